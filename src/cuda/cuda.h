/*
 * cuda.h - the CUDA backend as the rest of the library sees it (kernels/ops.h's interface on an NVIDIA GPU).
 * Built by `make cuda` (the .cu files of src/cuda); other builds link src/cuda/none.c, whose functions say that the
 * backend is not built in.
 */
#ifndef QW_CUDA_H
#define QW_CUDA_H

#include <stddef.h>

#include "kernels/ops.h"
#include "qwenc.h"

/* 1 when the backend is built in and a CUDA device can be used; desc receives its name and memory (or why
 * not). */
int qw_cuda_available(char *desc, size_t n);
/* The backend on CUDA device `device`. Weights are uploaded to the device the first time an op reads them
 * (and kept); activations and state live in device memory. */
qwenc_status qw_backend_cuda_new(int device, qw_backend **out, char *err, size_t errlen);
/* The device memory's read bandwidth in bytes/s: a kernel reading a 2 GiB buffer, the best of 5 passes (0 when
 * not a CUDA backend or out of memory). */
double qw_backend_cuda_read_bandwidth(const qw_backend *be);
/* Free device memory in bytes, and the total (0, 0 when not a CUDA backend). */
void qw_backend_cuda_memory(const qw_backend *be, size_t *free_bytes, size_t *total_bytes);

#endif
