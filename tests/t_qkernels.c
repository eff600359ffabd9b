/*
 * t_qkernels.c - the SIMD dot kernels of quantized weight types (so far Q8_0) against the reference.
 *
 * A Q8_0 weight is q*d with q an int8 and d an f16 scale: the product is exact in f32, so the kernel is
 * the f32 kernel on exactly the reference's dequantized weights and the bound of cpu.h applies:
 * |kernel - ref| <= (ceil(n/lanes) + log2(lanes) + 3) * 2^-24 * sum|w_i x_i| + 2^-149.
 * Every tile shape must also give bit-identical outputs (the determinism contract of cpu.h).
 *
 * The integer path (q8a.h: activations rounded to 8 bits per block of 32) is checked in three layers:
 *   unpack    A * iw + B of every weight equals ggml's dequantized value within 2 f32 roundings
 *             (|diff| <= 2^-23 * (|A * iw| + |B|));
 *   reference |qw_q8a_dot_ref - exact f32 dot| <= sum_g (d_g / 2) sum_{i in g} |w_i| (the activation
 *             rounding) + (n/32 + 4) * 2^-24 * qw_q8a_dot_abs (the f32 sums), on rows of 32 .. 4128;
 *   kernels   every variant's qtile against qw_q8a_dot_ref within (n/32 + 16) * 2^-24 * qw_q8a_dot_abs (only
 *             the order of the f32 additions differs), bit-identical across tile shapes; on random blocks
 *             and adversarial ones (extreme weights and scales, all-zero activation blocks, +-127 codes);
 *   words     q8dot.h's group dot of 32-bit words (the CUDA backend's integer matrix-vector kernels) gives
 *             qw_q8a_unpack's integer sum and A, B bit for bit, for every type and group, on the same rows;
 *             and its signed codes with per-half scales (qd_codes: the tensor-core GEMM's) the same sum.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "kernels/cpu.h"
#include "kernels/q8a.h"
#include "kernels/q8dot.h"
#include "tensor/quant.h"
#include "test_util.h"

static uint64_t rs = 88172645463325252ull;
static double urand(void) { /* xorshift64, [0, 1) */
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

static void test_type(const qw_cpu_kernels *k, qw_type type) {
    static const int64_t lens[] = {32, 64, 96, 256, 2048, 4128};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        size_t rb = qw_type_row_size(type, n);
        float *wf = malloc((size_t)4 * n * sizeof(float)), *x = malloc((size_t)4 * n * sizeof(float));
        float *deq = malloc((size_t)4 * n * sizeof(float));
        char *wq = malloc(4 * rb);
        for (int64_t i = 0; i < 4 * n; i++) {
            wf[i] = nrand() * (i % 97 == 0 ? 30.0f : 1.0f); /* outliers set some block scales */
            x[i] = nrand() * (i % 89 == 0 ? 1e4f : 1.0f);
        }
        for (int r = 0; r < 4; r++) qw_quantize(type, wf + r * n, wq + r * rb, n);
        qw_tensor t = {.name = "w", .data = wq, .type = type, .n_dims = 2, .shape = {4, n}};
        qw_tensor_to_f32(&t, 0, 4 * n, deq);
        float y44[16], y11[16];
        k->tile[type](y44, 4, wq, rb, x, n, 4, 4, n);
        int same = 1, within = 1;
        double worst = 0;
        for (int r = 0; r < 4; r++)
            for (int tk = 0; tk < 4; tk++) {
                k->tile[type](&y11[tk * 4 + r], 1, wq + r * rb, 0, x + tk * n, 0, 1, 1, n);
                same &= memcmp(&y11[tk * 4 + r], &y44[tk * 4 + r], sizeof(float)) == 0;
                double ref = qw_ref_dot_row(&t, r, x + tk * n, n), mag = 0;
                for (int64_t c = 0; c < n; c++) mag += fabs((double)deq[r * n + c] * x[tk * n + c]);
                double bound = ((n + k->lanes - 1) / k->lanes + log2(k->lanes) + 3) * ldexp(1, -24) * mag + ldexp(1, -149);
                double err = fabs(y44[tk * 4 + r] - ref);
                within &= err <= bound;
                if (bound > 0 && err / bound > worst) worst = err / bound;
            }
        CHECK(within, "%s %s n=%lld: error above the bound (worst %.2f of it)", k->name, qw_type_name(type), (long long)n,
              worst);
        CHECK(same, "%s %s n=%lld: 1x1 and 4x4 tiles differ", k->name, qw_type_name(type), (long long)n);
        free(wf);
        free(x);
        free(deq);
        free(wq);
    }
}


static const qw_type q8a_types[] = {QW_TYPE_Q8_0, QW_TYPE_Q4_0, QW_TYPE_Q4_1, QW_TYPE_Q5_0, QW_TYPE_Q5_1,
                                    QW_TYPE_Q4_K, QW_TYPE_Q5_K, QW_TYPE_Q6_K, QW_TYPE_IQ4_NL, QW_TYPE_IQ4_XS};
#define N_Q8A_TYPES (int)(sizeof(q8a_types) / sizeof(q8a_types[0]))

/* 4 rows of n weights and 4 rows of activations; `adv` picks an adversarial mix */
static void fill_case(float *wf, float *x, int64_t n, int adv) {
    for (int64_t i = 0; i < 4 * n; i++) {
        wf[i] = nrand() * (i % 97 == 0 ? 30.0f : 1.0f);
        x[i] = nrand() * (i % 89 == 0 ? 1e4f : 1.0f);
        if (adv == 1) { /* huge and tiny blocks, exact zeros, one sign */
            int64_t blk = i / 32;
            wf[i] = blk % 3 == 0 ? fabsf(wf[i]) * 1e3f : blk % 3 == 1 ? wf[i] * 1e-4f : wf[i];
            x[i] = blk % 4 == 0 ? 0.0f : blk % 4 == 1 ? (i % 2 ? 1e6f : -1e6f) : x[i];
        } else if (adv == 2) { /* constant blocks: all codes at +-127 / the extreme levels */
            wf[i] = (i / 32) % 2 ? -7.5f : 7.5f;
            x[i] = (i / 16) % 2 ? -3.0f : 3.0f;
        }
    }
}

static void test_q8a_unpack(qw_type type) {
    int64_t n = 512;
    size_t rb = qw_type_row_size(type, n);
    float wf[512], deq[512], x[4 * 512], wbig[4 * 512];
    char *wq = malloc(rb);
    int ok = 1;
    for (int adv = 0; adv < 3; adv++) {
        fill_case(wbig, x, n, adv);
        memcpy(wf, wbig, sizeof(wf));
        qw_quantize(type, wf, wq, n);
        qw_dequantize(type, wq, deq, n);
        for (int64_t g = 0; g < n / 32; g++) {
            int16_t iw[32];
            float A, B;
            qw_q8a_unpack(type, wq, g, iw, &A, &B);
            for (int i = 0; i < 32; i++) {
                double v = (double)A * iw[i] + B, e = deq[g * 32 + i];
                ok &= fabs(v - e) <= ldexp(1, -23) * (fabs((double)A * iw[i]) + fabs(B)) + ldexp(1, -149);
            }
        }
    }
    CHECK(ok, "%s: integer unpack differs from the dequantized weights", qw_type_name(type));
    free(wq);
}

/* q8dot.h's words against qw_q8a_unpack: the same integer sum and the same A, B bits for every group; the row on
 * a 16-byte boundary (the wide loads of the K-quants) and 2 bytes off one (the alignment the device kernels may
 * meet) */
static void test_q8dot(qw_type type, int mis) {
    int64_t n = 512;
    size_t rb = qw_type_row_size(type, n);
    float wf[4 * 512], x[4 * 512];
    char *buf = qw_aligned_alloc(16, rb + 32), *wq = buf + mis;
    qw_q8a xq[512 / 32];
    int ok = 1;
    for (int adv = 0; adv < 3 && ok; adv++) {
        fill_case(wf, x, n, adv);
        qw_quantize(type, wf, wq, n);
        qw_q8a_quantize(x, xq, n);
        for (int64_t g = 0; g < n / 32 && ok; g++) {
            int16_t iw[32];
            float A, B, A2, B2;
            qw_q8a_unpack(type, wq, g, iw, &A, &B);
            int32_t want = 0, got;
            for (int i = 0; i < 32; i++) want += iw[i] * xq[g].q[i];
            uint32_t words[8];
            memcpy(words, xq[g].q, sizeof(words));
            qd_group(type, (const uint8_t *)wq, g, words, xq[g].s, &got, &A2, &B2);
            if (got != want || memcmp(&A, &A2, 4) || memcmp(&B, &B2, 4)) {
                printf("  %s adv %d group %lld: isum %d (want %d), A %.9g (%.9g), B %.9g (%.9g)\n", qw_type_name(type),
                       adv, (long long)g, got, want, A2, A, B2, B);
                ok = 0;
            }
            /* the tensor-core GEMM's codes: the same sum by halves, the same A, B */
            uint32_t c[8];
            int m0, m1;
            qd_codes(type, (const uint8_t *)wq, g, c, &A2, &B2, &m0, &m1);
            int32_t h[2] = {0, 0};
            for (int i = 0; i < 32; i++) h[i / 16] += (int8_t)(c[i / 4] >> 8 * (i % 4)) * xq[g].q[i];
            got = m0 * h[0] + m1 * h[1];
            if (got != want || memcmp(&A, &A2, 4) || memcmp(&B, &B2, 4)) {
                printf("  %s adv %d group %lld: codes' isum %d (want %d), A %.9g (%.9g), B %.9g (%.9g)\n",
                       qw_type_name(type), adv, (long long)g, got, want, A2, A, B2, B);
                ok = 0;
            }
        }
    }
    CHECK(ok && qd_supported(type), "%s (row %d bytes off 16): q8dot.h's words differ from qw_q8a_unpack",
          qw_type_name(type), mis);
    free(buf);
}

/* the reference integer dot against the exact f32 dot of the dequantized weights, and quantize() itself */
static void test_q8a_ref(qw_type type) {
    static const int64_t lens[] = {32, 256, 512, 4096};
    int within = 1;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        if (n % qw_type_traits_of(type)->block_elems) continue;
        size_t rb = qw_type_row_size(type, n);
        float *wf = malloc((size_t)4 * n * sizeof(float)), *x = malloc((size_t)4 * n * sizeof(float));
        float *deq = malloc((size_t)n * sizeof(float));
        char *wq = malloc(rb);
        qw_q8a *xq = malloc((size_t)n / 32 * sizeof(qw_q8a));
        for (int adv = 0; adv < 3; adv++) {
            fill_case(wf, x, n, adv);
            qw_quantize(type, wf, wq, n);
            qw_dequantize(type, wq, deq, n);
            qw_q8a_quantize(x, xq, n);
            double exact = 0, round_bound = 0;
            for (int64_t g = 0; g < n / 32; g++) {
                double wa = 0;
                int32_t s = 0;
                for (int i = 0; i < 32; i++) {
                    exact += (double)deq[g * 32 + i] * x[g * 32 + i];
                    wa += fabs(deq[g * 32 + i]);
                    s += xq[g].q[i];
                    /* the rounding of one activation: at most half a step */
                    within &= fabs((double)xq[g].d * xq[g].q[i] - x[g * 32 + i]) <= 0.5000001 * xq[g].d + 1e-30;
                }
                within &= s == xq[g].s;
                round_bound += 0.5000001 * xq[g].d * wa;
            }
            double ref = qw_q8a_dot_ref(type, wq, xq, n);
            double bound = round_bound + (n / 32 + 4) * ldexp(1, -24) * qw_q8a_dot_abs(type, wq, xq, n) + 1e-30;
            if (!(fabs(ref - exact) <= bound)) {
                within = 0;
                printf("  %s n=%lld adv=%d: ref %.9g exact %.9g bound %.3g\n", qw_type_name(type), (long long)n, adv,
                       ref, exact, bound);
            }
        }
        free(wf);
        free(x);
        free(deq);
        free(wq);
        free(xq);
    }
    CHECK(within, "%s: integer reference dot outside the activation-rounding bound", qw_type_name(type));
}

/* |y - qw_q8a_dot_ref| over the tiles' bound (n/32 + 16) * 2^-24 * qw_q8a_dot_abs: within it when <= 1 */
static double qtile_err(qw_type type, const void *w, const qw_q8a *x, int64_t n, float y) {
    double ref = qw_q8a_dot_ref(type, w, x, n);
    double bound = (n / 32 + 16) * ldexp(1, -24) * qw_q8a_dot_abs(type, w, x, n) + 1e-30;
    return fabs(y - ref) / bound;
}

/* The buffers of a kernel test at row length n: f32 weights wf and activations x (nf rows each), nr quantized
 * weight rows wq (rb bytes each), nt activation rows xq (nb blocks each). */
typedef struct {
    float *wf, *x;
    char *wq;
    qw_q8a *xq;
    size_t rb;
    int64_t nb;
} qbufs;

static qbufs qbufs_new(qw_type type, int64_t n, int nf, int nr, int nt) {
    qbufs b = {.rb = qw_type_row_size(type, n), .nb = n / 32};
    b.wf = malloc((size_t)nf * n * sizeof(float));
    b.x = malloc((size_t)nf * n * sizeof(float));
    b.wq = malloc(nr * b.rb);
    b.xq = malloc((size_t)nt * b.nb * sizeof(qw_q8a));
    return b;
}

static void qbufs_free(qbufs *b) {
    free(b->wf);
    free(b->x);
    free(b->wq);
    free(b->xq);
}

/* qtile_err of one output folded into a test's running verdict and worst case */
static void tally_err(qw_type type, const void *w, const qw_q8a *x, int64_t n, float y, int *within, double *worst) {
    double e = qtile_err(type, w, x, n, y);
    *within &= e <= 1;
    if (e > *worst) *worst = e;
}

static void test_qtile(const qw_cpu_kernels *k, qw_type type) {
    static const int64_t lens[] = {32, 64, 96, 256, 768, 2048, 4128};
    int within = 1, same = 1;
    double worst = 0;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        if (n % qw_type_traits_of(type)->block_elems) continue;
        qbufs b = qbufs_new(type, n, 4, 4, 4);
        float *wf = b.wf, *x = b.x;
        char *wq = b.wq;
        qw_q8a *xq = b.xq;
        size_t rb = b.rb;
        int64_t nb = b.nb;
        for (int adv = 0; adv < 3; adv++) {
            fill_case(wf, x, n, adv);
            for (int r = 0; r < 4; r++) qw_quantize(type, wf + r * n, wq + r * rb, n);
            qw_q8a_quantize(x, xq, 4 * n);
            float y44[16], y11[16], y41[16];
            k->qtile[type](y44, 4, wq, rb, xq, nb, 4, 4, n);
            for (int tk = 0; tk < 4; tk++) k->qtile[type](y41 + tk * 4, 4, wq, rb, xq + tk * nb, nb, 4, 1, n);
            float y31[3]; /* one token may take any number of rows (cpu.h) */
            k->qtile[type](y31, 3, wq + rb, rb, xq + 2 * nb, nb, 3, 1, n);
            same &= !memcmp(y31, &y44[2 * 4 + 1], 3 * sizeof(float));
            for (int r = 0; r < 4; r++)
                for (int tk = 0; tk < 4; tk++) {
                    k->qtile[type](&y11[tk * 4 + r], 1, wq + r * rb, 0, xq + tk * nb, 0, 1, 1, n);
                    same &= !memcmp(&y11[tk * 4 + r], &y44[tk * 4 + r], 4) && !memcmp(&y41[tk * 4 + r], &y44[tk * 4 + r], 4);
                    tally_err(type, wq + r * rb, xq + tk * nb, n, y44[tk * 4 + r], &within, &worst);
                }
        }
        qbufs_free(&b);
    }
    CHECK(within, "%s %s: integer tile above the bound (worst %.2f of it)", k->name, qw_type_name(type), worst);
    CHECK(same, "%s %s: integer tile shapes differ", k->name, qw_type_name(type));
}

/* Calls of many tokens (up to the table's qtile_nt; the avx512 kernel repacks 16 rows from 16 tokens on):
 * every output within the bound of the reference, and the same bits whichever rows and tokens share the
 * call (20 rows x 21 tokens at once, against rows 3-19 x tokens 2-20). */
static void test_qtile_many(const qw_cpu_kernels *k, qw_type type) {
    static const int64_t lens[] = {32, 96, 256, 2048};
    enum { NR = 20, NT = 21 };
    int nt_max = k->qtile_nt > 0 ? k->qtile_nt : k->tile_nt, within = 1, same = 1;
    double worst = 0;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        if (n % qw_type_traits_of(type)->block_elems) continue;
        qbufs b = qbufs_new(type, n, 24, NR, NT);
        float *wf = b.wf, *x = b.x;
        char *wq = b.wq;
        qw_q8a *xq = b.xq;
        size_t rb = b.rb;
        int64_t nb = b.nb;
        float *ya = malloc(sizeof(float) * NR * NT), *yb = malloc(sizeof(float) * NR * NT);
        for (int adv = 0; adv < 3; adv++) {
            for (int c = 0; c < 6; c++) fill_case(wf + 4 * c * n, x + 4 * c * n, n, (adv + c) % 3);
            for (int r = 0; r < NR; r++) qw_quantize(type, wf + r * n, wq + r * rb, n);
            qw_q8a_quantize(x, xq, NT * n);
            for (int t = 0; t < NT; t += nt_max)
                k->qtile[type](ya + t * NR, NR, wq, rb, xq + t * nb, nb, NR, NT - t < nt_max ? NT - t : nt_max, n);
            for (int t = 2; t < NT; t += nt_max)
                k->qtile[type](yb + t * NR + 3, NR, wq + 3 * rb, rb, xq + t * nb, nb, NR - 3,
                               NT - t < nt_max ? NT - t : nt_max, n);
            for (int t = 0; t < NT; t++)
                for (int r = 0; r < NR; r++) {
                    tally_err(type, wq + r * rb, xq + t * nb, n, ya[t * NR + r], &within, &worst);
                    if (t >= 2 && r >= 3) same &= !memcmp(&ya[t * NR + r], &yb[t * NR + r], sizeof(float));
                }
        }
        qbufs_free(&b);
        free(ya);
        free(yb);
    }
    CHECK(within, "%s %s: %d-token calls above the bound (worst %.2f of it)", k->name, qw_type_name(type), NT, worst);
    CHECK(same, "%s %s: %d-token calls depend on which rows and tokens share them", k->name, qw_type_name(type), NT);
}

/* Two tables that must give the same bits: the amx table's tile products and the avx512 repacked path, the
 * two avx512 builds and the two avx2 builds (decode's prefetch for AMD or Intel), the two neon builds (sdot
 * or smull integer dots). 37 rows (two blocks of 16 and a partial one) against 1, 4, 16, 21 and 50 tokens
 * (every path: decode, 4 x 4 tiles, whole blocks of 16 and padded tails), on rows of 1 to 72 groups (an odd
 * count leaves the last step alone; Q6_K takes sub-groups). */
static void test_same_bits(const qw_cpu_kernels *ka, const char *na, const qw_cpu_kernels *kb, const char *nb,
                           qw_type type) {
    static const int64_t lens[] = {32, 96, 256, 2304};
    static const int nts[] = {1, 4, 16, 21, 50};
    enum { NR = 37, NT = 50 };
    int same = 1, calls = 0;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        if (n % qw_type_traits_of(type)->block_elems) continue;
        qbufs b = qbufs_new(type, n, NT + 3, NR, NT); /* fill_case writes 4 rows */
        float *ya = malloc(sizeof(float) * NR * NT), *yb = malloc(sizeof(float) * NR * NT);
        for (int c = 0; c < NT; c++) fill_case(b.wf + c * n, b.x + c * n, n, c % 3);
        for (int r = 0; r < NR; r++) qw_quantize(type, b.wf + r * n, b.wq + r * b.rb, n);
        qw_q8a_quantize(b.x, b.xq, NT * n);
        for (size_t i = 0; i < sizeof(nts) / sizeof(nts[0]); i++) {
            ka->qtile[type](ya, NR, b.wq, b.rb, b.xq, b.nb, NR, nts[i], n);
            kb->qtile[type](yb, NR, b.wq, b.rb, b.xq, b.nb, NR, nts[i], n);
            same &= !memcmp(ya, yb, sizeof(float) * NR * nts[i]);
            calls++;
        }
        qbufs_free(&b);
        free(ya);
        free(yb);
    }
    CHECK(same && calls > 0, "%s and %s %s tiles differ", na, nb, qw_type_name(type));
}

/* A table's fast activation rounding writes qw_q8a_quantize's bytes: random, huge, tiny (denormal, below
 * the 1e-30 where 127 / max overflows), zero, infinite and NaN blocks, values on rounding ties. */
static void test_q8a_quantize_fast(const qw_cpu_kernels *k) {
    if (!k->q8a_quantize) return;
    enum { NB = 64 };
    float x[NB * 32];
    qw_q8a a[NB], b[NB];
    int same = 1;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < NB * 32; i++) {
            int blk = i / 32;
            float v = nrand();
            switch (blk % 16) {
            case 0: v *= 1e6f; break;
            case 1: v *= 1e-36f; break;          /* 127 / max overflows */
            case 2: v *= 1e-42f; break;          /* denormals */
            case 3: v = 0.0f; break;
            case 4: v = (i % 32 == 5) ? INFINITY : v; break;
            case 5: v = (i % 32 == 7) ? NAN : v; break;
            case 6: v = (float)((i % 255) - 127) * 0.5f; break; /* x * 127 / max on ties */
            case 7: v = (i % 32 == 0) ? 127.0f : (float)(i % 64) - 31.5f; break;
            case 8: v *= 1e30f; break;
            case 9: v = -0.0f; break;
            default: break;
            }
            x[i] = v;
        }
        memset(a, 0x55, sizeof(a));
        memset(b, 0x55, sizeof(b));
        qw_q8a_quantize(x, a, NB * 32);
        k->q8a_quantize(x, b, NB * 32);
        same &= !memcmp(a, b, sizeof(a));
    }
    CHECK(same, "%s: q8a_quantize differs from qw_q8a_quantize", k->name);
}

/* a NaN activation reaches the output of every integer tile, as it would with f32 activations */
static void test_q8a_nan(const qw_cpu_kernels *k, qw_type type) {
    float wf[256], x[256];
    char wq[sizeof(float) * 256];
    qw_q8a xq[8];
    for (int i = 0; i < 256; i++) {
        wf[i] = nrand();
        x[i] = nrand();
    }
    x[77] = NAN;
    qw_quantize(type, wf, wq, 256);
    qw_q8a_quantize(x, xq, 256);
    float y = 0;
    k->qtile[type](&y, 1, wq, 0, xq, 0, 1, 1, 256);
    CHECK(isnan(y) && isnan(qw_q8a_dot_ref(type, wq, xq, 256)), "%s %s: a NaN activation is lost (%g)", k->name,
          qw_type_name(type), y);
}

int main(void) {
    for (int i = 0; i < N_Q8A_TYPES; i++) {
        test_q8a_unpack(q8a_types[i]);
        test_q8a_ref(q8a_types[i]);
        test_q8dot(q8a_types[i], 0);
        test_q8dot(q8a_types[i], 2);
    }
    int n_variants = 0;
    for (const qw_cpu_kernels *const *k = qw_cpu_kernels_available(); *k; k++) {
        static const qw_type types[] = {QW_TYPE_Q8_0};
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
            if ((*k)->tile[types[i]]) {
                printf("%s: %s dot kernel vs reference\n", (*k)->name, qw_type_name(types[i]));
                test_type(*k, types[i]);
                n_variants++;
            }
    }
    for (const qw_cpu_kernels *const *k = qw_cpu_kernels_available(); *k; k++) {
        int n = 0;
        test_q8a_quantize_fast(*k);
        for (int i = 0; i < N_Q8A_TYPES; i++)
            if ((*k)->qtile[q8a_types[i]]) {
                test_qtile(*k, q8a_types[i]);
                test_qtile_many(*k, q8a_types[i]);
                test_q8a_nan(*k, q8a_types[i]);
                n++;
            }
        printf("%s: integer tiles of %d quantized types vs the reference\n", (*k)->name, n);
    }
#if defined(__x86_64__)
    if (qw_cpu_kernels_find("avx512")) { /* both avx512 builds run on any AVX-512 CPU */
        for (int i = 0; i < N_Q8A_TYPES; i++)
            test_same_bits(&qw_kernels_avx512, "avx512 (AMD)", &qw_kernels_avx512_intel, "avx512 (Intel)", q8a_types[i]);
        printf("avx512: the AMD and Intel builds of %d quantized types give the same bits\n", N_Q8A_TYPES);
    }
    if (qw_cpu_kernels_find("avx2")) {
        for (int i = 0; i < N_Q8A_TYPES; i++)
            test_same_bits(&qw_kernels_avx2, "avx2 (AMD)", &qw_kernels_avx2_intel, "avx2 (Intel)", q8a_types[i]);
        printf("avx2: the AMD and Intel builds of %d quantized types give the same bits\n", N_Q8A_TYPES);
    }
    if (qw_cpu_kernels_find("amx")) {
        for (int i = 0; i < N_Q8A_TYPES; i++)
            test_same_bits(&qw_kernels_amx, "amx", &qw_kernels_avx512, "avx512", q8a_types[i]);
        printf("amx: tile products of %d quantized types give the avx512 bits\n", N_Q8A_TYPES);
    } else {
        printf("amx: not on this CPU (its tile products are checked where it is)\n");
    }
#endif
#if defined(__aarch64__)
    if (qw_cpu_kernels_find("neon") == &qw_kernels_neon_dotprod) { /* the smull build runs on any AArch64 CPU */
        for (int i = 0; i < N_Q8A_TYPES; i++)
            test_same_bits(&qw_kernels_neon_dotprod, "neon (sdot)", &qw_kernels_neon, "neon (smull)", q8a_types[i]);
        printf("neon: the sdot and smull builds of %d quantized types give the same bits\n", N_Q8A_TYPES);
    } else {
        printf("neon: no dot-product instructions on this CPU (the sdot build is checked where they are)\n");
    }
#endif
    printf("(%d kernel variants with quantized types on this CPU)\n", n_variants);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
