/*
 * ops_internal.cuh (tests/gpu/emu) - the part of CUDA that src/cuda/delta_chunk.cu's kernels use, on CPU threads,
 * so that their indexing and math are checked by `make test` where no GPU is lent. t_cuda_emu.cc includes the .cu
 * file with this directory first on the include path, so its `#include "cuda/ops_internal.cuh"` finds this file
 * instead of the backend's.
 *
 * A launch runs the grid's blocks one after another; a block's threads are std::threads, __syncthreads a barrier
 * over them, shared memory one buffer (`extern __shared__` arrays: the kernels here keep theirs there), f32
 * arithmetic the host's with no contraction (-ffp-contract=off; __fmaf_rn is fmaf), __ldg a plain load. Warp
 * shuffles, atomics and the other intrinsics are not here: a kernel that uses them does not build against it.
 * Not a GPU test (tests/gpu_check.sh runs the kernels themselves): a check of the kernels' logic.
 */
#ifndef QW_CUDA_EMU_CUH
#define QW_CUDA_EMU_CUH

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "qwenc.h"

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
#define __shared__ /* only `extern __shared__` arrays: the one buffer below */
#define QWC_PDL_ENTRY() ((void)0)
#define QWC_CHECK(x) ((void)(x))
#define QWC_LAUNCHED() ((void)0)

#define EMU_SMEM_FLOATS (1 << 16)
extern float sm[EMU_SMEM_FLOATS]; /* a block's shared memory (the kernels name theirs sm) */
extern thread_local dim3 threadIdx;
extern dim3 blockIdx, blockDim, gridDim;
extern std::barrier<> *emu_barrier;
extern int emu_launches;

inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
template <class T> inline T __ldg(const T *p) { return *p; }
using std::max;
using std::min;

/* the backend as the kernels' launchers see it: a stream, the chunked rule's setting, a scratch that grows */
typedef int cudaStream_t;
struct qwc {
    int dr_chunk, recording;
    size_t scratch_bytes;
    float *scratch;
};
static inline int qwc_dr_chunk_min(const qwc *c) { return c->dr_chunk; }
static inline int qwc_recording(const qwc *c) { return c->recording; }
static inline cudaStream_t qwc_stream(const qwc *) { return 0; }
/* grows as the backend's does; new bytes are NaN, as a reused device buffer holds what it held */
static inline void *qwc_scratch(qwc *c, size_t bytes) {
    if (bytes > c->scratch_bytes) {
        free(c->scratch);
        c->scratch = (float *)malloc(bytes);
        if (!c->scratch) abort();
        c->scratch_bytes = bytes;
        for (size_t i = 0; i < bytes / sizeof(float); i++) c->scratch[i] = NAN;
    }
    return c->scratch;
}
enum { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <class F> inline int cudaFuncSetAttribute(F, int, int) { return 0; }

template <class... P, class... A>
void qwc_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t, A &&...args) {
    if (smem > sizeof(float) * EMU_SMEM_FLOATS) {
        fprintf(stderr, "emu: %zu bytes of shared memory asked\n", smem);
        abort();
    }
    emu_launches++;
    gridDim = grid, blockDim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                std::fill(sm, sm + smem / sizeof(float), NAN); /* what the block before left */
                blockIdx = dim3(bx, by, bz);
                std::barrier<> bar((std::ptrdiff_t)block.x);
                emu_barrier = &bar;
                std::vector<std::thread> th;
                for (unsigned t = 0; t < block.x; t++)
                    th.emplace_back([&, t] {
                        threadIdx = dim3(t, 0, 0);
                        kernel(args...);
                    });
                for (auto &x : th) x.join();
            }
}

#endif
