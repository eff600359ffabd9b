/*
 * blocks.h - the building blocks the model files are assembled from. Each block reads the layer's weights
 * (blocks/weights.h), the step's context (qw_fwd) and the session's state for that layer, takes its
 * temporaries from the step's arena (released before it returns), and computes only through the backend's
 * ops: no code here reads or writes an activation (docs/ARCHITECTURE.md).
 *
 * Activations: [n_tok][width] f32 rows. Names follow the Hugging Face modules they mirror.
 */
#ifndef QW_BLOCKS_H
#define QW_BLOCKS_H

#include "kernels/composite.h"
#include "runtime/session.h"

/* RoPE: inv_freq [n_rot/2] (default, linear or llama3 scaling), computed at load. */
void qw_rope_inv_freq(const qw_hparams *hp, float *inv_freq);

/* self_attn: full attention (llama, qwen3), gated attention (qwen3_5, qwen3_next) or QSA (qwen4_exp).
 * zc: q/k norms zero-centred. x [n_tok][H] -> y [n_tok][H]. */
void qw_attn_forward(const qw_fwd *f, int il, const qw_attn_w *w, int zc, const float *x, float *y);

/* QSA indexer: its projection of a row is (n_idx_head + 1) * idx_head_dim wide (the queries, then the raw key);
 * qw_qsa_queries norms and RoPEs the queries of the step's n_tok rows iqk in place (the raw keys stay). */
int64_t qw_qsa_width(const qw_hparams *hp);
void qw_qsa_queries(const qw_fwd *f, const qw_attn_w *w, float *iqk);
/* For a segment's rows: updates its session's raw/pooled key cache and returns, for each of its queries, the
 * ascending key positions it attends (sel[sel_off[t] .. sel_off[t+1])), allocated in the arena; both NULL for a
 * step whose queries all keep every position (f->qsa_dense == its rows: dense causal attention). */
void qw_qsa_select(const qw_fwd *f, int il, const qw_attn_w *w, const float *iqk, qw_seg g, int32_t **sel,
                   int32_t **sel_off);
/* The same for rows row0 .. row0 + n - 1 of a batched step, one token of each of the sessions in r (qsa_rows): row
 * i's positions at sel[i * (topk + 1) R + sel_off[2 i] .. + sel_off[2 i + 1]); *sel_stride = (topk + 1) R. */
void qw_qsa_select_rows(const qw_fwd *f, const qw_attn_w *w, const float *iqk, int row0, int n, const qw_attn_rows *r,
                        int32_t **sel, int32_t **sel_off, int *sel_stride);

/* linear_attn: Gated DeltaNet. x [n_tok][H] -> y [n_tok][H]. gate_sigmoid: sigma output gate, else silu. */
void qw_gdn_forward(const qw_fwd *f, int il, const qw_gdn_w *w, int gate_sigmoid, const float *x, float *y);
/* The delta rule a token at a time (the bits of one-token steps; a longer call may take the chunked form): draft
 * steps and qwenc_session_accept's replay of kept tokens. */
void qw_gdn_recur(const qw_backend *be, float *o, float *state, const float *q, const float *k, const float *v,
                  const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled);
/* 1 when the layer's value heads are in llama.cpp's tiled order (the delta rule's `tiled`) */
int qw_gdn_tiled(const qw_gdn_w *w, int hk, int hv);
/* A batched step's convolutions through conv1d_state_rows (QW_ROWS_MAX rows a call): y, x [n_tok][ch], row r over
 * session r's history of layer il (its PLE history when ple, else its DeltaNet conv state). 0, nothing done: not a
 * batched step, or the backend has no such op (the caller runs conv1d_state a segment at a time). */
int qw_conv_rows(const qw_fwd *f, int il, int ple, float *y, const float *x, const float *w, int ch, int k, int dil,
                 int then_silu);

/* mlp: SwiGLU down(silu(gate x) * up x) for n rows. */
void qw_ffn_forward(const qw_fwd *f, const qw_ffn_w *w, const float *x, float *y, int n);
/* mlp: sparse MoE with shared expert. x [n_tok][H] -> y [n_tok][H]. */
void qw_moe_forward(const qw_fwd *f, const qw_moe_w *w, const float *x, float *y);

/* Hyper-connection: X [n_tok][C*H] -> block input a [n_tok][H] and injection inj [n_tok][C]
 * (inj may be NULL for the final mixer). */
void qw_hc_forward(const qw_fwd *f, const qw_hc_w *w, const float *X, float *a, float *inj);
/* X[s] += inj[s] * y for every stream s. */
void qw_hc_inject(const qw_fwd *f, float *X, const float *inj, const float *y);
/* qw_hc_inject (the block before's output y with its weights inj_y) then qw_hc_forward, the inject and the norm
 * one op (inj may be inj_y: read, then overwritten). */
void qw_hc_inject_forward(const qw_fwd *f, const qw_hc_w *w, float *X, const float *y, const float *inj_y, float *a,
                          float *inj);

/* PLE: X [n_tok][C*H] += PLE(X, token ids) of PLE layer il. */
void qw_ple_forward(const qw_fwd *f, int il, const qw_ple_w *w, float *X);
/* PLE: ask for the n-gram table rows the step will read (their pages start loading; nothing waits). */
void qw_ple_prefetch(const qw_fwd *f, const qw_ple_w *w);
/* PLE constants: hash multipliers, per-head primes and offsets, padded rows (spec 3.3a). */
void qw_ple_constants(const qw_hparams *hp, int li, uint64_t *mult, int64_t *prime, int64_t *offset,
                      int64_t *n_rows);
/* Table rows of every head for each new token (spec 3.3b-c), on the host; rows [n_tok][n_heads].
 * hist: the ngram_n-1 ids before tokens[0] (EOS before the start of the sequence). */
void qw_ple_rows(const qw_hparams *hp, const qw_ple_w *w, const int32_t *hist, const int32_t *tokens, int n_tok,
                 int64_t *rows);
uint64_t qw_splitmix64(uint64_t v);

#endif
