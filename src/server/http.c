/*
 * http.c - the server's HTTP side on libmicrohttpd: a thread per connection (HTTP/1.1 keep-alive), routes,
 * authentication, the limits (body size, header size, idle time, connections), waiting for a generation while
 * watching the client's socket, streaming server-sent events, and the two-phase shutdown.
 *
 * A request's body is gathered up to --max-body bytes (413 beyond, refused from its Content-Length when it
 * declares one); headers beyond 64 KiB are refused by libmicrohttpd itself (431). A generation's handler waits
 * on its job: a request that does not stream blocks in the handler until the job ends and then answers with the
 * exact status; a stream answers 200 at once and its content callback blocks until the next output. Either way,
 * while no output comes the socket is polled every 100 ms, and a client that has closed it (EOF or hang-up)
 * cancels its job, which frees the slot at the scheduler's next step. The idle timeout is suspended while a
 * generation runs and restored after it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#define HEADER_LIMIT (64 * 1024) /* libmicrohttpd's memory per connection: the request line and headers */

typedef struct {
    srv *s;
    struct MHD_Connection *conn;
    srv_endpoint ep;
    sbuf body;
    int too_big, answered;
    srv_gen *gen;            /* a stream in progress */
    sbuf out;                /* events not yet handed to libmicrohttpd */
    size_t out_off;
    int stream_done, logged, inflight;
    double t0, t_peer;       /* the request's start; when the socket was last checked (wait_job) */
    char method[8], path[80];
} req;

static const struct {
    const char *path, *method;
    srv_endpoint ep;
} routes[] = {
    {"/health", "GET", EP_HEALTH},
    {"/v1/health", "GET", EP_HEALTH},
    {"/v1/models", "GET", EP_MODELS},
    {"/models", "GET", EP_MODELS},
    {"/metrics", "GET", EP_METRICS},
    {"/v1/chat/completions", "POST", EP_CHAT},
    {"/chat/completions", "POST", EP_CHAT},
    {"/v1/completions", "POST", EP_COMPLETIONS},
    {"/completions", "POST", EP_COMPLETIONS},
    {"/tokenize", "POST", EP_TOKENIZE},
    {"/detokenize", "POST", EP_DETOKENIZE},
    {"/apply-template", "POST", EP_TEMPLATE},
};
#define N_ROUTES (int)(sizeof(routes) / sizeof(routes[0]))

/* ------------------------------------------------------------------ answering */

static void count_status(srv *s, int status) {
    int k = status < 300 ? 0 : status == 400 ? 1 : status == 401 ? 2 : status == 404 || status == 405 ? 3
            : status == 413 ? 4 : 5;
    atomic_fetch_add(&s->st.status[k], 1);
}

static void log_line(req *q, int status, const char *what) {
    if (q->logged) return;
    q->logged = 1;
    if (q->s->p.quiet) return;
    fprintf(stderr, "qwenc: %s %s %d %.3f s%s%s\n", q->method, q->path, status, srv_now() - q->t0, what && *what ? ": " : "",
            what ? what : "");
}

static enum MHD_Result send_reply(req *q, srv_reply *r, const char *allow) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(r->body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->ctype ? r->ctype : "application/json");
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (r->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(q->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    q->answered = 1;
    count_status(q->s, r->status);
    log_line(q, r->status, r->log);
    return ret;
}

/* Whether the client has gone: hung up, or the stream reads end-of-file. */
static int peer_gone(req *q) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(q->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd pf = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char c;
    return (pf.revents & POLLIN) && recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Wait until the job has output or has ended; -1 when the client has gone meanwhile. The socket is checked
 * at least every 100 ms, also while output keeps coming (a reply that is not streamed takes it all at the end,
 * so its client's leaving shows only on the socket). */
static int wait_job(req *q, srv_job *j) {
    double now = srv_now();
    if (now - q->t_peer >= 0.1) {
        q->t_peer = now;
        if (peer_gone(q)) return -1;
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done && j->text.n == 0 && j->n_probs == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&j->mu);
            q->t_peer = srv_now();
            if (peer_gone(q)) return -1;
            pthread_mutex_lock(&j->mu);
        }
    }
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void set_timeout(req *q, unsigned secs) {
    MHD_set_connection_option(q->conn, MHD_CONNECTION_OPTION_TIMEOUT, secs);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    req *q = cls;
    for (;;) {
        if (q->out_off < q->out.n) {
            size_t k = q->out.n - q->out_off < max ? q->out.n - q->out_off : max;
            memcpy(buf, q->out.p + q->out_off, k);
            q->out_off += k;
            if (q->out_off == q->out.n) q->out.n = q->out_off = 0;
            return (ssize_t)k;
        }
        if (q->stream_done) {
            char line[200];
            srv_gen_log(q->gen, line, sizeof(line));
            log_line(q, 200, line);
            set_timeout(q, (unsigned)q->s->p.timeout_s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (srv_gen_take(q->gen, &q->out)) {
            q->stream_done = 1;
            continue;
        }
        if (q->out.n) continue;
        if (wait_job(q, srv_gen_job(q->gen)) < 0) {
            log_line(q, 200, "the client left: generation cancelled");
            atomic_store(&srv_gen_job(q->gen)->cancel, SRV_CANCEL_CLIENT);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static enum MHD_Result generate(req *q) {
    srv *s = q->s;
    srv_gen *g = NULL;
    srv_reply r = {0};
    if (srv_gen_start(s, q->ep, q->body.p ? q->body.p : "", q->body.n, &g, &r)) return send_reply(q, &r, NULL);
    set_timeout(q, 0); /* no idle timeout while the model works */
    atomic_fetch_add(&s->inflight, 1);
    q->inflight = 1;
    if (srv_gen_stream(g)) {
        q->gen = g;
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, q, NULL);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(q->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        q->answered = 1;
        count_status(s, 200);
        return ret;
    }
    sbuf none = {0};
    while (!srv_gen_take(g, &none))
        if (wait_job(q, srv_gen_job(g)) < 0) {
            log_line(q, 200, "the client left: generation cancelled");
            srv_gen_free(g); /* cancels the job */
            sb_free(&none);
            return MHD_NO;
        }
    sb_free(&none);
    srv_gen_reply(g, &r);
    if (r.status == 200) srv_gen_log(g, r.log, sizeof(r.log));
    srv_gen_free(g);
    set_timeout(q, (unsigned)s->p.timeout_s);
    return send_reply(q, &r, NULL);
}

/* Compare in time independent of where the strings differ. */
static int same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la; i++) d |= (unsigned char)a[i] ^ (unsigned char)b[i < lb ? i : 0];
    return d == 0;
}

static enum MHD_Result dispatch(req *q, const char *url, const char *method) {
    srv *s = q->s;
    srv_reply r = {0};
    int found = -1, path_known = 0;
    char allow[32] = "";
    for (int i = 0; i < N_ROUTES; i++)
        if (!strcmp(url, routes[i].path)) {
            path_known = 1;
            snprintf(allow, sizeof(allow), "%s", routes[i].method);
            if (!strcmp(method, routes[i].method)) found = i;
        }
    int public = found >= 0 && routes[found].ep == EP_HEALTH;
    if (s->p.api_key && !public) {
        const char *auth = MHD_lookup_connection_value(q->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth || strncmp(auth, "Bearer ", 7) || !same_secret(auth + 7, s->p.api_key)) {
            srv_reply_error(&r, 401, NULL, "invalid_api_key", auth ? "the API key is not valid"
                                                                   : "an API key is required: send the header "
                                                                     "Authorization: Bearer KEY");
            return send_reply(q, &r, NULL);
        }
    }
    if (!path_known) {
        srv_reply_error(&r, 404, NULL, "not_found", "no endpoint %s %s; see docs/SERVER.md for the endpoints", method,
                        q->path);
        return send_reply(q, &r, NULL);
    }
    if (found < 0) {
        srv_reply_error(&r, 405, NULL, "method_not_allowed", "%s takes %s, not %s", q->path, allow, method);
        return send_reply(q, &r, allow);
    }
    q->ep = routes[found].ep;
    atomic_fetch_add(&s->st.requests[q->ep], 1);
    if (q->too_big) {
        srv_reply_error(&r, 413, NULL, "request_too_large", "the request body is larger than %zu bytes (qwenc serve "
                        "--max-body)", s->p.max_body);
        return send_reply(q, &r, NULL);
    }
    if (q->ep != EP_HEALTH && q->ep != EP_METRICS && !atomic_load(&s->ready)) {
        srv_reply_error(&r, 503, NULL, "loading", "the model is still loading; GET /health says when it is ready");
        return send_reply(q, &r, NULL);
    }
    if (q->ep == EP_CHAT || q->ep == EP_COMPLETIONS) {
        if (atomic_load(&s->stopping)) {
            srv_reply_error(&r, 503, NULL, "shutting_down", "the server is shutting down");
            return send_reply(q, &r, NULL);
        }
        return generate(q);
    }
    srv_api_simple(s, q->ep, q->body.p ? q->body.p : "", q->body.n, &r);
    return send_reply(q, &r, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    req *q = *con_cls;
    if (!q) {
        if (!(q = calloc(1, sizeof(*q)))) return MHD_NO;
        q->s = s;
        q->conn = conn;
        q->t0 = srv_now();
        snprintf(q->method, sizeof(q->method), "%s", method);
        char *clean = qwenc_utf8_repair(url, strlen(url));
        snprintf(q->path, sizeof(q->path), "%s", clean ? clean : "?");
        free(clean);
        *con_cls = q;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) { /* refused before it is read */
            q->too_big = 1;
            return dispatch(q, url, method);
        }
        return MHD_YES;
    }
    if (q->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!q->too_big && q->body.n + *upload_size <= s->p.max_body) {
            if (sb_add(&q->body, upload, *upload_size)) return MHD_NO;
        } else {
            q->too_big = 1;
            sb_free(&q->body);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(q, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls;
    (void)conn;
    req *q = *con_cls;
    if (!q) return;
    if (q->gen && why != MHD_REQUEST_TERMINATED_COMPLETED_OK) log_line(q, 200, "the client left: generation cancelled");
    srv_gen_free(q->gen); /* cancels the job if it still runs */
    if (q->inflight) atomic_fetch_sub(&q->s->inflight, 1);
    sb_free(&q->body);
    sb_free(&q->out);
    free(q);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    srv *s = cls;
    if (s->p.quiet) return;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    fprintf(stderr, "qwenc: http: %s\n", msg);
}

/* ------------------------------------------------------------------ the server */

srv_params srv_default_params(void) {
    srv_params p = {.host = "127.0.0.1", .port = 8080, .n_parallel = 4, .n_chunk = 64, .max_queue = 64,
                    .cache_bytes = (size_t)2048 << 20, .max_body = (size_t)16 << 20, .timeout_s = 60, .max_conn = 128,
                    .n_predict = -1, .alias = "model"};
    p.sp = qwenc_sampler_default_params();
    return p;
}

int srv_start(const srv_params *p, srv **out, char *err, size_t errlen) {
    *out = NULL;
    srv *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->p = *p;
    s->t_start = (long long)time(NULL);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", p->port);
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai) {
        snprintf(err, errlen, "--host %s: %s", p->host, gai_strerror(gai));
        free(s);
        return -1;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    errno = 0;
    s->daemon = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s,
                                 MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->timeout_s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_conn,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HEADER_LIMIT,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_END);
    int e = errno;
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, errlen, "cannot listen on %s port %d%s%s", p->host, p->port, e ? ": " : "", e ? strerror(e) : "");
        free(s);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    *out = s;
    return 0;
}

int srv_port(const srv *s) { return s->port; }

int srv_set_model(srv *s, const qwenc_model *model, const qwenc_tokenizer *tok, char *err, size_t errlen) {
    s->model = model;
    s->tok = tok;
    s->tmpl = qwenc_tokenizer_chat_template(tok);
    if (srv_sched_new(model, tok, &s->p, &s->st, &s->sched, err, errlen)) return -1;
    s->n_ctx = srv_sched_n_ctx(s->sched);
    atomic_store(&s->ready, 1);
    return 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void srv_quiesce(srv *s) {
    if (atomic_exchange(&s->stopping, 1)) return;
    if (s->daemon) {
        MHD_socket fd = MHD_quiesce_daemon(s->daemon); /* no new connections; open ones may still ask */
        if (fd != MHD_INVALID_SOCKET) close(fd);
    }
}

int srv_stop(srv *s, double grace_s, volatile int *cut) {
    srv_quiesce(s);
    if (!s->sched) return 0;
    srv_sched_stop(s->sched, 0);
    double t0 = srv_now();
    while (srv_sched_busy(s->sched) && srv_now() - t0 < grace_s && !(cut && *cut)) sleep_ms(20);
    int n = srv_sched_busy(s->sched);
    if (n) srv_sched_stop(s->sched, 1);
    for (t0 = srv_now(); srv_sched_busy(s->sched) && srv_now() - t0 < 10; sleep_ms(10)) {}
    /* the connections' threads write their last bytes before the daemon closes the connections */
    for (t0 = srv_now(); atomic_load(&s->inflight) > 0 && srv_now() - t0 < 5; sleep_ms(10)) {}
    return n;
}

void srv_free(srv *s) {
    if (!s) return;
    if (s->daemon) MHD_stop_daemon(s->daemon);
    srv_sched_free(s->sched);
    free(s);
}
