/*
 * avx2_q.c - AVX2 integer dot kernels of all ten block-quantized weight types against 8-bit activations
 * (q8a.h); the scalar oracle is qw_q8a_dot_ref, the contract of a tile is cpu.h's qw_qtile_fn.
 *
 * avx512_q.c's design in 256 bits, one group of 32 weights per step. A block's scales and mins are
 * decoded once per row and block (head: the K-quants' 8 sub-blocks at once); each type's unpack then gives
 * a group as 32 bytes, a per-lane f32 scale A (lane l covers elements 4l .. 4l+3, so Q6_K's two
 * 16-element sub-blocks are lanes 0-3 and 4-7) and, for Q4_1 / Q5_1, the min B. Sub-block scales go into
 * A (d * sc is exact in f32: an 11-bit by a 6- or 8-bit integer), so the bytes stay small.
 *
 * vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16 with saturation, so:
 *   Q4_1 Q5_1 Q4_K Q5_K   unsigned q <= 31 as they are;
 *   Q4_0 Q5_0 Q6_K        iw = q - o (o = 8, 16, 32): unsigned q <= 63 in, o * (sum of the lane's 4
 *                         activations) subtracted from the int32 lane (that sum is one vpmaddubsw per token);
 *   Q8_0 IQ4_NL IQ4_XS    |w| <= 128 in, its sign moved onto the activation (vpsignb; a is never -128,
 *                         and |-128| reads as the unsigned 128).
 * No pair saturates: at most 2 * 128 * 127 = 32512 < 32767. vpmaddwd with ones gives 8 int32 lanes of 4
 * products each (|lane| <= 65024, exact in f32), the same integers as the reference's; acc += isum *
 * (A * d_act) per lane. The mins: Q4_1 / Q5_1 add B * d_act * s in a scalar beside acc; the K-quants add
 * their 8 sub-blocks' B_j * d_act * s_j into acc's lane j once per super-block (one FMA instead of 8
 * scalar products). Then the fixed 8 -> 1 tree. Each output is computed by the same operations in every
 * tile shape: it depends only on the row and the token, never on the tile shape or the thread count.
 *
 * Error against the reference: the test checks |tile - qw_q8a_dot_ref| <= (n/32 + 16) * 2^-24 *
 * qw_q8a_dot_abs, avx512_q.c's bound. Each lane adds n/32 group terms (and n/256 K-quant min terms), each
 * rounded twice (A * d_act, the FMA), then 3 tree levels and the Q4_1 / Q5_1 scalar. Taken as a worst
 * case, with every rounding of this sum and of the reference's going the same way, that is about
 * (2 n/32 + 10) * 2^-24 * qw_q8a_dot_abs (so it is for avx512_q.c); roundings that partly cancel keep the
 * error well inside (n/32 + 16): at most 0.23 of it on the test's rows, 0.37 on rows of up to 65536
 * constant or one-signed weights and activations.
 *
 * Tiles: 4 rows x 2 tokens (the avx2 table's tile_nr x tile_nt): 8 accumulators, 2 activation vectors and
 * one row's weights fit the 16 registers; 4x1, 1x2 and 1x1 compute each output the same way, and up to 15
 * tokens are taken in pairs (Q4_K, Q5_K, Q6_K: a row at a time, a super-block per step: ksb_row). From
 * RP_MIN_TOKENS tokens on, blocks of 8 repacked rows instead (rp_matmul, below: one core, 64 tokens, Q4_K
 * 0.30 -> 0.63 GB/s of weights, Q6_K 0.34 -> 0.64, Q5_K 0.33 -> 0.76, Q4_0 0.28 -> 0.66, Q8_0 0.54 -> 0.85,
 * IQ4_XS 0.24 -> 0.42 on the Zen 4 VM), whose f32 additions run in another order, within the same bound.
 *
 * Only this file and avx2.c are compiled for AVX2 (the pragma below); cpu.c uses them only when cpuid
 * reports AVX2, FMA and F16C.
 */
#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <string.h>

#include "kernels/qtiles.h"
#include "tensor/quant.h"

#define QW_INLINE static inline __attribute__((always_inline))
/* Bytes ahead in each weight row that a tile asks the cache for: without it one thread decoding from DRAM
 * ran about 10% slower (every type alike, on the AMD Zen 4 VM); from L2 it makes no difference. Every tile
 * comes in two builds (PF, as in avx512_q.c). On AMD a row read alone asks 4 KiB ahead, non-temporally:
 * the K-quant super-block rows (ksb_row; one Zen 4 core from DRAM: Q4_K 14.7 -> 17.5 GB/s, Q6_K 16.4 ->
 * 18.6) and the one-token rows of the other types (against 512 bytes ahead to L1, Q8_0, medians of 5: rows
 * of 2048 and 8192 the same within the VM's noise, one core 22.9 / 23.6 -> 26.1 / 23.2 GB/s; long rows
 * faster, 16384 one core 13.0 -> 15.3, 2 threads 23.4 -> 28.4, 14336 on 2 threads 24.4 -> 29.5: the stream
 * no longer pushes a long row's activations out of L1); the other tiles ask PREFETCH ahead to L1. On Intel,
 * where a non-temporal prefetch halved avx512_q.c's decode, a row read alone (decode) asks ROW_PREFETCH_INTEL
 * ahead to L1 and the 4-row tiles PREFETCH ahead. One core of the
 * Sapphire Rapids VM from DRAM, 512 -> 4096 bytes ahead: Q8_0 7.2-8.2 -> 12.0 GB/s, Q4_K 7.4-7.8 -> 12.1,
 * Q6_K 7.0-7.4 -> 9.9-11.5, Q4_0 6.7-7.0 -> 10.8-12.1; 8 threads, Q8_0 44-49 -> 65-68, Q4_K 40-44 -> 55-79
 * (2048 bytes: between the two). */
#define PREFETCH 512
#define ROW_PREFETCH_AMD 4096
#define ROW_PREFETCH_INTEL 4096
enum { PF_AMD, PF_INTEL };

QW_INLINE float f16(const void *p) { return _cvtsh_ss(qw_rd16(p)); }

/* Does the type's unpack give signed bytes (then the sign trick is needed) / group mins (B)? */
QW_INLINE int type_signed(qw_type t) { return t == QW_TYPE_Q8_0 || t == QW_TYPE_IQ4_NL || t == QW_TYPE_IQ4_XS; }
/* The offset o of iw = q - o (Q4_0, Q5_0, Q6_K): unpack gives q >= 0, the tile subtracts o * sum(a) per lane. */
QW_INLINE int type_offset(qw_type t) { return t == QW_TYPE_Q4_0 ? 8 : t == QW_TYPE_Q5_0 ? 16 : t == QW_TYPE_Q6_K ? 32 : 0; }
QW_INLINE int type_has_min(qw_type t) { return t == QW_TYPE_Q4_1 || t == QW_TYPE_Q5_1 || t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K; }
/* Groups of 32 in a block (the super-block of the K-quants and IQ4_XS). */
QW_INLINE int type_groups(qw_type t) { return t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K || t == QW_TYPE_Q6_K || t == QW_TYPE_IQ4_XS ? 8 : 1; }

/* 16 bytes of nibbles -> 32 values: low nibbles then high nibbles (the Q4_0 packing of a group) */
QW_INLINE __m256i nibbles16(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* bit i of the 32-bit qh -> byte i = 0xFF or 0 (the fifth bits of Q5_0 / Q5_1) */
QW_INLINE __m256i bits32(const uint8_t *qh) {
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qw_rd32(qh)),
                                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE)); /* byte k: every bit but k % 8 */
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* Bit `from` (< 8) of every byte moved to bit `to` (other bits garbage: the caller masks). The 16-bit shift
 * brings the neighbouring byte's bits only below `to` (going left) or above it (going right). */
QW_INLINE __m256i move_bits(__m256i v, int from, int to) {
    return from < to ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - from)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(from - to));
}

/* One row's block scales, decoded once per block: group j's A (Q6_K: lanes 0-3 A[2j], 4-7 A[2j+1]) and B. */
typedef struct {
    float A[16], B[8];
} head_t;

QW_INLINE void head(qw_type t, const uint8_t *b, head_t *h) {
    switch (t) {
    case QW_TYPE_Q8_0:
    case QW_TYPE_Q4_0:
    case QW_TYPE_Q5_0:
    case QW_TYPE_IQ4_NL:
        h->A[0] = f16(b);
        return;
    case QW_TYPE_Q4_1:
    case QW_TYPE_Q5_1:
        h->A[0] = f16(b);
        h->B[0] = f16(b + 2);
        return;
    case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_K: { /* qw_k4_scale_min of all 8 sub-blocks at once: u[0..1] scales, u[2..3] mins */
        uint32_t u[4], m03;
        memcpy(u, b + 4, QW_K_SCALE_SIZE);
        u[3] = ((u[2] >> 4) & 0x0F0F0F0F) | (((u[1] >> 6) & 0x03030303) << 4);
        m03 = u[1] & 0x3F3F3F3F;
        u[1] = (u[2] & 0x0F0F0F0F) | (((u[0] >> 6) & 0x03030303) << 4);
        u[2] = m03;
        u[0] &= 0x3F3F3F3F;
        __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)));
        __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + 2))));
        _mm256_storeu_ps(h->A, _mm256_mul_ps(sc, _mm256_set1_ps(f16(b))));
        _mm256_storeu_ps(h->B, _mm256_mul_ps(mn, _mm256_set1_ps(-f16(b + 2))));
        return;
    }
    case QW_TYPE_Q6_K: { /* 16 int8 scales at 192, d at 208 */
        __m128i s = _mm_loadu_si128((const __m128i *)(b + 192));
        __m256 d = _mm256_set1_ps(f16(b + 208));
        _mm256_storeu_ps(h->A, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), d));
        _mm256_storeu_ps(h->A + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8))), d));
        return;
    }
    case QW_TYPE_IQ4_XS: { /* ls_j: bits 4j.. of scales_l (4 bits), bits 2j.. of scales_h (2 bits); A = d (ls - 32) */
        __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)qw_rd32(b + 4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32(qw_rd16(b + 2)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        __m256i ls = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xF)),
                                     _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
        __m256 sc = _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
        _mm256_storeu_ps(h->A, _mm256_mul_ps(sc, _mm256_set1_ps(f16(b))));
        return;
    }
    default:
        __builtin_unreachable();
    }
}

/* Group j of a block b (decoded head h): 32 weight bytes w, the per-lane scale A, the min B (Q4_1, Q5_1; the
 * K-quants' mins stay in h). kv: qw_kvalues_iq4nl in both 128-bit lanes (IQ4 types). */
QW_INLINE void unpack(qw_type t, const uint8_t *b, int j, const head_t *h, __m256i kv, __m256i *w, __m256 *A,
                      float *B) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    switch (t) {
    case QW_TYPE_Q8_0:
        *w = _mm256_loadu_si256((const __m256i *)(b + 2));
        break;
    case QW_TYPE_Q4_0:
        *w = nibbles16(b + 2);
        break;
    case QW_TYPE_Q4_1:
        *w = nibbles16(b + 4);
        break;
    case QW_TYPE_Q5_0:
        *w = _mm256_or_si256(nibbles16(b + 6), _mm256_and_si256(bits32(b + 2), _mm256_set1_epi8(0x10)));
        break;
    case QW_TYPE_Q5_1:
        *w = _mm256_or_si256(nibbles16(b + 8), _mm256_and_si256(bits32(b + 4), _mm256_set1_epi8(0x10)));
        break;
    case QW_TYPE_IQ4_NL:
        *w = _mm256_shuffle_epi8(kv, nibbles16(b + 2));
        break;
    case QW_TYPE_Q4_K: { /* sub-blocks 2i, 2i+1: low / high nibbles of the same 32 bytes */
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (j / 2)));
        *w = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (j % 2))), m4);
        break;
    }
    case QW_TYPE_Q5_K: { /* Q4_K's nibbles (after 32 bytes of qh) and bit j of qh[l] as bit 4 */
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (j / 2)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        *w = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (j % 2))), m4),
                             _mm256_and_si256(move_bits(qh, j, 4), _mm256_set1_epi8(0x10)));
        break;
    }
    case QW_TYPE_Q6_K: { /* half hf = j / 4, quarter k = j % 4: ql nibble, bits 2k, 2k+1 of qh as bits 4, 5 */
        int hf = j / 4, k = j % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * hf + 32 * (k & 1)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hf));
        *w = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (k / 2))), m4),
                             _mm256_and_si256(move_bits(qh, 2 * k, 4), _mm256_set1_epi8(0x30)));
        __m128 a2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(h->A + 2 * j)));
        *A = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(a2), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        return;
    }
    case QW_TYPE_IQ4_XS:
        *w = _mm256_shuffle_epi8(kv, nibbles16(b + 8 + 16 * j));
        break;
    default:
        __builtin_unreachable();
    }
    *A = _mm256_set1_ps(h->A[j]);
    if (type_has_min(t) && type_groups(t) == 1) *B = h->B[0];
}

/* The fixed reduction: 8 -> 4 -> 2 -> 1 (as avx2.c). */
QW_INLINE float hsum(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* An NR x NT tile (NR <= 4, NT <= 2; compile-time sizes once inlined). */
QW_INLINE void qtile_nxm(qw_type T, int PF, int NR, int NT, float *y, int64_t ldy, const void *w, size_t ws,
                         const qw_q8a *x, int64_t ldx, int64_t n) {
    const size_t ahead = PF == PF_INTEL && NR == 1 ? ROW_PREFETCH_INTEL : PREFETCH;
    const int G = type_groups(T);
    const size_t bb = qw_block_bytes(T);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i kv = T == QW_TYPE_IQ4_NL || T == QW_TYPE_IQ4_XS
                           ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qw_kvalues_iq4nl))
                           : _mm256_setzero_si256();
    __m256 acc[4][2];
    float accB[4][2];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) {
            acc[r][t] = _mm256_setzero_ps();
            accB[r][t] = 0;
        }
    for (int64_t ib = 0; ib < n / (32 * G); ib++) {
        const uint8_t *blk[4];
        head_t hd[4];
        float S8[2][8]; /* d_act * s of the block's groups (K-quants: their mins go in as one vector) */
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            blk[r] = (const uint8_t *)w + (size_t)r * ws + (size_t)ib * bb;
            for (size_t o = 0; o < bb; o += 64) {
                if (PF == PF_AMD && NR == 1)
                    _mm_prefetch((const char *)blk[r] + ROW_PREFETCH_AMD + o, _MM_HINT_NTA);
                else
                    _mm_prefetch((const char *)blk[r] + ahead + o, _MM_HINT_T0);
            }
            head(T, blk[r], &hd[r]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            __m256i av[2], off[2];
            __m256 D[2];
            float S[2];
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                const qw_q8a *xa = x + t * ldx + ib * G + j;
                av[t] = _mm256_loadu_si256((const __m256i *)xa->q);
                D[t] = _mm256_set1_ps(xa->d);
                S[t] = S8[t][j] = type_has_min(T) ? xa->d * (float)xa->s : 0.0f;
                if (type_offset(T)) /* o * (sum of each lane's 4 activations) */
                    off[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8((char)type_offset(T)), av[t]), ones);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m256i wv, wu;
                __m256 A;
                float B = 0;
                unpack(T, blk[r], j, &hd[r], kv, &wv, &A, &B);
                wu = type_signed(T) ? _mm256_abs_epi8(wv) : wv;
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    __m256i a = type_signed(T) ? _mm256_sign_epi8(av[t], wv) : av[t];
                    __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, a), ones);
                    if (type_offset(T)) s = _mm256_sub_epi32(s, off[t]);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(A, D[t]), acc[r][t]);
                    if (type_has_min(T) && G == 1) accB[r][t] += B * S[t];
                }
            }
        }
        if (type_has_min(T) && G == 8) /* lane j += B_j * S_j */
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++)
                    acc[r][t] = _mm256_fmadd_ps(_mm256_loadu_ps(hd[r].B), _mm256_loadu_ps(S8[t]), acc[r][t]);
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) y[t * ldy + r] = hsum(acc[r][t]) + accB[r][t];
}

/*
 * Several tokens (RP_MIN_TOKENS or more in a call): avx512_q.c's repacked path in 256 bits. 8 rows are
 * unpacked once per call so that lane r of a vector is row r: per group of 32 (sub-group of 16 for Q6_K)
 * its bytes as [chunk of 4][row][4 bytes] (one 32-byte vector per chunk; an 8 x 8 transpose of dwords),
 * the rows' scales A as one vector and, for the types with mins, their B. Per chunk and token: vpmaddubsw
 * of the chunk against the token's 4 bytes broadcast gives each row's two pair sums in int16; rp_k16 chunks
 * of them are added in int16 before one vpmaddwd with ones takes them to int32 (no int16 sum overflows:
 * with unsigned codes up to U and |a| <= 127 a pair is at most 2 * 127 * U, and rp_k16 * 2 * 127 * U <=
 * 32767: Q4 and Q5 types 4 chunks, Q6_K 2, the signed types 1). The offset and sign handling is the
 * one-row kernel's (the lane's sum starts at -o * the sub-group's activation sum; Q8_0 and the IQ4 types
 * move the weight's sign onto the activation). Then acc = fma(float(isum), A * d_act, acc) and, with mins,
 * acc = fma(B, d_act * s_act, acc), one FMA per group for 8 outputs. A row's result depends only on the
 * row and the token (rows past nr are zeros, never stored); it differs from the one-row kernel's order of
 * f32 additions, within the same bound.
 */
#define RP_ROWS 8
#define RP_MIN_TOKENS 16

QW_INLINE int rp_sub(qw_type T) { return T == QW_TYPE_Q6_K ? 2 : 1; } /* sub-groups per group */
/* chunks of 4 whose int16 pair sums are added before vpmaddwd: as many as cannot overflow (above), at most 4
 * (the Q4 types could take 8, but a chain of 8 dependent additions ran 12 % slower on Zen 4 than two of 4) */
QW_INLINE int rp_k16(qw_type T) {
    switch (T) {
    case QW_TYPE_Q4_0: case QW_TYPE_Q4_1: case QW_TYPE_Q4_K:
    case QW_TYPE_Q5_0: case QW_TYPE_Q5_1: case QW_TYPE_Q5_K: return 4;
    case QW_TYPE_Q6_K: return 2;
    default: return 1;
    }
}

/* r[i] dword c -> r[c] dword i */
QW_INLINE void transpose8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* unpack rows 0 .. nr-1 (nr <= 8; the rest zeros) into wq [ng][8 chunks][8 rows][4] bytes, A [ng * sub][8],
 * B [ng][8] (types with mins) */
QW_INLINE void rp_pack(qw_type T, const void *w, size_t ws, int nr, int64_t n, uint8_t *wq, float *A, float *B) {
    const int G = type_groups(T), sub = rp_sub(T);
    const size_t bb = qw_block_bytes(T);
    const __m256i kv = T == QW_TYPE_IQ4_NL || T == QW_TYPE_IQ4_XS
                           ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qw_kvalues_iq4nl))
                           : _mm256_setzero_si256();
    for (int64_t ib = 0; ib < n / (32 * G); ib++) {
        head_t hd[RP_ROWS];
        for (int r = 0; r < nr; r++) head(T, (const uint8_t *)w + (size_t)r * ws + (size_t)ib * bb, &hd[r]);
        for (int j = 0; j < G; j++) {
            int64_t g = ib * G + j;
            __m256i v[RP_ROWS];
            float a[RP_ROWS][8];
            for (int r = 0; r < RP_ROWS; r++) {
                __m256 Av = _mm256_setzero_ps();
                float Bv = 0;
                v[r] = _mm256_setzero_si256();
                if (r < nr) unpack(T, (const uint8_t *)w + (size_t)r * ws + (size_t)ib * bb, j, &hd[r], kv, &v[r], &Av, &Bv);
                _mm256_storeu_ps(a[r], Av);
                for (int si = 0; si < sub; si++) A[(g * sub + si) * RP_ROWS + r] = a[r][si * 4];
                if (type_has_min(T)) B[g * RP_ROWS + r] = r >= nr ? 0.0f : G == 1 ? Bv : hd[r].B[j];
            }
            transpose8_epi32(v);
            for (int c = 0; c < 8; c++) _mm256_store_si256((__m256i *)(wq + ((size_t)g * 8 + c) * 32), v[c]);
        }
    }
}

/* NT tokens (compile-time) against a packed block: y[t * ldy + r] for r < nr. ofs: each token's
 * -offset * (sub-group activation sum), dsm: d * s of each group (mins), ldo: their stride per token */
QW_INLINE void rp_tokens(qw_type T, int NT, float *y, int64_t ldy, int nr, const uint8_t *wq, const float *A,
                         const float *B, const qw_q8a *x, int64_t ldx, const int32_t *ofs, const float *dsm,
                         int64_t ldo, int64_t ng) {
    const int sub = rp_sub(T), cps = 8 / sub, k16 = rp_k16(T) < cps ? rp_k16(T) : cps;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        for (int si = 0; si < sub; si++) {
            __m256i is[4];
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                is[t] = type_offset(T) ? _mm256_set1_epi32(ofs[t * ldo + g * sub + si]) : _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k0 = 0; k0 < cps; k0 += k16) {
                __m256i p[4];
#pragma GCC unroll 8
                for (int k = k0; k < k0 + k16; k++) {
                    __m256i wv = _mm256_load_si256((const __m256i *)(wq + ((size_t)g * 8 + si * cps + k) * 32));
                    __m256i wu = type_signed(T) ? _mm256_abs_epi8(wv) : wv;
#pragma GCC unroll 4
                    for (int t = 0; t < NT; t++) {
                        int32_t a4;
                        memcpy(&a4, x[t * ldx + g].q + 4 * (si * cps + k), 4);
                        __m256i av = _mm256_set1_epi32(a4);
                        if (type_signed(T)) av = _mm256_sign_epi8(av, wv);
                        __m256i pk = _mm256_maddubs_epi16(wu, av);
                        p[t] = k == k0 ? pk : _mm256_add_epi16(p[t], pk);
                    }
                }
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) is[t] = _mm256_add_epi32(is[t], _mm256_madd_epi16(p[t], ones));
            }
            __m256 Av = _mm256_load_ps(A + (g * sub + si) * RP_ROWS);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(Av, _mm256_set1_ps(x[t * ldx + g].d)),
                                         acc[t]);
        }
        if (type_has_min(T)) {
            __m256 Bv = _mm256_load_ps(B + g * RP_ROWS);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(Bv, _mm256_set1_ps(dsm[t * ldo + g]), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        float o[8];
        _mm256_storeu_ps(o, acc[t]);
        memcpy(y + t * ldy, o, (size_t)nr * sizeof(float));
    }
}

/* nr rows (any) x nt tokens (any) through packed blocks of 8 rows */
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
        for (; t + 4 <= nt; t += 4)
            rp_tokens(T, 4, y + t * ldy + r, ldy, nb, b.wq, b.A, b.B, x + t * ldx, ldx, b.ofs + t * ldo,
                      b.dsm + t * ldo, ldo, ng);
        for (; t < nt; t++)
            rp_tokens(T, 1, y + t * ldy + r, ldy, nb, b.wq, b.A, b.B, x + t * ldx, ldx, b.ofs + t * ldo,
                      b.dsm + t * ldo, ldo, ng);
    }
}

/*
 * Q4_K, Q5_K and Q6_K with fewer than RP_MIN_TOKENS tokens take a whole 256-element super-block per step
 * (avx512_q.c's ksb_tile in 256 bits): the 8 groups' vpmaddubsw pair sums are folded to one int32 lane per
 * group (Q6_K: per 16-element sub-block, in two vectors) by horizontal additions, as far in int16 as cannot
 * overflow (pairs at most 2 * 127 * U for codes up to U: Q4_K and Q5_K sums of 8 elements, at most 31496;
 * Q6_K of 4, at most 32004), then in int32; one FMA then applies the lanes' scales (S = d * sub-block scale,
 * times the activation's d per lane), where the group-at-a-time kernel needed one per group. The mins (Q4_K,
 * Q5_K) are one more FMA per super-block, Q6_K's offset 32 one subtraction per vector. Q4_0 and Q5_0 take
 * the step over 8 blocks in rows of whole 256-element steps (one Zen 4 core from DRAM: Q4_0 12.7 -> 16-17
 * GB/s, Q5_0 12 -> 13-14). An output depends only on its row and token.
 */
QW_INLINE int is_ksb(qw_type t) { return t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K || t == QW_TYPE_Q6_K; }
/* Q4_0 and Q5_0 take the same step over 8 blocks (lane j = block j) in rows of whole 256-element steps */
QW_INLINE int is_ksb8(qw_type t) { return t == QW_TYPE_Q4_0 || t == QW_TYPE_Q5_0; }
QW_INLINE int ksb_rows(qw_type t, int64_t n) { return is_ksb(t) || (is_ksb8(t) && n % QW_QK_K == 0); }

/* The activation side of one super-block for one token, in the fold's lane order. Q4_K, Q5_K, Q4_0, Q5_0:
 * D lane j = d of group j, dsm lane j = d * s, off[0] lane j = the type's offset * s. Q6_K: vector v lane l covers sub-block 8 v + 2 (l % 4) + l / 4 (group
 * 4 v + l % 4): D its group's d, off 32 * its 16 activations' sum. */
typedef struct {
    __m256 D[2], dsm;
    __m256i off[2];
} act_sb;

QW_INLINE void act_prep_sb(qw_type T, const qw_q8a *x, int64_t sb, act_sb *ap) {
    const qw_q8a *xa = x + sb * 8;
    if (T != QW_TYPE_Q6_K) {
        float d[8], ds[8];
        int32_t off[8];
        for (int j = 0; j < 8; j++) {
            d[j] = xa[j].d;
            ds[j] = xa[j].d * (float)xa[j].s;
            off[j] = type_offset(T) * xa[j].s;
        }
        ap->D[0] = _mm256_loadu_ps(d);
        ap->dsm = _mm256_loadu_ps(ds);
        ap->off[0] = _mm256_loadu_si256((const __m256i *)off);
        return;
    }
    for (int v = 0; v < 2; v++) {
        float d[8];
        int32_t off[8];
        for (int l = 0; l < 8; l++) {
            const qw_q8a *g = &xa[4 * v + l % 4];
            int32_t s = 0;
            for (int i = 0; i < 16; i++) s += g->q[16 * (l / 4) + i];
            d[l] = g->d;
            off[l] = 32 * s;
        }
        ap->D[v] = _mm256_loadu_ps(d);
        ap->off[v] = _mm256_loadu_si256((const __m256i *)off);
    }
}

/* Q4_K, Q5_K: the groups' pair sums p[0..7] -> lane j = group j's sum */
QW_INLINE __m256i ksb_fold_k4(const __m256i p[8]) {
    const __m256i ones = _mm256_set1_epi16(1);
    /* quads, then octets in int16; then each 128-bit half's 16-element sums in int32: k0 = groups 0-3, k1 = 4-7 */
    __m256i k0 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    __m256i k1 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7]));
    k0 = _mm256_madd_epi16(k0, ones);
    k1 = _mm256_madd_epi16(k1, ones);
    return _mm256_add_epi32(_mm256_permute2x128_si256(k0, k1, 0x20), _mm256_permute2x128_si256(k0, k1, 0x31));
}

/* Q6_K: pair sums p[4 v .. 4 v + 3] -> 16-element sums in act_sb's lane order for vector v */
QW_INLINE __m256i ksb_fold_q6(const __m256i *p) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i e01 = _mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones);
    __m256i e23 = _mm256_madd_epi16(_mm256_hadd_epi16(p[2], p[3]), ones);
    return _mm256_hadd_epi32(e01, e23);
}

/* One row against NT (1 or 2, compile-time) tokens: token t's act_sb of super-block sb at pre[t * ldp + sb],
 * its activations at x + t * ldx; y[t * ldy]. */
QW_INLINE void ksb_row(qw_type T, int PF, int NT, float *y, int64_t ldy, const uint8_t *w, const qw_q8a *x, int64_t ldx,
                       const act_sb *pre, int64_t ldp, int64_t n) {
    const size_t bb = is_ksb8(T) ? 8 * qw_block_bytes(T) : qw_block_bytes(T); /* the bytes of one step */
    __m256 acc[2], accm[2];
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < n / QW_QK_K; sb++) {
        const uint8_t *blk = w + (size_t)sb * bb;
        for (size_t o = 0; o < bb; o += 64) {
            if (PF == PF_AMD)
                _mm_prefetch((const char *)blk + ROW_PREFETCH_AMD + o, _MM_HINT_NTA);
            else
                _mm_prefetch((const char *)blk + ROW_PREFETCH_INTEL + o, _MM_HINT_T0);
        }
        head_t hd;
        if (is_ksb8(T))
            hd.A[0] = 0.0f; /* unpack's A of a block's group, unused here: the 8 d's come below */
        else
            head(T, blk, &hd);
        __m256i wv[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256 Aj;
            float Bj;
            if (is_ksb8(T)) /* block j */
                unpack(T, blk + j * qw_block_bytes(T), 0, &hd, _mm256_setzero_si256(), &wv[j], &Aj, &Bj);
            else
                unpack(T, blk, j, &hd, _mm256_setzero_si256(), &wv[j], &Aj, &Bj);
        }
        __m256 S[2], Bv = _mm256_setzero_ps();
        if (is_ksb8(T)) { /* the 8 blocks' d */
#define D16(i) (short)qw_rd16(blk + (i) * qw_block_bytes(T))
            S[0] = _mm256_cvtph_ps(_mm_setr_epi16(D16(0), D16(1), D16(2), D16(3), D16(4), D16(5), D16(6), D16(7)));
#undef D16
        } else if (T == QW_TYPE_Q6_K) { /* sub-blocks 2 (l % 4) + l / 4 (+ 8) to lane l */
            const __m256i ord = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
            S[0] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(hd.A), ord);
            S[1] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(hd.A + 8), ord);
        } else {
            S[0] = _mm256_loadu_ps(hd.A);
            Bv = _mm256_loadu_ps(hd.B);
        }
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const qw_q8a *xa = x + t * ldx + sb * 8;
            const act_sb *ap = &pre[t * ldp + sb];
            __m256i p[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) p[j] = _mm256_maddubs_epi16(wv[j], _mm256_loadu_si256((const __m256i *)xa[j].q));
            if (T == QW_TYPE_Q6_K) {
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++) {
                    __m256i is = _mm256_sub_epi32(ksb_fold_q6(p + 4 * v), ap->off[v]);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(S[v], ap->D[v]), acc[t]);
                }
            } else {
                __m256i is = ksb_fold_k4(p);
                if (type_offset(T)) is = _mm256_sub_epi32(is, ap->off[0]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(S[0], ap->D[0]), acc[t]);
                if (type_has_min(T)) accm[t] = _mm256_fmadd_ps(Bv, ap->dsm, accm[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) y[t * ldy] = hsum(_mm256_add_ps(acc[t], accm[t]));
}

/* nr rows x nt (< RP_MIN_TOKENS) tokens of a K-quant: the tokens' act_sbs once, then a row at a time against
 * pairs of tokens */
QW_INLINE void ksb_matmul(qw_type T, int PF, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                          int nr, int nt, int64_t n) {
    int64_t nsb = n / QW_QK_K;
    act_sb *pre = qw_qtile_scratch(0, (size_t)(nt * nsb) * sizeof(act_sb));
    if (!pre) return; /* out of memory: counted by qw_qtile_scratch (cpu.c); the call is skipped */
    for (int t = 0; t < nt; t++)
        for (int64_t sb = 0; sb < nsb; sb++) act_prep_sb(T, x + t * ldx, sb, &pre[t * nsb + sb]);
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ws;
        int t = 0;
        for (; t + 2 <= nt; t += 2) ksb_row(T, PF, 2, y + t * ldy + r, ldy, wr, x + t * ldx, ldx, pre + t * nsb, nsb, n);
        if (t < nt) ksb_row(T, PF, 1, y + t * ldy + r, ldy, wr, x + t * ldx, ldx, pre + t * nsb, nsb, n);
    }
}

/* Any nr, nt <= 4 (cpu.h) from the shapes 4x2, 4x1, 1x2, 1x1 (each output computed the same way in all);
 * one token takes the rows one at a time (avx512_q.c's qtile_any says why). */
QW_INLINE void qtile_any(qw_type T, int PF, float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                         int nr, int nt, int64_t n) {
    if (nt >= RP_MIN_TOKENS) {
        rp_matmul(T, y, ldy, w, ws, x, ldx, nr, nt, n);
        return;
    }
    if (ksb_rows(T, n)) {
        ksb_matmul(T, PF, y, ldy, w, ws, x, ldx, nr, nt, n);
        return;
    }
    int r = 0;
    if (nt > 1)
        for (; r + 4 <= nr; r += 4) {
            const char *wr = (const char *)w + (size_t)r * ws;
            int t = 0;
            for (; t + 2 <= nt; t += 2) qtile_nxm(T, PF, 4, 2, y + t * ldy + r, ldy, wr, ws, x + t * ldx, ldx, n);
            if (t < nt) qtile_nxm(T, PF, 4, 1, y + t * ldy + r, ldy, wr, ws, x + t * ldx, ldx, n);
        }
    for (; r < nr; r++) {
        const char *wr = (const char *)w + (size_t)r * ws;
        int t = 0;
        for (; t + 2 <= nt; t += 2) qtile_nxm(T, PF, 1, 2, y + t * ldy + r, ldy, wr, ws, x + t * ldx, ldx, n);
        if (t < nt) qtile_nxm(T, PF, 1, 1, y + t * ldy + r, ldy, wr, ws, x + t * ldx, ldx, n);
    }
}

#define QTILE(v, T, name)                                                                                          \
    QW_QTILE_PROTO(v, T, name) { qtile_any(T, PF_AMD, y, ldy, w, ws, x, ldx, nr, nt, n); }
QW_QTILE_LIST(QTILE, avx2)
#undef QTILE
#define QTILE(v, T, name)                                                                                          \
    QW_QTILE_PROTO(v, T, name) { qtile_any(T, PF_INTEL, y, ldy, w, ws, x, ldx, nr, nt, n); }
QW_QTILE_LIST(QTILE, avx2i)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* __x86_64__ */
