/*
 * llama.c - Llama 3 (LlamaForCausalLM) and Qwen3 (Qwen3ForCausalLM): pre-norm decoder with full GQA
 * attention and a SwiGLU MLP. Qwen3 adds RMSNorm on each q and k head before RoPE. All norms are
 * plain RMSNorm (x / rms * w); RoPE rotates whole heads, rotate-half pairing (i, i + hd/2).
 *
 *   x = embed(tokens)
 *   per layer: x += o_proj(attn(RMSNorm(x; input_layernorm)))
 *              x += mlp(RMSNorm(x; post_attention_layernorm))
 *   hidden = RMSNorm(x; norm)
 */
#include "blocks/blocks.h"

qwenc_status qw_llama_bind(qwenc_model *m, char *err, size_t errlen) {
    const qw_hparams *hp = &m->hp;
    qw_binder b = {.m = m, .err = err, .errlen = errlen};
    if (hp->attn_bias || hp->mlp_bias)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s/config.json: attention_bias / mlp_bias are not supported",
                      m->path);
    for (int il = 0; il < hp->n_layer && !b.st; il++) {
        qw_layer *L = &m->layers[il];
        L->kind = QW_LAYER_ATTN;
        L->attn_norm = qw_bind_vec(&b, hp->n_embd, "~layers.%d.input_layernorm.weight", il);
        L->ffn_norm = qw_bind_vec(&b, hp->n_embd, "~layers.%d.post_attention_layernorm.weight", il);
        qw_bind_attn(&b, il, &L->attn, hp->arch == QW_ARCH_QWEN3, 0, 0);
        qw_bind_mlp(&b, il, &L->mlp, hp->n_ff);
    }
    m->out_norm = qw_bind_vec(&b, hp->n_embd, "~norm.weight");
    return b.st;
}

void qw_llama_forward(const qw_fwd *f, float *x) {
    const qwenc_model *m = f->m;
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, H = hp->n_embd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *h = qw_arena_f32(f->ar, (size_t)T * H), *y = qw_arena_f32(f->ar, (size_t)T * H);
    f->be->get_rows(f->be, x, m->tok_embd, f->tokens, T);
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        f->be->rms_norm(f->be, h, x, L->attn_norm, T, H, hp->norm_eps, 0);
        qw_attn_forward(f, il, &L->attn, 0, h, y);
        f->be->axpy(f->be, x, y, 1.0f, (int64_t)T * H);
        f->be->rms_norm(f->be, h, x, L->ffn_norm, T, H, hp->norm_eps, 0);
        qw_ffn_forward(f, &L->mlp, h, y, T);
        f->be->axpy(f->be, x, y, 1.0f, (int64_t)T * H);
    }
    f->be->rms_norm(f->be, x, x, m->out_norm, T, H, hp->norm_eps, 0);
    qw_arena_restore(f->ar, mk);
}
