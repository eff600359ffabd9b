/*
 * cuda_internal.cuh - what the CUDA backend's files share: the CUDA runtime's headers, error checking, the launch
 * helper, and (shared.cuh) the backend's functions and the device helpers. Only src/cuda/ includes it; the rest of
 * the library sees src/cuda/cuda.h. tests/gpu/emu has its own header of this name, which runs the kernels on CPU
 * threads with the same shared.cuh.
 *
 * Conventions: every kernel runs on the backend's one stream (qwc->stream), so ops are ordered and a decode
 * step can be captured as a CUDA graph; no function here synchronises except where it says so. Device
 * pointers are plain pointers. Weight tensors reach these functions as qw_tensor views whose data is a device
 * pointer (the backend uploads each weight once, qwc_weight); activations are f32 row-major [rows][cols].
 */
#ifndef QW_CUDA_INTERNAL_CUH
#define QW_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* Abort with file:line and the CUDA error: a failed kernel launch or copy is a broken invariant (the sizes
 * were checked before); out-of-memory is reported by the allocation functions instead. */
#define QWC_CHECK(x)                                                                                              \
    do {                                                                                                          \
        cudaError_t e_ = (x);                                                                                     \
        if (e_ != cudaSuccess) qwc_die(__FILE__, __LINE__, #x, cudaGetErrorString(e_));                          \
    } while (0)
#define QWC_LAUNCHED() QWC_CHECK(cudaGetLastError())

/*
 * Programmatic dependent launch (sm_90 and later): every kernel is launched with qwc_launch and opens with
 * QWC_PDL_ENTRY(), so the next kernel of the stream (or of a recorded graph) is set up on the device while this
 * one runs and only its first instruction waits: griddepcontrol.wait returns once the kernel before has finished
 * and its writes are visible, which is the order a plain launch gives; after it the kernel lets the next one be
 * scheduled (launch_dependents), so no more than one kernel waits ahead. Nothing a kernel writes is read, and
 * nothing is written, before the wait (weights may be read and state asked into L2: qwc_early_ops), so results are
 * those of plain launches. QWENC_CUDA_PDL=0 in the environment launches plainly
 * (qwc_pdl_on; to measure what it saves).
 */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QWC_PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define QWC_PDL_ENTRY() ((void)0)
#endif

/* Ask for the 128 bytes at p (global memory) to be brought into L2; no effect on results. */
#define QWC_PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))

#include "cuda/shared.cuh"

static inline int qwc_pdl_on(void) {
    static int on = -1; /* the environment read once (per file: the same answer) */
    return qwc_env_switch("QWENC_CUDA_PDL", 1, &on);
}
template <class... P, class... A>
void qwc_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = &at, cfg.numAttrs = qwc_pdl_on() ? 1 : 0;
    QWC_WROTE();
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...); /* errors: QWC_LAUNCHED after it */
}

#endif
