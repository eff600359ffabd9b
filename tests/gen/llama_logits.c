/*
 * llama_logits.c - llama.cpp as a second oracle: load a GGUF with libllama, feed a token list and
 * write the logits of every position (T x n_vocab float32, little-endian), the format of
 * `qwenc logits --out`. Not part of `make test`: the build needs a llama.cpp checkout.
 *
 * Build (LLAMA = a llama.cpp source tree whose CPU build is in $LLAMA/build):
 *   cc -O2 -std=c11 -o build/llama_logits tests/gen/llama_logits.c -I$LLAMA/include \
 *      -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin
 * Run:
 *   build/llama_logits MODEL.gguf 3,17,9 OUT.f32 [--batch N] [--threads N]
 *     --batch N   tokens per llama_decode call (default: all at once; 1 = token by token)
 *
 * Prints the architecture and vocabulary size; exits 1 with llama.cpp's reason when it refuses the file.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "llama.h"

/* ggml's AMX kernels (Q8_0, Q4_K on CPUs with AMX) need the tile state granted first, or die with SIGILL. */
static void allow_amx(void) {
#if defined(__linux__) && defined(__x86_64__)
    syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
#endif
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("LLAMA_LOGITS_VERBOSE")) fputs(text, stderr);
}

static int parse_ids(const char *s, llama_token **ids) {
    int n = 0, cap = 64;
    *ids = malloc((size_t)cap * sizeof(llama_token));
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (n == cap) *ids = realloc(*ids, (size_t)(cap *= 2) * sizeof(llama_token));
        (*ids)[n++] = (llama_token)v;
        p = end;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS OUT.f32 [--batch N] [--threads N]\n", argv[0]);
        return 2;
    }
    int batch = 0, threads = 1;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    llama_token *ids = NULL;
    int n = parse_ids(argv[2], &ids);
    if (n <= 0) {
        fprintf(stderr, "no token ids\n");
        return 2;
    }
    if (batch <= 0 || batch > n) batch = n;

    allow_amx();
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    /* ggml's AMX repacked Q8_0/Q4_K path faults (SIGILL on tileloadd) on this VM even with the permission
     * granted; the plain CPU path is the oracle */
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama.cpp refused %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int V = llama_vocab_n_tokens(vocab);
    char arch[64] = "?";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n < 64 ? 64 : n);
    cp.n_batch = cp.n_ubatch = (uint32_t)batch;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    cp.type_k = cp.type_v = GGML_TYPE_F32; /* the default F16 cache alone moves logits by ~1e-3 */
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not create a context for %s\n", argv[1]);
        return 1;
    }
    float *out = malloc((size_t)n * V * sizeof(float));
    struct llama_batch b = llama_batch_init(batch, 0, 1);
    for (int i = 0; i < n; i += batch) {
        int c = n - i < batch ? n - i : batch;
        b.n_tokens = c;
        for (int j = 0; j < c; j++) {
            b.token[j] = ids[i + j];
            b.pos[j] = i + j;
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = 1;
        }
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "llama_decode failed at token %d\n", i);
            return 1;
        }
        for (int j = 0; j < c; j++) memcpy(out + (size_t)(i + j) * V, llama_get_logits_ith(ctx, j), (size_t)V * sizeof(float));
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(out, sizeof(float), (size_t)n * V, f) != (size_t)n * V || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", argv[3]);
        return 1;
    }
    printf("%s: arch %s, vocab %d, %d tokens, batch %d\n", argv[1], arch, V, n, batch);
    llama_batch_free(b);
    free(out);
    free(ids);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
