/*
 * moe.c - mlp: the SwiGLU feed-forward and the sparse mixture of experts with a shared expert
 * (Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock / Qwen4Exp; spec qwen4_exp.md 3.6).
 *
 *   p = softmax(W_router x) over all experts (f32); top-k of p (ties: lower expert id first);
 *   renormalise the k weights when norm_topk_prob; routed = sum_j p_j * expert_j(x);
 *   shared = sigma(w_sg . x) * shared_expert(x); y = routed + shared.
 *
 * Tokens are grouped by expert so each expert's weights are read once per call.
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

void qw_ffn_forward(const qw_fwd *f, const qw_ffn_w *w, const float *x, float *y, int n) {
    const qw_ops *ops = f->ops;
    int64_t I = w->gate.shape[0];
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *g = qw_arena_f32(f->ar, (size_t)n * I), *u = qw_arena_f32(f->ar, (size_t)n * I);
    ops->matmul(ops, g, &w->gate, x, n);
    ops->matmul(ops, u, &w->up, x, n);
    ops->silu(ops, g, (int64_t)n * I);
    ops->mul(ops, g, g, u, (int64_t)n * I);
    ops->matmul(ops, y, &w->down, g, n);
    qw_arena_restore(f->ar, mk);
}

void qw_moe_forward(const qw_fwd *f, const qw_moe_w *w, const float *x, float *y) {
    const qw_hparams *hp = f->hp;
    const qw_ops *ops = f->ops;
    int T = f->n_tok, E = hp->n_expert, k = hp->n_expert_used, H = hp->n_embd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    float *logits = qw_arena_f32(f->ar, (size_t)T * E);
    ops->matmul(ops, logits, w->router, x, T);
    int *sel = qw_arena_alloc(f->ar, (size_t)T * k * sizeof(int));
    float *wt = qw_arena_f32(f->ar, (size_t)T * k);
    for (int t = 0; t < T; t++) {
        float *p = logits + (int64_t)t * E;
        float mx = p[0];
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
        for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        qw_topk(p, E, k, sel + t * k);
        double ws = 0;
        for (int j = 0; j < k; j++) ws += wt[t * k + j] = p[sel[t * k + j]];
        if (hp->norm_topk_prob)
            for (int j = 0; j < k; j++) wt[t * k + j] = (float)(wt[t * k + j] / ws);
    }

    /* shared expert first: y = sigma(w_sg . x) * shared(x) */
    qw_ffn_forward(f, &w->shared, x, y, T);
    float *sg = qw_arena_f32(f->ar, (size_t)T);
    ops->matmul(ops, sg, w->shared_gate, x, T);
    ops->sigmoid(ops, sg, T);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) y[(int64_t)t * H + i] *= sg[t];

    /* routed experts, tokens grouped per expert */
    int *rows = qw_arena_alloc(f->ar, (size_t)T * sizeof(int));
    float *rw = qw_arena_f32(f->ar, (size_t)T);
    float *xin = qw_arena_f32(f->ar, (size_t)T * H), *out = qw_arena_f32(f->ar, (size_t)T * H);
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (sel[t * k + j] == e) {
                    rows[n] = t;
                    rw[n++] = wt[t * k + j];
                }
        if (!n) continue;
        for (int i = 0; i < n; i++) memcpy(xin + (int64_t)i * H, x + (int64_t)rows[i] * H, (size_t)H * sizeof(float));
        qw_ffn_forward(f, &w->experts[e], xin, out, n);
        for (int i = 0; i < n; i++) ops->axpy(ops, y + (int64_t)rows[i] * H, out + (int64_t)i * H, rw[i], H);
    }
    qw_arena_restore(f->ar, mk);
}
