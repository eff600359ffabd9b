/*
 * qwen35.c - Qwen3.5 dense (qwen3_5), Qwen3.5/3.6 MoE (qwen3_5_moe) and Qwen3-Next (qwen3_next):
 * pre-norm decoder whose mixer is Gated DeltaNet ("linear_attention") or gated full attention
 * ("full_attention"), and whose FFN is a SwiGLU MLP or a sparse MoE with a shared expert
 * (spec qwen35_family.md). Every RMSNorm is zero-centred (x / rms * (1 + w)) except the DeltaNet
 * gated norm (plain w, silu gate).
 *
 *   x = embed(tokens)
 *   per layer: x += mixer(ZRMS(x; input_layernorm));  x += ffn(ZRMS(x; post_attention_layernorm))
 *   hidden = ZRMS(x; norm)
 */
#include "blocks/blocks.h"
#include "models/bind.h"

/* Every layer: the two norms (post_attention_layernorm is llama.cpp's post_attention_norm), the mixer, the FFN. */
void qw_qwen35_tensors(qw_binder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int qk_norm = qw_arch_has(hp->arch, QW_AF_QK_NORM);
    qw_bind_embd(b);
    for (int il = 0; il < hp->n_layer && !b->st; il++) {
        qw_layer *L = &m->layers[il];
        qw_bind_vec(b, QW_GT_ATTN_NORM, il, hp->n_embd, &L->attn_norm);
        qw_bind_vec(b, QW_GT_POST_ATTN_NORM, il, hp->n_embd, &L->ffn_norm);
        if (L->kind == QW_LAYER_GDN)
            qw_bind_gdn(b, il, &L->gdn);
        else
            qw_bind_attn(b, il, &L->attn, qk_norm, 1, 0);
        if (L->moe)
            qw_bind_moe(b, il, &L->moe_w);
        else
            qw_bind_mlp(b, il, &L->mlp);
    }
    qw_bind_vec(b, QW_GT_OUTPUT_NORM, -1, hp->n_embd, &m->out_norm);
    qw_bind_output(b);
    qw_bind_mtp(b);
}

void qw_qwen35_forward(const qw_fwd *f, float *x) {
    const qwenc_model *m = f->m;
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, H = hp->n_embd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *h = qw_arena_f32(f->ar, (size_t)T * H), *y = qw_arena_f32(f->ar, (size_t)T * H);
    qw_be_layer(f->be, -1);
    f->be->get_rows(f->be, x, m->tok_embd, f->tokens, T);
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        qw_be_layer(f->be, il);
        f->be->rms_norm(f->be, h, x, L->attn_norm, T, H, hp->norm_eps, 1);
        if (L->kind == QW_LAYER_GDN)
            qw_gdn_forward(f, il, &L->gdn, 0, h, y);
        else
            qw_attn_forward(f, il, &L->attn, 1, h, y);
        f->be->axpy(f->be, x, y, 1.0f, (int64_t)T * H);
        f->be->rms_norm(f->be, h, x, L->ffn_norm, T, H, hp->norm_eps, 1);
        if (L->moe)
            qw_moe_forward(f, &L->moe_w, h, y);
        else
            qw_ffn_forward(f, &L->mlp, h, y, T);
        f->be->axpy(f->be, x, y, 1.0f, (int64_t)T * H);
    }
    qw_be_layer(f->be, -1);
    f->be->rms_norm(f->be, x, x, m->out_norm, T, H, hp->norm_eps, 1);
    if (f->mtp_hidden) f->be->copy(f->be, f->mtp_hidden, x, (size_t)T * H * sizeof(float));
    qw_arena_restore(f->ar, mk);
}

/* The draft head (spec qwen35_family.md 3, vLLM's semantics):
 *   u = fc . concat(ZRMS(embed(token); enorm), ZRMS(h; hnorm))
 *   u += attn(ZRMS(u; input_layernorm));  u += ffn(ZRMS(u; post_attention_layernorm))   (the head's layer)
 *   out = h_next = ZRMS(u; mtp.norm) */
void qw_qwen35_mtp_forward(const qw_fwd *f, const float *h_in, float *h_next, float *out) {
    const qwenc_model *m = f->m;
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    const qw_mtp_w *w = &m->mtp;
    int T = f->n_tok, H = hp->n_embd, il = hp->n_layer;
    const qw_layer *L = &m->layers[il];
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *x = qw_arena_f32(f->ar, (size_t)T * H), *h = qw_arena_f32(f->ar, (size_t)T * H);
    float *y = qw_arena_f32(f->ar, (size_t)T * H), *cat = qw_arena_f32(f->ar, (size_t)T * 2 * H);
    qw_be_layer(be, -1);
    be->get_rows(be, x, m->tok_embd, f->tokens, T);
    qw_be_layer(be, il); /* the head's own weights and its decoder layer: the head's layer */
    be->rms_norm(be, x, x, w->enorm, T, H, hp->norm_eps, 1);
    be->rms_norm(be, h, h_in, w->hnorm, T, H, hp->norm_eps, 1);
    qw_copy_layout half = {{H, T, 1, 1}, {1, 2 * H, 0, 0}, {1, H, 0, 0}};
    be->copy_strided(be, cat, x, &half);
    be->copy_strided(be, cat + H, h, &half);
    be->matmul(be, x, w->fc, cat, T);
    be->rms_norm(be, h, x, L->attn_norm, T, H, hp->norm_eps, 1);
    qw_attn_forward(f, il, &L->attn, 1, h, y);
    be->axpy(be, x, y, 1.0f, (int64_t)T * H);
    be->rms_norm(be, h, x, L->ffn_norm, T, H, hp->norm_eps, 1);
    if (L->moe)
        qw_moe_forward(f, &L->moe_w, h, y);
    else
        qw_ffn_forward(f, &L->mlp, h, y, T);
    be->axpy(be, x, y, 1.0f, (int64_t)T * H);
    be->rms_norm(be, out, x, w->norm, T, H, hp->norm_eps, 1);
    be->copy(be, h_next, out, (size_t)T * H * sizeof(float));
    qw_be_layer(be, -1);
    qw_arena_restore(f->ar, mk);
}
