/*
 * qwen4exp.c - Qwen3.8-Flash-Next (transformers qwen4_exp; spec qwen4_exp.md 3.0):
 * four residual streams joined by hyper-connections, Gated DeltaNet and QSA sparse-attention layers,
 * a 512-expert MoE with shared expert in every layer, the hashed n-gram embedding (PLE) on chosen
 * DeltaNet layers, and a final stream mixer in place of a final norm.
 *
 *   X = [e | e | ... | e] (C copies of the token embedding)
 *   per layer l: if PLE layer: X += PLE(X, ids)
 *                (a, inj) = HC(attn_hyper_connection, X); X[s] += inj[s] * mixer(a)
 *                (a, inj) = HC(mlp_hyper_connection, X);  X[s] += inj[s] * moe(a)
 *   hidden = HC_mix(hyper_connection_mixer, X)
 */
#include <string.h>

#include "blocks/blocks.h"
#include "models/bind.h"

/* The PLE tables follow the token embedding; a layer holds its two hyper-connections, its PLE weights (a PLE
 * layer), the mixer (DeltaNet or QSA) and the MoE; the final stream mixer replaces a final norm. */
void qw_qwen4exp_tensors(qw_binder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int qk_norm = qw_arch_has(hp->arch, QW_AF_QK_NORM);
    qw_bind_embd(b);
    qw_bind_ple_tables(b);
    for (int il = 0; il < hp->n_layer && !b->st; il++) {
        qw_layer *L = &m->layers[il];
        qw_bind_hc(b, il, &L->hc_attn, QW_GT_HC_ATTN_NORM, QW_GT_HC_ATTN_DOWN, QW_GT_HC_ATTN_UP, QW_GT_HC_ATTN_INJECT);
        qw_bind_hc(b, il, &L->hc_mlp, QW_GT_HC_FFN_NORM, QW_GT_HC_FFN_DOWN, QW_GT_HC_FFN_UP, QW_GT_HC_FFN_INJECT);
        if (L->ple) qw_bind_ple(b, il, L->ple);
        if (L->kind == QW_LAYER_GDN)
            qw_bind_gdn(b, il, &L->gdn);
        else
            qw_bind_attn(b, il, &L->attn, qk_norm, 1, L->kind == QW_LAYER_QSA);
        qw_bind_moe(b, il, &L->moe_w);
    }
    qw_bind_hc(b, -1, &m->hc_final, QW_GT_HC_HEAD_NORM, QW_GT_HC_HEAD_DOWN, QW_GT_HC_HEAD_UP, QW_GT_COUNT);
    qw_bind_output(b);
    qw_bind_mtp(b);
}

void qw_qwen4exp_forward(const qw_fwd *f, float *hidden) {
    const qwenc_model *m = f->m;
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, H = hp->n_embd, C = hp->hc_count;
    int64_t CH = (int64_t)C * H;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *X = qw_arena_f32(f->ar, (size_t)T * CH);
    float *a = qw_arena_f32(f->ar, (size_t)T * H), *y = qw_arena_f32(f->ar, (size_t)T * H);
    float *inj = qw_arena_f32(f->ar, (size_t)T * C);
    qw_be_layer(be, -1);
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layers[il].ple) qw_ple_prefetch(f, m->layers[il].ple);
    be->get_rows(be, a, m->tok_embd, f->tokens, T);
    qw_copy_layout streams = {{H, C, T, 1}, {1, H, CH, 0}, {1, 0, H, 0}}; /* C copies of each token's embedding */
    be->copy_strided(be, X, a, &streams);
    /* each block's output goes into the streams with the next hyper-connection's norm (one op), except before a
     * PLE layer, whose embedding goes in between */
    int pending = 0; /* y and inj: the last MoE's output, not yet in X */
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        qw_be_layer(be, il);
        if (pending && L->ple) qw_hc_inject(f, X, inj, y), pending = 0;
        if (L->ple) qw_ple_forward(f, il, L->ple, X);
        if (pending)
            qw_hc_inject_forward(f, &L->hc_attn, X, y, inj, a, inj);
        else
            qw_hc_forward(f, &L->hc_attn, X, a, inj);
        if (L->kind == QW_LAYER_GDN)
            qw_gdn_forward(f, il, &L->gdn, hp->gdn_gate_sigmoid, a, y);
        else
            qw_attn_forward(f, il, &L->attn, 1, a, y);
        qw_hc_inject_forward(f, &L->hc_mlp, X, y, inj, a, inj);
        qw_moe_forward(f, &L->moe_w, a, y);
        pending = 1;
    }
    qw_be_layer(be, -1);
    if (pending)
        qw_hc_inject_forward(f, &m->hc_final, X, y, inj, hidden, NULL);
    else
        qw_hc_forward(f, &m->hc_final, X, hidden, NULL);
    if (f->mtp_hidden) be->copy(be, f->mtp_hidden, X, (size_t)T * CH * sizeof(float)); /* the streams, all in */
    qw_arena_restore(f->ar, mk);
}

/* The draft head (spec qwen4_exp.md 3.10, vLLM's semantics), reading the main model's streams before its mixer:
 *   ep = fc_embedding . ZRMS(embed(token); enorm);  hn = ZRMS(X; hnorm) (one RMS over the C*H values)
 *   Z[s] = fc_hidden . hn[s] + ep for every stream s
 *   Z = the head's QSA decoder layer (hyper-connections, QSA, MoE; no PLE)
 *   h_next = Z;  out = HC_mix(the head's mixer, Z) */
void qw_qwen4exp_mtp_forward(const qw_fwd *f, const float *h_in, float *h_next, float *out) {
    const qwenc_model *m = f->m;
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    const qw_mtp_w *w = &m->mtp;
    int T = f->n_tok, H = hp->n_embd, C = hp->hc_count, il = hp->n_layer;
    int64_t CH = (int64_t)C * H;
    const qw_layer *L = &m->layers[il];
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *X = qw_arena_f32(f->ar, (size_t)T * CH), *hn = qw_arena_f32(f->ar, (size_t)T * CH);
    float *a = qw_arena_f32(f->ar, (size_t)T * H), *y = qw_arena_f32(f->ar, (size_t)T * H);
    float *inj = qw_arena_f32(f->ar, (size_t)T * C);
    qw_be_layer(be, -1);
    be->get_rows(be, a, m->tok_embd, f->tokens, T);
    qw_be_layer(be, il); /* the head's own weights and its decoder layer: the head's layer */
    be->rms_norm(be, a, a, w->enorm, T, H, hp->norm_eps, 1);
    be->matmul(be, y, w->fc_embd, a, T);
    be->rms_norm(be, hn, h_in, w->hnorm, T, (int)CH, hp->norm_eps, 1);
    be->matmul(be, X, w->fc_hidden, hn, T * C);
    qw_copy_layout streams = {{H, C, T, 1}, {1, H, CH, 0}, {1, 0, H, 0}}; /* ep under every stream */
    be->copy_strided(be, hn, y, &streams);
    be->axpy(be, X, hn, 1.0f, (int64_t)T * CH);
    qw_hc_forward(f, &L->hc_attn, X, a, inj);
    qw_attn_forward(f, il, &L->attn, 1, a, y);
    qw_hc_inject(f, X, inj, y);
    qw_hc_forward(f, &L->hc_mlp, X, a, inj);
    qw_moe_forward(f, &L->moe_w, a, y);
    qw_hc_inject(f, X, inj, y);
    be->copy(be, h_next, X, (size_t)T * CH * sizeof(float));
    qw_hc_forward(f, &w->hc_final, X, out, NULL);
    qw_be_layer(be, -1);
    qw_arena_restore(f->ar, mk);
}
