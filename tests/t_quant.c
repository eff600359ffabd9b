/*
 * t_quant.c - the quantized block formats against llama.cpp's own quantizers and dequantizers.
 *
 *   t_quant [REF_DIR]      (default tests/quant)
 *
 * 1. Reference blocks (tests/quant/<type>.bin, written by tests/gen/make_quant_refs.c with ggml): for every
 *    type and every case of tests/quant/inputs.h, qwenc's quantizer must produce exactly ggml's bytes, and
 *    qwenc's dequantization of ggml's bytes must give exactly ggml's floats (bit for bit: both are the same
 *    sequence of IEEE float operations, so no tolerance is needed). Random-byte blocks check every bit of
 *    the dequantizers. All of ggml's quantizers used here are deterministic single-threaded functions.
 * 2. Round trips: error bounds per type on random data (relative RMS error, and per-element bounds that
 *    follow from the format for the 32-element types).
 * 3. qw_ref_dot_row on quantized rows equals the double dot product of the dequantized row exactly (the
 *    same block-by-block dequantization, the same summation order).
 * 4. The type table: sizes, ggml ids, names, row sizes, views and qw_tensor_to_f32 on quantized tensors,
 *    and the f16 conversion on all 65536 halves.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "quant/inputs.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"
#include "test_util.h"

#define CASE_RANDOM 100
#define CASE_F16_EDGES 200

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------ 1. reference blocks */

static const qw_type ref_types[] = {
    QW_TYPE_F16,  QW_TYPE_BF16, QW_TYPE_Q8_0, QW_TYPE_Q4_0,   QW_TYPE_Q4_1,   QW_TYPE_Q5_0, QW_TYPE_Q5_1,
    QW_TYPE_Q4_K, QW_TYPE_Q5_K, QW_TYPE_Q6_K, QW_TYPE_IQ4_NL, QW_TYPE_IQ4_XS, QW_TYPE_Q8_K,
};

static void test_reference(const char *dir, qw_type t) {
    const qw_type_traits *tt = qw_type_traits_of(t);
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.bin", dir, tt->name);
    size_t len = 0;
    uint8_t *buf = test_read_all(path, &len);
    CHECK(buf != NULL, "%s: cannot read (made by tests/gen/make_quant_refs.c)", path);
    if (!buf) return;
    const uint32_t ver = rd_u32(buf + 4), gt = rd_u32(buf + 8), n = rd_u32(buf + 12), cb = rd_u32(buf + 16),
                   nc = rd_u32(buf + 20);
    CHECK(len >= 24 && !memcmp(buf, "QWQR", 4) && ver == 1, "%s: bad header", path);
    CHECK((int)gt == tt->ggml_type, "%s: ggml type %u, table says %d", path, gt, tt->ggml_type);
    CHECK(cb == qw_type_row_size(t, n), "%s: %u bytes per case, qwenc's row size of %u is %zu", path, cb, n,
          qw_type_row_size(t, n));
    size_t rec = 4 + cb + (size_t)n * 4;
    CHECK(len == 24 + nc * rec, "%s: %zu bytes, expected %zu", path, len, 24 + nc * rec);
    if (len != 24 + nc * rec || cb != qw_type_row_size(t, n)) {
        free(buf);
        return;
    }
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *q = malloc(cb);
    int n_quant = 0, n_deq = 0;
    for (uint32_t c = 0; c < nc; c++) {
        const uint8_t *r = buf + 24 + c * rec;
        uint32_t id = rd_u32(r);
        const uint8_t *ref_q = r + 4, *ref_y = r + 4 + cb;
        const char *cname = id < QREF_N_CASES ? qref_case_names[id] : id == CASE_F16_EDGES ? "f16-edges" : "random-bytes";
        if (id < QREF_N_CASES || id == CASE_F16_EDGES) {
            if (id == CASE_F16_EDGES)
                qref_f16_edge_inputs(x, (int)n);
            else
                qref_case_inputs((int)id, (uint64_t)gt, x, (int)n);
            memset(q, 0xAA, cb);
            size_t wrote = qw_quantize(t, x, q, n);
            size_t at = 0;
            while (at < cb && q[at] == ref_q[at]) at++;
            CHECK(wrote == cb && at == cb, "%s case %s: quantized bytes differ from ggml's at byte %zu of %u (%02x, ggml %02x)",
                  tt->name, cname, at, cb, at < cb ? q[at] : 0, at < cb ? ref_q[at] : 0);
            n_quant++;
        }
        qw_dequantize(t, ref_q, y, n);
        uint32_t at = 0;
        while (at < n && !memcmp(&y[at], ref_y + 4 * at, 4)) at++;
        float want = 0;
        if (at < n) memcpy(&want, ref_y + 4 * at, 4);
        CHECK(at == n, "%s case %s: dequantized element %u is %.9g, ggml %.9g", tt->name, cname, at, at < n ? y[at] : 0.0,
              (double)want);
        n_deq++;
    }
    printf("%-7s %d quantized cases byte-exact, %d dequantized cases bit-exact vs ggml\n", tt->name, n_quant, n_deq);
    free(x);
    free(y);
    free(q);
    free(buf);
}

/* ------------------------------------------------------------------ 2. round trips */

/*
 * Relative RMS error bounds on N(0,1)-like data (inputs.h), 1.25x the values measured with these
 * quantizers (which produce ggml's bytes), so that a regression in a fit shows while noise does not.
 * Measured: q8_0 0.0051, q4_0 0.082, q4_1 0.076, q5_0 0.041, q5_1 0.037, q4_K 0.069, q5_K 0.035,
 * q6_K 0.017, iq4_nl 0.075, iq4_xs 0.075, q8_K 0.0062, f16 0.00021, bf16 0.0017.
 */
static const struct {
    qw_type t;
    double rel_rms;
} rt_bounds[] = {
    {QW_TYPE_Q8_0, 0.0064},  {QW_TYPE_Q4_0, 0.103},    {QW_TYPE_Q4_1, 0.095},   {QW_TYPE_Q5_0, 0.051},
    {QW_TYPE_Q5_1, 0.046},   {QW_TYPE_Q4_K, 0.087},    {QW_TYPE_Q5_K, 0.044},   {QW_TYPE_Q6_K, 0.021},
    {QW_TYPE_IQ4_NL, 0.093}, {QW_TYPE_IQ4_XS, 0.094},  {QW_TYPE_Q8_K, 0.0078},  {QW_TYPE_F16, 0.00026},
    {QW_TYPE_BF16, 0.0021},
};

static void test_round_trip(void) {
    enum { N = 64 * QW_QK_K };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(N * 4);
    qref_rng r = {12345};
    for (int i = 0; i < N; i++) x[i] = qref_normal(&r);
    for (size_t k = 0; k < sizeof(rt_bounds) / sizeof(rt_bounds[0]); k++) {
        qw_type t = rt_bounds[k].t;
        qw_quantize(t, x, q, N);
        qw_dequantize(t, q, y, N);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        printf("round trip %-7s relative rms error %.5f (bound %.5f)\n", qw_type_name(t), rel, rt_bounds[k].rel_rms);
        CHECK(rel <= rt_bounds[k].rel_rms, "%s: relative rms error %.5f above %.5f", qw_type_name(t), rel, rt_bounds[k].rel_rms);
        CHECK(rel > 0 || t == QW_TYPE_F32, "%s: a lossy type reproduced random data exactly", qw_type_name(t));
    }

    /*
     * Per-element bounds of the 32-element formats, per block with amax = max |x| and range = max - min.
     * The f16 rounding of the scale d moves a code q by at most |q| |d| 2^-11, hence the 1 + 2^-10 factors.
     *   Q8_0: d = amax/127, |err| <= d/2 + 127 d 2^-11 < 0.563 d
     *   Q4_0 / Q5_0: d = amax/8 (/16); the code of +amax would be 16 (32) and is clamped, so |err| <= d (1 + 2^-10) * ...
     *   Q4_1 / Q5_1: d = range/15 (/31), |err| <= d/2 (+ d 2^-11 |q| + the f16 rounding of the min)
     */
    for (int b = 0; b < N / QW_QK; b++) {
        const float *xb = x + b * QW_QK;
        float amax = 0, mn = xb[0], mx = xb[0];
        for (int j = 0; j < QW_QK; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
            mn = fminf(mn, xb[j]);
            mx = fmaxf(mx, xb[j]);
        }
        const struct {
            qw_type t;
            double bound;
        } eb[] = {
            {QW_TYPE_Q8_0, 0.563 * amax / 127},
            {QW_TYPE_Q4_0, 1.02 * amax / 8},
            {QW_TYPE_Q5_0, 1.04 * amax / 16},
            {QW_TYPE_Q4_1, 0.51 * (mx - mn) / 15 + 0.008 * (mx - mn) / 15 + fabs(mn) / 2048},
            {QW_TYPE_Q5_1, 0.52 * (mx - mn) / 31 + 0.016 * (mx - mn) / 31 + fabs(mn) / 2048},
        };
        for (size_t k = 0; k < sizeof(eb) / sizeof(eb[0]); k++) {
            float yb[QW_QK];
            qw_quantize(eb[k].t, xb, q, QW_QK);
            qw_dequantize(eb[k].t, q, yb, QW_QK);
            double worst = 0;
            for (int j = 0; j < QW_QK; j++) worst = fmax(worst, fabs((double)yb[j] - xb[j]));
            if (worst > eb[k].bound)
                CHECK(0, "%s block %d: error %.6g above the bound %.6g", qw_type_name(eb[k].t), b, worst, eb[k].bound);
        }
    }
    n_pass++;

    /* zero in, zero out; a constant block comes back within f16 rounding */
    for (size_t k = 0; k < sizeof(rt_bounds) / sizeof(rt_bounds[0]); k++) {
        qw_type t = rt_bounds[k].t;
        for (int i = 0; i < QW_QK_K; i++) x[i] = 0;
        qw_quantize(t, x, q, QW_QK_K);
        qw_dequantize(t, q, y, QW_QK_K);
        int zero = 1;
        for (int i = 0; i < QW_QK_K; i++) zero &= y[i] == 0;
        CHECK(zero, "%s: zeros do not come back as zeros", qw_type_name(t));
        for (int i = 0; i < QW_QK_K; i++) x[i] = 0.37f;
        qw_quantize(t, x, q, QW_QK_K);
        qw_dequantize(t, q, y, QW_QK_K);
        double worst = 0;
        for (int i = 0; i < QW_QK_K; i++) worst = fmax(worst, fabs(y[i] - 0.37));
        CHECK(worst <= 0.37 * 0.01, "%s: constant 0.37 comes back with error %g", qw_type_name(t), worst);
    }
    free(x);
    free(y);
    free(q);
}

/* ------------------------------------------------------------------ 3. the reference dot product */

static void test_dot(void) {
    enum { ROWS = 3, COLS = 2 * QW_QK_K };
    float *w = malloc(ROWS * COLS * sizeof(float)), *deq = malloc(COLS * sizeof(float)), *x = malloc(COLS * sizeof(float));
    uint8_t *q = malloc(ROWS * COLS * 4);
    qref_rng r = {777};
    for (int i = 0; i < ROWS * COLS; i++) w[i] = qref_normal(&r) * (i % 97 == 0 ? 20.0f : 1.0f);
    for (int i = 0; i < COLS; i++) x[i] = qref_normal(&r);
    for (int t = 0; t < QW_TYPE_COUNT; t++) {
        const qw_type_traits *tt = qw_type_traits_of((qw_type)t);
        if (!tt->from_float || t == QW_TYPE_Q8_K) continue;
        qw_quantize((qw_type)t, w, q, ROWS * COLS);
        qw_tensor wt = {.name = "w", .data = q, .type = (qw_type)t, .n_dims = 2, .shape = {ROWS, COLS}};
        int exact = 1;
        double worst_vs_f32 = 0, ref_scale = 0;
        for (int row = 0; row < ROWS; row++) {
            qw_dequantize((qw_type)t, q + qw_type_row_size((qw_type)t, COLS) * row, deq, COLS);
            double want = 0, f32 = 0;
            for (int c = 0; c < COLS; c++) {
                want += (double)deq[c] * x[c];
                f32 += (double)w[row * COLS + c] * x[c];
                ref_scale += fabs((double)w[row * COLS + c] * x[c]);
            }
            double got = qw_ref_dot_row(&wt, row, x, COLS);
            exact &= got == want;
            worst_vs_f32 = fmax(worst_vs_f32, fabs(got - f32));
        }
        /* tolerance 0: the dot product dequantizes with the same function and sums in the same order */
        CHECK(exact, "%s: qw_ref_dot_row differs from the dot product of the dequantized row", tt->name);
        /* and it is a dot product of this row at all: within 10% of the sum of |w x| of the f32 row */
        CHECK(worst_vs_f32 <= 0.1 * ref_scale / ROWS, "%s: dot product off the f32 one by %g", tt->name, worst_vs_f32);
    }
    free(w);
    free(deq);
    free(x);
    free(q);
}

/* ------------------------------------------------------------------ 4. type table */

static void test_table(void) {
    const struct {
        qw_type t;
        int ggml, elems, bytes;
        const char *name;
    } want[] = {
        {QW_TYPE_F32, 0, 1, 4, "F32"},        {QW_TYPE_F16, 1, 1, 2, "F16"},         {QW_TYPE_BF16, 30, 1, 2, "BF16"},
        {QW_TYPE_Q8_0, 8, 32, 34, "Q8_0"},    {QW_TYPE_Q4_0, 2, 32, 18, "Q4_0"},     {QW_TYPE_Q4_1, 3, 32, 20, "Q4_1"},
        {QW_TYPE_Q5_0, 6, 32, 22, "Q5_0"},    {QW_TYPE_Q5_1, 7, 32, 24, "Q5_1"},     {QW_TYPE_Q4_K, 12, 256, 144, "Q4_K"},
        {QW_TYPE_Q5_K, 13, 256, 176, "Q5_K"}, {QW_TYPE_Q6_K, 14, 256, 210, "Q6_K"},  {QW_TYPE_IQ4_NL, 20, 32, 18, "IQ4_NL"},
        {QW_TYPE_IQ4_XS, 23, 256, 136, "IQ4_XS"}, {QW_TYPE_Q8_K, 15, 256, 292, "Q8_K"}, {QW_TYPE_I32, 26, 1, 4, "I32"},
        {QW_TYPE_I64, 27, 1, 8, "I64"},
    };
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++) {
        const qw_type_traits *tt = qw_type_traits_of(want[k].t);
        CHECK(tt->ggml_type == want[k].ggml && tt->block_elems == want[k].elems && tt->block_bytes == want[k].bytes,
              "%s: table {ggml %d, %d elems, %d bytes}, llama.cpp {%d, %d, %d}", want[k].name, tt->ggml_type,
              tt->block_elems, tt->block_bytes, want[k].ggml, want[k].elems, want[k].bytes);
        CHECK(qw_type_from_ggml(want[k].ggml) == want[k].t, "ggml id %d does not map back to %s", want[k].ggml, want[k].name);
        CHECK(qw_type_from_name(want[k].name) == (int)want[k].t, "name %s not found", want[k].name);
        CHECK(qw_type_is_quantized(want[k].t) == (want[k].elems > 1), "%s: is_quantized", want[k].name);
    }
    CHECK(qw_type_from_ggml(10) == QW_TYPE_UNSUPPORTED && qw_type_from_ggml(99) == QW_TYPE_UNSUPPORTED &&
              qw_type_from_ggml(-1) == QW_TYPE_UNSUPPORTED,
          "Q2_K (10), 99 and -1 must be unsupported");
    CHECK(qw_type_from_name("q4_k") == QW_TYPE_Q4_K && qw_type_from_name("Q4_K_M") == -1, "name parsing");
    CHECK(qw_type_from_safetensors("BF16") == QW_TYPE_BF16 && qw_type_from_safetensors("F8_E4M3") == QW_TYPE_UNSUPPORTED,
          "safetensors dtypes");
    CHECK(qw_type_size(QW_TYPE_Q4_K) == 0 && qw_type_size(QW_TYPE_BF16) == 2, "element sizes");
    CHECK(qw_type_row_size(QW_TYPE_Q4_K, 4096) == 16 * 144 && qw_type_row_size(QW_TYPE_F32, 3) == 12, "row sizes");

    /* views and conversion of a quantized tensor: rows 1..2 of a [3, 512] Q6_K tensor */
    float w[3 * 512], all[3 * 512], part[2 * 512];
    qref_rng r = {5};
    for (int i = 0; i < 3 * 512; i++) w[i] = qref_normal(&r);
    uint8_t q[3 * 2 * 210];
    qw_quantize(QW_TYPE_Q6_K, w, q, 3 * 512);
    qw_tensor t = {.name = "t", .data = q, .type = QW_TYPE_Q6_K, .n_dims = 2, .shape = {3, 512}};
    qw_tensor_to_f32(&t, 0, 3 * 512, all);
    qw_tensor v = qw_tensor_rows(&t, 1, 2, 512);
    CHECK(v.data == q + 2 * 210 && v.shape[0] == 2 && v.shape[1] == 512, "qw_tensor_rows on a quantized tensor");
    qw_tensor_to_f32(&v, 0, 2 * 512, part);
    CHECK(!memcmp(part, all + 512, sizeof(part)), "qw_tensor_to_f32 of the view");
    qw_tensor_to_f32(&t, 768, 256, part);
    CHECK(!memcmp(part, all + 768, 256 * sizeof(float)), "qw_tensor_to_f32 from a block offset");

    /* f16: every half survives f16 -> f32 -> f16 (NaNs stay NaNs) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qw_f16_to_f32((uint16_t)h);
        uint16_t back = qw_f32_to_f16(f);
        if (isnan(f) ? (back & 0x7c00) != 0x7c00 || !(back & 0x3ff) : back != h) bad++;
    }
    CHECK(bad == 0, "%d halves do not survive the round trip through f32", bad);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/quant";
    printf("reference blocks from ggml (%s)\n", dir);
    for (size_t i = 0; i < sizeof(ref_types) / sizeof(ref_types[0]); i++) test_reference(dir, ref_types[i]);
    test_round_trip();
    test_dot();
    test_table();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
