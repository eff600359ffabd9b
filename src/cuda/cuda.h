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

/* on: quantized weights meet activations rounded to 8 bits per block of 32 in integer dot products (kernels/q8a.h:
 * the CPU backend's default, qwenc_model_params.f32_activations 0), off (the backend's start): f32 activations, the
 * exact product. Matrix-vector products only (up to 16 tokens); longer products stay f32 (cuBLAS). */
void qw_backend_cuda_set_q8_activations(qw_backend *be, int on);
/* The delta rule of a call of at least min_tok tokens (a prompt's; never fewer than 18) in the chunked form
 * (src/cuda/delta_chunk.cu: small matrix products a chunk of 64 tokens, within a stated bound of the token-by-token
 * rule); 0: token by token always. The backend starts with QWENC_CUDA_DR_CHUNK from the environment (default 64). */
void qw_backend_cuda_set_dr_chunk(qw_backend *be, int min_tok);
/* on: the n-gram table (PLE) is not copied to the device but to pinned host memory mapped for it, and the gather
 * kernel reads the rows a step needs (a few KiB a token) over the bus. For a table that does not fit beside the
 * rest of the weights. */
void qw_backend_cuda_set_ple_host(qw_backend *be, int on);
/* Device memory for weights the host never holds: the host addresses [keys, keys + bytes) (a reserved mapping
 * that is never written) stand for the device copy at the same offset, for every op and view. One range per
 * backend; freed with it. QWENC_ERR_NOMEM (with the sizes) when the device lacks the memory. */
qwenc_status qw_backend_cuda_weights_adopt(qw_backend *be, const void *keys, size_t bytes, char *err, size_t errlen);
/* Random weights of `type` in the device copy of [key, key + bytes), inside the adopted range (qwenc_model_synth):
 * random codes with block scales that give a deviation near 0.02 (not the values the host's synth would write;
 * the same bytes to read). Deterministic in seed; asynchronous (on the backend's stream). */
void qw_backend_cuda_weights_random(qw_backend *be, const void *key, qw_type type, size_t bytes, uint64_t seed);

#define QW_MAX_GPUS 8 /* the most GPUs a model spreads over */

/* The routed experts over n GPUs (devices[0] is the backend's own): rank r holds and runs the experts
 * [E s_r, E s_(r+1)) of every MoE layer, s_r the sum of share[0 .. r-1] rounded to whole experts (share NULL:
 * 1 / n each) (its weights uploaded there the first time they run); the rest of the
 * model stays on the first. Each MoE layer sends x and the routing to the other ranks and adds their experts'
 * output rows into the first's (NCCL broadcast and reduce; each row comes from one rank and zeros, so the sum is
 * that row: the bits of one GPU). A device listed twice gives ranks that share it and exchange by device copies
 * (NCCL takes one rank a device): the split tested on one GPU. */
qwenc_status qw_backend_cuda_split(qw_backend *be, const int *devices, int n, const double *share, char *err,
                                   size_t errlen);
/* The layers over n GPUs (--split layer; devices[0] is the backend's own): layer il (0 .. n_layers-1, the last the
 * MTP head's when there is one) has its weights, its session state and its ops on GPU stage[il]; everything else
 * (embeddings, the n-gram table, the head, activations and a step's inputs) on the first. Ops follow ops.h's layer
 * calls; a later GPU's kernels read and write the activations in the first's memory (peer access, enabled here:
 * an error when two of the GPUs have none). One chain of work: each GPU waits for the one before, so a step
 * gives the bits of one GPU. A device listed twice gives ranks that share it (the split tested on one GPU). */
qwenc_status qw_backend_cuda_split_layers(qw_backend *be, const int *devices, int n, const int *stage, int n_layers,
                                          char *err, size_t errlen);
/* The ranks (1 when not split; 0 when not a CUDA backend), and rank r's device, free and total memory, the
 * bytes of weights it holds and, split by layers, the layers it runs (first_layer .. + n_layers; else 0, 0). */
int qw_backend_cuda_ranks(const qw_backend *be);
void qw_backend_cuda_rank_info(const qw_backend *be, int r, int *device, size_t *free_bytes, size_t *total_bytes,
                               size_t *weight_bytes, int *first_layer, int *n_layers);
/* Microseconds of n_layers MoE layers' exchanges of an n_tok-token step (x [n_tok][H] and the routing [n_tok][k]
 * out, the rows [n_tok k][H] back), timed alone: the best of three (0 when not split). */
double qw_backend_cuda_exchange_us(qw_backend *be, int n_tok, int H, int k, int n_layers);

#endif
