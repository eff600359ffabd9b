/*
 * composite.c - the composite ops of composite.h: routing, QSA block selection, hyper-connection and PLE
 * steps, gathers and copies, for backends whose memory is the host's. Where a step is a primitive op (a
 * norm, RoPE, an element-wise function, a matmul) it is that op of the backend given, so a backend's
 * composites round as its primitives do; the rest are the plain loops of the reference, in the order of
 * floating-point operations the op's definition (ops.h) fixes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/mapfile.h"
#include "kernels/composite.h"
#include "kernels/ple_hash.h"

/* ---------------------------------------------------------------- host memory */

void *qw_host_alloc(const qw_backend *be, size_t bytes, qw_mem_kind kind) {
    (void)be, (void)kind;
    void *p = qw_aligned_alloc(64, bytes ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

void qw_host_free(const qw_backend *be, void *p) {
    (void)be;
    free(p);
}

void qw_host_copy(const qw_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

void qw_host_zero(const qw_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}

void qw_host_sync(const qw_backend *be) { (void)be; }

/* ---------------------------------------------------------------- gathers and copies */

void qw_op_store_rows(const qw_backend *be, float *cache, const float *src, int n_tok, int64_t width,
                      const qw_step *step) {
    (void)be;
    memcpy(cache + (int64_t)step->pos0 * width, src, (size_t)n_tok * (size_t)width * sizeof(float));
}

void qw_op_copy_strided(const qw_backend *be, float *dst, const float *src, const qw_copy_layout *l) {
    (void)be;
    for (int64_t i3 = 0; i3 < l->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < l->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < l->ne[1]; i1++) {
                float *d = dst + i1 * l->d[1] + i2 * l->d[2] + i3 * l->d[3];
                const float *s = src + i1 * l->s[1] + i2 * l->s[2] + i3 * l->s[3];
                if (l->d[0] == 1 && l->s[0] == 1) {
                    memcpy(d, s, (size_t)l->ne[0] * sizeof(float));
                } else {
                    for (int64_t i0 = 0; i0 < l->ne[0]; i0++) d[i0 * l->d[0]] = s[i0 * l->s[0]];
                }
            }
}

/* ---------------------------------------------------------------- norms, element-wise, positions */

void qw_op_rms_norm_grouped(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int n_group,
                            int dim, float eps, int zc) {
    for (int r = 0; r < n_rows; r++) {
        int64_t o = (int64_t)r * dim;
        be->rms_norm(be, y + o, x + o, w + (int64_t)(r % n_group) * dim, 1, dim, eps, zc);
    }
}

void qw_op_divide(const qw_backend *be, float *x, float d, int64_t n, int then_silu) {
    for (int64_t i = 0; i < n; i++) x[i] /= d;
    if (then_silu) be->silu(be, x, n);
}

void qw_op_act_mul(const qw_backend *be, float *y, float *a, const float *b, int64_t n, int act) {
    if (act == QW_ACT_SILU) be->silu(be, a, n);
    else be->sigmoid(be, a, n);
    be->mul(be, y, a, b, n);
}

void qw_op_rms_norm_gate(const qw_backend *be, float *y, const float *x, const float *w, float *z, int n_rows, int dim,
                         float eps, int act) {
    be->rms_norm(be, y, x, w, n_rows, dim, eps, 0);
    be->act_mul(be, y, z, y, (int64_t)n_rows * dim, act);
}

void qw_rope_cs(const float *inv_freq, int n_rot, int pos0, int n_tok, float *cs) {
    int half = n_rot / 2;
    for (int t = 0; t < n_tok; t++) {
        float *c = cs + (int64_t)t * n_rot, *s = c + half;
        float p = (float)(pos0 + t);
        for (int k = 0; k < half; k++) {
            float ang = p * inv_freq[k];
            c[k] = cosf(ang);
            s[k] = sinf(ang);
        }
    }
}

void qw_op_rope_table(const qw_backend *be, float *cs, const float *inv_freq, int n_rot, int n_tok,
                      const qw_step *step) {
    (void)be;
    qw_rope_cs(inv_freq, n_rot, step->pos0, n_tok, cs);
}

/* ---------------------------------------------------------------- QSA */

/* a ranks below b: lower score, or the same score and a higher index */
static int worse(const float *score, int a, int b) { return score[a] < score[b] || (score[a] == score[b] && a > b); }

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

void qw_op_qsa_keys(const qw_backend *be, float *raw, float *blk, const float *key_rows, int64_t key_stride, int n_tok,
                    int ihd, int R, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                    const qw_step *step) {
    int pos0 = step->pos0;
    for (int t = 0; t < n_tok; t++)
        memcpy(raw + (int64_t)(pos0 + t) * ihd, key_rows + t * key_stride, (size_t)ihd * sizeof(float));
    float cs[2 * 512];
    QW_ASSERT(n_rot <= 1024);
    for (int b = pos0 / R; b < (pos0 + n_tok) / R; b++) { /* the blocks these tokens complete */
        float *kb = blk + (int64_t)b * ihd;
        for (int d = 0; d < ihd; d++) {
            float sum = 0;
            for (int r = 0; r < R; r++) sum += raw[(int64_t)(b * R + r) * ihd + d];
            kb[d] = sum / (float)R;
        }
        be->rms_norm(be, kb, kb, k_norm, 1, ihd, eps, 1);
        qw_rope_cs(inv_freq, n_rot, b * R, 1, cs);
        be->rope(be, kb, 1, ihd, 1, ihd, n_rot, cs);
    }
}

size_t qw_op_qsa_select_work(const qw_backend *be, int n_ctx, int R, int topk) {
    (void)be;
    size_t blocks = (size_t)n_ctx / (size_t)R + 1;
    return blocks * sizeof(float) + (blocks > (size_t)topk ? blocks : (size_t)topk + 1) * sizeof(int);
}

void qw_op_qsa_select(const qw_backend *be, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                      const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                      const qw_step *step) {
    (void)be;
    int pos0 = step->pos0, blk_now = (pos0 + n_tok) / R;
    float *score = work;
    int *chosen = (int *)(score + blk_now + 1);
    float inv_sqrt = 1.0f / sqrtf((float)ihd);
    int64_t n = 0;
    for (int t = 0; t < n_tok; t++) {
        int i = pos0 + t, n_b = (i + 1) / R;
        sel_off[t] = (int32_t)n;
        if (n_b > topk) /* more blocks than the budget: score them (else all are kept) */
            for (int b = 0; b < n_b; b++) {
                const float *kb = blk + (int64_t)b * ihd;
                float s = 0;
                for (int h = 0; h < n_head; h++) {
                    const float *qh = q + t * q_stride + (int64_t)h * ihd;
                    double dot = 0;
                    for (int d = 0; d < ihd; d++) dot += (double)qh[d] * kb[d];
                    if (dot > 0) s += (float)dot;
                }
                score[b] = s * inv_sqrt;
            }
        n += qw_qsa_positions(score, n_b, topk, R, i, chosen, sel + n);
    }
    sel_off[n_tok] = (int32_t)n;
}

/* ---------------------------------------------------------------- Gated DeltaNet */

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void qw_op_gdn_gate(const qw_backend *be, float *a, float *beta, const float *neg_exp_a, const float *dt_bias,
                    int n_tok, int hv) {
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < hv; j++) {
            int64_t i = (int64_t)t * hv + j;
            a[i] = neg_exp_a[j] * softplus(a[i] + dt_bias[j]);
        }
    if (beta) be->sigmoid(be, beta, (int64_t)n_tok * hv);
}

/* ---------------------------------------------------------------- convolution over a history */

void qw_op_conv1d_state(const qw_backend *be, float *y, const float *x, float *hist, float *seq, const float *w,
                        int n_tok, int ch, int k, int dil, int then_silu, int keep_seq) {
    (void)keep_seq; /* seq is written either way */
    const int64_t nh = (int64_t)(k - 1) * dil * ch;
    if (seq != hist) be->copy(be, seq, hist, (size_t)nh * sizeof(float));
    if (seq + nh != x) be->copy(be, seq + nh, x, (size_t)n_tok * ch * sizeof(float));
    be->conv1d_dw(be, y, seq, w, n_tok, ch, k, dil, then_silu);
    be->copy(be, hist, seq + (int64_t)n_tok * ch, (size_t)nh * sizeof(float));
}

/* ---------------------------------------------------------------- mixture of experts */

void qw_op_moe_route(const qw_backend *be, int32_t *sel, float *wt, float *logits, int n_tok, int E, int k,
                     int norm_topk) {
    (void)be;
    for (int t = 0; t < n_tok; t++) {
        int *idx = (int *)sel + (int64_t)t * k; /* int32_t is int on every target */
        float *p = logits + (int64_t)t * E;
        float mx = p[0];
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
        for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        qw_topk(p, E, k, idx);
        double ws = 0;
        for (int j = 0; j < k; j++) ws += wt[t * k + j] = p[idx[j]];
        if (norm_topk)
            for (int j = 0; j < k; j++) wt[t * k + j] = (float)(wt[t * k + j] / ws);
    }
}

/* The layout of moe_ffn's work: R = n_tok * k routed rows, at most min(E, R) experts used. */
typedef struct {
    size_t rows, rw, ex, off, xin, out, g, u, sgt, sup, sg, jobs, total;
} moe_layout;

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

static moe_layout moe_layout_of(int n_tok, int k, int E, int H, int I, int Is) {
    size_t T = (size_t)n_tok, R = T * (size_t)k, slots = QW_MIN((size_t)E, R), o = 0;
    moe_layout l;
#define PART(f, bytes) (l.f = o, o += up64(bytes))
    PART(rows, R * sizeof(int));
    PART(rw, R * sizeof(float));
    PART(ex, (slots + 1) * sizeof(int));
    PART(off, (slots + 2) * sizeof(int64_t));
    PART(xin, R * (size_t)H * sizeof(float));
    PART(out, R * (size_t)H * sizeof(float));
    PART(g, R * (size_t)I * sizeof(float));
    PART(u, R * (size_t)I * sizeof(float));
    PART(sgt, T * (size_t)Is * sizeof(float));
    PART(sup, T * (size_t)Is * sizeof(float));
    PART(sg, T * sizeof(float));
    PART(jobs, (2 * slots + 3) * sizeof(qw_matmul_job));
#undef PART
    l.total = o;
    return l;
}

size_t qw_op_moe_work(const qw_backend *be, int n_tok, int k, int n_expert, int H, int I, int I_shared) {
    (void)be;
    return moe_layout_of(n_tok, k, n_expert, H, I, I_shared).total;
}

/*
 * Tokens are grouped by expert so each expert's weights are read once per call, and the projections of all
 * experts of a call run as one batch (matmul_batch) so that small experts share one parallel region.
 */
void qw_op_moe_ffn(const qw_backend *be, float *y, const float *x, int32_t *sel, float *wt, float *logits,
                   int norm_topk, int T, int k, const qw_ffn_w *experts, int E, const qw_ffn_w *shared,
                   const qw_tensor *shared_gate, void *work) {
    if (logits) be->moe_route(be, sel, wt, logits, T, E, k, norm_topk);
    int64_t H = experts[0].down.shape[0], I = experts[0].gate.shape[0], Is = shared ? shared->gate.shape[0] : 0;
    moe_layout l = moe_layout_of(T, k, E, (int)H, (int)I, (int)Is);
    char *w = work;
    int *rows = (int *)(w + l.rows), *ex = (int *)(w + l.ex);
    float *rw = (float *)(w + l.rw);
    int64_t *off = (int64_t *)(w + l.off);
    float *xin = (float *)(w + l.xin), *out = (float *)(w + l.out), *g = (float *)(w + l.g), *u = (float *)(w + l.u);
    float *sgt = (float *)(w + l.sgt), *sup = (float *)(w + l.sup), *sg = (float *)(w + l.sg);
    qw_matmul_job *jobs = (qw_matmul_job *)(w + l.jobs);

    /* slot s holds expert ex[s]'s token rows from row off[s] of the gathered buffers */
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
    for (int64_t i = 0; i < n_rows; i++) memcpy(xin + i * H, x + (int64_t)rows[i] * H, (size_t)H * sizeof(float));

    /* every gate and up projection of the step in one batch: routed experts, shared expert, shared gate */
    int nj = 0;
    for (int s = 0; s < n_slot; s++) {
        int n = (int)(off[s + 1] - off[s]);
        jobs[nj++] = (qw_matmul_job){g + off[s] * I, &experts[ex[s]].gate, xin + off[s] * H, n};
        jobs[nj++] = (qw_matmul_job){u + off[s] * I, &experts[ex[s]].up, xin + off[s] * H, n};
    }
    if (shared) {
        jobs[nj++] = (qw_matmul_job){sgt, &shared->gate, x, T};
        jobs[nj++] = (qw_matmul_job){sup, &shared->up, x, T};
        if (shared_gate) jobs[nj++] = (qw_matmul_job){sg, shared_gate, x, T};
    }
    be->matmul_batch(be, jobs, nj);
    be->act_mul(be, g, g, u, n_rows * I, QW_ACT_SILU);
    if (shared) {
        be->act_mul(be, sgt, sgt, sup, (int64_t)T * Is, QW_ACT_SILU);
        if (shared_gate) be->sigmoid(be, sg, T);
    }

    /* every down projection in one batch */
    nj = 0;
    for (int s = 0; s < n_slot; s++)
        jobs[nj++] = (qw_matmul_job){out + off[s] * H, &experts[ex[s]].down, g + off[s] * I, (int)(off[s + 1] - off[s])};
    if (shared) jobs[nj++] = (qw_matmul_job){y, &shared->down, sgt, T};
    be->matmul_batch(be, jobs, nj);

    /* y = sigma(w_sg . x) * shared(x) + the weighted routed outputs, expert by expert */
    if (!shared) memset(y, 0, (size_t)T * (size_t)H * sizeof(float));
    else if (shared_gate)
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < H; i++) y[(int64_t)t * H + i] *= sg[t];
    for (int64_t i = 0; i < n_rows; i++) be->axpy(be, y + (int64_t)rows[i] * H, out + i * H, rw[i], H);
}

/* ---------------------------------------------------------------- hyper-connections */

void qw_op_hc_read(const qw_backend *be, float *a, float *m, float *u, const qw_tensor *up, const float *xn, float *inj,
                   int n_tok, int C, int H) {
    int64_t CH = (int64_t)C * H;
    if (up) {
        be->divide(be, u, (float)C, (int64_t)n_tok * up->shape[1], 1); /* then silu */
        be->matmul(be, m, up, u, n_tok);
    }
    if (xn) be->act_mul(be, m, m, xn, (int64_t)n_tok * CH, QW_ACT_SIGMOID);
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < H; i++) {
            float s = 0;
            for (int c = 0; c < C; c++) s += m[t * CH + (int64_t)c * H + i];
            a[(int64_t)t * H + i] = s / (float)C;
        }
    if (inj) {
        int64_t n = (int64_t)n_tok * C;
        for (int64_t i = 0; i < n; i++) inj[i] /= (float)C;
        be->sigmoid(be, inj, n);
        for (int64_t i = 0; i < n; i++) inj[i] *= 2.0f;
    }
}

void qw_op_hc_inject(const qw_backend *be, float *X, const float *inj, const float *y, int n_tok, int C, int H,
                     float *xn, const float *norm_w, float eps) {
    for (int t = 0; t < n_tok; t++)
        for (int c = 0; c < C; c++) be->axpy(be, X + ((int64_t)t * C + c) * H, y + (int64_t)t * H, inj[t * C + c], H);
    if (xn) be->rms_norm_grouped(be, xn, X, norm_w, n_tok * C, C, H, eps, 1);
}

/* ---------------------------------------------------------------- PLE */

void qw_ple_hash(int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok, int n, int nh, int32_t eos,
                 const uint64_t *mult, const int64_t *prime, const int64_t *offset) {
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) rows[(int64_t)t * nh + h] = qw_ple_row(tokens, hist, t, h, n, nh, eos, mult, prime, offset);
}

void qw_op_ple_rows(const qw_backend *be, int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok,
                    int ngram_n, int n_heads, int32_t eos, const uint64_t *mult, const int64_t *prime,
                    const int64_t *offset) {
    (void)be;
    qw_ple_hash(rows, tokens, hist, n_tok, ngram_n, n_heads, eos, mult, prime, offset);
}

void qw_op_topk(const qw_backend *be, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k,
                void *work) {
    (void)be, (void)work;
    for (int r = 0; r < n_rows; r++) {
        const float *row = x + (int64_t)r * n;
        int32_t *id = ids + (int64_t)r * k;
        float *v = vals + (int64_t)r * k;
        int m = 0; /* the best m so far, in order: each value goes in by insertion when it beats the last */
        for (int64_t i = 0; i < n; i++) {
            if (m == k && !qw_topk_better(row[i], i, v[k - 1], id[k - 1])) continue;
            int j = m < k ? m++ : k - 1;
            while (j > 0 && qw_topk_better(row[i], i, v[j - 1], id[j - 1])) {
                v[j] = v[j - 1];
                id[j] = id[j - 1];
                j--;
            }
            v[j] = row[i];
            id[j] = (int32_t)i;
        }
    }
}

void qw_op_argmax(const qw_backend *be, int32_t *out, const float *x, int n_rows, int64_t n) {
    (void)be;
    for (int r = 0; r < n_rows; r++) {
        const float *row = x + (int64_t)r * n;
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++)
            if (row[i] > row[best]) best = i;
        out[r] = (int32_t)best;
    }
}

void qw_op_ple_hist_push(const qw_backend *be, int32_t *hist, const int32_t *tokens, int n_tok, int ngram_n) {
    (void)be;
    int keep = ngram_n - 1, n = 0;
    int32_t all[16];
    QW_ASSERT(keep <= 8);
    for (int i = 0; i < keep; i++) all[n++] = hist[i];
    for (int i = QW_MAX(0, n_tok - keep); i < n_tok; i++) all[n++] = tokens[i];
    memcpy(hist, all + n - keep, (size_t)keep * sizeof(int32_t));
}

/* The piece of the table that holds row r, and the row's index in it */
static const qw_tensor *table_row(const qw_tensor *chunks, int n_chunks, int64_t chunk_rows, int64_t r, int64_t *local) {
    int64_t c = r / chunk_rows;
    if (c >= n_chunks) c = n_chunks - 1;
    *local = r - c * chunk_rows;
    QW_ASSERT(*local >= 0 && *local < chunks[c].shape[0]);
    return &chunks[c];
}

void qw_op_ple_gather(const qw_backend *be, float *e, const int64_t *rows, int64_t n, const qw_tensor *chunks,
                      int n_chunks, int64_t chunk_rows, int prefetch) {
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        int64_t local;
        const qw_tensor *chunk = table_row(chunks, n_chunks, chunk_rows, rows[i], &local);
        int64_t dh = chunk->shape[1];
        if (prefetch) {
            size_t rb = qw_type_row_size(chunk->type, dh);
            qw_advise_willneed((const char *)chunk->data + (size_t)local * rb, rb);
        } else {
            qw_tensor_to_f32(chunk, local * dh, dh, e + i * dh);
        }
    }
}

void qw_op_ple_gate(const qw_backend *be, float *G, const float *K, const float *Q, const float *V, int n_tok, int C,
                    int H) {
    (void)be;
    int64_t CH = (int64_t)C * H;
    float inv_sqrt_h = 1.0f / sqrtf((float)H);
    for (int t = 0; t < n_tok; t++)
        for (int s = 0; s < C; s++) {
            const float *k = K + t * CH + (int64_t)s * H, *q = Q + t * CH + (int64_t)s * H;
            double dot = 0;
            for (int i = 0; i < H; i++) dot += (double)k[i] * q[i];
            float sg = (float)dot * inv_sqrt_h;
            float mag = sqrtf(fmaxf(fabsf(sg), 1e-6f));
            float g = sg > 0 ? mag : sg < 0 ? -mag : 0.0f;
            float gate = 1.0f / (1.0f + expf(-g));
            float *dst = G + t * CH + (int64_t)s * H;
            for (int i = 0; i < H; i++) dst[i] = gate * V[(int64_t)t * H + i];
        }
}
