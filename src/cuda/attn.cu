/*
 * attn.cu - the CUDA backend's softmax attention and QSA block indexer (ops.h; spec qwen4_exp.md 3.5).
 *
 * Attention: one block of ATT_WARPS warps per (query, head); the keys the query sees are dealt out to the
 * warps, each warp keeps a running max, sum and weighted value sum (an online softmax, in f32, the value sum
 * spread over its lanes), and the warps' partial results are merged in double at the end. The scores are
 * f32 dot products (a warp sum), as the CPU kernels compute them. Work grows with the keys a query sees, so a
 * decode step's launch is the same at every position (the position comes from the step in device memory).
 *
 * QSA: qsa_keys stores a step's raw keys and pools the blocks it completes (the f32 mean of R keys in order,
 * zero-centred RMS norm with a double sum, RoPE at the block's first position); qsa_select gives each query its
 * positions: the top budget/R of its complete blocks by sum_h relu(q_h . K_b) / sqrt(ihd) (dots in double, as
 * the reference), ties to the lower block, in ascending order, then the tail.
 */
#include <math.h>

#include "cuda/ops_internal.cuh"

#define ATT_WARPS 4
#define ATT_MAX_HD 512

__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(float *out, const float *q, int q_stride, const float *kc, const float *vc, int n_head, int n_head_kv,
                int hd, float scale, const int32_t *sel, const int32_t *sel_off, const qw_step *step) {
    QWC_PDL_ENTRY();
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float acc_sh[ATT_WARPS][ATT_MAX_HD];
    __shared__ float m_sh[ATT_WARPS], l_sh[ATT_WARPS];
    int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = n_head / n_head_kv, kvh = h / group;
    int nk = sel ? sel_off[t + 1] - sel_off[t] : step->pos0 + t + 1;
    const int32_t *keys = sel ? sel + sel_off[t] : NULL;
    const float *qh = q + (int64_t)t * q_stride + (int64_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();
    int64_t kv_stride = (int64_t)n_head_kv * hd;
    float m = -INFINITY, l = 0, acc[ATT_MAX_HD / 32];
#pragma unroll
    for (int e = 0; e < ATT_MAX_HD / 32; e++) acc[e] = 0;
    for (int i = warp; i < nk; i += ATT_WARPS) {
        int64_t pos = keys ? keys[i] : i;
        const float *kh = kc + pos * kv_stride + (int64_t)kvh * hd, *vh = vc + pos * kv_stride + (int64_t)kvh * hd;
        float s = 0;
        for (int d = lane; d < hd; d += 32) s += qs[d] * kh[d];
        s = qwc_warp_sum(s) * scale;
        float mn = fmaxf(m, s), ra = expf(m - mn), p = expf(s - mn);
        l = l * ra + p;
#pragma unroll
        for (int e = 0; e < ATT_MAX_HD / 32; e++) {
            int d = lane + 32 * e;
            if (d < hd) acc[e] = acc[e] * ra + p * vh[d];
        }
        m = mn;
    }
    if (lane == 0) {
        m_sh[warp] = m;
        l_sh[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < ATT_MAX_HD / 32; e++) {
        int d = lane + 32 * e;
        if (d < hd) acc_sh[warp][d] = acc[e];
    }
    __syncthreads();
    double M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++)
        if (l_sh[w] > 0) M = fmax(M, (double)m_sh[w]);
    double L = 0;
    for (int w = 0; w < ATT_WARPS; w++)
        if (l_sh[w] > 0) L += (double)l_sh[w] * exp((double)m_sh[w] - M);
    float *oh = out + ((int64_t)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        double a = 0;
        for (int w = 0; w < ATT_WARPS; w++)
            if (l_sh[w] > 0) a += (double)acc_sh[w][d] * exp((double)m_sh[w] - M);
        oh[d] = L > 0 ? (float)(a / L) : 0.0f; /* no visible key: zeros, as the reference gives */
    }
}

static void cu_attention(const qw_backend *be, float *out, const float *q, int q_stride, const float *kc,
                         const float *vc, int n_tok, int n_head, int n_head_kv, int hd, float scale, const int32_t *sel,
                         const int32_t *sel_off, void *work, const qw_step *step) {
    (void)work;
    if (hd > ATT_MAX_HD) qwc_die(__FILE__, __LINE__, "attention", "head dimension above 512");
    if (n_tok <= 0) return;
    qwc_launch(k_attention, n_tok * n_head, ATT_WARPS * 32, 0, qwc_stream(qwc_of(be)), out, q, q_stride, kc, vc, n_head,
               n_head_kv, hd, scale, sel, sel_off, step);
    QWC_LAUNCHED();
}

static size_t cu_attention_work(const qw_backend *be, int n_ctx, int hd) {
    (void)be, (void)n_ctx, (void)hd;
    return 0;
}

/* ---------------------------------------------------------------- QSA keys */

__global__ void k_qsa_raw(float *raw, const float *key_rows, int64_t key_stride, int n_tok, int ihd, const qw_step *step) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * ihd) return;
    int t = (int)(i / ihd), d = (int)(i % ihd);
    raw[(int64_t)(step->pos0 + t) * ihd + d] = key_rows[t * key_stride + d];
}

/* block blockIdx.x of those the step may complete: pooled, normed, rotated */
__global__ void k_qsa_pool(float *raw, float *blk, int n_tok, int ihd, int R, const float *k_norm, float eps,
                           const float *inv_freq, int n_rot, const qw_step *step) {
    QWC_PDL_ENTRY();
    __shared__ double sh[32];
    extern __shared__ float kb[]; /* [ihd] */
    int pos0 = step->pos0, b = pos0 / R + blockIdx.x;
    if (b >= (pos0 + n_tok) / R) return;
    for (int d = threadIdx.x; d < ihd; d += blockDim.x) {
        float sum = 0;
        for (int r = 0; r < R; r++) sum += raw[(int64_t)(b * R + r) * ihd + d];
        kb[d] = sum / (float)R;
    }
    __syncthreads();
    double ss = 0;
    for (int d = threadIdx.x; d < ihd; d += blockDim.x) ss += (double)kb[d] * kb[d];
    ss = qwc_block_sum(ss, sh);
    float inv = (float)(1.0 / sqrt(ss / ihd + eps));
    __syncthreads();
    for (int d = threadIdx.x; d < ihd; d += blockDim.x) kb[d] = kb[d] * inv * (1.0f + k_norm[d]);
    __syncthreads();
    int half = n_rot / 2;
    float p = (float)(b * R);
    float *dst = blk + (int64_t)b * ihd;
    for (int d = threadIdx.x; d < ihd; d += blockDim.x) {
        float v = kb[d];
        if (d < n_rot) {
            int k = d < half ? d : d - half;
            float ang = p * inv_freq[k], c = cosf(ang), s = sinf(ang);
            v = d < half ? kb[d] * c - kb[d + half] * s : kb[d] * c + kb[d - half] * s;
        }
        dst[d] = v;
    }
}

static void cu_qsa_keys(const qw_backend *be, float *raw, float *blk, const float *key_rows, int64_t key_stride,
                        int n_tok, int ihd, int R, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                        const qw_step *step) {
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    int64_t n = (int64_t)n_tok * ihd;
    if (n <= 0) return;
    qwc_launch(k_qsa_raw, qwc_blocks(n, 256), 256, 0, st, raw, key_rows, key_stride, n_tok, ihd, step);
    QWC_LAUNCHED();
    qwc_launch(k_qsa_pool, n_tok / R + 1, 128, (size_t)ihd * sizeof(float), st, raw, blk, n_tok, ihd, R,
               qwc_wf(c, k_norm, ihd), eps, qwc_wf(c, inv_freq, n_rot / 2), n_rot, step);
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- QSA selection */

/* the offsets of every query's positions: min(n_b, topk) blocks of R, then the tail */
__global__ void k_qsa_offsets(int32_t *sel_off, int n_tok, int R, int topk, const qw_step *step) {
    QWC_PDL_ENTRY();
    if (threadIdx.x || blockIdx.x) return;
    int64_t n = 0;
    for (int t = 0; t < n_tok; t++) {
        int i = step->pos0 + t, n_b = (i + 1) / R;
        sel_off[t] = (int32_t)n;
        n += (int64_t)(n_b < topk ? n_b : topk) * R + (i - n_b * R + 1);
    }
    sel_off[n_tok] = (int32_t)n;
}

/* one block per query: scores of its blocks, the top topk marked, positions written in block order */
__global__ void k_qsa_select(int32_t *sel, const int32_t *sel_off, const float *q, int64_t q_stride, const float *blk,
                             int n_head, int ihd, int R, int topk, const qw_step *step) {
    QWC_PDL_ENTRY();
    extern __shared__ float score[]; /* [n_b] scores, then [n_b] chosen flags */
    __shared__ float best_s[32];
    __shared__ int best_b[32];
    int t = blockIdx.x, i = step->pos0 + t, n_b = (i + 1) / R;
    unsigned char *chosen = (unsigned char *)(score + n_b);
    const float *qt = q + t * q_stride;
    float inv_sqrt = 1.0f / sqrtf((float)ihd);
    int keep_all = n_b <= topk;
    for (int b = threadIdx.x; b < n_b; b += blockDim.x) {
        chosen[b] = (unsigned char)keep_all;
        if (keep_all) continue;
        const float *kb = blk + (int64_t)b * ihd;
        float s = 0;
        for (int h = 0; h < n_head; h++) {
            const float *qh = qt + (int64_t)h * ihd;
            double dot = 0;
            for (int d = 0; d < ihd; d++) dot += (double)qh[d] * kb[d];
            if (dot > 0) s += (float)dot;
        }
        score[b] = s * inv_sqrt;
    }
    __syncthreads();
    /* topk rounds: the best unchosen block (higher score, or the same and lower index) */
    for (int round = 0; !keep_all && round < topk; round++) {
        float bs = -INFINITY;
        int bb = n_b;
        for (int b = threadIdx.x; b < n_b; b += blockDim.x)
            if (!chosen[b] && (score[b] > bs || (score[b] == bs && b < bb) || bb == n_b)) {
                bs = score[b];
                bb = b;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float os = __shfl_xor_sync(0xffffffffu, bs, o);
            int ob = __shfl_xor_sync(0xffffffffu, bb, o);
            if (ob < n_b && (bb == n_b || os > bs || (os == bs && ob < bb))) {
                bs = os;
                bb = ob;
            }
        }
        if ((threadIdx.x & 31) == 0) {
            best_s[threadIdx.x >> 5] = bs;
            best_b[threadIdx.x >> 5] = bb;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = -INFINITY;
            int w = n_b;
            for (int k = 0; k < (int)(blockDim.x >> 5); k++) {
                int ob = best_b[k];
                if (ob < n_b && (w == n_b || best_s[k] > s || (best_s[k] == s && ob < w))) {
                    s = best_s[k];
                    w = ob;
                }
            }
            if (w < n_b) chosen[w] = 1;
        }
        __syncthreads();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t *dst = sel + sel_off[t];
        int n = 0;
        for (int b = 0; b < n_b; b++)
            if (chosen[b])
                for (int r = 0; r < R; r++) dst[n++] = b * R + r;
        for (int p = n_b * R; p <= i; p++) dst[n++] = p;
    }
}

static void cu_qsa_select(const qw_backend *be, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                          const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                          const qw_step *step) {
    (void)work;
    cudaStream_t st = qwc_stream(qwc_of(be));
    qwc_launch(k_qsa_offsets, 1, 1, 0, st, sel_off, n_tok, R, topk, step);
    QWC_LAUNCHED();
    /* shared memory for the most blocks a query of this session may see: set by qsa_select_work */
    int max_blocks = qwc_qsa_max_blocks(qwc_of(be));
    size_t sh = (size_t)max_blocks * (sizeof(float) + 1) + 16;
    qwc_launch(k_qsa_select, n_tok, 256, sh, st, sel, sel_off, q, q_stride, blk, n_head, ihd, R, topk, step);
    QWC_LAUNCHED();
}

/* no work in device memory: the scores live in shared memory, sized here for the longest context */
static size_t cu_qsa_select_work(const qw_backend *be, int n_ctx, int R, int topk) {
    (void)topk;
    int blocks = n_ctx / R + 1;
    size_t sh = (size_t)blocks * (sizeof(float) + 1) + 16;
    if (sh > 200 * 1024) qwc_die(__FILE__, __LINE__, "qsa_select", "more QSA blocks than shared memory holds");
    if (qwc_qsa_reserve(qwc_of(be), blocks))
        QWC_CHECK(cudaFuncSetAttribute(k_qsa_select, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    return 0;
}

void qwc_attn_fill(qw_backend *t) {
    t->attention = cu_attention;
    t->attention_work = cu_attention_work;
    t->qsa_keys = cu_qsa_keys;
    t->qsa_select = cu_qsa_select;
    t->qsa_select_work = cu_qsa_select_work;
}
