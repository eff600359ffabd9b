/*
 * qsa.c - Qwen Sparse Attention block selection (spec qwen4_exp.md 3.5).
 *
 * The indexer projects each token to n_idx_head query vectors and one raw key. Keys are pooled per
 * block of R consecutive positions (aligned to position 0): the f32 mean of the R raw keys, then the
 * zero-centred k_layernorm, then RoPE at the block's first position. A query at position i scores each
 * of its floor((i+1)/R) complete blocks by sum_h relu(q_h . K_b) / sqrt(ihd), keeps the top budget/R
 * blocks and always the tail (the < R newest positions of the incomplete block).
 *
 * Ties: equal scores are ranked by ascending block index, so the lower block wins (transformers'
 * torch.topk leaves the order of ties unspecified; exact ties happen when blocks score exactly 0).
 *
 * Cache: the raw key of every position, and the pooled key of every complete block, computed once when
 * the block completes (the same ops in the same order as recomputing it, so the result is identical). The
 * keys, the scores and the selection are ops of the backend (qsa_keys, qsa_select). A query with no more complete
 * blocks than topk keeps every position it sees: a prompt step's leading queries that do (qw_fwd.qsa_dense)
 * attend densely over the same keys, and a step whose queries all do skips the selection.
 */
#include "blocks/blocks.h"

int64_t qw_qsa_width(const qw_hparams *hp) { return (int64_t)(hp->idx_n_head + 1) * hp->idx_head_dim; }

void qw_qsa_queries(const qw_fwd *f, const qw_attn_w *w, float *iqk) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, ni = hp->idx_n_head, ihd = hp->idx_head_dim;
    int64_t width = qw_qsa_width(hp);
    /* the queries normed and RoPE'd in place; the raw key after them is left for qsa_keys. Many tokens where the
     * backend has no rms_norm_rope: the queries copied together, normed in one call and copied back (three ops, not
     * one per token; the same values) */
    if (T == 1 || be->rms_norm_rope) {
        qw_be_rms_norm_rope(be, iqk, w->idx_q_norm, T, (int)width, ni, ihd, hp->norm_eps, 1, hp->n_rot, f->rope_cs);
    } else {
        const int64_t qw = (int64_t)ni * ihd;
        float *q = qw_arena_f32(f->ar, (size_t)T * (size_t)qw);
        const qw_copy_layout in = {{qw, T, 1, 1}, {1, qw, 0, 0}, {1, width, 0, 0}};
        const qw_copy_layout back = {{qw, T, 1, 1}, {1, width, 0, 0}, {1, qw, 0, 0}};
        be->copy_strided(be, q, iqk, &in);
        be->rms_norm(be, q, q, w->idx_q_norm, T * ni, ihd, hp->norm_eps, 1);
        be->copy_strided(be, iqk, q, &back);
        be->rope(be, iqk, T, (int)width, ni, ihd, hp->n_rot, f->rope_cs);
    }
}

void qw_qsa_select(const qw_fwd *f, int il, const qw_attn_w *w, const float *iqk, qw_seg g, int32_t **sel_out,
                   int32_t **sel_off_out) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    qw_layer_state *ls = &g.s->ls[il];
    int ni = hp->idx_n_head, ihd = hp->idx_head_dim, R = hp->idx_ratio, topk = hp->idx_budget / R, T = g.rows;
    int64_t width = (int64_t)(ni + 1) * ihd;
    const float *rows = iqk + (int64_t)g.row0 * width;
    /* the raw keys into the session's cache, the blocks they complete pooled */
    be->qsa_keys(be, ls->idx_raw, ls->idx_blk, rows + (int64_t)ni * ihd, width, T, ihd, R, w->idx_k_norm, hp->norm_eps,
                 f->m->rope_inv_freq, hp->n_rot, g.s->step);
    if (f->qsa_dense >= T) { /* every query keeps all it sees: no selection, dense attention */
        *sel_out = NULL;
        *sel_off_out = NULL;
        return;
    }
    /* per query: the top blocks and the tail */
    int32_t *sel = qw_arena_alloc(f->ar, (size_t)T * (size_t)(topk + 1) * (size_t)R * sizeof(int32_t));
    int32_t *off = qw_arena_alloc(f->ar, (size_t)(T + 1) * sizeof(int32_t));
    void *work = qw_arena_alloc(f->ar, be->qsa_select_work(be, f->n_ctx, R, topk));
    be->qsa_select(be, sel, off, rows, width, ls->idx_blk, T, ni, ihd, R, topk, work, g.s->step);
    *sel_out = sel;
    *sel_off_out = off;
}

void qw_qsa_select_rows(const qw_fwd *f, const qw_attn_w *w, const float *iqk, int row0, int n, const qw_attn_rows *r,
                        int32_t **sel_out, int32_t **sel_off_out, int *sel_stride) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int ni = hp->idx_n_head, ihd = hp->idx_head_dim, R = hp->idx_ratio, topk = hp->idx_budget / R;
    int64_t width = (int64_t)(ni + 1) * ihd;
    const float *rows = iqk + (int64_t)row0 * width;
    int32_t *sel = qw_arena_alloc(f->ar, (size_t)n * (size_t)(topk + 1) * (size_t)R * sizeof(int32_t));
    int32_t *off = qw_arena_alloc(f->ar, (size_t)2 * n * sizeof(int32_t));
    void *work = qw_arena_alloc(f->ar, be->qsa_select_work(be, f->n_ctx, R, topk));
    qw_be_qsa_rows(be, r, sel, off, rows, rows + (int64_t)ni * ihd, width, n, ni, ihd, R, topk, w->idx_k_norm,
                   hp->norm_eps, f->m->rope_inv_freq, hp->n_rot, work);
    *sel_out = sel;
    *sel_off_out = off;
    *sel_stride = (topk + 1) * R;
}
