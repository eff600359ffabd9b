/* tensor.c - element types, views and conversion to f32 (see tensor.h). */
#include "tensor/tensor.h"

#include <ctype.h>
#include <stdio.h>

#include "core/common.h"
#include "tensor/quant.h"

/* The one table of element types. ggml ids and block sizes follow ggml.h / ggml-common.h. */
static const qw_type_traits type_info[QW_TYPE_COUNT] = {
    [QW_TYPE_F32] = {"f32", "F32", 0, 1, 4, qw_dequantize_f32, qw_quantize_f32},
    [QW_TYPE_F16] = {"f16", "F16", 1, 1, 2, qw_dequantize_f16, qw_quantize_f16},
    [QW_TYPE_BF16] = {"bf16", "BF16", 30, 1, 2, qw_dequantize_bf16, qw_quantize_bf16},
    [QW_TYPE_I64] = {"i64", "I64", 27, 1, 8, NULL, NULL},
    [QW_TYPE_I32] = {"i32", "I32", 26, 1, 4, NULL, NULL},
    [QW_TYPE_UNSUPPORTED] = {"unsupported", NULL, -1, 1, 0, NULL, NULL},
    [QW_TYPE_Q8_0] = {"q8_0", NULL, 8, QW_QK, sizeof(qw_block_q8_0), qw_dequantize_q8_0, qw_quantize_q8_0},
    [QW_TYPE_Q4_0] = {"q4_0", NULL, 2, QW_QK, sizeof(qw_block_q4_0), qw_dequantize_q4_0, qw_quantize_q4_0},
    [QW_TYPE_Q4_1] = {"q4_1", NULL, 3, QW_QK, sizeof(qw_block_q4_1), qw_dequantize_q4_1, qw_quantize_q4_1},
    [QW_TYPE_Q5_0] = {"q5_0", NULL, 6, QW_QK, sizeof(qw_block_q5_0), qw_dequantize_q5_0, qw_quantize_q5_0},
    [QW_TYPE_Q5_1] = {"q5_1", NULL, 7, QW_QK, sizeof(qw_block_q5_1), qw_dequantize_q5_1, qw_quantize_q5_1},
    [QW_TYPE_Q4_K] = {"q4_K", NULL, 12, QW_QK_K, sizeof(qw_block_q4_K), qw_dequantize_q4_K, qw_quantize_q4_K},
    [QW_TYPE_Q5_K] = {"q5_K", NULL, 13, QW_QK_K, sizeof(qw_block_q5_K), qw_dequantize_q5_K, qw_quantize_q5_K},
    [QW_TYPE_Q6_K] = {"q6_K", NULL, 14, QW_QK_K, sizeof(qw_block_q6_K), qw_dequantize_q6_K, qw_quantize_q6_K},
    [QW_TYPE_IQ4_NL] = {"iq4_nl", NULL, 20, QW_QK, sizeof(qw_block_iq4_nl), qw_dequantize_iq4_nl, qw_quantize_iq4_nl},
    [QW_TYPE_IQ4_XS] = {"iq4_xs", NULL, 23, QW_QK_K, sizeof(qw_block_iq4_xs), qw_dequantize_iq4_xs, qw_quantize_iq4_xs},
    [QW_TYPE_Q8_K] = {"q8_K", NULL, 15, QW_QK_K, sizeof(qw_block_q8_K), qw_dequantize_q8_K, qw_quantize_q8_K},
};

const qw_type_traits *qw_type_traits_of(qw_type t) {
    QW_ASSERT((unsigned)t < QW_TYPE_COUNT);
    return &type_info[t];
}

size_t qw_type_size(qw_type t) {
    return t < QW_TYPE_COUNT && type_info[t].block_elems == 1 ? (size_t)type_info[t].block_bytes : 0;
}
const char *qw_type_name(qw_type t) { return t < QW_TYPE_COUNT ? type_info[t].name : "?"; }
int qw_type_is_quantized(qw_type t) { return t < QW_TYPE_COUNT && type_info[t].block_elems > 1; }

size_t qw_type_row_size(qw_type t, int64_t n) {
    const qw_type_traits *tt = qw_type_traits_of(t);
    QW_ASSERT(n >= 0 && n % tt->block_elems == 0);
    return (size_t)(n / tt->block_elems) * (size_t)tt->block_bytes;
}

qw_type qw_type_from_safetensors(const char *s) {
    for (int t = 0; t < QW_TYPE_COUNT; t++)
        if (type_info[t].st_name && strcmp(s, type_info[t].st_name) == 0) return (qw_type)t;
    return QW_TYPE_UNSUPPORTED;
}

qw_type qw_type_from_ggml(int ggml_type) {
    for (int t = 0; t < QW_TYPE_COUNT; t++)
        if (ggml_type >= 0 && type_info[t].ggml_type == ggml_type) return (qw_type)t;
    return QW_TYPE_UNSUPPORTED;
}

int qw_type_from_name(const char *s) {
    for (int t = 0; t < QW_TYPE_COUNT; t++) {
        const char *a = type_info[t].name, *b = s;
        if (t == QW_TYPE_UNSUPPORTED) continue;
        while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b)) a++, b++;
        if (!*a && !*b) return t;
    }
    return -1;
}

int64_t qw_tensor_nelem(const qw_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

int64_t qw_tensor_row_len(const qw_tensor *t) {
    int64_t n = 1;
    for (int i = 1; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

qw_tensor qw_tensor_rows(const qw_tensor *t, int64_t r0, int64_t nr, int64_t row_len) {
    QW_ASSERT(r0 >= 0 && nr >= 0 && (r0 + nr) * row_len <= qw_tensor_nelem(t));
    qw_tensor v = *t;
    v.data = (const uint8_t *)t->data + (size_t)r0 * qw_type_row_size(t->type, row_len);
    v.n_dims = 2;
    v.shape[0] = nr;
    v.shape[1] = row_len;
    v.shape[2] = v.shape[3] = 0;
    return v;
}

const char *qw_shape_str(const qw_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->n_dims && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

float qw_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t qw_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t qw_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);       /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);      /* overflow to inf */
    if (a < 0x38800000u) {                                        /* subnormal or zero in f16 */
        if (a < 0x33000000u) return (uint16_t)sign;                /* below half the smallest subnormal */
        uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
        int shift = (int)(126 - e); /* value = m * 2^(e-150) = (m >> shift) * 2^-24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

void qw_tensor_to_f32(const qw_tensor *t, int64_t i0, int64_t n, float *out) {
    const qw_type_traits *tt = qw_type_traits_of(t->type);
    QW_ASSERT(tt->to_float && i0 % tt->block_elems == 0 && n % tt->block_elems == 0);
    tt->to_float((const uint8_t *)t->data + qw_type_row_size(t->type, i0), out, n);
}
