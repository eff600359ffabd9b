/*
 * session.c - per-sequence state and the forward call (see qwenc.h).
 *
 * All state lives in one allocation made at init: per attention/QSA layer the K/V cache (and the QSA
 * raw and pooled indexer keys), per DeltaNet layer the last K-1 conv inputs and the f32 recurrent
 * state, per PLE layer the normalised gated-value history; plus the last n-1 token ids for the PLE
 * hash. A call is split into steps of at most n_batch tokens; every step's temporaries come from the
 * session's arena. Before a call changes anything, the arena is reserved for a bound of what its steps take
 * (step_scratch), so an allocation failure is a clean QWENC_ERR_NOMEM with the session as it was, and the
 * steps allocate nothing: init reserves what one token at the end of the context takes, so decoding never
 * allocates. The kernels' own per-thread scratch (kernels/cpu.c) grows on first use to the widest matmul;
 * should that fail, the step's results are lost: the call returns QWENC_ERR_NOMEM and the session must be
 * reset.
 */
#include <string.h>

#include "blocks/blocks.h"
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

/* ---- the scratch bound: the arena bytes of one step of T tokens after pos0 others, at most. It follows the
 * arena allocations of forward_step, of the model's forward (llama.c, qwen35.c, qwen4exp.c) and of the blocks
 * (blocks/), each rounded as the arena rounds; where a block keeps several buffers alive at once they are
 * summed, and a layer takes the largest of its blocks (each releases its buffers before the next runs).
 * tests/t_hostile.c checks on every fixture that no step goes past it. */

static uint64_t F(uint64_t n) { return QW_ARENA_BYTES(n * sizeof(float)); }
static uint64_t B(uint64_t n) { return QW_ARENA_BYTES(n); }

static uint64_t attn_scratch(const qw_hparams *hp, const qw_attn_w *w, uint64_t T, uint64_t P) {
    uint64_t hd = (uint64_t)hp->head_dim, nq = (uint64_t)hp->n_head * hd;
    uint64_t n = 2 * F(T * nq) + B((P + T + hd) * sizeof(double)); /* q, o, work */
    if (w->gated) n += F(2 * T * nq) + F(T * nq);                 /* [q | gate], gate */
    if (w->rope_interleaved) n += F(hd);
    if (w->idx_qk) { /* qw_qsa_select: the indexer's rows, the selection and its work */
        uint64_t R = (uint64_t)hp->idx_ratio, topk = (uint64_t)hp->idx_budget / R, blk = (P + T) / R, cap = 0;
        for (uint64_t t = 0; t < T; t++) cap += QW_MIN(P + t + 1, (topk + 1) * R);
        n += F(T * (uint64_t)(hp->idx_n_head + 1) * (uint64_t)hp->idx_head_dim) + B(cap * sizeof(int32_t)) +
             B((T + 1) * sizeof(int32_t)) + F(QW_MAX(blk, 1)) + B(QW_MAX(blk, topk + 1) * sizeof(int));
    }
    return n;
}

static uint64_t gdn_scratch(const qw_hparams *hp, const qw_gdn_w *w, uint64_t T) {
    uint64_t kd = (uint64_t)hp->gdn_hk * hp->gdn_dk, vd = (uint64_t)hp->gdn_hv * hp->gdn_dv, ch = 2 * kd + vd;
    uint64_t hv = (uint64_t)hp->gdn_hv, K = (uint64_t)hp->gdn_conv_k;
    uint64_t n = F((K - 1 + T) * ch) + 3 * F(T * vd) + 2 * F(T * hv) + F(T * ch) + 2 * F(T * kd) + F(vd);
    if (w->qkvz) n += F(T * (ch + vd)) + F(2 * T * hv); /* qwen3_next's fused projections */
    return n;
}

static uint64_t moe_scratch(const qw_hparams *hp, uint64_t T) {
    uint64_t E = (uint64_t)hp->n_expert, k = (uint64_t)hp->n_expert_used, R = T * k, H = (uint64_t)hp->n_embd;
    uint64_t I = (uint64_t)hp->n_ff_exp, Is = (uint64_t)hp->n_ff_shexp;
    return F(T * E) + B(R * sizeof(int)) + F(R) + B((R + 1) * sizeof(int)) + B((R + 2) * sizeof(int64_t)) +
           B(R * sizeof(int)) + F(R) + 2 * F(R * H) + 2 * F(R * I) + 2 * F(T * Is) + F(T) +
           B((2 * QW_MIN(E, R) + 3) * sizeof(qw_matmul_job));
}

static uint64_t step_scratch(const qwenc_model *m, int n_tok, int pos0) {
    const qw_hparams *hp = &m->hp;
    uint64_t T = (uint64_t)n_tok, P = (uint64_t)pos0, H = (uint64_t)hp->n_embd;
    uint64_t CH = (uint64_t)hp->hc_count * H, C = (uint64_t)hp->hc_count, nh = (uint64_t)hp->ngram_heads;
    uint64_t n = F(T * (uint64_t)hp->n_rot) + F(T * H); /* forward_step: cos/sin, hidden */
    uint64_t peak = 0;
    if (hp->arch == QW_ARCH_QWEN4EXP) {
        n += F(T * CH) + 2 * F(T * H) + F(T * C);        /* X, a, y, inj */
        if (hp->n_ple) peak = B(T * nh * sizeof(int64_t)); /* qw_ple_prefetch */
    } else {
        n += 2 * F(T * H); /* h, y */
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        uint64_t mix = L->kind == QW_LAYER_GDN ? gdn_scratch(hp, &L->gdn, T) : attn_scratch(hp, &L->attn, T, P);
        uint64_t ffn = L->moe ? moe_scratch(hp, T) : 2 * F(T * (uint64_t)hp->n_ff);
        uint64_t layer = QW_MAX(mix, ffn);
        if (hp->arch == QW_ARCH_QWEN4EXP) {
            uint64_t r = (uint64_t)hp->hc_lowrank;
            layer = QW_MAX(layer, 2 * F(T * CH) + F(T * r)); /* qw_hc_forward */
            if (L->ple) {
                uint64_t nhist = (uint64_t)(hp->ple_conv_k - 1) * (uint64_t)hp->ngram_n;
                layer = QW_MAX(layer, B(T * nh * sizeof(int64_t)) + F(T * (uint64_t)hp->ple_dim) + 4 * F(T * CH) +
                                          F(T * H) + F((nhist + T) * CH));
            }
        }
        peak = QW_MAX(peak, layer);
    }
    return n + peak;
}

/* Reserve the arena for steps of up to n_tok tokens starting at up to pos0; QWENC_ERR_NOMEM when it cannot be. */
static qwenc_status reserve_scratch(qwenc_session *s, int n_tok, int pos0, char *err, size_t errlen) {
    uint64_t need = step_scratch(s->model, n_tok, pos0);
    if (need > SIZE_MAX || qw_arena_reserve(&s->arena, (size_t)need) != 0)
        return qw_err(err, errlen, QWENC_ERR_NOMEM,
                      "session: out of memory allocating %llu bytes of scratch for a step of %d tokens at position %d",
                      (unsigned long long)need, n_tok, pos0);
    return QWENC_OK;
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
    s->model = m;
    s->n_ctx = p.n_ctx;
    s->n_batch = QW_MIN(QW_MIN(p.n_batch, p.n_ctx), SESSION_MAX_BATCH);
    qw_arena_init(&s->arena);
    qwenc_status st = QWENC_OK;
    s->ls = qw_calloc((size_t)m->hp.n_layer, sizeof(qw_layer_state));
    if (!s->ls) st = qw_err_nomem(err, errlen, "session: layer states", (size_t)m->hp.n_layer, sizeof(qw_layer_state));
    size_t total = 0;
    for (int il = 0; !st && il < m->hp.n_layer; il++) total += layer_state(m, s->n_ctx, il, NULL, NULL);
    s->state_floats = total;
    if (!st) {
        s->state_mem = qw_calloc(total, sizeof(float));
        if (!s->state_mem)
            st = qw_err(err, errlen, QWENC_ERR_NOMEM,
                        "session: out of memory allocating %.1f MiB of state for %d tokens (raise the memory or lower "
                        "n_ctx)",
                        total * 4.0 / (1 << 20), p.n_ctx);
    }
    /* what one token at the end of the context takes: decoding then never allocates */
    if (!st) st = reserve_scratch(s, 1, s->n_ctx - 1, err, errlen);
    if (st) {
        qwenc_session_free(s);
        return st;
    }
    size_t off = 0;
    for (int il = 0; il < m->hp.n_layer; il++) off += layer_state(m, s->n_ctx, il, &s->ls[il], s->state_mem + off);
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
    s->lost = 0;
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
    if (s->lost)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "forward: the session's state was lost to an earlier out-of-memory error; reset it first");
    if (n_tokens > s->n_ctx - s->n_past)
        return qw_err(err, errlen, QWENC_ERR_CONTEXT,
                      "forward: %d cached + %d new tokens exceed the session context of %d tokens", s->n_past,
                      n_tokens, s->n_ctx);
    /* every step's scratch before the first one runs (the bound grows with the step and its position) */
    qwenc_status st = reserve_scratch(s, QW_MIN(s->n_batch, n_tokens), s->n_past + n_tokens - 1, err, errlen);
    if (st) return st;
    unsigned long failed = qw_cpu_scratch_failures();
    for (int i = 0; i < n_tokens; i += s->n_batch) {
        int T = QW_MIN(s->n_batch, n_tokens - i);
        int last = i + T == n_tokens;
        if (logits_all)
            forward_step(s, tokens + i, T, logits ? logits + (int64_t)i * hp->n_vocab : NULL, 0);
        else
            forward_step(s, tokens + i, T, last ? logits : NULL, T - 1);
        if (qw_cpu_scratch_failures() != failed) {
            s->lost = 1;
            return qw_err(err, errlen, QWENC_ERR_NOMEM,
                          "forward: the kernels ran out of memory for their scratch; the session's state is lost "
                          "(reset it)");
        }
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
    return s->prof ? QWENC_OK : qw_err_nomem(err, errlen, "session: the profile", 1, qw_prof_size());
}

int qwenc_session_profile_read(const qwenc_session *s, qwenc_profile_entry *out, int max,
                               qwenc_profile_totals *totals) {
    if (!s->prof) {
        if (totals) *totals = (qwenc_profile_totals){0};
        return 0;
    }
    return qw_prof_read(s->prof, out, max, totals);
}
