/* hostdev.h - QW_HOST_DEVICE: a small inline function written once for the host and the CUDA backend's kernels
 * (the same operations, so the same bits on both: e^x of expd.h, the PLE hash of ple_hash.h). */
#ifndef QW_HOSTDEV_H
#define QW_HOSTDEV_H

#ifdef __CUDACC__
#define QW_HOST_DEVICE __host__ __device__
#else
#define QW_HOST_DEVICE
#endif

#endif
