/*
 * profile.c - the timing op table of profile.h.
 *
 * Entries 0 .. N_NAMED-1 are the ops other than matmul, in ops.h's order; matmul entries follow, one per
 * label (type + folded name), found through an open-addressing map from the tensor's name string and type
 * (the model's names do not move, and the views of one tensor, e.g. its experts, share its name), so a
 * call costs a hash probe, not a string compare. Labels past PROF_MAX share one "matmul (other)" entry.
 */
#define _GNU_SOURCE
#include "runtime/profile.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/common.h"

#define PROF_MAX 256
/* power of two: the (name, type) pairs seen, several to a label (a layer's, or with a checkpoint that stores
 * every expert apart, an expert's: flash-next has 94 x 512 x 3 of them) */
#define PROF_MAP (1 << 18)
#define LABEL_LEN 96

enum {
    E_GET_ROWS,
    E_RMS_NORM,
    E_L2_NORM,
    E_ROPE,
    E_CONV1D,
    E_SILU,
    E_SIGMOID,
    E_MUL,
    E_AXPY,
    E_ATTENTION,
    E_DELTA_RULE,
    E_BETWEEN, /* the step's wall time less the ops' */
    E_MM_OTHER,
    N_NAMED
};
static const char *const named[N_NAMED] = {"get_rows",  "rms_norm", "l2_norm",   "rope",       "conv1d_dw",
                                           "silu",      "sigmoid",  "mul",       "axpy",       "attention",
                                           "delta_rule", "between ops (the model's own code)", "matmul (other)"};

typedef struct {
    char name[LABEL_LEN];
    int64_t calls, bytes;
    double s;
} prof_entry;

struct qw_prof {
    qw_ops ops; /* first: the table handed to the forward points at the profiler */
    const qw_ops *inner;
    prof_entry e[PROF_MAX];
    int n;
    const char *map_name[PROF_MAP];
    int8_t map_type[PROF_MAP];
    int16_t map_val[PROF_MAP];
    int map_used;
    double ops_s, wall_s; /* every op's time, every step's */
    int64_t tokens, steps;
};

double qw_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static qw_prof *P(const qw_ops *ops) { return (qw_prof *)(uintptr_t)ops; }

static void add(qw_prof *p, int i, double s, int64_t bytes) {
    p->e[i].calls++;
    p->e[i].s += s;
    p->e[i].bytes += bytes;
    p->ops_s += s;
}

/* q8_0, "blk.12.ffn_down_exps.weight" -> "matmul q8_0 blk.#.ffn_down_exps.weight" */
static void label_of(qw_type type, const char *s, char *out) {
    int o = snprintf(out, LABEL_LEN, "matmul %s ", qw_type_name(type));
    for (; *s && o < LABEL_LEN - 1; s++) {
        if (isdigit((unsigned char)*s)) {
            out[o++] = '#';
            while (isdigit((unsigned char)s[1])) s++;
        } else {
            out[o++] = *s;
        }
    }
    out[o] = 0;
}

/* The entry of a weight tensor's matmuls. */
static int entry_of(qw_prof *p, const qw_tensor *w) {
    static const char unnamed[] = "(unnamed)";
    const char *name = w->name ? w->name : unnamed;
    size_t h = (((uintptr_t)name >> 3) ^ (uintptr_t)w->type) * 0x9E3779B97F4A7C15ull >> 40 & (PROF_MAP - 1);
    for (;; h = (h + 1) & (PROF_MAP - 1)) {
        if (p->map_name[h] == name && p->map_type[h] == (int8_t)w->type) return p->map_val[h];
        if (!p->map_name[h]) break;
    }
    char label[LABEL_LEN];
    label_of(w->type, name, label);
    int i = N_NAMED;
    while (i < p->n && strcmp(p->e[i].name, label)) i++;
    if (i == p->n) {
        if (p->n < PROF_MAX) {
            memcpy(p->e[p->n++].name, label, LABEL_LEN);
        } else {
            i = E_MM_OTHER;
        }
    }
    if (p->map_used < PROF_MAP / 2) { /* beyond that, names not mapped take this slow path each time */
        p->map_name[h] = name;
        p->map_type[h] = (int8_t)w->type;
        p->map_val[h] = (int16_t)i;
        p->map_used++;
    }
    return i;
}

static int64_t weight_bytes(const qw_tensor *w) {
    int64_t cols = w->shape[w->n_dims - 1], rows = cols ? qw_tensor_nelem(w) / cols : 0;
    return rows * (int64_t)qw_type_row_size(w->type, cols);
}

/* ---- the wrapped ops */

static void p_matmul(const qw_ops *ops, float *y, const qw_tensor *w, const float *x, int n_tok) {
    qw_prof *p = P(ops);
    double t0 = qw_prof_now();
    p->inner->matmul(p->inner, y, w, x, n_tok);
    add(p, entry_of(p, w), qw_prof_now() - t0, weight_bytes(w));
}

static void p_matmul_batch(const qw_ops *ops, const qw_matmul_job *jobs, int n_jobs) {
    qw_prof *p = P(ops);
    double t0 = qw_prof_now();
    p->inner->matmul_batch(p->inner, jobs, n_jobs);
    double s = qw_prof_now() - t0;
    int64_t all = 0;
    for (int j = 0; j < n_jobs; j++) all += weight_bytes(jobs[j].w);
    for (int j = 0; j < n_jobs; j++) {
        int64_t b = weight_bytes(jobs[j].w);
        add(p, entry_of(p, jobs[j].w), all > 0 ? s * (double)b / (double)all : s / n_jobs, b);
    }
}

#define TIMED(idx, call)                                                                                           \
    do {                                                                                                           \
        qw_prof *p = P(ops);                                                                                       \
        const qw_ops *in = p->inner;                                                                               \
        double t0 = qw_prof_now();                                                                                 \
        call;                                                                                                      \
        add(p, idx, qw_prof_now() - t0, 0);                                                                        \
    } while (0)

static void p_get_rows(const qw_ops *ops, float *y, const qw_tensor *w, const int32_t *ids, int n) {
    TIMED(E_GET_ROWS, in->get_rows(in, y, w, ids, n));
}
static void p_rms_norm(const qw_ops *ops, float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                       int zc) {
    TIMED(E_RMS_NORM, in->rms_norm(in, y, x, w, n_rows, dim, eps, zc));
}
static void p_l2_norm(const qw_ops *ops, float *x, int n_rows, int dim, float eps, float scale) {
    TIMED(E_L2_NORM, in->l2_norm(in, x, n_rows, dim, eps, scale));
}
static void p_rope(const qw_ops *ops, float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot,
                   const float *cs) {
    TIMED(E_ROPE, in->rope(in, x, n_tok, row_stride, n_head, head_stride, n_rot, cs));
}
static void p_conv1d_dw(const qw_ops *ops, float *y, const float *x, const float *w, int n_tok, int ch, int k,
                        int dil) {
    TIMED(E_CONV1D, in->conv1d_dw(in, y, x, w, n_tok, ch, k, dil));
}
static void p_silu(const qw_ops *ops, float *x, int64_t n) { TIMED(E_SILU, in->silu(in, x, n)); }
static void p_sigmoid(const qw_ops *ops, float *x, int64_t n) { TIMED(E_SIGMOID, in->sigmoid(in, x, n)); }
static void p_mul(const qw_ops *ops, float *y, const float *a, const float *b, int64_t n) {
    TIMED(E_MUL, in->mul(in, y, a, b, n));
}
static void p_axpy(const qw_ops *ops, float *y, const float *a, float s, int64_t n) {
    TIMED(E_AXPY, in->axpy(in, y, a, s, n));
}
static void p_attention(const qw_ops *ops, float *out, const float *q, int q_stride, const float *k_cache,
                        const float *v_cache, int n_tok, int pos0, int n_head, int n_head_kv, int hd, float scale,
                        const int32_t *sel, const int32_t *sel_off, double *work) {
    TIMED(E_ATTENTION, in->attention(in, out, q, q_stride, k_cache, v_cache, n_tok, pos0, n_head, n_head_kv, hd, scale,
                                     sel, sel_off, work));
}
static void p_delta_rule(const qw_ops *ops, float *o, float *state, const float *q, const float *k, const float *v,
                         const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv) {
    TIMED(E_DELTA_RULE, in->delta_rule(in, o, state, q, k, v, g, beta, n_tok, hk, hv, dk, dv));
}

size_t qw_prof_size(void) { return sizeof(qw_prof); }

qw_prof *qw_prof_new(const qw_ops *inner) {
    qw_prof *p = qw_calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->inner = inner;
    p->ops = (qw_ops){.name = inner->name,
                      .matmul = p_matmul,
                      .matmul_batch = p_matmul_batch,
                      .get_rows = p_get_rows,
                      .rms_norm = p_rms_norm,
                      .l2_norm = p_l2_norm,
                      .rope = p_rope,
                      .conv1d_dw = p_conv1d_dw,
                      .silu = p_silu,
                      .sigmoid = p_sigmoid,
                      .mul = p_mul,
                      .axpy = p_axpy,
                      .attention = p_attention,
                      .delta_rule = p_delta_rule};
    qw_prof_reset(p);
    return p;
}

void qw_prof_free(qw_prof *p) { free(p); }

const qw_ops *qw_prof_ops(qw_prof *p) { return &p->ops; }

void qw_prof_reset(qw_prof *p) {
    memset(p->e, 0, sizeof(p->e));
    memset(p->map_name, 0, sizeof(p->map_name));
    p->map_used = 0;
    for (int i = 0; i < N_NAMED; i++) snprintf(p->e[i].name, LABEL_LEN, "%s", named[i]);
    p->n = N_NAMED;
    p->ops_s = p->wall_s = 0;
    p->tokens = p->steps = 0;
}

void qw_prof_step(qw_prof *p, int n_tok, double wall_s) {
    p->wall_s += wall_s;
    p->tokens += n_tok;
    p->steps++;
}

static int by_time(const void *a, const void *b) {
    double x = ((const qwenc_profile_entry *)a)->seconds, y = ((const qwenc_profile_entry *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

int qw_prof_read(const qw_prof *p, qwenc_profile_entry *out, int max, qwenc_profile_totals *tot) {
    qwenc_profile_entry all[PROF_MAX];
    int n = 0;
    for (int i = 0; i < p->n; i++) {
        double s = i == E_BETWEEN ? p->wall_s - p->ops_s : p->e[i].s;
        int64_t calls = i == E_BETWEEN ? p->steps : p->e[i].calls;
        if (calls == 0) continue;
        all[n++] = (qwenc_profile_entry){.name = p->e[i].name, .calls = calls, .seconds = s > 0 ? s : 0,
                                         .bytes = p->e[i].bytes};
    }
    qsort(all, (size_t)n, sizeof(all[0]), by_time);
    for (int i = 0; i < n && i < max; i++) out[i] = all[i];
    if (tot) *tot = (qwenc_profile_totals){.seconds = p->wall_s, .tokens = p->tokens, .steps = p->steps};
    return n;
}
