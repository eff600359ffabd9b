/*
 * neon_q.c - AdvSIMD integer dot kernels of block-quantized weights against 8-bit activations (q8a.h) on
 * AArch64; the scalar oracle is qw_q8a_dot_ref, the contract of a tile is cpu.h's qw_qtile_fn.
 *
 * One group of 32 weights at a time, as in avx512_q.c: each type's unpack gives the group as 32 signed
 * bytes (two int8x16), a float scale A (the block's f16 scale times the sub-block scale, a product exact
 * in f32: 11 + 7 bits) and the group's min B (types with one). Q6_K has a scale per 16 elements: its two
 * int8 scales multiply the two halves' integer sums instead (|sc (q - 32) a| * 8 < 2^23, exact). NEON's
 * integer dots are signed x signed, so no sign trick is needed. Lane l of a group's int32x4 sum covers
 * elements 4l .. 4l+3 of each half of 16, at most 8 * 128 * 127 (Q6_K: 4.2e6) in magnitude: exact in
 * f32. Then acc += isum * (A * d_act) per lane (vfmaq), the B terms beside it in a scalar, and the fixed
 * tree (l0 + l2) + (l1 + l3). The result depends only on the row and the token, never on the tile shape
 * or the thread count. Error against the reference: |tile - qw_q8a_dot_ref| <= (n/32 + 16) * 2^-24 *
 * qw_q8a_dot_abs (tests/t_qkernels.c).
 *
 * Two builds of every tile, from one template that takes the 16-byte integer dot as a parameter:
 *   qw_neondot_*  sdot (vdotq_s32), Armv8.2 dot product: these functions alone are compiled for
 *                 armv8.2-a+dotprod (a target attribute), and cpu.c uses them only when the kernel's
 *                 hwcaps report ASIMDDP;
 *   qw_neon_*     smull + saddlp/addp, for every AArch64 CPU.
 * Both put the same products in the same lanes, so their integer sums and results are bit-identical.
 * Clang before 16 declares vdotq_s32 only when the whole file targets dotprod; there (and only there)
 * the qw_neondot_* tiles fall back to the smull dot. On other architectures this file is empty.
 */
#if defined(__aarch64__)

#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

#include "kernels/qtiles.h"
#include "tensor/quant.h"

#define QW_INLINE static inline __attribute__((always_inline))

#if !defined(__clang__) || __clang_major__ >= 16 || defined(__ARM_FEATURE_DOTPROD)
#define HAVE_SDOT 1
#if defined(__clang__)
#define TARGET_DOTPROD __attribute__((target("dotprod")))
#else
#define TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#else
#define HAVE_SDOT 0
#define TARGET_DOTPROD
#endif

/* acc[l] += sum_{i < 4} w[4l + i] * a[4l + i]: the lane layout of sdot, which the smull dot mirrors */
typedef int32x4_t (*idot_fn)(int32x4_t acc, int8x16_t w, int8x16_t a);

QW_INLINE int32x4_t idot_smull(int32x4_t acc, int8x16_t w, int8x16_t a) {
    int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a)), hi = vmull_high_s8(w, a); /* |p| <= 128 * 127 */
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}

#if HAVE_SDOT
TARGET_DOTPROD QW_INLINE int32x4_t idot_sdot(int32x4_t acc, int8x16_t w, int8x16_t a) { return vdotq_s32(acc, w, a); }
#else
#define idot_sdot idot_smull
#endif

QW_INLINE float f16(const uint8_t *p) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(qw_rd16(p)))), 0);
}

/* 16 nibbles of 16 bytes: the low ones (elements 0-15 of a Q4_0-packed group) or the high ones (16-31) */
QW_INLINE uint8x16_t lo_nib(uint8x16_t q) { return vandq_u8(q, vdupq_n_u8(0x0F)); }
QW_INLINE uint8x16_t hi_nib(uint8x16_t q) { return vshrq_n_u8(q, 4); }

/* 0x10 in byte i where bit i of the 16 bits is set (the fifth bit of Q5_0 / Q5_1) */
QW_INLINE uint8x16_t bit4_of(uint32_t bits16) {
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)bits16), vdup_n_u8((uint8_t)(bits16 >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(sel)), vdupq_n_u8(0x10));
}

QW_INLINE int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

QW_INLINE int type_has_min(qw_type t) {
    return t == QW_TYPE_Q4_1 || t == QW_TYPE_Q5_1 || t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K;
}

/*
 * Group g of a row: w[0] = elements 0-15, w[1] = 16-31 as signed bytes; the scale A and min B (0 for the
 * types without one); for Q6_K the two halves' integer scales sc[2] (A is then the block's d).
 */
QW_INLINE void unpack(qw_type t, const uint8_t *row, int64_t g, int8x16_t w[2], float *A, float *B, int32_t sc[2]) {
    *B = 0;
    switch (t) {
    case QW_TYPE_Q8_0: {
        const uint8_t *b = row + g * sizeof(qw_block_q8_0);
        *A = f16(b);
        w[0] = vld1q_s8((const int8_t *)b + 2);
        w[1] = vld1q_s8((const int8_t *)b + 18);
        return;
    }
    case QW_TYPE_Q4_0:
    case QW_TYPE_IQ4_NL: {
        const uint8_t *b = row + g * (t == QW_TYPE_Q4_0 ? sizeof(qw_block_q4_0) : sizeof(qw_block_iq4_nl));
        uint8x16_t q = vld1q_u8(b + 2);
        *A = f16(b);
        if (t == QW_TYPE_Q4_0) {
            w[0] = vsubq_s8(s8(lo_nib(q)), vdupq_n_s8(8));
            w[1] = vsubq_s8(s8(hi_nib(q)), vdupq_n_s8(8));
        } else {
            int8x16_t kv = vld1q_s8(qw_kvalues_iq4nl);
            w[0] = vqtbl1q_s8(kv, lo_nib(q));
            w[1] = vqtbl1q_s8(kv, hi_nib(q));
        }
        return;
    }
    case QW_TYPE_Q4_1: {
        const uint8_t *b = row + g * sizeof(qw_block_q4_1);
        uint8x16_t q = vld1q_u8(b + 4);
        *A = f16(b);
        *B = f16(b + 2);
        w[0] = s8(lo_nib(q));
        w[1] = s8(hi_nib(q));
        return;
    }
    case QW_TYPE_Q5_0:
    case QW_TYPE_Q5_1: {
        const uint8_t *b = row + g * (t == QW_TYPE_Q5_0 ? sizeof(qw_block_q5_0) : sizeof(qw_block_q5_1));
        int off = t == QW_TYPE_Q5_0 ? 2 : 4; /* qh after d (and m) */
        uint32_t qh = qw_rd32(b + off);
        uint8x16_t q = vld1q_u8(b + off + 4);
        *A = f16(b);
        uint8x16_t q0 = vorrq_u8(lo_nib(q), bit4_of(qh & 0xFFFF)), q1 = vorrq_u8(hi_nib(q), bit4_of(qh >> 16));
        if (t == QW_TYPE_Q5_1) {
            *B = f16(b + 2);
            w[0] = s8(q0);
            w[1] = s8(q1);
        } else {
            w[0] = vsubq_s8(s8(q0), vdupq_n_s8(16));
            w[1] = vsubq_s8(s8(q1), vdupq_n_s8(16));
        }
        return;
    }
    case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_K: { /* sub-block j: the low (j even) or high nibbles of 32 bytes; Q5_K: bit j of qh[l] */
        int j = (int)(g % 8);
        const uint8_t *b = row + g / 8 * (t == QW_TYPE_Q4_K ? sizeof(qw_block_q4_K) : sizeof(qw_block_q5_K));
        const uint8_t *qh = b + 4 + QW_K_SCALE_SIZE, *qs = t == QW_TYPE_Q4_K ? qh : qh + QW_QK_K / 8;
        uint8_t scv, mn;
        qw_k4_scale_min(j, b + 4, &scv, &mn);
        *A = f16(b) * scv;
        *B = -f16(b + 2) * mn;
        uint8x16_t q0 = vld1q_u8(qs + 32 * (j / 2)), q1 = vld1q_u8(qs + 32 * (j / 2) + 16);
        q0 = j % 2 ? hi_nib(q0) : lo_nib(q0);
        q1 = j % 2 ? hi_nib(q1) : lo_nib(q1);
        if (t == QW_TYPE_Q5_K) {
            uint8x16_t m = vdupq_n_u8((uint8_t)(1u << j)), h = vdupq_n_u8(0x10);
            q0 = vorrq_u8(q0, vandq_u8(vtstq_u8(vld1q_u8(qh), m), h));
            q1 = vorrq_u8(q1, vandq_u8(vtstq_u8(vld1q_u8(qh + 16), m), h));
        }
        w[0] = s8(q0);
        w[1] = s8(q1);
        return;
    }
    case QW_TYPE_Q6_K: { /* 128-half h, 32-quarter k: 4 bits from ql, bits 2k, 2k+1 of qh as bits 4, 5 */
        const uint8_t *b = row + g / 8 * sizeof(qw_block_q6_K);
        int h = (int)(g % 8) / 4, k = (int)(g % 4);
        const uint8_t *ql = b + 64 * h + (k & 1) * 32, *qh = b + offsetof(qw_block_q6_K, qh) + 32 * h;
        const int8_t *scales = (const int8_t *)(b + offsetof(qw_block_q6_K, scales));
        int8x16_t up = vdupq_n_s8((int8_t)(4 - 2 * k)); /* shift left by 4 - 2k (right for k = 3) */
        uint8x16_t hm = vdupq_n_u8(0x30);
        uint8x16_t q0 = vld1q_u8(ql), q1 = vld1q_u8(ql + 16);
        q0 = vorrq_u8(k >= 2 ? hi_nib(q0) : lo_nib(q0), vandq_u8(vshlq_u8(vld1q_u8(qh), up), hm));
        q1 = vorrq_u8(k >= 2 ? hi_nib(q1) : lo_nib(q1), vandq_u8(vshlq_u8(vld1q_u8(qh + 16), up), hm));
        w[0] = vsubq_s8(s8(q0), vdupq_n_s8(32));
        w[1] = vsubq_s8(s8(q1), vdupq_n_s8(32));
        *A = f16(b + offsetof(qw_block_q6_K, d));
        sc[0] = scales[8 * h + 2 * k];
        sc[1] = scales[8 * h + 2 * k + 1];
        return;
    }
    case QW_TYPE_IQ4_XS: {
        const uint8_t *b = row + g / 8 * sizeof(qw_block_iq4_xs);
        int j = (int)(g % 8);
        int ls = ((b[offsetof(qw_block_iq4_xs, scales_l) + j / 2] >> 4 * (j % 2)) & 0xF) |
                 ((qw_rd16(b + offsetof(qw_block_iq4_xs, scales_h)) >> 2 * j) & 3) << 4;
        uint8x16_t q = vld1q_u8(b + offsetof(qw_block_iq4_xs, qs) + 16 * j);
        int8x16_t kv = vld1q_s8(qw_kvalues_iq4nl);
        *A = f16(b) * (float)(ls - 32);
        w[0] = vqtbl1q_s8(kv, lo_nib(q));
        w[1] = vqtbl1q_s8(kv, hi_nib(q));
        return;
    }
    default:
        __builtin_unreachable();
    }
}

/* The fixed reduction: (l0 + l2) + (l1 + l3). */
QW_INLINE float hsum(float32x4_t v) {
    float32x2_t h = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);
}

/* An NR x NT tile (compile-time sizes and integer dot once inlined). */
QW_INLINE void qtile_nxm(idot_fn idot, qw_type T, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws,
                         const qw_q8a *x, int64_t ldx, int64_t n) {
    float32x4_t acc[4][2];
    float accB[4][2];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) {
            acc[r][t] = vdupq_n_f32(0.0f);
            accB[r][t] = 0;
        }
    const int32x4_t zero = vdupq_n_s32(0);
    for (int64_t g = 0; g < n / 32; g++) {
        int8x16_t a[2][2];
        float d[2], ds[2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const qw_q8a *xa = x + t * ldx + g;
            a[t][0] = vld1q_s8(xa->q);
            a[t][1] = vld1q_s8(xa->q + 16);
            d[t] = xa->d;
            ds[t] = xa->d * (float)xa->s;
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            int8x16_t wv[2];
            float A, B;
            int32_t sc[2] = {0, 0};
            unpack(T, (const uint8_t *)w + (size_t)r * ws, g, wv, &A, &B, sc);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                int32x4_t is;
                if (T == QW_TYPE_Q6_K)
                    is = vmlaq_n_s32(vmulq_n_s32(idot(zero, wv[0], a[t][0]), sc[0]), idot(zero, wv[1], a[t][1]), sc[1]);
                else
                    is = idot(idot(zero, wv[0], a[t][0]), wv[1], a[t][1]);
                acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(is), A * d[t]);
                if (type_has_min(T)) accB[r][t] += B * ds[t];
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]) + accB[r][t];
}

/* Any nr <= 4, nt <= 4 from the shapes 4x2, 4x1, 1x2, 1x1, tokens two at a time (each output is computed
 * the same way in all of them). */
QW_INLINE void qtile_any(idot_fn idot, qw_type T, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x,
                         int64_t ldx, int nr, int nt, int64_t n) {
    for (int r0 = 0; r0 < nr; r0 += 4) { /* any nr (cpu.h): 4-row tiles, then the rest a row at a time */
        int nr4 = nr - r0 < 4 ? nr - r0 : 4;
        const char *w4 = (const char *)w + (size_t)r0 * ws;
        for (int t = 0; t < nt; t += 2) {
            float *yt = y + t * ldy + r0;
            const qw_q8a *xt = x + t * ldx;
            if (nr4 == 4 && nt - t >= 2) {
                qtile_nxm(idot, T, 4, 2, yt, ldy, w4, ws, xt, ldx, n);
            } else if (nr4 == 4) {
                qtile_nxm(idot, T, 4, 1, yt, ldy, w4, ws, xt, ldx, n);
            } else if (nt - t >= 2) {
                for (int r = 0; r < nr4; r++) qtile_nxm(idot, T, 1, 2, yt + r, ldy, w4 + r * ws, ws, xt, ldx, n);
            } else {
                for (int r = 0; r < nr4; r++) qtile_nxm(idot, T, 1, 1, yt + r, ldy, w4 + r * ws, ws, xt, ldx, n);
            }
        }
    }
}

#define QTILE(v, T, name)                                                                                          \
    QW_QTILE_PROTO(neon, T, name) { qtile_any(idot_smull, T, y, ldy, w, ws, x, ldx, nr, nt, n); }                 \
    TARGET_DOTPROD QW_QTILE_PROTO(neondot, T, name) { qtile_any(idot_sdot, T, y, ldy, w, ws, x, ldx, nr, nt, n); }
QW_QTILE_LIST(QTILE, -)

#endif /* __aarch64__ */
