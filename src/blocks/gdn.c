/*
 * gdn.c - linear_attn: Gated DeltaNet (spec qwen4_exp.md 3.4, qwen35_family.md 1-2).
 *
 *   w = W_qkv x (channels [q | k | v]); z = W_z x; b = W_b x; a = W_a x
 *   c = silu(causal depthwise conv over the last K inputs of w)
 *   q = l2norm(q) / sqrt(dk), k = l2norm(k) (eps 1e-6 inside the square root)
 *   beta = sigma(b), g = -exp(A_log) * softplus(a + dt_bias)
 *   delta rule per value head (value head j reads q/k head j / (hv/hk))
 *   y = W_out (RMSNorm(o; w) * act(z)), act = sigma (qwen4_exp "sigmoid") or silu
 *
 * qwen3_next stores the projections fused and grouped per key head g:
 * in_proj_qkvz rows [q_g | k_g | v_g (r heads) | z_g (r heads)], in_proj_ba rows [b_g (r) | a_g (r)],
 * r = hv/hk; they are de-interleaved into the split layout first.
 *
 * State: the last K-1 conv inputs and the [hv][dk][dv] recurrent state, both f32.
 *
 * Weights from a llama.cpp GGUF (w->v_tiled) keep the value heads in its tiled order, value head i of key
 * head g at i*hk + g: v, g and beta are put in the grouped order above before the delta rule and its
 * output back in tiled order after it, so z and out_proj read the order they were stored in.
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Split the fused qwen3_next projections into qkv [T][2kd+vd], z [T][vd], b, a [T][hv]. */
static void deinterleave(const qw_fwd *f, const qw_gdn_w *w, const float *x, float *qkv, float *z, float *b,
                         float *a) {
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, hk = hp->gdn_hk, dk = hp->gdn_dk, dv = hp->gdn_dv, r = hp->gdn_hv / hk;
    int64_t kd = (int64_t)hk * dk, vd = (int64_t)hp->gdn_hv * dv, ch = 2 * kd + vd;
    int64_t gw = 2 * dk + 2 * (int64_t)r * dv; /* one key head's group in qkvz */
    float *m = qw_arena_f32(f->ar, (size_t)T * (ch + vd));
    float *mba = qw_arena_f32(f->ar, (size_t)T * 2 * hp->gdn_hv);
    qw_matmul_job proj[2] = {{m, w->qkvz, x, T}, {mba, w->ba, x, T}};
    f->ops->matmul_batch(f->ops, proj, 2);
    for (int t = 0; t < T; t++) {
        const float *src = m + t * (ch + vd);
        float *dst = qkv + t * ch;
        for (int g = 0; g < hk; g++) {
            const float *grp = src + g * gw;
            memcpy(dst + (int64_t)g * dk, grp, (size_t)dk * sizeof(float));
            memcpy(dst + kd + (int64_t)g * dk, grp + dk, (size_t)dk * sizeof(float));
            memcpy(dst + 2 * kd + (int64_t)g * r * dv, grp + 2 * dk, (size_t)r * dv * sizeof(float));
            memcpy(z + t * vd + (int64_t)g * r * dv, grp + 2 * dk + (int64_t)r * dv, (size_t)r * dv * sizeof(float));
            for (int i = 0; i < r; i++) {
                b[(int64_t)t * hp->gdn_hv + g * r + i] = mba[(int64_t)t * 2 * hp->gdn_hv + g * 2 * r + i];
                a[(int64_t)t * hp->gdn_hv + g * r + i] = mba[(int64_t)t * 2 * hp->gdn_hv + g * 2 * r + r + i];
            }
        }
    }
}

/* Reorder the hv heads (d floats each) of n rows between tiled (i*hk + g) and grouped (g*r + i) order. */
static void vhead_order(float *x, int n, int hk, int r, int d, int to_grouped, float *tmp) {
    int hv = hk * r;
    for (int t = 0; t < n; t++) {
        float *row = x + (int64_t)t * hv * d;
        for (int j = 0; j < hv; j++) {
            int p = (j % r) * hk + j / r; /* tiled position of grouped head j */
            memcpy(tmp + (int64_t)(to_grouped ? j : p) * d, row + (int64_t)(to_grouped ? p : j) * d,
                   (size_t)d * sizeof(float));
        }
        memcpy(row, tmp, (size_t)hv * d * sizeof(float));
    }
}

void qw_gdn_forward(const qw_fwd *f, int il, const qw_gdn_w *w, int gate_sigmoid, const float *x, float *y) {
    const qw_hparams *hp = f->hp;
    const qw_ops *ops = f->ops;
    qw_layer_state *ls = &f->s->ls[il];
    int T = f->n_tok, K = hp->gdn_conv_k, hk = hp->gdn_hk, hv = hp->gdn_hv, dk = hp->gdn_dk, dv = hp->gdn_dv;
    int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv, ch = 2 * kd + vd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    /* conv input rows: the K-1 remembered ones, then this call's projections */
    float *xc = qw_arena_f32(f->ar, (size_t)(K - 1 + T) * ch);
    float *qkv = xc + (int64_t)(K - 1) * ch;
    float *z = qw_arena_f32(f->ar, (size_t)T * vd);
    float *b = qw_arena_f32(f->ar, (size_t)T * hv), *a = qw_arena_f32(f->ar, (size_t)T * hv);
    memcpy(xc, ls->conv, (size_t)(K - 1) * ch * sizeof(float));
    if (w->qkvz) {
        deinterleave(f, w, x, qkv, z, b, a);
    } else {
        qw_matmul_job proj[4] = {{qkv, w->qkv, x, T}, {z, w->z, x, T}, {b, w->b, x, T}, {a, w->a, x, T}};
        ops->matmul_batch(ops, proj, 4);
    }
    float *c = qw_arena_f32(f->ar, (size_t)T * ch);
    ops->conv1d_dw(ops, c, xc, w->conv, T, (int)ch, K, 1);
    memcpy(ls->conv, xc + (int64_t)T * ch, (size_t)(K - 1) * ch * sizeof(float));
    ops->silu(ops, c, (int64_t)T * ch);

    float *q = qw_arena_f32(f->ar, (size_t)T * kd), *k = qw_arena_f32(f->ar, (size_t)T * kd);
    float *v = qw_arena_f32(f->ar, (size_t)T * vd);
    for (int t = 0; t < T; t++) {
        memcpy(q + t * kd, c + t * ch, (size_t)kd * sizeof(float));
        memcpy(k + t * kd, c + t * ch + kd, (size_t)kd * sizeof(float));
        memcpy(v + t * vd, c + t * ch + 2 * kd, (size_t)vd * sizeof(float));
    }
    ops->l2_norm(ops, q, T * hk, dk, 1e-6f, 1.0f / sqrtf((float)dk));
    ops->l2_norm(ops, k, T * hk, dk, 1e-6f, 1.0f);
    float *g = a; /* in place: g = -exp(A_log) * softplus(a + dt_bias) */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < hv; j++) {
            int64_t i = (int64_t)t * hv + j;
            g[i] = w->neg_exp_a[j] * softplus(a[i] + w->dt_bias[j]);
        }
    ops->sigmoid(ops, b, (int64_t)T * hv); /* beta */

    int r = hv / hk;
    float *tmp = w->v_tiled && r > 1 ? qw_arena_f32(f->ar, (size_t)vd) : NULL;
    if (tmp) {
        vhead_order(v, T, hk, r, dv, 1, tmp);
        vhead_order(g, T, hk, r, 1, 1, tmp);
        vhead_order(b, T, hk, r, 1, 1, tmp);
    }
    float *o = qw_arena_f32(f->ar, (size_t)T * vd);
    ops->delta_rule(ops, o, ls->ssm, q, k, v, g, b, T, hk, hv, dk, dv);
    if (tmp) vhead_order(o, T, hk, r, dv, 0, tmp);

    /* gated RMSNorm per value head: RMSNorm(o; w) * act(z) */
    ops->rms_norm(ops, o, o, w->norm, T * hv, dv, hp->norm_eps, 0);
    if (gate_sigmoid)
        ops->sigmoid(ops, z, (int64_t)T * vd);
    else
        ops->silu(ops, z, (int64_t)T * vd);
    ops->mul(ops, o, o, z, (int64_t)T * vd);
    ops->matmul(ops, y, w->out, o, T);
    qw_arena_restore(f->ar, mk);
}
