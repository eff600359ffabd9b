/*
 * check_llama_quantize.c - whole-file check that qwenc's quantizers give the bytes `llama-quantize` writes.
 * Not built by the Makefile and not part of `make test` (it needs a llama.cpp build); links against qwenc.
 *
 *   check_llama_quantize write IN.gguf          a 2-layer "llama" model with random f32 weights (with outliers)
 *   check_llama_quantize compare IN.gguf OUT.gguf
 *       for every tensor of OUT (as written by llama-quantize from IN): quantize IN's f32 tensor with qwenc
 *       to OUT's type and compare the bytes; prints one line per type and "N tensors identical, M differ"
 *
 * Run (from the repository root, after `make`):
 *   cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc tests/gen/check_llama_quantize.c build/libqwenc.a \
 *      -lcjson -lpcre2-8 -lutf8proc -lm -lpthread -o /tmp/check_llama_quantize
 *   /tmp/check_llama_quantize write /tmp/lq-f32.gguf
 *   for t in Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS; do
 *     $LLAMA/build/bin/llama-quantize /tmp/lq-f32.gguf /tmp/lq-$t.gguf $t 2 >/dev/null 2>&1 &&
 *     /tmp/check_llama_quantize compare /tmp/lq-f32.gguf /tmp/lq-$t.gguf; done
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "tensor/quant.h"

enum { N_EMBD = 256, N_FF = 768, N_VOCAB = 512, N_LAYER = 2, N_HEAD = 4 };

static uint64_t rng = 88172645463325252ull;
static float randn(void) { /* sum of 4 uniforms, centred and scaled to unit variance */
    float s = 0;
    for (int k = 0; k < 4; k++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        s += (float)(rng >> 40) / 16777216.0f;
    }
    return (s - 2.0f) * 1.7320508f;
}

static int write_model(const char *path) {
    char err[512];
    qw_gguf_writer *w;
    if (qw_gguf_writer_open(&w, path, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    qw_gguf_writer_set_str(w, "general.architecture", "llama");
    qw_gguf_writer_set_str(w, "general.name", "qwenc quantizer check");
    qw_gguf_writer_set_u32(w, "general.file_type", 0);
    qw_gguf_writer_set_u32(w, "llama.context_length", 256);
    qw_gguf_writer_set_u32(w, "llama.embedding_length", N_EMBD);
    qw_gguf_writer_set_u32(w, "llama.block_count", N_LAYER);
    qw_gguf_writer_set_u32(w, "llama.feed_forward_length", N_FF);
    qw_gguf_writer_set_u32(w, "llama.attention.head_count", N_HEAD);
    qw_gguf_writer_set_u32(w, "llama.attention.head_count_kv", N_HEAD);
    qw_gguf_writer_set_u32(w, "llama.rope.dimension_count", N_EMBD / N_HEAD);
    qw_gguf_writer_set_u32(w, "llama.vocab_size", N_VOCAB);
    qw_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    struct {
        char name[64];
        int64_t shape[2];
        int nd;
    } t[64];
    int n = 0;
#define ADD(nm, d0, d1, ndims) (snprintf(t[n].name, 64, "%s", nm), t[n].shape[0] = d0, t[n].shape[1] = d1, t[n].nd = ndims, n++)
    ADD("token_embd.weight", N_VOCAB, N_EMBD, 2);
    for (int l = 0; l < N_LAYER; l++) {
        char b[64];
#define L(s) (snprintf(b, 64, "blk.%d.%s", l, s), b)
        ADD(L("attn_norm.weight"), N_EMBD, 0, 1);
        ADD(L("attn_q.weight"), N_EMBD, N_EMBD, 2);
        ADD(L("attn_k.weight"), N_EMBD, N_EMBD, 2);
        ADD(L("attn_v.weight"), N_EMBD, N_EMBD, 2);
        ADD(L("attn_output.weight"), N_EMBD, N_EMBD, 2);
        ADD(L("ffn_norm.weight"), N_EMBD, 0, 1);
        ADD(L("ffn_gate.weight"), N_FF, N_EMBD, 2);
        ADD(L("ffn_up.weight"), N_FF, N_EMBD, 2);
        ADD(L("ffn_down.weight"), N_EMBD, N_FF, 2);
    }
    ADD("output_norm.weight", N_EMBD, 0, 1);
    ADD("output.weight", N_VOCAB, N_EMBD, 2);
    for (int i = 0; i < n; i++)
        if (qw_gguf_writer_add_tensor(w, t[i].name, QW_TYPE_F32, t[i].nd, t[i].shape, err, sizeof(err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
    for (int i = 0; i < n; i++) {
        int64_t ne = t[i].nd == 1 ? t[i].shape[0] : t[i].shape[0] * t[i].shape[1];
        float *x = malloc((size_t)ne * sizeof(float));
        for (int64_t k = 0; k < ne; k++) x[k] = t[i].nd == 1 ? 1.0f + 0.1f * randn() : 0.02f * randn() * (k % 331 == 7 ? 30.0f : 1.0f);
        if (qw_gguf_writer_write(w, x, (size_t)ne * sizeof(float), err, sizeof(err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        free(x);
    }
    if (qw_gguf_writer_close(w, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}

static int compare(const char *in_path, const char *out_path) {
    char err[512];
    qw_gguf in, out;
    if (qw_gguf_open(&in, in_path, err, sizeof(err)) || qw_gguf_open(&out, out_path, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int same = 0, differ = 0;
    for (int64_t i = 0; i < out.n_tensors; i++) {
        const qw_gguf_tensor *o = &out.tensors[i];
        const qw_tensor *src = qw_gguf_find(&in, o->name);
        if (!src || src->type != QW_TYPE_F32) {
            printf("%s: not an f32 tensor of the input\n", o->name);
            differ++;
            continue;
        }
        int64_t ne = qw_tensor_nelem(src);
        float *x = malloc((size_t)ne * sizeof(float));
        memcpy(x, src->data, (size_t)ne * sizeof(float));
        size_t nb = qw_type_row_size(o->t.type, ne);
        uint8_t *q = malloc(nb);
        qw_quantize(o->t.type, x, q, ne);
        int ok = nb == o->nbytes && !memcmp(q, o->t.data, nb);
        printf("%-26s %-7s %s\n", o->name, qw_type_name(o->t.type), ok ? "identical" : "DIFFERENT");
        ok ? same++ : differ++;
        free(x);
        free(q);
    }
    printf("%s: %d tensors identical, %d differ\n", out_path, same, differ);
    qw_gguf_free(&in);
    qw_gguf_free(&out);
    return differ != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "write")) return write_model(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "compare")) return compare(argv[2], argv[3]);
    fprintf(stderr, "usage: %s write IN.gguf | compare IN.gguf OUT.gguf\n", argv[0]);
    return 2;
}
