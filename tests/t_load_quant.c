/*
 * t_load_quant.c - quantizing at load (qwenc_model_params.quant, models/load_quant.c) against the GGUF that
 * qwenc_model_save_gguf writes from the same checkpoint at the same type.
 *
 * Per fixture (tests/fixtures/<arch>) and type (Q8_0, Q4_K, IQ4_XS: one per family of block formats, Q4_K
 * also exercising llama-quantize's per-tensor mixture):
 * 1. The tensors converted at load are those of the file, one for one: the same names, types, shapes and
 *    bytes (the quantizers are deterministic, so anything else is a bug in the plan or the binding).
 * 2. The logits are bit-identical to those of the GGUF, fed all at once and token by token (the same bytes
 *    bound the same way run through the same kernels).
 * 3. qwenc_model_weight_bytes counts the converted bytes, which equal the GGUF's tensor data.
 * Then: the progress callback (every tensor reported, bytes_done reaching bytes_total), cancelling from it,
 * an unknown type (an error naming the valid ones, before anything is read), and a .gguf requantized at load
 * equal to the file qwenc quantize writes from it. The bundled model is checked through the CLI
 * (tests/cli_quant.sh: logits and perplexity).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/model.h"
#include "qwenc.h"
#include "test_util.h"

static char tmpdir[512];

static qwenc_model *load(const char *path, const char *quant) {
    char err[1024];
    qwenc_model *m = NULL;
    qwenc_model_params mp = qwenc_model_default_params();
    mp.n_threads = 2;
    mp.quant = quant;
    if (qwenc_model_load_params(path, &mp, &m, err, sizeof(err))) {
        CHECK(0, "load %s --quant %s: %s", path, quant ? quant : "(none)", err);
        return NULL;
    }
    return m;
}

static int save(const qwenc_model *m, const char *path, const char *type) {
    char err[1024];
    qwenc_gguf_params p = qwenc_gguf_default_params();
    p.type = type;
    p.n_threads = 2;
    qwenc_status st = qwenc_model_save_gguf(m, path, &p, err, sizeof(err));
    CHECK(st == QWENC_OK, "save %s as %s: %s", path, type, err);
    return st == QWENC_OK;
}

/* Every converted tensor equals the file's of that name; the counts agree. */
static void check_same_tensors(const qwenc_model *m, const char *gguf_path, const char *label) {
    qw_gguf g;
    char err[1024];
    memset(&g, 0, sizeof(g));
    if (qw_gguf_open(&g, gguf_path, err, sizeof(err))) {
        CHECK(0, "open %s: %s", gguf_path, err);
        return;
    }
    const qw_converted *c = m->conv;
    CHECK(c && c->n_tensors == g.n_tensors, "%s: %d tensors converted, the file has %lld", label,
          c ? c->n_tensors : -1, (long long)g.n_tensors);
    int bad = 0;
    uint64_t file_bytes = 0;
    for (int64_t i = 0; i < g.n_tensors; i++) file_bytes += g.tensors[i].nbytes;
    for (int i = 0; c && i < c->n_tensors; i++) {
        const qw_tensor *a = &c->tensors[i];
        const qw_gguf_tensor *b = qw_gguf_find_info(&g, a->name);
        size_t nb = qw_type_row_size(a->type, qw_tensor_nelem(a));
        int same = b && b->t.type == a->type && b->t.n_dims == a->n_dims && b->nbytes == nb &&
                   memcmp(a->shape, b->t.shape, (size_t)a->n_dims * sizeof(int64_t)) == 0 &&
                   memcmp(a->data, b->t.data, nb) == 0;
        if (!same && bad++ < 3)
            CHECK(0, "%s: tensor %s (%s) differs from the file's (%s)", label, a->name, qw_type_name(a->type),
                  b ? qw_type_name(b->t.type) : "missing");
    }
    CHECK(bad == 0, "%s: %d tensors differ from the file's", label, bad);
    int64_t total = 0;
    qwenc_model_weight_bytes(m, &total, NULL);
    CHECK(c && (uint64_t)total == c->n_bytes && c->n_bytes == file_bytes,
          "%s: weight bytes %lld, converted %llu, file %llu", label, (long long)total,
          (unsigned long long)(c ? c->n_bytes : 0), (unsigned long long)file_bytes);
    qw_gguf_free(&g);
}

/* Logits of a and b fed the same tokens in the same steps are bit-identical. */
static void check_same_logits(const qwenc_model *a, const qwenc_model *b, const int32_t *ids, int n, int batch,
                              const char *label) {
    int V = qwenc_model_n_vocab(a);
    float *la = test_run_model(a, ids, n, batch), *lb = test_run_model(b, ids, n, batch);
    CHECK(la && lb && memcmp(la, lb, (size_t)n * V * sizeof(float)) == 0, "%s (batch %d): logits differ", label, batch);
    free(la);
    free(lb);
}

static void test_model(const char *dir, const char *name, const int32_t *ids, int n) {
    static const char *types[] = {"Q8_0", "Q4_K", "IQ4_XS"};
    qwenc_model *src = load(dir, NULL);
    if (!src) return;
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        char path[1100], label[256];
        snprintf(path, sizeof(path), "%s/%s.%s.gguf", tmpdir, name, types[k]);
        snprintf(label, sizeof(label), "%s --quant %s", name, types[k]);
        qwenc_model *q = load(dir, types[k]), *f = NULL;
        if (q && save(src, path, types[k]) && (f = load(path, NULL))) {
            check_same_tensors(q, path, label);
            check_same_logits(q, f, ids, n, n, label);
            check_same_logits(q, f, ids, n, 1, label);
            printf("  %-14s %-7s %3d tensors, %.2f MiB: the file's bytes and logits\n", name, types[k],
                   q->conv->n_tensors, (double)q->conv->n_bytes / 1048576.0);
        }
        qwenc_model_free(q);
        qwenc_model_free(f);
        unlink(path);
    }
    qwenc_model_free(src);
}

typedef struct {
    int calls, last_i, n_tensors, order_ok, cancel_after;
    uint64_t done, total;
} progress_log;

static int on_progress(const char *tensor, const char *type, int i, int n, uint64_t done, uint64_t total, void *user) {
    progress_log *p = user;
    p->order_ok &= tensor && type && i >= p->last_i && i < n && done >= p->done && done <= total;
    p->calls++;
    p->last_i = i;
    p->n_tensors = n;
    p->done = done;
    p->total = total;
    return p->cancel_after && p->calls >= p->cancel_after;
}

static void test_progress_and_errors(const char *dir) {
    char err[1024];
    qwenc_model *m = NULL;
    qwenc_model_params mp = qwenc_model_default_params();
    progress_log log = {.last_i = 0, .order_ok = 1};
    mp.quant = "q4_k"; /* any case */
    mp.progress = on_progress;
    mp.progress_user = &log;
    qwenc_status st = qwenc_model_load_params(dir, &mp, &m, err, sizeof(err));
    CHECK(st == QWENC_OK, "load with progress: %s", err);
    if (m) {
        CHECK(log.calls >= m->conv->n_tensors && log.n_tensors == m->conv->n_tensors && log.last_i == log.n_tensors - 1,
              "progress: %d calls, last tensor %d of %d", log.calls, log.last_i, log.n_tensors);
        CHECK(log.order_ok && log.done == log.total && log.total == m->conv->n_bytes,
              "progress: bytes %llu of %llu, converted %llu", (unsigned long long)log.done,
              (unsigned long long)log.total, (unsigned long long)m->conv->n_bytes);
        CHECK(!strcmp(m->params.quant, "Q4_K"), "params.quant reads \"%s\"", m->params.quant);
    }
    qwenc_model_free(m);

    progress_log stop = {.order_ok = 1, .cancel_after = 3};
    mp.progress_user = &stop;
    m = NULL;
    st = qwenc_model_load_params(dir, &mp, &m, err, sizeof(err));
    CHECK(st == QWENC_ERR_ARG && !m && strstr(err, "cancelled") && stop.calls == 3,
          "cancelled load: status %d, %d calls, \"%s\"", st, stop.calls, err);
    qwenc_model_free(m);

    mp.quant = "Q3_K";
    mp.progress = NULL;
    st = qwenc_model_load_params("/nonexistent", &mp, &m, err, sizeof(err));
    CHECK(st == QWENC_ERR_ARG && strstr(err, "\"Q3_K\"") && strstr(err, "Q8_0") && strstr(err, "IQ4_XS"),
          "unknown type: status %d, \"%s\" (the type is checked before the path)", st, err);
}

/* A .gguf quantized at load is the file qwenc quantize writes from it. */
static void test_gguf_source(const char *dir, const int32_t *ids, int n) {
    char f32[1100], q4[1100];
    snprintf(f32, sizeof(f32), "%s/src.F32.gguf", tmpdir);
    snprintf(q4, sizeof(q4), "%s/src.Q4_K.gguf", tmpdir);
    qwenc_model *src = load(dir, NULL), *g = NULL, *q = NULL, *f = NULL;
    if (src && save(src, f32, "F32") && (g = load(f32, NULL)) && save(g, q4, "Q4_K") && (q = load(f32, "Q4_K")) &&
        (f = load(q4, NULL))) {
        check_same_tensors(q, q4, "F32 gguf --quant Q4_K");
        check_same_logits(q, f, ids, n, n, "F32 gguf --quant Q4_K");
    }
    qwenc_model_free(src);
    qwenc_model_free(g);
    qwenc_model_free(q);
    qwenc_model_free(f);
    unlink(f32);
    unlink(q4);
}


int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    if (!test_make_tmpdir(tmpdir, sizeof(tmpdir), "qwenc-lq")) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    char *names[64];
    int n = test_list_fixtures(root, 0, names, 64);
    CHECK(n >= 0, "cannot open fixture directory %s", root);
    CHECK(n >= 7, "expected at least 7 fixtures in %s, found %d", root, n);
    for (int i = 0; i < n; i++) {
        char dir[1100], tok[1200];
        snprintf(dir, sizeof(dir), "%s/%s", root, names[i]);
        snprintf(tok, sizeof(tok), "%s/tokens.txt", dir);
        int nt = 0;
        int32_t *ids = test_read_tokens(tok, &nt);
        CHECK(ids && nt > 1, "%s: cannot read the tokens", tok);
        if (ids && nt > 1) {
            test_model(dir, names[i], ids, nt);
            if (!strcmp(names[i], "qwen4_exp")) {
                printf("  a .gguf requantized at load; progress, cancelling, errors\n");
                test_gguf_source(dir, ids, nt);
                test_progress_and_errors(dir);
            }
        }
        free(ids);
        free(names[i]);
    }
    rmdir(tmpdir);
    return test_summary();
}
