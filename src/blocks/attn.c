/*
 * attn.c - self_attn: softmax attention with GQA, optional q/k RMS norms, (partial) rotate-half RoPE, an
 * optional per-head output gate (Qwen3NextAttention: q_proj yields [q_h | gate_h] per head and
 * sigma(gate) multiplies the head outputs before o_proj), and optional QSA sparse selection.
 *
 * The KV cache holds K after norm and RoPE, and V, for every past position of the session.
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

/* llama.cpp's llama GGUFs store each q/k head's rows interleaved (HF row i < hd/2 at 2i, row hd/2+i at
 * 2i+1, for its RoPE on adjacent pairs): put n_rows heads of x back in rotate-half order. tmp [hd]. */
static void deinterleave_heads(float *x, int64_t n_rows, int hd, float *tmp) {
    int half = hd / 2;
    for (int64_t r = 0; r < n_rows; r++) {
        float *h = x + r * hd;
        for (int i = 0; i < half; i++) {
            tmp[i] = h[2 * i];
            tmp[half + i] = h[2 * i + 1];
        }
        memcpy(h, tmp, (size_t)hd * sizeof(float));
    }
}

void qw_attn_forward(const qw_fwd *f, int il, const qw_attn_w *w, int zc, const float *x, float *y) {
    const qw_hparams *hp = f->hp;
    const qw_ops *ops = f->ops;
    qw_layer_state *ls = &f->s->ls[il];
    int T = f->n_tok, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    int64_t nq = (int64_t)nh * hd, nk = (int64_t)nkv * hd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    float *q = qw_arena_f32(f->ar, (size_t)T * nq), *gate = NULL, *qg = NULL;
    /* new K and V go straight into the cache rows pos0 .. pos0+T-1; the three projections of x as one batch */
    float *k = ls->k + (int64_t)f->pos0 * nk, *v = ls->v + (int64_t)f->pos0 * nk;
    if (w->gated) qg = qw_arena_f32(f->ar, (size_t)T * nq * 2);
    qw_matmul_job proj[3] = {{w->gated ? qg : q, w->wq, x, T}, {k, w->wk, x, T}, {v, w->wv, x, T}};
    ops->matmul_batch(ops, proj, 3);
    if (w->gated) {
        gate = qw_arena_f32(f->ar, (size_t)T * nq);
        for (int64_t r = 0; r < (int64_t)T * nh; r++) {
            memcpy(q + r * hd, qg + r * 2 * hd, (size_t)hd * sizeof(float));
            memcpy(gate + r * hd, qg + r * 2 * hd + hd, (size_t)hd * sizeof(float));
        }
    }
    if (w->rope_interleaved) {
        float *tmp = qw_arena_f32(f->ar, (size_t)hd);
        deinterleave_heads(q, (int64_t)T * nh, hd, tmp);
        deinterleave_heads(k, (int64_t)T * nkv, hd, tmp);
    }
    if (w->q_norm) ops->rms_norm(ops, q, q, w->q_norm, T * nh, hd, hp->norm_eps, zc);
    if (w->k_norm) ops->rms_norm(ops, k, k, w->k_norm, T * nkv, hd, hp->norm_eps, zc);
    ops->rope(ops, q, T, (int)nq, nh, hd, hp->n_rot, f->rope_cs);
    ops->rope(ops, k, T, (int)nk, nkv, hd, hp->n_rot, f->rope_cs);

    int32_t *sel = NULL, *sel_off = NULL;
    if (w->idx_qk) qw_qsa_select(f, il, w, x, &sel, &sel_off);

    float *o = qw_arena_f32(f->ar, (size_t)T * nq);
    double *work = qw_arena_alloc(f->ar, (size_t)(f->pos0 + T + hd) * sizeof(double));
    ops->attention(ops, o, q, (int)nq, ls->k, ls->v, T, f->pos0, nh, nkv, hd, 1.0f / sqrtf((float)hd), sel, sel_off,
                   work);
    if (gate) {
        ops->sigmoid(ops, gate, (int64_t)T * nq);
        ops->mul(ops, o, o, gate, (int64_t)T * nq);
    }
    ops->matmul(ops, y, w->wo, o, T);
    qw_arena_restore(f->ar, mk);
}
