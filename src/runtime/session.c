/*
 * session.c - per-sequence state and the forward call (see qwenc.h).
 *
 * All state lives in one allocation made at init: per attention/QSA layer the K/V cache (and the QSA
 * raw and pooled indexer keys), per DeltaNet layer the last K-1 conv inputs and the f32 recurrent
 * state, per PLE layer the normalised gated-value history; plus the last n-1 token ids for the PLE
 * hash. A call is split into steps of at most n_batch tokens; every step's temporaries come from the
 * session's arena, which stops growing after the largest step, so decoding allocates nothing.
 */
#include <string.h>

#include "blocks/blocks.h"
#include "runtime/profile.h"

qwenc_session_params qwenc_session_default_params(void) {
    qwenc_session_params p = {.n_ctx = 0, .n_batch = 512};
    return p;
}

/* Floats of state for layer il; with base != NULL also assigns the pointers. */
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

qwenc_status qwenc_session_init(const qwenc_model *m, const qwenc_session_params *params, qwenc_session **out,
                                char *err, size_t errlen) {
    *out = NULL;
    qwenc_session_params p = params ? *params : qwenc_session_default_params();
    if (p.n_ctx < 0 || p.n_batch < 0)
        return qw_err(err, errlen, QWENC_ERR_ARG, "session: n_ctx and n_batch must not be negative");
    if (p.n_ctx == 0) p.n_ctx = QW_MIN(m->hp.n_ctx_train, 4096);
    if (p.n_batch == 0) p.n_batch = 512;
    qwenc_session *s = qw_xcalloc(1, sizeof(*s));
    s->model = m;
    s->n_ctx = p.n_ctx;
    s->n_batch = QW_MIN(p.n_batch, p.n_ctx);
    s->ls = qw_xcalloc((size_t)m->hp.n_layer, sizeof(qw_layer_state));
    size_t total = 0;
    for (int il = 0; il < m->hp.n_layer; il++) total += layer_state(m, s->n_ctx, il, NULL, NULL);
    s->state_floats = total;
    s->state_mem = calloc(total ? total : 1, sizeof(float));
    if (!s->state_mem) {
        free(s->ls);
        free(s);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "session: cannot allocate %.1f MiB of state for %d tokens",
                      total * 4.0 / (1 << 20), p.n_ctx);
    }
    size_t off = 0;
    for (int il = 0; il < m->hp.n_layer; il++) off += layer_state(m, s->n_ctx, il, &s->ls[il], s->state_mem + off);
    qw_arena_init(&s->arena, 1 << 20);
    qwenc_session_reset(s);
    *out = s;
    return QWENC_OK;
}

void qwenc_session_free(qwenc_session *s) {
    if (!s) return;
    qw_arena_free(&s->arena);
    qw_prof_free(s->prof);
    free(s->state_mem);
    free(s->ls);
    free(s);
}

void qwenc_session_reset(qwenc_session *s) {
    /* the recurrent parts must restart from zero; K/V rows are rewritten before they are read */
    memset(s->state_mem, 0, s->state_floats * sizeof(float));
    for (int i = 0; i < 8; i++) s->ple_last[i] = s->model->hp.eos_id;
    s->n_past = 0;
}

int qwenc_session_n_past(const qwenc_session *s) { return s->n_past; }
int qwenc_session_n_ctx(const qwenc_session *s) { return s->n_ctx; }

/* One step of at most n_batch tokens. logits: [T][V] rows to fill from row `first_logit` on. */
static void forward_step(qwenc_session *s, const int32_t *tokens, int T, float *logits, int first_logit) {
    const qwenc_model *m = s->model;
    double t0 = s->prof ? qw_prof_now() : 0;
    const qw_hparams *hp = &m->hp;
    qw_arena_reset(&s->arena);
    float *cs = qw_arena_f32(&s->arena, (size_t)T * hp->n_rot);
    qw_rope_cs(m->rope_inv_freq, hp->n_rot, s->n_past, T, cs);
    const qw_ops *ops = s->prof ? qw_prof_ops(s->prof) : m->ops;
    qw_fwd f = {.m = m, .hp = hp, .ops = ops, .s = s, .ar = &s->arena, .n_tok = T, .pos0 = s->n_past,
                .tokens = tokens, .rope_cs = cs};
    float *hidden = qw_arena_f32(&s->arena, (size_t)T * hp->n_embd);
    qw_model_forward(&f, hidden);
    if (logits && first_logit < T)
        ops->matmul(ops, logits, m->output, hidden + (int64_t)first_logit * hp->n_embd, T - first_logit);

    /* the PLE hash history: the last ngram_n-1 ids */
    int keep = hp->ngram_n > 1 ? hp->ngram_n - 1 : 0;
    if (keep) {
        int32_t all[16];
        QW_ASSERT(keep <= 8);
        int n = 0;
        for (int i = 0; i < keep; i++) all[n++] = s->ple_last[i];
        for (int i = QW_MAX(0, T - keep); i < T; i++) all[n++] = tokens[i];
        memcpy(s->ple_last, all + n - keep, (size_t)keep * sizeof(int32_t));
    }
    s->n_past += T;
    if (s->prof) qw_prof_step(s->prof, T, qw_prof_now() - t0);
}

qwenc_status qwenc_session_forward(qwenc_session *s, const int32_t *tokens, int n_tokens, float *logits,
                                   int logits_all, char *err, size_t errlen) {
    const qw_hparams *hp = &s->model->hp;
    if (n_tokens <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "forward: no tokens given");
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return qw_err(err, errlen, QWENC_ERR_ARG, "forward: token %d at index %d is outside the vocabulary [0, %d)",
                          tokens[i], i, hp->n_vocab);
    if (s->n_past + n_tokens > s->n_ctx)
        return qw_err(err, errlen, QWENC_ERR_CONTEXT,
                      "forward: %d cached + %d new tokens exceed the session context of %d tokens", s->n_past,
                      n_tokens, s->n_ctx);
    for (int i = 0; i < n_tokens; i += s->n_batch) {
        int T = QW_MIN(s->n_batch, n_tokens - i);
        int last = i + T == n_tokens;
        if (logits_all)
            forward_step(s, tokens + i, T, logits ? logits + (int64_t)i * hp->n_vocab : NULL, 0);
        else
            forward_step(s, tokens + i, T, last ? logits : NULL, T - 1);
    }
    return QWENC_OK;
}

qwenc_status qwenc_session_profile(qwenc_session *s, int on, char *err, size_t errlen) {
    if (!on) {
        qw_prof_free(s->prof);
        s->prof = NULL;
        return QWENC_OK;
    }
    if (s->prof) {
        qw_prof_reset(s->prof);
        return QWENC_OK;
    }
    s->prof = qw_prof_new(s->model->ops);
    return s->prof ? QWENC_OK : qw_err(err, errlen, QWENC_ERR_NOMEM, "session: cannot allocate the profile");
}

int qwenc_session_profile_read(const qwenc_session *s, qwenc_profile_entry *out, int max,
                               qwenc_profile_totals *totals) {
    if (!s->prof) {
        if (totals) *totals = (qwenc_profile_totals){0};
        return 0;
    }
    return qw_prof_read(s->prof, out, max, totals);
}
