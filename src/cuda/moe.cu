/*
 * moe.cu - the CUDA backend's mixture of experts (ops.h moe_route, moe_ffn; spec qwen4_exp.md 3.6).
 *
 * Routing runs on the device, one warp per token: the softmax (max in f32, the sum of the f32 exponentials
 * in double), the top k by k rounds of a warp-wide arg max (ties to the lower expert), the weights divided
 * by their sum (double) when norm_topk.
 *
 * The experts: each (token, slot) pair is a row. With few rows (a decode step) every pair runs as its own
 * matrix-vector product, the expert's matrices found on the device from the routing (a table of the experts'
 * device pointers, built once per layer), so nothing of the routing reaches the host. With many rows the
 * rows are grouped by expert (in token order within an expert) and each expert's rows are one matmul; the
 * group sizes come to the host for that (one download per MoE layer of a prompt step: the one host round trip
 * of the backend's forward). Either way the outputs are added to sigmoid(shared_gate . x) * shared(x) per
 * token in the order of the expert ids, as the reference adds them.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda/ops_internal.cuh"

extern "C" {
#include "core/common.h"
#include "kernels/q8a.h"
}


/* ---------------------------------------------------------------- routing */

/* One warp per token: every lane holds experts lane, lane + 32, ...; the k rounds of the arg max are warp
 * shuffles (no block barrier per round).
 *
 * route_regs (route_warp for E <= 32 N): lane l's experts l + 32 i in registers, and its best untaken one kept from
 * round to round (only the lane that held a round's winner looks again), so a round is the butterfly alone: the
 * operations and order of the loop over memory in route_warp, the same experts and weights. */

/* the warp's largest (bs, bb) (value, expert; bb == E: none), ties to the lower expert, by a butterfly */
__device__ __forceinline__ void warp_argmax(float &bs, int &bb, int E) {
    for (int o = 16; o > 0; o >>= 1) {
        float os = __shfl_xor_sync(0xffffffffu, bs, o);
        int ob = __shfl_xor_sync(0xffffffffu, bb, o);
        if (ob < E && (bb == E || os > bs || (os == bs && ob < bb))) {
            bs = os;
            bb = ob;
        }
    }
}

/* A round's arg max by the warp's integer reductions (QWC_MOE_ROUTE_REDUX 0: the butterfly of warp_argmax): the
 * probabilities are floats of +0 or more, whose bits order as unsigned integers do, so the largest is the maximum of
 * the bits, and its lowest expert the minimum of the lanes' experts holding it: two reductions a round where the
 * butterfly takes five dependent exchanges of two values. The same winner and value as warp_argmax (a lane without
 * an expert left takes no part; none at all: bb = E, bs = -inf); used when no lane holds a NaN. */
#ifndef QWC_MOE_ROUTE_REDUX
#define QWC_MOE_ROUTE_REDUX 1
#endif
__device__ __forceinline__ void warp_argmax_redux(float &bs, int &bb, int E) {
    const unsigned key = bb < E ? __float_as_uint(bs) : 0u;
    const unsigned mx = __reduce_max_sync(0xffffffffu, key);
    const int w = __reduce_min_sync(0xffffffffu, bb < E && key == mx ? bb : E);
    bb = w;
    bs = w < E ? __uint_as_float(mx) : -INFINITY;
}

/* the arg max rounds over lane l's probabilities v[i] of experts l + 32 i (left: those not taken) */
template <int N>
__device__ void route_topk(const float (&v)[N], unsigned left, int E, int k, int norm, int32_t *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    float ls = -INFINITY; /* the lane's best untaken expert (ascending: the first of equals stays) */
    int lb = E;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < N; i++) {
        if (left >> i & 1 && (lb == E || v[i] > ls)) ls = v[i], lb = lane + 32 * i;
        nan |= left >> i & 1 && v[i] != v[i];
    }
    const bool redux = QWC_MOE_ROUTE_REDUX && !__any_sync(0xffffffffu, nan);
    double ws = 0;
    for (int j = 0; j < k; j++) {
        float bs = ls;
        int bb = lb;
        if (redux) warp_argmax_redux(bs, bb, E);
        else warp_argmax(bs, bb, E);
        const int win = __shfl_sync(0xffffffffu, bb, 0); /* lane 0's, as the loop over memory takes */
        if (lane == 0) {
            ids[j] = bb;
            ws += wts[j] = bs;
        }
        if (win < E && (win & 31) == lane) {
            left &= ~(1u << (win >> 5));
            ls = -INFINITY, lb = E;
#pragma unroll
            for (int i = 0; i < N; i++)
                if (left >> i & 1 && (lb == E || v[i] > ls)) ls = v[i], lb = lane + 32 * i;
        }
    }
    __syncwarp();
    if (norm) { /* lane 0's sum, each weight divided by its own lane (k of them at once, not one after another) */
        const double tot = __shfl_sync(0xffffffffu, ws, 0);
        for (int j = lane; j < k; j += 32) wts[j] = (float)(wts[j] / tot);
    }
}

template <int N>
__device__ void route_regs(const float *lg, float *p, int E, int k, int norm, int32_t *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    float v[N];
    unsigned left = 0; /* bit i: expert lane + 32 i exists and is not taken */
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? lg[e] : 0.0f;
        if (e < E) mx = fmaxf(mx, v[i]), left |= 1u << i;
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
#pragma unroll
    for (int i = 0; i < N; i++)
        if (lane + 32 * i < E) v[i] = expf(v[i] - mx), sum += v[i];
    sum = qwc_warp_sum(sum);
#pragma unroll
    for (int i = 0; i < N; i++)
        if (lane + 32 * i < E) v[i] = (float)(v[i] / sum), p[lane + 32 * i] = v[i];
    route_topk<N>(v, left, E, k, norm, ids, wts);
}

/* route_regs' results by a whole block (every thread calls it; p: E floats of shared memory): the maximum (fmaxf:
 * the same whatever the order), the exponentials and the divisions an expert a thread, the sum (warp 0, lane l's
 * experts in order, then the butterfly) and the rounds by warp 0: a warp's chain of 16 exponentials and 16 double
 * divisions made parallel. */
template <int N>
__device__ void route_block(const float *lg, float *p, int E, int k, int norm, int32_t *ids, float *wts) {
    __shared__ float red[32];
    __shared__ double total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, lg[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    for (int w = 0; w < nw; w++) mx = fmaxf(mx, red[w]);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = expf(lg[e] - mx);
    __syncthreads();
    if (warp == 0) {
        double sum = 0;
#pragma unroll
        for (int i = 0; i < N; i++)
            if (lane + 32 * i < E) sum += p[lane + 32 * i];
        sum = qwc_warp_sum(sum);
        if (lane == 0) total = sum;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = (float)(p[e] / total);
    __syncthreads();
    if (warp == 0) {
        float v[N];
        unsigned left = 0;
#pragma unroll
        for (int i = 0; i < N; i++) {
            v[i] = lane + 32 * i < E ? p[lane + 32 * i] : 0.0f;
            if (lane + 32 * i < E) left |= 1u << i;
        }
        route_topk<N>(v, left, E, k, norm, ids, wts);
    }
}

/* Registers for the routing, and in the pairs' kernel the whole block (QWC_MOE_ROUTE_REGS 0: one warp, every round
 * scanning the probabilities in memory; the same experts and weights, tests/gpu/fusions.sh). */
#ifndef QWC_MOE_ROUTE_REGS
#define QWC_MOE_ROUTE_REGS 1
#endif

/* One token's routing by one warp (lane = threadIdx.x % 32): p = softmax(lg) (into p, which may be lg), then the
 * k arg max rounds; lane 0 writes the experts to ids[0..k) and their weights to wts[0..k). taken: E bytes. */
__device__ void route_warp(const float *lg, float *p, unsigned char *taken, int E, int k, int norm, int32_t *ids,
                           float *wts) {
    if (QWC_MOE_ROUTE_REGS && E <= 64) return route_regs<2>(lg, p, E, k, norm, ids, wts);
    if (QWC_MOE_ROUTE_REGS && E <= 128) return route_regs<4>(lg, p, E, k, norm, ids, wts);
    if (QWC_MOE_ROUTE_REGS && E <= 256) return route_regs<8>(lg, p, E, k, norm, ids, wts);
    if (QWC_MOE_ROUTE_REGS && E <= 512) return route_regs<16>(lg, p, E, k, norm, ids, wts);
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int e = lane; e < E; e += 32) {
        float v = expf(lg[e] - mx);
        p[e] = v;
        sum += v;
        taken[e] = 0;
    }
    sum = qwc_warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] = (float)(p[e] / sum);
    __syncwarp();
    double ws = 0;
    for (int j = 0; j < k; j++) {
        float bs = -INFINITY;
        int bb = E;
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && (bb == E || p[e] > bs)) { /* ascending e: the first of equals stays */
                bs = p[e];
                bb = e;
            }
        warp_argmax(bs, bb, E);
        if (lane == 0) {
            ids[j] = bb;
            taken[bb] = 1;
            ws += wts[j] = bs;
        }
        __syncwarp();
    }
    if (lane == 0 && norm)
        for (int j = 0; j < k; j++) wts[j] = (float)(wts[j] / ws);
}

__global__ void k_moe_route(int32_t *sel, float *wt, float *logits, int E, int k, int norm) {
    QWC_PDL_ENTRY();
    extern __shared__ unsigned char taken[]; /* [E] */
    float *p = logits + (int64_t)blockIdx.x * E;
    route_warp(p, p, taken, E, k, norm, sel + (int64_t)blockIdx.x * k, wt + (int64_t)blockIdx.x * k);
}

static void cu_moe_route(const qw_backend *be, int32_t *sel, float *wt, float *logits, int n_tok, int E, int k,
                         int norm) {
    if (n_tok <= 0) return;
    qwc_launch(k_moe_route, n_tok, 32, (size_t)E, qwc_stream(qwc_of(be)), sel, wt, logits, E, k, norm);
    QWC_LAUNCHED();
}

/* ---------------------------------------------------------------- the experts */

/* The device table of an expert list's matrices: [3][E] device pointers (gate, up, down), made once. */
static const void *const *expert_table(qwc *c, const qw_ffn_w *experts, int E) {
    const void *t = qwc_table_lookup(c, experts, (size_t)3 * E * sizeof(void *));
    if (t) return (const void *const *)t;
    const void **h = (const void **)qw_calloc((size_t)3 * E, sizeof(void *));
    if (!h) qwc_die(__FILE__, __LINE__, "expert_table", "out of host memory");
    for (int e = 0; e < E; e++) {
        h[e] = qwc_tensor(c, &experts[e].gate).data;
        h[E + e] = qwc_tensor(c, &experts[e].up).data;
        h[2 * E + e] = qwc_tensor(c, &experts[e].down).data;
    }
    t = qwc_table(c, experts, h, (size_t)3 * E * sizeof(void *));
    free(h);
    return (const void *const *)t;
}

/* The layout of moe_ffn's work for R rows. */
typedef struct {
    size_t xin, g, u, out, mats, rowpos, order, offs, tiles, xq, sgt, sup, sg, total;
} moe_layout;

static size_t up256(size_t n) { return (n + 255) / 256 * 256; }

/* Whether the R = T k rows of a step run as pairs, each its own matrix-vector product: up to qwc_pairs_max rows
 * (QWENC_CUDA_PAIRS_MAX), and past 64 only while the pairs' rows (the shared expert's T more, twice when gate and up
 * are one product) rounded to 8 bits fit the activations' buffer; more rows are grouped by expert. */
static int as_pairs(qwc *c, int T, int k, int64_t H, int64_t I) {
    const int64_t R = (int64_t)T * k;
    if (R > qwc_pairs_max(c)) return 0;
    if (R <= 64 || !qwc_q8_on(c)) return 1;
    size_t cap = 0;
    qwc_q8_buf(c, &cap);
    return 2 * (R + T) * (int64_t)sizeof(qw_q8a) * ((H > I ? H : I) / 32) <= (int64_t)cap;
}

/* Pairs (as_pairs) have room for P = R + T pairs (the shared expert as one more pair per token, when it can go with
 * the routed ones) and two copies of the input rows (gate and up as one product of 2P pairs); u follows g
 * directly. */
static moe_layout layout_of(int T, int k, int E, int H, int I, int Is, int pairs) {
    size_t R = (size_t)T * k, o = 0, P = pairs && Is == I ? R + T : R, X = pairs ? 2 * P : R;
    moe_layout l;
#define PART(f, bytes) (l.f = o, o += up256(bytes))
    PART(xin, X * H * sizeof(float));
    PART(g, 2 * P * I * sizeof(float));
    l.u = l.g + P * I * sizeof(float);
    PART(out, P * H * sizeof(float));
    PART(mats, 3 * P * sizeof(void *));
    PART(rowpos, R * sizeof(int32_t));
    PART(order, R * sizeof(int32_t));
    PART(offs, ((size_t)E + 1) * sizeof(int32_t));
    PART(tiles, 2 * ((size_t)E + 1) * sizeof(int32_t));
    PART(xq, pairs ? 0 : R * (size_t)(H > I ? H : I) / 32 * sizeof(qw_q8a)); /* many rows, 8-bit */
    PART(sgt, (size_t)T * Is * sizeof(float));
    PART(sup, (size_t)T * Is * sizeof(float));
    PART(sg, (size_t)T * sizeof(float));
#undef PART
    l.total = o;
    return l;
}

/* Split over GPUs (qw_backend_cuda_split): the layout (its shared expert's parts), then rank 0's own experts' layout,
 * then the rows by pair that the ranks' rows are added into. */
static size_t cu_moe_work(const qw_backend *be, int n_tok, int k, int E, int H, int I, int Is) {
    qwc *c = qwc_of(be);
    const int pairs = as_pairs(c, n_tok, k, H, I);
    size_t n = layout_of(n_tok, k, E, H, I, Is, pairs).total;
    if (qwc_split(c)) n += layout_of(n_tok, k, E, H, I, 0, pairs).total + up256((size_t)n_tok * k * H * sizeof(float));
    return n;
}

/* The shared expert's gate logit of token t, sg = w . x_t, for a one-row F32, BF16 or F16 w (sg_dot_takes): the
 * block's thread i the f32 fmas of elements i, i + blockDim, .. in order, then the block's fixed sum. The same for
 * any token count (a draft step's tokens get one-token bits) and wherever it runs: k_moe_pairs' last blocks
 * (QWC_MOE_SG_IN_PAIRS) or k_sg_dot. */
__device__ __forceinline__ float sg_dot(const void *w, int type, const float *x, int H, float *sh) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v;
        if (type == QW_TYPE_F32) v = ((const float *)w)[i];
        else if (type == QW_TYPE_BF16) v = __uint_as_float((uint32_t)((const uint16_t *)w)[i] << 16);
        else v = __half2float(((const __half *)w)[i]);
        acc = __fmaf_rn(v, x[i], acc);
    }
    return qwc_block_sum(acc, sh);
}

/* sg[t] = sg_dot(w, x_t) for the T tokens of x [T][H]: a block per token */
__global__ void k_sg_dot(float *sg, const void *w, int type, const float *x, int H) {
    QWC_PDL_ENTRY();
    __shared__ float sh[32];
    const float v = sg_dot(w, type, x + (int64_t)blockIdx.x * H, H, sh);
    if (threadIdx.x == 0) sg[blockIdx.x] = v;
}

/* few rows: pair p's matrices (gate mats[p], up mats[P + p], down mats[2P + p]) and its token's row (xin[p], and
 * xin[P + p] when dup; xin NULL: one token, its row x read in place, xq its rounding alone); pairs R .. P-1 are the
 * shared expert's (sh: its gate, up and down), token p - R. xq (not NULL, H a multiple of 32): the rows' 8-bit
 * rounding too. lg (not NULL): the routing first, by warp 0 of each
 * routed pair's block for its token (k_moe_route's operations), the pair writing its own slot of sel and wt. tab:
 * the matrices of experts lo .. lo + n_own - 1 ([3][n_own]); a pair of another expert gets NULL (its products
 * zeros: another GPU runs it). */
__global__ void k_moe_pairs(const void **mats, float *xin, const float *x, int32_t *sel, float *wt, const float *lg,
                            int norm, const void *const *tab, int R, int P, int k, int E, int H, const void *const *sh,
                            int dup, qw_q8a *xq, int lo, int n_own, const void *sgw, int sg_type, float *sg) {
    if (lg) /* the expert table depends on no kernel: its lines asked into L2 before the wait, a share a block, so the
             * lookup after the routing is no trip to HBM (the same results) */
        for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 128,
                     n = 3 * (int64_t)n_own * (int64_t)sizeof(void *);
             o < n; o += (int64_t)gridDim.x * blockDim.x * 128)
            QWC_PREFETCH_L2((const char *)tab + o);
    QWC_PDL_ENTRY();
    extern __shared__ float rp[]; /* routing: p [E], then taken [E] bytes */
    __shared__ int32_t ids[64];
    __shared__ float wts[64];
    int p = blockIdx.x;
    if (p >= P) { /* the blocks after the pairs': the shared gate's logit of token p - P (sgw: T of them) */
        if (sgw) {
            const float v = sg_dot(sgw, sg_type, x + (int64_t)(p - P) * H, H, wts);
            if (threadIdx.x == 0) sg[p - P] = v;
        }
        return;
    }
    const int t = p < R ? p / k : p - R;
    if (!xin && xq) { /* one token's x rounded once, the blocks sharing its blocks: first, as it needs no routing */
        const int nw = blockDim.x >> 5;
        for (int b = p * nw + (threadIdx.x >> 5); b < H / 32; b += P * nw)
            qwc_q8a_warp(x[32 * b + (threadIdx.x & 31)], xq + b);
    }
    if (lg && p < R) { /* block-uniform */
        const float *l = lg + (int64_t)t * E;
        if (QWC_MOE_ROUTE_REGS && E <= 64) route_block<2>(l, rp, E, k, norm, ids, wts);
        else if (QWC_MOE_ROUTE_REGS && E <= 128) route_block<4>(l, rp, E, k, norm, ids, wts);
        else if (QWC_MOE_ROUTE_REGS && E <= 256) route_block<8>(l, rp, E, k, norm, ids, wts);
        else if (QWC_MOE_ROUTE_REGS && E <= 512) route_block<16>(l, rp, E, k, norm, ids, wts);
        else if (threadIdx.x < 32) route_warp(l, rp, (unsigned char *)(rp + E), E, k, norm, ids, wts);
        __syncthreads();
        if (threadIdx.x == 0) sel[p] = ids[p % k], wt[p] = wts[p % k];
    }
    if (threadIdx.x == 0) { /* tab holds experts lo .. lo + n_own - 1; another's pair gets no matrix (zeros) */
        const int e = p < R ? (lg ? ids[p % k] : sel[p]) - lo : 0;
        const bool own = e >= 0 && e < n_own;
        for (int j = 0; j < 3; j++) mats[j * P + p] = p < R ? (own ? tab[j * n_own + e] : NULL) : sh[j];
    }
    if (!xin) return; /* one token's x read in place by every pair (rounded above) */
    const float *src = x + (int64_t)t * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) { /* H % 32 == 0 when xq: whole warps */
        const float v = src[i];
        xin[(int64_t)p * H + i] = v;
        if (dup) xin[(int64_t)(P + p) * H + i] = v;
        if (xq) {
            qwc_q8a_warp(v, xq + ((int64_t)p * H + i) / 32);
            if (dup) qwc_q8a_warp(v, xq + ((int64_t)(P + p) * H + i) / 32);
        }
    }
}

/* many rows: expert e's rows in token order. A block per expert counts its pairs, one thread makes the offsets,
 * then a block per expert walks the pairs 256 at a time and places its own at their ranks (warp ballots): the
 * order of a serial pass, in O(R / 256) steps per expert. */
__global__ void k_moe_group(int32_t *offs, const int32_t *sel, int R, int lo) {
    QWC_PDL_ENTRY();
    const int e = blockIdx.x; /* expert lo + e; offs[e+1] first holds its count */
    int n = 0;
    for (int p0 = 0; p0 < R; p0 += blockDim.x) {
        const int p = p0 + threadIdx.x;
        n += __syncthreads_count(p < R && sel[p] == lo + e);
    }
    if (threadIdx.x == 0) offs[e + 1] = n;
}
__global__ void k_moe_scan(int32_t *offs, int E) {
    QWC_PDL_ENTRY();
    if (threadIdx.x || blockIdx.x) return;
    offs[0] = 0;
    for (int e = 0; e < E; e++) offs[e + 1] += offs[e];
}
__global__ void k_moe_place(int32_t *order, int32_t *rowpos, const int32_t *offs, const int32_t *sel, int R, int lo) {
    QWC_PDL_ENTRY();
    __shared__ int wsum[32];
    const int e = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int base = offs[e];
    for (int p0 = 0; p0 < R; p0 += blockDim.x) {
        const int p = p0 + threadIdx.x;
        const bool mine = p < R && sel[p] == lo + e;
        const unsigned b = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) wsum[wid] = __popc(b);
        __syncthreads();
        int before = 0, all = 0;
        for (int w = 0; w < nw; w++) {
            before += w < wid ? wsum[w] : 0;
            all += wsum[w];
        }
        if (mine) {
            const int n = base + before + __popc(b & ((1u << lane) - 1));
            order[n] = p;
            rowpos[p] = n;
        }
        base += all;
        __syncthreads(); /* wsum is written again */
    }
}
__global__ void k_moe_gather(float *xin, const float *x, const int32_t *order, int k, int H, const int32_t *end) {
    QWC_PDL_ENTRY();
    int r = blockIdx.x;
    if (r >= *end) return; /* the rows of the experts grouped (end: their offsets' last) */
    const float *src = x + (int64_t)(order[r] / k) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) xin[(int64_t)r * H + i] = src[i];
}

/* The grouped rows' activations rounded to 8 bits: xt holds x's T rows rounded once (nb blocks each), and row r
 * (r < *end) gets its token's blocks, 8 bytes at a time (a block is 40). A row's rounding depends on its values
 * alone, so these are the bits of rounding the f32 rows k_moe_gather copies, at a k-th of the rounding and no f32
 * copies. */
__global__ void k_moe_gather_q8(qw_q8a *xq, const qw_q8a *xt, const int32_t *order, int k, int nb, const int32_t *end) {
    QWC_PDL_ENTRY();
    const int r = blockIdx.x;
    if (r >= *end) return;
    static_assert(sizeof(qw_q8a) % sizeof(uint2) == 0, "a block is whole 8-byte words");
    constexpr int WB = sizeof(qw_q8a) / sizeof(uint2);
    const uint2 *src = (const uint2 *)(xt + (int64_t)(order[r] / k) * nb);
    uint2 *dst = (uint2 *)(xq + (int64_t)r * nb);
    for (int i = threadIdx.x; i < nb * WB; i += blockDim.x) dst[i] = src[i];
}

/* The grouped products' input rows for R = T k rows grouped by order (offs[E]: how many): x's rows rounded, then
 * gathered as 8-bit blocks into xq (QWC_MOE_GATHER_Q8, QWENC_CUDA_MOE_GATHER_Q8=0: the f32 rows gathered into xin,
 * then rounded: the same bits); xin has room for R f32 rows. */
#ifndef QWC_MOE_GATHER_Q8
#define QWC_MOE_GATHER_Q8 1
#endif
static void gather_rows_q8(qwc *c, qw_q8a *xq, float *xin, const float *x, const int32_t *order, const int32_t *end,
                           int T, int k, int64_t H) {
    static int env = -1;
    const int R = T * k;
    if (QWC_MOE_GATHER_Q8 && qwc_env_switch("QWENC_CUDA_MOE_GATHER_Q8", 1, &env)) {
        qw_q8a *xt = (qw_q8a *)xin; /* T rows of H / 32 blocks: 1.25 T H bytes of xin's 4 R H */
        qwc_q8a_rows(c, xt, x, H, H, T);
        qwc_launch(k_moe_gather_q8, R, 128, 0, qwc_stream(c), xq, (const qw_q8a *)xt, order, k, (int)(H / 32), end);
        QWC_LAUNCHED();
    } else {
        qwc_launch(k_moe_gather, R, 256, 0, qwc_stream(c), xin, x, order, k, (int)H, end);
        QWC_LAUNCHED();
        qwc_q8a_rows(c, xq, xin, H, H, R); /* rows past the grouped ones are rounded and never read */
    }
}

/* The down products' input: the R rows of g [R][I] rounded to 8 bits, by act_mul where it could (in its buffer),
 * else into xq */
static const qw_q8a *act_rows_q8(qwc *c, qw_q8a *xq, const float *g, int64_t I, int R) {
    const qw_q8a *made = qwc_q8_fresh(c, g, I, I, R);
    if (made) return made;
    qwc_q8a_rows(c, xq, g, I, I, R);
    return xq;
}

/* outp [R][H] by pair: the grouped row of pair p (rowpos[p]), zeros for a pair no expert here took (rowpos -1) */
__global__ void k_moe_scatter(float *outp, const float *out, const int32_t *rowpos, int H) {
    QWC_PDL_ENTRY();
    const int p = blockIdx.x, r = rowpos[p];
    for (int i = threadIdx.x; i < H; i += blockDim.x) outp[(int64_t)p * H + i] = r >= 0 ? out[(int64_t)r * H + i] : 0.0f;
}

/* y[t] = (shared ? s[t] * sg[t] : 0) + the token's routed outputs in ascending expert order, s the shared expert's
 * output (in y, or at shared_out when not NULL); out row of pair p at rowpos[p] (NULL: p). Grid: tokens x blocks
 * of 256 columns; the slots' order is found once per block. */
__global__ void k_moe_combine(float *y, const float *out, const int32_t *rowpos, const int32_t *sel, const float *wt,
                              const float *sg, int sg_logit, int has_shared, const float *shared_out, int k, int H) {
    QWC_PDL_ENTRY();
    __shared__ int rows[64], ids[64], pos[64];
    __shared__ float w[64], wk[64];
    int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    qwc_combine_slots(sel, rowpos, wt, t, k, rows, w, ids, pos, wk);
    if (i >= H) return;
    const float s = has_shared ? (shared_out ? shared_out : y)[(int64_t)t * H + i] : 0.0f;
    float v = qwc_combine_start(s, sg, t, sg_logit, has_shared);
    for (int n = 0; n < k; n++) v += out[(int64_t)rows[n] * H + i] * w[n];
    y[(int64_t)t * H + i] = v;
}

/* The shared expert's gate: its sigmoid taken by the combine kernel (QWC_MOE_GATE_IN_COMBINE 0: the sigmoid op;
 * the same bits, tests/gpu/fusions.sh). */
#ifndef QWC_MOE_GATE_IN_COMBINE
#define QWC_MOE_GATE_IN_COMBINE 1
#endif

/* The shared expert as more pairs of the routed experts' products where that gives the bits of its own products
 * (QWC_MOE_SHARED_PAIRS 0: always its own; t_cuda_ops and tests/gpu/fusions.sh compare the two). */
#ifndef QWC_MOE_SHARED_PAIRS
#define QWC_MOE_SHARED_PAIRS 1
#endif

/* The routing inside the kernel that gathers the pairs' inputs (QWC_MOE_ROUTE_IN_PAIRS 0: k_moe_route first; the
 * same bits, tests/gpu/fusions.sh). */
#ifndef QWC_MOE_ROUTE_IN_PAIRS
#define QWC_MOE_ROUTE_IN_PAIRS 1
#endif

/* One token's pairs read its x where it is, rounded once (QWC_MOE_X_IN_PLACE 0, or QWENC_CUDA_MOE_X_IN_PLACE=0 in
 * the environment: a copy of x and its rounding for each pair, twice when gate and up are one product; the same
 * bits, tests/gpu/fusions.sh). */
#ifndef QWC_MOE_X_IN_PLACE
#define QWC_MOE_X_IN_PLACE 1
#endif

/* The shared gate's logits by the pairs' kernel, in blocks after the pairs' (QWC_MOE_SG_IN_PAIRS 0: k_sg_dot, a
 * launch of its own; the same bits, tests/gpu/fusions.sh). */
#ifndef QWC_MOE_SG_IN_PAIRS
#define QWC_MOE_SG_IN_PAIRS 1
#endif
#define SG_DOT_MAX_TOK 16 /* more tokens: the shared gate through matmul */

/* whether sg_dot takes the shared gate w (one row of H, F32 / BF16 / F16) for T tokens */
static int sg_dot_takes(const qw_tensor *w, int64_t H, int T) {
    return w && T <= SG_DOT_MAX_TOK && (w->type == QW_TYPE_F32 || w->type == QW_TYPE_BF16 || w->type == QW_TYPE_F16) &&
           qw_tensor_nelem(w) == H && qw_tensor_row_len(w) == H;
}

/* The shared gate's logits of the T tokens of x into sg (unless the pairs' kernel made them: made), and their
 * sigmoid unless the combine takes it. */
static void shared_gate_logits(const qw_backend *be, float *sg, const qw_tensor *w, const float *x, int T, int64_t H,
                               int made) {
    qwc *c = qwc_of(be);
    if (!made && sg_dot_takes(w, H, T)) {
        qwc_launch(k_sg_dot, T, 256, 0, qwc_stream(c), sg, qwc_tensor(c, w).data, (int)w->type, x, (int)H);
        QWC_LAUNCHED();
    } else if (!made) {
        be->matmul(be, sg, w, x, T);
    }
    if (!QWC_MOE_GATE_IN_COMBINE) be->sigmoid(be, sg, T);
}

/* Many rows on the integer path: the experts' products as three grouped tensor-core GEMMs (mmq.cu) when every
 * expert's projections have the first one's types and the integer path takes them; each row the bits of its own
 * product (qw_q8a_dot_ref's). */
static int grouped_mmq(qwc *c, const qw_ffn_w *experts, int E, int64_t H, int64_t I) {
    const qw_ffn_w *e0 = &experts[0];
    if (!qwc_q8_on(c) || !qwc_mmq_takes(e0->gate.type, H) || !qwc_mmq_takes(e0->up.type, H) ||
        !qwc_mmq_takes(e0->down.type, I))
        return 0;
    for (int e = 1; e < E; e++)
        if (experts[e].gate.type != e0->gate.type || experts[e].up.type != e0->up.type ||
            experts[e].down.type != e0->down.type)
            return 0;
    return 1;
}

/* The gate and up products of P pairs (mats [3][P], the inputs xin [P][H] xs apart (0: one row for all), twice
 * when one and xs): gate's into g, up's into u (g + P I when one: the two as one product of 2P pairs), then
 * silu(g) u into g (act_mul, with its 8-bit rounding). */
static void pairs_gate_up(const qw_backend *be, qwc *c, float *g, float *u, const void **mats, qw_type tg, qw_type tu,
                          int64_t I, int64_t H, const float *xin, int64_t xs, int P, int one) {
    qwc_q8_keep(c, 0);
    if (one) {
        qwc_matmul_pairs(c, g, mats, tg, I, H, xin, xs, 2 * P);
    } else {
        qwc_matmul_pairs(c, g, mats, tg, I, H, xin, xs, P);
        qwc_q8_keep(c, 1); /* up reads gate's x */
        qwc_matmul_pairs(c, u, mats + P, tu, I, H, xin, xs, P);
        qwc_q8_keep(c, 0);
    }
    be->act_mul(be, g, g, u, (int64_t)P * I, QW_ACT_SILU);
}

/* The shared expert's own products: its output into y, its gate's logit (or sigmoid) into sg; sgt, sup [T][Is]. */
static void shared_products(const qw_backend *be, float *y, float *sg, float *sgt, float *sup, const float *x, int T,
                            const qw_ffn_w *shared, const qw_tensor *shared_gate) {
    qw_matmul_job j[2] = {{sgt, &shared->gate, x, T}, {sup, &shared->up, x, T}};
    be->matmul_batch(be, j, 2);
    be->act_mul(be, sgt, sgt, sup, (int64_t)T * shared->gate.shape[0], QW_ACT_SILU);
    be->matmul(be, y, &shared->down, sgt, T);
    if (shared_gate) shared_gate_logits(be, sg, shared_gate, x, T, shared->down.shape[0], 0);
}

/* One rank's experts lo .. lo + n - 1 (c: that rank, its device current; c0: rank 0) for the pairs of sel (x
 * [T][H], sel [T k], in c's memory): outp [T k][H] by pair, zeros for the pairs of other experts. work:
 * layout_of(T, k, n, H, I, 0, pairs) bytes. The same products as one GPU's (pairs as as_pairs says, else grouped):
 * each row the bits it has there. */
static void rank_experts(qwc *c0, qwc *c, float *outp, const float *x, const int32_t *sel, int T, int k,
                         const qw_ffn_w *experts, int lo, int n, int64_t H, int64_t I, char *w) {
    const qw_backend *be = qwc_backend(c);
    cudaStream_t st = qwc_stream(c);
    const int R = T * k;
    if (n <= 0) {
        QWC_WROTE();
        QWC_CHECK(cudaMemsetAsync(outp, 0, (size_t)R * H * sizeof(float), st));
        return;
    }
    const int pairs = as_pairs(c0, T, k, H, I);
    const moe_layout l = layout_of(T, k, n, (int)H, (int)I, 0, pairs);
    float *xin = (float *)(w + l.xin), *g = (float *)(w + l.g), *u = (float *)(w + l.u), *out = (float *)(w + l.out);
    const qw_ffn_w *ex = experts + lo, *e0 = &ex[0];
    const void *const *tab = expert_table(c, ex, n);
    if (pairs) {
        const qw_type tg = e0->gate.type, tu = e0->up.type, td = e0->down.type;
        size_t cap = 0;
        qwc_q8_buf(c, &cap);
        const int64_t q8w = (int64_t)sizeof(qw_q8a) * (H > I ? H : I) / 32;
        const int one = tg == tu && 2 * R * q8w <= (int64_t)cap;
        const void **mats = (const void **)(w + l.mats);
        float *uu = g + (int64_t)R * I;
        const int64_t nx = (int64_t)(one ? 2 * R : R) * H;
        qw_q8a *xq = qwc_q8_for(c, nx, H);
        qwc_launch(k_moe_pairs, R, 256, 0, st, mats, xin, x, (int32_t *)sel, (float *)NULL, (const float *)NULL, 0, tab,
                   R, R, k, n, (int)H, (const void *const *)NULL, one, xq, lo, n, (const void *)NULL, 0, (float *)NULL);
        QWC_LAUNCHED();
        if (xq) qwc_q8_made(c, xin, nx);
        pairs_gate_up(be, c, g, uu, mats, tg, tu, I, H, xin, H, R, one);
        qwc_matmul_pairs(c, outp, mats + 2 * R, td, H, I, g, I, R); /* another's pairs: zeros */
        return;
    }
    int32_t *order = (int32_t *)(w + l.order), *offs = (int32_t *)(w + l.offs), *rowpos = (int32_t *)(w + l.rowpos);
    QWC_WROTE();
    QWC_CHECK(cudaMemsetAsync(rowpos, 0xff, (size_t)R * sizeof(int32_t), st)); /* -1: not here */
    qwc_launch(k_moe_group, n, 256, 0, st, offs, sel, R, lo);
    qwc_launch(k_moe_scan, 1, 1, 0, st, offs, n);
    qwc_launch(k_moe_place, n, 256, 0, st, order, rowpos, offs, sel, R, lo);
    QWC_LAUNCHED();
    if (grouped_mmq(c, ex, n, H, I)) {
        int32_t *tiles = (int32_t *)(w + l.tiles);
        qw_q8a *xq = (qw_q8a *)(w + l.xq);
        qwc_mmq_tiles(c, tiles, offs, n);
        gather_rows_q8(c, xq, xin, x, order, (const int32_t *)offs + n, T, k, H);
        qwc_mmq_grouped(c, g, I, tab, e0->gate.type, I, H, xq, offs, tiles, n, R);
        qwc_mmq_grouped(c, u, I, tab + n, e0->up.type, I, H, xq, offs, tiles, n, R);
        be->act_mul(be, g, g, u, (int64_t)R * I, QW_ACT_SILU);
        qwc_mmq_grouped(c, out, H, tab + 2 * n, e0->down.type, H, I, act_rows_q8(c, xq, g, I, R), offs, tiles, n, R);
    } else {
        qwc_launch(k_moe_gather, R, 256, 0, st, xin, x, order, k, (int)H, (const int32_t *)offs + n);
        QWC_LAUNCHED();
        if (qwc_capture_spoil(c0)) return; /* the group sizes cannot come to the host inside a graph */
        int32_t *ho = (int32_t *)qw_malloc((size_t)n + 1, sizeof(int32_t));
        if (!ho) qwc_die(__FILE__, __LINE__, "moe_ffn", "out of host memory");
        be->download(be, ho, offs, ((size_t)n + 1) * sizeof(int32_t));
        for (int e = 0; e < n; e++) {
            const int m = ho[e + 1] - ho[e];
            if (!m) continue;
            qw_matmul_job j[2] = {{g + (int64_t)ho[e] * I, &ex[e].gate, xin + (int64_t)ho[e] * H, m},
                                  {u + (int64_t)ho[e] * I, &ex[e].up, xin + (int64_t)ho[e] * H, m}};
            be->matmul_batch(be, j, 2);
        }
        be->act_mul(be, g, g, u, (int64_t)ho[n] * I, QW_ACT_SILU);
        for (int e = 0; e < n; e++) {
            const int m = ho[e + 1] - ho[e];
            if (m) be->matmul(be, out + (int64_t)ho[e] * H, &ex[e].down, g + (int64_t)ho[e] * I, m);
        }
        free(ho);
    }
    qwc_launch(k_moe_scatter, R, 256, 0, st, outp, (const float *)out, (const int32_t *)rowpos, (int)H);
    QWC_LAUNCHED();
}

/* The MoE split over the ranks (qw_backend_cuda_split): the routing on rank 0; x and the routing sent to the
 * others; each rank's experts (rank r: qwc_rank_lo(r) .. qwc_rank_lo(r + 1) - 1) into rows by pair, zeros elsewhere;
 * the rows summed into rank 0's (each row from one rank and zeros: that row exactly) while rank 0 runs the shared
 * expert; then the combine of one GPU, in the order of the expert ids. */
static void split_moe_ffn(qwc *c, float *y, const float *x, int32_t *sel, float *wt, float *logits, int norm, int T,
                          int k, const qw_ffn_w *experts, int E, const qw_ffn_w *shared, const qw_tensor *shared_gate,
                          void *work) {
    const qw_backend *be = qwc_backend(c);
    const int N = qwc_n_rank(c), R = T * k;
    const int64_t H = experts[0].down.shape[0], I = experts[0].gate.shape[0], Is = shared ? shared->gate.shape[0] : 0;
    const int pairs = as_pairs(c, T, k, H, I);
    const moe_layout full = layout_of(T, k, E, (int)H, (int)I, (int)Is, pairs),
                     own = layout_of(T, k, E, (int)H, (int)I, 0, pairs);
    char *w = (char *)work;
    float *sgt = (float *)(w + full.sgt), *sup = (float *)(w + full.sup), *sg = (float *)(w + full.sg);
    if (logits) cu_moe_route(be, sel, wt, logits, T, E, k, norm);
    if (k > 64) qwc_die(__FILE__, __LINE__, "moe_ffn", "more than 64 experts per token");
    const size_t xb = up256((size_t)T * H * sizeof(float)), sb = up256((size_t)R * sizeof(int32_t));
    const size_t ob = up256((size_t)R * H * sizeof(float));
    void *xs[QWC_MAX_RANKS], *ss[QWC_MAX_RANKS];
    float *os[QWC_MAX_RANKS];
    char *ws[QWC_MAX_RANKS];
    xs[0] = (void *)x, ss[0] = sel, ws[0] = w + full.total, os[0] = (float *)(w + full.total + own.total);
    for (int r = 1; r < N; r++) {
        qwc *p = qwc_rank(c, r);
        qwc_set_device(p);
        char *b = (char *)qwc_ep_buf(p, xb + sb + ob + own.total);
        xs[r] = b, ss[r] = b + xb, os[r] = (float *)(b + xb + sb), ws[r] = b + xb + sb + ob;
    }
    qwc_set_device(c);
    qwc_fork(c);
    qwc_bcast(c, xs, (size_t)T * H * sizeof(float), ss, (size_t)R * sizeof(int32_t));
    for (int r = N - 1; r >= 0; r--) { /* the others' first: rank 0's own run while theirs do */
        qwc *p = qwc_rank(c, r);
        const int lo = qwc_rank_lo(c, r, E), hi = qwc_rank_lo(c, r + 1, E);
        qwc_set_device(p);
        rank_experts(c, p, os[r], (const float *)xs[r], (const int32_t *)ss[r], T, k, experts, lo, hi - lo, H, I, ws[r]);
    }
    qwc_set_device(c);
    if (shared) shared_products(be, y, sg, sgt, sup, x, T, shared, shared_gate);
    qwc_reduce_sum(c, os, (size_t)R * H);
    qwc_launch(k_moe_combine, dim3(qwc_blocks(H, 256), T), 256, 0, qwc_stream(c), y, (const float *)os[0],
               (const int32_t *)NULL, (const int32_t *)sel, (const float *)wt, shared_gate ? (const float *)sg : (const float *)NULL,
               QWC_MOE_GATE_IN_COMBINE, shared != NULL, (const float *)NULL, k, (int)H);
    QWC_LAUNCHED();
}

static void cu_moe_ffn(const qw_backend *be, float *y, const float *x, int32_t *sel, float *wt, float *logits, int norm,
                       int T, int k, const qw_ffn_w *experts, int E, const qw_ffn_w *shared, const qw_tensor *shared_gate,
                       void *work) {
    qwc *c = qwc_of(be);
    if (qwc_split(c)) {
        split_moe_ffn(c, y, x, sel, wt, logits, norm, T, k, experts, E, shared, shared_gate, work);
        return;
    }
    cudaStream_t st = qwc_stream(c);
    int64_t H = experts[0].down.shape[0], I = experts[0].gate.shape[0], Is = shared ? shared->gate.shape[0] : 0;
    int R = T * k;
    const int pairs = as_pairs(c, T, k, H, I);
    moe_layout l = layout_of(T, k, E, (int)H, (int)I, (int)Is, pairs);
    char *w = (char *)work;
    float *xin = (float *)(w + l.xin), *g = (float *)(w + l.g), *u = (float *)(w + l.u), *out = (float *)(w + l.out);
    float *sgt = (float *)(w + l.sgt), *sup = (float *)(w + l.sup), *sg = (float *)(w + l.sg);
    int32_t *rowpos = NULL;
    const float *shared_out = NULL; /* the shared expert's output when it ran as pairs R .. P-1 */
    const size_t route_smem = (size_t)E * (sizeof(float) + 1);
    const int route_in_pairs = logits && QWC_MOE_ROUTE_IN_PAIRS && pairs && k <= 64 && route_smem <= 48 * 1024;
    if (logits && !route_in_pairs) cu_moe_route(be, sel, wt, logits, T, E, k, norm);
    if (pairs) { /* one type per projection: every expert of a layer has its projections' types */
        const qw_ffn_w *e0 = &experts[0];
        const qw_type tg = e0->gate.type, tu = e0->up.type, td = e0->down.type;
        /* the shared expert as T more pairs when its shapes and types are the experts' and its own products would
         * sum each token as the pairs do (one token, or the integer path) */
        /* (and so long as the rows fit the 8-bit activations' buffer, which the separate products' rows do) */
        size_t cap = 0;
        qwc_q8_buf(c, &cap);
        const int64_t q8w = (int64_t)sizeof(qw_q8a) * (H > I ? H : I) / 32; /* bytes of one row rounded */
        const int with_shared = QWC_MOE_SHARED_PAIRS && shared && Is == I && shared->gate.type == tg && shared->up.type == tu &&
                                shared->down.type == td && shared->down.shape[1] == I &&
                                qwc_matmul_like_pairs(c, tg, H, T) && qwc_matmul_like_pairs(c, tu, H, T) &&
                                qwc_matmul_like_pairs(c, td, I, T) &&
                                (int64_t)(R + T) * q8w <= (int64_t)cap;
        const int P = R + (with_shared ? T : 0);
        const int one = tg == tu && 2 * P * q8w <= (int64_t)cap; /* gate and up as one product of 2P pairs */
        const void **mats = (const void **)(w + l.mats);
        const void *const *sh = NULL;
        if (with_shared) sh = expert_table(c, shared, 1); /* [gate, up, down] */
        float *gu = g, *uu = g + (int64_t)P * I; /* up's outputs right after gate's */
        const void *const *tab = expert_table(c, experts, E);
        static int env = -1;
        const int in_place = QWC_MOE_X_IN_PLACE && T == 1 && qwc_env_switch("QWENC_CUDA_MOE_X_IN_PLACE", 1, &env);
        const int64_t nx = in_place ? H : (int64_t)(one ? 2 * P : P) * H;
        qw_q8a *xq = qwc_q8_for(c, nx, H);
        /* the shared gate's logits in blocks after the pairs' */
        const int sg_in = QWC_MOE_SG_IN_PAIRS && with_shared && sg_dot_takes(shared_gate, H, T);
        qwc_launch(k_moe_pairs, P + (sg_in ? T : 0), 256, route_in_pairs ? route_smem : 0, st, mats,
                   in_place ? NULL : xin, x, sel, wt, route_in_pairs ? (const float *)logits : NULL, norm, tab, R, P, k,
                   E, (int)H, sh, one, xq, 0, E, sg_in ? qwc_tensor(c, shared_gate).data : NULL,
                   sg_in ? (int)shared_gate->type : 0, sg);
        QWC_LAUNCHED();
        const float *xp = in_place ? x : xin;
        if (xq) qwc_q8_made(c, xp, nx);
        pairs_gate_up(be, c, gu, uu, mats, tg, tu, I, H, xp, in_place ? 0 : H, P, one);
        if (with_shared && shared_gate) shared_gate_logits(be, sg, shared_gate, x, T, H, sg_in);
        if (T == 1 && (with_shared || !shared) &&
            qwc_pairs_combine(c, y, mats + 2 * P, td, H, I, gu, P, sel, wt, k, shared_gate ? sg : NULL,
                              QWC_MOE_GATE_IN_COMBINE, shared != NULL, with_shared ? R : -1))
            return;
        qwc_matmul_pairs(c, out, mats + 2 * P, td, H, I, gu, I, P);
        if (with_shared) shared_out = out + (int64_t)R * H;
    } else {
        int32_t *order = (int32_t *)(w + l.order), *offs = (int32_t *)(w + l.offs);
        rowpos = (int32_t *)(w + l.rowpos);
        qwc_launch(k_moe_group, E, 256, 0, st, offs, sel, R, 0);
        qwc_launch(k_moe_scan, 1, 1, 0, st, offs, E);
        qwc_launch(k_moe_place, E, 256, 0, st, order, rowpos, offs, sel, R, 0);
        QWC_LAUNCHED();
        if (grouped_mmq(c, experts, E, H, I)) { /* every expert in one launch a projection: no host round trip */
            const void *const *tab = expert_table(c, experts, E);
            int32_t *tiles = (int32_t *)(w + l.tiles);
            qw_q8a *xq = (qw_q8a *)(w + l.xq);
            qwc_mmq_tiles(c, tiles, offs, E);
            gather_rows_q8(c, xq, xin, x, order, (const int32_t *)offs + E, T, k, H);
            qwc_mmq_grouped(c, g, I, tab, experts[0].gate.type, I, H, xq, offs, tiles, E, R);
            qwc_mmq_grouped(c, u, I, tab + E, experts[0].up.type, I, H, xq, offs, tiles, E, R);
            be->act_mul(be, g, g, u, (int64_t)R * I, QW_ACT_SILU);
            qwc_mmq_grouped(c, out, H, tab + 2 * E, experts[0].down.type, H, I, act_rows_q8(c, xq, g, I, R), offs,
                            tiles, E, R);
            goto shared_expert;
        }
        qwc_launch(k_moe_gather, R, 256, 0, st, xin, x, order, k, (int)H, (const int32_t *)offs + E);
        QWC_LAUNCHED();
        if (qwc_capture_spoil(c)) return; /* the group sizes cannot come to the host inside a graph */
        int32_t *ho = (int32_t *)qw_malloc((size_t)E + 1, sizeof(int32_t));
        if (!ho) qwc_die(__FILE__, __LINE__, "moe_ffn", "out of host memory");
        be->download(be, ho, offs, ((size_t)E + 1) * sizeof(int32_t)); /* the group sizes: the one round trip */
        for (int e = 0; e < E; e++) {
            int n = ho[e + 1] - ho[e];
            if (!n) continue;
            qw_matmul_job j[2] = {{g + (int64_t)ho[e] * I, &experts[e].gate, xin + (int64_t)ho[e] * H, n},
                                  {u + (int64_t)ho[e] * I, &experts[e].up, xin + (int64_t)ho[e] * H, n}};
            be->matmul_batch(be, j, 2);
        }
        be->act_mul(be, g, g, u, (int64_t)R * I, QW_ACT_SILU);
        for (int e = 0; e < E; e++) {
            int n = ho[e + 1] - ho[e];
            if (n) be->matmul(be, out + (int64_t)ho[e] * H, &experts[e].down, g + (int64_t)ho[e] * I, n);
        }
        free(ho);
    }
shared_expert:
    if (shared && !shared_out) shared_products(be, y, sg, sgt, sup, x, T, shared, shared_gate);
    if (k > 64) qwc_die(__FILE__, __LINE__, "moe_ffn", "more than 64 experts per token");
    qwc_launch(k_moe_combine, dim3(qwc_blocks(H, 256), T), 256, 0, st, y, out, rowpos, sel, wt, shared_gate ? sg : NULL,
               QWC_MOE_GATE_IN_COMBINE, shared != NULL, shared_out, k, (int)H);
    QWC_LAUNCHED();
}

void qwc_moe_fill(qw_backend *t) {
    t->moe_route = cu_moe_route;
    t->moe_ffn = cu_moe_ffn;
    t->moe_work = cu_moe_work;
}
