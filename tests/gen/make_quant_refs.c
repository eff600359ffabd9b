/*
 * make_quant_refs.c - writes tests/quant/<type>.bin: blocks quantized by ggml's own quantizers and ggml's
 * dequantization of them, for tests/t_quant.c. Not built by the Makefile; it links against a ggml build.
 *
 * For every type, the inputs of each case of tests/quant/inputs.h (one block each) go through
 * ggml_quantize_chunk() with no importance matrix - the call llama-quantize makes - (Q8_K, which
 * ggml_quantize_chunk does not take, through quantize_row_q8_K_ref), and the blocks through the type's
 * to_float (Q8_K: dequantize_row_q8_K). Two more cases per type are random bytes (with finite dequantized values),
 * to exercise every bit of the dequantizer; F16 and BF16 also get the rounding edge cases.
 *
 * Build and run (from the repository root, with llama.cpp built in $LLAMA/build):
 *   cc -std=c11 -O2 -ffp-contract=off -I$LLAMA/ggml/include tests/gen/make_quant_refs.c \
 *      -L$LLAMA/build/bin -lggml-base -lggml -Wl,-rpath,$LLAMA/build/bin -o /tmp/make_quant_refs
 *   /tmp/make_quant_refs tests/quant
 *
 * File layout (little-endian): "QWQR", u32 version (1), u32 ggml type, u32 n (elements per case),
 * u32 case_bytes, u32 n_cases; then per case: u32 case id (QREF_* of inputs.h, 100 + k for random bytes,
 * 200 for the f16 edge values), case_bytes bytes of blocks, n f32 of ggml's dequantization.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#include "../quant/inputs.h"

/* Q8_K has neither from_float_ref nor to_float in ggml's type table; libggml-base exports both. */
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);
void dequantize_row_q8_K(const void *x, float *y, int64_t k);

#define CASE_RANDOM 100
#define CASE_F16_EDGES 200
#define N_RANDOM 2

static void put_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }

static void run_case(enum ggml_type type, int n, const float *x, uint8_t *q) {
    size_t bytes = ggml_row_size(type, n);
    memset(q, 0, bytes);
    if (type == GGML_TYPE_Q8_K)
        quantize_row_q8_K_ref(x, q, n);
    else
        ggml_quantize_chunk(type, x, q, 0, 1, n, NULL);
}

static void to_float(enum ggml_type type, const uint8_t *q, float *y, int n) {
    if (type == GGML_TYPE_Q8_K)
        dequantize_row_q8_K(q, y, n);
    else
        ggml_get_type_traits(type)->to_float(q, y, n);
}

static int write_type(const char *dir, enum ggml_type type) {
    const struct ggml_type_traits *tt = ggml_get_type_traits(type);
    int n = (int)ggml_blck_size(type);
    if (n == 1) n = 64;
    size_t bytes = ggml_row_size(type, n);
    int is_float = type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    int n_cases = QREF_N_CASES + N_RANDOM + is_float;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    uint8_t *q = malloc(bytes);
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.bin", dir, tt->type_name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    fwrite("QWQR", 1, 4, f);
    put_u32(f, 1);
    put_u32(f, (uint32_t)type);
    put_u32(f, (uint32_t)n);
    put_u32(f, (uint32_t)bytes);
    put_u32(f, (uint32_t)n_cases);
    for (int c = 0; c < QREF_N_CASES; c++) {
        qref_case_inputs(c, (uint64_t)type, x, n);
        run_case(type, n, x, q);
        to_float(type, q, y, n);
        put_u32(f, (uint32_t)c);
        fwrite(q, 1, bytes, f);
        fwrite(y, sizeof(float), (size_t)n, f);
    }
    qref_rng r = {0xC0FFEEull + (uint64_t)type};
    for (int k = 0; k < N_RANDOM; k++) {
        for (int tries = 0;; tries++) { /* random bytes whose dequantization is finite */
            for (size_t i = 0; i < bytes; i++) q[i] = (uint8_t)qref_next(&r);
            to_float(type, q, y, n);
            int ok = 1;
            for (int i = 0; i < n; i++) ok &= isfinite(y[i]) != 0;
            if (ok) break;
            if (tries > 1000) {
                fprintf(stderr, "%s: no finite random block\n", tt->type_name);
                return 1;
            }
        }
        put_u32(f, CASE_RANDOM + (uint32_t)k);
        fwrite(q, 1, bytes, f);
        fwrite(y, sizeof(float), (size_t)n, f);
    }
    if (is_float) {
        qref_f16_edge_inputs(x, n);
        run_case(type, n, x, q);
        to_float(type, q, y, n);
        put_u32(f, CASE_F16_EDGES);
        fwrite(q, 1, bytes, f);
        fwrite(y, sizeof(float), (size_t)n, f);
    }
    fclose(f);
    printf("%-8s %2d cases of %3d elements, %4zu bytes each -> %s\n", tt->type_name, n_cases, n, bytes, path);
    free(x);
    free(y);
    free(q);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/quant";
    const enum ggml_type types[] = {
        GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
        GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q8_K,
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) rc |= write_type(dir, types[i]);
    return rc;
}
