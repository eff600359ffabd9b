/*
 * neon.c - AdvSIMD (NEON) kernels of the CPU backend on AArch64; see cpu.h for the contract.
 *
 * As avx2.c, with each 8-lane accumulator held in two float32x4 vectors (lanes 0-3, lanes 4-7): weights
 * widened to f32 exactly (bf16 by a 16-bit shift left, f16 by fcvtl, Q8_0 as q * d), FMA in the row
 * order, the tail of a row (n % 8 elements) through zero-padded copies, then the scalar variant's tree
 * 8 -> 4 -> 2 -> 1. Tiles are 4 rows x 2 tokens: 16 accumulator vectors + 4 activation vectors + 2
 * weight vectors of the 32 registers.
 *
 * AdvSIMD is part of every AArch64 CPU, so this file needs no target pragma. The integer tiles of the
 * quantized types are in neon_q.c, in two builds: with the dot-product instructions (sdot, Armv8.2+) and
 * without; cpu.c picks qw_kernels_neon_dotprod or qw_kernels_neon from the CPU's hwcaps. Both tables are
 * "neon": their integer sums are the same lane by lane, so their results are bit-identical.
 * On other architectures this file is empty.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/expd.h"
#include "kernels/qtiles.h"
#include "tensor/quant.h"

#define LANES 8
#define QW_INLINE static inline __attribute__((always_inline))

/* an f16 scale read at any alignment, widened by the hardware */
QW_INLINE float f16(const char *p) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(qw_rd16(p)))), 0);
}

/* 8 weights from element c of a row, widened exactly to f32: w[0] = lanes 0-3, w[1] = lanes 4-7. */
QW_INLINE void load_w(qw_type type, const char *row, int64_t c, float32x4_t w[2]) {
    const uint8_t *p = (const uint8_t *)row;
    if (type == QW_TYPE_F32) { /* byte loads: f32 rows in a safetensors file need not be aligned */
        w[0] = vreinterpretq_f32_u8(vld1q_u8(p + c * 4));
        w[1] = vreinterpretq_f32_u8(vld1q_u8(p + c * 4 + 16));
    } else if (type == QW_TYPE_Q8_0) { /* block of 32: f16 scale d, 32 int8 q; q*d is exact in f32. Rows are
                                        * whole blocks and c a multiple of 8: 8 lanes never straddle blocks. */
        const char *blk = row + (c / 32) * 34;
        float d = f16(blk);
        int16x8_t q = vmovl_s8(vld1_s8((const int8_t *)blk + 2 + c % 32));
        w[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d);
        w[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(q)), d);
    } else {
        uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(p + c * 2));
        if (type == QW_TYPE_BF16) {
            w[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
            w[1] = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
        } else {
            float16x8_t f = vreinterpretq_f16_u16(h);
            w[0] = vcvt_f32_f16(vget_low_f16(f));
            w[1] = vcvt_high_f32_f16(f);
        }
    }
}

/* The fixed reduction of the scalar variant: lane l += lane l+4, then l += l+2, then 0 += 1. */
QW_INLINE float hsum(const float32x4_t acc[2]) {
    float32x4_t s = vaddq_f32(acc[0], acc[1]);
    float32x2_t h = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

/* acc[r][t] += W[r][c .. c+8) * x[t][c .. c+8) for the NR rows and NT tokens at wr[r], xr[t] */
QW_INLINE void step(qw_type type, int NR, int NT, float32x4_t acc[4][2][2], const char *const wr[4],
                    const float *const xr[2], int64_t c) {
    float32x4_t xv[2][2], wv[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        xv[t][0] = vld1q_f32(xr[t] + c);
        xv[t][1] = vld1q_f32(xr[t] + c + 4);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        load_w(type, wr[r], c, wv);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            acc[r][t][0] = vfmaq_f32(acc[r][t][0], wv[0], xv[t][0]);
            acc[r][t][1] = vfmaq_f32(acc[r][t][1], wv[1], xv[t][1]);
        }
    }
}

/* An NR x NT tile (compile-time sizes once inlined): NR weight rows against NT token rows. */
QW_INLINE void tile_nxm(qw_type type, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws, const float *x,
                        int64_t ldx, int64_t n) {
    const char *wr[4];
    const float *xr[2];
    float32x4_t acc[4][2][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        wr[r] = (const char *)w + (size_t)r * ws;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[r][t][0] = acc[r][t][1] = vdupq_n_f32(0.0f);
    }
    for (int t = 0; t < NT; t++) xr[t] = x + t * ldx;
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES) step(type, NR, NT, acc, wr, xr, c);
    if (c < n) { /* the last n - c < 8 elements, zero-padded (Q8_0 rows are whole blocks: never here) */
        size_t es = type == QW_TYPE_F32 ? 4 : 2;
        char wt[4][LANES * 4];
        float xt[2][LANES];
        const char *wtr[4];
        const float *xtr[2];
        for (int r = 0; r < NR; r++) {
            memset(wt[r], 0, sizeof(wt[r]));
            memcpy(wt[r], wr[r] + c * es, (size_t)(n - c) * es);
            wtr[r] = wt[r];
        }
        for (int t = 0; t < NT; t++) {
            memset(xt[t], 0, sizeof(xt[t]));
            memcpy(xt[t], xr[t] + c, (size_t)(n - c) * sizeof(float));
            xtr[t] = xt[t];
        }
        step(type, NR, NT, acc, wtr, xtr, 0);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]);
}

/* Any nr <= 4 and nt (<= 2 by the table; more, two tokens at a time) from the shapes 4x2, 4x1, 1x2, 1x1. */
QW_INLINE void tile_any(qw_type type, float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx,
                        int nr, int nt, int64_t n) {
    for (int t = 0; t < nt; t += 2) {
        float *yt = y + t * ldy;
        const float *xt = x + t * ldx;
        if (nr == 4 && nt - t >= 2) {
            tile_nxm(type, 4, 2, yt, ldy, w, ws, xt, ldx, n);
        } else if (nr == 4) {
            tile_nxm(type, 4, 1, yt, ldy, w, ws, xt, ldx, n);
        } else if (nt - t >= 2) {
            for (int r = 0; r < nr; r++) tile_nxm(type, 1, 2, yt + r, ldy, (const char *)w + r * ws, ws, xt, ldx, n);
        } else {
            for (int r = 0; r < nr; r++) tile_nxm(type, 1, 1, yt + r, ldy, (const char *)w + r * ws, ws, xt, ldx, n);
        }
    }
}

static void tile_f32(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                     int64_t n) {
    tile_any(QW_TYPE_F32, y, ldy, w, ws, x, ldx, nr, nt, n);
}
static void tile_bf16(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                      int64_t n) {
    tile_any(QW_TYPE_BF16, y, ldy, w, ws, x, ldx, nr, nt, n);
}
static void tile_f16(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                     int64_t n) {
    tile_any(QW_TYPE_F16, y, ldy, w, ws, x, ldx, nr, nt, n);
}
static void tile_q8_0(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                      int64_t n) {
    tile_any(QW_TYPE_Q8_0, y, ldy, w, ws, x, ldx, nr, nt, n);
}

/* The row updates, 4 lanes at a time; the tail (n % 4) with fmaf, so every element is computed alike. */
static void decay_acc(float *S, float d, float *acc, float k, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t s = vmulq_n_f32(vld1q_f32(S + i), d);
        vst1q_f32(S + i, s);
        vst1q_f32(acc + i, vfmaq_n_f32(vld1q_f32(acc + i), s, k));
    }
    for (; i < n; i++) {
        S[i] *= d;
        acc[i] = fmaf(k, S[i], acc[i]);
    }
}

static void rank1_acc(float *S, const float *u, float k, float *acc, float q, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t s = vfmaq_n_f32(vld1q_f32(S + i), vld1q_f32(u + i), k);
        vst1q_f32(S + i, s);
        vst1q_f32(acc + i, vfmaq_n_f32(vld1q_f32(acc + i), s, q));
    }
    for (; i < n; i++) {
        S[i] = fmaf(k, u[i], S[i]);
        acc[i] = fmaf(q, S[i], acc[i]);
    }
}

static void scale_axpy(float *y, float s, float a, const float *x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(y + i), s), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i] * s);
}

/* e^x of 2 doubles (expd.h) */
QW_INLINE float64x2_t expd2(float64x2_t x) {
    static const double c[QW_EXPD_N_COEF] = QW_EXPD_COEFS;
    x = vminq_f64(vmaxq_f64(x, vdupq_n_f64(QW_EXPD_LO)), vdupq_n_f64(QW_EXPD_HI));
    float64x2_t n = vrndnq_f64(vmulq_n_f64(x, QW_EXPD_INV_LN2));
    float64x2_t r = vfmsq_f64(x, n, vdupq_n_f64(QW_EXPD_LN2_HI));
    r = vfmsq_f64(r, n, vdupq_n_f64(QW_EXPD_LN2_LO));
    float64x2_t p = vdupq_n_f64(c[0]);
    for (int i = 1; i < QW_EXPD_N_COEF; i++) p = vfmaq_f64(vdupq_n_f64(c[i]), p, r);
    /* 2^n built from its exponent bits: n is an integer in [-150, 128] */
    int64x2_t e = vshlq_n_s64(vaddq_s64(vcvtq_s64_f64(n), vdupq_n_s64(1023)), 52);
    return vmulq_f64(p, vreinterpretq_f64_s64(e));
}

/* e^-x of 4 floats, each rounded once to f32 (-x where x is NaN, as qw_expd) */
QW_INLINE float32x4_t exp_neg4(float32x4_t x) {
    float32x4_t nx = vnegq_f32(x);
    float32x4_t e = vcvt_high_f32_f64(vcvt_f32_f64(expd2(vcvt_f64_f32(vget_low_f32(nx)))), expd2(vcvt_high_f64_f32(nx)));
    return vbslq_f32(vceqq_f32(nx, nx), e, nx);
}

/* x[i] = num(x[i]) / (1 + e^-x[i]): num is 1 (sigmoid) or x (silu); the tail through a padded copy */
QW_INLINE void gate4(float *x, int64_t n, int silu) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (int64_t i = 0; i < n; i += 4) {
        float pad[4] = {0};
        int full = n - i >= 4;
        float *p = full ? x + i : pad;
        if (!full) memcpy(pad, x + i, (size_t)(n - i) * 4);
        float32x4_t v = vld1q_f32(p);
        vst1q_f32(p, vdivq_f32(silu ? v : one, vaddq_f32(one, exp_neg4(v))));
        if (!full) memcpy(x + i, pad, (size_t)(n - i) * 4);
    }
}
static void sigmoid(float *x, int64_t n) { gate4(x, n, 0); }
static void silu(float *x, int64_t n) { gate4(x, n, 1); }

static void axpy(float *y, const float *a, float s, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(vld1q_f32(a + i), s)));
    for (; i < n; i++) y[i] += a[i] * s; /* not fused: the build passes -ffp-contract=off */
}

static void mul(float *y, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
    for (; i < n; i++) y[i] = a[i] * b[i];
}

static void rms_norm_row(float *y, const float *x, const float *w, int dim, float eps, int zc) {
    float64x2_t s0 = vdupq_n_f64(0), s1 = vdupq_n_f64(0);
    int i = 0;
    for (; i + 4 <= dim; i += 4) { /* (double)x * x is exact: one rounding per addition, as ref.c */
        float32x4_t v = vld1q_f32(x + i);
        float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
        s0 = vfmaq_f64(s0, lo, lo);
        s1 = vfmaq_f64(s1, hi, hi);
    }
    double ss = vaddvq_f64(vaddq_f64(s0, s1));
    for (; i < dim; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / dim + eps));
    for (i = 0; i + 4 <= dim; i += 4) {
        float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), inv);
        if (w) v = vmulq_f32(v, zc ? vaddq_f32(vdupq_n_f32(1.0f), vld1q_f32(w + i)) : vld1q_f32(w + i));
        vst1q_f32(y + i, v);
    }
    for (; i < dim; i++) y[i] = x[i] * inv * (w ? (zc ? 1.0f + w[i] : w[i]) : 1.0f);
}

#define NEON_TABLE(v)                                                                                              \
    {                                                                                                              \
        .name = "neon", .simd = QW_SIMD_NEON, .lanes = LANES, .tile_nr = 4, .tile_nt = 2, .qtile_nt = 1 << 16,     \
        .tile = {[QW_TYPE_F32] = tile_f32, [QW_TYPE_BF16] = tile_bf16, [QW_TYPE_F16] = tile_f16,                   \
                 [QW_TYPE_Q8_0] = tile_q8_0},                                                                      \
        .qtile = {QW_QTILE_LIST(QW_QTILE_INIT, v)},                                                               \
        .decay_acc = decay_acc, .rank1_acc = rank1_acc, .scale_axpy = scale_axpy, .sigmoid = sigmoid,              \
        .silu = silu, .rms_norm_row = rms_norm_row, .axpy = axpy, .mul = mul,                                      \
    }

const qw_cpu_kernels qw_kernels_neon = NEON_TABLE(neon);
const qw_cpu_kernels qw_kernels_neon_dotprod = NEON_TABLE(neondot);

#endif /* __aarch64__ */
