/*
 * check_gguf_ggml.c - reads a GGUF file with ggml's own GGUF reader and prints it in the dump format of
 * `t_gguf --write`, so that a diff shows whether ggml reads what qwenc's writer wrote. Not built by the
 * Makefile and not part of `make test` (it needs a llama.cpp build).
 *
 * The file is loaded with no_alloc = false, so ggml also reads the whole padded data section: the check
 * covers ggml's rules on tensor order, offsets, alignment and padding, not only the header.
 *
 *   cc -std=c11 -O2 -I$LLAMA/ggml/include tests/gen/check_gguf_ggml.c -L$LLAMA/build/bin -lggml-base -lggml \
 *      -Wl,-rpath,$LLAMA/build/bin -o /tmp/check_gguf_ggml
 *   build/tests/t_gguf --write /tmp/sample.gguf > /tmp/sample.qwenc
 *   /tmp/check_gguf_ggml /tmp/sample.gguf > /tmp/sample.ggml && diff /tmp/sample.qwenc /tmp/sample.ggml && echo same
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

static uint64_t fnv(const uint8_t *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Element i of a numeric array (or the scalar) printed as t_gguf prints it. */
static void print_num(enum gguf_type t, const void *base, size_t i) {
    const uint8_t *p = base;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } v;
    static const size_t size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}; /* by enum gguf_type */
    size_t sz = size[t];
    memcpy(&v, p + i * sz, sz);
    switch (t) {
    case GGUF_TYPE_UINT8: printf(" %d", v.u8); break;
    case GGUF_TYPE_BOOL: printf(" %d", v.u8 != 0); break;
    case GGUF_TYPE_INT8: printf(" %d", v.i8); break;
    case GGUF_TYPE_UINT16: printf(" %d", v.u16); break;
    case GGUF_TYPE_INT16: printf(" %d", v.i16); break;
    case GGUF_TYPE_UINT32: printf(" %" PRIu32, v.u32); break;
    case GGUF_TYPE_INT32: printf(" %" PRId32, v.i32); break;
    case GGUF_TYPE_UINT64: printf(" %" PRIu64, v.u64); break;
    case GGUF_TYPE_INT64: printf(" %" PRId64, v.i64); break;
    case GGUF_TYPE_FLOAT32: printf(" %.17g", (double)v.f32); break;
    case GGUF_TYPE_FLOAT64: printf(" %.17g", v.f64); break;
    default: printf(" ?"); break;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE.gguf\n", argv[0]);
        return 2;
    }
    struct ggml_context *data = NULL;
    struct gguf_init_params params = {false, &data};
    struct gguf_context *g = gguf_init_from_file(argv[1], params);
    if (!g) {
        fprintf(stderr, "%s: ggml could not read the file\n", argv[1]);
        return 1;
    }
    int64_t nkv = gguf_get_n_kv(g), nt = gguf_get_n_tensors(g);
    printf("version %u alignment %zu n_kv %" PRId64 " n_tensors %" PRId64 " data_offset %zu\n", gguf_get_version(g),
           gguf_get_alignment(g), nkv, nt, gguf_get_data_offset(g));
    for (int64_t i = 0; i < nkv; i++) {
        enum gguf_type t = gguf_get_kv_type(g, i);
        printf("kv %s %d", gguf_get_key(g, i), (int)t);
        if (t == GGUF_TYPE_STRING) {
            printf(" '%s'", gguf_get_val_str(g, i));
        } else if (t == GGUF_TYPE_ARRAY) {
            enum gguf_type at = gguf_get_arr_type(g, i);
            size_t n = gguf_get_arr_n(g, i);
            printf(" %d [%zu]", (int)at, n);
            for (size_t k = 0; k < n; k++) {
                if (at == GGUF_TYPE_STRING)
                    printf(" '%s'", gguf_get_arr_str(g, i, k));
                else
                    print_num(at, gguf_get_arr_data(g, i), k);
            }
        } else {
            print_num(t, gguf_get_val_data(g, i), 0);
        }
        printf("\n");
    }
    for (int64_t i = 0; i < nt; i++) {
        const char *name = gguf_get_tensor_name(g, i);
        const int64_t *ne = gguf_get_tensor_ne(g, i);
        int nd = GGML_MAX_DIMS;
        while (nd > 1 && ne[nd - 1] == 1) nd--;
        printf("tensor %s %d", name, (int)gguf_get_tensor_type(g, i));
        for (int d = 0; d < nd; d++) printf("%s%" PRId64, d ? "," : " ", ne[d]);
        struct ggml_tensor *t = ggml_get_tensor(data, name);
        size_t nb = gguf_get_tensor_size(g, i);
        printf(" offset %zu bytes %zu fnv %016" PRIx64 "\n", gguf_get_tensor_offset(g, i), nb,
               fnv((const uint8_t *)t->data, nb));
    }
    ggml_free(data);
    gguf_free(g);
    return 0;
}
