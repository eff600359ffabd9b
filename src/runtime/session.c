/*
 * session.c - per-sequence state and the forward call (see qwenc.h).
 *
 * Memory, all from the model's backend and all allocated at init (the memory plan): each layer's state in one
 * allocation made where the layer runs (qw_be_layer; per attention/QSA layer the K/V cache and the QSA raw and
 * pooled indexer keys, per DeltaNet layer the last K-1 conv inputs and the f32 recurrent state, per PLE layer
 * the normalised gated-value history), the last n-1 token ids for the PLE hash, a step's inputs (its token ids
 * and position) and the scratch of a step. The scratch's size is measured, not estimated: init runs the model's forward for a step
 * of n_batch tokens through a backend that computes nothing (every op skipped) over an arena that only
 * counts. The forward's allocations depend on the number of tokens alone, never on the position or the
 * data (no code outside the backend reads an activation), so every step fits, a step of the same size gets
 * the same addresses, and a step allocates nothing. The kernels' own per-thread scratch (kernels/cpu.c)
 * grows on first use to the widest matmul; should that fail, the step's results are lost: the call returns
 * QWENC_ERR_NOMEM and the session must be reset.
 *
 * The MTP draft head (params.draft_head): its layer's caches are one more layer state, and every main step also
 * runs the head over the step's tokens (the "catch-up": the head at position p reads the main model's hidden at p
 * and the token at p + 1, so it lags one token behind: the last hidden waits in mtp_hid's row 0 for the token
 * that follows it). qwenc_session_draft_head runs the head a token at a time beyond that.
 */
#include <string.h>

#include "blocks/blocks.h"
#include "kernels/composite.h"
#include "kernels/cpu.h"
#include "runtime/profile.h"

/* The largest step: longer n_batch values are split into steps of this many tokens. It keeps every
 * tokens x width product of the forward (widths up to 2^22, formats/hfconfig.c) far inside int64 and the
 * tokens x heads products the kernels take as int inside int. llama.cpp's default batch is 2048. */
#define SESSION_MAX_BATCH 65536

qwenc_session_params qwenc_session_default_params(void) {
    qwenc_session_params p = {.n_ctx = 0, .n_batch = 512};
    return p;
}

/* Layers with state: the main ones, and the draft head's when the session keeps it. */
static int n_state_layers(const qwenc_session *s) { return s->model->hp.n_layer + (s->mtp ? 1 : 0); }

/* Floats of state for layer il; with base != NULL also assigns the pointers (backend memory). */
static size_t layer_state(const qwenc_model *m, int n_ctx, int il, qw_layer_state *ls, float *base) {
    const qw_hparams *hp = &m->hp;
    const qw_layer *L = &m->layers[il];
    size_t n = 0;
#define TAKE(ptr, count)                      \
    do {                                      \
        if (base) ls->ptr = base + n;         \
        n += (size_t)(count);                 \
    } while (0)
    if (L->kind == QW_LAYER_ATTN || L->kind == QW_LAYER_QSA) {
        size_t kv = (size_t)n_ctx * hp->n_head_kv * hp->head_dim;
        TAKE(k, kv);
        TAKE(v, kv);
    }
    if (L->kind == QW_LAYER_QSA) {
        TAKE(idx_raw, (size_t)n_ctx * hp->idx_head_dim);
        TAKE(idx_blk, (size_t)(n_ctx / hp->idx_ratio + 1) * hp->idx_head_dim);
    }
    if (L->kind == QW_LAYER_GDN) {
        size_t ch = (size_t)2 * hp->gdn_hk * hp->gdn_dk + (size_t)hp->gdn_hv * hp->gdn_dv;
        TAKE(conv, (size_t)(hp->gdn_conv_k - 1) * ch);
        TAKE(ssm, (size_t)hp->gdn_hv * hp->gdn_dk * hp->gdn_dv);
    }
    if (L->ple) TAKE(ple_hist, (size_t)(hp->ple_conv_k - 1) * hp->ngram_n * hp->hc_count * hp->n_embd);
#undef TAKE
    return n;
}

/* The ops of one step through backend be in session s's arena: s's T tokens, already in backend memory
 * (s->tokens) with its position (s->step); or, with seqs, one token of each of T sessions (seqs[0] == s), taken
 * from host_tokens, each session's position already in its own step. The model runs; the logits of rows
 * first_logit.. go straight into host_logits on a backend with host memory, else into the arena, whose address is
 * returned (NULL: none asked for). With the plan's dry-run backend nothing is computed and the arena only
 * measures. */
static float *step_ops(qwenc_session *s, qwenc_session *const *seqs, const qw_backend *be, int T,
                       const int32_t *host_tokens, float *host_logits, int want_logits, int first_logit, int draft) {
    const qwenc_model *m = s->model;
    const qw_hparams *hp = &m->hp;
    qw_arena_reset(&s->arena);
    qw_be_layer(be, -1);
    const int32_t *tokens = s->tokens;
    int n_ctx = s->n_ctx;
    float *cs = qw_arena_f32(&s->arena, (size_t)T * hp->n_rot);
    if (!seqs) {
        be->rope_table(be, cs, m->rope_inv_freq, hp->n_rot, T, s->step);
    } else {
        int32_t *tk = qw_arena_alloc(&s->arena, (size_t)T * sizeof(int32_t));
        be->upload(be, tk, host_tokens, (size_t)T * sizeof(int32_t));
        tokens = tk;
        for (int r = 0; r < T; r++) {
            be->rope_table(be, cs + (int64_t)r * hp->n_rot, m->rope_inv_freq, hp->n_rot, 1, seqs[r]->step);
            n_ctx = QW_MAX(n_ctx, seqs[r]->n_ctx);
        }
    }
    qw_fwd f = {.m = m, .hp = hp, .be = be, .s = s, .seqs = seqs, .n_ctx = n_ctx, .ar = &s->arena, .n_tok = T,
                .tokens = tokens, .rope_cs = cs, .draft = draft};
    /* The queries of a prompt step that see no more complete QSA blocks than the budget keeps select every
     * position up to their own (spec qwen4_exp.md 3.5, the dense regime): the query at position i while
     * floor((i + 1) / R) <= budget / R, so the first (budget / R + 1) R - 1 - n_past of the step. Only for steps run
     * op by op on the session's backend (longer than any recorded step, whose graph serves every position; not the
     * plan's dry run, which measures the selection's scratch). */
    if (!seqs && !draft && be == s->be && T > QWENC_MAX_DRAFT + 2 && hp->idx_ratio > 0) {
        const int64_t last = (int64_t)(hp->idx_budget / hp->idx_ratio + 1) * hp->idx_ratio - 2; /* the last such i */
        f.qsa_dense = (int)QW_MAX(0, QW_MIN((int64_t)T, last + 1 - s->n_past));
    }
    /* the draft head's input rows: into the session's buffer from row 1, or for a batched step into the arena,
     * each row then its session's row 1 (each session's head then catches up on its own) */
    int64_t W = qw_mtp_width(hp);
    if (!seqs && s->mtp) f.mtp_hidden = s->mtp_hid + W;
    if (seqs && hp->n_mtp) f.mtp_hidden = qw_arena_f32(&s->arena, (size_t)T * W);
    float *hidden = qw_arena_f32(&s->arena, (size_t)T * hp->n_embd);
    qw_model_forward(&f, hidden);
    if (seqs && hp->n_mtp)
        for (int r = 0; r < T; r++)
            if (seqs[r]->mtp) be->copy(be, seqs[r]->mtp_hid + W, f.mtp_hidden + r * W, (size_t)W * sizeof(float));
    float *lg = NULL;
    if (want_logits && first_logit < T) { /* want_logits 2: in the arena, and their last row's arg max into s->best;
                                            * 3 (one row): in s->top_logits, and its top k into s->top_out */
        int n = T - first_logit;
        const float *h = hidden + (int64_t)first_logit * hp->n_embd;
        lg = be->host_memory && want_logits == 1 ? host_logits
             : want_logits == 3 && n == 1 ? s->top_logits
                                          : qw_arena_f32(&s->arena, (size_t)n * hp->n_vocab);
        be->matmul(be, lg, m->output, h, n);
        const float *last = lg + (int64_t)(n - 1) * hp->n_vocab;
        if (want_logits == 2) be->argmax(be, s->best, last, 1, hp->n_vocab);
        if (want_logits == 3) {
            int k = s->topk_k;
            void *work = qw_arena_alloc(&s->arena, qw_topk_work(1, hp->n_vocab, k));
            be->topk(be, s->top_out, (float *)(s->top_out + k), last, 1, hp->n_vocab, k, work);
        }
    }
    /* the PLE hash history: the last ngram_n-1 ids */
    if (hp->ngram_n > 1) {
        if (!seqs) be->ple_hist_push(be, s->ple_hist, tokens, T, hp->ngram_n);
        else
            for (int r = 0; r < T; r++) be->ple_hist_push(be, seqs[r]->ple_hist, tokens + r, 1, hp->ngram_n);
    }
    return lg;
}

static int skip_op(void *user, int op) {
    (void)user, (void)op;
    return 0;
}

/* The draft head over n rows at the position in s->step (their tokens in s->mtp_tok): h_in [n][W] the hidden each
 * row reads, h_next [n][W] (NULL: scratch) what it passes on. With want, the logits of the last row go straight
 * into host_logits on a backend with host memory, else into the arena, whose address is returned. */
static float *mtp_ops(qwenc_session *s, const qw_backend *be, int n, const float *h_in, float *h_next,
                      float *host_logits, int want) {
    const qwenc_model *m = s->model;
    const qw_hparams *hp = &m->hp;
    qw_arena_reset(&s->arena);
    qw_be_layer(be, -1);
    float *cs = qw_arena_f32(&s->arena, (size_t)n * hp->n_rot);
    be->rope_table(be, cs, m->rope_inv_freq, hp->n_rot, n, s->step);
    qw_fwd f = {.m = m, .hp = hp, .be = be, .s = s, .n_ctx = s->n_ctx, .ar = &s->arena, .n_tok = n,
                .tokens = s->mtp_tok, .rope_cs = cs};
    if (!h_next) h_next = qw_arena_f32(&s->arena, (size_t)n * qw_mtp_width(hp));
    float *out = qw_arena_f32(&s->arena, (size_t)n * hp->n_embd);
    qw_arch_get(hp->arch)->mtp_forward(&f, h_in, h_next, out);
    if (!want) return NULL;
    float *lg = be->host_memory && host_logits ? host_logits : qw_arena_f32(&s->arena, (size_t)hp->n_vocab);
    be->matmul(be, lg, m->output, out + (int64_t)(n - 1) * hp->n_embd, 1);
    be->argmax(be, s->mtp_best, lg, 1, hp->n_vocab);
    return lg;
}

/* ---- steps recorded as graphs (qw_step_graph): a step's ops as a function of its arguments */

typedef struct {
    int T, want, first_logit, draft; /* step_ops */
    const float *h_in;               /* mtp_ops */
    float *h_next, *host_logits;
    int n_keep;                      /* accept_ops */
} step_args;
typedef float *(*step_fn)(qwenc_session *s, const qw_backend *be, const step_args *a);

static float *run_step_ops(qwenc_session *s, const qw_backend *be, const step_args *a) {
    return step_ops(s, NULL, be, a->T, NULL, a->host_logits, a->want, a->first_logit, a->draft);
}

static float *run_mtp_ops(qwenc_session *s, const qw_backend *be, const step_args *a) {
    return mtp_ops(s, be, a->T, a->h_in, a->h_next, a->host_logits, a->want);
}

/* fn's ops: recorded the second time this shape runs (the first, op by op, has put every weight it reads on the
 * device) and replayed from then on, on a backend with graphs; else op by op. */
static float *graphed(qwenc_session *s, qw_step_graph *sg, step_fn fn, const step_args *a) {
    const qw_backend *be = s->be;
    if (!be->graph_begin || sg->failed) return fn(s, be, a);
    if (!sg->g && sg->seen && be->graph_begin(be) == 0) {
        sg->lg = fn(s, be, a);
        sg->g = be->graph_end(be);
        sg->failed = !sg->g;
    }
    sg->seen = 1;
    if (!sg->g) return fn(s, be, a);
    be->graph_launch(be, sg->g);
    return sg->lg;
}

static void graphs_free(qwenc_session *s) {
    const qw_backend *be = s->model->be;
    qw_step_graph *lists[3] = {s->gr_draft, s->gr_catch, s->gr_accept};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < QWENC_MAX_DRAFT + 2; i++) {
            if (lists[l][i].g) be->graph_free(be, lists[l][i].g);
            memset(&lists[l][i], 0, sizeof(qw_step_graph));
        }
    qw_step_graph *few[2] = {s->gr_head, s->gr_one};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < (l ? 4 : 2); i++) {
            if (few[l][i].g) be->graph_free(be, few[l][i].g);
            memset(&few[l][i], 0, sizeof(qw_step_graph));
        }
}

/* After a step fed tokens[0..n) from position past0 and left their hidden in mtp_hid's rows 1..n: the head reads
 * row 0 (position past0 - 1, when there is one) and rows 1..n-1 with the tokens after each, and row n waits in
 * row 0. */
static void mtp_catch_up(qwenc_session *s, const int32_t *tokens, int n, int past0) {
    if (!s->mtp || n <= 0) return;
    const qw_backend *be = s->be;
    int64_t W = qw_mtp_width(&s->model->hp);
    int first = past0 > 0 ? 0 : 1; /* the first row that has a token after it */
    int rows = n - first;
    if (rows > 0) {
        qw_step step = {.pos0 = past0 - 1 + first};
        be->upload(be, s->step, &step, sizeof(step));
        be->upload(be, s->mtp_tok, tokens + first, (size_t)rows * sizeof(int32_t));
        step_args a = {.T = rows, .h_in = s->mtp_hid + first * W};
        if (!first && rows <= QWENC_MAX_DRAFT + 1)
            graphed(s, &s->gr_catch[rows], run_mtp_ops, &a);
        else
            run_mtp_ops(s, be, &a);
    }
    be->copy(be, s->mtp_hid, s->mtp_hid + n * W, (size_t)W * sizeof(float));
}

/* The scratch bytes of the largest step (n_batch tokens): its ops run through a backend that skips them all,
 * over an arena that measures. 0 when out of memory for the dry-run backend. */
static size_t plan_scratch(qwenc_session *s) {
    qw_backend_hooks h = {.enter = skip_op};
    qw_backend *dry = qw_backend_interpose(s->model->be, &h);
    if (!dry) return 0;
    qw_arena_init_measure(&s->arena);
    step_ops(s, NULL, dry, s->n_batch, NULL, NULL, 1, 0, 0);
    step_ops(s, NULL, dry, s->n_batch, NULL, NULL, 2, s->n_batch - 1, 0);
    if (s->top_out) { /* a top-k step with the largest k */
        s->topk_k = QWENC_MAX_TOPK;
        step_ops(s, NULL, dry, s->n_batch, NULL, NULL, 3, s->n_batch - 1, 0);
    }
    if (s->mtp) mtp_ops(s, dry, s->n_batch, NULL, NULL, NULL, 1);
    dry->release(dry);
    return QW_MAX(s->arena.high_water, (size_t)64);
}

qwenc_status qwenc_session_init(const qwenc_model *m, const qwenc_session_params *params, qwenc_session **out,
                                char *err, size_t errlen) {
    *out = NULL;
    qwenc_session_params p = params ? *params : qwenc_session_default_params();
    if (p.n_ctx < 0 || p.n_batch < 0)
        return qw_err(err, errlen, QWENC_ERR_ARG, "session: n_ctx and n_batch must not be negative");
    if (p.n_ctx == 0) p.n_ctx = QW_MIN(m->hp.n_ctx_train, 4096);
    if (p.n_batch == 0) p.n_batch = 512;
    qwenc_session *s = qw_calloc(1, sizeof(*s));
    if (!s) return qw_err_nomem(err, errlen, "session", 1, sizeof(*s));
    const qw_backend *be = m->be;
    s->model = m;
    s->be = be;
    s->n_ctx = p.n_ctx;
    s->n_batch = QW_MIN(QW_MIN(p.n_batch, p.n_ctx), SESSION_MAX_BATCH);
    s->mtp = p.draft_head && m->hp.n_mtp > 0;
    qwenc_status st = QWENC_OK;
    int nl = n_state_layers(s);
    s->ls = qw_calloc((size_t)nl, sizeof(qw_layer_state));
    if (!s->ls) st = qw_err_nomem(err, errlen, "session: layer states", (size_t)nl, sizeof(qw_layer_state));
    size_t total = 0;
    for (int il = 0; !st && il < nl; il++) total += layer_state(m, s->n_ctx, il, NULL, NULL);
    for (int il = 0; !st && il < nl; il++) { /* each layer's where it runs */
        qw_layer_state *ls = &s->ls[il];
        ls->n = layer_state(m, s->n_ctx, il, NULL, NULL);
        qw_be_layer(be, il);
        if (!(ls->mem = be->alloc(be, QW_MAX(ls->n, (size_t)1) * sizeof(float), QW_MEM_STATE)))
            st = qw_err(err, errlen, QWENC_ERR_NOMEM,
                        "session: out of memory allocating %.1f MiB of state for %d tokens (layer %d; %.1f MiB in all; "
                        "raise the memory or lower n_ctx)",
                        (double)ls->n * sizeof(float) / (1 << 20), p.n_ctx, il,
                        (double)total * sizeof(float) / (1 << 20));
        else
            layer_state(m, s->n_ctx, il, ls, ls->mem);
    }
    qw_be_layer(be, -1);
    if (!st && (!(s->ple_hist = be->alloc(be, 8 * sizeof(int32_t), QW_MEM_STATE)) ||
                !(s->step = be->alloc(be, sizeof(qw_step), QW_MEM_ACT)) ||
                !(s->best = be->alloc(be, sizeof(int32_t), QW_MEM_ACT)) ||
                !(s->tokens = be->alloc(be, (size_t)s->n_batch * sizeof(int32_t), QW_MEM_ACT))))
        st = qw_err(err, errlen, QWENC_ERR_NOMEM, "session: out of memory allocating the step's inputs");
    s->top_host = !be->topk || be->host_memory; /* the top k chosen on the host from logits in host memory */
    if (!st && !s->top_host &&
        (!(s->top_logits = be->alloc(be, (size_t)m->hp.n_vocab * sizeof(float), QW_MEM_ACT)) ||
         !(s->top_out = be->alloc(be, 2 * QWENC_MAX_TOPK * sizeof(int32_t), QW_MEM_ACT))))
        st = qw_err(err, errlen, QWENC_ERR_NOMEM, "session: out of memory allocating the top-k step's outputs");
    if (!st && s->top_host && !(s->top_logits = qw_malloc((size_t)m->hp.n_vocab, sizeof(float))))
        st = qw_err_nomem(err, errlen, "session: the last logits", (size_t)m->hp.n_vocab, sizeof(float));
    if (!st && s->mtp) {
        size_t W = (size_t)qw_mtp_width(&m->hp);
        if (!(s->mtp_hid = be->alloc(be, (size_t)(s->n_batch + 1) * W * sizeof(float), QW_MEM_STATE)) ||
            !(s->mtp_chain = be->alloc(be, W * sizeof(float), QW_MEM_STATE)) ||
            !(s->mtp_tok = be->alloc(be, (size_t)s->n_batch * sizeof(int32_t), QW_MEM_ACT)) ||
            !(s->mtp_best = be->alloc(be, sizeof(int32_t), QW_MEM_ACT)))
            st = qw_err(err, errlen, QWENC_ERR_NOMEM, "session: out of memory allocating the draft head's inputs");
    }
    if (!st) {
        s->scratch_bytes = plan_scratch(s);
        if (!s->scratch_bytes || !(s->scratch = be->alloc(be, s->scratch_bytes, QW_MEM_ACT)))
            st = qw_err(err, errlen, QWENC_ERR_NOMEM,
                        "session: out of memory allocating %.1f MiB of scratch for steps of %d tokens (lower n_batch)",
                        (double)s->scratch_bytes / (1 << 20), s->n_batch);
    }
    if (st) {
        qwenc_session_free(s);
        return st;
    }
    qw_arena_init(&s->arena, s->scratch, s->scratch_bytes);
    qwenc_session_reset(s);
    *out = s;
    return QWENC_OK;
}

void qwenc_session_free(qwenc_session *s) {
    if (!s) return;
    const qw_backend *be = s->model->be;
    graphs_free(s);
    be->free(be, s->best);
    if (s->top_host) free(s->top_logits);
    else be->free(be, s->top_logits);
    be->free(be, s->top_out);
    qw_prof_free(s->prof);
    be->free(be, s->scratch);
    be->free(be, s->tokens);
    be->free(be, s->step);
    be->free(be, s->ple_hist);
    for (int il = 0; s->ls && il < n_state_layers(s); il++) be->free(be, s->ls[il].mem);
    for (int il = 0; s->dl && il < s->model->hp.n_layer; il++) be->free(be, s->dl[il].mem);
    be->free(be, s->draft_hist);
    be->free(be, s->mtp_hid);
    be->free(be, s->mtp_chain);
    be->free(be, s->mtp_tok);
    be->free(be, s->mtp_best);
    free(s->dl);
    free(s->ls);
    free(s);
}

void qwenc_session_reset(qwenc_session *s) {
    /* the recurrent parts must restart from zero; K/V rows are rewritten before they are read */
    const qw_backend *be = s->model->be;
    for (int il = 0; il < n_state_layers(s); il++) {
        qw_be_layer(be, il);
        be->zero(be, s->ls[il].mem, s->ls[il].n * sizeof(float));
    }
    qw_be_layer(be, -1);
    int32_t hist[8];
    for (int i = 0; i < 8; i++) hist[i] = s->model->hp.eos_id;
    be->upload(be, s->ple_hist, hist, sizeof(hist));
    s->n_past = 0;
    s->lost = 0;
    s->draft_n = 0;
    s->mtp_j = 0;
    s->top_valid = 0;
}

int qwenc_session_n_past(const qwenc_session *s) { return s->n_past; }
int qwenc_session_n_ctx(const qwenc_session *s) { return s->n_ctx; }

/* One step of at most n_batch tokens. logits: [T][V] rows to fill from row `first_logit` on (NULL: none). On a
 * backend with graphs, a one-token step is recorded once (graphed: after one has run op by op, so every weight
 * it reads is on the device) and replayed: its ops are the same at every position; so are draft steps by size. */
static void forward_step(qwenc_session *s, const int32_t *tokens, int T, float *logits, int first_logit, int draft,
                         int32_t *best, int32_t *top) {
    double t0 = s->prof ? qw_prof_now() : 0;
    const qw_backend *be = s->be;
    const qw_hparams *hp = &s->model->hp;
    qw_step step = {.pos0 = s->n_past};
    be->upload(be, s->step, &step, sizeof(step));
    be->upload(be, s->tokens, tokens, (size_t)T * sizeof(int32_t));
    int want = best ? 2 : top ? 3 : logits != NULL;
    float *lg = NULL;
    s->top_valid = 0;
    if (top && s->gr_topk_k != s->topk_k) { /* the recorded top-k step is of another k */
        if (s->gr_one[3].g) be->graph_free(be, s->gr_one[3].g);
        memset(&s->gr_one[3], 0, sizeof(qw_step_graph));
        s->gr_topk_k = s->topk_k;
    }
    if (T == 1 && !draft) {
        step_args a = {.T = 1, .want = want, .first_logit = first_logit, .host_logits = logits};
        lg = graphed(s, &s->gr_one[want], run_step_ops, &a);
    } else if (draft && T <= QWENC_MAX_DRAFT + 1) {
        step_args a = {.T = T, .want = want || !be->host_memory, .draft = 1, .host_logits = logits};
        lg = graphed(s, &s->gr_draft[T], run_step_ops, &a);
    } else {
        lg = step_ops(s, NULL, be, T, NULL, logits, want, first_logit, draft);
    }
    if (best) be->download(be, best, s->best, sizeof(int32_t));
    else if (top) be->download(be, top, s->top_out, 2 * (size_t)s->topk_k * sizeof(int32_t));
    else if (lg && logits && !be->host_memory)
        be->download(be, logits, lg, (size_t)(T - first_logit) * hp->n_vocab * sizeof(float));
    if (!draft) mtp_catch_up(s, tokens, T, s->n_past); /* a draft step's: when its tokens are accepted */
    be->sync(be);
    s->n_past += T;
    s->mtp_j = 0;
    s->top_valid = top != NULL;
    if (s->prof) qw_prof_step(s->prof, T, qw_prof_now() - t0);
}

/* qwenc_session_forward, or with best its arg max variant, with top its top-k variant (s->topk_k: k ids then k
 * values) (logits NULL, logits_all 0). */
static qwenc_status forward_tokens(qwenc_session *s, const int32_t *tokens, int n_tokens, float *logits,
                                   int logits_all, int32_t *best, int32_t *top, char *err, size_t errlen) {
    const qw_hparams *hp = &s->model->hp;
    if (n_tokens <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "forward: no tokens given");
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return qw_err(err, errlen, QWENC_ERR_ARG, "forward: token %d at index %d is outside the vocabulary [0, %d)",
                          tokens[i], i, hp->n_vocab);
    if (s->lost)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "forward: the session's state was lost to an earlier out-of-memory error; reset it first");
    if (s->draft_n)
        return qw_err(err, errlen, QWENC_ERR_ARG, "forward: a draft step awaits qwenc_session_accept");
    if (n_tokens > s->n_ctx - s->n_past)
        return qw_err(err, errlen, QWENC_ERR_CONTEXT,
                      "forward: %d cached + %d new tokens exceed the session context of %d tokens", s->n_past,
                      n_tokens, s->n_ctx);
    unsigned long failed = qw_cpu_scratch_failures();
    for (int i = 0; i < n_tokens; i += s->n_batch) {
        int T = QW_MIN(s->n_batch, n_tokens - i);
        int last = i + T == n_tokens;
        if (logits_all)
            forward_step(s, tokens + i, T, logits ? logits + (int64_t)i * hp->n_vocab : NULL, 0, 0, NULL, NULL);
        else
            forward_step(s, tokens + i, T, last ? logits : NULL, T - 1, 0, last ? best : NULL, last ? top : NULL);
        if (qw_cpu_scratch_failures() != failed) {
            s->lost = 1;
            return qw_err(err, errlen, QWENC_ERR_NOMEM,
                          "forward: the kernels ran out of memory for their scratch; the session's state is lost "
                          "(reset it)");
        }
    }
    return QWENC_OK;
}

qwenc_status qwenc_session_forward(qwenc_session *s, const int32_t *tokens, int n_tokens, float *logits,
                                   int logits_all, char *err, size_t errlen) {
    return forward_tokens(s, tokens, n_tokens, logits, logits_all, NULL, NULL, err, errlen);
}

qwenc_status qwenc_session_forward_argmax(qwenc_session *s, const int32_t *tokens, int n_tokens, int32_t *best,
                                          char *err, size_t errlen) {
    if (!best) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_argmax: no place for the token given");
    return forward_tokens(s, tokens, n_tokens, NULL, 0, best, NULL, err, errlen);
}

qwenc_status qwenc_session_forward_topk(qwenc_session *s, const int32_t *tokens, int n_tokens, int k, int32_t *ids,
                                        float *logits, char *err, size_t errlen) {
    const qwenc_model *m = s->model;
    if (!ids || !logits) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_topk: no place for the ids and logits");
    if (k < 1 || k > QWENC_MAX_TOPK || k > m->hp.n_vocab)
        return qw_err(err, errlen, QWENC_ERR_ARG, "forward_topk: k must be in [1, %d] and at most the vocabulary (%d), "
                      "got %d", QWENC_MAX_TOPK, m->hp.n_vocab, k);
    s->top_valid = 0;
    qwenc_status st;
    if (s->top_out) { /* chosen where the model runs: k ids and k values come back */
        int32_t out[2 * QWENC_MAX_TOPK];
        s->topk_k = k;
        st = forward_tokens(s, tokens, n_tokens, NULL, 0, NULL, out, err, errlen);
        if (!st) {
            memcpy(ids, out, (size_t)k * sizeof(int32_t));
            memcpy(logits, out + k, (size_t)k * sizeof(float));
        }
        return st;
    }
    /* else the logits come to the host (a backend with host memory, or one without the op) */
    st = forward_tokens(s, tokens, n_tokens, s->top_logits, 0, NULL, NULL, err, errlen);
    if (!st) {
        qw_op_topk(NULL, ids, logits, s->top_logits, 1, m->hp.n_vocab, k, NULL);
        s->top_valid = 1;
    }
    return st;
}

qwenc_status qwenc_session_last_logits(qwenc_session *s, float *logits, char *err, size_t errlen) {
    if (!s->top_valid)
        return qw_err(err, errlen, QWENC_ERR_ARG, "last_logits: no qwenc_session_forward_topk step is the last one");
    if (s->top_host) memcpy(logits, s->top_logits, (size_t)s->model->hp.n_vocab * sizeof(float));
    else s->be->download(s->be, logits, s->top_logits, (size_t)s->model->hp.n_vocab * sizeof(float));
    return QWENC_OK;
}

/* ---- draft steps (qwenc.h): what a step of up to QWENC_MAX_DRAFT + 1 tokens keeps to take tokens back */

/* Floats of layer il's draft buffers for cap tokens; with base != NULL also assigns the pointers. */
static size_t draft_layer(const qwenc_model *m, int il, int cap, qw_draft_layer *dl, float *base) {
    const qw_hparams *hp = &m->hp;
    const qw_layer *L = &m->layers[il];
    size_t n = 0;
#define TAKE(ptr, count)                      \
    do {                                      \
        if (base) dl->ptr = base + n;         \
        n += (size_t)(count);                 \
    } while (0)
    if (L->kind == QW_LAYER_GDN) {
        size_t kd = (size_t)hp->gdn_hk * hp->gdn_dk, vd = (size_t)hp->gdn_hv * hp->gdn_dv, ch = 2 * kd + vd;
        TAKE(conv_seq, (size_t)(hp->gdn_conv_k - 1 + cap) * ch);
        TAKE(ssm0, (size_t)hp->gdn_hv * hp->gdn_dk * hp->gdn_dv);
        TAKE(q, (size_t)cap * kd);
        TAKE(k, (size_t)cap * kd);
        TAKE(v, (size_t)cap * vd);
        TAKE(g, (size_t)cap * hp->gdn_hv);
        TAKE(b, (size_t)cap * hp->gdn_hv);
    }
    if (L->ple)
        TAKE(ple_seq, ((size_t)(hp->ple_conv_k - 1) * hp->ngram_n + cap) * hp->hc_count * hp->n_embd);
#undef TAKE
    return n;
}

static qwenc_status draft_alloc(qwenc_session *s, char *err, size_t errlen) {
    const qwenc_model *m = s->model;
    const qw_backend *be = m->be;
    int cap = QWENC_MAX_DRAFT + 1, L = m->hp.n_layer;
    size_t total = 0;
    for (int il = 0; il < L; il++) total += draft_layer(m, il, cap, NULL, NULL);
    qw_draft_layer *dl = qw_calloc((size_t)L, sizeof(qw_draft_layer));
    int ok = dl != NULL;
    for (int il = 0; ok && il < L; il++) { /* each layer's where it runs */
        size_t n = draft_layer(m, il, cap, NULL, NULL);
        qw_be_layer(be, il);
        ok = (dl[il].mem = be->alloc(be, QW_MAX(n, (size_t)1) * sizeof(float), QW_MEM_STATE)) != NULL;
        if (ok) draft_layer(m, il, cap, &dl[il], dl[il].mem);
    }
    qw_be_layer(be, -1);
    s->draft_hist = ok ? be->alloc(be, 8 * sizeof(int32_t), QW_MEM_STATE) : NULL;
    if (!s->draft_hist) {
        for (int il = 0; dl && il < L; il++) be->free(be, dl[il].mem);
        free(dl);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "draft: out of memory allocating %.1f MiB to take drafts back",
                      (double)total * sizeof(float) / (1 << 20));
    }
    s->dl = dl;
    return QWENC_OK;
}

qwenc_status qwenc_session_forward_draft(qwenc_session *s, const int32_t *tokens, int n_tokens, float *logits,
                                         char *err, size_t errlen) {
    const qw_hparams *hp = &s->model->hp;
    if (n_tokens <= 0 || n_tokens > QWENC_MAX_DRAFT + 1 || n_tokens > s->n_batch)
        return qw_err(err, errlen, QWENC_ERR_ARG, "forward_draft: %d tokens; a draft step takes 1 to %d (and at most "
                      "n_batch, %d)", n_tokens, QWENC_MAX_DRAFT + 1, s->n_batch);
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return qw_err(err, errlen, QWENC_ERR_ARG,
                          "forward_draft: token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                          hp->n_vocab);
    if (s->lost)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "forward_draft: the session's state was lost to an earlier out-of-memory error; reset it first");
    if (s->draft_n) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_draft: the previous draft step awaits accept");
    if (n_tokens > s->n_ctx - s->n_past)
        return qw_err(err, errlen, QWENC_ERR_CONTEXT,
                      "forward_draft: %d cached + %d new tokens exceed the session context of %d tokens", s->n_past,
                      n_tokens, s->n_ctx);
    if (!s->dl) {
        qwenc_status st = draft_alloc(s, err, errlen);
        if (st) return st;
    }
    const qw_backend *be = s->be;
    be->copy(be, s->draft_hist, s->ple_hist, 8 * sizeof(int32_t));
    s->draft_past = s->n_past;
    unsigned long failed = qw_cpu_scratch_failures();
    forward_step(s, tokens, n_tokens, logits, 0, 1, NULL, NULL);
    if (qw_cpu_scratch_failures() != failed) {
        s->lost = 1;
        return qw_err(err, errlen, QWENC_ERR_NOMEM,
                      "forward_draft: the kernels ran out of memory for their scratch; the session's state is lost "
                      "(reset it)");
    }
    memcpy(s->draft_tokens, tokens, (size_t)n_tokens * sizeof(int32_t));
    s->draft_n = n_tokens;
    return QWENC_OK;
}

/* What accept does to take tokens back, keeping a->n_keep of the draft step's (its kept tokens already in
 * s->tokens). */
static float *accept_ops(qwenc_session *s, const qw_backend *be, const step_args *a) {
    const qw_hparams *hp = &s->model->hp;
    int n_keep = a->n_keep;
    qw_arena_reset(&s->arena);
    int hk = hp->gdn_hk, hv = hp->gdn_hv, dk = hp->gdn_dk, dv = hp->gdn_dv;
    int64_t ch = 2 * (int64_t)hk * dk + (int64_t)hv * dv, CH = (int64_t)hp->hc_count * hp->n_embd;
    float *o = NULL;
    for (int il = 0; il < hp->n_layer; il++) {
        qw_layer_state *ls = &s->ls[il];
        const qw_draft_layer *d = &s->dl[il];
        qw_be_layer(be, il);
        if (ls->ssm) { /* the conv window after the kept tokens; the recurrence of the kept tokens from before */
            be->copy(be, ls->conv, d->conv_seq + (int64_t)n_keep * ch, (size_t)(hp->gdn_conv_k - 1) * ch * sizeof(float));
            be->copy(be, ls->ssm, d->ssm0, (size_t)hv * dk * dv * sizeof(float));
            if (n_keep) {
                if (!o) o = qw_arena_f32(&s->arena, (size_t)n_keep * hv * dv);
                qw_gdn_recur(be, o, ls->ssm, d->q, d->k, d->v, d->g, d->b, n_keep, hk, hv, dk, dv,
                             qw_gdn_tiled(&s->model->layers[il].gdn, hk, hv));
            }
        }
        if (ls->ple_hist)
            be->copy(be, ls->ple_hist, d->ple_seq + (int64_t)n_keep * CH,
                     (size_t)(hp->ple_conv_k - 1) * hp->ngram_n * CH * sizeof(float));
    }
    qw_be_layer(be, -1);
    be->copy(be, s->ple_hist, s->draft_hist, 8 * sizeof(int32_t));
    if (n_keep && hp->ngram_n > 1) be->ple_hist_push(be, s->ple_hist, s->tokens, n_keep, hp->ngram_n);
    return NULL;
}

qwenc_status qwenc_session_accept(qwenc_session *s, int n_keep, char *err, size_t errlen) {
    if (!s->draft_n) return qw_err(err, errlen, QWENC_ERR_ARG, "accept: no draft step to accept");
    if (n_keep < 0 || n_keep > s->draft_n)
        return qw_err(err, errlen, QWENC_ERR_ARG, "accept: %d tokens kept of a draft step of %d", n_keep, s->draft_n);
    int n = s->draft_n;
    const qw_backend *be = s->be;
    s->draft_n = 0;
    s->mtp_j = 0;
    unsigned long failed = qw_cpu_scratch_failures();
    mtp_catch_up(s, s->draft_tokens, n_keep, s->draft_past);
    if (n_keep < n) { /* else the state is the step's */
        if (n_keep) be->upload(be, s->tokens, s->draft_tokens, (size_t)n_keep * sizeof(int32_t));
        step_args a = {.n_keep = n_keep};
        graphed(s, &s->gr_accept[n_keep], accept_ops, &a);
    }
    be->sync(be);
    if (qw_cpu_scratch_failures() != failed) {
        s->lost = 1;
        return qw_err(err, errlen, QWENC_ERR_NOMEM,
                      "accept: the kernels ran out of memory for their scratch; the session's state is lost (reset it)");
    }
    s->n_past = s->draft_past + n_keep;
    return QWENC_OK;
}

/* ---- the draft head (qwenc.h) */

int qwenc_session_has_draft_head(const qwenc_session *s) { return s->mtp; }

qwenc_status qwenc_session_draft_head(qwenc_session *s, int32_t token, float *logits, int32_t *best, char *err,
                                      size_t errlen) {
    const qw_hparams *hp = &s->model->hp;
    if (!s->mtp)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      hp->n_mtp ? "draft_head: the session was made without params.draft_head"
                                : "draft_head: the model has no MTP draft head");
    if (token < 0 || token >= hp->n_vocab)
        return qw_err(err, errlen, QWENC_ERR_ARG, "draft_head: token %d is outside the vocabulary [0, %d)", token,
                      hp->n_vocab);
    if (s->lost)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "draft_head: the session's state was lost to an earlier out-of-memory error; reset it first");
    if (s->draft_n) return qw_err(err, errlen, QWENC_ERR_ARG, "draft_head: a draft step awaits qwenc_session_accept");
    if (s->n_past == 0) return qw_err(err, errlen, QWENC_ERR_ARG, "draft_head: feed at least one token first");
    if (s->mtp_j >= QWENC_MAX_DRAFT)
        return qw_err(err, errlen, QWENC_ERR_ARG, "draft_head: %d head steps in a row; at most %d", s->mtp_j + 1,
                      QWENC_MAX_DRAFT);
    int pos = s->n_past - 1 + s->mtp_j;
    if (pos >= s->n_ctx)
        return qw_err(err, errlen, QWENC_ERR_CONTEXT, "draft_head: position %d is beyond the session context of %d",
                      pos, s->n_ctx);
    const qw_backend *be = s->be;
    unsigned long failed = qw_cpu_scratch_failures();
    qw_step step = {.pos0 = pos};
    be->upload(be, s->step, &step, sizeof(step));
    be->upload(be, s->mtp_tok, &token, sizeof(token));
    step_args a = {.T = 1, .want = 1, .h_in = s->mtp_j ? s->mtp_chain : s->mtp_hid, .h_next = s->mtp_chain,
                   .host_logits = logits};
    float *lg = graphed(s, &s->gr_head[s->mtp_j > 0], run_mtp_ops, &a);
    if (logits && !be->host_memory) be->download(be, logits, lg, (size_t)hp->n_vocab * sizeof(float));
    if (best) be->download(be, best, s->mtp_best, sizeof(int32_t));
    be->sync(be);
    if (qw_cpu_scratch_failures() != failed) {
        s->lost = 1;
        return qw_err(err, errlen, QWENC_ERR_NOMEM,
                      "draft_head: the kernels ran out of memory for their scratch; the session's state is lost "
                      "(reset it)");
    }
    s->mtp_j++;
    return QWENC_OK;
}

qwenc_status qwenc_session_draft_greedy(qwenc_session *s, int32_t token, int n, int32_t *drafts, char *err,
                                        size_t errlen) {
    for (int j = 0; j < n; j++) {
        qwenc_status st = qwenc_session_draft_head(s, j ? drafts[j - 1] : token, NULL, &drafts[j], err, errlen);
        if (st) return st;
    }
    return QWENC_OK;
}

/* ---- snapshots: the state a session's first n_past tokens left, region by region in a fixed order (the rows of
 * the caches that hold them, the whole recurrent states, the token history) */

struct qwenc_snapshot {
    const qwenc_model *model;
    int n_past;
    size_t bytes;
    uint8_t *data;
};

/* Every region of s that holds the state of its first n_past tokens: fn(backend address, bytes, offset). */
static size_t state_regions(const qwenc_session *s, int n_past, void (*fn)(void *dev, size_t bytes, size_t off, void *u),
                            void *u) {
    const qw_hparams *hp = &s->model->hp;
    size_t off = 0;
#define REGION(p, n)                                                                                                \
    do {                                                                                                            \
        size_t b_ = (size_t)(n);                                                                                    \
        if (fn && b_) fn((void *)(p), b_, off, u);                                                                  \
        off += b_;                                                                                                  \
    } while (0)
    for (int il = 0; il < n_state_layers(s); il++) {
        const qw_layer_state *ls = &s->ls[il];
        size_t kv = (size_t)n_past * hp->n_head_kv * hp->head_dim * sizeof(float);
        if (ls->k) {
            REGION(ls->k, kv);
            REGION(ls->v, kv);
        }
        if (ls->idx_raw) REGION(ls->idx_raw, (size_t)n_past * hp->idx_head_dim * sizeof(float));
        if (ls->idx_blk) REGION(ls->idx_blk, (size_t)(n_past / hp->idx_ratio) * hp->idx_head_dim * sizeof(float));
        size_t ch = (size_t)2 * hp->gdn_hk * hp->gdn_dk + (size_t)hp->gdn_hv * hp->gdn_dv;
        if (ls->conv) REGION(ls->conv, (size_t)(hp->gdn_conv_k - 1) * ch * sizeof(float));
        if (ls->ssm) REGION(ls->ssm, (size_t)hp->gdn_hv * hp->gdn_dk * hp->gdn_dv * sizeof(float));
        if (ls->ple_hist)
            REGION(ls->ple_hist,
                   (size_t)(hp->ple_conv_k - 1) * hp->ngram_n * hp->hc_count * hp->n_embd * sizeof(float));
    }
    REGION(s->ple_hist, 8 * sizeof(int32_t));
    if (s->mtp) REGION(s->mtp_hid, (size_t)qw_mtp_width(hp) * sizeof(float)); /* the hidden the head waits on */
#undef REGION
    return off;
}

typedef struct {
    const qw_backend *be;
    uint8_t *host;
} region_io;

static void region_down(void *dev, size_t bytes, size_t off, void *u) {
    region_io *io = u;
    io->be->download(io->be, io->host + off, dev, bytes);
}

static void region_up(void *dev, size_t bytes, size_t off, void *u) {
    region_io *io = u;
    io->be->upload(io->be, dev, io->host + off, bytes);
}

qwenc_status qwenc_session_snapshot(const qwenc_session *s, qwenc_snapshot **out, char *err, size_t errlen) {
    *out = NULL;
    if (s->lost)
        return qw_err(err, errlen, QWENC_ERR_ARG, "snapshot: the session's state was lost to an earlier error");
    if (s->draft_n) return qw_err(err, errlen, QWENC_ERR_ARG, "snapshot: a draft step awaits qwenc_session_accept");
    qwenc_snapshot *snap = qw_calloc(1, sizeof(*snap));
    size_t bytes = state_regions(s, s->n_past, NULL, NULL);
    if (snap) snap->data = qw_malloc(bytes ? bytes : 1, 1);
    if (!snap || !snap->data) {
        free(snap);
        return qw_err_nomem(err, errlen, "session snapshot", bytes, 1);
    }
    snap->model = s->model;
    snap->n_past = s->n_past;
    snap->bytes = bytes;
    region_io io = {s->model->be, snap->data};
    state_regions(s, s->n_past, region_down, &io);
    *out = snap;
    return QWENC_OK;
}

qwenc_status qwenc_session_restore(qwenc_session *s, const qwenc_snapshot *snap, char *err, size_t errlen) {
    s->top_valid = 0;
    if (snap->model != s->model)
        return qw_err(err, errlen, QWENC_ERR_ARG, "restore: the snapshot is of another model");
    if (s->draft_n) return qw_err(err, errlen, QWENC_ERR_ARG, "restore: a draft step awaits qwenc_session_accept");
    if (snap->n_past > s->n_ctx)
        return qw_err(err, errlen, QWENC_ERR_CONTEXT,
                      "restore: the snapshot holds %d tokens, more than the session's context of %d", snap->n_past,
                      s->n_ctx);
    if (state_regions(s, snap->n_past, NULL, NULL) != snap->bytes)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "restore: the snapshot was taken from a session %s the draft head's caches",
                      s->mtp ? "without" : "with");
    region_io io = {s->model->be, snap->data};
    state_regions(s, snap->n_past, region_up, &io);
    s->model->be->sync(s->model->be);
    s->n_past = snap->n_past;
    s->lost = 0;
    s->mtp_j = 0;
    return QWENC_OK;
}

int qwenc_snapshot_n_past(const qwenc_snapshot *snap) { return snap->n_past; }
size_t qwenc_snapshot_bytes(const qwenc_snapshot *snap) { return snap->bytes; }

void qwenc_snapshot_free(qwenc_snapshot *snap) {
    if (!snap) return;
    free(snap->data);
    free(snap);
}

/* ---- several sessions' decode steps at once: one step whose rows are the sessions' tokens, run in the first
 * session's scratch (grown once, when a batch is larger than any planned before) */

/* The scratch of a batched step of n sessions, measured as plan_scratch does; the first session's scratch grown
 * to it when short (its recorded graphs go: their addresses change). */
static qwenc_status plan_batch(qwenc_session *const *seqs, int n, char *err, size_t errlen) {
    qwenc_session *s = seqs[0];
    if (s->batch_planned >= n) return QWENC_OK;
    const qw_backend *be = s->model->be;
    qw_backend_hooks h = {.enter = skip_op};
    qw_backend *dry = qw_backend_interpose(be, &h);
    if (!dry) return qw_err_nomem(err, errlen, "forward_batch: the plan", 1, sizeof(qw_backend));
    qw_arena_init_measure(&s->arena);
    static const int32_t none[1];
    step_ops(s, seqs, dry, n, none, NULL, 1, 0, 0);
    dry->release(dry);
    size_t need = s->arena.high_water;
    qw_arena_init(&s->arena, s->scratch, s->scratch_bytes);
    if (need > s->scratch_bytes) {
        void *p = be->alloc(be, need, QW_MEM_ACT);
        if (!p)
            return qw_err(err, errlen, QWENC_ERR_NOMEM,
                          "forward_batch: out of memory for %.1f MiB of scratch for %d sessions", need / 1048576.0, n);
        graphs_free(s);
        be->free(be, s->scratch);
        s->scratch = p;
        s->scratch_bytes = need;
        qw_arena_init(&s->arena, s->scratch, s->scratch_bytes);
    }
    s->batch_planned = n;
    return QWENC_OK;
}

qwenc_status qwenc_session_forward_batch(qwenc_session *const *sessions, const int32_t *tokens, int n, float *logits,
                                         char *err, size_t errlen) {
    if (n <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_batch: no sessions given");
    const qwenc_model *m = sessions[0]->model;
    for (int i = 0; i < n; i++) {
        qwenc_session *s = sessions[i];
        if (s->model != m) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_batch: session %d is of another model", i);
        for (int j = 0; j < i; j++)
            if (sessions[j] == s) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_batch: session %d given twice", i);
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return qw_err(err, errlen, QWENC_ERR_ARG, "forward_batch: token %d of session %d is outside the vocabulary [0, %d)",
                          tokens[i], i, m->hp.n_vocab);
        if (s->lost) return qw_err(err, errlen, QWENC_ERR_ARG, "forward_batch: session %d was lost to an earlier error", i);
        if (s->draft_n)
            return qw_err(err, errlen, QWENC_ERR_ARG, "forward_batch: session %d has a draft step awaiting accept", i);
        if (s->n_past >= s->n_ctx)
            return qw_err(err, errlen, QWENC_ERR_CONTEXT, "forward_batch: session %d's context of %d tokens is full", i,
                          s->n_ctx);
    }
    if (n == 1) return qwenc_session_forward(sessions[0], tokens, 1, logits, 0, err, errlen);
    qwenc_status st = plan_batch(sessions, n, err, errlen);
    if (st) return st;
    qwenc_session *s = sessions[0];
    const qw_backend *be = s->be;
    double t0 = s->prof ? qw_prof_now() : 0;
    for (int i = 0; i < n; i++) {
        qw_step step = {.pos0 = sessions[i]->n_past};
        be->upload(be, sessions[i]->step, &step, sizeof(step));
    }
    unsigned long failed = qw_cpu_scratch_failures();
    float *lg = step_ops(s, sessions, be, n, tokens, logits, logits != NULL, 0, 0);
    if (lg && !be->host_memory) be->download(be, logits, lg, (size_t)n * m->hp.n_vocab * sizeof(float));
    for (int i = 0; i < n; i++) mtp_catch_up(sessions[i], tokens + i, 1, sessions[i]->n_past);
    be->sync(be);
    if (qw_cpu_scratch_failures() != failed) {
        for (int i = 0; i < n; i++) sessions[i]->lost = 1;
        return qw_err(err, errlen, QWENC_ERR_NOMEM,
                      "forward_batch: the kernels ran out of memory for their scratch; the sessions' states are lost");
    }
    for (int i = 0; i < n; i++) sessions[i]->n_past++, sessions[i]->mtp_j = 0, sessions[i]->top_valid = 0;
    if (s->prof) qw_prof_step(s->prof, n, qw_prof_now() - t0);
    return QWENC_OK;
}

qwenc_status qwenc_session_profile(qwenc_session *s, int on, char *err, size_t errlen) {
    if (!on) {
        qw_prof_free(s->prof);
        s->prof = NULL;
        s->be = s->model->be;
        return QWENC_OK;
    }
    if (s->prof) {
        qw_prof_reset(s->prof);
        return QWENC_OK;
    }
    s->prof = qw_prof_new(s->model->be);
    if (!s->prof) return qw_err_nomem(err, errlen, "session: the profile", 1, qw_prof_size());
    s->be = qw_prof_backend(s->prof);
    return QWENC_OK;
}

int qwenc_session_profile_read(const qwenc_session *s, qwenc_profile_entry *out, int max,
                               qwenc_profile_totals *totals) {
    if (!s->prof) {
        if (totals) *totals = (qwenc_profile_totals){0};
        return 0;
    }
    return qw_prof_read(s->prof, out, max, totals);
}
