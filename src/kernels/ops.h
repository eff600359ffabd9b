/*
 * ops.h - the op table every backend implements. Each model's forward is written once against it.
 *
 * Activations are f32, row-major, one row per token. Weights are qw_tensor views of any float type
 * (F32/F16/BF16) and are converted on the fly. kernels/ref.c is the scalar oracle of every op; SIMD and
 * CUDA variants are tested against it.
 */
#ifndef QW_OPS_H
#define QW_OPS_H

#include <stdint.h>

#include "tensor/tensor.h"

typedef struct qw_ops qw_ops;

/* One matmul of a batch: y [n_tok][rows] = x [n_tok][cols] W^T. */
typedef struct {
    float *y;
    const qw_tensor *w;
    const float *x;
    int n_tok;
} qw_matmul_job;

/* Every op takes the table itself first: a backend keeps its state (thread pool, device) next to it. */
struct qw_ops {
    const char *name;

    /* y[t][r] = sum_c W[r][c] * x[t][c]; W [rows, cols], x [n_tok][cols], y [n_tok][rows]. */
    void (*matmul)(const qw_ops *ops, float *y, const qw_tensor *w, const float *x, int n_tok);

    /* Independent matmuls (e.g. the routed experts of a step) as one unit of work: the results are those of
     * calling matmul on each job; a backend may spread all their rows over its threads at once. */
    void (*matmul_batch)(const qw_ops *ops, const qw_matmul_job *jobs, int n_jobs);

    /* y[i] = row ids[i] of W [n_rows, dim] as f32; y [n][dim]. */
    void (*get_rows)(const qw_ops *ops, float *y, const qw_tensor *w, const int32_t *ids, int n);

    /* RMS norm of n_rows vectors of length dim (y may alias x):
     * y = x / sqrt(mean(x^2) + eps) * (w or 1+w if zero_centred; 1 if w is NULL). w [dim]. */
    void (*rms_norm)(const qw_ops *ops, float *y, const float *x, const float *w, int n_rows, int dim, float eps, int zero_centred);

    /* x / sqrt(sum(x^2) + eps) * scale for n_rows vectors of length dim, in place. */
    void (*l2_norm)(const qw_ops *ops, float *x, int n_rows, int dim, float eps, float scale);

    /* Rotate-half (NeoX) RoPE on the first n_rot dims of every head, in place.
     * x [n_tok][row_stride] with n_head heads of head_stride floats from offset 0;
     * cs [n_tok][n_rot] holds cos[0..n_rot/2) then sin[0..n_rot/2) for each token. */
    void (*rope)(const qw_ops *ops, float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot, const float *cs);

    /* Depthwise causal convolution: y[t][c] = sum_j w[c][j] * x[t + j*dil][c], j < k;
     * x [(k-1)*dil + n_tok][ch] (history rows first), w [ch][k], y [n_tok][ch]. */
    void (*conv1d_dw)(const qw_ops *ops, float *y, const float *x, const float *w, int n_tok, int ch, int k, int dil);

    /* Element-wise: x = silu(x), x = sigmoid(x), y = a * b, y += a * s. */
    void (*silu)(const qw_ops *ops, float *x, int64_t n);
    void (*sigmoid)(const qw_ops *ops, float *x, int64_t n);
    void (*mul)(const qw_ops *ops, float *y, const float *a, const float *b, int64_t n);
    void (*axpy)(const qw_ops *ops, float *y, const float *a, float s, int64_t n);

    /*
     * Softmax attention of n_tok queries against the KV cache.
     * q [n_tok][q_stride] (head h at h*hd), k/v cache [n_ctx][n_head_kv][hd], out [n_tok][n_head][hd].
     * Query t (absolute position pos0+t) sees key positions sel[sel_off[t] .. sel_off[t+1]) when sel is
     * not NULL (ascending), else 0 .. pos0+t. Head h uses kv head h / (n_head / n_head_kv).
     * work: scratch of at least (pos0 + n_tok + hd) doubles.
     */
    void (*attention)(const qw_ops *ops, float *out, const float *q, int q_stride, const float *k_cache, const float *v_cache,
                      int n_tok, int pos0, int n_head, int n_head_kv, int hd, float scale, const int32_t *sel,
                      const int32_t *sel_off, double *work);

    /*
     * Gated delta rule, token by token, per value head j (qk head j / (hv/hk)):
     *   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
     * q, k [n_tok][hk][dk] (already l2-normalised, q scaled), v [n_tok][hv][dv], g, beta [n_tok][hv],
     * state [hv][dk][dv] (updated), o [n_tok][hv][dv].
     */
    void (*delta_rule)(const qw_ops *ops, float *o, float *state, const float *q, const float *k, const float *v, const float *g,
                       const float *beta, int n_tok, int hk, int hv, int dk, int dv);
};

/* Reference dot product of row r (length n) of any weight type with f32 x, accumulated in double:
 * the oracle for every optimised dot kernel, and the fallback for types a backend does not handle. */
double qw_ref_dot_row(const qw_tensor *w, int64_t r, const float *x, int64_t n);

/* The scalar reference implementation. */
const qw_ops *qw_ops_ref(void);
/* The best CPU implementation for this machine (chosen once). */
const qw_ops *qw_ops_cpu(void);

#endif
