/*
 * server.h - `qwenc serve`: an OpenAI-compatible HTTP server for one model, built on the public library
 * (include/qwenc.h) and libmicrohttpd. docs/SERVER.md describes it for users.
 *
 * Threads. libmicrohttpd runs a thread per connection (http.c): it reads the request, checks it, renders the
 * chat template and tokenizes (the tokenizer and the template renderer are read-only and thread-safe), submits
 * a job, then waits on the job's condition variable and writes the reply or the stream; while it waits it
 * watches its socket, and a client that leaves cancels its job. One scheduler thread (sched.c) owns every
 * session: the library's sessions are single-threaded, the model is shared.
 *
 * Scheduler. --parallel N slots, each a session with its own state and the list of tokens fed to it; a bounded
 * queue in front. Each step: admit queued jobs into idle slots (restoring the longest cached prefix), feed one
 * chunk of at most -b prompt tokens of the oldest job still reading its prompt, then decode one token of every
 * generating slot with one qwenc_session_forward_batch call. Sampling, stop ids, stop strings and the limits are
 * those of qwenc_generate (`qwenc run`), step by step.
 *
 * Prefix cache (cache.c). A new prompt that extends what an idle slot holds continues that slot; otherwise the
 * longest cached snapshot that is a prefix of it is restored (qwenc_session_restore: the exact state, KV cache
 * and recurrent states alike) and only the rest is fed. Snapshots are taken where a prompt's messages meet
 * (after the first message, before the last) and at the prompt's end (with its logits), and an idle slot's state
 * is saved before the slot is given to another conversation; all within --cache-ram bytes, least recently used
 * out first. Everything the cache holds is keyed by its exact token prefix, so no state crosses conversations
 * that differ.
 *
 * Output (parse.c): the generated text is split into content, reasoning_content (<think>...</think>) and Qwen
 * tool calls (the JSON form of Qwen3, the XML form of Qwen3.5 / 3.6 / Coder) as it streams; a non-streamed
 * reply is the sum of the same deltas.
 */
#ifndef QW_SERVER_H
#define QW_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "qwenc.h"

struct cJSON;
struct MHD_Daemon;

/* ------------------------------------------------------------------ the server (what tools/serve.c calls) */

typedef struct {
    const char *host;        /* address to listen on (default 127.0.0.1) */
    int port;                /* 0: any free port (srv_port says which) */
    const char *api_key;     /* NULL: no authentication */
    const char *alias;       /* the model's id in the API */
    int n_parallel;          /* slots */
    int n_ctx;               /* tokens per slot (0: the session default) */
    int n_chunk;             /* prompt tokens per scheduler step */
    int max_queue;           /* requests waiting for a slot; more are refused with 503 */
    size_t cache_bytes;      /* prefix cache budget (0: no cache) */
    size_t max_body;         /* largest request body (413 above) */
    int timeout_s;           /* an idle connection is closed after this many seconds */
    int max_conn;            /* connections at once */
    qwenc_sampler_params sp; /* sampling defaults of a request */
    int seed_set;            /* sp.seed is the default seed (else each request draws one) */
    int n_predict;           /* default max_tokens (-1: until the end of the turn or a full context) */
    int no_think;            /* default chat_template_kwargs.enable_thinking = false */
    int n_draft;             /* speculative decoding while one slot generates: drafts of up to n_draft tokens */
    int quiet;               /* no line per request on stderr */
} srv_params;

typedef struct srv srv;

srv_params srv_default_params(void);
/* Bind and start answering: /health says 503 "loading" until srv_set_model. */
int srv_start(const srv_params *p, srv **out, char *err, size_t errlen);
/* The model to serve (still owned by the caller, who frees it after srv_free): creates the slots and starts
 * the scheduler. */
int srv_set_model(srv *s, const qwenc_model *model, const qwenc_tokenizer *tok, char *err, size_t errlen);
int srv_port(const srv *s);
/* Stop accepting: no new connection, a new request on an open one gets 503. */
void srv_quiesce(srv *s);
/* Stop accepting (if not yet); requests in flight run on for at most grace_s seconds (or until *cut becomes non-zero), then
 * end with an error (a stream with an error event). Returns the number of requests that were cut. */
int srv_stop(srv *s, double grace_s, volatile int *cut);
void srv_free(srv *s);

/* ------------------------------------------------------------------ internals shared by the server's files */

#define SRV_MAX_STOP 16
#define SRV_MAX_TOP 20 /* top_logprobs */

/* Growable byte buffer (always NUL-terminated when p != NULL). */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;
int sb_add(sbuf *b, const char *s, size_t n); /* 0 on success */
int sb_str(sbuf *b, const char *s);
int sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(sbuf *b);

/* One sampled token's log-probabilities (logprobs / top_logprobs). */
typedef struct {
    int32_t id;
    float lp;
    int n_top;
    struct {
        int32_t id;
        float lp;
    } top[SRV_MAX_TOP];
} srv_tokprob;

enum { SRV_CANCEL_CLIENT = 1, SRV_CANCEL_SHUTDOWN = 2 };

/* One request's generation: filled by the HTTP thread, run by the scheduler, read back by the HTTP thread. */
typedef struct srv_job {
    /* input, read-only once submitted */
    int32_t *prompt;
    int n_prompt;
    int bounds[4];           /* positions worth a snapshot (message boundaries, the prompt's end), ascending */
    int n_bounds;
    qwenc_sampler_params sp;
    int n_predict;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int n_top;               /* top log-probabilities per token; -1: no log-probabilities */
    /* output, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sbuf text;               /* generated text not yet taken by the HTTP thread */
    srv_tokprob *probs;      /* records not yet taken */
    int n_probs, cap_probs;
    int done;                /* no more output */
    qwenc_stop_reason reason;
    int err_status;          /* an HTTP status when the job failed (500, 503), else 0 */
    char err[256];
    int n_cached, n_gen;
    double t_submit, t_start, t_first, t_end; /* seconds (CLOCK_MONOTONIC) */
    atomic_int cancel;       /* SRV_CANCEL_*: set by the HTTP side or the shutdown */
    atomic_int refs;         /* the HTTP side and the scheduler */
    struct srv_job *next;    /* the queue */
} srv_job;

srv_job *srv_job_new(void);
void srv_job_release(srv_job *j); /* drops a reference; the last one frees it */

typedef struct srv_cache srv_cache;
typedef struct srv_sched srv_sched;

/* Counters for /metrics; updated with atomics from any thread. */
typedef struct {
    atomic_llong requests[8];    /* by endpoint (srv_endpoint) */
    atomic_llong status[6];      /* replies by class: 2xx, 400, 401, 404/405, 413, 503 ... see http.c */
    atomic_llong prompt_tokens, cached_tokens, gen_tokens;
    atomic_llong cache_hits, cache_misses;   /* jobs that reused a prefix / did not */
    atomic_llong prompt_us, decode_us;       /* time the scheduler spent feeding prompts / decoding */
    atomic_llong decode_steps;
    atomic_llong drafted, draft_accepted;    /* --draft: tokens drafted, and accepted */
    atomic_llong cancelled;
    atomic_llong cache_bytes, cache_entries; /* gauges */
    atomic_int queued, active;               /* gauges */
} srv_stats;

/* The scheduler (sched.c). */
int srv_sched_new(const qwenc_model *m, const qwenc_tokenizer *tok, const srv_params *p, srv_stats *st,
                  srv_sched **out, char *err, size_t errlen);
/* Queue a job (takes a reference). 0, or 503 when the queue is full or the server stops. */
int srv_sched_submit(srv_sched *s, srv_job *j);
/* Jobs queued or running. */
int srv_sched_busy(srv_sched *s);
/* Refuse new jobs; cancel every job (with SRV_CANCEL_SHUTDOWN) when cancel_all. */
void srv_sched_stop(srv_sched *s, int cancel_all);
int srv_sched_n_ctx(const srv_sched *s);
void srv_sched_free(srv_sched *s);

/* The prefix cache (cache.c): used by the scheduler thread only. */
srv_cache *srv_cache_new(size_t budget, int n_vocab, srv_stats *st);
void srv_cache_free(srv_cache *c);
/* The longest entry whose tokens are a prefix of prompt[0..n): at most n - 1 tokens, or n with logits.
 * prefix_hash: srv_prefix_hashes(prompt, n). NULL if none. */
typedef struct srv_cache_entry srv_cache_entry;
srv_cache_entry *srv_cache_find(srv_cache *c, const int32_t *prompt, int n, const uint64_t *prefix_hash);
int srv_cache_entry_n(const srv_cache_entry *e);
const qwenc_snapshot *srv_cache_entry_snap(const srv_cache_entry *e);
const float *srv_cache_entry_logits(const srv_cache_entry *e); /* NULL: none */
/* Whether the cache holds exactly this prefix. */
int srv_cache_has(srv_cache *c, const int32_t *tokens, int n, uint64_t hash);
/* Snapshot the session (whose fed tokens are tokens[0..n)) and keep it, with the last position's logits when
 * given; evicts the least recently used entries to stay within the budget. 0, or -1 if it was not kept. */
int srv_cache_put(srv_cache *c, qwenc_session *session, const int32_t *tokens, int n, uint64_t hash,
                  const float *logits);
/* h[i] = the hash of tokens[0..i), for i in 0..n (n + 1 values); srv_hash: h[n] alone. */
void srv_prefix_hashes(const int32_t *tokens, int n, uint64_t *h);
uint64_t srv_hash(const int32_t *tokens, int n);

/* Output parsing (parse.c): the generated text -> content, reasoning and tool-call deltas. */
typedef struct {
    int index;       /* the tool call's place in tool_calls */
    char *id, *name; /* set on the call's first delta only */
    char *args;      /* a piece of the arguments' JSON text (may be empty) */
} srv_tool_delta;

typedef struct {
    sbuf content, reasoning;
    srv_tool_delta *tools;
    int n_tools, cap_tools;
} srv_delta;

typedef struct srv_parser srv_parser;
/* reasoning: split <think> blocks (starting inside one when think_open); tools: the request's tools array
 * (NULL: tool-call markup is content), used for the parameters' types of the XML form. */
srv_parser *srv_parser_new(int reasoning, int think_open, const struct cJSON *tools);
/* Feed generated text; the deltas it completes are appended to d. final: the text is complete. 0, or -1 when
 * out of memory. */
int srv_parser_feed(srv_parser *p, const char *text, size_t n, int final, srv_delta *d);
int srv_parser_n_tools(const srv_parser *p); /* tool calls begun so far */
void srv_parser_free(srv_parser *p);
void srv_delta_clear(srv_delta *d);
void srv_delta_free(srv_delta *d);

/* ------------------------------------------------------------------ the API (api.c), between HTTP and the scheduler */

typedef enum {
    EP_HEALTH, EP_MODELS, EP_METRICS, EP_CHAT, EP_COMPLETIONS, EP_TOKENIZE, EP_DETOKENIZE, EP_TEMPLATE, EP_COUNT
} srv_endpoint;

struct srv {
    srv_params p;
    struct MHD_Daemon *daemon;
    int port;
    atomic_int ready;        /* the model is loaded */
    atomic_int stopping;
    atomic_int inflight;     /* generation requests not yet answered to the last byte */
    const qwenc_model *model;
    const qwenc_tokenizer *tok;
    const char *tmpl;        /* the chat template, or NULL */
    srv_sched *sched;
    int n_ctx;
    srv_stats st;
    long long t_start;       /* unix time the server started ("created" of /v1/models) */
};

/* A finished answer: status, body (malloc'd) and its content type. */
typedef struct {
    int status;
    char *body;
    size_t len;
    const char *ctype;
    char log[160];           /* the request's line in the log: tokens and cache, or the error */
} srv_reply;

void srv_reply_json(srv_reply *r, int status, struct cJSON *j); /* takes j */
void srv_reply_error(srv_reply *r, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A generation in progress (chat or completion), from the checked request to the last byte of the answer. */
typedef struct srv_gen srv_gen;
/* Check a /v1/chat/completions or /v1/completions body, render and tokenize it, submit its job: 0 and *g, or
 * the error reply in r. */
int srv_gen_start(srv *s, srv_endpoint ep, const char *body, size_t n, srv_gen **g, srv_reply *r);
int srv_gen_stream(const srv_gen *g);
srv_job *srv_gen_job(const srv_gen *g);
/* Take the job's new output. A stream's events are appended to out (the last ones, [DONE] included, once the
 * job is done); otherwise the output is kept for srv_gen_reply. Returns 1 when nothing more will come. */
int srv_gen_take(srv_gen *g, sbuf *out);
/* The answer of a request that does not stream, once srv_gen_take returned 1. */
void srv_gen_reply(srv_gen *g, srv_reply *r);
/* The log line of a finished generation. */
void srv_gen_log(const srv_gen *g, char *buf, size_t n);
void srv_gen_free(srv_gen *g);
/* The endpoints without a generation: health, models, metrics, tokenize, detokenize, apply-template. */
void srv_api_simple(srv *s, srv_endpoint ep, const char *body, size_t n, srv_reply *r);

double srv_now(void);

#endif
