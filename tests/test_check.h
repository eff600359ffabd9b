/*
 * test_check.h - the CHECK macro, its pass/fail counters and the closing "N passed, M failed" line every test
 * program prints (tests/run.sh sums them). C and C++ (tests/gpu/emu); test_util.h includes it.
 */
#ifndef QW_TEST_CHECK_H
#define QW_TEST_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                \
    do {                                                \
        if (cond) {                                     \
            n_pass++;                                   \
        } else {                                        \
            n_fail++;                                   \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)

/* Print the closing line tests/run.sh reads and return the exit status. */
static inline int test_summary(void) {
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

/* xorshift64 on *state: a float uniform in [-1, 1) (24 random bits) */
static inline float test_frand(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (float)((x >> 40) * (2.0 / (1ull << 24)) - 1.0);
}

/* v [n] scaled to norm `scale` (the delta rule's inputs: unit keys, queries of norm 1 / sqrt(dk)) */
static inline void test_l2n(float *v, int n, float scale) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)v[i] * v[i];
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] / sqrt(s) * scale);
}

/* The delta-rule tests' decays g and betas [T][hv] (t_kernels, t_cuda_ops, gpu/emu/t_cuda_emu), rnd uniform in
 * [-1, 1): g mode 0 uniform in (-0.5, 0], 1 within 1e-6 of 0, 2 about -30, 3 a mix of those, 4 -30 for the first
 * half of the tokens then within 1e-7 of 0 (long decay products, then none); beta mode 0 uniform in [0, 1], 1 all 0,
 * 2 all 1, 3 a mix of those. */
static inline void test_dr_gates(float *g, float *beta, int T, int hv, int gm, int bm, float (*rnd)(void)) {
    for (int i = 0; i < T * hv; i++) {
        float u = rnd();
        u = u < 0 ? -u : u;
        int gi = gm, bi = bm;
        if (gi == 3) gi = (int)((rnd() + 1.0f) * 1.5f) % 3;
        if (bi == 3) bi = (int)((rnd() + 1.0f) * 1.5f) % 3;
        g[i] = gi == 0   ? -0.5f * u
               : gi == 1 ? -1e-6f * u
               : gi == 2 ? -30.0f + rnd()
                         : (i / hv < T / 2 ? -30.0f : -1e-7f * u);
        beta[i] = bi == 0 ? u : bi == 1 ? 0.0f : 1.0f;
    }
}

#endif
