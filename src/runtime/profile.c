/*
 * profile.c - the timing backend of profile.h.
 *
 * Entries 0 .. n_fn-1 are the backend's functions in the order of qw_backend_op_names (matmul's and
 * matmul_batch's stay empty), then "between ops" and "matmul (other)"; matmul entries follow, one per
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

#define MAX_FN 64
#define MAX_DEPTH 16 /* calls nested in calls */

typedef struct {
    char name[LABEL_LEN];
    int64_t calls, bytes;
    double s;
} prof_entry;

struct qw_prof {
    qw_backend *be; /* the interposer the forward runs with */
    const qw_backend *inner; /* a device backend's ops are asynchronous: each is waited for before it is timed */
    prof_entry e[PROF_MAX];
    int n, n_fn, e_between, e_mm_other;
    const char *map_name[PROF_MAP];
    int8_t map_type[PROF_MAP];
    int16_t map_val[PROF_MAP];
    int map_used;
    double ops_s, wall_s; /* the outermost calls' time, every step's */
    int64_t tokens, steps;
    /* the calls in progress: a composite op's own calls nest inside it */
    int depth;
    double t0[MAX_DEPTH], child_s[MAX_DEPTH];
};

double qw_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void add(qw_prof *p, int i, double s, int64_t bytes) {
    p->e[i].calls++;
    p->e[i].s += s;
    p->e[i].bytes += bytes;
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
    int i = p->e_mm_other + 1;
    while (i < p->n && strcmp(p->e[i].name, label)) i++;
    if (i == p->n) {
        if (p->n < PROF_MAX) {
            memcpy(p->e[p->n++].name, label, LABEL_LEN);
        } else {
            i = p->e_mm_other;
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

/* ---- the hooks: each call timed on the calling thread; a call's own time excludes the calls nested in it */

static int p_enter(void *user, int op) {
    (void)op;
    qw_prof *p = user;
    QW_ASSERT(p->depth < MAX_DEPTH);
    p->child_s[p->depth] = 0;
    p->t0[p->depth++] = qw_prof_now();
    return 1;
}

static void p_leave(void *user, int op, const qw_matmul_job *jobs, int n_jobs) {
    qw_prof *p = user;
    if (!p->inner->host_memory) p->inner->sync(p->inner);
    int d = --p->depth;
    double s = qw_prof_now() - p->t0[d], own = s - p->child_s[d];
    if (d > 0) p->child_s[d - 1] += s;
    else p->ops_s += s;
    if (!jobs) {
        add(p, op, own, 0);
        return;
    }
    /* a batch's time is shared among its jobs by the bytes of weights they read */
    int64_t all = 0;
    for (int j = 0; j < n_jobs; j++) all += weight_bytes(jobs[j].w);
    for (int j = 0; j < n_jobs; j++) {
        int64_t b = weight_bytes(jobs[j].w);
        add(p, entry_of(p, jobs[j].w), all > 0 ? own * (double)b / (double)all : own / n_jobs, b);
    }
}

size_t qw_prof_size(void) { return sizeof(qw_prof); }

qw_prof *qw_prof_new(const qw_backend *inner) {
    qw_prof *p = qw_calloc(1, sizeof(*p));
    if (!p) return NULL;
    qw_backend_hooks h = {.enter = p_enter, .leave = p_leave, .user = p};
    p->inner = inner;
    if (!(p->be = qw_backend_interpose(inner, &h))) {
        free(p);
        return NULL;
    }
    qw_backend_op_names(&p->n_fn);
    QW_ASSERT(p->n_fn + 2 < PROF_MAX && p->n_fn <= MAX_FN);
    p->e_between = p->n_fn;
    p->e_mm_other = p->n_fn + 1;
    qw_prof_reset(p);
    return p;
}

void qw_prof_free(qw_prof *p) {
    if (!p) return;
    p->be->release(p->be);
    free(p);
}

const qw_backend *qw_prof_backend(qw_prof *p) { return p->be; }

void qw_prof_reset(qw_prof *p) {
    memset(p->e, 0, sizeof(p->e));
    memset(p->map_name, 0, sizeof(p->map_name));
    p->map_used = 0;
    const char *const *names = qw_backend_op_names(NULL);
    for (int i = 0; i < p->n_fn; i++) snprintf(p->e[i].name, LABEL_LEN, "%s", names[i]);
    snprintf(p->e[p->e_between].name, LABEL_LEN, "between ops (the model's own code)");
    snprintf(p->e[p->e_mm_other].name, LABEL_LEN, "matmul (other)");
    p->n = p->e_mm_other + 1;
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
        double s = i == p->e_between ? p->wall_s - p->ops_s : p->e[i].s;
        int64_t calls = i == p->e_between ? p->steps : p->e[i].calls;
        if (calls == 0) continue;
        all[n++] = (qwenc_profile_entry){.name = p->e[i].name, .calls = calls, .seconds = s > 0 ? s : 0,
                                         .bytes = p->e[i].bytes};
    }
    qsort(all, (size_t)n, sizeof(all[0]), by_time);
    for (int i = 0; i < n && i < max; i++) out[i] = all[i];
    if (tot) *tot = (qwenc_profile_totals){.seconds = p->wall_s, .tokens = p->tokens, .steps = p->steps};
    return n;
}
