/*
 * t_gguf.c - the GGUF reader and writer.
 *
 *   t_gguf                 run the tests (files go to $TMPDIR, default /tmp, and are removed)
 *   t_gguf --write FILE    write the sample file and print the dump tests/gen/check_gguf_ggml.c prints for it,
 *                          to check that ggml reads what qwenc writes (see that file)
 *
 * 1. A file with metadata of every type (scalars, arrays of numbers, strings, bools, an empty array) and
 *    tensors of several types (float, integer, quantized; 1 to 4 dimensions; one written in odd-sized
 *    pieces) is written, read back and compared: values, types, shapes in both orders, bytes, alignment.
 * 2. The typed getters: conversions that fit, and the errors for a missing key, a wrong type, a value out
 *    of range.
 * 3. Broken files, each an error that names the file and the key or tensor: every truncation of the file,
 *    a bad magic, versions 1 and 4 and a byte-swapped one, an unknown metadata type, an unknown or
 *    unsupported tensor type, offsets past the end or not aligned, counts too large for the file, a row
 *    that is not a whole number of blocks, a bad general.alignment.
 * 4. Writer misuse: duplicate tensors, bad shapes, too much or too little data (the file is removed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "tensor/quant.h"
#include "test_util.h"

static char tmpdir[512];

/* The path of a scratch file in the test's directory, in the caller's buffer. */
static const char *tmp_path(char out[700], const char *name) {
    snprintf(out, 700, "%s/%s", tmpdir, name);
    return out;
}

static void write_all(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

/* ------------------------------------------------------------------ the sample file */

typedef struct {
    const char *name;
    qw_type type;
    int n_dims;
    int64_t shape[4]; /* PyTorch order */
} sample_tensor;

static const sample_tensor sample_tensors[] = {
    {"token_embd.weight", QW_TYPE_Q8_0, 2, {5, 64}},
    {"blk.0.attn_norm.weight", QW_TYPE_F32, 1, {7}},
    {"blk.0.attn_q.weight", QW_TYPE_Q4_K, 2, {3, 512}},
    {"blk.0.ffn_down.weight", QW_TYPE_Q6_K, 2, {2, 256}},
    {"blk.0.ffn_gate_exps.weight", QW_TYPE_Q5_0, 3, {2, 3, 64}},
    {"blk.0.ffn_up_exps.weight", QW_TYPE_IQ4_XS, 3, {2, 1, 256}},
    {"blk.0.conv.weight", QW_TYPE_F16, 4, {2, 1, 3, 5}},
    {"blk.0.ssm_a", QW_TYPE_BF16, 2, {3, 6}},
    {"blk.0.ple.weight", QW_TYPE_Q4_0, 2, {1, 96}},
    {"blk.0.q41.weight", QW_TYPE_Q4_1, 2, {2, 32}},
    {"blk.0.q51.weight", QW_TYPE_Q5_1, 2, {2, 32}},
    {"blk.0.q5k.weight", QW_TYPE_Q5_K, 1, {256}},
    {"blk.0.nl.weight", QW_TYPE_IQ4_NL, 2, {3, 32}},
    {"rope_freqs.weight", QW_TYPE_F32, 1, {1}},
    {"positions", QW_TYPE_I32, 1, {9}},
};
#define N_SAMPLE (int)(sizeof(sample_tensors) / sizeof(sample_tensors[0]))

static int64_t nelem(const sample_tensor *s) {
    int64_t n = 1;
    for (int d = 0; d < s->n_dims; d++) n *= s->shape[d];
    return n;
}

/* The bytes of sample tensor i: random normal values quantized to its type (integers for I32). */
static uint8_t *sample_bytes(int i, size_t *nbytes) {
    const sample_tensor *s = &sample_tensors[i];
    int64_t n = nelem(s);
    *nbytes = s->type == QW_TYPE_I32 ? (size_t)n * 4 : qw_type_row_size(s->type, n);
    uint8_t *b = malloc(*nbytes + 1);
    float *x = malloc((size_t)n * sizeof(float));
    uint64_t st = 0x1234567ull * (uint64_t)(i + 1);
    for (int64_t k = 0; k < n; k++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[k] = (float)((int64_t)(st >> 40) - (1 << 23)) / (float)(1 << 22);
    }
    if (s->type == QW_TYPE_I32)
        for (int64_t k = 0; k < n; k++) {
            int32_t v = (int32_t)(k * 1000 - 3);
            memcpy(b + 4 * k, &v, 4);
        }
    else
        qw_quantize(s->type, x, b, n);
    free(x);
    return b;
}

static const int32_t arr_i32[] = {1, -2, 300000, -2147483647 - 1};
static const float arr_f32[] = {0.5f, -1.25f, 1e-30f, 3.4e38f};
static const uint8_t arr_u8[] = {0, 1, 255};
static const uint8_t arr_bool[] = {1, 0, 1};
static const uint64_t arr_u64[] = {0, 18446744073709551615ull};
static const char *const arr_str[] = {"hello", "", "wörld ✓", "a\nb"};

/* Write the sample file; alignment 0 keeps the default. */
static qwenc_status write_sample(const char *path, uint32_t alignment, char *err, size_t errlen) {
    qw_gguf_writer *w;
    qwenc_status st = qw_gguf_writer_open(&w, path, err, errlen);
    if (st) return st;
    qw_gguf_writer_set_str(w, "general.architecture", "qwen3");
    qw_gguf_writer_set_str(w, "general.name", "sample: ünïcode");
    qw_gguf_writer_set_u8(w, "t.u8", 200);
    qw_gguf_writer_set_i8(w, "t.i8", -100);
    qw_gguf_writer_set_u16(w, "t.u16", 60000);
    qw_gguf_writer_set_i16(w, "t.i16", -30000);
    qw_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    qw_gguf_writer_set_i32(w, "t.i32", -2000000000);
    qw_gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull);
    qw_gguf_writer_set_i64(w, "t.i64", -9000000000000000000ll);
    qw_gguf_writer_set_f32(w, "t.f32", 0.123456789f);
    qw_gguf_writer_set_f64(w, "t.f64", 0.1234567890123456789);
    qw_gguf_writer_set_bool(w, "t.bool", 1);
    qw_gguf_writer_set_bool(w, "t.false", 0);
    qw_gguf_writer_set_str(w, "t.str", "to be replaced");
    qw_gguf_writer_set_str(w, "t.str", "replaced");
    qw_gguf_writer_set_str(w, "t.empty", "");
    qw_gguf_writer_set_arr(w, "t.arr.i32", QW_GGUF_I32, arr_i32, 4);
    qw_gguf_writer_set_arr(w, "t.arr.f32", QW_GGUF_F32, arr_f32, 4);
    qw_gguf_writer_set_arr(w, "t.arr.u8", QW_GGUF_U8, arr_u8, 3);
    qw_gguf_writer_set_arr(w, "t.arr.bool", QW_GGUF_BOOL, arr_bool, 3);
    qw_gguf_writer_set_arr(w, "t.arr.u64", QW_GGUF_U64, arr_u64, 2);
    qw_gguf_writer_set_arr(w, "t.arr.empty", QW_GGUF_I32, NULL, 0);
    qw_gguf_writer_set_arr_str(w, "t.arr.str", arr_str, 4);
    if (alignment) qw_gguf_writer_set_u32(w, "general.alignment", alignment);
    for (int i = 0; i < N_SAMPLE && !st; i++)
        st = qw_gguf_writer_add_tensor(w, sample_tensors[i].name, sample_tensors[i].type, sample_tensors[i].n_dims,
                                       sample_tensors[i].shape, err, errlen);
    for (int i = 0; i < N_SAMPLE && !st; i++) {
        size_t nb;
        uint8_t *b = sample_bytes(i, &nb);
        if (i == 2) { /* in pieces of 7 bytes */
            for (size_t o = 0; o < nb && !st; o += 7) st = qw_gguf_writer_write(w, b + o, nb - o < 7 ? nb - o : 7, err, errlen);
        } else {
            st = qw_gguf_writer_write(w, b, nb, err, errlen);
        }
        free(b);
    }
    if (st) {
        qw_gguf_writer_abort(w);
        return st;
    }
    return qw_gguf_writer_close(w, err, errlen);
}

static uint64_t fnv(const uint8_t *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The dump format of tests/gen/check_gguf_ggml.c: one line per key and per tensor. */
static void dump(const qw_gguf *g, FILE *out) {
    fprintf(out, "version %u alignment %u n_kv %lld n_tensors %lld data_offset %llu\n", g->version, g->alignment,
            (long long)g->n_kv, (long long)g->n_tensors, (unsigned long long)g->data_offset);
    for (int64_t i = 0; i < g->n_kv; i++) {
        const qw_gguf_kv *kv = &g->kv[i];
        fprintf(out, "kv %s %d", kv->key, (int)kv->type);
        if (kv->type == QW_GGUF_STRING) {
            fprintf(out, " '%s'", kv->str);
        } else if (kv->type == QW_GGUF_ARRAY) {
            fprintf(out, " %d [%llu]", (int)kv->arr_type, (unsigned long long)kv->n);
            for (uint64_t k = 0; k < kv->n; k++) {
                if (kv->arr_type == QW_GGUF_STRING)
                    fprintf(out, " '%s'", qw_gguf_arr_str(kv, k));
                else if (kv->arr_type == QW_GGUF_F32 || kv->arr_type == QW_GGUF_F64)
                    fprintf(out, " %.17g", qw_gguf_arr_f64(kv, k));
                else if (kv->arr_type == QW_GGUF_U64)
                    fprintf(out, " %llu", (unsigned long long)qw_gguf_arr_i64(kv, k));
                else
                    fprintf(out, " %lld", (long long)qw_gguf_arr_i64(kv, k));
            }
        } else if (kv->type == QW_GGUF_F32 || kv->type == QW_GGUF_F64) {
            fprintf(out, " %.17g", qw_gguf_kv_f64(kv));
        } else if (kv->type == QW_GGUF_U64) {
            fprintf(out, " %llu", (unsigned long long)qw_gguf_kv_i64(kv));
        } else {
            fprintf(out, " %lld", (long long)qw_gguf_kv_i64(kv));
        }
        fprintf(out, "\n");
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const qw_gguf_tensor *t = &g->tensors[i];
        /* ggml keeps ne[] padded with 1s, not the stored n_dims: print ne without trailing 1s */
        int nd = t->n_dims;
        while (nd > 1 && t->ne[nd - 1] == 1) nd--;
        fprintf(out, "tensor %s %d", t->name, t->ggml_type);
        if (nd == 0) fprintf(out, " 1");
        for (int d = 0; d < nd; d++) fprintf(out, "%s%lld", d ? "," : " ", (long long)t->ne[d]);
        fprintf(out, " offset %llu bytes %llu fnv %016llx\n", (unsigned long long)t->offset,
                (unsigned long long)t->nbytes, (unsigned long long)fnv(t->t.data, t->nbytes));
    }
}

/* ------------------------------------------------------------------ 1, 2: round trip and getters */

static void test_round_trip(uint32_t alignment) {
    char err[512] = "";
    char path_buf[700];
    const char *path = tmp_path(path_buf, alignment ? "a64.gguf" : "sample.gguf");
    qwenc_status st = write_sample(path, alignment, err, sizeof(err));
    CHECK(st == QWENC_OK, "writing the sample: %s", err);
    qw_gguf g;
    st = qw_gguf_open(&g, path, err, sizeof(err));
    CHECK(st == QWENC_OK, "reading the sample back: %s", err);
    if (st) return;
    uint32_t a = alignment ? alignment : 32;
    CHECK(g.version == 3 && g.alignment == a && g.data_offset % a == 0, "version %u alignment %u data offset %llu",
          g.version, g.alignment, (unsigned long long)g.data_offset);
    CHECK(g.n_tensors == N_SAMPLE && g.n_kv == 23 + (alignment != 0), "%lld tensors, %lld keys", (long long)g.n_tensors,
          (long long)g.n_kv);
    for (int i = 0; i < N_SAMPLE; i++) {
        const sample_tensor *s = &sample_tensors[i];
        const qw_tensor *t = qw_gguf_find(&g, s->name);
        const qw_gguf_tensor *info = qw_gguf_find_info(&g, s->name);
        CHECK(t && info && &info->t == t, "tensor %s not found", s->name);
        if (!t) continue;
        int same = t->type == s->type && t->n_dims == s->n_dims && info->n_dims == s->n_dims && !strcmp(t->name, s->name);
        for (int d = 0; d < s->n_dims; d++) same &= t->shape[d] == s->shape[d] && info->ne[d] == s->shape[s->n_dims - 1 - d];
        CHECK(same, "tensor %s: type/shape differ after the round trip", s->name);
        CHECK(info->ggml_type == qw_type_traits_of(s->type)->ggml_type, "tensor %s: ggml type %d", s->name, info->ggml_type);
        size_t nb;
        uint8_t *b = sample_bytes(i, &nb);
        CHECK(info->nbytes == nb && !memcmp(t->data, b, nb), "tensor %s: data differ", s->name);
        CHECK((size_t)((const uint8_t *)t->data - g.file.data) % a == 0, "tensor %s: data not aligned to %u", s->name, a);
        free(b);
    }
    CHECK(!qw_gguf_find(&g, "blk.0.attn_k.weight") && !qw_gguf_find(&g, ""), "missing tensors must not be found");
    /* the quantized tensor reads like any other: rows of the Q4_K [3, 512] tensor dequantize */
    const qw_tensor *q = qw_gguf_find(&g, "blk.0.attn_q.weight");
    if (q) {
        float row[512];
        qw_tensor_to_f32(q, 512, 512, row);
        double ss = 0;
        for (int k = 0; k < 512; k++) ss += row[k] * row[k];
        CHECK(ss > 0 && isfinite(ss), "dequantized row of a GGUF tensor");
    }

    const char *s = NULL;
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float f = 0;
    int b = 0;
    const qw_gguf_kv *kv = NULL;
    CHECK(!qw_gguf_get_str(&g, "general.architecture", &s, err, sizeof(err)) && !strcmp(s, "qwen3"), "architecture");
    CHECK(!qw_gguf_get_str(&g, "general.name", &s, err, sizeof(err)) && !strcmp(s, "sample: ünïcode"), "utf-8 string");
    CHECK(!qw_gguf_get_str(&g, "t.str", &s, err, sizeof(err)) && !strcmp(s, "replaced"), "a key set twice keeps the last");
    CHECK(!qw_gguf_get_str(&g, "t.empty", &s, err, sizeof(err)) && !strcmp(s, ""), "empty string");
    CHECK(!qw_gguf_get_u32(&g, "t.u32", &u32, err, sizeof(err)) && u32 == 4000000000u, "u32");
    CHECK(!qw_gguf_get_u32(&g, "t.u8", &u32, err, sizeof(err)) && u32 == 200, "u8 read as u32");
    CHECK(!qw_gguf_get_i32(&g, "t.i32", &i32, err, sizeof(err)) && i32 == -2000000000, "i32");
    CHECK(!qw_gguf_get_i32(&g, "t.i16", &i32, err, sizeof(err)) && i32 == -30000, "i16 read as i32");
    CHECK(!qw_gguf_get_i32(&g, "t.i8", &i32, err, sizeof(err)) && i32 == -100, "i8 read as i32");
    CHECK(!qw_gguf_get_u32(&g, "t.u16", &u32, err, sizeof(err)) && u32 == 60000, "u16 read as u32");
    CHECK(!qw_gguf_get_u64(&g, "t.u64", &u64, err, sizeof(err)) && u64 == 18000000000000000000ull, "u64");
    CHECK(!qw_gguf_get_i64(&g, "t.i64", &i64, err, sizeof(err)) && i64 == -9000000000000000000ll, "i64");
    CHECK(!qw_gguf_get_i64(&g, "t.u32", &i64, err, sizeof(err)) && i64 == 4000000000ll, "u32 read as i64");
    CHECK(!qw_gguf_get_f32(&g, "t.f32", &f, err, sizeof(err)) && f == 0.123456789f, "f32");
    CHECK(!qw_gguf_get_f32(&g, "t.f64", &f, err, sizeof(err)) && f == (float)0.1234567890123456789, "f64 read as f32");
    CHECK(!qw_gguf_get_bool(&g, "t.bool", &b, err, sizeof(err)) && b == 1, "bool true");
    CHECK(!qw_gguf_get_bool(&g, "t.false", &b, err, sizeof(err)) && b == 0, "bool false");
    kv = qw_gguf_find_kv(&g, "t.f64");
    CHECK(kv && qw_gguf_kv_f64(kv) == 0.1234567890123456789, "f64 exact");
    CHECK(!qw_gguf_get_arr(&g, "t.arr.i32", QW_GGUF_I32, &kv, err, sizeof(err)) && kv->n == 4, "i32 array");
    for (int k = 0; k < 4 && kv; k++) CHECK(qw_gguf_arr_i64(kv, (uint64_t)k) == arr_i32[k], "i32 array element %d", k);
    CHECK(!qw_gguf_get_arr(&g, "t.arr.f32", QW_GGUF_F32, &kv, err, sizeof(err)) && kv->n == 4, "f32 array");
    for (int k = 0; k < 4 && kv; k++) CHECK(qw_gguf_arr_f64(kv, (uint64_t)k) == arr_f32[k], "f32 array element %d", k);
    CHECK(!qw_gguf_get_arr(&g, "t.arr.u8", QW_GGUF_I64, &kv, err, sizeof(err)) && kv->n == 3 && qw_gguf_arr_i64(kv, 2) == 255,
          "u8 array as integers");
    CHECK(!qw_gguf_get_arr(&g, "t.arr.bool", QW_GGUF_BOOL, &kv, err, sizeof(err)) && kv->n == 3 &&
              qw_gguf_arr_i64(kv, 0) == 1 && qw_gguf_arr_i64(kv, 1) == 0,
          "bool array");
    CHECK(!qw_gguf_get_arr(&g, "t.arr.u64", QW_GGUF_U64, &kv, err, sizeof(err)) &&
              (uint64_t)qw_gguf_arr_i64(kv, 1) == 18446744073709551615ull,
          "u64 array");
    CHECK(!qw_gguf_get_arr(&g, "t.arr.empty", -1, &kv, err, sizeof(err)) && kv->n == 0, "empty array");
    CHECK(!qw_gguf_get_arr(&g, "t.arr.str", QW_GGUF_STRING, &kv, err, sizeof(err)) && kv->n == 4, "string array");
    for (int k = 0; k < 4 && kv; k++) CHECK(!strcmp(qw_gguf_arr_str(kv, (uint64_t)k), arr_str[k]), "string %d", k);

    /* errors of the getters name the file and the key */
    err[0] = 0;
    st = qw_gguf_get_u32(&g, "llama.block_count", &u32, err, sizeof(err));
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, path) && strstr(err, "'llama.block_count' is missing"), "missing key: %s", err);
    st = qw_gguf_get_u32(&g, "t.str", &u32, err, sizeof(err));
    CHECK(st && strstr(err, "'t.str' should be u32 but is string"), "wrong type: %s", err);
    st = qw_gguf_get_u32(&g, "t.i8", &u32, err, sizeof(err));
    CHECK(st && strstr(err, "'t.i8' = -100 does not fit in u32"), "negative into u32: %s", err);
    st = qw_gguf_get_i32(&g, "t.u32", &i32, err, sizeof(err));
    CHECK(st && strstr(err, "does not fit in i32"), "u32 too large for i32: %s", err);
    st = qw_gguf_get_f32(&g, "t.i32", &f, err, sizeof(err));
    CHECK(st && strstr(err, "'t.i32' should be f32 but is i32"), "int as f32: %s", err);
    st = qw_gguf_get_str(&g, "t.arr.str", &s, err, sizeof(err));
    CHECK(st && strstr(err, "should be string but is an array of string"), "array as string: %s", err);
    st = qw_gguf_get_arr(&g, "t.arr.f32", QW_GGUF_I64, &kv, err, sizeof(err));
    CHECK(st && strstr(err, "should be an array of integers but is an array of f32"), "float array as ints: %s", err);
    st = qw_gguf_get_bool(&g, "t.u8", &b, err, sizeof(err));
    CHECK(st && strstr(err, "should be bool"), "u8 as bool: %s", err);

    /* metadata carried into a new file with set_kv comes back identical */
    if (!alignment) {
        char copy_buf[700];
    const char *copy = tmp_path(copy_buf, "copy.gguf");
        qw_gguf_writer *w;
        CHECK(!qw_gguf_writer_open(&w, copy, err, sizeof(err)), "open copy: %s", err);
        for (int64_t i = 0; i < g.n_kv; i++) qw_gguf_writer_set_kv(w, &g.kv[i]);
        CHECK(!qw_gguf_writer_close(w, err, sizeof(err)), "close copy: %s", err);
        qw_gguf g2;
        st = qw_gguf_open(&g2, copy, err, sizeof(err));
        CHECK(!st && g2.n_kv == g.n_kv && g2.n_tensors == 0, "reopen copy: %s", err);
        if (!st) {
            char *d1 = NULL, *d2 = NULL;
            size_t l1 = 0, l2 = 0;
            FILE *f1 = open_memstream(&d1, &l1), *f2 = open_memstream(&d2, &l2);
            qw_gguf tmp = g;
            tmp.n_tensors = 0; /* compare the metadata lines only */
            dump(&tmp, f1);
            dump(&g2, f2);
            fclose(f1);
            fclose(f2);
            const char *m1 = strchr(d1, '\n'), *m2 = strchr(d2, '\n'); /* skip the header line */
            CHECK(m1 && m2 && !strcmp(m1, m2), "metadata copied with set_kv differs");
            free(d1);
            free(d2);
            qw_gguf_free(&g2);
        }
        remove(copy);
    }
    qw_gguf_free(&g);
    remove(path);
}

/* ------------------------------------------------------------------ 3. broken files */

/* Open a file made from bytes; expect an error containing each of the given strings. */
static void expect_error(const char *label, const uint8_t *p, size_t n, const char *want1, const char *want2) {
    char path_buf[700];
    const char *path = tmp_path(path_buf, "broken.gguf");
    write_all(path, p, n);
    char err[1024] = "";
    qw_gguf g;
    qwenc_status st = qw_gguf_open(&g, path, err, sizeof(err));
    CHECK(st != QWENC_OK && strstr(err, path) && (!want1 || strstr(err, want1)) && (!want2 || strstr(err, want2)),
          "%s: status %d, message '%s' (expected '%s' and '%s')", label, (int)st, err, want1 ? want1 : "",
          want2 ? want2 : "");
    if (st == QWENC_OK) qw_gguf_free(&g);
    remove(path);
}

/* Offset of the tensor info of name in the file (the byte after its name). */
static size_t info_after_name(const uint8_t *p, size_t n, const char *name) {
    size_t l = strlen(name);
    for (size_t i = 8; i + l <= n; i++) {
        uint64_t len;
        memcpy(&len, p + i - 8, 8);
        if (len == l && !memcmp(p + i, name, l)) return i + l;
    }
    return 0;
}

/* Offset of the value of metadata key name (the byte after its type field). */
static size_t kv_value_at(const uint8_t *p, size_t n, const char *name) {
    size_t at = info_after_name(p, n, name);
    return at ? at + 4 : 0;
}

/* Counts, lengths and shapes that claim more than the file holds are refused, naming the file and the key or
 * tensor, before anything of the claimed size is allocated: the message says how many bytes the claim needs and
 * how many the file has left (a claim of 2^60 elements would otherwise be a 2^63-byte allocation). */
static void test_huge_claims(const uint8_t *good, size_t n, uint8_t *p) {
    const uint64_t huge[] = {1ull << 32, 1ull << 60, UINT64_MAX / 8, UINT64_MAX};
    for (size_t k = 0; k < sizeof(huge) / sizeof(huge[0]); k++) {
        size_t at = kv_value_at(good, n, "t.arr.str"); /* u32 element type, u64 count, the strings */
        CHECK(at > 0, "t.arr.str not found");
        if (!at) return;
        memcpy(p, good, n);
        memcpy(p + at + 4, &huge[k], 8);
        expect_error("string array of a huge count", p, n, "'t.arr.str'", "truncated");
        memcpy(p, good, n);
        memcpy(p + at + 4 + 8, &huge[k], 8); /* the length of its first string */
        expect_error("string in an array of a huge length", p, n, "'t.arr.str'", "truncated");
        at = kv_value_at(good, n, "t.arr.u64");
        memcpy(p, good, n);
        memcpy(p + at + 4, &huge[k], 8);
        expect_error("u64 array of a huge count", p, n, "'t.arr.u64'", "truncated");
        at = kv_value_at(good, n, "general.name"); /* u64 length, the bytes */
        memcpy(p, good, n);
        memcpy(p + at, &huge[k], 8);
        expect_error("string of a huge length", p, n, "'general.name'", "truncated");
        memcpy(p, good, n);
        memcpy(p + 8, &huge[k], 8);
        expect_error("huge tensor count", p, n, "claims", "tensors");
        memcpy(p, good, n);
        memcpy(p + 16, &huge[k], 8);
        expect_error("huge key count", p, n, "claims", "metadata keys");
    }
    /* a shape of 2^62 x 2^62 elements overflows; one of 2^40 x 2^20 needs more bytes than the file has */
    size_t at = info_after_name(good, n, "token_embd.weight"); /* u32 n_dims = 2, ne[0] = 64, ne[1] = 5 */
    CHECK(at > 0, "token_embd.weight not found");
    if (!at) return;
    int64_t ne[2] = {(int64_t)1 << 62, (int64_t)1 << 62};
    memcpy(p, good, n);
    memcpy(p + at + 4, ne, 16);
    expect_error("shape whose element count overflows", p, n, "tensor 'token_embd.weight'", "overflows");
    ne[0] = (int64_t)1 << 40;
    ne[1] = (int64_t)1 << 20;
    memcpy(p, good, n);
    memcpy(p + at + 4, ne, 16);
    expect_error("shape larger than the file", p, n, "tensor 'token_embd.weight'", "extends past the end");
}

static void test_broken(void) {
    char err[512] = "";
    char path_buf[700];
    const char *path = tmp_path(path_buf, "good.gguf");
    if (write_sample(path, 0, err, sizeof(err))) {
        CHECK(0, "cannot write the sample: %s", err);
        return;
    }
    size_t n = 0;
    uint8_t *good = test_read_all(path, &n);
    uint8_t *p = malloc(n);
    qw_gguf g;
    if (qw_gguf_open(&g, path, err, sizeof(err))) {
        CHECK(0, "cannot read the sample: %s", err);
        free(good);
        free(p);
        return;
    }
    uint64_t data_end = 0, header_end = 0;
    const qw_gguf_tensor *last = &g.tensors[g.n_tensors - 1];
    data_end = g.data_offset + last->offset + last->nbytes;
    header_end = g.data_offset;
    qw_gguf_free(&g);

    /* every truncation of the header, and truncations inside the data, fail; the message names the file,
     * and for the data the tensor that no longer fits */
    int bad_header = 0, bad_data = 0;
    char bpath_buf[700];
    const char *bpath = tmp_path(bpath_buf, "trunc.gguf");
    for (size_t len = 0; len < data_end; len += len < header_end ? 1 : 61) {
        write_all(bpath, good, len);
        qw_gguf t;
        err[0] = 0;
        qwenc_status st = qw_gguf_open(&t, bpath, err, sizeof(err));
        if (st == QWENC_OK) {
            qw_gguf_free(&t);
            ++*(len < header_end ? &bad_header : &bad_data);
            printf("  truncated at %zu of %zu bytes: opened without error\n", len, n);
        } else if (!strstr(err, bpath) || (len >= header_end && !strstr(err, "tensor '")) ||
                   (len > 24 && len < header_end && !strstr(err, "truncated"))) {
            ++*(len < header_end ? &bad_header : &bad_data);
            printf("  truncated at %zu: message '%s'\n", len, err);
        }
    }
    remove(bpath);
    CHECK(bad_header == 0, "%d truncations of the header were not reported properly", bad_header);
    CHECK(bad_data == 0, "%d truncations of the data were not reported properly", bad_data);
    expect_error("data truncated by one byte", good, (size_t)data_end - 1, "tensor 'positions'", "truncated");

    memcpy(p, good, n);
    memcpy(p, "GGUX", 4);
    expect_error("bad magic", p, n, "not a GGUF file", "'GGUX'");
    expect_error("empty file", p, 0, "empty", NULL);

    uint32_t v = 2; /* version 2 has the same layout as 3 (3 only added big-endian files) */
    memcpy(p, good, n);
    memcpy(p + 4, &v, 4);
    char v2path_buf[700];
    const char *v2path = tmp_path(v2path_buf, "v2.gguf");
    write_all(v2path, p, n);
    qw_gguf g2;
    qwenc_status st2 = qw_gguf_open(&g2, v2path, err, sizeof(err));
    CHECK(st2 == QWENC_OK && g2.version == 2 && g2.n_tensors == N_SAMPLE, "a version 2 file: %s", err);
    if (!st2) qw_gguf_free(&g2);
    remove(v2path);
    v = 1;
    memcpy(p + 4, &v, 4);
    expect_error("version 1", p, n, "version 1 is not supported", NULL);
    v = 4;
    memcpy(p + 4, &v, 4);
    expect_error("version 4", p, n, "version 4 is not supported", NULL);
    v = 0x03000000;
    memcpy(p + 4, &v, 4);
    expect_error("byte-swapped version", p, n, "big-endian", NULL);

    uint64_t huge = 1ull << 60;
    memcpy(p, good, n);
    memcpy(p + 8, &huge, 8);
    expect_error("tensor count too large", p, n, "claims", NULL);
    memcpy(p, good, n);
    memcpy(p + 16, &huge, 8);
    expect_error("key count too large", p, n, "claims", NULL);

    /* the first key (general.architecture): its type field follows the 8 + 20 bytes of the key */
    memcpy(p, good, n);
    v = 13;
    memcpy(p + 24 + 8 + 20, &v, 4);
    expect_error("unknown metadata type", p, n, "'general.architecture'", "unknown value type 13");
    memcpy(p, good, n);
    memcpy(p + 24 + 8 + 20 + 4, &huge, 8);
    expect_error("string length past the end", p, n, "'general.architecture'", "truncated");
    memcpy(p, good, n);
    memcpy(p + 24 + 8 + 4, "alignment\0", 10); /* "general.architecture" -> "general.alignment\0..." */
    expect_error("key with a NUL byte", p, n, "NUL", NULL);
    test_huge_claims(good, n, p);

    /* tensor infos: name, n_dims u32, ne[n_dims] i64, type u32, offset u64 */
    size_t at = info_after_name(good, n, "blk.0.attn_q.weight");
    CHECK(at > 0, "tensor info not found in the file");
    if (at) {
        memcpy(p, good, n);
        v = 99;
        memcpy(p + at + 4 + 2 * 8, &v, 4);
        expect_error("unknown tensor type", p, n, "tensor 'blk.0.attn_q.weight'", "unknown ggml type 99");
        v = 10;
        memcpy(p + at + 4 + 2 * 8, &v, 4);
        expect_error("unsupported tensor type", p, n, "tensor 'blk.0.attn_q.weight'", "q2_K (ggml type 10)");
        memcpy(p, good, n);
        uint64_t off = 1ull << 40;
        memcpy(p + at + 4 + 2 * 8 + 4, &off, 8);
        expect_error("offset past the end", p, n, "tensor 'blk.0.attn_q.weight'", "extends past the end");
        off = 0xFFFFFFFFFFFFFFE0ull;
        memcpy(p + at + 4 + 2 * 8 + 4, &off, 8);
        expect_error("offset near 2^64", p, n, "tensor 'blk.0.attn_q.weight'", "extends past the end");
        off = 40;
        memcpy(p + at + 4 + 2 * 8 + 4, &off, 8);
        expect_error("offset not aligned", p, n, "tensor 'blk.0.attn_q.weight'", "not a multiple of the alignment 32");
        memcpy(p, good, n);
        int64_t ne0 = 500;
        memcpy(p + at + 4, &ne0, 8);
        expect_error("row not a whole number of blocks", p, n, "tensor 'blk.0.attn_q.weight'", "not a multiple of its block of 256");
        ne0 = -1;
        memcpy(p + at + 4, &ne0, 8);
        expect_error("negative dimension", p, n, "tensor 'blk.0.attn_q.weight'", "dimension 0 of size -1");
        memcpy(p, good, n);
        v = 9;
        memcpy(p + at, &v, 4);
        expect_error("too many dimensions", p, n, "tensor 'blk.0.attn_q.weight'", "9 dimensions");
    }
    size_t a51 = info_after_name(good, n, "blk.0.q51.weight");
    CHECK(a51 > 0, "tensor info of blk.0.q51.weight not found");
    if (a51) { /* rename it to the name of the tensor before it */
        memcpy(p, good, n);
        memcpy(p + a51 - 16, "blk.0.q41.weight", 16);
        expect_error("duplicate tensor name", p, n, "tensor 'blk.0.q41.weight' appears twice", NULL);
    }
    free(good);
    free(p);
    remove(path);

    /* general.alignment of the wrong type or not a power of two */
    char apath_buf[700];
    const char *apath = tmp_path(apath_buf, "align.gguf");
    for (int k = 0; k < 2; k++) {
        qw_gguf_writer *w;
        qw_gguf_writer_open(&w, apath, err, sizeof(err));
        if (k == 0)
            qw_gguf_writer_set_i32(w, "general.alignment", 64);
        else
            qw_gguf_writer_set_u32(w, "general.alignment", 64);
        qw_gguf_writer_close(w, err, sizeof(err));
        size_t an = 0;
        uint8_t *ab = test_read_all(apath, &an);
        if (k == 1) {
            uint32_t bad = 48;
            memcpy(ab + an - 4, &bad, 4); /* the last bytes are the only key's u32 value */
        }
        expect_error(k == 0 ? "alignment of type i32" : "alignment 48", ab, an,
                     k == 0 ? "'general.alignment' must be u32 but is i32" : "48 is not a power of two", NULL);
        free(ab);
    }
    remove(apath);
}

/* ------------------------------------------------------------------ 4. writer misuse */

static void test_writer_errors(void) {
    char err[512] = "";
    char path_buf[700];
    const char *path = tmp_path(path_buf, "w.gguf");
    qw_gguf_writer *w;
    CHECK(!qw_gguf_writer_open(&w, path, err, sizeof(err)), "open: %s", err);
    int64_t shape[2] = {2, 256};
    CHECK(!qw_gguf_writer_add_tensor(w, "a", QW_TYPE_Q4_K, 2, shape, err, sizeof(err)), "add a: %s", err);
    CHECK(qw_gguf_writer_add_tensor(w, "a", QW_TYPE_F32, 2, shape, err, sizeof(err)) && strstr(err, "'a' declared twice"),
          "duplicate: %s", err);
    int64_t bad[2] = {2, 100};
    CHECK(qw_gguf_writer_add_tensor(w, "b", QW_TYPE_Q4_K, 2, bad, err, sizeof(err)) && strstr(err, "whole number"),
          "bad row: %s", err);
    CHECK(qw_gguf_writer_add_tensor(w, "c", QW_TYPE_Q8_K, 2, shape, err, sizeof(err)) && strstr(err, "cannot be stored"),
          "q8_K: %s", err);
    int64_t five[5] = {1, 1, 1, 1, 32};
    CHECK(qw_gguf_writer_add_tensor(w, "d", QW_TYPE_F32, 5, five, err, sizeof(err)) && strstr(err, "5 dimensions"),
          "5 dims: %s", err);
    char longname[80];
    memset(longname, 'x', 70);
    longname[70] = 0;
    CHECK(qw_gguf_writer_add_tensor(w, longname, QW_TYPE_F32, 2, shape, err, sizeof(err)) && strstr(err, "63 bytes"),
          "long name: %s", err);
    int64_t s2[1] = {32};
    CHECK(!qw_gguf_writer_add_tensor(w, "e", QW_TYPE_F32, 1, s2, err, sizeof(err)), "add e: %s", err);
    uint8_t buf[4096] = {0};
    CHECK(qw_gguf_writer_write(w, buf, 289, err, sizeof(err)) && strstr(err, "tensor 'a'") && strstr(err, "only 288"),
          "too much data: %s", err);
    CHECK(!qw_gguf_writer_write(w, buf, 288, err, sizeof(err)), "write a: %s", err);
    CHECK(qw_gguf_writer_add_tensor(w, "f", QW_TYPE_F32, 1, s2, err, sizeof(err)) && strstr(err, "after tensor data"),
          "late tensor: %s", err);
    CHECK(!qw_gguf_writer_write(w, buf, 100, err, sizeof(err)), "part of e: %s", err);
    CHECK(qw_gguf_writer_close(w, err, sizeof(err)) && strstr(err, "tensor 'e'") && strstr(err, "at 100 of its 128"),
          "close with a missing piece: %s", err);
    CHECK(access(path, F_OK) != 0, "an incomplete file must be removed");

    char nodir[700];
    CHECK(qw_gguf_writer_open(&w, tmp_path(nodir, "no/such/dir.gguf"), err, sizeof(err)) == QWENC_ERR_IO && strstr(err, "cannot create"),
          "unwritable path: %s", err);

    /* an empty file (no tensors) is valid and has no padding */
    CHECK(!qw_gguf_writer_open(&w, path, err, sizeof(err)), "open: %s", err);
    CHECK(!qw_gguf_writer_close(w, err, sizeof(err)), "close empty: %s", err);
    qw_gguf g;
    CHECK(!qw_gguf_open(&g, path, err, sizeof(err)) && g.n_tensors == 0 && g.n_kv == 0 && g.file.size == 24,
          "empty file: %s", err);
    qw_gguf_free(&g);
    remove(path);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write")) {
        char err[512];
        if (write_sample(argv[2], 0, err, sizeof(err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        qw_gguf g;
        if (qw_gguf_open(&g, argv[2], err, sizeof(err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        dump(&g, stdout);
        qw_gguf_free(&g);
        return 0;
    }
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/qwenc_t_gguf_%ld", t && *t ? t : "/tmp", (long)getpid());
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", tmpdir);
    if (system(cmd) != 0) {
        printf("cannot create %s\n0 passed, 1 failed\n", tmpdir);
        return 1;
    }
    printf("round trip (default alignment)\n");
    test_round_trip(0);
    printf("round trip (general.alignment 64)\n");
    test_round_trip(64);
    printf("broken files\n");
    test_broken();
    printf("writer misuse\n");
    test_writer_errors();
    rmdir(tmpdir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
