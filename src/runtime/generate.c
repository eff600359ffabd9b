/*
 * generate.c - the generation loop: feed the prompt, then sample, stream text and feed each token until
 * an end-of-sequence id, a stop string, the token limit or a full context. The limit is checked before each
 * token is sampled, so n_predict 0 feeds the prompt and samples nothing.
 *
 * Text goes out through the tokenizer's streaming decoder (whole UTF-8 characters only). Stop strings
 * are matched on the decoded text: text that could still be the beginning of a stop string is held back
 * until it is known not to be, so the caller never sees any part of a stop string.
 */
#include <string.h>
#include <time.h>

#include "blocks/blocks.h"

const char *qwenc_stop_reason_str(qwenc_stop_reason r) {
    switch (r) {
    case QWENC_STOP_EOS: return "end of sequence";
    case QWENC_STOP_STRING: return "stop string";
    case QWENC_STOP_LIMIT: return "token limit";
    case QWENC_STOP_CONTEXT: return "context full";
    case QWENC_STOP_CALLER: return "stopped by caller";
    case QWENC_STOP_NONE: break;
    }
    return "none";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Text decoded but not yet handed out, checked against the stop strings. */
typedef struct {
    char *buf;
    size_t len, cap;
    const qwenc_gen_params *gp;
    qwenc_text_fn fn;
    void *user;
    int stopped_by_caller, hit_stop;
} text_out;

static void out_emit(text_out *o, const char *s, size_t n) {
    if (n && o->fn && !o->stopped_by_caller) o->stopped_by_caller = o->fn(s, n, o->user) != 0;
}

/* Append decoded text; hand out what cannot begin a stop string. final: hand out everything left.
 * The buffer holds at most a stop string's length of held-back text and one token's piece, so it is sized once
 * before the loop; only a piece longer than that grows it. 0, or -1 when that growth fails. */
static int out_push(text_out *o, const char *s, size_t n, int final) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = (o->len + n + 1) * 2;
        char *nb = qw_realloc(o->buf, cap, 1);
        if (!nb) return -1;
        o->buf = nb;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = 0;
    size_t cut = o->len; /* first stop-string match */
    for (int i = 0; i < o->gp->n_stop; i++) {
        const char *st = o->gp->stop[i];
        size_t sl = strlen(st);
        if (!sl) continue;
        for (size_t k = 0; k + sl <= o->len; k++)
            if (memcmp(o->buf + k, st, sl) == 0) {
                if (k < cut) cut = k;
                break;
            }
    }
    if (cut < o->len) {
        out_emit(o, o->buf, cut);
        o->len = 0;
        o->hit_stop = 1;
        return 0;
    }
    size_t keep = 0; /* the longest tail that is a proper prefix of a stop string */
    if (!final)
        for (int i = 0; i < o->gp->n_stop; i++) {
            size_t sl = strlen(o->gp->stop[i]);
            for (size_t k = QW_MIN(sl - (sl > 0), o->len); k > keep; k--)
                if (memcmp(o->buf + o->len - k, o->gp->stop[i], k) == 0) {
                    keep = k;
                    break;
                }
        }
    out_emit(o, o->buf, o->len - keep);
    memmove(o->buf, o->buf + o->len - keep, keep);
    o->len = keep;
    return 0;
}

int qwenc_draft_lookup(const int32_t *hist, int n, int k, int32_t *out) {
    for (int m = QW_MIN(3, n - 1); m >= 1; m--) {
        const int32_t *pat = hist + n - m;
        for (int j = n - m - 1; j >= 0; j--) {
            if (memcmp(hist + j, pat, (size_t)m * sizeof(int32_t))) continue;
            int got = QW_MIN(k, n - (j + m));
            memcpy(out, hist + j + m, (size_t)got * sizeof(int32_t));
            return got;
        }
    }
    return 0;
}

/* QWENC_DRAFT_AUTO: the leading draft positions at least half of whose recent drafts were accepted (a position
 * not yet tried counts as accepted; the counts are halved at 16 drafts, so the choice follows the text), and one
 * position more every DRAFT_AUTO_PROBE steps, to notice when the text starts to repeat. */
#define DRAFT_AUTO_MAX 8
#define DRAFT_AUTO_PROBE 16
typedef struct {
    int acc[DRAFT_AUTO_MAX], tried[DRAFT_AUTO_MAX];
} draft_auto;

static int auto_draft(const draft_auto *a, int step) {
    int k = 0;
    while (k < DRAFT_AUTO_MAX && 2 * (a->acc[k] + 1) >= a->tried[k] + 2) k++;
    return QW_MIN(k + (step % DRAFT_AUTO_PROBE == 0), DRAFT_AUTO_MAX);
}

static void auto_count(draft_auto *a, int pos, int accepted) {
    if (pos >= DRAFT_AUTO_MAX) return;
    a->tried[pos]++;
    a->acc[pos] += accepted;
    if (a->tried[pos] == 16) a->tried[pos] /= 2, a->acc[pos] /= 2;
}

/* What one generation keeps between tokens. */
typedef struct {
    qwenc_session *s;
    qwenc_sampler *smp;
    const qwenc_gen_params *gp;
    qwenc_gen_result *res;
    qwenc_detok *dt;
    text_out o;
    int32_t *hist;           /* with n_draft: the prompt and every sampled token */
    int n_hist;
    char *err;
    size_t errlen;
    qwenc_status st;
} gen_state;

/* Token t was sampled with n_past tokens in the session: into the sampler's history, the text and the checks.
 * Returns 1 when the generation ends with it (res->reason or g->st set). */
static int take_token(gen_state *g, int32_t t, int n_past) {
    qwenc_gen_result *res = g->res;
    const qwenc_gen_params *gp = g->gp;
    qwenc_sampler_accept(g->smp, t);
    res->unfed = t;
    if (g->hist) g->hist[g->n_hist++] = t;
    for (int i = 0; i < gp->n_eos; i++)
        if (gp->eos[i] == t) {
            res->reason = QWENC_STOP_EOS;
            return 1;
        }
    res->n_gen++;
    const char *piece;
    size_t n = qwenc_detok_push(g->dt, t, &piece);
    if (out_push(&g->o, piece, n, 0)) {
        g->st = qw_err(g->err, g->errlen, QWENC_ERR_NOMEM, "generate: out of memory for a piece of %zu bytes of text", n);
        return 1;
    }
    if (g->o.hit_stop) res->reason = QWENC_STOP_STRING;
    else if (g->o.stopped_by_caller) res->reason = QWENC_STOP_CALLER;
    else if (gp->n_predict >= 0 && res->n_gen >= gp->n_predict) res->reason = QWENC_STOP_LIMIT;
    else if (n_past >= qwenc_session_n_ctx(g->s)) res->reason = QWENC_STOP_CONTEXT;
    return res->reason != QWENC_STOP_NONE;
}

/* The token drawn after a qwenc_session_forward_topk step: from its n top candidates, or (when they cannot decide)
 * from the whole logits, fetched into logits; the draw qwenc_sampler_sample makes from the whole logits. */
static int32_t sample_top(qwenc_session *s, qwenc_sampler *smp, const int32_t *ids, const float *lg, int n, float *logits,
                          qwenc_status *st, char *err, size_t errlen) {
    int32_t x = qwenc_sampler_sample_top(smp, ids, lg, n);
    if (x >= 0) return x;
    *st = qwenc_session_last_logits(s, logits, err, errlen);
    return *st ? -1 : qwenc_sampler_sample(smp, logits);
}

qwenc_status qwenc_generate(qwenc_session *s, const qwenc_tokenizer *tok, qwenc_sampler *smp, const int32_t *prompt,
                            int n_prompt, const qwenc_gen_params *gp, qwenc_text_fn on_text, void *user,
                            qwenc_gen_result *result, char *err, size_t errlen) {
    qwenc_gen_result local;
    qwenc_gen_result *res = result ? result : &local;
    memset(res, 0, sizeof(*res));
    res->unfed = -1;
    if (n_prompt <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "generate: the prompt is empty");
    if ((gp->n_draft < 0 && gp->n_draft != QWENC_DRAFT_AUTO) || gp->n_draft > QWENC_MAX_DRAFT)
        return qw_err(err, errlen, QWENC_ERR_ARG, "generate: n_draft %d is outside [0, %d] (or QWENC_DRAFT_AUTO)",
                      gp->n_draft, QWENC_MAX_DRAFT);
    if (!tok) return qw_err(err, errlen, QWENC_ERR_ARG, "generate: no tokenizer given");
    if (gp->draft_src < QWENC_DRAFT_SRC_AUTO || gp->draft_src > QWENC_DRAFT_SRC_HEAD)
        return qw_err(err, errlen, QWENC_ERR_ARG, "generate: draft_src %d is not one of QWENC_DRAFT_SRC_*", gp->draft_src);
    if (gp->draft_src == QWENC_DRAFT_SRC_HEAD && gp->n_draft && !qwenc_session_has_draft_head(s))
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      qwenc_model_has_draft_head(s->model)
                          ? "generate: drafts from the head need a session made with draft_head"
                          : "generate: the model has no MTP draft head to draft with");
    int use_head = gp->draft_src != QWENC_DRAFT_SRC_LOOKUP && qwenc_session_has_draft_head(s);
    int rule = use_head && gp->draft_sample; /* drafts drawn from the head's distribution, kept by the rule */
    int V = s->model->hp.n_vocab, n_ctx = qwenc_session_n_ctx(s);
    int autodraft = gp->n_draft == QWENC_DRAFT_AUTO;
    int n_draft = QW_MIN(autodraft ? DRAFT_AUTO_MAX : gp->n_draft, s->n_batch - 1);
    size_t held = 256; /* one token's piece, and the longest stop string */
    for (int i = 0; i < gp->n_stop; i++) held += strlen(gp->stop[i]);
    gen_state g = {.s = s, .smp = smp, .gp = gp, .res = res, .err = err, .errlen = errlen};
    g.o = (text_out){.gp = gp, .fn = on_text, .user = user, .cap = held};
    /* the logits of a step, or of a draft step's every token */
    float *logits = qw_malloc((size_t)V * (size_t)(n_draft + 1), sizeof(float));
    float *q = rule && n_draft > 0 ? qw_malloc((size_t)V * (size_t)n_draft, sizeof(float)) : NULL; /* drafts' q */
    g.o.buf = qw_malloc(g.o.cap, 1);
    if (n_draft > 0 && (g.hist = qw_malloc((size_t)n_prompt + (size_t)n_ctx + 1, sizeof(int32_t))))
        memcpy(g.hist, prompt, (size_t)n_prompt * sizeof(int32_t)), g.n_hist = n_prompt;
    g.dt = logits && g.o.buf && (n_draft == 0 || g.hist) && (!rule || n_draft == 0 || q)
               ? qwenc_detok_new(tok, gp->skip_special)
               : NULL;
    if (!g.dt) {
        free(q);
        free(logits);
        free(g.o.buf);
        free(g.hist);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "generate: out of memory for the %d logits and the text buffer", V);
    }

    double t0 = now_s();
    int greedy = qwenc_sampler_is_greedy(smp); /* then the arg max is taken where the model runs */
    int topn = greedy ? 0 : qwenc_sampler_top_k(smp); /* else, with top-k, the top candidates are */
    int32_t first = -1, tids[QWENC_MAX_TOPK];
    float tlg[QWENC_MAX_TOPK];
    g.st = greedy ? qwenc_session_forward_argmax(s, prompt, n_prompt, &first, err, errlen)
           : topn ? qwenc_session_forward_topk(s, prompt, n_prompt, topn, tids, tlg, err, errlen)
                  : qwenc_session_forward(s, prompt, n_prompt, logits, 0, err, errlen);
    res->n_prompt = n_prompt;
    res->prompt_s = now_s() - t0;
    t0 = now_s();
    if (!g.st && gp->n_predict == 0) res->reason = QWENC_STOP_LIMIT; /* the prompt only: nothing is sampled */
    int32_t toks[QWENC_MAX_DRAFT + 1];
    draft_auto ad = {{0}, {0}};
    int done = g.st || res->reason != QWENC_STOP_NONE;
    if (!done) {
        int32_t x = greedy ? first : topn ? sample_top(s, smp, tids, tlg, topn, logits, &g.st, err, errlen)
                                          : qwenc_sampler_sample(smp, logits);
        done = g.st || take_token(&g, x, qwenc_session_n_past(s));
    }
    while (!done) {
        int32_t t = res->unfed;
        int past0 = qwenc_session_n_past(s), k = 0;
        if (n_draft > 0) { /* no more drafts than the context holds or the limit could use */
            int room = QW_MIN(autodraft ? auto_draft(&ad, res->n_steps) : n_draft, n_ctx - past0 - 1);
            if (gp->n_predict >= 0) room = QW_MIN(room, gp->n_predict - res->n_gen - 1);
            if (room > 0 && !use_head) k = qwenc_draft_lookup(g.hist, g.n_hist, room, toks + 1);
            if (room > 0 && use_head && !rule && !(g.st = qwenc_session_draft_greedy(s, t, room, toks + 1, err, errlen)))
                k = room;
            for (int32_t cur = t; rule && k < room; cur = toks[++k]) { /* drawn from the head's distribution */
                float *qk = q + (int64_t)k * V;
                if ((g.st = qwenc_session_draft_head(s, cur, qk, NULL, err, errlen))) break;
                qwenc_sampler_probs(smp, qk, qk);
                toks[k + 1] = qwenc_sampler_draw(smp, qk);
            }
            if (g.st) break;
        }
        res->n_steps++;
        if (k == 0) {
            int32_t x = -1;
            g.st = greedy ? qwenc_session_forward_argmax(s, &t, 1, &x, err, errlen)
                   : topn ? qwenc_session_forward_topk(s, &t, 1, topn, tids, tlg, err, errlen)
                          : qwenc_session_forward(s, &t, 1, logits, 0, err, errlen);
            if (g.st) break;
            res->unfed = -1;
            if (!greedy) x = topn ? sample_top(s, smp, tids, tlg, topn, logits, &g.st, err, errlen)
                                  : qwenc_sampler_sample(smp, logits);
            if (g.st) break;
            done = take_token(&g, x, past0 + 1);
            continue;
        }
        /* verify: each position sampled as without drafting; the first that differs from the draft ends it */
        toks[0] = t;
        g.st = qwenc_session_forward_draft(s, toks, k + 1, logits, err, errlen);
        if (g.st) break;
        res->unfed = -1;
        res->n_drafted += k;
        for (int i = 0; i < k; i++) res->drafted_at[i]++;
        int keep = 0;
        for (int i = 0; i <= k; i++) {
            int acc = 0;
            int32_t x = rule && i < k ? qwenc_sampler_verify(smp, logits + (int64_t)i * V, q + (int64_t)i * V,
                                                             toks[i + 1], &acc)
                                      : qwenc_sampler_sample(smp, logits + (int64_t)i * V);
            if (!rule) acc = i < k && x == toks[i + 1];
            keep = i + 1;
            done = take_token(&g, x, past0 + i + 1);
            if (done || i == k) break;
            auto_count(&ad, i, acc);
            if (!acc) break;
            res->n_accepted++;
            res->accepted_at[i]++;
        }
        qwenc_status sa = qwenc_session_accept(s, keep, err, errlen);
        if (sa && !g.st) g.st = sa;
        if (g.st) break;
    }
    if (!g.o.hit_stop && !g.st) {
        const char *piece;
        size_t n = qwenc_detok_flush(g.dt, &piece);
        if (out_push(&g.o, piece, n, 1))
            g.st = qw_err(err, errlen, QWENC_ERR_NOMEM, "generate: out of memory for %zu bytes of text", n);
    }
    res->gen_s = now_s() - t0;
    qwenc_detok_free(g.dt);
    free(g.o.buf);
    free(g.hist);
    free(q);
    free(logits);
    return g.st;
}
