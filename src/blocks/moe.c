/*
 * moe.c - mlp: the SwiGLU feed-forward and the sparse mixture of experts with a shared expert
 * (Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock / Qwen4Exp; spec qwen4_exp.md 3.6).
 *
 *   p = softmax(W_router x) over all experts (f32); top-k of p (ties: lower expert id first);
 *   renormalise the k weights when norm_topk_prob; routed = sum_j p_j * expert_j(x);
 *   shared = sigma(w_sg . x) * shared_expert(x); y = routed + shared.
 *
 * The routing and the expert products are one op (moe_ffn, routing as moe_route does): the backend groups the
 * tokens of each chosen expert, runs them, and adds the weighted outputs, with no trip of the routing through
 * the host.
 */
#include "blocks/blocks.h"

void qw_ffn_forward(const qw_fwd *f, const qw_ffn_w *w, const float *x, float *y, int n) {
    const qw_backend *be = f->be;
    int64_t I = w->gate.shape[0];
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *g = qw_arena_f32(f->ar, (size_t)n * I), *u = qw_arena_f32(f->ar, (size_t)n * I);
    qw_matmul_job proj[2] = {{g, &w->gate, x, n}, {u, &w->up, x, n}};
    be->matmul_batch(be, proj, 2);
    be->act_mul(be, g, g, u, (int64_t)n * I, QW_ACT_SILU);
    be->matmul(be, y, &w->down, g, n);
    qw_arena_restore(f->ar, mk);
}

void qw_moe_forward(const qw_fwd *f, const qw_moe_w *w, const float *x, float *y) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, E = hp->n_expert, k = hp->n_expert_used, H = hp->n_embd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *logits = qw_arena_f32(f->ar, (size_t)T * E);
    int32_t *sel = qw_arena_alloc(f->ar, (size_t)T * k * sizeof(int32_t));
    float *wt = qw_arena_f32(f->ar, (size_t)T * k);
    be->matmul(be, logits, w->router, x, T);
    void *work = qw_arena_alloc(f->ar, be->moe_work(be, T, k, E, H, hp->n_ff_exp, hp->n_ff_shexp));
    /* the routing inside the experts' op (a backend may do it in the kernel that gathers their inputs) */
    be->moe_ffn(be, y, x, sel, wt, logits, hp->norm_topk_prob, T, k, w->experts, E, &w->shared, w->shared_gate, work);
    qw_arena_restore(f->ar, mk);
}
