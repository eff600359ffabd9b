/*
 * hc.c - hyper-connections: C residual streams joined around each block (spec qwen4_exp.md 3.2).
 *
 *   xn = grouped zero-centred RMSNorm(X; hc_norm)          (each H-wide stream normalised on its own)
 *   m  = sigma(W_up silu(W_down xn / C))                   [C*H] mixing weights
 *   a  = (1/C) sum_s m[s] * xn[s]                          block input, built from the NORMALISED streams
 *   inj = 2 sigma(W_inject xn / C)                         [C] per-stream weight of the block output
 * and after the block X[s] += inj[s] * y on the UN-normalised streams. The final mixer has no inject.
 */
#include <string.h>

#include "blocks/blocks.h"

void qw_hc_forward(const qw_fwd *f, const qw_hc_w *w, const float *X, float *a, float *inj) {
    const qw_hparams *hp = f->hp;
    const qw_ops *ops = f->ops;
    int T = f->n_tok, C = hp->hc_count, H = hp->n_embd, r = hp->hc_lowrank;
    int64_t CH = (int64_t)C * H;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *xn = qw_arena_f32(f->ar, (size_t)T * CH);
    qw_norm_grouped(ops, xn, X, w->norm, T, C, H, hp->norm_eps, 1);
    float *u = qw_arena_f32(f->ar, (size_t)T * r), *m = qw_arena_f32(f->ar, (size_t)T * CH);
    qw_matmul_job proj[2] = {{u, w->down, xn, T}, {inj, w->inject, xn, T}}; /* both read xn: one batch */
    ops->matmul_batch(ops, proj, inj ? 2 : 1);
    for (int64_t i = 0; i < (int64_t)T * r; i++) u[i] /= (float)C;
    ops->silu(ops, u, (int64_t)T * r);
    ops->matmul(ops, m, w->up, u, T);
    ops->sigmoid(ops, m, (int64_t)T * CH);
    ops->mul(ops, m, m, xn, (int64_t)T * CH);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) {
            float s = 0;
            for (int c = 0; c < C; c++) s += m[t * CH + (int64_t)c * H + i];
            a[(int64_t)t * H + i] = s / (float)C;
        }
    if (inj) {
        for (int64_t i = 0; i < (int64_t)T * C; i++) inj[i] /= (float)C;
        ops->sigmoid(ops, inj, (int64_t)T * C);
        for (int64_t i = 0; i < (int64_t)T * C; i++) inj[i] *= 2.0f;
    }
    qw_arena_restore(f->ar, mk);
}

void qw_hc_inject(const qw_fwd *f, float *X, const float *inj, const float *y) {
    int T = f->n_tok, C = f->hp->hc_count, H = f->hp->n_embd;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            f->ops->axpy(f->ops, X + ((int64_t)t * C + c) * H, y + (int64_t)t * H, inj[t * C + c], H);
}
