/*
 * t_qkernels.c - the SIMD dot kernels of quantized weight types (so far Q8_0) against the reference.
 *
 * A Q8_0 weight is q*d with q an int8 and d an f16 scale: the product is exact in f32, so the kernel is
 * the f32 kernel on exactly the reference's dequantized weights and the bound of cpu.h applies:
 * |kernel - ref| <= (ceil(n/lanes) + log2(lanes) + 3) * 2^-24 * sum|w_i x_i| + 2^-149.
 * Every tile shape must also give bit-identical outputs (the determinism contract of cpu.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "tensor/quant.h"
#include "test_util.h"

static uint64_t rs = 88172645463325252ull;
static double urand(void) { /* xorshift64, [0, 1) */
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

static void test_type(const qw_cpu_kernels *k, qw_type type) {
    static const int64_t lens[] = {32, 64, 96, 256, 2048, 4128};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        size_t rb = qw_type_row_size(type, n);
        float *wf = malloc((size_t)4 * n * sizeof(float)), *x = malloc((size_t)4 * n * sizeof(float));
        float *deq = malloc((size_t)4 * n * sizeof(float));
        char *wq = malloc(4 * rb);
        for (int64_t i = 0; i < 4 * n; i++) {
            wf[i] = nrand() * (i % 97 == 0 ? 30.0f : 1.0f); /* outliers set some block scales */
            x[i] = nrand() * (i % 89 == 0 ? 1e4f : 1.0f);
        }
        for (int r = 0; r < 4; r++) qw_quantize(type, wf + r * n, wq + r * rb, n);
        qw_tensor t = {.name = "w", .data = wq, .type = type, .n_dims = 2, .shape = {4, n}};
        qw_tensor_to_f32(&t, 0, 4 * n, deq);
        float y44[16], y11[16];
        k->tile[type](y44, 4, wq, rb, x, n, 4, 4, n);
        int same = 1, within = 1;
        double worst = 0;
        for (int r = 0; r < 4; r++)
            for (int tk = 0; tk < 4; tk++) {
                k->tile[type](&y11[tk * 4 + r], 1, wq + r * rb, 0, x + tk * n, 0, 1, 1, n);
                same &= memcmp(&y11[tk * 4 + r], &y44[tk * 4 + r], sizeof(float)) == 0;
                double ref = qw_ref_dot_row(&t, r, x + tk * n, n), mag = 0;
                for (int64_t c = 0; c < n; c++) mag += fabs((double)deq[r * n + c] * x[tk * n + c]);
                double bound = ((n + k->lanes - 1) / k->lanes + log2(k->lanes) + 3) * ldexp(1, -24) * mag + ldexp(1, -149);
                double err = fabs(y44[tk * 4 + r] - ref);
                within &= err <= bound;
                if (bound > 0 && err / bound > worst) worst = err / bound;
            }
        CHECK(within, "%s %s n=%lld: error above the bound (worst %.2f of it)", k->name, qw_type_name(type), (long long)n,
              worst);
        CHECK(same, "%s %s n=%lld: 1x1 and 4x4 tiles differ", k->name, qw_type_name(type), (long long)n);
        free(wf);
        free(x);
        free(deq);
        free(wq);
    }
}

int main(void) {
    int n_variants = 0;
    for (const qw_cpu_kernels *const *k = qw_cpu_kernels_available(); *k; k++) {
        static const qw_type types[] = {QW_TYPE_Q8_0};
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
            if ((*k)->tile[types[i]]) {
                printf("%s: %s dot kernel vs reference\n", (*k)->name, qw_type_name(types[i]));
                test_type(*k, types[i]);
                n_variants++;
            }
    }
    printf("(%d kernel variants with quantized types on this CPU)\n", n_variants);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
