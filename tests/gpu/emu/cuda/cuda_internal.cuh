/*
 * cuda_internal.cuh (tests/gpu/emu) - the CUDA runtime as the CUDA backend's kernel files (src/cuda/) use it,
 * on CPU threads, so that `make test` checks those kernels' indexing and math where no GPU is lent. Found by the
 * kernel files' `#include "cuda/cuda_internal.cuh"` (directly or through src/cuda/ops_internal.cuh) because this
 * directory comes first on t_cuda_emu's include path; everything past the runtime is the backend's own
 * src/cuda/shared.cuh and ops_internal.cuh. The Makefile copies each kernel file with `extern __shared__` made plain
 * `extern` (the dynamic shared memory: a buffer of the test's under the same name), and backend.cc beside this
 * directory stands in for src/cuda/backend.cu (host memory, no graphs).
 *
 * A launch runs the grid's blocks one after another; a block's threads are coroutines (ucontext) of one host
 * thread, each running until it reaches a barrier or returns: __syncthreads waits for every thread of the block that
 * has not returned, __syncwarp for those of its warp (an exited GPU thread waits for no one either), and a block
 * whose threads all wait at barriers that cannot open (some at the block's, some at a warp's) is reported as a
 * deadlock. __shared__ arrays are static (one per kernel, shared by the block's threads); warp shuffles and votes go
 * through a slot a lane between two warp barriers, so every lane of the warp must take part (as the 0xffffffff
 * masks say); f32 arithmetic is the host's with no contraction (-ffp-contract=off; __fmaf_rn is fma), the libm
 * functions the host's; __ldg a plain load. The backend's memory is host memory and its weights the host arrays.
 * Not a GPU test (tests/gpu_check.sh runs the kernels themselves): a check of the kernels' logic.
 */
#ifndef QW_CUDA_EMU_INTERNAL_CUH
#define QW_CUDA_EMU_INTERNAL_CUH

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include <ucontext.h>

extern "C" {
#include "tensor/tensor.h"
}

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

/* the dynamic shared memory of the kernels (each names its own), large enough for any of them */
#define EMU_SMEM_FLOATS (1 << 16)
extern float sm[EMU_SMEM_FLOATS], kb[EMU_SMEM_FLOATS], score[EMU_SMEM_FLOATS], nh[EMU_SMEM_FLOATS],
    qk[EMU_SMEM_FLOATS], rp[EMU_SMEM_FLOATS];
extern unsigned char taken[4 * EMU_SMEM_FLOATS];
namespace { /* quant.cu's, which it names inside its anonymous namespace */
alignas(16) unsigned char mv_stage[4 * EMU_SMEM_FLOATS], stage[4 * EMU_SMEM_FLOATS];
} // namespace

extern dim3 threadIdx, blockIdx, blockDim, gridDim;
extern uint64_t emu_slot[32][32];
extern int emu_launches;

/* a thread's cp.async copies not yet landed (mma.cuh), and the groups it has committed; cleared for each block */
struct emu_cp {
    void *dst;
    unsigned char b[16];
    int n;
    unsigned group;
};
inline std::vector<emu_cp> emu_cps[1024];
inline unsigned emu_cp_groups[1024];

/* the coroutines of a block (emu_run), and where a thread waits */
enum { EMU_READY, EMU_AT_BLOCK, EMU_AT_WARP, EMU_DONE };
void emu_wait(int where); /* the calling thread waits at the block's (EMU_AT_BLOCK) or its warp's barrier */
void emu_run(unsigned n_threads, const std::function<void()> &body);

inline void __syncthreads() { emu_wait(EMU_AT_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_wait(EMU_AT_WARP); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    emu_slot[w][l] = b;
    __syncwarp();
    T r;
    memcpy(&r, &emu_slot[w][l ^ m], sizeof(T));
    __syncwarp();
    return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_slot[w][l] = p != 0;
    __syncwarp();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)emu_slot[w][i] << i;
    __syncwarp();
    return r;
}
/* the warp's integer reductions (redux.sync): every lane gets the maximum or minimum of the lanes' values */
template <class T, class F> inline T emu_reduce(T v, F pick) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_slot[w][l] = (uint64_t)(uint32_t)v;
    __syncwarp();
    T r = (T)(uint32_t)emu_slot[w][0];
    for (int i = 1; i < 32; i++) r = pick(r, (T)(uint32_t)emu_slot[w][i]);
    __syncwarp();
    return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    return emu_reduce(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    return emu_reduce(v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}
inline int __reduce_max_sync(unsigned, int v) {
    return emu_reduce(v, [](int a, int b) { return a > b ? a : b; });
}
inline int __reduce_min_sync(unsigned, int v) {
    return emu_reduce(v, [](int a, int b) { return a < b ? a : b; });
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* one rounding each, as the host's f32 arithmetic without contraction */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __int2float_rn(int i) { return (float)i; }
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
/* blocks run one after another: a device-wide fence orders nothing more, an atomic is a plain update */
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned o = *p;
    *p = o + v;
    return o;
}
using std::max;
using std::min;

inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
struct alignas(8) uint2 {
    unsigned x, y;
};
inline int __syncthreads_count(int p) {
    const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_slot[w][l] = p != 0;
    __syncthreads();
    int n = 0;
    for (unsigned i = 0; i < blockDim.x; i++) n += (int)emu_slot[i >> 5][i & 31];
    __syncthreads();
    return n;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    emu_slot[w][l] = b;
    __syncwarp();
    T r;
    memcpy(&r, &emu_slot[w][src & 31], sizeof(T));
    __syncwarp();
    return r;
}
struct __half {
    unsigned short x;
};
inline float __half2float(__half h) { return qw_f16_to_f32(h.x); }

typedef int cudaStream_t;
typedef void *cublasHandle_t;
/* cuBLAS as quant.cu calls it (backend.cc: f32 sums in k order on the host) */
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUDA_R_32F, CUDA_R_16BF } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC } cublasComputeType_t;
enum { CUBLAS_GEMM_DEFAULT };
enum { CUBLAS_DEFAULT_MATH, CUBLAS_PEDANTIC_MATH };
inline const char *cublasGetStatusString(cublasStatus_t) { return "emulated"; }
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, int) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t, int);
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                   cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t ctype, int algo) {
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                      ctype, algo);
}
inline int cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    memset(p, v, n);
    return 0;
}
#define QWC_CHECK(x) ((void)(x))
#define QWC_LAUNCHED() ((void)0)
#define QWC_PDL_ENTRY() ((void)0)
#define QWC_PREFETCH_L2(p) ((void)(p))

#include "cuda/shared.cuh"
#include "cuda/q8_state.cuh"

/* the backend as the op files see it (backend.cc): the op table first, as the backend's own (the table handed out is
 * a pointer to it), then the settings the op files read, a scratch that grows, the counters */
struct qwc {
    qw_backend be;
    int dr_chunk, recording, qsa_blocks, q8, pairs_max;
    qwc_q8_state q8s; /* the 8-bit activations' buffers (host memory), under backend.cu's rules */
    void *tables; /* the pointer tables (backend.cc) */
    size_t scratch_bytes;
    float *scratch;
    unsigned counts[4096]; /* zeros between kernels, as the backend's */
};

enum { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <class F> inline int cudaFuncSetAttribute(F, int, int) { return 0; }

/* QWC_EMU_TRACE=1 in the environment: each launch's kernel (as the call names it), grid, block and shared memory on
 * stderr, one line a launch (emu_trace: the text of the launch's arguments, cut at its first comma outside <>) */
void emu_trace(const char *args, dim3 grid, dim3 block, size_t smem);

template <class... P, class... A>
void qwc_launch_named(const char *args, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                      A &&...args_) {
    if (smem > sizeof(float) * EMU_SMEM_FLOATS || block.x < 1 || block.x > 1024) {
        fprintf(stderr, "emu: a launch of %u threads and %zu bytes of shared memory\n", block.x, smem);
        abort();
    }
    emu_launches++;
    emu_trace(args, grid, block, smem);
    gridDim = grid, blockDim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                for (void *b : {(void *)sm, (void *)kb, (void *)score, (void *)nh, (void *)qk, (void *)rp,
                                (void *)mv_stage, (void *)stage, (void *)taken}) /* a block before's: NaN */
                    memset(b, 0xff, smem);
                blockIdx = dim3(bx, by, bz);
                for (unsigned t = 0; t < block.x; t++) emu_cps[t].clear(), emu_cp_groups[t] = 0;
                emu_run(block.x, [&] { kernel(args_...); });
            }
}
#define qwc_launch(...) qwc_launch_named(#__VA_ARGS__, __VA_ARGS__)

#endif
