// launch_floor.cu - what a chain of dependent kernels costs on this GPU, whatever they compute: 1,000 launches
// recorded in one CUDA graph, each waiting for the one before (griddepcontrol.wait, as every qwenc kernel opens)
// and reading what it wrote, replayed 10 times; with and without programmatic dependent launch, grids of 1 to
// 1,320 blocks of 256 threads, each block reading 1 or 2,560 floats after its wait. A decode token of the whole
// Flash-Next is about 1,100 such kernels, so this times that many launches is a floor under its time that no
// kernel's speed lowers (docs/BENCH.md). Then the same chain inside one persistent kernel (one block per SM, or
// four, launched cooperatively so all are resident): each step ends at a grid-wide barrier (a counter and a
// generation word in global memory) instead of a kernel's end, the cost a decode step built as one persistent
// kernel would pay per dependent op instead of a launch. Not a test:
//
//   nvcc -std=c++17 -arch=sm_90a -O3 -o /tmp/launch_floor tests/gpu/launch_floor.cu && /tmp/launch_floor
#include <cstdio>
#include <cuda_runtime.h>

#include "pdl_launch.cuh"

__global__ void k_link(float *buf, int i, int nread) {
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
    float v = 0;
    for (int j = threadIdx.x; j < nread; j += blockDim.x) v += buf[(size_t)(i & 1) * (1 << 20) + j];
    if (threadIdx.x == 0) buf[(size_t)((i + 1) & 1) * (1 << 20) + blockIdx.x] = v + 1;
}

/* all blocks of the grid meet here (the grid resident: a cooperative launch); count and gen start at 0 */
__device__ void grid_barrier(unsigned *count, volatile unsigned *gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(count, 1) == gridDim.x - 1) {
            *count = 0;
            __threadfence();
            atomicAdd((unsigned *)gen, 1);
        } else {
            while (*gen == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

/* the same with acquire/release atomics in place of the fences */
__device__ void grid_barrier_ar(unsigned *count, unsigned *gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g, old, v;
        asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
        if (old == gridDim.x - 1) {
            asm volatile("st.relaxed.gpu.u32 [%0], 0;" ::"l"(count) : "memory");
            asm volatile("red.release.gpu.add.u32 [%0], 1;" ::"l"(gen) : "memory");
        } else {
            do
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(gen) : "memory");
            while (v == g);
        }
    }
    __syncthreads();
}

template <int AR> __global__ void k_persist(float *buf, int n, int nread, unsigned *bar) {
    for (int i = 0; i < n; i++) {
        float v = 0;
        const volatile float *in = buf + (size_t)(i & 1) * (1 << 20); /* past L1: the other blocks wrote it */
        for (int j = threadIdx.x; j < nread; j += blockDim.x) v += in[j];
        if (threadIdx.x == 0) buf[(size_t)((i + 1) & 1) * (1 << 20) + blockIdx.x] = v + 1;
        if (AR)
            grid_barrier_ar(bar, bar + 1);
        else
            grid_barrier(bar, bar + 1);
    }
}

int main() {
    float *buf;
    if (cudaMalloc(&buf, 2 << 22) != cudaSuccess) {
        fprintf(stderr, "launch_floor: no CUDA device memory\n");
        return 1;
    }
    cudaMemset(buf, 0, 2 << 22);
    cudaStream_t st;
    cudaStreamCreate(&st);
    const int grids[] = {1, 132, 528, 1320}, reads[] = {1, 2560}, N = 1000, REPS = 10;
    for (int pdl = 0; pdl < 2; pdl++)
        for (int grid : grids)
            for (int nread : reads) {
                cudaGraph_t g;
                cudaGraphExec_t ge;
                cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
                for (int i = 0; i < N; i++) pdl_launch(pdl, grid, 256, st, k_link, buf, i, nread);
                cudaStreamEndCapture(st, &g);
                cudaGraphInstantiate(&ge, g, 0);
                cudaGraphLaunch(ge, st);
                cudaStreamSynchronize(st);
                cudaEvent_t a, b;
                cudaEventCreate(&a), cudaEventCreate(&b);
                cudaEventRecord(a, st);
                for (int r = 0; r < REPS; r++) cudaGraphLaunch(ge, st);
                cudaEventRecord(b, st);
                cudaEventSynchronize(b);
                float ms = 0;
                cudaEventElapsedTime(&ms, a, b);
                const cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) {
                    fprintf(stderr, "launch_floor: %s\n", cudaGetErrorString(e));
                    return 1;
                }
                printf("programmatic %d, %4d blocks, %4d floats a block: %.2f us a kernel\n", pdl, grid, nread,
                       ms * 1000.0 / ((double)REPS * N));
                cudaEventDestroy(a), cudaEventDestroy(b);
                cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
            }
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    unsigned *bar;
    cudaMalloc(&bar, 2 * sizeof(unsigned));
    for (int v = 0; v < 8; v++) { /* barrier kind x blocks an SM x floats read */
        const int ar = v >> 2, per_sm = v & 2 ? 4 : 1;
        int nread = reads[v & 1];
        int n = N * REPS;
        cudaMemset(bar, 0, 2 * sizeof(unsigned));
        void *args[] = {&buf, &n, &nread, &bar};
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        cudaEventRecord(a, st);
        void *k = ar ? (void *)k_persist<1> : (void *)k_persist<0>;
        const cudaError_t le = cudaLaunchCooperativeKernel(k, sms * per_sm, 256, args, 0, st);
        cudaEventRecord(b, st);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        const cudaError_t e = le != cudaSuccess ? le : cudaGetLastError();
        if (e != cudaSuccess) {
            fprintf(stderr, "launch_floor: persistent kernel: %s\n", cudaGetErrorString(e));
            return 1;
        }
        printf("persistent (%s), %4d blocks, %4d floats a block: %.2f us a step\n",
               ar ? "acquire/release" : "fences", sms * per_sm, nread, ms * 1000.0 / n);
        cudaEventDestroy(a), cudaEventDestroy(b);
    }
    return 0;
}
