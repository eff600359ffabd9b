/*
 * q8a.h - 8-bit activations for the integer dot products of block-quantized weights.
 *
 * A matmul with quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) rounds
 * each activation row once, per block of 32, to x ~ d * q with q = round(x / d) in [-127, 127] and
 * d = max|x| / 127, and every weight row then meets it in integer arithmetic, as llama.cpp does (its
 * vec_dot_type). One activation format serves every weight type: a K-quant sub-block is 32 elements (16 for
 * Q6_K, two of which make a block here), so each 32 weights meet exactly one activation scale.
 *
 * Every weight type decomposes, per group g of 32 elements, into w_i = A_g * iw_i + B_g with integer iw_i
 * (|iw_i| < 2^13) and floats A_g (from the block's f16 scale) and B_g (the block's min; 0 for symmetric
 * types). Then
 *     dot(w, x) ~ sum_g d_g * (A_g * isum_g + B_g * s_g),  isum_g = sum_i iw_i q_i (exact, int32),
 *                                                          s_g    = sum_i q_i (exact, stored in the block)
 * with this per-type split:
 *     Q8_0   iw = q              A = d          Q4_K  iw = sc_j q         A = d  B = -dmin m_j
 *     Q4_0   iw = q - 8          A = d          Q5_K  iw = sc_j q         A = d  B = -dmin m_j
 *     Q5_0   iw = q - 16         A = d          Q6_K  iw = sc_s (q - 32)  A = d  (two scales per group)
 *     Q4_1   iw = q              A = d  B = m   IQ4_NL iw = kv[q]          A = d
 *     Q5_1   iw = q              A = d  B = m   IQ4_XS iw = (ls_j - 32) kv[q]  A = d
 *
 * Error against the exact dot with f32 activations: rounding x costs at most d_g / 2 per element, so
 *     |dot_q8a - dot_f32| <= sum_g (d_g / 2) * sum_{i in g} |w_i|  (+ f32 rounding of the sum),
 * about 0.4% of sum|w_i x_i| for typical rows (tests/t_qkernels.c checks the bound). qw_q8a_dot_ref is the
 * scalar oracle of the integer path; SIMD kernels compute the same exact integers and differ only in how
 * the per-group products are added: |simd - ref| <= (n/32 + 16) * 2^-24 * qw_q8a_dot_abs.
 */
#ifndef QW_Q8A_H
#define QW_Q8A_H

#include <stdint.h>

#include "tensor/tensor.h"

#define QW_Q8A_BLOCK 32

typedef struct { /* 40 bytes, 4-byte aligned: x[i] ~ d * q[i] */
    float d;
    int32_t s; /* sum of q */
    int8_t q[QW_Q8A_BLOCK];
} qw_q8a;

/* n / 32 blocks of x[0..n) (n a multiple of 32). Round to nearest even; an all-zero block gets d = 0, a
 * block with a NaN gets d = NaN (and q = 0), an infinite one d = inf (and q = 0): the dot is then NaN. */
void qw_q8a_quantize(const float *x, qw_q8a *y, int64_t n);

/* The per-group terms of nt tokens (token t at x + t * ldx, ng blocks) that the repacked integer tiles add
 * (avx512_q.c, avx2_q.c), with stride ldo = ng * sub per token: ofs[t * ldo + g * sub + si] = -o * (the
 * activation sum of sub-group si of block g: sub 1 is the block, 2 its halves), and dsm[t * ldo + g] = d * s
 * (the factor of a weight group's min). Either array may be NULL. */
void qw_q8a_group_terms(const qw_q8a *x, int64_t ldx, int nt, int64_t ng, int sub, int o, int32_t *ofs, float *dsm);

/* 1 if a weight type has the integer dot (every block-quantized weight type but Q8_K). */
int qw_q8a_supported(qw_type t);

/* The reference integer dot of one weight row of n elements (type t) with n / 32 activation blocks:
 * sum_g d_g * (A_g * isum_g + B_g * s_g), groups in order, each term and the running sum in f32. */
float qw_q8a_dot_ref(qw_type t, const void *row, const qw_q8a *x, int64_t n);
/* sum_g |d_g| * (|A_g| * sum_i |iw_i q_i| + |B_g * s_g|): the scale of the rounding of the sum, however a
 * kernel groups the integer products (for error bounds). */
double qw_q8a_dot_abs(qw_type t, const void *row, const qw_q8a *x, int64_t n);

/* Group g (32 elements) of a weight row as integers and its A_g, B_g; the split of the table above. */
void qw_q8a_unpack(qw_type t, const void *row, int64_t g, int16_t iw[QW_Q8A_BLOCK], float *A, float *B);

#endif
