/*
 * cpu.h - the CPU backend: the kernel variants it chooses from (scalar in cpu.c, avx2.c, avx512.c) and
 * the constructor of its op table (a thread pool beside the kernels).
 *
 * The dot kernels keep ONE f32 accumulator vector of `lanes` lanes per output, walk the row in steps
 * of `lanes` (the tail read through a mask or a zero-padded copy) and reduce it by a fixed tree. So
 * every tile shape gives bit-identical results: how rows and tokens are grouped into tiles, and how
 * tiles are spread over threads, never changes an output. The error against the exact dot product is
 * at most (ceil(n/lanes) + log2(lanes) + 3) * 2^-24 * sum|w_i x_i| (the per-lane f32 sums, the tree,
 * the rounding of products in the scalar variant, and the final rounding that the reference also does);
 * tests/t_kernels.c checks exactly this bound.
 */
#ifndef QW_CPU_H
#define QW_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "kernels/q8a.h"
#include "qwenc.h"

/* y[t * ldy + r] = sum_c W[r][c] * x[t * ldx + c] for r < nr, t < nt (nr <= tile_nr, nt <= tile_nt);
 * W is nr rows of n elements of the kernel's weight type, row r at (const char *)w + r * w_stride. */
typedef void (*qw_tile_fn)(float *y, int64_t ldy, const void *w, size_t w_stride, const float *x, int64_t ldx, int nr,
                           int nt, int64_t n);

/* The same tile for block-quantized weights against 8-bit activations (q8a.h): x holds nt rows of n / 32
 * activation blocks, row t at x + t * ldx. Integer products are exact; see q8a.h for the bound. Here nr
 * may be any number of rows and nt up to the table's qtile_nt: the kernel prepares the tokens once per
 * call and passes over the rows in its own tiles (a decode step hands each thread its whole chunk at
 * once). An output depends only on its row and token, except that a kernel may add up the f32 terms in
 * another order for calls of many tokens (avx512, avx2, neon: 16 or more, through repacked rows), within
 * the same bound; calls of fewer tokens give the bits of the one-token call. Thread counts never change a
 * bit: how many tokens a call gets depends on the matmul alone. */
typedef void (*qw_qtile_fn)(float *y, int64_t ldy, const void *w, size_t w_stride, const qw_q8a *x, int64_t ldx,
                            int nr, int nt, int64_t n);

/* The vector instruction set of a kernel table (delta_chunk.c picks its code by it) */
typedef enum { QW_SIMD_NONE, QW_SIMD_AVX2, QW_SIMD_AVX512, QW_SIMD_NEON } qw_simd;

typedef struct {
    const char *name;            /* "amx", "avx512", "avx2", "neon", "scalar" */
    qw_simd simd;                /* the vector instructions its kernels use (several tables may share them) */
    int lanes;                   /* f32 lanes of one accumulator (the dot error bound depends on it) */
    int tile_nr, tile_nt;        /* the largest tile: weight rows x tokens */
    qw_tile_fn tile[QW_TYPE_COUNT]; /* NULL: weight type not handled here (qw_ref_dot_row is used) */
    qw_qtile_fn qtile[QW_TYPE_COUNT]; /* integer dots of quantized weights (NULL: the f32 tile or reference) */
    int qtile_nt; /* tokens one qtile call may take (0: tile_nt) */
    /* qw_q8a_quantize with the same bytes, faster (NULL: qw_q8a_quantize itself) */
    void (*q8a_quantize)(const float *x, qw_q8a *y, int64_t n);
    /* The delta rule's row updates, i < n:
     * decay_acc: S[i] *= d; acc[i] += k * S[i].   rank1_acc: S[i] += k * u[i]; acc[i] += q * S[i]. */
    void (*decay_acc)(float *S, float d, float *acc, float k, int n);
    void (*rank1_acc)(float *S, const float *u, float k, float *acc, float q, int n);
    /* y[i] = y[i] * s + a * x[i], i < n (attention's running weighted sum of values) */
    void (*scale_axpy)(float *y, float s, float a, const float *x, int n);
    /* x[i] = sigmoid(x[i]) = 1 / (1 + e^-x[i]) and x[i] = silu(x[i]) = x[i] / (1 + e^-x[i]), i < n: the
     * reference's f32 steps around an e^x of expd.h (the one ref.c uses, so the reference's bits). NULL:
     * the reference (ref.c). */
    void (*sigmoid)(float *x, int64_t n);
    void (*silu)(float *x, int64_t n);
    /* y[i] += a[i] * s and y[i] = a[i] * b[i], i < n: ops.h's axpy and mul, each product and sum rounded as
     * the reference rounds them (no fused multiply-add: the build passes -ffp-contract=off), so its bits. NULL:
     * the reference. */
    void (*axpy)(float *y, const float *a, float s, int64_t n);
    void (*mul)(float *y, const float *a, const float *b, int64_t n);
    /* One row of ops.h's rms_norm: the squares summed in double as the reference does, in another order
     * (lanes, then a fixed tree), so 1 / rms rounds to the reference's float but for a sum within about
     * dim * 2^-53 of a rounding boundary. NULL: the reference. */
    void (*rms_norm_row)(float *y, const float *x, const float *w, int dim, float eps, int zero_centred);
    /* QSA block scores (ops.h qsa_select): score[b] = sum over heads h < n_head, in order, of relu(q_h . blk_b),
     * then times inv_sqrt, for b < n_b; q [n_head][ihd], blk [n_b][ihd]; each dot a double sum over d in order:
     * ref.c's bits. NULL: the composite's scalar loop. */
    void (*qsa_scores)(float *score, const float *q, const float *blk, int n_b, int n_head, int ihd, float inv_sqrt);
} qw_cpu_kernels;

/* The variants compiled for this architecture and supported by this CPU, best first; NULL-terminated. */
const qw_cpu_kernels *const *qw_cpu_kernels_available(void);
/* The variant of that name, if compiled and supported (NULL or "auto": the best); NULL otherwise. */
const qw_cpu_kernels *qw_cpu_kernels_find(const char *name);

/*
 * The CPU backend: host memory, and matmul, attention, delta rule and the large element-wise ops on a pool of
 * n_threads threads (0: one per CPU) with the kernel variant `kernels` (NULL or "auto": the best for this
 * CPU; "ref": the scalar reference of ref.c on one thread). guard: the test mode in which every activation
 * and state buffer is its own mapping, inaccessible (PROT_NONE) outside the backend's calls, so code outside
 * the backend that touches one faults. Fails if the variant is unknown or not supported by this CPU
 * (QWENC_ERR_UNSUPPORTED) or the threads cannot be created. Free it with (*out)->release(*out).
 */
qwenc_status qw_backend_cpu_new(int n_threads, const char *kernels, int guard, qw_backend **out, char *err,
                                size_t errlen);
/* Quantized weights meet f32 activations (1: the exact dequantized dot, slower) or, by default (0),
 * activations rounded once per matmul to 8 bits per block of 32 (q8a.h), as llama.cpp does. */
void qw_backend_cpu_set_f32_activations(const qw_backend *be, int on);
/* How many times, since the process started, a kernel's scratch (kernels/qtiles.h, the 8-bit activations of
 * a matmul) could not be allocated: the op that needed it was skipped, its output left unwritten. A caller
 * compares the count before and after a forward step (runtime/session.c). */
unsigned long qw_cpu_scratch_failures(void);
/* The threads of a backend made by qw_backend_cpu_new. */
int qw_backend_cpu_n_threads(const qw_backend *be);

#if defined(__x86_64__)
extern const qw_cpu_kernels qw_kernels_avx2;   /* AVX2 + FMA + F16C */
extern const qw_cpu_kernels qw_kernels_avx2_intel; /* the same, tuned for Intel (named "avx2" too) */
extern const qw_cpu_kernels qw_kernels_avx512; /* AVX-512 F + BW + VL */
extern const qw_cpu_kernels qw_kernels_avx512_intel; /* the same, tuned for Intel (named "avx512" too) */
extern const qw_cpu_kernels qw_kernels_amx;    /* avx512 with AMX-INT8 tile products for prefill */
#endif
#if defined(__aarch64__)
extern const qw_cpu_kernels qw_kernels_neon;         /* AdvSIMD ("neon") */
extern const qw_cpu_kernels qw_kernels_neon_dotprod; /* the same with sdot integer dots (Armv8.2 dot product) */
#endif

#endif
