/*
 * inputs.h - the deterministic inputs of the quantization reference data, shared by the program that
 * wrote the tests/quant/ files with ggml (tests/gen/make_quant_refs.c) and by tests/t_quant.c, which
 * regenerates them instead of reading them from disk.
 *
 * Only integer arithmetic and single float multiplications/additions are used (no libm, no expression
 * a*b+c that a compiler could fuse), so every platform produces the same floats.
 */
#ifndef QW_QREF_INPUTS_H
#define QW_QREF_INPUTS_H

#include <stdint.h>
#include <string.h>

/* The cases, each one block of the type (32 or 256 elements). */
enum {
    QREF_NORMAL_A,   /* approximately N(0, 1) */
    QREF_NORMAL_B,   /* another draw */
    QREF_OUTLIERS,   /* N(0, 1) with a few elements 25x larger, one of them negative */
    QREF_ZERO,       /* all zero */
    QREF_TINY,       /* N(0, 1) * 1e-7: scales below the smallest f16 */
    QREF_CONST_POS,  /* every element 0.37 */
    QREF_CONST_NEG,  /* every element -1.5 */
    QREF_MIXED,      /* each group of 32 at its own magnitude, 1e-4 .. 1e3 */
    QREF_POSITIVE,   /* uniform in [0.5, 2) */
    QREF_GRID,       /* multiples of 0.25 in [-4, 4]: exact ties of the rounding */
    QREF_LARGE,      /* N(0, 1) * 3000 */
    QREF_N_CASES
};

static const char *const qref_case_names[QREF_N_CASES] = {
    "normal-a", "normal-b", "outliers", "zero", "tiny", "const-pos", "const-neg", "mixed", "positive", "grid", "large",
};

typedef struct {
    uint64_t s;
} qref_rng;

static inline uint32_t qref_next(qref_rng *r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 2685821657736338717ull) >> 32);
}

/* Uniform in [0, 1), a multiple of 2^-24 (exact in float). */
static inline float qref_uniform(qref_rng *r) { return (float)(qref_next(r) >> 8) * (1.0f / 16777216.0f); }

/* Approximately N(0, 1): (sum of 4 uniforms - 2) * sqrt(3). */
static inline float qref_normal(qref_rng *r) {
    float s = qref_uniform(r);
    s += qref_uniform(r);
    s += qref_uniform(r);
    s += qref_uniform(r);
    s -= 2.0f;
    return s * 1.7320508f;
}

/* The n inputs of case c (seeded by the case and the seed, so that types can draw different data). */
static inline void qref_case_inputs(int c, uint64_t seed, float *x, int n) {
    qref_rng r = {0x9E3779B97F4A7C15ull ^ (seed * 0x100000001B3ull) ^ ((uint64_t)(c + 1) << 40)};
    for (int i = 0; i < 8; i++) qref_next(&r);
    for (int i = 0; i < n; i++) {
        switch (c) {
        case QREF_ZERO: x[i] = 0.0f; break;
        case QREF_CONST_POS: x[i] = 0.37f; break;
        case QREF_CONST_NEG: x[i] = -1.5f; break;
        case QREF_POSITIVE: x[i] = 0.5f + qref_uniform(&r) * 1.5f; break;
        case QREF_GRID: x[i] = (float)((int)(qref_next(&r) % 33u) - 16) * 0.25f; break;
        case QREF_TINY: x[i] = qref_normal(&r) * 1e-7f; break;
        case QREF_LARGE: x[i] = qref_normal(&r) * 3000.0f; break;
        case QREF_MIXED: {
            static const float mag[8] = {1e-4f, 1e3f, 1e-2f, 1.0f, 0.1f, 30.0f, 1e-3f, 3.0f};
            x[i] = qref_normal(&r) * mag[(i / 32) % 8];
            break;
        }
        default: x[i] = qref_normal(&r); break;
        }
    }
    if (c == QREF_OUTLIERS) {
        x[3 % n] = 25.0f * (x[3 % n] < 0 ? -2.0f : 2.0f);
        x[(n / 2 + 5) % n] = -60.0f;
        if (n > 64) x[200 % n] = 41.0f;
    }
}

/* Values where f32 -> f16 / bf16 rounding is delicate (ties, overflow, subnormals, infinities). */
static const uint32_t qref_f16_edges[] = {
    0x00000000, 0x80000000, 0x3f800000, 0x3f801000, 0x3f803000, 0x3f800fff, 0x3f801001, /* 1, ties at 2^-11 */
    0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, 0xc77ff000, 0x7f7fffff, /* f16 max, overflow */
    0x7f800000, 0xff800000,                                                             /* infinities */
    0x38800000, 0x387fe000, 0x387ff000, 0x33800000, 0x33000000, 0x33000001, 0x32ffffff, /* min normal, subnormals */
    0x33c00000, 0x34200000, 0x34400000, 0xb3c00000, 0x3f808000, 0x3f818000, 0x3f7f8000, /* bf16 ties */
    0x3f7fffff, 0x00000001, 0x80000001, 0x00800000, 0x007fffff, 0x3eaaaaab, 0x40490fdb,
};

static inline void qref_f16_edge_inputs(float *x, int n) {
    int ne = (int)(sizeof(qref_f16_edges) / sizeof(qref_f16_edges[0]));
    qref_case_inputs(QREF_NORMAL_A, 99, x, n);
    for (int i = 0; i < ne && i < n; i++) memcpy(&x[i], &qref_f16_edges[i], 4);
}

#endif
