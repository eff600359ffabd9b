/*
 * gguf.h - GGUF files (llama.cpp's model format, versions 2 and 3): a memory-mapped reader with O(1)
 * tensor lookup and typed metadata accessors, and a streaming writer.
 *
 * Format (little-endian; ggml/include/gguf.h and docs/gguf.md of llama.cpp):
 *   "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x {string key, u32 value type, value}; an array value is {u32 element type, u64 n, n elements},
 *   n_tensors x {string name, u32 n_dims, n_dims x i64 ne, u32 ggml type, u64 offset},
 *   padding to `general.alignment` (u32, default 32), then the data section; a tensor's offset is relative
 *   to the data section and a multiple of the alignment. A string is u64 length + bytes (no NUL); a bool
 *   is one byte. Version 1 (u32 counts) and big-endian files are refused.
 *
 * Shapes: ne[] is ggml's order, ne[0] the innermost (the row length, contiguous). qwenc's qw_tensor keeps
 * PyTorch order, outermost first, so a GGUF tensor's qw_tensor has shape[i] = ne[n_dims - 1 - i] and
 * reads like the safetensors tensor it was converted from: a Linear weight [out, in] has ne = {in, out}.
 *
 * Validation: every count, length, shape, type and offset is checked against the file size before use; a
 * truncated file, a bad magic or version, an unknown metadata or tensor type, a row that is not a whole
 * number of blocks, or tensor data past the end of the file is an error naming the file and the key or
 * tensor at fault. The reader keeps the file mapped; tensor data is never copied.
 *
 * GGUF tensors are found through qw_gguf_find() (the same `const qw_tensor *` the safetensors
 * qw_weightset_find() returns), not through qw_weightset itself.
 */
#ifndef QW_GGUF_H
#define QW_GGUF_H

#include <stdint.h>
#include <stdio.h>

#include "core/common.h"
#include "core/mapfile.h"
#include "tensor/tensor.h"

#define QW_GGUF_DEFAULT_ALIGNMENT 32
#define QW_GGUF_MAX_DIMS 4 /* ggml's limit: the writer refuses more; the reader accepts up to QW_MAX_DIMS */

typedef enum {
    QW_GGUF_U8 = 0,
    QW_GGUF_I8 = 1,
    QW_GGUF_U16 = 2,
    QW_GGUF_I16 = 3,
    QW_GGUF_U32 = 4,
    QW_GGUF_I32 = 5,
    QW_GGUF_F32 = 6,
    QW_GGUF_BOOL = 7,
    QW_GGUF_STRING = 8,
    QW_GGUF_ARRAY = 9,
    QW_GGUF_U64 = 10,
    QW_GGUF_I64 = 11,
    QW_GGUF_F64 = 12,
    QW_GGUF_TYPE_COUNT
} qw_gguf_type;

/* One metadata key/value. Scalars and numeric arrays point into the mapping (little-endian, unaligned:
 * use the accessors); strings are NUL-terminated copies. */
typedef struct {
    char *key;
    qw_gguf_type type;     /* the value's type; QW_GGUF_ARRAY for arrays */
    qw_gguf_type arr_type; /* element type of an array (never ARRAY: nested arrays are refused) */
    uint64_t n;            /* elements of an array, 1 for a scalar */
    const uint8_t *data;   /* scalar value or array elements in the file (not for strings) */
    char *str;             /* a string value */
    char **strs;           /* [n] the elements of a string array */
} qw_gguf_kv;

typedef struct {
    char *name;
    qw_tensor t;       /* shape in PyTorch order, t.name = name, t.data in the mapping */
    int n_dims;
    int64_t ne[QW_MAX_DIMS]; /* ggml order: ne[0] is the row */
    int ggml_type;
    uint64_t offset;   /* from the start of the data section */
    uint64_t nbytes;
} qw_gguf_tensor;

typedef struct {
    qw_mapfile file;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* file offset of the data section */
    qw_gguf_kv *kv;       /* [n_kv], in file order */
    int64_t n_kv;
    qw_gguf_tensor *tensors; /* [n_tensors], in file order */
    int64_t n_tensors;
    int32_t *kv_slots, *t_slots; /* open-addressing hashes of kv / tensor indices, -1 empty */
    size_t n_kv_slots, n_t_slots;
    char *strbuf; /* backing store of every string copied out of the file */
} qw_gguf;

/* Open and validate a GGUF file. On error g holds nothing that needs qw_gguf_free (it is safe to call). */
qwenc_status qw_gguf_open(qw_gguf *g, const char *path, char *err, size_t errlen);
void qw_gguf_free(qw_gguf *g);

/* The tensor of that exact name, or NULL. qw_gguf_find_info gives the GGUF view (ne[], ggml type, offset). */
const qw_tensor *qw_gguf_find(const qw_gguf *g, const char *name);
const qw_gguf_tensor *qw_gguf_find_info(const qw_gguf *g, const char *name);

/* The key/value of that key, or NULL. */
const qw_gguf_kv *qw_gguf_find_kv(const qw_gguf *g, const char *key);
const char *qw_gguf_type_name(qw_gguf_type t);

/*
 * Typed metadata getters. A missing key is QWENC_ERR_FORMAT ("<file>: metadata key 'k' is missing"); a
 * value of another type is QWENC_ERR_FORMAT naming the key, the type wanted and the type found. The
 * integer getters accept any integer type whose value fits (converters differ in u32 vs i32); the float
 * getter accepts F32 and F64; get_str, get_bool only their type. For optional keys, test qw_gguf_find_kv.
 */
qwenc_status qw_gguf_get_str(const qw_gguf *g, const char *key, const char **out, char *err, size_t errlen);
qwenc_status qw_gguf_get_u32(const qw_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen);
qwenc_status qw_gguf_get_i32(const qw_gguf *g, const char *key, int32_t *out, char *err, size_t errlen);
qwenc_status qw_gguf_get_u64(const qw_gguf *g, const char *key, uint64_t *out, char *err, size_t errlen);
qwenc_status qw_gguf_get_i64(const qw_gguf *g, const char *key, int64_t *out, char *err, size_t errlen);
qwenc_status qw_gguf_get_f32(const qw_gguf *g, const char *key, float *out, char *err, size_t errlen);
qwenc_status qw_gguf_get_bool(const qw_gguf *g, const char *key, int *out, char *err, size_t errlen);
/* An array; elem_type -1 accepts any element type, QW_GGUF_I64 any integer type, QW_GGUF_F32 F32 or F64. */
qwenc_status qw_gguf_get_arr(const qw_gguf *g, const char *key, int elem_type, const qw_gguf_kv **out, char *err,
                             size_t errlen);

/* Element i of an array of integers (any width; bools as 0/1) / of numbers (integers or floats) / of strings. */
int64_t qw_gguf_arr_i64(const qw_gguf_kv *kv, uint64_t i);
double qw_gguf_arr_f64(const qw_gguf_kv *kv, uint64_t i);
const char *qw_gguf_arr_str(const qw_gguf_kv *kv, uint64_t i);
/* A scalar numeric value (any integer, float or bool type) as double / int64 (a float truncated toward zero and
 * saturated, NaN as 0). */
double qw_gguf_kv_f64(const qw_gguf_kv *kv);
int64_t qw_gguf_kv_i64(const qw_gguf_kv *kv);

/*
 * Streaming writer. Usage:
 *   qw_gguf_writer *w;  qw_gguf_writer_open(&w, path, err, errlen);
 *   qw_gguf_writer_set_str(w, "general.architecture", "qwen3"); ...   (metadata, any order; a key set again
 *                                                                       replaces its value)
 *   qw_gguf_writer_add_tensor(w, "token_embd.weight", QW_TYPE_Q8_0, 2, shape, err, errlen); ...
 *   qw_gguf_writer_write(w, bytes, n, err, errlen); ...   (tensor data, in the order the tensors were added,
 *                                                          in pieces of any size; the header is written on
 *                                                          the first call, padding after each tensor)
 *   qw_gguf_writer_close(w, err, errlen);                 (checks every tensor was written in full; frees w)
 * Only the metadata and tensor infos are held in memory. Files are GGUF v3, with the tensors in order and
 * each padded to the alignment, as ggml's reader requires. `general.alignment` (set with set_u32, a power of
 * two, before the first tensor is added) changes the alignment. Metadata setters abort on misuse after the header is written (a programming
 * error); I/O and argument errors are returned.
 */
typedef struct qw_gguf_writer qw_gguf_writer;

qwenc_status qw_gguf_writer_open(qw_gguf_writer **w, const char *path, char *err, size_t errlen);
void qw_gguf_writer_set_u8(qw_gguf_writer *w, const char *key, uint8_t v);
void qw_gguf_writer_set_i8(qw_gguf_writer *w, const char *key, int8_t v);
void qw_gguf_writer_set_u16(qw_gguf_writer *w, const char *key, uint16_t v);
void qw_gguf_writer_set_i16(qw_gguf_writer *w, const char *key, int16_t v);
void qw_gguf_writer_set_u32(qw_gguf_writer *w, const char *key, uint32_t v);
void qw_gguf_writer_set_i32(qw_gguf_writer *w, const char *key, int32_t v);
void qw_gguf_writer_set_u64(qw_gguf_writer *w, const char *key, uint64_t v);
void qw_gguf_writer_set_i64(qw_gguf_writer *w, const char *key, int64_t v);
void qw_gguf_writer_set_f32(qw_gguf_writer *w, const char *key, float v);
void qw_gguf_writer_set_f64(qw_gguf_writer *w, const char *key, double v);
void qw_gguf_writer_set_bool(qw_gguf_writer *w, const char *key, int v);
void qw_gguf_writer_set_str(qw_gguf_writer *w, const char *key, const char *v);
/* An array of n numeric elements of elem_type (not STRING/ARRAY), in host (little-endian) layout. */
void qw_gguf_writer_set_arr(qw_gguf_writer *w, const char *key, qw_gguf_type elem_type, const void *data, uint64_t n);
void qw_gguf_writer_set_arr_str(qw_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* Copy a key/value read from another file (to carry metadata over when re-quantizing a GGUF). */
void qw_gguf_writer_set_kv(qw_gguf_writer *w, const qw_gguf_kv *kv);
/* Declare a tensor; shape in PyTorch order (outermost first), at most QW_GGUF_MAX_DIMS dimensions, the last
 * a whole number of the type's blocks; names unique and shorter than 64 bytes (ggml's limit). */
qwenc_status qw_gguf_writer_add_tensor(qw_gguf_writer *w, const char *name, qw_type type, int n_dims,
                                       const int64_t *shape, char *err, size_t errlen);
/* Append n bytes of tensor data; a piece never runs past the end of the current tensor. */
qwenc_status qw_gguf_writer_write(qw_gguf_writer *w, const void *data, size_t n, char *err, size_t errlen);
/* Finish the file; on error the partial file is removed. Frees w either way. */
qwenc_status qw_gguf_writer_close(qw_gguf_writer *w, char *err, size_t errlen);
/* Mark the file failed, for a metadata producer that cannot return a status: add_tensor, write and close
 * then return st with msg (the first failure is kept), and close removes the file. */
void qw_gguf_writer_fail(qw_gguf_writer *w, qwenc_status st, const char *msg);
/* Abandon a file being written (removes it) and free w. */
void qw_gguf_writer_abort(qw_gguf_writer *w);

#endif
