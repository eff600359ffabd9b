/*
 * mmq.cu - the integer path's products of many tokens on the tensor cores: quantized weights against 8-bit
 * activations (kernels/q8a.h) with the 8-bit integer MMA (mma.sync m16n8k32 s8, m16n8k16 for Q6_K's halves), each
 * output the bits of the CPU's integer reference qw_q8a_dot_ref (a narrow product cut into column slices: within
 * the matrix-vector kernels' bound of it, below).
 *
 * Per group g of 32 columns the reference adds d_g * (A_g * isum_g + B_g * s_g) to an f32 sum, groups in order.
 * The weights' groups come as signed codes and integer scales (q8dot.h qd_codes: isum = m0 sum_lo + m1 sum_hi),
 * so the tensor cores give each group's exact integer sums (a fresh int32 accumulator per group), and each
 * output's thread adds the group's term in the reference's f32 operations, in the reference's order, every one
 * rounded on its own: the result is qw_q8a_dot_ref's to the bit, whatever the tile shapes (the types without a
 * min leave out B_g * s_g, which adds +-0 to a sum that is never -0: the same bits).
 *
 * A block of 4 warps computes 64 weight rows by 64 tokens, each warp 32 x 32 (2 x 4 MMA tiles), or 32 x 32 (each
 * warp 16 x 16) when the big tiles would leave SMs idle. A step takes KG = 4 groups (128 columns): the weights'
 * codes decoded by a thread per row and group into registers while the step before computes, then stored to shared
 * memory (rows padded to 144 bytes so that the fragments' 32-bit reads hit 32 banks); the activation blocks copied
 * as they are by cp.async into one of two buffers, a step ahead; then per group the MMAs and the f32 terms. The f32 terms, not the MMAs, bound the rate: about 7 f32 and
 * integer operations per output and group against 32 multiply-adds on the tensor cores.
 *
 * Grouped (the MoE's prompt steps): one launch for every expert of a layer. Expert e's rows of x are
 * [offs[e], offs[e+1]) (grouped by expert, tokens in order), its token tiles are tiles[e] .. tiles[e+1] - 1 of
 * the grid's y (tiles: the prefix sums of ceil(rows / tile), made on the device); a block past tiles[E] returns.
 */
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "cuda/cuda_internal.cuh"
#include "cuda/mma.cuh"

extern "C" {
#include "kernels/q8a.h"
}
#include "kernels/q8dot.h"

namespace {

constexpr int KG = 4, THREADS = 128;
constexpr int WS = KG * 32 + 16; /* bytes of a row of codes in shared memory (padded: no bank conflicts) */

struct mmq_args {
    const uint8_t *w;          /* one matrix, or NULL: tab */
    const void *const *tab;    /* grouped: expert e's matrix */
    const int32_t *offs, *tiles;
    int E;
    int64_t rows, row_bytes, ng; /* ng = cols / 32 */
    const qw_q8a *xq;          /* x rows, xq_tok blocks apart */
    int64_t xq_tok;
    float *y;                  /* y[t * ldy + r] */
    int64_t ldy;
    int n_tok;                 /* one matrix: its tokens */
    int64_t gsplit, ysplit;    /* a narrow product cut into slices: groups a slice (a multiple of KG; 0: one
                                  slice), and how far apart the slices' outputs are (grid z: the slice) */
    int skip;                  /* a warp's n tiles past the block's tokens skipped (else computed and dropped) */
};

template <int T> constexpr bool has_min() {
    return T == QW_TYPE_Q4_1 || T == QW_TYPE_Q5_1 || T == QW_TYPE_Q4_K || T == QW_TYPE_Q5_K;
}

/* One step's loads, held in registers while the step before computes: the weights' items (row i / KG, group
 * i % KG of the tile, i = tid + THREADS j) and the activations' */
template <int MT> struct mmq_regs {
    uint32_t c[MT][8];
    float A[MT], B[MT];
    int m[MT];
};

/* The activations' blocks in shared memory as they are in x (10 words: d, s, 8 words of codes), a token's KG
 * blocks XW words apart (padded: a fragment's reads of 8 tokens hit 32 banks), copied by cp.async (4-byte pieces,
 * coalesced; past the tokens or groups: zeros), two steps' buffers */
constexpr int XW = KG * 10 + 4;

template <int BN_>
__device__ __forceinline__ void mmq_xcopy(uint32_t *sx, const mmq_args &a, int64_t t0, int nt, int64_t g0, int64_t ge) {
    const int kw = (int)min((int64_t)KG, ge - g0) * 10;
#pragma unroll
    for (int u = 0; u < BN_ * KG * 10 / THREADS; u++) {
        const int i = threadIdx.x + THREADS * u, n = i / (KG * 10), wi = i % (KG * 10);
        const bool ok = n < nt && wi < kw;
        const uint32_t *src = (const uint32_t *)(a.xq + (t0 + (ok ? n : 0)) * a.xq_tok + g0) + (ok ? wi : 0);
        cp_async4(sx + n * XW + wi, src, ok);
    }
    cp_commit();
}

template <int T, int MT>
__device__ __forceinline__ void mmq_load(mmq_regs<MT> &q, const mmq_args &a, const uint8_t *w, int64_t row0,
                                         int64_t g0, int64_t ge) {
    const int kg = (int)min((int64_t)KG, ge - g0);
#pragma unroll
    for (int j = 0; j < MT; j++) {
        const int i = threadIdx.x + THREADS * j, r = i / KG, gg = i % KG;
        const int64_t row = row0 + r;
        int m0 = 0, m1 = 0;
        q.A[j] = q.B[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) q.c[j][k] = 0;
        if (row < a.rows && gg < kg) qd_codes((qw_type)T, w + row * a.row_bytes, g0 + gg, q.c[j], &q.A[j], &q.B[j], &m0, &m1);
        q.m[j] = (m0 & 0xFFFF) | m1 << 16;
    }
}

/* MT m tiles (16 rows) and NT n tiles (8 tokens) a warp; 2 x 2 warps: BM = 32 MT rows by BN = 16 NT tokens.
 * UNROLL: a step's KG groups unrolled (the next group's fragments and MMAs can be in flight while this one's terms
 * are added); the same operations in the same order for every output. FAST: each group's term in fused
 * multiply-adds instead of the reference's operations (QWENC_CUDA_MMQ_FAST, below): not qw_q8a_dot_ref's bits. */
template <int T, int MT, int NT, int MINB, bool UNROLL = false, bool FAST = false>
__global__ void __launch_bounds__(THREADS, MINB) k_mmq(mmq_args a) {
    QWC_PDL_ENTRY();
    constexpr int BM_ = 32 * MT, BN_ = 16 * NT;
    __shared__ __align__(16) uint8_t sw[BM_ * WS];
    __shared__ __align__(16) uint32_t sxb[2][BN_ * XW];
    __shared__ float sA[KG][BM_], sB[KG][BM_];
    __shared__ int sM[KG][BM_];
    constexpr bool TWO = T == QW_TYPE_Q6_K; /* two scales a group: the halves summed apart */
    const uint8_t *w;
    int64_t t0;
    int nt;
    if (a.tab) {
        const int tile = blockIdx.y;
        if (tile >= a.tiles[a.E]) return;
        int lo = 0, hi = a.E; /* the last e with tiles[e] <= tile: a non-empty expert */
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (a.tiles[mid] <= tile) lo = mid;
            else hi = mid;
        }
        t0 = a.offs[lo] + (int64_t)(tile - a.tiles[lo]) * BN_;
        nt = min(BN_, (int)(a.offs[lo + 1] - t0));
        w = (const uint8_t *)a.tab[lo];
    } else {
        t0 = (int64_t)blockIdx.y * BN_;
        nt = (int)min((int64_t)BN_, a.n_tok - t0);
        w = a.w;
    }
    const int64_t row0 = (int64_t)blockIdx.x * BM_;
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int wm = (wid & 1) * 16 * MT, wn = (wid >> 1) * 8 * NT;
    /* this warp's n tiles that hold tokens (an expert's last tile is often part empty): none, or at most half of
     * them, and the rest are skipped (whole halves: a tile at a time costs registers) */
    const int nj = a.skip ? min(NT, max(0, (nt - wn + 7) / 8)) : NT;
    float acc[MT][2][NT][2]; /* [m tile][row half][n tile][token] */
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < NT; j++) acc[i][h][j][0] = acc[i][h][j][1] = 0.0f;

    /* this block's groups: a slice of a narrow product, or all */
    const int64_t gb = a.gsplit ? (int64_t)blockIdx.z * a.gsplit : 0, ge = a.gsplit ? min(a.ng, gb + a.gsplit) : a.ng;
    mmq_regs<MT> q;
    mmq_xcopy<BN_>(sxb[0], a, t0, nt, gb, ge);
    mmq_load<T, MT>(q, a, w, row0, gb, ge);
    for (int64_t g0 = gb; g0 < ge; g0 += KG) {
        const int kg = (int)min((int64_t)KG, ge - g0), step = (int)((g0 - gb) / KG);
        const uint32_t *sx = sxb[step & 1];
        const bool more = g0 + KG < ge;
#pragma unroll
        for (int j = 0; j < MT; j++) { /* this step's loads into shared memory */
            const int i = tid + THREADS * j, r = i / KG, gg = i % KG;
            uint4 *d = (uint4 *)(sw + r * WS + gg * 32);
            d[0] = make_uint4(q.c[j][0], q.c[j][1], q.c[j][2], q.c[j][3]);
            d[1] = make_uint4(q.c[j][4], q.c[j][5], q.c[j][6], q.c[j][7]);
            sA[gg][r] = q.A[j], sB[gg][r] = q.B[j], sM[gg][r] = q.m[j];
        }
        if (more) { /* the next step's activations (the buffer the step before read) */
            mmq_xcopy<BN_>(sxb[(step + 1) & 1], a, t0, nt, g0 + KG, ge);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (more) mmq_load<T, MT>(q, a, w, row0, g0 + KG, ge); /* in flight while this step runs */
        const auto group = [&](const int gg, auto njc) { /* this step's group gg: its MMAs and terms, n tiles < NJ */
            constexpr int NJ = decltype(njc)::value;
            uint32_t fa[MT][4], fb[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint8_t *p = sw + (wm + mt * 16 + gid) * WS + gg * 32 + tig * 4;
                fa[mt][0] = *(const uint32_t *)p;
                fa[mt][1] = *(const uint32_t *)(p + 8 * WS);
                fa[mt][2] = *(const uint32_t *)(p + 16);
                fa[mt][3] = *(const uint32_t *)(p + 8 * WS + 16);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= NJ) break;
                const uint32_t *p = sx + (wn + j * 8 + gid) * XW + gg * 10 + 2 + tig;
                fb[j][0] = p[0];
                fb[j][1] = p[4];
            }
            float xd[NT][2], xs[NT][2];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= NJ) break;
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const uint32_t *p = sx + (wn + j * 8 + tig * 2 + k) * XW + gg * 10;
                    xd[j][k] = __uint_as_float(p[0]);
                    xs[j][k] = (float)(int)p[1];
                    if (FAST && has_min<T>()) xs[j][k] = __fmul_rn(xd[j][k], xs[j][k]); /* d s: B's factor */
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int32_t S[NT][4], S1[NT][4];
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (j >= NJ) break;
                    if (TWO) {
                        mma16(S[j], fa[mt][0], fa[mt][1], fb[j][0]);
                        mma16(S1[j], fa[mt][2], fa[mt][3], fb[j][1]);
                    } else {
                        mma32(S[j], fa[mt], fb[j]);
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wm + mt * 16 + gid + 8 * h;
                    const float A = sA[gg][r], B = sB[gg][r];
                    const int mm = sM[gg][r], m0 = (int)(short)(mm & 0xFFFF), m1 = mm >> 16;
                    /* FAST: acc + (A m0 d) S + B (d s), the integer scale in A (exact: an f16's 11 bits times at
                     * most 6), Q6_K's two halves as integers */
                    const float Am = FAST && !TWO ? __fmul_rn(A, (float)m0) : A;
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        if (j >= NJ) break;
#pragma unroll
                        for (int k = 0; k < 2; k++) {
                            const int s0 = S[j][2 * h + k];
                            if constexpr (FAST) {
                                const int is = TWO ? m0 * s0 + m1 * S1[j][2 * h + k] : s0;
                                float v = __fmaf_rn(__fmul_rn(Am, xd[j][k]), __int2float_rn(is), acc[mt][h][j][k]);
                                if (has_min<T>()) v = __fmaf_rn(B, xs[j][k], v);
                                acc[mt][h][j][k] = v;
                            } else {
                                const int isum = TWO ? m0 * s0 + m1 * S1[j][2 * h + k] : m0 * s0;
                                float v = __fmul_rn(A, __int2float_rn(isum));
                                if (has_min<T>()) v = __fadd_rn(v, __fmul_rn(B, xs[j][k]));
                                acc[mt][h][j][k] = __fadd_rn(acc[mt][h][j][k], __fmul_rn(xd[j][k], v));
                            }
                        }
                    }
                }
            }
        };
        const auto groups = [&](auto njc) {
            if (UNROLL && kg == KG) { /* every step but a product's last: the groups in one straight run */
#pragma unroll
                for (int gg = 0; gg < KG; gg++) group(gg, njc);
            } else {
                for (int gg = 0; gg < kg; gg++) group(gg, njc);
            }
        };
        if (nj > NT / 2) groups(std::integral_constant<int, NT>{});
        else if (nj > 0) groups(std::integral_constant<int, NT / 2>{});
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = row0 + wm + mt * 16 + gid + 8 * h;
            if (row >= a.rows) continue;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const int n = wn + j * 8 + tig * 2 + k;
                    if (n < nt) a.y[blockIdx.z * a.ysplit + (t0 + n) * a.ldy + row] = acc[mt][h][j][k];
                }
        }
}

/* Big tiles (64 x 64) when they make enough blocks to fill the GPU, else 32 x 32 (four times the blocks: the
 * narrow matrices, whose few row tiles would leave most SMs idle). The outputs' bits do not depend on it. */
constexpr int64_t MMQ_BIG_BLOCKS = 264;

/* The big tiles' groups unrolled, at 3 blocks an SM for the registers that takes (QWENC_CUDA_MMQ_UNROLL=0 in the
 * environment: the loop at 4 blocks an SM; the same bits) */
static int mmq_unroll() {
    static int r = -1;
    return qwc_env_switch("QWENC_CUDA_MMQ_UNROLL", 1, &r);
}

/* A warp's MMAs and terms for its n tiles past the block's last token skipped (QWENC_CUDA_MMQ_SKIP=0: computed and
 * dropped as before; the same bits, since such outputs are never written). An expert's last token tile is often
 * part empty: 80 rows an expert on average at a 4,096-token prompt of Flash-Next fill 2 tiles of 64 to 62 %. */
static int mmq_skip() {
    static int r = -1;
    return qwc_env_switch("QWENC_CUDA_MMQ_SKIP", 1, &r);
}

/* Each output's group terms as fused multiply-adds, acc + (A m d) S + B (d s) (QWENC_CUDA_MMQ_FAST=1 in the
 * environment; off by default, as a faster numerics mode is opt-in): about four operations an output and group
 * instead of the reference's seven, where ncu found the kernel bound by the instructions it issues; 1.06-1.07x on an
 * H100's prompts (docs/BENCH.md). Not qw_q8a_dot_ref's bits but within the matrix-vector kernels' bound of it,
 * (ng + 48) 2^-24 qw_q8a_dot_abs (t_cuda_emu, gpu_check's t_cuda_quant_fast); the big and small tiles give the same
 * bits. */
static int mmq_fast() {
    static int r = -1;
    return qwc_env_switch("QWENC_CUDA_MMQ_FAST", 0, &r);
}

template <int T> void mmq_launch(qwc *c, mmq_args a, int64_t n_rows, int grouped, int slices) {
    a.skip = mmq_skip();
    const int64_t rows = a.rows;
    const int64_t big = ((rows + 63) / 64) * ((n_rows + 63) / 64);
    const bool fast = mmq_fast();
    if (big >= MMQ_BIG_BLOCKS) {
        const dim3 grid((unsigned)((rows + 63) / 64), (unsigned)((n_rows + 63) / 64 + (grouped ? a.E : 0)), slices);
        if (fast) qwc_launch(k_mmq<T, 2, 4, 3, true, true>, grid, THREADS, 0, qwc_stream(c), a);
        else if (mmq_unroll()) qwc_launch(k_mmq<T, 2, 4, 3, true>, grid, THREADS, 0, qwc_stream(c), a);
        else qwc_launch(k_mmq<T, 2, 4, 4>, grid, THREADS, 0, qwc_stream(c), a);
    } else {
        const dim3 grid((unsigned)((rows + 31) / 32), (unsigned)((n_rows + 31) / 32 + (grouped ? a.E : 0)), slices);
        if (grouped) a.tiles += a.E + 1; /* the 32-token tiles' prefix */
        if (fast) qwc_launch(k_mmq<T, 1, 2, 6, false, true>, grid, THREADS, 0, qwc_stream(c), a);
        else qwc_launch(k_mmq<T, 1, 2, 6>, grid, THREADS, 0, qwc_stream(c), a);
    }
    QWC_LAUNCHED();
}

void mmq_by_type(qwc *c, qw_type t, const mmq_args &a, int64_t n_rows, int grouped, int slices) {
    switch (t) {
    case QW_TYPE_Q8_0: mmq_launch<QW_TYPE_Q8_0>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q4_0: mmq_launch<QW_TYPE_Q4_0>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q4_1: mmq_launch<QW_TYPE_Q4_1>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q5_0: mmq_launch<QW_TYPE_Q5_0>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q5_1: mmq_launch<QW_TYPE_Q5_1>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q4_K: mmq_launch<QW_TYPE_Q4_K>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q5_K: mmq_launch<QW_TYPE_Q5_K>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_Q6_K: mmq_launch<QW_TYPE_Q6_K>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_IQ4_NL: mmq_launch<QW_TYPE_IQ4_NL>(c, a, n_rows, grouped, slices); return;
    case QW_TYPE_IQ4_XS: mmq_launch<QW_TYPE_IQ4_XS>(c, a, n_rows, grouped, slices); return;
    default: qwc_die(__FILE__, __LINE__, "mmq: no integer GEMM for weights of type", qw_type_name(t));
    }
}

/* tiles[e + 1] = tiles[e] + ceil((offs[e + 1] - offs[e]) / 64), tiles[0] = 0, then the same for 32-token tiles at
 * tiles + E + 1: one thread */
__global__ void k_mmq_tiles(int32_t *tiles, const int32_t *offs, int E) {
    QWC_PDL_ENTRY();
    if (threadIdx.x || blockIdx.x) return;
    int32_t n64 = 0, n32 = 0;
    tiles[0] = tiles[E + 1] = 0;
    for (int e = 0; e < E; e++) {
        const int32_t n = offs[e + 1] - offs[e];
        n64 += (n + 63) / 64, n32 += (n + 31) / 32;
        tiles[e + 1] = n64, tiles[E + 2 + e] = n32;
    }
}

/* A narrow product: when even the small tiles make fewer blocks than MMQ_SPLIT_BLOCKS (four per SM of an H200)
 * and the rows are long, the columns are cut into slices of at least MMQ_SPLIT_GROUPS groups, as many as bring
 * the blocks to that count (at most MMQ_SPLIT_MAX), each slice's f32 sums kept apart and then added in order
 * (the hyper-connections' down and inject products of a prompt step: 320 and 4 rows of 10,240 columns). Each
 * output is then an f32 sum of the reference's terms, a chain of the slice's terms per slice and S - 1 additions
 * of the slices' sums: within the matrix-vector kernels' bound ((ng + 48) u sum |term|), not qw_q8a_dot_ref's
 * bits. QWC_MMQ_SPLIT 0: never cut. */
#ifndef QWC_MMQ_SPLIT
#define QWC_MMQ_SPLIT 1
#endif
constexpr int64_t MMQ_SPLIT_BLOCKS = 528, MMQ_SPLIT_GROUPS = 32;
constexpr int MMQ_SPLIT_MAX = 16;

/* groups a slice (0: not cut) and the slices */
int64_t mmq_split(int64_t rows, int64_t ng, int n_tok, int *slices) {
    *slices = 1;
    const int64_t big = ((rows + 63) / 64) * ((n_tok + 63) / 64), small = ((rows + 31) / 32) * ((n_tok + 31) / 32);
    if (!QWC_MMQ_SPLIT || rows <= 0 || n_tok <= 0 || big >= MMQ_BIG_BLOCKS || small >= MMQ_SPLIT_BLOCKS) return 0;
    const int64_t want =
        std::min<int64_t>({MMQ_SPLIT_MAX, ng / MMQ_SPLIT_GROUPS, (MMQ_SPLIT_BLOCKS + small - 1) / small});
    if (want < 2) return 0;
    const int64_t gs = ((ng + want - 1) / want + KG - 1) / KG * KG;
    *slices = (int)((ng + gs - 1) / gs);
    if (*slices < 2) {
        *slices = 1;
        return 0;
    }
    return gs;
}

/* y [t * ldy + r] = sum over s in order of part [s][t][r], r < m */
__global__ void k_slice_sum(float *y, int64_t ldy, const float *part, int64_t m, int64_t n, int S) {
    QWC_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = part[i];
    for (int s = 1; s < S; s++) acc = __fadd_rn(acc, part[(int64_t)s * n + i]);
    y[(i / m) * ldy + i % m] = acc;
}

} // namespace

int qwc_mmq_slices(int64_t rows, int64_t cols, int n_tok) {
    int s;
    mmq_split(rows, cols / 32, n_tok, &s);
    return s;
}

int64_t qwc_mmq_work(int64_t rows, int64_t cols, int n_tok) {
    const int s = qwc_mmq_slices(rows, cols, n_tok);
    return s > 1 ? (int64_t)s * rows * n_tok : 0;
}

void qwc_slice_sum(qwc *c, float *y, int64_t ldy, const float *part, int64_t m, int n_tok, int S) {
    const int64_t n = m * n_tok;
    if (n <= 0) return;
    qwc_launch(k_slice_sum, (unsigned)((n + 255) / 256), 256, 0, qwc_stream(c), y, ldy, part, m, n, S);
    QWC_LAUNCHED();
}

int qwc_mmq_takes(qw_type t, int64_t cols) { return qd_supported(t) && cols % 32 == 0; }

void qwc_mmq(qwc *c, float *y, int64_t ldy, const uint8_t *w, qw_type t, int64_t rows, int64_t cols,
             const qw_q8a *xq, int64_t xq_tok, int n_tok, float *work) {
    if (rows <= 0 || n_tok <= 0) return;
    mmq_args a = {};
    a.w = w, a.rows = rows, a.row_bytes = (int64_t)qw_type_row_size(t, cols), a.ng = cols / 32;
    a.xq = xq, a.xq_tok = xq_tok, a.y = y, a.ldy = ldy, a.n_tok = n_tok;
    int slices = 1;
    if (work) a.gsplit = mmq_split(rows, a.ng, n_tok, &slices);
    if (slices > 1) { /* the slices' sums [slice][token][row], then added in order */
        a.y = work, a.ldy = rows, a.ysplit = rows * n_tok;
        mmq_by_type(c, t, a, n_tok, 0, slices);
        qwc_slice_sum(c, y, ldy, work, rows, n_tok, slices);
        return;
    }
    mmq_by_type(c, t, a, n_tok, 0, 1);
}

void qwc_mmq_tiles(qwc *c, int32_t *tiles, const int32_t *offs, int E) {
    qwc_launch(k_mmq_tiles, 1, 32, 0, qwc_stream(c), tiles, offs, E);
    QWC_LAUNCHED();
}

void qwc_mmq_grouped(qwc *c, float *y, int64_t ldy, const void *const *tab, qw_type t, int64_t rows, int64_t cols,
                     const qw_q8a *xq, const int32_t *offs, const int32_t *tiles, int E, int n_rows) {
    if (rows <= 0 || n_rows <= 0) return;
    mmq_args a = {};
    a.tab = tab, a.offs = offs, a.tiles = tiles, a.E = E;
    a.rows = rows, a.row_bytes = (int64_t)qw_type_row_size(t, cols), a.ng = cols / 32;
    a.xq = xq, a.xq_tok = cols / 32, a.y = y, a.ldy = ldy;
    mmq_by_type(c, t, a, n_rows, 1, 1);
}
