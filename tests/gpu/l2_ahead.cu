// l2_ahead.cu - whether a decode step's weights could come from L2 instead of HBM: a chain of dependent kernels,
// each reading one matrix of S bytes (the shape of a token's matrix-vector products: a grid of 528 blocks, each
// asking for its slice in L2 before its programmatic wait, as mvq_kernel does, then reading it), recorded in one
// CUDA graph and replayed; the matrices together far larger than L2, so each replay reads them from HBM; with 0 or
// 2 small kernels (a norm's shape, HBM idle through them) between two matrices. Then the same chain with a second
// branch of the graph beside it: a small persistent kernel that asks for the next matrices' lines in L2
// (prefetch.global.L2) as the chain reaches them, keeping AHEAD bytes in front of the kernel running (each chain
// kernel's first thread publishes its index); and the chain alone with each kernel's blocks also asking for their
// slices of the next AHEAD bytes of matrices (what a recorded step could do knowing its matrices' order). What this
// measures: the chain's time a matrix and the rate it reads it at, for matrices of 1 to 16 MB and two distances.
// On an H200 both ways of asking ahead were slower in every case (docs/BENCH.md), so decode does not ask ahead. Not a
// test:
//
//   nvcc -std=c++17 -arch=sm_90a -O3 -o /tmp/l2_ahead tests/gpu/l2_ahead.cu && /tmp/l2_ahead
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "pdl_launch.cuh"

constexpr int THREADS = 256, GRID = 528;

/* chain kernel i: block b's slice of matrix m (bytes, 16-byte aligned), asked for before the wait, read after it */
/* (nnext > 0: the block also asks for its slices of the nnext matrices after this one, m + words, ..) */
__global__ void k_read(const uint4 *m, size_t words, float *buf, int i, int early, int nnext, unsigned *progress) {
    const size_t per = (words + gridDim.x - 1) / gridDim.x, w0 = per * blockIdx.x;
    const size_t w1 = w0 + per < words ? w0 + per : words;
    if (early)
        for (int n = 0; n <= nnext; n++)
            for (size_t w = w0 + 8 * threadIdx.x; w < w1; w += 8 * THREADS) /* a 128-byte line a thread */
                asm volatile("prefetch.global.L2 [%0];" ::"l"(m + n * words + w));
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
    if (blockIdx.x == 0 && threadIdx.x == 0)
        asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(progress), "r"(i) : "memory");
    float v = buf[(i & 1) * GRID + (blockIdx.x & 127)];
    uint32_t s = 0;
    for (size_t w = w0 + threadIdx.x; w < w1; w += THREADS) {
        const uint4 q = __ldg(m + w);
        s += q.x ^ q.y ^ q.z ^ q.w;
    }
    s += __shfl_xor_sync(0xffffffffu, s, 16) + __shfl_xor_sync(0xffffffffu, s, 8);
    if (threadIdx.x == 0) buf[((i + 1) & 1) * GRID + blockIdx.x] = v + (float)(s & 1);
}

/* a small kernel of the chain between two matrices (a norm's shape: 8 blocks reading 2,560 floats after the wait) */
__global__ void k_small(float *buf, int i) {
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
    float v = 0;
    for (int j = threadIdx.x; j < 2560; j += blockDim.x) v += buf[(i & 1) * GRID + (j & 511)];
    if (threadIdx.x == 0) buf[((i + 1) & 1) * GRID + blockIdx.x] = v;
}

/* the branch beside the chain: block b asks for lines b, b + gridDim.x, .. of matrix j once the chain has reached
 * matrix j - ahead (its kernels' index in *progress; n_per matrices a replay of the chain) */
__global__ void k_ahead(const uint4 *base, size_t words, int n, int ahead, const unsigned *progress) {
    __shared__ int gave_up; /* the chain did not move for a long while (not running beside this): stop */
    if (threadIdx.x == 0) gave_up = 0;
    for (int j = 0; j < n; j++) {
        if (threadIdx.x == 0) {
            unsigned p;
            long spins = 0;
            do
                asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(p) : "l"(progress) : "memory");
            while ((int)p < j - ahead && ++spins < (1L << 20));
            gave_up = spins >= (1L << 20);
        }
        __syncthreads();
        if (gave_up) return;
        const uint4 *m = base + (size_t)j * words;
        const size_t step = 8 * (size_t)gridDim.x * THREADS;
        for (size_t w = 8 * ((size_t)blockIdx.x * THREADS + threadIdx.x); w < words; w += step)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(m + w));
        __syncthreads(); /* gave_up read by all before thread 0 writes it again */
    }
}

int main() {
    const size_t TOTAL = (size_t)3 << 29; /* the chain's matrices: 1.5 GiB, far past L2 */
    uint4 *mats;
    float *buf;
    unsigned *progress;
    if (cudaMalloc(&mats, TOTAL) != cudaSuccess || cudaMalloc(&buf, 2 * GRID * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&progress, sizeof(unsigned)) != cudaSuccess) {
        fprintf(stderr, "l2_ahead: no CUDA device memory\n");
        return 1;
    }
    cudaMemset(mats, 1, TOTAL);
    cudaMemset(buf, 0, 2 * GRID * sizeof(float));
    int l2 = 0;
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
    printf("L2 %d MiB\n", l2 >> 20);
    cudaStream_t st, st2;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking);
    cudaEvent_t fork, join, a, b;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    cudaEventCreate(&a), cudaEventCreate(&b);
    const size_t sizes[] = {1 << 20, 4 << 20, 16 << 20};
    const int aheads_mb[] = {0, 8, 32}; /* 0: none */
    const int REPS = 3;
    for (int gap = 0; gap <= 2; gap += 2) /* small kernels between two matrices (HBM idle through them) */
    for (size_t S : sizes)
        for (int mode = 0; mode < 3; mode++) /* plain; each block its own slice early; and with the branch or the next
                                               * matrices' slices too */
            for (int amb : aheads_mb) {
                const int early = mode > 0, branch = mode == 1 && amb, nmb = mode == 2 ? amb : 0;
                if ((mode == 0 && amb) || (mode == 2 && !amb)) continue;
                const int n = (int)(TOTAL / S) - 32, ahead = amb ? (int)(((size_t)amb << 20) / S) : 0;
                if (amb && ahead < 1) continue;
                const int nnext = nmb ? ahead : 0; /* (32 matrices past the chain's last are there to be asked for) */
                const size_t words = S / 16;
                cudaGraph_t g;
                cudaGraphExec_t ge;
                cudaMemset(progress, 0, sizeof(unsigned));
                cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
                if (branch) {
                    cudaEventRecord(fork, st);
                    cudaStreamWaitEvent(st2, fork, 0);
                    k_ahead<<<8, THREADS, 0, st2>>>(mats, words, n, ahead, progress);
                    cudaEventRecord(join, st2);
                }
                for (int i = 0; i < n; i++) {
                    pdl_launch(1, GRID, THREADS, st, k_read, (const uint4 *)(mats + (size_t)i * words), words, buf, i,
                               early, nnext, progress);
                    for (int k = 0; k < gap; k++) pdl_launch(1, 8, THREADS, st, k_small, buf, i + 1 + k);
                }
                if (branch) cudaStreamWaitEvent(st, join, 0);
                cudaStreamEndCapture(st, &g);
                if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
                    fprintf(stderr, "l2_ahead: graph: %s\n", cudaGetErrorString(cudaGetLastError()));
                    return 1;
                }
                cudaGraphLaunch(ge, st); /* warm */
                cudaStreamSynchronize(st);
                float best = 1e30f;
                for (int r = 0; r < REPS; r++) {
                    cudaMemsetAsync(progress, 0, sizeof(unsigned), st);
                    cudaEventRecord(a, st);
                    cudaGraphLaunch(ge, st);
                    cudaEventRecord(b, st);
                    cudaEventSynchronize(b);
                    float ms = 0;
                    cudaEventElapsedTime(&ms, a, b);
                    best = ms < best ? ms : best;
                }
                const cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) {
                    fprintf(stderr, "l2_ahead: %s\n", cudaGetErrorString(e));
                    return 1;
                }
                const double us = best * 1000.0 / n;
                printf("%d small kernels between, matrix %5.1f MiB, %-22s %2d MiB ahead: %7.2f us a matrix, %.2f "
                       "TB/s\n", gap, S / 1048576.0,
                       mode == 0 ? "plain," : mode == 1 ? (amb ? "early, a branch" : "early,") : "early, next matrices",
                       amb, us, S / us * 1e-6);
                cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
            }
    return 0;
}
