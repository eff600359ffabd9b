/*
 * hc.c - hyper-connections: C residual streams joined around each block (spec qwen4_exp.md 3.2).
 *
 *   xn = grouped zero-centred RMSNorm(X; hc_norm)          (each H-wide stream normalised on its own)
 *   m  = sigma(W_up silu(W_down xn / C))                   [C*H] mixing weights
 *   a  = (1/C) sum_s m[s] * xn[s]                          block input, built from the NORMALISED streams
 *   inj = 2 sigma(W_inject xn / C)                         [C] per-stream weight of the block output
 * and after the block X[s] += inj[s] * y on the UN-normalised streams. The final mixer has no inject.
 */
#include "blocks/blocks.h"

/* the read from the normalised streams xn [n_tok][C*H] on */
static void hc_read_from(const qw_fwd *f, const qw_hc_w *w, const float *xn, float *a, float *inj) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, C = hp->hc_count, H = hp->n_embd, r = hp->hc_lowrank;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *u = qw_arena_f32(f->ar, (size_t)T * r), *m = qw_arena_f32(f->ar, (size_t)T * C * H);
    qw_matmul_job proj[2] = {{u, w->down, xn, T}, {inj, w->inject, xn, T}}; /* both read xn: one batch */
    be->matmul_batch(be, proj, inj ? 2 : 1);
    /* m = W_up silu(u / C), then the gates sigma(m) on the normalised streams, summed */
    be->hc_read(be, a, m, u, w->up, xn, inj, T, C, H);
    qw_arena_restore(f->ar, mk);
}

void qw_hc_forward(const qw_fwd *f, const qw_hc_w *w, const float *X, float *a, float *inj) {
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, C = hp->hc_count, H = hp->n_embd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *xn = qw_arena_f32(f->ar, (size_t)T * C * H);
    f->be->rms_norm_grouped(f->be, xn, X, w->norm, T * C, C, H, hp->norm_eps, 1);
    hc_read_from(f, w, xn, a, inj);
    qw_arena_restore(f->ar, mk);
}

void qw_hc_inject_forward(const qw_fwd *f, const qw_hc_w *w, float *X, const float *y, const float *inj_y, float *a,
                          float *inj) {
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, C = hp->hc_count, H = hp->n_embd;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *xn = qw_arena_f32(f->ar, (size_t)T * C * H);
    f->be->hc_inject(f->be, X, inj_y, y, T, C, H, xn, w->norm, hp->norm_eps); /* and the norm */
    hc_read_from(f, w, xn, a, inj);
    qw_arena_restore(f->ar, mk);
}

void qw_hc_inject(const qw_fwd *f, float *X, const float *inj, const float *y) {
    f->be->hc_inject(f->be, X, inj, y, f->n_tok, f->hp->hc_count, f->hp->n_embd, NULL, NULL, 0.0f);
}
