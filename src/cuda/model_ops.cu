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

/* threads [0, n_tok H): a[t] = (1/C) sum_s m[t][s], or of sigmoid(m) * xn as k_act_mul forms it; the next n_inj:
 * inj = 2 sigmoid(inj / C) (one launch for all) */
__global__ void k_hc_read(float *a, const float *m, const float *xn, float *inj, int n_tok, int C, int H,
                          int64_t n_inj, qw_q8a *xq) {
    QWC_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = (int64_t)n_tok * H;
    if (i >= n) {
        if (i - n < n_inj) inj[i - n] = qwc_sigmoid(inj[i - n] / (float)C) * 2.0f;
        return;
    }
    int64_t t = i / H, d = i % H, CH = (int64_t)C * H;
    float s = 0;
    for (int c = 0; c < C; c++) {
        const int64_t o = t * CH + (int64_t)c * H + d;
        float v = m[o];
        if (xn) v = qwc_sigmoid(v) * xn[o];
        s += v;
    }
    const float r = s / (float)C;
    a[i] = r;
    if (xq) qwc_q8a_warp(r, xq + i / 32); /* n a multiple of 32: whole warps here */
}

/* One token's up product inside the read (QWC_HC_UP_READ 0, or QWENC_CUDA_HC_UP_READ=0 in the environment: divide,
 * the product and the read as three kernels; the same bits, tests/gpu/fusions.sh). */
#ifndef QWC_HC_UP_READ
#define QWC_HC_UP_READ 1
#endif

static void cu_hc_read(const qw_backend *be, float *a, float *m, float *u, const qw_tensor *up, const float *xn,
                       float *inj, int n_tok, int C, int H) {
    const int64_t n = (int64_t)n_tok * H, n_inj = inj ? (int64_t)n_tok * C : 0;
    if (n <= 0) return;
    qwc *c = qwc_of(be);
    qw_q8a *xq = qwc_q8_for(c, n, n);
    static int env = -1;
    if (up && QWC_HC_UP_READ && n_tok == 1 && xn && qwc_env_switch("QWENC_CUDA_HC_UP_READ", 1, &env)) {
        const qw_tensor d = qwc_tensor(c, up);
        if (qwc_hc_up_read(c, a, &d, u, xn, inj, C, H, xq)) {
            if (xq) qwc_q8_made(c, a, n);
            return;
        }
    }
    if (up) {
        be->divide(be, u, (float)C, (int64_t)n_tok * up->shape[1], 1); /* then silu */
        be->matmul(be, m, up, u, n_tok);
    }
    qwc_launch(k_hc_read, qwc_blocks(n + n_inj, 256), 256, 0, qwc_stream(c), a, m, xn, inj, n_tok, C, H, n_inj, xq);
    QWC_LAUNCHED();
    if (xq) qwc_q8_made(c, a, n);
}

__global__ void k_hc_inject(float *X, const float *inj, const float *y, int n_tok, int C, int H) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * C * H) return;
    int64_t d = i % H, tc = i / H, t = tc / C;
    X[i] += y[t * H + d] * inj[tc];
}

/* The inject and the next hyper-connection's norm as one kernel (QWC_HC_INJECT_NORM 0: k_hc_inject, then the
 * rms_norm_grouped op; the same bits, tests/gpu/fusions.sh). */
#ifndef QWC_HC_INJECT_NORM
#define QWC_HC_INJECT_NORM 1
#endif

/* A block per stream row r = t C + s: X's row += inj[r] * y[t] (k_hc_inject's operations), then xn's row = its
 * zero-centred RMS norm with w [C][H] (k_rms_norm's, with the same threads: its bits); xq (not NULL): xn's 8-bit
 * rounding too. */
__global__ void k_hc_inject_norm(float *X, const float *inj, const float *y, float *xn, const float *w, int C, int H,
                                 float eps, qw_q8a *xq, int early) {
    const int64_t r = blockIdx.x, t = r / C;
    const float *wr = w + (r % C) * H;
    float wv[QWC_EARLY_N]; /* the first norm weights, read before the wait (early) */
    if (early) qwc_early_row(wv, wr, H);
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    float *xr = X + r * H;
    const float *yr = y + t * H;
    const float g = inj[r];
    /* a thread's first QWC_EARLY_N values: every load asked for before the first store (X and y may be one array
     * to the compiler, so a loop's loads would each wait for the store before them), and kept for the norm */
    float xa[QWC_EARLY_N], ya[QWC_EARLY_N];
#pragma unroll
    for (int e = 0; e < QWC_EARLY_N; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        xa[e] = i < H ? xr[i] : 0.0f, ya[e] = i < H ? yr[i] : 0.0f;
    }
    double ss = 0;
#pragma unroll
    for (int e = 0; e < QWC_EARLY_N; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        if (i < H) {
            const float v = xa[e] + ya[e] * g;
            xr[i] = xa[e] = v;
            ss += (double)v * v;
        }
    }
    for (int i = threadIdx.x + QWC_EARLY_N * blockDim.x; i < H; i += blockDim.x) {
        const float v = xr[i] + yr[i] * g;
        xr[i] = v;
        ss += (double)v * v;
    }
    ss = qwc_block_sum(ss, sh);
    const float inv = (float)(1.0 / sqrt(ss / H + eps));
    auto put = [&](int i, float x, float wi) {
        const float v = x * inv * (1.0f + wi);
        xn[r * H + i] = v;
        if (xq) qwc_q8a_warp(v, xq + (r * H + i) / 32); /* H % 32 == 0: whole warps */
    };
#pragma unroll
    for (int e = 0; e < QWC_EARLY_N; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        if (i < H) put(i, xa[e], early ? wv[e] : wr[i]);
    }
    for (int i = threadIdx.x + QWC_EARLY_N * blockDim.x; i < H; i += blockDim.x) put(i, xr[i], wr[i]);
}

static void cu_hc_inject(const qw_backend *be, float *X, const float *inj, const float *y, int n_tok, int C, int H,
                         float *xn, const float *norm_w, float eps) {
    int64_t n = (int64_t)n_tok * C * H;
    if (n <= 0) return;
    qwc *c = qwc_of(be);
    if (xn && QWC_HC_INJECT_NORM) {
        const float *dw = qwc_wf(c, norm_w, (int64_t)C * H);
        qw_q8a *xq = qwc_q8_for(c, n, H);
        qwc_launch(k_hc_inject_norm, (unsigned)((int64_t)n_tok * C), qwc_norm_threads(H), 0, qwc_stream(c), X, inj, y,
                   xn, dw, C, H, eps, xq, qwc_early_ops());
        QWC_LAUNCHED();
        if (xq) qwc_q8_made(c, xn, n);
        return;
    }
    qwc_launch(k_hc_inject, qwc_blocks(n, 256), 256, 0, qwc_stream(c), X, inj, y, n_tok, C, H);
    QWC_LAUNCHED();
    if (xn) be->rms_norm_grouped(be, xn, X, norm_w, n_tok * C, C, H, eps, 1);
}

/* ---------------------------------------------------------------- PLE */

typedef struct {
    uint64_t m[8];
} mults;

/* one thread per (token, head) */
__global__ void k_ple_rows(int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok, int n, int nh,
                           int32_t eos, mults mult, const int64_t *prime, const int64_t *offset) {
    QWC_PDL_ENTRY();
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
    qwc_launch(k_ple_rows, qwc_blocks((int64_t)n_tok * n_heads, 128), 128, 0, qwc_stream(c), rows, tokens, hist, n_tok,
               ngram_n, n_heads, eos, m, dp, dof);
    QWC_LAUNCHED();
}

__global__ void k_ple_hist_push(int32_t *hist, const int32_t *tokens, int n_tok, int keep) {
    QWC_PDL_ENTRY();
    if (threadIdx.x || blockIdx.x) return;
    int32_t all[16];
    int n = 0;
    for (int i = 0; i < keep; i++) all[n++] = hist[i];
    for (int i = n_tok - keep > 0 ? n_tok - keep : 0; i < n_tok; i++) all[n++] = tokens[i];
    for (int i = 0; i < keep; i++) hist[i] = all[n - keep + i];
}

static void cu_ple_hist_push(const qw_backend *be, int32_t *hist, const int32_t *tokens, int n_tok, int ngram_n) {
    if (ngram_n < 2 || ngram_n > 9) return;
    qwc_launch(k_ple_hist_push, 1, 1, 0, qwc_stream(qwc_of(be)), hist, tokens, n_tok, ngram_n - 1);
    QWC_LAUNCHED();
}

static void cu_ple_gather(const qw_backend *be, float *e, const int64_t *rows, int64_t n, const qw_tensor *chunks,
                          int n_chunks, int64_t chunk_rows, int prefetch) {
    qwc *c = qwc_of(be);
    if (prefetch || n <= 0) return; /* the table is in device memory */
    /* the device pointers of the pieces, made once per table */
    const void *const *tab = (const void *const *)qwc_table_lookup(c, chunks, (size_t)n_chunks * sizeof(void *));
    if (!tab) {
        const void *h[64];
        if (n_chunks > 64) qwc_die(__FILE__, __LINE__, "ple_gather", "more than 64 pieces of an n-gram table");
        for (int i = 0; i < n_chunks; i++) /* device copies, or the host's pages read over the bus */
            h[i] = qwc_ple_host(c) ? qwc_host_mapped(c, chunks[i].data, (size_t)chunks[i].shape[0] *
                                                                         qw_type_row_size(chunks[i].type, chunks[i].shape[1]))
                                   : qwc_tensor(c, &chunks[i]).data;
        tab = (const void *const *)qwc_table(c, chunks, h, (size_t)n_chunks * sizeof(void *));
    }
    qwc_gather_rows(c, e, tab, chunks[0].type, chunks[0].shape[1], n_chunks, chunk_rows, rows, n);
}

/* one block per (token, stream): the gate from <K, Q> (a double sum), then G = gate * V */
__global__ void k_ple_gate(float *G, const float *K, const float *Q, const float *V, int C, int H) {
    QWC_PDL_ENTRY();
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
    qwc_launch(k_ple_gate, n_tok * C, 256, 0, qwc_stream(qwc_of(be)), G, K, Q, V, C, H);
    QWC_LAUNCHED();
}

/* one block per row: each thread the first largest of its strided share, then the block's by (value, lower index) */
__global__ void k_argmax(int32_t *out, const float *x, int64_t n) {
    QWC_PDL_ENTRY();
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
    qwc_launch(k_argmax, n_rows, 256, 0, qwc_stream(qwc_of(be)), out, x, n);
    QWC_LAUNCHED();
}

/* ---- topk: the k largest of a row under qw_topk_better (a NaN below every number; the sentinel (NaN, INT_MAX) below
 * everything) in rounds: a warp takes a chunk of 512 candidates, 16 in each lane's registers, and finds its best k by
 * k rounds of a warp arg max (the winner's lane retires it), largest first. k_topk_chunks does that for every chunk of
 * the row (n / 512 warps over the device); k_topk_merge, one block per row, repeats it over the chunks' winners until
 * one chunk's are left (31k -> 3.9k -> 512 -> 64 candidates for 248k values and k = 64). */
constexpr int TK_E = 16, TK_CHUNK = 32 * TK_E;

/* the warp's best k of candidates [base, base + cnt) of (v, ids: NULL = the index) into ov/oi[0..k) */
__device__ void tk_warp(const float *v, const int32_t *ids, int64_t base, int64_t cnt, int k, float *ov, int32_t *oi) {
    const int lane = threadIdx.x & 31;
    float cv[TK_E];
    int ci[TK_E];
#pragma unroll
    for (int e = 0; e < TK_E; e++) {
        const int64_t i = (int64_t)e * 32 + lane;
        cv[e] = i < cnt ? v[base + i] : __int_as_float(0x7fc00000);
        ci[e] = i < cnt ? (ids ? ids[base + i] : (int)(base + i)) : INT_MAX;
    }
    for (int j = 0; j < k; j++) {
        float bv = cv[0];
        int bi = ci[0];
#pragma unroll
        for (int e = 1; e < TK_E; e++)
            if (qw_topk_better(cv[e], ci[e], bv, bi)) bv = cv[e], bi = ci[e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ovv = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oii = __shfl_xor_sync(0xffffffffu, bi, o);
            if (qw_topk_better(ovv, oii, bv, bi)) bv = ovv, bi = oii;
        }
        if (lane == 0) ov[j] = bv, oi[j] = bi;
#pragma unroll
        for (int e = 0; e < TK_E; e++)
            if (ci[e] == bi && bi != INT_MAX) cv[e] = __int_as_float(0x7fc00000), ci[e] = INT_MAX;
    }
}

/* grid (chunks / 4, rows), 4 warps a block: chunk c of row r into cv/ci[(r * chunks + c) * k ..] */
__global__ void __launch_bounds__(128)
    k_topk_chunks(const float *x, int64_t n, int64_t chunks, int k, float *cv, int32_t *ci) {
    QWC_PDL_ENTRY();
    const int64_t c = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5), r = blockIdx.y;
    if (c >= chunks) return;
    const int64_t base = c * TK_CHUNK, o = (r * chunks + c) * k;
    tk_warp(x + r * n, NULL, base, n - base < TK_CHUNK ? n - base : TK_CHUNK, k, cv + o, ci + o);
}

/* one block of 16 warps per row (1024 threads would not have the registers tk_warp needs): rounds over the row's m
 * candidates (a[], then b[], ...) until one chunk's k remain */
__global__ void __launch_bounds__(512)
    k_topk_merge(float *av, int32_t *ai, float *bv, int32_t *bi, int64_t m0, int k, int32_t *ids, float *vals) {
    QWC_PDL_ENTRY();
    const int warp = threadIdx.x >> 5, r = blockIdx.x;
    float *sv = av + r * m0, *dv = bv + r * m0;
    int32_t *si = ai + r * m0, *di = bi + r * m0;
    int64_t m = m0;
    while (m > k) {
        const int64_t chunks = (m + TK_CHUNK - 1) / TK_CHUNK;
        for (int64_t c = warp; c < chunks; c += 16) {
            const int64_t base = c * TK_CHUNK;
            tk_warp(sv, si, base, m - base < TK_CHUNK ? m - base : TK_CHUNK, k, dv + c * k, di + c * k);
        }
        __syncthreads();
        float *tv = sv;
        int32_t *ti = si;
        sv = dv, si = di, dv = tv, di = ti;
        m = chunks * k;
    }
    for (int j = threadIdx.x; j < k; j += blockDim.x) ids[(int64_t)r * k + j] = si[j], vals[(int64_t)r * k + j] = sv[j];
}

void qwc_topk(qwc *c, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k, void *work) {
    if (n_rows <= 0 || n <= 0 || k <= 0) return;
    cudaStream_t st = qwc_stream(c);
    const int64_t chunks = (n + TK_CHUNK - 1) / TK_CHUNK, m = chunks * k; /* per row */
    float *av = (float *)work;
    int32_t *ai = (int32_t *)(av + n_rows * m);
    float *bv = (float *)(ai + n_rows * m);
    int32_t *bi = (int32_t *)(bv + n_rows * m);
    qwc_launch(k_topk_chunks, dim3((unsigned)((chunks + 3) / 4), (unsigned)n_rows), 128, 0, st, x, n, chunks, k, av,
               ai);
    QWC_LAUNCHED();
    qwc_launch(k_topk_merge, n_rows, 512, 0, st, av, ai, bv, bi, m, k, ids, vals);
    QWC_LAUNCHED();
}

static void cu_topk(const qw_backend *be, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k,
                    void *work) {
    qwc_topk(qwc_of(be), ids, vals, x, n_rows, n, k, work);
}

/* The device's topk (tests/gpu/t_cuda_ops.c); 0 at build time: sessions on the GPU bring the logits to the host for
 * sampling. */
#ifndef QWC_TOPK_ON
#define QWC_TOPK_ON 1
#endif

void qwc_model_ops_fill(qw_backend *t) {
    t->argmax = cu_argmax;
    t->topk = QWC_TOPK_ON ? cu_topk : NULL;
    t->hc_read = cu_hc_read;
    t->hc_inject = cu_hc_inject;
    t->ple_rows = cu_ple_rows;
    t->ple_hist_push = cu_ple_hist_push;
    t->ple_gather = cu_ple_gather;
    t->ple_gate = cu_ple_gate;
}
