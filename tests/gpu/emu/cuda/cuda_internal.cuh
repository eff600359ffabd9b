/*
 * cuda_internal.cuh (tests/gpu/emu) - what src/cuda/mmq.cu includes by this name: the emulation of
 * ops_internal.cuh (this directory), which has every part of the backend's internal header that mmq.cu uses.
 */
#ifndef QW_CUDA_EMU_INTERNAL_CUH
#define QW_CUDA_EMU_INTERNAL_CUH

#include "cuda/ops_internal.cuh"

#endif
