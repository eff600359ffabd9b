/*
 * model_ops.cu - the CUDA backend's hyper-connection and PLE ops (ops.h; spec qwen4_exp.md 3.2, 3.3), each
 * the reference's loop (kernels/composite.c) with one thread per output: the same f32 operations in the same
 * order, the PLE gate's dot product in double.
 */
#include "cuda/ops_internal.cuh"

extern "C" {
#include "kernels/ple_hash.h"
}

/* ---------------------------------------------------------------- hyper-connections */

__global__ void k_hc_read(float *a, const float *m, int n_tok, int C, int H) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * H) return;
    int64_t t = i / H, d = i % H, CH = (int64_t)C * H;
    float s = 0;
    for (int c = 0; c < C; c++) s += m[t * CH + (int64_t)c * H + d];
    a[i] = s / (float)C;
}

__global__ void k_hc_inj(float *inj, int64_t n, int C) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = inj[i] / (float)C;
    v = 1.0f / (1.0f + qwc_expd(-v));
    inj[i] = v * 2.0f;
}

static void cu_hc_read(const qw_backend *be, float *a, const float *m, float *inj, int n_tok, int C, int H) {
    cudaStream_t st = qwc_stream(qwc_of(be));
    int64_t n = (int64_t)n_tok * H;
    if (n <= 0) return;
    k_hc_read<<<qwc_blocks(n, 256), 256, 0, st>>>(a, m, n_tok, C, H);
    QWC_LAUNCHED();
    if (inj) {
        k_hc_inj<<<qwc_blocks((int64_t)n_tok * C, 256), 256, 0, st>>>(inj, (int64_t)n_tok * C, C);
        QWC_LAUNCHED();
    }
}

__global__ void k_hc_inject(float *X, const float *inj, const float *y, int n_tok, int C, int H) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * C * H) return;
    int64_t d = i % H, tc = i / H, t = tc / C;
    X[i] += y[t * H + d] * inj[tc];
}

static void cu_hc_inject(const qw_backend *be, float *X, const float *inj, const float *y, int n_tok, int C, int H) {
    int64_t n = (int64_t)n_tok * C * H;
    if (n <= 0) return;
    k_hc_inject<<<qwc_blocks(n, 256), 256, 0, qwc_stream(qwc_of(be))>>>(X, inj, y, n_tok, C, H);
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- PLE */

typedef struct {
    uint64_t m[8];
} mults;

/* one thread per (token, head) */
__global__ void k_ple_rows(int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok, int n, int nh,
                           int32_t eos, mults mult, const int64_t *prime, const int64_t *offset) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_tok * nh) rows[i] = qw_ple_row(tokens, hist, i / nh, i % nh, n, nh, eos, mult.m, prime, offset);
}

static void cu_ple_rows(const qw_backend *be, int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok,
                        int ngram_n, int n_heads, int32_t eos, const uint64_t *mult, const int64_t *prime,
                        const int64_t *offset) {
    qwc *c = qwc_of(be);
    if (n_tok <= 0) return;
    mults m;
    for (int i = 0; i < 8; i++) m.m[i] = i < ngram_n ? mult[i] : 0;
    const int64_t *dp = (const int64_t *)qwc_weight(c, prime, (size_t)n_heads * sizeof(int64_t));
    const int64_t *dof = (const int64_t *)qwc_weight(c, offset, (size_t)n_heads * sizeof(int64_t));
    k_ple_rows<<<qwc_blocks((int64_t)n_tok * n_heads, 128), 128, 0, qwc_stream(c)>>>(rows, tokens, hist, n_tok, ngram_n,
                                                                                    n_heads, eos, m, dp, dof);
    QWC_LAUNCHED();
}

__global__ void k_ple_hist_push(int32_t *hist, const int32_t *tokens, int n_tok, int keep) {
    if (threadIdx.x || blockIdx.x) return;
    int32_t all[16];
    int n = 0;
    for (int i = 0; i < keep; i++) all[n++] = hist[i];
    for (int i = n_tok - keep > 0 ? n_tok - keep : 0; i < n_tok; i++) all[n++] = tokens[i];
    for (int i = 0; i < keep; i++) hist[i] = all[n - keep + i];
}

static void cu_ple_hist_push(const qw_backend *be, int32_t *hist, const int32_t *tokens, int n_tok, int ngram_n) {
    if (ngram_n < 2 || ngram_n > 9) return;
    k_ple_hist_push<<<1, 1, 0, qwc_stream(qwc_of(be))>>>(hist, tokens, n_tok, ngram_n - 1);
    QWC_LAUNCHED();
}

static void cu_ple_gather(const qw_backend *be, float *e, const int64_t *rows, int64_t n, const qw_tensor *chunks,
                          int n_chunks, int64_t chunk_rows, int prefetch) {
    qwc *c = qwc_of(be);
    if (prefetch || n <= 0) return; /* the table is in device memory */
    /* the device pointers of the pieces, made once per table */
    const void *const *tab = (const void *const *)qwc_lookup(c, chunks);
    if (!tab) {
        const void *h[64];
        if (n_chunks > 64) qwc_die(__FILE__, __LINE__, "ple_gather", "more than 64 pieces of an n-gram table");
        for (int i = 0; i < n_chunks; i++) h[i] = qwc_tensor(c, &chunks[i]).data;
        tab = (const void *const *)qwc_weight_as(c, chunks, h, (size_t)n_chunks * sizeof(void *));
    }
    qwc_gather_rows(c, e, tab, chunks[0].type, chunks[0].shape[1], n_chunks, chunk_rows, rows, n);
}

/* one block per (token, stream): the gate from <K, Q> (a double sum), then G = gate * V */
__global__ void k_ple_gate(float *G, const float *K, const float *Q, const float *V, int C, int H) {
    __shared__ double sh[32];
    int w = blockIdx.x, t = w / C;
    const float *k = K + (int64_t)w * H, *q = Q + (int64_t)w * H;
    double dot = 0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) dot += (double)k[i] * q[i];
    dot = qwc_block_sum(dot, sh);
    float inv_sqrt_h = 1.0f / sqrtf((float)H);
    float sg = (float)dot * inv_sqrt_h;
    float mag = sqrtf(fmaxf(fabsf(sg), 1e-6f));
    float g = sg > 0 ? mag : sg < 0 ? -mag : 0.0f;
    float gate = 1.0f / (1.0f + expf(-g));
    float *dst = G + (int64_t)w * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = gate * V[(int64_t)t * H + i];
}

static void cu_ple_gate(const qw_backend *be, float *G, const float *K, const float *Q, const float *V, int n_tok, int C,
                        int H) {
    if (n_tok <= 0) return;
    k_ple_gate<<<n_tok * C, 256, 0, qwc_stream(qwc_of(be))>>>(G, K, Q, V, C, H);
    QWC_LAUNCHED();
}

/* one block per row: each thread the first largest of its strided share, then the block's by (value, lower index) */
__global__ void k_argmax(int32_t *out, const float *x, int64_t n) {
    __shared__ float sv[256];
    __shared__ int64_t si[256];
    const float *row = x + (int64_t)blockIdx.x * n;
    float bv = 0;
    int64_t bi = -1;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        if (bi < 0 || row[i] > bv) bv = row[i], bi = i;
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float v = sv[threadIdx.x + s];
            int64_t i = si[threadIdx.x + s];
            if (i >= 0 && (si[threadIdx.x] < 0 || v > sv[threadIdx.x] || (v == sv[threadIdx.x] && i < si[threadIdx.x])))
                sv[threadIdx.x] = v, si[threadIdx.x] = i;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)(si[0] < 0 ? 0 : si[0]);
}

static void cu_argmax(const qw_backend *be, int32_t *out, const float *x, int n_rows, int64_t n) {
    if (n_rows <= 0 || n <= 0) return;
    k_argmax<<<n_rows, 256, 0, qwc_stream(qwc_of(be))>>>(out, x, n);
    QWC_LAUNCHED();
}

void qwc_model_ops_fill(qw_backend *t) {
    t->argmax = cu_argmax;
    t->hc_read = cu_hc_read;
    t->hc_inject = cu_hc_inject;
    t->ple_rows = cu_ple_rows;
    t->ple_hist_push = cu_ple_hist_push;
    t->ple_gather = cu_ple_gather;
    t->ple_gate = cu_ple_gate;
}
