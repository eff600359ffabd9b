/*
 * moe.c - mlp: the SwiGLU feed-forward and the sparse mixture of experts with a shared expert
 * (Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock / Qwen4Exp; spec qwen4_exp.md 3.6).
 *
 *   p = softmax(W_router x) over all experts (f32); top-k of p (ties: lower expert id first);
 *   renormalise the k weights when norm_topk_prob; routed = sum_j p_j * expert_j(x);
 *   shared = sigma(w_sg . x) * shared_expert(x); y = routed + shared.
 *
 * Tokens are grouped by expert so each expert's weights are read once per call, and the projections of
 * all experts of a call run as one batch (matmul_batch) so that small experts share one parallel region.
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

void qw_ffn_forward(const qw_fwd *f, const qw_ffn_w *w, const float *x, float *y, int n) {
    const qw_ops *ops = f->ops;
    int64_t I = w->gate.shape[0];
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *g = qw_arena_f32(f->ar, (size_t)n * I), *u = qw_arena_f32(f->ar, (size_t)n * I);
    qw_matmul_job proj[2] = {{g, &w->gate, x, n}, {u, &w->up, x, n}};
    ops->matmul_batch(ops, proj, 2);
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

    /* Gather the tokens of every selected expert: slot s holds expert ex[s]'s n_in[s] token rows from
     * row off[s] of the gathered buffers (at most T*k rows in all). */
    int64_t I = hp->n_ff_exp, Is = hp->n_ff_shexp, R = (int64_t)T * k;
    int *ex = qw_arena_alloc(f->ar, (size_t)(R + 1) * sizeof(int));
    int64_t *off = qw_arena_alloc(f->ar, (size_t)(R + 2) * sizeof(int64_t));
    int *rows = qw_arena_alloc(f->ar, (size_t)R * sizeof(int));
    float *rw = qw_arena_f32(f->ar, (size_t)R);
    int n_slot = 0;
    int64_t n_rows = 0;
    for (int e = 0; e < E; e++) {
        int64_t n0 = n_rows;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (sel[t * k + j] == e) {
                    rows[n_rows] = t;
                    rw[n_rows++] = wt[t * k + j];
                }
        if (n_rows > n0) {
            ex[n_slot] = e;
            off[n_slot++] = n0;
        }
    }
    off[n_slot] = n_rows;
    float *xin = qw_arena_f32(f->ar, (size_t)n_rows * H), *out = qw_arena_f32(f->ar, (size_t)n_rows * H);
    float *g = qw_arena_f32(f->ar, (size_t)n_rows * I), *u = qw_arena_f32(f->ar, (size_t)n_rows * I);
    float *sgt = qw_arena_f32(f->ar, (size_t)T * Is), *sup = qw_arena_f32(f->ar, (size_t)T * Is);
    float *sg = qw_arena_f32(f->ar, (size_t)T);
    for (int64_t i = 0; i < n_rows; i++) memcpy(xin + i * H, x + (int64_t)rows[i] * H, (size_t)H * sizeof(float));

    /* every gate and up projection of the step in one batch: routed experts, shared expert, shared gate */
    qw_matmul_job *jobs = qw_arena_alloc(f->ar, (size_t)(2 * n_slot + 3) * sizeof(qw_matmul_job));
    int nj = 0;
    for (int s = 0; s < n_slot; s++) {
        int n = (int)(off[s + 1] - off[s]);
        jobs[nj++] = (qw_matmul_job){g + off[s] * I, &w->experts[ex[s]].gate, xin + off[s] * H, n};
        jobs[nj++] = (qw_matmul_job){u + off[s] * I, &w->experts[ex[s]].up, xin + off[s] * H, n};
    }
    jobs[nj++] = (qw_matmul_job){sgt, &w->shared.gate, x, T};
    jobs[nj++] = (qw_matmul_job){sup, &w->shared.up, x, T};
    jobs[nj++] = (qw_matmul_job){sg, w->shared_gate, x, T};
    ops->matmul_batch(ops, jobs, nj);
    ops->silu(ops, g, n_rows * I);
    ops->mul(ops, g, g, u, n_rows * I);
    ops->silu(ops, sgt, (int64_t)T * Is);
    ops->mul(ops, sgt, sgt, sup, (int64_t)T * Is);
    ops->sigmoid(ops, sg, T);

    /* every down projection in one batch */
    nj = 0;
    for (int s = 0; s < n_slot; s++)
        jobs[nj++] = (qw_matmul_job){out + off[s] * H, &w->experts[ex[s]].down, g + off[s] * I, (int)(off[s + 1] - off[s])};
    jobs[nj++] = (qw_matmul_job){y, &w->shared.down, sgt, T};
    ops->matmul_batch(ops, jobs, nj);

    /* y = sigma(w_sg . x) * shared(x) + sum of the weighted routed outputs */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) y[(int64_t)t * H + i] *= sg[t];
    for (int64_t i = 0; i < n_rows; i++) ops->axpy(ops, y + (int64_t)rows[i] * H, out + i * H, rw[i], H);
    qw_arena_restore(f->ar, mk);
}
