/*
 * t_nomem.c - out of memory is an error returned to the caller, never an abort, and leaks nothing.
 *
 * The program replaces malloc and its family (glibc lets a program do that; they forward to __libc_malloc...)
 * to count live allocations and to make the k-th allocation after arming fail. Each operation below is run
 * once to count its allocations N, then N times more with allocation k = 1..N failing: every run must return
 * QWENC_OK or QWENC_ERR_NOMEM (cJSON cannot tell running out of memory from a syntax error: a JSON text it failed
 * on is a QWENC_ERR_FORMAT about JSON), with a message naming the input, and leave as many allocations live as before it.
 * Operations: loading a tokenizer.json and a GGUF tokenizer, tokenizing and decoding, opening a GGUF and a
 * safetensors file, writing a GGUF, rendering a chat template. The inputs are seeds of tests/fuzz/corpus.
 *
 * Under AddressSanitizer (make asan) malloc belongs to the sanitizer: the program says so and checks nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "qwenc.h"
#include "test_util.h"
#include "text/tok_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define NOMEM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NOMEM_ASAN 1
#endif
#endif

#ifndef NOMEM_ASAN
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);


static long live;          /* allocations not yet freed */
static long count;         /* allocations since arming */
static long fail_at;       /* the allocation (1-based, since arming) that fails; 0: none */
static int failed;         /* the armed failure happened */

static int should_fail(void) {
    if (!fail_at) return 0;
    if (++count == fail_at) {
        failed = 1;
        errno = ENOMEM;
        return 1;
    }
    return 0;
}

void *malloc(size_t n) {
    if (should_fail()) return NULL;
    void *p = __libc_malloc(n);
    if (p) live++;
    return p;
}

void *calloc(size_t n, size_t s) {
    if (should_fail()) return NULL;
    void *p = __libc_calloc(n, s);
    if (p) live++;
    return p;
}

void *realloc(void *p, size_t n) {
    if (should_fail()) return NULL;
    void *q = __libc_realloc(p, n);
    if (q && !p) live++;
    return q;
}

void free(void *p) {
    if (p) live--;
    __libc_free(p);
}

void *memalign(size_t a, size_t n) {
    if (should_fail()) return NULL;
    void *p = __libc_memalign(a, n);
    if (p) live++;
    return p;
}

void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }

int posix_memalign(void **out, size_t a, size_t n) {
    void *p = memalign(a, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}

/* ------------------------------------------------------------------ the operations */

typedef qwenc_status (*op_fn)(char *err, size_t errlen);

static char tmpdir[600];
static qwenc_tokenizer *tok; /* loaded unarmed, for the tokenize operation */

static char *tok_json, *tok_json_copy;
static size_t tok_json_len;

static qwenc_status op_tokenizer_json(char *err, size_t errlen) {
    memcpy(tok_json_copy, tok_json, tok_json_len + 1); /* qw_tok_from_json rewrites it */
    qwenc_tokenizer *t = NULL;
    qwenc_status st = qw_tok_from_json(tok_json_copy, tok_json_len, "bytelevel_bpe.json", NULL, &t, err, errlen);
    qwenc_tokenizer_free(t);
    return st;
}

static qwenc_status op_tokenizer_gguf(char *err, size_t errlen) {
    qwenc_tokenizer *t = NULL;
    qwenc_status st = qwenc_tokenizer_load("tests/fuzz/corpus/gguf/tok_qwen2.gguf", &t, err, errlen);
    qwenc_tokenizer_free(t);
    return st;
}

static qwenc_status op_tokenize(char *err, size_t errlen) {
    static const char text[] = "<|endoftext|> Hello  world\tit's \xc3\xa9t\xc3\xa9 \xef\xbc\xa1 12345 <sep> x <mask>y\xff\xfe z";
    int32_t *ids = NULL;
    int n = 0;
    qwenc_status st = qwenc_tokenize(tok, text, sizeof(text) - 1, 1, 1, &ids, &n, err, errlen);
    if (!st) {
        char *out = NULL;
        size_t len = 0;
        st = qwenc_detokenize(tok, ids, n, 0, &out, &len, err, errlen);
        free(out);
        qwenc_detok *d = qwenc_detok_new(tok, 1);
        if (d) {
            const char *piece;
            for (int i = 0; i < n; i++) qwenc_detok_push(d, ids[i], &piece);
            qwenc_detok_flush(d, &piece);
            qwenc_detok_free(d);
        }
    }
    free(ids);
    return st;
}

static qwenc_status op_gguf_open(char *err, size_t errlen) {
    qw_gguf g;
    qwenc_status st = qw_gguf_open(&g, "tests/fuzz/corpus/gguf/all_types.gguf", err, errlen);
    if (!st) qw_gguf_free(&g);
    return st;
}

static qwenc_status op_safetensors(char *err, size_t errlen) {
    qw_weightset ws;
    memset(&ws, 0, sizeof(ws));
    qwenc_status st = qw_weightset_add_file(&ws, "tests/fuzz/corpus/safetensors/qwen4_exp_like.safetensors", err, errlen);
    qw_weightset_free(&ws);
    return st;
}

static qwenc_status op_gguf_write(char *err, size_t errlen) {
    char path[700];
    snprintf(path, sizeof(path), "%s/w.gguf", tmpdir);
    qw_gguf_writer *w = NULL;
    qwenc_status st = qw_gguf_writer_open(&w, path, err, errlen);
    if (st) return st;
    static const char *const strs[] = {"a", "bc"};
    static const int32_t ints[] = {1, 2, 3};
    qw_gguf_writer_set_str(w, "general.architecture", "qwen3");
    qw_gguf_writer_set_arr_str(w, "strs", strs, 2);
    qw_gguf_writer_set_arr(w, "ints", QW_GGUF_I32, ints, 3);
    qw_gguf_writer_set_u32(w, "n", 7);
    int64_t shape[2] = {2, 32};
    float data[64] = {0};
    st = qw_gguf_writer_add_tensor(w, "t", QW_TYPE_F32, 2, shape, err, errlen);
    if (!st) st = qw_gguf_writer_write(w, data, sizeof(data), err, errlen);
    if (st) {
        qw_gguf_writer_abort(w);
    } else {
        st = qw_gguf_writer_close(w, err, errlen);
    }
    if (st) CHECK(access(path, F_OK) != 0, "a failed GGUF write left %s behind", path);
    remove(path);
    return st;
}

static char *tmpl, *request;

static qwenc_status op_chat_render(char *err, size_t errlen) {
    char *out = NULL;
    qwenc_status st = qwenc_chat_render(tmpl, request, 1, 1, NULL, "<|im_end|>", &out, err, errlen);
    free(out);
    return st;
}

/* Run op with each of its allocations failing in turn. */
static void sweep(const char *name, op_fn op, const char *names_input) {
    char err[1024];
    op(err, sizeof(err)); /* warm up: one-time allocations of the libraries */
    long base = live;
    fail_at = (long)1 << 60;
    count = 0;
    err[0] = 0;
    qwenc_status st = op(err, sizeof(err));
    long n = count;
    fail_at = 0;
    CHECK(st == QWENC_OK && live == base, "%s: without failures: status %d (%s), %ld allocations left", name, (int)st,
          err, live - base);
    int bad = 0, nomem = 0, json = 0;
    for (long k = 1; k <= n; k++) {
        fail_at = k;
        count = 0;
        failed = 0;
        err[0] = 0;
        st = op(err, sizeof(err));
        fail_at = 0;
        int ok = (st == QWENC_OK || st == QWENC_ERR_NOMEM || (st == QWENC_ERR_FORMAT && strstr(err, "JSON"))) &&
                 (st == QWENC_OK || strstr(err, names_input)) && live == base;
        nomem += st == QWENC_ERR_NOMEM;
        json += st == QWENC_ERR_FORMAT;
        if (!ok && bad++ < 5)
            printf("  %s: allocation %ld of %ld failing: status %d, '%s', %ld allocations left\n", name, k, n, (int)st, err,
                   live - base);
        live = base; /* one leak is reported once */
    }
    CHECK(bad == 0, "%s: %d of %ld allocation failures mishandled", name, bad, n);
    CHECK(n == 0 || nomem > 0, "%s: no allocation failure was reported as QWENC_ERR_NOMEM", name);
    printf("%-18s %5ld allocations, each failing in turn: %d out-of-memory errors, %d JSON errors (cJSON), %ld "
           "recovered\n", name, n, nomem, json, n - nomem - json);
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/qwenc_t_nomem_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        printf("cannot create a directory under %s\n0 passed, 1 failed\n", t && *t ? t : "/tmp");
        return 1;
    }
    char err[1024];
    if (qwenc_tokenizer_load("tests/tokenizers/bytelevel_bpe", &tok, err, sizeof(err))) {
        printf("FAIL %s\n", err);
        return 1;
    }
    tok_json = (char *)test_read_all("tests/fuzz/corpus/tokenizer_json/bytelevel_bpe.json", &tok_json_len);
    tok_json_copy = tok_json ? malloc(tok_json_len + 1) : NULL;
    tmpl = (char *)test_read_all("tests/templates/qwen3.jinja", NULL);
    request = (char *)test_read_all("tests/templates/conversations/tool_call_obj.json", NULL);
    CHECK(tmpl && request, "cannot read the template fixtures");
    CHECK(tok_json && tok_json_copy, "cannot read the tokenizer seed");
    if (tok_json_copy) sweep("tokenizer.json", op_tokenizer_json, "bytelevel_bpe.json");
    sweep("GGUF tokenizer", op_tokenizer_gguf, "tok_qwen2.gguf");
    sweep("tokenize, decode", op_tokenize, "tokenize");
    sweep("GGUF open", op_gguf_open, "all_types.gguf");
    sweep("GGUF write", op_gguf_write, "w.gguf");
    sweep("safetensors open", op_safetensors, "qwen4_exp_like.safetensors");
    if (tmpl && request) sweep("chat template", op_chat_render, "chat template");
    qwenc_tokenizer_free(tok);
    free(tmpl);
    free(request);
    free(tok_json);
    free(tok_json_copy);
    rmdir(tmpdir);
    return test_summary();
}

#else

int main(void) {
    printf("t_nomem: SKIP under AddressSanitizer, which owns malloc (make test runs these checks)\n");
    return test_summary();
}

#endif
