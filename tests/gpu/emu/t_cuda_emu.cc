/*
 * t_cuda_emu.cc - kernels of the CUDA backend run on CPU threads through tests/gpu/emu/cuda/cuda_internal.cuh, so that
 * `make test` checks their indexing and math on every machine (tests/gpu/t_cuda_ops.c runs the same checks on a GPU):
 *
 * - the chunked delta rule (src/cuda/delta_chunk.cu) against the reference backend's token-by-token rule, within
 *   t_kernels.c's bound for the chunked form, |chunked - reference| <= 1e-5 ceil(T / 64) B, B the largest entry of
 *   the states, values and outputs (kernels/delta_chunk.c derives it): dk 32, 64 and 128, partial chunks and
 *   partial slabs of 32 state columns, grouped and tiled value heads, decays near 0 and near -30 and mixed, betas 0,
 *   1 and mixed, a zero state, a prompt over two windows; and the calls it must leave to the token kernel (too few
 *   tokens, the setting off, another dk, unaligned rows, a graph being recorded), which launch nothing;
 * - attention (src/cuda/attn.cu: the per-head kernel and the tiled one of prompt steps) against the reference
 *   backend (kernels/ref.c) within t_cuda_ops' bound, 2e-5 on values in [-2, 2], full, causal from a position and
 *   over a selection; QSA's pooled keys within 1e-5 and its positions exactly as the reference's;
 * - decode attention and QSA selection split along the keys (QWENC_CUDA_ATT_SPLIT, QWENC_CUDA_QSA_SPLIT): the same
 *   bound, each query the bits of its own one-query call, the same positions, the counters left at zero;
 * - a batched step's attention rows (kv_store_rows, qsa_rows, attention_rows) against each row's own calls, bit for
 *   bit;
 * - the integer GEMM (src/cuda/mmq.cu: 64 x 64 tiles, the same unrolled, 32 x 32, a grouped product) against the
 *   CPU's integer reference qw_q8a_dot_ref, bit for bit, for every weight type it takes; the 8-bit MMA's fragments
 *   through tests/gpu/emu/cuda/mma.cuh.
 */
#include "cuda/ops_internal.cuh"

/* the kernel files, copied by the Makefile with their dynamic shared memory made plain externs */
#include "delta_chunk.cu"
#include "attn.cu"
#include "mmq.cu"
#include "ops.cu"
#include "model_ops.cu"
#include "quant.cu"
#include "moe.cu"

extern "C" {
#include "kernels/composite.h"
#include "tensor/quant.h"
}
#include "../../test_check.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) { return test_frand(&rng); } /* uniform in [-1, 1) */

/* one call: 1 when the chunked form took it; err: its largest error over B (the bound's unit) */
struct inputs {
    int T, hk, hv, dk, dv, tiled;
    std::vector<float> q, k, v, g, beta, S0;
};

static inputs make_inputs(int T, int hk, int hv, int dk, int dv, int gm, int bm, int zero_state, int tiled) {
    inputs in = {T, hk, hv, dk, dv, tiled, {}, {}, {}, {}, {}, {}};
    const size_t nq = (size_t)T * hk * dk;
    in.q.resize(nq + 4), in.k.resize(nq + 4); /* + 4: room for the unaligned case's shifted rows */
    for (size_t i = 0; i < nq; i++) in.q[i] = frand(), in.k[i] = frand();
    for (size_t r = 0; r < (size_t)T * hk; r++) { /* unit keys, queries of norm 1 / sqrt(dk), as the model makes */
        test_l2n(in.q.data() + r * dk, dk, 1.0f / sqrtf((float)dk));
        test_l2n(in.k.data() + r * dk, dk, 1.0f);
    }
    in.v.resize((size_t)T * hv * dv);
    for (auto &x : in.v) x = frand();
    in.g.resize((size_t)T * hv), in.beta.resize((size_t)T * hv);
    test_dr_gates(in.g.data(), in.beta.data(), T, hv, gm, bm, frand);
    in.S0.resize((size_t)hv * dk * dv);
    for (auto &x : in.S0) x = zero_state ? 0.0f : 0.5f * frand();
    return in;
}

static void test_delta_chunk(void) {
    /* g and beta: test_dr_gates' modes (tests/test_check.h) */
    static const struct {
        int T, hk, hv, dk, dv, gm, bm, zero_state;
    } cases[] = {
        {20, 1, 1, 32, 32, 0, 0, 0},  {33, 1, 2, 64, 24, 3, 0, 0},   {63, 2, 4, 32, 17, 1, 2, 0},
        {64, 2, 2, 128, 32, 0, 0, 0}, {65, 1, 3, 64, 40, 3, 3, 0},   {77, 1, 1, 128, 48, 0, 0, 1},
        {130, 2, 4, 64, 72, 2, 0, 0}, {200, 1, 2, 128, 128, 4, 3, 0}, {1100, 1, 1, 32, 40, 1, 2, 0},
    };
    qwc c = {};
    c.dr_chunk = 1;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int T = cases[ci].T, hk = cases[ci].hk, hv = cases[ci].hv, dk = cases[ci].dk, dv = cases[ci].dv;
        const int tiled = (int)(ci % 2);
        inputs in = make_inputs(T, hk, hv, dk, dv, cases[ci].gm, cases[ci].bm, cases[ci].zero_state, tiled);
        const size_t no = (size_t)T * hv * dv, ns = in.S0.size();
        std::vector<float> o(no, NAN), S = in.S0;
        std::vector<float> ro(no), rS = in.S0; /* the reference backend's token-by-token rule (double sums) */
        qw_backend_ref()->delta_rule(qw_backend_ref(), ro.data(), rS.data(), in.q.data(), in.k.data(), in.v.data(),
                                     in.g.data(), in.beta.data(), T, hk, hv, dk, dv, tiled);
        emu_launches = 0;
        const int took = qwc_delta_chunk(&c, o.data(), S.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                         in.beta.data(), T, hk, hv, dk, dv, tiled);
        double B = 0, worst = 0;
        for (size_t i = 0; i < ns; i++) B = fmax(B, fmax(fabs(in.S0[i]), fabs(rS[i])));
        for (size_t i = 0; i < no; i++) B = fmax(B, fmax(fabs(in.v[i]), fabs(ro[i])));
        for (size_t i = 0; i < no; i++) worst = fmax(worst, o[i] == o[i] ? fabs((double)o[i] - ro[i]) : INFINITY);
        for (size_t i = 0; i < ns; i++) worst = fmax(worst, S[i] == S[i] ? fabs((double)S[i] - rS[i]) : INFINITY);
        const double tol = 1e-5 * ((T + 63) / 64) * B;
        const int windows = (T + DC_WIN - 1) / DC_WIN;
        printf("  T %4d hk %d hv %d dk %3d dv %3d g %d beta %d: max error %.2e of %.2e (%.1f%% of the bound)\n", T,
               hk, hv, dk, dv, cases[ci].gm, cases[ci].bm, worst, B, 100 * worst / tol);
        CHECK(took && emu_launches == 2 * windows, "case %zu: taken %d, %d launches (%d windows)", ci, took,
              emu_launches, windows);
        CHECK(worst <= tol, "case %zu (T %d, dk %d, dv %d): max error %.3g > bound %.3g", ci, T, dk, dv, worst, tol);
    }
    /* the calls it leaves to the token kernel: nothing launched, nothing written */
    {
        inputs in = make_inputs(80, 1, 2, 64, 32, 0, 0, 0, 0);
        std::vector<float> o(in.v.size(), NAN), S = in.S0;
        const float *q = in.q.data(), *k = in.k.data(), *v = in.v.data(), *g = in.g.data(), *b = in.beta.data();
        struct {
            const char *what;
            int setting, recording, T, dk, shift;
        } no[] = {
            {"the setting off", 0, 0, 80, 64, 0},          {"fewer tokens than the setting", 100, 0, 80, 64, 0},
            {"fewer tokens than a graph may hold", 1, 0, QWENC_MAX_DRAFT + 2, 64, 0},
            {"dk 48", 1, 0, 80, 48, 0},                    {"rows not 16-byte aligned", 1, 0, 80, 64, 1},
            {"a graph being recorded", 1, 1, 80, 64, 0},
        };
        for (auto &x : no) {
            qwc d = {};
            d.dr_chunk = x.setting, d.recording = x.recording;
            emu_launches = 0;
            const int took = qwc_delta_chunk(&d, o.data(), S.data(), q + x.shift, k + x.shift, v, g, b, x.T, 1, 2,
                                             x.dk, 32, 0);
            bool same = true;
            for (size_t i = 0; i < o.size(); i++) same = same && o[i] != o[i];
            for (size_t i = 0; i < S.size(); i++) same = same && S[i] == in.S0[i];
            CHECK(!took && !emu_launches && same, "%s: taken %d, %d launches", x.what, took, emu_launches);
            free(d.scratch);
        }
        /* and the shortest call it takes */
        qwc d = {};
        d.dr_chunk = 1;
        CHECK(qwc_delta_chunk(&d, o.data(), S.data(), q, k, v, g, b, QWENC_MAX_DRAFT + 3, 1, 2, 64, 32, 0),
              "%d tokens: not taken", QWENC_MAX_DRAFT + 3);
        free(d.scratch);
    }
    free(c.scratch);
}

/* the CUDA op table as the emulation runs it (attn.cu's ops, store_rows as the host's composite), rows ops on */
static qwc *emu_new(void) {
    qwc *e = (qwc *)calloc(1, sizeof(qwc));
    setenv("QWENC_CUDA_ATT_ROWS", "1", 1);
    qwc_attn_fill(&e->be);
    e->be.store_rows = qw_op_store_rows;
    e->be.name = "cuda (emulated)";
    return e;
}

static std::vector<float> rvec(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = frand() * scale;
    return v;
}

/* attention's kernels against the reference: t_cuda_ops' shapes and cases, fewer and shorter (a barrier of the
 * emulation costs a switch a thread) */
static void test_attention(const qw_backend *G) {
    const qw_backend *R = qw_backend_ref();
    static const int shapes[][3] = {{24, 2, 256}, {8, 2, 128}, {4, 1, 64}};
    static const int cases[][3] = {{1, 90, 0}, {5, 60, 1}, {24, 0, 0}, {20, 40, 1}, {37, 30, 0}}; /* 17 on: tiled */
    const int n_ctx = 100;
    for (auto &sh : shapes) {
        const int nh = sh[0], nkv = sh[1], hd = sh[2];
        std::vector<float> kc = rvec((size_t)n_ctx * nkv * hd, 1), vc = rvec((size_t)n_ctx * nkv * hd, 2);
        for (auto &cs : cases) {
            const int T = cs[0], p0 = cs[1], sparse = cs[2];
            std::vector<float> q = rvec((size_t)T * nh * hd, 2), o((size_t)T * nh * hd), g((size_t)T * nh * hd, NAN);
            std::vector<int32_t> sel, off;
            if (sparse) {
                for (int t = 0; t < T; t++) {
                    off.push_back((int32_t)sel.size());
                    for (int i = 0; i <= p0 + t; i++)
                        if (i % 3 == 0 || i == p0 + t) sel.push_back(i);
                }
                off.push_back((int32_t)sel.size());
            }
            std::vector<char> work(R->attention_work(R, n_ctx, hd) + 1);
            qw_step st = {p0};
            const float scale = 1.0f / sqrtf((float)hd);
            const int32_t *s_ = sparse ? sel.data() : NULL, *o_ = sparse ? off.data() : NULL;
            R->attention(R, o.data(), q.data(), nh * hd, kc.data(), vc.data(), T, nh, nkv, hd, scale, s_, o_,
                         work.data(), &st);
            for (int qt = 0; qt < 2; qt++) { /* dense prompts: k_attention_tiles, then k_attention_qtiles */
                if (qt && (sparse || T <= 16)) break;
                if (qt) setenv("QWENC_CUDA_ATT_QTILES", "1", 1);
                std::fill(g.begin(), g.end(), NAN);
                G->attention(G, g.data(), q.data(), nh * hd, kc.data(), vc.data(), T, nh, nkv, hd, scale, s_, o_,
                             NULL, &st);
                unsetenv("QWENC_CUDA_ATT_QTILES");
                double worst = 0;
                for (size_t i = 0; i < o.size(); i++)
                    worst = fmax(worst, g[i] == g[i] ? fabs((double)g[i] - o[i]) : 1e9);
                CHECK(worst < 2e-5, "attention%s %d heads / %d kv heads x %d, %d queries from %d%s: largest difference "
                      "%.2e (bound 2e-5)", qt ? " (queries tiled)" : "", nh, nkv, hd, T, p0,
                      sparse ? " over a selection" : "", worst);
                if (T > 16) { /* the tiled kernels' loads in place (QWENC_CUDA_ATT_ASYNC=0): the same bits */
                    std::vector<float> h((size_t)T * nh * hd, NAN);
                    setenv("QWENC_CUDA_ATT_ASYNC", "0", 1);
                    if (qt) setenv("QWENC_CUDA_ATT_QTILES", "1", 1);
                    G->attention(G, h.data(), q.data(), nh * hd, kc.data(), vc.data(), T, nh, nkv, hd, scale, s_, o_,
                                 NULL, &st);
                    unsetenv("QWENC_CUDA_ATT_QTILES");
                    unsetenv("QWENC_CUDA_ATT_ASYNC");
                    CHECK(!memcmp(h.data(), g.data(), h.size() * 4), "attention%s %d heads x %d, %d queries: the "
                          "copies a stage ahead not the bits of the loads in place", qt ? " (queries tiled)" : "", nh,
                          hd, T);
                }
            }
        }
    }
}

/* A decode step's attention split along the keys (QWENC_CUDA_ATT_SPLIT) for the queries past
 * QWENC_CUDA_ATT_SPLIT_MIN keys (0, and 200: some queries each way): within t_cuda_ops' bound of the reference, two
 * launches (the split kernel and the per-head kernel, each taking its queries), each query the bits of its own
 * one-query call, those at or below the threshold the bits of the unsplit kernel and those past it not, the counters
 * left at zero; head shapes the tiled kernel lacks go to the per-head kernel alone. */
static void test_attention_split(const qw_backend *G) {
    const qw_backend *R = qw_backend_ref();
    static const int shapes[][3] = {{24, 2, 256}, {8, 2, 128}, {3, 1, 128}};
    static const int cases[][3] = {{1, 0, 0}, {1, 250, 0}, {3, 140, 1}, {5, 290, 0}, {2, 200, 1}, {2, 199, 0}};
    const int n_ctx = 300;
    qwc *c = qwc_of(G);
    for (auto &sh : shapes) {
        const int nh = sh[0], nkv = sh[1], hd = sh[2];
        std::vector<float> kc = rvec((size_t)n_ctx * nkv * hd, 1), vc = rvec((size_t)n_ctx * nkv * hd, 2);
        for (int S : {2, 7, 40}) {
            char sv[16];
            snprintf(sv, sizeof(sv), "%d", S);
            const int min_keys = S == 7 ? 200 : 0;
            for (auto &cs : cases) {
                const int T = cs[0], p0 = cs[1], sparse = cs[2];
                const size_t qw = (size_t)nh * hd;
                std::vector<float> q = rvec((size_t)T * qw, 2), o((size_t)T * qw), g((size_t)T * qw, NAN);
                std::vector<int32_t> sel, off;
                if (sparse) {
                    for (int t = 0; t < T; t++) {
                        off.push_back((int32_t)sel.size());
                        for (int i = 0; i <= p0 + t; i++)
                            if (i % 3 == t % 2 || i == p0 + t) sel.push_back(i);
                    }
                    off.push_back((int32_t)sel.size());
                }
                std::vector<char> work(R->attention_work(R, n_ctx, hd) + 1);
                qw_step st = {p0};
                const float scale = 1.0f / sqrtf((float)hd);
                const int32_t *s_ = sparse ? sel.data() : NULL, *o_ = sparse ? off.data() : NULL;
                R->attention(R, o.data(), q.data(), (int)qw, kc.data(), vc.data(), T, nh, nkv, hd, scale, s_, o_,
                             work.data(), &st);
                std::vector<float> u((size_t)T * qw, NAN); /* unsplit */
                setenv("QWENC_CUDA_ATT_SPLIT", "1", 1);
                G->attention(G, u.data(), q.data(), (int)qw, kc.data(), vc.data(), T, nh, nkv, hd, scale, s_, o_, NULL,
                             &st);
                setenv("QWENC_CUDA_ATT_SPLIT", sv, 1);
                setenv("QWENC_CUDA_ATT_SPLIT_MIN", min_keys ? "200" : "0", 1);
                emu_launches = 0;
                G->attention(G, g.data(), q.data(), (int)qw, kc.data(), vc.data(), T, nh, nkv, hd, scale, s_, o_, NULL,
                             &st);
                const int launches = emu_launches;
                double worst = 0;
                for (size_t i = 0; i < o.size(); i++)
                    worst = fmax(worst, g[i] == g[i] ? fabs((double)g[i] - o[i]) : 1e9);
                bool own = true, zero = true, route = true;
                const int gq = nh / nkv; /* the tiled kernel's heads a kv head */
                const bool tiled = (hd == 256 || hd == 128) &&
                                   (gq == 1 || gq == 2 || gq == 4 || gq == 6 || gq == 8 || gq == 12 || gq == 16);
                for (int t = 0; t < T; t++) { /* query t alone, at its own position */
                    const int nk = sparse ? off[t + 1] - off[t] : p0 + t + 1;
                    const bool eq = !memcmp(u.data() + t * qw, g.data() + t * qw, qw * sizeof(float));
                    if (!tiled || nk <= min_keys) route = route && eq;
                    else if (nk > 8) route = route && !eq; /* (one key: its value, the same bits either way) */
                    std::vector<float> g1(qw, NAN);
                    std::vector<int32_t> s1, o1;
                    if (sparse)
                        s1.assign(sel.begin() + off[t], sel.begin() + off[t + 1]), o1 = {0, off[t + 1] - off[t]};
                    qw_step st1 = {p0 + t};
                    G->attention(G, g1.data(), q.data() + t * qw, (int)qw, kc.data(), vc.data(), 1, nh, nkv, hd, scale,
                                 sparse ? s1.data() : NULL, sparse ? o1.data() : NULL, NULL, &st1);
                    own = own && !memcmp(g1.data(), g.data() + t * qw, qw * sizeof(float));
                }
                unsetenv("QWENC_CUDA_ATT_SPLIT"), unsetenv("QWENC_CUDA_ATT_SPLIT_MIN");
                for (unsigned n : c->counts) zero = zero && !n;
                CHECK(worst < 2e-5, "attention split %d ways, %d heads / %d kv heads x %d, %d queries from %d%s: "
                      "largest difference %.2e (bound 2e-5)", S, nh, nkv, hd, T, p0, sparse ? " over a selection" : "",
                      worst);
                CHECK(own, "attention split %d ways (%d heads x %d, %d queries from %d): a query not the bits of its "
                      "own call", S, nh, hd, T, p0);
                CHECK(route, "attention split %d ways past %d keys (%d heads x %d, %d queries from %d): a query "
                      "on the wrong side of the threshold", S, min_keys, nh, hd, T, p0);
                CHECK(zero, "attention split %d ways: counters not left at zero", S);
                CHECK(launches == (tiled ? 2 : 1), "attention split %d ways: %d launches", S, launches);
            }
        }
    }
}

/* QSA's keys and selection against the reference: pooled keys within 1e-5, the same positions */
static void test_qsa(const qw_backend *G) {
    const qw_backend *R = qw_backend_ref();
    const int ihd = 64, RR = 4, n_ctx = 64, ni = 4, n_rot = 32, topk = 3; /* up to 7 blocks: some left out */
    static const int steps[] = {9, 1, 21, 1, 1, 12}; /* one-token steps at 9, 31 (completing a block) and 32 */
    std::vector<float> knorm = rvec(ihd, 0.3f), inv(n_rot / 2);
    for (int k = 0; k < n_rot / 2; k++) inv[k] = 1.0f / powf(10000.0f, (float)(2 * k) / n_rot);
    std::vector<float> raw((size_t)n_ctx * ihd), blk((size_t)(n_ctx / RR + 1) * ihd), graw = raw, gblk = blk;
    const int64_t width = (int64_t)(ni + 1) * ihd;
    int pos = 0;
    for (int T : steps) {
        std::vector<float> rows = rvec((size_t)T * width, 1);
        qw_step st = {pos};
        R->qsa_keys(R, raw.data(), blk.data(), rows.data() + ni * ihd, width, T, ihd, RR, knorm.data(), 1e-6f,
                    inv.data(), n_rot, &st);
        G->qsa_keys(G, graw.data(), gblk.data(), rows.data() + ni * ihd, width, T, ihd, RR, knorm.data(), 1e-6f,
                    inv.data(), n_rot, &st);
        CHECK(!memcmp(graw.data(), raw.data(), raw.size() * 4), "qsa_keys step at %d: the raw keys differ", pos);
        double e = 0;
        for (size_t k = 0; k < (size_t)(pos + T) / RR * ihd; k++)
            e = fmax(e, fabs((double)gblk[k] - blk[k]) / (fabs((double)blk[k]) + 1e-3));
        CHECK(e < 1e-5, "qsa_keys step at %d: pooled keys, relative error %.2e (bound 1e-5)", pos, e);
        gblk = blk; /* the selection from the same pooled keys on both sides */
        const size_t cap = (size_t)T * (topk + 1) * RR;
        std::vector<int32_t> sel(cap), off(T + 1), gsel(cap, -1), goff(T + 1, -1);
        std::vector<char> work(R->qsa_select_work(R, n_ctx, RR, topk) + 1);
        G->qsa_select_work(G, n_ctx, RR, topk);
        R->qsa_select(R, sel.data(), off.data(), rows.data(), width, blk.data(), T, ni, ihd, RR, topk, work.data(),
                      &st);
        G->qsa_select(G, gsel.data(), goff.data(), rows.data(), width, gblk.data(), T, ni, ihd, RR, topk, NULL, &st);
        CHECK(goff == off && !memcmp(gsel.data(), sel.data(), (size_t)off[T] * 4),
              "qsa_select step at %d: other positions", pos);
        for (const char *S : {"1", "2", "5", "40"}) { /* few queries one block each or split: the same offsets and
                                                        * positions */
            setenv("QWENC_CUDA_QSA_SPLIT", S, 1);
            std::fill(gsel.begin(), gsel.end(), -1), std::fill(goff.begin(), goff.end(), -1);
            emu_launches = 0;
            G->qsa_select(G, gsel.data(), goff.data(), rows.data(), width, gblk.data(), T, ni, ihd, RR, topk, NULL,
                          &st);
            unsetenv("QWENC_CUDA_QSA_SPLIT");
            bool zero = true;
            for (unsigned u : qwc_of(G)->counts) zero = zero && !u;
            CHECK(goff == off && !memcmp(gsel.data(), sel.data(), (size_t)off[T] * 4),
                  "qsa_select split %s ways, step at %d: other positions", S, pos);
            const int launches = strcmp(S, "1") && T <= 16 ? 1 : 2; /* split: the offsets in the same kernel */
            CHECK(emu_launches == launches && zero, "qsa_select split %s ways, step at %d: %d launches (want %d), "
                  "counters %s", S, pos, emu_launches, launches, zero ? "at zero" : "not left at zero");
        }
        pos += T;
    }
}

/* The QSA selection's k-th largest score (qsa_kth, a byte a pass) against a sort, on sets that decide it in each
 * pass: random scores; scores of one exponent that differ in their low bits only; a few values many times over; all
 * zeros; values that differ in the last byte only; more scores than the block's threads */
static void k_kth(const float *sc, int n, int k, unsigned *out) {
    const unsigned v = qsa_kth(sc, n, k);
    if (threadIdx.x == 0) *out = v;
}

static void test_qsa_kth(void) {
    for (int set = 0; set < 5; set++)
        for (int n : {5, 300, 1500}) {
            std::vector<float> sc((size_t)n);
            for (int i = 0; i < n; i++) {
                const float u = 0.5f * (frand() + 1.0f); /* [0, 1) */
                unsigned bits = 0x3F800000u | (unsigned)(u * 4096.0f); /* 1 + a few low bits */
                switch (set) {
                case 0: sc[i] = u * 100.0f; break;
                case 1: memcpy(&sc[i], &bits, 4); break;
                case 2: sc[i] = (float)((int)(u * 3.0f)); break;
                case 3: sc[i] = 0.0f; break;
                default: bits = 0x40000000u | (unsigned)(u * 256.0f), memcpy(&sc[i], &bits, 4); break;
                }
            }
            std::vector<unsigned> want((size_t)n);
            for (int i = 0; i < n; i++) memcpy(&want[i], &sc[i], 4);
            std::sort(want.begin(), want.end(), std::greater<unsigned>());
            for (int k : {1, 2, n / 2 + 1, n - 1, n}) {
                if (k < 1 || k > n) continue;
                unsigned got = 0;
                qwc_launch(k_kth, dim3(1), dim3(256), 0, 0, (const float *)sc.data(), n, k, &got);
                CHECK(got == want[(size_t)k - 1], "qsa_kth set %d, %d scores, k %d: %08x, want %08x", set, n, k, got,
                      want[(size_t)k - 1]);
            }
        }
}

/* a batched step's attention rows against each row's own calls: t_cuda_ops' test_attn_rows */
static void test_attn_rows(const qw_backend *G) {
    enum { N = 6, NCTX = 80, NH = 4, NKV = 2, HD = 64, NI = 2, IHD = 32, RR = 4, TOPK = 3, NROT = 16 };
    static const int pos[N] = {0, 3, 11, 27, 40, 79};
    std::vector<float> knorm = rvec(IHD, 0.3f), inv(NROT / 2);
    for (int d = 0; d < NROT / 2; d++) inv[d] = 1.0f / powf(10000.0f, (float)(2 * d) / (float)NROT);
    const int64_t width = NKV * HD, qwd = NH * HD, iw = (NI + 1) * IHD, cap = (TOPK + 1) * RR;
    std::vector<std::vector<float>> mem; /* both sides' caches, the same history */
    qw_attn_rows ra, rb;
    memset(&ra, 0, sizeof(ra)), memset(&rb, 0, sizeof(rb));
    qw_step steps[N];
    for (int i = 0; i < N; i++) {
        for (int side = 0; side < 2; side++) {
            qw_attn_rows &r = side ? rb : ra;
            rng = 0x1234567ull + (uint64_t)i; /* the same history on both sides */
            mem.push_back(rvec((size_t)NCTX * width, 1)), r.k[i] = mem.back().data();
            mem.push_back(rvec((size_t)NCTX * width, 1)), r.v[i] = mem.back().data();
            mem.push_back(rvec((size_t)NCTX * IHD, 1)), r.idx_raw[i] = mem.back().data();
            mem.push_back(rvec((size_t)(NCTX / RR + 1) * IHD, 1)), r.idx_blk[i] = mem.back().data();
        }
        steps[i].pos0 = pos[i];
        ra.step[i] = rb.step[i] = &steps[i];
    }
    std::vector<float> k = rvec((size_t)N * width, 1), v = rvec((size_t)N * width, 1), q = rvec((size_t)N * qwd, 1);
    std::vector<float> iq = rvec((size_t)N * iw, 1);
    std::vector<int32_t> sa((size_t)N * cap, -1), oa(2 * N, -1), sb((size_t)N * cap, -1), ob(2 * N, -1);
    std::vector<float> out_a((size_t)N * qwd), out_b(out_a.size()), den_a(out_a.size()), den_b(out_a.size());
    const float scale = 1.0f / sqrtf((float)HD);
    G->qsa_select_work(G, NCTX, RR, TOPK);
    for (int i = 0; i < N; i++) { /* a call a row */
        G->store_rows(G, ra.k[i], k.data() + i * width, 1, width, ra.step[i]);
        G->store_rows(G, ra.v[i], v.data() + i * width, 1, width, ra.step[i]);
        G->qsa_keys(G, ra.idx_raw[i], ra.idx_blk[i], iq.data() + i * iw + NI * IHD, iw, 1, IHD, RR, knorm.data(),
                    1e-6f, inv.data(), NROT, ra.step[i]);
        G->qsa_select(G, sa.data() + i * cap, oa.data() + 2 * i, iq.data() + i * iw, iw, ra.idx_blk[i], 1, NI, IHD,
                      RR, TOPK, NULL, ra.step[i]);
        G->attention(G, out_a.data() + i * qwd, q.data() + i * qwd, (int)qwd, ra.k[i], ra.v[i], 1, NH, NKV, HD, scale,
                     sa.data() + i * cap, oa.data() + 2 * i, NULL, ra.step[i]);
        G->attention(G, den_a.data() + i * qwd, q.data() + i * qwd, (int)qwd, ra.k[i], ra.v[i], 1, NH, NKV, HD, scale,
                     NULL, NULL, NULL, ra.step[i]);
    }
    emu_launches = 0;
    G->kv_store_rows(G, &rb, k.data(), v.data(), N, width);
    G->qsa_rows(G, &rb, sb.data(), ob.data(), iq.data(), iq.data() + NI * IHD, iw, N, NI, IHD, RR, TOPK, knorm.data(),
                1e-6f, inv.data(), NROT, NULL);
    G->attention_rows(G, &rb, out_b.data(), q.data(), (int)qwd, N, NH, NKV, HD, scale, sb.data(), ob.data(),
                      (int)cap, NULL);
    G->attention_rows(G, &rb, den_b.data(), q.data(), (int)qwd, N, NH, NKV, HD, scale, NULL, NULL, 0, NULL);
    CHECK(emu_launches == 5, "the rows ops: %d launches for 6 rows (5: one store, two QSA, two attention)",
          emu_launches);
    CHECK(oa == ob, "qsa_rows: the offsets differ from the rows' own calls");
    const int nb5 = (pos[5] + 1) / RR;
    CHECK(ob[11] == TOPK * RR + pos[5] - nb5 * RR + 1 && nb5 > TOPK, "qsa_rows: the last row keeps %d positions",
          ob[11]);
    for (int i = 0; i < N; i++) {
        const size_t n = (size_t)(oa[2 * i + 1] > 0 && oa[2 * i + 1] <= cap ? oa[2 * i + 1] : 0);
        CHECK(n > 0 && !memcmp(sa.data() + i * cap, sb.data() + i * cap, n * 4), "qsa_rows row %d: other positions", i);
        CHECK(!memcmp(ra.k[i], rb.k[i], NCTX * width * 4) && !memcmp(ra.v[i], rb.v[i], NCTX * width * 4),
              "kv_store_rows row %d: the caches differ", i);
        CHECK(!memcmp(ra.idx_raw[i], rb.idx_raw[i], NCTX * IHD * 4) &&
                  !memcmp(ra.idx_blk[i], rb.idx_blk[i], (NCTX / RR + 1) * IHD * 4),
              "qsa_rows row %d: the indexer's keys differ", i);
    }
    CHECK(!memcmp(out_a.data(), out_b.data(), out_a.size() * 4), "attention_rows (QSA): not the bits of a call a row");
    CHECK(!memcmp(den_a.data(), den_b.data(), den_a.size() * 4),
          "attention_rows (dense): not the bits of a call a row");
    CHECK(memcmp(out_a.data(), den_a.data(), out_a.size() * 4), "attention_rows: the selection changed nothing");
}

/* attention_rows with decode attention split along the keys past 30 keys (QWENC_CUDA_ATT_SPLIT_MIN): two launches
 * (the rows' split kernel and their per-head kernel), each row the bits of its own call, dense and over a selection */
static void test_attn_rows_split(const qw_backend *G) {
    enum { N = 4, NCTX = 90, NH = 8, NKV = 2, HD = 128, CAP = NCTX };
    static const int pos[N] = {5, 29, 41, 89}; /* dense: 6 and 30 keys a block a head, 42 and 90 split */
    const int64_t width = NKV * HD, qwd = NH * HD;
    std::vector<std::vector<float>> mem;
    qw_attn_rows r;
    memset(&r, 0, sizeof(r));
    qw_step steps[N];
    std::vector<int32_t> sel((size_t)N * CAP), off(2 * N);
    for (int i = 0; i < N; i++) {
        mem.push_back(rvec((size_t)NCTX * width, 1)), r.k[i] = mem.back().data();
        mem.push_back(rvec((size_t)NCTX * width, 1)), r.v[i] = mem.back().data();
        steps[i].pos0 = pos[i];
        r.step[i] = &steps[i];
        int m = 0; /* every other position, and the row's own */
        for (int p = 0; p <= pos[i]; p++)
            if (p % 2 == i % 2 || p == pos[i]) sel[(size_t)i * CAP + m++] = p;
        off[2 * i] = 0, off[2 * i + 1] = m;
    }
    std::vector<float> q = rvec((size_t)N * qwd, 1);
    const float scale = 1.0f / sqrtf((float)HD);
    setenv("QWENC_CUDA_ATT_SPLIT", "6", 1);
    setenv("QWENC_CUDA_ATT_SPLIT_MIN", "30", 1);
    for (int sparse = 0; sparse < 2; sparse++) {
        std::vector<float> out_a((size_t)N * qwd, NAN), out_b(out_a.size(), NAN);
        for (int i = 0; i < N; i++)
            G->attention(G, out_a.data() + i * qwd, q.data() + i * qwd, (int)qwd, r.k[i], r.v[i], 1, NH, NKV, HD, scale,
                         sparse ? sel.data() + i * CAP : NULL, sparse ? off.data() + 2 * i : NULL, NULL, r.step[i]);
        emu_launches = 0;
        G->attention_rows(G, &r, out_b.data(), q.data(), (int)qwd, N, NH, NKV, HD, scale, sparse ? sel.data() : NULL,
                          sparse ? off.data() : NULL, sparse ? CAP : 0, NULL);
        CHECK(emu_launches == 2, "attention_rows split along the keys: %d launches for %d rows", emu_launches, N);
        CHECK(!memcmp(out_a.data(), out_b.data(), out_a.size() * 4),
              "attention_rows split along the keys (%s): not the bits of a call a row", sparse ? "selection" : "dense");
    }
    unsetenv("QWENC_CUDA_ATT_SPLIT"), unsetenv("QWENC_CUDA_ATT_SPLIT_MIN");
}

/* the matrix-vector kernels' bound of a row's integer dot against qw_q8a_dot_ref (cols columns, ng groups), which the
 * integer GEMM's fused terms (QWENC_CUDA_MMQ_FAST) are held to */
static double q8_bound(qw_type t, const uint8_t *row, const qw_q8a *xq, int64_t cols) {
    return (double)(cols / 32 + 48) * ldexp(1.0, -24) * qw_q8a_dot_abs(t, row, xq, cols);
}

/* The integer GEMM (mmq.cu) against the CPU's integer reference: every output qw_q8a_dot_ref's bits, for each kernel
 * variant (64 x 64 tiles, the same with the group loop unrolled (QWENC_CUDA_MMQ_UNROLL), 32 x 32 tiles) launched as
 * mmq_launch launches them, over rows and tokens that end inside a tile (a warp's empty n tiles computed, and
 * skipped: QWENC_CUDA_MMQ_SKIP); the MMA's fragments emulated
 * (tests/gpu/emu/cuda/mma.cuh) in the PTX ISA's layout, which the kernel's own loads assume. */
template <int T> static void test_mmq_type(void) {
    const qw_type t = (qw_type)T;
    const int64_t rows = 70, cols = qw_type_traits_of(t)->block_elems == 256 ? 512 : 480; /* 480: a short step */
    const int64_t ng = cols / 32, rb = (int64_t)qw_type_row_size(t, cols);
    const int n_tok = 67;
    std::vector<float> wf = rvec((size_t)(rows * cols), 1), x = rvec((size_t)n_tok * cols, 2);
    std::vector<uint8_t> w((size_t)(rows * rb));
    for (int64_t r = 0; r < rows; r++) qw_quantize(t, wf.data() + r * cols, w.data() + r * rb, cols);
    std::vector<qw_q8a> xq((size_t)(n_tok * ng));
    for (int k = 0; k < n_tok; k++) qw_q8a_quantize(x.data() + k * cols, xq.data() + k * ng, cols);
    std::vector<float> want((size_t)n_tok * rows);
    for (int k = 0; k < n_tok; k++)
        for (int64_t r = 0; r < rows; r++)
            want[(size_t)(k * rows + r)] = qw_q8a_dot_ref(t, w.data() + r * rb, xq.data() + k * ng, cols);
    mmq_args a = {};
    a.w = w.data(), a.rows = rows, a.row_bytes = rb, a.ng = ng, a.xq = xq.data(), a.xq_tok = ng, a.ldy = rows;
    a.n_tok = n_tok;
    static const char *const name[] = {"64 x 64", "64 x 64 unrolled", "32 x 32"};
    for (int vs = 0; vs < 6; vs++) {
        const int v = vs % 3;
        a.skip = vs / 3; /* the empty n tiles computed, then skipped */
        std::vector<float> y(want.size(), NAN);
        a.y = y.data();
        const int tile = v < 2 ? 64 : 32;
        const dim3 grid((unsigned)((rows + tile - 1) / tile), (unsigned)((n_tok + tile - 1) / tile), 1);
        if (v == 0) qwc_launch(k_mmq<T, 2, 4, 4>, grid, THREADS, 0, 0, a);
        if (v == 1) qwc_launch(k_mmq<T, 2, 4, 3, true>, grid, THREADS, 0, 0, a);
        if (v == 2) qwc_launch(k_mmq<T, 1, 2, 6>, grid, THREADS, 0, 0, a);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < y.size(); i++)
            if (memcmp(&y[i], &want[i], 4) && !bad++) first = i;
        CHECK(!bad, "mmq %s, %s tiles%s: %zu of %zu outputs not qw_q8a_dot_ref's bits (token %zu row %zu: %.9g, not "
              "%.9g)", qw_type_name(t), name[v], a.skip ? ", empty n tiles skipped" : "", bad, y.size(), first / rows,
              first % rows, y[first], want[first]);
    }
    /* the terms as fused multiply-adds (QWENC_CUDA_MMQ_FAST): within (ng + 48) 2^-24 qw_q8a_dot_abs of the
     * reference, the two tile shapes the same bits */
    std::vector<float> yb(want.size(), NAN), ys(want.size(), NAN);
    a.skip = 1;
    a.y = yb.data();
    qwc_launch((k_mmq<T, 2, 4, 3, true, true>), dim3((unsigned)((rows + 63) / 64), (unsigned)((n_tok + 63) / 64), 1),
               THREADS, 0, 0, a);
    a.y = ys.data();
    qwc_launch((k_mmq<T, 1, 2, 6, false, true>), dim3((unsigned)((rows + 31) / 32), (unsigned)((n_tok + 31) / 32), 1),
               THREADS, 0, 0, a);
    size_t over = 0, differ = 0, exact = 0;
    double worst = 0;
    for (int k = 0; k < n_tok; k++)
        for (int64_t r = 0; r < rows; r++) {
            const size_t i = (size_t)(k * rows + r);
            const double bound = q8_bound(t, w.data() + r * rb, xq.data() + k * ng, cols);
            const double e = fabs((double)yb[i] - (double)want[i]);
            if (!(e <= bound)) over++;
            if (bound > 0) worst = std::max(worst, e / bound);
            differ += memcmp(&yb[i], &ys[i], 4) != 0;
            exact += memcmp(&yb[i], &want[i], 4) == 0;
        }
    CHECK(!over, "mmq %s, fused terms: %zu of %zu outputs past (ng + 48) 2^-24 sum|terms| of qw_q8a_dot_ref (worst "
          "%.2f of it)", qw_type_name(t), over, yb.size(), worst);
    CHECK(!differ, "mmq %s, fused terms: %zu outputs differ between the 64 x 64 and 32 x 32 tiles", qw_type_name(t),
          differ);
    CHECK(exact < yb.size(), "mmq %s, fused terms: every output qw_q8a_dot_ref's bits (is the fused path taken?)",
          qw_type_name(t));
}

/* A grouped product (the MoE's prompt path) through qwc_mmq_grouped: three experts of 0, 5 and 40 rows, each row the
 * bits of qw_q8a_dot_ref, or with QWENC_CUDA_MMQ_FAST=1 those of its own expert's plain product (fused terms) */
static void test_mmq_grouped(void) {
    const qw_type t = QW_TYPE_Q4_K;
    const int E = 3, rows_e[E] = {0, 5, 40};
    const int64_t rows = 48, cols = 256, ng = cols / 32, rb = (int64_t)qw_type_row_size(t, cols);
    std::vector<std::vector<uint8_t>> w(E, std::vector<uint8_t>((size_t)(rows * rb)));
    const void *tab[E];
    for (int e = 0; e < E; e++) {
        std::vector<float> wf = rvec((size_t)(rows * cols), 1);
        for (int64_t r = 0; r < rows; r++) qw_quantize(t, wf.data() + r * cols, w[e].data() + r * rb, cols);
        tab[e] = w[e].data();
    }
    int32_t offs[E + 1] = {0};
    for (int e = 0; e < E; e++) offs[e + 1] = offs[e] + rows_e[e];
    const int R = offs[E];
    std::vector<float> x = rvec((size_t)R * cols, 2), y((size_t)R * rows, NAN);
    std::vector<qw_q8a> xq((size_t)(R * ng));
    for (int k = 0; k < R; k++) qw_q8a_quantize(x.data() + k * cols, xq.data() + k * ng, cols);
    std::vector<int32_t> tiles(2 * (E + 1), -1);
    qwc c = {};
    qwc_mmq_tiles(&c, tiles.data(), offs, E);
    qwc_mmq_grouped(&c, y.data(), rows, tab, t, rows, cols, xq.data(), offs, tiles.data(), E, R);
    /* the default: qw_q8a_dot_ref's bits; QWENC_CUDA_MMQ_FAST=1 in the environment (fused terms): each expert's rows
     * the bits of a plain product of that expert's matrix (the 32 x 32 tiles' fused kernel) and within the
     * matrix-vector bound of qw_q8a_dot_ref */
    const char *fe = getenv("QWENC_CUDA_MMQ_FAST");
    const bool fused = fe && fe[0] && fe[0] != '0';
    size_t bad = 0, over = 0;
    for (int e = 0; e < E; e++) {
        const int n = offs[e + 1] - offs[e];
        std::vector<float> yp((size_t)n * rows, NAN);
        if (fused && n) {
            mmq_args a = {};
            a.w = w[e].data(), a.rows = rows, a.row_bytes = rb, a.ng = ng, a.xq = xq.data() + offs[e] * ng;
            a.xq_tok = ng, a.ldy = rows, a.n_tok = n, a.skip = 1, a.y = yp.data();
            qwc_launch((k_mmq<QW_TYPE_Q4_K, 1, 2, 6, false, true>),
                       dim3((unsigned)((rows + 31) / 32), (unsigned)((n + 31) / 32), 1), THREADS, 0, 0, a);
        }
        for (int k = offs[e]; k < offs[e + 1]; k++)
            for (int64_t r = 0; r < rows; r++) {
                const float got = y[(size_t)(k * rows + r)];
                const float want = qw_q8a_dot_ref(t, w[e].data() + r * rb, xq.data() + k * ng, cols);
                if (!fused) {
                    bad += memcmp(&got, &want, 4) != 0;
                    continue;
                }
                bad += memcmp(&got, &yp[(size_t)((k - offs[e]) * rows + r)], 4) != 0;
                const double bound = q8_bound(t, w[e].data() + r * rb, xq.data() + k * ng, cols);
                over += !(fabs((double)got - (double)want) <= bound);
            }
    }
    CHECK(!bad, "mmq grouped (experts of 0, 5 and 40 rows): %zu outputs not %s bits", bad,
          fused ? "a plain product's (fused terms)" : "qw_q8a_dot_ref's");
    CHECK(!over, "mmq grouped (experts of 0, 5 and 40 rows), fused terms: %zu outputs past the matrix-vector bound",
          over);
    CHECK(tiles[1] == 0 && tiles[2] == 1 && tiles[3] == 2, "mmq tiles: the 64-token prefix %d %d %d", tiles[1],
          tiles[2], tiles[3]);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* each part's line as it starts */
    printf("delta_rule, chunked\n");
    test_delta_chunk();
    qwc *e = emu_new();
    printf("attention\n");
    test_attention(&e->be);
    printf("attention of decode steps split along the keys\n");
    test_attention_split(&e->be);
    printf("qsa_keys, qsa_select\n");
    test_qsa(&e->be);
    test_qsa_kth();
    printf("kv_store_rows, qsa_rows, attention_rows\n");
    test_attn_rows(&e->be);
    test_attn_rows_split(&e->be);
    printf("the integer GEMM (mmq.cu) against qw_q8a_dot_ref\n");
    test_mmq_type<QW_TYPE_Q8_0>();
    test_mmq_type<QW_TYPE_Q4_0>();
    test_mmq_type<QW_TYPE_Q4_1>();
    test_mmq_type<QW_TYPE_Q5_0>();
    test_mmq_type<QW_TYPE_Q5_1>();
    test_mmq_type<QW_TYPE_Q4_K>();
    test_mmq_type<QW_TYPE_Q5_K>();
    test_mmq_type<QW_TYPE_Q6_K>();
    test_mmq_type<QW_TYPE_IQ4_NL>();
    test_mmq_type<QW_TYPE_IQ4_XS>();
    test_mmq_grouped();
    free(e);
    return test_summary();
}
