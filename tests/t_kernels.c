/*
 * t_kernels.c - the CPU backend against the scalar reference: the thread pool, every dot-kernel variant
 * this CPU runs (avx512, avx2, scalar) for F32/BF16/F16 weights on random and adversarial rows, every op
 * of the threaded op table against ref.c, thread-count invariance, and whole-model logits per variant.
 *
 * Tolerances (u = 2^-24, L = the variant's f32 lanes):
 *   dot       |kernel - ref| <= (ceil(n/L) + log2(L) + 3) * (u * sum_i |w_i x_i| + 2^-149)
 *             Each lane sums ceil(n/L) products in f32 (an FMA rounds once; the scalar variant rounds the
 *             product too), then a log2(L)-deep tree, then the final f32 rounding the reference also
 *             makes: the classical bound for recursive summation, with 2^-149 per rounding for the
 *             absolute error of results in the subnormal range. Inputs whose products or partial sums
 *             leave the f32 range are outside the contract (the reference sums in double).
 *             Non-finite results must match: NaN where the reference is NaN, the same infinity.
 *   ops that the CPU table runs through the reference code on ranges (norms, rope, conv, element-wise,
 *             get_rows): bit-identical.
 *   sigmoid, silu (a table's vector kernels): bit-identical, on the edges of the range too: they and
 *             ref.c take e^x from expd.h by the same steps. expd.h's e^x itself: within 1 ulp of libm's
 *             expf, and within 0.5 ulp + 1e-13 relative of e^x computed in double (it is e^r to 6.2e-15,
 *             rounded once); at most 1 in 1000 random results differ from expf at all (measured over
 *             every float of (-110, 90): 170,648 of 2.24e9).
 *   rms_norm  (a table's rms_norm_row: the double sum of squares in another order) bit-identical on these
 *             inputs: 1 / rms rounds to another float only for a sum within dim * 2^-53 of a boundary.
 *   matmul    the dot bound per element; and bit-identical for 1 and 3 threads.
 *   attention |cpu - ref| <= (4 d + 80 u) * max|v| + 2^-126, d = the largest score error (the dot bound
 *             above with n = head_dim, times the scale, plus u |s|): a relative error r of the scores'
 *             exponentials moves the normalised weights by at most 2r, and the f32 block sums of at most
 *             64 weighted values add 64 u; blocks are merged in double.
 *   delta rule  |cpu - ref| <= 4 T (dk + 8) u B max(1, |k|_1, |q|_1) per output and state entry, B the
 *             largest |entry| of the states, values and outputs: each of the T steps adds two dk-term f32
 *             sums, and earlier errors are carried through exp(g) (I - beta k k^T), which does not grow.
 *   chunked delta rule (delta_chunk.c, the path of calls of QW_DELTA_CHUNK_MIN_TOK tokens or more)
 *             |chunked - ref| <= DR_CHUNK_TOL ceil(T/64) B, DR_CHUNK_TOL = 1e-5 (about 170 u) per chunk of
 *             64 tokens, B as above: each chunk rounds f32 sums of at most dk + 128 terms of unit-norm
 *             rows, about sqrt(dk + 128) u B for roundings of random sign (seen: at most 5e-7 B per chunk,
 *             about what the token-by-token path shows), and the state carries errors without amplifying
 *             them; through the op table, the same bits as a direct call for 1 and 3 threads.
 *   model     logits of every fixture within the transformers bar (rel L2 < 1e-4) for every variant, and
 *             bit-identical with 1 and 3 threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mapfile.h"
#include "core/pool.h"
#include "kernels/cpu.h"
#include "kernels/delta_chunk.h"
#include "kernels/expd.h"
#include "qwenc.h"
#include "test_util.h"

#define U24 (1.0 / 16777216.0)
#define SUBNORMAL_STEP 1.401298464324817e-45 /* 2^-149 */
#define DR_CHUNK_TOL 1e-5 /* per chunk of 64 tokens, relative to B (see the top comment) */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float frand(void) { return (float)((rng() >> 40) * (2.0 / 16777216.0) - 1.0); } /* [-1, 1) */
static int irand(int n) { return (int)(rng() % (uint64_t)n); }

static const char *type_name(qw_type t) { return t == QW_TYPE_F32 ? "f32" : t == QW_TYPE_BF16 ? "bf16" : "f16"; }

/* ------------------------------------------------------------------ pool */

typedef struct {
    unsigned char *hits;
    qw_pool *pool; /* for the nested call */
    atomic_int calls;
} pool_ctx;

static void mark(void *arg, int64_t i0, int64_t i1) {
    pool_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    for (int64_t i = i0; i < i1; i++) c->hits[i]++;
}

static void mark_nested(void *arg, int64_t i0, int64_t i1) {
    pool_ctx *c = arg;
    /* a job inside a job runs on the calling thread */
    pool_ctx inner = {.hits = c->hits + i0 * 4};
    atomic_init(&inner.calls, 0);
    qw_pool_parallel_for(c->pool, (i1 - i0) * 4, 1, mark, &inner);
}

static int all_once(const unsigned char *h, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (h[i] != 1) return 0;
    return 1;
}

typedef struct {
    qw_pool *pool;
    int ok;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    unsigned char *h = calloc(5000, 1);
    r->ok = 1;
    for (int k = 0; k < 200 && r->ok; k++) {
        memset(h, 0, 5000);
        pool_ctx c = {.hits = h};
        atomic_init(&c.calls, 0);
        qw_pool_parallel_for(r->pool, 5000, 7, mark, &c);
        r->ok = all_once(h, 5000);
    }
    free(h);
    return NULL;
}

static void test_pool(void) {
    printf("pool: every item once, any chunk, nested jobs, two callers at once\n");
    static const int64_t sizes[] = {1, 2, 7, 64, 1000, 100003};
    static const int64_t chunks[] = {0, 1, 3, 64, 1 << 20};
    static const int threads[] = {1, 2, 3, 5};
    unsigned char *h = malloc(100003 * 4);
    CHECK(qw_pool_n_threads(NULL) == 1 && qw_cpu_count() >= 1, "thread counts");
    for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++) {
        qw_pool *p = qw_pool_new(threads[ti]);
        CHECK(p && qw_pool_n_threads(p) == threads[ti], "pool of %d threads", threads[ti]);
        if (!p) continue;
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
            for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
                memset(h, 0, (size_t)sizes[si]);
                pool_ctx c = {.hits = h};
                atomic_init(&c.calls, 0);
                qw_pool_parallel_for(p, sizes[si], chunks[ci], mark, &c);
                int64_t ch = chunks[ci] < 1 ? 1 : chunks[ci];
                int calls = atomic_load(&c.calls);
                CHECK(all_once(h, sizes[si]) && calls >= 1 && calls <= (sizes[si] + ch - 1) / ch,
                      "%d threads, %lld items in chunks of %lld: %d calls", threads[ti], (long long)sizes[si],
                      (long long)chunks[ci], calls);
            }
        memset(h, 0, 1000 * 4);
        pool_ctx c = {.hits = h, .pool = p};
        atomic_init(&c.calls, 0);
        qw_pool_parallel_for(p, 1000, 9, mark_nested, &c);
        CHECK(all_once(h, 4000), "%d threads: nested job", threads[ti]);
        racer r[2] = {{p, 0}, {p, 0}};
        pthread_t th;
        pthread_create(&th, NULL, race, &r[0]);
        race(&r[1]);
        pthread_join(th, NULL);
        CHECK(r[0].ok && r[1].ok, "%d threads: two callers at once", threads[ti]);
        qw_pool_free(p);
    }
    qw_pool_parallel_for(NULL, 0, 1, mark, NULL); /* nothing to do: fn never called */
    n_pass++;
    free(h);
}

/* ------------------------------------------------------------------ dot kernels */

/* weight bits of element i of a row of type t */
static void put_w(qw_type t, void *row, int64_t i, float v) {
    if (t == QW_TYPE_F32) {
        memcpy((char *)row + i * 4, &v, 4);
    } else {
        uint16_t h = t == QW_TYPE_BF16 ? qw_f32_to_bf16(v) : qw_f32_to_f16(v);
        memcpy((char *)row + i * 2, &h, 2);
    }
}
static void put_bits(qw_type t, void *row, int64_t i, uint32_t bits) {
    if (t == QW_TYPE_F32) {
        memcpy((char *)row + i * 4, &bits, 4);
    } else {
        uint16_t h = (uint16_t)bits;
        memcpy((char *)row + i * 2, &h, 2);
    }
}
static float get_w(qw_type t, const void *row, int64_t i) {
    float v;
    uint16_t h;
    if (t == QW_TYPE_F32) {
        memcpy(&v, (const char *)row + i * 4, 4);
        return v;
    }
    memcpy(&h, (const char *)row + i * 2, 2);
    return t == QW_TYPE_BF16 ? qw_bf16_to_f32(h) : qw_f16_to_f32(h);
}

static double dot_tol(const qw_cpu_kernels *k, int64_t n, double abs_sum) {
    int lg = 0;
    while ((1 << lg) < k->lanes) lg++;
    double steps = (double)((n + k->lanes - 1) / k->lanes + lg + 3);
    return steps * (U24 * abs_sum + SUBNORMAL_STEP);
}

static double max_ratio; /* the largest |error| / bound seen on random rows, printed */

/* Compare one output of a kernel with the reference dot of row r; returns 1 if within the contract. */
static int check_dot(const qw_cpu_kernels *k, const qw_tensor *w, int64_t r, const float *x, int64_t n, float got,
                     const char *what) {
    double ref = qw_ref_dot_row(w, r, x, n);
    float reff = (float)ref;
    size_t es = qw_type_size(w->type);
    const char *row = (const char *)w->data + (size_t)r * n * es;
    double abs_sum = 0;
    for (int64_t i = 0; i < n; i++) abs_sum += fabs((double)get_w(w->type, row, i) * x[i]);
    int ok;
    if (!isfinite(reff) || !isfinite(abs_sum)) { /* an infinite or NaN term: the same class of result */
        ok = isnan(reff) ? isnan(got) : isinf(reff) ? got == reff : isfinite(got);
    } else {
        double tol = dot_tol(k, n, abs_sum), err = fabs((double)got - ref);
        ok = err <= tol;
        if (tol > 0 && err / tol > max_ratio) max_ratio = err / tol;
    }
    if (!ok)
        printf("  %s %s %s n=%lld: kernel %.9g ref %.17g (sum|wx| %.3g, bound %.3g)\n", k->name, type_name(w->type), what,
               (long long)n, got, ref, abs_sum, dot_tol(k, n, abs_sum));
    return ok;
}

/* A tile of k->tile_nr rows x k->tile_nt tokens of length n against the reference, and every output
 * equal to the 1x1 kernel's (the tile-shape invariance the thread-count invariance rests on). */
static void dot_case(const qw_cpu_kernels *k, qw_type t, int64_t n, const char *what, void (*fill)(qw_type, void *, float *, int64_t, int, int)) {
    int NR = k->tile_nr, NT = k->tile_nt;
    size_t es = qw_type_size(t);
    /* one spare byte in front: f32 rows in a safetensors file need not be aligned */
    char *wbuf = malloc((size_t)NR * n * es + 8), *wd = wbuf + (t == QW_TYPE_F32 ? 1 : 2);
    float *x = malloc((size_t)NT * n * sizeof(float)), y[16], y1;
    for (int r = 0; r < NR; r++)
        for (int tk = 0; tk < NT; tk++) fill(t, wd + (size_t)r * n * es, x + (size_t)tk * n, n, r, tk);
    qw_tensor w = {.name = "w", .data = wd, .type = t, .n_dims = 2, .shape = {NR, n}};
    k->tile[t](y, NR, wd, (size_t)n * es, x, n, NR, NT, n);
    int ok = 1, same = 1;
    for (int r = 0; r < NR; r++)
        for (int tk = 0; tk < NT; tk++) {
            ok &= check_dot(k, &w, r, x + (size_t)tk * n, n, y[tk * NR + r], what);
            k->tile[t](&y1, 1, wd + (size_t)r * n * es, 0, x + (size_t)tk * n, 0, 1, 1, n);
            same &= memcmp(&y1, &y[tk * NR + r], 4) == 0 || (isnan(y1) && isnan(y[tk * NR + r]));
        }
    CHECK(ok, "%s %s %s n=%lld: outside the dot bound", k->name, type_name(t), what, (long long)n);
    CHECK(same, "%s %s %s n=%lld: a %dx%d tile differs from the 1x1 kernel", k->name, type_name(t), what, (long long)n,
          NR, NT);
    free(wbuf);
    free(x);
}

static void fill_random(qw_type t, void *row, float *x, int64_t n, int r, int tk) {
    (void)r;
    for (int64_t i = 0; i < n; i++) {
        if (tk == 0) put_w(t, row, i, frand());
        x[i] = frand() * 4.0f;
    }
}

/* pairs w x that cancel (+a, -a) plus a small remainder: the exact sum is tiny next to sum |w x| */
static void fill_cancel(qw_type t, void *row, float *x, int64_t n, int r, int tk) {
    (void)r;
    for (int64_t i = 0; i < n; i++) {
        float a = frand() * 1000.0f;
        if (tk == 0) put_w(t, row, i, (i & 1) ? -get_w(t, row, i - 1) : a);
        x[i] = (i & 1) ? x[i - 1] : 1.0f + frand() * 1e-3f;
    }
}

/* magnitudes near the top of each type's range, products still inside f32 */
static void fill_huge(qw_type t, void *row, float *x, int64_t n, int r, int tk) {
    (void)r;
    float wmag = t == QW_TYPE_F16 ? 60000.0f : 1e18f, xmag = t == QW_TYPE_F16 ? 1e30f : 1e18f;
    for (int64_t i = 0; i < n; i++) {
        if (tk == 0) put_w(t, row, i, frand() * wmag);
        x[i] = frand() * xmag / (float)(n > 64 ? n : 64);
    }
}

/* products in or near the subnormal range, subnormal weights and subnormal activations */
static void fill_tiny(qw_type t, void *row, float *x, int64_t n, int r, int tk) {
    for (int64_t i = 0; i < n; i++) {
        if (tk == 0) {
            if (t == QW_TYPE_F16 && (i + r) % 3 == 0)
                put_bits(t, row, i, (uint32_t)(1 + irand(0x3ff)) | (irand(2) ? 0x8000u : 0)); /* f16 subnormal */
            else if (t == QW_TYPE_BF16 && (i + r) % 3 == 0)
                put_bits(t, row, i, (uint32_t)(1 + irand(0x7f)) | (irand(2) ? 0x8000u : 0)); /* bf16 subnormal */
            else if (t == QW_TYPE_F32 && (i + r) % 3 == 0)
                put_bits(t, row, i, (uint32_t)(1 + irand(0x7fffff)) | (irand(2) ? 0x80000000u : 0));
            else
                put_w(t, row, i, frand() * (t == QW_TYPE_F16 ? 1e-4f : 1e-30f));
        }
        x[i] = (i + tk) % 4 == 0 ? frand() * 1e-39f /* f32 subnormal */ : frand() * 1e-8f;
    }
}

/* infinities and NaNs in weights or activations, anywhere in the row (the tail included) */
static void fill_nonfinite(qw_type t, void *row, float *x, int64_t n, int r, int tk) {
    fill_random(t, row, x, n, r, tk);
    int64_t i = irand((int)n);
    uint32_t inf = t == QW_TYPE_F32 ? 0x7f800000u : t == QW_TYPE_BF16 ? 0x7f80u : 0x7c00u;
    uint32_t ninf = t == QW_TYPE_F32 ? 0xff800000u : t == QW_TYPE_BF16 ? 0xff80u : 0xfc00u;
    uint32_t nan = t == QW_TYPE_F32 ? 0x7fc00001u : t == QW_TYPE_BF16 ? 0x7fc1u : 0x7e01u;
    if (tk == 0) {
        switch (r % 4) {
        case 0: put_bits(t, row, i, inf); break;                              /* +inf times x */
        case 1: put_bits(t, row, i, nan); break;                              /* NaN */
        case 2: put_bits(t, row, i, inf); put_bits(t, row, (i + 1) % n, ninf); break; /* inf - inf */
        default: break;                                                       /* finite row */
        }
    }
    if (tk == 1 && n > 1) x[irand((int)n)] = INFINITY;
    if (tk == 2) x[i] = 0.0f; /* inf * 0 */
    if (tk == 3) x[irand((int)n)] = NAN;
}

static void test_dots(void) {
    const qw_cpu_kernels *const *ks = qw_cpu_kernels_available();
    static const qw_type types[] = {QW_TYPE_F32, QW_TYPE_BF16, QW_TYPE_F16};
    for (; *ks; ks++) {
        const qw_cpu_kernels *k = *ks;
        printf("dot kernels %s (%d lanes, tiles %dx%d): random lengths 1..4096, cancellation, huge, tiny and "
               "subnormal, inf/nan\n", k->name, k->lanes, k->tile_nr, k->tile_nt);
        max_ratio = 0;
        for (size_t ti = 0; ti < 3; ti++) {
            qw_type t = types[ti];
            for (int64_t n = 1; n <= 70; n++) dot_case(k, t, n, "random", fill_random);
            for (int i = 0; i < 24; i++) dot_case(k, t, 71 + irand(4096 - 71), "random", fill_random);
            dot_case(k, t, 4096, "random", fill_random);
            static const int64_t adv[] = {1, 2, 15, 16, 17, 33, 100, 257, 1000};
            for (size_t i = 0; i < sizeof(adv) / sizeof(adv[0]); i++) {
                dot_case(k, t, adv[i], "cancellation", fill_cancel);
                dot_case(k, t, adv[i], "huge", fill_huge);
                dot_case(k, t, adv[i], "tiny", fill_tiny);
                dot_case(k, t, adv[i], "inf/nan", fill_nonfinite);
            }
        }
        printf("  largest error / bound on finite rows: %.3f\n", max_ratio);
    }
}

/* ------------------------------------------------------------------ ops against ref.c */

static float *rand_vec(int64_t n, float scale) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

static qw_backend *ops_new(int n_threads, const char *kernels) {
    qw_backend *o = NULL;
    char err[256];
    qwenc_status st = qw_backend_cpu_new(n_threads, kernels, 0, &o, err, sizeof(err));
    CHECK(!st && o, "qw_backend_cpu_new(%d, %s): %s", n_threads, kernels ? kernels : "auto", err);
    return o;
}

static void test_matmul(const qw_backend *o1, const qw_backend *o3, const qw_cpu_kernels *k) {
    static const int64_t rows[] = {1, 5, 37, 300}, cols[] = {1, 7, 64, 300};
    static const int toks[] = {1, 2, 3, 5, 17};
    static const qw_type types[] = {QW_TYPE_F32, QW_TYPE_BF16, QW_TYPE_F16};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ri = 0; ri < 4; ri++)
            for (size_t ci = 0; ci < 4; ci++)
                for (size_t ni = 0; ni < 5; ni++) {
                    qw_type t = types[ti];
                    int64_t R = rows[ri], C = cols[ci];
                    int T = toks[ni];
                    size_t es = qw_type_size(t);
                    void *wd = malloc((size_t)(R * C) * es);
                    for (int64_t i = 0; i < R * C; i++) put_w(t, wd, i, frand());
                    qw_tensor w = {.name = "w", .data = wd, .type = t, .n_dims = 2, .shape = {R, C}};
                    float *x = rand_vec(T * C, 2.0f), *y1 = malloc((size_t)(T * R) * 4), *y3 = malloc((size_t)(T * R) * 4);
                    o1->matmul(o1, y1, &w, x, T);
                    o3->matmul(o3, y3, &w, x, T);
                    int ok = 1;
                    for (int tk = 0; tk < T; tk++)
                        for (int64_t r = 0; r < R; r++) ok &= check_dot(k, &w, r, x + tk * C, C, y1[tk * R + r], "matmul");
                    CHECK(ok, "matmul %s %s [%lld x %lld] x %d tokens: outside the dot bound", k->name, type_name(t),
                          (long long)R, (long long)C, T);
                    CHECK(!memcmp(y1, y3, (size_t)(T * R) * 4), "matmul %s %s [%lld x %lld] x %d: 1 and 3 threads differ",
                          k->name, type_name(t), (long long)R, (long long)C, T);
                    free(wd);
                    free(x);
                    free(y1);
                    free(y3);
                }
}

/* The ops the CPU table runs through ref.c's code on ranges: bit-identical, small and large (threaded). */
/* The distance in ulps of two finite floats (0 for +0 and -0) */
static int64_t ulp_dist(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t la = ia < 0 ? -(int64_t)(ia & 0x7FFFFFFF) : ia, lb = ib < 0 ? -(int64_t)(ib & 0x7FFFFFFF) : ib;
    return la > lb ? la - lb : lb - la;
}

/* Inputs for e^x and the gates: the edges of e^x's range, infinities, NaN, zeros, subnormals, every
 * exponent from 2^-30 to 2^8 of either sign, random floats on [-120, 120]. Returns how many are edges. */
static int gate_inputs(float *x, int n) {
    static const float edge[] = {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, -1e-38f, 1e-7f, -1e-7f, 0.5f, -0.5f,
                                 0.34657359f, -0.34657359f, 16.635532f, -16.635532f, 87.33654f, -87.33654f,
                                 88.72283f, -88.72283f, 88.7229f, -88.7229f, 89.0f, -89.0f, 103.27893f,
                                 -103.27893f, 103.97208f, -103.97208f, 104.0f, -104.0f, 110.0f, -110.0f, 1e30f,
                                 -1e30f, 3.4028235e38f, -3.4028235e38f, INFINITY, -INFINITY, NAN, -NAN};
    int ne = (int)(sizeof(edge) / sizeof(edge[0]));
    for (int i = 0; i < n; i++) {
        if (i < ne)
            x[i] = edge[i];
        else if (i < n / 2)
            x[i] = ldexpf(1.0f + 0.5f * (frand() + 1.0f), irand(39) - 30) * (irand(2) ? 1.0f : -1.0f);
        else
            x[i] = 120.0f * frand();
    }
    return ne;
}

/* expd.h's e^x against libm's expf and against e^x in double (see the top comment) */
static void test_expd(void) {
    enum { N = 1 << 18 };
    float *x = malloc(N * 4);
    int ne = gate_inputs(x, N), n_diff = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        float e = qw_expd(x[i]), l = expf(x[i]);
        if (x[i] != x[i]) {
            bad += e == e;
            continue;
        }
        if (isinf(l) || l == 0 || isinf(e) || e == 0) { /* past the range: the same 0 or infinity */
            bad += e != l;
            continue;
        }
        n_diff += e != l;
        double d = exp((double)x[i]), ulp = ldexp(1.0, ilogb(d) < -126 ? -149 : ilogb(d) - 23);
        if (ulp_dist(e, l) > 1 || fabs(e - d) > 0.5 * ulp + 1e-13 * d) {
            if (bad++ < 5) printf("  qw_expd(%a) = %a, expf %a, exp %a\n", (double)x[i], (double)e, (double)l, d);
        }
    }
    CHECK(!bad && n_diff * 1000 <= N, "expd.h e^x on %d inputs (%d edges): %d outside the bounds, %d differ from expf",
          N, ne, bad, n_diff);
    free(x);
}

/* The table's axpy and mul against the reference, bit for bit: on values whose product and sum both round
 * (a fused multiply-add would give other bits on most of them), infinities, NaN, subnormals and zeros of
 * both signs, and every length up to 40 with the element past the end left alone. */
static void test_axpy_mul(const qw_cpu_kernels *k) {
    if (!k->axpy || !k->mul) return;
    const qw_backend *R = qw_backend_ref();
    enum { N = 4099 };
    float *x = rand_vec(N, 3.0f), *y0 = rand_vec(N, 7.0f), *a = malloc(N * 4), *b = malloc(N * 4);
    static const float edge[] = {INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 0.0f, -0.0f, 3e38f, -3e38f, 1e-30f};
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++) {
        x[7 * i] = edge[i];
        y0[11 * i + 3] = edge[(i + 3) % 10];
    }
    const float scales[] = {0.3f, -1.7f, 1e-20f, 3e20f};
    int fused = 0;
    for (int si = 0; si < 4; si++) {
        memcpy(a, y0, N * 4);
        memcpy(b, y0, N * 4);
        R->axpy(R, a, x, scales[si], N);
        k->axpy(b, x, scales[si], N);
        CHECK(!memcmp(a, b, N * 4), "%s axpy (s = %g) differs from the reference", k->name, scales[si]);
        for (int i = 0; i < N; i++) fused += a[i] != fmaf(x[i], scales[si], y0[i]) && a[i] == a[i];
    }
    CHECK(fused > 100, "%s axpy: only %d results would differ with a fused multiply-add (weak inputs)", k->name, fused);
    R->mul(R, a, x, y0, N);
    k->mul(b, x, y0, N);
    CHECK(!memcmp(a, b, N * 4), "%s mul differs from the reference", k->name);
    for (int n = 1; n <= 40; n++) {
        memcpy(a, y0, (size_t)(n + 1) * 4);
        memcpy(b, y0, (size_t)(n + 1) * 4);
        R->axpy(R, a, x, 0.7f, n);
        k->axpy(b, x, 0.7f, n);
        CHECK(!memcmp(a, b, (size_t)n * 4) && !memcmp(b + n, y0 + n, 4), "%s axpy tail %d", k->name, n);
        memcpy(b, y0, (size_t)(n + 1) * 4);
        R->mul(R, a, x, y0, n);
        k->mul(b, x, y0, n);
        CHECK(!memcmp(a, b, (size_t)n * 4) && !memcmp(b + n, y0 + n, 4), "%s mul tail %d", k->name, n);
    }
    free(x);
    free(y0);
    free(a);
    free(b);
}

/* A table's sigmoid and silu against the reference's, bit for bit, over gate_inputs and every length of
 * tail (nothing past n touched). */
static void test_gates(const qw_cpu_kernels *k) {
    if (!k->sigmoid || !k->silu) return;
    const qw_backend *R = qw_backend_ref();
    enum { N = 1 << 16 };
    float *x = malloc(N * 4), *a = malloc(N * 4), *b = malloc(N * 4);
    int ne = gate_inputs(x, N);
    for (int g = 0; g < 2; g++) {
        const char *name = g ? "sigmoid" : "silu";
        memcpy(a, x, N * 4);
        memcpy(b, x, N * 4);
        (g ? R->sigmoid : R->silu)(R, a, N);
        (g ? k->sigmoid : k->silu)(b, N);
        int nd = 0;
        for (int i = 0; i < N; i++)
            if (memcmp(a + i, b + i, 4) && nd++ < 3)
                printf("  %s %s(%a) = %a, reference %a\n", k->name, name, (double)x[i], (double)b[i], (double)a[i]);
        CHECK(!nd, "%s %s: %d of %d (%d edges) differ from the reference", k->name, name, nd, N, ne);
        for (int n = 1; n <= 40; n++) {
            memcpy(a, x + ne, (size_t)(n + 1) * 4);
            memcpy(b, x + ne, (size_t)(n + 1) * 4);
            (g ? R->sigmoid : R->silu)(R, a, n);
            (g ? k->sigmoid : k->silu)(b, n);
            CHECK(!memcmp(a, b, (size_t)n * 4) && !memcmp(b + n, x + ne + n, 4), "%s %s tail %d", k->name, name, n);
        }
    }
    free(x);
    free(a);
    free(b);
}

static void test_range_ops(const qw_backend *o3) {
    const qw_backend *R = qw_backend_ref();
    static const int sizes[][2] = {{1, 16}, {3, 7}, {512, 96}, {1024, 128}}; /* rows, dim */
    for (size_t si = 0; si < 4; si++) {
        int nr = sizes[si][0], dim = sizes[si][1];
        int64_t n = (int64_t)nr * dim;
        float *x = rand_vec(n, 3.0f), *w = rand_vec(dim, 1.0f), *a = malloc((size_t)(n + 3 * dim) * 4);
        float *b = malloc((size_t)(n + 3 * dim) * 4);
        for (int zc = 0; zc < 2; zc++) {
            R->rms_norm(R, a, x, zc ? w : NULL, nr, dim, 1e-6f, zc);
            o3->rms_norm(o3, b, x, zc ? w : NULL, nr, dim, 1e-6f, zc);
            CHECK(!memcmp(a, b, (size_t)n * 4), "rms_norm %dx%d zc %d", nr, dim, zc);
        }
        memcpy(a, x, (size_t)n * 4);
        memcpy(b, x, (size_t)n * 4);
        R->l2_norm(R, a, nr, dim, 1e-6f, 0.5f, nr / 2);
        o3->l2_norm(o3, b, nr, dim, 1e-6f, 0.5f, nr / 2);
        CHECK(!memcmp(a, b, (size_t)n * 4), "l2_norm %dx%d", nr, dim);
        memcpy(b, x, (size_t)n * 4); /* the scaled rows and the rest: the bits of two calls */
        R->l2_norm(R, b, nr / 2, dim, 1e-6f, 0.5f, nr / 2);
        R->l2_norm(R, b + (int64_t)(nr / 2) * dim, nr - nr / 2, dim, 1e-6f, 1.0f, 0);
        CHECK(!memcmp(a, b, (size_t)n * 4), "l2_norm %dx%d: not the bits of two calls", nr, dim);
        /* rope: nr tokens of dim floats, heads of 16 with 8 rotated dims */
        float *cs = rand_vec((int64_t)nr * 8, 1.0f);
        memcpy(a, x, (size_t)n * 4);
        memcpy(b, x, (size_t)n * 4);
        R->rope(R, a, nr, dim, dim / 16, 16, 8, cs);
        o3->rope(o3, b, nr, dim, dim / 16, 16, 8, cs);
        CHECK(!memcmp(a, b, (size_t)n * 4), "rope %dx%d", nr, dim);
        /* conv: k = 4, dilation 2, inputs with 6 history rows */
        if (nr > 6) {
            int T = nr - 6;
            float *cw = rand_vec((int64_t)dim * 4, 1.0f);
            R->conv1d_dw(R, a, x, cw, T, dim, 4, 2, 0);
            o3->conv1d_dw(o3, b, x, cw, T, dim, 4, 2, 0);
            CHECK(!memcmp(a, b, (size_t)T * dim * 4), "conv1d_dw %dx%d", T, dim);
            /* then silu: the bits of each backend's own silu after its convolution */
            const qw_backend *bs[2] = {R, o3};
            for (int bi = 0; bi < 2; bi++) {
                bs[bi]->conv1d_dw(bs[bi], a, x, cw, T, dim, 4, 2, 0);
                bs[bi]->silu(bs[bi], a, (int64_t)T * dim);
                bs[bi]->conv1d_dw(bs[bi], b, x, cw, T, dim, 4, 2, 1);
                CHECK(!memcmp(a, b, (size_t)T * dim * 4), "conv1d_dw then silu %dx%d (%s)", T, dim, bi ? "cpu" : "ref");
            }
            free(cw);
        }
        if (si == 0) /* decode's shapes: a token or a few over many channels (split by channel blocks), a partial
                      * last block, dilations 1 and 3 */
            for (int ci = 0; ci < 4; ci++) {
                int T = ci % 2 ? 3 : 1, ch = ci < 2 ? 8200 : 12288, dil = ci < 2 ? 1 : 3;
                int64_t nx = (int64_t)(T + 3 * dil) * ch;
                float *cx = rand_vec(nx, 2.0f), *cw = rand_vec((int64_t)ch * 4, 1.0f);
                float *ca = malloc((size_t)T * ch * 4), *cb = malloc((size_t)T * ch * 4);
                R->conv1d_dw(R, ca, cx, cw, T, ch, 4, dil, 0);
                o3->conv1d_dw(o3, cb, cx, cw, T, ch, 4, dil, 0);
                CHECK(!memcmp(ca, cb, (size_t)T * ch * 4), "conv1d_dw %dx%d dilation %d", T, ch, dil);
                free(cx);
                free(cw);
                free(ca);
                free(cb);
            }
        memcpy(a, x, (size_t)n * 4);
        memcpy(b, x, (size_t)n * 4);
        R->silu(R, a, n);
        o3->silu(o3, b, n);
        CHECK(!memcmp(a, b, (size_t)n * 4), "silu %lld", (long long)n);
        memcpy(a, x, (size_t)n * 4);
        memcpy(b, x, (size_t)n * 4);
        R->sigmoid(R, a, n);
        o3->sigmoid(o3, b, n);
        CHECK(!memcmp(a, b, (size_t)n * 4), "sigmoid %lld", (long long)n);
        float *y = rand_vec(n, 1.0f);
        R->mul(R, a, x, y, n);
        o3->mul(o3, b, x, y, n);
        CHECK(!memcmp(a, b, (size_t)n * 4), "mul %lld", (long long)n);
        memcpy(a, y, (size_t)n * 4);
        memcpy(b, y, (size_t)n * 4);
        R->axpy(R, a, x, 0.3f, n);
        o3->axpy(o3, b, x, 0.3f, n);
        CHECK(!memcmp(a, b, (size_t)n * 4), "axpy %lld", (long long)n);
        /* get_rows from a bf16 table of nr rows */
        uint16_t *tab = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) tab[i] = qw_f32_to_bf16(x[i]);
        qw_tensor tt = {.name = "tab", .data = tab, .type = QW_TYPE_BF16, .n_dims = 2, .shape = {nr, dim}};
        int32_t ids[3] = {0, nr - 1, nr / 2};
        R->get_rows(R, a, &tt, ids, 3);
        o3->get_rows(o3, b, &tt, ids, 3);
        CHECK(!memcmp(a, b, (size_t)3 * dim * 4), "get_rows %dx%d", nr, dim);
        free(tab);
        free(y);
        free(cs);
        free(x);
        free(w);
        free(a);
        free(b);
    }
}

static void test_attention(const qw_backend *o1, const qw_backend *o3, const qw_cpu_kernels *k) {
    const qw_backend *R = qw_backend_ref();
    static const struct {
        int n_tok, pos0, nh, nkv, hd, sparse;
        float qscale;
    } cases[] = {
        {1, 0, 2, 1, 16, 0, 1.0f},  {1, 200, 4, 2, 64, 0, 1.0f}, {7, 60, 4, 4, 80, 0, 1.0f},
        {5, 130, 6, 2, 32, 1, 1.0f}, {3, 70, 2, 1, 64, 0, 12.0f}, /* sharp softmax: scores in the hundreds */
        {33, 0, 2, 2, 16, 0, 1.0f}, {2, 300, 2, 1, 16, 1, 30.0f},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int T = cases[ci].n_tok, p0 = cases[ci].pos0, nh = cases[ci].nh, nkv = cases[ci].nkv, hd = cases[ci].hd;
        int n_ctx = p0 + T;
        float *q = rand_vec((int64_t)T * nh * hd, cases[ci].qscale);
        float *kc = rand_vec((int64_t)n_ctx * nkv * hd, 1.0f), *vc = rand_vec((int64_t)n_ctx * nkv * hd, 2.0f);
        /* values whose mean changes from one block of keys to the next, so a misweighted block shows */
        for (int64_t i = 0; i < (int64_t)n_ctx * nkv * hd; i++) vc[i] += (i / (nkv * hd) / 40) % 2 ? 1.5f : -1.5f;
        /* sparse: every other key and the last one (ascending) */
        int32_t *sel = NULL, *off = NULL;
        if (cases[ci].sparse) {
            sel = malloc((size_t)T * n_ctx * sizeof(int32_t));
            off = malloc((size_t)(T + 1) * sizeof(int32_t));
            int m = 0;
            for (int t = 0; t < T; t++) {
                off[t] = m;
                for (int i = 0; i <= p0 + t; i++)
                    if (i % 2 == 0 || i == p0 + t) sel[m++] = i;
            }
            off[T] = m;
        }
        float scale = 1.0f / sqrtf((float)hd);
        float *a = malloc((size_t)T * nh * hd * 4), *b = malloc((size_t)T * nh * hd * 4), *c = malloc((size_t)T * nh * hd * 4);
        void *work = malloc(R->attention_work(R, n_ctx, hd));
        qw_step step = {.pos0 = p0};
        R->attention(R, a, q, nh * hd, kc, vc, T, nh, nkv, hd, scale, sel, off, work, &step);
        o1->attention(o1, b, q, nh * hd, kc, vc, T, nh, nkv, hd, scale, sel, off, work, &step);
        o3->attention(o3, c, q, nh * hd, kc, vc, T, nh, nkv, hd, scale, sel, off, work, &step);
        /* the bound: the largest score error d over every query and key */
        int lg = 0;
        while ((1 << lg) < k->lanes) lg++;
        double d = 0, vmax = 0;
        for (int64_t i = 0; i < (int64_t)n_ctx * nkv * hd; i++) vmax = fmax(vmax, fabs(vc[i]));
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < n_ctx; i++) {
                    const float *qh = q + ((int64_t)t * nh + h) * hd, *kh = kc + ((int64_t)i * nkv + h / (nh / nkv)) * hd;
                    double s = 0, abs_s = 0;
                    for (int e = 0; e < hd; e++) {
                        s += (double)qh[e] * kh[e];
                        abs_s += fabs((double)qh[e] * kh[e]);
                    }
                    double di = ((hd + k->lanes - 1) / k->lanes + lg + 3) * U24 * abs_s * scale + U24 * fabs(s) * scale;
                    d = fmax(d, di);
                }
        double tol = (4 * d + 80 * U24) * vmax + 1.1754944e-38, worst = 0;
        for (int64_t i = 0; i < (int64_t)T * nh * hd; i++) worst = fmax(worst, fabs((double)b[i] - a[i]));
        CHECK(worst <= tol, "attention case %zu (%s): max error %.3g > bound %.3g", ci, k->name, worst, tol);
        CHECK(!memcmp(b, c, (size_t)T * nh * hd * 4), "attention case %zu: 1 and 3 threads differ", ci);
        free(q);
        free(kc);
        free(vc);
        free(sel);
        free(off);
        free(a);
        free(b);
        free(c);
        free(work);
    }
}

static void test_delta_rule(const qw_backend *o1, const qw_backend *o3) {
    const qw_backend *R = qw_backend_ref();
    static const int cases[][5] = {{1, 1, 1, 16, 16}, {4, 2, 4, 32, 40}, {9, 2, 2, 64, 64}, {3, 1, 3, 24, 17},
                                   {2, 4, 8, 64, 128}}; /* n_tok, hk, hv, dk, dv */
    const size_t nc = sizeof(cases) / sizeof(cases[0]);
    for (size_t ci = 0; ci < 2 * nc; ci++) { /* the grouped value heads, then llama.cpp's tiled order */
        const int tiled = ci >= nc, *cs = cases[ci % nc];
        int T = cs[0], hk = cs[1], hv = cs[2], dk = cs[3], dv = cs[4];
        int64_t ns = (int64_t)hv * dk * dv, no = (int64_t)T * hv * dv;
        float *q = rand_vec((int64_t)T * hk * dk, 1.0f), *k = rand_vec((int64_t)T * hk * dk, 1.0f);
        for (int i = 0; i < T * hk; i++) {
            test_l2n(q + (int64_t)i * dk, dk, 1.0f / sqrtf((float)dk));
            test_l2n(k + (int64_t)i * dk, dk, 1.0f);
        }
        float *v = rand_vec(no, 1.0f), *g = rand_vec((int64_t)T * hv, 1.0f), *beta = rand_vec((int64_t)T * hv, 1.0f);
        for (int i = 0; i < T * hv; i++) {
            g[i] = -fabsf(g[i]) * 0.5f;
            beta[i] = 0.5f + 0.5f * fabsf(beta[i]);
        }
        float *s0 = rand_vec(ns, 0.5f), *sa = malloc((size_t)ns * 4), *sb = malloc((size_t)ns * 4), *sc = malloc((size_t)ns * 4);
        float *oa = malloc((size_t)no * 4), *ob = malloc((size_t)no * 4), *oc = malloc((size_t)no * 4);
        memcpy(sa, s0, (size_t)ns * 4);
        memcpy(sb, s0, (size_t)ns * 4);
        memcpy(sc, s0, (size_t)ns * 4);
        R->delta_rule(R, oa, sa, q, k, v, g, beta, T, hk, hv, dk, dv, tiled);
        o1->delta_rule(o1, ob, sb, q, k, v, g, beta, T, hk, hv, dk, dv, tiled);
        o3->delta_rule(o3, oc, sc, q, k, v, g, beta, T, hk, hv, dk, dv, tiled);
        if (tiled) { /* the reference in tiled order is the grouped one with the value heads moved: value head
                      * i*hk + g tiled is head g*r + i grouped */
            int r = hv / hk;
            float *vg = malloc((size_t)no * 4), *gg = malloc((size_t)T * hv * 4), *bg = malloc((size_t)T * hv * 4);
            float *sg = malloc((size_t)ns * 4), *og = malloc((size_t)no * 4);
            for (int p = 0; p < hv; p++) {
                int j = (p % hk) * r + p / hk;
                for (int t = 0; t < T; t++) {
                    memcpy(vg + ((int64_t)t * hv + j) * dv, v + ((int64_t)t * hv + p) * dv, (size_t)dv * 4);
                    gg[t * hv + j] = g[t * hv + p], bg[t * hv + j] = beta[t * hv + p];
                }
                memcpy(sg + (int64_t)j * dk * dv, s0 + (int64_t)p * dk * dv, (size_t)dk * dv * 4);
            }
            R->delta_rule(R, og, sg, q, k, vg, gg, bg, T, hk, hv, dk, dv, 0);
            int ok = 1;
            for (int p = 0; p < hv; p++) {
                int j = (p % hk) * r + p / hk;
                for (int t = 0; t < T; t++)
                    ok &= !memcmp(og + ((int64_t)t * hv + j) * dv, oa + ((int64_t)t * hv + p) * dv, (size_t)dv * 4);
                ok &= !memcmp(sg + (int64_t)j * dk * dv, sa + (int64_t)p * dk * dv, (size_t)dk * dv * 4);
            }
            CHECK(ok, "delta_rule case %zu: the tiled order is not the grouped one with its heads moved", ci);
            free(vg), free(gg), free(bg), free(sg), free(og);
        }
        double B = 0, n1 = 1, worst = 0;
        for (int64_t i = 0; i < ns; i++) B = fmax(B, fmax(fabs(s0[i]), fabs(sa[i])));
        for (int64_t i = 0; i < no; i++) B = fmax(B, fmax(fabs(v[i]), fabs(oa[i])));
        for (int i = 0; i < T * hk; i++) {
            double aq = 0, ak = 0;
            for (int e = 0; e < dk; e++) {
                aq += fabs(q[(int64_t)i * dk + e]);
                ak += fabs(k[(int64_t)i * dk + e]);
            }
            n1 = fmax(n1, fmax(aq, ak));
        }
        double tol = 4.0 * T * (dk + 8) * U24 * B * n1;
        for (int64_t i = 0; i < no; i++) worst = fmax(worst, fabs((double)ob[i] - oa[i]));
        for (int64_t i = 0; i < ns; i++) worst = fmax(worst, fabs((double)sb[i] - sa[i]));
        CHECK(worst <= tol, "delta_rule case %zu: max error %.3g > bound %.3g", ci, worst, tol);
        CHECK(!memcmp(ob, oc, (size_t)no * 4) && !memcmp(sb, sc, (size_t)ns * 4), "delta_rule case %zu: 1 and 3 threads differ",
              ci);
        free(q);
        free(k);
        free(v);
        free(g);
        free(beta);
        free(s0);
        free(sa);
        free(sb);
        free(sc);
        free(oa);
        free(ob);
        free(oc);
    }
}

/* The chunked form (delta_chunk.c) against the reference token-by-token rule, per kernel variant, on random
 * and adversarial decays and betas; through the op table it must give the same bits for 1 and 3 threads. */
static void test_delta_chunk(const qw_backend *o1, const qw_backend *o3, const qw_cpu_kernels *ks) {
    const qw_backend *R = qw_backend_ref();
    /* g and beta: test_dr_gates' modes (test_check.h) */
    static const struct {
        int T, hk, hv, dk, dv, gm, bm, zero_state;
    } cases[] = {
        {1, 1, 1, 16, 16, 0, 0, 0},     {5, 1, 2, 16, 24, 3, 0, 0},      {63, 2, 4, 18, 17, 1, 2, 0},
        {64, 2, 2, 32, 32, 0, 0, 0},    {65, 1, 3, 24, 40, 3, 3, 0},     {77, 1, 1, 48, 32, 0, 0, 1},
        {96, 2, 2, 32, 48, 0, 1, 0},    {128, 1, 2, 128, 128, 4, 3, 0},  {130, 2, 6, 64, 128, 2, 0, 0},
        {200, 1, 2, 128, 128, 1, 2, 0},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int T = cases[ci].T, hk = cases[ci].hk, hv = cases[ci].hv, dk = cases[ci].dk, dv = cases[ci].dv;
        int64_t ns = (int64_t)hv * dk * dv, no = (int64_t)T * hv * dv;
        float *q = rand_vec((int64_t)T * hk * dk, 1.0f), *k = rand_vec((int64_t)T * hk * dk, 1.0f);
        for (int i = 0; i < T * hk; i++) {
            test_l2n(q + (int64_t)i * dk, dk, 1.0f / sqrtf((float)dk));
            test_l2n(k + (int64_t)i * dk, dk, 1.0f);
        }
        float *v = rand_vec(no, 1.0f), *g = malloc((size_t)T * hv * 4), *beta = malloc((size_t)T * hv * 4);
        test_dr_gates(g, beta, T, hv, cases[ci].gm, cases[ci].bm, frand);
        float *s0 = rand_vec(ns, cases[ci].zero_state ? 0.0f : 0.5f);
        float *sa = malloc((size_t)ns * 4), *sb = malloc((size_t)ns * 4);
        float *oa = malloc((size_t)no * 4), *ob = malloc((size_t)no * 4);
        memcpy(sa, s0, (size_t)ns * 4);
        memcpy(sb, s0, (size_t)ns * 4);
        const int tiled = (int)(ci % 2); /* value heads grouped, or in llama.cpp's tiled order */
        R->delta_rule(R, oa, sa, q, k, v, g, beta, T, hk, hv, dk, dv, tiled);
        CHECK(qw_delta_chunk_heads(ks, ob, sb, q, k, v, g, beta, T, hk, hv, dk, dv, tiled, 0, hv), "chunked: scratch");
        double B = 0, worst = 0;
        for (int64_t i = 0; i < ns; i++) B = fmax(B, fmax(fabs(s0[i]), fabs(sa[i])));
        for (int64_t i = 0; i < no; i++) B = fmax(B, fmax(fabs(v[i]), fabs(oa[i])));
        for (int64_t i = 0; i < no; i++) worst = fmax(worst, fabs((double)ob[i] - oa[i]));
        for (int64_t i = 0; i < ns; i++) worst = fmax(worst, fabs((double)sb[i] - sa[i]));
        double tol = DR_CHUNK_TOL * ((T + QW_DELTA_CHUNK - 1) / QW_DELTA_CHUNK) * B;
        printf("  %s T %3d hk %d hv %d dk %3d dv %3d g %d beta %d: max error %.2e of %.2e (%.1f%% of the bound)\n",
               ks->name, T, hk, hv, dk, dv, cases[ci].gm, cases[ci].bm, worst, B, 100 * worst / tol);
        CHECK(worst <= tol, "chunked delta rule %s case %zu: max error %.3g > bound %.3g", ks->name, ci, worst, tol);
        if (T >= QW_DELTA_CHUNK_MIN_TOK) { /* the op table takes the chunked path: same bits, any thread count */
            for (int nt = 0; nt < 2; nt++) {
                const qw_backend *o = nt ? o3 : o1;
                float *oc = malloc((size_t)no * 4), *sc = malloc((size_t)ns * 4);
                memcpy(sc, s0, (size_t)ns * 4);
                o->delta_rule(o, oc, sc, q, k, v, g, beta, T, hk, hv, dk, dv, tiled);
                CHECK(!memcmp(ob, oc, (size_t)no * 4) && !memcmp(sb, sc, (size_t)ns * 4),
                      "chunked delta rule %s case %zu: %d thread(s) through the op table differ", ks->name, ci,
                      nt ? 3 : 1);
                free(oc);
                free(sc);
            }
        }
        free(q);
        free(k);
        free(v);
        free(g);
        free(beta);
        free(s0);
        free(sa);
        free(sb);
        free(oa);
        free(ob);
    }
}

/* QSA selection through the op table (threads, the variant's block scores) against ref.c: the same positions
 * and the same scores, for index head dims 32, 128 and 40 (a tail of lanes) and positions across block counts. */
static void test_qsa(const qw_backend *o, const char *name) {
    const qw_backend *r = qw_backend_ref();
    int bad = 0;
    for (int trial = 0; trial < 24; trial++) {
        int ihd = trial % 3 == 0 ? 32 : trial % 3 == 1 ? 128 : 40, nh = 1 + trial % 4, R = 4, topk = 8;
        int pos0 = 37 + trial * 211, T = 1 + trial % 3, nb = (pos0 + T) / R + 1;
        float *blk = malloc(sizeof(float) * (size_t)nb * ihd), *q = malloc(sizeof(float) * (size_t)T * (nh + 1) * ihd);
        uint64_t s = 77 + (uint64_t)trial;
        for (int i = 0; i < nb * ihd; i++) blk[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
        for (int i = 0; i < T * (nh + 1) * ihd; i++) q[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / (1 << 24) - 0.5f;
        size_t ws = r->qsa_select_work(r, pos0 + T, R, topk);
        float *w1 = malloc(ws), *w2 = malloc(ws);
        size_t ns = (size_t)T * (topk + 1) * R + 16;
        int32_t *s1 = malloc(ns * 4), *s2 = malloc(ns * 4), o1[4], o2[4];
        qw_step st = {.pos0 = pos0};
        r->qsa_select(r, s1, o1, q, (int64_t)(nh + 1) * ihd, blk, T, nh, ihd, R, topk, w1, &st);
        o->qsa_select(o, s2, o2, q, (int64_t)(nh + 1) * ihd, blk, T, nh, ihd, R, topk, w2, &st);
        bad += memcmp(o1, o2, sizeof(int32_t) * (size_t)(T + 1)) || memcmp(s1, s2, sizeof(int32_t) * (size_t)o1[T]) ||
               memcmp(w1, w2, sizeof(float) * (size_t)((pos0 + T) / R)); /* the last query's scores */
        free(blk), free(q), free(w1), free(w2), free(s1), free(s2);
    }
    CHECK(bad == 0, "qsa_select %s: %d of 24 cases differ from ref.c", name, bad);
}

/* topk against a selection by rounds under qw_topk_better: random rows, rows of few distinct values (ties: the
 * lower index first), -inf and NaN (below every number, the lower index first among them), k from 1 to n */
static void test_topk(const qw_backend *o, const char *name) {
    enum { N = 3000, R = 3 };
    static float x[R * N]; /* row r at r * n */
    static int32_t ids[R * QW_TOPK_MAX], want[QW_TOPK_MAX]; /* row r at r * k */
    static float vals[R * QW_TOPK_MAX];
    static unsigned char taken[N];
    uint64_t r = 4242;
    int bad = 0;
    for (int trial = 0; trial < 12; trial++) {
        int n = trial < 10 ? N : 70, k = trial == 11 ? 64 : 1 + (trial * 7) % QW_TOPK_MAX;
        if (k > n) k = n;
        for (int row = 0; row < R; row++)
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                float v = trial % 3 == 0 ? (float)((r >> 33) % 9) : (float)((double)(r >> 11) / 9007199254740992.0 - 0.5);
                if (trial % 4 == 1 && i % 97 == 3) v = -INFINITY;
                if (trial % 4 == 2 && i % 89 == 5) v = NAN;
                x[row * n + i] = v;
            }
        o->topk(o, ids, vals, x, R, n, k, NULL);
        for (int row = 0; row < R; row++) {
            memset(taken, 0, sizeof(taken));
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int i = 0; i < n; i++)
                    if (!taken[i] && (best < 0 || qw_topk_better(x[row * n + i], i, x[row * n + best], best))) best = i;
                taken[best] = 1;
                want[j] = best;
            }
            for (int j = 0; j < k; j++)
                bad += ids[row * k + j] != want[j] || memcmp(&vals[row * k + j], &x[row * n + want[j]], sizeof(float)) != 0;
        }
    }
    CHECK(bad == 0, "topk %s: %d ids or values differ from the selection by rounds", name, bad);
}

static void test_ops(void) {
    for (const qw_cpu_kernels *const *ks = qw_cpu_kernels_available(); *ks; ks++) {
        printf("ops %s vs ref.c: matmul, attention, delta rule (1 and 3 threads), range ops, sigmoid/silu\n",
               (*ks)->name);
        qw_backend *o1 = ops_new(1, (*ks)->name), *o3 = ops_new(3, (*ks)->name);
        if (!o1 || !o3) continue;
        CHECK(qw_backend_cpu_n_threads(o1) == 1 && qw_backend_cpu_n_threads(o3) == 3, "thread counts");
        CHECK(!strcmp(o1->name, (*ks)->name), "table name %s", o1->name);
        test_matmul(o1, o3, *ks);
        test_attention(o1, o3, *ks);
        test_delta_rule(o1, o3);
        test_delta_chunk(o1, o3, *ks);
        test_range_ops(o3);
        test_gates(*ks);
        test_axpy_mul(*ks);
        test_qsa(o3, (*ks)->name);
        { /* argmax: the lowest index among equal largest values, per row */
            float x[3][6] = {{1, 3, 2, 3, -1, 0}, {-5, -4, -4, -9, -4, -6}, {0, 0, 0, 0, 0, 7}};
            int32_t out[3] = {-1, -1, -1};
            o3->argmax(o3, out, &x[0][0], 3, 6);
            CHECK(out[0] == 1 && out[1] == 1 && out[2] == 5, "argmax %s: %d %d %d (want 1 1 5)", (*ks)->name, out[0],
                  out[1], out[2]);
        }
        test_topk(o3, (*ks)->name);
        o1->release(o1);
        o3->release(o3);
    }
    char err[256] = "";
    qw_backend *o = NULL;
    CHECK(qw_backend_cpu_new(1, "avx9", 0, &o, err, sizeof(err)) == QWENC_ERR_UNSUPPORTED && !o && strstr(err, "avx9") &&
              strstr(err, "available: "),
          "unknown kernels: %s", err);
    CHECK(qw_backend_cpu_new(2, "ref", 0, &o, err, sizeof(err)) == QWENC_OK && o && !strcmp(o->name, "ref") &&
              qw_backend_cpu_n_threads(o) == 1,
          "ref kernels");
    if (o) o->release(o);
    CHECK(qw_backend_cpu_default() == qw_backend_cpu_default() && !strcmp(qw_backend_cpu_default()->name, qw_cpu_kernels_available()[0]->name),
          "qw_backend_cpu_default() is the best variant");
}

/* ------------------------------------------------------------------ whole models */

static float *model_logits(const char *dir, int n_threads, const char *kernels, const int32_t *ids, int n, int batch,
                           int *V) {
    char err[1024];
    qwenc_model *m = NULL;
    qwenc_model_params mp = qwenc_model_default_params();
    mp.n_threads = n_threads;
    mp.kernels = kernels;
    if (qwenc_model_load_params(dir, &mp, &m, err, sizeof(err))) {
        CHECK(0, "%s: %s", dir, err);
        return NULL;
    }
    CHECK(qwenc_model_n_threads(m) == (kernels && !strcmp(kernels, "ref") ? 1 : n_threads) &&
              !strcmp(qwenc_model_kernels(m), kernels),
          "%s: model reports %d threads, kernels %s", dir, qwenc_model_n_threads(m), qwenc_model_kernels(m));
    *V = qwenc_model_n_vocab(m);
    qwenc_session_params sp = {.n_ctx = n, .n_batch = batch};
    qwenc_session *s = NULL;
    float *out = malloc((size_t)n * *V * sizeof(float));
    if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) CHECK(0, "%s: %s", dir, err);
    for (int i = 0; s && i < n; i += batch) {
        int c = n - i < batch ? n - i : batch;
        if (qwenc_session_forward(s, ids + i, c, out + (size_t)i * *V, 1, err, sizeof(err))) CHECK(0, "%s: %s", dir, err);
    }
    qwenc_session_free(s);
    qwenc_model_free(m);
    return out;
}

static int32_t *fixture_tokens(const char *dir, int *n) {
    char path[512], *txt = NULL, err[256];
    snprintf(path, sizeof(path), "%s/tokens.txt", dir);
    *n = 0;
    if (qw_read_file(path, &txt, NULL, err, sizeof(err))) return NULL;
    int32_t *ids = malloc(4096 * sizeof(int32_t));
    for (char *p = txt; *p && *n < 4096;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        ids[(*n)++] = (int32_t)v;
        p = end;
    }
    free(txt);
    return ids;
}

static void test_models(void) {
    printf("models: every variant within the fixture bar; 1 and 3 threads bit-identical\n");
    static const char *fixtures[] = {"tests/fixtures/llama", "tests/fixtures/qwen3", "tests/fixtures/qwen4_exp",
                                     "tests/fixtures/qwen3_next"}; /* f32, f16, bf16 weights; every block */
    for (size_t fi = 0; fi < sizeof(fixtures) / sizeof(fixtures[0]); fi++) {
        int n = 0, V = 0;
        int32_t *ids = fixture_tokens(fixtures[fi], &n);
        CHECK(ids && n > 0, "%s: tokens.txt", fixtures[fi]);
        if (!ids) continue;
        char path[512], *ref = NULL, err[256];
        size_t len = 0;
        snprintf(path, sizeof(path), "%s/logits_full.f32", fixtures[fi]);
        CHECK(!qw_read_file(path, &ref, &len, err, sizeof(err)), "%s", err);
        for (const qw_cpu_kernels *const *ks = qw_cpu_kernels_available(); ref && *ks; ks++) {
            float *a = model_logits(fixtures[fi], 1, (*ks)->name, ids, n, n, &V);
            if (a && len == (size_t)n * V * 4) {
                const float *r = (const float *)ref;
                double num = 0, den = 0;
                for (size_t i = 0; i < (size_t)n * V; i++) {
                    num += ((double)a[i] - r[i]) * ((double)a[i] - r[i]);
                    den += (double)r[i] * r[i];
                }
                printf("  %-26s %-7s rel L2 %.2e\n", fixtures[fi], (*ks)->name, sqrt(num / den));
                CHECK(sqrt(num / den) < 1e-4, "%s %s: rel L2 %.3e", fixtures[fi], (*ks)->name, sqrt(num / den));
            } else {
                CHECK(0, "%s %s: no logits", fixtures[fi], (*ks)->name);
            }
            if (fi == 2 && a) { /* one fixture: 1 vs 3 threads, all at once and token by token */
                float *b = model_logits(fixtures[fi], 3, (*ks)->name, ids, n, n, &V);
                CHECK(b && !memcmp(a, b, (size_t)n * V * 4), "%s %s: 1 and 3 threads differ (prefill)", fixtures[fi],
                      (*ks)->name);
                free(b);
                float *c = model_logits(fixtures[fi], 1, (*ks)->name, ids, n, 1, &V);
                float *d = model_logits(fixtures[fi], 3, (*ks)->name, ids, n, 1, &V);
                CHECK(c && d && !memcmp(c, d, (size_t)n * V * 4), "%s %s: 1 and 3 threads differ (decode)", fixtures[fi],
                      (*ks)->name);
                free(c);
                free(d);
            }
            free(a);
        }
        free(ref);
        free(ids);
    }
    int V = 0, n = 0;
    int32_t *ids = fixture_tokens("tests/fixtures/qwen3", &n);
    float *a = ids ? model_logits("tests/fixtures/qwen3", 1, "ref", ids, n, n, &V) : NULL;
    CHECK(a != NULL, "ref kernels through the model parameters");
    free(a);
    free(ids);
}

int main(void) {
    test_pool();
    test_dots();
    test_expd();
    test_ops();
    test_models();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
