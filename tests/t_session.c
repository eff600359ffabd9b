/*
 * t_session.c - session snapshots and batched decode steps, on every fixture (every architecture).
 *
 * Snapshots: a prompt's first part is fed, the session snapshotted, the rest fed (logits A); another session,
 * and the first one after a reset, restored from the snapshot and fed the same rest (logits B, C): A, B and C
 * are the same bits, and so are the decode steps after them. A snapshot of another model, or of more tokens
 * than a session's context, is refused.
 * Batched steps: four sessions at different positions (one at the start) take one token each in one call, twice,
 * each session's logits the bits its own step gives; a session given twice and a token outside the vocabulary
 * are refused. Draft steps (test_drafts): any part of a draft kept leaves the bits of feeding only that part.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwenc.h"
#include "test_util.h"

static float *feed(qwenc_session *s, const int32_t *ids, int n, int V) {
    char err[512];
    float *lg = malloc((size_t)n * V * sizeof(float));
    if (qwenc_session_forward(s, ids, n, lg, 1, err, sizeof(err))) {
        printf("FAIL forward: %s\n", err);
        free(lg);
        return NULL;
    }
    return lg;
}

static void test_snapshots(const char *dir, qwenc_model *m, const int32_t *ids, int n) {
    char err[512];
    int V = qwenc_model_n_vocab(m), cut = n / 2;
    qwenc_session_params sp = {.n_ctx = n, .n_batch = 5};
    qwenc_session *a = NULL, *b = NULL;
    qwenc_snapshot *snap = NULL;
    CHECK(!qwenc_session_init(m, &sp, &a, err, sizeof(err)) && !qwenc_session_init(m, &sp, &b, err, sizeof(err)),
          "%s: sessions: %s", dir, err);
    free(feed(b, ids, 3, V)); /* b is somewhere else before the restore */
    free(feed(a, ids, cut, V));
    CHECK(!qwenc_session_snapshot(a, &snap, err, sizeof(err)), "%s: snapshot: %s", dir, err);
    CHECK(snap && qwenc_snapshot_n_past(snap) == cut && qwenc_snapshot_bytes(snap) > 0, "%s: snapshot of %d tokens",
          dir, cut);
    float *la = feed(a, ids + cut, n - cut, V);
    CHECK(!qwenc_session_restore(b, snap, err, sizeof(err)) && qwenc_session_n_past(b) == cut, "%s: restore: %s", dir,
          err);
    float *lb = feed(b, ids + cut, n - cut, V);
    qwenc_session_reset(a);
    CHECK(!qwenc_session_restore(a, snap, err, sizeof(err)), "%s: restore after reset: %s", dir, err);
    float *lc = NULL;
    if (n - cut > 1) { /* token by token this time */
        lc = malloc((size_t)(n - cut) * V * sizeof(float));
        for (int i = cut; i < n; i++)
            if (qwenc_session_forward(a, ids + i, 1, lc + (size_t)(i - cut) * V, 0, err, sizeof(err))) break;
    }
    size_t bytes = (size_t)(n - cut) * V * sizeof(float);
    CHECK(la && lb && !memcmp(la, lb, bytes), "%s: after a restore into another session: other logits", dir);
    /* token by token: the last row is the bits of a one-token step, compared with the same from a */
    if (lc) {
        qwenc_session_reset(b);
        CHECK(!qwenc_session_restore(b, snap, err, sizeof(err)), "%s: restore: %s", dir, err);
        float *ld = malloc(bytes);
        for (int i = cut; i < n; i++)
            if (qwenc_session_forward(b, ids + i, 1, ld + (size_t)(i - cut) * V, 0, err, sizeof(err))) break;
        CHECK(!memcmp(lc, ld, bytes), "%s: decoding after a restore: other logits", dir);
        free(ld);
    }
    /* refused: more tokens than a session's context */
    qwenc_session_params small = {.n_ctx = cut > 1 ? cut - 1 : 1};
    qwenc_session *c = NULL;
    if (cut > 1 && !qwenc_session_init(m, &small, &c, err, sizeof(err))) {
        CHECK(qwenc_session_restore(c, snap, err, sizeof(err)) == QWENC_ERR_CONTEXT && strstr(err, "context"),
              "%s: a snapshot larger than the context: %s", dir, err);
        qwenc_session_free(c);
    }
    free(la), free(lb), free(lc);
    qwenc_snapshot_free(snap);
    qwenc_session_free(a);
    qwenc_session_free(b);
}

static void test_batch(const char *dir, qwenc_model *m, const int32_t *ids, int n) {
    char err[512];
    int V = qwenc_model_n_vocab(m);
    qwenc_session_params sp = {.n_ctx = n};
    enum { NS = 4 };
    qwenc_session *s[NS] = {NULL}, *r[NS] = {NULL};
    int fed[NS] = {n / 3, 0, 1, n - 3}; /* four positions, one at the start; the first session's arena runs it */
    for (int i = 0; i < NS; i++) {
        CHECK(!qwenc_session_init(m, &sp, &s[i], err, sizeof(err)) && !qwenc_session_init(m, &sp, &r[i], err, sizeof(err)),
              "%s: session: %s", dir, err);
        if (fed[i]) free(feed(s[i], ids, fed[i], V)), free(feed(r[i], ids, fed[i], V));
    }
    int32_t next[NS];
    float *lb = malloc((size_t)NS * V * sizeof(float)), *ls = malloc((size_t)NS * V * sizeof(float));
    for (int step = 0; step < 2; step++) { /* two steps: the second after the batch's own history */
        for (int i = 0; i < NS; i++) next[i] = ids[fed[i] + step];
        CHECK(!qwenc_session_forward_batch(s, next, NS, lb, err, sizeof(err)), "%s: forward_batch: %s", dir, err);
        for (int i = 0; i < NS; i++) qwenc_session_forward(r[i], next + i, 1, ls + (size_t)i * V, 0, err, sizeof(err));
        CHECK(!memcmp(lb, ls, (size_t)NS * V * sizeof(float)), "%s: batched step %d differs from the sessions' own", dir,
              step);
    }
    for (int i = 0; i < NS; i++)
        CHECK(qwenc_session_n_past(s[i]) == fed[i] + 2, "%s: session %d at %d after the batches", dir, i,
              qwenc_session_n_past(s[i]));
    /* refused: a session twice, another model's token range */
    qwenc_session *twice[2] = {s[0], s[0]};
    CHECK(qwenc_session_forward_batch(twice, next, 2, lb, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "twice"),
          "%s: a session twice in a batch: %s", dir, err);
    int32_t bad[NS] = {0, V, 0, 0};
    CHECK(qwenc_session_forward_batch(s, bad, NS, lb, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "vocabulary"),
          "%s: a token outside the vocabulary: %s", dir, err);
    free(lb), free(ls);
    for (int i = 0; i < NS; i++) qwenc_session_free(s[i]), qwenc_session_free(r[i]);
}

/* One token at a time: the logits of each, [n][V]. */
/* More sessions in one batched step than a backend's call over the sessions' states takes (32 rows: the blocks cut
 * it), each at its own position, in m's sessions and in r's (r: NULL, or the model again on a backend without those
 * calls): on the CPU every session's logits the bits of its own step; on the GPU, whose products of 35 rows are not
 * one row's bits, the bits of the batch run a session at a time (r's). */
static void test_batch_many(const char *dir, qwenc_model *m, qwenc_model *rm, const int32_t *ids, int n) {
    char err[512];
    int V = qwenc_model_n_vocab(m);
    qwenc_session_params sp = {.n_ctx = n};
    enum { NS = 35 };
    qwenc_session *s[NS] = {NULL}, *r[NS] = {NULL};
    int32_t next[NS];
    int made = 0;
    for (; made < NS; made++) {
        if (qwenc_session_init(m, &sp, &s[made], err, sizeof(err)) ||
            qwenc_session_init(rm ? rm : m, &sp, &r[made], err, sizeof(err))) {
            CHECK(0, "%s: session %d: %s", dir, made, err);
            break;
        }
        const int fed = made % (n - 1);
        if (fed) free(feed(s[made], ids, fed, V)), free(feed(r[made], ids, fed, V));
        next[made] = ids[fed];
    }
    float *lb = malloc((size_t)NS * V * sizeof(float)), *ls = malloc((size_t)NS * V * sizeof(float));
    if (made == NS) {
        CHECK(!qwenc_session_forward_batch(s, next, NS, lb, err, sizeof(err)), "%s: forward_batch of %d: %s", dir, NS,
              err);
        if (rm)
            CHECK(!qwenc_session_forward_batch(r, next, NS, ls, err, sizeof(err)), "%s: forward_batch of %d: %s", dir,
                  NS, err);
        else
            for (int i = 0; i < NS; i++)
                qwenc_session_forward(r[i], next + i, 1, ls + (size_t)i * V, 0, err, sizeof(err));
        for (int i = 0; i < NS; i++)
            CHECK(!memcmp(lb + (size_t)i * V, ls + (size_t)i * V, (size_t)V * sizeof(float)),
                  "%s: session %d of a batch of %d differs from its %s", dir, i, NS,
                  rm ? "batch a session at a time" : "own step");
    }
    for (int i = 0; i < made; i++) qwenc_session_free(s[i]), qwenc_session_free(r[i]);
    if (made < NS) qwenc_session_free(s[made]), qwenc_session_free(r[made]);
    free(lb);
    free(ls);
}

static float *feed_each(qwenc_session *s, const int32_t *ids, int n, int V) {
    char err[512];
    float *lg = malloc((size_t)(n ? n : 1) * V * sizeof(float));
    for (int i = 0; i < n; i++)
        if (qwenc_session_forward(s, ids + i, 1, lg + (int64_t)i * V, 0, err, sizeof(err))) {
            printf("FAIL forward: %s\n", err);
            free(lg);
            return NULL;
        }
    return lg;
}

/* Draft steps: after a prompt, a draft of D tokens (the fixture's next tokens, then tokens it does not hold: some
 * of it "right", the rest not), fed with qwenc_session_forward_draft: its logits are the bits of feeding the D
 * tokens one at a time; after qwenc_session_accept(j), for every j in 0..D, the next three tokens fed one at a time
 * give the bits of a session fed the prompt, the j kept tokens and those three one at a time. Twice in a row
 * (the second draft from the first's kept state), so the kept state is itself drafted from. */
static void test_drafts(const char *dir, qwenc_model *m, const int32_t *ids, int n) {
    enum { D = 6 };
    char err[512];
    int V = qwenc_model_n_vocab(m), p = n / 3;
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = 64;
    qwenc_session *a = NULL, *b = NULL;
    CHECK(!qwenc_session_init(m, &sp, &a, err, sizeof(err)) && !qwenc_session_init(m, &sp, &b, err, sizeof(err)),
          "%s: session: %s", dir, err);
    if (!a || !b) goto done;
    int32_t draft[D], next[3];
    for (int i = 0; i < D; i++) draft[i] = i < 3 ? ids[p + i] : (ids[p + i] * 7 + 11 + i) % V;
    for (int i = 0; i < 3; i++) next[i] = ids[(p + D + i) % n];
    float *ld = malloc((size_t)D * V * sizeof(float));
    int mismatched = -1, draft_bits = 1;
    for (int j = 0; j <= D && ld; j++) {
        qwenc_session_reset(a);
        qwenc_session_reset(b);
        free(feed(a, ids, p, V));
        free(feed(b, ids, p, V));
        /* twice: draft, keep j, draft again from there, keep j again */
        int32_t seq[2 * D];
        int ns = 0, ok = 1;
        for (int round = 0; round < 2 && ok; round++) {
            ok = !qwenc_session_forward_draft(a, draft, D, ld, err, sizeof(err));
            CHECK(ok, "%s: forward_draft: %s", dir, err);
            if (!ok) break;
            float *le = NULL;
            if (round == 0 && j == D) { /* the draft's logits: the bits of one token at a time */
                qwenc_session *c = NULL;
                if (!qwenc_session_init(m, &sp, &c, err, sizeof(err))) {
                    free(feed(c, ids, p, V));
                    le = feed_each(c, draft, D, V);
                    draft_bits = le && !memcmp(le, ld, (size_t)D * V * sizeof(float));
                    free(le);
                    qwenc_session_free(c);
                }
            }
            CHECK(qwenc_session_forward(a, next, 1, NULL, 0, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "accept"),
                  "%s: a step before accept: %s", dir, err);
            ok = !qwenc_session_accept(a, j, err, sizeof(err));
            CHECK(ok && qwenc_session_n_past(a) == p + ns + j, "%s: accept %d: %s", dir, j, err);
            for (int i = 0; i < j; i++) seq[ns++] = draft[i];
        }
        float *la = feed_each(a, next, 3, V);
        free(feed_each(b, seq, ns, V));
        float *lb = feed_each(b, next, 3, V);
        if (la && lb && memcmp(la, lb, (size_t)3 * V * sizeof(float)) && mismatched < 0) mismatched = j;
        free(la);
        free(lb);
    }
    CHECK(draft_bits, "%s: a draft step's logits differ from feeding its tokens one at a time", dir);
    CHECK(mismatched < 0, "%s: after keeping %d of a draft, other logits than feeding only those", dir, mismatched);
    CHECK(qwenc_session_accept(a, 0, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "no draft"),
          "%s: accept without a draft: %s", dir, err);
    CHECK(!qwenc_session_forward_draft(a, draft, 2, ld, err, sizeof(err)) &&
              qwenc_session_accept(a, 3, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "3 tokens kept of a draft step of 2"),
          "%s: keeping more than drafted: %s", dir, err);
    CHECK(!qwenc_session_accept(a, 2, err, sizeof(err)), "%s: accept after a refusal: %s", dir, err);
    free(ld);
done:
    qwenc_session_free(a);
    qwenc_session_free(b);
}

/* qwenc_session_forward_argmax: the arg max of the logits qwenc_session_forward gives, for the prompt (in steps of
 * 5) and for one-token steps (graphs on a GPU), the lowest id on ties. */
static void test_argmax(const char *dir, qwenc_model *m, const int32_t *ids, int n) {
    char err[512];
    int V = qwenc_model_n_vocab(m), bad = 0;
    qwenc_session_params sp = {.n_ctx = n, .n_batch = 5};
    qwenc_session *a = NULL, *b = NULL;
    float *lg = malloc((size_t)V * sizeof(float));
    int ok = !qwenc_session_init(m, &sp, &a, err, sizeof(err)) && !qwenc_session_init(m, &sp, &b, err, sizeof(err));
    int cut = n / 2;
    for (int i = cut; ok && i <= n; i++) {
        int32_t best = -1;
        const int32_t *t = i == cut ? ids : ids + i - 1;
        int k = i == cut ? cut : 1;
        ok = !qwenc_session_forward(a, t, k, lg, 0, err, sizeof(err)) &&
             !qwenc_session_forward_argmax(b, t, k, &best, err, sizeof(err));
        int32_t want = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[want]) want = v;
        bad += ok && best != want;
    }
    CHECK(ok, "%s: forward_argmax: %s", dir, err);
    CHECK(ok && bad == 0, "%s: forward_argmax: %d steps gave another id than the arg max of the logits", dir, bad);
    free(lg);
    qwenc_session_free(a);
    qwenc_session_free(b);
}

/* qwenc_session_forward_topk: the k largest of the logits qwenc_session_forward gives (largest first, the lower id
 * first among equals, the same bits), for the prompt and for one-token steps, k from 1 to QWENC_MAX_TOPK (a change
 * of k between steps too); qwenc_session_last_logits: the step's logits, refused after another forward; k out of
 * range refused. */
static void test_topk(const char *dir, qwenc_model *m, const int32_t *ids, int n) {
    char err[512];
    int V = qwenc_model_n_vocab(m), bad = 0, bad_last = 0;
    qwenc_session_params sp = {.n_ctx = n, .n_batch = 5};
    qwenc_session *a = NULL, *b = NULL;
    float *lg = malloc((size_t)V * sizeof(float)), *last = malloc((size_t)V * sizeof(float)), vals[QWENC_MAX_TOPK];
    int32_t tid[QWENC_MAX_TOPK];
    unsigned char *taken = malloc((size_t)V);
    int ok = !qwenc_session_init(m, &sp, &a, err, sizeof(err)) && !qwenc_session_init(m, &sp, &b, err, sizeof(err));
    int cut = n / 2;
    for (int i = cut; ok && i <= n; i++) {
        const int32_t *t = i == cut ? ids : ids + i - 1;
        int nt = i == cut ? cut : 1, k = i % 3 == 0 ? 41 : i % 3 == 1 ? QWENC_MAX_TOPK : 1 + i % 7;
        if (k > V) k = V;
        ok = !qwenc_session_forward(a, t, nt, lg, 0, err, sizeof(err)) &&
             !qwenc_session_forward_topk(b, t, nt, k, tid, vals, err, sizeof(err)) &&
             !qwenc_session_last_logits(b, last, err, sizeof(err));
        if (!ok) break;
        memset(taken, 0, (size_t)V);
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int v = 0; v < V; v++)
                if (!taken[v] && (best < 0 || lg[v] > lg[best])) best = v;
            taken[best] = 1;
            bad += tid[j] != best || memcmp(&vals[j], &lg[best], sizeof(float)) != 0;
        }
        bad_last += memcmp(last, lg, (size_t)V * sizeof(float)) != 0;
    }
    CHECK(ok, "%s: forward_topk: %s", dir, err);
    CHECK(ok && bad == 0, "%s: forward_topk: %d ids or values differ from the largest logits of forward", dir, bad);
    CHECK(ok && bad_last == 0, "%s: last_logits: %d steps gave other logits than forward", dir, bad_last);
    if (ok) {
        qwenc_session_reset(b);
        ok = !qwenc_session_forward_topk(b, ids, 1, 3, tid, vals, err, sizeof(err)) &&
             !qwenc_session_forward(b, ids + 1, 1, NULL, 0, err, sizeof(err));
        CHECK(ok && qwenc_session_last_logits(b, last, err, sizeof(err)) == QWENC_ERR_ARG, "%s: last_logits after a "
              "forward", dir);
        CHECK(qwenc_session_forward_topk(b, ids, 1, QWENC_MAX_TOPK + 1, tid, vals, err, sizeof(err)) == QWENC_ERR_ARG &&
                  strstr(err, "k must be"), "%s: forward_topk with k %d: %s", dir, QWENC_MAX_TOPK + 1, err);
    }
    free(lg), free(last), free(taken);
    qwenc_session_free(a);
    qwenc_session_free(b);
}

static const char *gpus, *split; /* --gpus, --split: the model over several GPUs */

static void run_fixtures(const char *root, const char *backend) {
    char *names[64];
    int nf = test_list_fixtures(root, 1, names, 64);
    CHECK(nf >= 7, "fixtures in %s: %d", root, nf);
    qwenc_model *prev = NULL;
    for (int f = 0; f < nf; f++) {
        char dir[1100], path[1200], err[512];
        snprintf(dir, sizeof(dir), "%s/%s", root, names[f]);
        snprintf(path, sizeof(path), "%s/model.txt", dir);
        char mdir[1100];
        FILE *mt = fopen(path, "r");
        if (mt) { /* the fixture names the model's directory */
            if (!fgets(mdir, sizeof(mdir), mt)) mdir[0] = 0;
            mdir[strcspn(mdir, "\r\n")] = 0;
            fclose(mt);
        } else {
            snprintf(mdir, sizeof(mdir), "%s", dir);
        }
        qwenc_model *m = NULL;
        qwenc_model_params mp = qwenc_model_default_params();
        mp.backend = backend;
        mp.gpus = gpus;
        mp.split = split;
        if (qwenc_model_load_params(mdir, &mp, &m, err, sizeof(err))) {
            CHECK(0, "%s: load: %s", dir, err);
            free(names[f]);
            continue;
        }
        snprintf(path, sizeof(path), "%s/tokens.txt", dir);
        int n = 0;
        int32_t *ids = test_read_tokens(path, &n);
        if (n > 40) n = 40;
        printf("%s (%s): snapshots, batched steps and drafts over %d tokens\n", names[f], backend, n);
        if (ids && n >= 6) {
            test_snapshots(names[f], m, ids, n);
            test_batch(names[f], m, ids, n);
            if (!strcmp(names[f], "qwen4_exp") && !strcmp(backend, "cpu")) /* DeltaNet, PLE, QSA */
                test_batch_many(names[f], m, NULL, ids, n);
            if (!strcmp(names[f], "qwen4_exp") && !strcmp(backend, "cuda")) { /* the rows one call at a time */
                qwenc_model *rm = NULL;
                setenv("QWENC_CUDA_ROWS", "0", 1);
                if (qwenc_model_load_params(mdir, &mp, &rm, err, sizeof(err))) CHECK(0, "%s: load: %s", dir, err);
                unsetenv("QWENC_CUDA_ROWS");
                if (rm) test_batch_many(names[f], m, rm, ids, n);
                qwenc_model_free(rm);
            }
            test_drafts(names[f], m, ids, n);
            test_argmax(names[f], m, ids, n);
            test_topk(names[f], m, ids, n);
        }
        if (prev) { /* a snapshot of one model is refused by another's session */
            qwenc_session *a = NULL, *b = NULL;
            qwenc_snapshot *snap = NULL;
            if (!qwenc_session_init(prev, NULL, &a, err, sizeof(err)) && !qwenc_session_init(m, NULL, &b, err, sizeof(err)) &&
                !qwenc_session_snapshot(a, &snap, err, sizeof(err)))
                CHECK(qwenc_session_restore(b, snap, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "another model"),
                      "%s: a snapshot of another model: %s", names[f], err);
            qwenc_snapshot_free(snap);
            qwenc_session_free(a);
            qwenc_session_free(b);
            qwenc_model_free(prev);
        }
        prev = m;
        free(ids);
        free(names[f]);
    }
    qwenc_model_free(prev);
}

int main(int argc, char **argv) {
    /* t_session [--backend NAME] [--gpus LIST] [--split HOW] [FIXTURE_DIR]: the fixtures on that backend (over those
     * GPUs: tests/gpu/split.sh); by default the CPU's, then again in its guard mode (state and activations
     * inaccessible outside the backend's calls: the snapshot, batch and draft code must touch them only through the
     * backend). Built as t_session_emu (QW_CUDA_EMU): the emulated CUDA backend's (tests/gpu/emu) by default. */
#ifdef QW_CUDA_EMU
    const char *backend = "cuda";
#else
    const char *backend = NULL;
#endif
    while (argc > 2 && argv[1][0] == '-' && argv[1][1] == '-') {
        if (!strcmp(argv[1], "--backend")) backend = argv[2];
        else if (!strcmp(argv[1], "--gpus")) gpus = argv[2];
        else if (!strcmp(argv[1], "--split")) split = argv[2];
        else break;
        argc -= 2;
        argv += 2;
    }
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    run_fixtures(root, backend ? backend : "cpu");
    if (!backend) run_fixtures(root, "cpu-guard");
    return test_summary();
}
