/*
 * q8a.c - the 8-bit activation blocks and the scalar reference of the integer dot products (q8a.h).
 *
 * The unpacking follows the block layouts of tensor/quant.h (ggml's); qw_q8a_unpack is checked against
 * the dequantizers in tests/t_qkernels.c, so the integer path reads every weight as quant.c does.
 */
#include "kernels/q8a.h"

#include <math.h>
#include <stdlib.h>

#include "core/common.h"
#include "tensor/quant.h"

void qw_q8a_quantize(const float *x, qw_q8a *y, int64_t n) {
    QW_ASSERT(n % QW_Q8A_BLOCK == 0);
    for (int64_t b = 0; b < n / QW_Q8A_BLOCK; b++) {
        const float *xb = x + b * QW_Q8A_BLOCK;
        float amax = 0;
        int nan = 0;
        for (int i = 0; i < QW_Q8A_BLOCK; i++) { /* not fmaxf: a library call at -O2 */
            float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
            nan |= a != a;
        }
        /* a NaN activation makes the block's scale NaN, so it reaches the output as with f32 activations */
        float d = nan ? NAN : amax / 127.0f, id = amax != 0 && !nan ? 127.0f / amax : 0.0f;
        int32_t s = 0;
        for (int i = 0; i < QW_Q8A_BLOCK; i++) {
            int q = qw_nearest_int(xb[i] * id); /* |x * id| <= 127 (+ rounding): in range */
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            y[b].q[i] = (int8_t)q;
            s += q;
        }
        y[b].d = d;
        y[b].s = s;
    }
}

int qw_q8a_supported(qw_type t) { return qw_type_is_quantized(t) && t != QW_TYPE_Q8_K; }

/* element j < 16 in the low nibble of qs[j], element j + 16 in the high nibble (Q4_0 packing) */
static inline int nib32(const uint8_t *qs, int i) { return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4; }

void qw_q8a_unpack(qw_type t, const void *row, int64_t g, int16_t iw[QW_Q8A_BLOCK], float *A, float *B) {
    const uint8_t *r = row;
    *B = 0;
    switch (t) {
    case QW_TYPE_Q8_0: {
        const qw_block_q8_0 *b = (const qw_block_q8_0 *)(r + g * sizeof(qw_block_q8_0));
        *A = qw_f16_to_f32(qw_rd16(&b->d));
        for (int i = 0; i < 32; i++) iw[i] = b->qs[i];
        return;
    }
    case QW_TYPE_Q4_0: {
        const qw_block_q4_0 *b = (const qw_block_q4_0 *)(r + g * sizeof(qw_block_q4_0));
        *A = qw_f16_to_f32(qw_rd16(&b->d));
        for (int i = 0; i < 32; i++) iw[i] = (int16_t)(nib32(b->qs, i) - 8);
        return;
    }
    case QW_TYPE_Q4_1: {
        const qw_block_q4_1 *b = (const qw_block_q4_1 *)(r + g * sizeof(qw_block_q4_1));
        *A = qw_f16_to_f32(qw_rd16(&b->d));
        *B = qw_f16_to_f32(qw_rd16(&b->m));
        for (int i = 0; i < 32; i++) iw[i] = (int16_t)nib32(b->qs, i);
        return;
    }
    case QW_TYPE_Q5_0:
    case QW_TYPE_Q5_1: {
        const uint8_t *b = r + g * (t == QW_TYPE_Q5_0 ? sizeof(qw_block_q5_0) : sizeof(qw_block_q5_1));
        int off = t == QW_TYPE_Q5_0 ? 2 : 4; /* qh after d (and m) */
        *A = qw_f16_to_f32(qw_rd16(b));
        if (t == QW_TYPE_Q5_1) *B = qw_f16_to_f32(qw_rd16(b + 2));
        uint32_t qh = qw_rd32(b + off);
        for (int i = 0; i < 32; i++) {
            int q = nib32(b + off + 4, i) | (int)((qh >> i) & 1) << 4;
            iw[i] = (int16_t)(t == QW_TYPE_Q5_0 ? q - 16 : q);
        }
        return;
    }
    case QW_TYPE_IQ4_NL: {
        const qw_block_iq4_nl *b = (const qw_block_iq4_nl *)(r + g * sizeof(qw_block_iq4_nl));
        *A = qw_f16_to_f32(qw_rd16(&b->d));
        for (int i = 0; i < 32; i++) iw[i] = qw_kvalues_iq4nl[nib32(b->qs, i)];
        return;
    }
    case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_K: {
        int j = (int)(g % 8); /* sub-block of the super-block */
        const uint8_t *b = r + g / 8 * (t == QW_TYPE_Q4_K ? sizeof(qw_block_q4_K) : sizeof(qw_block_q5_K));
        const uint8_t *scales = b + 4, *qh = b + 4 + QW_K_SCALE_SIZE;
        const uint8_t *qs = t == QW_TYPE_Q4_K ? qh : qh + QW_QK_K / 8;
        uint8_t sc, mn;
        qw_k4_scale_min(j, scales, &sc, &mn);
        *A = qw_f16_to_f32(qw_rd16(b));
        *B = -qw_f16_to_f32(qw_rd16(b + 2)) * mn;
        for (int l = 0; l < 32; l++) {
            int q = j % 2 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 0xF;
            if (t == QW_TYPE_Q5_K) q |= (qh[l] >> j & 1) << 4;
            iw[l] = (int16_t)(sc * q);
        }
        return;
    }
    case QW_TYPE_Q6_K: {
        const qw_block_q6_K *b = (const qw_block_q6_K *)(r + g / 8 * sizeof(qw_block_q6_K));
        *A = qw_f16_to_f32(qw_rd16(&b->d));
        int h = (int)(g % 8) / 4, k = (int)(g % 4); /* 128-half, 32-quarter */
        for (int l = 0; l < 32; l++) {
            int ql = b->ql[64 * h + l + (k & 1) * 32];
            int q = (k >= 2 ? ql >> 4 : ql & 0xF) | ((b->qh[32 * h + l] >> (2 * k)) & 3) << 4;
            iw[l] = (int16_t)(b->scales[8 * h + l / 16 + 2 * k] * (q - 32));
        }
        return;
    }
    case QW_TYPE_IQ4_XS: {
        const qw_block_iq4_xs *b = (const qw_block_iq4_xs *)(r + g / 8 * sizeof(qw_block_iq4_xs));
        int j = (int)(g % 8);
        int ls = ((b->scales_l[j / 2] >> 4 * (j % 2)) & 0xF) | ((qw_rd16(&b->scales_h) >> 2 * j) & 3) << 4;
        *A = qw_f16_to_f32(qw_rd16(&b->d));
        for (int i = 0; i < 32; i++) iw[i] = (int16_t)((ls - 32) * qw_kvalues_iq4nl[nib32(b->qs + 16 * j, i)]);
        return;
    }
    default:
        QW_ASSERT(!"weight type without an integer dot");
    }
}

/* isum_g = sum_i iw_i q_i over group g */
static int32_t group_isum(const int16_t *iw, const qw_q8a *x) {
    int32_t s = 0;
    for (int i = 0; i < QW_Q8A_BLOCK; i++) s += iw[i] * x->q[i];
    return s;
}

float qw_q8a_dot_ref(qw_type t, const void *row, const qw_q8a *x, int64_t n) {
    float acc = 0;
    int16_t iw[QW_Q8A_BLOCK];
    for (int64_t g = 0; g < n / QW_Q8A_BLOCK; g++) {
        float A, B;
        qw_q8a_unpack(t, row, g, iw, &A, &B);
        acc += x[g].d * (A * (float)group_isum(iw, &x[g]) + B * (float)x[g].s);
    }
    return acc;
}

double qw_q8a_dot_abs(qw_type t, const void *row, const qw_q8a *x, int64_t n) {
    double acc = 0;
    int16_t iw[QW_Q8A_BLOCK];
    for (int64_t g = 0; g < n / QW_Q8A_BLOCK; g++) {
        float A, B;
        qw_q8a_unpack(t, row, g, iw, &A, &B);
        int64_t a = 0;
        for (int i = 0; i < QW_Q8A_BLOCK; i++) a += abs(iw[i] * x[g].q[i]);
        acc += fabs((double)x[g].d) * (fabs((double)A) * (double)a + fabs((double)B * x[g].s));
    }
    return acc;
}

void qw_q8a_group_terms(const qw_q8a *x, int64_t ldx, int nt, int64_t ng, int sub, int o, int32_t *ofs, float *dsm) {
    int64_t ldo = ng * sub;
    for (int t = 0; t < nt; t++)
        for (int64_t g = 0; g < ng; g++) {
            const qw_q8a *xa = x + t * ldx + g;
            for (int si = 0; ofs && si < sub; si++) {
                int32_t sum = xa->s;
                if (sub == 2) {
                    sum = 0;
                    for (int i = 0; i < QW_Q8A_BLOCK / 2; i++) sum += xa->q[QW_Q8A_BLOCK / 2 * si + i];
                }
                ofs[t * ldo + g * sub + si] = -o * sum;
            }
            if (dsm) dsm[t * ldo + g] = xa->d * (float)xa->s;
        }
}
