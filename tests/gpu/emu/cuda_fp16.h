/* cuda_fp16.h (tests/gpu/emu) - what quant.cu includes by this name: the emulation's __half and __half2float are in
 * cuda/cuda_internal.cuh here. */
