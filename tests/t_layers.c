/*
 * t_layers.c - where a model's work and state belong (ops.h's layer call), on every fixture and the MTP heads'.
 *
 * A backend that spreads the layers over devices (the CUDA backend's --split layer) uploads a weight where the first
 * product reading it runs, and keeps a layer's state where it was allocated; so the forward and the session must
 * name the layer before its work and before its memory. This runs each model on the CPU through an interposer
 * whose layer call records the layer set, and checks:
 *   - every matrix product with a layer's weight (its name holds the layer: "layers.N." or "blk.N."; the MTP
 *     head's tensors, "mtp.*", are its layer n_layer) runs while that layer is set, and every other product (the
 *     token embedding, the lm_head) while none is (-1);
 *   - each layer's session state and draft state (s->ls[il].mem, s->dl[il].mem) was allocated while that layer was
 *     set, and the step's inputs and scratch while none was;
 *   - prompt steps, decode steps, a draft step and its accept, the MTP head's steps and a batched step all end with
 *     no layer set, and every layer was set at least once;
 *   - the logits are those of the plain CPU backend, bit for bit (the calls change nothing).
 * Usage: t_layers [ROOT] (ROOT: tests/fixtures).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwenc.h"
#include "runtime/session.h"
#include "test_util.h"

#define MAX_ALLOCS 4096

static struct {
    int cur;                  /* the layer set now */
    int n_layer;              /* the model's n_layer (the MTP head's layer number) */
    int n_prod, bad_prod;     /* products seen, products under another layer than their weight's */
    char first_bad[256];
    int seen[512];            /* layer il set at least once (il < 512) */
    void *ptr[MAX_ALLOCS];    /* allocations and the layer set when each was made */
    int at[MAX_ALLOCS];
    int n_alloc;
    void *(*alloc)(const qw_backend *, size_t, qw_mem_kind); /* the interposer's */
} R;

static void rec_layer(const qw_backend *be, int il) {
    (void)be;
    R.cur = il;
    if (il >= 0 && il < 512) R.seen[il] = 1;
}

static void *rec_alloc(const qw_backend *be, size_t bytes, qw_mem_kind kind) {
    void *p = R.alloc(be, bytes, kind);
    if (p && R.n_alloc < MAX_ALLOCS) R.ptr[R.n_alloc] = p, R.at[R.n_alloc++] = R.cur;
    return p;
}

/* the layer set when p was allocated (-2: not seen) */
static int alloc_layer(const void *p) {
    for (int i = R.n_alloc - 1; i >= 0; i--)
        if (R.ptr[i] == p) return R.at[i];
    return -2;
}

/* the layer a weight belongs to by its name: "mtp.*" the head's, "layers.N." / "blk.N." layer N, else -1 */
static int weight_layer(const char *name) {
    if (!name) return -1;
    if (!strncmp(name, "mtp.", 4)) return R.n_layer;
    const char *keys[] = {"layers.", "blk."};
    for (int k = 0; k < 2; k++)
        for (const char *p = strstr(name, keys[k]); p; p = strstr(p + 1, keys[k])) {
            const char *d = p + strlen(keys[k]);
            if (*d < '0' || *d > '9' || (p > name && p[-1] != '.' && p[-1] != '_')) continue;
            return atoi(d);
        }
    return -1;
}

static int on_enter(void *user, int op) {
    (void)user, (void)op;
    return 1;
}

static void on_leave(void *user, int op, const qw_matmul_job *jobs, int n_jobs) {
    (void)user, (void)op;
    for (int j = 0; j < n_jobs; j++) {
        const char *name = jobs[j].w ? jobs[j].w->name : NULL;
        int want = weight_layer(name);
        R.n_prod++;
        if (want != R.cur && !R.bad_prod++)
            snprintf(R.first_bad, sizeof(R.first_bad), "%s (layer %d) multiplied while layer %d is set",
                     name ? name : "(unnamed)", want, R.cur);
    }
}

/* logits of the whole prompt (one step) and of one more decode token */
static int run_steps(qwenc_session *s, const int32_t *ids, int n, int V, float *lg, char *err, size_t errlen) {
    return qwenc_session_forward(s, ids, n - 1, lg, 1, err, errlen) ||
           qwenc_session_forward(s, ids + n - 1, 1, lg + (size_t)(n - 1) * V, 0, err, errlen);
}

static void check_model(const char *name, const char *dir, int head) {
    char err[512], what[600];
    qwenc_model *m = NULL;
    if (qwenc_model_load(dir, &m, err, sizeof(err))) {
        CHECK(0, "%s: load: %s", name, err);
        return;
    }
    int V = qwenc_model_n_vocab(m);
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
    const int n = 12;
    float *plain = malloc(sizeof(float) * (size_t)n * V), *got = malloc(sizeof(float) * (size_t)n * V);
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = 64;
    sp.draft_head = head;
    qwenc_session *s = NULL;
    int ok = plain && got && !qwenc_session_init(m, &sp, &s, err, sizeof(err)) &&
             !run_steps(s, ids, n, V, plain, err, sizeof(err));
    qwenc_session_free(s);
    s = NULL;
    CHECK(ok, "%s: the plain run: %s", name, err);

    /* the same through the recording interposer, which the session then allocates from */
    memset(&R, 0, sizeof(R));
    R.cur = -1;
    R.n_layer = m->hp.n_layer;
    qw_backend_hooks h = {.enter = on_enter, .leave = on_leave};
    qw_backend *rb = qw_backend_interpose(m->be, &h);
    qw_backend *keep = m->be;
    if (!rb) {
        CHECK(0, "%s: out of memory", name);
        free(plain), free(got), qwenc_model_free(m);
        return;
    }
    R.alloc = rb->alloc;
    rb->alloc = rec_alloc;
    rb->layer = rec_layer;
    m->be = rb;
    ok = ok && !qwenc_session_init(m, &sp, &s, err, sizeof(err));
    CHECK(ok, "%s: session on the recording backend: %s", name, err);
    if (ok) {
        int nl = m->hp.n_layer + (s->mtp ? 1 : 0), state_ok = 1;
        CHECK(R.cur == -1, "%s: init ends with layer %d set", name, R.cur);
        for (int il = 0; il < nl && state_ok; il++) {
            int at = alloc_layer(s->ls[il].mem);
            state_ok = at == il;
            if (!state_ok) snprintf(what, sizeof(what), "layer %d's state allocated under layer %d", il, at);
        }
        CHECK(state_ok, "%s: %s", name, what);
        CHECK(alloc_layer(s->scratch) == -1 && alloc_layer(s->tokens) == -1 && alloc_layer(s->step) == -1,
              "%s: the scratch or the step's inputs allocated under a layer", name);
        ok = !run_steps(s, ids, n, V, got, err, sizeof(err));
        CHECK(ok, "%s: steps: %s", name, err);
        CHECK(R.cur == -1, "%s: a step ends with layer %d set", name, R.cur);
        CHECK(ok && !memcmp(plain, got, sizeof(float) * (size_t)n * V), "%s: the logits differ from the plain run's",
              name);
        /* a draft step, taken back in part, and the head's own steps */
        float *dl = malloc(sizeof(float) * 3 * (size_t)V);
        ok = dl && !qwenc_session_forward_draft(s, ids, 3, dl, err, sizeof(err)) &&
             !qwenc_session_accept(s, 1, err, sizeof(err));
        CHECK(ok, "%s: draft and accept: %s", name, err);
        if (ok) {
            int draft_ok = 1;
            for (int il = 0; il < m->hp.n_layer && draft_ok; il++) {
                int at = alloc_layer(s->dl[il].mem);
                draft_ok = at == il;
                if (!draft_ok) snprintf(what, sizeof(what), "layer %d's draft state allocated under layer %d", il, at);
            }
            CHECK(draft_ok, "%s: %s", name, what);
            CHECK(R.cur == -1, "%s: accept ends with layer %d set", name, R.cur);
        }
        if (s->mtp) {
            int32_t best = -1;
            ok = !qwenc_session_draft_head(s, ids[2], dl, &best, err, sizeof(err));
            CHECK(ok && best >= 0, "%s: the head's step: %s", name, err);
            CHECK(R.cur == -1, "%s: the head's step ends with layer %d set", name, R.cur);
            CHECK(R.seen[m->hp.n_layer], "%s: the head's layer was never set", name);
        }
        /* a batched step of two sessions */
        qwenc_session *b = NULL;
        qwenc_session_params bp = sp;
        bp.draft_head = 0;
        if (!qwenc_session_init(m, &bp, &b, err, sizeof(err))) {
            qwenc_session *both[2] = {s, b};
            int32_t tk[2] = {ids[4], ids[5]};
            float *bl = malloc(sizeof(float) * 2 * (size_t)V);
            ok = bl && !qwenc_session_forward_batch(both, tk, 2, bl, err, sizeof(err));
            CHECK(ok, "%s: a batched step: %s", name, err);
            CHECK(R.cur == -1, "%s: a batched step ends with layer %d set", name, R.cur);
            free(bl);
            qwenc_session_free(b);
        } else {
            CHECK(0, "%s: a second session: %s", name, err);
        }
        free(dl);
        int all = 1;
        for (int il = 0; il < m->hp.n_layer; il++) all &= R.seen[il];
        CHECK(all, "%s: a layer was never set", name);
        CHECK(R.n_prod > 0 && !R.bad_prod, "%s: %d of %d products under another layer than their weight's: %s", name,
              R.bad_prod, R.n_prod, R.first_bad);
    }
    qwenc_session_free(s);
    m->be = keep;
    rb->release(rb);
    free(plain);
    free(got);
    qwenc_model_free(m);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    static const char *archs[] = {"llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp"};
    char dir[1024];
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        snprintf(dir, sizeof(dir), "%s/%s", root, archs[i]);
        check_model(archs[i], dir, 0);
    }
    static const char *heads[] = {"qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp"};
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        snprintf(dir, sizeof(dir), "%s/mtp/%s", root, heads[i]);
        check_model(heads[i], dir, 1);
    }
    return test_summary();
}
