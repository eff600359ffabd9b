/*
 * composite.h - the ops of ops.h that are made of other ops and small loops (routing, block selection, the
 * hyper-connection and PLE steps, strided copies), written once for every backend whose memory is the
 * host's (the scalar reference and the CPU backend share them). Each calls the primitive ops of the backend
 * it is given, so the CPU backend's composites run its vector kernels and keep their bits. Also the pure
 * functions they are made of, which the unit tests check against hand-worked cases.
 */
#ifndef QW_COMPOSITE_H
#define QW_COMPOSITE_H

#include "kernels/ops.h"

/* Top-k of n scores, descending; equal scores are ordered by ascending index. idx [k]. */
void qw_topk(const float *score, int n, int k, int *idx);
/* The key positions query i attends given the scores of its n_b complete blocks: the top min(topk, n_b)
 * blocks (positions b*R .. b*R+R-1, in block order) then the tail n_b*R .. i. chosen: work of n_b ints.
 * Returns the count written to sel. */
int qw_qsa_positions(const float *score, int n_b, int topk, int R, int i, int *chosen, int32_t *sel);
/* cs [n_tok][n_rot]: cos then sin of (pos0 + t) * inv_freq[k], in f32. */
void qw_rope_cs(const float *inv_freq, int n_rot, int pos0, int n_tok, float *cs);
/* The PLE table rows of every head for each token (ops.h ple_rows, spec qwen4_exp.md 3.3b-c). */
void qw_ple_hash(int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok, int ngram_n, int n_heads,
                 int32_t eos, const uint64_t *mult, const int64_t *prime, const int64_t *offset);

/* The composite ops (their definitions in ops.h). */
void qw_op_store_rows(const qw_backend *be, float *cache, const float *src, int n_tok, int64_t width,
                      const qw_step *step);
void qw_op_copy_strided(const qw_backend *be, float *dst, const float *src, const qw_copy_layout *l);
void qw_op_rms_norm_grouped(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int n_group,
                            int dim, float eps, int zero_centred);
void qw_op_divide(const qw_backend *be, float *x, float d, int64_t n, int then_silu);
void qw_op_act_mul(const qw_backend *be, float *y, float *a, const float *b, int64_t n, int act);
void qw_op_rms_norm_gate(const qw_backend *be, float *y, const float *x, const float *w, float *z, int n_rows, int dim,
                         float eps, int act);
void qw_op_rope_table(const qw_backend *be, float *cs, const float *inv_freq, int n_rot, int n_tok,
                      const qw_step *step);
void qw_op_qsa_keys(const qw_backend *be, float *raw, float *blk, const float *key_rows, int64_t key_stride, int n_tok,
                    int ihd, int R, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                    const qw_step *step);
void qw_op_qsa_select(const qw_backend *be, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                      const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                      const qw_step *step);
size_t qw_op_qsa_select_work(const qw_backend *be, int n_ctx, int R, int topk);
void qw_op_conv1d_state(const qw_backend *be, float *y, const float *x, float *hist, float *seq, const float *w,
                        int n_tok, int ch, int k, int dil, int then_silu, int keep_seq);
void qw_op_gdn_gate(const qw_backend *be, float *a, float *beta, const float *neg_exp_a, const float *dt_bias,
                    int n_tok, int hv);
void qw_op_moe_route(const qw_backend *be, int32_t *sel, float *wt, float *logits, int n_tok, int n_expert, int k,
                     int norm_topk);
void qw_op_moe_ffn(const qw_backend *be, float *y, const float *x, int32_t *sel, float *wt, float *logits,
                   int norm_topk, int n_tok, int k, const qw_ffn_w *experts, int n_expert, const qw_ffn_w *shared,
                   const qw_tensor *shared_gate, void *work);
size_t qw_op_moe_work(const qw_backend *be, int n_tok, int k, int n_expert, int H, int I, int I_shared);
void qw_op_hc_read(const qw_backend *be, float *a, float *m, float *u, const qw_tensor *up, const float *xn, float *inj,
                   int n_tok, int C, int H);
void qw_op_hc_inject(const qw_backend *be, float *X, const float *inj, const float *y, int n_tok, int C, int H,
                     float *xn, const float *norm_w, float eps);
void qw_op_ple_rows(const qw_backend *be, int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok,
                    int ngram_n, int n_heads, int32_t eos, const uint64_t *mult, const int64_t *prime,
                    const int64_t *offset);
void qw_op_ple_hist_push(const qw_backend *be, int32_t *hist, const int32_t *tokens, int n_tok, int ngram_n);
void qw_op_ple_gather(const qw_backend *be, float *e, const int64_t *rows, int64_t n, const qw_tensor *chunks,
                      int n_chunks, int64_t chunk_rows, int prefetch);
void qw_op_argmax(const qw_backend *be, int32_t *out, const float *x, int n_rows, int64_t n);
void qw_op_topk(const qw_backend *be, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k,
                void *work);
void qw_op_ple_gate(const qw_backend *be, float *G, const float *K, const float *Q, const float *V, int n_tok, int C,
                    int H);

/* Host memory for a backend's memory functions: aligned, zeroed allocation and plain copies. */
void *qw_host_alloc(const qw_backend *be, size_t bytes, qw_mem_kind kind);
void qw_host_free(const qw_backend *be, void *p);
void qw_host_copy(const qw_backend *be, void *dst, const void *src, size_t bytes);
void qw_host_zero(const qw_backend *be, void *p, size_t bytes);
void qw_host_sync(const qw_backend *be);

#endif
