/* tensor.c - element types, views and conversion to f32 (see tensor.h). */
#include "tensor/tensor.h"

#include <stdio.h>

#include "core/common.h"

static const struct {
    const char *name;
    const char *st_name;
    size_t size;
} type_info[QW_TYPE_COUNT] = {
    [QW_TYPE_F32] = {"f32", "F32", 4},       [QW_TYPE_F16] = {"f16", "F16", 2},
    [QW_TYPE_BF16] = {"bf16", "BF16", 2},    [QW_TYPE_I64] = {"i64", "I64", 8},
    [QW_TYPE_I32] = {"i32", "I32", 4},       [QW_TYPE_UNSUPPORTED] = {"unsupported", "", 0},
};

size_t qw_type_size(qw_type t) { return t < QW_TYPE_COUNT ? type_info[t].size : 0; }
const char *qw_type_name(qw_type t) { return t < QW_TYPE_COUNT ? type_info[t].name : "?"; }

qw_type qw_type_from_safetensors(const char *s) {
    for (int t = 0; t < QW_TYPE_UNSUPPORTED; t++)
        if (strcmp(s, type_info[t].st_name) == 0) return (qw_type)t;
    return QW_TYPE_UNSUPPORTED;
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
    v.data = (const uint8_t *)t->data + (size_t)(r0 * row_len) * qw_type_size(t->type);
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
    switch (t->type) {
    case QW_TYPE_F32:
        memcpy(out, (const float *)t->data + i0, (size_t)n * sizeof(float));
        break;
    case QW_TYPE_BF16: {
        const uint16_t *p = (const uint16_t *)t->data + i0;
        for (int64_t i = 0; i < n; i++) out[i] = qw_bf16_to_f32(p[i]);
        break;
    }
    case QW_TYPE_F16: {
        const uint16_t *p = (const uint16_t *)t->data + i0;
        for (int64_t i = 0; i < n; i++) out[i] = qw_f16_to_f32(p[i]);
        break;
    }
    default:
        QW_ASSERT(!"qw_tensor_to_f32: not a float tensor");
    }
}
