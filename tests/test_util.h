/*
 * test_util.h - what every test program shares: the CHECK macro with its pass/fail counters and the
 * closing "N passed, M failed" line (test_check.h), and the helpers of the model tests (listing the fixtures, a scratch
 * directory, reading reference files, comparing logits, running a model in steps). Header-only: each tests/t_*.c is its own program.
 */
#ifndef QW_TEST_UTIL_H
#define QW_TEST_UTIL_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mapfile.h"
#include "qwenc.h"
#include "test_check.h"

static inline int test_cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The fixture directories under root (those holding config.json, or also model.txt, a pointer to a model
 * elsewhere, when with_pointers), sorted by name, at most max; the caller frees the names. -1 if root cannot
 * be opened. */
static inline int test_list_fixtures(const char *root, int with_pointers, char **names, int max) {
    DIR *d = opendir(root);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < max;) {
        if (de->d_name[0] == '.') continue;
        char p[1100], q[1100];
        snprintf(p, sizeof(p), "%s/%s/config.json", root, de->d_name);
        snprintf(q, sizeof(q), "%s/%s/model.txt", root, de->d_name);
        if (access(p, R_OK) == 0 || (with_pointers && access(q, R_OK) == 0)) names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(char *), test_cmp_name);
    return n;
}

/* A new directory $TMPDIR/<tag>-XXXXXX (TMPDIR unset: /tmp) written to buf; prints the failure and returns 0
 * if it cannot be made. */
static inline int test_make_tmpdir(char *buf, size_t len, const char *tag) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, len, "%s/%s-XXXXXX", t && *t ? t : "/tmp", tag);
    if (mkdtemp(buf)) return 1;
    printf("FAIL cannot create a directory under %s\n", t && *t ? t : "/tmp");
    return 0;
}

/* A whole file (NUL-terminated for convenience); NULL if it cannot be read. */
static inline uint8_t *test_read_all(const char *path, size_t *len) {
    char *buf = NULL, err[512];
    if (qw_read_file(path, &buf, len, err, sizeof(err))) return NULL;
    return (uint8_t *)buf;
}

/* A whole little-endian f32 file; *n gets the number of floats. NULL (message printed) on failure. */
static inline float *test_read_f32(const char *path, size_t *n) {
    char *buf = NULL, err[512];
    size_t len = 0;
    if (qw_read_file(path, &buf, &len, err, sizeof(err))) {
        printf("FAIL %s\n", err);
        return NULL;
    }
    *n = len / 4;
    return (float *)buf;
}

/* Comma-separated token ids of a file. */
static inline int32_t *test_read_tokens(const char *path, int *n) {
    char *txt = NULL, err[512];
    *n = 0;
    if (qw_read_file(path, &txt, NULL, err, sizeof(err))) return NULL;
    int cap = 64;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    for (char *p = txt; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (*n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t));
        ids[(*n)++] = (int32_t)v;
        p = end;
    }
    free(txt);
    return ids;
}

typedef struct {
    double rel_l2;        /* ||a - b|| / ||b|| over the whole matrix */
    int argmax_mismatch;  /* rows whose largest logit is at another index */
    int first_mismatch;   /* the first such row, -1 if none */
} test_cmp;

/* Compare two [rows][V] logit matrices (b is the reference). */
static inline test_cmp test_compare_logits(const float *a, const float *b, size_t rows, size_t V) {
    test_cmp r = {0, 0, -1};
    double num = 0, den = 0;
    for (size_t t = 0; t < rows; t++) {
        size_t ia = 0, ib = 0;
        for (size_t v = 0; v < V; v++) {
            double d = (double)a[t * V + v] - b[t * V + v];
            num += d * d;
            den += (double)b[t * V + v] * b[t * V + v];
            if (a[t * V + v] > a[t * V + ia]) ia = v;
            if (b[t * V + v] > b[t * V + ib]) ib = v;
        }
        if (ia != ib) {
            if (r.first_mismatch < 0) r.first_mismatch = (int)t;
            r.argmax_mismatch++;
        }
    }
    r.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return r;
}

/* Feed the tokens to a fresh session `batch` at a time and return every position's logits. */
static inline float *test_run_model(const qwenc_model *m, const int32_t *ids, int n, int batch) {
    char err[512];
    qwenc_session_params sp = {.n_ctx = n, .n_batch = batch};
    qwenc_session *s = NULL;
    if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) {
        printf("FAIL session: %s\n", err);
        return NULL;
    }
    int V = qwenc_model_n_vocab(m);
    float *out = malloc((size_t)n * V * sizeof(float));
    for (int i = 0; i < n; i += batch) {
        int c = batch < n - i ? batch : n - i;
        if (qwenc_session_forward(s, ids + i, c, out + (size_t)i * V, 1, err, sizeof(err))) {
            printf("FAIL forward: %s\n", err);
            free(out);
            out = NULL;
            break;
        }
    }
    qwenc_session_free(s);
    return out;
}

#endif
