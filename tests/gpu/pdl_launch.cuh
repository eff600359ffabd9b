// pdl_launch.cuh - the launch the GPU microbenchmarks (launch_floor.cu, l2_ahead.cu) time: a kernel on stream st,
// with programmatic dependent launch when pdl (as qwenc's qwc_launch makes every launch), plainly otherwise.
#ifndef QW_GPU_PDL_LAUNCH_CUH
#define QW_GPU_PDL_LAUNCH_CUH
#include <cuda_runtime.h>

template <class... P, class... A>
cudaError_t pdl_launch(int pdl, dim3 grid, dim3 block, cudaStream_t st, void (*kernel)(P...), A... args) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.stream = st, cfg.attrs = &at, cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
#endif
