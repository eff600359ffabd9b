/*
 * shared.cuh - the part of the CUDA backend's internal header (cuda_internal.cuh) that does not depend on the CUDA
 * runtime's headers: the backend's functions that its files share, and the device helpers they all use. The
 * runtime's types it names (cudaStream_t, cublasHandle_t) and the launch and check macros come from the file that
 * includes it: cuda_internal.cuh, or the emulation's header of that name in tests/gpu/emu (kernels on CPU threads).
 */
#ifndef QW_CUDA_SHARED_CUH
#define QW_CUDA_SHARED_CUH

#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "cuda/cuda.h"
#include "kernels/ops.h"
#include "kernels/q8a.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"
}

/* C linkage: the GPU tests (tests/gpu/, plain C) call these functions, and may stand in for backend.cu's. */
extern "C" {

typedef struct qwc qwc;

void qwc_die(const char *file, int line, const char *what, const char *msg);

/* The stream every op runs on, the cuBLAS handle bound to it, and a device scratch buffer that grows to
 * the largest request (qwc_scratch: dequantized weight tiles for the GEMMs); see backend.cu. */
cudaStream_t qwc_stream(const qwc *c);
cublasHandle_t qwc_cublas(const qwc *c);
/* At least `bytes` of device scratch, valid until the next call (grows by reallocating: never inside a
 * captured graph, so the backend reserves the decode step's needs before capturing). Not for the ops of steps that
 * are recorded as graphs (decode steps, drafts): a later growth frees the memory a recorded graph would use. */
void *qwc_scratch(qwc *c, size_t bytes);
/* At least `bytes` of device scratch for an op of a step that may be recorded as a graph (a decode step's split
 * attention), valid until the next call: it grows into a new buffer (not while a graph is recorded: the step's
 * first, unrecorded run grows it) and keeps the ones it outgrew until the backend goes. */
void *qwc_keep_buf(qwc *c, size_t bytes);
/* An op that needs the host mid-way (a download) cannot be recorded: while a graph is being recorded this spoils
 * the recording (graph_end then gives none, and the caller runs the step op by op) and returns 1; else 0. */
int qwc_capture_spoil(qwc *c);
/* 1 when quantized weights meet 8-bit activations (qw_backend_cuda_set_q8_activations; the CPU's default), 0: f32
 * activations (the exact product). */
int qwc_q8_on(const qwc *c);
/* 1 while a graph is being recorded on this backend (or, for a rank, on its root) */
int qwc_recording(const qwc *c);
/* The delta rule takes its chunked form (delta_chunk.cu) for calls of at least this many tokens; 0: never. The
 * backend's start: QWENC_CUDA_DR_CHUNK in the environment, else QWC_DR_CHUNK_MIN; qw_backend_cuda_set_dr_chunk. */
#ifndef QWC_DR_CHUNK_MIN
#define QWC_DR_CHUNK_MIN 64
#endif
int qwc_dr_chunk_min(const qwc *c);
/* The MoE's rows (token, slot pairs) up to which each pair is its own matrix-vector product (moe.cu); more rows are
 * grouped by expert into the tensor-core GEMMs. The backend's start: QWENC_CUDA_PAIRS_MAX in the environment (1 ..
 * QWC_PAIRS_LIMIT), else QWC_PAIRS_MAX. */
#ifndef QWC_PAIRS_MAX
#define QWC_PAIRS_MAX 256
#endif
#define QWC_PAIRS_LIMIT 1024
int qwc_pairs_max(const qwc *c);
/* 1 when the n-gram table stays in host memory (qw_backend_cuda_set_ple_host) */
int qwc_ple_host(const qwc *c);
/* The device address of a pinned, mapped host copy of [host, host + bytes), made once (read over the bus; freed
 * with the backend); the process ends with a message when the host cannot pin that much. */
const void *qwc_host_mapped(qwc *c, const void *host, size_t bytes);
/* The device buffer of the 8-bit activations (*bytes its size: fixed, made with the backend, so recorded graphs
 * keep its address); NULL when there is none. */
void *qwc_q8_buf(qwc *c, size_t *bytes);
/* n (at most 4,096) counters in device memory, zeros between kernels: a kernel whose last block to end finishes
 * the work counts its blocks there and leaves them zero; NULL when n is more or they could not be had */
unsigned *qwc_counts(qwc *c, int n);
/* Products that read the same x in a row (a matmul_batch's jobs, the MoE's gate and up): keep 0 starts a chain
 * (forgets what the buffers hold), keep 1 lets a product of the chain use a buffer's rounding again when an
 * earlier one rounded the same rows into it (qwc_q8_same); qwc_q8_note records what buf (the fixed buffer or the
 * prompt's) holds. */
void qwc_q8_keep(qwc *c, int on);
int qwc_q8_same(const qwc *c, const qw_q8a *buf, const float *x, int64_t ldx, int64_t cols, int64_t n_rows);
void qwc_q8_note(qwc *c, const qw_q8a *buf, const float *x, int64_t ldx, int64_t cols, int64_t n_rows);
/* A prompt's products, whose rows the fixed buffer cannot hold: a device buffer of at least bytes for their 8-bit
 * rows (NULL: none now, as while a graph is recorded), under the same rules as the fixed one */
qw_q8a *qwc_q8_big(qwc *c, size_t bytes);
/* A kernel that writes n floats at y can write their 8-bit rounding too (into qwc_q8_for's buffer: the fixed one,
 * or for more than it holds the prompt's; NULL when not now: the path off, n or the rows its loops walk (row floats
 * each; n for an element-wise kernel) not whole blocks of 32, or no prompt's buffer); qwc_q8_made after its launch
 * says the buffer holds y's rounding until the next launch or copy, and a product that reads y right after takes
 * it (qwc_q8_fresh: that buffer, else NULL) instead of rounding y again. The same bits either way: the kernels
 * round as k_q8a does. */
qw_q8a *qwc_q8_for(qwc *c, int64_t n, int64_t row);
void qwc_q8_made(qwc *c, const float *y, int64_t n);
const qw_q8a *qwc_q8_fresh(const qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows);

/* ---- the routed experts over several GPUs (backend.cu; qw_backend_cuda_split). Rank 0 is the backend the model
 * runs on; each other rank is a backend of its own on its GPU (or the same GPU: the copies' way, for tests), which
 * holds and runs its range of experts. Rank 0's thread drives them all: qwc_set_device before a rank's launches,
 * and back to rank 0's after. The exchanges: NCCL (one communicator a rank, calls grouped), or device copies
 * when ranks share a device. */
#define QWC_MAX_RANKS QW_MAX_GPUS
int qwc_n_rank(const qwc *c); /* 1: not split */
int qwc_split(const qwc *c);  /* 1: split (qw_backend_cuda_split), maybe over one rank */
qwc *qwc_rank(qwc *c, int r);
/* rank r's first expert of E (qwc_rank_lo(c, n_rank, E) = E): rank r runs [lo(r), lo(r + 1)) */
int qwc_rank_lo(const qwc *c, int r, int E);
const qw_backend *qwc_backend(qwc *c);
void qwc_set_device(const qwc *c);
/* At least bytes of the rank's exchange memory (grow-only; never while a graph is recorded) */
void *qwc_ep_buf(qwc *c, size_t bytes);
/* the other ranks' streams wait for rank 0's work so far; rank 0's for theirs */
void qwc_fork(qwc *c);
void qwc_join(qwc *c);
/* buf[r] (rank r's memory, r < qwc_n_rank) receives rank 0's buf[0], and buf2[r] buf2[0] (buf2 NULL: none), after
 * qwc_fork */
void qwc_bcast(qwc *c, void *const *buf, size_t bytes, void *const *buf2, size_t bytes2);
/* buf[0] = the sum over the ranks of buf[r] (n floats); then qwc_join */
void qwc_reduce_sum(qwc *c, float *const *buf, size_t n);

/* ---- quant.cu: weights of every type qwenc reads (F32, F16, BF16 and the 10 block-quantized types of
 * tensor/quant.h), dequantized on the device exactly as tensor/quant.c and quant_k.c do on the host (the same
 * f32 values: each element is the product or sum of the same f32 operands). */

/* y[t][r] = sum_c W[r][c] * x[t][c]; W [rows, cols] on the device (any type), x [n_tok][cols], y [n_tok][rows];
 * f32 products and f32 accumulation. Few tokens: one pass over the weights (memory-bound matrix-vector
 * kernels); many: dequantized tiles and cuBLAS SGEMM. */
void qwc_matmul(qwc *c, float *y, const qw_tensor *w, const float *x, int n_tok);
/* Rows of a matrix (any type) to f32: y[i] = row ids[i]; ids [n] int32 on the device. */
void qwc_get_rows(qwc *c, float *y, const qw_tensor *w, const int32_t *ids, int n);
/* Rows of a table in n_chunks pieces of chunk_rows rows (all of one type and row length dh): y[i] = row
 * rows[i] (int64, on the device, global row numbers); chunk_data [n_chunks] device pointers of the pieces
 * (on the device). */
void qwc_gather_rows(qwc *c, float *y, const void *const *chunk_data, qw_type type, int64_t dh, int n_chunks,
                     int64_t chunk_rows, const int64_t *rows, int64_t n);
/* The MoE's per-pair products without grouping (a decode step: few pairs): for each pair p < n_pairs,
 * y[p][r] = sum_c W_p[r][c] * x[p][c], W_p = mats[p] (a device array of n_pairs device pointers, each matrix
 * [rows, cols] of `type`), x [n_pairs][cols] (x_stride floats apart; 0: every pair reads the same row). */
void qwc_matmul_pairs(qwc *c, float *y, const void *const *mats, qw_type type, int64_t rows, int64_t cols,
                      const float *x, int64_t x_stride, int n_pairs);
/* One token's MoE down products and their combine, one launch: y[i] = the shared expert's output times its gate
 * (pair shared_pair's row, or y[i] where it ran on its own; has_shared 0: none; sg: the gate, its logit when
 * sg_logit, or NULL) + sum over the token's k slots in the order of their expert ids (sel) of wt * pair's row i, the
 * rows those of P pairs' matrices mats[p] (type, [rows][cols]; NULL: zeros) against x [P][cols]. The bits of
 * qwc_matmul_pairs then k_moe_combine. 0 (nothing done) where that kernel does not take them. */
int qwc_pairs_combine(qwc *c, float *y, const void *const *mats, qw_type type, int64_t rows, int64_t cols,
                      const float *x, int P, const int32_t *sel, const float *wt, int k, const float *sg, int sg_logit,
                      int has_shared, int shared_pair);
/* n_tok (<= 8) tokens x [n_tok][cols] through n (<= 4) matrices w[j] on the device of one type and row length, into
 * y[j] [n_tok][rows j]: one launch of the integer path, the bits of their own products. 0 (nothing done) when that
 * path does not take them. */
int qwc_matmul_group(qwc *c, const qw_tensor *w, float *const *y, int n, const float *x, int n_tok);
/* hc_read of one token with its up product (ops.h) in one kernel, on the integer path: a [H] from u [r] (read only),
 * up [C H][r] on the device, xn [C][H], inj [C] (or NULL); xq (or NULL): a's 8-bit rounding. The bits of divide,
 * the up product and hc_read; 0 (nothing done) where those would not take the integer path's one-warp rows. */
int qwc_hc_up_read(qwc *c, float *a, const qw_tensor *up, const float *u, const float *xn, float *inj, int C, int H,
                   qw_q8a *xq);
/* 1 when qwc_matmul of n_tok tokens through weights of `type` and row length cols sums each token as
 * qwc_matmul_pairs sums one pair (the same bits): one token, or the integer path of up to 16 tokens. */
int qwc_matmul_like_pairs(const qwc *c, qw_type type, int64_t cols, int n_tok);

/* ---- mmq.cu: the integer path's products of many tokens on the tensor cores, each output qw_q8a_dot_ref's bits
 * (narrow products cut into column slices: within a bound of them) */

/* 1 when qwc_mmq takes weights of type t and row length cols (the block-quantized types of the integer path) */
int qwc_mmq_takes(qw_type t, int64_t cols);
/* y[t * ldy + r] = qw_q8a_dot_ref(row r of W, the 8-bit row xq + t * xq_tok) for t < n_tok; W [rows, cols] of
 * type t on the device. A narrow product (qwc_mmq_slices > 1: few tiles, long rows) with work (qwc_mmq_work floats)
 * is cut into slices of the columns whose sums are added in order: then within the matrix-vector kernels' bound of
 * qw_q8a_dot_ref, not its bits (work NULL: never cut). */
void qwc_mmq(qwc *c, float *y, int64_t ldy, const uint8_t *w, qw_type t, int64_t rows, int64_t cols,
             const qw_q8a *xq, int64_t xq_tok, int n_tok, float *work);
int qwc_mmq_slices(int64_t rows, int64_t cols, int n_tok);
int64_t qwc_mmq_work(int64_t rows, int64_t cols, int n_tok);
/* y [t * ldy + r] = the sum over s = 0 .. S - 1, in that order, of part [s][t][r], for r < m, t < n_tok */
void qwc_slice_sum(qwc *c, float *y, int64_t ldy, const float *part, int64_t m, int n_tok, int S);
/* tiles [2 (E + 1)] for qwc_mmq_grouped from the group offsets offs [E + 1] (on the device) */
void qwc_mmq_tiles(qwc *c, int32_t *tiles, const int32_t *offs, int E);
/* The same for E matrices tab[e] (device pointers, on the device) at once: rows offs[e] .. offs[e + 1] - 1 of the
 * n_rows rows of xq (cols / 32 blocks apart) and of y meet matrix e. */
void qwc_mmq_grouped(qwc *c, float *y, int64_t ldy, const void *const *tab, qw_type t, int64_t rows, int64_t cols,
                     const qw_q8a *xq, const int32_t *offs, const int32_t *tiles, int E, int n_rows);
/* n_rows rows of x (ldx floats apart, cols a multiple of 32) rounded to 8 bits into xq [n_rows][cols / 32] as
 * qw_q8a_quantize rounds them (quant.cu) */
void qwc_q8a_rows(qwc *c, qw_q8a *xq, const float *x, int64_t ldx, int64_t cols, int64_t n_rows);

/* ---- model_ops.cu: the topk op (ops.h), callable by the GPU tests before the op table takes it */
void qwc_topk(qwc *c, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k, void *work);

/* ---- synth.cu: random weights made on the device (qw_backend_cuda_weights_random) */

/* d [bytes]: bytes [off, off + bytes) of a tensor of `type` with random codes (a hash of seed and the offset), each
 * block's scales set so that a weight's standard deviation is about 0.02 (the plain types: uniform values of that
 * deviation); always finite. d - off is 4-byte aligned and off a whole number of blocks. */
void qwc_fill_random(qwc *c, uint8_t *d, qw_type type, size_t bytes, uint64_t seed, size_t off);

} /* extern "C" */

/* Launches and copies on this thread so far (qwc_q8_made / qwc_q8_fresh: nothing ran between) */
inline thread_local unsigned long long qwc_writes = 0;
#define QWC_WROTE() (++qwc_writes)

/* Lane l of a warp holds element 32 b + l of rows being rounded to 8 bits: block b of them into *o exactly as
 * qw_q8a_quantize makes it (the same f32 operations, correctly rounded). The whole warp calls it. */
__device__ __forceinline__ void qwc_q8a_warp(float v, qw_q8a *o) {
    const int lane = threadIdx.x & 31;
    const float a = fabsf(v);
    float amax = a; /* fmaxf passes over a NaN, as the host's compare does */
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    const bool nan = __any_sync(0xffffffffu, a != a);
    const float d = nan ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.0f);
    const float id = amax != 0.0f && !nan ? __fdiv_rn(127.0f, amax) : 0.0f;
    int q = 0;
    if (id != 0.0f) { /* else 0, as the host's rounding of x * 0 gives (NaN and infinite blocks too) */
        q = (__float_as_int(__fadd_rn(__fmul_rn(v, id), 12582912.0f)) & 0x007fffff) - 0x00400000;
        q = q > 127 ? 127 : q < -127 ? -127 : q;
    }
    int sum = q;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    o->q[lane] = (int8_t)q;
    if (lane == 0) o->d = d, o->s = sum;
}

/* A fused path's switch at run time (to measure what it saves in one binary; the compile-time QWC_* switches are
 * what tests/gpu/fusions.sh compares): 0 when the environment sets `name` to 0, 1 when to anything else, else def;
 * *cache: -1 until read */
static inline int qwc_env_switch(const char *name, int def, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && e[0] ? e[0] != '0' : def;
    }
    return *cache;
}

/* Small kernels read what depends on no kernel (a norm's weights) before their programmatic wait, and ask for the
 * state they will read to be brought into L2 (a prefetch leaves no stale copy: L2 is the device's one coherent
 * level); QWC_EARLY_OPS 0 or QWENC_CUDA_EARLY_OPS=0 in the environment: after the wait, the same results. */
#ifndef QWC_EARLY_OPS
#define QWC_EARLY_OPS 1
#endif
static inline int qwc_early_ops(void) {
    static int on = -1;
    return QWC_EARLY_OPS && qwc_env_switch("QWENC_CUDA_EARLY_OPS", 1, &on);
}

/* A thread's first QWC_EARLY_N elements of a block-strided row w [n] (element threadIdx.x + e blockDim.x in wv[e];
 * zeros past n): what a small kernel reads of its weights before the wait */
#define QWC_EARLY_N 4
__device__ __forceinline__ void qwc_early_row(float (&wv)[QWC_EARLY_N], const float *w, int n) {
#pragma unroll
    for (int e = 0; e < QWC_EARLY_N; e++) {
        const int i = threadIdx.x + e * blockDim.x;
        wv[e] = i < n ? w[i] : 0.0f;
    }
}

#endif
