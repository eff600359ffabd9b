/*
 * ops.cu - the CUDA backend's general ops: matmuls and gathers (through quant.cu), stores and strided copies,
 * norms, element-wise functions, RoPE, and the Gated DeltaNet's convolution, gate and delta rule.
 *
 * Each follows kernels/ref.c's definition: the same f32 operations in the same order where an op has one
 * order per output (element-wise, RoPE), and double sums where the reference sums in double (norms, the
 * convolution); the delta rule runs the recurrence token by token with its dot products as partial sums
 * (below). The build compiles with -fmad=false, so a * b + c is two roundings as on the host (fused
 * multiply-adds only where written, __fmaf_rn).
 */
#include "cuda/ops_internal.cuh"

extern "C" {
#include "kernels/composite.h"
}

/* ---------------------------------------------------------------- matmuls and gathers */

static void cu_matmul(const qw_backend *be, float *y, const qw_tensor *w, const float *x, int n_tok) {
    qwc *c = qwc_of(be);
    qw_tensor d = qwc_tensor(c, w);
    qwc_matmul(c, y, &d, x, n_tok);
}

/* Jobs of one weight type and row length reading the same x of up to 8 tokens as one launch (QWC_MVQ_BATCH 0: one
 * launch each; tests/gpu/fusions.sh checks the two give the same bits). QWENC_CUDA_MVQ_BATCH_TOK=0 in the
 * environment: one token's jobs only, as before multi-token steps were grouped (to measure what that saves). */
#ifndef QWC_MVQ_BATCH
#define QWC_MVQ_BATCH 1
#endif
static int batch_tok() {
    static int r = -1;
    return qwc_env_switch("QWENC_CUDA_MVQ_BATCH_TOK", 1, &r) ? 8 : 1;
}

/* the jobs in turn, or up to 4 of one type, row length and x in one launch (the first not yet run and the next ones
 * of its kind, wherever they stand among the jobs); a job reading the x of the one run before it uses its 8-bit
 * rounding again (the integer path) */
static void cu_matmul_batch(const qw_backend *be, const qw_matmul_job *jobs, int n_jobs) {
    qwc *c = qwc_of(be);
    uint64_t ran = 0; /* bit j: job j ran (jobs past 64 run in turn) */
    const qw_matmul_job *last = NULL;
    for (int j = 0; j < n_jobs; j++) {
        if (j < 64 && ran >> j & 1) continue;
        const qw_matmul_job *a = &jobs[j];
        qwc_q8_keep(c, last && a->x == last->x && a->n_tok == last->n_tok);
        last = a;
        int at[4] = {j}, n = 1;
        for (int i = j + 1; QWC_MVQ_BATCH && a->n_tok <= batch_tok() && n < 4 && i < n_jobs && i < 64; i++)
            if (!(ran >> i & 1) && jobs[i].x == a->x && jobs[i].n_tok == a->n_tok && jobs[i].w->type == a->w->type &&
                jobs[i].w->shape[1] == a->w->shape[1])
                at[n++] = i;
        if (n > 1) {
            qw_tensor d[4];
            float *y[4];
            for (int i = 0; i < n; i++) d[i] = qwc_tensor(c, jobs[at[i]].w), y[i] = jobs[at[i]].y;
            if (qwc_matmul_group(c, d, y, n, a->x, a->n_tok)) {
                for (int i = 0; i < n; i++) ran |= 1ull << at[i];
                continue;
            }
        }
        cu_matmul(be, a->y, a->w, a->x, a->n_tok);
        if (j < 64) ran |= 1ull << j;
    }
    qwc_q8_keep(c, 0);
}

static void cu_get_rows(const qw_backend *be, float *y, const qw_tensor *w, const int32_t *ids, int n) {
    qwc *c = qwc_of(be);
    qw_tensor d = qwc_tensor(c, w);
    qwc_get_rows(c, y, &d, ids, n);
}

__global__ void k_store_rows(float *cache, const float *src, int64_t n, int64_t width, const qw_step *step) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) cache[(int64_t)step->pos0 * width + i] = src[i];
}

static void cu_store_rows(const qw_backend *be, float *cache, const float *src, int n_tok, int64_t width,
                          const qw_step *step) {
    int64_t n = (int64_t)n_tok * width;
    qwc_launch(k_store_rows, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), cache, src, n, width, step);
    QWC_LAUNCHED();
}

__global__ void k_copy_strided(float *dst, const float *src, qw_copy_layout l, int64_t n) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t i0 = i % l.ne[0], r = i / l.ne[0], i1 = r % l.ne[1];
    r /= l.ne[1];
    int64_t i2 = r % l.ne[2], i3 = r / l.ne[2];
    dst[i0 * l.d[0] + i1 * l.d[1] + i2 * l.d[2] + i3 * l.d[3]] = src[i0 * l.s[0] + i1 * l.s[1] + i2 * l.s[2] + i3 * l.s[3]];
}

static void cu_copy_strided(const qw_backend *be, float *dst, const float *src, const qw_copy_layout *l) {
    int64_t n = l->ne[0] * l->ne[1] * l->ne[2] * l->ne[3];
    if (n <= 0) return;
    qwc_launch(k_copy_strided, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), dst, src, *l, n);
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- norms */

/* one block per row; n_group > 0: the weights of row r are w + (r % n_group) * dim; xq (not NULL, dim a multiple of
 * 32): y's 8-bit rounding too */
/* 1 / sqrt(mean(xr^2) + eps) for the row xr [dim], the squares summed in double by the block (every thread gets
 * it; sh: 32 slots) */
__device__ __forceinline__ float rms_inv(const float *xr, int dim, float eps, double *sh) {
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = qwc_block_sum(ss, sh);
    return (float)(1.0 / sqrt(ss / dim + eps));
}
/* the same as a block of nt threads (a multiple of 32, at most blockDim.x) forms it: the threads past nt add zeros,
 * which leave qwc_block_sum's warp and block sums as they are, so a larger block gets those bits (a separate
 * function: rms_inv written as rms_inv_as(.., blockDim.x) compiles to longer code for every norm kernel) */
__device__ __forceinline__ float rms_inv_as(const float *xr, int dim, float eps, double *sh, int nt) {
    double ss = 0;
    if ((int)threadIdx.x < nt)
        for (int i = threadIdx.x; i < dim; i += nt) ss += (double)xr[i] * xr[i];
    ss = qwc_block_sum(ss, sh);
    return (float)(1.0 / sqrt(ss / dim + eps));
}

/* element i of a normed row: x times 1 / rms times its weight (1 + w[i] when zero-centred; w NULL: none) */
__device__ __forceinline__ float rms_scaled_by(float x, float inv, bool has_w, float wi, int zc) {
    const float s = has_w ? (zc ? 1.0f + wi : wi) : 1.0f;
    return x * inv * s;
}
__device__ __forceinline__ float rms_scaled(float x, float inv, const float *w, int i, int zc) {
    return rms_scaled_by(x, inv, w != NULL, w ? w[i] : 0.0f, zc);
}

__global__ void k_rms_norm(float *y, const float *x, const float *w, int dim, int n_group, float eps, int zc,
                           qw_q8a *xq) {
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * dim;
    float *yr = y + r * dim;
    const float *wr = w ? w + (int64_t)(r % n_group) * dim : NULL;
    const float inv = rms_inv(xr, dim, eps, sh);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = rms_scaled(xr[i], inv, wr, i, zc);
        yr[i] = v;
        if (xq) qwc_q8a_warp(v, xq + (r * dim + i) / 32); /* a warp's 32 values: one block (dim % 32 == 0) */
    }
}

static void cu_rms_norm(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                        int zc) {
    qwc *c = qwc_of(be);
    if (n_rows <= 0) return;
    const float *dw = qwc_wf(c, w, dim);
    qw_q8a *xq = qwc_q8_for(c, (int64_t)n_rows * dim, dim);
    qwc_launch(k_rms_norm, n_rows, qwc_norm_threads(dim), 0, qwc_stream(c), y, x, dw, dim, 1, eps, zc, xq);
    QWC_LAUNCHED();
    if (xq) qwc_q8_made(c, y, (int64_t)n_rows * dim);
}

static void cu_rms_norm_grouped(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int n_group,
                                int dim, float eps, int zc) {
    qwc *c = qwc_of(be);
    if (n_rows <= 0) return;
    const float *dw = qwc_wf(c, w, (int64_t)n_group * dim);
    qw_q8a *xq = qwc_q8_for(c, (int64_t)n_rows * dim, dim);
    qwc_launch(k_rms_norm, n_rows, qwc_norm_threads(dim), 0, qwc_stream(c), y, x, dw, dim, n_group, eps, zc, xq);
    QWC_LAUNCHED();
    if (xq) qwc_q8_made(c, y, (int64_t)n_rows * dim);
}

/* one row of l2_norm by the block (qwc_norm_threads(dim) threads), times scale */
__device__ __forceinline__ void l2_norm_row(float *xr, int dim, float eps, float scale, double *sh) {
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = qwc_block_sum(ss, sh);
    float inv = (float)(1.0 / sqrt(ss + eps)) * scale;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] *= inv;
}

__global__ void k_l2_norm(float *x, int dim, float eps, float scale, int n_scaled) {
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    l2_norm_row(x + (int64_t)blockIdx.x * dim, dim, eps, (int)blockIdx.x < n_scaled ? scale : 1.0f, sh);
}

static void cu_l2_norm(const qw_backend *be, float *x, int n_rows, int dim, float eps, float scale, int n_scaled) {
    if (n_rows <= 0) return;
    qwc_launch(k_l2_norm, n_rows, qwc_norm_threads(dim), 0, qwc_stream(qwc_of(be)), x, dim, eps, scale, n_scaled);
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- element-wise */

__global__ void k_silu(float *x, int64_t n) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = qwc_silu(x[i]);
}
__global__ void k_sigmoid(float *x, int64_t n) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = qwc_sigmoid(x[i]);
}
__global__ void k_mul(float *y, const float *a, const float *b, int64_t n) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}
__global__ void k_axpy(float *y, const float *a, float s, int64_t n) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a[i] * s;
}
/* xq (not NULL, n a multiple of 32): y's 8-bit rounding too (k_divide's and k_hc_read's likewise) */
__global__ void k_act_mul(float *y, const float *a, const float *b, int64_t n, int act, qw_q8a *xq) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return; /* whole warps when xq */
    const float v = qwc_act(a[i], act);
    const float r = v * b[i];
    y[i] = r;
    if (xq) qwc_q8a_warp(r, xq + i / 32);
}
__global__ void k_divide(float *x, float d, int64_t n, int then_silu, qw_q8a *xq) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i] / d;
    if (then_silu) v = qwc_silu(v);
    x[i] = v;
    if (xq) qwc_q8a_warp(v, xq + i / 32);
}

static void cu_silu(const qw_backend *be, float *x, int64_t n) {
    if (n <= 0) return;
    qwc_launch(k_silu, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), x, n);
    QWC_LAUNCHED();
}
static void cu_sigmoid(const qw_backend *be, float *x, int64_t n) {
    if (n <= 0) return;
    qwc_launch(k_sigmoid, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), x, n);
    QWC_LAUNCHED();
}
static void cu_mul(const qw_backend *be, float *y, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    qwc_launch(k_mul, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), y, a, b, n);
    QWC_LAUNCHED();
}
static void cu_axpy(const qw_backend *be, float *y, const float *a, float s, int64_t n) {
    if (n <= 0) return;
    qwc_launch(k_axpy, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), y, a, s, n);
    QWC_LAUNCHED();
}
static void cu_divide(const qw_backend *be, float *x, float d, int64_t n, int then_silu) {
    if (n <= 0) return;
    qwc *c = qwc_of(be);
    qw_q8a *xq = qwc_q8_for(c, n, n);
    qwc_launch(k_divide, qwc_blocks(n, 256), 256, 0, qwc_stream(c), x, d, n, then_silu, xq);
    QWC_LAUNCHED();
    if (xq) qwc_q8_made(c, x, n);
}

/* ---------------------------------------------------------------- RoPE */

__global__ void k_rope_table(float *cs, const float *inv_freq, int n_rot, int n_tok, const qw_step *step) {
    QWC_PDL_ENTRY();
    int half = n_rot / 2, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_tok * half) return;
    int t = i / half, k = i % half;
    float p = (float)(step->pos0 + t), ang = p * inv_freq[k];
    cs[(int64_t)t * n_rot + k] = cosf(ang);
    cs[(int64_t)t * n_rot + half + k] = sinf(ang);
}

static void cu_act_mul(const qw_backend *be, float *y, float *a, const float *b, int64_t n, int act) {
    if (n <= 0) return;
    qwc *c = qwc_of(be);
    qw_q8a *xq = qwc_q8_for(c, n, n);
    qwc_launch(k_act_mul, qwc_blocks(n, 256), 256, 0, qwc_stream(c), y, a, b, n, act, xq);
    QWC_LAUNCHED();
    if (xq) qwc_q8_made(c, y, n);
}

/* The gated norm as one kernel (QWC_NORM_GATE 0, or QWENC_CUDA_NORM_GATE=0 in the environment: rms_norm, then
 * act_mul, the same bits; t_cuda_ops and fusions.sh compare them). */
#ifndef QWC_NORM_GATE
#define QWC_NORM_GATE 1
#endif

/* A block per row: k_rms_norm's operations (not zero-centred, one weight vector) and threads, then k_act_mul's on
 * the result: y = act(z) * the normed x; xq (not NULL, dim % 32 == 0): y's 8-bit rounding. */
/* the gated norm's row xr [dim] into yr by the block, its squares summed as nt threads sum them (rms_inv_as); xq
 * (not NULL): the row's 8-bit blocks */
__device__ __forceinline__ void norm_gate_row(float *yr, const float *xr, const float *w, const float *zr, int dim,
                                              float eps, int act, qw_q8a *xq, int nt, double *sh) {
    const float inv = rms_inv_as(xr, dim, eps, sh, nt);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float s = w ? w[i] : 1.0f, v = xr[i] * inv * s, a = zr[i];
        const float g = qwc_act(a, act);
        const float o = g * v;
        yr[i] = o;
        if (xq) qwc_q8a_warp(o, xq + i / 32); /* a warp's 32 values: one block */
    }
}

__global__ void k_rms_norm_gate(float *y, const float *x, const float *w, const float *z, int dim, float eps, int act,
                                qw_q8a *xq) {
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    const int64_t r = blockIdx.x;
    norm_gate_row(y + r * dim, x + r * dim, w, z + r * dim, dim, eps, act, xq ? xq + r * dim / 32 : NULL, blockDim.x,
                  sh);
}

static void cu_rms_norm_gate(const qw_backend *be, float *y, const float *x, const float *w, float *z, int n_rows,
                             int dim, float eps, int act) {
    if (n_rows <= 0) return;
    qwc *c = qwc_of(be);
    const int64_t n = (int64_t)n_rows * dim;
    static int env = -1;
    if (!QWC_NORM_GATE || dim % 32 || !qwc_env_switch("QWENC_CUDA_NORM_GATE", 1, &env)) {
        cu_rms_norm(be, y, x, w, n_rows, dim, eps, 0);
        cu_act_mul(be, y, z, y, n, act);
        return;
    }
    const float *dw = qwc_wf(c, w, dim);
    qw_q8a *xq = qwc_q8_for(c, n, dim);
    qwc_launch(k_rms_norm_gate, n_rows, qwc_norm_threads(dim), 0, qwc_stream(c), y, x, dw, (const float *)z, dim, eps,
               act, xq);
    QWC_LAUNCHED();
    if (xq) qwc_q8_made(c, y, n);
}

static void cu_rope_table(const qw_backend *be, float *cs, const float *inv_freq, int n_rot, int n_tok,
                          const qw_step *step) {
    qwc *c = qwc_of(be);
    int n = n_tok * (n_rot / 2);
    if (n <= 0) return;
    qwc_launch(k_rope_table, qwc_blocks(n, 256), 256, 0, qwc_stream(c), cs, qwc_wf(c, inv_freq, n_rot / 2), n_rot,
               n_tok, step);
    QWC_LAUNCHED();
}

/* RoPE's rotation of the pair (a, b) = (v[k], v[k + n_rot / 2]) by c = cos, s = sin of its angle */
__device__ __forceinline__ void rope_pair(float *a, float *b, float c, float s) {
    const float a0 = *a, b0 = *b;
    *a = a0 * c - b0 * s;
    *b = b0 * c + a0 * s;
}

__global__ void k_rope(float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot, const float *cs) {
    QWC_PDL_ENTRY();
    int half = n_rot / 2;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * n_head * half) return;
    int k = (int)(i % half);
    int64_t th = i / half;
    int h = (int)(th % n_head), t = (int)(th / n_head);
    const float *c = cs + (int64_t)t * n_rot, *s = c + half;
    float *v = x + (int64_t)t * row_stride + (int64_t)h * head_stride;
    rope_pair(&v[k], &v[k + half], c[k], s[k]);
}

static void cu_rope(const qw_backend *be, float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot,
                    const float *cs) {
    int64_t n = (int64_t)n_tok * n_head * (n_rot / 2);
    if (n <= 0) return;
    qwc_launch(k_rope, qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be)), x, n_tok, row_stride, n_head, head_stride,
               n_rot, cs);
    QWC_LAUNCHED();
}

/* Each head's norm and RoPE as one kernel (QWC_NORM_ROPE 0: rms_norm, then rope; the same bits, tests/gpu/fusions.sh):
 * a block per head of k_rms_norm's threads for hd (its operations: its bits), the normed head in shared memory, then
 * k_rope's operations on its pairs. Attention's q and k norms and the QSA indexer's queries: three launches fewer. */
#ifndef QWC_NORM_ROPE
#define QWC_NORM_ROPE 1
#endif

/* With kc (rms_norm_rope_kv): each head also into the key cache at its position, and as many blocks again copy the
 * values' heads into theirs (store_rows' copies). */
__global__ void k_rms_norm_rope(float *x, const float *w, int row_stride, int n_head, int hd, float eps, int zc,
                                int n_rot, const float *cs, float *kc, const float *v, float *vc, const qw_step *step,
                                int early) {
    float wv[QWC_EARLY_N]; /* the first weights, read before the wait (early) */
    if (early && w) qwc_early_row(wv, w, hd);
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    extern __shared__ float nh[]; /* [hd] */
    const int64_t width = (int64_t)n_head * hd;
    if (kc && blockIdx.x >= gridDim.x / 2) { /* a value head (v's rows are width apart) */
        const int64_t e = (int64_t)(blockIdx.x - gridDim.x / 2) * hd;
        float *dst = vc + (int64_t)step->pos0 * width + e;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = v[e + i];
        return;
    }
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head, half = n_rot / 2;
    float *xr = x + (int64_t)t * row_stride + (int64_t)h * hd;
    float *cr = kc ? kc + ((int64_t)step->pos0 + t) * width + (int64_t)h * hd : NULL;
    const float inv = rms_inv(xr, hd, eps, sh);
#pragma unroll
    for (int e = 0; e < QWC_EARLY_N; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        if (i < hd) nh[i] = rms_scaled_by(xr[i], inv, w != NULL, early && w ? wv[e] : w ? w[i] : 0.0f, zc);
    }
    for (int i = threadIdx.x + QWC_EARLY_N * blockDim.x; i < hd; i += blockDim.x)
        nh[i] = rms_scaled(xr[i], inv, w, i, zc);
    __syncthreads();
    const float *c = cs + (int64_t)t * n_rot, *s = c + half;
    for (int k = threadIdx.x; k < half; k += blockDim.x) {
        float a = nh[k], b = nh[k + half];
        rope_pair(&a, &b, c[k], s[k]);
        xr[k] = a, xr[k + half] = b;
        if (cr) cr[k] = a, cr[k + half] = b;
    }
    for (int i = 2 * half + threadIdx.x; i < hd; i += blockDim.x) { /* past the rotated pairs */
        xr[i] = nh[i];
        if (cr) cr[i] = nh[i];
    }
}

static void cu_rms_norm_rope(const qw_backend *be, float *x, const float *w, int n_tok, int row_stride, int n_head,
                             int hd, float eps, int zc, int n_rot, const float *cs) {
    static int env = -1; /* QWENC_CUDA_NORM_ROPE=0 in the environment: the two ops (to measure what it saves) */
    if (!QWC_NORM_ROPE || n_rot > hd || !qwc_env_switch("QWENC_CUDA_NORM_ROPE", 1, &env)) {
        qw_rms_norm_rope_ops(be, x, w, n_tok, row_stride, n_head, hd, eps, zc, n_rot, cs);
        return;
    }
    if (n_tok <= 0 || n_head <= 0) return;
    qwc *c = qwc_of(be);
    qwc_launch(k_rms_norm_rope, (unsigned)((int64_t)n_tok * n_head), qwc_norm_threads(hd), (size_t)hd * sizeof(float),
               qwc_stream(c), x, qwc_wf(c, w, hd), row_stride, n_head, hd, eps, zc, n_rot, cs, (float *)NULL,
               (const float *)NULL, (float *)NULL, (const qw_step *)NULL, qwc_early_ops());
    QWC_LAUNCHED();
}

/* The keys' norm and RoPE with both cache stores in one kernel (QWC_NORM_ROPE_KV 0, or QWENC_CUDA_NORM_ROPE_KV=0 in
 * the environment: rms_norm_rope, then the two store_rows; fusions.sh and t_cuda_ops compare them). */
#ifndef QWC_NORM_ROPE_KV
#define QWC_NORM_ROPE_KV 1
#endif

static void cu_store_rows(const qw_backend *be, float *cache, const float *src, int n_tok, int64_t width,
                          const qw_step *step);

static void cu_rms_norm_rope_kv(const qw_backend *be, float *k, const float *w, int n_tok, int n_head, int hd,
                                float eps, int zc, int n_rot, const float *cs, float *k_cache, const float *v,
                                float *v_cache, const qw_step *step) {
    static int env = -1;
    const int64_t width = (int64_t)n_head * hd;
    if (!QWC_NORM_ROPE_KV || !QWC_NORM_ROPE || n_rot > hd || (int64_t)n_tok * n_head > INT32_MAX / 2 ||
        !qwc_env_switch("QWENC_CUDA_NORM_ROPE_KV", 1, &env)) {
        cu_rms_norm_rope(be, k, w, n_tok, (int)width, n_head, hd, eps, zc, n_rot, cs);
        cu_store_rows(be, k_cache, k, n_tok, width, step);
        cu_store_rows(be, v_cache, v, n_tok, width, step);
        return;
    }
    if (n_tok <= 0 || n_head <= 0) return;
    qwc *c = qwc_of(be);
    qwc_launch(k_rms_norm_rope, (unsigned)(2 * (int64_t)n_tok * n_head), qwc_norm_threads(hd),
               (size_t)hd * sizeof(float), qwc_stream(c), k, qwc_wf(c, w, hd), (int)width, n_head, hd, eps, zc, n_rot,
               cs, k_cache, v, v_cache, step, qwc_early_ops());
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- Gated DeltaNet */

__global__ void k_conv1d_dw(float *y, const float *x, const float *w, int n_tok, int ch, int k, int dil,
                            int then_silu) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * ch) return;
    int t = (int)(i / ch), c = (int)(i % ch);
    double acc = 0;
    for (int j = 0; j < k; j++) acc += (double)w[(int64_t)c * k + j] * x[(int64_t)(t + j * dil) * ch + c];
    float v = (float)acc;
    if (then_silu) v = qwc_silu(v);
    y[i] = v;
}

/* The convolution and its silu in one launch (QWC_FUSE_CONV_SILU 0: two; tests/gpu/fusions.sh compares them). */
#ifndef QWC_FUSE_CONV_SILU
#define QWC_FUSE_CONV_SILU 1
#endif

static void cu_conv1d_dw(const qw_backend *be, float *y, const float *x, const float *w, int n_tok, int ch, int k,
                         int dil, int then_silu) {
    qwc *c = qwc_of(be);
    int64_t n = (int64_t)n_tok * ch;
    if (n <= 0) return;
    const int fuse = then_silu && QWC_FUSE_CONV_SILU;
    qwc_launch(k_conv1d_dw, qwc_blocks(n, 256), 256, 0, qwc_stream(c), y, x, qwc_wf(c, w, (int64_t)ch * k), n_tok, ch,
               k, dil, fuse);
    QWC_LAUNCHED();
    if (then_silu && !fuse) cu_silu(be, y, n);
}

/* The convolution over a history in one kernel (QWC_CONV_STATE 0: the copies and conv1d_dw of
 * qw_op_conv1d_state; tests/gpu/fusions.sh compares the two). A thread per channel walks the window hist ++ x
 * (k_conv1d_dw's sums and silu), keeps it in seq when asked, then moves the history on: row i takes window row
 * n_tok + i, which no earlier i overwrote. */
#ifndef QWC_CONV_STATE
#define QWC_CONV_STATE 1
#endif
#define CONV_STATE_MAX_TOK 16 /* more rows: the copies and the convolution's parallel kernel */

/* channel c of k_conv1d_state */
__device__ __forceinline__ void conv_state_channel(float *y, const float *x, float *hist, float *seq, const float *w,
                                                   int n_tok, int ch, int k, int dil, int then_silu, int keep_seq,
                                                   int c) {
    const int nh = (k - 1) * dil;
#define WIN(s) ((s) < nh ? hist[(int64_t)(s) * ch + c] : x[(int64_t)((s) - nh) * ch + c])
    for (int t = 0; t < n_tok; t++) {
        double acc = 0;
        for (int j = 0; j < k; j++) acc += (double)w[(int64_t)c * k + j] * WIN(t + j * dil);
        float v = (float)acc;
        if (then_silu) v = qwc_silu(v);
        y[(int64_t)t * ch + c] = v;
    }
    if (keep_seq)
        for (int s = 0; s < nh + n_tok; s++) seq[(int64_t)s * ch + c] = WIN(s);
    for (int i = 0; i < nh; i++) hist[(int64_t)i * ch + c] = WIN(n_tok + i);
#undef WIN
}

__global__ void k_conv1d_state(float *y, const float *x, float *hist, float *seq, const float *w, int n_tok, int ch,
                               int k, int dil, int then_silu, int keep_seq) {
    QWC_PDL_ENTRY();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < ch) conv_state_channel(y, x, hist, seq, w, n_tok, ch, k, dil, then_silu, keep_seq, c);
}

static void cu_conv1d_state(const qw_backend *be, float *y, const float *x, float *hist, float *seq, const float *w,
                            int n_tok, int ch, int k, int dil, int then_silu, int keep_seq) {
    if (n_tok <= 0 || ch <= 0) return;
    if (!QWC_CONV_STATE || !QWC_FUSE_CONV_SILU || n_tok > CONV_STATE_MAX_TOK) {
        qw_op_conv1d_state(be, y, x, hist, seq, w, n_tok, ch, k, dil, then_silu, keep_seq);
        return;
    }
    qwc *c = qwc_of(be);
    qwc_launch(k_conv1d_state, qwc_blocks(ch, 128), 128, 0, qwc_stream(c), y, x, hist, seq,
               qwc_wf(c, w, (int64_t)ch * k), n_tok, ch, k, dil, then_silu, keep_seq);
    QWC_LAUNCHED();
}

/* A batched step's rows, one token of each of n sessions, through their own states (conv1d_state_rows,
 * delta_rule_rows; QWC_ROWS 0, or QWENC_CUDA_ROWS=0 in the environment: the backend has neither, and the blocks call
 * conv1d_state and delta_rule once a session). Each row's operations are those of its one-token call. */
#ifndef QWC_ROWS
#define QWC_ROWS 1
#endif
struct qwc_rows { /* the rows' state addresses, a kernel argument */
    float *p[QW_ROWS_MAX];
};

static qwc_rows rows_of(float *const *p, int n) {
    qwc_rows r = {};
    for (int i = 0; i < n; i++) r.p[i] = p[i];
    return r;
}

/* blocks of channels x rows: row r's channel c of k_conv1d_state over hist.p[r] */
__global__ void k_conv1d_state_rows(float *y, const float *x, qwc_rows hist, const float *w, int ch, int k, int dil,
                                    int then_silu) {
    QWC_PDL_ENTRY();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t r = blockIdx.y;
    if (c < ch) conv_state_channel(y + r * ch, x + r * ch, hist.p[r], NULL, w, 1, ch, k, dil, then_silu, 0, c);
}

static void cu_conv1d_state_rows(const qw_backend *be, float *y, const float *x, float *const *hist, const float *w,
                                 int n, int ch, int k, int dil, int then_silu) {
    if (n <= 0 || ch <= 0) return;
    if (n > QW_ROWS_MAX) qwc_die(__FILE__, __LINE__, "conv1d_state_rows", "more rows than QW_ROWS_MAX");
    qwc *c = qwc_of(be);
    qwc_launch(k_conv1d_state_rows, dim3((unsigned)qwc_blocks(ch, 128), (unsigned)n), 128, 0, qwc_stream(c), y, x,
               rows_of(hist, n), qwc_wf(c, w, (int64_t)ch * k), ch, k, dil, then_silu);
    QWC_LAUNCHED();
}

/* the gate of a value head: neg_exp_a softplus(a + dt_bias) */
__device__ __forceinline__ float gdn_g(float a, float neg_exp_a, float dt_bias) {
    float x = a + dt_bias;
    return neg_exp_a * (x > 20.0f ? x : log1pf(expf(x)));
}

/* threads [0, n): the gate; [n, n + n_beta): beta = sigmoid(beta) as k_sigmoid forms it */
__global__ void k_gdn_gate(float *a, float *beta, const float *neg_exp_a, const float *dt_bias, int64_t n, int hv,
                           int64_t n_beta) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        if (i - n < n_beta) beta[i - n] = qwc_sigmoid(beta[i - n]);
        return;
    }
    int j = (int)(i % hv);
    a[i] = gdn_g(a[i], neg_exp_a[j], dt_bias[j]);
}

static void cu_gdn_gate(const qw_backend *be, float *a, float *beta, const float *neg_exp_a, const float *dt_bias,
                        int n_tok, int hv) {
    qwc *c = qwc_of(be);
    int64_t n = (int64_t)n_tok * hv, n_beta = beta ? n : 0;
    if (n <= 0) return;
    qwc_launch(k_gdn_gate, qwc_blocks(n + n_beta, 256), 256, 0, qwc_stream(c), a, beta, qwc_wf(c, neg_exp_a, hv),
               qwc_wf(c, dt_bias, hv), n, hv, n_beta);
    QWC_LAUNCHED();
}

/* One token's delta-rule inputs in one kernel (QWC_GDN_PREP 0: conv1d_state, l2_norm and gdn_gate one by one; the
 * same bits, tests/gpu/fusions.sh). Blocks of k_l2_norm's threads for dk: the first 2 hk take a head of q or k each
 * (its channels' convolution, k_conv1d_state's, then the head's norm, k_l2_norm's), the next the v channels, the last
 * the gate and beta (k_gdn_gate's). */
#ifndef QWC_GDN_PREP
#define QWC_GDN_PREP 1
#endif
/* ... and for several tokens of one session, or one of a draft step (QWC_GDN_PREP_N 0, or QWENC_CUDA_GDN_PREP_N=0
 * in the environment: the ops one by one, the copies of q, k and v out of the convolution's rows among them; the same
 * bits) */
#ifndef QWC_GDN_PREP_N
#define QWC_GDN_PREP_N 1
#endif
static int gdn_prep_n_on() {
    static int r = -1;
    return QWC_GDN_PREP_N && qwc_env_switch("QWENC_CUDA_GDN_PREP_N", 1, &r);
}

/* conv_state_channel for one token, dilation 1 and silu, k <= GDN_KMAX: its window's loads all asked for before its
 * stores (to the compiler hist, x and y may overlap, so a load after a store waits for it), the same operations;
 * returns y's value, written to y unless !put */
constexpr int GDN_KMAX = 8, GDN_DKMAX = 4; /* GDN_DKMAX: channels a thread of a q or k head */
__device__ __forceinline__ float conv_state_channel1(float *y, const float *x, float *hist, const float *w, int ch,
                                                     int k, int c, bool put) {
    float win[GDN_KMAX], wk[GDN_KMAX];
#pragma unroll
    for (int j = 0; j < GDN_KMAX; j++) {
        win[j] = j < k - 1 ? hist[(int64_t)j * ch + c] : j == k - 1 ? x[c] : 0.0f;
        wk[j] = j < k ? w[(int64_t)c * k + j] : 0.0f;
    }
    double acc = 0;
#pragma unroll
    for (int j = 0; j < GDN_KMAX; j++)
        if (j < k) acc += (double)wk[j] * win[j];
    const float v = qwc_silu((float)acc);
    if (put) y[c] = v;
#pragma unroll
    for (int i = 0; i < GDN_KMAX - 1; i++)
        if (i < k - 1) hist[(int64_t)i * ch + c] = win[i + 1];
    return v;
}

__global__ void k_gdn_prep(float *c, const float *x, float *hist, const float *w, int ch, int k, int hk, int dk,
                           float eps, float q_scale, float *a, float *beta, const float *neg_exp_a,
                           const float *dt_bias, int hv, int n_vb) {
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    const int b = blockIdx.x, nqk = 2 * hk;
    const bool regs = k <= GDN_KMAX && dk <= GDN_DKMAX * (int)blockDim.x; /* else the general loops */
    if (b < nqk && regs) { /* the head's channels in registers from the convolution to the norm (l2_norm_row's
                            * operations: a thread's squares in the order of its channels, the block's sum) */
        float v[GDN_DKMAX];
        double ss = 0;
#pragma unroll
        for (int e = 0; e < GDN_DKMAX; e++) {
            const int i = threadIdx.x + e * blockDim.x;
            v[e] = i < dk ? conv_state_channel1(c, x, hist, w, ch, k, b * dk + i, false) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < GDN_DKMAX; e++)
            if (threadIdx.x + e * blockDim.x < dk) ss += (double)v[e] * v[e];
        ss = qwc_block_sum(ss, sh);
        const float inv = (float)(1.0 / sqrt(ss + eps)) * (b < hk ? q_scale : 1.0f);
#pragma unroll
        for (int e = 0; e < GDN_DKMAX; e++) {
            const int i = threadIdx.x + e * blockDim.x;
            if (i < dk) c[(int64_t)b * dk + i] = v[e] * inv;
        }
    } else if (b < nqk) {
        for (int i = threadIdx.x; i < dk; i += blockDim.x)
            conv_state_channel(c, x, hist, NULL, w, 1, ch, k, 1, 1, 0, b * dk + i);
        l2_norm_row(c + (int64_t)b * dk, dk, eps, b < hk ? q_scale : 1.0f, sh);
    } else if (b < nqk + n_vb) {
        const int ci = nqk * dk + (b - nqk) * blockDim.x + threadIdx.x;
        if (ci < ch) {
            if (regs) conv_state_channel1(c, x, hist, w, ch, k, ci, true);
            else conv_state_channel(c, x, hist, NULL, w, 1, ch, k, 1, 1, 0, ci);
        }
    } else {
        for (int i = threadIdx.x; i < hv; i += blockDim.x) {
            a[i] = gdn_g(a[i], neg_exp_a[i], dt_bias[i]);
            if (beta) beta[i] = qwc_sigmoid(beta[i]);
        }
    }
}

/* conv_state_channel's sum and silu of token t's window (dilation 1): the history's rows, then x's */
__device__ __forceinline__ float conv_tok(const float *x, const float *hist, const float *w, int ch, int k, int c,
                                          int t) {
    double acc = 0;
    for (int j = 0; j < k; j++) {
        const int s = t + j;
        const float win = s < k - 1 ? hist[(int64_t)s * ch + c] : x[(int64_t)(s - k + 1) * ch + c];
        acc += (double)w[(int64_t)c * k + j] * win;
    }
    return qwc_silu((float)acc);
}

/* conv_state_channel's end for channel c after n_tok tokens: the window into seq (keep_seq), the history moved on */
__device__ __forceinline__ void conv_tok_end(const float *x, float *hist, float *seq, int keep_seq, int ch, int k,
                                             int c, int n_tok) {
    const int nh = k - 1;
#define WIN(s) ((s) < nh ? hist[(int64_t)(s) * ch + c] : x[(int64_t)((s) - nh) * ch + c])
    if (keep_seq)
        for (int s = 0; s < nh + n_tok; s++) seq[(int64_t)s * ch + c] = WIN(s);
    for (int i = 0; i < nh; i++) hist[(int64_t)i * ch + c] = WIN(n_tok + i);
#undef WIN
}

/* gdn_prep of n_tok tokens (up to CONV_STATE_MAX_TOK), or of one keeping its window (a draft step's): k_gdn_prep's
 * blocks, each walking the tokens in turn (a q or k head's channels in registers from the convolution to the
 * norm, token by token; the v channels a thread each; the gate and beta of every token), the outputs into q, k and
 * v [n_tok][..] where the copies out of c would put them; the window kept and the history moved on after the last
 * token, by the thread that read the channel. The operations of conv1d_state, l2_norm and gdn_gate. */
__global__ void k_gdn_prep_n(float *q, float *kq, float *v, const float *x, float *hist, float *seq, int keep_seq,
                             const float *w, int n_tok, int ch, int k, int hk, int dk, float eps, float q_scale,
                             float *a, float *beta, const float *neg_exp_a, const float *dt_bias, int hv, int n_vb) {
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    const int b = blockIdx.x, nqk = 2 * hk;
    const int64_t kd = (int64_t)hk * dk, vd = ch - 2 * kd;
    if (b < nqk) { /* k <= GDN_KMAX and dk <= GDN_DKMAX blockDim.x (cu_gdn_prep) */
        float *out = b < hk ? q + (int64_t)b * dk : kq + (int64_t)(b - hk) * dk;
        const float scale = b < hk ? q_scale : 1.0f;
        for (int t = 0; t < n_tok; t++) {
            float vv[GDN_DKMAX];
            double ss = 0;
#pragma unroll
            for (int e = 0; e < GDN_DKMAX; e++) {
                const int i = threadIdx.x + e * blockDim.x;
                vv[e] = i < dk ? conv_tok(x, hist, w, ch, k, b * dk + i, t) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < GDN_DKMAX; e++)
                if (threadIdx.x + e * blockDim.x < dk) ss += (double)vv[e] * vv[e];
            ss = qwc_block_sum(ss, sh);
            const float inv = (float)(1.0 / sqrt(ss + eps)) * scale;
#pragma unroll
            for (int e = 0; e < GDN_DKMAX; e++) {
                const int i = threadIdx.x + e * blockDim.x;
                if (i < dk) out[t * kd + i] = vv[e] * inv;
            }
        }
        for (int i = threadIdx.x; i < dk; i += blockDim.x)
            conv_tok_end(x, hist, seq, keep_seq, ch, k, b * dk + i, n_tok);
    } else if (b < nqk + n_vb) {
        const int ci = nqk * dk + (b - nqk) * blockDim.x + threadIdx.x;
        if (ci < ch) {
            for (int t = 0; t < n_tok; t++) v[t * vd + ci - 2 * kd] = conv_tok(x, hist, w, ch, k, ci, t);
            conv_tok_end(x, hist, seq, keep_seq, ch, k, ci, n_tok);
        }
    } else {
        for (int i = threadIdx.x; i < n_tok * hv; i += blockDim.x) {
            a[i] = gdn_g(a[i], neg_exp_a[i % hv], dt_bias[i % hv]);
            if (beta) beta[i] = qwc_sigmoid(beta[i]);
        }
    }
}

static void cu_gdn_prep(const qw_backend *be, float *c, float *q, float *k, float *v, const float *x, float *hist,
                        float *seq, int keep_seq, const float *w, int n_tok, int ch, int kc, int hk, int dk, float eps,
                        float q_scale, float *a, float *beta, const float *neg_exp_a, const float *dt_bias, int hv) {
    const int nt = qwc_norm_threads(dk);
    const int one = n_tok == 1 && !keep_seq, regs = kc <= GDN_KMAX && dk <= GDN_DKMAX * nt;
    if (!QWC_GDN_PREP || !QWC_CONV_STATE || !QWC_FUSE_CONV_SILU || 2 * hk * dk > ch || n_tok < 1 ||
        n_tok > CONV_STATE_MAX_TOK || (!one && (!regs || !gdn_prep_n_on()))) {
        qw_gdn_prep_ops(be, c, q, k, v, x, hist, seq, keep_seq, w, n_tok, ch, kc, hk, dk, eps, q_scale, a, beta,
                        neg_exp_a, dt_bias, hv);
        return;
    }
    qwc *cc = qwc_of(be);
    const int n_vb = (int)qwc_blocks(ch - 2 * hk * dk, nt);
    if (one)
        qwc_launch(k_gdn_prep, 2 * hk + n_vb + 1, nt, 0, qwc_stream(cc), c, x, hist, qwc_wf(cc, w, (int64_t)ch * kc),
                   ch, kc, hk, dk, eps, q_scale, a, beta, qwc_wf(cc, neg_exp_a, hv), qwc_wf(cc, dt_bias, hv), hv, n_vb);
    else
        qwc_launch(k_gdn_prep_n, 2 * hk + n_vb + 1, nt, 0, qwc_stream(cc), q, k, v, x, hist, seq, keep_seq,
                   qwc_wf(cc, w, (int64_t)ch * kc), n_tok, ch, kc, hk, dk, eps, q_scale, a, beta,
                   qwc_wf(cc, neg_exp_a, hv), qwc_wf(cc, dt_bias, hv), hv, n_vb);
    QWC_LAUNCHED();
}

/*
 * The delta rule, token by token as the CPU kernels do it (kernels/cpu.c dr_heads; a prompt's call may take the
 * chunked form of delta_chunk.cu instead, qw_backend_cuda_set_dr_chunk), for one value head j and
 * column c of its state S [dk][dv]: per token S[:, c] *= exp(g) while kv = sum_r S[r][c] k[r] accumulates; u =
 * beta (v[c] - kv); S[r][c] += k[r] u while o = sum_r q[r] S[r][c] accumulates. Columns are independent.
 *
 * k_delta_rule4 (dk 32, 64 or 128): a block per value head and 16 columns, eight lanes of a warp per column
 * (lane = column + 4 part), lane part p holding rows p, p + 8, p + 16, ... of its column in registers for all the
 * tokens; each of kv and o is eight partial sums (each of two interleaved f32 accumulators, fused multiply-adds)
 * added across the eight lanes by three butterfly shuffles, which leave the same bits in every lane, so u is one
 * value. The tokens' q and k rows, decays and betas go through shared memory DR_TOK tokens at a time; v's next
 * element is loaded while a token computes. The order of the f32 sums is not the CPU's (a tree of 16 partial sums
 * instead of one running sum, and fused multiply-adds), so the results differ from it within f32 rounding
 * (t_cuda_ops' bound); a token's operations do not depend on how many tokens the call has, so a prompt and the
 * same tokens one at a time give the same bits.
 * k_delta_rule_any (other dk): one thread per column, the state read and written in place.
 */
constexpr int DR_TOK = 32, DR_COLS = 16, DR_PARTS = 8, DR_CW = 32 / DR_PARTS; /* DR_CW: columns a warp */

/* what k_delta_rule4<DK, true> does after its delta rule: each value head's rows of o through the gated norm (y =
 * rms_norm_gate(o; w, z), nt: the threads rms_norm_gate's kernel gives a row) by the head's last block to end;
 * count [hv]: zeros, left zeros */
struct dr_gate {
    float *y;
    const float *w, *z;
    float eps;
    int act, nt;
    qw_q8a *xq;
    unsigned *count;
};

template <int DK, bool GATE, bool ROWS>
__global__ void __launch_bounds__(128) k_delta_rule4(float *o, float *state, const float *q, const float *k,
                                                     const float *v, const float *g, const float *beta, int n_tok,
                                                     int hk, int hv, int dv, int tiled, dr_gate ng, int early,
                                                     qwc_rows rows) {
    if (ROWS) { /* grid z: the row, one token through its own state */
        const int64_t z = blockIdx.z;
        state = rows.p[z];
        q += z * hk * DK, k += z * hk * DK, v += z * hv * dv, o += z * hv * dv, g += z * hv, beta += z * hv;
    }
    if (early && (int)threadIdx.x < DK && blockIdx.y * DR_COLS < dv) /* the block's state rows into L2 */
        QWC_PREFETCH_L2(state + ((int64_t)blockIdx.x * DK + threadIdx.x) * dv + blockIdx.y * DR_COLS);
    QWC_PDL_ENTRY();
    constexpr int R = DK / DR_PARTS;
    __shared__ float sq[DR_TOK][DK], sk[DR_TOK][DK], sd[DR_TOK], sb[DR_TOK];
    const int j = blockIdx.x, lane = threadIdx.x & 31, p = lane / DR_CW;
    const int c = blockIdx.y * DR_COLS + (threadIdx.x >> 5) * DR_CW + lane % DR_CW;
    const int hq = tiled ? j % hk : j / (hv / hk); /* its q/k head */
    const bool on = c < dv;
    float *S = state + (int64_t)j * DK * dv;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = on ? S[(int64_t)(i * DR_PARTS + p) * dv + c] : 0.0f;
    for (int t0 = 0; t0 < n_tok; t0 += DR_TOK) {
        const int nt = min(DR_TOK, n_tok - t0);
        __syncthreads();
        for (int e = threadIdx.x; e < nt * DK; e += blockDim.x) {
            const int t = e / DK, r = e % DK;
            const int64_t at = ((int64_t)(t0 + t) * hk + hq) * DK + r;
            sq[t][r] = q[at];
            sk[t][r] = k[at];
        }
        if (threadIdx.x < nt) {
            sd[threadIdx.x] = expf(g[(int64_t)(t0 + threadIdx.x) * hv + j]);
            sb[threadIdx.x] = beta[(int64_t)(t0 + threadIdx.x) * hv + j];
        }
        __syncthreads();
        const float *vj = v + (int64_t)j * dv + c;
        float vn = on ? vj[(int64_t)t0 * hv * dv] : 0.0f;
        for (int t = 0; t < nt; t++) {
            const float vt = vn;
            if (on && t + 1 < nt) vn = vj[(int64_t)(t0 + t + 1) * hv * dv];
            const float decay = sd[t];
            float kv0 = 0, kv1 = 0;
#pragma unroll
            for (int i = 0; i < R; i += 2) {
                s[i] *= decay;
                kv0 = __fmaf_rn(sk[t][i * DR_PARTS + p], s[i], kv0);
                s[i + 1] *= decay;
                kv1 = __fmaf_rn(sk[t][(i + 1) * DR_PARTS + p], s[i + 1], kv1);
            }
            float kv = kv0 + kv1;
#pragma unroll
            for (int m = DR_CW; m < 32; m <<= 1) kv += __shfl_xor_sync(0xffffffffu, kv, m);
            const float u = sb[t] * (vt - kv);
            float a0 = 0, a1 = 0;
#pragma unroll
            for (int i = 0; i < R; i += 2) {
                s[i] = __fmaf_rn(sk[t][i * DR_PARTS + p], u, s[i]);
                a0 = __fmaf_rn(sq[t][i * DR_PARTS + p], s[i], a0);
                s[i + 1] = __fmaf_rn(sk[t][(i + 1) * DR_PARTS + p], u, s[i + 1]);
                a1 = __fmaf_rn(sq[t][(i + 1) * DR_PARTS + p], s[i + 1], a1);
            }
            float acc = a0 + a1;
#pragma unroll
            for (int m = DR_CW; m < 32; m <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
            if (on && p == 0) o[((int64_t)(t0 + t) * hv + j) * dv + c] = acc;
        }
    }
    if (on)
#pragma unroll
        for (int i = 0; i < R; i++) S[(int64_t)(i * DR_PARTS + p) * dv + c] = s[i];
    if (GATE) { /* the head's last block: its o complete (every block's stores made visible before it counts) */
        __shared__ unsigned last;
        __shared__ double sh[32];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(ng.count + j, 1u) == gridDim.y - 1;
        __syncthreads();
        if (!last) return;
        if (threadIdx.x == 0) ng.count[j] = 0; /* for the next launch (which reads it after this grid ends) */
        __threadfence();
        float *row = &sq[0][0]; /* a row of o, read past L1 (other blocks wrote it) */
        for (int t = 0; t < n_tok; t++) {
            const int64_t r = (int64_t)t * hv + j;
            __syncthreads();
            for (int i = threadIdx.x; i < dv; i += blockDim.x) row[i] = __ldcg(o + r * dv + i);
            __syncthreads();
            qw_q8a *xq = ng.xq ? ng.xq + r * dv / 32 : NULL;
            norm_gate_row(ng.y + r * dv, row, ng.w, ng.z + r * dv, dv, ng.eps, ng.act, xq, ng.nt, sh);
        }
    }
}

__global__ void k_delta_rule_any(float *o, float *state, const float *q, const float *k, const float *v,
                                 const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv,
                                 int tiled) {
    QWC_PDL_ENTRY();
    extern __shared__ float qk[]; /* [2][dk] */
    int j = blockIdx.x, c = threadIdx.x, hq = tiled ? j % hk : j / (hv / hk);
    float *S = state + (int64_t)j * dk * dv;
    for (int t = 0; t < n_tok; t++) {
        const float *qj = q + ((int64_t)t * hk + hq) * dk, *kj = k + ((int64_t)t * hk + hq) * dk;
        __syncthreads();
        for (int r = c; r < dk; r += blockDim.x) {
            qk[r] = qj[r];
            qk[dk + r] = kj[r];
        }
        __syncthreads();
        if (c >= dv) continue;
        float decay = expf(g[(int64_t)t * hv + j]), bt = beta[(int64_t)t * hv + j], kv = 0, acc = 0;
        for (int r = 0; r < dk; r++) {
            float x = S[(int64_t)r * dv + c] * decay;
            S[(int64_t)r * dv + c] = x;
            kv += qk[dk + r] * x;
        }
        float u = bt * (v[((int64_t)t * hv + j) * dv + c] - kv);
        for (int r = 0; r < dk; r++) {
            float x = S[(int64_t)r * dv + c] + qk[dk + r] * u;
            S[(int64_t)r * dv + c] = x;
            acc += qk[r] * x;
        }
        o[((int64_t)t * hv + j) * dv + c] = acc;
    }
}

/* k_delta_rule4 for dk 32, 64 or 128 (false for another dk: nothing launched); ROWS: n_rows rows of one token, row
 * r's state rows.p[r] */
template <bool GATE, bool ROWS = false>
static bool delta_rule4(cudaStream_t st, float *o, float *state, const float *q, const float *k, const float *v,
                        const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled,
                        const dr_gate &ng, const qwc_rows &rows = {}, int n_rows = 1) {
    void (*kern)(float *, float *, const float *, const float *, const float *, const float *, const float *, int, int,
                 int, int, int, dr_gate, int, qwc_rows) = dk == 128 ? k_delta_rule4<128, GATE, ROWS>
                                                          : dk == 64 ? k_delta_rule4<64, GATE, ROWS>
                                                          : dk == 32 ? k_delta_rule4<32, GATE, ROWS>
                                                                     : NULL;
    if (!kern) return false;
    const dim3 grid((unsigned)hv, (unsigned)((dv + DR_COLS - 1) / DR_COLS), (unsigned)n_rows);
    qwc_launch(kern, grid, DR_COLS * DR_PARTS, 0, st, o, state, q, k, v, g, beta, n_tok, hk, hv, dv, tiled, ng,
               qwc_early_ops(), rows);
    return true;
}

static void cu_delta_rule(const qw_backend *be, float *o, float *state, const float *q, const float *k, const float *v,
                          const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled) {
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    if (n_tok <= 0) return;
    if (qwc_delta_chunk(c, o, state, q, k, v, g, beta, n_tok, hk, hv, dk, dv, tiled)) return; /* a prompt's */
    const dr_gate none = {};
    if (!delta_rule4<false>(st, o, state, q, k, v, g, beta, n_tok, hk, hv, dk, dv, tiled, none)) {
        const int th = (dv + 31) / 32 * 32;
        if (th > 1024) qwc_die(__FILE__, __LINE__, "delta_rule", "value heads wider than 1024");
        qwc_launch(k_delta_rule_any, hv, th, (size_t)2 * dk * sizeof(float), st, o, state, q, k, v, g, beta, n_tok, hk,
                   hv, dk, dv, tiled);
    }
    QWC_LAUNCHED();
}

static void cu_delta_rule_rows(const qw_backend *be, float *o, float *const *state, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, int n, int hk, int hv, int dk,
                               int dv, int tiled) {
    if (n <= 0) return;
    if (n > QW_ROWS_MAX) qwc_die(__FILE__, __LINE__, "delta_rule_rows", "more rows than QW_ROWS_MAX");
    const dr_gate none = {};
    if (delta_rule4<false, true>(qwc_stream(qwc_of(be)), o, NULL, q, k, v, g, beta, 1, hk, hv, dk, dv, tiled, none,
                                 rows_of(state, n), n)) {
        QWC_LAUNCHED();
        return;
    }
    const int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv; /* another dk: a call a row */
    for (int r = 0; r < n; r++)
        cu_delta_rule(be, o + r * vd, state[r], q + r * kd, k + r * kd, v + r * vd, g + (int64_t)r * hv,
                      beta + (int64_t)r * hv, 1, hk, hv, dk, dv, tiled);
}

/* The delta rule with its gated norm (QWC_DR_GATE 0, or QWENC_CUDA_DR_GATE=0 in the environment: delta_rule, then
 * rms_norm_gate; t_cuda_ops and fusions.sh compare them): k_delta_rule4's blocks as they are, and the last block of
 * each value head to end normalises the head's rows with rms_norm_gate's kernel's operations and thread count (heads
 * of dk 32, 64 or 128 and dv a multiple of 32 under 256, whose norm takes 64 threads: fewer than the block's; up to
 * 16 tokens). */
#ifndef QWC_DR_GATE
#define QWC_DR_GATE 1
#endif
#define DR_GATE_MAX_TOK 16 /* more rows: the two ops (one block a head would norm them one after another) */

static void cu_delta_rule_gate(const qw_backend *be, float *o, float *state, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, int n_tok, int hk, int hv, int dk,
                               int dv, int tiled, const float *w, float *z, float eps, int act) {
    qwc *c = qwc_of(be);
    static int env = -1;
    const int threads = DR_COLS * DR_PARTS, nt = qwc_norm_threads(dv);
    unsigned *count = qwc_counts(c, hv);
    if (n_tok <= 0) return;
    if (!QWC_DR_GATE || !QWC_NORM_GATE || n_tok > DR_GATE_MAX_TOK || (dk != 32 && dk != 64 && dk != 128) ||
        dv % 32 || nt > threads || dv > DR_TOK * dk || !count || !qwc_env_switch("QWENC_CUDA_DR_GATE", 1, &env)) {
        cu_delta_rule(be, o, state, q, k, v, g, beta, n_tok, hk, hv, dk, dv, tiled);
        cu_rms_norm_gate(be, o, o, w, z, n_tok * hv, dv, eps, act);
        return;
    }
    const int64_t n = (int64_t)n_tok * hv * dv;
    const dr_gate ng = {o, qwc_wf(c, w, dv), z, eps, act, nt, qwc_q8_for(c, n, dv), count};
    delta_rule4<true>(qwc_stream(c), o, state, q, k, v, g, beta, n_tok, hk, hv, dk, dv, tiled, ng);
    QWC_LAUNCHED();
    if (ng.xq) qwc_q8_made(c, o, n);
}

void qwc_ops_fill(qw_backend *t) {
    t->matmul = cu_matmul;
    t->matmul_batch = cu_matmul_batch;
    t->get_rows = cu_get_rows;
    t->store_rows = cu_store_rows;
    t->copy_strided = cu_copy_strided;
    t->rms_norm = cu_rms_norm;
    t->rms_norm_grouped = cu_rms_norm_grouped;
    t->l2_norm = cu_l2_norm;
    t->silu = cu_silu;
    t->sigmoid = cu_sigmoid;
    t->mul = cu_mul;
    t->axpy = cu_axpy;
    t->divide = cu_divide;
    t->act_mul = cu_act_mul;
    t->rms_norm_gate = cu_rms_norm_gate;
    t->rope_table = cu_rope_table;
    t->rope = cu_rope;
    t->rms_norm_rope = cu_rms_norm_rope;
    t->rms_norm_rope_kv = cu_rms_norm_rope_kv;
    t->conv1d_dw = cu_conv1d_dw;
    t->conv1d_state = cu_conv1d_state;
    t->gdn_gate = cu_gdn_gate;
    t->gdn_prep = cu_gdn_prep;
    t->delta_rule = cu_delta_rule;
    t->delta_rule_gate = cu_delta_rule_gate;
    int rows_env = -1; /* read at each backend's making (t_session compares a backend with and one without) */
    if (QWC_ROWS && QWC_CONV_STATE && QWC_FUSE_CONV_SILU && qwc_env_switch("QWENC_CUDA_ROWS", 1, &rows_env)) {
        t->conv1d_state_rows = cu_conv1d_state_rows;
        t->delta_rule_rows = cu_delta_rule_rows;
    }
}
