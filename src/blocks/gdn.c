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
 * State: the last K-1 conv inputs and the [hv][dk][dv] recurrent state, both f32. A draft step also keeps the
 * conv window, the state before it and the delta rule's inputs (session.h, qw_draft_layer).
 *
 * Weights from a llama.cpp GGUF (w->v_tiled) keep the value heads in its tiled order, value head i of key
 * head g at i*hk + g: the delta rule takes that order as it is (its `tiled`: value head p reads q/k head
 * p % hk), so v, g, beta, o, z, the recurrent state and out_proj all stay in the order they were stored in.
 */
#include <math.h>

#include "blocks/blocks.h"

/* Split the fused qwen3_next projections into qkv [T][2kd+vd], z [T][vd], b, a [T][hv]. */
static void deinterleave(const qw_fwd *f, const qw_gdn_w *w, const float *x, float *qkv, float *z, float *b,
                         float *a) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int64_t T = f->n_tok, hk = hp->gdn_hk, dk = hp->gdn_dk, dv = hp->gdn_dv, hv = hp->gdn_hv, r = hv / hk;
    int64_t kd = hk * dk, vd = hv * dv, ch = 2 * kd + vd;
    int64_t gw = 2 * dk + 2 * r * dv; /* one key head's group in qkvz */
    float *m = qw_arena_f32(f->ar, (size_t)(T * (ch + vd)));
    float *mba = qw_arena_f32(f->ar, (size_t)(T * 2 * hv));
    qw_matmul_job proj[2] = {{m, w->qkvz, x, (int)T}, {mba, w->ba, x, (int)T}};
    be->matmul_batch(be, proj, 2);
    /* per token t and key head g: a piece of the group's row to its place in the split layout */
    qw_copy_layout qk = {{dk, hk, T, 1}, {1, dk, ch, 0}, {1, gw, ch + vd, 0}};
    be->copy_strided(be, qkv, m, &qk);                 /* q_g */
    be->copy_strided(be, qkv + kd, m + dk, &qk);       /* k_g */
    qw_copy_layout vz = {{r * dv, hk, T, 1}, {1, r * dv, ch, 0}, {1, gw, ch + vd, 0}};
    be->copy_strided(be, qkv + 2 * kd, m + 2 * dk, &vz); /* v_g */
    vz.d[2] = vd;
    be->copy_strided(be, z, m + 2 * dk + r * dv, &vz);   /* z_g */
    qw_copy_layout ba = {{r, hk, T, 1}, {1, r, hv, 0}, {1, 2 * r, 2 * hv, 0}};
    be->copy_strided(be, b, mba, &ba);
    be->copy_strided(be, a, mba + r, &ba);
}


/* The causal convolution of a segment's rows and its session's conv state: c rows [row0, row0+rows) from the
 * state's K-1 rows followed by the segment's projections, and the state moved on. xc holds the projections after
 * K-1 free rows, where one session's window is formed; a batched step's window goes beside, a draft step's into
 * the draft's copy (for qwenc_session_accept). */
static void gdn_conv(const qw_fwd *f, int il, const qw_gdn_w *w, qw_seg g, float *xc, float *c, int64_t ch, int K) {
    float *seq = xc; /* the state's rows, then the segment's */
    if (f->draft) seq = g.s->dl[il].conv_seq;
    else if (f->seqs) seq = qw_arena_f32(f->ar, (size_t)(K - 1 + g.rows) * ch);
    f->be->conv1d_state(f->be, c + (int64_t)g.row0 * ch, xc + (int64_t)(K - 1 + g.row0) * ch, g.s->ls[il].conv, seq,
                        w->conv, g.rows, (int)ch, K, 1, 1, f->draft); /* and silu */
}

void qw_gdn_recur(const qw_backend *be, float *o, float *state, const float *q, const float *k, const float *v,
                  const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled) {
    int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv;
    for (int t = 0; t < n_tok; t++)
        be->delta_rule(be, o + t * vd, state, q + t * kd, k + t * kd, v + t * vd, g + (int64_t)t * hv,
                       beta + (int64_t)t * hv, 1, hk, hv, dk, dv, tiled);
}

int qw_gdn_tiled(const qw_gdn_w *w, int hk, int hv) { return w->v_tiled && hv / hk > 1; }

int qw_conv_rows(const qw_fwd *f, int il, int ple, float *y, const float *x, const float *w, int ch, int k, int dil,
                 int then_silu) {
    const qw_backend *be = f->be;
    if (!f->seqs || f->draft || !be->conv1d_state_rows) return 0;
    for (int r0 = 0; r0 < f->n_tok; r0 += QW_ROWS_MAX) {
        const int n = QW_MIN(QW_ROWS_MAX, f->n_tok - r0);
        float *hist[QW_ROWS_MAX];
        for (int r = 0; r < n; r++) {
            qw_layer_state *ls = &f->seqs[r0 + r]->ls[il];
            hist[r] = ple ? ls->ple_hist : ls->conv;
        }
        be->conv1d_state_rows(be, y + (int64_t)r0 * ch, x + (int64_t)r0 * ch, hist, w, n, ch, k, dil, then_silu);
    }
    return 1;
}

/* A batched step's delta rule through delta_rule_rows, QW_ROWS_MAX sessions a call, row r through session r's
 * recurrent state of layer il. 0, nothing done: as qw_conv_rows. */
static int gdn_rule_rows(const qw_fwd *f, int il, float *o, const float *q, const float *k, const float *v,
                         const float *g, const float *b, int hk, int hv, int dk, int dv, int tiled) {
    const qw_backend *be = f->be;
    if (!f->seqs || f->draft || !be->delta_rule_rows) return 0;
    const int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv;
    for (int r0 = 0; r0 < f->n_tok; r0 += QW_ROWS_MAX) {
        const int n = QW_MIN(QW_ROWS_MAX, f->n_tok - r0);
        float *state[QW_ROWS_MAX];
        for (int r = 0; r < n; r++) state[r] = f->seqs[r0 + r]->ls[il].ssm;
        be->delta_rule_rows(be, o + r0 * vd, state, q + r0 * kd, k + r0 * kd, v + r0 * vd, g + (int64_t)r0 * hv,
                            b + (int64_t)r0 * hv, n, hk, hv, dk, dv, tiled);
    }
    return 1;
}

void qw_gdn_forward(const qw_fwd *f, int il, const qw_gdn_w *w, int gate_sigmoid, const float *x, float *y) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, K = hp->gdn_conv_k, hk = hp->gdn_hk, hv = hp->gdn_hv, dk = hp->gdn_dk, dv = hp->gdn_dv;
    int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv, ch = 2 * kd + vd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    /* conv input rows: K-1 free rows (the remembered ones go there), then this call's projections */
    float *xc = qw_arena_f32(f->ar, (size_t)(K - 1 + T) * ch);
    float *qkv = xc + (int64_t)(K - 1) * ch;
    float *z = qw_arena_f32(f->ar, (size_t)T * vd);
    /* a draft step keeps the delta rule's inputs for qwenc_session_accept: they are made where it keeps them */
    const qw_draft_layer *d = f->draft ? &f->s->dl[il] : NULL;
    float *b = d ? d->b : qw_arena_f32(f->ar, (size_t)T * hv), *a = d ? d->g : qw_arena_f32(f->ar, (size_t)T * hv);
    if (w->qkvz) {
        deinterleave(f, w, x, qkv, z, b, a);
    } else {
        qw_matmul_job proj[4] = {{qkv, w->qkv, x, T}, {z, w->z, x, T}, {b, w->b, x, T}, {a, w->a, x, T}};
        be->matmul_batch(be, proj, 4);
    }
    float *c = qw_arena_f32(f->ar, (size_t)T * ch);
    float *g = a; /* in place: g = -exp(A_log) * softplus(a + dt_bias) */
    float *q = c, *k = c + kd, *v = c + 2 * kd; /* one token's q, k and v lie apart in c already */
    if (T > 1) {
        q = d ? d->q : qw_arena_f32(f->ar, (size_t)T * kd), k = d ? d->k : qw_arena_f32(f->ar, (size_t)T * kd);
        v = d ? d->v : qw_arena_f32(f->ar, (size_t)T * vd);
    }
    if (qw_fwd_n_seg(f) == 1) { /* one session's tokens: the convolution, q, k and v, the l2 norms and the gate */
        qw_be_gdn_prep(be, c, q, k, v, qkv, qw_fwd_seg(f, 0).s->ls[il].conv, d ? d->conv_seq : xc, f->draft,
                       w->conv, T, (int)ch, K, hk, dk, 1e-6f, 1.0f / sqrtf((float)dk), g, b, w->neg_exp_a,
                       w->dt_bias, hv);
    } else { /* a batched step's, each row through its session's convolution state */
        if (!qw_conv_rows(f, il, 0, c, qkv, w->conv, (int)ch, K, 1, 1))
            for (int i = 0; i < qw_fwd_n_seg(f); i++) {
                qw_seg sg = qw_fwd_seg(f, i);
                qw_arena_mark ms = qw_arena_get_mark(f->ar);
                gdn_conv(f, il, w, sg, xc, c, ch, K);
                qw_arena_restore(f->ar, ms);
            }
        qw_copy_layout qk = {{kd, T, 1, 1}, {1, kd, 0, 0}, {1, ch, 0, 0}};
        be->copy_strided(be, q, c, &qk);
        be->copy_strided(be, k, c + kd, &qk);
        qw_copy_layout vl = {{vd, T, 1, 1}, {1, vd, 0, 0}, {1, ch, 0, 0}};
        be->copy_strided(be, v, c + 2 * kd, &vl);
        be->l2_norm(be, q, T * hk, dk, 1e-6f, 1.0f / sqrtf((float)dk), T * hk);
        be->l2_norm(be, k, T * hk, dk, 1e-6f, 1.0f, 0);
        be->gdn_gate(be, g, b, w->neg_exp_a, w->dt_bias, T, hv); /* and beta = sigma(b) in place */
    }
    /* the value heads in the order they were stored in: the delta rule takes llama.cpp's tiled order as it is */
    const int tiled = qw_gdn_tiled(w, hk, hv);

    float *o = qw_arena_f32(f->ar, (size_t)T * vd);
    if (d) { /* the state before the step, and the step's inputs where they were not made in place (one token) */
        be->copy(be, d->ssm0, f->s->ls[il].ssm, (size_t)hv * dk * dv * sizeof(float));
        if (q != d->q) be->copy(be, d->q, q, (size_t)T * kd * sizeof(float));
        if (k != d->k) be->copy(be, d->k, k, (size_t)T * kd * sizeof(float));
        if (v != d->v) be->copy(be, d->v, v, (size_t)T * vd * sizeof(float));
    }
    /* then the gated RMSNorm per value head: RMSNorm(o; w) * act(z); one session's rows with the delta rule (one op
     * where the backend has it) */
    const int act = gate_sigmoid ? QW_ACT_SIGMOID : QW_ACT_SILU;
    const int gated = be->delta_rule_gate && !f->draft && qw_fwd_n_seg(f) == 1;
    const int at_once = gdn_rule_rows(f, il, o, q, k, v, g, b, hk, hv, dk, dv, tiled); /* a batched step's */
    for (int i = 0; i < qw_fwd_n_seg(f) && !at_once; i++) { /* each session's rows through its own recurrent state */
        qw_seg s = qw_fwd_seg(f, i);
        int64_t r0 = s.row0;
        if (f->draft)
            qw_gdn_recur(be, o + r0 * vd, s.s->ls[il].ssm, q + r0 * kd, k + r0 * kd, v + r0 * vd, g + r0 * hv,
                         b + r0 * hv, s.rows, hk, hv, dk, dv, tiled);
        else if (gated)
            be->delta_rule_gate(be, o, s.s->ls[il].ssm, q, k, v, g, b, T, hk, hv, dk, dv, tiled, w->norm, z,
                                hp->norm_eps, act);
        else
            be->delta_rule(be, o + r0 * vd, s.s->ls[il].ssm, q + r0 * kd, k + r0 * kd, v + r0 * vd, g + r0 * hv,
                           b + r0 * hv, s.rows, hk, hv, dk, dv, tiled);
    }
    if (!gated) be->rms_norm_gate(be, o, o, w->norm, z, T * hv, dv, hp->norm_eps, act);
    be->matmul(be, y, w->out, o, T);
    qw_arena_restore(f->ar, mk);
}
