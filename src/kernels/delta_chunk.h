/*
 * delta_chunk.h - the gated delta rule of ops.h over many tokens in the chunked (WY / UT-transform) form,
 * for the CPU backend's prefill. See delta_chunk.c for the math and its tolerance.
 */
#ifndef QW_DELTA_CHUNK_H
#define QW_DELTA_CHUNK_H

#include <stdint.h>

#include "kernels/cpu.h"

/* Tokens per chunk (as flash-linear-attention and transformers' torch_chunk_gated_delta_rule). */
#define QW_DELTA_CHUNK 64
/* The CPU backend takes the chunked form for calls of at least this many tokens: from here on it is faster
 * than token by token, at 2 tokens only as fast (docs/BENCH.md, Gated DeltaNet prefill). */
#define QW_DELTA_CHUNK_MIN_TOK 4

/*
 * Value heads j0 <= j < j1 of ops.h's delta_rule, same arguments and layouts:
 * q, k [n_tok][hk][dk], v [n_tok][hv][dv], g, beta [n_tok][hv], state [hv][dk][dv] (updated),
 * o [n_tok][hv][dv]; value head j reads qk head j / (hv/hk), or j % hk when tiled (ops.h delta_rule). Each head is computed alone, so the result
 * does not depend on how heads are split over threads. `kern` picks the build of the loops (AVX-512,
 * AVX2 or generic) that matches the CPU backend's variant.
 * Returns 0, having touched nothing, when its scratch (about (dk+2*64)*(dv+2*64) floats) cannot be
 * allocated: the caller then runs the token-by-token rule.
 */
int qw_delta_chunk_heads(const qw_cpu_kernels *kern, float *o, float *state, const float *q, const float *k,
                         const float *v, const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv,
                         int tiled, int64_t j0, int64_t j1);

#endif
