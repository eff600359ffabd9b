/*
 * gguf_save.c - write a loaded model as the GGUF file llama.cpp's convert_hf_to_gguf.py (+ llama-quantize for
 * the block types) would write: the same architecture, metadata keys, tensor names, transformations and
 * tensor types (gguf_map.h), streamed one tensor at a time.
 *
 * The source is the bound model (model.h), so a checkpoint directory and a .gguf are written the same way.
 * Each output tensor is described by where its rows come from: views stacked along rows (experts, n-gram
 * table shards), an optional row map and column map (the converter's reorderings, applied only where the
 * source is in the Hugging Face layout: qw_gdn_w.v_tiled and qw_attn_w.rope_interleaved say when it is
 * not), or an f32 vector already transformed (norms + 1, -exp(A_log), squeezed convs). Rows are converted
 * to f32, reordered, and quantized by the reference quantizers of tensor/quant.h, on n_threads threads,
 * in batches of bounded size: memory use does not grow with the model.
 *
 * The plan with its tensor types (qw_gguf_plan, model.h) is also what loading with --quant converts into
 * memory (models/load_quant.c), so a model quantized at load holds the bytes this file would hold.
 *
 * The tokenizer of a checkpoint directory is written as llama.cpp's tokenizer.ggml.* keys (text/tok_gguf.h;
 * without a tokenizer.json the file says tokenizer.ggml.model "none"); a .gguf source's tokenizer is copied.
 * Not written: the MTP draft head and the vision tower (qwenc does not bind them).
 *
 * Out of memory: the plan's bookkeeping (tensor list, row and column maps, f32 copies; all owned by the plan)
 * is allocated at some twenty places while it is built; a failure there unwinds with longjmp to
 * qw_gguf_plan_new, which frees the plan and returns QWENC_ERR_NOMEM. Nothing else is live across the jump.
 */
#include <pthread.h>
#include <setjmp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blocks/blocks.h"
#include "core/mapfile.h"
#include "models/gguf_map.h"
#include "tensor/quant.h"
#include "text/tok_gguf.h"

typedef struct {
    char name[64];
    qw_gt role;
    int n_dims;
    int64_t shape[4];     /* PyTorch order; shape[n_dims-1] is the row */
    qw_type type;
    qw_type src_type;     /* float type of the source (for the policy's "keep") */
    qw_tensor *pieces;    /* [n_pieces] views stacked along rows */
    int n_pieces;
    int64_t *piece_row0;  /* [n_pieces + 1] first stacked row of each piece */
    int64_t *row_map;     /* [rows] stacked source row of each output row, NULL: the same row */
    int32_t *col_map;     /* [cols] source column of each output column, NULL: the same column */
    float *vec;           /* [rows * cols] f32 source instead of pieces */
} out_tensor;

typedef struct {
    const qwenc_model *m;
    out_tensor *t;
    int n, cap;
    void **own; /* buffers freed at the end */
    int n_own, cap_own;
    jmp_buf oom;          /* where an allocation failure while planning unwinds to */
    size_t oom_bytes;     /* the allocation that failed */
} plan;

/* The allocation failed: back to qw_gguf_plan_new (see the top of the file). */
static _Noreturn void plan_oom(plan *p, size_t bytes) {
    p->oom_bytes = bytes;
    longjmp(p->oom, 1);
}

static void *plan_alloc(plan *p, size_t bytes) {
    if (p->n_own == p->cap_own) {
        int cap = p->cap_own ? 2 * p->cap_own : 256;
        void **no = qw_realloc(p->own, (size_t)cap, sizeof(void *));
        if (!no) plan_oom(p, (size_t)cap * sizeof(void *));
        p->own = no;
        p->cap_own = cap;
    }
    void *b = qw_calloc(bytes, 1);
    if (!b) plan_oom(p, bytes);
    p->own[p->n_own++] = b;
    return b;
}

static out_tensor *plan_add(plan *p, qw_gt role, int il, int n_dims, const int64_t *shape) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        out_tensor *nt = qw_realloc(p->t, (size_t)cap, sizeof(out_tensor));
        if (!nt) plan_oom(p, (size_t)cap * sizeof(out_tensor));
        p->t = nt;
        p->cap = cap;
    }
    out_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof(*t));
    qw_gt_name(t->name, sizeof(t->name), role, il);
    t->role = role;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->shape[i] = shape[i];
    t->src_type = QW_TYPE_F32;
    return t;
}

static void set_pieces(plan *p, out_tensor *t, const qw_tensor *const *src, int n) {
    t->pieces = plan_alloc(p, (size_t)n * sizeof(qw_tensor));
    t->piece_row0 = plan_alloc(p, (size_t)(n + 1) * sizeof(int64_t));
    t->n_pieces = n;
    for (int i = 0; i < n; i++) {
        t->pieces[i] = *src[i];
        t->piece_row0[i + 1] = t->piece_row0[i] + src[i]->shape[0];
    }
    qw_type st = src[0]->type;
    t->src_type = st == QW_TYPE_F16 || st == QW_TYPE_BF16 ? st : QW_TYPE_F32;
}

/* A matrix [d0, d1] from one view. */
static out_tensor *add_mat(plan *p, qw_gt role, int il, const qw_tensor *w) {
    int64_t s[2] = {w->shape[0], qw_tensor_row_len(w)};
    out_tensor *t = plan_add(p, role, il, 2, s);
    set_pieces(p, t, &w, 1);
    return t;
}

/* A stack of n views of [d0, d1] as one [n, d0, d1] tensor (experts). */
static void add_stack(plan *p, qw_gt role, int il, const qw_tensor *const *w, int n) {
    int64_t s[3] = {n, w[0]->shape[0], qw_tensor_row_len(w[0])};
    set_pieces(p, plan_add(p, role, il, 3, s), w, n);
}

/* An f32 vector [n] (or matrix [d0, d1] when d1 > 0) copied, + add. */
static out_tensor *add_vec(plan *p, qw_gt role, int il, const float *v, int64_t d0, int64_t d1, float add) {
    int64_t s[2] = {d0, d1};
    out_tensor *t = plan_add(p, role, il, d1 > 0 ? 2 : 1, s);
    int64_t n = d0 * (d1 > 0 ? d1 : 1);
    t->vec = plan_alloc(p, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) t->vec[i] = v[i] + add;
    return t;
}

/* ---------------------------------------------------------------- the converter's reorderings */

/* grouped value head of each tiled position */
static int *vhead_src(plan *p, const qw_hparams *hp) {
    int hv = hp->gdn_hv, hk = hp->gdn_hk, r = hv / hk;
    int *src = plan_alloc(p, (size_t)hv * sizeof(int));
    for (int j = 0; j < hv; j++) src[qw_gguf_vhead_tiled(j, hk, r)] = j;
    return src;
}

/* row map of n_pre rows kept then hv heads of d rows reordered */
static int64_t *vhead_rows(plan *p, const qw_hparams *hp, int64_t n_pre, int d) {
    int *vs = vhead_src(p, hp);
    int64_t n = n_pre + (int64_t)hp->gdn_hv * d;
    int64_t *map = plan_alloc(p, (size_t)n * sizeof(int64_t));
    for (int64_t i = 0; i < n_pre; i++) map[i] = i;
    for (int q = 0; q < hp->gdn_hv; q++)
        for (int x = 0; x < d; x++) map[n_pre + (int64_t)q * d + x] = n_pre + (int64_t)vs[q] * d + x;
    return map;
}

/* the same reordering applied to the rows of an f32 [rows][cols] copy */
static void vhead_vec(plan *p, out_tensor *t, const qw_hparams *hp, int64_t n_pre, int d) {
    int64_t cols = t->n_dims == 2 ? t->shape[1] : 1, rows = t->shape[0];
    int64_t *map = vhead_rows(p, hp, n_pre, d);
    float *nv = plan_alloc(p, (size_t)(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) memcpy(nv + r * cols, t->vec + map[r] * cols, (size_t)cols * sizeof(float));
    t->vec = nv;
}

/* llama: rows of each head to interleaved RoPE order */
static int64_t *rope_rows(plan *p, int n_head, int hd) {
    int64_t *map = plan_alloc(p, (size_t)n_head * hd * sizeof(int64_t));
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < hd; i++) map[(int64_t)h * hd + qw_gguf_rope_row(i, hd)] = (int64_t)h * hd + i;
    return map;
}

/* ---------------------------------------------------------------- the plan of each architecture */

static void plan_ffn(plan *p, int il, const qw_ffn_w *w, qw_gt g, qw_gt u, qw_gt d) {
    add_mat(p, g, il, &w->gate);
    add_mat(p, u, il, &w->up);
    add_mat(p, d, il, &w->down);
}

static void plan_moe(plan *p, int il, const qw_moe_w *w) {
    int E = p->m->hp.n_expert;
    const qw_tensor **v = plan_alloc(p, (size_t)E * sizeof(qw_tensor *));
    add_mat(p, QW_GT_FFN_GATE_INP, il, w->router);
    for (int e = 0; e < E; e++) v[e] = &w->experts[e].gate;
    add_stack(p, QW_GT_FFN_GATE_EXPS, il, v, E);
    for (int e = 0; e < E; e++) v[e] = &w->experts[e].up;
    add_stack(p, QW_GT_FFN_UP_EXPS, il, v, E);
    for (int e = 0; e < E; e++) v[e] = &w->experts[e].down;
    add_stack(p, QW_GT_FFN_DOWN_EXPS, il, v, E);
    add_mat(p, QW_GT_FFN_GATE_INP_SHEXP, il, w->shared_gate);
    plan_ffn(p, il, &w->shared, QW_GT_FFN_GATE_SHEXP, QW_GT_FFN_UP_SHEXP, QW_GT_FFN_DOWN_SHEXP);
}

static void plan_attn(plan *p, int il, const qw_attn_w *w) {
    const qw_hparams *hp = &p->m->hp;
    float one = qw_gguf_norm_plus_one(hp->arch) ? 1.0f : 0.0f;
    out_tensor *q = add_mat(p, QW_GT_ATTN_Q, il, w->wq), *k = add_mat(p, QW_GT_ATTN_K, il, w->wk);
    if (hp->arch == QW_ARCH_LLAMA && !w->rope_interleaved) {
        q->row_map = rope_rows(p, hp->n_head, hp->head_dim);
        k->row_map = rope_rows(p, hp->n_head_kv, hp->head_dim);
    }
    add_mat(p, QW_GT_ATTN_V, il, w->wv);
    add_mat(p, QW_GT_ATTN_OUT, il, w->wo);
    if (w->q_norm) add_vec(p, QW_GT_ATTN_Q_NORM, il, w->q_norm, hp->head_dim, 0, one);
    if (w->k_norm) add_vec(p, QW_GT_ATTN_K_NORM, il, w->k_norm, hp->head_dim, 0, one);
    if (w->idx_qk) {
        int64_t ihd = hp->idx_head_dim, nqi = (int64_t)hp->idx_n_head * ihd, H = hp->n_embd;
        qw_tensor *qk = plan_alloc(p, 2 * sizeof(qw_tensor));
        qk[0] = qw_tensor_rows(w->idx_qk, 0, nqi, H);
        qk[1] = qw_tensor_rows(w->idx_qk, nqi, ihd, H);
        if (!w->idx_qk->data) { /* generated rows (synth): the key rows are their own tensor */
            char *nm = plan_alloc(p, strlen(w->idx_qk->name) + 3);
            sprintf(nm, "%s.k", w->idx_qk->name);
            qk[1].data = NULL;
            qk[1].name = nm;
        }
        add_mat(p, QW_GT_INDEXER_Q, il, &qk[0]);
        add_mat(p, QW_GT_INDEXER_K, il, &qk[1]);
        add_vec(p, QW_GT_INDEXER_Q_NORM, il, w->idx_q_norm, ihd, 0, 1.0f);
        add_vec(p, QW_GT_INDEXER_K_NORM, il, w->idx_k_norm, ihd, 0, 1.0f);
    }
}

static void plan_gdn(plan *p, int il, const qw_gdn_w *w) {
    const qw_hparams *hp = &p->m->hp;
    int hk = hp->gdn_hk, hv = hp->gdn_hv, dk = hp->gdn_dk, dv = hp->gdn_dv, r = hv / hk;
    int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv, ch = 2 * kd + vd;
    int tile = qw_gguf_v_tiled(hp) && !w->v_tiled; /* HF order in, tiled order out */
    out_tensor *t;
    if (w->qkvz) {
        /* qwen3next fused, grouped per key head g: [q_g | k_g | v_g (r heads) | z_g (r heads)] */
        int64_t gw = 2 * dk + 2 * (int64_t)r * dv;
        int64_t *mq = plan_alloc(p, (size_t)ch * sizeof(int64_t)), *mz = plan_alloc(p, (size_t)vd * sizeof(int64_t));
        for (int g = 0; g < hk; g++) {
            for (int x = 0; x < dk; x++) {
                mq[(int64_t)g * dk + x] = g * gw + x;
                mq[kd + (int64_t)g * dk + x] = g * gw + dk + x;
            }
            for (int64_t x = 0; x < (int64_t)r * dv; x++) {
                mq[2 * kd + g * r * dv + x] = g * gw + 2 * dk + x;
                mz[g * r * dv + x] = g * gw + 2 * dk + (int64_t)r * dv + x;
            }
        }
        int64_t sq[2] = {ch, hp->n_embd}, sz[2] = {vd, hp->n_embd};
        t = plan_add(p, QW_GT_SSM_QKV, il, 2, sq);
        set_pieces(p, t, &w->qkvz, 1);
        t->row_map = mq;
        t = plan_add(p, QW_GT_SSM_GATE, il, 2, sz);
        set_pieces(p, t, &w->qkvz, 1);
        t->row_map = mz;
    } else {
        t = add_mat(p, QW_GT_SSM_QKV, il, w->qkv);
        if (tile) t->row_map = vhead_rows(p, hp, 2 * kd, dv);
        t = add_mat(p, QW_GT_SSM_GATE, il, w->z);
        if (tile) t->row_map = vhead_rows(p, hp, 0, dv);
    }
    if (hp->arch == QW_ARCH_QWEN3_NEXT) {
        if (w->ba) {
            add_mat(p, QW_GT_SSM_BA, il, w->ba);
        } else {
            /* [b_g (r) | a_g (r)] per key head from the separate b, a */
            const qw_tensor *ba[2] = {w->b, w->a};
            int64_t s[2] = {2 * (int64_t)hv, hp->n_embd};
            t = plan_add(p, QW_GT_SSM_BA, il, 2, s);
            set_pieces(p, t, ba, 2);
            t->row_map = plan_alloc(p, (size_t)(2 * hv) * sizeof(int64_t));
            for (int g = 0; g < hk; g++)
                for (int i = 0; i < r; i++) {
                    t->row_map[g * 2 * r + i] = g * r + i;
                    t->row_map[g * 2 * r + r + i] = hv + g * r + i;
                }
        }
    } else {
        t = add_mat(p, QW_GT_SSM_BETA, il, w->b);
        if (tile) t->row_map = vhead_rows(p, hp, 0, 1);
        t = add_mat(p, QW_GT_SSM_ALPHA, il, w->a);
        if (tile) t->row_map = vhead_rows(p, hp, 0, 1);
    }
    t = add_vec(p, QW_GT_SSM_CONV, il, w->conv, ch, hp->gdn_conv_k, 0);
    if (tile) vhead_vec(p, t, hp, 2 * kd, dv);
    t = add_vec(p, QW_GT_SSM_DT, il, w->dt_bias, hv, 0, 0);
    if (tile) vhead_vec(p, t, hp, 0, 1);
    t = add_vec(p, QW_GT_SSM_A, il, w->neg_exp_a, hv, 0, 0);
    if (tile) vhead_vec(p, t, hp, 0, 1);
    add_vec(p, QW_GT_SSM_NORM, il, w->norm, dv, 0, 0);
    t = add_mat(p, QW_GT_SSM_OUT, il, w->out);
    if (tile) {
        int *vs = vhead_src(p, hp);
        t->col_map = plan_alloc(p, (size_t)vd * sizeof(int32_t));
        for (int q = 0; q < hv; q++)
            for (int x = 0; x < dv; x++) t->col_map[q * dv + x] = vs[q] * dv + x;
    }
}

static void plan_hc(plan *p, int il, const qw_hc_w *w, qw_gt norm, qw_gt down, qw_gt up, qw_gt inject) {
    const qw_hparams *hp = &p->m->hp;
    add_vec(p, norm, il, w->norm, (int64_t)hp->hc_count * hp->n_embd, 0, 1.0f);
    add_mat(p, down, il, w->down);
    add_mat(p, up, il, w->up);
    if (w->inject) add_mat(p, inject, il, w->inject);
}

static void plan_ple(plan *p, int il, const qw_ple_w *w) {
    const qw_hparams *hp = &p->m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd;
    add_mat(p, QW_GT_PLE_KEY, il, w->key_proj);
    add_mat(p, QW_GT_PLE_VALUE, il, w->value_proj);
    add_vec(p, QW_GT_PLE_NORM_KEY, il, w->norm_key, CH, 0, 1.0f);
    add_vec(p, QW_GT_PLE_NORM_QUERY, il, w->norm_query, CH, 0, 1.0f);
    add_vec(p, QW_GT_PLE_NORM_CONV, il, w->norm_conv, CH, 0, 1.0f);
    add_vec(p, QW_GT_PLE_CONV, il, w->conv, CH, hp->ple_conv_k, 0);
}

/* The n-gram table of the li-th PLE layer (the first under llama.cpp's name, the others qwenc's). */
static void plan_ple_table(plan *p, int il, const qw_ple_w *w) {
    const qw_tensor **v = plan_alloc(p, (size_t)w->n_chunks * sizeof(qw_tensor *));
    for (int i = 0; i < w->n_chunks; i++) v[i] = &w->chunks[i];
    int64_t s[2] = {w->n_rows, qw_tensor_row_len(&w->chunks[0])};
    out_tensor *t = plan_add(p, QW_GT_PLE_TABLE, il, 2, s);
    if (w->li > 0) snprintf(t->name, sizeof(t->name), "blk.%d.ple_token_embd.weight", il);
    set_pieces(p, t, v, w->n_chunks);
}

static void plan_model(plan *p) {
    const qwenc_model *m = p->m;
    const qw_hparams *hp = &m->hp;
    float one = qw_gguf_norm_plus_one(hp->arch) ? 1.0f : 0.0f;
    add_mat(p, QW_GT_TOKEN_EMBD, 0, m->tok_embd);
    for (int i = 0; i < hp->n_ple; i++) plan_ple_table(p, hp->ple_layers[i], m->layers[hp->ple_layers[i]].ple);
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        if (hp->arch == QW_ARCH_QWEN4EXP) {
            plan_hc(p, il, &L->hc_attn, QW_GT_HC_ATTN_NORM, QW_GT_HC_ATTN_DOWN, QW_GT_HC_ATTN_UP, QW_GT_HC_ATTN_INJECT);
            plan_hc(p, il, &L->hc_mlp, QW_GT_HC_FFN_NORM, QW_GT_HC_FFN_DOWN, QW_GT_HC_FFN_UP, QW_GT_HC_FFN_INJECT);
            if (L->ple) plan_ple(p, il, L->ple);
        } else {
            add_vec(p, QW_GT_ATTN_NORM, il, L->attn_norm, hp->n_embd, 0, one);
            add_vec(p, hp->arch <= QW_ARCH_QWEN3 ? QW_GT_FFN_NORM : QW_GT_POST_ATTN_NORM, il, L->ffn_norm, hp->n_embd,
                    0, one);
        }
        if (L->kind == QW_LAYER_GDN)
            plan_gdn(p, il, &L->gdn);
        else
            plan_attn(p, il, &L->attn);
        if (L->moe)
            plan_moe(p, il, &L->moe_w);
        else
            plan_ffn(p, il, &L->mlp, QW_GT_FFN_GATE, QW_GT_FFN_UP, QW_GT_FFN_DOWN);
    }
    if (hp->arch == QW_ARCH_QWEN4EXP)
        plan_hc(p, 0, &m->hc_final, QW_GT_HC_HEAD_NORM, QW_GT_HC_HEAD_DOWN, QW_GT_HC_HEAD_UP, QW_GT_COUNT);
    else
        add_vec(p, QW_GT_OUTPUT_NORM, 0, m->out_norm, hp->n_embd, 0, one);
    if (m->output != m->tok_embd) add_mat(p, QW_GT_OUTPUT, 0, m->output);
    if (hp->arch == QW_ARCH_LLAMA) {
        /* llama3 scaling travels as rope_freqs: the divisor of each default frequency */
        qw_hparams plain = *hp;
        plain.rope_type = QW_ROPE_DEFAULT;
        int half = hp->n_rot / 2, scaled = 0;
        float *f = plan_alloc(p, (size_t)half * sizeof(float));
        qw_rope_inv_freq(&plain, f);
        for (int k = 0; k < half; k++) {
            f[k] /= m->rope_inv_freq[k];
            scaled |= f[k] != 1.0f;
        }
        if (scaled && hp->rope_type != QW_ROPE_LINEAR) add_vec(p, QW_GT_ROPE_FREQS, 0, f, half, 0, 0);
    }
}

/* The converter forces these to F32 (conversion/base.py prepare_tensors). */
static int converter_f32(const out_tensor *t) {
    size_t n = strlen(t->name);
    if (t->n_dims <= 1 || (n > 12 && strcmp(t->name + n - 12, "_norm.weight") == 0)) return 1;
    if (n < 7 || strcmp(t->name + n - 7, ".weight") != 0) return 1; /* ssm_a, ssm_dt.bias */
    return t->role == QW_GT_FFN_GATE_INP || t->role == QW_GT_FFN_GATE_INP_SHEXP || t->role == QW_GT_SSM_CONV ||
           t->role == QW_GT_ROPE_FREQS;
}

/* ---------------------------------------------------------------- metadata */

/* A key of the GGUF the model was read from (NULL for a checkpoint directory). */
static const qw_gguf_kv *source_kv(const qwenc_model *m, const char *key) {
    return m->gguf ? qw_gguf_find_kv(m->gguf, key) : NULL;
}

static void put_u32(qw_gguf_writer *w, qw_arch a, const char *suffix, int64_t v) {
    char k[128];
    qw_gguf_writer_set_u32(w, qw_gguf_key(k, sizeof(k), a, suffix), (uint32_t)v);
}

/* A metadata array could not be allocated: the file fails with QWENC_ERR_NOMEM. */
static void meta_oom(qw_gguf_writer *w, const char *keys, size_t bytes) {
    char msg[256];
    qw_err_nomem(msg, sizeof(msg), keys, bytes, 1);
    qw_gguf_writer_fail(w, QWENC_ERR_NOMEM, msg);
}

static void write_metadata(qw_gguf_writer *w, const qwenc_model *m, const qw_gguf_policy *pol) {
    const qw_hparams *hp = &m->hp;
    qw_arch a = hp->arch;
    char k[128];
    /* general.* and tokenizer.* of a GGUF source carry over (llama-quantize copies every key) */
    if (m->gguf) {
        for (int64_t i = 0; i < m->gguf->n_kv; i++) {
            const qw_gguf_kv *kv = &m->gguf->kv[i];
            if ((!strncmp(kv->key, "general.", 8) && strcmp(kv->key, "general.alignment") != 0) ||
                !strncmp(kv->key, "tokenizer.", 10) || !strcmp(kv->key, qw_gguf_key(k, sizeof(k), a, "ple.image_token_id")))
                qw_gguf_writer_set_kv(w, kv);
        }
    } else {
        const char *base = strrchr(m->path, '/');
        char name[256];
        snprintf(name, sizeof(name), "%s", base && base[1] ? base + 1 : m->path);
        size_t n = strlen(name);
        while (n > 1 && name[n - 1] == '/') name[--n] = 0;
        qw_gguf_writer_set_str(w, "general.type", "model");
        qw_gguf_writer_set_str(w, "general.name", name);
    }
    qw_gguf_writer_set_str(w, "general.architecture", qw_gguf_arch_name(a));
    qw_gguf_writer_set_u32(w, "general.quantization_version", 2);
    qw_gguf_writer_set_u32(w, "general.file_type", (uint32_t)pol->ftype);

    put_u32(w, a, "block_count", hp->n_layer);
    put_u32(w, a, "context_length", hp->n_ctx_train);
    put_u32(w, a, "embedding_length", hp->n_embd);
    if (hp->n_ff > 0) put_u32(w, a, "feed_forward_length", hp->n_ff);
    put_u32(w, a, "attention.head_count", hp->n_head);
    put_u32(w, a, "attention.head_count_kv", hp->n_head_kv);
    if (hp->rope_type == QW_ROPE_LINEAR) {
        qw_gguf_writer_set_str(w, qw_gguf_key(k, sizeof(k), a, "rope.scaling.type"), "linear");
        qw_gguf_writer_set_f32(w, qw_gguf_key(k, sizeof(k), a, "rope.scaling.factor"), hp->rope_factor);
    }
    if (a == QW_ARCH_QWEN35 || a == QW_ARCH_QWEN35_MOE || a == QW_ARCH_QWEN4EXP) {
        /* interleaved MRoPE sections (_Qwen35MRopeMixin's default [11, 11, 10, 0]); text positions make any
         * split plain RoPE, but ggml asserts the sections fit the rotary dims, so a smaller rotary dim (the
         * tiny fixtures) gets a proportional split */
        int h = hp->n_rot / 2;
        int32_t sec[4] = {11, 11, 10, 0};
        if (h < 32) sec[0] = h - 2 * (h / 3), sec[1] = sec[2] = h / 3;
        const qw_gguf_kv *src = m->gguf ? qw_gguf_find_kv(m->gguf, qw_gguf_key(k, sizeof(k), a, "rope.dimension_sections")) : NULL;
        if (src && src->type == QW_GGUF_ARRAY && src->n == 4)
            qw_gguf_writer_set_kv(w, src);
        else
            qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "rope.dimension_sections"), QW_GGUF_I32, sec, 4);
    }
    qw_gguf_writer_set_f32(w, qw_gguf_key(k, sizeof(k), a, "rope.freq_base"), hp->rope_theta);
    qw_gguf_writer_set_f32(w, qw_gguf_key(k, sizeof(k), a, "attention.layer_norm_rms_epsilon"), hp->norm_eps);
    if (hp->n_expert) {
        put_u32(w, a, "expert_count", hp->n_expert);
        put_u32(w, a, "expert_used_count", hp->n_expert_used);
    }
    put_u32(w, a, "attention.key_length", hp->head_dim);
    put_u32(w, a, "attention.value_length", hp->head_dim);
    if (a == QW_ARCH_LLAMA) {
        put_u32(w, a, "vocab_size", hp->n_vocab);
        put_u32(w, a, "rope.dimension_count", hp->n_rot);
    }
    if (hp->n_expert) {
        put_u32(w, a, "expert_feed_forward_length", hp->n_ff_exp);
        put_u32(w, a, "expert_shared_feed_forward_length", hp->n_ff_shexp);
        if (!hp->norm_topk_prob) qw_gguf_writer_set_bool(w, qw_gguf_key(k, sizeof(k), a, "expert_weights_norm"), 0);
    }
    if (a >= QW_ARCH_QWEN35) {
        put_u32(w, a, "ssm.conv_kernel", hp->gdn_conv_k);
        put_u32(w, a, "ssm.state_size", hp->gdn_dk);
        put_u32(w, a, "ssm.group_count", hp->gdn_hk);
        put_u32(w, a, "ssm.time_step_rank", hp->gdn_hv);
        put_u32(w, a, "ssm.inner_size", (int64_t)hp->gdn_dv * hp->gdn_hv);
        uint8_t *rec = qw_calloc((size_t)hp->n_layer, 1);
        if (!rec) {
            meta_oom(w, "attention.recurrent_layers", (size_t)hp->n_layer);
            return;
        }
        for (int l = 0; l < hp->n_layer; l++) rec[l] = hp->layer_kind[l] == QW_LAYER_GDN;
        qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "attention.recurrent_layers"), QW_GGUF_BOOL, rec,
                               (uint64_t)hp->n_layer);
        free(rec);
        put_u32(w, a, "full_attention_interval", 4);
        put_u32(w, a, "rope.dimension_count", hp->n_rot);
    }
    if (a == QW_ARCH_QWEN4EXP) {
        put_u32(w, a, "hyper_connection.count", hp->hc_count);
        put_u32(w, a, "hyper_connection.low_rank", hp->hc_lowrank);
        if (!hp->gdn_gate_sigmoid) qw_gguf_writer_set_str(w, qw_gguf_key(k, sizeof(k), a, "ssm.gate_activation"), "silu");
        if (hp->idx_n_head > 0) {
            put_u32(w, a, "attention.indexer.head_count", hp->idx_n_head);
            put_u32(w, a, "attention.indexer.key_length", hp->idx_head_dim);
            put_u32(w, a, "attention.indexer.top_k", hp->idx_budget);
            int32_t *cr = qw_calloc((size_t)hp->n_layer, sizeof(int32_t));
            if (!cr) {
                meta_oom(w, "attention.compress_ratios", (size_t)hp->n_layer * sizeof(int32_t));
                return;
            }
            for (int l = 0; l < hp->n_layer; l++) cr[l] = hp->layer_kind[l] == QW_LAYER_QSA ? hp->idx_ratio : 0;
            qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "attention.compress_ratios"), QW_GGUF_I32, cr,
                                   (uint64_t)hp->n_layer);
            free(cr);
        }
        if (hp->n_ple > 0) {
            int n = hp->ngram_n, nh = hp->ngram_heads, np = hp->n_ple;
            int32_t *layers = qw_calloc((size_t)np, sizeof(int32_t));
            uint64_t *mult = qw_calloc((size_t)np * n, sizeof(uint64_t));
            uint64_t *off = qw_calloc((size_t)np * nh, sizeof(uint64_t)), *voc = qw_calloc((size_t)np * nh, sizeof(uint64_t));
            if (!layers || !mult || !off || !voc) {
                free(layers);
                free(mult);
                free(off);
                free(voc);
                meta_oom(w, "ple.layers, ple.layer_multipliers, ple.head_offsets, ple.head_vocab_sizes",
                         (size_t)np * (4 + 8 * (size_t)(n + 2 * nh)));
                return;
            }
            for (int i = 0; i < np; i++) {
                const qw_ple_w *pw = m->layers[hp->ple_layers[i]].ple;
                layers[i] = hp->ple_layers[i];
                for (int j = 0; j < n; j++) mult[i * n + j] = pw->mult[j];
                for (int h = 0; h < nh; h++) {
                    off[i * nh + h] = (uint64_t)pw->offset[h];
                    voc[i * nh + h] = (uint64_t)pw->prime[h];
                }
            }
            qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "ple.layers"), QW_GGUF_I32, layers, (uint64_t)np);
            put_u32(w, a, "ple.ngram_size", n);
            put_u32(w, a, "ple.heads_per_ngram", nh / (n - 1));
            put_u32(w, a, "ple.conv_kernel", hp->ple_conv_k);
            put_u32(w, a, "ple.eos_token_id", hp->eos_id);
            put_u32(w, a, "embedding_length_per_layer_input", hp->ple_dim / nh);
            qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "ple.layer_multipliers"), QW_GGUF_U64, mult,
                                   (uint64_t)np * n);
            qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "ple.head_offsets"), QW_GGUF_U64, off, (uint64_t)np * nh);
            qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "ple.head_vocab_sizes"), QW_GGUF_U64, voc,
                                   (uint64_t)np * nh);
            free(layers);
            free(mult);
            free(off);
            free(voc);
        }
    }
    /* a checkpoint directory's tokenizer.json is converted (text/tok_gguf.c; an error fails the file); without
     * one the file says "none": llama.cpp then runs on token ids only, with <arch>.vocab_size */
    int has_tokens = source_kv(m, "tokenizer.ggml.tokens") != NULL;
    if (!source_kv(m, "tokenizer.ggml.model")) {
        char terr[1024];
        qwenc_status st = m->gguf ? QWENC_OK : qw_tok_gguf_write(w, m->path, hp->n_vocab, &has_tokens, terr, sizeof(terr));
        if (st) qw_gguf_writer_fail(w, st, terr);
        if (!has_tokens) {
            qw_gguf_writer_set_str(w, "tokenizer.ggml.model", "none");
            if (hp->eos_id >= 0) qw_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)hp->eos_id);
            if (hp->bos_id >= 0) qw_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)hp->bos_id);
        }
    }
    if (!has_tokens) put_u32(w, a, "vocab_size", hp->n_vocab);
}

/* ---------------------------------------------------------------- streaming the data */

typedef struct {
    const out_tensor *t;
    qw_row_gen gen; /* rows of pieces without data (qwenc synth) */
    void *gen_user;
    int64_t r0, n, cols;
    float *f32, *tmp; /* [n * cols], [cols] */
    uint8_t *dst;     /* the bytes of rows r0 .. r0+n */
} job;

/* Rows r0 .. r0+n of the output tensor as f32 (the source rows, reordered; generated for a piece without data). */
static void fill_rows(const job *j, int64_t r0, int64_t n, int64_t cols, float *out, float *tmp) {
    const out_tensor *t = j->t;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = r0 + i;
        float *o = out + i * cols;
        if (t->vec) {
            memcpy(o, t->vec + r * cols, (size_t)cols * sizeof(float));
            continue;
        }
        int64_t src = t->row_map ? t->row_map[r] : r;
        int lo = 0, hi = t->n_pieces - 1; /* the piece holding stacked row src */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (t->piece_row0[mid] <= src) lo = mid;
            else hi = mid - 1;
        }
        const qw_tensor *pc = &t->pieces[lo];
        int64_t local = src - t->piece_row0[lo];
        if (!pc->data) {
            QW_ASSERT(j->gen && !t->col_map);
            j->gen(pc, local, cols, o, j->gen_user);
        } else if (t->col_map) {
            qw_tensor_to_f32(pc, local * cols, cols, tmp);
            for (int64_t c = 0; c < cols; c++) o[c] = tmp[t->col_map[c]];
        } else {
            qw_tensor_to_f32(pc, local * cols, cols, o);
        }
    }
}

static void *run_job(void *arg) {
    job *j = arg;
    fill_rows(j, j->r0, j->n, j->cols, j->f32, j->tmp);
    qw_quantize(j->t->type, j->f32, j->dst, j->n * j->cols);
    return NULL;
}

qwenc_gguf_params qwenc_gguf_default_params(void) {
    qwenc_gguf_params p = {.type = "F16", .n_threads = 0, .progress = NULL, .user = NULL};
    return p;
}

const char *qwenc_gguf_types(void) { return qw_gguf_policy_names(); }

static void plan_free(plan *p) {
    for (int i = 0; i < p->n_own; i++) free(p->own[i]);
    free(p->own);
    free(p->t);
}

/* ---------------------------------------------------------------- the plan with its types (model.h) */

struct qw_gguf_plan {
    plan p;
    qw_gguf_policy pol;
    uint64_t total;           /* bytes of every tensor's data */
    int nt;                   /* converting threads */
    qw_row_gen gen;           /* rows of pieces without data (qwenc synth) */
    void *gen_user;
    float *f32, *tmp;         /* scratch: [cap_f32] rows of a batch, [nt][cap_tmp] one row per thread */
    size_t cap_f32, cap_tmp;
};

qwenc_status qw_gguf_plan_new(const qwenc_model *m, const char *type, int n_threads, qw_row_gen gen, void *gen_user,
                              qw_gguf_plan **out, char *err, size_t errlen) {
    *out = NULL;
    const qw_hparams *hp = &m->hp;
    qw_gguf_plan *pl = qw_calloc(1, sizeof(*pl));
    if (!pl) return qw_err_nomem(err, errlen, m->path, 1, sizeof(*pl));
    if (!qw_gguf_policy_parse(&pl->pol, type)) {
        free(pl);
        return qw_err(err, errlen, QWENC_ERR_ARG, "unknown GGUF type \"%s\" (one of %s)", type, qw_gguf_policy_names());
    }
    int nt = n_threads > 0 ? n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    pl->nt = nt < 1 ? 1 : nt > 64 ? 64 : nt;
    pl->gen = gen;
    pl->gen_user = gen_user;
    plan *p = &pl->p;
    p->m = m;
    if (setjmp(p->oom)) {
        qwenc_status st = qw_err_nomem(err, errlen, m->path, p->oom_bytes, 1);
        qw_gguf_plan_free(pl);
        return st;
    }
    plan_model(p);
    qw_gguf_policy *pol = &pl->pol;
    pol->n_layer = hp->n_layer;
    pol->n_expert = hp->n_expert;
    pol->n_gqa = hp->n_head / hp->n_head_kv;
    pol->tied = m->output == m->tok_embd;
    for (int i = 0; i < p->n; i++)
        pol->n_attn_v += strstr(p->t[i].name, "attn_v.weight") || strstr(p->t[i].name, "attn_qkv.weight");
    for (int i = 0; i < p->n; i++) {
        out_tensor *t = &p->t[i];
        pol->keep = t->src_type;
        t->type = qw_gguf_policy_type(pol, t->role, t->name, t->n_dims, t->shape, converter_f32(t));
        int64_t ne = 1;
        for (int d = 0; d < t->n_dims; d++) ne *= t->shape[d];
        pl->total += qw_type_row_size(t->type, ne);
    }
    *out = pl;
    return QWENC_OK;
}

void qw_gguf_plan_free(qw_gguf_plan *pl) {
    if (!pl) return;
    plan_free(&pl->p);
    free(pl->f32);
    free(pl->tmp);
    free(pl);
}

int qw_gguf_plan_n_tensors(const qw_gguf_plan *pl) { return pl->p.n; }
uint64_t qw_gguf_plan_bytes(const qw_gguf_plan *pl) { return pl->total; }

qw_tensor qw_gguf_plan_tensor(const qw_gguf_plan *pl, int i) {
    const out_tensor *t = &pl->p.t[i];
    qw_tensor d = {.name = t->name, .type = t->type, .n_dims = t->n_dims};
    for (int k = 0; k < t->n_dims; k++) d.shape[k] = t->shape[k];
    return d;
}

void qw_gguf_plan_sources(const qw_gguf_plan *pl, int i, int64_t r0, int64_t n, int before,
                          void (*fn)(const void *data, size_t bytes, void *user), void *user) {
    const out_tensor *t = &pl->p.t[i];
    int64_t rows = 1;
    for (int d = 0; d < t->n_dims - 1; d++) rows *= t->shape[d];
    for (int k = 0; k < t->n_pieces; k++) {
        const qw_tensor *pc = &t->pieces[k];
        if (!pc->data) continue;
        size_t row_bytes = qw_type_row_size(pc->type, qw_tensor_row_len(pc));
        int64_t a = 0, b = pc->shape[0]; /* rows of the piece read */
        if (t->row_map) { /* any output row may read any source row: the whole pieces, once */
            if (before ? r0 > 0 : r0 + n < rows) return;
        } else {
            a = QW_MAX(r0, t->piece_row0[k]) - t->piece_row0[k];
            b = QW_MIN(r0 + n, t->piece_row0[k + 1]) - t->piece_row0[k];
        }
        if (b > a) fn((const uint8_t *)pc->data + (size_t)a * row_bytes, (size_t)(b - a) * row_bytes, user);
    }
}

/* batches of at most ~64 MiB of f32 rows */
int64_t qw_gguf_plan_batch_rows(const qw_gguf_plan *pl, int i) {
    const out_tensor *t = &pl->p.t[i];
    int64_t cols = t->shape[t->n_dims - 1], rows = 1;
    for (int d = 0; d < t->n_dims - 1; d++) rows *= t->shape[d];
    int64_t per = (int64_t)(((size_t)16 << 20) / (size_t)cols);
    return QW_MAX((int64_t)1, QW_MIN(per, rows));
}

qwenc_status qw_gguf_plan_rows(qw_gguf_plan *pl, int i, int64_t r0, int64_t n, void *dst, char *err, size_t errlen) {
    const out_tensor *t = &pl->p.t[i];
    int64_t cols = t->shape[t->n_dims - 1];
    size_t row_bytes = qw_type_row_size(t->type, cols);
    if ((size_t)(n * cols) > pl->cap_f32) {
        free(pl->f32);
        pl->cap_f32 = 0;
        pl->f32 = qw_calloc((size_t)(n * cols), sizeof(float));
        if (!pl->f32) return qw_err_nomem(err, errlen, t->name, (size_t)(n * cols), sizeof(float));
        pl->cap_f32 = (size_t)(n * cols);
    }
    if ((size_t)cols > pl->cap_tmp) {
        free(pl->tmp);
        pl->cap_tmp = 0;
        pl->tmp = qw_calloc((size_t)cols * (size_t)pl->nt, sizeof(float));
        if (!pl->tmp) return qw_err_nomem(err, errlen, t->name, (size_t)cols * (size_t)pl->nt, sizeof(float));
        pl->cap_tmp = (size_t)cols;
    }
    job jobs[64];
    pthread_t th[64];
    int nj = (int)QW_MIN((int64_t)pl->nt, n);
    int64_t step = (n + nj - 1) / nj, at = 0;
    int used = 0;
    for (int k = 0; k < nj && at < n; k++, used++) {
        int64_t c = QW_MIN(step, n - at);
        jobs[k] = (job){.t = t, .gen = pl->gen, .gen_user = pl->gen_user, .r0 = r0 + at, .n = c, .cols = cols,
                        .f32 = pl->f32 + at * cols, .tmp = pl->tmp + (size_t)k * pl->cap_tmp,
                        .dst = (uint8_t *)dst + (size_t)at * row_bytes};
        at += c;
    }
    int started[64] = {0};
    for (int k = 1; k < used; k++) {
        started[k] = pthread_create(&th[k], NULL, run_job, &jobs[k]) == 0;
        if (!started[k]) run_job(&jobs[k]);
    }
    run_job(&jobs[0]);
    for (int k = 1; k < used; k++)
        if (started[k]) pthread_join(th[k], NULL);
    return QWENC_OK;
}

/* ---------------------------------------------------------------- the file */

/* The source bytes of a batch, asked for before it is read: the token embedding and the PLE table are mapped
 * without readahead (MADV_RANDOM, for decode's lookups), and would otherwise be read from the file a 4 KiB
 * page fault at a time. */
static void willneed(const void *data, size_t bytes, void *user) {
    (void)user;
    qw_advise_willneed(data, bytes);
}

qwenc_status qwenc_model_save_gguf(const qwenc_model *m, const char *path, const qwenc_gguf_params *params, char *err,
                                   size_t errlen) {
    return qw_model_save_gguf_gen(m, path, params, NULL, NULL, err, errlen);
}

qwenc_status qw_model_save_gguf_gen(const qwenc_model *m, const char *path, const qwenc_gguf_params *params,
                                    qw_row_gen gen, void *gen_user, char *err, size_t errlen) {
    qwenc_gguf_params prm = params ? *params : qwenc_gguf_default_params();
    qw_gguf_plan *pl = NULL;
    qwenc_status st = qw_gguf_plan_new(m, prm.type ? prm.type : "F16", prm.n_threads, gen, gen_user, &pl, err, errlen);
    if (st) return st;
    if (m->gguf) {
        struct stat a, b;
        if (stat(path, &a) == 0 && stat(m->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            qw_gguf_plan_free(pl);
            return qw_err(err, errlen, QWENC_ERR_ARG, "%s: the output would overwrite the model being read", path);
        }
    }
    const plan *p = &pl->p;

    qw_gguf_writer *w = NULL;
    st = qw_gguf_writer_open(&w, path, err, errlen);
    if (st) {
        qw_gguf_plan_free(pl);
        return st;
    }
    write_metadata(w, m, &pl->pol);
    for (int i = 0; i < p->n && !st; i++)
        st = qw_gguf_writer_add_tensor(w, p->t[i].name, p->t[i].type, p->t[i].n_dims, p->t[i].shape, err, errlen);

    uint64_t done = 0;
    uint8_t *out = NULL;
    size_t cap_out = 0;
    for (int i = 0; i < p->n && !st; i++) {
        const out_tensor *t = &p->t[i];
        int64_t cols = t->shape[t->n_dims - 1], rows = 1;
        for (int d = 0; d < t->n_dims - 1; d++) rows *= t->shape[d];
        size_t row_bytes = qw_type_row_size(t->type, cols);
        int64_t per = qw_gguf_plan_batch_rows(pl, i);
        if ((size_t)per * row_bytes > cap_out) {
            free(out);
            cap_out = (size_t)per * row_bytes;
            out = qw_calloc(cap_out, 1);
            if (!out) {
                st = qw_err_nomem(err, errlen, path, cap_out, 1);
                break;
            }
        }
        for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
            int64_t n = QW_MIN(per, rows - r0);
            qw_gguf_plan_sources(pl, i, r0, n, 1, willneed, NULL);
            st = qw_gguf_plan_rows(pl, i, r0, n, out, err, errlen);
            if (!st) st = qw_gguf_writer_write(w, out, (size_t)n * row_bytes, err, errlen);
            done += (uint64_t)n * row_bytes;
            if (!st && prm.progress &&
                prm.progress(t->name, qw_type_name(t->type), i, p->n, done, pl->total, prm.user) != 0)
                st = qw_err(err, errlen, QWENC_ERR_ARG, "%s: cancelled", path);
        }
    }
    free(out);
    qw_gguf_plan_free(pl);
    if (st) {
        qw_gguf_writer_abort(w);
        return st;
    }
    return qw_gguf_writer_close(w, err, errlen);
}
