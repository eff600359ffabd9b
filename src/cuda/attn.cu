/*
 * attn.cu - the CUDA backend's softmax attention and QSA block indexer (ops.h; spec qwen4_exp.md 3.5).
 *
 * Attention (few queries: a decode step, drafts; prompt steps: k_attention_tiles below): one block of ATT_WARPS
 * warps per (query, head); the keys the query sees are dealt out to the
 * warps, each warp keeps a running max, sum and weighted value sum (an online softmax, in f32, the value sum
 * spread over its lanes), and the warps' partial results are merged in double at the end. The scores are
 * f32 dot products (a warp sum), as the CPU kernels compute them. Work grows with the keys a query sees, so a
 * decode step's launch is the same at every position (the position comes from the step in device memory). A query
 * that sees more than ATT_SPLIT_MIN keys goes to the tiled kernel of prompt steps instead, split ATT_SPLIT ways
 * along the keys (att_split below: flash-decoding).
 *
 * QSA: qsa_keys stores a step's raw keys and pools the blocks it completes (the f32 mean of R keys in order,
 * zero-centred RMS norm with a double sum, RoPE at the block's first position); qsa_select gives each query its
 * positions: the top budget/R of its complete blocks by sum_h relu(q_h . K_b) / sqrt(ihd) (dots in double, as
 * the reference), ties to the lower block, in ascending order, then the tail.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda/ops_internal.cuh"
#include "cuda/mma.cuh"

#define ATT_WARPS 4
#define QWC_QSA_SPLIT_MAX_TOK 16 /* more queries: one block each (a prompt step has blocks enough) */
#define ATT_MAX_HD 512

/* One query head against its keys (the block: k_attention's): keys[0 .. nk) (NULL: positions 0 .. nk - 1) of kv head
 * kvh; qh its query, oh where its output goes */
__device__ __forceinline__ void attention_head(float *oh, const float *qh, const float *kc, const float *vc, int kvh,
                                               int n_head_kv, int hd, float scale, const int32_t *keys, int nk) {
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float acc_sh[ATT_WARPS][ATT_MAX_HD];
    __shared__ float m_sh[ATT_WARPS], l_sh[ATT_WARPS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        double a = 0;
        for (int w = 0; w < ATT_WARPS; w++)
            if (l_sh[w] > 0) a += (double)acc_sh[w][d] * exp((double)m_sh[w] - M);
        oh[d] = L > 0 ? (float)(a / L) : 0.0f; /* no visible key: zeros, as the reference gives */
    }
}

/* nk_max: queries that see more keys are the split kernel's (their blocks return at once) */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(float *out, const float *q, int q_stride, const float *kc, const float *vc, int n_head, int n_head_kv,
                int hd, float scale, const int32_t *sel, const int32_t *sel_off, const qw_step *step, int nk_max) {
    QWC_PDL_ENTRY();
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int nk = sel ? sel_off[t + 1] - sel_off[t] : step->pos0 + t + 1;
    if (nk > nk_max) return;
    attention_head(out + ((int64_t)t * n_head + h) * hd, q + (int64_t)t * q_stride + (int64_t)h * hd, kc, vc,
                   h / (n_head / n_head_kv), n_head_kv, hd, scale, sel ? sel + sel_off[t] : NULL, nk);
}

/* A batched step's rows (attention_rows): block (row t, head h) as k_attention's for row t's one-token call */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention_rows(qw_attn_rows r, float *out, const float *q, int q_stride, int n_head, int n_head_kv, int hd,
                     float scale, const int32_t *sel, const int32_t *sel_off, int sel_stride, int nk_max) {
    QWC_PDL_ENTRY();
    const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    const int nk = sel ? sel_off[2 * t + 1] - sel_off[2 * t] : r.step[t]->pos0 + 1;
    if (nk > nk_max) return;
    attention_head(out + ((int64_t)t * n_head + h) * hd, q + (int64_t)t * q_stride + (int64_t)h * hd, r.k[t], r.v[t],
                   h / (n_head / n_head_kv), n_head_kv, hd, scale,
                   sel ? sel + (int64_t)t * sel_stride + sel_off[2 * t] : NULL, nk);
}

/*
 * Prompt steps (more than ATT_TILE_MIN_TOK queries, head dimension 128 or 256, G = n_head / n_head_kv of 1-16):
 * one block of 256 threads per (query, kv head) for all G query heads that share the kv head, so each key and
 * value row is read once for the G heads. The query's keys go through shared memory TK at a time (32 rows at HD
 * 256, 64 at 128). Scores: warp w takes the keys 32 (w / DSL) + lane and the dimensions of slice w % DSL (32 of
 * them), each thread the G heads' partial dots of its key over its slice (the key's 32 values read once); the DSL
 * partials are added in slice order and times the scale (f32 dots, fused multiply-adds, in another order than the
 * token kernel's). Then
 * a warp per head takes the tile's max, rescales its running max, sum and value sums (the online softmax, in f32)
 * and writes the tile's probabilities; then each thread adds, for its dimension and its heads, the tile's values
 * weighted by them. out = value sums / sum (zeros where no key is seen, as the reference gives).
 */
#define ATT_TILE_MIN_TOK 16
#define ATT_TILE_THREADS 256

template <int HD, int G> struct att_tile {
    static constexpr int DSL = HD / 32, KW = 8 / DSL, TK = 32 * KW, KP = HD + 4;
    static constexpr int HP = ATT_TILE_THREADS / HD, GH = (G + HP - 1) / HP;
    /* floats of shared memory: K tile, V tile, q, partial scores, probabilities, rescales, maxes, sums */
    static constexpr int SMEM = TK * KP + TK * HD + G * HD + DSL * G * TK + TK * G + 3 * G;
};

/* A tile's row piece (16 bytes) into shared memory: by cp.async (ASYNC; zeros when !ok), or loaded and stored in
 * place (QWENC_CUDA_ATT_ASYNC=0: the tiles' loads wait where they stand, as before the copies ran a stage ahead;
 * the same values either way) */
template <bool ASYNC> __device__ __forceinline__ void att_copy16(float *dst, const float *src, bool ok) {
    if constexpr (ASYNC) cp_async16(dst, src, ok);
    else *(float4 *)dst = ok ? *(const float4 *)src : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
/* A tile's n rows (of TK) of kv head kvh into dst (rows stride floats apart; zeros past n) by the block's
 * ATT_TILE_THREADS threads, then committed as one group: the rows at keys[i0 ..] (NULL: positions i0 ..) of cache */
template <int HD, int TK, bool ASYNC>
__device__ __forceinline__ void att_copy_tile(float *dst, int stride, const float *cache, int64_t kv_stride, int kvh,
                                              const int32_t *keys, int i0, int n) {
    for (int e = threadIdx.x; e < TK * (HD / 4); e += ATT_TILE_THREADS) {
        const int k = e / (HD / 4), d4 = 4 * (e % (HD / 4));
        const int64_t pos = k < n ? (keys ? keys[i0 + k] : i0 + k) : 0;
        att_copy16<ASYNC>(dst + k * stride + d4, cache + pos * kv_stride + (int64_t)kvh * HD + d4, k < n);
    }
    cp_commit();
}
static int att_async(void) {
    const char *e = getenv("QWENC_CUDA_ATT_ASYNC"); /* read at each call: tests compare the two */
    return !(e && e[0] == '0');
}

/*
 * Few queries over many keys (decode steps, drafts and a batched step's rows; QWENC_CUDA_ATT_SPLIT=S, default 16):
 * for a query that sees more than min_keys keys (QWENC_CUDA_ATT_SPLIT_MIN, default ATT_SPLIT_MIN) the tiled
 * kernel's blocks for each (query, kv head) split S ways along the keys, so that a decode step has S n_head_kv
 * blocks at work instead of n_head blocks each walking every key alone (flash-decoding); the per-head kernel,
 * launched beside it, takes the queries with fewer keys (each kernel's blocks return at once for the other's
 * queries: the choice is made on the device, where a recorded step's position is). Block s takes the keys
 * [s cs, (s + 1) cs) of the query's nk, cs = ceil(nk / S) rounded up to whole tiles (the chunks past nk are empty),
 * and leaves its heads' running max m, sum l and value sums (the online softmax of its keys, the tiled kernel's f32
 * operations) in part; the last of the S blocks to end (a counter per (query, kv head), left at zero) merges them in
 * split order, in double: M = max m_s over the splits with l_s > 0, L = sum l_s exp(m_s - M), out = sum acc_s
 * exp(m_s - M) / L (zeros where no key is seen). A query's result depends on its keys, S and min_keys only, not on
 * the other queries of the call: a draft step's rows and a batched step's rows are one-token steps' bits.
 */
struct att_split {
    int S;           /* splits (1: none; the tiled kernel as it was) */
    int min_keys;    /* split: queries that see at most this many keys are the per-head kernel's */
    float *part;     /* [n_tok n_head_kv][S][G (2 + HD)]: m [G], l [G], acc [G][HD] */
    unsigned *count; /* [n_tok n_head_kv] */
};

/* The S partials of (query, kv head) tk merged by the last of its blocks to end; W: shared memory for G S doubles
 * (the tiles', free by then). Each split's weight exp(m_s - M) is taken once a head and split (W; -1 where the split
 * saw no key), then L and the value sums add them in split order: the operations of a weight taken where it is used,
 * with G S exponentials instead of G HD S. */
#define ATT_SPLIT_MAX 256

template <int HD, int G>
__device__ __forceinline__ void att_split_merge(const att_split &sp, const float *acc, const float *mx,
                                                const float *sum, float *out, int64_t tk, double *W) {
    constexpr int HP = att_tile<HD, G>::HP, GH = att_tile<HD, G>::GH, PW = G * (2 + HD);
    static_assert(2 * G * ATT_SPLIT_MAX <= att_tile<HD, G>::SMEM, "the merge's weights fit the tiles' memory");
    const int tid = threadIdx.x, d = tid % HD, hp = tid / HD, S = sp.S;
    float *mine = sp.part + (tk * S + blockIdx.z) * PW;
    if (tid < G) mine[tid] = mx[tid], mine[G + tid] = sum[tid];
#pragma unroll
    for (int j = 0; j < GH; j++) {
        const int h = hp + HP * j;
        if (h < G) mine[2 * G + h * HD + d] = acc[j];
    }
    __shared__ unsigned last;
    __shared__ double Ms[G], Ls[G];
    __threadfence(); /* every block's partials visible before it counts */
    __syncthreads();
    if (tid == 0) last = atomicAdd(sp.count + tk, 1u) == (unsigned)S - 1;
    __syncthreads();
    if (!last) return;
    if (tid == 0) sp.count[tk] = 0; /* for the next launch (which reads it after this grid ends) */
    __threadfence();
    const float *all = sp.part + tk * S * PW;
    if (tid < G) {
        double M = -INFINITY;
        for (int s = 0; s < S; s++)
            if (__ldcg(all + s * PW + G + tid) > 0) M = fmax(M, (double)__ldcg(all + s * PW + tid));
        Ms[tid] = M;
    }
    __syncthreads();
    for (int i = tid; i < G * S; i += ATT_TILE_THREADS) {
        const int h = i / S;
        const float *p = all + (i % S) * PW;
        W[i] = __ldcg(p + G + h) > 0 ? exp((double)__ldcg(p + h) - Ms[h]) : -1.0;
    }
    __syncthreads();
    if (tid < G) {
        double L = 0;
        for (int s = 0; s < S; s++) {
            const double w = W[tid * S + s];
            if (w >= 0) L += (double)__ldcg(all + s * PW + G + tid) * w;
        }
        Ls[tid] = L;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < GH; j++) {
        const int h = hp + HP * j;
        if (h >= G) continue;
        double a = 0;
        for (int s = 0; s < S; s++) {
            const double w = W[h * S + s];
            if (w >= 0) a += (double)__ldcg(all + s * PW + 2 * G + h * HD + d) * w;
        }
        out[h * HD + d] = Ls[h] > 0 ? (float)(a / Ls[h]) : 0.0f;
    }
}

/* block (query t, kv head blockIdx.y, split blockIdx.z) of the tiled kernel: t's nk keys (keys[i], or positions 0 ..
 * nk - 1 where keys is NULL) in caches kc, vc */
template <int HD, int G, bool SPLIT, bool ASYNC>
__device__ __forceinline__ void attention_tiles_block(float *out, const float *q, int q_stride, const float *kc,
                                                      const float *vc, int n_head, int n_head_kv, float scale,
                                                      const int32_t *keys, int nk, int t, const att_split &sp) {
    using L = att_tile<HD, G>;
    constexpr int DSL = L::DSL, TK = L::TK, KP = L::KP, HP = L::HP, GH = L::GH;
    extern __shared__ __align__(16) float sm[];
    float *ks = sm, *vs = ks + TK * KP, *qs = vs + TK * HD, *ps = qs + G * HD, *pr = ps + DSL * G * TK;
    float *al = pr + TK * G, *mx = al + G, *sum = mx + G;
    const int kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t kv_stride = (int64_t)n_head_kv * HD;
    const float *qt = q + (int64_t)t * q_stride + (int64_t)kvh * G * HD; /* heads kvh G .. kvh G + G - 1 */
    for (int i = tid; i < G * HD; i += ATT_TILE_THREADS) qs[i] = qt[i];
    if (tid < G) mx[tid] = -INFINITY, sum[tid] = 0.0f;
    float acc[GH];
#pragma unroll
    for (int j = 0; j < GH; j++) acc[j] = 0.0f;
    const int dsl = w % DSL, kk = (w / DSL) * 32 + lane, d = tid % HD, hp = tid / HD;
    int kb = 0, ke = nk; /* this block's keys: all, or split blockIdx.z's chunk */
    if constexpr (SPLIT) {
        const int cs = ((nk + sp.S - 1) / sp.S + TK - 1) / TK * TK;
        kb = min(nk, (int)blockIdx.z * cs), ke = min(nk, kb + cs);
    }
    /* the tiles' keys and values come by cp.async, each a stage ahead of its use: the next tile's keys while this
     * tile's softmax and value sums run (ks is free once its scores are made), the next tile's values while its
     * scores run (vs is free once this tile's sums are added); zeros past the keys. Two groups in flight at most:
     * a tile's keys and values, in that order. */
    const auto copy_rows = [&](float *dst, int stride, const float *cache, int i0, int n) {
        att_copy_tile<HD, TK, ASYNC>(dst, stride, cache, kv_stride, kvh, keys, i0, n);
    };
    if (kb < ke) {
        copy_rows(ks, KP, kc, kb, min(TK, ke - kb));
        copy_rows(vs, HD, vc, kb, min(TK, ke - kb));
    }
    for (int i0 = kb; i0 < ke; i0 += TK) {
        const int n = min(TK, ke - i0), nn = min(TK, ke - i0 - TK); /* nn > 0: a tile follows */
        cp_wait<1>(); /* this tile's keys (its values may still come) */
        __syncthreads();
        { /* partial dots: key kk, dimensions 32 dsl .. 32 dsl + 31, every head */
            float part[G];
#pragma unroll
            for (int h = 0; h < G; h++) part[h] = 0.0f;
#pragma unroll
            for (int c = 0; c < 32; c += 4) {
                const float4 kv = *(const float4 *)(ks + kk * KP + 32 * dsl + c);
#pragma unroll
                for (int h = 0; h < G; h++) {
                    const float4 qv = *(const float4 *)(qs + h * HD + 32 * dsl + c);
                    part[h] = __fmaf_rn(qv.x, kv.x, part[h]);
                    part[h] = __fmaf_rn(qv.y, kv.y, part[h]);
                    part[h] = __fmaf_rn(qv.z, kv.z, part[h]);
                    part[h] = __fmaf_rn(qv.w, kv.w, part[h]);
                }
            }
#pragma unroll
            for (int h = 0; h < G; h++) ps[(dsl * G + h) * TK + kk] = part[h];
        }
        __syncthreads();
        if (nn > 0) copy_rows(ks, KP, kc, i0 + TK, nn);
        for (int h = w; h < G; h += ATT_TILE_THREADS / 32) { /* the online softmax of head h over the tile */
            float s[TK / 32], tmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < TK / 32; j++) {
                const int k = lane + 32 * j;
                float v = 0.0f;
#pragma unroll
                for (int p = 0; p < DSL; p++) v += ps[(p * G + h) * TK + k];
                s[j] = k < n ? v * scale : -INFINITY;
                tmax = fmaxf(tmax, s[j]);
            }
            for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
            const float m0 = mx[h], m1 = fmaxf(m0, tmax), ra = expf(m0 - m1);
            float ts = 0.0f;
#pragma unroll
            for (int j = 0; j < TK / 32; j++) {
                const int k = lane + 32 * j;
                const float p = k < n ? expf(s[j] - m1) : 0.0f;
                pr[k * G + h] = p;
                ts += p;
            }
            ts = qwc_warp_sum(ts);
            __syncwarp();
            if (lane == 0) mx[h] = m1, sum[h] = sum[h] * ra + ts, al[h] = ra;
        }
        if (nn > 0) cp_wait<1>(); /* this tile's values (the next tile's keys may still come) */
        else cp_wait<0>();
        __syncthreads();
        /* value sums: dimension d of heads hp, hp + HP, ... (G / HP chains side by side, each value read once) */
#pragma unroll
        for (int j = 0; j < GH; j++)
            if (hp + HP * j < G) acc[j] *= al[hp + HP * j];
        if constexpr (HP == 1 && G % 4 == 0) { /* a key's G probabilities by 16-byte reads (the same products) */
            static_assert((TK * KP + TK * HD + G * HD + DSL * G * TK) % 4 == 0, "pr's rows are 16-byte aligned");
            for (int k = 0; k < n; k++) {
                const float v = vs[k * HD + d];
#pragma unroll
                for (int j = 0; j < G; j += 4) {
                    const float4 p = *(const float4 *)(pr + k * G + j);
                    acc[j] = __fmaf_rn(p.x, v, acc[j]);
                    acc[j + 1] = __fmaf_rn(p.y, v, acc[j + 1]);
                    acc[j + 2] = __fmaf_rn(p.z, v, acc[j + 2]);
                    acc[j + 3] = __fmaf_rn(p.w, v, acc[j + 3]);
                }
            }
        } else {
            for (int k = 0; k < n; k++) {
                const float v = vs[k * HD + d];
#pragma unroll
                for (int j = 0; j < GH; j++)
                    if (hp + HP * j < G) acc[j] = __fmaf_rn(pr[k * G + hp + HP * j], v, acc[j]);
            }
        }
        __syncthreads(); /* vs, pr and al are done with */
        if (nn > 0) copy_rows(vs, HD, vc, i0 + TK, nn);
    }
    __syncthreads();
    if constexpr (SPLIT) {
        att_split_merge<HD, G>(sp, acc, mx, sum, out + ((int64_t)t * n_head + (int64_t)kvh * G) * HD,
                               (int64_t)t * n_head_kv + kvh, (double *)sm);
    } else {
#pragma unroll
        for (int j = 0; j < GH; j++) {
            const int h = hp + HP * j;
            if (h >= G) continue;
            const float l = sum[h];
            out[((int64_t)t * n_head + (int64_t)kvh * G + h) * HD + d] = l > 0 ? acc[j] / l : 0.0f;
        }
    }
}

template <int HD, int G, bool SPLIT, bool ASYNC>
__global__ void __launch_bounds__(ATT_TILE_THREADS)
    k_attention_tiles(float *out, const float *q, int q_stride, const float *kc, const float *vc, int n_head,
                      int n_head_kv, float scale, const int32_t *sel, const int32_t *sel_off, const qw_step *step,
                      att_split sp) {
    QWC_PDL_ENTRY();
    const int t = blockIdx.x, nk = sel ? sel_off[t + 1] - sel_off[t] : step->pos0 + t + 1;
    if (SPLIT && nk <= sp.min_keys) return; /* the per-head kernel's */
    attention_tiles_block<HD, G, SPLIT, ASYNC>(out, q, q_stride, kc, vc, n_head, n_head_kv, scale,
                                        sel ? sel + sel_off[t] : NULL, nk, t, sp);
}

/* A batched step's rows split along the keys: block (row t, kv head, split) as k_attention_tiles' for row t's
 * one-token call (attention_rows) */
template <int HD, int G, bool ASYNC>
__global__ void __launch_bounds__(ATT_TILE_THREADS)
    k_attention_split_rows(qw_attn_rows r, float *out, const float *q, int q_stride, int n_head, int n_head_kv,
                           float scale, const int32_t *sel, const int32_t *sel_off, int sel_stride, att_split sp) {
    QWC_PDL_ENTRY();
    const int t = blockIdx.x, nk = sel ? sel_off[2 * t + 1] - sel_off[2 * t] : r.step[t]->pos0 + 1;
    if (nk <= sp.min_keys) return; /* k_attention_rows' */
    attention_tiles_block<HD, G, true, ASYNC>(out, q, q_stride, r.k[t], r.v[t], n_head, n_head_kv, scale,
                                       sel ? sel + (int64_t)t * sel_stride + sel_off[2 * t] : NULL, nk, t, sp);
}

/* One call of the tiled kernel: a step's n_tok queries (rows NULL: caches kc, vc, the step's selection sel,
 * sel_off), or a batched step's n_tok rows (rows: each row's caches and step, its selection at sel + t sel_stride +
 * sel_off[2 t], split only) */
struct att_call {
    float *out;
    const float *q;
    int q_stride;
    const float *kc, *vc;
    int n_tok, n_head, n_head_kv;
    float scale;
    const int32_t *sel, *sel_off;
    int sel_stride;
    const qw_step *step;
    const qw_attn_rows *rows;
};

template <int HD, int G, bool ASYNC> static void attention_tiles_as(cudaStream_t st, const att_call &a, att_split sp) {
    const size_t sh = (size_t)att_tile<HD, G>::SMEM * sizeof(float);
    const dim3 grid((unsigned)a.n_tok, (unsigned)a.n_head_kv, (unsigned)sp.S);
    if (a.rows) {
        auto *k = k_attention_split_rows<HD, G, ASYNC>;
        QWC_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
        qwc_launch(k, grid, ATT_TILE_THREADS, sh, st, *a.rows, a.out, a.q, a.q_stride, a.n_head, a.n_head_kv, a.scale,
                   a.sel, a.sel_off, a.sel_stride, sp);
    } else {
        auto *k = sp.S > 1 ? k_attention_tiles<HD, G, true, ASYNC> : k_attention_tiles<HD, G, false, ASYNC>;
        QWC_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
        qwc_launch(k, grid, ATT_TILE_THREADS, sh, st, a.out, a.q, a.q_stride, a.kc, a.vc, a.n_head, a.n_head_kv,
                   a.scale, a.sel, a.sel_off, a.step, sp);
    }
    QWC_LAUNCHED();
}
template <int HD, int G> static void attention_tiles(cudaStream_t st, const att_call &a, att_split sp) {
    if (att_async()) attention_tiles_as<HD, G, true>(st, a, sp);
    else attention_tiles_as<HD, G, false>(st, a, sp);
}

/* the tiled kernel for these heads (sp.S > 1: split along the keys): 1 when it ran */
template <int HD> static int attention_tiles_g(cudaStream_t st, const att_call &a, att_split sp) {
    switch (a.n_head / a.n_head_kv) {
#define ATT_G(g)                                                                                                   \
    case g: attention_tiles<HD, g>(st, a, sp); return 1;
        ATT_G(1) ATT_G(2) ATT_G(4) ATT_G(6) ATT_G(8) ATT_G(12) ATT_G(16)
#undef ATT_G
    default: return 0;
    }
}

/*
 * Dense prompt steps (no selection; QWENC_CUDA_ATT_QTILES=0 in the environment: k_attention_tiles instead): one
 * block of 256 threads per (QB consecutive queries, kv head), its ROWS = QB G rows (query, head) sharing each key
 * and value tile, so a tile is read once for QB queries. QB = 32 / G rounded down to a power
 * of 2 (1 to 8). A tile of 32 keys: warp w scores its rows w RPW .. against key `lane` (full dots, f32 fused
 * multiply-adds, times the scale; keys past the row's position -inf); a warp a row takes the tile's max, rescales the
 * row's running max and sum and writes its probabilities (the online softmax in f32); then thread (dimension group,
 * row group) adds the tile's values weighted by them for 4 dimensions and RPG rows. out = value sums / sum. The sums
 * run in another order than the other kernels': t_cuda_ops holds it to the same bound against the reference.
 */
template <int HD, int G> struct att_qtile {
    static constexpr int QB = G >= 32 ? 1 : G > 16 ? 1 : G > 8 ? 2 : G > 4 ? 4 : 8;
    static constexpr int ROWS = QB * G, TK = 32, KP = HD + 4, RPW = (ROWS + 7) / 8;
    static constexpr int NDG = HD / 4, NRG = ATT_TILE_THREADS / NDG, RPG = (ROWS + NRG - 1) / NRG;
    /* floats of shared memory: queries, K tile, V tile, scores, probabilities, rescales, maxes, sums */
    static constexpr int SMEM = ROWS * HD + TK * KP + TK * HD + ROWS * (TK + 1) + TK * ROWS + 3 * ROWS;
};

template <int HD, int G, bool ASYNC>
__global__ void __launch_bounds__(ATT_TILE_THREADS)
    k_attention_qtiles(float *out, const float *q, int q_stride, const float *kc, const float *vc, int n_tok,
                       int n_head, int n_head_kv, float scale, const qw_step *step) {
    QWC_PDL_ENTRY();
    using L = att_qtile<HD, G>;
    constexpr int QB = L::QB, ROWS = L::ROWS, TK = L::TK, KP = L::KP, RPW = L::RPW, NDG = L::NDG, RPG = L::RPG;
    extern __shared__ __align__(16) float sm[];
    float *qs = sm, *ks = qs + ROWS * HD, *vs = ks + TK * KP, *ps = vs + TK * HD, *pr = ps + ROWS * (TK + 1);
    float *al = pr + TK * ROWS, *mx = al + ROWS, *sum = mx + ROWS;
    const int t0 = blockIdx.x * QB, kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int pos0 = step->pos0, nq = min(QB, n_tok - t0), nk = pos0 + t0 + nq; /* the last query's keys */
    const int64_t kv_stride = (int64_t)n_head_kv * HD;
    for (int i = tid; i < ROWS * HD; i += ATT_TILE_THREADS) { /* row r: query t0 + r / G, head kvh G + r % G */
        const int r = i / HD, d = i % HD, qi = r / G;
        qs[i] = qi < nq ? q[(int64_t)(t0 + qi) * q_stride + (int64_t)(kvh * G + r % G) * HD + d] : 0.0f;
    }
    if (tid < ROWS) mx[tid] = -INFINITY, sum[tid] = 0.0f;
    const int dg = tid % NDG, rg = tid / NDG;
    float acc[RPG][4];
#pragma unroll
    for (int j = 0; j < RPG; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    /* keys and values by cp.async a stage ahead, as attention_tiles_block's (zeros past the keys) */
    const auto copy_rows = [&](float *dst, int stride, const float *cache, int i0, int n) {
        att_copy_tile<HD, TK, ASYNC>(dst, stride, cache, kv_stride, kvh, (const int32_t *)NULL, i0, n);
    };
    copy_rows(ks, KP, kc, 0, min(TK, nk)); /* nk >= 1 */
    copy_rows(vs, HD, vc, 0, min(TK, nk));
    for (int i0 = 0; i0 < nk; i0 += TK) {
        const int n = min(TK, nk - i0), nn = min(TK, nk - i0 - TK); /* nn > 0: a tile follows */
        cp_wait<1>(); /* this tile's keys */
        __syncthreads();
        { /* scores: rows w RPW .. of key `lane` */
            float s[RPW];
#pragma unroll
            for (int j = 0; j < RPW; j++) s[j] = 0.0f;
            for (int d = 0; d < HD; d += 4) {
                const float4 kv = *(const float4 *)(ks + lane * KP + d);
#pragma unroll
                for (int j = 0; j < RPW; j++) {
                    const int r = w * RPW + j;
                    if (r >= ROWS) break;
                    const float4 qv = *(const float4 *)(qs + r * HD + d);
                    s[j] = __fmaf_rn(qv.x, kv.x, s[j]);
                    s[j] = __fmaf_rn(qv.y, kv.y, s[j]);
                    s[j] = __fmaf_rn(qv.z, kv.z, s[j]);
                    s[j] = __fmaf_rn(qv.w, kv.w, s[j]);
                }
            }
#pragma unroll
            for (int j = 0; j < RPW; j++) {
                const int r = w * RPW + j;
                if (r >= ROWS) break;
                const bool seen = lane < n && i0 + lane <= pos0 + t0 + r / G;
                ps[r * (TK + 1) + lane] = seen ? s[j] * scale : -INFINITY;
            }
        }
        __syncthreads();
        if (nn > 0) copy_rows(ks, KP, kc, i0 + TK, nn);
        for (int r = w; r < ROWS; r += ATT_TILE_THREADS / 32) { /* the online softmax of row r over the tile */
            const float v = ps[r * (TK + 1) + lane];
            float tmax = v;
            for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
            /* every row sees key 0 in the first tile, so m1 is finite from there on */
            const float m0 = mx[r], m1 = fmaxf(m0, tmax), ra = expf(m0 - m1);
            const float p = v == -INFINITY ? 0.0f : expf(v - m1);
            pr[lane * ROWS + r] = p;
            const float ts = qwc_warp_sum(p);
            __syncwarp();
            if (lane == 0) mx[r] = m1, sum[r] = sum[r] * ra + ts, al[r] = ra;
        }
        if (nn > 0) cp_wait<1>(); /* this tile's values */
        else cp_wait<0>();
        __syncthreads();
        /* value sums: dimensions 4 dg .. 4 dg + 3 of rows rg RPG .. */
#pragma unroll
        for (int j = 0; j < RPG; j++) {
            const int r = rg * RPG + j;
            const float a = r < ROWS ? al[r] : 0.0f;
            acc[j][0] *= a, acc[j][1] *= a, acc[j][2] *= a, acc[j][3] *= a;
        }
        for (int k = 0; k < n; k++) {
            const float4 v = *(const float4 *)(vs + k * HD + 4 * dg);
#pragma unroll
            for (int j = 0; j < RPG; j++) {
                const int r = rg * RPG + j;
                if (r >= ROWS) break;
                const float p = pr[k * ROWS + r];
                acc[j][0] = __fmaf_rn(p, v.x, acc[j][0]);
                acc[j][1] = __fmaf_rn(p, v.y, acc[j][1]);
                acc[j][2] = __fmaf_rn(p, v.z, acc[j][2]);
                acc[j][3] = __fmaf_rn(p, v.w, acc[j][3]);
            }
        }
        __syncthreads(); /* vs, pr and al are done with */
        if (nn > 0) copy_rows(vs, HD, vc, i0 + TK, nn);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < RPG; j++) {
        const int r = rg * RPG + j;
        if (r >= ROWS || r / G >= nq) continue;
        const float l = sum[r];
        float *o = out + ((int64_t)(t0 + r / G) * n_head + (int64_t)kvh * G + r % G) * HD + 4 * dg;
        o[0] = l > 0 ? acc[j][0] / l : 0.0f;
        o[1] = l > 0 ? acc[j][1] / l : 0.0f;
        o[2] = l > 0 ? acc[j][2] / l : 0.0f;
        o[3] = l > 0 ? acc[j][3] / l : 0.0f;
    }
}

/* k_attention_qtiles for these heads (dense prompt steps, when switched on): 1 when it ran */
template <int HD>
static int attention_qtiles_g(cudaStream_t st, float *out, const float *q, int q_stride, const float *kc,
                              const float *vc, int n_tok, int n_head, int n_head_kv, float scale, const qw_step *step) {
    const char *e = getenv("QWENC_CUDA_ATT_QTILES"); /* read at each call: tests compare the two kernels */
    if (e && e[0] == '0') return 0;
    switch (n_head / n_head_kv) {
#define ATT_QG(g)                                                                                                 \
    case g: {                                                                                                     \
        using L = att_qtile<HD, g>;                                                                               \
        const size_t sh = (size_t)L::SMEM * sizeof(float);                                                        \
        auto *k = att_async() ? k_attention_qtiles<HD, g, true> : k_attention_qtiles<HD, g, false>;               \
        QWC_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));                  \
        qwc_launch(k, dim3((unsigned)((n_tok + L::QB - 1) / L::QB), (unsigned)n_head_kv), ATT_TILE_THREADS, sh, st, \
                   out, q, q_stride, kc, vc, n_tok, n_head, n_head_kv, scale, step);                              \
        QWC_LAUNCHED();                                                                                           \
        return 1;                                                                                                 \
    }
        ATT_QG(1) ATT_QG(2) ATT_QG(4) ATT_QG(6) ATT_QG(8) ATT_QG(12) ATT_QG(16)
#undef ATT_QG
    default: return 0;
    }
}

/* the tiled kernel at head dimension 256 or 128 for these heads: 1 when it ran */
static int attention_tiles_hd(cudaStream_t st, int hd, const att_call &a, att_split sp) {
    if (hd == 256) return attention_tiles_g<256>(st, a, sp);
    if (hd == 128) return attention_tiles_g<128>(st, a, sp);
    return 0;
}

#define ATT_SPLIT 16      /* splits along the keys of a query past ATT_SPLIT_MIN keys */
#define ATT_SPLIT_MIN 256 /* this many keys or fewer: the per-head kernel (the split gains past ~300 on an H100) */

/* Splits of decode attention along the keys: QWENC_CUDA_ATT_SPLIT=S in the environment (read at each call: tests
 * compare settings; at most 256; 0 or 1: never split), default ATT_SPLIT */
static int att_splits(void) {
    const char *e = getenv("QWENC_CUDA_ATT_SPLIT");
    const int s = e && e[0] ? atoi(e) : ATT_SPLIT;
    return s < 1 ? 1 : s > ATT_SPLIT_MAX ? ATT_SPLIT_MAX : s;
}

/* The most keys a query has for the per-head kernel rather than the split one: QWENC_CUDA_ATT_SPLIT_MIN=N in the
 * environment (read at each call), default ATT_SPLIT_MIN */
static int att_split_min(void) {
    const char *e = getenv("QWENC_CUDA_ATT_SPLIT_MIN");
    const int m = e && e[0] ? atoi(e) : ATT_SPLIT_MIN;
    return m < 0 ? 0 : m;
}

/* Decode attention split along the keys for the queries of a that see more than att_split_min() keys: 1 when
 * launched, and *nk_max the most keys of the queries left to the per-head kernel */
static int attention_split(qwc *c, cudaStream_t st, int hd, const att_call &a, int *nk_max) {
    const int S = att_splits();
    if (S < 2 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv || a.q_stride % 4 || (hd != 128 && hd != 256)) return 0;
    const int G = a.n_head / a.n_head_kv;
    att_split sp = {S, att_split_min(), NULL, qwc_counts(c, a.n_tok * a.n_head_kv)};
    if (!sp.count) return 0;
    sp.part = (float *)qwc_keep_buf(c, (size_t)a.n_tok * a.n_head_kv * S * G * (2 + hd) * sizeof(float));
    if (!attention_tiles_hd(st, hd, a, sp)) return 0;
    *nk_max = sp.min_keys;
    return 1;
}

static void cu_attention(const qw_backend *be, float *out, const float *q, int q_stride, const float *kc,
                         const float *vc, int n_tok, int n_head, int n_head_kv, int hd, float scale, const int32_t *sel,
                         const int32_t *sel_off, void *work, const qw_step *step) {
    (void)work;
    if (hd > ATT_MAX_HD) qwc_die(__FILE__, __LINE__, "attention", "head dimension above 512");
    if (n_tok <= 0) return;
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    const att_call a = {out, q, q_stride, kc, vc, n_tok, n_head, n_head_kv, scale, sel, sel_off, 0, step, NULL};
    int nk_max = INT_MAX;
    if (n_tok > ATT_TILE_MIN_TOK) {
        if (n_head_kv > 0 && n_head % n_head_kv == 0 && q_stride % 4 == 0) {
            if (!sel && hd == 256 &&
                attention_qtiles_g<256>(st, out, q, q_stride, kc, vc, n_tok, n_head, n_head_kv, scale, step))
                return;
            if (!sel && hd == 128 &&
                attention_qtiles_g<128>(st, out, q, q_stride, kc, vc, n_tok, n_head, n_head_kv, scale, step))
                return;
            const att_split one = {1, 0, NULL, NULL};
            if (attention_tiles_hd(st, hd, a, one)) return;
        }
    } else {
        attention_split(c, st, hd, a, &nk_max);
    }
    qwc_launch(k_attention, n_tok * n_head, ATT_WARPS * 32, 0, st, out, q, q_stride, kc, vc, n_head, n_head_kv, hd,
               scale, sel, sel_off, step, nk_max);
    QWC_LAUNCHED();
}

static size_t cu_attention_work(const qw_backend *be, int n_ctx, int hd) {
    (void)be, (void)n_ctx, (void)hd;
    return 0;
}

/* ---------------------------------------------------------------- QSA keys */

__global__ void k_qsa_raw(float *raw, const float *key_rows, int64_t key_stride, int n_tok, int ihd,
                          const qw_step *step) {
    QWC_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * ihd) return;
    int t = (int)(i / ihd), d = (int)(i % ihd);
    raw[(int64_t)(step->pos0 + t) * ihd + d] = key_rows[t * key_stride + d];
}

/* block b of raw pooled, normed and rotated into blk (the whole block calls it; kb: ihd floats of shared memory) */
__device__ __forceinline__ void qsa_pool_block(const float *raw, float *blk, int b, int ihd, int R, const float *k_norm,
                                               float eps, const float *inv_freq, int n_rot, float *kb) {
    __shared__ double sh[32];
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

/* block blockIdx.x of those the step may complete: pooled, normed, rotated */
__global__ void k_qsa_pool(float *raw, float *blk, int n_tok, int ihd, int R, const float *k_norm, float eps,
                           const float *inv_freq, int n_rot, const qw_step *step) {
    QWC_PDL_ENTRY();
    extern __shared__ float kb[]; /* [ihd] */
    int pos0 = step->pos0, b = pos0 / R + blockIdx.x;
    if (b >= (pos0 + n_tok) / R) return;
    qsa_pool_block(raw, blk, b, ihd, R, k_norm, eps, inv_freq, n_rot, kb);
}

/* A batched step's rows (qsa_rows): row blockIdx.x's raw key stored, then the block it completes (if it does)
 * pooled, as k_qsa_raw and k_qsa_pool do for its one-token call */
__global__ void k_qsa_keys_rows(qw_attn_rows r, const float *key_rows, int64_t key_stride, int ihd, int R,
                                const float *k_norm, float eps, const float *inv_freq, int n_rot) {
    QWC_PDL_ENTRY();
    extern __shared__ float kb[]; /* [ihd] */
    const int t = blockIdx.x, pos = r.step[t]->pos0;
    float *raw = r.idx_raw[t];
    for (int d = threadIdx.x; d < ihd; d += blockDim.x) raw[(int64_t)pos * ihd + d] = key_rows[t * key_stride + d];
    if ((pos + 1) % R) return;
    __syncthreads(); /* the row just stored, seen by the block's threads */
    qsa_pool_block(raw, r.idx_blk[t], pos / R, ihd, R, k_norm, eps, inv_freq, n_rot, kb);
}

static void cu_qsa_keys(const qw_backend *be, float *raw, float *blk, const float *key_rows, int64_t key_stride,
                        int n_tok, int ihd, int R, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                        const qw_step *step) {
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    int64_t n = (int64_t)n_tok * ihd;
    if (n <= 0) return;
    if (n_tok == 1) { /* a decode step: the raw key and the block it completes in one launch, as a batched step's row */
        qw_attn_rows r;
        memset(&r, 0, sizeof(r));
        r.idx_raw[0] = raw, r.idx_blk[0] = blk, r.step[0] = step;
        qwc_launch(k_qsa_keys_rows, 1, 128, (size_t)ihd * sizeof(float), st, r, key_rows, key_stride, ihd, R,
                   qwc_wf(c, k_norm, ihd), eps, qwc_wf(c, inv_freq, n_rot / 2), n_rot);
        QWC_LAUNCHED();
        return;
    }
    qwc_launch(k_qsa_raw, qwc_blocks(n, 256), 256, 0, st, raw, key_rows, key_stride, n_tok, ihd, step);
    QWC_LAUNCHED();
    qwc_launch(k_qsa_pool, n_tok / R + 1, 128, (size_t)ihd * sizeof(float), st, raw, blk, n_tok, ihd, R,
               qwc_wf(c, k_norm, ihd), eps, qwc_wf(c, inv_freq, n_rot / 2), n_rot, step);
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- QSA selection */

/* the positions the query at position i keeps: min(n_b, topk) blocks of R, then the tail */
__device__ __forceinline__ int64_t qsa_count(int i, int R, int topk) {
    const int n_b = (i + 1) / R;
    return (int64_t)(n_b < topk ? n_b : topk) * R + (i - n_b * R + 1);
}

/* the offsets of every query's positions */
__global__ void k_qsa_offsets(int32_t *sel_off, int n_tok, int R, int topk, const qw_step *step) {
    QWC_PDL_ENTRY();
    if (threadIdx.x || blockIdx.x) return;
    int64_t n = 0;
    for (int t = 0; t < n_tok; t++) {
        sel_off[t] = (int32_t)n;
        n += qsa_count(step->pos0 + t, R, topk);
    }
    sel_off[n_tok] = (int32_t)n;
}

/* Over the block's threads in order: how many before this one have f set (returned) and, in cnt[nw], how many in
 * all (cnt: nw + 1 slots; every thread calls it) */
__device__ __forceinline__ int block_prefix(bool f, int *cnt, int lane, int wp, int nw) {
    const unsigned bal = __ballot_sync(0xffffffffu, f);
    __syncthreads(); /* the slots' last readers are done */
    if (lane == 0) cnt[wp] = __popc(bal);
    __syncthreads();
    int before = __popc(bal & ((1u << lane) - 1)), total = 0;
    for (int k = 0; k < nw; k++) {
        if (k < wp) before += cnt[k];
        total += cnt[k];
    }
    __syncthreads();
    if (threadIdx.x == 0) cnt[nw] = total;
    __syncthreads();
    return before;
}

/* Scores of the query's rows qt against blocks [b0, b1) of blk into score[b] (the block's threads a block each): sum
 * over heads of relu(q_h . K_b) / sqrt(ihd), each dot in double in dimension order */
__device__ __forceinline__ void qsa_score(float *score, const float *qt, const float *blk, int b0, int b1, int n_head,
                                          int ihd) {
    const float inv_sqrt = 1.0f / sqrtf((float)ihd);
    for (int b = b0 + threadIdx.x; b < b1; b += blockDim.x) {
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
}

/* The bits of the topk-th largest of the n_b scores (non-negative floats: their bits order as they do; 1 <= topk <=
 * n_b), a byte at a time from the top: each pass counts, among the scores whose higher bytes are those found so far,
 * how many have each value of the next byte, and takes the byte at which the count from the top reaches the number
 * still wanted. Four passes of four barriers (the bit-by-bit search took 32 block sums): the same value. */
__device__ __forceinline__ unsigned qsa_kth(const float *score, int n_b, int topk) {
    __shared__ unsigned hist[256], lane_sum[32];
    __shared__ unsigned found[2]; /* the bytes so far, the number still wanted among the scores that have them */
    unsigned prefix = 0, mask = 0, need = (unsigned)topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
        __syncthreads();
        for (int b = threadIdx.x; b < n_b; b += blockDim.x) {
            const unsigned u = __float_as_uint(score[b]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* lane l: the bytes 255 - 8 l down to 248 - 8 l */
            const int lane = threadIdx.x;
            unsigned own = 0, before = 0;
            for (int j = 0; j < 8; j++) own += hist[255 - 8 * lane - j];
            lane_sum[lane] = own;
            __syncwarp();
            for (int k = 0; k < lane; k++) before += lane_sum[k];
            if (before < need && need <= before + own)
                for (int j = 0; j < 8; j++) {
                    const unsigned c = hist[255 - 8 * lane - j];
                    if (before + c >= need) {
                        found[0] = prefix | (unsigned)(255 - 8 * lane - j) << shift;
                        found[1] = need - before;
                        break;
                    }
                    before += c;
                }
        }
        __syncthreads();
        prefix = found[0], need = found[1], mask |= 255u << shift;
        __syncthreads(); /* found and hist read before the next pass writes them */
    }
    return prefix;
}

/* The query at position i with the n_b = (i + 1) / R scores of its blocks in shared memory (score; when n_b > topk):
 * the top topk marked (in score + n_b, n_b flags), positions written in block order into dst, then the tail */
__device__ __forceinline__ void qsa_pick(int32_t *dst, float *score, int i, int R, int topk) {
    __shared__ int cnt[33];
    const int n_b = (i + 1) / R;
    unsigned char *chosen = (unsigned char *)(score + n_b);
    const int keep_all = n_b <= topk;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (keep_all) {
        for (int b = threadIdx.x; b < n_b; b += blockDim.x) chosen[b] = 1;
        __syncthreads();
    } else {
        /* the topk best (higher score, or the same and lower index): the scores are sums of positive terms, so
         * their bits order as they do; the topk-th largest (qsa_kth), then every score above it and, of those equal
         * to it, the lowest blocks */
        const unsigned cand = qsa_kth(score, n_b, topk);
        int above = 0;
        for (int b = threadIdx.x; b < n_b; b += blockDim.x) above += __float_as_uint(score[b]) > cand;
        const int need = topk - qwc_block_sum(above, cnt);
        int taken = 0; /* equal scores taken so far, in block order */
        for (int base = 0; base < n_b; base += blockDim.x) {
            const int b = base + threadIdx.x;
            const unsigned key = b < n_b ? __float_as_uint(score[b]) : 0u;
            const bool eq = b < n_b && key == cand;
            const int before = block_prefix(eq, cnt, lane, wp, nw), total = cnt[nw];
            if (b < n_b) chosen[b] = key > cand || (eq && taken + before < need);
            taken += total;
        }
        __syncthreads();
    }
    /* the chosen blocks' positions in block order, then the tail */
    int n = 0;
    for (int base = 0; base < n_b; base += blockDim.x) {
        const int b = base + threadIdx.x;
        const bool ch = b < n_b && chosen[b];
        const int before = block_prefix(ch, cnt, lane, wp, nw), total = cnt[nw];
        if (ch)
            for (int r = 0; r < R; r++) dst[(n + before) * R + r] = b * R + r;
        n += total;
    }
    for (int p = n_b * R + threadIdx.x; p <= i; p += blockDim.x) dst[n * R + p - n_b * R] = p;
}

/* The block's query at position i (its rows qt): scores of its blocks, the top topk marked, positions written in block
 * order into dst; score: shared memory for n_b floats and n_b flags */
__device__ __forceinline__ void qsa_select_query(int32_t *dst, const float *qt, const float *blk, int i, int n_head,
                                                 int ihd, int R, int topk, float *score) {
    const int n_b = (i + 1) / R;
    if (n_b > topk) qsa_score(score, qt, blk, 0, n_b, n_head, ihd);
    __syncthreads();
    qsa_pick(dst, score, i, R, topk);
}

/* one block per query: scores of its blocks, the top topk marked, positions written in block order */
__global__ void k_qsa_select(int32_t *sel, const int32_t *sel_off, const float *q, int64_t q_stride, const float *blk,
                             int n_head, int ihd, int R, int topk, const qw_step *step) {
    QWC_PDL_ENTRY();
    extern __shared__ float score[]; /* [n_b] scores, then [n_b] chosen flags */
    const int t = blockIdx.x;
    qsa_select_query(sel + sel_off[t], q + t * q_stride, blk, step->pos0 + t, n_head, ihd, R, topk, score);
}

/* A batched step's rows (qsa_rows): row blockIdx.x's query as its one-token call selects, its positions at sel + t
 * (topk + 1) R and its offsets (0, their count: k_qsa_offsets' for one query) at sel_off + 2 t */
__global__ void k_qsa_select_rows(qw_attn_rows r, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                                  int n_head, int ihd, int R, int topk) {
    QWC_PDL_ENTRY();
    extern __shared__ float score[];
    const int t = blockIdx.x, i = r.step[t]->pos0, n_b = (i + 1) / R;
    if (threadIdx.x == 0) {
        sel_off[2 * t] = 0;
        sel_off[2 * t + 1] = (n_b < topk ? n_b : topk) * R + (i - n_b * R + 1);
    }
    qsa_select_query(sel + (int64_t)t * (topk + 1) * R, q + t * q_stride, r.idx_blk[t], i, n_head, ihd, R, topk, score);
}

/*
 * Few queries over many blocks (decode steps and drafts; QWENC_CUDA_QSA_SPLIT=S in the environment, default
 * QSA_SPLIT): a query's block scores split S ways over blocks (y), each block scoring its chunk of the query's n_b
 * blocks into scratch (gscore, gs_stride floats a query), the last of them to end (a counter per query, left at zero)
 * copying them to its shared memory and picking as k_qsa_select does: the same scores, the same positions, with S
 * blocks at work instead of one (at 32k positions a query has 8,192 blocks of four heads' 128-wide dots in double).
 * A query with no more blocks than it keeps (every block selected, nothing scored) is block 0's alone.
 */
__global__ void k_qsa_select_split(int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                                   const float *blk, int n_head, int ihd, int R, int topk, const qw_step *step,
                                   float *gscore, int64_t gs_stride, unsigned *count) {
    QWC_PDL_ENTRY();
    extern __shared__ float score[];
    __shared__ unsigned last;
    const int t = blockIdx.x, S = gridDim.y, i = step->pos0 + t, n_b = (i + 1) / R;
    int64_t off = 0; /* the query's offset (k_qsa_offsets' sums, here: few queries), written by its first block */
    for (int u = 0; u < t; u++) off += qsa_count(step->pos0 + u, R, topk);
    if (blockIdx.y == 0 && threadIdx.x == 0) {
        sel_off[t] = (int32_t)off;
        if (t == (int)gridDim.x - 1) sel_off[t + 1] = (int32_t)(off + qsa_count(i, R, topk));
    }
    float *gs = gscore + t * gs_stride;
    if (n_b <= topk) { /* nothing to score */
        if (blockIdx.y == 0) qsa_pick(sel + off, score, i, R, topk);
        return;
    }
    {
        const int cb = (n_b + S - 1) / S, b0 = min(n_b, (int)blockIdx.y * cb);
        qsa_score(gs, q + t * q_stride, blk, b0, min(n_b, b0 + cb), n_head, ihd);
    }
    __threadfence(); /* every block's scores visible before it counts */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(count + t, 1u) == (unsigned)S - 1;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) count[t] = 0; /* for the next launch (which reads it after this grid ends) */
    __threadfence();
    for (int b = threadIdx.x; b < n_b; b += blockDim.x) score[b] = __ldcg(gs + b);
    __syncthreads();
    qsa_pick(sel + off, score, i, R, topk);
}

#define QSA_SPLIT 16

/* Splits of a decode step's QSA selection: QWENC_CUDA_QSA_SPLIT=S in the environment (read at each call, at most
 * 256; 0 or 1: one block a query), default QSA_SPLIT */
static int qsa_splits(void) {
    const char *e = getenv("QWENC_CUDA_QSA_SPLIT");
    const int s = e && e[0] ? atoi(e) : QSA_SPLIT;
    return s < 1 ? 1 : s > 256 ? 256 : s;
}

static void cu_qsa_select(const qw_backend *be, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                          const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                          const qw_step *step) {
    (void)work;
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    /* shared memory for the most blocks a query of this session may see: set by qsa_select_work */
    int max_blocks = qwc_qsa_max_blocks(c);
    size_t sh = (size_t)max_blocks * (sizeof(float) + 1) + 16;
    const int S = n_tok <= QWC_QSA_SPLIT_MAX_TOK ? qsa_splits() : 1;
    unsigned *count = S > 1 ? qwc_counts(c, n_tok) : NULL;
    if (count) { /* the split kernel writes the offsets too */
        float *gscore = (float *)qwc_keep_buf(c, (size_t)n_tok * max_blocks * sizeof(float));
        qwc_launch(k_qsa_select_split, dim3((unsigned)n_tok, (unsigned)S), 256, sh, st, sel, sel_off, q, q_stride,
                   blk, n_head, ihd, R, topk, step, gscore, (int64_t)max_blocks, count);
        QWC_LAUNCHED();
        return;
    }
    qwc_launch(k_qsa_offsets, 1, 1, 0, st, sel_off, n_tok, R, topk, step);
    QWC_LAUNCHED();
    qwc_launch(k_qsa_select, n_tok, 256, sh, st, sel, sel_off, q, q_stride, blk, n_head, ihd, R, topk, step);
    QWC_LAUNCHED();
}

/* no work in device memory: the scores live in shared memory, sized here for the longest context */
static size_t cu_qsa_select_work(const qw_backend *be, int n_ctx, int R, int topk) {
    (void)topk;
    int blocks = n_ctx / R + 1;
    size_t sh = (size_t)blocks * (sizeof(float) + 1) + 16;
    if (sh > 200 * 1024) qwc_die(__FILE__, __LINE__, "qsa_select", "more QSA blocks than shared memory holds");
    if (qwc_qsa_reserve(qwc_of(be), blocks)) {
        QWC_CHECK(cudaFuncSetAttribute(k_qsa_select, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
        QWC_CHECK(cudaFuncSetAttribute(k_qsa_select_split, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
        QWC_CHECK(cudaFuncSetAttribute(k_qsa_select_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    }
    return 0;
}

/* ---------------------------------------------------------------- a batched step's rows */

/* A batched step's cache stores, QSA keys and selection, and attention over all its sessions' rows in one launch
 * each (kv_store_rows, qsa_rows, attention_rows: each row's operations those of its one-token call, so its bits):
 * with the other rows ops (QWC_ROWS, QWENC_CUDA_ROWS in ops.cu) unless QWENC_CUDA_ATT_ROWS=0 is in the environment
 * (then a launch a session). QWC_ATT_ROWS 0: never. */
#ifndef QWC_ATT_ROWS
#define QWC_ATT_ROWS 1
#endif

/* grid columns x rows: row r's keys and values at its position */
__global__ void k_kv_store_rows(qw_attn_rows r, const float *k, const float *v, int64_t width) {
    QWC_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (i >= width) return;
    const int64_t at = (int64_t)r.step[t]->pos0 * width + i;
    r.k[t][at] = k[t * width + i];
    r.v[t][at] = v[t * width + i];
}

static void cu_kv_store_rows(const qw_backend *be, const qw_attn_rows *r, const float *k, const float *v, int n,
                             int64_t width) {
    if (n <= 0 || width <= 0) return;
    if (n > QW_ROWS_MAX) qwc_die(__FILE__, __LINE__, "kv_store_rows", "more rows than QW_ROWS_MAX");
    qwc_launch(k_kv_store_rows, dim3(qwc_blocks(width, 256), (unsigned)n), 256, 0, qwc_stream(qwc_of(be)), *r, k, v,
               width);
    QWC_LAUNCHED();
}

static void cu_qsa_rows(const qw_backend *be, const qw_attn_rows *r, int32_t *sel, int32_t *sel_off, const float *q,
                        const float *key_rows, int64_t row_stride, int n, int n_head, int ihd, int R, int topk,
                        const float *k_norm, float eps, const float *inv_freq, int n_rot, void *work) {
    (void)work;
    if (n <= 0) return;
    if (n > QW_ROWS_MAX) qwc_die(__FILE__, __LINE__, "qsa_rows", "more rows than QW_ROWS_MAX");
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    qwc_launch(k_qsa_keys_rows, n, 128, (size_t)ihd * sizeof(float), st, *r, key_rows, row_stride, ihd, R,
               qwc_wf(c, k_norm, ihd), eps, qwc_wf(c, inv_freq, n_rot / 2), n_rot);
    QWC_LAUNCHED();
    const size_t sh = (size_t)qwc_qsa_max_blocks(c) * (sizeof(float) + 1) + 16; /* as qsa_select's */
    qwc_launch(k_qsa_select_rows, n, 256, sh, st, *r, sel, sel_off, q, row_stride, n_head, ihd, R, topk);
    QWC_LAUNCHED();
}

static void cu_attention_rows(const qw_backend *be, const qw_attn_rows *r, float *out, const float *q, int q_stride,
                              int n, int n_head, int n_head_kv, int hd, float scale, const int32_t *sel,
                              const int32_t *sel_off, int sel_stride, void *work) {
    (void)work;
    if (hd > ATT_MAX_HD) qwc_die(__FILE__, __LINE__, "attention_rows", "head dimension above 512");
    if (n <= 0) return;
    if (n > QW_ROWS_MAX) qwc_die(__FILE__, __LINE__, "attention_rows", "more rows than QW_ROWS_MAX");
    qwc *c = qwc_of(be);
    cudaStream_t st = qwc_stream(c);
    const att_call a = {out, q, q_stride, NULL, NULL, n, n_head, n_head_kv, scale, sel, sel_off, sel_stride, NULL, r};
    int nk_max = INT_MAX; /* the rows past att_split_min() keys split along them, the others a block a head */
    attention_split(c, st, hd, a, &nk_max);
    qwc_launch(k_attention_rows, n * n_head, ATT_WARPS * 32, 0, st, *r, out, q, q_stride, n_head, n_head_kv, hd, scale,
               sel, sel_off, sel_stride, nk_max);
    QWC_LAUNCHED();
}

void qwc_attn_fill(qw_backend *t) {
    t->attention = cu_attention;
    t->attention_work = cu_attention_work;
    t->qsa_keys = cu_qsa_keys;
    t->qsa_select = cu_qsa_select;
    t->qsa_select_work = cu_qsa_select_work;
    int rows_env = -1, att_env = -1; /* read at each backend's making (t_session compares one with, one without) */
    if (QWC_ATT_ROWS && qwc_env_switch("QWENC_CUDA_ROWS", 1, &rows_env) &&
        qwc_env_switch("QWENC_CUDA_ATT_ROWS", 1, &att_env)) {
        t->kv_store_rows = cu_kv_store_rows;
        t->qsa_rows = cu_qsa_rows;
        t->attention_rows = cu_attention_rows;
    }
}
