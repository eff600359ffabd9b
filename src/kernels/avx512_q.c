/*
 * avx512_q.c - AVX-512 VNNI integer dot kernels of block-quantized weights against 8-bit activations
 * (q8a.h); the scalar oracle is qw_q8a_dot_ref, the contract of a tile is cpu.h's qw_qtile_fn.
 *
 * Sixty-four weights (two groups of 32) at a time: each type's unpack gives them as 64 bytes, a per-lane
 * f32 scale A (lane l covers elements 4l .. 4l+3, so a scale may change every 4 elements: Q6_K's 16-element
 * sub-blocks fit) and, for the types with a min, the two groups' B. vpdpbusd multiplies unsigned by signed
 * bytes, so weights that can be negative are split into |w| and their sign, moved onto the activation
 * (a -> -a where w < 0; a is never -128). Each lane's integer sum (at most 4 * 127 * 127) is exact in f32;
 * acc += isum * (A * d_act) per lane, the B terms beside it in a scalar, then the fixed 16 -> 1 tree.
 * The result depends only on the row and the token, never on the tile shape or the thread count.
 * Error against the reference: |tile - qw_q8a_dot_ref| <= (n/32 + 16) * 2^-24 * qw_q8a_dot_abs
 * (tests/t_qkernels.c).
 *
 * Only this file and avx512.c are compiled for AVX-512; cpu.c uses them only when cpuid reports
 * AVX-512 F/BW/VL and VNNI.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "kernels/qtiles.h"
#include "tensor/quant.h"

#define QW_INLINE static inline __attribute__((always_inline))

QW_INLINE float f16(const void *p) { return _cvtsh_ss(qw_rd16(p)); }

/* lanes 0-7 = a, lanes 8-15 = b */
QW_INLINE __m512 halves(float a, float b) { return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b)); }

QW_INLINE __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* 32 bytes of nibbles -> low nibbles then high nibbles (Q4_0 packing of a group: 16 bytes -> 32 values) */
QW_INLINE __m256i nibbles16(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* Does the type's unpack give signed bytes (then the sign trick is needed) / group mins (B)? */
QW_INLINE int type_signed(qw_type t) { return t == QW_TYPE_Q8_0 || t == QW_TYPE_Q4_0 || t == QW_TYPE_Q5_0 || t == QW_TYPE_Q6_K || t == QW_TYPE_IQ4_NL || t == QW_TYPE_IQ4_XS; }
QW_INLINE int type_has_min(qw_type t) { return t == QW_TYPE_Q4_1 || t == QW_TYPE_Q5_1 || t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K; }

/*
 * Groups g and g+1 (g even; `two` = 0: only group g, the rest zero) of a row: 64 weight bytes w, the
 * per-lane scale A, and the groups' mins B[2] (types with a min).
 */
QW_INLINE void unpack(qw_type t, const uint8_t *row, int64_t g, int two, __m512i *w, __m512 *A, float B[2]) {
    switch (t) {
    case QW_TYPE_Q8_0: {
        const uint8_t *b = row + g * 34;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 2));
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b + 36)) : _mm256_setzero_si256();
        *w = join(lo, hi);
        *A = halves(f16(b), two ? f16(b + 34) : 0.0f);
        return;
    }
    case QW_TYPE_Q4_K: { /* groups g, g+1 = sub-blocks j, j+1 of one super-block: low / high nibbles of 32 bytes */
        const uint8_t *b = row + g / 8 * 144;
        int j = (int)(g % 8);
        uint8_t sc0, m0, sc1, m1;
        qw_k4_scale_min(j, b + 4, &sc0, &m0);
        qw_k4_scale_min(j + 1, b + 4, &sc1, &m1);
        float d = f16(b), dmin = f16(b + 2);
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 16 * j)), m = _mm256_set1_epi8(0x0F);
        *w = join(_mm256_and_si256(q, m), _mm256_and_si256(_mm256_srli_epi16(q, 4), m));
        *A = halves(d * sc0, d * sc1);
        B[0] = -dmin * m0;
        B[1] = -dmin * m1;
        return;
    }
    default:
        __builtin_unreachable();
    }
}

/* The fixed reduction: 16 -> 8 -> 4 -> 2 -> 1. */
QW_INLINE float hsum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* An NR x NT tile (compile-time sizes once inlined). */
QW_INLINE void qtile_nxm(qw_type T, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x,
                         int64_t ldx, int64_t n) {
    __m512 acc[4][4];
    float accB[4][4];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) {
            acc[r][t] = _mm512_setzero_ps();
            accB[r][t] = 0;
        }
    int64_t ng = n / 32;
    for (int64_t g = 0; g < ng; g += 2) {
        int two = g + 1 < ng;
        __m512i wv[4], av[4];
        __m512 A[4], D[4];
        __mmask64 neg[4];
        float B[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            unpack(T, (const uint8_t *)w + (size_t)r * ws, g, two, &wv[r], &A[r], B[r]);
            if (type_signed(T)) {
                neg[r] = _mm512_movepi8_mask(wv[r]);
                wv[r] = _mm512_abs_epi8(wv[r]);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const qw_q8a *xa = x + t * ldx + g;
            __m256i hi = two ? _mm256_loadu_si256((const __m256i *)xa[1].q) : _mm256_setzero_si256();
            av[t] = join(_mm256_loadu_si256((const __m256i *)xa[0].q), hi);
            D[t] = halves(xa[0].d, two ? xa[1].d : 0.0f);
            if (type_has_min(T))
                for (int r = 0; r < NR; r++)
                    accB[r][t] += B[r][0] * (xa[0].d * (float)xa[0].s) + (two ? B[r][1] * (xa[1].d * (float)xa[1].s) : 0.0f);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i a = type_signed(T) ? _mm512_mask_sub_epi8(av[t], neg[r], _mm512_setzero_si512(), av[t]) : av[t];
                __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], a);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(A[r], D[t]), acc[r][t]);
            }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]) + accB[r][t];
}

/* Any nr <= 4, nt <= 4 from the specialised shapes 4x4, 4x1, 1x4, 1x1 (each output is computed the same
 * way in all of them). */
QW_INLINE void qtile_any(qw_type T, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                         int nr, int nt, int64_t n) {
    if (nr == 4 && nt == 4) {
        qtile_nxm(T, 4, 4, y, ldy, w, ws, x, ldx, n);
    } else if (nr == 4) {
        for (int t = 0; t < nt; t++) qtile_nxm(T, 4, 1, y + t * ldy, ldy, w, ws, x + t * ldx, ldx, n);
    } else if (nt == 4) {
        for (int r = 0; r < nr; r++) qtile_nxm(T, 1, 4, y + r, ldy, (const char *)w + r * ws, ws, x, ldx, n);
    } else {
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++)
                qtile_nxm(T, 1, 1, y + t * ldy + r, ldy, (const char *)w + r * ws, ws, x + t * ldx, ldx, n);
    }
}

#define QTILE(T, name)                                                                                             \
    void qw_avx512_qtile_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,     \
                                int nr, int nt, int64_t n) {                                                       \
        qtile_any(T, y, ldy, w, ws, x, ldx, nr, nt, n);                                                            \
    }
QTILE(QW_TYPE_Q8_0, q8_0)
QTILE(QW_TYPE_Q4_K, q4_K)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* __x86_64__ */
