/*
 * avx512.c - AVX-512 (F + BW + VL) kernels of the CPU backend; see cpu.h for the contract.
 *
 * Weights are widened to f32 exactly: bf16 by a zero-extend and a 16-bit shift, f16 by vcvtph2ps, so the
 * f32 activations are never rounded (vdpbf16ps would round them to bf16). One 16-lane accumulator per
 * output, FMA in the row order, the tail through a masked load, then a fixed reduction tree.
 *
 * Only this file is compiled for AVX-512 (the pragma below); the rest of the build stays generic x86-64,
 * and cpu.c calls in here only when cpuid says the CPU has it. On other architectures it is empty.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/expd.h"
#include "kernels/qtiles.h"

#define LANES 16
#define QW_INLINE static inline __attribute__((always_inline))

/* 16 weights from element c of a row, widened to f32; m selects the lanes to read (the rest are 0). */
QW_INLINE __m512 load_w(qw_type type, const char *row, int64_t c, __mmask16 m, int full) {
    if (type == QW_TYPE_Q8_0) { /* block of 32: f16 scale d, 32 int8 q; q*d is exact in f32. Rows are whole
                                 * blocks and c a multiple of 16, so 16 lanes never straddle two blocks. */
        const char *blk = row + (c / 32) * 34;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + c % 32))));
        return _mm512_mul_ps(q, _mm512_set1_ps(_cvtsh_ss(dh)));
    }
    if (type == QW_TYPE_F32) return full ? _mm512_loadu_ps(row + c * 4) : _mm512_maskz_loadu_ps(m, row + c * 4);
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)(row + c * 2)) : _mm256_maskz_loadu_epi16(m, row + c * 2);
    if (type == QW_TYPE_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The fixed reduction: 16 -> 8 -> 4 -> 2 -> 1. */
QW_INLINE float hsum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* An NR x NT tile (compile-time sizes once inlined): NR weight rows against NT token rows. */
QW_INLINE void tile_nxm(qw_type type, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws, const float *x,
                        int64_t ldx, int64_t n) {
    const char *wr[4];
    __m512 acc[4][4], xv[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        wr[r] = (const char *)w + (size_t)r * ws;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES) {
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512 wv = load_w(type, wr[r], c, 0, 1);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (c < n) {
        __mmask16 m = (__mmask16)((1u << (n - c)) - 1);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + c);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512 wv = load_w(type, wr[r], c, m, 0);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]);
}

/* Any nr <= 4, nt <= 4 from the four specialised shapes 4x4, 4x1, 1x4, 1x1. */
QW_INLINE void tile_any(qw_type type, float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx,
                        int nr, int nt, int64_t n) {
    if (nr == 4 && nt == 4) {
        tile_nxm(type, 4, 4, y, ldy, w, ws, x, ldx, n);
    } else if (nr == 4) {
        for (int t = 0; t < nt; t++) tile_nxm(type, 4, 1, y + t * ldy, ldy, w, ws, x + t * ldx, ldx, n);
    } else if (nt == 4) {
        for (int r = 0; r < nr; r++) tile_nxm(type, 1, 4, y + r, ldy, (const char *)w + r * ws, ws, x, ldx, n);
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

QW_INLINE __mmask16 tail_mask(int n) { return (__mmask16)((1u << n) - 1); }

static void decay_acc(float *S, float d, float *acc, float k, int n) {
    __m512 vd = _mm512_set1_ps(d), vk = _mm512_set1_ps(k);
    for (int i = 0; i < n; i += LANES) {
        __mmask16 m = n - i >= LANES ? 0xFFFF : tail_mask(n - i);
        __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, S + i), vd);
        _mm512_mask_storeu_ps(S + i, m, s);
        _mm512_mask_storeu_ps(acc + i, m, _mm512_fmadd_ps(vk, s, _mm512_maskz_loadu_ps(m, acc + i)));
    }
}

static void rank1_acc(float *S, const float *u, float k, float *acc, float q, int n) {
    __m512 vk = _mm512_set1_ps(k), vq = _mm512_set1_ps(q);
    for (int i = 0; i < n; i += LANES) {
        __mmask16 m = n - i >= LANES ? 0xFFFF : tail_mask(n - i);
        __m512 s = _mm512_fmadd_ps(vk, _mm512_maskz_loadu_ps(m, u + i), _mm512_maskz_loadu_ps(m, S + i));
        _mm512_mask_storeu_ps(S + i, m, s);
        _mm512_mask_storeu_ps(acc + i, m, _mm512_fmadd_ps(vq, s, _mm512_maskz_loadu_ps(m, acc + i)));
    }
}

static void scale_axpy(float *y, float s, float a, const float *x, int n) {
    __m512 vs = _mm512_set1_ps(s), va = _mm512_set1_ps(a);
    for (int i = 0; i < n; i += LANES) {
        __mmask16 m = n - i >= LANES ? 0xFFFF : tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), vs);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), v));
    }
}

/* e^x of 8 doubles (expd.h) */
QW_INLINE __m512d expd8(__m512d x) {
    static const double c[QW_EXPD_N_COEF] = QW_EXPD_COEFS;
    x = _mm512_min_pd(_mm512_max_pd(x, _mm512_set1_pd(QW_EXPD_LO)), _mm512_set1_pd(QW_EXPD_HI));
    __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(QW_EXPD_INV_LN2)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(QW_EXPD_LN2_HI), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(QW_EXPD_LN2_LO), r);
    __m512d p = _mm512_set1_pd(c[0]);
    for (int i = 1; i < QW_EXPD_N_COEF; i++) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c[i]));
    return _mm512_scalef_pd(p, n); /* p * 2^n; n is an integer in [-150, 128] */
}

/* e^-x of 16 floats, each rounded once to f32 (-x where x is NaN, as qw_expd) */
QW_INLINE __m512 exp_neg16(__m512 x) {
    __m512 nx = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
    __m256 lo = _mm512_cvtpd_ps(expd8(_mm512_cvtps_pd(_mm512_castps512_ps256(nx))));
    __m256 nx_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(nx), 1));
    __m256 hi = _mm512_cvtpd_ps(expd8(_mm512_cvtps_pd(nx_hi)));
    __m512d lh = _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1);
    __m512 e = _mm512_castpd_ps(lh);
    return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(nx, nx, _CMP_UNORD_Q), nx);
}

/* x[i] = num(x[i]) / (1 + e^-x[i]): num is 1 (sigmoid) or x (silu) */
QW_INLINE void gate16(float *x, int64_t n, int silu) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 m = n - i >= LANES ? 0xFFFF : tail_mask((int)(n - i));
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 d = _mm512_add_ps(one, exp_neg16(v));
        _mm512_mask_storeu_ps(x + i, m, _mm512_div_ps(silu ? v : one, d));
    }
}
static void sigmoid(float *x, int64_t n) { gate16(x, n, 0); }
static void silu(float *x, int64_t n) { gate16(x, n, 1); }

static void axpy(float *y, const float *a, float s, int64_t n) {
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 m = n - i >= LANES ? 0xFFFF : tail_mask((int)(n - i));
        __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), vs);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), p));
    }
}

static void mul(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 m = n - i >= LANES ? 0xFFFF : tail_mask((int)(n - i));
        __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(y + i, m, p);
    }
}

static void rms_norm_row(float *y, const float *x, const float *w, int dim, float eps, int zc) {
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int i = 0; i < dim; i += LANES) {
        __mmask16 m = dim - i >= LANES ? 0xFFFF : tail_mask(dim - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0); /* (double)x * x is exact: one rounding per addition, as ref.c */
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt(ss / dim + eps)));
    for (int i = 0; i < dim; i += LANES) {
        __mmask16 m = dim - i >= LANES ? 0xFFFF : tail_mask(dim - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
        if (w) {
            __m512 s = _mm512_maskz_loadu_ps(m, w + i);
            v = _mm512_mul_ps(v, zc ? _mm512_add_ps(_mm512_set1_ps(1.0f), s) : s);
        }
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* QSA block scores (cpu.h): 8 blocks side by side in the lanes, their keys gathered a dimension at a time and
 * shared by 4 heads; each lane's dot is the double sum over d in order (the float products are exact in double,
 * so a fused multiply-add rounds as ref.c's multiply then add), the heads' relu'd dots added in float in head
 * order: the reference's bits. */
static void qsa_scores(float *score, const float *q, const float *blk, int n_b, int n_head, int ihd, float inv_sqrt) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(ihd));
    for (int b0 = 0; b0 < n_b; b0 += 8) {
        int nb = n_b - b0 < 8 ? n_b - b0 : 8;
        __mmask8 m = (__mmask8)((1u << nb) - 1);
        const float *base = blk + (int64_t)b0 * ihd;
        __m256 s = _mm256_setzero_ps();
        for (int h0 = 0; h0 < n_head; h0 += 4) {
            int nh = n_head - h0 < 4 ? n_head - h0 : 4;
            const float *qh = q + (int64_t)h0 * ihd;
            __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < ihd; d++) {
                __m512d k = _mm512_cvtps_pd(_mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, idx, base + d, 4));
                a0 = _mm512_fmadd_pd(_mm512_set1_pd(qh[d]), k, a0);
                if (nh > 1) a1 = _mm512_fmadd_pd(_mm512_set1_pd(qh[ihd + d]), k, a1);
                if (nh > 2) a2 = _mm512_fmadd_pd(_mm512_set1_pd(qh[2 * ihd + d]), k, a2);
                if (nh > 3) a3 = _mm512_fmadd_pd(_mm512_set1_pd(qh[3 * ihd + d]), k, a3);
            }
            __m512d acc[4] = {a0, a1, a2, a3};
            for (int j = 0; j < nh; j++) {
                __mmask8 pos = _mm512_cmp_pd_mask(acc[j], _mm512_setzero_pd(), _CMP_GT_OQ);
                s = _mm256_mask_add_ps(s, pos, s, _mm512_cvtpd_ps(acc[j]));
            }
        }
        _mm256_mask_storeu_ps(score + b0, m, _mm256_mul_ps(s, _mm256_set1_ps(inv_sqrt)));
    }
}

/* The avx512 table with the integer tiles of build v (avx512_q.c) */
#define AVX512_TABLE(table_name, v)                                                                              \
    {                                                                                                              \
        .name = table_name, .simd = QW_SIMD_AVX512, .lanes = LANES, .tile_nr = 4, .tile_nt = 4,                                            \
        .tile = {[QW_TYPE_F32] = tile_f32, [QW_TYPE_BF16] = tile_bf16, [QW_TYPE_F16] = tile_f16,                   \
                 [QW_TYPE_Q8_0] = tile_q8_0},                                                                      \
        .qtile = {QW_QTILE_LIST(QW_QTILE_INIT, v)}, .qtile_nt = 1 << 16, .q8a_quantize = qw_avx512_q8a_quantize,  \
        .decay_acc = decay_acc, .rank1_acc = rank1_acc, .scale_axpy = scale_axpy, .sigmoid = sigmoid,              \
        .silu = silu, .rms_norm_row = rms_norm_row, .axpy = axpy, .mul = mul, .qsa_scores = qsa_scores,            \
    }

const qw_cpu_kernels qw_kernels_avx512 = AVX512_TABLE("avx512", avx512);
/* The same with decode's prefetch tuned for Intel (avx512_q.c, ROW_PREFETCH); cpu.c offers it, under the same
 * name, on Intel CPUs. */
const qw_cpu_kernels qw_kernels_avx512_intel = AVX512_TABLE("avx512", avx512i);
/* The same with AMX tile products for the integer dots of 16 tokens or more (avx512_q.c: the bits of the
 * avx512 table, faster); cpu.c offers it once the kernel has granted the tile state. */
const qw_cpu_kernels qw_kernels_amx = AVX512_TABLE("amx", amx);

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* __x86_64__ */
