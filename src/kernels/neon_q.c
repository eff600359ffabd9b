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
 * tree (l0 + l2) + (l1 + l3).
 *
 * Three paths (qtile_any): below 16 tokens, the K-quants and IQ4_XS a 256-element super-block per step
 * (ksb_tile: its scales decoded once, one FMA per four groups) and the other types a group per step in
 * 4 x 2 tiles; from 16 tokens on, 8-row blocks repacked once per call (rp_matmul: lane = row, one lane-indexed
 * dot per 4 elements of 4 rows, one FMA per group for 4 rows), whose f32 additions run in another order.
 * Within a path an output depends only on its row and token, never on the tile shape or the thread count.
 * Error against the reference, every path: |tile - qw_q8a_dot_ref| <= (n/32 + 16) * 2^-24 * qw_q8a_dot_abs
 * (tests/t_qkernels.c). These paths mirror avx512_q.c's; their speed has not been measured on Arm hardware
 * (tests/arm_check.sh checks their results under emulation).
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

/* the 32 activation bytes of a block as two int8x16 (elements 0-15, 16-31) */
QW_INLINE void act_bytes(const qw_q8a *xa, int8x16_t a[2]) {
    a[0] = vld1q_s8(xa->q);
    a[1] = vld1q_s8(xa->q + 16);
}

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

/* A group's integer sum against a token's activation bytes, lane l over elements 4l .. 4l+3 of each half (Q6_K:
 * the halves times their sub-block scales) */
QW_INLINE int32x4_t group_isum(idot_fn idot, qw_type T, const int8x16_t wv[2], const int8x16_t a[2],
                               const int32_t sc[2]) {
    const int32x4_t zero = vdupq_n_s32(0);
    if (T == QW_TYPE_Q6_K)
        return vmlaq_n_s32(vmulq_n_s32(idot(zero, wv[0], a[0]), sc[0]), idot(zero, wv[1], a[1]), sc[1]);
    return idot(idot(zero, wv[0], a[0]), wv[1], a[1]);
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
    for (int64_t g = 0; g < n / 32; g++) {
        int8x16_t a[2][2];
        float d[2], ds[2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const qw_q8a *xa = x + t * ldx + g;
            act_bytes(xa, a[t]);
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
                int32x4_t is = group_isum(idot, T, wv, a[t], sc);
                acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(is), A * d[t]);
                if (type_has_min(T)) accB[r][t] += B * ds[t];
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]) + accB[r][t];
}

/*
 * Q4_K, Q5_K, Q6_K and IQ4_XS take a whole 256-element super-block per step (ksb_tile): its scales decoded
 * once (ksb_scales: lane j of S[h] is group 4h + j's A, of M[h] its B), each group's integer partial as in
 * qtile_nxm (Q6_K's two sub-block scales applied in integers), and every four groups' partials folded by
 * three pairwise adds into one vector whose lane j is group j's whole integer sum (|sum| < 2^24: exact in
 * f32; Q6_K's at most 32 * 128 * 32 * 127). Then one FMA per four groups: acc += sum * (A * d_act) lane by
 * lane, and for the types with mins accm += B * (d * s)_act; the result is the fixed tree of acc + accm.
 * The per-group step above spends an f16 conversion, a scale extraction and an FMA on every 32 weights.
 */
QW_INLINE int is_ksb(qw_type t) {
    return t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K || t == QW_TYPE_Q6_K || t == QW_TYPE_IQ4_XS;
}

/* one token's side of a super-block: its eight groups' d and d * s */
typedef struct {
    float D[8], DS[8];
} act_sb;

QW_INLINE void act_prep_sb(const qw_q8a *x, int64_t sb, act_sb *ap) {
    for (int j = 0; j < 8; j++) {
        const qw_q8a *xa = x + 8 * sb + j;
        ap->D[j] = xa->d;
        ap->DS[j] = xa->d * (float)xa->s;
    }
}

/* u8 lanes 0-7 of v (the scales of groups 0-7) as two f32 vectors, times f */
QW_INLINE void u8x8_scaled(uint8x8_t v, float f, float32x4_t out[2]) {
    uint16x8_t w = vmovl_u8(v);
    out[0] = vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), f);
    out[1] = vmulq_n_f32(vcvtq_f32_u32(vmovl_high_u16(w)), f);
}

/*
 * The scales of super-block b, lane j of S[h] / M[h] for group 4h + j: the A and B of unpack (each an f16
 * times an integer of at most 8 bits, exact in f32), except Q6_K, whose S is d alone (its integer scales
 * come with the weights). Q4_K / Q5_K's 12 bytes as dwords u0 u1 u2: sc0-3 = u0 & 0x3F, sc4-7 = (u2 & 0x0F)
 * | (u0 >> 2 & 0x30), m0-3 = u1 & 0x3F, m4-7 = (u2 >> 4 & 0x0F) | (u1 >> 2 & 0x30), byte by byte
 * (qw_k4_scale_min).
 */
QW_INLINE void ksb_scales(qw_type T, const uint8_t *b, float32x4_t S[2], float32x4_t M[2]) {
    switch (T) {
    case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_K: {
        uint32_t u0 = qw_rd32(b + 4), u1 = qw_rd32(b + 8), u2 = qw_rd32(b + 12);
        uint64_t sc = (uint64_t)((u2 & 0x0F0F0F0Fu) | (u0 >> 2 & 0x30303030u)) << 32 | (u0 & 0x3F3F3F3Fu);
        uint64_t mn = (uint64_t)((u2 >> 4 & 0x0F0F0F0Fu) | (u1 >> 2 & 0x30303030u)) << 32 | (u1 & 0x3F3F3F3Fu);
        u8x8_scaled(vcreate_u8(sc), f16(b), S);
        u8x8_scaled(vcreate_u8(mn), -f16(b + 2), M);
        return;
    }
    case QW_TYPE_Q6_K:
        S[0] = S[1] = vdupq_n_f32(f16(b + offsetof(qw_block_q6_K, d)));
        return;
    case QW_TYPE_IQ4_XS: {
        float d = f16(b), ls[8];
        uint16_t sh = qw_rd16(b + offsetof(qw_block_iq4_xs, scales_h));
        for (int j = 0; j < 8; j++)
            ls[j] = d * (float)((((b[offsetof(qw_block_iq4_xs, scales_l) + j / 2] >> 4 * (j % 2)) & 0xF) |
                                 ((sh >> 2 * j) & 3) << 4) - 32);
        S[0] = vld1q_f32(ls);
        S[1] = vld1q_f32(ls + 4);
        return;
    }
    default:
        __builtin_unreachable();
    }
}

/* One row (its bytes at w) against NT tokens (compile-time): token t's activations at x + t * ldx and its
 * act_sbs at pre + t * ldp. */
QW_INLINE void ksb_tile(idot_fn idot, qw_type T, int NT, float *y, int64_t ldy, const uint8_t *w, const qw_q8a *x,
                        int64_t ldx, const act_sb *pre, int64_t ldp, int64_t n) {
    float32x4_t acc[4], accm[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = vdupq_n_f32(0.0f);
    for (int64_t sb = 0; sb < n / QW_QK_K; sb++) {
        const uint8_t *b = w + sb * qw_block_bytes(T);
        float32x4_t S[2], M[2];
        ksb_scales(T, b, S, M);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            int32x4_t P[4][4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                int8x16_t wv[2];
                int32_t sc[2] = {0, 0};
                float A, B; /* the group's scale and min: S's and M's lane (unused here) */
                unpack(T, b, 4 * h + k, wv, &A, &B, sc);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    int8x16_t a[2];
                    act_bytes(x + t * ldx + 8 * sb + 4 * h + k, a);
                    P[t][k] = group_isum(idot, T, wv, a, sc);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const act_sb *ap = pre + t * ldp + sb;
                int32x4_t G = vpaddq_s32(vpaddq_s32(P[t][0], P[t][1]), vpaddq_s32(P[t][2], P[t][3]));
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(G), vmulq_f32(S[h], vld1q_f32(ap->D + 4 * h)));
                if (type_has_min(T)) accm[t] = vfmaq_f32(accm[t], M[h], vld1q_f32(ap->DS + 4 * h));
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) y[t * ldy] = hsum(type_has_min(T) ? vaddq_f32(acc[t], accm[t]) : acc[t]);
}

/* nr rows against nt tokens (any): the tokens' act_sbs once, then each row against four tokens at a time */
QW_INLINE void ksb_rows(idot_fn idot, qw_type T, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x,
                        int64_t ldx, int nr, int nt, int64_t n) {
    int64_t nsb = n / QW_QK_K;
    act_sb *pre = qw_qtile_scratch(0, (size_t)nt * (size_t)nsb * sizeof(act_sb));
    if (!pre) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    for (int t = 0; t < nt; t++)
        for (int64_t sb = 0; sb < nsb; sb++) act_prep_sb(x + t * ldx, sb, &pre[t * nsb + sb]);
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ws;
        int t = 0;
        for (; t + 4 <= nt; t += 4)
            ksb_tile(idot, T, 4, y + t * ldy + r, ldy, wr, x + t * ldx, ldx, pre + t * nsb, nsb, n);
        for (; t < nt; t++) ksb_tile(idot, T, 1, y + t * ldy + r, ldy, wr, x + t * ldx, ldx, pre + t * nsb, nsb, n);
    }
}

/*
 * Sixteen tokens or more: blocks of 8 rows unpacked once per call (rp_pack) into, for each group of 32, its
 * bytes as [chunk of 4][row][4 bytes] (two 16-byte vectors per chunk, rows 0-3 and 4-7), the rows' A and B
 * and (Q6_K) their two sub-block scales; every token then passes over the block: per group, one lane-indexed
 * integer dot per chunk and vector of rows against the token's 4 bytes of that chunk, so a lane holds a
 * row's exact group sum (unpack's integers; Q6_K's halves times their scales, as above); then acc +=
 * sum * (A * d) and, with mins, acc += B * (d * s), one FMA for four rows instead of one per 4 elements.
 * An output depends only on its row and token (rows past nr are zeros, never stored); its f32 additions
 * run in another order than the paths above, within the same bound. The lane dot comes in the two builds
 * of the integer dot: sdot by lane, or the smull dot against the chunk's 4 bytes broadcast (the same lane
 * sums, so the same bits).
 */
#define RP_ROWS 8
#define RP_MIN_TOKENS 16

/* acc[l] += sum_{i < 4} w[4l + i] * a[4 lane + i] (lane a constant once inlined) */
typedef int32x4_t (*ldot_fn)(int32x4_t acc, int8x16_t w, int8x16_t a, int lane);

QW_INLINE int8x16_t lane_bcast(int8x16_t a, int lane) {
    int32x4_t v = vreinterpretq_s32_s8(a);
    switch (lane & 3) {
    case 0: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 0));
    case 1: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 1));
    case 2: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 2));
    default: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 3));
    }
}

QW_INLINE int32x4_t ldot_smull(int32x4_t acc, int8x16_t w, int8x16_t a, int lane) {
    return idot_smull(acc, w, lane_bcast(a, lane));
}

#if HAVE_SDOT
TARGET_DOTPROD QW_INLINE int32x4_t ldot_sdot(int32x4_t acc, int8x16_t w, int8x16_t a, int lane) {
    switch (lane & 3) {
    case 0: return vdotq_laneq_s32(acc, w, a, 0);
    case 1: return vdotq_laneq_s32(acc, w, a, 1);
    case 2: return vdotq_laneq_s32(acc, w, a, 2);
    default: return vdotq_laneq_s32(acc, w, a, 3);
    }
}
#else
#define ldot_sdot ldot_smull
#endif

/* rows r < nr (<= 8) of w into wq [ng][8 chunks][8 rows][4 bytes], A and B [ng][8], SC [ng][2][8] (Q6_K);
 * rows past nr zero */
QW_INLINE void rp_pack(qw_type T, const void *w, size_t ws, int nr, int64_t ng, int8_t *wq, float *A, float *B,
                       int32_t *SC) {
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < RP_ROWS; r++) {
            int8x16_t v[2] = {vdupq_n_s8(0), vdupq_n_s8(0)};
            float a = 0, b = 0;
            int32_t sc[2] = {0, 0};
            if (r < nr) unpack(T, (const uint8_t *)w + (size_t)r * ws, g, v, &a, &b, sc);
            int8_t bytes[32];
            vst1q_s8(bytes, v[0]);
            vst1q_s8(bytes + 16, v[1]);
            for (int c = 0; c < 8; c++) memcpy(wq + g * 256 + c * 32 + r * 4, bytes + 4 * c, 4);
            A[g * RP_ROWS + r] = a;
            B[g * RP_ROWS + r] = b;
            SC[(g * 2) * RP_ROWS + r] = sc[0];
            SC[(g * 2 + 1) * RP_ROWS + r] = sc[1];
        }
}

/* Chunks c0 .. c0+3 of group g into is[t][v] for NT tokens */
QW_INLINE void rp_chunks(ldot_fn ldot, int NT, int c0, int32x4_t is[4][2], const int8_t *wg, int8x16_t a[4][2]) {
#pragma GCC unroll 4
    for (int c = c0; c < c0 + 4; c++) {
        int8x16_t w0 = vld1q_s8(wg + c * 32), w1 = vld1q_s8(wg + c * 32 + 16);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            is[t][0] = ldot(is[t][0], w0, a[t][c / 4], c % 4);
            is[t][1] = ldot(is[t][1], w1, a[t][c / 4], c % 4);
        }
    }
}

/* NT tokens (compile-time) against a packed block: y[t * ldy + r] for r < nr; dsm: the tokens' d * s per group
 * (types with mins, stride ng) */
QW_INLINE void rp_tokens(ldot_fn ldot, qw_type T, int NT, float *y, int64_t ldy, int nr, const int8_t *wq,
                         const float *A, const float *B, const int32_t *SC, const qw_q8a *x, int64_t ldx,
                         const float *dsm, int64_t ng) {
    float32x4_t acc[4][2];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < ng; g++) {
        const int8_t *wg = wq + g * 256;
        int8x16_t a[4][2];
        float d[4];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            act_bytes(x + t * ldx + g, a[t]);
            d[t] = x[t * ldx + g].d;
        }
        int32x4_t is[4][2];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) is[t][0] = is[t][1] = vdupq_n_s32(0);
        rp_chunks(ldot, NT, 0, is, wg, a);
        if (T == QW_TYPE_Q6_K) { /* the first half times its scales, then the second half's with its own */
            int32x4_t hs[4][2];
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) {
                int32x4_t s0 = vld1q_s32(SC + (g * 2) * RP_ROWS + 4 * v);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    is[t][v] = vmulq_s32(is[t][v], s0);
                    hs[t][v] = vdupq_n_s32(0);
                }
            }
            rp_chunks(ldot, NT, 4, hs, wg, a);
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) {
                int32x4_t s1 = vld1q_s32(SC + (g * 2 + 1) * RP_ROWS + 4 * v);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) is[t][v] = vmlaq_s32(is[t][v], hs[t][v], s1);
            }
        } else {
            rp_chunks(ldot, NT, 4, is, wg, a);
        }
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) {
            float32x4_t Av = vld1q_f32(A + g * RP_ROWS + 4 * v);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                acc[t][v] = vfmaq_f32(acc[t][v], vcvtq_f32_s32(is[t][v]), vmulq_n_f32(Av, d[t]));
            if (type_has_min(T)) {
                float32x4_t Bv = vld1q_f32(B + g * RP_ROWS + 4 * v);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) acc[t][v] = vfmaq_n_f32(acc[t][v], Bv, dsm[t * ng + g]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float out[RP_ROWS];
        vst1q_f32(out, acc[t][0]);
        vst1q_f32(out + 4, acc[t][1]);
        memcpy(y + t * ldy, out, (size_t)nr * sizeof(float));
    }
}

/* nr rows (any) x nt tokens (any) through packed blocks of 8 rows */
QW_INLINE void rp_matmul(ldot_fn ldot, qw_type T, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x,
                         int64_t ldx, int nr, int nt, int64_t n) {
    const int64_t ng = n / 32;
    float *dsm = NULL;
    if (type_has_min(T)) {
        dsm = qw_qtile_scratch(2, (size_t)nt * (size_t)ng * sizeof(float));
        if (!dsm) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
        qw_q8a_group_terms(x, ldx, nt, ng, 1, 0, NULL, dsm);
    }
    size_t wq_bytes = (size_t)ng * 256;
    int8_t *wq = qw_qtile_scratch(1, wq_bytes + (size_t)ng * RP_ROWS * 4 * sizeof(float));
    if (!wq) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    float *A = (float *)(wq + wq_bytes), *B = A + ng * RP_ROWS;
    int32_t *SC = (int32_t *)(B + ng * RP_ROWS);
    for (int r = 0; r < nr; r += RP_ROWS) {
        int nb = nr - r < RP_ROWS ? nr - r : RP_ROWS;
        rp_pack(T, (const char *)w + (size_t)r * ws, ws, nb, ng, wq, A, B, SC);
        int t = 0;
        for (; t + 4 <= nt; t += 4)
            rp_tokens(ldot, T, 4, y + t * ldy + r, ldy, nb, wq, A, B, SC, x + t * ldx, ldx, dsm ? dsm + t * ng : NULL,
                      ng);
        for (; t < nt; t++)
            rp_tokens(ldot, T, 1, y + t * ldy + r, ldy, nb, wq, A, B, SC, x + t * ldx, ldx, dsm ? dsm + t * ng : NULL,
                      ng);
    }
}

/* Any nr and nt (the tables' qtile_nt): RP_MIN_TOKENS tokens or more through the packed blocks; fewer, the
 * K-quants and IQ4_XS a super-block per step (a row against four tokens, then one), the other types a group
 * per step in 4 x 2, 4 x 1, 1 x 2 and 1 x 1 tiles (each output is computed the same way in all of them). */
QW_INLINE void qtile_any(idot_fn idot, ldot_fn ldot, qw_type T, float *y, int64_t ldy, const void *w, size_t ws,
                         const qw_q8a *x, int64_t ldx, int nr, int nt, int64_t n) {
    if (nt >= RP_MIN_TOKENS) {
        rp_matmul(ldot, T, y, ldy, w, ws, x, ldx, nr, nt, n);
        return;
    }
    if (is_ksb(T)) {
        ksb_rows(idot, T, y, ldy, w, ws, x, ldx, nr, nt, n);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += 4) { /* 4-row tiles, then the rest a row at a time */
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
    QW_QTILE_PROTO(neon, T, name) { qtile_any(idot_smull, ldot_smull, T, y, ldy, w, ws, x, ldx, nr, nt, n); }     \
    TARGET_DOTPROD QW_QTILE_PROTO(neondot, T, name) {                                                              \
        qtile_any(idot_sdot, ldot_sdot, T, y, ldy, w, ws, x, ldx, nr, nt, n);                                      \
    }
QW_QTILE_LIST(QTILE, -)

#endif /* __aarch64__ */
