/*
 * quant.h - llama.cpp's block-quantized weight formats: the block layouts, dequantization (to_float)
 * and the reference quantizers (from_float) that `llama-quantize` runs when it has no importance matrix.
 *
 * A quantized row of n elements is n / block_elems blocks stored one after another; a tensor is its
 * rows one after another (ggml's ne[0] is the row). The layouts below are byte-for-byte ggml's
 * (ggml-common.h); sizes are checked by static asserts. Multi-byte fields are little-endian; `d`, `m`,
 * `dmin` are IEEE half floats stored as uint16_t. The per-type sizes live in the type table
 * (tensor.h: qw_type_traits), not in the code that uses them.
 *
 * Quantizers follow ggml-quants.c as called by ggml_quantize_chunk() with imatrix == NULL:
 *   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K -> quantize_row_<type>_ref
 *   IQ4_NL, IQ4_XS -> quantize_iq4_nl / quantize_iq4_xs (quantize_row_iq4_nl_impl with 7 scale tries)
 *   Q8_K (activations of the K-quant dot products, never stored in files) -> quantize_row_q8_K_ref
 * and produce the same bytes for the same floats (tests/t_quant.c checks this against blocks written by
 * ggml itself). Dequantizers give the same floats as ggml's dequantize_row_<type>.
 */
#ifndef QW_QUANT_H
#define QW_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tensor/tensor.h"

#define QW_QK 32     /* elements of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL block */
#define QW_QK_K 256  /* elements of a K-quant (and IQ4_XS) super-block */
#define QW_K_SCALE_SIZE 12

typedef struct { /* 18 bytes: x = d * (q - 8) */
    uint16_t d;
    uint8_t qs[QW_QK / 2]; /* element j in the low nibble of qs[j], element j+16 in the high nibble */
} qw_block_q4_0;

typedef struct { /* 20 bytes: x = d * q + m */
    uint16_t d, m;
    uint8_t qs[QW_QK / 2];
} qw_block_q4_1;

typedef struct { /* 22 bytes: x = d * (q - 16), q = nibble | fifth bit from qh (bit j for element j) */
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QW_QK / 2];
} qw_block_q5_0;

typedef struct { /* 24 bytes: x = d * q + m */
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QW_QK / 2];
} qw_block_q5_1;

typedef struct { /* 34 bytes: x = d * q */
    uint16_t d;
    int8_t qs[QW_QK];
} qw_block_q8_0;

/* Q4_K: 8 sub-blocks of 32; sub-block j: x = d * sc[j] * q - dmin * mn[j], sc/mn 6-bit, packed in scales[12]
 * (see qw_k4_scale_min). qs: 4 groups of 64 elements, 32 bytes each: low nibbles the first 32, high the next. */
typedef struct { /* 144 bytes */
    uint16_t d, dmin;
    uint8_t scales[QW_K_SCALE_SIZE];
    uint8_t qs[QW_QK_K / 2];
} qw_block_q4_K;

/* Q5_K: Q4_K plus a fifth bit: element l of group g (0..3) of 64 takes bit 2g (first 32) or 2g+1 of qh[l % 32]. */
typedef struct { /* 176 bytes */
    uint16_t d, dmin;
    uint8_t scales[QW_K_SCALE_SIZE];
    uint8_t qh[QW_QK_K / 8];
    uint8_t qs[QW_QK_K / 2];
} qw_block_q5_K;

/* Q6_K: 16 sub-blocks of 16 with int8 scales: x = d * scales[s] * (q - 32), q 6-bit (4 in ql, 2 in qh). */
typedef struct { /* 210 bytes */
    uint8_t ql[QW_QK_K / 2];
    uint8_t qh[QW_QK_K / 4];
    int8_t scales[QW_QK_K / 16];
    uint16_t d;
} qw_block_q6_K;

/* Q8_K: x = d * q with an f32 scale, plus the sums of each 16 quants (for the K-quant dot products). */
typedef struct { /* 292 bytes */
    float d;
    int8_t qs[QW_QK_K];
    int16_t bsums[QW_QK_K / 16];
} qw_block_q8_K;

/* IQ4_NL: x = d * qw_kvalues_iq4nl[q], nibbles packed as in Q4_0. */
typedef struct { /* 18 bytes */
    uint16_t d;
    uint8_t qs[QW_QK / 2];
} qw_block_iq4_nl;

/* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales ls (low 4 bits in scales_l, high 2 in scales_h):
 * x = d * (ls - 32) * qw_kvalues_iq4nl[q]; each sub-block's 16 bytes of qs packed as in Q4_0. */
typedef struct { /* 136 bytes */
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QW_QK_K / 64];
    uint8_t qs[QW_QK_K / 2];
} qw_block_iq4_xs;

/* The bytes of one block of a block-quantized type (the ten with integer kernels), as a constant the
 * compiler can fold into a kernel specialised for the type; 0 for the others. qw_type_traits_of has the
 * same value for every type. */
static inline size_t qw_block_bytes(qw_type t) {
    switch (t) {
    case QW_TYPE_Q8_0: return sizeof(qw_block_q8_0);
    case QW_TYPE_Q4_0: return sizeof(qw_block_q4_0);
    case QW_TYPE_Q4_1: return sizeof(qw_block_q4_1);
    case QW_TYPE_Q5_0: return sizeof(qw_block_q5_0);
    case QW_TYPE_Q5_1: return sizeof(qw_block_q5_1);
    case QW_TYPE_Q4_K: return sizeof(qw_block_q4_K);
    case QW_TYPE_Q5_K: return sizeof(qw_block_q5_K);
    case QW_TYPE_Q6_K: return sizeof(qw_block_q6_K);
    case QW_TYPE_IQ4_NL: return sizeof(qw_block_iq4_nl);
    case QW_TYPE_IQ4_XS: return sizeof(qw_block_iq4_xs);
    default: return 0;
    }
}

/* The 16 non-linear levels of IQ4_NL / IQ4_XS. */
extern const int8_t qw_kvalues_iq4nl[16];

/* Scale and min (6 bits each) of sub-block j (0..7) of a Q4_K / Q5_K block. */
static inline void qw_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Little-endian loads and stores at any alignment (weights sit at arbitrary offsets of a mapped file). */
static inline uint16_t qw_rd16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t qw_rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline void qw_wr16(void *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void qw_wr32(void *p, uint32_t v) { memcpy(p, &v, 4); }

/* C's float-to-int8 / uint8 conversion (truncation) for in-range values, saturating outside
 * (where the plain cast would be undefined). */
static inline int qw_trunc_i8(float v) { return v >= 127.0f ? 127 : v > -128.0f ? (int)v : -128; }
static inline int qw_trunc_u8(float v) { return v >= 255.0f ? 255 : v > 0.0f ? (int)v : 0; }

/* Round to nearest, ties to even, for |f| <= 2^22 - 1 (ggml's nearest_int): adding 1.5 * 2^23 leaves
 * the rounded integer in the low mantissa bits. */
static inline int qw_nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Per-type entry points (n a multiple of the block size; dst of quantizers is n / block_elems blocks). */
void qw_dequantize_q4_0(const void *src, float *dst, int64_t n);
void qw_dequantize_q4_1(const void *src, float *dst, int64_t n);
void qw_dequantize_q5_0(const void *src, float *dst, int64_t n);
void qw_dequantize_q5_1(const void *src, float *dst, int64_t n);
void qw_dequantize_q8_0(const void *src, float *dst, int64_t n);
void qw_dequantize_q4_K(const void *src, float *dst, int64_t n);
void qw_dequantize_q5_K(const void *src, float *dst, int64_t n);
void qw_dequantize_q6_K(const void *src, float *dst, int64_t n);
void qw_dequantize_q8_K(const void *src, float *dst, int64_t n);
void qw_dequantize_iq4_nl(const void *src, float *dst, int64_t n);
void qw_dequantize_iq4_xs(const void *src, float *dst, int64_t n);
void qw_dequantize_f32(const void *src, float *dst, int64_t n);
void qw_dequantize_f16(const void *src, float *dst, int64_t n);
void qw_dequantize_bf16(const void *src, float *dst, int64_t n);

void qw_quantize_q4_0(const float *src, void *dst, int64_t n);
void qw_quantize_q4_1(const float *src, void *dst, int64_t n);
void qw_quantize_q5_0(const float *src, void *dst, int64_t n);
void qw_quantize_q5_1(const float *src, void *dst, int64_t n);
void qw_quantize_q8_0(const float *src, void *dst, int64_t n);
void qw_quantize_q4_K(const float *src, void *dst, int64_t n);
void qw_quantize_q5_K(const float *src, void *dst, int64_t n);
void qw_quantize_q6_K(const float *src, void *dst, int64_t n);
void qw_quantize_q8_K(const float *src, void *dst, int64_t n);
void qw_quantize_iq4_nl(const float *src, void *dst, int64_t n);
void qw_quantize_iq4_xs(const float *src, void *dst, int64_t n);
void qw_quantize_f32(const float *src, void *dst, int64_t n);
void qw_quantize_f16(const float *src, void *dst, int64_t n);
void qw_quantize_bf16(const float *src, void *dst, int64_t n);

/* Through the type table: n elements of type t (n a multiple of its block size). The quantizer
 * returns the bytes written (qw_type_row_size(t, n)). Both abort on a type without the function. */
void qw_dequantize(qw_type t, const void *src, float *dst, int64_t n);
size_t qw_quantize(qw_type t, const float *src, void *dst, int64_t n);

#endif
