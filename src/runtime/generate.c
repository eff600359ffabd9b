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

qwenc_status qwenc_generate(qwenc_session *s, const qwenc_tokenizer *tok, qwenc_sampler *smp, const int32_t *prompt,
                            int n_prompt, const qwenc_gen_params *gp, qwenc_text_fn on_text, void *user,
                            qwenc_gen_result *result, char *err, size_t errlen) {
    qwenc_gen_result local;
    qwenc_gen_result *res = result ? result : &local;
    memset(res, 0, sizeof(*res));
    res->unfed = -1;
    if (n_prompt <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "generate: the prompt is empty");
    int V = s->model->hp.n_vocab;
    size_t held = 256; /* one token's piece, and the longest stop string */
    for (int i = 0; i < gp->n_stop; i++) held += strlen(gp->stop[i]);
    text_out o = {.gp = gp, .fn = on_text, .user = user, .cap = held};
    if (!tok) return qw_err(err, errlen, QWENC_ERR_ARG, "generate: no tokenizer given");
    float *logits = qw_malloc((size_t)V, sizeof(float));
    o.buf = qw_malloc(o.cap, 1);
    qwenc_detok *dt = logits && o.buf ? qwenc_detok_new(tok, gp->skip_special) : NULL;
    if (!dt) {
        free(logits);
        free(o.buf);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "generate: out of memory for the %d logits and the text buffer", V);
    }

    double t0 = now_s();
    qwenc_status st = qwenc_session_forward(s, prompt, n_prompt, logits, 0, err, errlen);
    res->n_prompt = n_prompt;
    res->prompt_s = now_s() - t0;
    t0 = now_s();
    if (!st && gp->n_predict == 0) res->reason = QWENC_STOP_LIMIT; /* the prompt only: nothing is sampled */
    while (!st && res->reason == QWENC_STOP_NONE) {
        int32_t t = qwenc_sampler_sample(smp, logits);
        qwenc_sampler_accept(smp, t);
        res->unfed = t;
        int is_eos = 0;
        for (int i = 0; i < gp->n_eos && !is_eos; i++) is_eos = gp->eos[i] == t;
        if (is_eos) {
            res->reason = QWENC_STOP_EOS;
            break;
        }
        res->n_gen++;
        const char *piece;
        size_t n = qwenc_detok_push(dt, t, &piece);
        if (out_push(&o, piece, n, 0)) {
            st = qw_err(err, errlen, QWENC_ERR_NOMEM, "generate: out of memory for a piece of %zu bytes of text", n);
            break;
        }
        if (o.hit_stop) {
            res->reason = QWENC_STOP_STRING;
            break;
        }
        if (o.stopped_by_caller) {
            res->reason = QWENC_STOP_CALLER;
            break;
        }
        if (gp->n_predict >= 0 && res->n_gen >= gp->n_predict) {
            res->reason = QWENC_STOP_LIMIT;
            break;
        }
        if (qwenc_session_n_past(s) >= qwenc_session_n_ctx(s)) {
            res->reason = QWENC_STOP_CONTEXT;
            break;
        }
        st = qwenc_session_forward(s, &t, 1, logits, 0, err, errlen);
        if (!st) res->unfed = -1;
    }
    if (!o.hit_stop && !st) {
        const char *piece;
        size_t n = qwenc_detok_flush(dt, &piece);
        if (out_push(&o, piece, n, 1))
            st = qw_err(err, errlen, QWENC_ERR_NOMEM, "generate: out of memory for %zu bytes of text", n);
    }
    res->gen_s = now_s() - t0;
    qwenc_detok_free(dt);
    free(o.buf);
    free(logits);
    return st;
}
