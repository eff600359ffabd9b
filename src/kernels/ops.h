/*
 * ops.h - the backend interface: the memory a backend owns and the ops it implements. Each model's forward
 * is written once against it (docs/ARCHITECTURE.md), and no code outside a backend reads or writes the
 * memory it hands out.
 *
 * Memory. Activations, a session's state (KV cache, DeltaNet states, PLE history, QSA keys) and every
 * scratch buffer come from the backend's alloc, are addressed by plain pointers (a device address on a GPU),
 * and cross to the host only through upload / download. Weights are qw_tensor views whose data the backend
 * can read: the CPU backend reads the mapped file in place; small f32 vectors made at load are uploaded.
 * A backend whose memory is the host's sets host_memory: a caller may then hand it host buffers directly
 * (the logits of a step are written straight into the caller's array).
 *
 * Ops. Activations are f32, row-major, one row per token. An op may be asynchronous: results are in memory
 * once sync returns, and download syncs first. Ops that depend on where a forward step stands in its
 * sequence read the step's position from a qw_step in backend memory, written before the step with upload,
 * so a step's op calls are the same at every position (a GPU backend can capture a decode step once and
 * replay it). The order of every floating-point operation is part of an op's definition: kernels/ref.c is
 * the scalar oracle of every op, and every other implementation is tested against it (tests/t_kernels.c)
 * for the same bits or within a bound stated there.
 */
#ifndef QW_OPS_H
#define QW_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/hostdev.h"
#include "tensor/tensor.h"

typedef struct qw_backend qw_backend;

/* One matmul of a batch: y [n_tok][rows] = x [n_tok][cols] W^T. */
typedef struct {
    float *y;
    const qw_tensor *w;
    const float *x;
    int n_tok;
} qw_matmul_job;

/* A SwiGLU feed-forward: down(silu(gate x) * up x); gate, up [I, H], down [H, I]. */
typedef struct {
    qw_tensor gate, up, down;
} qw_ffn_w;

/* Where a forward step stands: what the position-dependent ops read (backend memory, one per session). */
typedef struct {
    int32_t pos0; /* position of the step's first token = tokens already in the session */
} qw_step;

/* A strided copy of up to four dimensions: dst[i3][i2][i1][i0] = src[i3][i2][i1][i0], the element at
 * d[0]*i0 + d[1]*i1 + d[2]*i2 + d[3]*i3 floats from dst (s[] likewise from src); ne[] the extents (1 for an
 * unused dimension). dst and src must not overlap. */
typedef struct {
    int64_t ne[4], d[4], s[4];
} qw_copy_layout;

enum { QW_ACT_SILU = 0, QW_ACT_SIGMOID = 1 };

#define QW_ROWS_MAX 32 /* the sessions' rows of one call of the *_rows ops */

/* A batched step's attention rows (kv_store_rows, qsa_rows, attention_rows): row r is one token of its own session,
 * whose layer caches and step these are (backend addresses; the struct itself in host memory). */
typedef struct {
    float *k[QW_ROWS_MAX], *v[QW_ROWS_MAX];             /* key and value caches [n_ctx][n_head_kv][hd] */
    float *idx_raw[QW_ROWS_MAX], *idx_blk[QW_ROWS_MAX]; /* the QSA indexer's raw and block keys (QSA layers) */
    const qw_step *step[QW_ROWS_MAX];                   /* the session's step: the row's position is its pos0 */
} qw_attn_rows;

/* Memory kinds: the guard mode of the CPU backend (tests) makes ACT and STATE memory inaccessible outside
 * the backend's own calls; WEIGHTS are read-only after upload. */
typedef enum { QW_MEM_WEIGHTS = 0, QW_MEM_STATE, QW_MEM_ACT } qw_mem_kind;

/* The functions of a backend. Every op takes the backend itself first: a backend keeps its state (thread pool,
 * device, streams) beside the table. */
struct qw_backend {
    const char *name;
    int host_memory; /* its memory is the host's: host buffers may be passed to ops and get back host pointers */

    /* ---- memory */
    /* bytes of zeroed memory, 64-byte aligned; NULL when out of memory. */
    void *(*alloc)(const qw_backend *be, size_t bytes, qw_mem_kind kind);
    void (*free)(const qw_backend *be, void *p);
    void (*upload)(const qw_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(const qw_backend *be, void *host_dst, const void *src, size_t bytes);
    /* dst = src (backend memory on both sides; may not overlap) and p = 0, bytes long */
    void (*copy)(const qw_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(const qw_backend *be, void *p, size_t bytes);
    /* wait until every op issued so far has completed */
    void (*sync)(const qw_backend *be);

    /* ---- matrix products and gathers */
    /* Weights (w->data) are host views of the model: their bytes stay at their address, unchanged, for the backend's
     * life (a backend without host memory keeps its copy of a weight under that address). */
    /* y[t][r] = sum_c W[r][c] * x[t][c]; W [rows, cols], x [n_tok][cols], y [n_tok][rows]. */
    void (*matmul)(const qw_backend *be, float *y, const qw_tensor *w, const float *x, int n_tok);
    /* Independent matmuls (e.g. a layer's q, k and v) as one unit of work: the results are those of calling
     * matmul on each job; a backend may spread all their rows over its threads at once. */
    void (*matmul_batch)(const qw_backend *be, const qw_matmul_job *jobs, int n_jobs);
    /* y[i] = row ids[i] of W [n_rows, dim] as f32; ids [n] int32 in backend memory, y [n][dim]. */
    void (*get_rows)(const qw_backend *be, float *y, const qw_tensor *w, const int32_t *ids, int n);
    /* dst rows pos0 .. pos0+n_tok-1 (pos0 from step) of a cache with `width` floats per row = src [n_tok][width] */
    void (*store_rows)(const qw_backend *be, float *cache, const float *src, int n_tok, int64_t width,
                       const qw_step *step);
    void (*copy_strided)(const qw_backend *be, float *dst, const float *src, const qw_copy_layout *l);

    /* ---- norms and element-wise */
    /* RMS norm of n_rows vectors of length dim (y may alias x):
     * y = x / sqrt(mean(x^2) + eps) * (w or 1+w if zero_centred; 1 if w is NULL). w [dim]. */
    void (*rms_norm)(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                     int zero_centred);
    /* The same with n_group weight vectors: row r uses w + (r % n_group) * dim. w [n_group][dim]. */
    void (*rms_norm_grouped)(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int n_group,
                             int dim, float eps, int zero_centred);
    /* x / sqrt(sum(x^2) + eps) * scale for n_rows vectors of length dim, in place; scale for the first n_scaled
     * rows, 1 for the rest (two calls' bits in one). */
    void (*l2_norm)(const qw_backend *be, float *x, int n_rows, int dim, float eps, float scale, int n_scaled);
    /* x = silu(x), x = sigmoid(x), y = a * b, y += a * s, x = x / d (a division, as the reference divides; then
     * silu(x) when then_silu: the bits of divide and silu, one kernel where a backend fuses them). */
    void (*silu)(const qw_backend *be, float *x, int64_t n);
    void (*sigmoid)(const qw_backend *be, float *x, int64_t n);
    void (*mul)(const qw_backend *be, float *y, const float *a, const float *b, int64_t n);
    void (*axpy)(const qw_backend *be, float *y, const float *a, float s, int64_t n);
    void (*divide)(const qw_backend *be, float *x, float d, int64_t n, int then_silu);
    /* y = act(a) * b with act silu or sigmoid (QW_ACT_*): the same bits as act(a) then mul(y, a, b); a may be
     * left holding act(a) or anything else; y may alias a or b. One kernel where a backend fuses them. */
    void (*act_mul)(const qw_backend *be, float *y, float *a, const float *b, int64_t n, int act);
    /* y = rms_norm(x; w) * act(z) for n_rows rows of dim (w [dim] or NULL, not zero-centred; z [n_rows][dim]; y may
     * alias x): the bits of rms_norm, then act_mul(y, z, y) (the DeltaNet's gated norm; one kernel where a backend
     * fuses them). */
    void (*rms_norm_gate)(const qw_backend *be, float *y, const float *x, const float *w, float *z, int n_rows,
                          int dim, float eps, int act);

    /* ---- positions and attention */
    /* cs [n_tok][n_rot]: cos(p * f_i) for i < n_rot/2 then sin(p * f_i), p = pos0 + t (pos0 from step);
     * inv_freq [n_rot/2] in backend memory. */
    void (*rope_table)(const qw_backend *be, float *cs, const float *inv_freq, int n_rot, int n_tok,
                       const qw_step *step);
    /* Rotate-half (NeoX) RoPE on the first n_rot dims of every head, in place.
     * x [n_tok][row_stride] with n_head heads of head_stride floats from offset 0; cs from rope_table. */
    void (*rope)(const qw_backend *be, float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot,
                 const float *cs);
    /* Each head's rms_norm, then its RoPE, in place (optional: NULL where the two ops run one by one; callers use
     * qw_be_rms_norm_rope): x [n_tok][row_stride] with n_head heads of hd floats from offset 0; every head
     * rms_norm(head, head, w, 1 row, hd, eps, zc), then rope(x, n_tok, row_stride, n_head, hd, n_rot, cs): the bits
     * of those two ops (a backend may run them as one). */
    void (*rms_norm_rope)(const qw_backend *be, float *x, const float *w, int n_tok, int row_stride, int n_head,
                          int hd, float eps, int zc, int n_rot, const float *cs);
    /* The keys' rms_norm_rope (k [n_tok][n_head * hd]) and both cache stores of a step (optional: NULL where the
     * ops run one by one): rms_norm_rope(k, w, n_tok, n_head * hd, n_head, hd, eps, zc, n_rot, cs), then
     * store_rows(k_cache, k, n_tok, n_head * hd, step) and store_rows(v_cache, v, ...): the bits of those ops. */
    void (*rms_norm_rope_kv)(const qw_backend *be, float *k, const float *w, int n_tok, int n_head, int hd, float eps,
                             int zc, int n_rot, const float *cs, float *k_cache, const float *v, float *v_cache,
                             const qw_step *step);
    /*
     * Softmax attention of n_tok queries against the KV cache.
     * q [n_tok][q_stride] (head h at h*hd), k/v cache [n_ctx][n_head_kv][hd], out [n_tok][n_head][hd].
     * Query t (absolute position pos0+t, pos0 from step) sees key positions sel[sel_off[t] .. sel_off[t+1])
     * when sel is not NULL (ascending; from qsa_select), else 0 .. pos0+t. Head h uses kv head h / (n_head /
     * n_head_kv). work: scratch of at least attention_work(n_ctx, hd) bytes.
     */
    void (*attention)(const qw_backend *be, float *out, const float *q, int q_stride, const float *k_cache,
                      const float *v_cache, int n_tok, int n_head, int n_head_kv, int hd, float scale,
                      const int32_t *sel, const int32_t *sel_off, void *work, const qw_step *step);
    size_t (*attention_work)(const qw_backend *be, int n_ctx, int hd);

    /* ---- QSA (spec qwen4_exp.md 3.5): the block indexer */
    /* The indexer keys of a step: raw [n_ctx][ihd] rows pos0.. = the n_tok keys at key_rows (row t at
     * key_rows + t * key_stride); every block of R positions the step completes gets its pooled key in
     * blk [n_ctx/R][ihd]: the f32 mean of its R raw keys, zero-centred RMS norm with k_norm [ihd], then RoPE at
     * the block's first position (inv_freq [n_rot/2], as rope_table). */
    void (*qsa_keys)(const qw_backend *be, float *raw, float *blk, const float *key_rows, int64_t key_stride,
                     int n_tok, int ihd, int R, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                     const qw_step *step);
    /* The keys each query attends: query t (position i = pos0 + t) scores its n_b = (i+1)/R complete blocks,
     * score_b = sum_h relu(q_h . blk_b) / sqrt(ihd) over its n_head queries (q row t at q + t * q_stride, head
     * h at h * ihd), keeps the top topk (ties: the lower block; all of them when n_b <= topk), and attends their
     * positions in ascending order, then the tail n_b*R .. i. sel [n_tok][(topk + 1) * R] and sel_off
     * [n_tok + 1] for attention; work: qsa_select_work bytes. */
    void (*qsa_select)(const qw_backend *be, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                       const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                       const qw_step *step);
    size_t (*qsa_select_work)(const qw_backend *be, int n_ctx, int R, int topk);

    /* ---- Gated DeltaNet (spec qwen4_exp.md 3.4) */
    /* Depthwise causal convolution: y[t][c] = sum_j w[c][j] * x[t + j*dil][c], j < k;
     * x [(k-1)*dil + n_tok][ch] (history rows first), w [ch][k], y [n_tok][ch]; then_silu: then y = silu(y), the
     * bits of the silu op after it. */
    void (*conv1d_dw)(const qw_backend *be, float *y, const float *x, const float *w, int n_tok, int ch, int k,
                      int dil, int then_silu);
    /* The convolution over a session's history, which it moves on: seq = hist ([(k-1)*dil][ch]) followed by the
     * new rows x ([n_tok][ch]) into seq ([(k-1)*dil + n_tok][ch]: kept when keep_seq, else scratch; x may
     * already lie there), y = conv1d_dw(seq), hist = seq's last (k-1)*dil rows. The bits of those copies and
     * conv1d_dw (a backend may do it all in one kernel). */
    void (*conv1d_state)(const qw_backend *be, float *y, const float *x, float *hist, float *seq, const float *w,
                         int n_tok, int ch, int k, int dil, int then_silu, int keep_seq);
    /* g[t][j] = neg_exp_a[j] * softplus(a[t][j] + dt_bias[j]) in place (a becomes g); [n_tok][hv]. With beta (not
     * NULL, [n_tok][hv]) also beta = sigmoid(beta) in place, the sigmoid op's bits (one kernel for both). */
    void (*gdn_gate)(const qw_backend *be, float *a, float *beta, const float *neg_exp_a, const float *dt_bias,
                     int n_tok, int hv);
    /* One session's inputs of the delta rule for n_tok tokens (optional: NULL where the ops run one by one; callers
     * use qw_be_gdn_prep, whose qw_gdn_prep_ops are the reference): conv1d_state(c, x, hist, seq, w, n_tok rows,
     * ch, k, dilation 1, then_silu, keep_seq); then q, k and v, [n_tok][hk dk], [n_tok][hk dk] and
     * [n_tok][ch - 2 hk dk], copied out of c's rows (copy_strided; one token: q = c, k = c + hk dk, v = c + 2 hk dk,
     * no copies); l2_norm of q's heads times q_scale and of k's heads; then gdn_gate(a, beta, neg_exp_a, dt_bias,
     * n_tok, hv): the bits of those ops (a backend may run them as one). */
    void (*gdn_prep)(const qw_backend *be, float *c, float *q, float *k, float *v, const float *x, float *hist,
                     float *seq, int keep_seq, const float *w, int n_tok, int ch, int kc, int hk, int dk, float eps,
                     float q_scale, float *a, float *beta, const float *neg_exp_a, const float *dt_bias, int hv);
    /*
     * Gated delta rule, token by token, per value head j (qk head j / (hv/hk)):
     *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
     * q, k [n_tok][hk][dk] (already l2-normalised, q scaled), v [n_tok][hv][dv], g, beta [n_tok][hv],
     * state [hv][dk][dv] (updated), o [n_tok][hv][dv]. tiled: the value heads in llama.cpp's tiled order, value
     * head j reading q/k head j % hk (else j / (hv/hk)); v, g, beta, o and the state all in that order.
     */
    void (*delta_rule)(const qw_backend *be, float *o, float *state, const float *q, const float *k, const float *v,
                       const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled);
    /* delta_rule, then the gated norm of its output in place (optional: NULL where the two ops run one by one):
     * rms_norm_gate(o, o, w, z, n_tok * hv rows, dv, eps, act) after delta_rule(o, ...): the bits of those two ops
     * (a backend may finish each value head's norm in the kernel of its delta rule). */
    void (*delta_rule_gate)(const qw_backend *be, float *o, float *state, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, int n_tok, int hk, int hv, int dk,
                            int dv, int tiled, const float *w, float *z, float eps, int act);
    /* A batched step's rows, one token of each of n sessions (optional: NULL where the blocks call the op above
     * once a session): row r through its own session's state, hist[r] or state[r] (n <= QW_ROWS_MAX backend
     * addresses, the array in host memory). conv1d_state_rows: conv1d_state(y + r ch, x + r ch, hist[r], scratch, w,
     * 1 row, ch, k, dil, then_silu, keep_seq 0) for each row r; delta_rule_rows: delta_rule(o + r hv dv, state[r],
     * q + r hk dk, k + r hk dk, v + r hv dv, g + r hv, beta + r hv, 1 token, hk, hv, dk, dv, tiled) for each row r.
     * The bits of those calls (a backend may run all the rows in one kernel). */
    void (*conv1d_state_rows)(const qw_backend *be, float *y, const float *x, float *const *hist, const float *w,
                              int n, int ch, int k, int dil, int then_silu);
    void (*delta_rule_rows)(const qw_backend *be, float *o, float *const *state, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, int n, int hk, int hv, int dk, int dv,
                            int tiled);
    /* The same for a batched step's attention (optional, all three or none: NULL where the blocks call the ops above
     * once a session), n <= QW_ROWS_MAX rows of the sessions in r, the bits of those calls for each row i:
     * kv_store_rows: store_rows(r->k[i], k + i width, 1, width, r->step[i]), then the same of v into r->v[i];
     * qsa_rows: qsa_keys(r->idx_raw[i], r->idx_blk[i], key_rows + i row_stride, row_stride, 1, ihd, R, k_norm, eps,
     *   inv_freq, n_rot, r->step[i]), then qsa_select(sel + i (topk + 1) R, sel_off + 2 i, q + i row_stride,
     *   row_stride, r->idx_blk[i], 1, n_head, ihd, R, topk, work, r->step[i]): sel [n][(topk + 1) R], sel_off
     *   [n][2] (each row's positions where its own call would put them); work: qsa_select_work bytes;
     * attention_rows: attention(out + i n_head hd, q + i q_stride, q_stride, r->k[i], r->v[i], 1, n_head,
     *   n_head_kv, hd, scale, sel ? sel + i (topk + 1) R : NULL, sel ? sel_off + 2 i : NULL, work, r->step[i]),
     *   sel_stride = (topk + 1) R; work: attention_work bytes. */
    void (*kv_store_rows)(const qw_backend *be, const qw_attn_rows *r, const float *k, const float *v, int n,
                          int64_t width);
    void (*qsa_rows)(const qw_backend *be, const qw_attn_rows *r, int32_t *sel, int32_t *sel_off, const float *q,
                     const float *key_rows, int64_t row_stride, int n, int n_head, int ihd, int R, int topk,
                     const float *k_norm, float eps, const float *inv_freq, int n_rot, void *work);
    void (*attention_rows)(const qw_backend *be, const qw_attn_rows *r, float *out, const float *q, int q_stride,
                           int n, int n_head, int n_head_kv, int hd, float scale, const int32_t *sel,
                           const int32_t *sel_off, int sel_stride, void *work);

    /* ---- mixture of experts (spec qwen4_exp.md 3.6) */
    /* Routing: p = softmax(logits) over the n_expert (in place: logits [n_tok][n_expert] becomes p); the top k
     * (ties: the lower expert) into sel [n_tok][k], their p into wt [n_tok][k], divided by their sum when
     * norm_topk. */
    void (*moe_route)(const qw_backend *be, int32_t *sel, float *wt, float *logits, int n_tok, int n_expert, int k,
                      int norm_topk);
    /* y [n_tok][H] = sum_j wt[t][j] * expert_{sel[t][j]}(x[t]) + (shared ? sigmoid(shared_gate . x[t]) *
     * shared(x[t]) : 0), the experts SwiGLU feed-forwards; the weighted expert outputs are added to the shared
     * expert's output in the order of the expert ids, then of the tokens' slots. shared_gate [1, H] (NULL: a
     * gate of 1). work: moe_work bytes. With logits (not NULL) the op routes first, as moe_route (sel and wt
     * written; logits its scratch). */
    void (*moe_ffn)(const qw_backend *be, float *y, const float *x, int32_t *sel, float *wt, float *logits,
                    int norm_topk, int n_tok, int k, const qw_ffn_w *experts, int n_expert, const qw_ffn_w *shared,
                    const qw_tensor *shared_gate, void *work);
    size_t (*moe_work)(const qw_backend *be, int n_tok, int k, int n_expert, int H, int I, int I_shared);

    /* ---- hyper-connections (spec qwen4_exp.md 3.2), C streams of H */
    /* a[t] = (1/C) sum_s m[t][s] (m [n_tok][C][H], a [n_tok][H]); with xn (not NULL, [n_tok][C][H]) m holds gate
     * logits and each term is sigmoid(m[t][s]) * xn[t][s] (act_mul's QW_ACT_SIGMOID, its bits; m may then be
     * overwritten); when inj is not NULL, inj = 2 sigmoid(inj / C) in place ([n_tok][C]). With up (not NULL, [C H]
     * [r]) the gate logits are made first from u [n_tok][r]: u = silu(u / C) (divide's bits), m = up . u (matmul's
     * bits); u and m are then scratch (one kernel for all of it where a backend fuses them). */
    void (*hc_read)(const qw_backend *be, float *a, float *m, float *u, const qw_tensor *up, const float *xn,
                    float *inj, int n_tok, int C, int H);
    /* X[t][s] += inj[t][s] * y[t] for every stream s; X [n_tok][C][H], y [n_tok][H]. With xn (not NULL, [n_tok][C]
     * [H]) then xn = each H-wide stream of X through the zero-centred RMS norm with norm_w [C][H] and eps: the bits
     * of rms_norm_grouped after the inject (the next hyper-connection's norm; one kernel where a backend fuses them). */
    void (*hc_inject)(const qw_backend *be, float *X, const float *inj, const float *y, int n_tok, int C, int H,
                      float *xn, const float *norm_w, float eps);

    /* ---- the hashed n-gram embedding, PLE (spec qwen4_exp.md 3.3) */
    /* rows [n_tok][n_heads] int64: the table row of each head for each token (tokens [n_tok] int32, hist the
     * ngram_n-1 ids before them, oldest first; an id equal to eos cuts the n-gram); mult [ngram_n], prime and
     * offset [n_heads] in backend memory. */
    void (*ple_rows)(const qw_backend *be, int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok,
                     int ngram_n, int n_heads, int32_t eos, const uint64_t *mult, const int64_t *prime,
                     const int64_t *offset);
    /* hist = the last ngram_n-1 ids of hist followed by tokens [n_tok] (the next step's history). */
    void (*ple_hist_push)(const qw_backend *be, int32_t *hist, const int32_t *tokens, int n_tok, int ngram_n);
    /* e [n][dh] = the table rows rows [n], the table in n_chunks pieces of chunk_rows rows (the last may be
     * shorter). prefetch != 0: only ask for the rows' memory to be brought in (a hint; computes nothing). */
    void (*ple_gather)(const qw_backend *be, float *e, const int64_t *rows, int64_t n, const qw_tensor *chunks,
                       int n_chunks, int64_t chunk_rows, int prefetch);
    /* G[t][s] = sigmoid(g) * V[t], g = sign(x) sqrt(max(|x|, 1e-6)), x = <K[t][s], Q[t][s]> / sqrt(H)
     * (the dot in double); K, Q, G [n_tok][C][H], V [n_tok][H]. */
    void (*ple_gate)(const qw_backend *be, float *G, const float *K, const float *Q, const float *V, int n_tok, int C,
                     int H);

    /* ---- choosing */
    /* out[r] = the index of the largest of x[r][0..n) for r < n_rows, the lowest index among equal values (as
     * the greedy sampler): greedy drafts without the logits leaving the backend. */
    void (*argmax)(const qw_backend *be, int32_t *out, const float *x, int n_rows, int64_t n);
    /* ids[r][0..k), vals[r][0..k) = the k largest of x[r][0..n) for r < n_rows, largest first, among equal values
     * the lower index first, a NaN below every number (qw_topk_better); 1 <= k <= QW_TOPK_MAX, k <= n; work:
     * qw_topk_work(n_rows, n, k) bytes of backend memory. Optional (NULL: the caller brings the logits to the host
     * instead): sampling from the top candidates without the logits leaving the backend. */
    void (*topk)(const qw_backend *be, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k,
                 void *work);

    /* ---- graphs (optional: NULL where a backend has none, as on the CPU, and under an interposer) */
    /* The ops issued between graph_begin and graph_end are recorded, not run; graph_end returns them as a graph
     * (NULL when recording failed) that graph_launch runs again, with the same addresses and the values then in
     * memory (a decode step: the same calls at every position). graph_begin returns 0 on success. */
    int (*graph_begin)(const qw_backend *be);
    void *(*graph_end)(const qw_backend *be);
    void (*graph_launch)(const qw_backend *be, void *graph);
    void (*graph_free)(const qw_backend *be, void *graph);

    /* ---- placement (optional: NULL where a backend has one place for everything, as on the CPU) */
    /* The memory allocated and the ops issued from now on belong to layer il (0 .. n_layer, the last the MTP
     * head's) or, il < 0, to the model's own parts (embeddings, the n-gram table, the head) and the session's
     * inputs and scratch: a backend that spreads layers over devices (CUDA, --split layer) runs them, and places
     * their state, where that layer lives. Results do not depend on it. Callers use qw_be_layer. */
    void (*layer)(const qw_backend *be, int il);

    /* ---- the backend object */
    void (*release)(qw_backend *be); /* frees the backend (NULL: a static table) */
};

/* be->layer when the backend has it */
static inline void qw_be_layer(const qw_backend *be, int il) {
    if (be->layer) be->layer(be, il);
}

/* gdn_prep as its ops */
static inline void qw_gdn_prep_ops(const qw_backend *be, float *c, float *q, float *k, float *v, const float *x,
                                   float *hist, float *seq, int keep_seq, const float *w, int n_tok, int ch, int kc,
                                   int hk, int dk, float eps, float q_scale, float *a, float *beta,
                                   const float *neg_exp_a, const float *dt_bias, int hv) {
    be->conv1d_state(be, c, x, hist, seq, w, n_tok, ch, kc, 1, 1, keep_seq);
    const int64_t kd = (int64_t)hk * dk, vd = ch - 2 * kd;
    if (n_tok == 1) { /* q's rows then k's, one call */
        be->l2_norm(be, c, 2 * hk, dk, eps, q_scale, hk);
    } else {
        qw_copy_layout qk = {{kd, n_tok, 1, 1}, {1, kd, 0, 0}, {1, ch, 0, 0}};
        be->copy_strided(be, q, c, &qk);
        be->copy_strided(be, k, c + kd, &qk);
        qw_copy_layout vl = {{vd, n_tok, 1, 1}, {1, vd, 0, 0}, {1, ch, 0, 0}};
        be->copy_strided(be, v, c + 2 * kd, &vl);
        be->l2_norm(be, q, n_tok * hk, dk, eps, q_scale, n_tok * hk);
        be->l2_norm(be, k, n_tok * hk, dk, eps, 1.0f, 0);
    }
    be->gdn_gate(be, a, beta, neg_exp_a, dt_bias, n_tok, hv);
}
/* be->gdn_prep when the backend has it, else its ops */
static inline void qw_be_gdn_prep(const qw_backend *be, float *c, float *q, float *k, float *v, const float *x,
                                  float *hist, float *seq, int keep_seq, const float *w, int n_tok, int ch, int kc,
                                  int hk, int dk, float eps, float q_scale, float *a, float *beta,
                                  const float *neg_exp_a, const float *dt_bias, int hv) {
    if (be->gdn_prep)
        be->gdn_prep(be, c, q, k, v, x, hist, seq, keep_seq, w, n_tok, ch, kc, hk, dk, eps, q_scale, a, beta,
                     neg_exp_a, dt_bias, hv);
    else
        qw_gdn_prep_ops(be, c, q, k, v, x, hist, seq, keep_seq, w, n_tok, ch, kc, hk, dk, eps, q_scale, a, beta,
                        neg_exp_a, dt_bias, hv);
}

/* rms_norm_rope as its two ops */
static inline void qw_rms_norm_rope_ops(const qw_backend *be, float *x, const float *w, int n_tok, int row_stride,
                                        int n_head, int hd, float eps, int zc, int n_rot, const float *cs) {
    if (row_stride == n_head * hd)
        be->rms_norm(be, x, x, w, n_tok * n_head, hd, eps, zc);
    else
        for (int t = 0; t < n_tok; t++) {
            float *xt = x + (int64_t)t * row_stride;
            be->rms_norm(be, xt, xt, w, n_head, hd, eps, zc);
        }
    be->rope(be, x, n_tok, row_stride, n_head, hd, n_rot, cs);
}
/* be->rms_norm_rope when the backend has it, else its two ops */
static inline void qw_be_rms_norm_rope(const qw_backend *be, float *x, const float *w, int n_tok, int row_stride,
                                       int n_head, int hd, float eps, int zc, int n_rot, const float *cs) {
    if (be->rms_norm_rope)
        be->rms_norm_rope(be, x, w, n_tok, row_stride, n_head, hd, eps, zc, n_rot, cs);
    else
        qw_rms_norm_rope_ops(be, x, w, n_tok, row_stride, n_head, hd, eps, zc, n_rot, cs);
}

/* kv_store_rows, qsa_rows and attention_rows as the calls they stand for, a row at a time (a backend without them; the
 * blocks use qw_be_attn_rows, which picks) */
static inline void qw_kv_store_rows_ops(const qw_backend *be, const qw_attn_rows *r, const float *k, const float *v,
                                        int n, int64_t width) {
    for (int i = 0; i < n; i++) {
        be->store_rows(be, r->k[i], k + i * width, 1, width, r->step[i]);
        be->store_rows(be, r->v[i], v + i * width, 1, width, r->step[i]);
    }
}
static inline void qw_qsa_rows_ops(const qw_backend *be, const qw_attn_rows *r, int32_t *sel, int32_t *sel_off,
                                   const float *q, const float *key_rows, int64_t row_stride, int n, int n_head,
                                   int ihd, int R, int topk, const float *k_norm, float eps, const float *inv_freq,
                                   int n_rot, void *work) {
    for (int i = 0; i < n; i++) {
        be->qsa_keys(be, r->idx_raw[i], r->idx_blk[i], key_rows + i * row_stride, row_stride, 1, ihd, R, k_norm, eps,
                     inv_freq, n_rot, r->step[i]);
        be->qsa_select(be, sel + (int64_t)i * (topk + 1) * R, sel_off + 2 * i, q + i * row_stride, row_stride,
                       r->idx_blk[i], 1, n_head, ihd, R, topk, work, r->step[i]);
    }
}
static inline void qw_attention_rows_ops(const qw_backend *be, const qw_attn_rows *r, float *out, const float *q,
                                         int q_stride, int n, int n_head, int n_head_kv, int hd, float scale,
                                         const int32_t *sel, const int32_t *sel_off, int sel_stride, void *work) {
    for (int i = 0; i < n; i++)
        be->attention(be, out + (int64_t)i * n_head * hd, q + (int64_t)i * q_stride, q_stride, r->k[i], r->v[i], 1,
                      n_head, n_head_kv, hd, scale, sel ? sel + (int64_t)i * sel_stride : NULL,
                      sel ? sel_off + 2 * i : NULL, work, r->step[i]);
}

/* the rows ops where the backend has them, else their calls a row at a time */
static inline void qw_be_kv_store_rows(const qw_backend *be, const qw_attn_rows *r, const float *k, const float *v,
                                       int n, int64_t width) {
    if (be->kv_store_rows)
        be->kv_store_rows(be, r, k, v, n, width);
    else
        qw_kv_store_rows_ops(be, r, k, v, n, width);
}
static inline void qw_be_qsa_rows(const qw_backend *be, const qw_attn_rows *r, int32_t *sel, int32_t *sel_off,
                                  const float *q, const float *key_rows, int64_t row_stride, int n, int n_head, int ihd,
                                  int R, int topk, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                                  void *work) {
    if (be->qsa_rows)
        be->qsa_rows(be, r, sel, sel_off, q, key_rows, row_stride, n, n_head, ihd, R, topk, k_norm, eps, inv_freq,
                     n_rot, work);
    else
        qw_qsa_rows_ops(be, r, sel, sel_off, q, key_rows, row_stride, n, n_head, ihd, R, topk, k_norm, eps, inv_freq,
                        n_rot, work);
}
static inline void qw_be_attention_rows(const qw_backend *be, const qw_attn_rows *r, float *out, const float *q,
                                        int q_stride, int n, int n_head, int n_head_kv, int hd, float scale,
                                        const int32_t *sel, const int32_t *sel_off, int sel_stride, void *work) {
    if (be->attention_rows)
        be->attention_rows(be, r, out, q, q_stride, n, n_head, n_head_kv, hd, scale, sel, sel_off, sel_stride, work);
    else
        qw_attention_rows_ops(be, r, out, q, q_stride, n, n_head, n_head_kv, hd, scale, sel, sel_off, sel_stride,
                              work);
}

#define QW_TOPK_MAX 64
/* The order of topk: a before b (values a, b at indices ia, ib); the CUDA kernel's too. */
static inline QW_HOST_DEVICE int qw_topk_better(float a, int64_t ia, float b, int64_t ib) {
    if (a != a) return b != b && ia < ib;
    if (b != b) return 1;
    return a > b || (a == b && ia < ib);
}
/* topk's work: two rounds of candidates, k of each 512 values */
static inline size_t qw_topk_work(int n_rows, int64_t n, int k) {
    return (size_t)n_rows * (size_t)((n + 511) / 512) * (size_t)k * 2 * (sizeof(float) + sizeof(int32_t)) + 256;
}

/* Reference dot product of row r (length n) of any weight type with f32 x, accumulated in double:
 * the oracle for every optimised dot kernel, and the fallback for types a backend does not handle. */
double qw_ref_dot_row(const qw_tensor *w, int64_t r, const float *x, int64_t n);

/* The scalar reference backend (host memory, one thread): the oracle. */
const qw_backend *qw_backend_ref(void);
/* The best CPU kernels for this machine on the calling thread only (chosen once; host memory). */
const qw_backend *qw_backend_cpu_default(void);

/* A backend that calls hooks around every memory function and op of `inner` (which must outlive it): enter,
 * then the inner function unless enter returned 0 (a dry run: the session's memory plan runs a step that
 * way), then leave. They get the function's index in qw_backend_op_names() and, for matmul / matmul_batch, the
 * jobs (one for matmul). The *_work size queries, layer and release are not interposed. The profiler and the CPU
 * backend's guard mode are built on it (runtime/profile.c, kernels/cpu.c). */
typedef struct {
    int (*enter)(void *user, int op);
    void (*leave)(void *user, int op, const qw_matmul_job *jobs, int n_jobs);
    void (*release)(void *user); /* called by the interposer's release (NULL: nothing more to free) */
    void *user;
} qw_backend_hooks;
/* NULL when out of memory. Its release frees it (and calls hooks->release). */
qw_backend *qw_backend_interpose(const qw_backend *inner, const qw_backend_hooks *hooks);
/* The inner backend of an interposer, or NULL when be is not one. */
const qw_backend *qw_backend_interposed(const qw_backend *be);
/* The names of the functions interposed, in the order of the table, and their count (the memory functions
 * first: index QW_OP_FIRST is the first op, matmul). */
const char *const *qw_backend_op_names(int *n);
enum { QW_OP_FIRST = 7 };

#endif
