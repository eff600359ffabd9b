/*
 * synth.cu - random weights made in device memory (qwenc_model_synth on the GPU: `qwenc bench --synth`), so a
 * model larger than the host's memory or disk can be measured.
 *
 * The bytes are not the host synth's values (those come from N(0, 0.02) floats quantized on the host, too slow
 * for 100 GB); they are what a decode step reads at the same size: every 32-bit word a hash of the seed and its
 * index (the codes, sub-block scales and high bits of the block types), then each block's f16 scale fields set
 * to one value chosen so that a weight's standard deviation is near 0.02, as in the host's synth. The plain types
 * (F32, F16, BF16) get uniform values of that deviation. A byte's value depends only on the seed and its offset
 * in the tensor, so a part of a tensor (one expert, made on the GPU that runs it) is filled alone with the bytes the
 * whole tensor has there. Everything is finite, so a forward over them routes
 * experts and selects blocks as over real weights.
 */
#include "cuda/cuda_internal.cuh"

namespace {

__device__ __forceinline__ uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* uniform in [-a, a) from 24 bits of h */
__device__ __forceinline__ float unif(uint32_t h, float a) { return a * ((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f); }

constexpr float SPREAD = 0.0346410162f; /* 0.02 sqrt(3): the half width of a uniform of deviation 0.02 */

/* The word of tensor offset 4 i: plain types values, others hashes */
__device__ __forceinline__ uint32_t word_at(size_t i, int plain, uint64_t seed) {
    const uint32_t h = mix(seed + i * 0x9E3779B97F4A7C15ull), g = mix(~seed + i * 0xD1B54A32D192ED03ull);
    if (plain == 4) return __float_as_uint(unif(h, SPREAD));
    if (plain == 2) /* two bf16 */
        return (__float_as_uint(unif(h, SPREAD)) >> 16) | (__float_as_uint(unif(g, SPREAD)) & 0xFFFF0000u);
    if (plain == 1) /* two f16 */
        return (uint32_t)__half_as_ushort(__float2half_rn(unif(h, SPREAD))) |
               (uint32_t)__half_as_ushort(__float2half_rn(unif(g, SPREAD))) << 16;
    return h;
}
/* bytes [off, off + n) of a tensor at d (d: the byte at offset off; d - off + 4 i is 4-byte aligned): byte o is byte
 * o % 4 of word o / 4, whatever part of the tensor is filled */
__global__ void k_words(uint8_t *d, size_t off, size_t n, int plain, uint64_t seed) {
    QWC_PDL_ENTRY();
    const size_t w0 = off / 4, w1 = (off + n + 3) / 4;
    for (size_t i = w0 + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < w1; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t w = word_at(i, plain, seed);
        if (4 * i >= off && 4 * i + 4 <= off + n) {
            *(uint32_t *)(d + (4 * i - off)) = w;
        } else {
            for (int b = 0; b < 4; b++)
                if (4 * i + b >= off && 4 * i + b < off + n) d[4 * i + b - off] = (uint8_t)(w >> (8 * b));
        }
    }
}
/* the f16 fields of every block: up to two (offset, value) pairs */
__global__ void k_fields(uint8_t *d, size_t n_blocks, int bb, int n_f, int off0, uint16_t v0, int off1, uint16_t v1) {
    QWC_PDL_ENTRY();
    for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < n_blocks; b += (size_t)gridDim.x * blockDim.x) {
        uint8_t *p = d + b * bb;
        *(uint16_t *)(p + off0) = v0;
        if (n_f > 1) *(uint16_t *)(p + off1) = v1;
    }
}

struct fields {
    int bb, n, off0, off1;
    float v0, v1;
};

/* Block bytes and scale fields of each block type, with the scale values for a deviation near 0.02 given the
 * codes' own deviation (uniform codes; the K-quants' 6-bit sub-block scales average 31.5, and their mins offset
 * about the mean of d * sc * q). */
fields fields_of(qw_type t) {
    switch (t) {
    case QW_TYPE_Q8_0: return {34, 1, 0, 0, 2.7e-4f, 0};   /* int8 codes: deviation 74 */
    case QW_TYPE_Q4_0: return {18, 1, 0, 0, 4.3e-3f, 0};   /* q - 8: 4.6 */
    case QW_TYPE_Q4_1: return {20, 2, 0, 2, 4.3e-3f, -3.2e-2f};
    case QW_TYPE_Q5_0: return {22, 1, 0, 0, 2.2e-3f, 0};   /* q - 16: 9.2 */
    case QW_TYPE_Q5_1: return {24, 2, 0, 2, 2.2e-3f, -3.4e-2f};
    case QW_TYPE_Q4_K: return {144, 2, 0, 2, 1.4e-4f, 1.0e-3f};
    case QW_TYPE_Q5_K: return {176, 2, 0, 2, 6.9e-5f, 1.07e-3f};
    case QW_TYPE_Q6_K: return {210, 1, 208, 0, 1.5e-5f, 0}; /* q - 32: 18.5, int8 scales: 74 */
    case QW_TYPE_IQ4_NL: return {18, 1, 0, 0, 3.3e-4f, 0};  /* levels: about 60 */
    case QW_TYPE_IQ4_XS: return {136, 1, 0, 0, 2e-5f, 0};   /* levels 60, scales ls - 32: 18 */
    default: return {0, 0, 0, 0, 0, 0};
    }
}

} // namespace

void qwc_fill_random(qwc *c, uint8_t *d, qw_type type, size_t bytes, uint64_t seed, size_t off) {
    if (!bytes) return;
    cudaStream_t s = qwc_stream(c);
    const int plain = type == QW_TYPE_F32 ? 4 : type == QW_TYPE_BF16 ? 2 : type == QW_TYPE_F16 ? 1 : 0;
    const fields f = fields_of(type);
    if (!plain && !f.bb) qwc_die(__FILE__, __LINE__, "qwc_fill_random", qw_type_name(type));
    if (((uintptr_t)d - off) % 4 || (!plain && off % f.bb))
        qwc_die(__FILE__, __LINE__, "qwc_fill_random", "a part that does not start at a block, or misaligned");
    const unsigned grid = 4096, threads = 256;
    qwc_launch(k_words, grid, threads, 0, s, d, off, bytes, plain, seed);
    QWC_LAUNCHED();
    if (!plain) {
        qwc_launch(k_fields, grid, threads, 0, s, d, bytes / f.bb, f.bb, f.n, f.off0, qw_f32_to_f16(f.v0), f.off1,
                   qw_f32_to_f16(f.v1));
        QWC_LAUNCHED();
    }
}
