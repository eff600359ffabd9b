/*
 * attn.c - self_attn: softmax attention with GQA, optional q/k RMS norms, (partial) rotate-half RoPE, an
 * optional per-head output gate (Qwen3NextAttention: q_proj yields [q_h | gate_h] per head and
 * sigma(gate) multiplies the head outputs before o_proj), and optional QSA sparse selection.
 *
 * The KV cache holds K after norm and RoPE, and V, for every past position of the session: a step's new
 * rows are computed in scratch and stored at the step's position (store_rows). In a batched step each session's
 * row is stored in its own cache and attends over it, QW_ROWS_MAX sessions' rows a call of the rows ops (ops.h
 * kv_store_rows, qsa_rows, attention_rows; a call a row where the backend lacks them).
 */
#include <math.h>

#include "blocks/blocks.h"

/* llama.cpp's llama GGUFs store each q/k head's rows interleaved (HF row i < hd/2 at 2i, row hd/2+i at
 * 2i+1, for its RoPE on adjacent pairs): put n_rows heads of x back in rotate-half order, through tmp. */
static void deinterleave_heads(const qw_fwd *f, float *x, int64_t n_rows, int hd, float *tmp) {
    int64_t half = hd / 2;
    qw_copy_layout to_tmp = {{half, 2, n_rows, 1}, {1, half, hd, 0}, {2, 1, hd, 0}};
    qw_copy_layout back = {{n_rows * hd, 1, 1, 1}, {1, 0, 0, 0}, {1, 0, 0, 0}};
    f->be->copy_strided(f->be, tmp, x, &to_tmp);
    f->be->copy_strided(f->be, x, tmp, &back);
}

/* A batched step's rows (one token of each session): stored, selected (QSA) and attended QW_ROWS_MAX at a time. */
static void attn_rows(const qw_fwd *f, int il, const qw_attn_w *w, const float *q, const float *k, const float *v,
                      const float *iqk, float *o, void *work) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    int64_t nq = (int64_t)nh * hd, nk = (int64_t)nkv * hd;
    for (int r0 = 0; r0 < f->n_tok; r0 += QW_ROWS_MAX) {
        const int n = QW_MIN(QW_ROWS_MAX, f->n_tok - r0);
        qw_attn_rows r = {0};
        for (int i = 0; i < n; i++) {
            qwenc_session *s = f->seqs[r0 + i];
            r.k[i] = s->ls[il].k, r.v[i] = s->ls[il].v, r.step[i] = s->step;
            r.idx_raw[i] = s->ls[il].idx_raw, r.idx_blk[i] = s->ls[il].idx_blk;
        }
        qw_be_kv_store_rows(be, &r, k + r0 * nk, v + r0 * nk, n, nk);
        qw_arena_mark ms = qw_arena_get_mark(f->ar);
        int32_t *sel = NULL, *sel_off = NULL;
        int sel_stride = 0;
        if (iqk) qw_qsa_select_rows(f, w, iqk, r0, n, &r, &sel, &sel_off, &sel_stride);
        qw_be_attention_rows(be, &r, o + r0 * nq, q + r0 * nq, (int)nq, n, nh, nkv, hd, 1.0f / sqrtf((float)hd), sel,
                             sel_off, sel_stride, work);
        qw_arena_restore(f->ar, ms);
    }
}

void qw_attn_forward(const qw_fwd *f, int il, const qw_attn_w *w, int zc, const float *x, float *y) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    int64_t nq = (int64_t)nh * hd, nk = (int64_t)nkv * hd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    float *q = w->gated ? NULL : qw_arena_f32(f->ar, (size_t)T * nq), *gate = NULL, *qg = NULL;
    float *k = qw_arena_f32(f->ar, (size_t)T * nk), *v = qw_arena_f32(f->ar, (size_t)T * nk);
    if (w->gated) qg = qw_arena_f32(f->ar, (size_t)T * nq * 2);
    /* the QSA indexer's queries and key with q, k and v: one batch */
    float *iqk = w->idx_qk ? qw_arena_f32(f->ar, (size_t)T * qw_qsa_width(hp)) : NULL;
    qw_matmul_job proj[4] = {
        {w->gated ? qg : q, w->wq, x, T}, {k, w->wk, x, T}, {v, w->wv, x, T}, {iqk, w->idx_qk, x, T}};
    be->matmul_batch(be, proj, iqk ? 4 : 3);
    if (w->gated) { /* per head [q_h | gate_h]: all q heads, then all gate heads, in one copy */
        q = qw_arena_f32(f->ar, (size_t)T * nq * 2), gate = q + (int64_t)T * nq;
        qw_copy_layout split = {{hd, (int64_t)T * nh, 2, 1}, {1, hd, (int64_t)T * nq, 0}, {1, 2 * hd, hd, 0}};
        be->copy_strided(be, q, qg, &split);
    }
    if (w->rope_interleaved) {
        float *tmp = qw_arena_f32(f->ar, (size_t)T * nq);
        deinterleave_heads(f, q, (int64_t)T * nh, hd, tmp);
        deinterleave_heads(f, k, (int64_t)T * nkv, hd, tmp);
    }
    if (w->q_norm) /* each head's norm and RoPE (one op where the backend fuses them) */
        qw_be_rms_norm_rope(be, q, w->q_norm, T, (int)nq, nh, hd, hp->norm_eps, zc, hp->n_rot, f->rope_cs);
    else
        be->rope(be, q, T, (int)nq, nh, hd, hp->n_rot, f->rope_cs);
    /* one session's keys normed, RoPE'd and stored with its values in one op where the backend has it */
    const int kv_stored = w->k_norm && be->rms_norm_rope_kv && qw_fwd_n_seg(f) == 1;
    if (kv_stored) {
        qw_seg g = qw_fwd_seg(f, 0);
        be->rms_norm_rope_kv(be, k, w->k_norm, T, nkv, hd, hp->norm_eps, zc, hp->n_rot, f->rope_cs, g.s->ls[il].k, v,
                             g.s->ls[il].v, g.s->step);
    } else if (w->k_norm) {
        qw_be_rms_norm_rope(be, k, w->k_norm, T, (int)nk, nkv, hd, hp->norm_eps, zc, hp->n_rot, f->rope_cs);
    } else {
        be->rope(be, k, T, (int)nk, nkv, hd, hp->n_rot, f->rope_cs);
    }
    if (iqk) qw_qsa_queries(f, w, iqk);

    /* each session's rows against its own cache, at its own position */
    float *o = qw_arena_f32(f->ar, (size_t)T * nq);
    void *work = qw_arena_alloc(f->ar, be->attention_work(be, f->n_ctx, hd));
    if (f->seqs && !kv_stored) /* a batched step: the rows ops */
        attn_rows(f, il, w, q, k, v, iqk, o, work);
    else
        for (int i = 0; i < qw_fwd_n_seg(f); i++) {
            qw_seg g = qw_fwd_seg(f, i);
            qw_layer_state *ls = &g.s->ls[il];
            int64_t r0 = g.row0;
            if (!kv_stored) {
                be->store_rows(be, ls->k, k + r0 * nk, g.rows, nk, g.s->step);
                be->store_rows(be, ls->v, v + r0 * nk, g.rows, nk, g.s->step);
            }
            qw_arena_mark ms = qw_arena_get_mark(f->ar);
            int32_t *sel = NULL, *sel_off = NULL;
            if (iqk) qw_qsa_select(f, il, w, iqk, g, &sel, &sel_off);
            /* the leading queries that keep every position they see (QSA's dense regime) attend densely, the rest
             * over their selection (its offsets are absolute in sel) */
            const int dense = sel && f->qsa_dense > 0 && f->qsa_dense < g.rows ? f->qsa_dense : 0;
            if (dense)
                be->attention(be, o + r0 * nq, q + r0 * nq, (int)nq, ls->k, ls->v, dense, nh, nkv, hd,
                              1.0f / sqrtf((float)hd), NULL, NULL, work, g.s->step);
            be->attention(be, o + (r0 + dense) * nq, q + (r0 + dense) * nq, (int)nq, ls->k, ls->v, g.rows - dense, nh,
                          nkv, hd, 1.0f / sqrtf((float)hd), sel, sel ? sel_off + dense : NULL, work, g.s->step);
            qw_arena_restore(f->ar, ms);
        }
    if (gate) be->act_mul(be, o, gate, o, (int64_t)T * nq, QW_ACT_SIGMOID);
    be->matmul(be, y, w->wo, o, T);
    qw_arena_restore(f->ar, mk);
}
