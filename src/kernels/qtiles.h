/*
 * qtiles.h - the integer dot tiles (cpu.h's qw_qtile_fn) of each SIMD variant, one per weight type,
 * defined in avx512_q.c / avx2_q.c / neon_q.c and listed in the variants' kernel tables.
 */
#ifndef QW_QTILES_H
#define QW_QTILES_H

#include "kernels/cpu.h"

/* The weight types with integer tiles, as X(v, type, suffix) for variant v: one list for the declarations,
 * the definitions in each *_q.c and the .qtile initialiser of each kernel table. */
#define QW_QTILE_LIST(X, v)                                                                                        \
    X(v, QW_TYPE_Q8_0, q8_0) X(v, QW_TYPE_Q4_0, q4_0) X(v, QW_TYPE_Q4_1, q4_1) X(v, QW_TYPE_Q5_0, q5_0)            \
    X(v, QW_TYPE_Q5_1, q5_1) X(v, QW_TYPE_Q4_K, q4_K) X(v, QW_TYPE_Q5_K, q5_K) X(v, QW_TYPE_Q6_K, q6_K)            \
    X(v, QW_TYPE_IQ4_NL, iq4_nl) X(v, QW_TYPE_IQ4_XS, iq4_xs)

/* qw_<v>_qtile_<suffix>: the prototype, and its entry in a table's .qtile */
#define QW_QTILE_PROTO(v, T, name)                                                                                 \
    void qw_##v##_qtile_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,      \
                               int nr, int nt, int64_t n)
#define QW_QTILE_DECL(v, T, name) QW_QTILE_PROTO(v, T, name);
#define QW_QTILE_INIT(v, T, name) [T] = qw_##v##_qtile_##name,

/* The calling thread's kernel scratch buffer `slot` (< QW_QTILE_SCRATCH), at least `bytes` long, 64-byte
 * aligned: grown, never shrunk (decode allocates nothing once the widest matmul has run), freed when the
 * thread ends (cpu.c). Slot 0: per-call activation layouts, 1: a repacked row block, 2: the tokens' group
 * terms, 3: a matmul's activations rounded to 8 bits (cpu.c, the calling thread's). NULL when out of memory
 * (counted: qw_cpu_scratch_failures): the caller skips its work. */
#define QW_QTILE_SCRATCH 4
void *qw_qtile_scratch(int slot, size_t bytes);

/* The scratch of a call of the repacked tiles (avx512_q.c: rows = 16, avx2_q.c: 8) on the calling thread: the
 * nt tokens' group terms filled in (qw_q8a_group_terms, stride ldo = ng * sub; dsm only for types with mins,
 * has_min), and room for one packed block of rows (wq: ng * 8 chunks of 4 bytes per row; A: ng * sub scales
 * per row; B: ng mins per row), 64-byte aligned where rows * 4 is a multiple of 32. */
typedef struct {
    int32_t *ofs;
    float *dsm, *A, *B;
    uint8_t *wq;
    int64_t ldo;
} qw_rp_scratch;
qw_rp_scratch qw_rp_scratch_get(const qw_q8a *x, int64_t ldx, int nt, int64_t ng, int sub, int o, int has_min,
                                int rows);

#if defined(__x86_64__)
/* avx512_q.c: qw_q8a_quantize's bytes, 32 floats per step */
void qw_avx512_q8a_quantize(const float *x, qw_q8a *y, int64_t n);
QW_QTILE_LIST(QW_QTILE_DECL, avx512)
/* avx512_q.c: the same tiles with decode's prefetch tuned for Intel (ROW_PREFETCH) */
QW_QTILE_LIST(QW_QTILE_DECL, avx512i)
QW_QTILE_LIST(QW_QTILE_DECL, avx2)
/* avx2_q.c: the same tiles with the K-quant rows' prefetch tuned for Intel */
QW_QTILE_LIST(QW_QTILE_DECL, avx2i)
/* avx512_q.c: the same tiles with AMX tile products from 16 tokens on (the amx table) */
QW_QTILE_LIST(QW_QTILE_DECL, amx)
#endif

#if defined(__aarch64__)
/* neon_q.c: each tile with the smull dot (qw_neon_*) and with sdot (qw_neondot_*, Armv8.2 dot product) */
QW_QTILE_LIST(QW_QTILE_DECL, neon)
QW_QTILE_LIST(QW_QTILE_DECL, neondot)
#endif

#endif
