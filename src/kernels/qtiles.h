/*
 * qtiles.h - the integer dot tiles (cpu.h's qw_qtile_fn) of each SIMD variant, one per weight type,
 * defined in avx512_q.c / avx2_q.c and listed in the variants' kernel tables.
 */
#ifndef QW_QTILES_H
#define QW_QTILES_H

#include "kernels/cpu.h"

#if defined(__x86_64__)
#define QW_QTILE_DECL(v, name)                                                                                     \
    void qw_##v##_qtile_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,      \
                               int nr, int nt, int64_t n);
QW_QTILE_DECL(avx512, q8_0)
QW_QTILE_DECL(avx512, q4_0)
QW_QTILE_DECL(avx512, q4_1)
QW_QTILE_DECL(avx512, q5_0)
QW_QTILE_DECL(avx512, q5_1)
QW_QTILE_DECL(avx512, q4_K)
QW_QTILE_DECL(avx512, q5_K)
QW_QTILE_DECL(avx512, q6_K)
QW_QTILE_DECL(avx512, iq4_nl)
QW_QTILE_DECL(avx512, iq4_xs)
QW_QTILE_DECL(avx2, q8_0)
QW_QTILE_DECL(avx2, q4_0)
QW_QTILE_DECL(avx2, q4_1)
QW_QTILE_DECL(avx2, q5_0)
QW_QTILE_DECL(avx2, q5_1)
QW_QTILE_DECL(avx2, q4_K)
QW_QTILE_DECL(avx2, q5_K)
QW_QTILE_DECL(avx2, q6_K)
QW_QTILE_DECL(avx2, iq4_nl)
QW_QTILE_DECL(avx2, iq4_xs)
#endif

#if defined(__aarch64__)
/* neon_q.c: each tile with the smull dot (qw_neon_*) and with sdot (qw_neondot_*, Armv8.2 dot product) */
#define QW_QTILE_DECL_NEON(name)                                                                                   \
    void qw_neon_qtile_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,       \
                              int nr, int nt, int64_t n);                                                          \
    void qw_neondot_qtile_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,    \
                                 int nr, int nt, int64_t n);
QW_QTILE_DECL_NEON(q8_0)
QW_QTILE_DECL_NEON(q4_0)
QW_QTILE_DECL_NEON(q4_1)
QW_QTILE_DECL_NEON(q5_0)
QW_QTILE_DECL_NEON(q5_1)
QW_QTILE_DECL_NEON(q4_K)
QW_QTILE_DECL_NEON(q5_K)
QW_QTILE_DECL_NEON(q6_K)
QW_QTILE_DECL_NEON(iq4_nl)
QW_QTILE_DECL_NEON(iq4_xs)
#endif

#endif
