/*
 * sched.c - the server's scheduler: one thread that owns every session (slot) and runs the jobs the HTTP
 * threads submit.
 *
 * A step: admit queued jobs into idle slots; end the jobs whose client left; feed one chunk (at most n_chunk
 * tokens, cut at the prompt's snapshot points) of the oldest job still reading its prompt; then one
 * qwenc_session_forward_batch call feeds the last sampled token of every generating slot, and each slot samples
 * its next token. A prompt is therefore fed in the same pieces whatever else runs, and a generating stream waits
 * at most one chunk between two tokens.
 *
 * Generation follows qwenc_generate (src/runtime/generate.c) token for token, so a request gives what `qwenc
 * run` gives for the same prompt, sampling parameters and seed: the sampler sees only generated tokens; the
 * limit is checked before each token is sampled; an end-of-sequence id ends the reply and is not printed; text
 * that may begin a stop string is held back, and the reply ends before the first stop string; the reply ends
 * when the context is full; the last sampled token is never fed.
 *
 * Admission (see server.h): the slot whose tokens the prompt extends, else the longest cached prefix restored
 * into the least recently used idle slot (its own state saved to the cache first), else a fresh start. The
 * tokens a slot's session was fed are kept beside it (hist), so what it holds is always known exactly.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

enum { PH_PREFILL, PH_DECODE };

typedef struct {
    int id;
    qwenc_session *session;
    int32_t *hist;          /* [n_ctx] the tokens fed to the session */
    int n_hist;
    srv_job *job;           /* NULL: idle */
    int phase;
    uint64_t seq;           /* admission order of its job */
    uint64_t used;          /* when it last ended a job (least recently used goes first) */
    /* the job's generation */
    qwenc_sampler *sampler;
    qwenc_detok *detok;
    sbuf hold;              /* decoded text held back: it may begin a stop string */
    int32_t pending;        /* sampled, to be fed by the next decode step (-1: none) */
    int n_gen, bound, hit_stop;
} slot;

struct srv_sched {
    const qwenc_model *m;
    const qwenc_tokenizer *tok;
    srv_params p;
    srv_stats *st;
    int n_vocab, n_ctx;
    const int32_t *eos;
    int n_eos;
    slot *slots;
    int n_slots;
    srv_cache *cache;
    float *logits;          /* [n_slots][n_vocab] */
    qwenc_session **bs;     /* [n_slots] a decode step's sessions, tokens and slots */
    int32_t *bt;
    slot **bslot;
    uint64_t *ph;           /* [n_ctx + 1] prefix hashes of the prompt being admitted */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;     /* guards the queue and the flags below */
    pthread_cond_t cv;
    srv_job *qhead, *qtail;
    int n_queued, n_active, stopping, cancel_all, quit;
    uint64_t seq, clock;
};

/* ------------------------------------------------------------------ jobs */

srv_job *srv_job_new(void) {
    srv_job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca; /* the HTTP side waits with timeouts on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&j->cancel, 0);
    atomic_init(&j->refs, 1);
    j->n_top = -1;
    return j;
}

void srv_job_release(srv_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    sb_free(&j->text);
    free(j->probs);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Hand text to the job's reader. */
static void job_text(srv_job *j, const char *s, size_t n) {
    if (!n) return;
    pthread_mutex_lock(&j->mu);
    sb_add(&j->text, s, n);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The log-probabilities of the sampled token and the n_top most likely ones (log-softmax of the raw logits). */
static void job_probs(srv_job *j, int32_t t, const float *lg, int V) {
    srv_tokprob r = {.id = t};
    float mx = lg[0];
    for (int i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)lg[i] - mx);
    float lse = mx + (float)log(sum);
    r.lp = lg[t] - lse;
    int k = j->n_top > SRV_MAX_TOP ? SRV_MAX_TOP : j->n_top, ids[SRV_MAX_TOP];
    float best[SRV_MAX_TOP];
    for (int i = 0; i < V && k > 0; i++) { /* insertion into the k best, highest first; equal logits: lower id */
        if (r.n_top == k && lg[i] <= best[k - 1]) continue;
        int at = r.n_top < k ? r.n_top++ : k - 1;
        for (; at > 0 && lg[i] > best[at - 1]; at--) {
            best[at] = best[at - 1];
            ids[at] = ids[at - 1];
        }
        best[at] = lg[i];
        ids[at] = i;
    }
    for (int i = 0; i < r.n_top; i++) {
        r.top[i].id = ids[i];
        r.top[i].lp = best[i] - lse;
    }
    pthread_mutex_lock(&j->mu);
    if (j->n_probs == j->cap_probs) {
        int cap = j->cap_probs ? j->cap_probs * 2 : 64;
        srv_tokprob *np = realloc(j->probs, (size_t)cap * sizeof(*np));
        if (np) {
            j->probs = np;
            j->cap_probs = cap;
        }
    }
    if (j->n_probs < j->cap_probs) j->probs[j->n_probs++] = r;
    pthread_mutex_unlock(&j->mu);
}

/* ------------------------------------------------------------------ text out (as generate.c's out_push) */

/* Append decoded text; hand out what cannot begin a stop string. final: hand out everything left. */
static void out_push(slot *sl, const char *s, size_t n, int final) {
    srv_job *j = sl->job;
    sbuf *o = &sl->hold;
    if (sb_add(o, s, n)) return;
    size_t cut = o->n; /* the first stop-string match */
    for (int i = 0; i < j->n_stop; i++) {
        size_t sl_ = strlen(j->stop[i]);
        if (!sl_) continue;
        for (size_t k = 0; k + sl_ <= o->n; k++)
            if (!memcmp(o->p + k, j->stop[i], sl_)) {
                if (k < cut) cut = k;
                break;
            }
    }
    if (cut < o->n) {
        job_text(j, o->p, cut);
        o->n = 0;
        sl->hit_stop = 1;
        return;
    }
    size_t keep = 0; /* the longest tail that is a proper prefix of a stop string */
    if (!final)
        for (int i = 0; i < j->n_stop; i++) {
            size_t sl_ = strlen(j->stop[i]);
            for (size_t k = (sl_ ? sl_ - 1 : 0) < o->n ? (sl_ ? sl_ - 1 : 0) : o->n; k > keep; k--)
                if (!memcmp(o->p + o->n - k, j->stop[i], k)) {
                    keep = k;
                    break;
                }
        }
    job_text(j, o->p, o->n - keep);
    memmove(o->p, o->p + o->n - keep, keep);
    o->n = keep;
}

/* ------------------------------------------------------------------ slots */

/* The job ends: the rest of its text, its reason, and the slot is idle again (its state kept for reuse). */
static void finish(srv_sched *s, slot *sl, qwenc_stop_reason reason, int status, const char *msg) {
    srv_job *j = sl->job;
    if (!status && !sl->hit_stop && sl->detok) {
        const char *piece;
        size_t n = qwenc_detok_flush(sl->detok, &piece);
        out_push(sl, piece, n, 1);
    }
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    j->reason = reason;
    j->n_gen = sl->n_gen;
    j->t_end = srv_now();
    if (status) {
        j->err_status = status;
        snprintf(j->err, sizeof(j->err), "%s", msg);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    qwenc_sampler_free(sl->sampler);
    qwenc_detok_free(sl->detok);
    sl->sampler = NULL;
    sl->detok = NULL;
    sl->job = NULL;
    sl->pending = -1;
    sl->used = ++s->clock;
    srv_job_release(j);
    pthread_mutex_lock(&s->mu);
    s->n_active--;
    atomic_store(&s->st->active, s->n_active);
    pthread_mutex_unlock(&s->mu);
}

/* A job's end by cancellation: the client left, or the server stops. */
static void finish_cancelled(srv_sched *s, slot *sl) {
    if (atomic_load(&sl->job->cancel) == SRV_CANCEL_SHUTDOWN)
        finish(s, sl, QWENC_STOP_CALLER, 503, "the server is shutting down");
    else
        finish(s, sl, QWENC_STOP_CALLER, 0, NULL);
    atomic_fetch_add(&s->st->cancelled, 1);
}

/* A failed forward leaves the session in an unknown state: it starts over. */
static void lose_state(slot *sl) {
    qwenc_session_reset(sl->session);
    sl->n_hist = 0;
}

/* Sample the next token from logits and handle it as qwenc_generate does. */
static void sample_step(srv_sched *s, slot *sl, const float *logits) {
    srv_job *j = sl->job;
    int32_t t = qwenc_sampler_sample(sl->sampler, logits);
    qwenc_sampler_accept(sl->sampler, t);
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == t) {
            finish(s, sl, QWENC_STOP_EOS, 0, NULL);
            return;
        }
    if (j->n_top >= 0) job_probs(j, t, logits, s->n_vocab); /* the generated tokens' (the end id is not one) */
    sl->n_gen++;
    atomic_fetch_add(&s->st->gen_tokens, 1);
    const char *piece;
    size_t n = qwenc_detok_push(sl->detok, t, &piece);
    out_push(sl, piece, n, 0);
    if (sl->hit_stop)
        finish(s, sl, QWENC_STOP_STRING, 0, NULL);
    else if (j->n_predict >= 0 && sl->n_gen >= j->n_predict)
        finish(s, sl, QWENC_STOP_LIMIT, 0, NULL);
    else if (sl->n_hist >= s->n_ctx)
        finish(s, sl, QWENC_STOP_CONTEXT, 0, NULL);
    else
        sl->pending = t;
}

/* Keep an idle slot's state in the cache before the slot is given to another conversation. */
static void save_slot(srv_sched *s, slot *sl) {
    if (!s->cache || sl->n_hist == 0) return;
    uint64_t h = srv_hash(sl->hist, sl->n_hist);
    if (!srv_cache_has(s->cache, sl->hist, sl->n_hist, h))
        srv_cache_put(s->cache, sl->session, sl->hist, sl->n_hist, h, NULL);
}

/* Give a job a slot (one is idle), with the longest prefix of its prompt already fed. */
static void admit(srv_sched *s, srv_job *j) {
    if (atomic_load(&j->cancel)) { /* left while queued */
        pthread_mutex_lock(&j->mu);
        j->done = 1;
        j->reason = QWENC_STOP_CALLER;
        if (atomic_load(&j->cancel) == SRV_CANCEL_SHUTDOWN) {
            j->err_status = 503;
            snprintf(j->err, sizeof(j->err), "the server is shutting down");
        }
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        atomic_fetch_add(&s->st->cancelled, 1);
        srv_job_release(j);
        return;
    }
    slot *live = NULL, *sl = NULL;
    for (int i = 0; i < s->n_slots; i++) {
        slot *c = &s->slots[i];
        if (c->job) continue;
        if (c->n_hist > 0 && c->n_hist < j->n_prompt && (!live || c->n_hist > live->n_hist) &&
            !memcmp(c->hist, j->prompt, (size_t)c->n_hist * sizeof(int32_t)))
            live = c;
    }
    srv_cache_entry *ce = NULL;
    if (s->cache) {
        srv_prefix_hashes(j->prompt, j->n_prompt, s->ph);
        ce = srv_cache_find(s->cache, j->prompt, j->n_prompt, s->ph);
    }
    int cached = 0;
    const float *start_logits = NULL;
    if (live && (!ce || live->n_hist >= srv_cache_entry_n(ce))) {
        sl = live;
        cached = live->n_hist;
    } else {
        for (int i = 0; i < s->n_slots; i++) { /* an empty slot, else the least recently used idle one */
            slot *c = &s->slots[i];
            if (c->job) continue;
            if (!sl || (c->n_hist == 0 && sl->n_hist > 0) ||
                ((c->n_hist == 0) == (sl->n_hist == 0) && c->used < sl->used))
                sl = c;
        }
        if (s->cache) { /* saving the slot's state may evict entries: look again after */
            save_slot(s, sl);
            ce = srv_cache_find(s->cache, j->prompt, j->n_prompt, s->ph);
        }
        char err[256];
        if (ce && !qwenc_session_restore(sl->session, srv_cache_entry_snap(ce), err, sizeof(err))) {
            cached = srv_cache_entry_n(ce);
            memcpy(sl->hist, j->prompt, (size_t)cached * sizeof(int32_t));
            sl->n_hist = cached;
            if (cached == j->n_prompt) start_logits = srv_cache_entry_logits(ce);
        } else {
            qwenc_session_reset(sl->session);
            sl->n_hist = 0;
        }
    }
    sl->job = j;
    sl->phase = PH_PREFILL;
    sl->seq = ++s->seq;
    sl->n_gen = 0;
    sl->pending = -1;
    sl->hit_stop = 0;
    sl->hold.n = 0;
    sl->bound = 0;
    while (sl->bound < j->n_bounds && j->bounds[sl->bound] <= sl->n_hist) sl->bound++;
    j->n_cached = cached;
    j->t_start = srv_now();
    atomic_fetch_add(&s->st->prompt_tokens, j->n_prompt);
    atomic_fetch_add(&s->st->cached_tokens, cached);
    atomic_fetch_add(cached ? &s->st->cache_hits : &s->st->cache_misses, 1);
    pthread_mutex_lock(&s->mu);
    s->n_active++;
    atomic_store(&s->st->active, s->n_active);
    pthread_mutex_unlock(&s->mu);
    char err[256];
    sl->detok = qwenc_detok_new(s->tok, 1);
    if (qwenc_sampler_init(&j->sp, s->n_vocab, &sl->sampler, err, sizeof(err)) || !sl->detok) {
        finish(s, sl, QWENC_STOP_NONE, 500, sl->detok ? err : "out of memory for the text decoder");
        return;
    }
    if (j->n_predict == 0) { /* nothing to sample: the prompt is not fed either */
        finish(s, sl, QWENC_STOP_LIMIT, 0, NULL);
        return;
    }
    if (start_logits) { /* the whole prompt was cached with its logits */
        sl->phase = PH_DECODE;
        j->t_first = srv_now();
        sample_step(s, sl, start_logits);
    }
}

/* One chunk of the prompt of the oldest job still reading one. */
static void prefill_step(srv_sched *s) {
    slot *sl = NULL;
    for (int i = 0; i < s->n_slots; i++) {
        slot *c = &s->slots[i];
        if (c->job && c->phase == PH_PREFILL && (!sl || c->seq < sl->seq)) sl = c;
    }
    if (!sl) return;
    srv_job *j = sl->job;
    int from = sl->n_hist, end = from + s->p.n_chunk < j->n_prompt ? from + s->p.n_chunk : j->n_prompt;
    if (sl->bound < j->n_bounds && j->bounds[sl->bound] < end) end = j->bounds[sl->bound];
    int last = end == j->n_prompt;
    double t0 = srv_now();
    char err[256];
    qwenc_status st = qwenc_session_forward(sl->session, j->prompt + from, end - from, last ? s->logits : NULL, 0, err,
                                           sizeof(err));
    atomic_fetch_add(&s->st->prompt_us, (long long)((srv_now() - t0) * 1e6));
    if (st) {
        lose_state(sl);
        finish(s, sl, QWENC_STOP_NONE, 500, err);
        return;
    }
    memcpy(sl->hist + from, j->prompt + from, (size_t)(end - from) * sizeof(int32_t));
    sl->n_hist = end;
    if (sl->bound < j->n_bounds && j->bounds[sl->bound] == end) {
        if (s->cache) srv_cache_put(s->cache, sl->session, sl->hist, end, srv_hash(sl->hist, end), last ? s->logits : NULL);
        sl->bound++;
    }
    if (last) {
        sl->phase = PH_DECODE;
        j->t_first = srv_now();
        sample_step(s, sl, s->logits);
    }
}

/* The one generating slot's pending token and up to n_draft tokens drafted from its tokens (prompt lookup) in one
 * draft step: each position sampled as a plain step would, the agreeing prefix kept (the same tokens as without
 * drafting). 0 when nothing could be drafted (the caller runs a plain step). */
static int draft_step(srv_sched *s, slot *c) {
    srv_job *j = c->job;
    int32_t toks[QWENC_MAX_DRAFT + 1];
    int room = s->p.n_draft < s->n_ctx - c->n_hist - 1 ? s->p.n_draft : s->n_ctx - c->n_hist - 1;
    if (j->n_predict >= 0 && j->n_predict - c->n_gen - 1 < room) room = j->n_predict - c->n_gen - 1;
    if (room <= 0) return 0;
    toks[0] = c->pending;
    c->hist[c->n_hist] = c->pending; /* the lookup sees the pending token last */
    int k = 0;
    char err[256];
    if (qwenc_session_has_draft_head(c->session)) { /* the model's MTP head: its greedy chain */
        if (qwenc_session_draft_greedy(c->session, toks[0], room, toks + 1, err, sizeof(err))) {
            lose_state(c);
            finish(s, c, QWENC_STOP_NONE, 500, err);
            return 1;
        }
        k = room;
    } else {
        k = qwenc_draft_lookup(c->hist, c->n_hist + 1, room, toks + 1);
    }
    if (k == 0) return 0;
    double t0 = srv_now();
    qwenc_status st = qwenc_session_forward_draft(c->session, toks, k + 1, s->logits, err, sizeof(err));
    atomic_fetch_add(&s->st->decode_us, (long long)((srv_now() - t0) * 1e6));
    atomic_fetch_add(&s->st->decode_steps, 1);
    if (st) {
        lose_state(c);
        finish(s, c, QWENC_STOP_NONE, 500, err);
        return 1;
    }
    atomic_fetch_add(&s->st->drafted, k);
    int keep = 0;
    for (int i = 0; i <= k; i++) { /* position i: toks[i] is fed; sample what follows it */
        c->hist[c->n_hist++] = toks[i];
        c->pending = -1;
        keep = i + 1;
        sample_step(s, c, s->logits + (size_t)i * s->n_vocab);
        if (!c->job || i == k || c->pending != toks[i + 1]) break; /* ended, or the draft is wrong from here */
        atomic_fetch_add(&s->st->draft_accepted, 1);
    }
    if (qwenc_session_accept(c->session, keep, err, sizeof(err))) { /* cannot fail after a draft step */
        lose_state(c);
        if (c->job) finish(s, c, QWENC_STOP_NONE, 500, err);
    }
    return 1;
}

/* One token of every generating slot, in one forward call (with --draft and one slot generating, a draft step). */
static void decode_step(srv_sched *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *c = &s->slots[i];
        if (c->job && c->phase == PH_DECODE && c->pending >= 0) {
            s->bs[n] = c->session;
            s->bt[n] = c->pending;
            s->bslot[n++] = c;
        }
    }
    if (!n) return;
    if (n == 1 && s->p.n_draft > 0 && draft_step(s, s->bslot[0])) return;
    double t0 = srv_now();
    char err[256];
    qwenc_status st = qwenc_session_forward_batch(s->bs, s->bt, n, s->logits, err, sizeof(err));
    atomic_fetch_add(&s->st->decode_us, (long long)((srv_now() - t0) * 1e6));
    atomic_fetch_add(&s->st->decode_steps, 1);
    for (int i = 0; i < n; i++) {
        slot *c = s->bslot[i];
        if (st) { /* which sessions took their token is not known: each starts over */
            lose_state(c);
            finish(s, c, QWENC_STOP_NONE, 500, err);
            continue;
        }
        c->hist[c->n_hist++] = c->pending;
        c->pending = -1;
        sample_step(s, c, s->logits + (size_t)i * s->n_vocab);
    }
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    srv_job *admitted[64];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && s->n_active == 0 && !s->qhead) pthread_cond_wait(&s->cv, &s->mu);
        if (s->cancel_all) {
            for (srv_job *q = s->qhead; q; q = q->next) atomic_store(&q->cancel, SRV_CANCEL_SHUTDOWN);
            for (int i = 0; i < s->n_slots; i++)
                if (s->slots[i].job) atomic_store(&s->slots[i].job->cancel, SRV_CANCEL_SHUTDOWN);
        }
        if (s->quit && s->n_active == 0 && !s->qhead) break;
        /* queued jobs into idle slots, in order; a cancelled one is taken out without a slot */
        int n_adm = 0, idle = s->n_slots - s->n_active;
        while (s->qhead && n_adm < 64) {
            srv_job *q = s->qhead;
            int gone = atomic_load(&q->cancel) != 0;
            if (!gone && idle == 0) break;
            s->qhead = q->next;
            if (!s->qhead) s->qtail = NULL;
            s->n_queued--;
            idle -= !gone;
            admitted[n_adm++] = q;
        }
        atomic_store(&s->st->queued, s->n_queued);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_adm; i++) admit(s, admitted[i]);
        for (int i = 0; i < s->n_slots; i++)
            if (s->slots[i].job && atomic_load(&s->slots[i].job->cancel)) finish_cancelled(s, &s->slots[i]);
        prefill_step(s);
        decode_step(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ------------------------------------------------------------------ the interface */

int srv_sched_new(const qwenc_model *m, const qwenc_tokenizer *tok, const srv_params *p, srv_stats *st,
                  srv_sched **out, char *err, size_t errlen) {
    *out = NULL;
    srv_sched *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory for the scheduler");
        return -1;
    }
    s->m = m;
    s->tok = tok;
    s->p = *p;
    s->st = st;
    s->n_vocab = qwenc_model_n_vocab(m);
    s->n_eos = qwenc_tokenizer_eos(tok, &s->eos);
    s->n_slots = p->n_parallel;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->slots = calloc((size_t)s->n_slots, sizeof(slot));
    /* a batched step's logits, or a draft step's */
    s->logits = malloc((size_t)(s->n_slots > p->n_draft + 1 ? s->n_slots : p->n_draft + 1) * s->n_vocab * sizeof(float));
    s->bs = calloc((size_t)s->n_slots, sizeof(*s->bs));
    s->bt = calloc((size_t)s->n_slots, sizeof(*s->bt));
    s->bslot = calloc((size_t)s->n_slots, sizeof(*s->bslot));
    if (!s->slots || !s->logits || !s->bs || !s->bt || !s->bslot) {
        snprintf(err, errlen, "out of memory for %d slots", s->n_slots);
        srv_sched_free(s);
        return -1;
    }
    qwenc_session_params sp = qwenc_session_default_params();
    if (p->n_ctx) sp.n_ctx = p->n_ctx;
    sp.n_batch = p->n_chunk;
    sp.draft_head = p->n_draft > 0; /* drafts from the model's MTP head when it has one */
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        sl->id = i;
        sl->pending = -1;
        char e[512];
        if (qwenc_session_init(m, &sp, &sl->session, e, sizeof(e))) {
            snprintf(err, errlen, "slot %d of %d: %s", i, s->n_slots, e);
            srv_sched_free(s);
            return -1;
        }
        s->n_ctx = qwenc_session_n_ctx(sl->session);
        if (!(sl->hist = malloc((size_t)s->n_ctx * sizeof(int32_t)))) {
            snprintf(err, errlen, "out of memory for slot %d's tokens", i);
            srv_sched_free(s);
            return -1;
        }
    }
    s->ph = malloc(((size_t)s->n_ctx + 1) * sizeof(uint64_t));
    if (p->cache_bytes) s->cache = srv_cache_new(p->cache_bytes, s->n_vocab, st);
    if (!s->ph || (p->cache_bytes && !s->cache)) {
        snprintf(err, errlen, "out of memory for the prefix cache");
        srv_sched_free(s);
        return -1;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        snprintf(err, errlen, "cannot start the scheduler thread");
        srv_sched_free(s);
        return -1;
    }
    s->started = 1;
    *out = s;
    return 0;
}

int srv_sched_n_ctx(const srv_sched *s) { return s->n_ctx; }

int srv_sched_submit(srv_sched *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    int waiting = s->n_active + s->n_queued - s->n_slots; /* jobs that would wait for a slot */
    if (s->stopping || waiting >= s->p.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return 503;
    }
    atomic_fetch_add(&j->refs, 1);
    j->next = NULL;
    j->t_submit = srv_now();
    if (s->qtail)
        s->qtail->next = j;
    else
        s->qhead = j;
    s->qtail = j;
    s->n_queued++;
    atomic_store(&s->st->queued, s->n_queued);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int srv_sched_busy(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_active + s->n_queued;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void srv_sched_stop(srv_sched *s, int cancel_all) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    if (cancel_all) s->cancel_all = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_free(srv_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = s->cancel_all = s->quit = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        qwenc_session_free(s->slots[i].session);
        free(s->slots[i].hist);
        sb_free(&s->slots[i].hold);
    }
    srv_cache_free(s->cache);
    free(s->slots);
    free(s->logits);
    free(s->bs);
    free(s->bt);
    free(s->bslot);
    free(s->ph);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
