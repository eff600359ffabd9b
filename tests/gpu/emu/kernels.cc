/*
 * kernels.cc (tests/gpu/emu) - the CUDA backend's kernel files on the emulation's CPU threads, for the programs that
 * call them only through the op table (t_cuda_ops_emu); t_cuda_emu.cc includes the same files itself, as it also
 * launches their kernels directly. The Makefile copies each file with its dynamic shared memory made plain externs.
 */
#include "cuda/ops_internal.cuh"

#include "delta_chunk.cu"
#include "attn.cu"
#include "mmq.cu"
#include "ops.cu"
#include "model_ops.cu"
#include "quant.cu"
#include "moe.cu"
