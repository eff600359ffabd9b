/* ple_hash.h - the table row of one head of the PLE n-gram embedding for one token (spec qwen4_exp.md 3.3b-c),
 * for the host (kernels/composite.c) and the CUDA backend (src/cuda/model_ops.cu) alike.
 *
 * The n-gram ending at token t: x[s] = the token s steps back (from hist, the ngram_n-1 ids before tokens[0],
 * oldest first, when it lies before the step), every id at or before an EOS replaced by EOS; head h hashes the
 * first 2 + h / (n_heads / (ngram_n-1)) of them: the xor of x[i] * mult[i] (wrapping mod 2^64), mod its prime,
 * plus its offset in the table. */
#ifndef QW_PLE_HASH_H
#define QW_PLE_HASH_H

#include <stdint.h>

#include "kernels/hostdev.h"

static inline QW_HOST_DEVICE int64_t qw_ple_row(const int32_t *tokens, const int32_t *hist, int t, int h, int n, int nh,
                                                int32_t eos, const uint64_t *mult, const int64_t *prime,
                                                const int64_t *offset) {
    int64_t x[8];
    x[0] = tokens[t];
    int cut = 0;
    for (int s = 1; s < n; s++) {
        int src = t - s;
        int64_t id = src >= 0 ? tokens[src] : hist[n - 1 + src];
        if (id == eos) cut = 1;
        x[s] = cut ? eos : id;
    }
    int order = 2 + h / (nh / (n - 1));
    uint64_t v = 0;
    for (int i = 0; i < order; i++) v ^= (uint64_t)x[i] * mult[i];
    return (int64_t)(v % (uint64_t)prime[h]) + offset[h];
}

#endif
