/*
 * avx2.c - AVX2 + FMA + F16C kernels of the CPU backend; see cpu.h for the contract.
 *
 * As avx512.c with 8 lanes: bf16 widened by a zero-extend and a 16-bit shift, f16 by vcvtph2ps, one
 * 8-lane accumulator per output, FMA in the row order, a fixed reduction tree. AVX2 has no 16-bit masked
 * load, so the tail of a bf16/f16 row goes through a zero-padded copy; f32 tails use vmaskmovps. Tiles
 * are 4 rows x 2 tokens: 8 accumulators + 2 activation vectors + 1 weight vector fit the 16 registers.
 *
 * The integer tiles of quantized weights (.qtile) are in avx2_q.c. Only these two files are compiled for
 * AVX2 (the pragma below); cpu.c calls in here only when cpuid says the CPU has it. On other architectures
 * they are empty.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/expd.h"
#include "kernels/qtiles.h"

#define LANES 8
#define QW_INLINE static inline __attribute__((always_inline))

/* lanes [0, n) of a vmaskmovps mask */
QW_INLINE __m256i lane_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

QW_INLINE __m256 widen(qw_type type, __m128i h) {
    if (type == QW_TYPE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* 8 weights from element c of a row as f32; a tail of n_tail < 8 elements reads only those (rest 0). */
QW_INLINE __m256 load_w(qw_type type, const char *row, int64_t c, int64_t n_tail) {
    if (type == QW_TYPE_Q8_0) { /* block of 32: f16 scale d, 32 int8 q; q*d is exact in f32. Rows are whole
                                 * blocks and c a multiple of 8, so 8 lanes never straddle two blocks. */
        const char *blk = row + (c / 32) * 34;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + c % 32))));
        (void)n_tail;
        return _mm256_mul_ps(q, _mm256_set1_ps(_cvtsh_ss(dh)));
    }
    if (type == QW_TYPE_F32)
        return n_tail ? _mm256_maskload_ps((const float *)(row + c * 4), lane_mask(n_tail))
                      : _mm256_loadu_ps((const float *)(row + c * 4));
    if (!n_tail) return widen(type, _mm_loadu_si128((const __m128i *)(row + c * 2)));
    uint16_t buf[LANES] = {0};
    memcpy(buf, row + c * 2, (size_t)n_tail * 2);
    return widen(type, _mm_loadu_si128((const __m128i *)buf));
}

/* The fixed reduction: 8 -> 4 -> 2 -> 1. */
QW_INLINE float hsum(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

QW_INLINE void tile_nxm(qw_type type, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws, const float *x,
                        int64_t ldx, int64_t n) {
    const char *wr[4];
    __m256 acc[4][2], xv[2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        wr[r] = (const char *)w + (size_t)r * ws;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    }
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES) {
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 wv = load_w(type, wr[r], c, 0);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (c < n) {
        __m256i m = lane_mask(n - c);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) xv[t] = _mm256_maskload_ps(x + t * ldx + c, m);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 wv = load_w(type, wr[r], c, n - c);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]);
}

/* Any nr <= 4, nt <= 2 from the shapes 4x2, 4x1, 1x2, 1x1. */
QW_INLINE void tile_any(qw_type type, float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx,
                        int nr, int nt, int64_t n) {
    if (nr == 4 && nt == 2) {
        tile_nxm(type, 4, 2, y, ldy, w, ws, x, ldx, n);
    } else if (nr == 4) {
        for (int t = 0; t < nt; t++) tile_nxm(type, 4, 1, y + t * ldy, ldy, w, ws, x + t * ldx, ldx, n);
    } else if (nt == 2) {
        for (int r = 0; r < nr; r++) tile_nxm(type, 1, 2, y + r, ldy, (const char *)w + r * ws, ws, x, ldx, n);
    } else {
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++)
                tile_nxm(type, 1, 1, y + t * ldy + r, ldy, (const char *)w + r * ws, ws, x + t * ldx, ldx, n);
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
static void tile_q8_0(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                      int64_t n) {
    tile_any(QW_TYPE_Q8_0, y, ldy, w, ws, x, ldx, nr, nt, n);
}
static void tile_f16(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                     int64_t n) {
    tile_any(QW_TYPE_F16, y, ldy, w, ws, x, ldx, nr, nt, n);
}

static void decay_acc(float *S, float d, float *acc, float k, int n) {
    __m256 vd = _mm256_set1_ps(d), vk = _mm256_set1_ps(k);
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(S + i), vd);
        _mm256_storeu_ps(S + i, s);
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vk, s, _mm256_loadu_ps(acc + i)));
    }
    if (i < n) {
        __m256i m = lane_mask(n - i);
        __m256 s = _mm256_mul_ps(_mm256_maskload_ps(S + i, m), vd);
        _mm256_maskstore_ps(S + i, m, s);
        _mm256_maskstore_ps(acc + i, m, _mm256_fmadd_ps(vk, s, _mm256_maskload_ps(acc + i, m)));
    }
}

static void rank1_acc(float *S, const float *u, float k, float *acc, float q, int n) {
    __m256 vk = _mm256_set1_ps(k), vq = _mm256_set1_ps(q);
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256 s = _mm256_fmadd_ps(vk, _mm256_loadu_ps(u + i), _mm256_loadu_ps(S + i));
        _mm256_storeu_ps(S + i, s);
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vq, s, _mm256_loadu_ps(acc + i)));
    }
    if (i < n) {
        __m256i m = lane_mask(n - i);
        __m256 s = _mm256_fmadd_ps(vk, _mm256_maskload_ps(u + i, m), _mm256_maskload_ps(S + i, m));
        _mm256_maskstore_ps(S + i, m, s);
        _mm256_maskstore_ps(acc + i, m, _mm256_fmadd_ps(vq, s, _mm256_maskload_ps(acc + i, m)));
    }
}

static void scale_axpy(float *y, float s, float a, const float *x, int n) {
    __m256 vs = _mm256_set1_ps(s), va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_mul_ps(_mm256_loadu_ps(y + i), vs)));
    if (i < n) {
        __m256i m = lane_mask(n - i);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(y + i, m), vs);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), v));
    }
}

/* e^x of 4 doubles (expd.h) */
QW_INLINE __m256d expd4(__m256d x) {
    static const double c[QW_EXPD_N_COEF] = QW_EXPD_COEFS;
    x = _mm256_min_pd(_mm256_max_pd(x, _mm256_set1_pd(QW_EXPD_LO)), _mm256_set1_pd(QW_EXPD_HI));
    __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(QW_EXPD_INV_LN2)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(QW_EXPD_LN2_HI), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(QW_EXPD_LN2_LO), r);
    __m256d p = _mm256_set1_pd(c[0]);
    for (int i = 1; i < QW_EXPD_N_COEF; i++) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c[i]));
    /* 2^n built from its exponent bits: n is an integer in [-150, 128] */
    __m128i e = _mm_add_epi32(_mm256_cvtpd_epi32(n), _mm_set1_epi32(1023));
    return _mm256_mul_pd(p, _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(e), 52)));
}

/* e^-x of 8 floats, each rounded once to f32 (-x where x is NaN, as qw_expd) */
QW_INLINE __m256 exp_neg8(__m256 x) {
    __m256 nx = _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
    __m128 lo = _mm256_cvtpd_ps(expd4(_mm256_cvtps_pd(_mm256_castps256_ps128(nx))));
    __m128 hi = _mm256_cvtpd_ps(expd4(_mm256_cvtps_pd(_mm256_extractf128_ps(nx, 1))));
    return _mm256_blendv_ps(_mm256_set_m128(hi, lo), nx, _mm256_cmp_ps(nx, nx, _CMP_UNORD_Q));
}

/* x[i] = num(x[i]) / (1 + e^-x[i]): num is 1 (sigmoid) or x (silu); the tail through masked loads */
QW_INLINE void gate8(float *x, int64_t n, int silu) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += LANES) {
        __m256i m = lane_mask(n - i >= LANES ? LANES : (int)(n - i));
        __m256 v = _mm256_maskload_ps(x + i, m);
        __m256 d = _mm256_add_ps(one, exp_neg8(v));
        _mm256_maskstore_ps(x + i, m, _mm256_div_ps(silu ? v : one, d));
    }
}
static void sigmoid(float *x, int64_t n) { gate8(x, n, 0); }
static void silu(float *x, int64_t n) { gate8(x, n, 1); }

static void axpy(float *y, const float *a, float s, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    for (int64_t i = 0; i < n; i += LANES) {
        __m256i m = lane_mask(n - i >= LANES ? LANES : (int)(n - i));
        __m256 p = _mm256_mul_ps(_mm256_maskload_ps(a + i, m), vs);
        _mm256_maskstore_ps(y + i, m, _mm256_add_ps(_mm256_maskload_ps(y + i, m), p));
    }
}

static void mul(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i += LANES) {
        __m256i m = lane_mask(n - i >= LANES ? LANES : (int)(n - i));
        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
    }
}

static void rms_norm_row(float *y, const float *x, const float *w, int dim, float eps, int zc) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (int i = 0; i < dim; i += LANES) {
        __m256 v = _mm256_maskload_ps(x + i, lane_mask(dim - i >= LANES ? LANES : dim - i));
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0); /* (double)x * x is exact: one rounding per addition, as ref.c */
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    __m256 inv = _mm256_set1_ps((float)(1.0 / sqrt(ss / dim + eps)));
    for (int i = 0; i < dim; i += LANES) {
        __m256i m = lane_mask(dim - i >= LANES ? LANES : dim - i);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv);
        if (w) {
            __m256 sw = _mm256_maskload_ps(w + i, m);
            v = _mm256_mul_ps(v, zc ? _mm256_add_ps(_mm256_set1_ps(1.0f), sw) : sw);
        }
        _mm256_maskstore_ps(y + i, m, v);
    }
}

/* QSA block scores (cpu.h), as avx512.c's: 4 blocks side by side in the lanes, keys gathered a dimension at a
 * time and shared by 4 heads, each lane's dot the double sum over d in order (exact products: a fused
 * multiply-add rounds as ref.c's multiply then add), relu'd dots added in float in head order. */
static void qsa_scores(float *score, const float *q, const float *blk, int n_b, int n_head, int ihd, float inv_sqrt) {
    const __m128i idx = _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(ihd));
    for (int b0 = 0; b0 < n_b; b0 += 4) {
        int nb = n_b - b0 < 4 ? n_b - b0 : 4;
        __m128i mi = _mm_cmpgt_epi32(_mm_set1_epi32(nb), _mm_setr_epi32(0, 1, 2, 3));
        __m128 m = _mm_castsi128_ps(mi);
        const float *base = blk + (int64_t)b0 * ihd;
        __m128 s = _mm_setzero_ps();
        for (int h0 = 0; h0 < n_head; h0 += 4) {
            int nh = n_head - h0 < 4 ? n_head - h0 : 4;
            const float *qh = q + (int64_t)h0 * ihd;
            __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < ihd; d++) {
                __m256d k = _mm256_cvtps_pd(_mm_mask_i32gather_ps(_mm_setzero_ps(), base + d, idx, m, 4));
                a0 = _mm256_fmadd_pd(_mm256_set1_pd(qh[d]), k, a0);
                if (nh > 1) a1 = _mm256_fmadd_pd(_mm256_set1_pd(qh[ihd + d]), k, a1);
                if (nh > 2) a2 = _mm256_fmadd_pd(_mm256_set1_pd(qh[2 * ihd + d]), k, a2);
                if (nh > 3) a3 = _mm256_fmadd_pd(_mm256_set1_pd(qh[3 * ihd + d]), k, a3);
            }
            __m256d acc[4] = {a0, a1, a2, a3};
            const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6); /* 64-bit lane masks to 32-bit */
            for (int j = 0; j < nh; j++) {
                __m256i gt = _mm256_castpd_si256(_mm256_cmp_pd(acc[j], _mm256_setzero_pd(), _CMP_GT_OQ));
                __m128 pos = _mm_castsi128_ps(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(gt, pick)));
                /* lanes whose dot is not > 0 add +0.0f, which leaves s as it is (s >= +0: it starts at +0) */
                s = _mm_add_ps(s, _mm_and_ps(_mm256_cvtpd_ps(acc[j]), pos));
            }
        }
        __m128 r = _mm_mul_ps(s, _mm_set1_ps(inv_sqrt));
        _mm_maskstore_ps(score + b0, mi, r);
    }
}

/* The avx2 table with the integer tiles of build v (avx2_q.c) */
#define AVX2_TABLE(v)                                                                                              \
    {                                                                                                              \
        .name = "avx2", .simd = QW_SIMD_AVX2, .lanes = LANES, .tile_nr = 4, .tile_nt = 2,                                                \
        .tile = {[QW_TYPE_F32] = tile_f32, [QW_TYPE_BF16] = tile_bf16, [QW_TYPE_F16] = tile_f16,                   \
                 [QW_TYPE_Q8_0] = tile_q8_0},                                                                      \
        .qtile = {QW_QTILE_LIST(QW_QTILE_INIT, v)}, .qtile_nt = 1 << 16, .decay_acc = decay_acc,                   \
        .rank1_acc = rank1_acc, .scale_axpy = scale_axpy, .sigmoid = sigmoid, .silu = silu,                        \
        .rms_norm_row = rms_norm_row, .axpy = axpy, .mul = mul, .qsa_scores = qsa_scores,                          \
    }

const qw_cpu_kernels qw_kernels_avx2 = AVX2_TABLE(avx2);
/* The same with the K-quant rows' prefetch tuned for Intel (avx2_q.c); cpu.c offers it, under the same name, on
 * Intel CPUs. */
const qw_cpu_kernels qw_kernels_avx2_intel = AVX2_TABLE(avx2i);

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* __x86_64__ */
