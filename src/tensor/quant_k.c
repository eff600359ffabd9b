/*
 * quant_k.c - llama.cpp's 256-element super-block formats: Q4_K, Q5_K, Q6_K (weights), Q8_K (activations of
 * the K-quant dot products) and the non-linear IQ4_NL (32-element blocks) and IQ4_XS.
 *
 * The quantizers are those llama-quantize runs without an importance matrix (ggml-quants.c):
 *   Q4_K / Q5_K: quantize_row_q{4,5}_K_ref - per 32-element sub-block a weighted least-squares fit of
 *                scale and min (make_qkx2_quants, weights sqrt(mean x^2) + |x|, a sweep of 21 / 16 trial
 *                scales), the 8 scales and mins quantized to 6 bits against two f16 super-scales, then
 *                every element re-rounded against the quantized scale and min;
 *   Q6_K:        quantize_row_q6_K_ref - per 16-element sub-block a signed fit (make_qx_quants, weights x^2,
 *                19 trial scales), scales quantized to int8 against one f16 super-scale;
 *   IQ4_NL / IQ4_XS: quantize_iq4_nl / quantize_iq4_xs with no imatrix (quantize_row_iq4_nl_impl, weights
 *                x^2, 15 trial scales); IQ4_XS then quantizes the 8 sub-block scales to 6 bits;
 *   Q8_K:        quantize_row_q8_K_ref (ggml's CPU backend has its own SIMD quantizer for activations; this
 *                is the reference one).
 * Every float operation is done in float, in ggml's order, unfused (see quant.c), so the bytes are ggml's.
 */
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "tensor/quant.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ggml's threshold below which a group counts as all zero (GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

const int8_t qw_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ------------------------------------------------------------------ Q4_K, Q5_K */

/*
 * Fit x[i] ~ scale * L[i] - the_min with L in [0, nmax] minimising sum w (scale L - the_min - x)^2:
 * start from the range [min(x, 0), max(x)], then try nstep + 1 scales (rmin + rdelta*is + nmax) / range,
 * solving the 2x2 least squares for scale and min at each and keeping the best (ggml's make_qkx2_quants).
 */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                           float rmin, float rdelta, int nstep) {
    uint8_t Laux[32];
    QW_ASSERT(n <= 32);
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(qw_nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(qw_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * (diff * diff);
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Pack 6-bit scales sc[8] and mins mn[8]: bytes 0-3 scale 0-3, 4-7 min 0-3 (low 6 bits), 8-11 the low
 * nibbles of scale and min 4-7, whose top 2 bits go in bits 6-7 of bytes 0-3 and 4-7 (see qw_k4_scale_min). */
static void pack_k4_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[QW_K_SCALE_SIZE]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}

/*
 * The shared part of the Q4_K and Q5_K quantizers: fit each of the 8 sub-blocks, quantize its scale and
 * min to 6 bits, and re-round every element to L[256] in [0, nmax] against the quantized values.
 */
static void quantize_k_scale_min(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out, uint16_t *dmin_out,
                                 uint8_t scales[QW_K_SCALE_SIZE], uint8_t L[QW_QK_K]) {
    float sub_scale[8], sub_min[8], weights[32];
    float max_scale = 0, max_min = 0; /* the mins are subtracted, so both are >= 0 */
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xb[l] * xb[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xb[l]);
        sub_scale[j] = fit_scale_min(32, nmax, xb, weights, L + 32 * j, &sub_min[j], rmin, 0.1f, nstep);
        if (sub_scale[j] > max_scale) max_scale = sub_scale[j];
        if (sub_min[j] > max_min) max_min = sub_min[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* ggml stores the rounded value in a uint8_t before clamping: keep that wrap-around */
        ls[j] = (uint8_t)QW_MIN(63, (uint8_t)qw_nearest_int(inv_scale * sub_scale[j]));
        lm[j] = (uint8_t)QW_MIN(63, (uint8_t)qw_nearest_int(inv_min * sub_min[j]));
    }
    pack_k4_scales(ls, lm, scales);
    *d_out = qw_f32_to_f16(max_scale / 63.f);
    *dmin_out = qw_f32_to_f16(max_min / 63.f);
    const float d_all = qw_f16_to_f32(*d_out), dmin_all = qw_f16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        qw_k4_scale_min(j, scales, &sc, &m);
        const float d = d_all * sc;
        if (d == 0.0f) continue; /* keeps the codes of the fit */
        const float dm = dmin_all * m;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)clampi(qw_nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
    }
}

void qw_quantize_q4_K(const float *src, void *dst, int64_t n) {
    qw_block_q4_K *y = dst;
    uint8_t L[QW_QK_K];
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        qw_block_q4_K b;
        quantize_k_scale_min(src + i * QW_QK_K, 15, -1.f, 20, &b.d, &b.dmin, b.scales, L);
        for (int g = 0; g < 4; g++) /* 64 elements per group: the first 32 in low nibbles, the next in high */
            for (int l = 0; l < 32; l++) b.qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_quantize_q5_K(const float *src, void *dst, int64_t n) {
    qw_block_q5_K *y = dst;
    uint8_t L[QW_QK_K];
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        qw_block_q5_K b;
        quantize_k_scale_min(src + i * QW_QK_K, 31, -0.5f, 15, &b.d, &b.dmin, b.scales, L);
        memset(b.qh, 0, sizeof(b.qh));
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
                b.qs[32 * g + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                b.qh[l] |= (uint8_t)(((lo >> 4) & 1) << (2 * g) | ((hi >> 4) & 1) << (2 * g + 1));
            }
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_dequantize_q4_K(const void *src, float *dst, int64_t n) {
    qw_block_q4_K b;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        memcpy(&b, (const uint8_t *)src + i * sizeof(b), sizeof(b));
        const float d = qw_f16_to_f32(b.d), min = qw_f16_to_f32(b.dmin);
        for (int g = 0; g < 4; g++) {
            uint8_t sc, m;
            qw_k4_scale_min(2 * g, b.scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            qw_k4_scale_min(2 * g + 1, b.scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            const uint8_t *q = b.qs + 32 * g;
            for (int l = 0; l < 32; l++) *dst++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *dst++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void qw_dequantize_q5_K(const void *src, float *dst, int64_t n) {
    qw_block_q5_K b;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        memcpy(&b, (const uint8_t *)src + i * sizeof(b), sizeof(b));
        const float d = qw_f16_to_f32(b.d), min = qw_f16_to_f32(b.dmin);
        for (int g = 0; g < 4; g++) {
            uint8_t sc, m;
            qw_k4_scale_min(2 * g, b.scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            qw_k4_scale_min(2 * g + 1, b.scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            const uint8_t *q = b.qs + 32 * g;
            for (int l = 0; l < 32; l++) *dst++ = d1 * (float)((q[l] & 0xF) | (((b.qh[l] >> (2 * g)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++) *dst++ = d2 * (float)((q[l] >> 4) | (((b.qh[l] >> (2 * g + 1)) & 1) << 4)) - m2;
        }
    }
}

/* ------------------------------------------------------------------ Q6_K */

/*
 * Signed fit x[i] ~ scale * (L[i] - nmax), L in [0, 2 nmax), weights x^2: start from scale max / -nmax and
 * try 18 more scales -(nmax + 0.1 is) / max, keeping the best weighted least-squares scale (ggml's
 * make_qx_quants with rmse_type 1). All-zero groups give scale 0.
 */
static float fit_scale_signed(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = (float)-nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(qw_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(qw_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(qw_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void qw_quantize_q6_K(const float *src, void *dst, int64_t n) {
    qw_block_q6_K *y = dst;
    int8_t L[QW_QK_K];
    float scales[QW_QK_K / 16];
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        const float *x = src + i * QW_QK_K;
        qw_block_q6_K b;
        float max_scale = 0, max_abs_scale = 0;
        for (int s = 0; s < QW_QK_K / 16; s++) {
            scales[s] = fit_scale_signed(16, 32, x + 16 * s, L + 16 * s);
            if (fabsf(scales[s]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[s]);
                max_scale = scales[s];
            }
        }
        memset(&b, 0, sizeof(b));
        if (max_abs_scale < GROUP_EPS) { /* all zero: an all-zero block */
            memcpy(&y[i], &b, sizeof(b));
            continue;
        }
        const float iscale = -128.f / max_scale;
        b.d = qw_f32_to_f16(1 / iscale);
        for (int s = 0; s < QW_QK_K / 16; s++) b.scales[s] = (int8_t)clampi(qw_nearest_int(iscale * scales[s]), -128, 127);
        const float d_all = qw_f16_to_f32(b.d);
        for (int s = 0; s < QW_QK_K / 16; s++) {
            const float d = d_all * (float)b.scales[s];
            if (d == 0.0f) continue; /* keeps the codes of the fit */
            for (int k = 0; k < 16; k++) L[16 * s + k] = (int8_t)(clampi(qw_nearest_int(x[16 * s + k] / d), -32, 31) + 32);
        }
        /* per half of 128: ql[l] holds elements l (low) and l+64 (high), ql[l+32] elements l+32 and l+96;
         * qh[l] their top two bits at 0, 2, 4, 6 for l, l+32, l+64, l+96 */
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
            }
        }
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_dequantize_q6_K(const void *src, float *dst, int64_t n) {
    qw_block_q6_K b;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        memcpy(&b, (const uint8_t *)src + i * sizeof(b), sizeof(b));
        const float d = qw_f16_to_f32(b.d);
        for (int h = 0; h < 2; h++, dst += 128) {
            const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
            const int8_t *sc = b.scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                const int s = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                dst[l] = d * (float)sc[s] * (float)q1;
                dst[l + 32] = d * (float)sc[s + 2] * (float)q2;
                dst[l + 64] = d * (float)sc[s + 4] * (float)q3;
                dst[l + 96] = d * (float)sc[s + 6] * (float)q4;
            }
        }
    }
}

/* ------------------------------------------------------------------ Q8_K */

void qw_quantize_q8_K(const float *src, void *dst, int64_t n) {
    qw_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        const float *x = src + i * QW_QK_K;
        qw_block_q8_K b;
        memset(&b, 0, sizeof(b));
        float max = 0, amax = 0;
        for (int j = 0; j < QW_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        if (amax != 0.0f) {
            const float iscale = -127.f / max;
            for (int j = 0; j < QW_QK_K; j++) b.qs[j] = (int8_t)clampi(qw_nearest_int(iscale * x[j]), -128, 127);
            for (int g = 0; g < QW_QK_K / 16; g++) {
                int sum = 0;
                for (int k = 0; k < 16; k++) sum += b.qs[16 * g + k];
                b.bsums[g] = (int16_t)sum;
            }
            b.d = 1 / iscale;
        }
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_dequantize_q8_K(const void *src, float *dst, int64_t n) {
    qw_block_q8_K b;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        memcpy(&b, (const uint8_t *)src + i * sizeof(b), sizeof(b));
        for (int j = 0; j < QW_QK_K; j++) *dst++ = b.d * (float)b.qs[j];
    }
}

/* ------------------------------------------------------------------ IQ4_NL, IQ4_XS */

/* The index of the level of qw_kvalues_iq4nl nearest to x (the lower one on ties). */
static int nearest_level(float x) {
    const int8_t *v = qw_kvalues_iq4nl;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < v[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* Best scale d of one 32-element block for x ~ d * level (weights x^2): start at max / 127, then try
 * (t - 127) / max for t in [-7, 7] (ggml's quantize_row_iq4_nl_impl without imatrix, ntry 7). */
static float fit_scale_iq4(const float *x) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    if (amax < GROUP_EPS) return 0;
    const int8_t *v = qw_kvalues_iq4nl;
    float d = -max / (float)v[0], id = 1 / d, sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        float q = v[nearest_level(id * x[j])], w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int t = -7; t <= 7; t++) {
        id = (float)(t + v[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            float q = v[nearest_level(id * x[j])], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* Levels of 32 elements against the scale d, packed as in Q4_0. */
static void pack_iq4(const float *x, float d, uint8_t qs[16]) {
    const float id = d != 0.0f ? 1 / d : 0.0f;
    uint8_t L[32];
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_level(id * x[j]);
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

void qw_quantize_iq4_nl(const float *src, void *dst, int64_t n) {
    qw_block_iq4_nl *y = dst;
    for (int64_t i = 0; i < n / QW_QK; i++) {
        const float *x = src + i * QW_QK;
        qw_block_iq4_nl b;
        float d = fit_scale_iq4(x);
        b.d = qw_f32_to_f16(d);
        pack_iq4(x, d, b.qs); /* against the unrounded scale, as ggml does */
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_quantize_iq4_xs(const float *src, void *dst, int64_t n) {
    qw_block_iq4_xs *y = dst;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        const float *x = src + i * QW_QK_K;
        qw_block_iq4_xs b;
        float scales[8], max_scale = 0, amax_scale = 0;
        for (int s = 0; s < 8; s++) {
            scales[s] = fit_scale_iq4(x + 32 * s);
            if (fabsf(scales[s]) > amax_scale) {
                amax_scale = fabsf(scales[s]);
                max_scale = scales[s];
            }
        }
        /* 6-bit signed sub-block scales against d = -max_scale / 32 (an all-zero block gets d = -0) */
        const float d = -max_scale / 32;
        const float id = d != 0.0f ? 1 / d : 0.f;
        b.d = qw_f32_to_f16(d);
        b.scales_h = 0;
        memset(b.scales_l, 0, sizeof(b.scales_l));
        for (int s = 0; s < 8; s++) {
            int l = clampi(qw_nearest_int(id * scales[s]), -32, 31);
            pack_iq4(x + 32 * s, d * (float)l, b.qs + 16 * s);
            l += 32;
            b.scales_l[s / 2] |= (uint8_t)((l & 0xF) << (4 * (s % 2)));
            b.scales_h |= (uint16_t)((l >> 4) << (2 * s));
        }
        memcpy(&y[i], &b, sizeof(b));
    }
}

void qw_dequantize_iq4_nl(const void *src, float *dst, int64_t n) {
    qw_block_iq4_nl b;
    for (int64_t i = 0; i < n / QW_QK; i++, dst += QW_QK) {
        memcpy(&b, (const uint8_t *)src + i * sizeof(b), sizeof(b));
        const float d = qw_f16_to_f32(b.d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)qw_kvalues_iq4nl[b.qs[j] & 0xF];
            dst[j + 16] = d * (float)qw_kvalues_iq4nl[b.qs[j] >> 4];
        }
    }
}

void qw_dequantize_iq4_xs(const void *src, float *dst, int64_t n) {
    qw_block_iq4_xs b;
    for (int64_t i = 0; i < n / QW_QK_K; i++) {
        memcpy(&b, (const uint8_t *)src + i * sizeof(b), sizeof(b));
        const float d = qw_f16_to_f32(b.d);
        for (int s = 0; s < 8; s++, dst += 32) {
            const int ls = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((b.scales_h >> (2 * s)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            const uint8_t *qs = b.qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                dst[j] = dl * (float)qw_kvalues_iq4nl[qs[j] & 0xF];
                dst[j + 16] = dl * (float)qw_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}
