/*
 * rope.c - rotary position tables (transformers modeling_rope_utils: "default", "linear", "llama3").
 *
 * inv_freq_k = 1 / theta^(2k/n_rot) in f32, as the reference computes it, once at load; the cos/sin of
 * pos * inv_freq_k are the backend's rope_table op (kernels/composite.c). Partial rotary (qwen3_5, qwen4_exp)
 * rotates only the first n_rot dims of each head.
 */
#include <math.h>

#include "blocks/blocks.h"

void qw_rope_inv_freq(const qw_hparams *hp, float *inv_freq) {
    int half = hp->n_rot / 2;
    for (int k = 0; k < half; k++) {
        float e = (float)(2 * k) / (float)hp->n_rot;
        inv_freq[k] = 1.0f / powf(hp->rope_theta, e);
    }
    if (hp->rope_type == QW_ROPE_LINEAR) {
        for (int k = 0; k < half; k++) inv_freq[k] /= hp->rope_factor;
    } else if (hp->rope_type == QW_ROPE_LLAMA3) {
        /* wavelengths above original_ctx/low_freq are slowed by factor, below original_ctx/high_freq kept,
         * in between interpolated */
        float factor = hp->rope_factor, lo = hp->rope_low_freq, hi = hp->rope_high_freq;
        float old_ctx = (float)hp->rope_orig_ctx;
        float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
        for (int k = 0; k < half; k++) {
            float f = inv_freq[k];
            float wavelen = 2.0f * 3.14159265358979323846f / f;
            float scaled = wavelen > low_wavelen ? f / factor : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = (old_ctx / wavelen - lo) / (hi - lo);
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            }
            inv_freq[k] = scaled;
        }
    }
}
