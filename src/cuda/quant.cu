/*
 * quant.cu - the weight kernels of the CUDA backend: every weight type qwenc reads (F32, F16, BF16 and the ten
 * block-quantized types of tensor/quant.h) read on the device, for matrix products, row gathers and the MoE's
 * per-pair products (cuda_internal.cuh).
 *
 * Exact dequantization. dq_item gives 32 elements of a row as tensor/quant.c and quant_k.c compute them: the same
 * f32 operations on the same operands in the same order, each rounded on its own (__fmul_rn, __fadd_rn: never
 * fused, whatever the flags). get_rows, gather_rows, the GEMM tiles and the fallback matrix-vector kernel use it,
 * so they see the host's floats bit for bit.
 *
 * Matrix-vector kernels (n_tok <= MV_MAX_TOK, passes of up to 8 tokens): memory-bound, each weight byte read once
 * per pass. A block of 4 warps; a row group of MV_ROWS (4) rows is shared by kw warps (1, 2 or 4: split over the
 * row's chunks, then summed in a fixed order). A warp's chunk is 32 items of 32 elements (8 for the plain types),
 * one item per lane, for each of its 4 rows at once, so every x value loaded (16-byte loads through the read-only
 * cache, from L1) serves 4 rows. Weights go to shared memory with cp.async (16-byte aligned copies of the row's
 * bytes, coalesced, two chunks in flight per warp, L2 only so x keeps L1), because most block layouts are only
 * 2-byte aligned; lanes then read their item with aligned 32-bit shared loads and funnel shifts (or 64/128-bit
 * loads where the layout keeps them aligned: the "AL" variant, chosen per block when the matrix and row size are
 * multiples of 16 bytes). Codes become floats without conversion instructions: a byte v is placed in the low bits
 * of 2^23 (one byte permute) and 2^23 plus the code's offset subtracted, exact. For 1 or 2 tokens each item's
 * codes are dotted with x in f32 (fma) and the block scale applied once per group: sum_j (a q_j + b) x_j =
 * a sum_j q_j x_j + b sum_j x_j, with b (the Q4_1/Q5_1 min, the K-quants' -dmin*m) times the group's sum of x; for
 * 3 to 8, each weight's exact value (a q + b, rounded as the host rounds it) is formed once and used for every
 * token. The float order differs from the host's; tests/gpu/t_cuda_quant.c bounds the difference. Compute per
 * weight and token: about a byte permute, a subtraction and an fma, the budget of a 4.5-bit weight read at
 * 4.8 TB/s on 132 SMs (qwenc bench measures what it reaches).
 *
 * 8-bit activations (qwc_q8_on: the backend asked for the CPU's integer path, qw_backend_cuda_set_q8_activations):
 * quantized weights and up to 16 tokens (or the MoE's pairs) go through k_q8a, which rounds each token's x per block
 * of 32 exactly as kernels/q8a.c does, into a fixed device buffer (graphs keep its address), and mvq_kernel: a warp
 * per row, a lane per group of 32 weights, the group's exact integer sum from kernels/q8dot.h (dp4a over the codes
 * four to a word, the same integers as the CPU's) and its f32 term as qw_q8a_dot_ref forms it; about one
 * instruction per weight instead of the f32 path's three or four. Every token of a pass does what a pass of one
 * does, so a draft step's logits are one-token steps' bits.
 *
 * Many tokens: rows are dequantized to f32 in qwc_scratch (tiles of at most GEMM_TILE_BYTES) and multiplied by
 * cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F_PEDANTIC: f32 products and sums, never TF32, whatever the handle's math
 * mode); F32 weights go to cuBLAS in place (4-byte aligned, as every f32 weight on the device is).
 *
 * Everything runs on qwc_stream without synchronising, allocates only through qwc_scratch (GEMM path), and reads
 * nothing back: the decode-sized calls can be captured in a CUDA graph. Offsets are int64 throughout.
 */
#include <assert.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "cuda/cuda_internal.cuh"
#include "cuda/mma.cuh"

#include "cuda/ops_internal.cuh"

extern "C" {
#include "kernels/q8a.h"
}
#include "kernels/q8dot.h"

namespace {

constexpr int MV_WARPS = 4, MV_THREADS = 32 * MV_WARPS;
constexpr int MV_ROWS = 4;       /* rows of a row group: every x load serves them all */
constexpr int MV_PASS_TOK = 8;   /* tokens of one matrix-vector pass */
constexpr int MVQ_JOBS = 4;      /* matrices of one grouped integer launch (qwc_matmul_group) */
constexpr int MV_MAX_TOK = 16;   /* more tokens: dequantized tiles and cuBLAS */
/* Decode (1-2 tokens): blocks per SM the register budget is set for, and the warps kw grows the grid to (a
 * constant, so that a matrix's results do not depend on the GPU). H200, Flash-Next cut Q4_K decode: 6 and 8192
 * gave +9 % over 1 and 2048 (8 blocks: slower, spills). More tokens keep 1 and 2048: 6 made the 8-token kernels
 * spill (the whole Flash-Next's prefill, many experts of a few rows each: pp512 445 -> 314 tok/s). */
constexpr int MV_MINB_DECODE = 6;
constexpr int64_t MV_TARGET_DECODE = 8192, MV_TARGET_WARPS = 2048;
constexpr size_t GEMM_TILE_BYTES = (size_t)256 << 20;
constexpr int DQ_THREADS = 256;

#define QWC_CUBLAS(x)                                                                                             \
    do {                                                                                                          \
        cublasStatus_t s_ = (x);                                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) qwc_die(__FILE__, __LINE__, #x, cublasGetStatusString(s_));             \
    } while (0)

/* ------------------------------------------------------------------ block layouts */

/* BE elements in BB bytes per block (the plain types: a pseudo-block of 8 elements), IPB matrix-vector items per
 * block; AL_OK: every field the matrix-vector item reads is 4-byte aligned or better when the row's bytes start on
 * a 16-byte boundary. CBLK blocks (CB bytes) per warp chunk; SROW the shared bytes staged per row and chunk (the
 * chunk, its misalignment, and the word a funnel shift reads past the end). */
template <int T> struct lay;
#define QWC_LAY(T, be, bb, ipb, al)                                                                              \
    template <> struct lay<T> {                                                                                   \
        static constexpr int BE = be, BB = bb, IPB = ipb, CBLK = 32 / ipb, CB = CBLK * bb;                         \
        static constexpr int SROW = (CB + 32 + 15) / 16 * 16;                                                     \
        static constexpr bool AL_OK = al, PLAIN = be == 8;                                                       \
    };
QWC_LAY(QW_TYPE_F32, 8, 32, 1, true)
QWC_LAY(QW_TYPE_F16, 8, 16, 1, true)
QWC_LAY(QW_TYPE_BF16, 8, 16, 1, true)
QWC_LAY(QW_TYPE_Q8_0, 32, 34, 1, false)
QWC_LAY(QW_TYPE_Q4_0, 32, 18, 1, false)
QWC_LAY(QW_TYPE_Q4_1, 32, 20, 1, true)
QWC_LAY(QW_TYPE_Q5_0, 32, 22, 1, false)
QWC_LAY(QW_TYPE_Q5_1, 32, 24, 1, true)
QWC_LAY(QW_TYPE_Q4_K, 256, 144, 8, true)
QWC_LAY(QW_TYPE_Q5_K, 256, 176, 8, true)
QWC_LAY(QW_TYPE_Q6_K, 256, 210, 8, false)
QWC_LAY(QW_TYPE_IQ4_NL, 32, 18, 1, false)
QWC_LAY(QW_TYPE_IQ4_XS, 256, 136, 8, true)
#undef QWC_LAY

/* the field offsets the kernels below use, against quant.h */
static_assert(sizeof(qw_block_q8_0) == 34 && offsetof(qw_block_q8_0, qs) == 2, "q8_0");
static_assert(sizeof(qw_block_q4_0) == 18 && offsetof(qw_block_q4_0, qs) == 2, "q4_0");
static_assert(sizeof(qw_block_q4_1) == 20 && offsetof(qw_block_q4_1, m) == 2 && offsetof(qw_block_q4_1, qs) == 4,
              "q4_1");
static_assert(sizeof(qw_block_q5_0) == 22 && offsetof(qw_block_q5_0, qh) == 2 && offsetof(qw_block_q5_0, qs) == 6,
              "q5_0");
static_assert(sizeof(qw_block_q5_1) == 24 && offsetof(qw_block_q5_1, qh) == 4 && offsetof(qw_block_q5_1, qs) == 8,
              "q5_1");
static_assert(sizeof(qw_block_q4_K) == 144 && offsetof(qw_block_q4_K, scales) == 4 && offsetof(qw_block_q4_K, qs) == 16,
              "q4_K");
static_assert(sizeof(qw_block_q5_K) == 176 && offsetof(qw_block_q5_K, qh) == 16 && offsetof(qw_block_q5_K, qs) == 48,
              "q5_K");
static_assert(sizeof(qw_block_q6_K) == 210 && offsetof(qw_block_q6_K, qh) == 128 &&
                  offsetof(qw_block_q6_K, scales) == 192 && offsetof(qw_block_q6_K, d) == 208,
              "q6_K");
static_assert(sizeof(qw_block_iq4_nl) == 18 && offsetof(qw_block_iq4_nl, qs) == 2, "iq4_nl");
static_assert(sizeof(qw_block_iq4_xs) == 136 && offsetof(qw_block_iq4_xs, scales_l) == 4 &&
                  offsetof(qw_block_iq4_xs, qs) == 8,
              "iq4_xs");

/* ------------------------------------------------------------------ primitives */

/* The device instructions the decoders use, and host equivalents: everything up to the kernels also compiles as
 * host C++, so the bit logic of the decoders can be checked against tensor/quant.c on a machine without a GPU. */
#ifdef __CUDA_ARCH__
__device__ __forceinline__ uint32_t q_perm(uint32_t x, uint32_t y, uint32_t s) { return __byte_perm(x, y, s); }
__device__ __forceinline__ uint32_t q_funnel(uint32_t lo, uint32_t hi, uint32_t sh) { return __funnelshift_r(lo, hi, sh); }
__device__ __forceinline__ float q_asf(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ float q_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float q_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float q_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float q_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ uint32_t q_ld16(const uint8_t *p) { return __ldg((const unsigned short *)p); }
__device__ __forceinline__ float q_ldf(const float *p) { return __ldg(p); }
__device__ __forceinline__ float4 q_ldf4(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ float f16f(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)(h & 0xFFFF))); }
__device__ __forceinline__ uint32_t q_bfe(uint32_t x, uint32_t pos, uint32_t len) {
    uint32_t r;
    asm("bfe.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(pos), "r"(len)); /* len 0: 0 */
    return r;
}
/* s + the four products of x's and y's bytes (x unsigned, y signed) */
__device__ __forceinline__ int32_t q_dp4a_us(uint32_t x, uint32_t y, int32_t s) {
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(s) : "r"(x), "r"(y));
    return s;
}
#else
__device__ __forceinline__ uint32_t q_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)(v >> (8 * ((s >> (4 * i)) & 7)) & 0xFF) << (8 * i);
    return r;
}
__device__ __forceinline__ uint32_t q_funnel(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t)(((uint64_t)hi << 32 | lo) >> (sh & 31));
}
__device__ __forceinline__ float q_asf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
__device__ __forceinline__ float q_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float q_add(float a, float b) { return a + b; }
__device__ __forceinline__ float q_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float q_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ uint32_t q_ld16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ float q_ldf(const float *p) { return *p; }
__device__ __forceinline__ float4 q_ldf4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float f16f(uint32_t h) {
    const uint32_t e = (h >> 10) & 31, m = h & 0x3FF, sign = (h & 0x8000) << 16;
    if (e == 0) return (h & 0x8000 ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-8f; /* m 2^-24, exact */
    return q_asf(sign | (e == 31 ? 0x7F800000u : (e + 112) << 23) | m << 13);
}
__device__ __forceinline__ uint32_t q_bfe(uint32_t x, uint32_t pos, uint32_t len) {
    pos &= 0xFF, len &= 0xFF; /* bfe.u32 reads the low bytes; bits past 31 are zeros */
    return pos >= 32 || len == 0 ? 0 : (uint32_t)(((uint64_t)x >> pos) & ((1ull << (len < 32 ? len : 32)) - 1));
}
__device__ __forceinline__ int32_t q_dp4a_us(uint32_t x, uint32_t y, int32_t s) {
    for (int j = 0; j < 4; j++) s += (int32_t)((x >> (8 * j)) & 0xFF) * (int32_t)(int8_t)(y >> (8 * j));
    return s;
}
#endif
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

/* ------------------------------------------------------------------ scalars */

__device__ __forceinline__ float bf16f(uint32_t h) { return q_asf(h << 16); }

/* The float v - off for byte k of w (v its unsigned value), exact for off = 2^23 + the code's offset: the byte
 * permute makes the float 2^23 + v. */
constexpr float MAGIC = 8388608.0f; /* 2^23 */
__device__ __forceinline__ float bytef(uint32_t w, int k, float off) {
    return q_sub(q_asf(q_perm(w, 0x4B000000u, 0x7540 | k)), off);
}
/* a small unsigned integer (< 2^23) as a float, the same way */
__device__ __forceinline__ float smallf(uint32_t v) { return q_sub(q_asf(0x4B000000u | v), MAGIC); }

/* ggml's IQ4_NL levels (tensor/quant_k.c's qw_kvalues_iq4nl; t_cuda_quant checks that the device agrees) as four
 * little-endian words, and their lookup by byte permutes. */
constexpr int8_t KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr uint32_t kv_word(int i) {
    return (uint32_t)(uint8_t)KV[4 * i] | (uint32_t)(uint8_t)KV[4 * i + 1] << 8 |
           (uint32_t)(uint8_t)KV[4 * i + 2] << 16 | (uint32_t)(uint8_t)KV[4 * i + 3] << 24;
}
__device__ __forceinline__ int kvalue(uint32_t q) {
    const uint32_t lo = q_perm(kv_word(0), kv_word(1), q & 7), hi = q_perm(kv_word(2), kv_word(3), q & 7);
    return (int)(int8_t)((q & 8 ? hi : lo) & 0xFF);
}

/* ------------------------------------------------------------------ exact dequantization (global memory) */

/* Blocks are 2-byte aligned (every block size is even), so their fields are read 16 bits at a time. */
__device__ __forceinline__ uint32_t g16(const uint8_t *p) { return q_ld16(p); }
__device__ __forceinline__ uint32_t g32(const uint8_t *p) { return g16(p) | g16(p + 2) << 16; }
template <int N> __device__ __forceinline__ void gbytes(const uint8_t *p, uint8_t (&b)[N]) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
        const uint32_t v = g16(p + i);
        b[i] = (uint8_t)v;
        b[i + 1] = (uint8_t)(v >> 8);
    }
}

/* Scale and min (6 bits) of sub-block j (0..7) of a Q4_K / Q5_K block, as quant.h's qw_k4_scale_min, from its 12
 * scale bytes in the words s0, s1, s2 (little-endian: byte j of s0 is scales[j]). */
__device__ __forceinline__ void k4_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2, uint32_t *sc, uint32_t *mn) {
    const int sh = 8 * (j & 3);
    const uint32_t b0 = (s0 >> sh) & 0xFF, b1 = (s1 >> sh) & 0xFF, b2 = (s2 >> sh) & 0xFF;
    *sc = j < 4 ? b0 & 63 : (b2 & 0xF) | (b0 >> 6) << 4;
    *mn = j < 4 ? b1 & 63 : (b2 >> 4) | (b1 >> 6) << 4;
}

/* Elements 32 it .. 32 it + 31 of a row of type T (fewer at the end of a plain row of `cols`): their count. */
template <int T> __device__ int dq_item(const uint8_t *row, int64_t it, int64_t cols, float *v) {
    using L = lay<T>;
    if constexpr (L::PLAIN) {
        const int64_t c0 = 32 * it;
        const int n = (int)imin(32, cols - c0);
#pragma unroll
        for (int j = 0; j < 32; j++) {
            if (j >= n) v[j] = 0.0f;
            else if constexpr (T == QW_TYPE_F32) v[j] = q_ldf((const float *)row + c0 + j);
            else if constexpr (T == QW_TYPE_F16) v[j] = f16f(g16(row + 2 * (c0 + j)));
            else v[j] = bf16f(g16(row + 2 * (c0 + j)));
        }
        return n;
    } else {
        const uint8_t *b = row + it / L::IPB * L::BB;
        const int sub = (int)(it % L::IPB);
        if constexpr (T == QW_TYPE_Q8_0) {
            const float d = f16f(g16(b));
            uint8_t q[32];
            gbytes(b + 2, q);
#pragma unroll
            for (int j = 0; j < 32; j++) v[j] = q_mul((float)(int8_t)q[j], d);
        } else if constexpr (T == QW_TYPE_Q4_0 || T == QW_TYPE_IQ4_NL) {
            const float d = f16f(g16(b));
            uint8_t q[16];
            gbytes(b + 2, q);
#pragma unroll
            for (int j = 0; j < 16; j++) {
                if constexpr (T == QW_TYPE_Q4_0) {
                    v[j] = q_mul((float)((q[j] & 0xF) - 8), d);
                    v[j + 16] = q_mul((float)((q[j] >> 4) - 8), d);
                } else {
                    v[j] = q_mul(d, (float)kvalue(q[j] & 0xF));
                    v[j + 16] = q_mul(d, (float)kvalue(q[j] >> 4));
                }
            }
        } else if constexpr (T == QW_TYPE_Q4_1 || T == QW_TYPE_Q5_1) {
            const int qs = T == QW_TYPE_Q4_1 ? 4 : 8;
            const float d = f16f(g16(b)), m = f16f(g16(b + 2));
            const uint32_t h = T == QW_TYPE_Q5_1 ? g32(b + 4) : 0;
            uint8_t q[16];
            gbytes(b + qs, q);
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int lo = (q[j] & 0xF) | (int)(((h >> j) & 1) << 4), hi = (q[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
                v[j] = q_add(q_mul((float)lo, d), m);
                v[j + 16] = q_add(q_mul((float)hi, d), m);
            }
        } else if constexpr (T == QW_TYPE_Q5_0) {
            const float d = f16f(g16(b));
            const uint32_t h = g32(b + 2);
            uint8_t q[16];
            gbytes(b + 6, q);
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int lo = (q[j] & 0xF) | (int)(((h >> j) & 1) << 4), hi = (q[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
                v[j] = q_mul((float)(lo - 16), d);
                v[j + 16] = q_mul((float)(hi - 16), d);
            }
        } else if constexpr (T == QW_TYPE_Q4_K || T == QW_TYPE_Q5_K) {
            /* sub-block j = sub: the low (even j) or high (odd j) nibbles of qs[32 (j/2) ..], fifth bit j of qh[l] */
            const float d = f16f(g16(b)), dmin = f16f(g16(b + 2));
            uint8_t q[32], qh[32];
            uint32_t sc, mn;
            k4_scale_min(sub, g32(b + 4), g32(b + 8), g32(b + 12), &sc, &mn);
            const float d1 = q_mul(d, (float)sc), m1 = q_mul(dmin, (float)mn);
            constexpr int QS = T == QW_TYPE_Q4_K ? 16 : 48;
            gbytes(b + QS + 32 * (sub >> 1), q);
            if constexpr (T == QW_TYPE_Q5_K) gbytes(b + 16, qh);
#pragma unroll
            for (int l = 0; l < 32; l++) {
                int c = sub & 1 ? q[l] >> 4 : q[l] & 0xF;
                if constexpr (T == QW_TYPE_Q5_K) c |= ((qh[l] >> sub) & 1) << 4;
                v[l] = q_sub(q_mul(d1, (float)c), m1);
            }
        } else if constexpr (T == QW_TYPE_Q6_K) {
            /* sub-block j = 4h + k: elements 128h + 32k + l; ql[64h + l (+32 for odd k)], low nibble for k < 2,
             * high bits (qh[32h + l] >> 2k) & 3, scale scales[8h + l/16 + 2k] */
            const int h = sub >> 2, k = sub & 3;
            const float d = f16f(g16(b + 208));
            uint8_t ql[32], qh[32];
            gbytes(b + 64 * h + 32 * (k & 1), ql);
            gbytes(b + 128 + 32 * h, qh);
            const uint64_t sc = g32(b + 192 + 8 * h) | (uint64_t)g32(b + 196 + 8 * h) << 32;
            const float sc0 = (float)(int8_t)(sc >> (16 * k)), sc1 = (float)(int8_t)(sc >> (16 * k + 8));
#pragma unroll
            for (int l = 0; l < 32; l++) {
                const int c = ((k < 2 ? ql[l] & 0xF : ql[l] >> 4) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                v[l] = q_mul(q_mul(d, l < 16 ? sc0 : sc1), (float)c);
            }
        } else if constexpr (T == QW_TYPE_IQ4_XS) {
            const float d = f16f(g16(b));
            const uint32_t sh = g16(b + 2), sl = g32(b + 4);
            uint8_t q[16];
            gbytes(b + 8 + 16 * sub, q);
            const int ls = (int)((sl >> (8 * (sub / 2) + 4 * (sub % 2))) & 0xF) | (int)(((sh >> (2 * sub)) & 3) << 4);
            const float dl = q_mul(d, (float)(ls - 32));
#pragma unroll
            for (int j = 0; j < 16; j++) {
                v[j] = q_mul(dl, (float)kvalue(q[j] & 0xF));
                v[j + 16] = q_mul(dl, (float)kvalue(q[j] >> 4));
            }
        }
        return 32;
    }
}

/* Where the rows of a dequantization come from: row i of the output is at src(i). */
struct rows_dense { /* rows r0 + i of a matrix */
    const uint8_t *w;
    int64_t row_bytes, r0;
    __device__ const uint8_t *operator()(int64_t i) const { return w + (r0 + i) * row_bytes; }
};
struct rows_ids { /* rows ids[i] of a matrix of n_rows rows */
    const uint8_t *w;
    int64_t row_bytes, n_rows;
    const int32_t *ids;
    __device__ const uint8_t *operator()(int64_t i) const {
        const int32_t r = ids[i];
        assert(r >= 0 && r < n_rows);
        return w + (int64_t)r * row_bytes;
    }
};
struct rows_chunks { /* global rows rows[i] of a table in pieces of chunk_rows rows */
    const void *const *chunks;
    int64_t row_bytes, chunk_rows;
    const int64_t *rows;
    int n_chunks;
    __device__ const uint8_t *operator()(int64_t i) const {
        const int64_t r = rows[i], k = r / chunk_rows;
        assert(r >= 0 && k < n_chunks);
        return (const uint8_t *)chunks[k] + (r - k * chunk_rows) * row_bytes;
    }
};

/* y [n][cols] = rows src(0 .. n-1) as f32; one thread per 32 elements. */
template <int T, class Src>
__global__ void __launch_bounds__(DQ_THREADS) dq_rows(float *y, int64_t n, int64_t cols, Src src) {
    QWC_PDL_ENTRY();
    const int64_t ipr = (cols + 31) / 32, total = n * ipr;
    for (int64_t idx = (int64_t)blockIdx.x * DQ_THREADS + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * DQ_THREADS) {
        const int64_t i = idx / ipr, it = idx - i * ipr;
        float v[32];
        const int cnt = dq_item<T>(src(i), it, cols, v);
        float *o = y + i * cols + 32 * it;
        if (cnt == 32 && ((uintptr_t)o & 15) == 0) {
#pragma unroll
            for (int j = 0; j < 32; j += 4) *(float4 *)(o + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
        } else {
#pragma unroll
            for (int j = 0; j < 32; j++)
                if (j < cnt) o[j] = v[j];
        }
    }
}

/* ------------------------------------------------------------------ shared memory */

/* n 32-bit words from byte offset off (even) of shared memory s, with the widest loads that alignment A (the
 * alignment of off the caller guarantees) allows; below 4, aligned words and funnel shifts. Reads up to 4 bytes
 * past the last word. */
template <int N, int A> __device__ __forceinline__ void shw(const uint8_t *s, int off, uint32_t *w) {
    if constexpr (A % 16 == 0 && N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const uint4 v = *(const uint4 *)(s + off + 4 * i);
            w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
        }
    } else if constexpr (A % 8 == 0 && N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            const uint2 v = *(const uint2 *)(s + off + 4 * i);
            w[i] = v.x, w[i + 1] = v.y;
        }
    } else if constexpr (A % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = *(const uint32_t *)(s + off + 4 * i);
    } else {
        const uint32_t *a = (const uint32_t *)(s + (off & ~3));
        const uint32_t sh = (off & 3) * 8;
        uint32_t prev = a[0];
#pragma unroll
        for (int i = 0; i < N; i++) {
            const uint32_t next = a[i + 1];
            w[i] = q_funnel(prev, next, sh);
            prev = next;
        }
    }
}
__device__ __forceinline__ uint32_t sh16(const uint8_t *s, int off) { return *(const uint16_t *)(s + off); }

/* ------------------------------------------------------------------ matrix-vector items */

/* Codes of 8 elements: the nibbles at `shift` of the 8 bytes in w0, w1, plus `hi` (the fifth / high bits already
 * in place, per byte), minus off - 2^23. */
__device__ __forceinline__ void codes8(uint32_t w0, uint32_t w1, int shift, uint32_t hi0, uint32_t hi1, float off,
                                       float *c) {
    const uint32_t a = ((w0 >> shift) & 0x0F0F0F0Fu) | hi0, b = ((w1 >> shift) & 0x0F0F0F0Fu) | hi1;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        c[k] = bytef(a, k, off);
        c[4 + k] = bytef(b, k, off);
    }
}
/* bits 0..3 of x to bit 4 of bytes 0..3 */
__device__ __forceinline__ uint32_t spread4(uint32_t x) { return ((x & 0xF) * 0x00204081u & 0x01010101u) << 4; }

/*
 * mv_item<T>: one lane's item of one row, read from the staged chunk: load() reads its bytes (s: the row's staged
 * bytes, off: the block's offset there, sub: the item in the block), then G groups of P pieces of 8 elements:
 * codes(g, p) the 8 codes as floats, col(sub, g, p) the column of the piece's first element from the block's first,
 * scale(g) and bias(g) the group's a and b of w = a q + b (SCALED: a is not 1; BIAS: b is not 0).
 */
template <int T> struct mv_item;

template <int T> struct mv_plain {
    static constexpr int G = 1, P = 1;
    static constexpr bool SCALED = false, BIAS = false;
    static constexpr int NW = T == QW_TYPE_F32 ? 8 : 4;
    uint32_t w[NW];
    template <bool AL> __device__ void load(const uint8_t *s, int off, int, const float *) {
        shw<NW, AL ? 16 : (T == QW_TYPE_F32 ? 4 : 2)>(s, off, w);
    }
    __device__ void codes(int, int, float *c) const {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (T == QW_TYPE_F32) c[2 * i] = q_asf(w[2 * i]), c[2 * i + 1] = q_asf(w[2 * i + 1]);
            else if constexpr (T == QW_TYPE_F16) c[2 * i] = f16f(w[i]), c[2 * i + 1] = f16f(w[i] >> 16);
            else c[2 * i] = bf16f(w[i]), c[2 * i + 1] = q_asf(w[i] & 0xFFFF0000u);
        }
    }
    static __device__ int col(int, int, int) { return 0; }
    __device__ float scale(int) const { return 1.0f; }
    __device__ float bias(int) const { return 0.0f; }
};
template <> struct mv_item<QW_TYPE_F32> : mv_plain<QW_TYPE_F32> {};
template <> struct mv_item<QW_TYPE_F16> : mv_plain<QW_TYPE_F16> {};
template <> struct mv_item<QW_TYPE_BF16> : mv_plain<QW_TYPE_BF16> {};

/* The 32-element blocks: element j in the low nibble of qs[j], j + 16 in the high one (Q8_0: byte j). */
template <int T> struct mv_b32 {
    static constexpr int G = 1, P = 4;
    static constexpr bool SCALED = true, BIAS = T == QW_TYPE_Q4_1 || T == QW_TYPE_Q5_1;
    static constexpr bool FIFTH = T == QW_TYPE_Q5_0 || T == QW_TYPE_Q5_1;
    static constexpr int NQ = T == QW_TYPE_Q8_0 ? 8 : 4;
    /* the offset of qs and its alignment in the AL variant; Q8_0's int8 codes are read as q ^ 0x80 */
    static constexpr int QS = T == QW_TYPE_Q4_1 ? 4 : T == QW_TYPE_Q5_0 ? 6 : T == QW_TYPE_Q5_1 ? 8 : 2;
    static constexpr int QA = T == QW_TYPE_Q4_1 ? 4 : T == QW_TYPE_Q5_1 ? 8 : 2;
    uint32_t q[NQ], h;
    float d, m;
    const float *tbl;
    template <bool AL> __device__ void load(const uint8_t *s, int off, int, const float *table) {
        d = f16f(sh16(s, off));
        m = BIAS ? f16f(sh16(s, off + 2)) : 0.0f;
        if constexpr (FIFTH) {
            uint32_t hw[1];
            shw<1, AL && T == QW_TYPE_Q5_1 ? 4 : 2>(s, off + (T == QW_TYPE_Q5_0 ? 2 : 4), hw);
            h = hw[0];
        }
        shw<NQ, AL ? QA : 2>(s, off + QS, q);
        tbl = table;
    }
    __device__ void codes(int, int p, float *c) const {
        if constexpr (T == QW_TYPE_Q8_0) {
            const uint32_t a = q[2 * p] ^ 0x80808080u, b = q[2 * p + 1] ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) c[k] = bytef(a, k, MAGIC + 128), c[4 + k] = bytef(b, k, MAGIC + 128);
        } else if constexpr (T == QW_TYPE_IQ4_NL) {
            const uint32_t a = q[2 * (p & 1)], b = q[2 * (p & 1) + 1];
            const int sh = 4 * (p >> 1);
#pragma unroll
            for (int k = 0; k < 4; k++) c[k] = tbl[(a >> (8 * k + sh)) & 0xF], c[4 + k] = tbl[(b >> (8 * k + sh)) & 0xF];
        } else {
            uint32_t h0 = 0, h1 = 0;
            if constexpr (FIFTH) { /* piece p is elements 8p .. 8p+7: fifth bits 8p .. 8p+7 */
                const uint32_t hb = h >> (8 * p);
                h0 = spread4(hb), h1 = spread4(hb >> 4);
            }
            /* the codes q - 8 (Q4_0), q - 16 (Q5_0), q (Q4_1, Q5_1) */
            codes8(q[2 * (p & 1)], q[2 * (p & 1) + 1], 4 * (p >> 1), h0, h1,
                   MAGIC + (T == QW_TYPE_Q4_0 ? 8 : T == QW_TYPE_Q5_0 ? 16 : 0), c);
        }
    }
    static __device__ int col(int, int, int p) { return 8 * p; }
    __device__ float scale(int) const { return d; }
    __device__ float bias(int) const { return m; }
};
template <> struct mv_item<QW_TYPE_Q8_0> : mv_b32<QW_TYPE_Q8_0> {};
template <> struct mv_item<QW_TYPE_Q4_0> : mv_b32<QW_TYPE_Q4_0> {};
template <> struct mv_item<QW_TYPE_Q4_1> : mv_b32<QW_TYPE_Q4_1> {};
template <> struct mv_item<QW_TYPE_Q5_0> : mv_b32<QW_TYPE_Q5_0> {};
template <> struct mv_item<QW_TYPE_Q5_1> : mv_b32<QW_TYPE_Q5_1> {};
template <> struct mv_item<QW_TYPE_IQ4_NL> : mv_b32<QW_TYPE_IQ4_NL> {};

/* Q4_K / Q5_K: item sub = 2g + h of a super-block is the 16 bytes qs[32g + 16h ..]: group 0 their low nibbles
 * (sub-block 2g, elements 64g + 16h + i), group 1 the high ones (sub-block 2g + 1, 32 further); Q5_K adds bit 2g
 * (2g + 1) of qh[16h + i]. w = (d sc) q - (dmin m). */
template <int T> struct mv_k45 {
    static constexpr int G = 2, P = 2;
    static constexpr bool SCALED = true, BIAS = true, Q5 = T == QW_TYPE_Q5_K;
    uint32_t q[4], qh[4];
    float a[2], b[2];
    int g;
    template <bool AL> __device__ void load(const uint8_t *s, int off, int sub, const float *) {
        constexpr int A = AL ? 16 : 2;
        uint32_t hd[4];
        shw<4, A>(s, off, hd);
        g = sub >> 1;
        const int hh = sub & 1;
        shw<4, A>(s, off + (Q5 ? 48 : 16) + 32 * g + 16 * hh, q);
        if constexpr (Q5) shw<4, A>(s, off + 16 + 16 * hh, qh);
        const float d = f16f(hd[0]), dmin = f16f(hd[0] >> 16);
        /* k4_scale_min for sub-blocks 2g and 2g + 1 at once: their bytes are adjacent, bytes 2 (g & 1) and
         * 2 (g & 1) + 1 of each scale word, decoded as byte pairs */
        const int sh = 16 * (g & 1);
        const uint32_t p0 = hd[1] >> sh, p1 = hd[2] >> sh, p2 = hd[3] >> sh;
        const uint32_t sc = g < 2 ? p0 & 0x3F3Fu : (p2 & 0x0F0Fu) | ((p0 >> 2) & 0x3030u);
        const uint32_t mn = g < 2 ? p1 & 0x3F3Fu : ((p2 >> 4) & 0x0F0Fu) | ((p1 >> 2) & 0x3030u);
#pragma unroll
        for (int gr = 0; gr < 2; gr++) {
            a[gr] = q_mul(d, bytef(sc, gr, MAGIC));
            b[gr] = -q_mul(dmin, bytef(mn, gr, MAGIC));
        }
    }
    __device__ void codes(int gr, int p, float *c) const {
        uint32_t h0 = 0, h1 = 0;
        if constexpr (Q5) {
            const int bit = 2 * g + gr;
            h0 = ((qh[2 * p] >> bit) & 0x01010101u) << 4;
            h1 = ((qh[2 * p + 1] >> bit) & 0x01010101u) << 4;
        }
        codes8(q[2 * p], q[2 * p + 1], 4 * gr, h0, h1, MAGIC, c);
    }
    static __device__ int col(int sub, int gr, int p) { return 64 * (sub >> 1) + 32 * gr + 16 * (sub & 1) + 8 * p; }
    __device__ float scale(int gr) const { return a[gr]; }
    __device__ float bias(int gr) const { return b[gr]; }
};
template <> struct mv_item<QW_TYPE_Q4_K> : mv_k45<QW_TYPE_Q4_K> {};
template <> struct mv_item<QW_TYPE_Q5_K> : mv_k45<QW_TYPE_Q5_K> {};

/* Q6_K: item sub = 4h + m is l = 8m .. 8m+7 of half h; group k (0..3) is elements 128h + 32k + l: ql[64h + l]
 * (k even) or ql[64h + 32 + l] (k odd), low nibble for k < 2, bits (qh[32h + l] >> 2k) & 3 on top, minus 32;
 * scale d * scales[8h + m/2 + 2k]. */
template <> struct mv_item<QW_TYPE_Q6_K> {
    static constexpr int G = 4, P = 1;
    static constexpr bool SCALED = true, BIAS = false;
    uint32_t qa[2], qb[2], qh[2];
    float a[4];
    template <bool> __device__ void load(const uint8_t *s, int off, int sub, const float *) {
        const int h = sub >> 2, m = sub & 3;
        shw<2, 2>(s, off + 64 * h + 8 * m, qa);
        shw<2, 2>(s, off + 64 * h + 32 + 8 * m, qb);
        shw<2, 2>(s, off + 128 + 32 * h + 8 * m, qh);
        uint32_t sc[2];
        shw<2, 2>(s, off + 192 + 8 * h, sc);
        const float d = f16f(sh16(s, off + 208));
#pragma unroll
        for (int k = 0; k < 4; k++) /* the int8 scales[8h + m/2 + 2k]: byte 2 (k & 1) + m/2 of word k/2 */
            a[k] = q_mul(d, bytef(sc[k >> 1] ^ 0x80808080u, 2 * (k & 1) + (m >> 1), MAGIC + 128));
    }
    __device__ void codes(int k, int, float *c) const {
        const uint32_t *src = k & 1 ? qb : qa;
        const uint32_t h0 = ((qh[0] >> (2 * k)) & 0x03030303u) << 4, h1 = ((qh[1] >> (2 * k)) & 0x03030303u) << 4;
        codes8(src[0], src[1], 4 * (k >> 1), h0, h1, MAGIC + 32, c);
    }
    static __device__ int col(int sub, int k, int) { return 128 * (sub >> 2) + 32 * k + 8 * (sub & 3); }
    __device__ float scale(int k) const { return a[k]; }
    __device__ float bias(int) const { return 0.0f; }
};

/* IQ4_XS: item sub = sub-block s, its 16 bytes qs[16s ..] packed as in Q4_0, levels from the table, scale
 * d * (ls - 32), ls 6 bits: the low 4 in scales_l[s/2] (nibble s%2), the high 2 at bit 2s of scales_h. */
template <> struct mv_item<QW_TYPE_IQ4_XS> {
    static constexpr int G = 1, P = 4;
    static constexpr bool SCALED = true, BIAS = false;
    uint32_t q[4];
    float a;
    const float *tbl;
    template <bool AL> __device__ void load(const uint8_t *s, int off, int sub, const float *table) {
        uint32_t hd[2];
        shw<2, AL ? 8 : 2>(s, off, hd);
        shw<4, AL ? 8 : 2>(s, off + 8 + 16 * sub, q);
        const uint32_t ls = ((hd[1] >> (8 * (sub >> 1) + 4 * (sub & 1))) & 0xF) | ((hd[0] >> (16 + 2 * sub)) & 3) << 4;
        a = q_mul(f16f(hd[0]), q_sub(smallf(ls), 32.0f));
        tbl = table;
    }
    __device__ void codes(int, int p, float *c) const {
        const uint32_t x = q[2 * (p & 1)], y = q[2 * (p & 1) + 1];
        const int sh = 4 * (p >> 1);
#pragma unroll
        for (int k = 0; k < 4; k++) c[k] = tbl[(x >> (8 * k + sh)) & 0xF], c[4 + k] = tbl[(y >> (8 * k + sh)) & 0xF];
    }
    static __device__ int col(int sub, int, int p) { return 32 * sub + 8 * p; }
    __device__ float scale(int) const { return a; }
    __device__ float bias(int) const { return 0.0f; }
};

/* ------------------------------------------------------------------ matrix-vector kernel */

struct mv_args {
    const uint8_t *w;          /* the matrix, or NULL: mats */
    const void *const *mats;   /* [n_pairs] the matrix of pair blockIdx.y + pair0 (on the device) */
    int64_t rows, row_bytes, nblk; /* nblk: blocks (pseudo-blocks of 8 for the plain types) per row */
    const float *x;
    int64_t x_tok, x_pair; /* floats from one token's x to the next, from one pair's to the next */
    float *y;
    int64_t y_tok, y_pair;
    int64_t pair0;
    int n_tok, kw;
    int early; /* the rows asked for before the programmatic launch's wait (w: not a pair's) */
};

/* Stage chunk k (blocks k*CBLK ..) of the rows rp[] into dst: 16-byte aligned copies covering the chunk's bytes,
 * none past the matrix's end (wend); the chunk's first byte lands at its address mod 16. */
template <int T, int R>
__device__ __forceinline__ void stage_chunk(uint8_t (*dst)[lay<T>::SROW], const uint8_t *const *rp, int64_t k,
                                            int64_t nblk, const uint8_t *wend, int lane) {
    using L = lay<T>;
    const int64_t blk0 = k * L::CBLK;
    const int bytes = (int)imin(L::CBLK, nblk - blk0) * L::BB;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *p = rp[r] + blk0 * L::BB;
        const uint8_t *a0 = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)15);
        const int nseg = (int)(p - a0 + bytes + 15) >> 4;
        if (a0 + 16 * nseg <= wend) { /* every row but the matrix's last: whole segments */
            for (int s = lane; s < nseg; s += 32) cp_async16n(dst[r] + 16 * s, a0 + 16 * s, 16);
        } else {
            for (int s = lane; s < nseg; s += 32) cp_async16n(dst[r] + 16 * s, a0 + 16 * s, (int)imin(16, wend - (a0 + 16 * s)));
        }
    }
}

/*
 * One lane's item of chunk k for the row group: acc[r][t] += its part of row r . x_t.
 * Few tokens (NT <= 2): per group, S = sum q x in f32, then acc += a S (+ b sum x): the fewest instructions per
 * weight. More tokens: the weight's exact value (a q + b, rounded as the host rounds it) once per row, then one fma
 * per token; the dequantization cost is shared by the tokens and the registers of S are saved.
 */
template <int T, int NT, bool AL, int R>
__device__ __forceinline__ void mv_item_acc(const uint8_t (*st)[lay<T>::SROW], const uint8_t *const *rp, int64_t blk0,
                                            int lane, const float *const *xt, const float *tbl, float (&acc)[R][NT]) {
    using L = lay<T>;
    using I = mv_item<T>;
    constexpr bool EXACT = NT >= 4;
    const int blk = lane / L::IPB, sub = lane % L::IPB;
    const int64_t col0 = (blk0 + blk) * L::BE;
    I it[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int delta = (int)((uintptr_t)(rp[r] + blk0 * L::BB) & 15);
        it[r].template load<AL>(st[r], delta + blk * L::BB, sub, tbl);
    }
#pragma unroll
    for (int g = 0; g < I::G; g++) {
        float S[R][EXACT ? 1 : NT], Sx[EXACT ? 1 : NT];
        if constexpr (!EXACT) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                Sx[t] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) S[r][t] = 0.0f;
            }
        }
#pragma unroll
        for (int p = 0; p < I::P; p++) {
            float c[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) {
                it[r].codes(g, p, c[r]);
                if constexpr (EXACT && I::SCALED) {
                    const float a = it[r].scale(g), b = it[r].bias(g);
#pragma unroll
                    for (int i = 0; i < 8; i++) c[r][i] = I::BIAS ? q_add(q_mul(a, c[r][i]), b) : q_mul(a, c[r][i]);
                }
            }
            const int64_t col = col0 + I::col(sub, g, p);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 x0 = q_ldf4(xt[t] + col), x1 = q_ldf4(xt[t] + col + 4);
                const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                if constexpr (EXACT) {
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[r][t] = q_fma(c[r][i], xv[i], acc[r][t]);
                } else {
                    if constexpr (I::BIAS) {
#pragma unroll
                        for (int i = 0; i < 8; i++) Sx[t] = q_add(Sx[t], xv[i]);
                    }
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < 8; i++) S[r][t] = q_fma(c[r][i], xv[i], S[r][t]);
                }
            }
        }
        if constexpr (!EXACT) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if constexpr (I::SCALED) acc[r][t] = q_fma(it[r].scale(g), S[r][t], acc[r][t]);
                    else acc[r][t] = q_add(acc[r][t], S[r][t]);
                    if constexpr (I::BIAS) acc[r][t] = q_fma(it[r].bias(g), Sx[t], acc[r][t]);
                }
        }
    }
}

/* A warp's chunks k = kwi, kwi + kw, ... of the row group of R rows from row0, two in flight. */
template <int T, int NT, bool AL, int R>
__device__ __forceinline__ void mv_rows(const mv_args &a, const uint8_t *w, int64_t row0, int64_t pair, int kwi,
                                        int lane, uint8_t (*st)[R][lay<T>::SROW], const float *tbl,
                                        float (&acc)[R][NT]) {
    using L = lay<T>;
    const uint8_t *wend = w + a.rows * a.row_bytes;
    const uint8_t *rp[R];
#pragma unroll
    for (int r = 0; r < R; r++) rp[r] = w + imin(row0 + r, a.rows - 1) * a.row_bytes; /* past the end: the last row */
    const float *xt[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xt[t] = a.x + pair * a.x_pair + imin(t, a.n_tok - 1) * a.x_tok;
    const int64_t nchunk = (a.nblk + L::CBLK - 1) / L::CBLK;
    int64_t k = kwi;
    if (k < nchunk) stage_chunk<T, R>(st[0], rp, k, a.nblk, wend, lane);
    cp_commit();
    for (int b = 0; k < nchunk; k += a.kw, b ^= 1) {
        if (k + a.kw < nchunk) stage_chunk<T, R>(st[b ^ 1], rp, k + a.kw, a.nblk, wend, lane);
        cp_commit();
        cp_wait<1>();
        __syncwarp();
        const int64_t blk0 = k * L::CBLK;
        if (lane < imin(32, (a.nblk - blk0) * L::IPB)) mv_item_acc<T, NT, AL, R>(st[b], rp, blk0, lane, xt, tbl, acc);
        __syncwarp();
    }
}

/* One halving step of warp_sum_many: n values to n/2, exchanged with the lane o away (lanes with bit o keep the
 * upper half); recursion keeps every index a constant, so v stays in registers. */
template <int N> __device__ __forceinline__ void warp_halve(float *v, int lane, int o, int *id) {
    if constexpr (N > 1) {
        const bool upper = lane & o;
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            const float lo = v[i], hi = v[i + N / 2];
            const float recv = __shfl_xor_sync(0xffffffffu, upper ? lo : hi, o);
            v[i] = (upper ? hi : lo) + recv;
        }
        *id = 2 * *id + (upper ? 1 : 0);
        warp_halve<N / 2>(v, lane, o >> 1, id);
    }
}
/* Sum V values (a power of 2 up to 32) over the warp: halving steps, then plain butterflies; returns the total of
 * value idx (set), held by the 32/V lanes that share it. */
template <int V> __device__ __forceinline__ float warp_sum_many(float (&v)[V], int lane, int *idx) {
    static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V a power of 2 up to 32");
    *idx = 0;
    warp_halve<V>(v, lane, 16, idx);
    float s = v[0];
#pragma unroll
    for (int o = 16 / V; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

template <int T, int NT, int R = MV_ROWS>
__global__ void __launch_bounds__(MV_THREADS, NT <= 2 ? MV_MINB_DECODE : 1) mv_kernel(mv_args a) {
    using L = lay<T>;
    constexpr int V = R * NT;
    if (a.early && !a.mats) { /* the weights depend on no kernel: their reads start while the one before runs */
        const int warp = threadIdx.x >> 5, kwi = warp % a.kw;
        const int64_t row0 = ((int64_t)blockIdx.x * (MV_WARPS / a.kw) + warp / a.kw) * R;
        for (int r = 0; r < R && row0 + r < a.rows; r++)
            for (int64_t o = (int64_t)(kwi * 32 + (threadIdx.x & 31)) * 128; o < a.row_bytes;
                 o += (int64_t)a.kw * 32 * 128)
                QWC_PREFETCH_L2(a.w + (row0 + r) * a.row_bytes + o);
    }
    QWC_PDL_ENTRY();
    __shared__ __align__(16) uint8_t stage[MV_WARPS][2][R][L::SROW];
    __shared__ float red[MV_WARPS][V];
    __shared__ float tbl[16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if constexpr (T == QW_TYPE_IQ4_NL || T == QW_TYPE_IQ4_XS) {
        if (threadIdx.x < 16) tbl[threadIdx.x] = (float)kvalue(threadIdx.x);
        __syncthreads();
    }
    const int kwi = warp % a.kw;
    const int64_t row0 = ((int64_t)blockIdx.x * (MV_WARPS / a.kw) + warp / a.kw) * R;
    const int64_t pair = a.pair0 + blockIdx.y;
    const uint8_t *w = a.mats ? (const uint8_t *)a.mats[pair] : a.w;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    if (row0 < a.rows && w) { /* a pair without its matrix (NULL: another GPU's expert) gives zeros */
        if (L::AL_OK && ((uintptr_t)w & 15) == 0 && (a.row_bytes & 15) == 0)
            mv_rows<T, NT, L::AL_OK, R>(a, w, row0, pair, kwi, lane, stage[warp], tbl, acc);
        else
            mv_rows<T, NT, false, R>(a, w, row0, pair, kwi, lane, stage[warp], tbl, acc);
    }
    float v[V];
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = acc[i / NT][i % NT];
    int idx;
    const float s = warp_sum_many<V>(v, lane, &idx);
    if ((lane & (32 / V - 1)) == 0) red[warp][idx] = s;
    __syncthreads();
    if (kwi == 0 && lane < V && row0 < a.rows) {
        float sum = red[warp][lane];
        for (int k = 1; k < a.kw; k++) sum += red[warp + k][lane];
        const int r = lane / NT, t = lane % NT;
        if (row0 + r < a.rows && t < a.n_tok) a.y[pair * a.y_pair + t * a.y_tok + row0 + r] = sum;
    }
}

/* The fallback for any shape and alignment (plain rows of any length, x not 16-byte aligned): a warp per row and
 * pair, the exact elements of dq_item dotted with x one token at a time. */
template <int T> __global__ void __launch_bounds__(MV_THREADS) mv_any(mv_args a, int64_t cols) {
    QWC_PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5), pair = a.pair0 + blockIdx.y;
    if (row >= a.rows) return;
    const uint8_t *w0 = a.mats ? (const uint8_t *)a.mats[pair] : a.w;
    const uint8_t *w = w0 + (w0 ? row * a.row_bytes : 0);
    const int64_t ipr = w0 ? (cols + 31) / 32 : 0; /* NULL: zeros */
    for (int t = 0; t < a.n_tok; t++) {
        const float *x = a.x + pair * a.x_pair + t * a.x_tok;
        float acc = 0.0f;
        for (int64_t it = lane; it < ipr; it += 32) {
            float v[32];
            const int cnt = dq_item<T>(w, it, cols, v);
#pragma unroll
            for (int j = 0; j < 32; j++)
                if (j < cnt) acc = q_fma(v[j], x[32 * it + j], acc);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) a.y[pair * a.y_pair + t * a.y_tok + row] = acc;
    }
}

/* ------------------------------------------------------------------ 8-bit activations (integer path) */

/* Rows of x (row r at x + r * ldx, nb blocks of 32 each) to xq [n_rows][nb] exactly as qw_q8a_quantize rounds them
 * (the same f32 operations, correctly rounded): a warp per block, a lane per element. */
__global__ void k_q8a(const float *x, int64_t ldx, int64_t nb, int64_t n_rows, qw_q8a *xq) {
    QWC_PDL_ENTRY();
    const int64_t blk = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= nb * n_rows) return; /* the whole warp */
    qwc_q8a_warp(x[blk / nb * ldx + 32 * (blk % nb) + (threadIdx.x & 31)], xq + blk);
}

/* mvq_kernel asks for each row's cache lines before its loop (QWC_MVQ_PREFETCH 0: not; the same bits) */
#ifndef QWC_MVQ_PREFETCH
#define QWC_MVQ_PREFETCH 1
#endif
constexpr bool MVQ_PREFETCH = QWC_MVQ_PREFETCH;

struct mvq_args {
    const uint8_t *w;        /* the matrix, or NULL: mats */
    const void *const *mats; /* [n_pairs] the matrix of pair blockIdx.y + pair0 */
    int64_t rows, row_bytes, ng; /* ng: groups of 32 per row */
    const qw_q8a *xq;
    int64_t xq_tok, xq_pair; /* blocks from one token's activations to the next, from one pair's to the next */
    float *y;
    int64_t y_tok, y_pair, pair0;
    int n_tok;
    /* n_jobs > 0: the tokens through n_jobs matrices of the same type and row length at once, job blockIdx.y's
     * matrix, rows and output taking the place of w, rows and y, its rows y's stride a token (qwc_matmul_group) */
    int n_jobs;
    int early; /* the rows asked for before the programmatic launch's wait (w or jw: not a pair's) */
    int ks;    /* warps a row (1, 2 or 4): each sums a part of the groups, the parts added in order */
    int walk;  /* Q8_0, Q4_K, Q6_K: mvq_walk */
    int stage; /* a block's rows (w or jw: not a pair's) copied into shared memory before the programmatic launch's
                * wait, read from there (QWC_MVQ_STAGE) */
    const uint8_t *jw[MVQ_JOBS];
    int64_t jrows[MVQ_JOBS];
    int jks[MVQ_JOBS];
    float *jy[MVQ_JOBS];
};

/* the arguments of one matrix (or one matrix per pair), in mvq_args' order; no jobs */
static mvq_args mvq_of(const uint8_t *w, const void *const *mats, int64_t rows, int64_t row_bytes, int64_t ng,
                       const qw_q8a *xq, int64_t xq_tok, int64_t xq_pair, float *y, int64_t y_tok, int64_t y_pair,
                       int64_t pair0, int n_tok) {
    mvq_args a = {};
    a.w = w, a.mats = mats, a.rows = rows, a.row_bytes = row_bytes, a.ng = ng, a.xq = xq, a.xq_tok = xq_tok;
    a.xq_pair = xq_pair, a.y = y, a.y_tok = y_tok, a.y_pair = y_pair, a.pair0 = pair0, a.n_tok = n_tok;
    return a;
}

/*
 * Quantized weights against 8-bit activations (the CPU's default for them): a warp per row, lane l taking groups
 * l, l + 32, ... of 32 weights, each the exact integer sum of q8dot.h and the f32 term d (A isum + B s) of
 * qw_q8a_dot_ref, the lane's terms added in order and the lanes' sums by a fixed butterfly. Every token of a pass
 * runs the same operations as a pass of one (the weights are read again from the cache, not from memory), so a
 * draft step's logits are the bits of one-token steps.
 *
 * A long row of a matrix of few rows (the hyper-connections' down and inject products: 320 and 4 rows of 10,240
 * columns) is cut into ks parts (mvq_ks), each a warp's as above, the parts' sums added in order: more warps read
 * it, each a shorter chain. ks depends on the matrix alone, so every pass gives a row the same sums. A matrix given
 * as an argument (not one found on the device, as a pair's is) has its rows asked for before the programmatic
 * launch's wait: the weights depend on no kernel, so their reads start while the kernel before runs.
 *
 * Tried on the H200 (Flash-Next decode) and dropped: two or four rows a warp sharing the activations' loads (half
 * the warps: 12 % and 25 % slower), a lane's groups four or eight at a time with their loads first (the tail
 * groups computed and dropped: 15 % and 35 % slower), the MoE pairs' matrices asked for by the gather kernel (7 %
 * slower: that kernel ran longer).
 */
/* a group's f32 term d (A isum + B xs) as qw_q8a_dot_ref forms it (isum, A, B from qd_group; d, xs the activation
 * block's scale and sum) */
__device__ __forceinline__ float q8_term(float d, float A, int32_t isum, float B, int32_t xs) {
    return __fmul_rn(d, __fadd_rn(__fmul_rn(A, (float)isum), __fmul_rn(B, (float)xs)));
}

/*
 * A lane's walk along a Q8_0, Q4_K or Q6_K row (mvq_kernel; QWC_MVQ_WALK 0 or QWENC_CUDA_MVQ_WALK=0: qd_group for every
 * group, the same bits). Lane l's groups are g0 = gs + l, g0 + 32, .. with gs a multiple of 32, so what qd_group
 * works out from g is the same for all of a lane's groups and is worked out once: the group's bytes by a pointer
 * that steps by 32 groups, Q4_K's sub-block j = l % 8, which of its 12 scale bytes hold the 6-bit scale and min
 * (by bit-field extracts, the same instructions for every j: qd_k4_scale_min's branch on j < 4 made a warp run
 * both sides), and which nibble of the codes: masked in place, a high nibble as 16 times its value (dp4a of
 * unsigned codes, the exact sum shifted back by 4); Q6_K's below; Q8_0's blocks as qd_group reads them. The same
 * integers and floats as qd_group's. H200, the whole Flash-Next Q4_K decode: 154 -> 161.5 tok/s (Q8_0, Q4_K); the
 * loop unrolled four groups at a time (the compiler's choice without the pragma) gave 155.6.
 */
#ifndef QWC_MVQ_WALK
#define QWC_MVQ_WALK 1
#endif

/* Each walk: get() reads a group's codes c and its floats (A, B and the integer scales), isum() its exact integer sum
 * with an activation block (codes x, sum xs), term() the f32 term d (A isum + B xs) of qw_q8a_dot_ref; next() steps
 * to the lane's next group. */

/* Q8_0: isum = the signed codes' dot, A = d, no B (qd_group's B is 0, and d (A isum + 0 xs) is d (A isum) to the
 * bit once added to a sum that starts at +0: the two differ at most in a zero's sign) */
struct walk_q8_0 {
    const uint8_t *p; /* the group's block */
    float A;
    __device__ walk_q8_0(const uint8_t *r, int g) : p(r + (int64_t)g * 34) {}
    __device__ void next() { p += 32 * 34; }
    __device__ void get(uint32_t *c) {
        A = qd_f16(qd_ld16(p));
        qd_ldw(p + 2, c, 8);
    }
    __device__ int32_t isum(const uint32_t *c, const uint32_t *x, int32_t) const { return qd_dot8(c, x); }
    __device__ float term(float d, int32_t isum, int32_t) const { return __fmul_rn(d, __fmul_rn(A, (float)isum)); }
};

/* Q4_K (the super-block 16-byte aligned): isum = sc_j times the codes' dot, A = d, B = -dmin m_j */
struct walk_q4_k {
    const uint8_t *p; /* the super-block */
    uint32_t qo, msk, nsh, psc, lsc, pmn, p6, l6;
    bool hi;
    float A, B;
    int sc;
    __device__ walk_q4_k(const uint8_t *r, int g) {
        const int j = g & 7, jl = j & 3;
        p = r + (int64_t)(g >> 3) * 144;
        qo = 16 + 32 * (j >> 1);
        msk = j & 1 ? 0xF0F0F0F0u : 0x0F0F0F0Fu, nsh = j & 1 ? 4 : 0;
        hi = j >= 4; /* qd_k4_scale_min: j < 4 the low 6 bits of bytes j and j + 4; else nibbles of byte j + 4 and
                      * the top 2 bits of bytes j - 4 and j */
        psc = 8 * jl, lsc = hi ? 4 : 6, pmn = 8 * jl + (hi ? 4 : 0), p6 = 8 * jl + 6, l6 = hi ? 2 : 0;
    }
    __device__ void next() { p += 4 * 144; }
    __device__ void get(uint32_t *c) {
        const uint4 h = *(const uint4 *)p; /* (p: global or shared memory) */
        const uint4 c0 = *(const uint4 *)(p + qo), c1 = *(const uint4 *)(p + qo + 16);
        c[0] = c0.x & msk, c[1] = c0.y & msk, c[2] = c0.z & msk, c[3] = c0.w & msk;
        c[4] = c1.x & msk, c[5] = c1.y & msk, c[6] = c1.z & msk, c[7] = c1.w & msk;
        sc = (int)(q_bfe(hi ? h.w : h.y, psc, lsc) | q_bfe(h.y, p6, l6) << 4);
        const uint32_t mn = q_bfe(hi ? h.w : h.z, pmn, lsc) | q_bfe(h.z, p6, l6) << 4;
        A = qd_f16(h.x);
        B = qd_mul(-qd_f16(h.x >> 16), (float)mn);
    }
    __device__ int32_t isum(const uint32_t *c, const uint32_t *x, int32_t) const {
        int32_t s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = q_dp4a_us(c[i], x[i], s);
        return sc * (s >> nsh);
    }
    __device__ float term(float d, int32_t isum, int32_t xs) const { return q8_term(d, A, isum, B, xs); }
};

/* Q6_K: the sub-blocks h = j / 4, k = j % 4 of group j = l % 8 (qd_group's), the low codes' nibble and the high
 * codes' 2 bits moved into place by the funnel shifts that read the 2-byte aligned words (qd_ldw_bits), the
 * two halves' scales by one 16-bit load, and the second
 * half's activation sum as the block's sum less the first's (exact integers). A = d, no B (as Q8_0's). */
struct walk_q6_k {
    const uint8_t *p; /* the super-block */
    uint32_t lo, hq, so, ls, hs;
    float A;
    int sc0, sc1;
    __device__ walk_q6_k(const uint8_t *r, int g) {
        const int j = g & 7, h = j >> 2, k = j & 3;
        p = r + (int64_t)(g >> 3) * 210;
        lo = 64 * h + 32 * (k & 1), hq = 128 + 32 * h, so = 192 + 8 * h + 2 * k;
        ls = 4 * (k >> 1), hs = 2 * k;
    }
    __device__ void next() { p += 4 * 210; }
    __device__ void get(uint32_t *c) {
        uint32_t hw[8];
        qd_ldw_bits(p + lo, c, 8, (int)ls, 0x0F0F0F0Fu);
        qd_ldw_bits(p + hq, hw, 8, (int)hs, 0x03030303u);
#pragma unroll
        for (int i = 0; i < 8; i++) c[i] |= hw[i] << 4;
        const uint32_t s2 = *(const unsigned short *)(p + so);
        sc0 = (int8_t)(s2 & 0xFF), sc1 = (int8_t)(s2 >> 8);
        A = qd_f16(*(const unsigned short *)(p + 208));
    }
    __device__ int32_t isum(const uint32_t *c, const uint32_t *x, int32_t xs) const {
        int32_t s0 = 0, s1 = 0, x0 = 0;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            s0 = qd_dp4a(c[w], x[w], s0);
            s1 = qd_dp4a(c[4 + w], x[4 + w], s1);
            x0 = qd_dp4a(0x01010101u, x[w], x0);
        }
        return sc0 * (s0 - 32 * x0) + sc1 * (s1 - 32 * (xs - x0));
    }
    __device__ float term(float d, int32_t isum, int32_t) const { return __fmul_rn(d, __fmul_rn(A, (float)isum)); }
};

template <int T> constexpr bool mvq_walks() {
    return T == QW_TYPE_Q8_0 || T == QW_TYPE_Q4_K || T == QW_TYPE_Q6_K;
}

/* the lanes' sums of mvq_kernel through a walk (Q8_0, Q4_K, Q6_K): the terms of groups g, g + 32, .. < ge in order
 * into acc[t] for each token t < n_tok; xb the activation block of group g for token 0 */
template <int T, int NT>
__device__ __forceinline__ void mvq_walk(const uint8_t *r, int g, int ge, const qw_q8a *xb, int64_t xq_tok, int n_tok,
                                         float *acc) {
    if constexpr (mvq_walks<T>()) {
        using W = std::conditional_t<T == QW_TYPE_Q8_0, walk_q8_0,
                                     std::conditional_t<T == QW_TYPE_Q4_K, walk_q4_k, walk_q6_k>>;
        W w(r, g);
#pragma unroll 1
        for (; g < ge; g += 32, xb += 32, w.next()) {
            uint32_t c[8];
            w.get(c);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n_tok) break;
                const uint2 *src = (const uint2 *)(xb + t * xq_tok); /* 8-byte aligned (d, s, then the codes) */
                uint2 v[5];
#pragma unroll
                for (int i = 0; i < 5; i++) v[i] = __ldg(src + i);
                const uint32_t xw[8] = {v[1].x, v[1].y, v[2].x, v[2].y, v[3].x, v[3].y, v[4].x, v[4].y};
                const int32_t xs = (int32_t)v[0].y;
                acc[t] = __fadd_rn(acc[t], w.term(__uint_as_float(v[0].x), w.isum(c, xw, xs), xs));
            }
        }
    }
}

/* The block's NT threads start asynchronous copies of n bytes from src into shared memory at dst, width (16 or 4;
 * else none) bytes a copy (src, dst and n multiples of it); then cp_commit, and cp_wait<0> (mma.cuh) before
 * the bytes are read */
template <int NT>
__device__ __forceinline__ void block_copy_async(uint8_t *dst, const uint8_t *src, int64_t n, int width) {
    if (width == 16)
        for (int64_t o = 16 * threadIdx.x; o < n; o += 16 * NT) cp_async16(dst + o, src + o, true);
    else if (width == 4)
        for (int64_t o = 4 * threadIdx.x; o < n; o += 4 * NT) cp_async4((uint32_t *)(dst + o), src + o, true);
}

/* mvq_kernel stages a block's rows in shared memory for Q8_0 only (QWC_MVQ_STAGE, mvq_go) */
template <int T> constexpr bool mvq_stages() { return T == QW_TYPE_Q8_0; }

/* A lane's part of mvq_kernel's sums of row r over groups gs .. ge - 1 (the lane's: gs + lane, gs + lane + 32, ..),
 * added into acc[t] for the tokens t < n_tok; xq: the activations' blocks of token 0 (xq_tok blocks a token) */
template <int T, int NT>
__device__ __forceinline__ void mvq_lane(const uint8_t *r, int64_t gs, int64_t ge, const qw_q8a *xq, int64_t xq_tok,
                                         int n_tok, int walk_on, float *acc) {
    const int lane = threadIdx.x & 31;
    const bool walk = mvq_walks<T>() && (T != QW_TYPE_Q4_K || ((uintptr_t)r & 15) == 0) && walk_on;
    if (walk) {
        mvq_walk<T, NT>(r, (int)(gs + lane), (int)ge, xq + gs + lane, xq_tok, n_tok, acc);
        return;
    }
    for (int64_t g = gs + lane; g < ge; g += 32) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok) break;
            const qw_q8a *xb = xq + t * xq_tok + g;
            uint32_t xw[8];
            const uint2 *src = (const uint2 *)xb->q; /* 8-byte aligned: 40-byte blocks, 256-aligned */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint2 v = __ldg(src + i);
                xw[2 * i] = v.x, xw[2 * i + 1] = v.y;
            }
            const int32_t xs = __ldg(&xb->s);
            int32_t isum;
            float A, B;
            qd_group((qw_type)T, r, g, xw, xs, &isum, &A, &B);
            acc[t] = __fadd_rn(acc[t], q8_term(__ldg(&xb->d), A, isum, B, xs));
        }
    }
}

/* the lanes' sums of each token added over the warp (every lane gets them) in mvq_kernel's order */
template <int NT> __device__ __forceinline__ void mvq_warp_sum(float *acc) {
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(0xffffffffu, acc[t], o));
}

/* mvq_kernel's work for weights of type T: the block's rows of its matrix (pair or job blockIdx.y) */
template <int T, int NT>
__device__ __forceinline__ void mvq_rows(const mvq_args &a, float (*red)[NT], uint8_t *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = a.n_jobs ? a.jks[blockIdx.y] : a.ks;
    const int kk = warp % ks;
    const int64_t row0 = (int64_t)blockIdx.x * (MV_WARPS / ks), row = row0 + warp / ks;
    const int64_t row_bytes = a.row_bytes;
    int64_t pair = a.pair0 + blockIdx.y, rows = a.rows, y_tok = a.y_tok;
    const uint8_t *w = a.w;
    float *yo = a.y;
    if (a.n_jobs) w = a.jw[blockIdx.y], rows = y_tok = a.jrows[blockIdx.y], yo = a.jy[blockIdx.y], pair = 0;
    const bool early = MVQ_PREFETCH && a.early && !a.mats, staging = a.stage && !a.mats;
    int stage = 0; /* the block's rows copied into sm, 16 or 4 bytes a copy */
    if (staging) {
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(MV_WARPS / ks, rows - row0)) * row_bytes;
        const uint8_t *src = w + row0 * row_bytes;
        const uintptr_t al = (uintptr_t)src | (uintptr_t)n;
        stage = n <= 0 ? 0 : (al & 15) == 0 ? 16 : (al & 3) == 0 ? 4 : 0;
        block_copy_async<MV_THREADS>(sm, src, n, stage);
        cp_commit();
    }
    if (!stage && early && row < rows)
        for (int64_t o = (int64_t)(kk * 32 + lane) * 128; o < row_bytes; o += (int64_t)ks * 32 * 128)
            QWC_PREFETCH_L2(w + row * row_bytes + o);
    QWC_PDL_ENTRY();
    if (staging) { /* block-uniform */
        cp_wait<0>(); /* every group: the one committed above */
        __syncthreads();
    }
    if (ks == 1 && row >= rows) return; /* (with ks > 1 every warp meets the barrier below) */
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (row < rows) {
        const uint8_t *r0 = a.mats ? (const uint8_t *)a.mats[pair] : w;
        const uint8_t *r = stage ? sm + (row - row0) * row_bytes : r0 + (r0 ? row * row_bytes : 0);
        const int64_t ng = r0 ? a.ng : 0; /* a pair without its matrix (another GPU's expert): zeros */
        const int64_t per = (ng + 32 * ks - 1) / (32 * ks) * 32, gs = kk * per, ge = std::min(ng, gs + per);
        if (MVQ_PREFETCH && !early && !stage) /* the row's lines asked for at once: later groups from L2, not HBM */
            for (int64_t o = (int64_t)(kk * 32 + lane) * 128; o < (r0 ? row_bytes : 0); o += (int64_t)ks * 32 * 128)
                QWC_PREFETCH_L2(r + o);
        mvq_lane<T, NT>(r, gs, ge, a.xq + pair * a.xq_pair, a.xq_tok, a.n_tok, a.walk, acc);
    }
    mvq_warp_sum<NT>(acc);
    if (ks > 1) { /* the row's ks parts added in order */
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) red[warp][t] = acc[t];
        __syncthreads();
        if (kk || row >= rows) return;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[t] = red[warp][t];
            for (int k = 1; k < ks; k++) acc[t] = __fadd_rn(acc[t], red[warp + k][t]);
        }
    }
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < a.n_tok) yo[pair * a.y_pair + t * y_tok + row] = acc[t];
}

template <int T, int NT> __global__ void __launch_bounds__(MV_THREADS) mvq_kernel(mvq_args a) {
    __shared__ float red[MV_WARPS][NT];
    extern __shared__ __align__(16) uint8_t mv_stage[]; /* a.stage: the block's rows */
    mvq_rows<T, NT>(a, red, mv_stage);
}

/* One token's MoE down products and their combine (qwc_pairs_combine, QWC_MOE_DOWN_COMBINE): a block per RPB output
 * rows i, its warp p rows i of pair p's matrix (mats[p]; NULL: zeros) against the pair's activations xq + p ng, each
 * as mvq_kernel sums it (one warp a row), then k_moe_combine's sum for each row i: the shared expert's output (pair
 * shared_pair, or y[i] where it ran on its own; has_shared 0: none) times its gate, then the routed outputs in the
 * order of their expert ids. A row's operations do not depend on RPB (its terms by the same lanes, its own butterfly,
 * its own combine), so every RPB gives the same bits; more rows a block order the slots once for them and keep a
 * warp's rows' loads in flight together. */
struct dc_args {
    const void *const *mats;
    const qw_q8a *xq;
    int64_t row_bytes, ng, rows;
    const int32_t *sel;
    const float *wt, *sg;
    float *y;
    int P, k, sg_logit, has_shared, shared_pair, walk;
};

template <int T, int RPB> __global__ void __launch_bounds__(1024) k_down_combine(dc_args a) {
    __shared__ float out[RPB][32];
    __shared__ int rows[64], ids[64], pos[64];
    __shared__ float w[64], wk[64];
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5;
    const int64_t i0 = (int64_t)blockIdx.x * RPB;
    QWC_PDL_ENTRY();
    float acc[RPB];
    const uint8_t *r0 = (const uint8_t *)a.mats[p];
#pragma unroll
    for (int j = 0; j < RPB; j++) {
        acc[j] = 0.0f;
        if (r0 && i0 + j < a.rows) mvq_lane<T, 1>(r0 + (i0 + j) * a.row_bytes, 0, a.ng, a.xq + p * a.ng, 0, 1, a.walk,
                                                  &acc[j]);
    }
    mvq_warp_sum<RPB>(acc);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < RPB; j++) out[j][p] = acc[j];
    qwc_combine_slots(a.sel, NULL, a.wt, 0, a.k, rows, w, ids, pos, wk); /* (its barriers order out too) */
    const int64_t i = i0 + threadIdx.x;
    if (threadIdx.x < RPB && i < a.rows) {
        const int j = threadIdx.x;
        const float s = a.has_shared ? (a.shared_pair >= 0 ? out[j][a.shared_pair] : a.y[i]) : 0.0f;
        float v = qwc_combine_start(s, a.sg, 0, a.sg_logit, a.has_shared);
        for (int n = 0; n < a.k; n++) v += out[j][rows[n]] * w[n];
        a.y[i] = v;
    }
}

/*
 * A hyper-connection's read for one token with its up product (hc_read with up; model_ops.cu's cu_hc_read): the
 * low-rank u [ng * 32] through silu(u / C) and its 8-bit rounding (k_divide's operations and qwc_q8a_warp's), the
 * up product's rows m[s H + h] (mvq_kernel's sums: lane l adds the terms of groups l, l + 32, .. from 0, then the
 * warp's butterfly), then a[h] = (1/C) sum_s sigmoid(m[s H + h]) xn[s H + h] and its rounding (k_hc_read's). A
 * block per 32 values of h (its C 32-row runs of the matrix), each warp HCU_BATCH rows at a time so that their
 * loads are in flight together; block 0 also makes inj = 2 sigmoid(inj / C). Three kernels' bits in one.
 * stage (the runs fit in HCU_STAGE bytes, 16-byte aligned; QWC_HC_STAGE): the block starts asynchronous copies of
 * its runs into shared memory before the programmatic launch's wait (the weights depend on no kernel, so they come
 * while the kernel before runs, or beside u when the block starts after it) and reads its rows from there; xn is
 * asked for right after the wait, beside u, not after the rows.
 */
constexpr int HCU_MAXC = 8, HCU_MAXG = 64, HCU_WARPS = 16, HCU_BATCH = 8;
constexpr int HCU_STAGE = 44 * 1024; /* with the static shared memory, under the 48 KiB a block has unasked */
#ifndef QWC_HC_STAGE
#define QWC_HC_STAGE 1
#endif
struct hcu_args {
    const uint8_t *w;
    int64_t row_bytes;
    int ng, C, H, early, stage;
    const float *u, *xn;
    float *a, *inj;
    qw_q8a *xq; /* a's rounding, or NULL */
};

template <int T> __global__ void __launch_bounds__(32 * HCU_WARPS) k_hc_up_read(hcu_args a) {
    __shared__ qw_q8a uq[HCU_MAXG];
    __shared__ float ms[HCU_MAXC * 32];
    extern __shared__ __align__(16) uint8_t stage[]; /* the C runs, 32 rows each, when a.stage */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t h0 = (int64_t)blockIdx.x * 32, run = 32 * a.row_bytes;
    if (a.stage) { /* the weights depend on no kernel: asked for before the wait, waited for before the rows */
        for (int s = 0; s < a.C; s++)
            block_copy_async<32 * HCU_WARPS>(stage + s * run, a.w + ((int64_t)s * a.H + h0) * a.row_bytes, run, 16);
        cp_commit();
    } else if (MVQ_PREFETCH && a.early) { /* the weights depend on no kernel */
        for (int s = 0; s < a.C; s++)
            for (int64_t o = (int64_t)threadIdx.x * 128; o < run; o += 32 * HCU_WARPS * 128)
                QWC_PREFETCH_L2(a.w + ((int64_t)s * a.H + h0) * a.row_bytes + o);
    }
    QWC_PDL_ENTRY();
    float xv[HCU_MAXC]; /* warp 0: xn of its value of h in each stream, asked for now */
    if (warp == 0)
#pragma unroll
        for (int c = 0; c < HCU_MAXC; c++)
            if (c < a.C) xv[c] = a.xn[(int64_t)c * a.H + h0 + lane];
    for (int b = warp; b < a.ng; b += HCU_WARPS) {
        float v = a.u[32 * b + lane] / (float)a.C;
        qwc_q8a_warp(qwc_silu(v), &uq[b]);
    }
    if (a.stage) cp_wait<0>(); /* every group: the one committed above */
    __syncthreads();
    const int per = 32 * a.C / HCU_WARPS; /* rows a warp: q = warp * per + i is row (q / 32) H + h0 + q % 32 */
    for (int i0 = 0; i0 < per; i0 += HCU_BATCH) {
        float acc[HCU_BATCH];
        const uint8_t *r[HCU_BATCH];
#pragma unroll
        for (int k = 0; k < HCU_BATCH; k++) {
            const int q = warp * per + std::min(i0 + k, per - 1);
            acc[k] = 0.0f;
            r[k] = a.stage ? stage + q * a.row_bytes : a.w + ((int64_t)(q / 32) * a.H + h0 + q % 32) * a.row_bytes;
        }
        for (int g = lane; g < a.ng; g += 32) {
            const qw_q8a *xb = &uq[g];
            const int32_t xs = xb->s;
            const float d = xb->d;
            uint32_t xw[8];
            const uint2 *src = (const uint2 *)xb->q;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint2 v = src[k];
                xw[2 * k] = v.x, xw[2 * k + 1] = v.y;
            }
#pragma unroll
            for (int k = 0; k < HCU_BATCH; k++) {
                int32_t isum;
                float A, B;
                qd_group((qw_type)T, r[k], g, xw, xs, &isum, &A, &B);
                acc[k] = __fadd_rn(acc[k], q8_term(d, A, isum, B, xs));
            }
        }
#pragma unroll
        for (int k = 0; k < HCU_BATCH; k++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[k] = __fadd_rn(acc[k], __shfl_xor_sync(0xffffffffu, acc[k], o));
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < HCU_BATCH; k++)
                if (i0 + k < per) ms[warp * per + i0 + k] = acc[k];
    }
    __syncthreads();
    if (warp == 0) {
        const int64_t h = h0 + lane;
        float sum = 0;
#pragma unroll
        for (int c = 0; c < HCU_MAXC; c++)
            if (c < a.C) sum += qwc_sigmoid(ms[32 * c + lane]) * xv[c];
        const float v = sum / (float)a.C;
        a.a[h] = v;
        if (a.xq) qwc_q8a_warp(v, a.xq + h / 32);
    }
    if (blockIdx.x == 0 && a.inj && threadIdx.x < a.C) {
        a.inj[threadIdx.x] = qwc_sigmoid(a.inj[threadIdx.x] / (float)a.C) * 2.0f;
    }
}

/* ------------------------------------------------------------------ launches */

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* y [n][cols] = the rows src(0 .. n-1) as f32 */
template <int T, class Src> void dq_launch(qwc *c, float *y, int64_t n, int64_t cols, const Src &src) {
    const int64_t total = n * cdiv(cols, 32);
    if (total <= 0) return;
    const unsigned grid = (unsigned)std::min<int64_t>(cdiv(total, DQ_THREADS), (int64_t)1 << 20);
    qwc_launch(dq_rows<T, Src>, grid, DQ_THREADS, 0, qwc_stream(c), y, n, cols, src);
    QWC_LAUNCHED();
}

/* The weights asked for before the programmatic launch's wait (QWENC_CUDA_MV_EARLY=0 in the environment: after it,
 * as before; the same results, to measure what it saves). */
static int mv_early() {
    static int r = -1;
    return qwc_env_switch("QWENC_CUDA_MV_EARLY", 1, &r);
}

/* One token's product whose row groups would fill few blocks (fewer than MV_ONE_ROW_BLOCKS: the MoE's f32 router,
 * 512 rows in 128 blocks; most products of a BF16 model) takes a row a warp instead of a group of MV_ROWS: four
 * times the warps, each with the same chunks (kw is chosen for the groups of MV_ROWS as before) and the same sums
 * (a row's partial sums do not depend on the rows beside it, and warp_sum_many adds each value in the butterfly's
 * tree whatever their number), so the same bits. QWC_MV_ONE_ROW 0, or QWENC_CUDA_MV_ONE_ROW=0 in the
 * environment: groups of MV_ROWS throughout (tests/gpu/fusions.sh compares the bits). */
#ifndef QWC_MV_ONE_ROW
#define QWC_MV_ONE_ROW 1
#endif
constexpr int64_t MV_ONE_ROW_BLOCKS = 264;
static int mv_one_row_on() {
    static int r = -1;
    return QWC_MV_ONE_ROW && qwc_env_switch("QWENC_CUDA_MV_ONE_ROW", 1, &r);
}

/* the matrix-vector kernels of type T for one pass of n_tok <= MV_PASS_TOK tokens (n_pairs pairs: blockIdx.y) */
template <int T> void mv_launch(qwc *c, mv_args a, int64_t cols, int64_t n_pairs) {
    using L = lay<T>;
    const bool fast = ((uintptr_t)a.x & 15) == 0 && (a.x_tok & 3) == 0 && (a.x_pair & 3) == 0 &&
                      (!L::PLAIN || cols % 8 == 0) && (a.mats || ((uintptr_t)a.w & (T == QW_TYPE_F32 ? 3 : 1)) == 0);
    cudaStream_t s = qwc_stream(c);
    for (int64_t p0 = 0; p0 < n_pairs; p0 += 65535) {
        a.pair0 = p0;
        const unsigned ny = (unsigned)std::min<int64_t>(n_pairs - p0, 65535);
        if (!fast) {
            qwc_launch(mv_any<T>, dim3((unsigned)cdiv(a.rows, MV_WARPS), ny), MV_THREADS, 0, s, a, cols);
            QWC_LAUNCHED();
            continue;
        }
        a.nblk = cols / L::BE;
        a.early = mv_early();
        const int64_t nchunk = cdiv(a.nblk, L::CBLK), groups = cdiv(a.rows, MV_ROWS) * n_pairs;
        const int64_t target = a.n_tok <= 2 ? MV_TARGET_DECODE : MV_TARGET_WARPS;
        a.kw = 1;
        while (a.kw < MV_WARPS && 2 * a.kw <= nchunk && groups * a.kw < target) a.kw *= 2;
        const dim3 grid((unsigned)cdiv(cdiv(a.rows, MV_ROWS), MV_WARPS / a.kw), ny);
        const int nt = a.n_tok;
        if (nt == 1 && (int64_t)grid.x * ny < MV_ONE_ROW_BLOCKS && mv_one_row_on())
            qwc_launch(mv_kernel<T, 1, 1>, dim3((unsigned)cdiv(a.rows, MV_WARPS / a.kw), ny), MV_THREADS, 0, s, a);
        else if (nt == 1) qwc_launch(mv_kernel<T, 1>, grid, MV_THREADS, 0, s, a);
        else if (nt == 2) qwc_launch(mv_kernel<T, 2>, grid, MV_THREADS, 0, s, a);
        else if (nt <= 4) qwc_launch(mv_kernel<T, 4>, grid, MV_THREADS, 0, s, a);
        else qwc_launch(mv_kernel<T, 8>, grid, MV_THREADS, 0, s, a);
        QWC_LAUNCHED();
    }
}

/* The integer path for n_rows activation rows of cols (x rows ldx apart) when it applies: the backend asks for it
 * (qwc_q8_on), the type has it and the rows fit the activation buffer; returns the quantized rows, else NULL. */
template <int T> constexpr bool q8_type() {
    return T != QW_TYPE_F32 && T != QW_TYPE_F16 && T != QW_TYPE_BF16;
}
/* x's rows rounded into xq (the fixed buffer or the prompt's): as the product before left them (a chain), as the
 * kernel that wrote x left them, or rounded now */
static const qw_q8a *q8_into(qwc *c, qw_q8a *xq, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    if (qwc_q8_same(c, xq, x, ldx, cols, n_rows)) return xq; /* the product before rounded the same x */
    if (qwc_q8_fresh(c, x, ldx, cols, n_rows) != xq) { /* else the kernel that wrote x rounded it there */
        const int64_t nb = cols / 32, warps = nb * n_rows;
        qwc_launch(k_q8a, (unsigned)cdiv(warps, 8), 256, 0, qwc_stream(c), x, ldx, nb, n_rows, xq);
        QWC_LAUNCHED();
    }
    qwc_q8_note(c, xq, x, ldx, cols, n_rows);
    return xq;
}
template <int T> const qw_q8a *q8_rows(qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    if (!q8_type<T>() || !qwc_q8_on(c) || !qd_supported((qw_type)T) || cols % 32 || n_rows <= 0) return NULL;
    size_t cap = 0;
    qw_q8a *xq = (qw_q8a *)qwc_q8_buf(c, &cap);
    if (!xq || (size_t)(cols / 32 * n_rows) * sizeof(qw_q8a) > cap) return NULL;
    return q8_into(c, xq, x, ldx, cols, n_rows);
}

/* Warps a row: a row of many groups in a matrix of few rows is cut into parts (up to 4), so that more warps read
 * it; a function of the matrix alone (not of the tokens or pairs), so every pass gives a row the same sums.
 * QWENC_CUDA_MVQ_KS=1, 2 or 4 in the environment fixes it for every matrix (to measure what the cut saves). */
int mvq_ks(int64_t rows, int64_t ng) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("QWENC_CUDA_MVQ_KS");
        mode = e ? atoi(e) : 0;
    }
    if (mode == 1 || mode == 2 || mode == 4) return mode;
    int ks = 1;
    while (ks < MV_WARPS && rows * ks < 4096 && ng / (2 * ks) >= 64) ks *= 2;
    return ks;
}

/* mvq_walk on (QWENC_CUDA_MVQ_WALK=0 in the environment: qd_group for every group, the same bits, to measure what
 * the walk saves) */
static int mvq_walk_on() {
    static int r = -1;
    return QWC_MVQ_WALK && qwc_env_switch("QWENC_CUDA_MVQ_WALK", 1, &r);
}

/* A block's rows through shared memory (mvq_rows' stage): asked for at once by asynchronous copies before the
 * programmatic launch's wait (the weights depend on no kernel), so a block's weights are one round trip, during
 * the kernel before for the blocks that start then, instead of a lane's groups one load after another. Q8_0 only
 * (mvq_stages):
 * H200, staged against not in one binary, the Flash-Next cut's decode at Q8_0 691 -> 718 tok/s, at Q4_K (its
 * Q8_0 tensors staged) 753 -> 773, the whole model 169.7 -> 171.4; every type staged took the cut at Q4_K from
 * 760 to 750 and the whole model nowhere (a lane's 16-byte reads of Q4_K groups 144 bytes apart meet shared
 * memory's banks badly). Up to MVQ_STAGE_MAX bytes a block; QWC_MVQ_STAGE 0, or QWENC_CUDA_MVQ_STAGE=0 in the
 * environment: not (the same bits, to measure what it saves). */
#ifndef QWC_MVQ_STAGE
#define QWC_MVQ_STAGE 1
#endif
constexpr int64_t MVQ_STAGE_MAX = 32 * 1024;
static int mvq_stage_on() {
    static int r = -1;
    return QWC_MVQ_STAGE && qwc_env_switch("QWENC_CUDA_MVQ_STAGE", 1, &r);
}

/* one launch of mvq_kernel */
template <int T> void mvq_go(cudaStream_t s, mvq_args a, unsigned ny) {
    a.early = mv_early();
    a.walk = mvq_walk_on();
    int64_t nb = 0; /* blocks a matrix */
    if (a.n_jobs)
        for (int j = 0; j < a.n_jobs; j++) {
            a.jks[j] = mvq_ks(a.jrows[j], a.ng);
            nb = std::max(nb, cdiv(a.jrows[j], MV_WARPS / a.jks[j]));
        }
    else
        a.ks = mvq_ks(a.rows, a.ng), nb = cdiv(a.rows, MV_WARPS / a.ks);
    int64_t smem = 0; /* a block's rows */
    for (int j = 0; j < std::max(a.n_jobs, 1); j++)
        smem = std::max<int64_t>(smem, MV_WARPS / (a.n_jobs ? a.jks[j] : a.ks) * a.row_bytes);
    a.stage = mvq_stages<T>() && !a.mats && smem <= MVQ_STAGE_MAX && mvq_stage_on();
    const size_t sb = a.stage ? (size_t)smem : 0;
    const dim3 grid((unsigned)nb, ny);
    if (a.n_tok == 1) qwc_launch(mvq_kernel<T, 1>, grid, MV_THREADS, sb, s, a);
    else if (a.n_tok == 2) qwc_launch(mvq_kernel<T, 2>, grid, MV_THREADS, sb, s, a);
    else if (a.n_tok <= 4) qwc_launch(mvq_kernel<T, 4>, grid, MV_THREADS, sb, s, a);
    else qwc_launch(mvq_kernel<T, 8>, grid, MV_THREADS, sb, s, a);
    QWC_LAUNCHED();
}

/* mvq_kernel over n_pairs pairs, passes of up to 8 tokens */
template <int T> void mvq_launch(qwc *c, mvq_args a, int64_t n_pairs) {
    cudaStream_t s = qwc_stream(c);
    const int n_tok = a.n_tok;
    const qw_q8a *xq0 = a.xq;
    float *y0 = a.y;
    for (int t0 = 0; t0 < n_tok; t0 += MV_PASS_TOK) {
        a.n_tok = std::min(MV_PASS_TOK, n_tok - t0);
        a.xq = xq0 + t0 * a.xq_tok;
        a.y = y0 + t0 * a.y_tok;
        for (int64_t p0 = 0; p0 < n_pairs; p0 += 65535) {
            a.pair0 = p0;
            mvq_go<T>(s, a, (unsigned)std::min<int64_t>(n_pairs - p0, 65535));
        }
    }
}

/* Narrow products: when cuBLAS's output tiles (about 128 x 128) over m rows and n_tok tokens would not fill one
 * wave of the GPU and the rows are long (the hyper-connections' down and inject products: 320 and 4 rows of 10,240
 * columns), the columns are cut into S equal slices, one batched GEMM gives each slice's f32 sums and
 * qwc_slice_sum adds the S partial sums in slice order: an f32 sum of the same exact products in another order,
 * within the SGEMM's own bound. gemm_slices: S (1: no cut); slices of a multiple of 4 columns, at least SPLIT_COLS
 * each. */
constexpr int64_t SPLIT_WAVE = 132, SPLIT_BLOCKS = 264, SPLIT_COLS = 1024;
constexpr int SPLIT_MAX = 16;

int gemm_slices(int64_t m, int64_t cols, int n_tok) {
    const int64_t tiles = cdiv(m, 128) * cdiv(n_tok, 128);
    if (tiles <= 0 || tiles >= SPLIT_WAVE || cols < 2 * SPLIT_COLS) return 1;
    const int64_t want = std::min<int64_t>({SPLIT_MAX, cols / SPLIT_COLS, cdiv(SPLIT_BLOCKS, tiles)});
    for (int64_t s = want; s >= 2; s--)
        if (cols % (4 * s) == 0) return (int)s;
    return 1;
}

/* the floats of partial sums gemm needs in its work buffer for m rows */
int64_t gemm_work(int64_t m, int64_t cols, int n_tok) {
    const int s = gemm_slices(m, cols, n_tok);
    return s > 1 ? (int64_t)s * m * n_tok : 0;
}

/* y [n_tok][rows] = x W^T through cuBLAS: column-major, y^T [rows][n_tok] = W^T^T x^T; W here [m][cols] from A.
 * work: gemm_work(m, cols, n_tok) floats for a narrow product's slices (NULL: never sliced). */
void gemm(qwc *c, float *y, int64_t ldy, const float *A, int64_t m, int64_t cols, const float *x, int n_tok,
          float *work) {
    const float one = 1.0f, zero = 0.0f;
    QWC_WROTE();
    const int S = work ? gemm_slices(m, cols, n_tok) : 1;
    if (S > 1) {
        const int64_t ks = cols / S, n = m * n_tok;
        QWC_CUBLAS(cublasGemmStridedBatchedEx(qwc_cublas(c), CUBLAS_OP_T, CUBLAS_OP_N, (int)m, n_tok, (int)ks, &one, A,
                                              CUDA_R_32F, (int)cols, ks, x, CUDA_R_32F, (int)cols, ks, &zero, work,
                                              CUDA_R_32F, (int)m, n, S, CUBLAS_COMPUTE_32F_PEDANTIC,
                                              CUBLAS_GEMM_DEFAULT));
        qwc_slice_sum(c, y, ldy, work, m, n_tok, S);
        return;
    }
    QWC_CUBLAS(cublasGemmEx(qwc_cublas(c), CUBLAS_OP_T, CUBLAS_OP_N, (int)m, n_tok, (int)cols, &one, A, CUDA_R_32F,
                            (int)cols, x, CUDA_R_32F, (int)cols, &zero, y, CUDA_R_32F, (int)ldy,
                            CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
}

/* BF16 weights and many tokens on the tensor cores (QWC_BF16_SPLIT 0: dequantized f32 tiles and the f32 SGEMM):
 * each f32 activation is the exact sum of three bf16 pieces (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi -
 * mid): 8 + 8 + 8 significand bits, every difference exact in f32), the weights are bf16 already, so one bf16 GEMM
 * over the 3 n tokens' pieces (f32 accumulation: every product exact) and the sum lo + mid + hi per output give an
 * f32 sum of the exact products, as the SGEMM does, at the tensor cores' rate. */
#ifndef QWC_BF16_SPLIT
#define QWC_BF16_SPLIT 1
#endif

__global__ void k_bf16_split(uint16_t *p, const float *x, int64_t n, int64_t piece) {
    QWC_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float r = x[i];
    for (int k = 0; k < 3; k++) { /* round to nearest even; the rest stays exact */
        const uint32_t u = __float_as_uint(r);
        const uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)(u >> 16 | 0x40) /* NaN stays NaN */
                                                          : (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
        p[k * piece + i] = h;
        r = __fsub_rn(r, __uint_as_float((uint32_t)h << 16));
    }
}

__global__ void k_bf16_sum(float *y, const float *y3, int64_t n) {
    QWC_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fadd_rn(y3[2 * n + i], y3[n + i]), y3[i]);
}

/* y [n_tok][rows] = x W^T for BF16 W [rows][cols], in chunks of tokens whose pieces and partial sums fit 256 MiB */
void bf16_split_gemm(qwc *c, float *y, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int n_tok) {
    const size_t per_tok = (size_t)cols * 3 * sizeof(uint16_t) + (size_t)rows * 3 * sizeof(float);
    const int chunk = (int)std::max<size_t>(1, std::min<size_t>((size_t)n_tok, GEMM_TILE_BYTES / per_tok));
    char *buf = (char *)qwc_scratch(c, per_tok * (size_t)chunk + 256); /* + 256: y3's alignment below */
    cudaStream_t s = qwc_stream(c);
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = qwc_cublas(c);
    for (int t0 = 0; t0 < n_tok; t0 += chunk) {
        const int nt = std::min(chunk, n_tok - t0);
        uint16_t *p = (uint16_t *)buf;
        float *y3 = (float *)(buf + ((size_t)nt * cols * 3 * sizeof(uint16_t) + 255) / 256 * 256);
        const int64_t nx = (int64_t)nt * cols, ny = (int64_t)nt * rows;
        qwc_launch(k_bf16_split, (unsigned)cdiv(nx, 256), 256, 0, s, p, x + (int64_t)t0 * cols, nx, nx);
        QWC_LAUNCHED();
        QWC_WROTE();
        QWC_CUBLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH)); /* the tensor cores, f32 accumulation */
        QWC_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, 3 * nt, (int)cols, &one, w, CUDA_R_16BF,
                                (int)cols, p, CUDA_R_16BF, (int)cols, &zero, y3, CUDA_R_32F, (int)rows,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        QWC_CUBLAS(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
        qwc_launch(k_bf16_sum, (unsigned)cdiv(ny, 256), 256, 0, s, y + (int64_t)t0 * rows, y3, ny);
        QWC_LAUNCHED();
    }
}

template <int T> struct op_matmul {
    static void run(qwc *c, float *y, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int n_tok) {
        const int64_t row_bytes = (int64_t)qw_type_row_size((qw_type)T, cols);
        if (n_tok <= MV_MAX_TOK) {
            const qw_q8a *xq = q8_type<T>() ? q8_rows<T>(c, x, cols, cols, n_tok) : NULL;
            if constexpr (q8_type<T>()) if (xq) { /* tokens cols / 32 blocks apart */
                const int64_t ng = cols / 32;
                mvq_launch<T>(c, mvq_of(w, NULL, rows, row_bytes, ng, xq, ng, 0, y, rows, 0, 0, n_tok), 1);
                return;
            }
            for (int t0 = 0; t0 < n_tok; t0 += MV_PASS_TOK) {
                mv_args a = {};
                a.w = w;
                a.rows = rows;
                a.row_bytes = row_bytes;
                a.x = x + (int64_t)t0 * cols;
                a.x_tok = cols;
                a.y = y + (int64_t)t0 * rows;
                a.y_tok = rows;
                a.n_tok = std::min(MV_PASS_TOK, n_tok - t0);
                mv_launch<T>(c, a, cols, 1);
            }
            return;
        }
        if (T == QW_TYPE_BF16 && QWC_BF16_SPLIT && cols <= INT32_MAX && rows <= INT32_MAX) {
            bf16_split_gemm(c, y, w, rows, cols, x, n_tok);
            return;
        }
        if constexpr (q8_type<T>()) /* the integer path: the tensor cores (mmq.cu), x rounded once */
            if (qwc_q8_on(c) && qwc_mmq_takes((qw_type)T, cols)) {
                const qw_q8a *xq = q8_rows<T>(c, x, cols, cols, n_tok);
                if (!xq) { /* more rows than the fixed buffer holds: the prompt's buffer, by the same rules */
                    qw_q8a *big = qwc_q8_big(c, (size_t)(n_tok * (cols / 32)) * sizeof(qw_q8a));
                    if (big) xq = q8_into(c, big, x, cols, cols, n_tok);
                }
                /* the scratch: x's 8-bit rows when neither buffer can hold them, then a narrow product's partial
                 * sums */
                const size_t xb = xq ? 0 : ((size_t)(n_tok * (cols / 32)) * sizeof(qw_q8a) + 255) / 256 * 256;
                const size_t wb = (size_t)qwc_mmq_work(rows, cols, n_tok) * sizeof(float);
                char *sc = xb + wb ? (char *)qwc_scratch(c, xb + wb) : NULL;
                if (!xq) {
                    qwc_q8a_rows(c, (qw_q8a *)sc, x, cols, cols, n_tok);
                    xq = (const qw_q8a *)sc;
                }
                qwc_mmq(c, y, rows, w, (qw_type)T, rows, cols, xq, cols / 32, n_tok, wb ? (float *)(sc + xb) : NULL);
                return;
            }
        /* tiles of rows: each dequantized into the scratch (F32 weights: read in place), then one GEMM; a tile
         * also keeps every cuBLAS dimension and offset within int */
        int64_t tile = std::max<int64_t>(1, (int64_t)(GEMM_TILE_BYTES / sizeof(float)) / cols);
        if (tile >= 128) tile -= tile % 128;
        tile = std::min(tile, rows);
        const int64_t tiled = T == QW_TYPE_F32 ? 0 : (tile * cols + 63) / 64 * 64; /* floats of a dequantized tile */
        const int64_t work = std::max(gemm_work(tile, cols, n_tok), gemm_work(rows % tile, cols, n_tok));
        float *buf = tiled + work ? (float *)qwc_scratch(c, (size_t)(tiled + work) * sizeof(float)) : NULL;
        for (int64_t r0 = 0; r0 < rows; r0 += tile) {
            const int64_t nr = std::min(tile, rows - r0);
            if (T == QW_TYPE_F32) {
                gemm(c, y + r0, rows, (const float *)(w + r0 * row_bytes), nr, cols, x, n_tok, buf);
            } else {
                dq_launch<T>(c, buf, nr, cols, rows_dense{w, row_bytes, r0});
                gemm(c, y + r0, rows, buf, nr, cols, x, n_tok, buf + tiled);
            }
        }
    }
};

template <int T> struct op_get_rows {
    static void run(qwc *c, float *y, const uint8_t *w, int64_t n_rows, int64_t cols, const int32_t *ids, int n) {
        dq_launch<T>(c, y, n, cols, rows_ids{w, (int64_t)qw_type_row_size((qw_type)T, cols), n_rows, ids});
    }
};

template <int T> struct op_gather {
    static void run(qwc *c, float *y, const void *const *chunks, int64_t dh, int n_chunks, int64_t chunk_rows,
                    const int64_t *rows, int64_t n) {
        dq_launch<T>(c, y, n, dh, rows_chunks{chunks, (int64_t)qw_type_row_size((qw_type)T, dh), chunk_rows, rows, n_chunks});
    }
};

template <int T> struct op_pairs {
    static void run(qwc *c, float *y, const void *const *mats, int64_t rows, int64_t cols, const float *x,
                    int64_t x_stride, int n_pairs) {
        const int64_t row_bytes = (int64_t)qw_type_row_size((qw_type)T, cols);
        const int64_t ldx = x_stride ? x_stride : cols, nx = x_stride ? n_pairs : 1;
        const qw_q8a *xq = q8_type<T>() ? q8_rows<T>(c, x, ldx, cols, nx) : NULL;
        if constexpr (q8_type<T>()) if (xq) { /* pairs cols / 32 blocks apart, or all one x */
            const int64_t ng = cols / 32;
            const mvq_args a = mvq_of(NULL, mats, rows, row_bytes, ng, xq, 0, x_stride ? ng : 0, y, 0, rows, 0, 1);
            mvq_launch<T>(c, a, n_pairs);
            return;
        }
        mv_args a = {};
        a.mats = mats;
        a.rows = rows;
        a.row_bytes = row_bytes;
        a.x = x;
        a.x_pair = x_stride;
        a.y = y;
        a.y_pair = rows;
        a.n_tok = 1;
        mv_launch<T>(c, a, cols, n_pairs);
    }
};

/* n_tok <= MV_PASS_TOK tokens through n <= MVQ_JOBS matrices of type T that read the same x: one integer launch
 * (when the integer path takes x); *done 0: not taken. */
template <int T> struct op_group {
    static void run(qwc *c, const uint8_t *const *w, const int64_t *rows, float *const *y, int n, int64_t cols,
                    const float *x, int n_tok, int *done) {
        *done = 0;
        if constexpr (q8_type<T>()) {
            const qw_q8a *xq = q8_rows<T>(c, x, cols, cols, n_tok);
            if (!xq) return;
            mvq_args a = {};
            a.row_bytes = (int64_t)qw_type_row_size((qw_type)T, cols);
            a.ng = cols / 32, a.xq = xq, a.xq_tok = a.ng, a.n_tok = n_tok, a.n_jobs = n;
            for (int j = 0; j < n; j++) a.jw[j] = w[j], a.jrows[j] = rows[j], a.jy[j] = y[j];
            mvq_go<T>(qwc_stream(c), a, (unsigned)n);
            *done = 1;
        }
    }
};

/* Output rows a block of k_down_combine: 4, or 1 with QWENC_CUDA_DC_ROWS=1 in the environment (a block a row, as
 * before; the same bits, tests/gpu/fusions.sh) */
static int dc_rows() {
    static int r = -1;
    if (r < 0) {
        const char *e = getenv("QWENC_CUDA_DC_ROWS");
        r = e && e[0] ? (atoi(e) >= 4 ? 4 : 1) : 4;
    }
    return r;
}

/* k_down_combine for weights of type T (the integer path's types; *done 0: not taken) */
template <int T> struct op_down_combine {
    static void run(qwc *c, dc_args a, const float *x, int64_t cols, int *done) {
        *done = 0;
        if constexpr (q8_type<T>()) {
            a.xq = q8_rows<T>(c, x, cols, cols, a.P);
            if (!a.xq) return;
            a.row_bytes = (int64_t)qw_type_row_size((qw_type)T, cols), a.ng = cols / 32, a.walk = mvq_walk_on();
            if (dc_rows() >= 4)
                qwc_launch(k_down_combine<T, 4>, (unsigned)cdiv(a.rows, 4), 32 * a.P, 0, qwc_stream(c), a);
            else qwc_launch(k_down_combine<T, 1>, (unsigned)a.rows, 32 * a.P, 0, qwc_stream(c), a);
            QWC_LAUNCHED();
            *done = 1;
        }
    }
};

/* k_hc_up_read for weights of type T (the integer path's types; *done 0: not this type) */
template <int T> struct op_hc_up {
    static void run(qwc *c, const qw_tensor *up, float *a, const float *u, const float *xn, float *inj, int C, int H,
                    qw_q8a *xq, int *done) {
        *done = 0;
        if constexpr (q8_type<T>()) {
            hcu_args h = {};
            h.w = (const uint8_t *)up->data, h.row_bytes = (int64_t)qw_type_row_size((qw_type)T, up->shape[1]);
            h.ng = (int)(up->shape[1] / 32), h.C = C, h.H = H, h.early = mv_early();
            h.u = u, h.xn = xn, h.a = a, h.inj = inj, h.xq = xq;
            const int64_t smem = (int64_t)C * 32 * h.row_bytes;
            static int env = -1;
            h.stage = QWC_HC_STAGE && smem <= HCU_STAGE && ((uintptr_t)h.w & 15) == 0 &&
                      qwc_env_switch("QWENC_CUDA_HC_STAGE", 1, &env);
            qwc_launch(k_hc_up_read<T>, (unsigned)(H / 32), 32 * HCU_WARPS, h.stage ? (size_t)smem : 0,
                       qwc_stream(c), h);
            QWC_LAUNCHED();
            *done = 1;
        }
    }
};

/* F<T>::run(args...) for the weight type t */
template <template <int> class F, class... A> void by_type(qw_type t, A... args) {
    switch (t) {
    case QW_TYPE_F32: F<QW_TYPE_F32>::run(args...); return;
    case QW_TYPE_F16: F<QW_TYPE_F16>::run(args...); return;
    case QW_TYPE_BF16: F<QW_TYPE_BF16>::run(args...); return;
    case QW_TYPE_Q8_0: F<QW_TYPE_Q8_0>::run(args...); return;
    case QW_TYPE_Q4_0: F<QW_TYPE_Q4_0>::run(args...); return;
    case QW_TYPE_Q4_1: F<QW_TYPE_Q4_1>::run(args...); return;
    case QW_TYPE_Q5_0: F<QW_TYPE_Q5_0>::run(args...); return;
    case QW_TYPE_Q5_1: F<QW_TYPE_Q5_1>::run(args...); return;
    case QW_TYPE_Q4_K: F<QW_TYPE_Q4_K>::run(args...); return;
    case QW_TYPE_Q5_K: F<QW_TYPE_Q5_K>::run(args...); return;
    case QW_TYPE_Q6_K: F<QW_TYPE_Q6_K>::run(args...); return;
    case QW_TYPE_IQ4_NL: F<QW_TYPE_IQ4_NL>::run(args...); return;
    case QW_TYPE_IQ4_XS: F<QW_TYPE_IQ4_XS>::run(args...); return;
    default: qwc_die(__FILE__, __LINE__, "quant.cu: no kernel for weights of type", qw_type_name(t));
    }
}

} // namespace

void qwc_matmul(qwc *c, float *y, const qw_tensor *w, const float *x, int n_tok) {
    const int64_t rows = w->shape[0], cols = qw_tensor_row_len(w);
    if (n_tok <= 0 || rows <= 0) return;
    by_type<op_matmul>(w->type, c, y, (const uint8_t *)w->data, rows, cols, x, n_tok);
}

int qwc_hc_up_read(qwc *c, float *a, const qw_tensor *up, const float *u, const float *xn, float *inj, int C, int H,
                   qw_q8a *xq) {
    const int64_t r = up->shape[1], ng = r / 32;
    if (!qwc_q8_on(c) || !qd_supported(up->type) || up->n_dims != 2 || r % 32 || ng < 1 || ng > HCU_MAXG ||
        H % 32 || C < 1 || C > HCU_MAXC || up->shape[0] != (int64_t)C * H || mvq_ks(up->shape[0], ng) != 1)
        return 0;
    int done = 0;
    by_type<op_hc_up>(up->type, c, up, a, u, xn, inj, C, H, xq, &done);
    return done;
}

void qwc_q8a_rows(qwc *c, qw_q8a *xq, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    const int64_t warps = cols / 32 * n_rows;
    if (warps <= 0) return;
    qwc_launch(k_q8a, (unsigned)cdiv(warps, 8), 256, 0, qwc_stream(c), x, ldx, cols / 32, n_rows, xq);
    QWC_LAUNCHED();
}

void qwc_get_rows(qwc *c, float *y, const qw_tensor *w, const int32_t *ids, int n) {
    if (n <= 0) return;
    by_type<op_get_rows>(w->type, c, y, (const uint8_t *)w->data, w->shape[0], qw_tensor_row_len(w), ids, n);
}

void qwc_gather_rows(qwc *c, float *y, const void *const *chunk_data, qw_type type, int64_t dh, int n_chunks,
                     int64_t chunk_rows, const int64_t *rows, int64_t n) {
    if (n <= 0) return;
    by_type<op_gather>(type, c, y, chunk_data, dh, n_chunks, chunk_rows, rows, n);
}

/* One token's MoE down products and their combine as one kernel (QWC_MOE_DOWN_COMBINE 0, or
 * QWENC_CUDA_MOE_DOWN_COMBINE=0 in the environment: the pairs' product, then k_moe_combine; the same bits) */
#ifndef QWC_MOE_DOWN_COMBINE
#define QWC_MOE_DOWN_COMBINE 1
#endif

int qwc_pairs_combine(qwc *c, float *y, const void *const *mats, qw_type type, int64_t rows, int64_t cols,
                      const float *x, int P, const int32_t *sel, const float *wt, int k, const float *sg, int sg_logit,
                      int has_shared, int shared_pair) {
    static int env = -1;
    if (!QWC_MOE_DOWN_COMBINE || !qwc_env_switch("QWENC_CUDA_MOE_DOWN_COMBINE", 1, &env)) return 0;
    if (P < 1 || P > 32 || k < 1 || k > P || rows <= 0 || rows > 0x7fffffff || cols % 32 || !qwc_q8_on(c) ||
        !qd_supported(type) || mvq_ks(rows, cols / 32) != 1)
        return 0;
    dc_args a = {};
    a.mats = mats, a.rows = rows, a.sel = sel, a.wt = wt, a.sg = sg, a.y = y, a.P = P, a.k = k;
    a.sg_logit = sg_logit, a.has_shared = has_shared, a.shared_pair = shared_pair;
    int done = 0;
    by_type<op_down_combine>(type, c, a, x, cols, &done);
    return done;
}

void qwc_matmul_pairs(qwc *c, float *y, const void *const *mats, qw_type type, int64_t rows, int64_t cols,
                      const float *x, int64_t x_stride, int n_pairs) {
    if (n_pairs <= 0 || rows <= 0) return;
    by_type<op_pairs>(type, c, y, mats, rows, cols, x, x_stride, n_pairs);
}

int qwc_matmul_like_pairs(const qwc *c, qw_type type, int64_t cols, int n_tok) {
    if (n_tok == 1) return 1;
    return n_tok <= MV_MAX_TOK && qwc_q8_on(c) && type != QW_TYPE_F32 && type != QW_TYPE_F16 && type != QW_TYPE_BF16 &&
           qd_supported(type) && cols % 32 == 0;
}

int qwc_matmul_group(qwc *c, const qw_tensor *w, float *const *y, int n, const float *x, int n_tok) {
    if (n < 1 || n > MVQ_JOBS || n_tok < 1 || n_tok > MV_PASS_TOK) return 0;
    const uint8_t *d[MVQ_JOBS];
    int64_t rows[MVQ_JOBS];
    for (int j = 0; j < n; j++) {
        if (w[j].type != w[0].type || w[j].shape[1] != w[0].shape[1] || w[j].shape[0] <= 0) return 0;
        d[j] = (const uint8_t *)w[j].data, rows[j] = w[j].shape[0];
    }
    int done = 0;
    by_type<op_group>(w[0].type, c, d, rows, y, n, w[0].shape[1], x, n_tok, &done);
    return done;
}
