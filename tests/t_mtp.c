/*
 * t_mtp.c - the MTP draft head, on its fixtures (tests/fixtures/mtp/<arch>: a random head for qwen4_exp, qwen3_5,
 * qwen3_5_moe and qwen3_next; tests/fixtures/tiny-flash: the bundled model's trained head), against the reference
 * of tests/gen/make_mtp_fixtures.py (transformers' own layers assembled as the spec's head).
 *
 * For every fixture:
 *   - the head at every position p of the fixture's tokens (fed one at a time; the head reads the token at p + 1),
 *     against mtp_logits row p: relative L2 error of all rows together below 1e-4 and the same argmax in every
 *     row (the bar of t_model.c: f32 summation order);
 *   - the same at a few cut points after the prompt was fed in steps of 5 tokens (the head catches up over the
 *     steps' rows), and after draft steps of which 0..5 tokens were kept (the catch-up of accepted tokens);
 *   - three chained head steps after the whole prompt against mtp_chain;
 *   - a snapshot restores the head's caches (the same bits after a restore), and is refused by a session without
 *     them; the head written to GGUF (qwenc_model_save_gguf F32) and read back gives the reference logits;
 *     --no-mtp (no_draft_head) leaves it out;
 *   - speculative greedy decoding with the head's drafts gives the tokens of plain greedy decoding (random heads:
 *     most drafts are rejected, so the rollback runs nearly every step);
 *   - misuse is refused: a session without the head's caches, no token fed, more than QWENC_MAX_DRAFT steps.
 * Usage: t_mtp [--backend NAME] [ROOT] (ROOT: tests/fixtures). Without --backend: on the CPU, then the random
 * heads again in its guard mode (activations and state inaccessible outside the backend's calls).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qwenc.h"
#include "test_util.h"

#define TOL 1e-4

typedef struct {
    const char *name;
    qwenc_model *m;
    int V, T;
    int32_t *ids, *chain;
    float *ref, *ref_chain; /* [T-1][V], [3][V] */
} fixture;

static qwenc_session *open_session(const fixture *fx, int n_batch, int head) {
    char err[512];
    qwenc_session_params sp = {.n_ctx = fx->T + 8, .n_batch = n_batch, .draft_head = head};
    qwenc_session *s = NULL;
    if (qwenc_session_init(fx->m, &sp, &s, err, sizeof(err))) {
        CHECK(0, "%s: session: %s", fx->name, err);
        return NULL;
    }
    return s;
}

static void check_rows(const fixture *fx, const char *what, const float *got, const float *ref, int rows) {
    test_cmp r = test_compare_logits(got, ref, (size_t)rows, (size_t)fx->V);
    if (getenv("T_MTP_VERBOSE")) printf("    %s: %s: rel L2 %.2e\n", fx->name, what, r.rel_l2);
    CHECK(r.rel_l2 < TOL && r.argmax_mismatch == 0, "%s: %s: relative L2 %.3e, %d rows with another argmax (first %d)",
          fx->name, what, r.rel_l2, r.argmax_mismatch, r.first_mismatch);
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Fed one token at a time, the head at every position. */
static void test_every_position(const fixture *fx) {
    char err[512];
    qwenc_session *s = open_session(fx, 8, 1);
    if (!s) return;
    float *got = malloc((size_t)(fx->T - 1) * fx->V * sizeof(float));
    int ok = 1, best_ok = 1;
    for (int p = 0; p + 1 < fx->T && ok; p++) {
        int32_t best = -1;
        ok = !qwenc_session_forward(s, fx->ids + p, 1, NULL, 0, err, sizeof(err)) &&
             !qwenc_session_draft_head(s, fx->ids[p + 1], got + (size_t)p * fx->V, &best, err, sizeof(err));
        best_ok &= best == argmax(got + (size_t)p * fx->V, fx->V);
    }
    CHECK(ok, "%s: token by token: %s", fx->name, err);
    CHECK(best_ok, "%s: the head's arg max is not that of its logits", fx->name);
    if (ok) check_rows(fx, "every position, fed a token at a time", got, fx->ref, fx->T - 1);
    /* the chain after the whole prompt */
    float chain[3 * 8192];
    ok = fx->V <= 8192 && !qwenc_session_forward(s, fx->ids + fx->T - 1, 1, NULL, 0, err, sizeof(err));
    for (int j = 0; j < 3 && ok; j++)
        ok = !qwenc_session_draft_head(s, fx->chain[j], chain + (size_t)j * fx->V, NULL, err, sizeof(err));
    CHECK(ok, "%s: chain: %s", fx->name, err);
    if (ok) check_rows(fx, "three chained head steps", chain, fx->ref_chain, 3);
    free(got);
    qwenc_session_free(s);
}

/* The prompt in steps of 5 tokens, cut at a few points. */
static void test_cuts(const fixture *fx) {
    char err[512];
    int cuts[] = {1, 6, fx->T / 2, fx->T - 1};
    float *lg = malloc((size_t)fx->V * sizeof(float));
    for (int c = 0; c < 4; c++) {
        int cut = cuts[c];
        qwenc_session *s = open_session(fx, 5, 1);
        if (!s) break;
        int ok = !qwenc_session_forward(s, fx->ids, cut, NULL, 0, err, sizeof(err)) &&
                 !qwenc_session_draft_head(s, fx->ids[cut], lg, NULL, err, sizeof(err));
        char what[96];
        snprintf(what, sizeof(what), "after %d tokens fed in steps of 5", cut);
        CHECK(ok, "%s: %s: %s", fx->name, what, err);
        if (ok) check_rows(fx, what, lg, fx->ref + (size_t)(cut - 1) * fx->V, 1);
        qwenc_session_free(s);
    }
    free(lg);
}

/* Draft steps of the fixture's own next tokens, keeping 0..5 of each; the head after each accept. */
static void test_draft_steps(const fixture *fx) {
    char err[512];
    qwenc_session *s = open_session(fx, 8, 1);
    if (!s) return;
    float *lg = malloc((size_t)6 * fx->V * sizeof(float)), *got = malloc((size_t)fx->T * fx->V * sizeof(float));
    int ok = !qwenc_session_forward(s, fx->ids, 3, NULL, 0, err, sizeof(err)), n_checked = 0, keep = 0;
    float *ref = malloc((size_t)fx->T * fx->V * sizeof(float));
    while (ok) {
        int past = qwenc_session_n_past(s), n = fx->T - past < 5 ? fx->T - past : 5;
        if (n < 2) break;
        ok = !qwenc_session_forward_draft(s, fx->ids + past, n, lg, err, sizeof(err)) &&
             !qwenc_session_accept(s, keep % (n + 1), err, sizeof(err));
        keep++;
        int now = qwenc_session_n_past(s);
        if (ok && now > 0 && now < fx->T) {
            ok = !qwenc_session_draft_head(s, fx->ids[now], got + (size_t)n_checked * fx->V, NULL, err, sizeof(err));
            memcpy(ref + (size_t)n_checked * fx->V, fx->ref + (size_t)(now - 1) * fx->V, (size_t)fx->V * sizeof(float));
            n_checked++;
        }
        if (ok && now == past) ok = !qwenc_session_forward(s, fx->ids + now, 1, NULL, 0, err, sizeof(err));
    }
    CHECK(ok, "%s: draft steps: %s", fx->name, err);
    CHECK(n_checked >= 4, "%s: draft steps: only %d head checks", fx->name, n_checked);
    if (ok && n_checked) check_rows(fx, "after draft steps with 0..5 tokens kept", got, ref, n_checked);
    free(lg), free(got), free(ref);
    qwenc_session_free(s);
}

/* Batched steps of two sessions keeping the head (and one that does not): each head as the session alone. */
static void test_batch(const fixture *fx) {
    char err[512];
    int V = fx->V, ca = 5, cb = fx->T / 2;
    qwenc_session *a = open_session(fx, 8, 1), *b = open_session(fx, 8, 1), *c = open_session(fx, 8, 0);
    float *got = malloc((size_t)2 * V * sizeof(float)), *ref = malloc((size_t)2 * V * sizeof(float));
    int ok = a && b && c && !qwenc_session_forward(a, fx->ids, ca, NULL, 0, err, sizeof(err)) &&
             !qwenc_session_forward(b, fx->ids, cb, NULL, 0, err, sizeof(err)) &&
             !qwenc_session_forward(c, fx->ids, 2, NULL, 0, err, sizeof(err));
    for (int step = 0; ok && step < 2; step++) {
        qwenc_session *ss[3] = {a, b, c};
        int32_t tk[3] = {fx->ids[ca + step], fx->ids[cb + step], fx->ids[2 + step]};
        ok = !qwenc_session_forward_batch(ss, tk, 3, NULL, err, sizeof(err));
    }
    ok = ok && !qwenc_session_draft_head(a, fx->ids[ca + 2], got, NULL, err, sizeof(err)) &&
         !qwenc_session_draft_head(b, fx->ids[cb + 2], got + V, NULL, err, sizeof(err));
    CHECK(ok, "%s: batched steps: %s", fx->name, err);
    memcpy(ref, fx->ref + (size_t)(ca + 1) * V, (size_t)V * sizeof(float));
    memcpy(ref + V, fx->ref + (size_t)(cb + 1) * V, (size_t)V * sizeof(float));
    if (ok) check_rows(fx, "after batched steps", got, ref, 2);
    free(got), free(ref);
    qwenc_session_free(a), qwenc_session_free(b), qwenc_session_free(c);
}

static void test_snapshot(const fixture *fx) {
    char err[512];
    int cut = fx->T / 2, V = fx->V;
    qwenc_session *a = open_session(fx, 8, 1), *b = open_session(fx, 8, 1), *c = open_session(fx, 8, 0);
    qwenc_snapshot *snap = NULL;
    float *la = malloc((size_t)2 * V * sizeof(float)), *lb = malloc((size_t)2 * V * sizeof(float));
    int ok = a && b && c && !qwenc_session_forward(a, fx->ids, cut, NULL, 0, err, sizeof(err)) &&
             !qwenc_session_snapshot(a, &snap, err, sizeof(err)) &&
             !qwenc_session_draft_head(a, fx->ids[cut], la, NULL, err, sizeof(err)) &&
             !qwenc_session_draft_head(a, fx->chain[0], la + V, NULL, err, sizeof(err)) &&
             !qwenc_session_forward(b, fx->ids, 3, NULL, 0, err, sizeof(err)) &&
             !qwenc_session_restore(b, snap, err, sizeof(err)) &&
             !qwenc_session_draft_head(b, fx->ids[cut], lb, NULL, err, sizeof(err)) &&
             !qwenc_session_draft_head(b, fx->chain[0], lb + V, NULL, err, sizeof(err));
    CHECK(ok, "%s: snapshot: %s", fx->name, err);
    CHECK(ok && !memcmp(la, lb, (size_t)2 * V * sizeof(float)), "%s: the head after a restore: other bits", fx->name);
    if (snap && c)
        CHECK(qwenc_session_restore(c, snap, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "draft head"),
              "%s: a snapshot with the head's caches into a session without: %s", fx->name, err);
    /* misuse */
    if (c)
        CHECK(qwenc_session_draft_head(c, 0, la, NULL, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "draft_head"),
              "%s: a session without the head's caches: %s", fx->name, err);
    if (a) {
        qwenc_session_reset(a);
        CHECK(qwenc_session_draft_head(a, 0, la, NULL, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "feed"),
              "%s: the head before any token: %s", fx->name, err);
        ok = !qwenc_session_forward(a, fx->ids, 2, NULL, 0, err, sizeof(err));
        for (int j = 0; ok && j < QWENC_MAX_DRAFT; j++) ok = !qwenc_session_draft_head(a, 1, NULL, NULL, err, sizeof(err));
        CHECK(ok && qwenc_session_draft_head(a, 1, NULL, NULL, err, sizeof(err)) == QWENC_ERR_ARG,
              "%s: a head step past QWENC_MAX_DRAFT is refused: %s", fx->name, err);
        CHECK(qwenc_session_draft_head(a, fx->V, NULL, NULL, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "vocabulary"),
              "%s: a token outside the vocabulary: %s", fx->name, err);
    }
    free(la), free(lb);
    qwenc_snapshot_free(snap);
    qwenc_session_free(a), qwenc_session_free(b), qwenc_session_free(c);
}


/* Greedy decoding of n tokens after the prompt, plain and with k head drafts per step: the same tokens. */
static void test_greedy(const fixture *fx, int k, int n) {
    char err[512];
    int V = fx->V, P = 4;
    qwenc_session *a = open_session(fx, 16, 0), *b = open_session(fx, 16, 1);
    int32_t *plain = malloc((size_t)n * sizeof(int32_t)), *spec = malloc((size_t)(n + k + 1) * sizeof(int32_t));
    float *lg = malloc((size_t)(k + 1) * V * sizeof(float));
    int ok = a && b && !qwenc_session_forward(a, fx->ids, P, lg, 0, err, sizeof(err));
    for (int i = 0; ok && i < n; i++) {
        plain[i] = argmax(lg, V);
        ok = i + 1 == n || !qwenc_session_forward(a, plain + i, 1, lg, 0, err, sizeof(err));
    }
    ok = ok && !qwenc_session_forward(b, fx->ids, P, lg, 0, err, sizeof(err));
    int got = 0, steps = 0, accepted = 0;
    if (ok) spec[got++] = argmax(lg, V);
    while (ok && got < n) {
        int32_t toks[QWENC_MAX_DRAFT + 1];
        toks[0] = spec[got - 1];
        int kk = k < n - got ? k : n - got;
        if (steps % 2) /* head steps one by one, the arg max alone (no logits to the host), or the chain in one call */
            for (int j = 0; ok && j < kk; j++) ok = !qwenc_session_draft_head(b, toks[j], NULL, &toks[j + 1], err, sizeof(err));
        else
            ok = !qwenc_session_draft_greedy(b, toks[0], kk, toks + 1, err, sizeof(err));
        ok = ok && !qwenc_session_forward_draft(b, toks, kk + 1, lg, err, sizeof(err));
        int keep = 0;
        for (int i = 0; ok && i <= kk; i++) {
            spec[got++] = argmax(lg + (size_t)i * V, V);
            keep = i + 1;
            if (i == kk || spec[got - 1] != toks[i + 1]) break;
            accepted++;
        }
        ok = ok && !qwenc_session_accept(b, keep, err, sizeof(err));
        steps++;
    }
    CHECK(ok, "%s: greedy with drafts: %s", fx->name, err);
    CHECK(ok && !memcmp(plain, spec, (size_t)n * sizeof(int32_t)),
          "%s: greedy with %d head drafts per step: other tokens than plain greedy decoding", fx->name, k);
    if (ok) printf("  %s: greedy %d tokens with %d head drafts: %d steps, %d drafts accepted\n", fx->name, n, k, steps,
                   accepted);
    free(plain), free(spec), free(lg);
    qwenc_session_free(a), qwenc_session_free(b);
}

static void test_gguf(const fixture *fx, const char *dir, const char *backend) {
    char tmp[512], path[600], err[512];
    if (!test_make_tmpdir(tmp, sizeof(tmp), "t_mtp")) return;
    snprintf(path, sizeof(path), "%s/head.gguf", tmp);
    qwenc_gguf_params gp = qwenc_gguf_default_params();
    gp.type = "F32";
    CHECK(!qwenc_model_save_gguf(fx->m, path, &gp, err, sizeof(err)), "%s: save F32 GGUF: %s", fx->name, err);
    qwenc_model_params mp = qwenc_model_default_params();
    mp.backend = backend;
    fixture g = *fx;
    g.m = NULL;
    if (!qwenc_model_load_params(path, &mp, &g.m, err, sizeof(err))) {
        CHECK(qwenc_model_has_draft_head(g.m), "%s: the GGUF lost the draft head", fx->name);
        if (qwenc_model_has_draft_head(g.m)) test_cuts(&g);
        qwenc_model_free(g.m);
    } else {
        CHECK(0, "%s: load the GGUF: %s", fx->name, err);
    }
    mp.no_draft_head = 1;
    qwenc_model *m = NULL;
    if (!qwenc_model_load_params(dir, &mp, &m, err, sizeof(err))) {
        CHECK(!qwenc_model_has_draft_head(m), "%s: no_draft_head: the head was loaded", fx->name);
        qwenc_model_free(m);
    } else {
        CHECK(0, "%s: load with no_draft_head: %s", fx->name, err);
    }
    unlink(path);
    rmdir(tmp);
}

static void run(const char *fdir, const char *mdir, const char *name, const char *backend) {
    char path[1200], err[512];
    fixture fx = {.name = name};
    qwenc_model_params mp = qwenc_model_default_params();
    mp.backend = backend;
    if (qwenc_model_load_params(mdir, &mp, &fx.m, err, sizeof(err))) {
        CHECK(0, "%s: load: %s", name, err);
        return;
    }
    CHECK(qwenc_model_has_draft_head(fx.m), "%s: no draft head loaded", name);
    fx.V = qwenc_model_n_vocab(fx.m);
    snprintf(path, sizeof(path), "%s/tokens.txt", fdir);
    fx.ids = test_read_tokens(path, &fx.T);
    int nc = 0;
    snprintf(path, sizeof(path), "%s/chain.txt", fdir);
    fx.chain = test_read_tokens(path, &nc);
    size_t n1 = 0, n2 = 0;
    snprintf(path, sizeof(path), "%s/mtp_logits.f32", fdir);
    fx.ref = test_read_f32(path, &n1);
    snprintf(path, sizeof(path), "%s/mtp_chain.f32", fdir);
    fx.ref_chain = test_read_f32(path, &n2);
    int ok = fx.ids && fx.chain && nc == 3 && fx.ref && fx.ref_chain && n1 == (size_t)(fx.T - 1) * fx.V &&
             n2 == (size_t)3 * fx.V && qwenc_model_has_draft_head(fx.m);
    CHECK(ok, "%s: fixture files (tokens %d, chain %d, logits %zu, chain logits %zu)", name, fx.T, nc, n1, n2);
    if (ok) {
        printf("%s (%s): the draft head over %d positions\n", name, backend, fx.T);
        test_every_position(&fx);
        test_cuts(&fx);
        test_draft_steps(&fx);
        test_snapshot(&fx);
        test_batch(&fx);
        for (int k = 1; k <= 4; k++) test_greedy(&fx, k, fx.T < 60 ? 40 : 80);
        test_gguf(&fx, mdir, backend);
    }
    free(fx.ids), free(fx.chain), free(fx.ref), free(fx.ref_chain);
    qwenc_model_free(fx.m);
}

static void run_all(const char *root, const char *backend, int bundled) {
    char mroot[512], *names[16];
    snprintf(mroot, sizeof(mroot), "%s/mtp", root);
    int n = test_list_fixtures(mroot, 0, names, 16);
    CHECK(n == 4, "draft head fixtures in %s: %d (qwen4_exp, qwen3_5, qwen3_5_moe, qwen3_next)", mroot, n);
    for (int i = 0; i < n; i++) {
        char d[1200], nm[64];
        snprintf(d, sizeof(d), "%s/%s", mroot, names[i]);
        snprintf(nm, sizeof(nm), "mtp/%s", names[i]);
        run(d, d, nm, backend);
        free(names[i]);
    }
    if (!bundled) return;
    /* the bundled model's trained head (its fixture names the model directory) */
    char fdir[1100], mdir[1100];
    snprintf(fdir, sizeof(fdir), "%s/tiny-flash", root);
    snprintf(mdir, sizeof(mdir), "%s/../../models/tiny-flash", root);
    run(fdir, mdir, "tiny-flash", backend);
}

int main(int argc, char **argv) {
#ifdef QW_CUDA_EMU /* t_mtp_emu: the emulated CUDA backend (tests/gpu/emu) */
    const char *backend = "cuda";
#else
    const char *backend = NULL;
#endif
    if (argc > 2 && !strcmp(argv[1], "--backend")) {
        backend = argv[2];
        argc -= 2;
        argv += 2;
    }
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    run_all(root, backend ? backend : "cpu", 1);
    if (!backend) run_all(root, "cpu-guard", 0);
    return test_summary();
}
