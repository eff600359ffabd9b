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
#include "models/bind.h"

/* llama: q/k rows permuted in a GGUF (interleaved RoPE), llama3 scaling as rope_freqs; qwen3: per-head q/k norms.
 * FFN_NORM is llama.cpp's name of post_attention_layernorm for both. */
void qw_llama_tensors(qw_binder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int qk_norm = qw_arch_has(hp->arch, QW_AF_QK_NORM);
    qw_bind_embd(b);
    for (int il = 0; il < hp->n_layer && !b->st; il++) {
        qw_layer *L = &m->layers[il];
        qw_bind_vec(b, QW_GT_ATTN_NORM, il, hp->n_embd, &L->attn_norm);
        qw_bind_vec(b, QW_GT_FFN_NORM, il, hp->n_embd, &L->ffn_norm);
        qw_bind_attn(b, il, &L->attn, qk_norm, 0, 0);
        qw_bind_mlp(b, il, &L->mlp);
    }
    qw_bind_vec(b, QW_GT_OUTPUT_NORM, -1, hp->n_embd, &m->out_norm);
    qw_bind_output(b);
}

void qw_llama_forward(const qw_fwd *f, float *x) {
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
        f->be->rms_norm(f->be, h, x, L->attn_norm, T, H, hp->norm_eps, 0);
        qw_attn_forward(f, il, &L->attn, 0, h, y);
        f->be->axpy(f->be, x, y, 1.0f, (int64_t)T * H);
        f->be->rms_norm(f->be, h, x, L->ffn_norm, T, H, hp->norm_eps, 0);
        qw_ffn_forward(f, &L->mlp, h, y, T);
        f->be->axpy(f->be, x, y, 1.0f, (int64_t)T * H);
    }
    qw_be_layer(f->be, -1);
    f->be->rms_norm(f->be, x, x, m->out_norm, T, H, hp->norm_eps, 0);
    qw_arena_restore(f->ar, mk);
}
