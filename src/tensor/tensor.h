/*
 * tensor.h - a weight tensor as the library sees it: a typed, row-major view into mapped file memory.
 *
 * Shapes are written in PyTorch order (shape[0] outermost), as in the safetensors header, so a
 * Linear weight is shape {out_features, in_features}. A view (one expert of a fused [E, 2I, H]
 * tensor, one head's rows) is just another qw_tensor with a data pointer inside the parent.
 * Weights are converted to f32 on the fly by the kernels; they are never copied whole into f32.
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
    QW_TYPE_COUNT
} qw_type;

#define QW_MAX_DIMS 8

typedef struct {
    const char *name;   /* as written in the checkpoint, for error messages */
    const void *data;   /* row-major, contiguous */
    qw_type type;
    int n_dims;
    int64_t shape[QW_MAX_DIMS];
} qw_tensor;

/* Bytes per element (0 for QW_TYPE_UNSUPPORTED). */
size_t qw_type_size(qw_type t);
const char *qw_type_name(qw_type t);
/* Parse a safetensors dtype string ("BF16", "F32", ...); QW_TYPE_UNSUPPORTED for others. */
qw_type qw_type_from_safetensors(const char *s);

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

/* Convert n elements starting at element i0 of a float tensor (F32/F16/BF16) to f32. */
void qw_tensor_to_f32(const qw_tensor *t, int64_t i0, int64_t n, float *out);

#endif
