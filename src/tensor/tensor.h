/*
 * tensor.h - a weight tensor as the library sees it: a typed, row-major view into mapped file memory.
 *
 * Shapes are written in PyTorch order (shape[0] outermost), as in the safetensors header, so a
 * Linear weight is shape {out_features, in_features}. A view (one expert of a fused [E, 2I, H]
 * tensor, one head's rows) is just another qw_tensor with a data pointer inside the parent.
 * Weights are converted to f32 on the fly by the kernels; they are never copied whole into f32.
 *
 * Block-quantized types (llama.cpp's Q8_0, Q4_K, ...; layouts in quant.h) store a row of n elements as
 * n / block_elems blocks of block_bytes; the row is the last (innermost) dimension and must be a whole
 * number of blocks. Per-type sizes and functions are one table, qw_type_traits, indexed by qw_type.
 */
#ifndef QW_TENSOR_H
#define QW_TENSOR_H

#include <stdint.h>
#include <string.h>

typedef enum {
    QW_TYPE_F32 = 0,
    QW_TYPE_F16,
    QW_TYPE_BF16,
    QW_TYPE_I64,
    QW_TYPE_I32,
    QW_TYPE_UNSUPPORTED, /* known to the file format, not to the kernels (F8, U8, ...) */
    /* block-quantized types, in llama.cpp's layouts (quant.h) */
    QW_TYPE_Q8_0,
    QW_TYPE_Q4_0,
    QW_TYPE_Q4_1,
    QW_TYPE_Q5_0,
    QW_TYPE_Q5_1,
    QW_TYPE_Q4_K,
    QW_TYPE_Q5_K,
    QW_TYPE_Q6_K,
    QW_TYPE_IQ4_NL,
    QW_TYPE_IQ4_XS,
    QW_TYPE_Q8_K, /* activations of the K-quant dot products; never a weight in a file */
    QW_TYPE_COUNT
} qw_type;

/* dst[0..n) = the n elements at src as f32; n a multiple of block_elems. */
typedef void (*qw_to_float_fn)(const void *src, float *dst, int64_t n);
/* The reference quantizer: n floats into n / block_elems blocks at dst. */
typedef void (*qw_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct {
    const char *name;        /* llama.cpp's spelling: "f32", "bf16", "q8_0", "q4_K", "iq4_xs" */
    const char *st_name;     /* safetensors dtype ("F32"), NULL if safetensors has none */
    int ggml_type;           /* GGML type id in GGUF files, -1 if none */
    int block_elems;         /* elements per block (1 for the plain types) */
    int block_bytes;         /* bytes per block (the element size for the plain types) */
    qw_to_float_fn to_float;     /* NULL for the integer types */
    qw_from_float_fn from_float; /* NULL for the integer types */
} qw_type_traits;

#define QW_MAX_DIMS 8

typedef struct {
    const char *name;   /* as written in the checkpoint, for error messages */
    const void *data;   /* row-major, contiguous */
    qw_type type;
    int n_dims;
    int64_t shape[QW_MAX_DIMS];
} qw_tensor;

/* The table entry of a type (t < QW_TYPE_COUNT). */
const qw_type_traits *qw_type_traits_of(qw_type t);
/* Bytes per element of a plain type (0 for QW_TYPE_UNSUPPORTED and the block-quantized types). */
size_t qw_type_size(qw_type t);
const char *qw_type_name(qw_type t);
/* 1 for the block-quantized types. */
int qw_type_is_quantized(qw_type t);
/* Bytes of n elements of type t; n must be a multiple of the block size (asserted). */
size_t qw_type_row_size(qw_type t, int64_t n);
/* Parse a safetensors dtype string ("BF16", "F32", ...); QW_TYPE_UNSUPPORTED for others. */
qw_type qw_type_from_safetensors(const char *s);
/* The type of a GGML type id, QW_TYPE_UNSUPPORTED for an id qwenc does not handle. */
qw_type qw_type_from_ggml(int ggml_type);
/* The type of a name as llama-quantize spells it ("Q4_K", "q8_0", "BF16"; case-insensitive), or -1. */
int qw_type_from_name(const char *s);

int64_t qw_tensor_nelem(const qw_tensor *t);
/* Elements in one row: the product of every dimension but the first. */
int64_t qw_tensor_row_len(const qw_tensor *t);
/* The 2-D view of rows [r0, r0+nr) of a tensor whose rows are of length row_len. */
qw_tensor qw_tensor_rows(const qw_tensor *t, int64_t r0, int64_t nr, int64_t row_len);
/* Format the shape as "[a, b, c]" into buf. */
const char *qw_shape_str(const qw_tensor *t, char *buf, size_t n);

static inline float qw_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float qw_f16_to_f32(uint16_t h);
uint16_t qw_f32_to_bf16(float f); /* round to nearest even, NaN kept */
uint16_t qw_f32_to_f16(float f);  /* round to nearest even */

/* Convert n elements starting at element i0 of a float or quantized tensor to f32
 * (for a quantized tensor, i0 and n must be multiples of the block size). */
void qw_tensor_to_f32(const qw_tensor *t, int64_t i0, int64_t n, float *out);

#endif
