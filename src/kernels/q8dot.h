/*
 * q8dot.h - one group of 32 quantized weights against one 8-bit activation block (kernels/q8a.h), in 32-bit
 * words: written once for the host and for the CUDA backend's integer matrix-vector kernels (src/cuda/quant.cu),
 * and checked on the host against qw_q8a_unpack (tests/t_qkernels.c), so the device reads every weight type
 * exactly as the CPU's integer path does.
 *
 * qd_group gives, for group g of a row, the exact integer isum_g = sum_i iw_i q_i and the floats A_g, B_g of
 * q8a.h's split, from the weight's codes taken four to a word (the byte-wise dot product of the device, dp4a):
 * the codes without their offset (Q4_0's q, not q - 8), the offset then taken off with the activations' sum
 * (isum = sum c q - 8 s), and the sub-block scales applied to the integer sums (Q4_K: sc_j sum c q; Q6_K: one
 * scale per 16 elements, so its two halves are summed apart). The same integers as qw_q8a_unpack's products.
 *
 * Reads: every field by 16-bit loads (2-byte alignment is all that every block layout guarantees inside a row);
 * x: the block's 8 words of codes (element 4w + k in byte k of word w) and its sum s.
 */
#ifndef QW_Q8DOT_H
#define QW_Q8DOT_H

#include <stdint.h>

#include "kernels/hostdev.h"
#include "tensor/tensor.h"

#ifdef __CUDACC__
#define QD_INLINE static __host__ __device__ __forceinline__
#else
#define QD_INLINE static inline
#endif

QD_INLINE uint32_t qd_ld16(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
#endif
}
QD_INLINE uint32_t qd_ld32(const uint8_t *p) { return qd_ld16(p) | qd_ld16(p + 2) << 16; }
/* n (1 to 16) little-endian words from the 2-byte aligned p, each shifted right by s bits and masked by m, where m
 * keeps none of a word's top s bits (so what a shift brings in from above does not matter). On the device by aligned
 * words, not two 16-bit loads each (the blocks of Q6_K, Q5_0, Q4_0, Q8_0 are 2-byte aligned): the n words a[i]
 * from p's word, one 16-bit load for the tail, and word i the funnel shift of a[i] and a[i + 1] by 0 or 16 bits
 * plus s. The same instructions whether p is 4-byte aligned or 2 bytes off (a lane's group and its neighbour's are
 * often one of each, and a branch on it made the warp run both sides); the tail read is the last half the n words
 * need (2 bytes off) or the last half of a[n - 1] (aligned, where it lands only in masked bits): never a byte past
 * the n words. */
QD_INLINE void qd_ldw_bits(const uint8_t *p, uint32_t *w, int n, int s, uint32_t m) {
#ifdef __CUDA_ARCH__
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const int sh = (int)((uintptr_t)p & 2) * 8;
    uint32_t v[16];
    for (int i = 0; i < n; i++) v[i] = a[i];
    const uint32_t tail = qd_ld16((const uint8_t *)(a + n) - 2 + sh / 8);
    for (int i = 0; i < n; i++) w[i] = __funnelshift_r(v[i], i + 1 < n ? v[i + 1] : tail, sh + s) & m;
#else
    for (int i = 0; i < n; i++) w[i] = qd_ld32(p + 4 * i) >> s & m;
#endif
}
QD_INLINE void qd_ldw(const uint8_t *p, uint32_t *w, int n) { qd_ldw_bits(p, w, n, 0, 0xFFFFFFFFu); }

/* 16 bytes at a 16-byte aligned p as 4 words (one load on the device) */
QD_INLINE void qd_ld128(const uint8_t *p, uint32_t *w) {
#ifdef __CUDA_ARCH__
    const uint4 v = *(const uint4 *)p;
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
    for (int i = 0; i < 4; i++) w[i] = qd_ld32(p + 4 * i);
#endif
}

/* c + the dot of the 4 signed bytes of a and b */
QD_INLINE int32_t qd_dp4a(uint32_t a, uint32_t b, int32_t c) {
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int k = 0; k < 4; k++) c += (int32_t)(int8_t)(a >> 8 * k) * (int32_t)(int8_t)(b >> 8 * k);
    return c;
#endif
}

QD_INLINE float qd_f16(uint32_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)(h & 0xFFFF)));
#else
    return qw_f16_to_f32((uint16_t)h);
#endif
}
QD_INLINE float qd_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* bits 0..3 of x to bit 4 of bytes 0..3 */
QD_INLINE uint32_t qd_spread4(uint32_t x) { return ((x & 0xF) * 0x00204081u & 0x01010101u) << 4; }

/* the IQ4_NL levels of the 4 nibbles at bits 0, 8, 16, 24 of v (after >> shift), as signed bytes */
QD_INLINE uint32_t qd_iq4(uint32_t v) {
    const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull; /* -127 -104 -83 -65 -49 -35 -22 -10 | 1 13 25 38 53 69 89 113 */
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) {
        uint32_t n = v >> 8 * k & 0xF;
        r |= (uint32_t)((n < 8 ? lo >> 8 * n : hi >> 8 * (n - 8)) & 0xFF) << 8 * k;
    }
    return r;
}

/* sum over the 8 words of codes c (element 4w + k in byte k of word w) times the activations' words */
QD_INLINE int32_t qd_dot8(const uint32_t *c, const uint32_t *xq) {
    int32_t s = 0;
    for (int w = 0; w < 8; w++) s = qd_dp4a(c[w], xq[w], s);
    return s;
}

/* the 16 bytes at p as 32 4-bit codes: element j < 16 the low nibble of byte j, j + 16 its high nibble */
QD_INLINE void qd_nib32(const uint8_t *p, uint32_t *c) {
    uint32_t v[4];
    qd_ldw(p, v, 4);
    for (int w = 0; w < 4; w++) {
        c[w] = v[w] & 0x0F0F0F0Fu;
        c[4 + w] = v[w] >> 4 & 0x0F0F0F0Fu;
    }
}

/* Q4_K / Q5_K sub-block j's 6-bit scale and min (qw_k4_scale_min) from the 12 scale bytes at s */
QD_INLINE void qd_k4_scale_min(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Q4_0 / Q4_1 / IQ4_NL group g of the row at r: its codes (Q4_0, Q4_1: the nibbles as they are; IQ4_NL: their
 * levels), *A = d, and *B = m for Q4_1 (else left as it is) */
QD_INLINE void qd_q4_group(qw_type t, const uint8_t *r, int64_t g, uint32_t *c, float *A, float *B) {
    const uint8_t *b = r + g * (t == QW_TYPE_Q4_1 ? 20 : 18);
    *A = qd_f16(qd_ld16(b));
    qd_nib32(b + (t == QW_TYPE_Q4_1 ? 4 : 2), c);
    if (t == QW_TYPE_IQ4_NL)
        for (int w = 0; w < 8; w++) c[w] = qd_iq4(c[w]);
    if (t == QW_TYPE_Q4_1) *B = qd_f16(qd_ld16(b + 2));
}

/* Q5_0 / Q5_1 (q5_1) group g of the row at r: its 5-bit codes as they are (element 4w + k in byte k of word w:
 * the nibble and bit 4w + k of qh), *A = d, and *B = m for Q5_1 (else left as it is) */
QD_INLINE void qd_q5_group(int q5_1, const uint8_t *r, int64_t g, uint32_t *c, float *A, float *B) {
    const uint8_t *b = r + g * (q5_1 ? 24 : 22);
    *A = qd_f16(qd_ld16(b));
    if (q5_1) *B = qd_f16(qd_ld16(b + 2));
    uint32_t v[5]; /* qh, then the 16 bytes of nibbles */
    qd_ldw(b + (q5_1 ? 4 : 2), v, 5);
    for (int w = 0; w < 4; w++) {
        c[w] = (v[1 + w] & 0x0F0F0F0Fu) | qd_spread4(v[0] >> 4 * w);
        c[4 + w] = (v[1 + w] >> 4 & 0x0F0F0F0Fu) | qd_spread4(v[0] >> 4 * (4 + w));
    }
}

/* Q4_K / Q5_K (q5) group g of the row at r: its super-block *b, its 32 bytes of codes *qs (group j = g % 8 in the
 * low nibbles for even j, the high for odd), *A = d, *B = -dmin m_j; returns the scale sc_j */
QD_INLINE int qd_k4_head(int q5, const uint8_t *r, int64_t g, const uint8_t **b, const uint8_t **qs, float *A, float *B) {
    const int j = (int)(g % 8);
    *b = r + g / 8 * (q5 ? 176 : 144);
    *qs = *b + (q5 ? 48 : 16) + 32 * (j / 2);
    int sc, mn;
    qd_k4_scale_min(j, *b + 4, &sc, &mn);
    *A = qd_f16(qd_ld16(*b));
    *B = qd_mul(-qd_f16(qd_ld16(*b + 2)), (float)mn);
    return sc;
}

/* Group g of the row at r (type t): *isum = sum_i iw_i q_i, *A, *B as qw_q8a_unpack gives them; xq the activation
 * block's 8 words, xs its sum. */
QD_INLINE void qd_group(qw_type t, const uint8_t *r, int64_t g, const uint32_t *xq, int32_t xs, int32_t *isum, float *A,
                        float *B) {
    uint32_t c[8];
    *B = 0.0f;
    switch (t) {
    case QW_TYPE_Q8_0: {
        const uint8_t *b = r + g * 34;
        *A = qd_f16(qd_ld16(b));
        qd_ldw(b + 2, c, 8);
        *isum = qd_dot8(c, xq);
        return;
    }
    case QW_TYPE_Q4_0:
    case QW_TYPE_Q4_1:
    case QW_TYPE_IQ4_NL: {
        qd_q4_group(t, r, g, c, A, B);
        *isum = qd_dot8(c, xq) - (t == QW_TYPE_Q4_0 ? 8 * xs : 0);
        return;
    }
    case QW_TYPE_Q5_0:
    case QW_TYPE_Q5_1: {
        const int q5_1 = t == QW_TYPE_Q5_1;
        qd_q5_group(q5_1, r, g, c, A, B);
        *isum = qd_dot8(c, xq) - (q5_1 ? 0 : 16 * xs);
        return;
    }
    case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_K: {
        const int q5 = t == QW_TYPE_Q5_K, j = (int)(g % 8);
        const uint8_t *b, *qs;
        const int sc = qd_k4_head(q5, r, g, &b, &qs, A, B);
        uint32_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (((uintptr_t)b & 15) == 0) { /* the block on a 16-byte boundary (a whole row's are): wide loads */
            qd_ld128(qs, c);
            qd_ld128(qs + 16, c + 4);
            if (q5) qd_ld128(b + 16, h), qd_ld128(b + 32, h + 4);
        } else {
            for (int w = 0; w < 8; w++) {
                c[w] = qd_ld32(qs + 4 * w);
                if (q5) h[w] = qd_ld32(b + 16 + 4 * w);
            }
        }
        for (int w = 0; w < 8; w++) {
            c[w] = c[w] >> 4 * (j % 2) & 0x0F0F0F0Fu;
            if (q5) c[w] |= (h[w] >> j & 0x01010101u) << 4;
        }
        *isum = sc * qd_dot8(c, xq);
        return;
    }
    case QW_TYPE_Q6_K: {
        const uint8_t *b = r + g / 8 * 210;
        const int h = (int)(g % 8) / 4, k = (int)(g % 4);
        const uint8_t *ql = b + 64 * h + (k & 1) * 32, *qh = b + 128 + 32 * h;
        *A = qd_f16(qd_ld16(b + 208));
        uint32_t lw[8], hw[8];
        qd_ldw(ql, lw, 8);
        qd_ldw(qh, hw, 8);
        for (int w = 0; w < 8; w++) c[w] = (lw[w] >> 4 * (k / 2) & 0x0F0F0F0Fu) | (hw[w] >> 2 * k & 0x03030303u) << 4;
        int32_t s0 = 0, s1 = 0, x0 = 0, x1 = 0;
        for (int w = 0; w < 4; w++) {
            s0 = qd_dp4a(c[w], xq[w], s0);
            s1 = qd_dp4a(c[4 + w], xq[4 + w], s1);
            x0 = qd_dp4a(0x01010101u, xq[w], x0);
            x1 = qd_dp4a(0x01010101u, xq[4 + w], x1);
        }
        const int sc0 = (int8_t)b[192 + 8 * h + 2 * k], sc1 = (int8_t)b[192 + 8 * h + 1 + 2 * k];
        *isum = sc0 * (s0 - 32 * x0) + sc1 * (s1 - 32 * x1);
        return;
    }
    case QW_TYPE_IQ4_XS: {
        const int j = (int)(g % 8);
        const uint8_t *b = r + g / 8 * 136;
        const int ls = (b[4 + j / 2] >> 4 * (j % 2) & 0xF) | (int)(qd_ld16(b + 2) >> 2 * j & 3) << 4;
        *A = qd_f16(qd_ld16(b));
        qd_nib32(b + 8 + 16 * j, c);
        for (int w = 0; w < 8; w++) c[w] = qd_iq4(c[w]);
        *isum = (ls - 32) * qd_dot8(c, xq);
        return;
    }
    default: *isum = 0, *A = 0.0f; return;
    }
}

/* a - b per byte (each mod 256) */
QD_INLINE uint32_t qd_sub4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) r |= (((a >> 8 * k) - (b >> 8 * k)) & 0xFFu) << 8 * k;
    return r;
#endif
}

/* Group g of the row at r (type t) as 32 signed codes c (element 4w + k in byte k of word w) and integer scales m0
 * (elements 0..15) and m1 (16..31), so that qd_group's isum = m0 sum_{i<16} c_i q_i + m1 sum_{i>=16} c_i q_i for
 * any activations q, and *A, *B as qd_group gives them: the offsets (Q4_0's 8, Q5_0's 16, Q6_K's 32) taken off the
 * codes, the sub-block scales (K-quants, IQ4_XS) left in m0 = m1 (Q6_K: one per half). |c_i| <= 127. For the
 * tensor-core GEMM (src/cuda/mmq.cu), whose 8-bit products take the codes as they are. */
QD_INLINE void qd_codes(qw_type t, const uint8_t *r, int64_t g, uint32_t *c, float *A, float *B, int *m0, int *m1) {
    *B = 0.0f;
    *m0 = *m1 = 1;
    switch (t) {
    case QW_TYPE_Q8_0: {
        const uint8_t *b = r + g * 34;
        *A = qd_f16(qd_ld16(b));
        qd_ldw(b + 2, c, 8);
        return;
    }
    case QW_TYPE_Q4_0:
    case QW_TYPE_Q4_1:
    case QW_TYPE_IQ4_NL: {
        qd_q4_group(t, r, g, c, A, B);
        if (t == QW_TYPE_Q4_0)
            for (int w = 0; w < 8; w++) c[w] = qd_sub4(c[w], 0x08080808u);
        return;
    }
    case QW_TYPE_Q5_0:
    case QW_TYPE_Q5_1: {
        const int q5_1 = t == QW_TYPE_Q5_1;
        qd_q5_group(q5_1, r, g, c, A, B);
        if (!q5_1)
            for (int w = 0; w < 8; w++) c[w] = qd_sub4(c[w], 0x10101010u);
        return;
    }
    case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_K: {
        const int q5 = t == QW_TYPE_Q5_K, j = (int)(g % 8);
        const uint8_t *b, *qs;
        const int sc = qd_k4_head(q5, r, g, &b, &qs, A, B);
        *m0 = *m1 = sc;
        uint32_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        qd_ldw(qs, c, 8);
        if (q5) qd_ldw(b + 16, h, 8);
        for (int w = 0; w < 8; w++) c[w] = (c[w] >> 4 * (j % 2) & 0x0F0F0F0Fu) | (h[w] >> j & 0x01010101u) << 4;
        return;
    }
    case QW_TYPE_Q6_K: {
        const uint8_t *b = r + g / 8 * 210;
        const int h = (int)(g % 8) / 4, k = (int)(g % 4);
        uint32_t lw[8], hw[8];
        qd_ldw(b + 64 * h + (k & 1) * 32, lw, 8);
        qd_ldw(b + 128 + 32 * h, hw, 8);
        *A = qd_f16(qd_ld16(b + 208));
        for (int w = 0; w < 8; w++)
            c[w] = qd_sub4((lw[w] >> 4 * (k / 2) & 0x0F0F0F0Fu) | (hw[w] >> 2 * k & 0x03030303u) << 4, 0x20202020u);
        *m0 = (int8_t)b[192 + 8 * h + 2 * k], *m1 = (int8_t)b[192 + 8 * h + 1 + 2 * k];
        return;
    }
    case QW_TYPE_IQ4_XS: {
        const int j = (int)(g % 8);
        const uint8_t *b = r + g / 8 * 136;
        *A = qd_f16(qd_ld16(b));
        *m0 = *m1 = ((b[4 + j / 2] >> 4 * (j % 2) & 0xF) | (int)(qd_ld16(b + 2) >> 2 * j & 3) << 4) - 32;
        qd_nib32(b + 8 + 16 * j, c);
        for (int w = 0; w < 8; w++) c[w] = qd_iq4(c[w]);
        return;
    }
    default:
        for (int w = 0; w < 8; w++) c[w] = 0;
        *A = 0.0f;
        return;
    }
}

/* 1 for the types qd_group reads */
QD_INLINE int qd_supported(qw_type t) {
    return t == QW_TYPE_Q8_0 || t == QW_TYPE_Q4_0 || t == QW_TYPE_Q4_1 || t == QW_TYPE_Q5_0 || t == QW_TYPE_Q5_1 ||
           t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K || t == QW_TYPE_Q6_K || t == QW_TYPE_IQ4_NL || t == QW_TYPE_IQ4_XS;
}

#endif
