/*
 * ref.c - the scalar reference of every op in ops.h: plain loops, double accumulation, no tricks.
 * It is the oracle the SIMD and CUDA kernels are tested against, and the CPU fallback. Sigmoid and silu
 * take e^x from expd.h (within one ulp of libm's expf, the same bits on every platform) so that the vector
 * kernels, which compute it the same way, give the same bits.
 */
#include <math.h>
#include <string.h>

#include "core/common.h"
#include "kernels/expd.h"
#include "kernels/composite.h"
#include "tensor/quant.h"

/* the scalar kernels keep no state: their table argument is unused */
#define QW_OPS_SELF const qw_backend *ops __attribute__((unused)),

/* Dot product of weight row r of w (row length n) with x, accumulated in double. */
double qw_ref_dot_row(const qw_tensor *w, int64_t r, const float *x, int64_t n) {
    double acc = 0;
    switch (w->type) {
    case QW_TYPE_F32: {
        const uint8_t *p = (const uint8_t *)w->data + (size_t)(r * n) * 4;
        for (int64_t c = 0; c < n; c++) {
            float v;
            memcpy(&v, p + c * 4, 4); /* f32 data may be unaligned inside a safetensors file */
            acc += (double)v * x[c];
        }
        break;
    }
    case QW_TYPE_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * n;
        for (int64_t c = 0; c < n; c++) acc += (double)qw_bf16_to_f32(p[c]) * x[c];
        break;
    }
    case QW_TYPE_F16: {
        const uint16_t *p = (const uint16_t *)w->data + r * n;
        for (int64_t c = 0; c < n; c++) acc += (double)qw_f16_to_f32(p[c]) * x[c];
        break;
    }
    default: {
        /* block-quantized: dequantize one block at a time (the type's to_float) and dot */
        const qw_type_traits *tt = qw_type_traits_of(w->type);
        QW_ASSERT(tt->to_float && tt->block_elems > 1 && n % tt->block_elems == 0);
        const uint8_t *p = (const uint8_t *)w->data + (size_t)r * qw_type_row_size(w->type, n);
        float buf[QW_QK_K];
        QW_ASSERT(tt->block_elems <= QW_QK_K);
        for (int64_t c = 0; c < n; c += tt->block_elems, p += tt->block_bytes) {
            tt->to_float(p, buf, tt->block_elems);
            for (int k = 0; k < tt->block_elems; k++) acc += (double)buf[k] * x[c + k];
        }
        break;
    }
    }
    return acc;
}

static void ref_matmul(QW_OPS_SELF float *y, const qw_tensor *w, const float *x, int n_tok) {
    int64_t rows = w->shape[0], cols = qw_tensor_row_len(w);
    for (int64_t r = 0; r < rows; r++)
        for (int t = 0; t < n_tok; t++) y[(int64_t)t * rows + r] = (float)qw_ref_dot_row(w, r, x + (int64_t)t * cols, cols);
}

static void ref_matmul_batch(QW_OPS_SELF const qw_matmul_job *jobs, int n_jobs) {
    for (int j = 0; j < n_jobs; j++) ref_matmul(ops, jobs[j].y, jobs[j].w, jobs[j].x, jobs[j].n_tok);
}

static void ref_get_rows(QW_OPS_SELF float *y, const qw_tensor *w, const int32_t *ids, int n) {
    int64_t dim = qw_tensor_row_len(w);
    for (int i = 0; i < n; i++) {
        QW_ASSERT(ids[i] >= 0 && ids[i] < w->shape[0]);
        qw_tensor_to_f32(w, (int64_t)ids[i] * dim, dim, y + (int64_t)i * dim);
    }
}

static void ref_rms_norm(QW_OPS_SELF float *y, const float *x, const float *w, int n_rows, int dim, float eps, int zc) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (int64_t)r * dim;
        float *yr = y + (int64_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) {
            float s = w ? (zc ? 1.0f + w[i] : w[i]) : 1.0f;
            yr[i] = xr[i] * inv * s;
        }
    }
}

static void ref_l2_norm(QW_OPS_SELF float *x, int n_rows, int dim, float eps, float scale, int n_scaled) {
    for (int r = 0; r < n_rows; r++) {
        float *xr = x + (int64_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss + eps)) * (r < n_scaled ? scale : 1.0f);
        for (int i = 0; i < dim; i++) xr[i] *= inv;
    }
}

static void ref_rope(QW_OPS_SELF float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot, const float *cs) {
    int half = n_rot / 2;
    for (int t = 0; t < n_tok; t++) {
        const float *c = cs + (int64_t)t * n_rot, *s = c + half;
        for (int h = 0; h < n_head; h++) {
            float *v = x + (int64_t)t * row_stride + (int64_t)h * head_stride;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

static void ref_conv1d_dw(QW_OPS_SELF float *y, const float *x, const float *w, int n_tok, int ch, int k, int dil,
                          int then_silu) {
    for (int t = 0; t < n_tok; t++)
        for (int c = 0; c < ch; c++) {
            double acc = 0;
            for (int j = 0; j < k; j++) acc += (double)w[(int64_t)c * k + j] * x[(int64_t)(t + j * dil) * ch + c];
            y[(int64_t)t * ch + c] = (float)acc;
        }
    if (then_silu) ops->silu(ops, y, (int64_t)n_tok * ch);
}

static void ref_silu(QW_OPS_SELF float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + qw_expd(-x[i]));
}

static void ref_sigmoid(QW_OPS_SELF float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 1.0f / (1.0f + qw_expd(-x[i]));
}

static void ref_mul(QW_OPS_SELF float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

static void ref_axpy(QW_OPS_SELF float *y, const float *a, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a[i] * s;
}

static void ref_attention(QW_OPS_SELF float *out, const float *q, int q_stride, const float *kc, const float *vc, int n_tok,
                          int n_head, int n_head_kv, int hd, float scale, const int32_t *sel, const int32_t *sel_off,
                          void *work, const qw_step *step) {
    int group = n_head / n_head_kv, pos0 = step->pos0;
    double *acc = work, *p = acc + hd;
    for (int t = 0; t < n_tok; t++) {
        int nk = sel ? sel_off[t + 1] - sel_off[t] : pos0 + t + 1;
        const int32_t *keys = sel ? sel + sel_off[t] : NULL;
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + (int64_t)t * q_stride + (int64_t)h * hd;
            int kvh = h / group;
            double mx = -INFINITY;
            for (int i = 0; i < nk; i++) {
                int64_t pos = keys ? keys[i] : i;
                const float *kh = kc + (pos * n_head_kv + kvh) * hd;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)qh[d] * kh[d];
                p[i] = s * scale;
                if (p[i] > mx) mx = p[i];
            }
            double sum = 0;
            for (int i = 0; i < nk; i++) sum += p[i] = exp(p[i] - mx);
            memset(acc, 0, (size_t)hd * sizeof(double));
            for (int i = 0; i < nk; i++) {
                int64_t pos = keys ? keys[i] : i;
                const float *vh = vc + (pos * n_head_kv + kvh) * hd;
                double wgt = p[i] / sum;
                for (int d = 0; d < hd; d++) acc[d] += wgt * vh[d];
            }
            float *oh = out + ((int64_t)t * n_head + h) * hd;
            for (int d = 0; d < hd; d++) oh[d] = (float)acc[d];
        }
    }
}

static void ref_delta_rule(QW_OPS_SELF float *o, float *state, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled) {
    int rep = hv / hk;
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < hv; j++) {
            float *S = state + (int64_t)j * dk * dv; /* [dk][dv] */
            const int hq = tiled ? j % hk : j / rep; /* its q/k head */
            const float *qj = q + ((int64_t)t * hk + hq) * dk;
            const float *kj = k + ((int64_t)t * hk + hq) * dk;
            const float *vj = v + ((int64_t)t * hv + j) * dv;
            float *oj = o + ((int64_t)t * hv + j) * dv;
            float decay = expf(g[(int64_t)t * hv + j]), b = beta[(int64_t)t * hv + j];
            for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= decay;
            for (int c = 0; c < dv; c++) {
                double kv = 0; /* (S^T k)[c] */
                for (int r = 0; r < dk; r++) kv += (double)S[r * dv + c] * kj[r];
                float u = b * (vj[c] - (float)kv);
                for (int r = 0; r < dk; r++) S[r * dv + c] += kj[r] * u;
            }
            for (int c = 0; c < dv; c++) {
                double acc = 0;
                for (int r = 0; r < dk; r++) acc += (double)S[r * dv + c] * qj[r];
                oj[c] = (float)acc;
            }
        }
}

/* (n_ctx + hd) doubles: the scores of one query and its weighted sum of values */
static size_t ref_attention_work(QW_OPS_SELF int n_ctx, int hd) { return ((size_t)n_ctx + (size_t)hd) * sizeof(double); }

static const qw_backend ref_backend = {
    .name = "ref",
    .host_memory = 1,
    .alloc = qw_host_alloc,
    .free = qw_host_free,
    .upload = qw_host_copy,
    .download = qw_host_copy,
    .copy = qw_host_copy,
    .zero = qw_host_zero,
    .sync = qw_host_sync,
    .matmul = ref_matmul,
    .matmul_batch = ref_matmul_batch,
    .get_rows = ref_get_rows,
    .store_rows = qw_op_store_rows,
    .copy_strided = qw_op_copy_strided,
    .rms_norm = ref_rms_norm,
    .rms_norm_grouped = qw_op_rms_norm_grouped,
    .l2_norm = ref_l2_norm,
    .silu = ref_silu,
    .sigmoid = ref_sigmoid,
    .mul = ref_mul,
    .axpy = ref_axpy,
    .divide = qw_op_divide,
    .act_mul = qw_op_act_mul,
    .rms_norm_gate = qw_op_rms_norm_gate,
    .rope_table = qw_op_rope_table,
    .rope = ref_rope,
    .attention = ref_attention,
    .attention_work = ref_attention_work,
    .qsa_keys = qw_op_qsa_keys,
    .qsa_select = qw_op_qsa_select,
    .qsa_select_work = qw_op_qsa_select_work,
    .conv1d_dw = ref_conv1d_dw,
    .conv1d_state = qw_op_conv1d_state,
    .gdn_gate = qw_op_gdn_gate,
    .delta_rule = ref_delta_rule,
    .moe_route = qw_op_moe_route,
    .moe_ffn = qw_op_moe_ffn,
    .moe_work = qw_op_moe_work,
    .hc_read = qw_op_hc_read,
    .hc_inject = qw_op_hc_inject,
    .ple_rows = qw_op_ple_rows,
    .ple_hist_push = qw_op_ple_hist_push,
    .argmax = qw_op_argmax,
    .topk = qw_op_topk,
    .ple_gather = qw_op_ple_gather,
    .ple_gate = qw_op_ple_gate,
};

const qw_backend *qw_backend_ref(void) { return &ref_backend; }
