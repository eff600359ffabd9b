/*
 * ops_internal.cuh - the op table of the CUDA backend and what its op files share: the weights' device copies,
 * launch helpers, and the device forms of the reference's scalar functions (e^x of kernels/expd.h, so sigmoid
 * and silu give the CPU's bits).
 */
#ifndef QW_CUDA_OPS_INTERNAL_CUH
#define QW_CUDA_OPS_INTERNAL_CUH

#include "cuda/cuda_internal.cuh"
#include "cuda/reduce.cuh"

extern "C" {
#include "kernels/expd.h"
}

/* The table of ops (memory and graph functions are filled in by backend.cu). */
qw_backend qwc_op_table(void);
/* The device copy of `bytes` of weights at host address `host` (uploaded on first use; NULL for NULL). */
const void *qwc_weight(qwc *c, const void *host, size_t bytes);
/* A table of device pointers made on the host, kept under another key (the host array it was made from), and the
 * lookup alone: NULL when not there yet, or when what is kept under key is a weight's bytes (an address the host
 * freed and handed out again is never read as pointers). */
const void *qwc_table(qwc *c, const void *key, const void *contents, size_t bytes);
const void *qwc_table_lookup(qwc *c, const void *key, size_t bytes);
/* The most QSA blocks a query may see in this backend's sessions (qsa_select_work reserves their shared memory):
 * 1 when that grew. */
int qwc_qsa_reserve(qwc *c, int blocks);
int qwc_qsa_max_blocks(const qwc *c);
/* A weight tensor's view with its data on the device. */
qw_tensor qwc_tensor(qwc *c, const qw_tensor *t);
/* The backend an op runs on: be's own, or with the layers split over GPUs (qw_backend_cuda_split_layers) the rank
 * of the layer the ops belong to now (ops.h's layer), its device made current. */
qwc *qwc_of(const qw_backend *be);
static inline const float *qwc_wf(qwc *c, const float *host, int64_t n) {
    return (const float *)qwc_weight(c, host, (size_t)n * sizeof(float));
}

/* blocks of `threads` covering n items */
static inline unsigned qwc_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* the threads of a norm's block for rows of dim (k_rms_norm and the kernels that give its bits) */
static inline int qwc_norm_threads(int dim) { return dim >= 1024 ? 1024 : dim >= 256 ? 256 : 64; }

/* e^x as kernels/expd.h computes it: the same function, so the same f32 result */
#define qwc_expd qw_expd

/* sigmoid(x) and silu(x) as the reference forms them (ref.c's, with expd.h's e^x): every kernel that applies one */
__device__ __forceinline__ float qwc_sigmoid(float x) { return 1.0f / (1.0f + qwc_expd(-x)); }
__device__ __forceinline__ float qwc_silu(float x) { return x / (1.0f + qwc_expd(-x)); }
/* act_mul's activation (QW_ACT_SILU or QW_ACT_SIGMOID) */
__device__ __forceinline__ float qwc_act(float x, int act) {
    return act == QW_ACT_SILU ? x / (1.0f + qwc_expd(-x)) : 1.0f / (1.0f + qwc_expd(-x));
}

/* The combine of token t's routed outputs (k_moe_combine's and the fused down product's, qwc_pairs_combine): its k
 * slots ordered by expert id (one token's ids are distinct) into rows (each slot's output row: rowpos[p], or p) and
 * w (its weight). The whole block calls it (two barriers); ids, pos and wk: k slots of scratch. */
__device__ __forceinline__ void qwc_combine_slots(const int32_t *sel, const int32_t *rowpos, const float *wt, int t,
                                                  int k, int *rows, float *w, int *ids, int *pos, float *wk) {
    if (threadIdx.x < k) { /* the token's slots read at once, then ordered from shared memory */
        const int p = t * k + threadIdx.x;
        ids[threadIdx.x] = sel[p];
        pos[threadIdx.x] = rowpos ? rowpos[p] : p;
        wk[threadIdx.x] = wt[p];
    }
    __syncthreads();
    if (threadIdx.x < k) { /* slot j goes to its rank by expert id */
        const int j = threadIdx.x;
        int n = 0;
        for (int m = 0; m < k; m++) n += ids[m] < ids[j];
        rows[n] = pos[j];
        w[n] = wk[j];
    }
    __syncthreads();
}

/* what a combined value starts from: the shared expert's output s times its gate (sg[t]: the gate's logit when
 * sg_logit), s when it has no gate, 0 without a shared expert; the routed outputs times their weights are then
 * added in the slots' order */
__device__ __forceinline__ float qwc_combine_start(float s, const float *sg, int t, int sg_logit, int has_shared) {
    float gt = sg ? sg[t] : 1.0f;
    if (sg && sg_logit) gt = qwc_sigmoid(gt);
    return has_shared ? (sg ? s * gt : s) : 0.0f;
}

/* delta_chunk.cu: ops.h's delta_rule over a call's tokens in the chunked form, launched on c's stream: 1; 0 (nothing
 * launched) when the call is not one it takes (fewer tokens than qwc_dr_chunk_min or than a step recorded as a graph
 * may have, dk other than 32, 64 or 128, q or k not 16-byte aligned) */
int qwc_delta_chunk(qwc *c, float *o, float *state, const float *q, const float *k, const float *v, const float *g,
                    const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled);

/* ---- entry points of the op files (ops.cu, attn.cu, moe.cu, model_ops.cu) */
void qwc_ops_fill(qw_backend *t);
void qwc_attn_fill(qw_backend *t);
void qwc_moe_fill(qw_backend *t);
void qwc_model_ops_fill(qw_backend *t);

#endif
