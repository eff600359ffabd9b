/*
 * blocks.h - the building blocks the model files are assembled from. Each block reads the layer's
 * weights (models/model.h), the call's context (qw_fwd) and the session's state for that layer, and
 * takes its temporaries from the call's arena (released before it returns).
 *
 * Activations: [n_tok][width] f32 rows. Names follow the Hugging Face modules they mirror.
 */
#ifndef QW_BLOCKS_H
#define QW_BLOCKS_H

#include "runtime/session.h"

/* RoPE: inv_freq [n_rot/2] (default, linear or llama3 scaling); cs [n_tok][n_rot] (cos then sin). */
void qw_rope_inv_freq(const qw_hparams *hp, float *inv_freq);
void qw_rope_cs(const float *inv_freq, int n_rot, int pos0, int n_tok, float *cs);

/* Grouped RMS norm: each of the n_group consecutive dim-chunks of each row gets its own mean square and
 * its own chunk of w (zero-centred when zc). x [n_rows][n_group*dim], y may alias x. */
void qw_norm_grouped(const qw_ops *ops, float *y, const float *x, const float *w, int n_rows, int n_group, int dim,
                     float eps, int zc);

/* self_attn: full attention (llama, qwen3), gated attention (qwen3_5, qwen3_next) or QSA (qwen4_exp).
 * zc: q/k norms zero-centred. x [n_tok][H] -> y [n_tok][H]. */
void qw_attn_forward(const qw_fwd *f, int il, const qw_attn_w *w, int zc, const float *x, float *y);

/* QSA indexer: updates the layer's raw/pooled key cache and returns, for each new query, the ascending
 * key positions it attends (sel[sel_off[t] .. sel_off[t+1])), allocated in the arena. */
void qw_qsa_select(const qw_fwd *f, int il, const qw_attn_w *w, const float *x, int32_t **sel, int32_t **sel_off);

/* The key positions query i attends given the scores of its n_b complete blocks: the top min(topk, n_b)
 * blocks (positions b*R .. b*R+R-1, in block order) then the tail n_b*R .. i. chosen: work of n_b ints.
 * Returns the count written to sel. */
int qw_qsa_positions(const float *score, int n_b, int topk, int R, int i, int *chosen, int32_t *sel);

/* Top-k of n scores, descending; equal scores are ordered by ascending index. idx [k]. */
void qw_topk(const float *score, int n, int k, int *idx);

/* linear_attn: Gated DeltaNet. x [n_tok][H] -> y [n_tok][H]. gate_sigmoid: sigma output gate, else silu. */
void qw_gdn_forward(const qw_fwd *f, int il, const qw_gdn_w *w, int gate_sigmoid, const float *x, float *y);

/* mlp: SwiGLU down(silu(gate x) * up x) for n rows. */
void qw_ffn_forward(const qw_fwd *f, const qw_ffn_w *w, const float *x, float *y, int n);
/* mlp: sparse MoE with shared expert. x [n_tok][H] -> y [n_tok][H]. */
void qw_moe_forward(const qw_fwd *f, const qw_moe_w *w, const float *x, float *y);

/* Hyper-connection: X [n_tok][C*H] -> block input a [n_tok][H] and injection inj [n_tok][C]
 * (inj may be NULL for the final mixer). */
void qw_hc_forward(const qw_fwd *f, const qw_hc_w *w, const float *X, float *a, float *inj);
/* X[s] += inj[s] * y for every stream s. */
void qw_hc_inject(const qw_fwd *f, float *X, const float *inj, const float *y);

/* PLE: X [n_tok][C*H] += PLE(X, token ids) of PLE layer il. */
void qw_ple_forward(const qw_fwd *f, int il, const qw_ple_w *w, float *X);
/* PLE: ask for the n-gram table rows the step will read (their pages start loading; nothing waits). */
void qw_ple_prefetch(const qw_fwd *f, const qw_ple_w *w);
/* PLE constants: hash multipliers, per-head primes and offsets, padded rows (spec 3.3a). */
void qw_ple_constants(const qw_hparams *hp, int li, uint64_t *mult, int64_t *prime, int64_t *offset,
                      int64_t *n_rows);
/* Table rows of every head for each new token (spec 3.3b-c); rows [n_tok][n_heads].
 * hist: the ngram_n-1 ids before tokens[0] (EOS before the start of the sequence). */
void qw_ple_rows(const qw_hparams *hp, const qw_ple_w *w, const int32_t *hist, const int32_t *tokens, int n_tok,
                 int64_t *rows);
uint64_t qw_splitmix64(uint64_t v);

#endif
