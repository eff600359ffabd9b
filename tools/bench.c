/*
 * bench.c - `qwenc bench -m DIR [-p 512] [-n 128] [-t THREADS] [-r REPS] [--json]`, after llama-bench; -p, -n
 * and -t take comma lists (-p 128,512): every test runs at every thread count, a row each.
 *
 *   pp   prompt processing: a fresh session fed p random tokens in one call (one forward step)
 *   tg   text generation: a fresh session fed n random tokens one at a time, logits at every step
 *        (sampling is left out: it is the same for every backend)
 *   tgNxP with -np P: P fresh sessions decoding together, each step one qwenc_session_forward_batch of one
 *        token per session (as the server's slots decode); tokens per second of all P sessions together
 *   tgNdK with --draft K: draft steps, each qwenc_session_forward_draft of K+1 tokens and qwenc_session_accept
 *        keeping 1 (so the cost of taking K tokens back is in); steps per second, to set against tgN's
 *   tgNhK with --draft K on a model with an MTP draft head: the same with the K drafts from the head's greedy chain
 *         (K head steps per step, timed with it; in a session keeping the head's caches)
 * Each is run once untimed (page faults, thread start-up), then REPS times: mean and sample standard
 * deviation of tokens per second. Token ids are drawn from a fixed seed.
 *
 * --profile times every op of the timed runs (qwenc_session_profile; its clock reads cost a few microseconds
 * per token) and prints, per test, where a token's time went: per op and per weight tensor, with the bytes of
 * weights each matmul read and the rate it read them at.
 *
 * Peak RSS is the process's VmHWM, read before the bandwidth buffer below exists. The decode bound is
 * (weight bytes one decoded token reads, qwenc_model_weight_bytes) / (read bandwidth), the bandwidth
 * measured here: the largest of 5 timed passes, each with 1, 2 and 4 streams per thread and with one stream
 * asking for its bytes ahead as the decode kernels do, of THREADS
 * threads summing a 1 GiB buffer of 64-bit integers (each thread its slice), larger than the last-level
 * caches this is meant for (a model whose weights fit in that cache can beat the bound).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "cli.h"

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 5

#define PROF_ROWS 256
#define DEPTH_CHUNK 2048 /* tokens a call when bench -d feeds its context */

typedef struct {
    qwenc_profile_entry e[PROF_ROWS]; /* names copied (owned) */
    int n;
    qwenc_profile_totals tot;
} bench_prof;

typedef struct {
    double mean, sd;
    int ran;
    bench_prof *prof; /* --profile: the timed runs' ops */
} bench_stat;

static void stat_of(const double *v, int n, bench_stat *s) {
    double sum = 0, ss = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s->mean = sum / n;
    for (int i = 0; i < n; i++) ss += (v[i] - s->mean) * (v[i] - s->mean);
    s->sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
    s->ran = 1;
}

/* Peak resident set size in bytes: VmHWM, else getrusage's ru_maxrss (KiB on Linux). */
static int64_t peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atoll(line + 6);
    if (f) fclose(f);
    if (kb < 0) {
        struct rusage ru;
        kb = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
    }
    return (int64_t)kb * 1024;
}

/* ---- read bandwidth */

/* 32 bytes as one GCC/Clang vector: 256-bit loads where the CPU has them, two 128-bit ones elsewhere */
typedef uint64_t bw_vec __attribute__((vector_size(32)));

typedef struct {
    const bw_vec *p;
    size_t n;    /* vectors */
    int streams; /* the slice read as this many interleaved sequential streams */
    int pf;      /* software prefetch (bw_sum_streams) */
    uint64_t sum;
} bw_part;

/* pf: 0 none; 1 each 64 bytes asked for 4 KiB ahead non-temporally; 2 4 KiB ahead to L1 and 8 KiB ahead to
 * L2 (what the decode kernels do on AMD and on Intel) */
static inline __attribute__((always_inline)) uint64_t bw_sum_streams(const bw_vec *p, size_t n, int streams, int pf) {
    size_t per = n / (size_t)streams / 2 * 2;
    bw_vec s[4] = {{0}};
    for (size_t i = 0; i < per; i += 2) {
        if (pf == 1) __builtin_prefetch((const char *)(p + i) + 4096, 0, 0);
        if (pf == 2) {
            __builtin_prefetch((const char *)(p + i) + 4096, 0, 3);
            __builtin_prefetch((const char *)(p + i) + 8192, 0, 2);
        }
        for (int k = 0; k < streams; k++) s[k] += p[k * per + i] + p[k * per + i + 1];
    }
    bw_vec t = s[0] + s[1] + s[2] + s[3];
    return t[0] + t[1] + t[2] + t[3];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t bw_sum_avx2(const bw_vec *p, size_t n, int streams, int pf) {
    return bw_sum_streams(p, n, streams, pf);
}
#endif

/*
 * The sum of a thread's slice, read as 1, 2 or 4 interleaved sequential streams: which reaches the most
 * depends on the CPU's prefetchers (several streams per core on some CPUs, one on others), so read_bandwidth
 * tries all three, and one stream with the decode kernels' software prefetch, which is how decode reads and
 * can beat the plain streams. Loads are 256 bits wide where the CPU has AVX2: 128-bit loads leave a core well
 * short of what it can read. The measurements: docs/BENCH.md, the read bandwidth of the decode bound.
 */
static void *bw_sum(void *arg) {
    bw_part *b = arg;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        b->sum = bw_sum_avx2(b->p, b->n, b->streams, b->pf);
        return NULL;
    }
#endif
    b->sum = bw_sum_streams(b->p, b->n, b->streams, b->pf);
    return NULL;
}

/* Bytes per second that n_threads threads read from memory together; 0 if the buffer cannot be had. */
static double read_bandwidth(int n_threads) {
    size_t n = BW_BYTES / sizeof(bw_vec);
    /* in 2 MiB pages where the kernel gives them, as the weights' mapping asks for them (mapfile.c), so the
     * bound is measured with the pages decode reads through */
    bw_vec *buf = aligned_alloc((size_t)2 << 20, BW_BYTES);
    if (!buf) return 0;
#ifdef MADV_HUGEPAGE
    madvise(buf, BW_BYTES, MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < n; i++) buf[i] = (bw_vec){i, i + 1, i + 2, i + 3};
    bw_part *parts = calloc((size_t)n_threads, sizeof(bw_part));
    pthread_t *th = calloc((size_t)n_threads, sizeof(pthread_t));
    double best = 0;
    volatile uint64_t sink = 0;
    static const int patterns[][2] = {{1, 0}, {2, 0}, {4, 0}, {1, 1}, {1, 2}}; /* streams, prefetch */
    for (size_t pi = 0; pi < sizeof(patterns) / sizeof(patterns[0]); pi++)
        for (int pass = 0, streams = patterns[pi][0]; parts && th && pass < BW_PASSES; pass++) {
            size_t per = n / (size_t)n_threads;
            for (int t = 0; t < n_threads; t++) {
                parts[t].p = buf + (size_t)t * per;
                parts[t].n = t == n_threads - 1 ? n - (size_t)t * per : per;
                parts[t].streams = streams;
                parts[t].pf = patterns[pi][1];
            }
            double t0 = cli_now_s();
            int started = 1;
            for (int t = 1; t < n_threads; t++, started++)
                if (pthread_create(&th[t], NULL, bw_sum, &parts[t]) != 0) break;
            bw_sum(&parts[0]);
            for (int t = 1; t < started; t++) pthread_join(th[t], NULL);
            double dt = cli_now_s() - t0;
            size_t bytes = 0;
            for (int t = 0; t < started; t++) {
                sink += parts[t].sum;
                bytes += parts[t].n / (size_t)streams / 2 * 2 * (size_t)streams * sizeof(bw_vec);
            }
            if (dt > 0 && bytes / dt > best) best = bytes / dt;
        }
    (void)sink;
    free(th);
    free(parts);
    free(buf);
    return best;
}

/* ---- the model runs */

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* The context a test starts after (bench -d): n tokens fed to a reset session before each run, untimed, chunk
 * tokens a call; with prof, the session's profile restarted after them (it then holds the last run alone). */
typedef struct {
    const int32_t *ids;
    int n, chunk, prof;
} bench_depth;

static void feed_depth(qwenc_session *s, const bench_depth *d, char *err, size_t errlen, int *failed) {
    if (*failed || d->n <= 0) return;
    if (d->prof) qwenc_session_profile(s, 0, NULL, 0);
    for (int i = 0; i < d->n && !*failed; i += d->chunk)
        if (qwenc_session_forward(s, d->ids + i, d->n - i < d->chunk ? d->n - i : d->chunk, NULL, 0, err, errlen))
            *failed = 1;
    if (d->prof && !*failed && qwenc_session_profile(s, 1, err, errlen)) *failed = 1;
}

/* d with its profile flag set to prof */
static bench_depth depth_prof(const bench_depth *d, int prof) {
    bench_depth r = *d;
    r.prof = prof;
    return r;
}

/* Seconds for one run: p tokens in one call (gen = 0) or one at a time (gen = 1), on a reset session (after d's
 * context). */
static double run_once(qwenc_session *s, const int32_t *ids, int n, int gen, const bench_depth *d, float *logits,
                       char *err, size_t errlen, int *failed) {
    qwenc_session_reset(s);
    feed_depth(s, d, err, errlen, failed);
    double t0 = cli_now_s();
    if (gen) {
        for (int i = 0; i < n && !*failed; i++)
            if (qwenc_session_forward(s, ids + i, 1, logits, 0, err, errlen)) *failed = 1;
    } else if (qwenc_session_forward(s, ids, n, logits, 0, err, errlen)) {
        *failed = 1;
    }
    return cli_now_s() - t0;
}

static void prof_free(bench_prof *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) free((char *)p->e[i].name);
    free(p);
}

/* The session's profile, names copied; NULL if out of memory. */
static bench_prof *prof_take(const qwenc_session *s) {
    bench_prof *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    int n = qwenc_session_profile_read(s, p->e, PROF_ROWS, &p->tot);
    p->n = n < PROF_ROWS ? n : PROF_ROWS;
    for (int i = 0; i < p->n; i++) {
        p->e[i].name = strdup(p->e[i].name);
        if (!p->e[i].name) {
            p->n = i;
            prof_free(p);
            return NULL;
        }
    }
    return p;
}

static int bench_test(qwenc_session *s, const int32_t *ids, int n, int gen, const bench_depth *d, int reps,
                      int profile, float *logits, bench_stat *st) {
    char err[1024];
    int failed = 0;
    double *tps = calloc((size_t)reps, sizeof(double));
    if (!tps) return 0;
    const bench_depth dw = depth_prof(d, 0), dr = depth_prof(d, profile);
    run_once(s, ids, gen && n > 4 ? 4 : n, gen, &dw, logits, err, sizeof(err), &failed); /* warm-up */
    if (profile && !failed && qwenc_session_profile(s, 1, err, sizeof(err))) failed = 1;
    for (int r = 0; r < reps && !failed; r++)
        tps[r] = n / run_once(s, ids, n, gen, &dr, logits, err, sizeof(err), &failed);
    if (profile && !failed && !(st->prof = prof_take(s))) {
        snprintf(err, sizeof(err), "out of memory for the profile");
        failed = 1;
    }
    qwenc_session_profile(s, 0, NULL, 0);
    if (failed)
        fprintf(stderr, "qwenc: bench: %s\n", err);
    else
        stat_of(tps, reps, st);
    free(tps);
    return !failed;
}

/* Seconds for np sessions decoding n tokens each together: a step is one batched forward of one token per
 * session (session k is fed ids[(i + 17 k) mod len] at step i: the sessions differ). */
static double run_batch(qwenc_session *const *ss, int np, const int32_t *ids, int len, int n, const bench_depth *d,
                        int32_t *toks, float *logits, char *err, size_t errlen, int *failed) {
    const bench_depth plain = depth_prof(d, 0);
    for (int k = np - 1; k >= 0; k--) { /* the first session last: its profile restarts after the others' context */
        qwenc_session_reset(ss[k]);
        feed_depth(ss[k], k ? &plain : d, err, errlen, failed);
    }
    double t0 = cli_now_s();
    for (int i = 0; i < n && !*failed; i++) {
        for (int k = 0; k < np; k++) toks[k] = ids[(i + 17 * k) % len];
        if (qwenc_session_forward_batch(ss, toks, np, logits, err, errlen)) *failed = 1;
    }
    return cli_now_s() - t0;
}

/* Seconds for n draft steps of k+1 tokens each keeping one (the session's position advances a token a step); with
 * head, each step's k drafts come from the session's MTP draft head first (its greedy chain), as --draft does. */
static double run_draft(qwenc_session *s, const int32_t *ids, int len, int n, int k, int head, const bench_depth *d,
                        float *logits, char *err, size_t errlen, int *failed) {
    qwenc_session_reset(s);
    feed_depth(s, d, err, errlen, failed);
    int32_t toks[QWENC_MAX_DRAFT + 1];
    double t0 = cli_now_s();
    for (int i = 0; i < n && !*failed; i++) {
        for (int j = 0; j <= k; j++) toks[j] = ids[(i + j) % len];
        if (head && i > 0 && qwenc_session_draft_greedy(s, toks[0], k, toks + 1, err, errlen)) *failed = 1;
        if (*failed || qwenc_session_forward_draft(s, toks, k + 1, logits, err, errlen) ||
            qwenc_session_accept(s, 1, err, errlen))
            *failed = 1;
    }
    return cli_now_s() - t0;
}

static int bench_draft(qwenc_session *s, int V, const int32_t *ids, int len, int n, int k, int head,
                       const bench_depth *d, int reps, bench_stat *st) {
    char err[1024] = "out of memory";
    int failed = 0;
    float *logits = malloc((size_t)(k + 1) * (size_t)V * sizeof(float));
    double *tps = calloc((size_t)reps, sizeof(double));
    if (!logits || !tps) failed = 1;
    if (!failed) run_draft(s, ids, len, n > 4 ? 4 : n, k, head, d, logits, err, sizeof(err), &failed); /* warm-up */
    for (int r = 0; r < reps && !failed; r++)
        tps[r] = n / run_draft(s, ids, len, n, k, head, d, logits, err, sizeof(err), &failed);
    if (failed)
        fprintf(stderr, "qwenc: bench: tg%d with drafts of %d%s: %s\n", n, k, head ? " from the head" : "", err);
    else
        stat_of(tps, reps, st);
    free(logits);
    free(tps);
    return !failed;
}

/* The tg test of np sessions together (bench_test's warm-up and repetitions); 0 (message printed) on failure. */
static int bench_batch(qwenc_model *m, const qwenc_session_params *sp, const int32_t *ids, int len, int n, int np,
                       const bench_depth *d, int reps, int profile, bench_stat *st) {
    char err[1024] = "out of memory";
    int failed = 0, made = 0, V = qwenc_model_n_vocab(m);
    qwenc_session **ss = calloc((size_t)np, sizeof(*ss));
    int32_t *toks = malloc((size_t)np * sizeof(int32_t));
    float *logits = malloc((size_t)np * (size_t)V * sizeof(float));
    double *tps = calloc((size_t)reps, sizeof(double));
    if (!ss || !toks || !logits || !tps) failed = 1;
    for (; made < np && !failed; made++)
        if (qwenc_session_init(m, sp, &ss[made], err, sizeof(err))) failed = 1;
    const bench_depth dw = depth_prof(d, 0), dr = depth_prof(d, profile);
    if (!failed) run_batch(ss, np, ids, len, n > 4 ? 4 : n, &dw, toks, logits, err, sizeof(err), &failed); /* warm-up */
    /* a batched step runs through its first session's backend: that session's profile has every op */
    if (profile && !failed && qwenc_session_profile(ss[0], 1, err, sizeof(err))) failed = 1;
    for (int r = 0; r < reps && !failed; r++)
        tps[r] = (double)n * np / run_batch(ss, np, ids, len, n, &dr, toks, logits, err, sizeof(err), &failed);
    if (profile && !failed && !(st->prof = prof_take(ss[0]))) {
        snprintf(err, sizeof(err), "out of memory for the profile");
        failed = 1;
    }
    if (made) qwenc_session_profile(ss[0], 0, NULL, 0);
    if (failed)
        fprintf(stderr, "qwenc: bench: tg%d with %d sessions: %s\n", n, np, err);
    else
        stat_of(tps, reps, st);
    for (int k = 0; k < made; k++) qwenc_session_free(ss[k]);
    free(ss);
    free(toks);
    free(logits);
    free(tps);
    return !failed;
}

/* Where a token's time went: one row per op or weight tensor, slowest first. */
static void print_prof(const char *test, const bench_prof *p) {
    double tok = p->tot.tokens > 0 ? (double)p->tot.tokens : 1;
    printf("\nprofile of %s: %lld tokens in %lld step%s, %.3f ms per token\n", test, (long long)p->tot.tokens,
           (long long)p->tot.steps, p->tot.steps == 1 ? "" : "s", 1e3 * p->tot.seconds / tok);
    printf("%10s %6s %10s %10s %7s  %s\n", "ms/token", "%", "calls/tok", "MiB/tok", "GB/s", "op");
    for (int i = 0; i < p->n; i++) {
        const qwenc_profile_entry *e = &p->e[i];
        printf("%10.4f %6.2f %10.2f", 1e3 * e->seconds / tok, p->tot.seconds > 0 ? 100 * e->seconds / p->tot.seconds : 0,
               (double)e->calls / tok);
        if (e->bytes > 0)
            printf(" %10.2f %7.2f", (double)e->bytes / tok / 1048576.0, e->seconds > 0 ? e->bytes / e->seconds / 1e9 : 0);
        else
            printf(" %10s %7s", "", "");
        printf("  %s\n", e->name);
    }
}

static cJSON *prof_json(const bench_prof *p) {
    cJSON *j = cJSON_CreateObject(), *ops = cJSON_CreateArray();
    cJSON_AddNumberToObject(j, "seconds", p->tot.seconds);
    cJSON_AddNumberToObject(j, "tokens", (double)p->tot.tokens);
    cJSON_AddNumberToObject(j, "steps", (double)p->tot.steps);
    for (int i = 0; i < p->n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", p->e[i].name);
        cJSON_AddNumberToObject(e, "calls", (double)p->e[i].calls);
        cJSON_AddNumberToObject(e, "seconds", p->e[i].seconds);
        cJSON_AddNumberToObject(e, "bytes", (double)p->e[i].bytes);
        cJSON_AddItemToArray(ops, e);
    }
    cJSON_AddItemToObject(j, "ops", ops);
    return j;
}

/* One thread count: the model as loaded with it, and its read bandwidth. */
typedef struct {
    int threads; /* as the model runs (-t 0: one per core) */
    char kernels[16];
    double bw, bound; /* bytes/s (0: not measured), decode tok/s */
    qwenc_device_info dev; /* a GPU's (dev.name empty on the CPU): bw is its memory's */
    int n_gpus;            /* the experts split over GPUs (--gpus): each GPU's memory, the exchanges' time a token */
    qwenc_gpu_info gpu[8];
    double xchg_us;
} bench_cfg;

typedef struct {
    int cfg;     /* index into the bench_cfg */
    int gen, n;  /* tg n (gen) or pp n */
    int np;      /* sessions decoding together (tg; 1: one session) */
    int draft;   /* tokens drafted per step (tg; 0: plain one-token steps) */
    int head;    /* the drafts come from the model's MTP draft head (its steps timed too) */
    bench_stat st;
} bench_row;

typedef struct {
    const cli_opts *o;
    char arch[32];
    int reps, lists; /* lists: a -p, -n or -t list was given */
    bench_cfg cfg[CLI_MAX_LIST];
    int n_cfg;
    bench_row *rows;
    int n_rows;
    int64_t total, per_tok, rss;
} bench_run;

static void test_name(const bench_row *r, int depth, char *buf, size_t n) {
    int k;
    if (r->gen && r->np > 1)
        k = snprintf(buf, n, "tg%dx%d", r->n, r->np);
    else if (r->gen && r->draft)
        k = snprintf(buf, n, "tg%d%c%d", r->n, r->head ? 'h' : 'd', r->draft);
    else
        k = snprintf(buf, n, "%s%d", r->gen ? "tg" : "pp", r->n);
    if (depth > 0 && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "@d%d", depth); /* llama-bench's */
}

static void print_table(const bench_run *b) {
    char path[512], *name = path; /* the last component of the model path, trailing slashes dropped */
    if (b->o->synth)
        snprintf(path, sizeof(path), "synth-%s", b->o->synth);
    else
        snprintf(path, sizeof(path), "%s", b->o->model);
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = 0;
    if (strrchr(path, '/')) name = strrchr(path, '/') + 1;
    char size[32], test[32], tps[64];
    int tw = 8; /* the test column: its longest name */
    for (int i = 0; i < b->n_rows; i++) {
        test_name(&b->rows[i], b->o->bench_depth, test, sizeof(test));
        tw = (int)strlen(test) > tw ? (int)strlen(test) : tw;
    }
    printf("| %-20s | %-12s | %11s | %-7s | %7s | %*s | %20s |\n", "model", "arch", "size", "kernels", "threads", tw,
           "test", "t/s");
    printf("| %.20s | %.12s | %.11s | %.7s | %.7s | %.*s | %.20s |\n", "--------------------------------",
           "----------------", "----------------", "--------", "--------", tw, "--------------------------------",
           "-----------------------");
    snprintf(size, sizeof(size), "%.2f MiB", b->total / 1048576.0);
    for (int i = 0; i < b->n_rows; i++) {
        const bench_row *r = &b->rows[i];
        const bench_cfg *c = &b->cfg[r->cfg];
        test_name(r, b->o->bench_depth, test, sizeof(test));
        snprintf(tps, sizeof(tps), "%.2f ± %.2f", r->st.mean, r->st.sd);
        printf("| %-20.20s | %-12s | %11s | %-7s | %7d | %*s | %21s |\n", name, b->arch, size, c->kernels, c->threads,
               tw, test, tps);
    }
    printf("\nactivations     %s\n", b->o->f32_act ? "f32 (--f32-act)" : "8-bit per block of 32 for quantized weights");
    printf("peak RSS        %.1f MiB\n", b->rss / 1048576.0);
    printf("decode reads    %.2f MiB of weights per token (every matrix, one embedding row, the used share of\n"
           "                routed experts, PLE rows; not the KV cache or recurrent state)\n",
           b->per_tok / 1048576.0);
    for (int k = 0; k < b->n_cfg; k++) {
        const bench_cfg *c = &b->cfg[k];
        if (c->dev.name[0])
            printf("device          %s: %.1f of %.1f GiB free after the run\n", c->dev.name,
                   c->dev.free_bytes / 1073741824.0, c->dev.total_bytes / 1073741824.0);
        int by_layer = 0;
        for (int g = 0; g < c->n_gpus; g++) by_layer |= c->gpu[g].n_layers > 0;
        for (int g = 0; g < c->n_gpus; g++) {
            const qwenc_gpu_info *q = &c->gpu[g];
            char what[96] = "";
            if (by_layer && q->n_layers)
                snprintf(what, sizeof(what), " (layers %d-%d%s)", q->first_layer, q->first_layer + q->n_layers - 1,
                         g ? "" : " and the rest of the model");
            else if (by_layer)
                snprintf(what, sizeof(what), " (no layers%s)", g ? "" : "; the rest of the model");
            else if (!g)
                snprintf(what, sizeof(what), " (the experts' share and the rest of the model)");
            printf("GPU %d           device %d: %.2f GiB of weights, %.1f of %.1f GiB free after the run%s\n", g,
                   q->device, q->weight_bytes / 1073741824.0, q->free_bytes / 1073741824.0,
                   q->total_bytes / 1073741824.0, what);
        }
        if (c->n_gpus && !by_layer) {
            printf("exchanges       %.1f us a decode token between the GPUs (every MoE layer's, timed alone)", c->xchg_us);
            for (int i = 0; i < b->n_rows; i++) {
                const bench_row *r = &b->rows[i];
                if (r->cfg != k || !r->gen || r->np > 1 || r->draft || r->st.mean <= 0) continue;
                printf("; %.1f %% of a tg%d token", 100.0 * c->xchg_us * 1e-6 * r->st.mean, r->n);
                break;
            }
            printf("\n");
        }
        if (c->dev.host_table_bytes)
            printf("n-gram table    %.1f GiB in pinned host memory (it did not fit beside the rest), rows read over "
                   "the bus\n", c->dev.host_table_bytes / 1073741824.0);
        if (c->bw <= 0) {
            printf("read bandwidth  not measured (no memory for the buffer)\n");
            continue;
        }
        if (c->dev.name[0])
            printf("read bandwidth  %.1f GB/s (the device's memory: a kernel reading a 2 GiB buffer, best of 5)\n",
                   c->bw / 1e9);
        else
            printf("read bandwidth  %.2f GB/s (%d thread%s summing a %zu MiB buffer, best of %d passes each as 1, 2\n"
                   "                and 4 streams per thread and one stream with the decode kernels' prefetch)\n",
                   c->bw / 1e9, c->threads, c->threads == 1 ? "" : "s", BW_BYTES >> 20, BW_PASSES);
        printf("decode bound    %.2f tok/s", c->bound);
        if (b->n_cfg > 1) printf(" at %d thread%s", c->threads, c->threads == 1 ? "" : "s");
        const char *sep = "; ";
        for (int i = 0; i < b->n_rows; i++) {
            const bench_row *r = &b->rows[i];
            if (r->cfg != k || !r->gen || r->np > 1 || r->draft) continue; /* the bound is one token's */
            printf("%stg%d reaches %.1f %%", sep, r->n, 100.0 * r->st.mean / c->bound);
            sep = ", ";
        }
        printf("\n");
    }
    for (int i = 0; i < b->n_rows; i++) {
        const bench_row *r = &b->rows[i];
        if (!r->st.prof) continue;
        test_name(r, b->o->bench_depth, test, sizeof(test));
        size_t k = strlen(test);
        if (b->n_cfg > 1) snprintf(test + k, sizeof(test) - k, " at %d threads", b->cfg[r->cfg].threads);
        print_prof(test, r->st.prof);
    }
}

/* The fields every JSON object has: the run's settings and the machine's numbers. */
static cJSON *json_head(const bench_run *b, const bench_cfg *c, int p, int n, int np) {
    cJSON *j = cJSON_CreateObject();
    char label[160];
    snprintf(label, sizeof(label), "synth-%s", b->o->synth ? b->o->synth : "");
    cJSON_AddStringToObject(j, "model", b->o->synth ? label : b->o->model);
    cJSON_AddStringToObject(j, "arch", b->arch);
    cJSON_AddStringToObject(j, "kernels", c->kernels);
    cJSON_AddNumberToObject(j, "n_threads", c->threads);
    cJSON_AddBoolToObject(j, "f32_activations", b->o->f32_act);
    cJSON_AddNumberToObject(j, "n_prompt", p);
    cJSON_AddNumberToObject(j, "n_gen", n);
    cJSON_AddNumberToObject(j, "n_parallel", np);
    cJSON_AddNumberToObject(j, "n_depth", b->o->bench_depth);
    cJSON_AddNumberToObject(j, "reps", b->reps);
    return j;
}

static void json_stat(cJSON *j, const char *key, const bench_stat *s) {
    char sd[32];
    snprintf(sd, sizeof(sd), "%s_sd", key);
    if (s && s->ran) {
        cJSON_AddNumberToObject(j, key, s->mean);
        cJSON_AddNumberToObject(j, sd, s->sd);
    } else {
        cJSON_AddNullToObject(j, key);
        cJSON_AddNullToObject(j, sd);
    }
}

static void json_tail(cJSON *j, const bench_run *b, const bench_cfg *c, const bench_stat *pp, const bench_stat *tg) {
    cJSON_AddNumberToObject(j, "peak_rss_bytes", (double)b->rss);
    cJSON_AddNumberToObject(j, "weight_bytes", (double)b->total);
    cJSON_AddNumberToObject(j, "decode_bytes_per_token", (double)b->per_tok);
    cJSON_AddNumberToObject(j, "read_bw_bytes_per_s", c->bw);
    cJSON_AddNumberToObject(j, "bound_tg_tps", c->bound);
    if (tg && tg->ran && c->bound > 0)
        cJSON_AddNumberToObject(j, "tg_fraction_of_bound", tg->mean / c->bound);
    else
        cJSON_AddNullToObject(j, "tg_fraction_of_bound");
    if (c->dev.name[0]) {
        cJSON_AddStringToObject(j, "device", c->dev.name);
        cJSON_AddNumberToObject(j, "device_free_bytes", (double)c->dev.free_bytes);
        cJSON_AddNumberToObject(j, "device_total_bytes", (double)c->dev.total_bytes);
        cJSON_AddNumberToObject(j, "device_host_table_bytes", (double)c->dev.host_table_bytes);
    }
    if ((pp && pp->prof) || (tg && tg->prof)) {
        cJSON *pr = cJSON_CreateObject();
        if (pp && pp->prof) cJSON_AddItemToObject(pr, "pp", prof_json(pp->prof));
        if (tg && tg->prof) cJSON_AddItemToObject(pr, "tg", prof_json(tg->prof));
        cJSON_AddItemToObject(j, "profile", pr);
    }
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

/* One object: pp and tg of the single -p, -n and -t; with lists, one object per line and test, its "test"
 * named as in the table. */
static void print_json(const bench_run *b) {
    if (!b->lists) {
        const bench_stat *pp = NULL, *tg = NULL;
        int p = 0, n = 0, np = 1;
        for (int i = 0; i < b->n_rows; i++) {
            if (b->rows[i].gen) tg = &b->rows[i].st, n = b->rows[i].n, np = b->rows[i].np;
            else pp = &b->rows[i].st, p = b->rows[i].n;
        }
        cJSON *j = json_head(b, &b->cfg[0], p, n, np);
        json_stat(j, "pp_tps", pp);
        json_stat(j, "tg_tps", tg);
        json_tail(j, b, &b->cfg[0], pp, np > 1 ? NULL : tg); /* the bound is one session's */
        return;
    }
    for (int i = 0; i < b->n_rows; i++) {
        const bench_row *r = &b->rows[i];
        char test[32];
        test_name(r, b->o->bench_depth, test, sizeof(test));
        cJSON *j = json_head(b, &b->cfg[r->cfg], r->gen ? 0 : r->n, r->gen ? r->n : 0, r->gen ? r->np : 1);
        cJSON_AddStringToObject(j, "test", test);
        json_stat(j, "pp_tps", r->gen ? NULL : &r->st);
        json_stat(j, "tg_tps", r->gen ? &r->st : NULL);
        json_tail(j, b, &b->cfg[r->cfg], r->gen ? NULL : &r->st, r->gen && r->np == 1 ? &r->st : NULL);
    }
}

/* Every test at one thread count; 0 (message printed) on failure. */
static int bench_threads(bench_run *b, int threads, const int *P, int nP, const int *N, int nN, const int *NP,
                         int nNP, const int *DR, int nDR) {
    cli_opts ot = *b->o;
    ot.threads = threads;
    qwenc_model *m = cli_load_model(&ot);
    if (!m) return 0;
    int ok = 0, V = qwenc_model_n_vocab(m), len = 1, max_p = 1;
    for (int i = 0; i < nP; i++) len = P[i] > len ? P[i] : len, max_p = P[i] > max_p ? P[i] : max_p;
    for (int i = 0; i < nN; i++) len = N[i] > len ? N[i] : len;
    char err[1024];
    const int depth = b->o->bench_depth;
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = len + depth;
    const int chunk = depth < DEPTH_CHUNK ? depth : DEPTH_CHUNK;
    sp.n_batch = max_p > chunk ? max_p : chunk;
    for (int d = 0; d < nDR; d++) { /* a draft step needs its k + 1 tokens in the batch and the context */
        sp.n_batch = DR[d] + 1 > sp.n_batch ? DR[d] + 1 : sp.n_batch;
        sp.n_ctx = len + depth + DR[d] > sp.n_ctx ? len + depth + DR[d] : sp.n_ctx;
    }
    qwenc_session *s = NULL, *sh = NULL; /* sh: with the draft head's caches, for the head's draft rows */
    int32_t *ids = malloc(((size_t)len + (size_t)depth) * sizeof(int32_t)); /* the tests' ids, then the context's */
    float *logits = malloc((size_t)V * sizeof(float));
    bench_cfg *c = &b->cfg[b->n_cfg];
    if (!ids || !logits) {
        fprintf(stderr, "qwenc: bench: out of memory\n");
        goto done;
    }
    if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) {
        fprintf(stderr, "qwenc: bench: %s (lower -p, -n or -d)\n", err);
        goto done;
    }
    qwenc_session_params sph = sp;
    sph.draft_head = 1;
    if (nDR && qwenc_model_has_draft_head(m) && qwenc_session_init(m, &sph, &sh, err, sizeof(err))) {
        fprintf(stderr, "qwenc: bench: %s (lower -p, -n or -d)\n", err);
        goto done;
    }
    snprintf(b->arch, sizeof(b->arch), "%s", qwenc_model_arch(m));
    c->threads = qwenc_model_n_threads(m);
    snprintf(c->kernels, sizeof(c->kernels), "%s", qwenc_model_kernels(m));
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < len + depth; i++) ids[i] = (int32_t)(rng_next(&seed) % (uint64_t)V);
    const bench_depth dp = {ids + len, depth, sp.n_batch, 0};
    for (int gen = 0; gen < 2; gen++)
        for (int i = 0; i < (gen ? nN : nP); i++)
            for (int q = 0; q < (gen ? nNP : 1); q++) {
                int n = gen ? N[i] : P[i], np = gen ? NP[q] : 1;
                if (n == 0) continue;
                bench_row *r = &b->rows[b->n_rows];
                memset(r, 0, sizeof(*r));
                r->cfg = b->n_cfg;
                r->gen = gen;
                r->n = n;
                r->np = np;
                if (np > 1 ? !bench_batch(m, &sp, ids, len, n, np, &dp, b->reps, b->o->profile, &r->st)
                           : !bench_test(s, ids, n, gen, &dp, b->reps, b->o->profile, logits, &r->st))
                    goto done;
                b->n_rows++;
                for (int d = 0; gen && np == 1 && d < nDR; d++) { /* the same test in draft steps */
                    bench_row *rd = &b->rows[b->n_rows];
                    memset(rd, 0, sizeof(*rd));
                    rd->cfg = b->n_cfg;
                    rd->gen = 1;
                    rd->n = n;
                    rd->np = 1;
                    rd->draft = DR[d];
                    if (!bench_draft(s, V, ids, len, n, DR[d], 0, &dp, b->reps, &rd->st)) goto done;
                    b->n_rows++;
                    if (!sh) continue;
                    bench_row *rh = &b->rows[b->n_rows]; /* and with the head's drafts */
                    *rh = *rd;
                    rh->head = 1;
                    if (!bench_draft(sh, V, ids, len, n, DR[d], 1, &dp, b->reps, &rh->st)) goto done;
                    b->n_rows++;
                }
            }
    qwenc_model_weight_bytes(m, &b->total, &b->per_tok);
    qwenc_model_device_info(m, 1, &c->dev); /* a GPU's memory is measured while the model holds it */
    c->bw = c->dev.read_bw;
    if (b->o->gpus && *b->o->gpus) {
        c->n_gpus = qwenc_model_n_gpus(m) > 8 ? 8 : qwenc_model_n_gpus(m);
        for (int g = 0; g < c->n_gpus; g++) qwenc_model_gpu_info(m, g, &c->gpu[g]);
        c->xchg_us = qwenc_model_gpu_exchange_us(m, 1);
    }
    b->n_cfg++;
    ok = 1;
done:
    qwenc_session_free(s);
    qwenc_session_free(sh);
    free(logits);
    free(ids);
    qwenc_model_free(m);
    return ok;
}

int cmd_bench(cli_opts *o) {
    static const int def_p[] = {512}, def_n[] = {128};
    const int *P = o->n_bench_p ? o->bench_p : def_p, *N = o->n_bench_n ? o->bench_n : def_n;
    int nP = o->n_bench_p ? o->n_bench_p : 1, nN = o->n_bench_n ? o->n_bench_n : 1;
    int T1[1] = {o->threads}, *T = o->n_bench_t ? o->bench_t : T1, nT = o->n_bench_t ? o->n_bench_t : 1;
    const int *DR = o->bench_draft;
    int nDR = o->n_bench_draft;
    static const int def_np[] = {1};
    const int *NP = o->n_bench_np ? o->bench_np : def_np;
    int nNP = o->n_bench_np ? o->n_bench_np : 1;
    int tests = 0;
    for (int i = 0; i < nP; i++) tests += P[i] > 0;
    for (int i = 0; i < nN; i++) tests += (N[i] > 0) * (nNP + 2 * nDR); /* a draft row, and one with the head's drafts */
    if (tests == 0) return fprintf(stderr, "qwenc: bench: nothing to run (-p 0 -n 0): give -p or -n a count > 0\n"), 1;
    bench_run b = {.o = o, .reps = o->reps ? o->reps : 5, .lists = nP > 1 || nN > 1 || nT > 1 || nNP > 1 || nDR > 0};
    b.rows = calloc((size_t)(tests * nT), sizeof(bench_row));
    int rc = 1;
    if (!b.rows) {
        fprintf(stderr, "qwenc: bench: out of memory\n");
        return 1;
    }
    for (int k = 0; k < nT; k++)
        if (!bench_threads(&b, T[k], P, nP, N, nN, NP, nNP, DR, nDR)) goto done;
    b.rss = peak_rss(); /* before the bandwidth buffer exists */
    for (int k = 0; k < b.n_cfg; k++) {
        bench_cfg *c = &b.cfg[k];
        if (!c->dev.name[0]) c->bw = read_bandwidth(c->threads);
        c->bound = c->bw > 0 && b.per_tok > 0 ? c->bw / (double)b.per_tok : 0;
    }
    if (o->json)
        print_json(&b);
    else
        print_table(&b);
    rc = 0;
done:
    for (int i = 0; i < b.n_rows; i++) prof_free(b.rows[i].st.prof);
    free(b.rows);
    return rc;
}
