/*
 * quant.c - the plain float types and llama.cpp's 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
 * dequantization and the reference quantizers of ggml-quants.c (quantize_row_<type>_ref), plus the
 * dispatch through the type table. The K-quants, IQ4 and Q8_K are in quant_k.c.
 *
 * Bit-exactness with ggml: every quantity is computed in float with the operations in ggml's order, and
 * the conversions to integers truncate or round as ggml's do ((int)(v + 8.5f), roundf, round-half-even).
 * A product followed by a sum must not be fused into an FMA: gcc in ISO C mode (-std=c11) never
 * contracts, and the pragma below stops clang. Inputs are assumed finite (weights are); a NaN or an
 * infinity gives some block, never undefined behaviour.
 */
#include "tensor/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/common.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ------------------------------------------------------------------ float types */

void qw_dequantize_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }
void qw_quantize_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

void qw_dequantize_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = qw_f16_to_f32(qw_rd16(p + 2 * i));
}

void qw_quantize_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) qw_wr16(p + 2 * i, qw_f32_to_f16(src[i]));
}

void qw_dequantize_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = qw_bf16_to_f32(qw_rd16(p + 2 * i));
}

void qw_quantize_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) qw_wr16(p + 2 * i, qw_f32_to_bf16(src[i]));
}

/* ------------------------------------------------------------------ 32-element blocks */

/* The element of largest magnitude with its sign (the first of equal magnitudes). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

/* Symmetric 4/5-bit codes: d = max / -half, q = min(2 half - 1, trunc(x / d + half + 0.5)), x = d (q - half). */
static float quantize_sym(const float *x, int half, uint8_t q[QW_QK]) {
    const float d = signed_absmax(x, QW_QK) / (float)-half;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float bias = (float)half + 0.5f;
    for (int j = 0; j < QW_QK; j++) q[j] = (uint8_t)QW_MIN(2 * half - 1, qw_trunc_i8(x[j] * id + bias));
    return d;
}

/* Asymmetric codes on [min, max]: d = (max - min) / nmax, q = trunc((x - min) / d + 0.5), x = d q + min.
 * Q4_1 clamps q to 15; Q5_1 does not clamp (ggml keeps the low five bits). */
static float quantize_asym(const float *x, int nmax, int clamp, uint8_t q[QW_QK], float *min_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QW_QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / (float)nmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QW_QK; j++) {
        const float v = (x[j] - min) * id + 0.5f;
        q[j] = (uint8_t)(clamp ? QW_MIN(nmax, qw_trunc_i8(v)) : qw_trunc_u8(v));
    }
    *min_out = min;
    return d;
}

/* Element j in the low nibble of byte j, element j + 16 in the high nibble. */
static void pack_nibbles(const uint8_t q[QW_QK], uint8_t qs[QW_QK / 2]) {
    for (int j = 0; j < QW_QK / 2; j++) qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + QW_QK / 2] & 0xF) << 4));
}

/* The fifth bits: bit j of qh is bit 4 of element j. */
static void pack_fifth_bits(const uint8_t q[QW_QK], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < QW_QK; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    qw_wr32(qh, h);
}

/* Codes of a 32-block with 4-bit nibbles and optional fifth bits (qh NULL for none). */
static void unpack_codes(const uint8_t *qs, const uint8_t *qh, int q[QW_QK]) {
    uint32_t h = qh ? qw_rd32(qh) : 0;
    for (int j = 0; j < QW_QK / 2; j++) {
        q[j] = (qs[j] & 0xF) | (int)(((h >> j) & 1) << 4);
        q[j + QW_QK / 2] = (qs[j] >> 4) | (int)(((h >> (j + QW_QK / 2)) & 1) << 4);
    }
}

void qw_quantize_q4_0(const float *src, void *dst, int64_t n) {
    qw_block_q4_0 *y = dst;
    uint8_t q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++) {
        qw_block_q4_0 b;
        b.d = qw_f32_to_f16(quantize_sym(src + i * QW_QK, 8, q));
        pack_nibbles(q, b.qs);
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_quantize_q5_0(const float *src, void *dst, int64_t n) {
    qw_block_q5_0 *y = dst;
    uint8_t q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++) {
        qw_block_q5_0 b;
        b.d = qw_f32_to_f16(quantize_sym(src + i * QW_QK, 16, q));
        pack_nibbles(q, b.qs);
        pack_fifth_bits(q, b.qh);
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_quantize_q4_1(const float *src, void *dst, int64_t n) {
    qw_block_q4_1 *y = dst;
    uint8_t q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++) {
        qw_block_q4_1 b;
        float min;
        b.d = qw_f32_to_f16(quantize_asym(src + i * QW_QK, 15, 1, q, &min));
        b.m = qw_f32_to_f16(min);
        pack_nibbles(q, b.qs);
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_quantize_q5_1(const float *src, void *dst, int64_t n) {
    qw_block_q5_1 *y = dst;
    uint8_t q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++) {
        qw_block_q5_1 b;
        float min;
        b.d = qw_f32_to_f16(quantize_asym(src + i * QW_QK, 31, 0, q, &min));
        b.m = qw_f32_to_f16(min);
        pack_nibbles(q, b.qs);
        pack_fifth_bits(q, b.qh);
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_quantize_q8_0(const float *src, void *dst, int64_t n) {
    qw_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QW_QK; i++) {
        const float *x = src + i * QW_QK;
        qw_block_q8_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QW_QK; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = qw_f32_to_f16(d);
        for (int j = 0; j < QW_QK; j++) b.qs[j] = (int8_t)qw_trunc_i8(roundf(x[j] * id));
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_dequantize_q4_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++, p += sizeof(qw_block_q4_0), dst += QW_QK) {
        const float d = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q4_0, d)));
        unpack_codes(p + offsetof(qw_block_q4_0, qs), NULL, q);
        for (int j = 0; j < QW_QK; j++) dst[j] = (float)(q[j] - 8) * d;
    }
}

void qw_dequantize_q4_1(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++, p += sizeof(qw_block_q4_1), dst += QW_QK) {
        const float d = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q4_1, d)));
        const float m = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q4_1, m)));
        unpack_codes(p + offsetof(qw_block_q4_1, qs), NULL, q);
        for (int j = 0; j < QW_QK; j++) dst[j] = (float)q[j] * d + m;
    }
}

void qw_dequantize_q5_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++, p += sizeof(qw_block_q5_0), dst += QW_QK) {
        const float d = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q5_0, d)));
        unpack_codes(p + offsetof(qw_block_q5_0, qs), p + offsetof(qw_block_q5_0, qh), q);
        for (int j = 0; j < QW_QK; j++) dst[j] = (float)(q[j] - 16) * d;
    }
}

void qw_dequantize_q5_1(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int q[QW_QK];
    for (int64_t i = 0; i < n / QW_QK; i++, p += sizeof(qw_block_q5_1), dst += QW_QK) {
        const float d = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q5_1, d)));
        const float m = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q5_1, m)));
        unpack_codes(p + offsetof(qw_block_q5_1, qs), p + offsetof(qw_block_q5_1, qh), q);
        for (int j = 0; j < QW_QK; j++) dst[j] = (float)q[j] * d + m;
    }
}

void qw_dequantize_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QW_QK; i++, p += sizeof(qw_block_q8_0), dst += QW_QK) {
        const float d = qw_f16_to_f32(qw_rd16(p + offsetof(qw_block_q8_0, d)));
        const int8_t *qs = (const int8_t *)(p + offsetof(qw_block_q8_0, qs));
        for (int j = 0; j < QW_QK; j++) dst[j] = (float)qs[j] * d;
    }
}

/* ------------------------------------------------------------------ dispatch */

void qw_dequantize(qw_type t, const void *src, float *dst, int64_t n) {
    const qw_type_traits *tt = qw_type_traits_of(t);
    QW_ASSERT(tt->to_float && n % tt->block_elems == 0);
    tt->to_float(src, dst, n);
}

size_t qw_quantize(qw_type t, const float *src, void *dst, int64_t n) {
    const qw_type_traits *tt = qw_type_traits_of(t);
    QW_ASSERT(tt->from_float && n % tt->block_elems == 0);
    tt->from_float(src, dst, n);
    return qw_type_row_size(t, n);
}
