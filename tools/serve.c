/*
 * serve.c - `qwenc serve`: the OpenAI-compatible HTTP server of src/server/ for one model.
 *
 * It listens before it loads, so GET /health answers 503 "loading model" until the model is ready. The model
 * and tokenizer are loaded as `run` loads them; the request defaults (sampling, max_tokens, seed,
 * enable_thinking) come from the same options as `run`'s. SIGINT or SIGTERM: no new connections; the requests
 * in flight get SHUTDOWN_GRACE seconds to finish, and a second signal ends them at once; whatever is left ends
 * with an error (a stream with an error event). The exit status is 0 after such a shutdown.
 *
 * The server's threads are started with SIGINT and SIGTERM blocked, so that the signals reach this thread,
 * which only waits for them.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "server/server.h"

#define SHUTDOWN_GRACE 10.0 /* seconds */

/* The last part of the model's path: "models/tiny-flash/" -> "tiny-flash". */
static void default_alias(const char *path, char *out, size_t n) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    snprintf(out, n, "%.*s", (int)(len - start), path + start);
}

/* --api-key-file: the first line of the file. */
static char *read_key(const char *path) {
    size_t len = 0;
    char *k = cli_slurp(path, &len);
    if (!k) return NULL;
    k[strcspn(k, "\r\n")] = 0;
    if (!*k) {
        fprintf(stderr, "qwenc: --api-key-file %s: the first line is empty\n", path);
        free(k);
        return NULL;
    }
    return k;
}

/* Block SIGINT and SIGTERM (block = 1; the threads started meanwhile inherit the mask) or restore *old (0). */
static void block_signals(int block, sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (block) pthread_sigmask(SIG_BLOCK, &set, old);
    else pthread_sigmask(SIG_SETMASK, old, NULL);
}

int cmd_serve(cli_opts *o) {
    srv_params p = srv_default_params();
    char alias[256], err[1024], *key = NULL;
    if (o->host) p.host = o->host;
    if (o->port != CLI_UNSET) p.port = o->port;
    if (o->parallel != CLI_UNSET) p.n_parallel = o->parallel;
    if (o->ctx) p.n_ctx = o->ctx;
    if (o->batch) p.n_chunk = o->batch;
    if (o->max_queue != CLI_UNSET) p.max_queue = o->max_queue;
    if (o->cache_ram != CLI_UNSET) p.cache_bytes = (size_t)o->cache_ram << 20;
    if (o->max_body != CLI_UNSET) p.max_body = (size_t)o->max_body << 20;
    if (o->timeout != CLI_UNSET) p.timeout_s = o->timeout;
    if (o->n_predict != CLI_UNSET) p.n_predict = o->n_predict;
    p.sp = o->sp;
    p.seed_set = o->seed_set;
    p.no_think = o->no_think;
    if (o->draft == QWENC_DRAFT_AUTO)
        return fprintf(stderr, "qwenc: serve takes --draft N (a number of tokens), not auto\n"), 1;
    p.n_draft = o->draft;
    p.quiet = o->quiet;
    p.max_conn = 2 * (p.n_parallel + p.max_queue) + 16;
    default_alias(o->model, alias, sizeof(alias));
    p.alias = o->alias ? o->alias : alias;
    if (o->api_key_file && !(p.api_key = key = read_key(o->api_key_file))) return 1;
    if (o->api_key) p.api_key = o->api_key;

    srv *s = NULL;
    sigset_t old;
    block_signals(1, &old);
    int bad = srv_start(&p, &s, err, sizeof(err));
    block_signals(0, &old);
    if (bad) {
        fprintf(stderr, "qwenc: serve: %s\n", err);
        free(key);
        return 1;
    }
    const char *h = strchr(p.host, ':') ? "[" : "", *h2 = *h ? "]" : "";
    fprintf(stderr, "qwenc: listening on http://%s%s%s:%d (loading %s)\n", h, p.host, h2, srv_port(s), o->model);
    cli_signals(CLI_SIG_STOP); /* a signal while loading stops the load (a second one ends the process) */
    double t0 = cli_now_s();
    qwenc_model *m = cli_load_model(o);
    qwenc_tokenizer *tok = m && !cli_stop_signal ? cli_load_tokenizer(o) : NULL;
    int rc = 1;
    if (!m || !tok) goto done;
    if (cli_stop_signal) {
        rc = 0;
        goto done;
    }
    block_signals(1, &old);
    bad = srv_set_model(s, m, tok, err, sizeof(err));
    block_signals(0, &old);
    if (bad) {
        fprintf(stderr, "qwenc: serve: %s\n", err);
        goto done;
    }
    cli_signals(CLI_SIG_KEEP);
    fprintf(stderr, "qwenc: serving %s (%s, %s, %d threads) as \"%s\" on http://%s%s%s:%d, loaded in %.1f s: %d slots, "
                    "prefix cache %zu MiB%s\n",
            o->model, qwenc_model_arch(m), qwenc_model_backend(m), qwenc_model_n_threads(m), p.alias, h, p.host, h2,
            srv_port(s), cli_now_s() - t0, p.n_parallel, p.cache_bytes >> 20, p.api_key ? ", API key required" : "");
    while (!cli_stop_signal) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int sig = cli_stop_signal;
    cli_stop_signal = 0; /* a second signal cuts the grace period short */
    srv_quiesce(s);
    fprintf(stderr, "qwenc: %s: no new connections; requests in flight have %.0f s to finish (signal again to end "
                    "them now)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", SHUTDOWN_GRACE);
    int cut = srv_stop(s, SHUTDOWN_GRACE, &cli_stop_signal);
    if (cut) fprintf(stderr, "qwenc: ended %d request%s with an error\n", cut, cut == 1 ? "" : "s");
    fprintf(stderr, "qwenc: stopped\n");
    rc = 0;
done:
    srv_free(s);
    cli_signals(CLI_SIG_DEFAULT);
    qwenc_tokenizer_free(tok);
    qwenc_model_free(m);
    free(key);
    return rc;
}
