/*
 * t_gguf_models.c - models through llama.cpp's GGUF layout: every fixture written by qwenc_model_save_gguf,
 * read back by the GGUF loader, and compared with the transformers reference logits.
 *
 *   t_gguf_models [FIXTURE_DIR]        run the tests (GGUFs go to a directory under $TMPDIR, removed after)
 *   t_gguf_models --diff A.gguf B.gguf compare two GGUFs: metadata, tensor names, types, shapes and bytes
 *                                      (used to check qwenc quantize against llama-quantize; docs/GGUF.md)
 *
 * Per fixture:
 * 1. F32 GGUF: the same bar as the safetensors path (relative L2 < 1e-4 and the same argmax at every
 *    position) for all tokens at once, token by token and in chunks of 7: the converter's transformations
 *    (norms + 1, -exp(A_log), tiled value heads, llama's q/k permutation, split indexer, stacked experts,
 *    concatenated PLE shards) are undone exactly, so the logits are those of the checkpoint.
 * 2. The checkpoint's own float type (BF16 or F16) is lossless: the logits equal those of the F32 GGUF
 *    (rel L2 < 1e-6, the summation-order noise of two kernels).
 * 3. Writing the loaded GGUF again gives the same file contents (every tensor byte and metadata value):
 *    the loader's flags (v_tiled, rope_interleaved) and the writer's reorderings are inverse.
 * 4. Q8_0 and Q4_K files: the types the policy promises (norms, router, convs F32; fragile tensors >= Q8_0;
 *    output Q6_K for Q4_K), and every tensor dequantizes to within the format's error of the F32 one
 *    (Q8_0: rel L2 < 1%, Q4_K mixture: < 12%): a misplaced row or column would be off by ~140%. Logits of
 *    the quantized model are not compared with the reference: tiny random models move by 10-70% when
 *    quantized (the bundled trained model is the quality check: qwenc perplexity).
 * Then: a qwen3_5_moe checkpoint written as qwen3next (the same math, the fused ssm_ba layout), the
 * fallbacks for what llama.cpp's converter drops, and errors (unknown type, overwriting the input, unknown
 * architecture, missing tensor).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blocks/blocks.h"
#include "core/mapfile.h"
#include "models/gguf_map.h"
#include "qwenc.h"
#include "test_util.h"

static char tmpdir[512];

static const char *tmp_path(char *out, size_t n, const char *a, const char *b) {
    snprintf(out, n, "%s/%s.%s.gguf", tmpdir, a, b);
    return out;
}

/* ---------------------------------------------------------------- logits */



static double rel_l2(const float *a, const float *b, size_t n, int V, int *argmax_mismatch) {
    /* V = 0: no rows, just the relative L2 error of n values */
    test_cmp r = test_compare_logits(a, b, V ? n / (size_t)V : n, V ? (size_t)V : 1);
    *argmax_mismatch = r.argmax_mismatch;
    return r.rel_l2;
}


static qwenc_model *load(const char *path) {
    char err[1024];
    qwenc_model *m = NULL;
    if (qwenc_model_load(path, &m, err, sizeof(err))) {
        CHECK(0, "load %s: %s", path, err);
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

/* The three feeding modes of t_model against the fixture's references. */
static void check_reference(const qwenc_model *m, const char *dir, const char *label, const int32_t *ids, int n) {
    static const struct {
        const char *ref;
        int batch;
        const char *label;
    } modes[] = {
        {"logits_full.f32", 0, "all tokens in one call"},
        {"logits_decode.f32", 1, "token by token"},
        {"logits_full.f32", 7, "chunks of 7"},
    };
    int V = qwenc_model_n_vocab(m);
    for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
        char *path = qw_path_new(dir, modes[k].ref);
        size_t nref = 0;
        float *ref = test_read_f32(path, &nref);
        free(path);
        float *out = test_run_model(m, ids, n, modes[k].batch ? modes[k].batch : n);
        if (ref && out && nref == (size_t)n * V) {
            int mism;
            double e = rel_l2(out, ref, nref, V, &mism);
            printf("  %-14s %-5s %-24s rel L2 %.2e  argmax mismatches %d\n", qwenc_model_arch(m), label,
                   modes[k].label, e, mism);
            CHECK(e < 1e-4, "%s %s %s: relative L2 error %.3e >= 1e-4", dir, label, modes[k].label, e);
            CHECK(mism == 0, "%s %s %s: argmax differs at %d positions", dir, label, modes[k].label, mism);
        } else {
            CHECK(0, "%s %s: missing output or reference of the wrong size", dir, modes[k].ref);
        }
        free(ref);
        free(out);
    }
}

/* ---------------------------------------------------------------- files */

static int open_gguf(qw_gguf *g, const char *path) {
    char err[1024];
    memset(g, 0, sizeof(*g));
    if (qw_gguf_open(g, path, err, sizeof(err))) {
        CHECK(0, "open %s: %s", path, err);
        return 0;
    }
    return 1;
}

static int kv_equal(const qw_gguf_kv *a, const qw_gguf_kv *b) {
    if (a->type != b->type || a->n != b->n || a->arr_type != b->arr_type) return 0;
    if (a->type == QW_GGUF_STRING) return strcmp(a->str, b->str) == 0;
    if (a->type == QW_GGUF_ARRAY && a->arr_type == QW_GGUF_STRING) {
        for (uint64_t i = 0; i < a->n; i++)
            if (strcmp(a->strs[i], b->strs[i])) return 0;
        return 1;
    }
    static const int size[QW_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    int es = size[a->type == QW_GGUF_ARRAY ? a->arr_type : a->type];
    return memcmp(a->data, b->data, (size_t)es * a->n) == 0;
}

/* Differences between two GGUFs (printed when verbose): metadata keys and values, tensors (name, type,
 * shape, bytes). Returns the number of differences. */
static int gguf_diff(const qw_gguf *a, const qw_gguf *b, int verbose, const char *skip_prefix) {
    int nd = 0;
    for (int64_t i = 0; i < a->n_kv; i++) {
        const qw_gguf_kv *ka = &a->kv[i], *kb = qw_gguf_find_kv(b, ka->key);
        if (skip_prefix && !strncmp(ka->key, skip_prefix, strlen(skip_prefix))) continue;
        if (!kb || !kv_equal(ka, kb)) {
            nd++;
            if (verbose) printf("  metadata %-48s %s\n", ka->key, kb ? "differs" : "only in the first file");
        }
    }
    for (int64_t i = 0; i < b->n_kv; i++)
        if (!qw_gguf_find_kv(a, b->kv[i].key) && !(skip_prefix && !strncmp(b->kv[i].key, skip_prefix, strlen(skip_prefix)))) {
            nd++;
            if (verbose) printf("  metadata %-48s only in the second file\n", b->kv[i].key);
        }
    for (int64_t i = 0; i < a->n_tensors; i++) {
        const qw_gguf_tensor *ta = &a->tensors[i], *tb = qw_gguf_find_info(b, ta->name);
        if (!tb) {
            nd++;
            if (verbose) printf("  tensor %-40s only in the first file\n", ta->name);
            continue;
        }
        int same_shape = 1; /* ggml pads ne with 1: [H] and [H, 1] are the same tensor */
        for (int d = 0; same_shape && d < QW_MAX(ta->n_dims, tb->n_dims); d++)
            same_shape = (d < ta->n_dims ? ta->ne[d] : 1) == (d < tb->n_dims ? tb->ne[d] : 1);
        int same = same_shape && ta->ggml_type == tb->ggml_type && ta->nbytes == tb->nbytes &&
                   memcmp(ta->t.data, tb->t.data, ta->nbytes) == 0;
        if (!same) {
            nd++;
            if (verbose)
                printf("  tensor %-40s %-6s %-6s %s\n", ta->name, qw_type_name(ta->t.type), qw_type_name(tb->t.type),
                       !same_shape ? "shapes differ" : ta->ggml_type != tb->ggml_type ? "types differ" : "bytes differ");
        }
    }
    for (int64_t i = 0; i < b->n_tensors; i++)
        if (!qw_gguf_find_info(a, b->tensors[i].name)) {
            nd++;
            if (verbose) printf("  tensor %-40s only in the second file\n", b->tensors[i].name);
        }
    return nd;
}

/* Relative L2 distance of a tensor of q from the same tensor of f (both dequantized). */
static double tensor_error(const qw_tensor *q, const qw_tensor *f) {
    int64_t n = qw_tensor_nelem(f);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    qw_tensor_to_f32(q, 0, n, a);
    qw_tensor_to_f32(f, 0, n, b);
    int dummy;
    double e = rel_l2(a, b, (size_t)n, 0, &dummy);
    free(a);
    free(b);
    return e;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Types promised by the policy, and every tensor close to its F32 original. */
static void check_quantized(const char *name, const char *f32_path, const char *q_path, const char *type, double tol) {
    qw_gguf f, q;
    if (!open_gguf(&f, f32_path)) return;
    if (!open_gguf(&q, q_path)) {
        qw_gguf_free(&f);
        return;
    }
    CHECK(f.n_tensors == q.n_tensors, "%s %s: %lld tensors, the F32 file has %lld", name, type,
          (long long)q.n_tensors, (long long)f.n_tensors);
    int bad = 0, n_quant = 0;
    double worst = 0;
    for (int64_t i = 0; i < f.n_tensors; i++) {
        const qw_gguf_tensor *tf = &f.tensors[i], *tq = qw_gguf_find_info(&q, tf->name);
        if (!tq) {
            CHECK(0, "%s %s: tensor %s missing", name, type, tf->name);
            continue;
        }
        qw_type t = tq->t.type;
        const char *nm = tf->name;
        int must_f32 = tf->n_dims == 1 || ends_with(nm, "_norm.weight") || strstr(nm, "ffn_gate_inp") ||
                       strstr(nm, "ssm_conv1d") || !ends_with(nm, ".weight");
        int fragile = strstr(nm, "_inject.") || strstr(nm, "ssm_alpha") || strstr(nm, "ssm_beta") ||
                      strstr(nm, "ssm_ba.") || strstr(nm, "ple_conv1d");
        if (must_f32 && t != QW_TYPE_F32) {
            CHECK(0, "%s %s: %s is %s, expected f32", name, type, nm, qw_type_name(t));
            bad++;
        }
        if (fragile && qw_type_is_quantized(t) && t != QW_TYPE_Q8_0) {
            CHECK(0, "%s %s: fragile %s stored as %s (below Q8_0)", name, type, nm, qw_type_name(t));
            bad++;
        }
        n_quant += qw_type_is_quantized(t);
        double e = tensor_error(&tq->t, &tf->t);
        if (e > worst) worst = e;
        if (e > tol) {
            CHECK(0, "%s %s: %s (%s) differs from the F32 tensor by %.3e (> %.2g)", name, type, nm, qw_type_name(t), e, tol);
            bad++;
        }
    }
    const qw_gguf_tensor *out = qw_gguf_find_info(&q, "output.weight");
    if (out && !strcmp(type, "Q4_K")) {
        qw_type want = out->ne[0] % 256 ? QW_TYPE_Q8_0 : QW_TYPE_Q6_K;
        CHECK(out->t.type == want, "%s Q4_K: output.weight is %s, llama-quantize gives %s", name,
              qw_type_name(out->t.type), qw_type_name(want));
    }
    CHECK(n_quant > 0, "%s %s: no tensor was quantized", name, type);
    printf("  %-14s %-5s %lld tensors (%d quantized), types as the policy says, worst tensor error %.2e\n", name, type,
           (long long)q.n_tensors, n_quant, worst);
    CHECK(bad == 0, "%s %s: %d tensors off", name, type, bad);
    qw_gguf_free(&f);
    qw_gguf_free(&q);
}

/* Copy a GGUF, leaving out one tensor (drop) and replacing one metadata key's value by zeros (zero_key). */
static int copy_gguf(const char *src, const char *dst, const char *drop, const char *zero_key) {
    qw_gguf g;
    char err[1024];
    if (!open_gguf(&g, src)) return 0;
    qw_gguf_writer *w = NULL;
    int ok = qw_gguf_writer_open(&w, dst, err, sizeof(err)) == QWENC_OK;
    for (int64_t i = 0; ok && i < g.n_kv; i++) {
        const qw_gguf_kv *kv = &g.kv[i];
        if (!strcmp(kv->key, "general.alignment")) continue;
        if (zero_key && !strcmp(kv->key, zero_key) && kv->type == QW_GGUF_ARRAY) {
            int32_t *z = calloc(kv->n, sizeof(int32_t));
            qw_gguf_writer_set_arr(w, kv->key, QW_GGUF_I32, z, kv->n);
            free(z);
            continue;
        }
        qw_gguf_writer_set_kv(w, kv);
    }
    for (int64_t i = 0; ok && i < g.n_tensors; i++)
        if (!drop || strcmp(g.tensors[i].name, drop))
            ok = qw_gguf_writer_add_tensor(w, g.tensors[i].name, g.tensors[i].t.type, g.tensors[i].t.n_dims,
                                           g.tensors[i].t.shape, err, sizeof(err)) == QWENC_OK;
    for (int64_t i = 0; ok && i < g.n_tensors; i++)
        if (!drop || strcmp(g.tensors[i].name, drop))
            ok = qw_gguf_writer_write(w, g.tensors[i].t.data, g.tensors[i].nbytes, err, sizeof(err)) == QWENC_OK;
    if (ok)
        ok = qw_gguf_writer_close(w, err, sizeof(err)) == QWENC_OK;
    else if (w)
        qw_gguf_writer_abort(w);
    CHECK(ok, "copy %s: %s", src, err);
    qw_gguf_free(&g);
    return ok;
}

/* Copy a GGUF, fusing in every layer the tensors blk.<il>.<parts[i]> (same type and row length) into
 * blk.<il>.<out>: n_blocks blocks, each taking its share of rows from every part in turn (1 block: plain
 * concatenation; E blocks: per-expert interleaving, as convert_hf_to_gguf --fuse-gate-up-exps writes). */
static int fuse_copy(const char *src, const char *dst, const char *out, const char *const *parts, int n_parts,
                     int n_blocks, int n_layer) {
    qw_gguf g;
    char err[1024], nm[128];
    if (!open_gguf(&g, src)) return 0;
    qw_gguf_writer *w = NULL;
    int ok = qw_gguf_writer_open(&w, dst, err, sizeof(err)) == QWENC_OK;
    for (int64_t i = 0; ok && i < g.n_kv; i++)
        if (strcmp(g.kv[i].key, "general.alignment")) qw_gguf_writer_set_kv(w, &g.kv[i]);
    /* is tensor i a part (returns the layer), and which */
    for (int pass = 0; pass < 2 && ok; pass++)
        for (int64_t i = 0; ok && i < g.n_tensors; i++) {
            const qw_gguf_tensor *t = &g.tensors[i];
            int il = -1, part = -1;
            for (int l = 0; l < n_layer && part < 0; l++)
                for (int k = 0; k < n_parts; k++) {
                    snprintf(nm, sizeof(nm), "blk.%d.%s", l, parts[k]);
                    if (!strcmp(nm, t->name)) il = l, part = k;
                }
            if (part > 0) continue; /* written with part 0 */
            if (part < 0) {
                ok = pass == 0 ? qw_gguf_writer_add_tensor(w, t->name, t->t.type, t->t.n_dims, t->t.shape, err,
                                                           sizeof(err)) == QWENC_OK
                               : qw_gguf_writer_write(w, t->t.data, t->nbytes, err, sizeof(err)) == QWENC_OK;
                continue;
            }
            const qw_gguf_tensor *pt[4];
            int64_t rows = 0, len = t->t.shape[t->t.n_dims - 1];
            for (int k = 0; k < n_parts; k++) {
                snprintf(nm, sizeof(nm), "blk.%d.%s", il, parts[k]);
                pt[k] = qw_gguf_find_info(&g, nm);
                rows += qw_tensor_nelem(&pt[k]->t) / len;
            }
            if (pass == 0) {
                int64_t shape[3] = {n_blocks, rows / n_blocks, len};
                snprintf(nm, sizeof(nm), "blk.%d.%s", il, out);
                ok = qw_gguf_writer_add_tensor(w, nm, t->t.type, n_blocks > 1 ? 3 : 2, n_blocks > 1 ? shape : shape + 1,
                                               err, sizeof(err)) == QWENC_OK;
                continue;
            }
            size_t rs = qw_type_row_size(t->t.type, len);
            for (int b = 0; ok && b < n_blocks; b++)
                for (int k = 0; ok && k < n_parts; k++) {
                    int64_t pr = qw_tensor_nelem(&pt[k]->t) / len / n_blocks;
                    ok = qw_gguf_writer_write(w, (const uint8_t *)pt[k]->t.data + (size_t)(b * pr) * rs, (size_t)pr * rs,
                                              err, sizeof(err)) == QWENC_OK;
                }
        }
    if (ok)
        ok = qw_gguf_writer_close(w, err, sizeof(err)) == QWENC_OK;
    else if (w)
        qw_gguf_writer_abort(w);
    CHECK(ok, "fuse %s: %s", src, err);
    qw_gguf_free(&g);
    return ok;
}

/* The converter's opt-in fusions: --fuse-qkv (attn_qkv) and --fuse-gate-up-exps (ffn_gate_up_exps). */
static void test_fused_variants(const char *root) {
    static const char *const qkv[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"};
    static const char *const gu[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight"};
    static const struct {
        const char *fixture, *out;
        const char *const *parts;
        int n_parts, experts;
    } cases[] = {{"qwen3", "attn_qkv.weight", qkv, 3, 0}, {"qwen3_5_moe", "ffn_gate_up_exps.weight", gu, 2, 1}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char dir[700], a[700], b[700];
        snprintf(dir, sizeof(dir), "%s/%s", root, cases[c].fixture);
        qwenc_model *hf = load(dir);
        if (!hf) continue;
        tmp_path(a, sizeof(a), cases[c].fixture, "unfused");
        tmp_path(b, sizeof(b), cases[c].fixture, "fused");
        if (save(hf, a, "F32") &&
            fuse_copy(a, b, cases[c].out, cases[c].parts, cases[c].n_parts, cases[c].experts ? hf->hp.n_expert : 1,
                      hf->hp.n_layer)) {
            qwenc_model *g = load(b);
            int n = 0;
            snprintf(dir, sizeof(dir), "%s/%s/tokens.txt", root, cases[c].fixture);
            int32_t *ids = test_read_tokens(dir, &n);
            snprintf(dir, sizeof(dir), "%s/%s", root, cases[c].fixture);
            char nm[64];
            snprintf(nm, sizeof(nm), "blk.0.%s", cases[c].out);
            CHECK(g && qw_gguf_find(g->gguf, nm), "%s: %s not in the fused file", cases[c].fixture, nm);
            if (g && ids) check_reference(g, dir, "fused", ids, n);
            free(ids);
            qwenc_model_free(g);
        }
        unlink(a), unlink(b);
        qwenc_model_free(hf);
    }
}

/* ---------------------------------------------------------------- per fixture */

static const char *storage_type(const char *dir) {
    char *path = qw_path_new(dir, "meta.json"), *txt = NULL, err[256];
    const char *t = "F32";
    if (!qw_read_file(path, &txt, NULL, err, sizeof(err))) {
        if (strstr(txt, "\"storage_dtype\": \"bfloat16\"")) t = "BF16";
        if (strstr(txt, "\"storage_dtype\": \"float16\"")) t = "F16";
    }
    free(txt);
    free(path);
    return t;
}

static void test_fixture(const char *dir, const char *name) {
    int n = 0;
    char *path = qw_path_new(dir, "tokens.txt");
    int32_t *ids = test_read_tokens(path, &n);
    free(path);
    CHECK(ids && n > 0, "%s: tokens.txt", dir);
    qwenc_model *hf = load(dir);
    if (!hf || !ids) {
        free(ids);
        qwenc_model_free(hf);
        return;
    }
    int V = qwenc_model_n_vocab(hf);
    char f32[700], own[700], again[700], q8[700], q4[700];
    tmp_path(f32, sizeof(f32), name, "f32");
    float *l32 = NULL;
    if (save(hf, f32, "F32")) {
        qwenc_model *g = load(f32);
        if (g) {
            CHECK(!strcmp(qwenc_model_arch(g), qwenc_model_arch(hf)), "%s: the GGUF loads as %s, not %s", name,
                  qwenc_model_arch(g), qwenc_model_arch(hf));
            check_reference(g, dir, "F32", ids, n);
            l32 = test_run_model(g, ids, n, n);
            /* 3. written again from the GGUF: the same file */
            tmp_path(again, sizeof(again), name, "again");
            if (save(g, again, "F32")) {
                qw_gguf a, b;
                if (open_gguf(&a, f32) && open_gguf(&b, again)) {
                    int nd = gguf_diff(&a, &b, 1, NULL);
                    printf("  %-14s F32 GGUF written again from itself: %d differences\n", name, nd);
                    CHECK(nd == 0, "%s: writing the GGUF again changed %d tensors or keys", name, nd);
                }
                qw_gguf_free(&a);
                qw_gguf_free(&b);
            }
            qwenc_model_free(g);
        }
    }
    /* 2. the checkpoint's own float type is lossless */
    const char *st = storage_type(dir);
    if (strcmp(st, "F32") && l32) {
        tmp_path(own, sizeof(own), name, st);
        if (save(hf, own, st)) {
            qwenc_model *g = load(own);
            float *l = g ? test_run_model(g, ids, n, n) : NULL;
            if (l) {
                int mism;
                double e = rel_l2(l, l32, (size_t)n * V, V, &mism);
                printf("  %-14s %-5s lossless: vs the F32 GGUF rel L2 %.2e\n", name, st, e);
                CHECK(e < 1e-6 && mism == 0, "%s: %s GGUF of a %s checkpoint differs from the F32 one by %.3e", name,
                      st, st, e);
            }
            free(l);
            qwenc_model_free(g);
        }
    }
    /* 4. quantized files */
    tmp_path(q8, sizeof(q8), name, "q8_0");
    tmp_path(q4, sizeof(q4), name, "q4_k");
    if (save(hf, q8, "Q8_0")) check_quantized(name, f32, q8, "Q8_0", 0.01);
    if (save(hf, q4, "Q4_K")) check_quantized(name, f32, q4, "Q4_K", 0.12);
    qwenc_model *g = load(q4);
    if (g) {
        float *l = test_run_model(g, ids, QW_MIN(n, 8), QW_MIN(n, 8));
        int finite = l != NULL;
        for (int i = 0; l && i < QW_MIN(n, 8) * V; i++) finite &= isfinite(l[i]) != 0;
        CHECK(finite, "%s: the Q4_K model gives non-finite logits", name);
        free(l);
        qwenc_model_free(g);
    }
    unlink(f32), unlink(again), unlink(q8), unlink(q4);
    if (strcmp(st, "F32")) unlink(own);
    free(l32);
    free(ids);
    qwenc_model_free(hf);
}

/* qwen3_5_moe and qwen3_next compute the same function; written as qwen3next the file uses llama.cpp's
 * qwen3next layout (grouped value heads, fused ssm_ba), which the loader must undo. */
static void test_as_qwen3next(const char *root) {
    char dir[700], path[700];
    snprintf(dir, sizeof(dir), "%s/qwen3_5_moe", root);
    qwenc_model *hf = load(dir);
    if (!hf) return;
    hf->hp.arch = QW_ARCH_QWEN3_NEXT;
    tmp_path(path, sizeof(path), "qwen3_5_moe", "as-qwen3next");
    if (save(hf, path, "F32")) {
        qwenc_model *g = load(path);
        if (g) {
            CHECK(!strcmp(qwenc_model_arch(g), "qwen3_next"), "written as qwen3next, loads as %s", qwenc_model_arch(g));
            CHECK(qw_gguf_find(g->gguf, "blk.0.ssm_ba.weight") && !qw_gguf_find(g->gguf, "blk.0.ssm_beta.weight"),
                  "qwen3next file: ssm_ba fused, no ssm_beta");
            int n = 0;
            snprintf(dir, sizeof(dir), "%s/qwen3_5_moe/tokens.txt", root);
            int32_t *ids = test_read_tokens(dir, &n);
            snprintf(dir, sizeof(dir), "%s/qwen3_5_moe", root);
            if (ids) check_reference(g, dir, "as3nx", ids, n);
            free(ids);
            qwenc_model_free(g);
        }
    }
    hf->hp.arch = QW_ARCH_QWEN35_MOE;
    unlink(path);
    qwenc_model_free(hf);
}

/* What llama.cpp's converter loses, and errors. */
static void test_fallbacks_and_errors(const char *root) {
    char dir[700], a[700], b[700], err[1024];
    snprintf(dir, sizeof(dir), "%s/qwen4_exp", root);
    qwenc_model *hf = load(dir);
    if (!hf) return;
    tmp_path(a, sizeof(a), "qwen4_exp", "base");
    if (!save(hf, a, "F32")) {
        qwenc_model_free(hf);
        return;
    }
    /* compress_ratios all 0 (the converter under transformers >= 5.16): ratio 4 assumed, and said */
    tmp_path(b, sizeof(b), "qwen4_exp", "ratios0");
    if (copy_gguf(a, b, NULL, "qwen4exp.attention.compress_ratios")) {
        qwenc_model *g = load(b);
        if (g) {
            CHECK(g->hp.idx_ratio == 4 && strstr(g->gguf_note, "compress_ratios"),
                  "compress_ratios 0: ratio %d, note \"%s\"", g->hp.idx_ratio, g->gguf_note);
            qwenc_model_free(g);
        }
        unlink(b);
    }
    /* a missing tensor is named */
    tmp_path(b, sizeof(b), "qwen4_exp", "missing");
    if (copy_gguf(a, b, "blk.3.indexer.k_proj.weight", NULL)) {
        qwenc_model *g = NULL;
        qwenc_status st = qwenc_model_load(b, &g, err, sizeof(err));
        CHECK(st == QWENC_ERR_FORMAT && strstr(err, "blk.3.indexer.k_proj.weight"), "missing tensor: %d %s", st, err);
        qwenc_model_free(g);
        unlink(b);
    }
    /* an unknown type; writing over the model being read */
    qwenc_gguf_params p = qwenc_gguf_default_params();
    p.type = "Q3_K";
    tmp_path(b, sizeof(b), "qwen4_exp", "q3k");
    qwenc_status st = qwenc_model_save_gguf(hf, b, &p, err, sizeof(err));
    CHECK(st == QWENC_ERR_ARG && strstr(err, "Q4_K"), "unknown type: %d %s", st, err);
    CHECK(access(b, F_OK) != 0, "no file is left behind for an unknown type");
    qwenc_model *g = load(a);
    if (g) {
        p.type = "F32";
        st = qwenc_model_save_gguf(g, a, &p, err, sizeof(err));
        CHECK(st == QWENC_ERR_ARG && strstr(err, "overwrite"), "overwriting the input: %d %s", st, err);
        CHECK(qw_gguf_find_kv(g->gguf, "qwen4exp.ple.layer_multipliers") != NULL, "PLE constants in the metadata");
        qwenc_model_free(g);
    }
    /* an architecture qwenc does not run */
    qw_gguf_writer *w = NULL;
    tmp_path(b, sizeof(b), "gpt2", "arch");
    if (qw_gguf_writer_open(&w, b, err, sizeof(err)) == QWENC_OK) {
        qw_gguf_writer_set_str(w, "general.architecture", "gpt2");
        qw_gguf_writer_close(w, err, sizeof(err));
        qwenc_model *m = NULL;
        st = qwenc_model_load(b, &m, err, sizeof(err));
        CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "gpt2"), "unknown architecture: %d %s", st, err);
        qwenc_model_free(m);
        unlink(b);
    }
    unlink(a);
    qwenc_model_free(hf);

    /* qwen4_exp_vlm: two PLE layers and a silu output gate, in qwenc's own keys */
    snprintf(dir, sizeof(dir), "%s/qwen4_exp_vlm", root);
    hf = load(dir);
    tmp_path(a, sizeof(a), "qwen4_exp_vlm", "keys");
    if (hf && save(hf, a, "F32")) {
        qw_gguf q;
        if (open_gguf(&q, a)) {
            const qw_gguf_kv *kv = qw_gguf_find_kv(&q, "qwen4exp.ssm.gate_activation");
            CHECK(kv && kv->type == QW_GGUF_STRING && !strcmp(kv->str, "silu"), "silu gate key");
            CHECK(qw_gguf_find(&q, "per_layer_token_embd.weight") && qw_gguf_find(&q, "blk.2.ple_token_embd.weight"),
                  "one table per PLE layer");
            qw_gguf_free(&q);
        }
        unlink(a);
    }
    qwenc_model_free(hf);
}

/* The names and keys llama.cpp's loaders ask for (src/models/<arch>.cpp), spot-checked per architecture. */
static void test_names(const char *root) {
    static const struct {
        const char *fixture;
        const char *names[12];
    } want[] = {
        {"llama", {"token_embd.weight", "output.weight", "output_norm.weight", "rope_freqs.weight",
                   "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.2.ffn_norm.weight", "blk.2.ffn_down.weight",
                   "llama.vocab_size", "llama.rope.dimension_count", "llama.attention.layer_norm_rms_epsilon"}},
        {"qwen3", {"token_embd.weight", "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.1.ffn_norm.weight",
                   "qwen3.attention.key_length", "qwen3.rope.freq_base"}},
        {"qwen3_5", {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_beta.weight",
                     "blk.0.ssm_alpha.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_conv1d.weight",
                     "blk.3.attn_q.weight", "blk.3.post_attention_norm.weight", "qwen35.ssm.inner_size",
                     "qwen35.rope.dimension_sections", "qwen35.attention.recurrent_layers"}},
        {"qwen3_5_moe", {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight",
                         "blk.0.ffn_gate_inp_shexp.weight", "blk.0.ffn_up_shexp.weight", "qwen35moe.expert_count",
                         "qwen35moe.expert_feed_forward_length", "qwen35moe.expert_shared_feed_forward_length"}},
        {"qwen3_next", {"blk.0.ssm_ba.weight", "blk.0.attn_qkv.weight", "blk.1.ffn_gate.weight",
                        "qwen3next.ssm.group_count", "qwen3next.expert_weights_norm"}},
        {"qwen4_exp", {"output_hc_norm.weight", "output_hc_down.weight", "blk.0.hc_attn_inject.weight",
                       "blk.0.hc_ffn_norm.weight", "blk.3.indexer.q_proj.weight", "blk.3.indexer.k_norm.weight",
                       "per_layer_token_embd.weight", "blk.1.ple_conv1d.weight", "qwen4exp.ple.head_vocab_sizes",
                       "qwen4exp.attention.compress_ratios", "qwen4exp.hyper_connection.low_rank",
                       "qwen4exp.embedding_length_per_layer_input"}},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char dir[700], path[700];
        snprintf(dir, sizeof(dir), "%s/%s", root, want[i].fixture);
        qwenc_model *m = load(dir);
        tmp_path(path, sizeof(path), want[i].fixture, "names");
        if (m && save(m, path, "F16")) {
            qw_gguf g;
            if (open_gguf(&g, path)) {
                int missing = 0;
                for (int k = 0; k < 12 && want[i].names[k]; k++) {
                    const char *nm = want[i].names[k];
                    int found = qw_gguf_find(&g, nm) || qw_gguf_find_kv(&g, nm);
                    CHECK(found, "%s: '%s' is not in the file", want[i].fixture, nm);
                    missing += !found;
                }
                const qw_gguf_kv *arch = qw_gguf_find_kv(&g, "general.architecture");
                CHECK(arch && !strcmp(arch->str, qw_gguf_arch_name(m->hp.arch)), "%s: general.architecture",
                      want[i].fixture);
                printf("  %-14s llama.cpp names and keys present (%s)\n", want[i].fixture, missing ? "NOT all" : "all");
                qw_gguf_free(&g);
            }
            unlink(path);
        }
        qwenc_model_free(m);
    }
}


int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--diff")) {
        qw_gguf a, b;
        if (!open_gguf(&a, argv[2]) || !open_gguf(&b, argv[3])) return 2;
        int nd = gguf_diff(&a, &b, 1, NULL);
        printf("%d differences\n", nd);
        qw_gguf_free(&a);
        qw_gguf_free(&b);
        return nd ? 1 : 0;
    }
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    if (!test_make_tmpdir(tmpdir, sizeof(tmpdir), "qwenc-gguf")) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    char *names[64];
    int n = test_list_fixtures(root, 0, names, 64);
    CHECK(n >= 0, "cannot open fixture directory %s", root);
    CHECK(n >= 7, "expected at least 7 fixtures in %s, found %d", root, n);
    for (int i = 0; i < n; i++) {
        char p[1100];
        snprintf(p, sizeof(p), "%s/%s", root, names[i]);
        printf("fixture %s\n", names[i]);
        test_fixture(p, names[i]);
        free(names[i]);
    }
    printf("qwen3_5_moe written as qwen3next\n");
    test_as_qwen3next(root);
    printf("fused attn_qkv and ffn_gate_up_exps\n");
    test_fused_variants(root);
    printf("converter gaps and errors\n");
    test_fallbacks_and_errors(root);
    printf("llama.cpp names\n");
    test_names(root);
    rmdir(tmpdir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
