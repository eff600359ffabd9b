/*
 * fuzz_gguf.c - fuzz target: a GGUF file (formats/gguf.c: header, metadata, tensor infos, offsets), and,
 * when it has tokenizer.* metadata, the tokenizer read from it (text/tok_gguf.c).
 *
 * Properties: a file is either refused with a message naming it, or every metadata value and tensor it
 * describes can be read within the file (accessors, tensor data inside the mapping, lookup by name finds
 * each tensor and key); a tokenizer read from it passes fuzz_tok.h's checks.
 */
#include "fuzz_tok.h"
#include "formats/gguf.h"

static void walk_kv(const qw_gguf *g, const qw_gguf_kv *kv) {
    char err[512];
    FZ_CHECK(qw_gguf_find_kv(g, kv->key) == kv, "key '%s' not found by its name", kv->key);
    if (kv->type == QW_GGUF_STRING) {
        const char *s = NULL;
        FZ_CHECK(qw_gguf_get_str(g, kv->key, &s, err, sizeof(err)) == QWENC_OK && s, "%s", err);
        return;
    }
    if (kv->type == QW_GGUF_ARRAY) {
        const qw_gguf_kv *a = NULL;
        FZ_CHECK(qw_gguf_get_arr(g, kv->key, -1, &a, err, sizeof(err)) == QWENC_OK && a == kv, "%s", err);
        uint64_t n = kv->n < 4096 ? kv->n : 4096;
        volatile double sum = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (kv->arr_type == QW_GGUF_STRING) sum += (double)strlen(qw_gguf_arr_str(kv, i));
            else sum += qw_gguf_arr_f64(kv, i) + (double)qw_gguf_arr_i64(kv, i);
        }
        if (kv->n) { /* the last element too */
            if (kv->arr_type == QW_GGUF_STRING) sum += (double)strlen(qw_gguf_arr_str(kv, kv->n - 1));
            else sum += qw_gguf_arr_f64(kv, kv->n - 1);
        }
        (void)sum;
        return;
    }
    /* a scalar: every getter either reads it or refuses it with a message */
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    int b;
    volatile double v = qw_gguf_kv_f64(kv) + (double)qw_gguf_kv_i64(kv);
    (void)v;
    qwenc_status st[6] = {
        qw_gguf_get_u32(g, kv->key, &u32, err, sizeof(err)), qw_gguf_get_i32(g, kv->key, &i32, err, sizeof(err)),
        qw_gguf_get_u64(g, kv->key, &u64, err, sizeof(err)), qw_gguf_get_i64(g, kv->key, &i64, err, sizeof(err)),
        qw_gguf_get_f32(g, kv->key, &f, err, sizeof(err)),   qw_gguf_get_bool(g, kv->key, &b, err, sizeof(err)),
    };
    for (int k = 0; k < 6; k++) FZ_CHECK(st[k] == QWENC_OK || st[k] == QWENC_ERR_FORMAT, "getter %d: status %d", k, st[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_as_file(data, size);
    char err[1024] = "";
    qw_gguf g;
    qwenc_status st = qw_gguf_open(&g, path, err, sizeof(err));
    fz_note("gguf", st, err);
    if (st) {
        FZ_CHECK_ERR(st, err, path);
        qw_gguf_free(&g);
        return 0;
    }
    FZ_CHECK(g.file.size == size, "mapped %zu bytes of %zu", g.file.size, size);
    for (int64_t i = 0; i < g.n_kv; i++) walk_kv(&g, &g.kv[i]);
    const uint8_t *lo = g.file.data, *hi = g.file.data + g.file.size;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const qw_gguf_tensor *t = &g.tensors[i];
        FZ_CHECK(qw_gguf_find(&g, t->name) == &t->t && qw_gguf_find_info(&g, t->name) == t, "tensor '%s' not found",
                 t->name);
        FZ_CHECK(t->nbytes == 0 || ((const uint8_t *)t->t.data >= lo && t->nbytes <= (uint64_t)(hi - (const uint8_t *)t->t.data)),
                 "tensor '%s' data outside the file", t->name);
        if (t->nbytes) {
            volatile uint8_t x = ((const uint8_t *)t->t.data)[0] ^ ((const uint8_t *)t->t.data)[t->nbytes - 1];
            (void)x;
        }
    }
    int has_tok = qw_gguf_find_kv(&g, "tokenizer.ggml.model") != NULL;
    qw_gguf_free(&g);
    if (has_tok) {
        qwenc_tokenizer *tok = NULL;
        err[0] = 0;
        st = qwenc_tokenizer_load(path, &tok, err, sizeof(err));
        fz_note("tokenizer", st, err);
        if (st) FZ_CHECK_ERR(st, err, path);
        else fz_tok_exercise(tok);
        qwenc_tokenizer_free(tok);
    }
    return 0;
}
