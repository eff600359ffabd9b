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
 * the block completes (the same ops in the same order as recomputing it, so the result is identical).
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

/* a ranks below b: lower score, or the same score and a higher index */
static int worse(const float *score, int a, int b) {
    return score[a] < score[b] || (score[a] == score[b] && a > b);
}

static void sift_down(const float *score, int *heap, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(score, heap[l], heap[m])) m = l;
        if (r < n && worse(score, heap[r], heap[m])) m = r;
        if (m == i) return;
        int tmp = heap[i];
        heap[i] = heap[m];
        heap[m] = tmp;
        i = m;
    }
}

void qw_topk(const float *score, int n, int k, int *idx) {
    /* a heap of the k best so far whose root is the worst of them: O(n log k) */
    if (k <= 0) return;
    QW_ASSERT(k <= n);
    for (int i = 0; i < k; i++) idx[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(score, idx, k, i);
    for (int b = k; b < n; b++)
        if (worse(score, idx[0], b)) {
            idx[0] = b;
            sift_down(score, idx, k, 0);
        }
    /* order the result best first (heap sort of the k entries) */
    for (int end = k - 1; end > 0; end--) {
        int tmp = idx[0];
        idx[0] = idx[end];
        idx[end] = tmp;
        sift_down(score, idx, end, 0);
    }
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int qw_qsa_positions(const float *score, int n_b, int topk, int R, int i, int *chosen, int32_t *sel) {
    int k = n_b < topk ? n_b : topk, n = 0;
    if (k == n_b) {
        for (int b = 0; b < n_b; b++) chosen[b] = b;
    } else {
        qw_topk(score, n_b, k, chosen);
        qsort(chosen, (size_t)k, sizeof(int), cmp_int);
    }
    for (int j = 0; j < k; j++)
        for (int r = 0; r < R; r++) sel[n++] = chosen[j] * R + r;
    for (int p = n_b * R; p <= i; p++) sel[n++] = p; /* the tail is always attended */
    return n;
}

void qw_qsa_select(const qw_fwd *f, int il, const qw_attn_w *w, const float *x, int32_t **sel_out,
                   int32_t **sel_off_out) {
    const qw_hparams *hp = f->hp;
    const qw_ops *ops = f->ops;
    qw_layer_state *ls = &f->s->ls[il];
    int T = f->n_tok, ni = hp->idx_n_head, ihd = hp->idx_head_dim, R = hp->idx_ratio;
    int topk = hp->idx_budget / R, n_rot = hp->n_rot;
    int64_t width = (int64_t)(ni + 1) * ihd;

    /* indexer projections: queries normed + RoPE'd, raw key into the cache */
    float *iqk = qw_arena_f32(f->ar, (size_t)T * width);
    ops->matmul(ops, iqk, w->idx_qk, x, T);
    for (int t = 0; t < T; t++)
        memcpy(ls->idx_raw + (int64_t)(f->pos0 + t) * ihd, iqk + t * width + (int64_t)ni * ihd,
               (size_t)ihd * sizeof(float));
    for (int t = 0; t < T; t++) ops->rms_norm(ops, iqk + t * width, iqk + t * width, w->idx_q_norm, ni, ihd, hp->norm_eps, 1);
    ops->rope(ops, iqk, T, (int)width, ni, ihd, n_rot, f->rope_cs);

    /* pooled keys of the blocks completed by these tokens */
    int blk_done = f->pos0 / R, blk_now = (f->pos0 + T) / R;
    float cs[2 * 512];
    QW_ASSERT(n_rot <= 1024);
    for (int b = blk_done; b < blk_now; b++) {
        float *kb = ls->idx_blk + (int64_t)b * ihd;
        for (int d = 0; d < ihd; d++) {
            float sum = 0;
            for (int r = 0; r < R; r++) sum += ls->idx_raw[(int64_t)(b * R + r) * ihd + d];
            kb[d] = sum / (float)R;
        }
        ops->rms_norm(ops, kb, kb, w->idx_k_norm, 1, ihd, hp->norm_eps, 1);
        qw_rope_cs(f->m->rope_inv_freq, n_rot, b * R, 1, cs);
        ops->rope(ops, kb, 1, ihd, 1, ihd, n_rot, cs);
    }

    /* per query: score the complete blocks, keep the top ones and the tail: at most min(i + 1, topk * R + R - 1)
     * positions for query i (qw_qsa_positions), so the selection does not grow with the context */
    int64_t cap = 0;
    for (int t = 0; t < T; t++) cap += QW_MIN((int64_t)f->pos0 + t + 1, (int64_t)(topk + 1) * R);
    int32_t *sel = qw_arena_alloc(f->ar, (size_t)cap * sizeof(int32_t));
    int32_t *off = qw_arena_alloc(f->ar, (size_t)(T + 1) * sizeof(int32_t));
    float *score = qw_arena_f32(f->ar, (size_t)(blk_now ? blk_now : 1));
    int *chosen = qw_arena_alloc(f->ar, (size_t)(blk_now > topk ? blk_now : topk + 1) * sizeof(int));
    float inv_sqrt = 1.0f / sqrtf((float)ihd);
    int64_t n = 0;
    for (int t = 0; t < T; t++) {
        int i = f->pos0 + t, n_b = (i + 1) / R;
        off[t] = (int32_t)n;
        if (n_b > topk) /* more blocks than the budget: score them (else all are kept) */
            for (int b = 0; b < n_b; b++) {
                const float *kb = ls->idx_blk + (int64_t)b * ihd;
                float s = 0;
                for (int h = 0; h < ni; h++) {
                    const float *qh = iqk + t * width + (int64_t)h * ihd;
                    double dot = 0;
                    for (int d = 0; d < ihd; d++) dot += (double)qh[d] * kb[d];
                    if (dot > 0) s += (float)dot;
                }
                score[b] = s * inv_sqrt;
            }
        n += qw_qsa_positions(score, n_b, topk, R, i, chosen, sel + n);
    }
    off[T] = (int32_t)n;
    *sel_out = sel;
    *sel_off_out = off;
}
