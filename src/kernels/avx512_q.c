/*
 * avx512_q.c - AVX-512 VNNI integer dot kernels of block-quantized weights against 8-bit activations
 * (q8a.h); the scalar oracle is qw_q8a_dot_ref, the contract of a tile is cpu.h's qw_qtile_fn.
 *
 * Sixty-four weights (two groups of 32) at a time: each type's unpack gives them as 64 bytes, a per-lane
 * f32 scale A (lane l covers elements 4l .. 4l+3, so a scale may change every 4 elements: Q6_K's 16-element
 * sub-blocks fit) and, for the types with a min, the two groups' B. vpdpbusd multiplies unsigned by signed
 * bytes, so the bytes are the integer weights plus a per-type offset o (type_offset: 128 for Q8_0 and the
 * IQ4 levels, 8 for Q4_0, 16 for Q5_0, 32 for Q6_K, 0 for the unsigned types), and the offset comes back
 * through vpdpbusd's accumulator, started at -o * (the sum of the lane's 4 activations): one vpdpbusd per
 * token and pair of groups, none per weight row. Each lane's integer sum (at most 4 * 128 * 127 after the
 * offset, 4 * 255 * 127 before it) is exact in int32 and f32; acc += isum * (A * d_act) per lane, the B
 * terms beside it in a scalar, then the fixed 16 -> 1 tree.
 * The unpacks (all ten weight types) are a few vector instructions each: 4-bit codes by one 16-bit shift
 * per 16-byte lane and a mask, the fifth bits of Q5_0/Q5_1/Q5_K as a byte mask (a 64-bit integer or a
 * vptestmb) that adds 16, IQ4_NL/IQ4_XS levels by vpshufb of the 16 kvalues. The f16 scales (and mins) of
 * two 32-element blocks are read in scalar code; those of a 256-element super-block (K-quants, IQ4_XS) are
 * decoded to f32 once for its four pairs of groups (super_scales), Q6_K's then spread to four lanes each.
 * A row of 32-element blocks may end on a single group (`two` = 0); a super-block's groups always pair.
 * Q4_K, Q5_K, Q6_K and IQ4_XS take a whole super-block per step instead when 1-15 tokens meet a row
 * (ksb_tile): four vpdpbusd folded to 16 lanes of 16-element sums, one FMA for their 16 scales (IQ4_XS, one
 * core from DRAM: 12.7-13.6 -> 17-18 GB/s, four tokens 3.5 -> 7.7); so do Q4_0, Q5_0 and
 * IQ4_NL over 8 blocks at a time in rows of whole 256-element steps (one core from DRAM: Q4_0 11-13 ->
 * 17.5-20 GB/s, IQ4_NL 11-15 -> 17; four tokens 4.4 -> 8.3 and 7.2).
 *
 * Three paths (qtile_any): one token (decode) a row at a time; 2-15 tokens in 4 x 4 tiles (K-quants: one
 * row against 4 tokens), with the bits of the one-token path; 16 tokens or more through 16-row repacked
 * blocks (rp_matmul: lane = row, one FMA per group for 16 outputs), whose f32 additions run in another
 * order. Within a path an output depends only on its row and token, never on the tile shape or the thread
 * count. The amx table runs the repacked path's integer dots as AMX tile products (amx_matmul), with the
 * same bits.
 * Error against the reference, every path: |tile - qw_q8a_dot_ref| <= (n/32 + 16) * 2^-24 * qw_q8a_dot_abs
 * (tests/t_qkernels.c). qw_avx512_q8a_quantize, at the end, is qw_q8a_quantize's rounding, byte for byte.
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

/* lanes 0-7 = p[0], lanes 8-15 = p[1] (one 8-byte load and a permute) */
QW_INLINE __m512 pair_at(const float *p) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)p))));
}

QW_INLINE __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* 32 bytes holding two groups packed as Q4_0 (16 bytes each: element i < 16 in the low nibble of byte i,
 * element i + 16 in the high nibble) -> their 64 values 0..15 in element order */
QW_INLINE __m512i nibbles64(__m256i q) {
    __m512i v = _mm512_castsi256_si512(q);
    v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0)); /* 16-byte lanes q0 q0 q1 q1 */
    v = _mm512_srlv_epi16(v, _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                              0x0004000400040004, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

/* the 16 quant bytes at offset off of 32-element blocks g and g+1 (of bs bytes each; only g when !two) */
QW_INLINE __m256i qs_pair(const uint8_t *b, size_t bs, size_t off, int two) {
    __m128i hi = two ? _mm_loadu_si128((const __m128i *)(b + bs + off)) : _mm_setzero_si128();
    return _mm256_set_m128i(hi, _mm_loadu_si128((const __m128i *)(b + off)));
}

/* the f16 at offset off of blocks g and g+1 as the per-lane scale of their groups (0 for a missing g+1) */
QW_INLINE __m512 f16_pair(const uint8_t *b, size_t bs, size_t off, int two) {
    return halves(f16(b + off), two ? f16(b + bs + off) : 0.0f);
}

/* the 16 kvalues of IQ4_NL + 128 (as unsigned bytes) in each 16-byte lane, for vpshufb */
QW_INLINE __m512i kvalues128(void) {
    __m512i kv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qw_kvalues_iq4nl));
    return _mm512_xor_si512(kv, _mm512_set1_epi8((char)0x80));
}

/* The offset of the type's unpacked bytes (iw = w - offset: w is unsigned) / does it have group mins (B)? */
QW_INLINE int type_offset(qw_type t) {
    switch (t) {
    case QW_TYPE_Q8_0: case QW_TYPE_IQ4_NL: case QW_TYPE_IQ4_XS: return 128;
    case QW_TYPE_Q4_0: return 8;
    case QW_TYPE_Q5_0: return 16;
    case QW_TYPE_Q6_K: return 32;
    default: return 0;
    }
}

QW_INLINE int type_has_min(qw_type t) {
    return t == QW_TYPE_Q4_1 || t == QW_TYPE_Q5_1 || t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K;
}

/* The 6-bit scales and mins of a Q4_K / Q5_K super-block (qw_k4_scale_min) as the bytes sc0-7 m0-7. The 12
 * bytes as dwords u0 u1 u2: sc0-3 = u0 & 0x3F, sc4-7 = (u2 & 0x0F) | (u0 >> 2 & 0x30), m0-3 = u1 & 0x3F,
 * m4-7 = (u2 >> 4 & 0x0F) | (u1 >> 2 & 0x30). */
QW_INLINE __m128i k4_scale_bytes(const uint8_t *b) {
    __m128i v = _mm_loadu_si128((const __m128i *)(b + 4)); /* the 4 bytes past the scales are qs */
    __m128i a = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                              _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    __m128i hb = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                               _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(a, hb);
}

/* Q6_K: the 6-bit codes of quarters 0 | 1 (hi = 0: the low nibbles of ql, qh bits 0, 1 | 2, 3) or 2 | 3
 * (hi = 1: the high nibbles, qh bits 4, 5 | 6, 7) of the 128-element half h, as 64 bytes. The qh bits go to
 * bits 4, 5 by 16-bit shifts, which bring a neighbouring byte's bits only into bits that are masked. */
QW_INLINE __m512i q6_quarters(const uint8_t *b, int h, int hi) {
    __m512i ql = _mm512_loadu_si512(b + 64 * h);
    __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + offsetof(qw_block_q6_K, qh) + 32 * h)));
    hb = hi ? _mm512_srlv_epi16(hb, _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
                                                     0x0002000200020002, 0, 0, 0, 0))
            : _mm512_sllv_epi16(hb, _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
                                                     0x0002000200020002, 0x0004000400040004, 0x0004000400040004,
                                                     0x0004000400040004, 0x0004000400040004));
    __m512i q = _mm512_ternarylogic_epi32(_mm512_set1_epi8(0x0F), hi ? _mm512_srli_epi16(ql, 4) : ql, hb, 0xCA);
    return _mm512_and_si512(q, _mm512_set1_epi8(0x3F)); /* bits 0-3 of the nibble, 4-5 of qh */
}

/*
 * The scales of a 256-element super-block as f32, decoded once for its four pairs of groups:
 *     Q4_K, Q5_K  kc[j] = d * sc_j, kc[8 + j] = -dmin * m_j (sub-block j)
 *     Q6_K        kc[s] = d * scales[s] (16-element sub-block s)
 *     IQ4_XS      kc[j] = d * (ls_j - 32)
 * Each is an f16 times an integer of at most 8 bits: exact in f32, as the scalar products were.
 */
QW_INLINE void super_scales(qw_type t, const uint8_t *b, float kc[16]) {
    if (t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K) {
        __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(k4_scale_bytes(b)));
        _mm512_storeu_ps(kc, _mm512_mul_ps(v, halves(f16(b), -f16(b + 2))));
    } else if (t == QW_TYPE_Q6_K) {
        __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + offsetof(qw_block_q6_K, scales))));
        float d = f16(b + offsetof(qw_block_q6_K, d));
        _mm512_storeu_ps(kc, _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(d)));
    } else { /* IQ4_XS: low 4 bits of ls_j in nibble j of scales_l, high 2 in bits 2j, 2j+1 of scales_h */
        __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)qw_rd32(b + offsetof(qw_block_iq4_xs, scales_l))),
                                       _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32(qw_rd16(b + offsetof(qw_block_iq4_xs, scales_h))),
                                       _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        __m256i ls = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xF)),
                                     _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
        __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
        _mm256_storeu_ps(kc, _mm256_mul_ps(v, _mm256_set1_ps(f16(b))));
    }
}

/*
 * Groups g and g+1 (g even; `two` = 0: only group g, and lanes 8-15 of A are zero, the other 32 bytes of w
 * any values: their activations are zero) of a row: 64 unsigned weight bytes w (the integer weights plus
 * type_offset), the per-lane scale A, and the groups' mins B[2] (types with a min). kc: the row's super_scales,
 * refreshed here at the start of each super-block (K-quants and IQ4_XS).
 */
QW_INLINE void unpack(qw_type t, const uint8_t *row, int64_t g, int two, __m512i *w, __m512 *A, float B[2],
                      float kc[16]) {
    switch (t) {
    case QW_TYPE_Q8_0: {
        const uint8_t *b = row + g * sizeof(qw_block_q8_0);
        __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 2));
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b + 36)) : _mm256_setzero_si256();
        *w = _mm512_xor_si512(join(lo, hi), _mm512_set1_epi8((char)0x80)); /* q + 128 */
        *A = halves(f16(b), two ? f16(b + 34) : 0.0f);
        return;
    }
    case QW_TYPE_Q4_0:   /* iw = q - 8 */
    case QW_TYPE_IQ4_NL: { /* iw = kvalues[q] (same block layout) */
        size_t bs = sizeof(qw_block_q4_0);
        const uint8_t *b = row + g * bs;
        __m512i q = nibbles64(qs_pair(b, bs, offsetof(qw_block_q4_0, qs), two));
        *w = t == QW_TYPE_Q4_0 ? q : _mm512_shuffle_epi8(kvalues128(), q);
        *A = f16_pair(b, bs, 0, two);
        return;
    }
    case QW_TYPE_Q4_1: {
        size_t bs = sizeof(qw_block_q4_1);
        const uint8_t *b = row + g * bs;
        *w = nibbles64(qs_pair(b, bs, offsetof(qw_block_q4_1, qs), two));
        *A = f16_pair(b, bs, 0, two);
        B[0] = f16(b + offsetof(qw_block_q4_1, m));
        B[1] = two ? f16(b + bs + offsetof(qw_block_q4_1, m)) : 0.0f;
        return;
    }
    case QW_TYPE_Q5_0:   /* iw = q - 16 */
    case QW_TYPE_Q5_1: { /* iw = q; q = the nibble + 16 where the fifth bit (bit i of qh) is set */
        int q50 = t == QW_TYPE_Q5_0;
        size_t bs = q50 ? sizeof(qw_block_q5_0) : sizeof(qw_block_q5_1);
        size_t qh = q50 ? offsetof(qw_block_q5_0, qh) : offsetof(qw_block_q5_1, qh);
        const uint8_t *b = row + g * bs;
        __m512i q = nibbles64(qs_pair(b, bs, qh + 4, two)), sixteen = _mm512_set1_epi8(16);
        __mmask64 h = _cvtu64_mask64(qw_rd32(b + qh) | (two ? (uint64_t)qw_rd32(b + bs + qh) << 32 : 0));
        *w = _mm512_mask_add_epi8(q, h, q, sixteen);
        *A = f16_pair(b, bs, 0, two);
        if (!q50) {
            B[0] = f16(b + offsetof(qw_block_q5_1, m));
            B[1] = two ? f16(b + bs + offsetof(qw_block_q5_1, m)) : 0.0f;
        }
        return;
    }
    case QW_TYPE_Q4_K:   /* groups g, g+1 = sub-blocks j, j+1 of one super-block: low / high nibbles of 32 bytes */
    case QW_TYPE_Q5_K: { /* and Q5_K's fifth bits: bits j, j+1 of the 32 bytes of qh */
        size_t bs = t == QW_TYPE_Q4_K ? sizeof(qw_block_q4_K) : sizeof(qw_block_q5_K);
        const uint8_t *b = row + g / 8 * bs, *qs = b + bs - QW_QK_K / 2; /* qs last in both */
        int j = (int)(g % 8);
        if (j == 0) super_scales(t, b, kc);
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 16 * j)), m = _mm256_set1_epi8(0x0F);
        *w = join(_mm256_and_si256(q, m), _mm256_and_si256(_mm256_srli_epi16(q, 4), m));
        if (t == QW_TYPE_Q5_K) {
            __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + offsetof(qw_block_q5_K, qh))));
            h = _mm512_srl_epi16(h, _mm_cvtsi32_si128(j)); /* bit j -> bit 0, j+1 -> 1 (j <= 6: within the byte) */
            __mmask64 k = _mm512_test_epi8_mask(h, _mm512_set_epi64(0x0202020202020202, 0x0202020202020202,
                                                                    0x0202020202020202, 0x0202020202020202,
                                                                    0x0101010101010101, 0x0101010101010101,
                                                                    0x0101010101010101, 0x0101010101010101));
            *w = _mm512_mask_add_epi8(*w, k, *w, _mm512_set1_epi8(16));
        }
        *A = pair_at(kc + j);
        B[0] = kc[8 + j];
        B[1] = kc[9 + j];
        return;
    }
    case QW_TYPE_Q6_K: { /* groups g, g+1 = quarters k, k+1 (k = 0 or 2) of the 128-element half h (q6_quarters);
                          * iw = q - 32 and A = d * scales[s], a scale per 16 elements (4 lanes) */
        const uint8_t *b = row + g / 8 * sizeof(qw_block_q6_K);
        int h = (int)(g % 8) / 4, k = (int)(g % 4);
        if (g % 8 == 0) super_scales(t, b, kc);
        *w = q6_quarters(b, h, k != 0);
        __m512 s4 = _mm512_castps128_ps512(_mm_loadu_ps(kc + 8 * h + 2 * k)); /* the pair's 4 scales */
        *A = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), s4);
        return;
    }
    case QW_TYPE_IQ4_XS: { /* groups g, g+1 = sub-blocks j, j+1: 32 bytes of qs packed as two Q4_0 groups,
                            * iw = kvalues[q], A = d * (ls - 32) */
        const uint8_t *b = row + g / 8 * sizeof(qw_block_iq4_xs);
        int j = (int)(g % 8);
        if (j == 0) super_scales(t, b, kc);
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + offsetof(qw_block_iq4_xs, qs) + 16 * j));
        *w = _mm512_shuffle_epi8(kvalues128(), nibbles64(q));
        *A = pair_at(kc + j);
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

/* The activation side of one pair step for one token: the same for every weight row, so a call prepares
 * it once for its tokens (qrows_1tok, q4tok) and its rows read it back. */
typedef struct {
    __m512i a;  /* the pair's 64 activation bytes (zeros for a missing group g+1) */
    __m512i s0; /* -type_offset * (sum of each lane's 4 activations): vpdpbusd's starting value */
    __m512 D;   /* d of group g in lanes 0-7, of g+1 in lanes 8-15 */
    float ds[2]; /* Q4_1 / Q5_1: d * s of groups g and g+1 (0 for a missing g+1) */
} act_pair;

QW_INLINE void act_prep(qw_type T, const qw_q8a *x, int64_t g, int two, act_pair *ap) {
    const qw_q8a *xa = x + g;
    __m256i hi = two ? _mm256_loadu_si256((const __m256i *)xa[1].q) : _mm256_setzero_si256();
    ap->a = join(_mm256_loadu_si256((const __m256i *)xa[0].q), hi);
    ap->D = halves(xa[0].d, two ? xa[1].d : 0.0f);
    ap->s0 = _mm512_setzero_si512();
    if (type_offset(T)) {
        __m512i o = _mm512_set1_epi8((char)type_offset(T));
        ap->s0 = _mm512_sub_epi32(ap->s0, _mm512_dpbusd_epi32(ap->s0, o, ap->a));
    }
    if (type_has_min(T)) {
        ap->ds[0] = xa[0].d * (float)xa[0].s;
        ap->ds[1] = two ? xa[1].d * (float)xa[1].s : 0.0f;
    }
}

/*
 * K-quants (Q4_K, Q5_K, Q6_K) take a whole 256-element super-block per step. Its weights come as four
 * 64-byte vectors c = 0..3 (ksb_unpack), the token's activations laid out in the same order (act_sb), one
 * vpdpbusd each from zero; the four results are folded to 16 lanes (ksb_fold) of exact integer sums over
 * 16 elements, and one FMA applies the 16 lanes' scales: four f32 operations per super-block instead of
 * twelve, which is what bounded the pair-at-a-time kernel at about 13.7 GB/s per core on Q4_K.
 *   Q4_K, Q5_K   c = 0: groups 0 | 2 (the low nibbles of qs[0..63]), 1: groups 1 | 3 (their high nibbles),
 *                2: 4 | 6, 3: 5 | 7. Q4_K keeps a high nibble in place (x & 0xF0 = 16 q) and lets the
 *                scale carry the 1/16; Q5_K shifts it down to add its fifth bit.
 *   Q6_K         c: groups 2c | 2c+1 (elements 64c .. 64c+63), q as in unpack; the 32 * (sum of each
 *                sub-block's activations) of its offset is taken from the folded sums.
 * The 16-element units in vector c, 128-bit lane i, are unit 4c + i; ksb_fold leaves unit 4c + i in lane
 * 4i + c (ksb_unit). Every lane sum is at most 16 * 255 * 127 in magnitude: exact in int32 and f32.
 */
QW_INLINE int is_ksb(qw_type t) {
    return t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K || t == QW_TYPE_Q6_K || t == QW_TYPE_IQ4_XS;
}
/* The 32-element types without mins take the same step over 8 blocks (256 elements) when a row is whole
 * steps long (ksb_rows) */
QW_INLINE int is_ksb8(qw_type t) {
    return t == QW_TYPE_Q4_0 || t == QW_TYPE_Q5_0 || t == QW_TYPE_IQ4_NL;
}
QW_INLINE int ksb_rows(qw_type t, int64_t n) { return is_ksb(t) || (is_ksb8(t) && n % QW_QK_K == 0); }
/* Lane units of 16 in group order (unit u = half u % 2 of group u / 2): Q6_K, IQ4_XS and the 8-block types */
QW_INLINE int ksb_halves(qw_type t) { return t == QW_TYPE_Q6_K || t == QW_TYPE_IQ4_XS || is_ksb8(t); }

/* the 16-element unit in lane L after ksb_fold, and the 32-element group it belongs to */
QW_INLINE int ksb_unit(int L) { return 4 * (L % 4) + L / 4; }
QW_INLINE int ksb_group(qw_type t, int L) {
    static const int8_t g4[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}}; /* Q4_K, Q5_K: vector c's two groups */
    int u = ksb_unit(L);
    return ksb_halves(t) ? u / 2 : g4[u / 4][u % 4 / 2];
}

/* P[c] -> 16 lanes: pairs of 64-bit halves within each 128-bit lane, then pairs of dwords */
QW_INLINE __m512i ksb_fold(const __m512i P[4]) {
    __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi64(P[0], P[1]), _mm512_unpackhi_epi64(P[0], P[1]));
    __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi64(P[2], P[3]), _mm512_unpackhi_epi64(P[2], P[3]));
    __m512 af = _mm512_castsi512_ps(a), bf = _mm512_castsi512_ps(b);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(af, bf, _MM_SHUFFLE(2, 0, 2, 0))),
                            _mm512_castps_si512(_mm512_shuffle_ps(af, bf, _MM_SHUFFLE(3, 1, 3, 1))));
}

/* One super-block of a row: the four weight vectors and its scales kc, in two forms: S, each lane's scale
 * (ksb lane order), and, for Q4_K and Q5_K, kc itself: lanes 0-7 d * sc_j (Q4_K: d * sc_j / 16 for the odd
 * groups, whose bytes hold 16 q), lanes 8-15 dmin * m_j, which meet act_sb's dsm. */
QW_INLINE void ksb_unpack(qw_type t, const uint8_t *b, __m512i w[4], __m512 *S, __m512 *kc) {
    if (is_ksb8(t)) { /* vector c = blocks 2c, 2c + 1 as unpack gives a pair; lane L takes d of block u / 2 */
        const size_t bb = qw_block_bytes(t);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const uint8_t *b0 = b + 2 * c * bb;
            if (t == QW_TYPE_Q5_0) {
                __m512i q = nibbles64(qs_pair(b0, bb, offsetof(qw_block_q5_0, qs), 1));
                __mmask64 h = _cvtu64_mask64(qw_rd32(b0 + offsetof(qw_block_q5_0, qh)) |
                                             (uint64_t)qw_rd32(b0 + bb + offsetof(qw_block_q5_0, qh)) << 32);
                w[c] = _mm512_mask_add_epi8(q, h, q, _mm512_set1_epi8(16));
            } else {
                __m512i q = nibbles64(qs_pair(b0, bb, offsetof(qw_block_q4_0, qs), 1));
                w[c] = t == QW_TYPE_Q4_0 ? q : _mm512_shuffle_epi8(kvalues128(), q);
            }
        }
#define D16(i) (short)qw_rd16(b + (i) * bb)
        __m128i hv = _mm_setr_epi16(D16(0), D16(1), D16(2), D16(3), D16(4), D16(5), D16(6), D16(7));
#undef D16
        *S = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7),
                                   _mm512_castps256_ps512(_mm256_cvtph_ps(hv)));
        *kc = _mm512_setzero_ps();
        return;
    }
    if (t == QW_TYPE_IQ4_XS) { /* vector c = groups 2c, 2c + 1 packed as two Q4_0 groups; lane L: ls of u / 2 */
        const uint8_t *qs = b + offsetof(qw_block_iq4_xs, qs);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            w[c] = _mm512_shuffle_epi8(kvalues128(), nibbles64(_mm256_loadu_si256((const __m256i *)(qs + 32 * c))));
        float sc[16];
        super_scales(t, b, sc);
        *S = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7),
                                   _mm512_castps256_ps512(_mm256_loadu_ps(sc)));
        *kc = _mm512_setzero_ps();
        return;
    }
    if (t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K) {
        size_t bs = t == QW_TYPE_Q4_K ? sizeof(qw_block_q4_K) : sizeof(qw_block_q5_K);
        const uint8_t *qs = b + bs - QW_QK_K / 2;
        __m512i x0 = _mm512_loadu_si512(qs), x1 = _mm512_loadu_si512(qs + 64), lo = _mm512_set1_epi8(0x0F);
        w[0] = _mm512_and_si512(x0, lo);
        w[2] = _mm512_and_si512(x1, lo);
        if (t == QW_TYPE_Q4_K) {
            w[1] = _mm512_andnot_si512(lo, x0);
            w[3] = _mm512_andnot_si512(lo, x1);
        } else {
            w[1] = _mm512_and_si512(_mm512_srli_epi16(x0, 4), lo);
            w[3] = _mm512_and_si512(_mm512_srli_epi16(x1, 4), lo);
            /* the fifth bit of element i of group j is bit j of qh[i]: vector c's groups (j, j + 2) */
            __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + offsetof(qw_block_q5_K, qh))));
            __m512i m0 = _mm512_set_epi64(0x0404040404040404, 0x0404040404040404, 0x0404040404040404,
                                          0x0404040404040404, 0x0101010101010101, 0x0101010101010101,
                                          0x0101010101010101, 0x0101010101010101);
            static const int sh[4] = {0, 1, 4, 5};
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __mmask64 k = _mm512_test_epi8_mask(h, _mm512_slli_epi16(m0, sh[c]));
                w[c] = _mm512_mask_add_epi8(w[c], k, w[c], _mm512_set1_epi8(16));
            }
        }
        __m128i sm = k4_scale_bytes(b);
        /* d and dmin, then d to lanes 0-7, dmin to 8-15 */
        __m512 dm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)qw_rd32(b))));
        dm = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), dm);
        if (t == QW_TYPE_Q4_K)
            dm = _mm512_mul_ps(dm, _mm512_setr_ps(1, 0.0625f, 1, 0.0625f, 1, 0.0625f, 1, 0.0625f, 1, 1, 1, 1, 1, 1, 1, 1));
        *kc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm)), dm);
        /* lane L takes kc[ksb_group(L)] = 0 1 4 5 0 1 4 5 2 3 6 7 2 3 6 7 */
        *S = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6, 7, 2, 3, 6, 7), *kc);
        return;
    }
    /* Q6_K: vector c = quarters 2(c % 2) and 2(c % 2) + 1 of half c / 2 */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) w[c] = q6_quarters(b, c / 2, c % 2);
    /* lane L takes scales[ksb_unit(L)] */
    __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(b + offsetof(qw_block_q6_K, scales))),
                                  _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    *S = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), _mm512_set1_ps(f16(b + offsetof(qw_block_q6_K, d))));
    *kc = _mm512_setzero_ps();
}

/* The activation side of one super-block for one token, in ksb_unpack's order */
typedef struct {
    __m512i a[4]; /* vector c's 64 activation bytes */
    __m512 D;     /* d of each lane's group */
    __m512i off;  /* Q6_K, Q4_0, Q5_0, IQ4_NL: the type's offset * the activation sum of each lane's unit */
    __m512 dsm;   /* Q4_K, Q5_K: lanes 0-7 zero, 8-15 -d_j * s_j of groups 0 .. 7 (against kc's mins) */
} act_sb;

QW_INLINE void act_prep_sb(qw_type T, const qw_q8a *x, int64_t sb, act_sb *ap) {
    const qw_q8a *xa = x + 8 * sb;
    for (int c = 0; c < 4; c++) {
        int g0 = ksb_halves(T) ? 2 * c : ksb_group(T, c), g1 = ksb_halves(T) ? 2 * c + 1 : ksb_group(T, c + 8);
        ap->a[c] = join(_mm256_loadu_si256((const __m256i *)xa[g0].q), _mm256_loadu_si256((const __m256i *)xa[g1].q));
    }
    float D[16], dsm[16];
    int32_t off[16];
    for (int L = 0; L < 16; L++) {
        D[L] = xa[ksb_group(T, L)].d;
        int u = ksb_unit(L), s = 0;
        if (type_offset(T))
            for (int i = 0; i < 16; i++) s += xa[u / 2].q[16 * (u % 2) + i];
        off[L] = type_offset(T) * s;
        dsm[L] = L < 8 ? 0.0f : -(xa[L - 8].d * (float)xa[L - 8].s);
    }
    ap->D = _mm512_loadu_ps(D);
    ap->off = _mm512_loadu_si512(off);
    ap->dsm = _mm512_loadu_ps(dsm);
}

/*
 * Decode reads one weight row after another, and asks for its bytes ROW_PREFETCH ahead of where it reads
 * (rows follow one another, so this runs into the next rows; a prefetch never faults, past the end of the
 * weights too). What pays differs by vendor, so each tile comes in two builds (PF):
 *   PF_AMD    (the avx512 table on AMD and others) non-temporal. One Zen 4 core from DRAM: Q4_K 16.3 ->
 *             18.5 GB/s, Q6_K 20 -> 23.5 (T0: 17.6, 21); the pair kernels' one-token rows: see step_1tok.
 *   PF_INTEL  (the avx512 table on Intel, and amx) every row T0, one-token rows also T1 twice as far ahead
 *             (step_1tok; K-quants, median of 3, rows of 2048 / 8192: one core Q4_K 12.8 / 12.0 -> 15.0 /
 *             15.1 GB/s, Q6_K 9.9 / 10.5 -> 14.6 / 11.9; 8 threads Q6_K 72 / 69 -> 84 / 72, Q4_K 89 / 108 ->
 *             98 / 103). Before that, T0 alone: an Intel Xeon (Sapphire Rapids, a VM):
 *             one core Q8_0 7.7 -> 12.5 GB/s, Q4_K 7.8 -> 13.9, Q6_K 6.9 -> 10.6 (against non-temporal 4 KiB
 *             ahead for the K-quants); 8 threads Q8_0 40 -> 77, Q4_K 41 -> 77 (its read probe: 80). 1 and
 *             2 KiB ahead gave less (Q8_0 8.5, 12.0 on one core), non-temporal Q8_0 6.2.
 */
enum { PF_AMD, PF_INTEL };
#define ROW_PREFETCH 4096

/* the bytes of one group of 32 in a row (the pair kernels' types; IQ4_XS has 8 in a super-block) */
QW_INLINE size_t group_bytes(qw_type t) { return qw_block_bytes(t) / (t == QW_TYPE_IQ4_XS ? 8 : 1); }

/* An NR x NT tile of a K-quant (compile-time sizes once inlined): token t's act_sb of super-block sb at
 * pre[t * ldp + sb]. */
QW_INLINE void ksb_tile(qw_type T, int PF, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws,
                        const act_sb *pre, int64_t ldp, int64_t n) {
    const size_t bs = is_ksb(T) ? qw_block_bytes(T) : 8 * qw_block_bytes(T); /* the bytes of one step */
    __m512 acc[4][4], accm[4][4];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = accm[r][t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n / QW_QK_K; sb++) {
        __m512i wv[4][4];
        __m512 S[4], kc[4];
        if (NR == 1) /* one row: its stream ahead of where it is read */
            for (size_t o = 0; o < bs; o += 64) {
                const char *p = (const char *)w + sb * bs + ROW_PREFETCH + o;
                if (PF == PF_INTEL) { /* and to L2 twice as far ahead, as step_1tok */
                    _mm_prefetch(p, _MM_HINT_T0);
                    _mm_prefetch(p + ROW_PREFETCH, _MM_HINT_T1);
                } else {
                    _mm_prefetch(p, _MM_HINT_NTA);
                }
            }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) ksb_unpack(T, (const uint8_t *)w + (size_t)r * ws + sb * bs, wv[r], &S[r], &kc[r]);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const act_sb *ap = &pre[t * ldp + sb];
                __m512i P[4];
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) P[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r][c], ap->a[c]);
                __m512i R = ksb_fold(P);
                if (type_offset(T)) R = _mm512_sub_epi32(R, ap->off);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(R), _mm512_mul_ps(S[r], ap->D), acc[r][t]);
                if (type_has_min(T)) accm[r][t] = _mm512_fmadd_ps(kc[r], ap->dsm, accm[r][t]);
            }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(_mm512_add_ps(acc[r][t], accm[r][t]));
}

/* The accumulators of an NR x NT tile */
typedef struct {
    __m512 acc[4][4];
    float accB[4][4], kc[4][16]; /* kc: each row's super_scales */
} tile_acc;

/* Groups g and g+1 (only g when !two) of an NR x NT tile */
QW_INLINE void pair_step(qw_type T, int PF, int NR, int NT, tile_acc *ta, const void *w, size_t ws,
                         const act_pair *pre, int64_t ldp, int64_t g, int two) {
    __m512i wv[4];
    __m512 A[4];
    float B[4][2];
    const act_pair *ap[4];
    if (PF == PF_INTEL && NR == 1) _mm_prefetch((const char *)w + g * group_bytes(T) + ROW_PREFETCH, _MM_HINT_T0);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) unpack(T, (const uint8_t *)w + (size_t)r * ws, g, two, &wv[r], &A[r], B[r], ta->kc[r]);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        ap[t] = &pre[t * ldp + g / 2];
        if (type_has_min(T)) /* Q4_1, Q5_1; B[r][1] is 0 when !two */
            for (int r = 0; r < NR; r++) ta->accB[r][t] += B[r][0] * ap[t]->ds[0] + B[r][1] * ap[t]->ds[1];
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m512i sum = _mm512_dpbusd_epi32(ap[t]->s0, wv[r], ap[t]->a);
            ta->acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(A[r], ap[t]->D), ta->acc[r][t]);
        }
}

/* An NR x NT tile of the types and rows that do not take ksb_tile (ksb_rows; unpack's K-quant and IQ4_XS cases
 * serve rp_pack) (compile-time sizes once inlined) against prepared activations: token t's act_pair of
 * pair step g / 2 at pre[t * ldp + g / 2]. The pairs of groups run in a loop without the odd last group,
 * which comes after it (a branch on it inside the loop halved one-row Q8_0 decode on the Zen 4 VM in some
 * builds). */
QW_INLINE void qtile_nxm(qw_type T, int PF, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws,
                         const act_pair *pre, int64_t ldp, int64_t n) {
    tile_acc ta;
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) {
            ta.acc[r][t] = _mm512_setzero_ps();
            ta.accB[r][t] = 0;
        }
    int64_t ng = n / 32;
    for (int64_t g = 0; g + 1 < ng; g += 2) pair_step(T, PF, NR, NT, &ta, w, ws, pre, ldp, g, 1);
    if (ng % 2) pair_step(T, PF, NR, NT, &ta, w, ws, pre, ldp, ng - 1, 0);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(ta.acc[r][t]) + ta.accB[r][t];
}

/* The calling thread's scratch (qtiles.h): slot 0 act_pairs / act_sbs, 1 a repacked row block, 2 the tokens' group
 * terms. */
static act_pair *pre_scratch(int64_t n) { return qw_qtile_scratch(0, (size_t)n * sizeof(act_pair)); }

/*
 * One token (decode) against the pair kernels' types: the token's activations are prepared once per call
 * and every row of the call reads them back, so they must stay in L1 beside the weight stream. They are
 * kept compact, per pair step its 64 bytes and, in act_scal, d and d * s of its two groups (72 bytes where
 * act_pair has 256): vpdpbusd's start, -type_offset * (lane sums), is recomputed per row and step (one more
 * vpdpbusd, the same integers). On AMD the row is also prefetched non-temporally ROW_PREFETCH ahead, so its
 * lines do not push the activations out of L1. One Zen 4 core, Q8_0, 16 Mi weights, median of 5: 2048 /
 * 4096 / 8192 / 16384 elements per row 20.0 / 18.7 / 9.1 / 8.2 GB/s with act_pair and no prefetch, 21.3 /
 * 21.3 / 20.1 / 14.1 so; 2 threads 34 / 30 / 17 / 16 -> 33 / 33 / 31 / 27.
 * On Intel the row is asked for twice: to L1 ROW_PREFETCH ahead and to L2 twice that, so more of its lines
 * are in flight than L1's fill buffers hold. Xeon (Sapphire Rapids VM), Q8_0, 48 Mi weights, median of 3,
 * rows of 2048 / 8192 elements: one core 10.3 / 11.4 GB/s with the L1 request alone, 13.5 / 14.2 with
 * both; 2 threads 23.9 / 22.7 -> 23.3 / 28.1; 8 threads 85 / 82 -> 94 / 91 (L1 2 KiB ahead or 8 KiB,
 * L2 4, 12 or 16 KiB ahead, or L2 alone did no better).
 */
typedef struct {
    float d[2], ds[2]; /* group g's and g+1's d, and d * s (Q4_1 / Q5_1); 0 for a missing g+1 */
} act_scal;

QW_INLINE void act_prep1(qw_type T, const qw_q8a *x, int64_t g, int two, __m512i *a, act_scal *sc) {
    act_pair ap;
    act_prep(T, x, g, two, &ap);
    *a = ap.a;
    sc->d[0] = x[g].d;
    sc->d[1] = two ? x[g + 1].d : 0.0f;
    sc->ds[0] = type_has_min(T) ? ap.ds[0] : 0.0f;
    sc->ds[1] = type_has_min(T) ? ap.ds[1] : 0.0f;
}

/* Groups g and g+1 (only g when !two) of one row against one token: pair_step's integers and f32 steps for
 * NR = NT = 1, so its bits. */
QW_INLINE void step_1tok(qw_type T, int PF, __m512 *acc, float *accB, const void *w, const __m512i *a,
                         const act_scal *sc, int64_t g, int two) {
    __m512i wv, av = a[g / 2], s0 = _mm512_setzero_si512();
    __m512 A;
    float B[2], kc[16];
    const char *pf = (const char *)w + g * group_bytes(T);
    if (PF == PF_INTEL) {
        _mm_prefetch(pf + ROW_PREFETCH, _MM_HINT_T0);
        _mm_prefetch(pf + 2 * ROW_PREFETCH, _MM_HINT_T1);
    } else {
        _mm_prefetch(pf + ROW_PREFETCH, _MM_HINT_NTA);
    }
    unpack(T, (const uint8_t *)w, g, two, &wv, &A, B, kc);
    if (type_offset(T)) s0 = _mm512_sub_epi32(s0, _mm512_dpbusd_epi32(s0, _mm512_set1_epi8((char)type_offset(T)), av));
    if (type_has_min(T)) *accB += B[0] * sc[g / 2].ds[0] + B[1] * sc[g / 2].ds[1];
    __m512i sum = _mm512_dpbusd_epi32(s0, wv, av);
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(A, pair_at(sc[g / 2].d)), *acc);
}

/* One token against nr rows (any nr): its activations once, then each row alone from start to end, the pairs
 * in a loop and the odd last group after it (as qtile_nxm). */
QW_INLINE void qrows_1tok(qw_type T, int PF, float *y, const void *w, size_t ws, const qw_q8a *x, int nr, int64_t n) {
    if (ksb_rows(T, n)) {
        act_sb *pre = qw_qtile_scratch(0, (size_t)(n / QW_QK_K) * sizeof(act_sb));
        if (!pre) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
        for (int64_t sb = 0; sb < n / QW_QK_K; sb++) act_prep_sb(T, x, sb, &pre[sb]);
        for (int r = 0; r < nr; r++) ksb_tile(T, PF, 1, 1, y + r, 1, (const char *)w + r * ws, ws, pre, 0, n);
        return;
    }
    int64_t ng = n / 32, np = (ng + 1) / 2;
    __m512i *a = qw_qtile_scratch(0, (size_t)np * (sizeof(__m512i) + sizeof(act_scal)));
    if (!a) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    act_scal *sc = (act_scal *)(a + np);
    for (int64_t g = 0; g < ng; g += 2) act_prep1(T, x, g, g + 1 < ng, &a[g / 2], &sc[g / 2]);
    for (int r = 0; r < nr; r++) {
        const char *wr = (const char *)w + (size_t)r * ws;
        __m512 acc = _mm512_setzero_ps();
        float accB = 0;
        for (int64_t g = 0; g + 1 < ng; g += 2) step_1tok(T, PF, &acc, &accB, wr, a, sc, g, 1);
        if (ng % 2) step_1tok(T, PF, &acc, &accB, wr, a, sc, ng - 1, 0);
        y[r] = hsum(acc) + accB;
    }
}

/*
 * Several tokens: 16 rows repacked so that lane r of a vector is row r (the layout llama.cpp's CPU_REPACK
 * also uses). A row block is unpacked once per call into, for each group of 32 (sub-group of 16 for
 * Q6_K, whose scales change every 16), its bytes as [chunk of 4][row][4 bytes] (one 64-byte vector per
 * chunk), the rows' scales A as one vector and, for the types with mins, their B; every token of the call
 * then passes over it. Per group and token: one vpdpbusd per 4 elements against the token's 4 bytes
 * broadcast, started at -offset * (the sub-group's activation sum), so the lane holds the group's exact
 * integer dot; then acc = fma(float(isum), A * d_act, acc) and, with mins, acc = fma(B, d_act * s_act,
 * acc). The f32 work is one FMA per group for 16 outputs instead of one per 4 elements, which is what
 * bounds the one-row kernel above. A row's result depends only on the row and the token (rows past nr
 * are zeros, never stored), so any grouping of rows, tokens and threads gives the same bits; it differs
 * from the one-token kernel's order of f32 additions, within the same bound (q8a.h).
 */
#define RP_ROWS 16
#define RP_MIN_TOKENS 16

QW_INLINE int rp_sub(qw_type T) { return T == QW_TYPE_Q6_K ? 2 : 1; } /* sub-groups per group */

/* unpack rows r0 .. r0+nr-1 (nr <= 16; the rest zeros) into wq [ng][8][16][4] bytes, A [ng * sub][16],
 * B [ng][16] (types with mins) */
QW_INLINE void rp_pack(qw_type T, const void *w, size_t ws, int nr, int64_t n, uint8_t *wq, float *A, float *B) {
    int64_t ng = n / 32;
    const int sub = rp_sub(T);
    float kc[16];
    for (int r = 0; r < RP_ROWS; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * ws;
        for (int64_t g = 0; g < ng; g += 2) {
            int two = g + 1 < ng;
            __m512i wv = _mm512_setzero_si512();
            __m512 Av = _mm512_setzero_ps();
            float Bp[2] = {0, 0};
            if (r < nr) unpack(T, row, g, two, &wv, &Av, Bp, kc);
            /* dword c of the pair (chunk c % 8 of group g + c / 8) to [chunk][row r] */
            const __m512i idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
            if (two)
                _mm512_i32scatter_epi32(wq + (size_t)g * 8 * 64 + 4 * r, idx, wv, 4);
            else
                _mm512_mask_i32scatter_epi32(wq + (size_t)g * 8 * 64 + 4 * r, 0x00FF, idx, wv, 4);
            float av[16];
            _mm512_storeu_ps(av, Av);
            for (int h = 0; h <= two; h++) {
                for (int si = 0; si < sub; si++) A[((g + h) * sub + si) * RP_ROWS + r] = av[8 * h + si * 8 / sub];
                if (type_has_min(T)) B[(g + h) * RP_ROWS + r] = Bp[h];
            }
        }
    }
}

/* NT tokens (compile-time) against a packed block: y[t * ldy + r] for r < nr. ofs: each token's
 * -offset * (sub-group activation sum), dsm: d * s of each group (mins), ldo: their stride per token */
QW_INLINE void rp_tokens(qw_type T, int NT, float *y, int64_t ldy, int nr, const uint8_t *wq, const float *A,
                         const float *B, const qw_q8a *x, int64_t ldx, const int32_t *ofs, const float *dsm,
                         int64_t ldo, int64_t ng) {
    const int sub = rp_sub(T), cps = 8 / sub; /* chunks of 4 per sub-group */
    __m512 acc[8];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        for (int si = 0; si < sub; si++) {
            __m512i is[8];
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) is[t] = _mm512_set1_epi32(ofs[t * ldo + g * sub + si]);
#pragma GCC unroll 8
            for (int k = 0; k < cps; k++) {
                __m512i wv = _mm512_load_si512(wq + ((size_t)g * 8 + si * cps + k) * 64);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    int32_t a4;
                    memcpy(&a4, x[t * ldx + g].q + 4 * (si * cps + k), 4);
                    is[t] = _mm512_dpbusd_epi32(is[t], wv, _mm512_set1_epi32(a4));
                }
            }
            __m512 Av = _mm512_load_ps(A + (g * sub + si) * RP_ROWS);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(Av, _mm512_set1_ps(x[t * ldx + g].d)),
                                         acc[t]);
        }
        if (type_has_min(T)) {
            __m512 Bv = _mm512_load_ps(B + g * RP_ROWS);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(Bv, _mm512_set1_ps(dsm[t * ldo + g]), acc[t]);
        }
    }
    __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

/* nr rows (any) x nt tokens (any) through packed blocks of 16 rows */
QW_INLINE void rp_matmul(qw_type T, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                         int nr, int nt, int64_t n) {
    int64_t ng = n / 32;
    qw_rp_scratch b = qw_rp_scratch_get(x, ldx, nt, ng, rp_sub(T), type_offset(T), type_has_min(T), RP_ROWS);
    if (!b.wq) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    const int64_t ldo = b.ldo;
    for (int r = 0; r < nr; r += RP_ROWS) {
        int nb = nr - r < RP_ROWS ? nr - r : RP_ROWS;
        rp_pack(T, (const char *)w + (size_t)r * ws, ws, nb, n, b.wq, b.A, b.B);
        int t = 0;
        for (; t + 8 <= nt; t += 8)
            rp_tokens(T, 8, y + t * ldy + r, ldy, nb, b.wq, b.A, b.B, x + t * ldx, ldx, b.ofs + t * ldo,
                      b.dsm + t * ldo, ldo, ng);
        for (; t + 4 <= nt; t += 4)
            rp_tokens(T, 4, y + t * ldy + r, ldy, nb, b.wq, b.A, b.B, x + t * ldx, ldx, b.ofs + t * ldo,
                      b.dsm + t * ldo, ldo, ng);
        for (; t < nt; t++)
            rp_tokens(T, 1, y + t * ldy + r, ldy, nb, b.wq, b.A, b.B, x + t * ldx, ldx, b.ofs + t * ldo,
                      b.dsm + t * ldo, ldo, ng);
    }
}

/*
 * AMX (Intel Xeon from Sapphire Rapids on; the "amx" table): the integer dots of rp_matmul's packed blocks
 * as tile products. A packed group, [chunk of 4][row][4 bytes], is already the layout of a tile product's
 * B operand (K/4 rows of 64 bytes: 16 columns of 4 consecutive k), so a block is rp_pack's with the offset
 * taken off its bytes (signed weights, tdpbssd); the A operand is 16 tokens' activation bytes, read where
 * they are (row stride: one token). C then holds the 16 x 16 exact integer dots of a group (Q6_K: of a
 * sub-group of 16), the very integers of rp_tokens' lanes, and the f32 steps after it are rp_tokens' in
 * its order: an output has the bits of the avx512 table's. Two C tiles alternate, so the tile product of
 * group k + 1 runs while the vector unit scales group k. Tiles: 0, 1 = C; 2, 3 = A; 4, 5 = B. A call sets
 * the tile configuration of its thread and releases it at the end. Linux lets a process use the tile
 * data only after arch_prctl(ARCH_REQ_XCOMP_PERM) (cpu.c, before the table is offered).
 */
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* C tile c's 16 x 16 int32 at cb through the f32 steps of rp_tokens for packed step k (group k / sub,
 * sub-group k % sub): 16 tokens of x, lane = row. */
QW_INLINE void amx_scale(qw_type T, __m512 acc[16], const int32_t *cb, const float *A, const float *B,
                         const qw_q8a *x, int64_t ldx, const float *dsm, int64_t ldo, int64_t k) {
    const int sub = rp_sub(T);
    int64_t g = k / sub;
    __m512 Av = _mm512_load_ps(A + k * RP_ROWS);
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * t)),
                                 _mm512_mul_ps(Av, _mm512_set1_ps(x[t * ldx + g].d)), acc[t]);
    if (type_has_min(T) && k % sub == sub - 1) {
        __m512 Bv = _mm512_load_ps(B + g * RP_ROWS);
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++) acc[t] = _mm512_fmadd_ps(Bv, _mm512_set1_ps(dsm[t * ldo + g]), acc[t]);
    }
}

/* 16 tokens of x (row stride ldx) against a packed block: y[t * ldy + r] for r < nr, t < nt */
QW_INLINE AMX_TARGET void amx_tokens16(qw_type T, float *y, int64_t ldy, int nr, int nt, const uint8_t *wq,
                                       const float *A, const float *B, const qw_q8a *x, int64_t ldx,
                                       const float *dsm, int64_t ldo, int64_t ng) {
    const int sub = rp_sub(T), kb = 32 / sub; /* activation bytes of one step */
    const int64_t K = ng * sub;
    const long xs = (long)(ldx * (int64_t)sizeof(qw_q8a));
    _Alignas(64) int32_t cb[2][256];
    __m512 acc[16];
    for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
#define AMX_A(k) ((const int8_t *)x[(k) / sub].q + kb * ((k) % sub))
#define AMX_B(k) (wq + (size_t)(k) * 8 * 64 / sub)
    for (int64_t k = 0; k < K; k += 2) {
        _tile_loadd(2, AMX_A(k), xs);
        _tile_loadd(4, AMX_B(k), 64);
        _tile_zero(0);
        _tile_dpbssd(0, 2, 4);
        if (k > 0) {
            _tile_stored(1, cb[1], 64);
            amx_scale(T, acc, cb[1], A, B, x, ldx, dsm, ldo, k - 1);
        }
        if (k + 1 < K) {
            _tile_loadd(3, AMX_A(k + 1), xs);
            _tile_loadd(5, AMX_B(k + 1), 64);
            _tile_zero(1);
            _tile_dpbssd(1, 3, 5);
        }
        _tile_stored(0, cb[0], 64);
        amx_scale(T, acc, cb[0], A, B, x, ldx, dsm, ldo, k);
    }
    if (K % 2 == 0) {
        _tile_stored(1, cb[1], 64);
        amx_scale(T, acc, cb[1], A, B, x, ldx, dsm, ldo, K - 1);
    }
#undef AMX_A
#undef AMX_B
    __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * ldy, m, acc[t]);
}

/* nr rows (any) x nt >= 16 tokens through packed blocks of 16 rows and tile products of 16 tokens; the
 * last nt % 16 tokens from a copy padded with zero tokens */
QW_INLINE AMX_TARGET void amx_matmul(qw_type T, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x,
                                     int64_t ldx, int nr, int nt, int64_t n) {
    const int64_t ng = n / 32;
    const int sub = rp_sub(T), o = type_offset(T), tail = nt % 16, nt16 = nt - tail;
    /* the tokens' d * s (mins), zero for the padding */
    float *dsm = qw_qtile_scratch(2, (size_t)(nt16 + 16) * ng * sizeof(float) + (size_t)16 * ng * sizeof(qw_q8a));
    if (!dsm) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    qw_q8a *pad = (qw_q8a *)(dsm + (size_t)(nt16 + 16) * ng);
    if (type_has_min(T)) {
        qw_q8a_group_terms(x, ldx, nt, ng, 1, 0, NULL, dsm);
        memset(dsm + (size_t)nt * ng, 0, (size_t)(16 - tail) % 16 * ng * sizeof(float));
    }
    if (tail) {
        memset(pad, 0, (size_t)16 * ng * sizeof(qw_q8a));
        for (int t = 0; t < tail; t++) memcpy(pad + t * ng, x + (nt16 + t) * ldx, (size_t)ng * sizeof(qw_q8a));
    }
    size_t wq_bytes = (size_t)ng * 8 * 64, a_bytes = (size_t)ng * sub * RP_ROWS * sizeof(float);
    uint8_t *wq = qw_qtile_scratch(1, wq_bytes + a_bytes + (size_t)ng * RP_ROWS * sizeof(float));
    if (!wq) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    float *A = (float *)(wq + wq_bytes), *B = A + (size_t)ng * sub * RP_ROWS;
    amx_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 6; i++) {
        cfg.rows[i] = i < 4 ? 16 : (uint8_t)(8 / sub);
        cfg.colsb[i] = i == 2 || i == 3 ? (uint16_t)(32 / sub) : 64;
    }
    _tile_loadconfig(&cfg);
    for (int r = 0; r < nr; r += RP_ROWS) {
        int nb = nr - r < RP_ROWS ? nr - r : RP_ROWS;
        rp_pack(T, (const char *)w + (size_t)r * ws, ws, nb, n, wq, A, B);
        if (o)
            for (size_t i = 0; i < wq_bytes; i += 64)
                _mm512_store_si512(wq + i, _mm512_sub_epi8(_mm512_load_si512(wq + i), _mm512_set1_epi8((char)o)));
        __asm__ volatile("" ::: "memory"); /* the tile loads read what the vector stores wrote */
        for (int t = 0; t < nt16; t += 16)
            amx_tokens16(T, y + t * ldy + r, ldy, nb, 16, wq, A, B, x + t * ldx, ldx, dsm + t * ng, ng, ng);
        if (tail) amx_tokens16(T, y + nt16 * ldy + r, ldy, nb, tail, wq, A, B, pad, ng, dsm + nt16 * ng, ng, ng);
    }
    _tile_release();
}

/*
 * Any nr, any nt (cpu.h: the avx512 table's qtile_nt). One token (decode) takes the rows one at a time: a
 * single sequential stream through memory. Reading 2 or 4 rows side by side, the hardware prefetcher of
 * the AMD Zen 4 development VM kept only half of DRAM's bandwidth busy (one Q8_0 row at a time: 22 GB/s
 * on one core, 4 rows: 9.5; software prefetching of the 4 rows did not recover it). From RP_MIN_TOKENS
 * tokens on, the repacked blocks above (rp_matmul): one core, 64 tokens, weights from DRAM: Q4_K 0.42 ->
 * 0.81 GB/s of weights, Q8_0 0.95 -> 1.63, Q6_K 0.60 -> 0.83, Q5_0 0.53 -> 0.99; below it repacking a
 * block costs more than it saves (Q4_K, 4 tokens: 4.3 GB/s with the 4 x 4 tiles, 1.9 repacked; even at
 * 12-16 tokens), so 2 .. 15 tokens take q4tok's 4 x 4 tiles (their numbers are the one-token kernel's).
 */
/* 4 tokens or fewer against nr rows: their act_pairs once, then 4 x 4 tiles, the rest a row at a time */
QW_INLINE void q4tok(qw_type T, int PF, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                     int nr, int nt, int64_t n) {
    if (ksb_rows(T, n)) { /* a row at a time against the nt tokens (4 x 4 would spill the weight vectors) */
        int64_t nsb = n / QW_QK_K;
        act_sb *pre = qw_qtile_scratch(0, (size_t)(nt * nsb) * sizeof(act_sb));
        if (!pre) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
        for (int t = 0; t < nt; t++)
            for (int64_t sb = 0; sb < nsb; sb++) act_prep_sb(T, x + t * ldx, sb, &pre[t * nsb + sb]);
        for (int r = 0; r < nr; r++) {
            const char *wr = (const char *)w + (size_t)r * ws;
            if (nt == 4)
                ksb_tile(T, PF, 1, 4, y + r, ldy, wr, ws, pre, nsb, n);
            else
                for (int t = 0; t < nt; t++) ksb_tile(T, PF, 1, 1, y + t * ldy + r, ldy, wr, ws, pre + t * nsb, nsb, n);
        }
        return;
    }
    int64_t ng = n / 32, ldp = (ng + 1) / 2;
    act_pair *pre = pre_scratch(nt * ldp);
    if (!pre) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    for (int t = 0; t < nt; t++)
        for (int64_t g = 0; g < ng; g += 2) act_prep(T, x + t * ldx, g, g + 1 < ng, &pre[t * ldp + g / 2]);
    int r = 0;
    if (nt == 4)
        for (; r + 4 <= nr; r += 4)
            qtile_nxm(T, PF, 4, 4, y + r, ldy, (const char *)w + (size_t)r * ws, ws, pre, ldp, n);
    for (; r < nr; r++) {
        const char *wr = (const char *)w + (size_t)r * ws;
        if (nt == 4)
            qtile_nxm(T, PF, 1, 4, y + r, ldy, wr, ws, pre, ldp, n);
        else
            for (int t = 0; t < nt; t++) qtile_nxm(T, PF, 1, 1, y + t * ldy + r, ldy, wr, ws, pre + t * ldp, ldp, n);
    }
}

QW_INLINE void qtile_any(qw_type T, int PF, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                         int nr, int nt, int64_t n) {
    if (nt == 1)
        qrows_1tok(T, PF, y, w, ws, x, nr, n);
    else if (nt >= RP_MIN_TOKENS)
        rp_matmul(T, y, ldy, w, ws, x, ldx, nr, nt, n);
    else
        for (int t = 0; t < nt; t += 4)
            q4tok(T, PF, y + t * ldy, ldy, w, ws, x + t * ldx, ldx, nr, nt - t < 4 ? nt - t : 4, n);
}

/*
 * qw_q8a_quantize, 32 floats at a time, the same bytes: the block's max |x| is exact in any order, d and
 * 127 / max are the same scalar divisions, x * (127 / max) the same f32 products, and vcvtps2dq rounds half
 * to even as qw_nearest_int does below 2^22 (|x * id| <= 127 here). Blocks where that does not hold (a NaN,
 * or a max outside [1e-30, 1e30] but not 0, where 127 / max overflows or x * id can be NaN) go through
 * qw_q8a_quantize itself.
 */
void qw_avx512_q8a_quantize(const float *x, qw_q8a *y, int64_t n) {
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t b = 0; b < n / QW_Q8A_BLOCK; b++) {
        const float *xb = x + b * QW_Q8A_BLOCK;
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        __mmask16 nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        if (nan || !(amax == 0.0f || (amax >= 1e-30f && amax <= 1e30f))) {
            qw_q8a_quantize(xb, y + b, QW_Q8A_BLOCK);
            continue;
        }
        float id = amax != 0 ? 127.0f / amax : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        q0 = _mm512_max_epi32(_mm512_min_epi32(q0, hi), lo);
        q1 = _mm512_max_epi32(_mm512_min_epi32(q1, hi), lo);
        _mm_storeu_si128((__m128i *)y[b].q, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].q + 16), _mm512_cvtepi32_epi8(q1));
        y[b].d = amax / 127.0f;
        y[b].s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

#define QTILE(v, T, name)                                                                                          \
    QW_QTILE_PROTO(v, T, name) { qtile_any(T, PF_AMD, y, ldy, w, ws, x, ldx, nr, nt, n); }
QW_QTILE_LIST(QTILE, avx512)
#undef QTILE
#define QTILE(v, T, name)                                                                                          \
    QW_QTILE_PROTO(v, T, name) { qtile_any(T, PF_INTEL, y, ldy, w, ws, x, ldx, nr, nt, n); }
QW_QTILE_LIST(QTILE, avx512i)

/* the amx table's tiles: 16 tokens or more through amx_matmul, fewer through the avx512 tile */
#define QTILE_AMX(v, T, name)                                                                                      \
    static AMX_TARGET void amx_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x,           \
                                      int64_t ldx, int nr, int nt, int64_t n) {                                    \
        amx_matmul(T, y, ldy, w, ws, x, ldx, nr, nt, n);                                                           \
    }                                                                                                              \
    QW_QTILE_PROTO(v, T, name) {                                                                                   \
        if (nt >= RP_MIN_TOKENS)                                                                                   \
            amx_##name(y, ldy, w, ws, x, ldx, nr, nt, n);                                                          \
        else                                                                                                       \
            qw_avx512i_qtile_##name(y, ldy, w, ws, x, ldx, nr, nt, n);                                             \
    }
QW_QTILE_LIST(QTILE_AMX, amx)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* __x86_64__ */
