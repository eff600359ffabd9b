/*
 * delta_chunk.c - the gated delta rule (ops.h delta_rule) over many tokens in the chunked form of
 * flash-linear-attention and transformers' torch_chunk_gated_delta_rule (chunks of 64 tokens), so that
 * prefill runs as small matrix products instead of a read-modify-write of the state per token.
 *
 * For one value head and a chunk of n <= 64 tokens entering with state S [dk][dv]: e_i = exp(g_i),
 * gam_i = e_0 ... e_i (decay from the chunk start through token i) and D_ij = e_{j+1} ... e_i for j <= i
 * (D_ii = 1). The recurrence (S = e S; u = beta (v - S^T k); S += k u^T; o = S^T q) sees before token i's
 * write the state gam_i S + sum_{j<i} D_ij k_j u_j^T, so
 *   u_i   = beta_i (v_i - gam_i S^T k_i - sum_{j<i} D_ij (k_i . k_j) u_j)    a unit lower-triangular system
 *   o_i   = gam_i S^T q_i + sum_{j<=i} D_ij (q_i . k_j) u_j
 *   S_new = gam_{n-1} S + sum_j D_{n-1,j} k_j u_j^T
 * computed as: W = K S and P = Q S ([n][dk] x [dk][dv]); the lower triangles of K K^T and Q K^T, times D
 * (and beta_i); U by forward substitution on R_i = beta_i (v_i - gam_i W_i), four rows at a time (a
 * product with the rows already solved, then a 4 x 4 fix-up); O = gam P + (Q K^T o D) U; the state
 * update as one more product. HF solves the same system by inverting (I + A) first; substituting into
 * the right-hand side directly is the same math with half the work.
 *
 * Numerics. Everything is f32. The decays are products of the per-token exp(g), formed only for j <= i:
 * every factor is <= 1 for g <= 0, so nothing overflows however negative g is (HF forms exp of
 * differences of cumulative sums, which loses digits when the sums are large; products lose at most
 * 64 roundings, u = 2^-24 each) and a long run of g = -30 just underflows to 0, as the recurrence's
 * repeated scaling does. The substitution is the recurrence's own correction restated (row i of
 * (I + A)^-1 R is beta_i (v_i - S'^T k_i) with S' the state before token i), so its errors are carried by
 * the same contractions exp(g) (I - beta k k^T) (beta in [0, 1], |k| = 1) and do not grow. Each chunk adds
 * the rounding of dot products of at most dk terms (K S, Q S, the Gram matrices) and of at most 64
 * (substitution, output, state update); chunks add up. On x86 the loops run with subnormals flushed to
 * zero (FTZ/DAZ, restored on return), an absolute error below 2^-126 per operation, so that a run of very
 * negative g does not send the products through slow microcode.
 * Tolerance (tests/t_kernels.c, DR_CHUNK_TOL): |chunked - reference| <= 1e-5 * ceil(n_tok/64) * B, B the
 * largest entry of the states, values and outputs, on random and adversarial inputs (g near 0 and about
 * -30, beta 0 and 1, partial chunks, hv > hk, dk != dv, a carried state). Per chunk an entry goes through
 * f32 sums of at most dk + 2*64 = 256 terms (dk <= 128) of unit-norm rows, whose roundings of random sign
 * grow like sqrt(256) u = 1e-6 B; the cases show at most 5e-7 B per chunk, about what the token-by-token
 * path shows, so f32 suffices, and 1e-5 leaves a margin of 20 without being the loose worst case
 * (256 u |k|_1 B). The result is not bit-identical to the token-by-token path, but for a given input it
 * does not depend on the thread count (each head is computed alone, its chunks in order).
 *
 * The loops are plain C with compile-time panel widths so the compiler vectorises them; they are built
 * three times, for AVX-512, for AVX2 + FMA and for the generic target, and qw_delta_chunk_heads runs the
 * build that matches the CPU backend's kernel variant. One kernel shape does all the products: 4 rows of
 * A times a panel of NR columns of B, the accumulators in registers.
 */
#include "kernels/delta_chunk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "core/common.h"

#define DC_C QW_DELTA_CHUNK /* chunk rows */
#define DC_MR 4             /* rows of one product tile */
#define DC_NR_MAX 32        /* widest column panel: padded column counts are multiples of it */
#define DC_INLINE static inline __attribute__((always_inline))

/* a * b + c, fused where the build has FMA (the generic x86-64 build would call libm for fmaf) */
DC_INLINE float dc_fma(int fma, float a, float b, float c) { return fma ? fmaf(a, b, c) : a * b + c; }

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* How a product tile is stored: Y = acc, Y -= acc, or Y = s_i Y + acc with s_i = rs[i * rs_stride]. */
enum { DC_SET, DC_SUB, DC_SCALE_ADD };

/* Y[i][l] (op) sum_{r<n} A[i*lda + r] B[r*ldb + l], i < 4, l < NR: every product of the chunked form. */
DC_INLINE void dc_tile(int NR, int fma, float *restrict Y, int64_t ldy, const float *restrict A, int64_t lda,
                       const float *restrict B, int64_t ldb, int n, int op, const float *rs, int rs_stride) {
    float acc[DC_MR][DC_NR_MAX];
#pragma GCC unroll 4
    for (int i = 0; i < DC_MR; i++)
        for (int l = 0; l < NR; l++) acc[i][l] = 0;
    for (int r = 0; r < n; r++) {
        const float *b = B + (int64_t)r * ldb;
#pragma GCC unroll 4
        for (int i = 0; i < DC_MR; i++) {
            float a = A[i * lda + r];
            for (int l = 0; l < NR; l++) acc[i][l] = dc_fma(fma, a, b[l], acc[i][l]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < DC_MR; i++) {
        float *y = Y + i * ldy;
        if (op == DC_SET) {
            for (int l = 0; l < NR; l++) y[l] = acc[i][l];
        } else if (op == DC_SUB) {
            for (int l = 0; l < NR; l++) y[l] -= acc[i][l];
        } else {
            float s = rs[i * rs_stride];
            for (int l = 0; l < NR; l++) y[l] = dc_fma(fma, s, y[l], acc[i][l]);
        }
    }
}

/* Y (m x ncols) op= A (m x n) B (n x ncols); m a multiple of 4, ncols of NR. */
DC_INLINE void dc_gemm(int NR, int fma, float *Y, int64_t ldy, const float *A, int64_t lda, const float *B,
                       int64_t ldb, int m, int ncols, int n, int op, const float *rs, int rs_stride) {
    for (int i = 0; i < m; i += DC_MR)
        for (int c = 0; c < ncols; c += NR)
            dc_tile(NR, fma, Y + i * ldy + c, ldy, A + i * lda, lda, B + c, ldb, n, op, rs ? rs + i * rs_stride : NULL,
                    rs_stride);
}

/* y[l] -= a x[l], l < n (n a multiple of NR) */
DC_INLINE void dc_axmy(int NR, int fma, float *restrict y, float a, const float *restrict x, int n) {
    for (int c = 0; c < n; c += NR)
        for (int l = 0; l < NR; l++) y[c + l] = dc_fma(fma, -a, x[c + l], y[c + l]);
}

/* y[l] = a[l] * b[l], l < n (n a multiple of NR) */
DC_INLINE void dc_mul(int NR, float *restrict y, const float *restrict a, const float *restrict b, int n) {
    for (int c = 0; c < n; c += NR)
        for (int l = 0; l < NR; l++) y[c + l] = a[c + l] * b[c + l];
}

/* gk[l] *= beta d[l], gq[l] *= d[l], l < n (n a multiple of NR): one row of each Gram matrix times D */
DC_INLINE void dc_decay_gram(int NR, float *restrict gk, float *restrict gq, const float *restrict d, float beta,
                             int n) {
    for (int c = 0; c < n; c += NR)
        for (int l = 0; l < NR; l++) {
            gk[c + l] *= beta * d[c + l];
            gq[c + l] *= d[c + l];
        }
}

/* r[l] = beta (v[l] - gam r[l]), l < n: the right-hand side of the substitution */
DC_INLINE void dc_rhs(int NR, int fma, float *restrict r, const float *restrict v, float beta, float gam, int n) {
    int c = 0;
    for (; c + NR <= n; c += NR)
        for (int l = 0; l < NR; l++) r[c + l] = beta * dc_fma(fma, -gam, r[c + l], v[c + l]);
    for (; c < n; c++) r[c] = beta * dc_fma(fma, -gam, r[c], v[c]);
}

/* Scratch of one head, padded: rows of A to multiples of 4, columns of B to multiples of DC_NR_MAX. */
typedef struct {
    int dk, dv, dkp, dvp; /* dkp = dk rounded up to 4, dvp = dv rounded up to DC_NR_MAX */
    float *S;             /* [dkp][dvp] the state (zero padding); the caller's own when it needs no padding */
    float *Sbuf;          /* [dkp][dvp] room for a padded copy */
    float *K, *Q;         /* [C][dkp] the chunk's keys and queries (rows past n zero up to a multiple of 4) */
    float *KT, *KdT;      /* [dkp][C] keys transposed; and times D_{n-1,j} (columns past n zero) */
    float *Gk, *Gq;       /* [C][C] beta_i D_ij k_i.k_j (j < i), D_ij q_i.k_j (j <= i); only the panels that
                           * reach the diagonal are computed and read */
    float *W, *P;         /* [C][dvp] K S then R then U; Q S then O */
    float *D;             /* [C][C] decay products D_ij, j <= i; zero above the diagonal and past row n */
    float *gam, *bt;      /* [C] gam_i, beta_i (zero past n) */
} dc_work;

static size_t dc_work_floats(int dk, int dv) {
    int64_t dkp = round_up(dk, DC_MR), dvp = round_up(dv, DC_NR_MAX), c = DC_C;
    return (size_t)(dkp * dvp + 4 * c * dkp + 3 * c * c + 2 * c * dvp + 2 * c);
}

static void dc_work_init(dc_work *w, float *buf, int dk, int dv) {
    w->dk = dk;
    w->dv = dv;
    w->dkp = (int)round_up(dk, DC_MR);
    w->dvp = (int)round_up(dv, DC_NR_MAX);
    int64_t c = DC_C;
    float *p = buf;
    w->Sbuf = p, p += (int64_t)w->dkp * w->dvp;
    w->K = p, p += c * w->dkp;
    w->Q = p, p += c * w->dkp;
    w->KT = p, p += c * w->dkp;
    w->KdT = p, p += c * w->dkp;
    w->Gk = p, p += c * c;
    w->Gq = p, p += c * c;
    w->D = p, p += c * c;
    w->W = p, p += c * w->dvp;
    w->P = p, p += c * w->dvp;
    w->gam = p, p += c;
    w->bt = p;
    /* the rows of KdT past dk enter the state update as zeros; nothing else past dk is read */
    memset(w->KdT + (int64_t)dk * c, 0, (size_t)((w->dkp - dk) * c) * sizeof(float));
}

/*
 * One chunk of n tokens of one head: q, k rows at stride qk_stride floats, v and o rows at stride
 * v_stride, g and beta at stride gb_stride. w->S holds the entering state and gets the leaving one.
 */
DC_INLINE void dc_chunk(int NR, int fma, dc_work *w, float *o, const float *q, const float *k, int64_t qk_stride,
                        const float *v, int64_t v_stride, const float *g, const float *beta, int64_t gb_stride, int n) {
    const int dk = w->dk, dv = w->dv, dkp = w->dkp, dvp = w->dvp, C = DC_C;
    const int m = (int)round_up(n, DC_MR); /* rows of the products */

    /* the chunk's keys and queries, zero past n, and the keys transposed */
    for (int i = 0; i < C; i++) {
        float *kr = w->K + (int64_t)i * dkp, *qr = w->Q + (int64_t)i * dkp;
        if (i < n) {
            memcpy(kr, k + i * qk_stride, (size_t)dk * sizeof(float));
            memcpy(qr, q + i * qk_stride, (size_t)dk * sizeof(float));
        } else if (i < m) {
            memset(kr, 0, (size_t)dk * sizeof(float));
            memset(qr, 0, (size_t)dk * sizeof(float));
        }
    }
    for (int r = 0; r < dk; r++) {
        float *kt = w->KT + (int64_t)r * C;
        for (int i = 0; i < n; i++) kt[i] = w->K[(int64_t)i * dkp + r];
        for (int i = n; i < C; i++) kt[i] = 0;
    }

    /* decays: D_ij = e_{j+1} ... e_i (j <= i), gam_i = e_0 ... e_i; products of factors <= 1 */
    float gprev = 1;
    for (int i = 0; i < C; i++) {
        float e = i < n ? expf(g[i * gb_stride]) : 0, *Di = w->D + (int64_t)i * C;
        if (i == 0)
            for (int j = 0; j < C; j++) Di[j] = 0;
        else
            for (int j = 0; j < C; j++) Di[j] = Di[j - C] * e;
        if (i < n) Di[i] = 1;
        w->gam[i] = gprev = gprev * e;
        w->bt[i] = i < n ? beta[i * gb_stride] : 0;
    }

    /* W = K S, P = Q S */
    dc_gemm(NR, fma, w->W, dvp, w->K, dkp, w->S, dvp, m, dvp, dk, DC_SET, NULL, 0);
    dc_gemm(NR, fma, w->P, dvp, w->Q, dkp, w->S, dvp, m, dvp, dk, DC_SET, NULL, 0);

    /* K K^T and Q K^T on the panels of columns that reach the diagonal of each row block, times D (zero
     * above the diagonal) and beta_i; the diagonal of Gk is 0 (the system is unit lower-triangular) */
    for (int i = 0; i < m; i += DC_MR) {
        int cend = (int)round_up(i + DC_MR, NR);
        for (int c = 0; c < cend; c += NR) {
            dc_tile(NR, fma, w->Gk + (int64_t)i * C + c, C, w->K + (int64_t)i * dkp, dkp, w->KT + c, C, dk, DC_SET,
                    NULL, 0);
            dc_tile(NR, fma, w->Gq + (int64_t)i * C + c, C, w->Q + (int64_t)i * dkp, dkp, w->KT + c, C, dk, DC_SET,
                    NULL, 0);
        }
        for (int a = 0; a < DC_MR; a++) {
            float *gk = w->Gk + (int64_t)(i + a) * C, *gq = w->Gq + (int64_t)(i + a) * C;
            const float *Di = w->D + (int64_t)(i + a) * C;
            dc_decay_gram(NR, gk, gq, Di, w->bt[i + a], cend);
            gk[i + a] = 0;
        }
    }

    /* R_i = beta_i (v_i - gam_i W_i); zero past n and past dv */
    for (int i = 0; i < m; i++) {
        float *wr = w->W + (int64_t)i * dvp;
        if (i >= n) {
            memset(wr, 0, (size_t)dvp * sizeof(float));
            continue;
        }
        dc_rhs(NR, fma, wr, v + i * v_stride, w->bt[i], w->gam[i], dv);
        for (int c = dv; c < dvp; c++) wr[c] = 0;
    }

    /* U: (I + Gk) U = R, four rows at a time */
    for (int i = 0; i < m; i += DC_MR) {
        float *Wi = w->W + (int64_t)i * dvp;
        if (i > 0)
            for (int c = 0; c < dvp; c += NR)
                dc_tile(NR, fma, Wi + c, dvp, w->Gk + (int64_t)i * C, C, w->W + c, dvp, i, DC_SUB, NULL, 0);
        for (int a = 1; a < DC_MR; a++)
            for (int b = 0; b < a; b++)
                dc_axmy(NR, fma, Wi + (int64_t)a * dvp, w->Gk[(int64_t)(i + a) * C + i + b], Wi + (int64_t)b * dvp,
                        dvp);
    }

    /* O = gam P + (Q K^T o D) U; row block i needs the rows of U below i + 4 */
    for (int i = 0; i < m; i += DC_MR)
        for (int c = 0; c < dvp; c += NR)
            dc_tile(NR, fma, w->P + (int64_t)i * dvp + c, dvp, w->Gq + (int64_t)i * C, C, w->W + c, dvp, i + DC_MR,
                    DC_SCALE_ADD, w->gam + i, 1);
    for (int i = 0; i < n; i++) memcpy(o + i * v_stride, w->P + (int64_t)i * dvp, (size_t)dv * sizeof(float));

    /* S = gam_{n-1} S + (K o D_{n-1,.})^T U */
    const float *Dl = w->D + (int64_t)(n - 1) * C;
    for (int r = 0; r < dk; r++) dc_mul(NR, w->KdT + (int64_t)r * C, w->KT + (int64_t)r * C, Dl, C);
    dc_gemm(NR, fma, w->S, dvp, w->KdT, C, w->W, dvp, dkp, dvp, m, DC_SCALE_ADD, w->gam + n - 1, 0);
}

typedef struct {
    float *o, *state;
    const float *q, *k, *v, *g, *beta;
    int n_tok, hk, hv, dk, dv, tiled;
    int64_t j0, j1;
} dc_args;

/* Heads j0..j1 with one scratch: state in (padded unless dk, dv need none), chunks in order, state out. */
DC_INLINE void dc_heads(int NR, int fma, const dc_args *a, float *buf) {
    dc_work w;
    dc_work_init(&w, buf, a->dk, a->dv);
    int rep = a->hv / a->hk, in_place = w.dkp == a->dk && w.dvp == a->dv;
    int64_t qk_stride = (int64_t)a->hk * a->dk, v_stride = (int64_t)a->hv * a->dv;
    for (int64_t j = a->j0; j < a->j1; j++) {
        float *S = a->state + j * a->dk * a->dv;
        w.S = in_place ? S : w.Sbuf;
        if (!in_place) {
            memset(w.S, 0, (size_t)w.dkp * w.dvp * sizeof(float));
            for (int r = 0; r < a->dk; r++)
                memcpy(w.S + (int64_t)r * w.dvp, S + (int64_t)r * a->dv, (size_t)a->dv * sizeof(float));
        }
        for (int t0 = 0; t0 < a->n_tok; t0 += DC_C) {
            int64_t qk = t0 * qk_stride + (a->tiled ? j % a->hk : j / rep) * a->dk, vo = t0 * v_stride + j * a->dv;
            int64_t gb = (int64_t)t0 * a->hv + j;
            dc_chunk(NR, fma, &w, a->o + vo, a->q + qk, a->k + qk, qk_stride, a->v + vo, v_stride, a->g + gb,
                     a->beta + gb, a->hv, QW_MIN(DC_C, a->n_tok - t0));
        }
        if (!in_place)
            for (int r = 0; r < a->dk; r++)
                memcpy(S + (int64_t)r * a->dv, w.S + (int64_t)r * w.dvp, (size_t)a->dv * sizeof(float));
    }
}

/* The three builds: panels of 32 columns (two 16-lane registers) for AVX-512, 16 for AVX2, 8 otherwise
 * (fused multiply-adds where the target has them in hardware, as AArch64 does). */
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vl,avx2,fma"))) static void dc_heads_avx512(const dc_args *a, float *buf) {
    dc_heads(32, 1, a, buf);
}
__attribute__((target("avx2,fma"))) static void dc_heads_avx2(const dc_args *a, float *buf) { dc_heads(16, 1, a, buf); }
#endif
#if defined(__FP_FAST_FMAF)
static void dc_heads_generic(const dc_args *a, float *buf) { dc_heads(8, 1, a, buf); }
#else
static void dc_heads_generic(const dc_args *a, float *buf) { dc_heads(8, 0, a, buf); }
#endif

int qw_delta_chunk_heads(const qw_cpu_kernels *kern, float *o, float *state, const float *q, const float *k,
                         const float *v, const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv,
                         int tiled, int64_t j0, int64_t j1) {
    QW_ASSERT(hk > 0 && hv % hk == 0 && dk > 0 && dv > 0);
    if (n_tok <= 0 || j0 >= j1) return 1;
    float *buf = qw_aligned_alloc(64, (size_t)round_up((int64_t)dc_work_floats(dk, dv) * sizeof(float), 64));
    if (!buf) return 0;
    dc_args a = {.o = o, .state = state, .q = q, .k = k, .v = v, .g = g, .beta = beta, .n_tok = n_tok, .hk = hk,
                 .hv = hv, .dk = dk, .dv = dv, .tiled = tiled, .j0 = j0, .j1 = j1};
#if defined(__x86_64__)
    /* subnormal inputs and results read as 0 while this runs (flush-to-zero and denormals-are-zero): a long run
     * of very negative g makes decay products that x86 would otherwise compute through slow microcode */
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    if (kern->simd == QW_SIMD_AVX512)
        dc_heads_avx512(&a, buf);
    else if (kern->simd == QW_SIMD_AVX2)
        dc_heads_avx2(&a, buf);
    else
#endif
        dc_heads_generic(&a, buf);
#if defined(__x86_64__)
    _mm_setcsr(csr);
#endif
    (void)kern;
    free(buf);
    return 1;
}
