/*
 * t_cuda_ops.c - every op of the CUDA backend against the scalar reference (kernels/ref.c) on random inputs,
 * the weights handed over as host views as the model hands them. Bits where the op's definition fixes them
 * and both sides compute them the same way (copies, element-wise ops and their e^x, RoPE on the same table,
 * the convolution's ordered double sum, QSA scores and selection, PLE hashing and gathers, hyper-connection
 * steps); where the device sums in another order (norms' block sums, attention's online softmax, the delta
 * rule's f32 sums against the reference's double) or uses CUDA's libm (cos, sin, exp, log1p), a relative
 * error bound stated at each check, far below what a wrong index or a missed term gives (> 1e-3).
 * Matmuls and weight gathers of every type: t_cuda_quant.c. Prints SKIP and passes without a CUDA device.
 *
 * Built a second time as t_cuda_ops_emu (QW_CUDA_EMU; `make test`): the same checks on the backend's kernel files
 * run on CPU threads (tests/gpu/emu: backend.cc there for backend.cu, cuBLAS's products on the host, a fixed 8-bit
 * buffer of 256 KiB, so that a prompt past it is PROMPT_TOK = 40 tokens).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "kernels/composite.h"
#include "kernels/cpu.h"
#include "kernels/ops.h"
#include "tensor/quant.h"
#include "../test_util.h"

static const qw_backend *R;
static qw_backend *G;

#if defined(QW_CUDA_EMU) && defined(__SANITIZE_ADDRESS__)
/* the test's device buffers go with the process (main), which on the emulated backend are host allocations */
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "detect_leaks=0"; }
#endif

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rng); } /* uniform in [-1, 1) */
static float *rvec(size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}
static void *dev(const void *h, size_t bytes) {
    void *d = G->alloc(G, bytes, QW_MEM_ACT);
    if (h) G->upload(G, d, h, bytes);
    return d;
}
static void *back(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    G->download(G, h, d, bytes);
    return h;
}
static qw_step *dev_step(int pos0) {
    qw_step s = {.pos0 = pos0};
    return dev(&s, sizeof(s));
}
/* the largest |a - b| / (|b| + floor) */
static double rel_err(const float *a, const float *b, size_t n, double floor) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + floor));
    return w;
}
static int same(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }
/* the same floats, NaN equal to NaN (its sign and payload are the platform's); prints the first difference */
static int same_f(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) && !(a[i] != a[i] && b[i] != b[i])) {
            printf("  first difference at %zu: %.9g vs %.9g (reference)\n", i, a[i], b[i]);
            return 0;
        }
    return 1;
}

static void test_copies(void) {
    printf("store_rows, copy_strided\n");
    int T = 5, W = 37;
    float *src = rvec((size_t)T * W, 1), *cache = calloc(20 * W, sizeof(float));
    float *dsrc = dev(src, (size_t)T * W * 4), *dcache = dev(cache, 20 * W * 4);
    qw_step hs = {.pos0 = 7};
    R->store_rows(R, cache, src, T, W, &hs);
    G->store_rows(G, dcache, dsrc, T, W, dev_step(7));
    float *g = back(dcache, 20 * W * 4);
    CHECK(same(g, cache, 20 * W * 4), "store_rows differs");
    free(g);
    /* a 4-d permutation with a zero stride (broadcast) and an inner stride of 2 */
    qw_copy_layout l = {{3, 2, 4, 5}, {1, 3, 6, 24}, {2, 1, 0, 6}};
    float *in = rvec(64, 1), *out = calloc(120, 4), *dout = dev(NULL, 120 * 4);
    R->copy_strided(R, out, in, &l);
    G->copy_strided(G, dout, dev(in, 64 * 4), &l);
    g = back(dout, 120 * 4);
    CHECK(same(g, out, 120 * 4), "copy_strided differs");
    free(g), free(in), free(out), free(src), free(cache);
}

static void test_norms_elementwise(void) {
    printf("rms_norm (plain, zero-centred, gated, grouped), l2_norm, silu, sigmoid, mul, axpy, divide\n");
    int rows = 12, dim = 1000;
    size_t n = (size_t)rows * dim;
    float *x = rvec(n, 3), *w = rvec(4 * dim, 0.5f), *y = malloc(n * 4);
    float *dx = dev(x, n * 4), *dy = dev(NULL, n * 4);
    for (int zc = 0; zc < 2; zc++) {
        R->rms_norm(R, y, x, w, rows, dim, 1e-6f, zc);
        G->rms_norm(G, dy, dx, w, rows, dim, 1e-6f, zc);
        float *g = back(dy, n * 4);
        double e = rel_err(g, y, n, 1e-6);
        CHECK(e < 4e-7, "rms_norm zc %d: relative error %.2e (bound 4e-7: 1/rms may round differently)", zc, e);
        free(g);
    }
    /* the gated norm (one kernel): rms_norm then act_mul's bits on the GPU, within rms_norm's bound of the
     * reference's (the gate is the same bits; one more rounding) */
    for (int act = 0; act < 2; act++) {
        const int gr = 48, gd = 128, ga = act ? QW_ACT_SIGMOID : QW_ACT_SILU;
        const size_t gn = (size_t)gr * gd;
        float *z = rvec(gn, 6), *zr = malloc(gn * 4), *yr = malloc(gn * 4);
        memcpy(zr, z, gn * 4);
        float *dz = dev(z, gn * 4), *dy2 = dev(NULL, gn * 4);
        R->rms_norm_gate(R, yr, x, w, zr, gr, gd, 1e-6f, ga);
        G->rms_norm_gate(G, dy, dx, w, dz, gr, gd, 1e-6f, ga);
        G->rms_norm(G, dy2, dx, w, gr, gd, 1e-6f, 0);
        G->act_mul(G, dy2, dz, dy2, (int64_t)gn, ga);
        float *g1 = back(dy, gn * 4), *g2 = back(dy2, gn * 4);
        CHECK(same_f(g1, g2, gn), "rms_norm_gate (%s): not the bits of rms_norm then act_mul",
              act ? "sigmoid" : "silu");
        CHECK(rel_err(g1, yr, gn, 1e-6) < 5e-7, "rms_norm_gate (%s): relative error %.2e", act ? "sigmoid" : "silu",
              rel_err(g1, yr, gn, 1e-6));
        free(g1), free(g2), free(z), free(zr), free(yr);
    }
    R->rms_norm_grouped(R, y, x, w, rows, 4, dim, 1e-6f, 1);
    G->rms_norm_grouped(G, dy, dx, w, rows, 4, dim, 1e-6f, 1);
    float *g = back(dy, n * 4);
    CHECK(rel_err(g, y, n, 1e-6) < 4e-7, "rms_norm_grouped: relative error %.2e", rel_err(g, y, n, 1e-6));
    free(g);
    memcpy(y, x, n * 4);
    R->l2_norm(R, y, rows, dim, 1e-6f, 0.3f, rows / 2);
    G->upload(G, dy, x, n * 4);
    G->l2_norm(G, dy, rows, dim, 1e-6f, 0.3f, rows / 2);
    g = back(dy, n * 4);
    CHECK(rel_err(g, y, n, 1e-6) < 4e-7, "l2_norm: relative error %.2e", rel_err(g, y, n, 1e-6));
    free(g);
    /* element-wise: the reference's bits (the device repeats expd.h's e^x); include extremes and NaN */
    float *e = rvec(n, 40);
    e[0] = -200, e[1] = 200, e[2] = 0, e[3] = -0.0f, e[4] = NAN, e[5] = 88.7f, e[6] = -103.9f;
    float *de = dev(NULL, n * 4);
    for (int k = 0; k < 2; k++) {
        memcpy(y, e, n * 4);
        G->upload(G, de, e, n * 4);
        if (k == 0) {
            R->silu(R, y, (int64_t)n);
            G->silu(G, de, (int64_t)n);
        } else {
            R->sigmoid(R, y, (int64_t)n);
            G->sigmoid(G, de, (int64_t)n);
        }
        g = back(de, n * 4);
        CHECK(same_f(g, y, n), "%s: not the reference's bits", k ? "sigmoid" : "silu");
        free(g);
    }
    float *a = rvec(n, 2), *b = rvec(n, 2), *da = dev(a, n * 4), *db = dev(b, n * 4);
    R->mul(R, y, a, b, (int64_t)n);
    G->mul(G, de, da, db, (int64_t)n);
    g = back(de, n * 4);
    CHECK(same(g, y, n * 4), "mul: not the reference's bits");
    free(g);
    memcpy(y, x, n * 4);
    G->upload(G, de, x, n * 4);
    R->axpy(R, y, a, 0.37f, (int64_t)n);
    G->axpy(G, de, da, 0.37f, (int64_t)n);
    R->divide(R, y, 3.0f, (int64_t)n, 0);
    G->divide(G, de, 3.0f, (int64_t)n, 0);
    g = back(de, n * 4);
    CHECK(same(g, y, n * 4), "axpy then divide: not the reference's bits");
    free(g);
    R->divide(R, y, 4.0f, (int64_t)n, 1);
    G->divide(G, de, 4.0f, (int64_t)n, 1);
    g = back(de, n * 4);
    CHECK(same(g, y, n * 4), "divide then silu: not the reference's bits");
    free(g), free(x), free(w), free(y), free(e), free(a), free(b);
}

static void test_rope(void) {
    printf("rope_table, rope\n");
    int T = 6, n_rot = 64, nh = 3, hs = 80, stride = nh * hs + 16;
    float *inv = malloc(32 * 4), *cs = malloc((size_t)T * n_rot * 4);
    for (int k = 0; k < 32; k++) inv[k] = 1.0f / powf(10000.0f, (float)(2 * k) / n_rot);
    qw_step hs_ = {.pos0 = 1000};
    R->rope_table(R, cs, inv, n_rot, T, &hs_);
    float *dcs = dev(NULL, (size_t)T * n_rot * 4);
    G->rope_table(G, dcs, inv, n_rot, T, dev_step(1000));
    float *g = back(dcs, (size_t)T * n_rot * 4);
    double worst = 0;
    for (int i = 0; i < T * n_rot; i++) worst = fmax(worst, fabs((double)g[i] - cs[i]));
    CHECK(worst < 2e-6, "rope_table: largest difference %.2e (bound 2e-6: CUDA's and the C library's cos/sin)", worst);
    free(g);
    float *x = rvec((size_t)T * stride, 1), *y = malloc((size_t)T * stride * 4);
    memcpy(y, x, (size_t)T * stride * 4);
    float *dx = dev(x, (size_t)T * stride * 4);
    G->upload(G, dcs, cs, (size_t)T * n_rot * 4); /* the same table on both sides */
    R->rope(R, y, T, stride, nh, hs, n_rot, cs);
    G->rope(G, dx, T, stride, nh, hs, n_rot, dcs);
    g = back(dx, (size_t)T * stride * 4);
    CHECK(same(g, y, (size_t)T * stride * 4), "rope: not the reference's bits");
    free(g), free(x), free(y), free(inv), free(cs);
}

static void test_attention(void) {
    printf("attention: full, causal from a position, and over a selection\n");
    /* heads, kv heads, head dimension: more than 16 queries at 128 or 256 take the tiled kernel (G = 4, 12); G = 3
     * and hd 64 the per-head one */
    static const int shapes[][3] = {{8, 2, 128}, {24, 2, 256}, {6, 2, 128}, {4, 1, 64}};
    static const int cases[][3] = {{1, 0, 0}, {1, 250, 0}, {9, 100, 0}, {5, 200, 1}, {40, 0, 0}, {40, 200, 0},
                                   {20, 150, 1}, {70, 230, 1}};
    const int n_ctx = 300;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int nh = shapes[si][0], nkv = shapes[si][1], hd = shapes[si][2];
        float *kc = rvec((size_t)n_ctx * nkv * hd, 1), *vc = rvec((size_t)n_ctx * nkv * hd, 2);
        float *dk = dev(kc, (size_t)n_ctx * nkv * hd * 4), *dv = dev(vc, (size_t)n_ctx * nkv * hd * 4);
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            int T = cases[ci][0], p0 = cases[ci][1], sparse = cases[ci][2];
            float *q = rvec((size_t)T * nh * hd, 2), *o = malloc((size_t)T * nh * hd * 4);
            int32_t *sel = NULL, *off = NULL, *dsel = NULL, *doff = NULL;
            if (sparse) {
                sel = malloc((size_t)T * n_ctx * 4);
                off = malloc((size_t)(T + 1) * 4);
                int m = 0;
                for (int t = 0; t < T; t++) {
                    off[t] = m;
                    for (int i = 0; i <= p0 + t; i++)
                        if (i % 3 == 0 || i == p0 + t) sel[m++] = i;
                }
                off[T] = m;
                dsel = dev(sel, (size_t)m * 4);
                doff = dev(off, (size_t)(T + 1) * 4);
            }
            void *work = malloc(R->attention_work(R, n_ctx, hd));
            qw_step st = {.pos0 = p0};
            float scale = 1.0f / sqrtf((float)hd);
            R->attention(R, o, q, nh * hd, kc, vc, T, nh, nkv, hd, scale, sel, off, work, &st);
            float *dout = dev(NULL, (size_t)T * nh * hd * 4), *dq = dev(q, (size_t)T * nh * hd * 4);
            qw_step *dst = dev_step(p0);
            /* the default kernels (few queries: a block a head below ATT_SPLIT_MIN keys; dense prompts: queries
             * tiled); dense prompts a query a block (QWENC_CUDA_ATT_QTILES=0); few queries split along the keys 7
             * ways past 100 keys and 40 ways always (QWENC_CUDA_ATT_SPLIT, QWENC_CUDA_ATT_SPLIT_MIN) */
            static const char *const var[] = {"", " (a query a block)", " (split 7 ways past 100 keys)",
                                              " (split 40 ways)"};
            for (int qt = 0; qt < 4; qt++) {
                if ((qt == 1 && (sparse || T <= 16)) || (qt >= 2 && T > 16)) continue;
                if (qt == 1) setenv("QWENC_CUDA_ATT_QTILES", "0", 1);
                if (qt >= 2) {
                    setenv("QWENC_CUDA_ATT_SPLIT", qt == 2 ? "7" : "40", 1);
                    setenv("QWENC_CUDA_ATT_SPLIT_MIN", qt == 2 ? "100" : "0", 1);
                }
                G->attention(G, dout, dq, nh * hd, dk, dv, T, nh, nkv, hd, scale, dsel, doff, NULL, dst);
                unsetenv("QWENC_CUDA_ATT_QTILES");
                unsetenv("QWENC_CUDA_ATT_SPLIT");
                unsetenv("QWENC_CUDA_ATT_SPLIT_MIN");
                float *g = back(dout, (size_t)T * nh * hd * 4);
                double worst = 0;
                for (int i = 0; i < T * nh * hd; i++) worst = fmax(worst, fabs((double)g[i] - o[i]));
                /* values within [-2, 2]: the f32 online softmax against the double reference */
                CHECK(worst < 2e-5, "attention%s %d heads / %d kv heads x %d, %d queries from %d%s: largest "
                      "difference %.2e (bound 2e-5)", var[qt], nh, nkv, hd, T, p0, sparse ? " over a selection" : "",
                      worst);
                free(g);
            }
            free(q), free(o), free(sel), free(off), free(work);
        }
        free(kc), free(vc);
    }
}

static void test_qsa(void) {
    printf("qsa_keys, qsa_select: the same pooled keys and the same positions\n");
    /* ihd, R, n_ctx, topk; steps (negative: that many tokens whose queries are zeros, every score 0: ties, the
     * lowest blocks win); the second config has more blocks than the selection kernel's threads */
    static const struct {
        int ihd, R, n_ctx, topk, steps[8];
    } cfgs[] = {{64, 8, 256, 5, {13, 1, 1, 30, 7, 1, 60, -20}}, {32, 2, 1200, 300, {600, 1, -40, 500}}};
    for (size_t gi = 0; gi < sizeof(cfgs) / sizeof(cfgs[0]); gi++) {
        int ihd = cfgs[gi].ihd, R_ = cfgs[gi].R, n_ctx = cfgs[gi].n_ctx, ni = 4, n_rot = 32, topk = cfgs[gi].topk;
        float *knorm = rvec(ihd, 0.3f), *inv = malloc(16 * 4);
        for (int k = 0; k < 16; k++) inv[k] = 1.0f / powf(10000.0f, (float)(2 * k) / n_rot);
        float *raw = calloc((size_t)n_ctx * ihd, 4), *blk = calloc((size_t)(n_ctx / R_ + 1) * ihd, 4);
        float *draw = dev(raw, (size_t)n_ctx * ihd * 4), *dblk = dev(blk, (size_t)(n_ctx / R_ + 1) * ihd * 4);
        int64_t width = (int64_t)(ni + 1) * ihd;
        int pos = 0;
        for (size_t si = 0; si < 8 && cfgs[gi].steps[si]; si++) {
            int T = abs(cfgs[gi].steps[si]);
            float *rows = rvec((size_t)T * width, 1);
            if (cfgs[gi].steps[si] < 0)
                for (int t = 0; t < T; t++) memset(rows + (int64_t)t * width, 0, (size_t)ni * ihd * 4);
            float *drows = dev(rows, (size_t)T * width * 4);
            qw_step st = {.pos0 = pos};
            qw_step *dst = dev_step(pos);
            R->qsa_keys(R, raw, blk, rows + (int64_t)ni * ihd, width, T, ihd, R_, knorm, 1e-6f, inv, n_rot, &st);
            G->qsa_keys(G, draw, dblk, drows + (int64_t)ni * ihd, width, T, ihd, R_, knorm, 1e-6f, inv, n_rot, dst);
            float *graw = back(draw, (size_t)n_ctx * ihd * 4), *gblk = back(dblk, (size_t)(n_ctx / R_ + 1) * ihd * 4);
            CHECK(same(graw, raw, (size_t)n_ctx * ihd * 4), "qsa_keys config %zu step %zu: raw keys differ", gi, si);
            const size_t nbk = (size_t)(pos + T) / R_ * ihd;
            if (gi == 0) {
                double e = rel_err(gblk, blk, nbk, 1e-3);
                CHECK(e < 1e-5, "qsa_keys config %zu step %zu: pooled keys, relative error %.2e (bound 1e-5: cos/sin)",
                      gi, si, e);
            } else { /* RoPE angles up to ~1,100 rad: the device's cosf/sinf (2 ulp) of the same f32 angle, two
                      * products and a sum: |error| < 4 * 2 ulp(1) * max|key| = 5e-7 max|key|, bound 1e-6 */
                double e = 0, mx = 0;
                for (size_t k = 0; k < nbk; k++) {
                    e = fmax(e, fabs((double)gblk[k] - blk[k]));
                    mx = fmax(mx, fabs((double)blk[k]));
                }
                CHECK(e <= 1e-6 * mx, "qsa_keys config %zu step %zu: pooled keys, largest difference %.2e (bound 1e-6 "
                      "of the largest key, %.3g)", gi, si, e, mx);
            }
            /* the selection from the same pooled keys on both sides (the device's copied from the host's) */
            G->upload(G, dblk, blk, (size_t)(n_ctx / R_ + 1) * ihd * 4);
            size_t cap = (size_t)T * (topk + 1) * R_;
            int32_t *sel = malloc(cap * 4), *off = malloc((size_t)(T + 1) * 4);
            void *work = malloc(R->qsa_select_work(R, n_ctx, R_, topk));
            G->qsa_select_work(G, n_ctx, R_, topk);
            int32_t *dsel = dev(NULL, cap * 4), *doff = dev(NULL, (size_t)(T + 1) * 4);
            R->qsa_select(R, sel, off, rows, width, blk, T, ni, ihd, R_, topk, work, &st);
            G->qsa_select(G, dsel, doff, drows, width, dblk, T, ni, ihd, R_, topk, NULL, dst);
            int32_t *goff = back(doff, (size_t)(T + 1) * 4);
            CHECK(same(goff, off, (size_t)(T + 1) * 4), "qsa_select config %zu step %zu: offsets differ", gi, si);
            int32_t *gsel = back(dsel, (size_t)off[T] * 4);
            CHECK(same(gsel, sel, (size_t)off[T] * 4), "qsa_select config %zu step %zu: positions differ", gi, si);
            for (int sv = 0; sv < 2; sv++) { /* few queries one block each, or split 37 ways: the same */
                free(gsel), free(goff);
                setenv("QWENC_CUDA_QSA_SPLIT", sv ? "37" : "1", 1);
                G->qsa_select(G, dsel, doff, drows, width, dblk, T, ni, ihd, R_, topk, NULL, dst);
                unsetenv("QWENC_CUDA_QSA_SPLIT");
                goff = back(doff, (size_t)(T + 1) * 4), gsel = back(dsel, (size_t)off[T] * 4);
                CHECK(same(goff, off, (size_t)(T + 1) * 4) && same(gsel, sel, (size_t)off[T] * 4),
                      "qsa_select split %d ways, config %zu step %zu: other positions", sv ? 37 : 1, gi, si);
            }
            free(goff), free(gsel), free(sel), free(off), free(work), free(graw), free(gblk), free(rows);
            pos += T;
        }
        free(knorm), free(inv), free(raw), free(blk);
    }
}

static void test_gdn(void) {
    printf("conv1d_dw, gdn_gate, delta_rule\n");
    qw_backend_cuda_set_dr_chunk(G, 0); /* token by token (test_delta_chunk: the chunked form) */
    int T = 7, ch = 300, k = 4, dil = 1;
    float *x = rvec((size_t)(k - 1 + T) * ch, 1), *w = rvec((size_t)ch * k, 1), *y = malloc((size_t)T * ch * 4);
    float *dy = dev(NULL, (size_t)T * ch * 4), *dx = dev(x, (size_t)(k - 1 + T) * ch * 4), *g;
    for (int s = 0; s < 2; s++) { /* plain, then with the silu after it */
        R->conv1d_dw(R, y, x, w, T, ch, k, dil, s);
        G->conv1d_dw(G, dy, dx, w, T, ch, k, dil, s);
        g = back(dy, (size_t)T * ch * 4);
        CHECK(same(g, y, (size_t)T * ch * 4), "conv1d_dw%s: not the reference's bits", s ? " then silu" : "");
        free(g);
    }
    free(x), free(y);
    /* the convolution over a history that it moves on: one kernel for few rows, the copies and conv1d_dw beyond;
     * the same weights (the backend knows weights by host address: a new array could take a freed one's) */
    printf("conv1d_state\n");
    int Ts[] = {1, 3, 20}, dils[] = {1, 3};
    float *ws = w;
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 2; di++)
            for (int keep = 0; keep < 2; keep++) {
                int n = Ts[ti], dl = dils[di], nh = (k - 1) * dl;
                float *xs = rvec((size_t)n * ch, 1), *hs = rvec((size_t)nh * ch, 1);
                float *ys = malloc((size_t)n * ch * 4), *sq = malloc((size_t)(nh + n) * ch * 4);
                float *dxs = dev(xs, (size_t)n * ch * 4), *dhs = dev(hs, (size_t)nh * ch * 4);
                float *dys = dev(NULL, (size_t)n * ch * 4), *dsq = dev(NULL, (size_t)(nh + n) * ch * 4);
                R->conv1d_state(R, ys, xs, hs, sq, ws, n, ch, k, dl, 1, keep);
                G->conv1d_state(G, dys, dxs, dhs, dsq, ws, n, ch, k, dl, 1, keep);
                g = back(dys, (size_t)n * ch * 4);
                CHECK(same(g, ys, (size_t)n * ch * 4), "conv1d_state %d rows, dilation %d: y not the reference's bits", n, dl);
                free(g);
                g = back(dhs, (size_t)nh * ch * 4);
                CHECK(same(g, hs, (size_t)nh * ch * 4), "conv1d_state %d rows, dilation %d: the history moved on wrongly", n, dl);
                free(g);
                if (keep) {
                    g = back(dsq, (size_t)(nh + n) * ch * 4);
                    CHECK(same(g, sq, (size_t)(nh + n) * ch * 4), "conv1d_state %d rows, dilation %d: the window kept wrongly", n, dl);
                    free(g);
                }
                free(xs), free(hs), free(ys), free(sq);
            }
    free(ws);
    int hv = 8, hk = 2, dk = 128, dv = 128;
    float *a = rvec((size_t)T * hv, 10), *nea = rvec(hv, 1), *dtb = rvec(hv, 1), *ga = malloc((size_t)T * hv * 4);
    memcpy(ga, a, (size_t)T * hv * 4);
    float *da = dev(a, (size_t)T * hv * 4), *bt = rvec((size_t)T * hv, 4), *dbt = dev(bt, (size_t)T * hv * 4);
    R->gdn_gate(R, ga, bt, nea, dtb, T, hv);
    G->gdn_gate(G, da, dbt, nea, dtb, T, hv);
    g = back(da, (size_t)T * hv * 4);
    CHECK(rel_err(g, ga, (size_t)T * hv, 1e-6) < 1e-6, "gdn_gate: relative error %.2e (CUDA's expf, log1pf)",
          rel_err(g, ga, (size_t)T * hv, 1e-6));
    free(g);
    g = back(dbt, (size_t)T * hv * 4);
    CHECK(same(g, bt, (size_t)T * hv * 4), "gdn_gate's beta: not the sigmoid op's bits");
    free(g), free(bt);
    /* the convolution, q, k and v, the l2 norms and the gate as one op: the bits of the GPU's ops, the reference's
     * within the ops' own bounds; one token (c's thirds), one keeping its window (a draft step's), several tokens
     * (q, k and v apart, where the copies out of c put them) with and without the window; v channels not a multiple
     * of the kernel's blocks (pw kept: weights are known by their address) */
    printf("gdn_prep\n");
    {
        const int pch = 2 * hk * dk + 300, kd = hk * dk, vd = pch - 2 * kd;
        const float sc = 1.0f / sqrtf((float)dk);
        const size_t hb = (size_t)(k - 1) * pch * 4;
        float *pw = rvec((size_t)pch * k, 0.5f);
        static const int cases[][2] = {{1, 0}, {1, 1}, {3, 0}, {5, 1}, {16, 0}};
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            const int n = cases[ci][0], keep = cases[ci][1];
            const size_t yb = (size_t)n * pch * 4, gb = (size_t)n * hv * 4, sqb = (size_t)(k - 1 + n) * pch * 4;
            const size_t qb = (size_t)n * kd * 4, vb = (size_t)n * vd * 4;
            float *px = rvec((size_t)n * pch, 1), *ph = rvec((size_t)(k - 1) * pch, 1);
            float *pa = rvec((size_t)n * hv, 3), *pb = rvec((size_t)n * hv, 3), *ry = malloc(yb), *rseq = malloc(sqb);
            float *rq = ry, *rk = ry + kd, *rv = ry + 2 * kd; /* one token: c's thirds */
            if (n > 1) rq = malloc(qb), rk = malloc(qb), rv = malloc(vb);
            float *rh = malloc(hb), *ra = malloc(gb), *rb = malloc(gb);
            memcpy(rh, ph, hb), memcpy(ra, pa, gb), memcpy(rb, pb, gb);
            qw_gdn_prep_ops(R, ry, rq, rk, rv, px, rh, rseq, keep, pw, n, pch, k, hk, dk, 1e-6f, sc, ra, rb, nea, dtb,
                            hv);
            float *dpx = dev(px, yb), *dseq1 = dev(NULL, sqb), *dseq2 = dev(NULL, sqb);
            float *y1 = dev(NULL, yb), *h1 = dev(ph, hb), *a1 = dev(pa, gb), *b1 = dev(pb, gb);
            float *y2 = dev(NULL, yb), *h2 = dev(ph, hb), *a2 = dev(pa, gb), *b2 = dev(pb, gb);
            float *q1 = y1, *k1 = y1 + kd, *v1 = y1 + 2 * kd, *q2 = y2, *k2 = y2 + kd, *v2 = y2 + 2 * kd;
            if (n > 1) {
                q1 = dev(NULL, qb), k1 = dev(NULL, qb), v1 = dev(NULL, vb);
                q2 = dev(NULL, qb), k2 = dev(NULL, qb), v2 = dev(NULL, vb);
            }
            qw_gdn_prep_ops(G, y1, q1, k1, v1, dpx, h1, dseq1, keep, pw, n, pch, k, hk, dk, 1e-6f, sc, a1, b1, nea,
                            dtb, hv);
            CHECK(G->gdn_prep != NULL, "gdn_prep: the CUDA backend has none");
            qw_be_gdn_prep(G, y2, q2, k2, v2, dpx, h2, dseq2, keep, pw, n, pch, k, hk, dk, 1e-6f, sc, a2, b2, nea,
                           dtb, hv);
            float *gq1 = back(q1, qb), *gq2 = back(q2, qb), *gk1 = back(k1, qb), *gk2 = back(k2, qb);
            float *gv1 = back(v1, vb), *gv2 = back(v2, vb), *gh1 = back(h1, hb), *gh2 = back(h2, hb);
            float *ga1 = back(a1, gb), *ga2 = back(a2, gb), *gb1 = back(b1, gb), *gb2 = back(b2, gb);
            CHECK(same_f(gq2, gq1, n * kd) && same_f(gk2, gk1, n * kd) && same_f(gv2, gv1, n * vd),
                  "gdn_prep, %d tokens%s: q, k, v not the bits of conv1d_state, the copies and l2_norm", n,
                  keep ? ", window kept" : "");
            CHECK(same(gh2, gh1, hb) && same(gh2, rh, hb), "gdn_prep, %d tokens: the history moved on wrongly", n);
            CHECK(same_f(ga2, ga1, n * hv) && same_f(gb2, gb1, n * hv), "gdn_prep, %d tokens: g or beta not "
                  "gdn_gate's bits", n);
            if (keep) {
                float *gs1 = back(dseq1, sqb), *gs2 = back(dseq2, sqb);
                CHECK(same(gs2, gs1, sqb) && same(gs2, rseq, sqb), "gdn_prep, %d tokens: the window kept wrongly", n);
                free(gs1), free(gs2);
            }
            double e = fmax(fmax(rel_err(gq2, rq, (size_t)n * kd, 1e-6), rel_err(gk2, rk, (size_t)n * kd, 1e-6)),
                            rel_err(gv2, rv, (size_t)n * vd, 1e-6));
            CHECK(e < 4e-7, "gdn_prep, %d tokens: relative error %.2e against the reference", n, e);
            CHECK(rel_err(ga2, ra, (size_t)n * hv, 1e-6) < 1e-6 && same(gb2, rb, gb), "gdn_prep, %d tokens: the "
                  "gate against the reference", n);
            if (n > 1) {
                G->free(G, q1), G->free(G, k1), G->free(G, v1), G->free(G, q2), G->free(G, k2), G->free(G, v2);
                free(rq), free(rk), free(rv);
            }
            G->free(G, dpx), G->free(G, dseq1), G->free(G, dseq2), G->free(G, y1), G->free(G, h1), G->free(G, a1);
            G->free(G, b1), G->free(G, y2), G->free(G, h2), G->free(G, a2), G->free(G, b2);
            free(px), free(ph), free(pa), free(pb), free(ry), free(rseq), free(rh), free(ra), free(rb);
            free(gq1), free(gq2), free(gk1), free(gk2), free(gv1), free(gv2), free(gh1), free(gh2);
            free(ga1), free(ga2), free(gb1), free(gb2);
        }
    }
    /* dk 192: the general kernel (state in memory); 32-128: four lanes a column, with dv not a multiple of the
     * block's 32 columns and prompts longer than its 32-token staging */
    static const int dr_cases[][3] = {{64, 128, 7}, {128, 128, 70}, {192, 128, 7}, {128, 72, 40}, {32, 40, 9}};
    for (size_t ci = 0; ci < sizeof(dr_cases) / sizeof(dr_cases[0]); ci++) {
        dk = dr_cases[ci][0], dv = dr_cases[ci][1];
        const int Tn = dr_cases[ci][2], tiled = dk == 128 && dv == 128; /* value heads in llama.cpp's tiled order */
        float *q = rvec((size_t)Tn * hk * dk, 0.1f), *kk = rvec((size_t)Tn * hk * dk, 0.1f);
        float *v = rvec((size_t)Tn * hv * dv, 1), *gg = rvec((size_t)Tn * hv, 0.5f);
        float *beta = rvec((size_t)Tn * hv, 0.5f);
        for (int i = 0; i < Tn * hv; i++) gg[i] = -fabsf(gg[i]), beta[i] = fabsf(beta[i]);
        float *S = rvec((size_t)hv * dk * dv, 0.1f), *o = malloc((size_t)Tn * hv * dv * 4);
        const size_t sb = (size_t)hv * dk * dv * 4, ob = (size_t)Tn * hv * dv * 4;
        float *dS = dev(S, sb), *dO = dev(NULL, ob), *dq = dev(q, (size_t)Tn * hk * dk * 4);
        float *dk_ = dev(kk, (size_t)Tn * hk * dk * 4), *dv_ = dev(v, ob), *dg = dev(gg, (size_t)Tn * hv * 4);
        float *db = dev(beta, (size_t)Tn * hv * 4), *dS1 = dev(S, sb), *dO1 = dev(NULL, ob);
        G->delta_rule(G, dO, dS, dq, dk_, dv_, dg, db, Tn, hk, hv, dk, dv, tiled);
        for (int t = 0; t < Tn; t++) /* the same tokens one call each */
            G->delta_rule(G, dO1 + (size_t)t * hv * dv, dS1, dq + (size_t)t * hk * dk, dk_ + (size_t)t * hk * dk,
                          dv_ + (size_t)t * hv * dv, dg + (size_t)t * hv, db + (size_t)t * hv, 1, hk, hv, dk, dv,
                          tiled);
        R->delta_rule(R, o, S, q, kk, v, gg, beta, Tn, hk, hv, dk, dv, tiled);
        float *go = back(dO, ob), *gS = back(dS, sb), *go1 = back(dO1, ob), *gS1 = back(dS1, sb);
        double eo = 0, es = 0;
        for (int i = 0; i < Tn * hv * dv; i++) eo = fmax(eo, fabs((double)go[i] - o[i]));
        for (int i = 0; i < hv * dk * dv; i++) es = fmax(es, fabs((double)gS[i] - S[i]));
        /* outputs and states of size ~0.1-1: f32 sums of dk terms against the reference's double */
        CHECK(eo < 1e-5 && es < 1e-5, "delta_rule dk %d dv %d%s, %d tokens: largest difference output %.2e, state "
              "%.2e (bound 1e-5)", dk, dv, tiled ? " tiled" : "", Tn, eo, es);
        CHECK(same(go, go1, ob) && same(gS, gS1, sb), "delta_rule dk %d dv %d, %d tokens: one call and a call a token "
              "differ", dk, dv, Tn);
        free(q), free(kk), free(v), free(gg), free(beta), free(S), free(o), free(go), free(gS), free(go1), free(gS1);
    }
    free(a), free(nea), free(dtb), free(ga);
}

/* random SwiGLU experts of f32 weights: gate, up [I, H], down [H, I] */
static qw_ffn_w *make_experts(int E, int H, int I, float **store) {
    qw_ffn_w *ex = calloc((size_t)E, sizeof(*ex));
    *store = rvec((size_t)E * 3 * H * I, 0.05f);
    for (int e = 0; e < E; e++) {
        float *base = *store + (size_t)e * 3 * H * I;
        qw_tensor t = {.name = "expert", .type = QW_TYPE_F32, .n_dims = 2};
        t.data = base, t.shape[0] = I, t.shape[1] = H, ex[e].gate = t;
        t.data = base + (size_t)H * I, ex[e].up = t;
        t.data = base + (size_t)2 * H * I, t.shape[0] = H, t.shape[1] = I, ex[e].down = t;
    }
    return ex;
}

/* moe_route at Flash-Next's 512 experts and top 10 against the reference: the same experts, weights within 1e-6;
 * rows of random logits, of four levels (ties across the top k and at its edge), all equal (the first k experts)
 * and one level above the rest on every 37th expert (ties inside the top k only) */
static void test_moe_route_ties(void) {
    printf("moe_route with ties\n");
    enum { E = 512, k = 10, T = 4 };
    float *lg = rvec((size_t)T * E, 4);
    for (int e = 0; e < E; e++) {
        lg[E + e] = (float)((e * 7919) % 4);
        lg[2 * E + e] = 0.5f;
        lg[3 * E + e] = e % 37 ? -1.0f : 2.0f;
    }
    float *dlg = dev(lg, (size_t)T * E * 4), *wt = malloc((size_t)T * k * 4), *dwt = dev(NULL, (size_t)T * k * 4);
    int32_t *sel = malloc((size_t)T * k * 4), *dsel = dev(NULL, (size_t)T * k * 4);
    R->moe_route(R, sel, wt, lg, T, E, k, 1);
    G->moe_route(G, dsel, dwt, dlg, T, E, k, 1);
    int32_t *gsel = back(dsel, (size_t)T * k * 4);
    float *gwt = back(dwt, (size_t)T * k * 4);
    for (int t = 0; t < T; t++)
        CHECK(same(gsel + t * k, sel + t * k, k * 4), "moe_route with ties, row %d: experts %d %d %d .., not %d %d %d ..",
              t, gsel[t * k], gsel[t * k + 1], gsel[t * k + 2], sel[t * k], sel[t * k + 1], sel[t * k + 2]);
    CHECK(rel_err(gwt, wt, (size_t)T * k, 1e-7) < 1e-6, "moe_route with ties: weights, relative error %.2e",
          rel_err(gwt, wt, (size_t)T * k, 1e-7));
    CHECK(sel[2 * k] == 0 && sel[2 * k + k - 1] == k - 1, "moe_route with ties: equal logits chose %d .. %d, not the "
          "first k", sel[2 * k], sel[2 * k + k - 1]);
    free(lg), free(wt), free(sel), free(gsel), free(gwt);
}

static void test_moe(void) {
    printf("moe_route, moe_ffn (pairs and grouped)\n");
    int E = 64, k = 8, H = 128, I = 64;
    float *store, *sstore[2];
    qw_ffn_w *ex = make_experts(E, H, I, &store);
    /* both shared experts live to the end: the backend knows weights by their host address, which a freed one's
     * successor could take */
    qw_ffn_w *shs[2] = {make_experts(1, H, 96, &sstore[0]), make_experts(1, H, I, &sstore[1])};
    float *gate_w = rvec(H, 0.1f);
    qw_tensor sgt = {.name = "gate", .data = gate_w, .type = QW_TYPE_F32, .n_dims = 2, .shape = {1, H}};
    static const int Ts[] = {1, 2, 12, 136}; /* 136: 1,088 rows, past any pairs' limit (QWENC_CUDA_PAIRS_MAX) */
    /* a shared expert of another width (its own products), then of the experts' (few rows: more pairs of theirs) */
    for (int si = 0; si < 2; si++) {
        qw_ffn_w *sh = shs[si];
        int Is = (int)sh->gate.shape[0];
        for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
            int T = Ts[ti];
            float *lg = rvec((size_t)T * E, 4), *x = rvec((size_t)T * H, 1);
            float *dlg = dev(lg, (size_t)T * E * 4), *dx = dev(x, (size_t)T * H * 4);
            int32_t *sel = malloc((size_t)T * k * 4);
            float *wt = malloc((size_t)T * k * 4), *y = malloc((size_t)T * H * 4);
            int32_t *dsel = dev(NULL, (size_t)T * k * 4);
            float *dwt = dev(NULL, (size_t)T * k * 4), *dy = dev(NULL, (size_t)T * H * 4);
            float *dlg2 = dev(lg, (size_t)T * E * 4), *dlg3 = dev(lg, (size_t)T * E * 4); /* before it is p */
            R->moe_route(R, sel, wt, lg, T, E, k, 1);
            G->moe_route(G, dsel, dwt, dlg, T, E, k, 1);
            int32_t *gsel = back(dsel, (size_t)T * k * 4);
            float *gwt = back(dwt, (size_t)T * k * 4);
            CHECK(same(gsel, sel, (size_t)T * k * 4), "moe_route T %d: other experts", T);
            CHECK(rel_err(gwt, wt, (size_t)T * k, 1e-7) < 1e-6, "moe_route T %d: weights, relative error %.2e", T,
                  rel_err(gwt, wt, (size_t)T * k, 1e-7));
            void *rw = malloc(R->moe_work(R, T, k, E, H, I, Is));
            void *gw = dev(NULL, G->moe_work(G, T, k, E, H, I, Is));
            G->upload(G, dwt, wt, (size_t)T * k * 4); /* the same weights on both sides */
            R->moe_ffn(R, y, x, sel, wt, NULL, 0, T, k, ex, E, sh, &sgt, rw);
            G->moe_ffn(G, dy, dx, dsel, dwt, NULL, 0, T, k, ex, E, sh, &sgt, gw);
            float *gy = back(dy, (size_t)T * H * 4);
            double worst = 0;
            for (int i = 0; i < T * H; i++) worst = fmax(worst, fabs((double)gy[i] - y[i]));
            /* outputs ~0.1: f32 dot products of 64-128 terms in another order */
            CHECK(worst < 2e-6, "moe_ffn T %d (%s, shared expert %d wide): largest difference %.2e (bound 2e-6)", T,
                  T * k <= 256 ? "pairs" : "grouped", Is, worst);
            /* the routing inside the op: the bits of moe_route then moe_ffn, on the device */
            G->moe_route(G, dsel, dwt, dlg3, T, E, k, 1);
            G->moe_ffn(G, dy, dx, dsel, dwt, NULL, 0, T, k, ex, E, sh, &sgt, gw);
            float *y3 = back(dy, (size_t)T * H * 4), *w3 = back(dwt, (size_t)T * k * 4);
            int32_t *s3 = back(dsel, (size_t)T * k * 4);
            G->zero(G, dsel, (size_t)T * k * 4), G->zero(G, dwt, (size_t)T * k * 4);
            G->moe_ffn(G, dy, dx, dsel, dwt, dlg2, 1, T, k, ex, E, sh, &sgt, gw);
            float *y2 = back(dy, (size_t)T * H * 4), *w2 = back(dwt, (size_t)T * k * 4);
            int32_t *s2 = back(dsel, (size_t)T * k * 4);
            CHECK(same(s2, s3, (size_t)T * k * 4) && same(w2, w3, (size_t)T * k * 4) && same(y2, y3, (size_t)T * H * 4),
                  "moe_ffn T %d (%s, shared expert %d wide) routing inside: not the bits of moe_route then moe_ffn", T,
                  T * k <= 256 ? "pairs" : "grouped", Is);
            free(y3), free(w3), free(s3), free(y2), free(w2), free(s2);
            free(lg), free(x), free(sel), free(wt), free(y), free(gsel), free(gwt), free(rw), free(gy);
        }
    }
    free(store), free(ex), free(gate_w), free(sstore[0]), free(sstore[1]), free(shs[0]), free(shs[1]);
}

/* The MoE's grouped path with quantized experts and 8-bit activations (the rows rounded, gathered by expert, and
 * mmq.cu's one tensor-core GEMM a projection for every expert; gate and up Q4_K, down Q8_0; 136 tokens of 8 experts
 * of 64: 1,088 rows, more than any pairs' limit) against the CPU backend's integer path with its scalar kernels:
 * both give each product qw_q8a_dot_ref's bits. The SiLU and the weighted sums may differ in the last bit, and a
 * last-bit difference in a down projection's input can move its 8-bit rounding by one step, which changes that
 * token's outputs by about an activation step times a weight (under 1 % of max|y|). So: every output within 1e-5
 * max|y| (f32 roundings) but those of at most a sixth of the tokens, and those within 2e-2 max|y|. A wrong expert,
 * row, group or token order changes every token's outputs by about max|y|. */
/* the CPU backend with scalar kernels (its integer path: qw_q8a_dot_ref's sums), or NULL after a failed check */
static qw_backend *scalar_cpu(void) {
    char err[256];
    qw_backend *Q = NULL;
    if (qw_backend_cpu_new(1, "scalar", 0, &Q, err, sizeof(err))) {
        CHECK(0, "the CPU backend with scalar kernels: %s", err);
        return NULL;
    }
    return Q;
}

/* E experts of Q4_K gate and up [I][H] and Q8_0 down [H][I] (random, 0.05), in *store (freed by the caller) */
static qw_ffn_w *q8_experts(int E, int H, int I, char **store) {
    qw_ffn_w *ex = calloc(E, sizeof(*ex));
    const size_t rb4 = qw_type_row_size(QW_TYPE_Q4_K, H), rb8 = qw_type_row_size(QW_TYPE_Q8_0, I);
    *store = malloc((size_t)E * (2 * I * rb4 + H * rb8));
    for (int e = 0; e < E; e++) {
        char *b = *store + (size_t)e * (2 * I * rb4 + H * rb8);
        for (int j = 0; j < 3; j++) {
            const int down = j == 2, rows = down ? H : I, cols = down ? I : H;
            const qw_type ty = down ? QW_TYPE_Q8_0 : QW_TYPE_Q4_K;
            char *d = b + (size_t)j * I * rb4;
            float *wf = rvec((size_t)H * I, 0.05f);
            for (int r = 0; r < rows; r++) qw_quantize(ty, wf + (size_t)r * cols, d + (size_t)r * qw_type_row_size(ty, cols), cols);
            free(wf);
            qw_tensor t = {.name = "expert", .data = d, .type = ty, .n_dims = 2, .shape = {rows, cols}};
            if (j == 0) ex[e].gate = t;
            else if (j == 1) ex[e].up = t;
            else ex[e].down = t;
        }
    }
    return ex;
}

static void test_moe_q8(void) {
    printf("moe_ffn grouped, quantized experts, 8-bit activations\n");
    enum { E = 64, K = 8, H = 256, I = 256, T = 136 };
    qw_backend *Q = scalar_cpu();
    if (!Q) return;
    char *store;
    qw_ffn_w *ex = q8_experts(E, H, I, &store);
    float *lg = rvec((size_t)T * E, 4), *x = rvec((size_t)T * H, 1);
    int32_t *sel = malloc((size_t)T * K * 4);
    float *wt = malloc((size_t)T * K * 4), *y = malloc((size_t)T * H * 4);
    Q->moe_route(Q, sel, wt, lg, T, E, K, 1);
    void *qw = malloc(Q->moe_work(Q, T, K, E, H, I, 0));
    Q->moe_ffn(Q, y, x, sel, wt, NULL, 0, T, K, ex, E, NULL, NULL, qw);
    float *dx = dev(x, (size_t)T * H * 4), *dwt = dev(wt, (size_t)T * K * 4), *dy = dev(NULL, (size_t)T * H * 4);
    int32_t *dsel = dev(sel, (size_t)T * K * 4);
    void *gw = dev(NULL, G->moe_work(G, T, K, E, H, I, 0));
    qw_backend_cuda_set_q8_activations(G, 1);
    G->moe_ffn(G, dy, dx, dsel, dwt, NULL, 0, T, K, ex, E, NULL, NULL, gw);
    qw_backend_cuda_set_q8_activations(G, 0);
    float *gy = back(dy, (size_t)T * H * 4);
    double ymax = 0, worst = 0;
    for (int i = 0; i < T * H; i++) ymax = fmax(ymax, fabs(y[i]));
    int off_tokens = 0;
    for (int t = 0; t < T; t++) {
        double tw = 0;
        for (int i = 0; i < H; i++) tw = fmax(tw, fabs((double)gy[t * H + i] - y[t * H + i]));
        off_tokens += tw > 1e-5 * ymax;
        worst = fmax(worst, tw);
    }
    CHECK(ymax > 0 && 6 * off_tokens <= T && worst <= 2e-2 * ymax, "moe_ffn grouped, Q4_K / Q8_0 experts, 8-bit "
          "activations: %d of %d tokens beyond 1e-5 max|y| (at most a sixth), largest difference %.3g of max|y| %.3g",
          off_tokens, T, worst, ymax);
    printf("  %d of %d tokens beyond 1e-5 max|y|; largest difference / max|y| %.2e\n", off_tokens, T, worst / ymax);
    free(gy), free(lg), free(x), free(sel), free(wt), free(y), free(qw);
    /* the weights stay: the backend knows them by their host address */
    Q->release(Q);
}

/* One token through moe_ffn on the integer path with the routing inside (logits given), a shared expert of the
 * experts' shapes and types and its gate: the decode path (the routing in the pairs' kernel, the shared expert as
 * one more pair, its gate's logit in the pairs' kernel, the down products and the combine as one kernel) against
 * the CPU backend's scalar integer path. The integer sums are the same; the f32 sums of a row's groups differ in
 * order, so an activation of silu(g) u can land one 8-bit step away: within 2e-2 of max|y| (as above; measured on
 * the H200: 1.5e-7), the experts chosen the same and their weights within moe_route's bound. */
static void test_moe_one(void) {
    printf("moe_ffn, one token, shared expert and gate, 8-bit activations\n");
    enum { E = 64, K = 8, H = 256, I = 256 };
    qw_backend *Q = scalar_cpu();
    if (!Q) return;
    char *store;
    qw_ffn_w *ex = q8_experts(E + 1, H, I, &store); /* the last: the shared expert */
    float *sgw = rvec(H, 0.1f);
    qw_tensor sg = {.name = "shared_gate", .data = sgw, .type = QW_TYPE_F32, .n_dims = 2, .shape = {1, H}};
    float *lg = rvec(E, 4), *x = rvec(H, 1), *y = malloc(H * 4), wt[K], gwt[K];
    int32_t sel[K], gsel[K];
    float *dx = dev(x, H * 4), *dlg = dev(lg, E * 4), *dwt = dev(NULL, K * 4), *dy = dev(NULL, H * 4);
    void *qw = malloc(Q->moe_work(Q, 1, K, E, H, I, I));
    Q->moe_ffn(Q, y, x, sel, wt, lg, 1, 1, K, ex, E, &ex[E], &sg, qw); /* (the routing may overwrite lg) */
    int32_t *dsel = dev(NULL, K * 4);
    void *gw = dev(NULL, G->moe_work(G, 1, K, E, H, I, I));
    qw_backend_cuda_set_q8_activations(G, 1);
    G->moe_ffn(G, dy, dx, dsel, dwt, dlg, 1, 1, K, ex, E, &ex[E], &sg, gw);
    qw_backend_cuda_set_q8_activations(G, 0);
    float *gy = back(dy, H * 4);
    G->download(G, gsel, dsel, sizeof(gsel));
    G->download(G, gwt, dwt, sizeof(gwt));
    CHECK(!memcmp(gsel, sel, sizeof(sel)), "moe_ffn, one token: not the CPU's experts");
    CHECK(rel_err(gwt, wt, K, 1e-7) < 1e-6, "moe_ffn, one token: weights, relative error %.2e (as moe_route's)",
          rel_err(gwt, wt, K, 1e-7));
    double ymax = 0, worst = 0;
    for (int i = 0; i < H; i++) ymax = fmax(ymax, fabs(y[i])), worst = fmax(worst, fabs((double)gy[i] - y[i]));
    CHECK(ymax > 0 && worst <= 2e-2 * ymax, "moe_ffn, one token, shared expert and gate: largest difference %.3g of "
          "max|y| %.3g", worst, ymax);
    printf("  largest difference / max|y| %.2e\n", worst / ymax);
    free(gy), free(lg), free(x), free(y), free(qw); /* the weights stay (sgw too) */
    Q->release(Q);
}

static void test_hc_ple(void) {
    printf("hc_read, hc_inject, ple_rows, ple_hist_push, ple_gather, ple_gate\n");
    int T = 5, C = 4, H = 96;
    size_t n = (size_t)T * C * H;
    float *m = rvec(n, 1), *inj = rvec((size_t)T * C, 3), *a = malloc((size_t)T * H * 4), *ginj = malloc((size_t)T * C * 4);
    memcpy(ginj, inj, (size_t)T * C * 4);
    float *da = dev(NULL, (size_t)T * H * 4);
    float *xn = rvec(n, 2), *dxn = dev(xn, n * 4);
    for (int gated = 0; gated < 2; gated++) { /* the plain sum, then the gates on xn */
        float *mr = malloc(n * 4), *dmg = dev(m, n * 4);
        memcpy(mr, m, n * 4);
        memcpy(ginj, inj, (size_t)T * C * 4);
        float *dinj = dev(inj, (size_t)T * C * 4);
        R->hc_read(R, a, mr, NULL, NULL, gated ? xn : NULL, ginj, T, C, H);
        G->hc_read(G, da, dmg, NULL, NULL, gated ? dxn : NULL, dinj, T, C, H);
        float *g = back(da, (size_t)T * H * 4), *gi = back(dinj, (size_t)T * C * 4);
        CHECK(same(g, a, (size_t)T * H * 4) && same(gi, ginj, (size_t)T * C * 4), "hc_read%s: not the reference's bits",
              gated ? " with gates" : "");
        free(g), free(gi), free(mr);
    }
    free(xn);
    float *X = rvec(n, 1), *yv = rvec((size_t)T * H, 1), *dX = dev(X, n * 4);
    float *dinj = dev(ginj, (size_t)T * C * 4), *dyv = dev(yv, (size_t)T * H * 4);
    R->hc_inject(R, X, ginj, yv, T, C, H, NULL, NULL, 0.0f);
    G->hc_inject(G, dX, dinj, dyv, T, C, H, NULL, NULL, 0.0f);
    float *g = back(dX, n * 4);
    CHECK(same(g, X, n * 4), "hc_inject: not the reference's bits");
    free(g);
    /* with the next norm (one kernel on the GPU), twice in a row: the streams the reference's bits, the norm its
     * rms_norm_grouped's bits on the GPU and within that op's bound of the reference (1/rms may round apart) */
    float *nw = rvec((size_t)C * H, 0.5f), *xnr = malloc(n * 4), *dxn2 = dev(NULL, n * 4), *dxn3 = dev(NULL, n * 4);
    for (int rep = 0; rep < 2; rep++) {
        R->hc_inject(R, X, ginj, yv, T, C, H, xnr, nw, 1e-6f);
        G->hc_inject(G, dX, dinj, dyv, T, C, H, dxn2, nw, 1e-6f);
        G->rms_norm_grouped(G, dxn3, dX, nw, T * C, C, H, 1e-6f, 1);
        float *gx = back(dX, n * 4), *gn = back(dxn2, n * 4), *gu = back(dxn3, n * 4);
        CHECK(same(gx, X, n * 4), "hc_inject with the norm (%d): the streams are not the reference's bits", rep);
        CHECK(same(gn, gu, n * 4), "hc_inject with the norm (%d): the norm is not rms_norm_grouped's bits", rep);
        CHECK(rel_err(gn, xnr, n, 1e-6) < 4e-7, "hc_inject with the norm (%d): relative error %.2e", rep,
              rel_err(gn, xnr, n, 1e-6));
        free(gx), free(gn), free(gu);
    }
    free(nw), free(xnr);
    /* PLE: hashing with an EOS in the history and in the step, the history pushed, rows gathered from a table
     * in three pieces (q8_0), the gate */
    int ng = 3, nh = 8, eos = 2;
    uint64_t mult[3] = {0x9E3779B97F4A7C15ull | 1, 0xBF58476D1CE4E5B9ull | 1, 0x94D049BB133111EBull | 1};
    int64_t prime[8], offset[8], total = 0;
    for (int h = 0; h < nh; h++) prime[h] = 101 + 2 * h, offset[h] = total, total += prime[h];
    int32_t tok[5] = {7, 2, 9, 11, 4}, hist[8] = {3, 5};
    int64_t rows[40];
    int32_t *dtok = dev(tok, sizeof(tok)), *dhist = dev(hist, sizeof(hist));
    int64_t *drows = dev(NULL, sizeof(rows));
    R->ple_rows(R, rows, tok, hist, T, ng, nh, eos, mult, prime, offset);
    G->ple_rows(G, drows, dtok, dhist, T, ng, nh, eos, mult, prime, offset);
    int64_t *grows = back(drows, sizeof(rows));
    CHECK(same(grows, rows, sizeof(rows)), "ple_rows: other rows");
    free(grows);
    R->ple_hist_push(R, hist, tok, T, ng);
    G->ple_hist_push(G, dhist, dtok, T, ng);
    int32_t *gh = back(dhist, 2 * 4);
    CHECK(same(gh, hist, 2 * 4), "ple_hist_push: other history");
    free(gh);
    int dh = 64;
    int64_t chunk_rows = (total + 2) / 3;
    qw_tensor chunks[3];
    void *blocks[3];
    for (int c = 0; c < 3; c++) {
        int64_t nr = c < 2 ? chunk_rows : total - 2 * chunk_rows;
        float *f = rvec((size_t)nr * dh, 1);
        blocks[c] = malloc((size_t)nr * qw_type_row_size(QW_TYPE_Q8_0, dh));
        qw_type_traits_of(QW_TYPE_Q8_0)->from_float(f, blocks[c], nr * dh);
        free(f);
        chunks[c] = (qw_tensor){.name = "table", .data = blocks[c], .type = QW_TYPE_Q8_0, .n_dims = 2, .shape = {nr, dh}};
    }
    float *e = malloc((size_t)T * nh * dh * 4), *de = dev(NULL, (size_t)T * nh * dh * 4);
    R->ple_gather(R, e, rows, (int64_t)T * nh, chunks, 3, chunk_rows, 0);
    G->ple_gather(G, de, drows, (int64_t)T * nh, chunks, 3, chunk_rows, 0);
    g = back(de, (size_t)T * nh * dh * 4);
    CHECK(same(g, e, (size_t)T * nh * dh * 4), "ple_gather: not the host's dequantized rows");
    free(g);
    float *K = rvec(n, 1), *Q = rvec(n, 1), *V = rvec((size_t)T * H, 1), *Gr = malloc(n * 4), *dG = dev(NULL, n * 4);
    R->ple_gate(R, Gr, K, Q, V, T, C, H);
    G->ple_gate(G, dG, dev(K, n * 4), dev(Q, n * 4), dev(V, (size_t)T * H * 4), T, C, H);
    g = back(dG, n * 4);
    CHECK(rel_err(g, Gr, n, 1e-6) < 1e-6, "ple_gate: relative error %.2e (CUDA's expf)", rel_err(g, Gr, n, 1e-6));
    free(g), free(K), free(Q), free(V), free(Gr), free(e), free(m), free(inj), free(a), free(ginj), free(X), free(yv);
    for (int c = 0; c < 3; c++) free(blocks[c]);
}

/* Host memory of weights, freed only when the program ends: the backend keeps a weight's device copy under its host
 * address, so an address handed out again would be read as the weights that were there before */
static void *kept[64];
static int n_kept;
static void *keep_alloc(size_t n) {
    if (n_kept == (int)(sizeof(kept) / sizeof(kept[0]))) {
        printf("FAIL: more than %d kept weight buffers\n", n_kept);
        exit(1);
    }
    return kept[n_kept++] = malloc(n);
}

/* a random matrix of rows x cols quantized to type t (its bytes in *store, kept to the program's end) */
static qw_tensor q8_weights(qw_type t, int rows, int cols, void **store) {
    float *wf = rvec((size_t)rows * cols, 1);
    size_t rb = qw_type_row_size(t, cols);
    *store = keep_alloc(rb * rows);
    for (int r = 0; r < rows; r++) qw_quantize(t, wf + (size_t)r * cols, (char *)*store + rb * r, cols);
    free(wf);
    return (qw_tensor){.name = "w", .data = *store, .type = t, .n_dims = 2, .shape = {rows, cols}};
}

/* With 8-bit activations (the integer path): a matmul_batch whose jobs read one x rounds it once and gives the bits
 * of each job as a matmul of its own (which rounds it again). Set 0: jobs 0 and 1 of one type, one x, other row
 * counts (one launch where the backend groups them), job 2 another type on the same x (its rounding used again),
 * job 3 another x; set 1: two pairs of types on one x, rows of 8,192 columns cut into 1, 2 and 4 parts (mvq_ks:
 * 1,100, 300 and 4 rows), each pair one launch; sets 2 and 3: three types on one x, the jobs of one type apart
 * among the others (10,240 columns: the hyper-connections' rows). 1 and 3 tokens (grouped as one token's are); set
 * 3 also PROMPT_TOK tokens (a prompt's rows, more than the fixed 8-bit buffer holds: the prompt's buffer,
 * qwc_q8_big). Then x is written again in place and the batch run again: its first job must round it anew. */
#ifdef QW_CUDA_EMU
#define PROMPT_TOK 40 /* 500 KB of rounded rows of 10,240 columns against the emulated build's fixed 256 KiB */
#else
#define PROMPT_TOK 400 /* 5.1 MB against the backend's fixed 4 MiB */
#endif
static void q8_batch_set(int cols, const qw_type *types, const int *rows, const int *same_x, int max_tok) {
    enum { NJ = 4 };
    void *wq[NJ];
    qw_tensor w[NJ];
    size_t off[NJ + 1] = {0};
    for (int j = 0; j < NJ; j++) {
        w[j] = q8_weights(types[j], rows[j], cols, &wq[j]);
        off[j + 1] = off[j] + (size_t)rows[j];
    }
    static const int toks[] = {1, 3, PROMPT_TOK};
    for (int ti = 0; ti < 3 && toks[ti] <= max_tok; ti++) {
        const int nt = toks[ti];
        float *x1 = rvec((size_t)nt * cols, 1), *x2 = rvec((size_t)nt * cols, 1);
        float *dx1 = dev(x1, (size_t)nt * cols * 4), *dx2 = dev(x2, (size_t)nt * cols * 4);
        size_t ny = off[NJ] * nt;
        float *dy = dev(NULL, ny * 4), *dz = dev(NULL, ny * 4);
        qw_matmul_job jobs[NJ];
        for (int j = 0; j < NJ; j++) jobs[j] = (qw_matmul_job){dy + off[j] * nt, &w[j], same_x[j] ? dx1 : dx2, nt};
        for (int again = 0; again < 2; again++) {
            if (again) { /* x written again where it was */
                for (size_t i = 0; i < (size_t)nt * cols; i++) x1[i] = frand(), x2[i] = frand();
                G->upload(G, dx1, x1, (size_t)nt * cols * 4);
                G->upload(G, dx2, x2, (size_t)nt * cols * 4);
            }
            G->matmul_batch(G, jobs, NJ);
            for (int j = 0; j < NJ; j++) G->matmul(G, dz + off[j] * nt, &w[j], same_x[j] ? dx1 : dx2, nt);
            float *y = back(dy, ny * 4), *z = back(dz, ny * 4);
            CHECK(same(y, z, ny * 4), "matmul_batch with 8-bit activations, %d columns, %s first, %d tokens%s: not the "
                  "bits of the jobs' own matmuls", cols, qw_type_name(types[0]), nt, again ? ", x written again" : "");
            size_t bad = ny; /* the first zero or non-finite output */
            for (size_t i = 0; i < ny && bad == ny; i++)
                if (!isfinite(y[i]) || y[i] == 0) bad = i;
            int bj = 0;
            while (bad < ny && bj + 1 < NJ && bad >= off[bj + 1] * nt) bj++;
            CHECK(bad == ny, "matmul_batch with 8-bit activations, %d columns, %d tokens: output %zu (job %d, %s, "
                  "%d rows: token %zu row %zu) is %g", cols, nt, bad, bj, qw_type_name(types[bj]), rows[bj],
                  bad < ny ? (bad - off[bj] * nt) / rows[bj] : 0, bad < ny ? (bad - off[bj] * nt) % rows[bj] : 0,
                  bad < ny ? y[bad] : 0.0);
            free(y), free(z);
        }
        G->free(G, dx1), G->free(G, dx2), G->free(G, dy), G->free(G, dz);
        free(x1), free(x2);
    }
}

/* A prompt's producer: act_mul of PROMPT_TOK tokens of 10,240 values (more than the fixed 8-bit buffer holds)
 * rounds its output into the prompt's buffer, and the products reading it right after take that rounding (the first
 * job; the second by the batch's rule): the bits of the same products reading a copy of it. Then a product of
 * another x right after act_mul must not take act_mul's rounding. */
static void q8_producer_set(void) {
    enum { NT = PROMPT_TOK, COLS = 10240, NJ = 2 };
    static const qw_type types[NJ] = {QW_TYPE_Q4_K, QW_TYPE_Q8_0};
    static const int rows[NJ] = {64, 4};
    const size_t n = (size_t)NT * COLS;
    void *wq[NJ];
    qw_tensor w[NJ];
    for (int j = 0; j < NJ; j++) w[j] = q8_weights(types[j], rows[j], COLS, &wq[j]);
    float *a = rvec(n, 2), *b = rvec(n, 2);
    float *da = dev(a, n * 4), *db = dev(b, n * 4), *dx = dev(NULL, n * 4);
    G->act_mul(G, dx, da, db, (int64_t)n, QW_ACT_SILU);
    float *x = back(dx, n * 4);
    float *dc = dev(x, n * 4);
    float *dy[NJ], *dz[NJ];
    for (int j = 0; j < NJ; j++) {
        dy[j] = dev(NULL, (size_t)NT * rows[j] * 4);
        dz[j] = dev(NULL, (size_t)NT * rows[j] * 4);
    }
    G->act_mul(G, dx, da, db, (int64_t)n, QW_ACT_SILU); /* written again: its rounding made right before the batch */
    qw_matmul_job jobs[NJ];
    for (int j = 0; j < NJ; j++) jobs[j] = (qw_matmul_job){dy[j], &w[j], dx, NT};
    G->matmul_batch(G, jobs, NJ);
    for (int j = 0; j < NJ; j++) G->matmul(G, dz[j], &w[j], dc, NT);
    for (int j = 0; j < NJ; j++) {
        float *y = back(dy[j], (size_t)NT * rows[j] * 4), *z = back(dz[j], (size_t)NT * rows[j] * 4);
        CHECK(same(y, z, (size_t)NT * rows[j] * 4), "a product of act_mul's %d x %d output (%s), its rounding made by "
              "act_mul: not the bits of the product of a copy", NT, COLS, qw_type_name(types[j]));
        free(y), free(z);
    }
    /* another x right after act_mul: its own rounding (dc holds x's values, so give it others) */
    float *x2 = rvec(n, 1);
    G->upload(G, dc, x2, n * 4);
    G->act_mul(G, dx, da, db, (int64_t)n, QW_ACT_SILU);
    G->matmul(G, dy[0], &w[0], dc, NT);
    float *dc2 = dev(x2, n * 4);
    G->matmul(G, dz[0], &w[0], dc2, NT);
    float *y = back(dy[0], (size_t)NT * rows[0] * 4), *z = back(dz[0], (size_t)NT * rows[0] * 4);
    CHECK(same(y, z, (size_t)NT * rows[0] * 4), "a product of another x right after act_mul: not its own rounding's "
          "bits");
    free(y), free(z), free(x), free(x2), free(a), free(b);
    G->free(G, da), G->free(G, db), G->free(G, dx), G->free(G, dc), G->free(G, dc2);
    for (int j = 0; j < NJ; j++) G->free(G, dy[j]), G->free(G, dz[j]);
}

static void test_q8_batch(void) {
    printf("matmul_batch with 8-bit activations\n");
    static const qw_type t0[4] = {QW_TYPE_Q4_K, QW_TYPE_Q4_K, QW_TYPE_Q8_0, QW_TYPE_Q6_K};
    static const int r0[4] = {96, 40, 64, 96}, x0[4] = {1, 1, 1, 0};
    static const qw_type t1[4] = {QW_TYPE_Q4_K, QW_TYPE_Q4_K, QW_TYPE_Q8_0, QW_TYPE_Q8_0};
    static const int r1[4] = {1100, 300, 4, 67}, x1[4] = {1, 1, 1, 1};
    qw_backend_cuda_set_q8_activations(G, 1);
    q8_batch_set(512, t0, r0, x0, 3);
    q8_batch_set(8192, t1, r1, x1, 3);
    static const qw_type t2[4] = {QW_TYPE_Q6_K, QW_TYPE_Q8_0, QW_TYPE_Q4_K, QW_TYPE_Q6_K};
    static const int r2[4] = {33, 7, 50, 130}, x2[4] = {1, 1, 1, 1};
    q8_batch_set(512, t2, r2, x2, 3);
    static const qw_type t3[4] = {QW_TYPE_Q4_K, QW_TYPE_Q8_0, QW_TYPE_Q6_K, QW_TYPE_Q4_K};
    static const int r3[4] = {320, 4, 5, 64}, x3[4] = {1, 1, 1, 1};
    q8_batch_set(10240, t3, r3, x3, PROMPT_TOK);
    q8_producer_set();
    qw_backend_cuda_set_q8_activations(G, 0);
}

/* hc_read with the up product (one kernel for one token on the integer path): the bits of the GPU's own divide,
 * matmul and hc_read, and against the CPU backend's integer path (scalar kernels: qw_q8a_dot_ref's sums) within
 * 1e-5 of max|a|: silu and the 8-bit rounding are the same operations, the sums of a row's r / 32 groups differ in
 * order (the matrix-vector bound, (ng + 48) u sum|terms| ~ 4e-6 of them) and sigmoid's slope is at most 1/4.
 * Q5_0 and Q8_0 weights, r = 320 (the released width) and 64; 1 token (fused) and 3 (composite). */
static void test_hc_up(void) {
    printf("hc_read with the up product\n");
    enum { C = 4, H = 96 };
    qw_backend *Q = scalar_cpu();
    if (!Q) return;
    static const qw_type types[2] = {QW_TYPE_Q5_0, QW_TYPE_Q8_0};
    static const int rs[2] = {320, 64};
    qw_backend_cuda_set_q8_activations(G, 1);
    for (int ti = 0; ti < 2; ti++)
        for (int ri = 0; ri < 2; ri++)
            for (int T = 1; T <= 3; T += 2) {
                const int r = rs[ri], n = C * H;
                const size_t rb = qw_type_row_size(types[ti], r);
                float *wf = rvec((size_t)n * r, 0.05f);
                void *wq = malloc(rb * n);
                for (int i = 0; i < n; i++) qw_quantize(types[ti], wf + (size_t)i * r, (char *)wq + rb * i, r);
                free(wf);
                qw_tensor up = {.name = "up", .data = wq, .type = types[ti], .n_dims = 2, .shape = {n, r}};
                float *u = rvec((size_t)T * r, 4), *xn = rvec((size_t)T * n, 1), *inj = rvec((size_t)T * C, 2);
                float *m = malloc((size_t)T * n * 4), *a = malloc((size_t)T * H * 4), *ur = malloc((size_t)T * r * 4);
                float *injr = malloc((size_t)T * C * 4);
                memcpy(ur, u, (size_t)T * r * 4), memcpy(injr, inj, (size_t)T * C * 4);
                Q->hc_read(Q, a, m, ur, &up, xn, injr, T, C, H);
                float *du = dev(u, (size_t)T * r * 4), *du2 = dev(u, (size_t)T * r * 4);
                float *dxn = dev(xn, (size_t)T * n * 4);
                float *dinj = dev(inj, (size_t)T * C * 4), *dinj2 = dev(inj, (size_t)T * C * 4);
                float *dm = dev(NULL, (size_t)T * n * 4), *da = dev(NULL, (size_t)T * H * 4);
                float *da2 = dev(NULL, (size_t)T * H * 4);
                G->hc_read(G, da, dm, du, &up, dxn, dinj, T, C, H);
                G->divide(G, du2, (float)C, (int64_t)T * r, 1);
                G->matmul(G, dm, &up, du2, T);
                G->hc_read(G, da2, dm, NULL, NULL, dxn, dinj2, T, C, H);
                float *g = back(da, (size_t)T * H * 4), *g2 = back(da2, (size_t)T * H * 4);
                float *gi = back(dinj, (size_t)T * C * 4), *gi2 = back(dinj2, (size_t)T * C * 4);
                CHECK(same_f(g, g2, (size_t)T * H) && same(gi, gi2, (size_t)T * C * 4), "hc_read with up (%s, r %d, "
                      "%d tokens): not the bits of divide, matmul and hc_read", qw_type_name(types[ti]), r, T);
                double amax = 0, e = 0;
                for (int i = 0; i < T * H; i++) amax = fmax(amax, fabs(a[i])), e = fmax(e, fabs((double)g[i] - a[i]));
                e /= amax;
                CHECK(amax > 0 && e < 1e-5 && same(gi, injr, (size_t)T * C * 4), "hc_read with up (%s, r %d, %d "
                      "tokens): largest difference %.2e of max|a| against the CPU's integer path, or other inject "
                      "weights", qw_type_name(types[ti]), r, T, e);
                free(g), free(g2), free(gi), free(gi2), free(u), free(xn), free(inj), free(m), free(a), free(ur);
                free(injr); /* wq stays: the backend knows the weights by their host address */
            }
    qw_backend_cuda_set_q8_activations(G, 0);
    Q->release(Q);
}

/* the device's topk (model_ops.cu) against the reference's, the same ids and value bits: rows of a vocabulary's
 * width (random, a repeated value across the k-th place, NaN and -inf), k = 1, 41, 64; and a row of fewer values
 * than a chunk. */
void qwc_topk(void *c, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k, void *work);
static void test_topk(void) {
    printf("topk\n");
    static const int ks[] = {1, 41, 64};
    int rows = 3;
    int64_t n = 248320;
    float *x = rvec((size_t)rows * n, 1);
    for (int64_t i = 0; i < 100; i++) x[1 * n + i * 997] = 7.0f; /* ties across the top */
    for (int64_t i = 0; i < n; i += 1009) x[2 * n + i] = i % 2 ? NAN : -INFINITY;
    float *dx = dev(x, (size_t)rows * n * 4);
    for (int q = 0; q < 4; q++) {
        int k = q < 3 ? ks[q] : 64;
        int64_t nn = q < 3 ? n : 300; /* one row of 300 values: one chunk */
        int nr = q < 3 ? rows : 1;
        int32_t want_i[3 * 64], *di = dev(NULL, sizeof(want_i));
        float want_v[3 * 64], *dv = dev(NULL, sizeof(want_v));
        void *work = dev(NULL, qw_topk_work(nr, nn, k));
        R->topk(R, want_i, want_v, x, nr, nn, k, NULL);
        qwc_topk(G, di, dv, q < 3 ? dx : dev(x, (size_t)nn * 4), nr, nn, k, work);
        int32_t *gi = back(di, (size_t)nr * k * 4);
        float *gv = back(dv, (size_t)nr * k * 4);
        CHECK(same(gi, want_i, (size_t)nr * k * 4) && same(gv, want_v, (size_t)nr * k * 4),
              "topk k %d over %lld values: ids or values differ from the reference (first id %d, want %d)", k,
              (long long)nn, gi[0], want_i[0]);
        free(gi), free(gv);
    }
    free(x);
}

static void test_argmax(void) {
    printf("argmax\n");
    /* rows of a vocabulary's width: random, with the largest value repeated (the lower index wins), at the end,
     * and all equal */
    int rows = 4;
    int64_t n = 248320;
    float *x = rvec((size_t)rows * n, 1);
    x[1 * n + 200000] = 5, x[1 * n + 70000] = 5, x[1 * n + 90000] = 5;
    x[2 * n + n - 1] = 9;
    for (int64_t i = 0; i < n; i++) x[3 * n + i] = 0.5f;
    int32_t want[4], *dout = dev(NULL, sizeof(want));
    R->argmax(R, want, x, rows, n);
    G->argmax(G, dout, dev(x, (size_t)rows * n * 4), rows, n);
    int32_t *got = back(dout, sizeof(want));
    CHECK(same(got, want, sizeof(want)) && want[1] == 70000 && want[2] == n - 1 && want[3] == 0,
          "argmax: %d %d %d %d, the reference %d %d %d %d", got[0], got[1], got[2], got[3], want[0], want[1], want[2],
          want[3]);
    free(got), free(x);
}

/* Each head's norm then RoPE as one op: the bits of the GPU's two ops, the reference's within rms_norm's bound;
 * heads strided with a partial rotation (64 of 80: 64 threads a head), and contiguous heads of 256 rotated whole
 * (256 threads); zero-centred and plain weights, in static arrays (the backend knows a weight by its address, and
 * a freed test buffer's may come back from malloc). Last, so that the tests before it see the random values and
 * buffers they always saw. */
static void test_norm_rope(void) {
    printf("rms_norm_rope\n");
    fflush(stdout); /* the name shown should a kernel fault end the process */
    CHECK(G->rms_norm_rope != NULL, "rms_norm_rope: the CUDA backend has none");
    static const int nr_cases[][5] = {{6, 3, 80, 3 * 80 + 16, 64}, {2, 4, 256, 4 * 256, 256}};
    for (int ci = 0; ci < 2; ci++) {
        const int nt = nr_cases[ci][0], nhh = nr_cases[ci][1], hd = nr_cases[ci][2], rs = nr_cases[ci][3];
        const int nrot = nr_cases[ci][4];
        const size_t nb = (size_t)nt * rs * 4;
        float *ifr = malloc((size_t)nrot / 2 * 4), *tab = malloc((size_t)nt * nrot * 4);
        for (int k = 0; k < nrot / 2; k++) ifr[k] = 1.0f / powf(10000.0f, (float)(2 * k) / nrot);
        qw_step st = {.pos0 = 77};
        R->rope_table(R, tab, ifr, nrot, nt, &st);
        static float nw_store[2][256];
        float *dtab = dev(tab, (size_t)nt * nrot * 4), *nw = nw_store[ci], *r = rvec((size_t)hd, 0.5f);
        memcpy(nw, r, (size_t)hd * 4);
        free(r);
        for (int zc = 0; zc < 2; zc++) {
            float *hx = rvec((size_t)nt * rs, 2), *ry = malloc(nb);
            memcpy(ry, hx, nb);
            qw_rms_norm_rope_ops(R, ry, nw, nt, rs, nhh, hd, 1e-6f, zc, nrot, tab);
            float *d1 = dev(hx, nb), *d2 = dev(hx, nb);
            qw_rms_norm_rope_ops(G, d1, nw, nt, rs, nhh, hd, 1e-6f, zc, nrot, dtab);
            qw_be_rms_norm_rope(G, d2, nw, nt, rs, nhh, hd, 1e-6f, zc, nrot, dtab);
            float *g1 = back(d1, nb), *g2 = back(d2, nb);
            CHECK(same_f(g2, g1, (size_t)nt * rs), "rms_norm_rope (heads of %d, zc %d): not the bits of rms_norm then "
                  "rope", hd, zc);
            CHECK(rel_err(g2, ry, (size_t)nt * rs, 1e-6) < 4e-7, "rms_norm_rope (heads of %d, zc %d): relative "
                  "error %.2e", hd, zc, rel_err(g2, ry, (size_t)nt * rs, 1e-6));
            free(hx), free(ry), free(g1), free(g2);
        }
        free(ifr), free(tab);
    }
}

/* the delta rule with its gated norm (delta_rule_gate) against the two ops on the GPU: the same bits, two calls in a
 * row (the second sees the counters the first left); cases the kernel takes (dk 32-128, dv a multiple of 32 under
 * 256) and ones it hands to the two ops (dk 192, dv 40) */
static void test_dr_gate(void) {
    printf("delta_rule_gate\n");
    fflush(stdout);
    CHECK(G->delta_rule_gate != NULL, "delta_rule_gate: the CUDA backend has none");
    static const int cases[][6] = {/* dk, dv, tokens, hk, hv, act */
                                   {128, 128, 1, 4, 8, QW_ACT_SIGMOID}, {128, 128, 40, 2, 4, QW_ACT_SILU},
                                   {64, 64, 3, 2, 6, QW_ACT_SIGMOID},   {32, 96, 5, 1, 3, QW_ACT_SILU},
                                   {192, 128, 2, 2, 4, QW_ACT_SIGMOID}, {64, 40, 2, 2, 2, QW_ACT_SILU}};
    static float nw_store[6][128];
    for (int ci = 0; ci < 6; ci++) {
        const int dk = cases[ci][0], dv = cases[ci][1], Tn = cases[ci][2], hk = cases[ci][3], hv = cases[ci][4];
        const int act = cases[ci][5], tiled = ci == 0;
        const float *w = ci == 3 ? NULL : nw_store[ci];
        for (int i = 0; i < dv; i++) nw_store[ci][i] = 1.0f + 0.5f * frand();
        const size_t qb = (size_t)Tn * hk * dk * 4, ob = (size_t)Tn * hv * dv * 4, sb = (size_t)hv * dk * dv * 4;
        const size_t gb = (size_t)Tn * hv * 4;
        float *q = rvec((size_t)Tn * hk * dk, 0.1f), *kk = rvec((size_t)Tn * hk * dk, 0.1f);
        float *v = rvec((size_t)Tn * hv * dv, 1), *gg = rvec((size_t)Tn * hv, 0.5f);
        float *beta = rvec((size_t)Tn * hv, 0.5f), *z = rvec((size_t)Tn * hv * dv, 2);
        float *S = rvec((size_t)hv * dk * dv, 0.1f);
        for (int i = 0; i < Tn * hv; i++) gg[i] = -fabsf(gg[i]), beta[i] = fabsf(beta[i]);
        float *dq = dev(q, qb), *dk_ = dev(kk, qb), *dv_ = dev(v, ob), *dg = dev(gg, gb), *db = dev(beta, gb);
        float *dz1 = dev(z, ob), *dz2 = dev(z, ob), *dS1 = dev(S, sb), *dS2 = dev(S, sb);
        float *dO1 = dev(NULL, ob), *dO2 = dev(NULL, ob);
        int ok = 1;
        for (int call = 0; call < 2 && ok; call++) {
            G->delta_rule(G, dO1, dS1, dq, dk_, dv_, dg, db, Tn, hk, hv, dk, dv, tiled);
            G->rms_norm_gate(G, dO1, dO1, w, dz1, Tn * hv, dv, 1e-6f, act);
            G->delta_rule_gate(G, dO2, dS2, dq, dk_, dv_, dg, db, Tn, hk, hv, dk, dv, tiled, w, dz2, 1e-6f, act);
            float *o1 = back(dO1, ob), *o2 = back(dO2, ob), *s1 = back(dS1, sb), *s2 = back(dS2, sb);
            ok = same_f(o2, o1, (size_t)Tn * hv * dv) && same_f(s2, s1, (size_t)hv * dk * dv);
            CHECK(ok, "delta_rule_gate dk %d dv %d, %d tokens, call %d: not the bits of delta_rule then rms_norm_gate",
                  dk, dv, Tn, call + 1);
            free(o1), free(o2), free(s1), free(s2);
        }
        free(q), free(kk), free(v), free(gg), free(beta), free(z), free(S);
    }
}

/* the keys' norm, RoPE and both cache stores (rms_norm_rope_kv) against rms_norm_rope and two store_rows: the keys
 * and both whole caches bit for bit */
static void test_norm_rope_kv(void) {
    printf("rms_norm_rope_kv\n");
    fflush(stdout);
    CHECK(G->rms_norm_rope_kv != NULL, "rms_norm_rope_kv: the CUDA backend has none");
    static const int cases[][5] = {{1, 2, 256, 64, 5}, {7, 4, 64, 32, 0}}; /* tokens, heads, hd, n_rot, pos0 */
    static float kw_store[2][256];
    for (int ci = 0; ci < 2; ci++) {
        const int nt = cases[ci][0], nhh = cases[ci][1], hd = cases[ci][2], nrot = cases[ci][3], pos0 = cases[ci][4];
        const int n_ctx = 16, width = nhh * hd;
        const size_t kb = (size_t)nt * width * 4, cb = (size_t)n_ctx * width * 4;
        float *ifr = malloc((size_t)nrot / 2 * 4), *tab = malloc((size_t)nt * nrot * 4);
        for (int k = 0; k < nrot / 2; k++) ifr[k] = 1.0f / powf(10000.0f, (float)(2 * k) / nrot);
        qw_step st = {.pos0 = pos0};
        R->rope_table(R, tab, ifr, nrot, nt, &st);
        for (int i = 0; i < hd; i++) kw_store[ci][i] = 0.5f * frand();
        float *k = rvec((size_t)nt * width, 2), *v = rvec((size_t)nt * width, 1);
        float *cache = rvec((size_t)n_ctx * width, 1);
        float *dtab = dev(tab, (size_t)nt * nrot * 4), *dv_ = dev(v, kb);
        float *dk1 = dev(k, kb), *dk2 = dev(k, kb), *kc1 = dev(cache, cb), *kc2 = dev(cache, cb);
        float *vc1 = dev(cache, cb), *vc2 = dev(cache, cb);
        qw_step *dst = dev_step(pos0);
        G->rms_norm_rope(G, dk1, kw_store[ci], nt, width, nhh, hd, 1e-6f, 1, nrot, dtab);
        G->store_rows(G, kc1, dk1, nt, width, dst);
        G->store_rows(G, vc1, dv_, nt, width, dst);
        G->rms_norm_rope_kv(G, dk2, kw_store[ci], nt, nhh, hd, 1e-6f, 1, nrot, dtab, kc2, dv_, vc2, dst);
        float *k1 = back(dk1, kb), *k2 = back(dk2, kb), *c1 = back(kc1, cb), *c2 = back(kc2, cb);
        float *v1 = back(vc1, cb), *v2 = back(vc2, cb);
        CHECK(same_f(k2, k1, (size_t)nt * width) && same_f(c2, c1, (size_t)n_ctx * width) &&
                  same_f(v2, v1, (size_t)n_ctx * width),
              "rms_norm_rope_kv (%d tokens at %d, heads of %d): not the bits of rms_norm_rope and two store_rows", nt,
              pos0, hd);
        free(ifr), free(tab), free(k), free(v), free(cache), free(k1), free(k2), free(c1), free(c2), free(v1), free(v2);
    }
}

/* a batched step's rows through their own states at once (conv1d_state_rows, delta_rule_rows) against a call a row:
 * the outputs and every row's state bit for bit; up to QW_ROWS_MAX rows, a dilated convolution, a dk the kernel does
 * not take (48: a call a row inside the op) */
static void test_rows(void) {
    printf("conv1d_state_rows, delta_rule_rows\n");
    fflush(stdout);
    CHECK(G->conv1d_state_rows && G->delta_rule_rows, "the CUDA backend lacks conv1d_state_rows or delta_rule_rows");
    if (!G->conv1d_state_rows || !G->delta_rule_rows) return;
    static const int cc[][4] = {{96, 4, 1, 3}, {320, 3, 2, QW_ROWS_MAX}}; /* ch, k, dil, rows */
    static float cw_store[2][320 * 4];
    for (int ci = 0; ci < 2; ci++) {
        const int ch = cc[ci][0], k = cc[ci][1], dil = cc[ci][2], n = cc[ci][3], nh = (k - 1) * dil;
        float *w = cw_store[ci], *x = rvec((size_t)n * ch, 1);
        for (int i = 0; i < ch * k; i++) w[i] = frand();
        const size_t hb = (size_t)nh * ch * 4, yb = (size_t)n * ch * 4;
        float *hist1[QW_ROWS_MAX], *hist2[QW_ROWS_MAX];
        for (int r = 0; r < n; r++) {
            float *h = rvec((size_t)nh * ch, 1);
            hist1[r] = dev(h, hb), hist2[r] = dev(h, hb);
            free(h);
        }
        float *dx = dev(x, yb), *dy1 = dev(NULL, yb), *dy2 = dev(NULL, yb), *seq = dev(NULL, hb + (size_t)ch * 4);
        for (int r = 0; r < n; r++)
            G->conv1d_state(G, dy1 + (size_t)r * ch, dx + (size_t)r * ch, hist1[r], seq, w, 1, ch, k, dil, 1, 0);
        G->conv1d_state_rows(G, dy2, dx, hist2, w, n, ch, k, dil, 1);
        float *y1 = back(dy1, yb), *y2 = back(dy2, yb);
        int ok = same_f(y2, y1, (size_t)n * ch);
        for (int r = 0; r < n && ok; r++) {
            float *h1 = back(hist1[r], hb), *h2 = back(hist2[r], hb);
            ok = same_f(h2, h1, (size_t)nh * ch);
            free(h1), free(h2);
        }
        CHECK(ok, "conv1d_state_rows (%d rows of %d channels, k %d, dilation %d): not the bits of a call a row", n, ch,
              k, dil);
        free(x), free(y1), free(y2);
    }
    static const int dc[][6] = {{128, 128, 4, 8, 3, 1}, {64, 64, 2, 6, QW_ROWS_MAX, 0}, {48, 40, 2, 2, 2, 0}};
    for (int ci = 0; ci < 3; ci++) { /* dk, dv, hk, hv, rows, tiled */
        const int dk = dc[ci][0], dv = dc[ci][1], hk = dc[ci][2], hv = dc[ci][3], n = dc[ci][4], tiled = dc[ci][5];
        const size_t qn = (size_t)n * hk * dk, on = (size_t)n * hv * dv, sn = (size_t)hv * dk * dv, gn = (size_t)n * hv;
        float *q = rvec(qn, 0.1f), *kk = rvec(qn, 0.1f), *v = rvec(on, 1), *gg = rvec(gn, 0.5f), *beta = rvec(gn, 0.5f);
        for (size_t i = 0; i < gn; i++) gg[i] = -fabsf(gg[i]), beta[i] = fabsf(beta[i]);
        float *dq = dev(q, qn * 4), *dk_ = dev(kk, qn * 4), *dv_ = dev(v, on * 4), *dg = dev(gg, gn * 4);
        float *db = dev(beta, gn * 4), *dO1 = dev(NULL, on * 4), *dO2 = dev(NULL, on * 4);
        float *S1[QW_ROWS_MAX], *S2[QW_ROWS_MAX];
        for (int r = 0; r < n; r++) {
            float *S = rvec(sn, 0.1f);
            S1[r] = dev(S, sn * 4), S2[r] = dev(S, sn * 4);
            free(S);
        }
        const size_t kd = (size_t)hk * dk, vd = (size_t)hv * dv;
        for (int r = 0; r < n; r++)
            G->delta_rule(G, dO1 + r * vd, S1[r], dq + r * kd, dk_ + r * kd, dv_ + r * vd, dg + (size_t)r * hv,
                          db + (size_t)r * hv, 1, hk, hv, dk, dv, tiled);
        G->delta_rule_rows(G, dO2, S2, dq, dk_, dv_, dg, db, n, hk, hv, dk, dv, tiled);
        float *o1 = back(dO1, on * 4), *o2 = back(dO2, on * 4);
        int ok = same_f(o2, o1, on);
        for (int r = 0; r < n && ok; r++) {
            float *s1 = back(S1[r], sn * 4), *s2 = back(S2[r], sn * 4);
            ok = same_f(s2, s1, sn);
            free(s1), free(s2);
        }
        CHECK(ok, "delta_rule_rows (%d rows, dk %d, dv %d, tiled %d): not the bits of a call a row", n, dk, dv, tiled);
        free(q), free(kk), free(v), free(gg), free(beta), free(o1), free(o2);
    }
}

/* The delta rule's chunked form (src/cuda/delta_chunk.cu: calls of qw_backend_cuda_set_dr_chunk's tokens or more)
 * against the reference's token-by-token rule on t_kernels.c's random and adversarial decays and betas, with its
 * bound: |chunked - reference| <= 1e-5 ceil(T / 64) B, B the largest entry of the states, values and outputs (the
 * derivation: kernels/delta_chunk.c). dk 32, 64 and 128; partial chunks and partial slabs of 32 columns; a zero and
 * a carried state; Flash-Next's 16 / 48 heads; a prompt over two of its 1,024-token windows. A second run of the
 * same call gives the same bits. (Calls of fewer than 18 tokens stay token by token whatever the setting.) */
static void test_delta_chunk(void) {
    printf("delta_rule, chunked\n");
    fflush(stdout);
    /* g and beta: test_dr_gates' modes (test_check.h) */
    static const struct {
        int T, hk, hv, dk, dv, gm, bm, zero_state;
    } cases[] = {
        {20, 1, 1, 32, 32, 0, 0, 0},     {33, 1, 2, 64, 24, 3, 0, 0},  {63, 2, 4, 32, 17, 1, 2, 0},
        {64, 2, 2, 128, 32, 0, 0, 0},    {65, 1, 3, 64, 40, 3, 3, 0},  {77, 1, 1, 128, 48, 0, 0, 1},
        {130, 2, 6, 64, 128, 2, 0, 0},   {200, 2, 4, 128, 72, 4, 3, 0}, {300, 16, 48, 128, 128, 0, 0, 0},
        {1100, 1, 2, 32, 48, 1, 2, 0},
    };
    qw_backend_cuda_set_dr_chunk(G, 1);
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int T = cases[ci].T, hk = cases[ci].hk, hv = cases[ci].hv, dk = cases[ci].dk, dv = cases[ci].dv;
        const int tiled = (int)(ci % 2);
        const size_t nq = (size_t)T * hk * dk, no = (size_t)T * hv * dv, ns = (size_t)hv * dk * dv;
        float *q = rvec(nq, 1), *kk = rvec(nq, 1), *v = rvec(no, 1), *g = malloc((size_t)T * hv * 4);
        float *beta = malloc((size_t)T * hv * 4);
        for (size_t r = 0; r < (size_t)T * hk; r++) { /* unit keys, queries of norm 1 / sqrt(dk) (the model's) */
            test_l2n(q + r * dk, dk, 1.0f / sqrtf((float)dk));
            test_l2n(kk + r * dk, dk, 1.0f);
        }
        test_dr_gates(g, beta, T, hv, cases[ci].gm, cases[ci].bm, frand);
        float *S0 = rvec(ns, cases[ci].zero_state ? 0.0f : 0.5f), *S = malloc(ns * 4), *o = malloc(no * 4);
        memcpy(S, S0, ns * 4);
        float *dq = dev(q, nq * 4), *dk_ = dev(kk, nq * 4), *dv_ = dev(v, no * 4), *dg = dev(g, (size_t)T * hv * 4);
        float *db = dev(beta, (size_t)T * hv * 4), *dS = dev(S0, ns * 4), *dO = dev(NULL, no * 4);
        float *dS2 = dev(S0, ns * 4), *dO2 = dev(NULL, no * 4);
        G->delta_rule(G, dO, dS, dq, dk_, dv_, dg, db, T, hk, hv, dk, dv, tiled);
        G->delta_rule(G, dO2, dS2, dq, dk_, dv_, dg, db, T, hk, hv, dk, dv, tiled);
        R->delta_rule(R, o, S, q, kk, v, g, beta, T, hk, hv, dk, dv, tiled);
        float *go = back(dO, no * 4), *gS = back(dS, ns * 4), *go2 = back(dO2, no * 4), *gS2 = back(dS2, ns * 4);
        double B = 0, worst = 0;
        for (size_t i = 0; i < ns; i++) B = fmax(B, fmax(fabs(S0[i]), fabs(S[i])));
        for (size_t i = 0; i < no; i++) B = fmax(B, fmax(fabs(v[i]), fabs(o[i])));
        for (size_t i = 0; i < no; i++) worst = fmax(worst, go[i] == go[i] ? fabs((double)go[i] - o[i]) : INFINITY);
        for (size_t i = 0; i < ns; i++) worst = fmax(worst, gS[i] == gS[i] ? fabs((double)gS[i] - S[i]) : INFINITY);
        const double tol = 1e-5 * ((T + 63) / 64) * B;
        printf("  T %4d hk %2d hv %2d dk %3d dv %3d g %d beta %d: max error %.2e of %.2e (%.1f%% of the bound)\n", T,
               hk, hv, dk, dv, cases[ci].gm, cases[ci].bm, worst, B, 100 * worst / tol);
        CHECK(worst <= tol, "chunked delta rule case %zu (T %d, dk %d, dv %d): max error %.3g > bound %.3g", ci, T, dk,
              dv, worst, tol);
        CHECK(same(go, go2, no * 4) && same(gS, gS2, ns * 4), "chunked delta rule case %zu: two runs, other bits", ci);
        free(q), free(kk), free(v), free(g), free(beta), free(S0), free(S), free(o);
        free(go), free(gS), free(go2), free(gS2);
    }
    qw_backend_cuda_set_dr_chunk(G, 0);
}

/* A batched step's attention rows (kv_store_rows, qsa_rows, attention_rows) against each row's own calls
 * (store_rows, qsa_keys, qsa_select, attention of one token): the same caches, pooled keys, positions and outputs,
 * bit for bit. Six sessions at positions 0 to 79 with random history in their caches: rows that complete a QSA
 * block and rows that do not, a session with more blocks than the selection keeps; with QSA's positions and dense. */
static void test_attn_rows(void) {
    printf("kv_store_rows, qsa_rows, attention_rows\n");
    fflush(stdout);
    CHECK(G->kv_store_rows && G->qsa_rows && G->attention_rows, "the CUDA backend lacks the attention rows ops");
    if (!G->kv_store_rows || !G->qsa_rows || !G->attention_rows) return;
    enum { N = 6, NCTX = 80, NH = 4, NKV = 2, HD = 64, NI = 2, IHD = 32, RR = 4, TOPK = 3, NROT = 16 };
    static const int pos[N] = {0, 3, 11, 27, 40, 79};
    static float knorm[IHD], inv[NROT / 2]; /* weights: static, so no host address is reused for other ones */
    for (int d = 0; d < IHD; d++) knorm[d] = 0.3f * frand();
    for (int d = 0; d < NROT / 2; d++) inv[d] = 1.0f / powf(10000.0f, (float)(2 * d) / NROT);
    const int64_t width = NKV * HD, qwd = NH * HD, iw = (NI + 1) * IHD, cap = (TOPK + 1) * RR;
    const size_t cb = (size_t)NCTX * width * 4, rb_ = (size_t)NCTX * IHD * 4, bb = (size_t)(NCTX / RR + 1) * IHD * 4;
    qw_attn_rows ra, rb;
    memset(&ra, 0, sizeof(ra)), memset(&rb, 0, sizeof(rb));
    for (int i = 0; i < N; i++) { /* both sides the same history */
        float *kc = rvec((size_t)NCTX * width, 1), *vc = rvec((size_t)NCTX * width, 1);
        float *raw = rvec((size_t)NCTX * IHD, 1), *blk = rvec((size_t)(NCTX / RR + 1) * IHD, 1);
        ra.k[i] = dev(kc, cb), rb.k[i] = dev(kc, cb), ra.v[i] = dev(vc, cb), rb.v[i] = dev(vc, cb);
        ra.idx_raw[i] = dev(raw, rb_), rb.idx_raw[i] = dev(raw, rb_);
        ra.idx_blk[i] = dev(blk, bb), rb.idx_blk[i] = dev(blk, bb);
        ra.step[i] = rb.step[i] = dev_step(pos[i]);
        free(kc), free(vc), free(raw), free(blk);
    }
    float *hk = rvec((size_t)N * width, 1), *hv = rvec((size_t)N * width, 1), *hq = rvec((size_t)N * qwd, 1);
    float *hi = rvec((size_t)N * iw, 1);
    float *dk_ = dev(hk, (size_t)N * width * 4), *dv_ = dev(hv, (size_t)N * width * 4);
    float *dq = dev(hq, (size_t)N * qwd * 4), *di = dev(hi, (size_t)N * iw * 4);
    int32_t *sa = dev(NULL, (size_t)N * cap * 4), *oa = dev(NULL, 2 * N * 4);
    int32_t *sb = dev(NULL, (size_t)N * cap * 4), *ob = dev(NULL, 2 * N * 4);
    float *out_a = dev(NULL, (size_t)N * qwd * 4), *out_b = dev(NULL, (size_t)N * qwd * 4);
    float *den_a = dev(NULL, (size_t)N * qwd * 4), *den_b = dev(NULL, (size_t)N * qwd * 4);
    const float scale = 1.0f / sqrtf((float)HD);
    G->qsa_select_work(G, NCTX, RR, TOPK);
    for (int i = 0; i < N; i++) { /* a call a row */
        G->store_rows(G, ra.k[i], dk_ + i * width, 1, width, ra.step[i]);
        G->store_rows(G, ra.v[i], dv_ + i * width, 1, width, ra.step[i]);
        G->qsa_keys(G, ra.idx_raw[i], ra.idx_blk[i], di + i * iw + NI * IHD, iw, 1, IHD, RR, knorm, 1e-6f, inv, NROT,
                    ra.step[i]);
        G->qsa_select(G, sa + i * cap, oa + 2 * i, di + i * iw, iw, ra.idx_blk[i], 1, NI, IHD, RR, TOPK, NULL,
                      ra.step[i]);
        G->attention(G, out_a + i * qwd, dq + i * qwd, (int)qwd, ra.k[i], ra.v[i], 1, NH, NKV, HD, scale, sa + i * cap,
                     oa + 2 * i, NULL, ra.step[i]);
        G->attention(G, den_a + i * qwd, dq + i * qwd, (int)qwd, ra.k[i], ra.v[i], 1, NH, NKV, HD, scale, NULL, NULL,
                     NULL, ra.step[i]);
    }
    G->kv_store_rows(G, &rb, dk_, dv_, N, width);
    G->qsa_rows(G, &rb, sb, ob, di, di + NI * IHD, iw, N, NI, IHD, RR, TOPK, knorm, 1e-6f, inv, NROT, NULL);
    G->attention_rows(G, &rb, out_b, dq, (int)qwd, N, NH, NKV, HD, scale, sb, ob, (int)cap, NULL);
    G->attention_rows(G, &rb, den_b, dq, (int)qwd, N, NH, NKV, HD, scale, NULL, NULL, 0, NULL);
    int32_t *goa = back(oa, 2 * N * 4), *gob = back(ob, 2 * N * 4);
    int32_t *gsa = back(sa, (size_t)N * cap * 4), *gsb = back(sb, (size_t)N * cap * 4);
    CHECK(same(goa, gob, 2 * N * 4), "qsa_rows: the offsets differ from the rows' own calls");
    const int nb5 = (pos[5] + 1) / RR; /* the last session keeps TOPK of its blocks, then its tail */
    CHECK(gob[11] == TOPK * RR + pos[5] - nb5 * RR + 1 && nb5 > TOPK, "qsa_rows: the last row keeps %d positions",
          gob[11]);
    for (int i = 0; i < N; i++) {
        const size_t n = (size_t)(goa[2 * i + 1] > 0 && goa[2 * i + 1] <= cap ? goa[2 * i + 1] : 0);
        CHECK(n > 0 && same(gsa + i * cap, gsb + i * cap, n * 4), "qsa_rows row %d: other positions", i);
        float *c1 = back(ra.k[i], cb), *c2 = back(rb.k[i], cb), *c3 = back(ra.v[i], cb), *c4 = back(rb.v[i], cb);
        CHECK(same(c1, c2, cb) && same(c3, c4, cb), "kv_store_rows row %d: the caches differ", i);
        free(c1), free(c2), free(c3), free(c4);
        c1 = back(ra.idx_raw[i], rb_), c2 = back(rb.idx_raw[i], rb_), c3 = back(ra.idx_blk[i], bb);
        c4 = back(rb.idx_blk[i], bb);
        CHECK(same(c1, c2, rb_) && same(c3, c4, bb), "qsa_rows row %d: the indexer's keys differ", i);
        free(c1), free(c2), free(c3), free(c4);
    }
    float *g1 = back(out_a, (size_t)N * qwd * 4), *g2 = back(out_b, (size_t)N * qwd * 4);
    float *g3 = back(den_a, (size_t)N * qwd * 4), *g4 = back(den_b, (size_t)N * qwd * 4);
    CHECK(same_f(g2, g1, (size_t)N * qwd), "attention_rows (QSA positions): not the bits of a call a row");
    CHECK(same_f(g4, g3, (size_t)N * qwd), "attention_rows (dense): not the bits of a call a row");
    CHECK(!same(g1, g3, (size_t)N * qwd * 4), "attention_rows: the selection changed nothing (the test is void)");
    free(g1), free(g2), free(g3), free(g4), free(goa), free(gob), free(gsa), free(gsb), free(hk), free(hv), free(hq);
    free(hi);
}

/* attention_rows with decode attention split along the keys (QWENC_CUDA_ATT_SPLIT 6 ways past
 * QWENC_CUDA_ATT_SPLIT_MIN=30 keys): each row the bits of its own one-token call, dense and over a selection; the rows
 * past 30 keys not the bits of the unsplit kernel (the split ran), the others its bits */
static void test_attn_rows_split(void) {
    printf("attention_rows split along the keys\n");
    fflush(stdout);
    if (!G->attention_rows) return;
    enum { N = 4, NCTX = 90, NH = 8, NKV = 2, HD = 128, CAP = NCTX };
    static const int pos[N] = {5, 29, 41, 89}; /* dense: 6 and 30 keys a block a head, 42 and 90 split */
    const int64_t width = NKV * HD, qwd = NH * HD;
    const size_t cb = (size_t)NCTX * width * 4;
    qw_attn_rows r;
    memset(&r, 0, sizeof(r));
    int32_t hsel[N * CAP], hoff[2 * N];
    for (int i = 0; i < N; i++) {
        float *kc = rvec((size_t)NCTX * width, 1), *vc = rvec((size_t)NCTX * width, 1);
        r.k[i] = dev(kc, cb), r.v[i] = dev(vc, cb), r.step[i] = dev_step(pos[i]);
        free(kc), free(vc);
        int m = 0; /* every other position, and the row's own */
        for (int p = 0; p <= pos[i]; p++)
            if (p % 2 == i % 2 || p == pos[i]) hsel[i * CAP + m++] = p;
        hoff[2 * i] = 0, hoff[2 * i + 1] = m;
    }
    float *hq = rvec((size_t)N * qwd, 1), *dq = dev(hq, (size_t)N * qwd * 4);
    int32_t *dsel = dev(hsel, sizeof(hsel)), *doff = dev(hoff, sizeof(hoff));
    float *da = dev(NULL, (size_t)N * qwd * 4), *db = dev(NULL, (size_t)N * qwd * 4);
    float *du = dev(NULL, (size_t)N * qwd * 4);
    const float scale = 1.0f / sqrtf((float)HD);
    for (int sparse = 0; sparse < 2; sparse++) {
        setenv("QWENC_CUDA_ATT_SPLIT", "1", 1); /* unsplit, a call a row */
        for (int i = 0; i < N; i++)
            G->attention(G, du + i * qwd, dq + i * qwd, (int)qwd, r.k[i], r.v[i], 1, NH, NKV, HD, scale,
                         sparse ? dsel + i * CAP : NULL, sparse ? doff + 2 * i : NULL, NULL, r.step[i]);
        setenv("QWENC_CUDA_ATT_SPLIT", "6", 1), setenv("QWENC_CUDA_ATT_SPLIT_MIN", "30", 1);
        for (int i = 0; i < N; i++)
            G->attention(G, da + i * qwd, dq + i * qwd, (int)qwd, r.k[i], r.v[i], 1, NH, NKV, HD, scale,
                         sparse ? dsel + i * CAP : NULL, sparse ? doff + 2 * i : NULL, NULL, r.step[i]);
        G->attention_rows(G, &r, db, dq, (int)qwd, N, NH, NKV, HD, scale, sparse ? dsel : NULL,
                          sparse ? doff : NULL, sparse ? CAP : 0, NULL);
        unsetenv("QWENC_CUDA_ATT_SPLIT"), unsetenv("QWENC_CUDA_ATT_SPLIT_MIN");
        float *ga = back(da, (size_t)N * qwd * 4), *gb = back(db, (size_t)N * qwd * 4);
        float *gu = back(du, (size_t)N * qwd * 4);
        CHECK(same_f(gb, ga, (size_t)N * qwd), "attention_rows split (%s): not the bits of a call a row",
              sparse ? "selection" : "dense");
        for (int i = 0; i < N; i++) {
            const int nk = sparse ? hoff[2 * i + 1] : pos[i] + 1, split = nk > 30;
            const int eq = same(ga + i * qwd, gu + i * qwd, (size_t)qwd * 4);
            CHECK(split ? !eq : eq, "attention split past 30 keys (%s), row of %d keys: %s the unsplit kernel's bits",
                  sparse ? "selection" : "dense", nk, eq ? "" : "not");
        }
        free(ga), free(gb), free(gu);
    }
    free(hq);
}

int main(void) {
    char desc[320];
    if (!qw_cuda_available(desc, sizeof(desc))) {
        printf("SKIP: %s\n0 passed, 0 failed\n", desc);
        return 0;
    }
    printf("device: %s\n", desc);
    char err[512];
    if (qw_backend_cuda_new(0, &G, err, sizeof(err))) {
        printf("FAIL cuda backend: %s\n0 passed, 1 failed\n", err);
        return 1;
    }
    R = qw_backend_ref();
    test_copies();
    test_norms_elementwise();
    test_rope();
    test_attention();
    test_qsa();
    test_gdn();
    test_moe();
    test_moe_route_ties();
    test_moe_q8();
    test_moe_one();
    test_hc_ple();
    test_hc_up();
    test_argmax();
    test_topk();
    test_q8_batch();
    test_norm_rope();
    test_dr_gate();
    test_norm_rope_kv();
    test_rows();
    test_delta_chunk();
    test_attn_rows();
    test_attn_rows_split();
    G->release(G); /* the test's device buffers go with the process */
    for (int i = 0; i < n_kept; i++) free(kept[i]);
    return test_summary();
}
