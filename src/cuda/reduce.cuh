/*
 * reduce.cuh - sums over a warp and over a block, which the op files share (through ops_internal.cuh). Nothing but
 * CUDA's built-in functions, so that tests/gpu/emu can build the kernels that use them on the CPU.
 */
#ifndef QW_CUDA_REDUCE_CUH
#define QW_CUDA_REDUCE_CUH

/* sum of v over the warp, every lane gets it */
template <typename T> __device__ __forceinline__ T qwc_warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. sh: 32 slots. */
template <typename T> __device__ __forceinline__ T qwc_block_sum(T v, T *sh) {
    v = qwc_warp_sum(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : (T)0;
    v = qwc_warp_sum(v);
    return v;
}

#endif
