/*
 * gguf_save.c - write a loaded model as the GGUF file llama.cpp's convert_hf_to_gguf.py (+ llama-quantize for
 * the block types) would write: the same architecture, metadata keys, tensor names, transformations and
 * tensor types (gguf_map.h), streamed one tensor at a time.
 *
 * The source is the bound model (model.h), so a checkpoint directory and a .gguf are written the same way: the
 * plan is the binder (bind.h) reading the model, the architecture's description of its tensors walked with an
 * io that turns each slot into the tensor the file holds. Each output tensor is described by where its rows
 * come from: views stacked along rows (experts, n-gram table shards), an optional row map and column map (the
 * converter's reorderings of the role, gguf_map.h, applied only where the source is in the Hugging Face
 * layout: qw_gdn_w.v_tiled and qw_attn_w.rope_interleaved say when it is not), or an f32 vector already
 * transformed (norms + 1, -exp(A_log), squeezed convs). Rows are converted to f32, reordered, and quantized by
 * the reference quantizers of tensor/quant.h on the plan's thread pool (core/pool.h), in batches of bounded
 * size: memory use does not grow with the model.
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
#include <setjmp.h>
#include <string.h>
#include <sys/stat.h>

#include "blocks/blocks.h"
#include "core/mapfile.h"
#include "core/pool.h"
#include "models/bind.h"
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

/* ---------------------------------------------------------------- the plan: the binder reading the model */

/* The source is in the Hugging Face order and the file wants the converter's (bind.h: b->layout). */
static int reorder(const qw_binder *b, qw_layout which) {
    return qw_bind_file_layout(b, which) && !(b->layout & which);
}

/* The converter's reordering of a role's rows or columns (gguf_map.h, QW_XF_*), where the source needs it. */
static void reorder_tensor(qw_binder *b, out_tensor *t, qw_gt role) {
    plan *p = b->ctx;
    const qw_hparams *hp = &b->m->hp;
    unsigned xf = qw_gt_info_of(role)->xf;
    int64_t rows = t->shape[0], dv = hp->gdn_dv;
    if ((xf & QW_XF_ROPE) && reorder(b, QW_LAYOUT_ROPE))
        t->row_map = rope_rows(p, (int)(rows / hp->head_dim), hp->head_dim);
    if (!(xf & (QW_XF_VHEADS | QW_XF_VROWS | QW_XF_VCOLS)) || !reorder(b, QW_LAYOUT_VHEADS)) return;
    if (xf & QW_XF_VCOLS) {
        int *vs = vhead_src(p, hp);
        t->col_map = plan_alloc(p, (size_t)hp->gdn_hv * dv * sizeof(int32_t));
        for (int q = 0; q < hp->gdn_hv; q++)
            for (int x = 0; x < dv; x++) t->col_map[q * dv + x] = vs[q] * (int)dv + x;
        return;
    }
    int d = xf & QW_XF_VHEADS ? 1 : (int)dv; /* rows per value head, after rows - hv * d kept */
    if (t->vec)
        vhead_vec(p, t, hp, rows - (int64_t)hp->gdn_hv * d, d);
    else
        t->row_map = vhead_rows(p, hp, rows - (int64_t)hp->gdn_hv * d, d);
}

static void plan_mat(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot) {
    QW_ASSERT(*slot && qw_tensor_nelem(*slot) == d0 * d1);
    int64_t s[2] = {d0, d1};
    out_tensor *t = plan_add(b->ctx, role, il, 2, s);
    set_pieces(b->ctx, t, slot, 1);
    reorder_tensor(b, t, role);
}

static void plan_vec(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, float **slot) {
    QW_ASSERT(*slot);
    int one = (qw_gt_info_of(role)->xf & QW_XF_NORM) && qw_arch_has(b->m->hp.arch, QW_AF_NORM_PLUS_ONE);
    reorder_tensor(b, add_vec(b->ctx, role, il, *slot, d0, d1, one ? 1.0f : 0.0f), role);
}

/* Two pieces: the query rows and the key rows. */
static void plan_indexer(qw_binder *b, int il, int64_t nq, int64_t nk, qw_attn_w *w) {
    plan *p = b->ctx;
    int64_t H = b->m->hp.n_embd;
    qw_tensor *qk = plan_alloc(p, 2 * sizeof(qw_tensor));
    qk[0] = qw_tensor_rows(w->idx_qk, 0, nq, H);
    qk[1] = qw_tensor_rows(w->idx_qk, nq, nk, H);
    if (!w->idx_qk->data) { /* generated rows (synth): the key rows are their own tensor */
        char *nm = plan_alloc(p, strlen(w->idx_qk->name) + 3);
        sprintf(nm, "%s.k", w->idx_qk->name);
        qk[1].data = NULL;
        qk[1].name = nm;
    }
    const qw_tensor *q = &qk[0], *k = &qk[1];
    plan_mat(b, QW_GT_INDEXER_Q, il, nq, H, &q);
    plan_mat(b, QW_GT_INDEXER_K, il, nk, H, &k);
}

static void plan_gdn_in(qw_binder *b, int il, qw_gdn_w *w) {
    plan *p = b->ctx;
    const qw_hparams *hp = &b->m->hp;
    int hk = hp->gdn_hk, hv = hp->gdn_hv, dk = hp->gdn_dk, dv = hp->gdn_dv, r = hv / hk;
    int64_t H = hp->n_embd, kd = (int64_t)hk * dk, vd = (int64_t)hv * dv, ch = 2 * kd + vd;
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
        int64_t sq[2] = {ch, H}, sz[2] = {vd, H};
        t = plan_add(p, QW_GT_SSM_QKV, il, 2, sq);
        set_pieces(p, t, &w->qkvz, 1);
        t->row_map = mq;
        t = plan_add(p, QW_GT_SSM_GATE, il, 2, sz);
        set_pieces(p, t, &w->qkvz, 1);
        t->row_map = mz;
    } else {
        plan_mat(b, QW_GT_SSM_QKV, il, ch, H, &w->qkv);
        plan_mat(b, QW_GT_SSM_GATE, il, vd, H, &w->z);
    }
    if (!qw_arch_has(hp->arch, QW_AF_SSM_BA)) {
        plan_mat(b, QW_GT_SSM_BETA, il, hv, H, &w->b);
        plan_mat(b, QW_GT_SSM_ALPHA, il, hv, H, &w->a);
    } else if (w->ba) {
        plan_mat(b, QW_GT_SSM_BA, il, 2 * (int64_t)hv, H, &w->ba);
    } else {
        /* [b_g (r) | a_g (r)] per key head from the separate b, a */
        const qw_tensor *ba[2] = {w->b, w->a};
        int64_t s[2] = {2 * (int64_t)hv, H};
        t = plan_add(p, QW_GT_SSM_BA, il, 2, s);
        set_pieces(p, t, ba, 2);
        t->row_map = plan_alloc(p, (size_t)(2 * hv) * sizeof(int64_t));
        for (int g = 0; g < hk; g++)
            for (int i = 0; i < r; i++) {
                t->row_map[g * 2 * r + i] = g * r + i;
                t->row_map[g * 2 * r + r + i] = hv + g * r + i;
            }
    }
}

/* Each of gate, up, down: the experts' views stacked [E, rows, cols]. */
static void plan_experts(qw_binder *b, int il, qw_moe_w *w) {
    plan *p = b->ctx;
    int E = b->m->hp.n_expert;
    const qw_tensor **v = plan_alloc(p, (size_t)E * sizeof(qw_tensor *));
    for (int e = 0; e < E; e++) v[e] = &w->experts[e].gate;
    add_stack(p, QW_GT_FFN_GATE_EXPS, il, v, E);
    for (int e = 0; e < E; e++) v[e] = &w->experts[e].up;
    add_stack(p, QW_GT_FFN_UP_EXPS, il, v, E);
    for (int e = 0; e < E; e++) v[e] = &w->experts[e].down;
    add_stack(p, QW_GT_FFN_DOWN_EXPS, il, v, E);
}

/* The n-gram table of the li-th PLE layer: its pieces stacked (the hash constants are metadata). */
static void plan_ple_table(qw_binder *b, int il, int li, qw_ple_w **slot) {
    plan *p = b->ctx;
    const qw_ple_w *w = *slot;
    const qw_tensor **v = plan_alloc(p, (size_t)w->n_chunks * sizeof(qw_tensor *));
    for (int i = 0; i < w->n_chunks; i++) v[i] = &w->chunks[i];
    int64_t s[2] = {w->n_rows, qw_tensor_row_len(&w->chunks[0])};
    out_tensor *t = plan_add(p, QW_GT_PLE_TABLE, il, 2, s);
    qw_gguf_ple_table_name(t->name, sizeof(t->name), li, il);
    set_pieces(p, t, v, w->n_chunks);
}

/* llama3 scaling travels as rope_freqs: the divisor of each default frequency. */
static void plan_rope(qw_binder *b) {
    const qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    if (!qw_arch_has(hp->arch, QW_AF_ROPE_FREQS)) return;
    qw_hparams plain = *hp;
    plain.rope_type = QW_ROPE_DEFAULT;
    int half = hp->n_rot / 2, scaled = 0;
    float *f = plan_alloc(b->ctx, (size_t)half * sizeof(float));
    qw_rope_inv_freq(&plain, f);
    for (int k = 0; k < half; k++) {
        f[k] /= m->rope_inv_freq[k];
        scaled |= f[k] != 1.0f;
    }
    if (scaled && hp->rope_type != QW_ROPE_LINEAR) add_vec(b->ctx, QW_GT_ROPE_FREQS, -1, f, half, 0, 0);
}

static const qw_bind_io plan_io = {
    .reads = 1,
    .mat = plan_mat,
    .vec = plan_vec,
    .indexer = plan_indexer,
    .gdn_in = plan_gdn_in,
    .experts = plan_experts,
    .ple_table = plan_ple_table,
    .rope = plan_rope,
};

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

    /* the MTP draft head is the block after the last layer (llama.cpp's nextn layout) */
    int n_blk = hp->n_layer + hp->n_mtp;
    put_u32(w, a, "block_count", n_blk);
    if (hp->n_mtp) put_u32(w, a, "nextn_predict_layers", hp->n_mtp);
    put_u32(w, a, "context_length", hp->n_ctx_train);
    put_u32(w, a, "embedding_length", hp->n_embd);
    if (hp->n_ff > 0) put_u32(w, a, "feed_forward_length", hp->n_ff);
    put_u32(w, a, "attention.head_count", hp->n_head);
    put_u32(w, a, "attention.head_count_kv", hp->n_head_kv);
    if (hp->rope_type == QW_ROPE_LINEAR) {
        qw_gguf_writer_set_str(w, qw_gguf_key(k, sizeof(k), a, "rope.scaling.type"), "linear");
        qw_gguf_writer_set_f32(w, qw_gguf_key(k, sizeof(k), a, "rope.scaling.factor"), hp->rope_factor);
    }
    if (qw_arch_has(a, QW_AF_MROPE)) {
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
    if (qw_arch_has(a, QW_AF_VOCAB_KEY)) {
        put_u32(w, a, "vocab_size", hp->n_vocab);
        put_u32(w, a, "rope.dimension_count", hp->n_rot);
    }
    if (hp->n_expert) {
        put_u32(w, a, "expert_feed_forward_length", hp->n_ff_exp);
        put_u32(w, a, "expert_shared_feed_forward_length", hp->n_ff_shexp);
        if (!hp->norm_topk_prob) qw_gguf_writer_set_bool(w, qw_gguf_key(k, sizeof(k), a, "expert_weights_norm"), 0);
    }
    if (qw_arch_has(a, QW_AF_GDN)) {
        put_u32(w, a, "ssm.conv_kernel", hp->gdn_conv_k);
        put_u32(w, a, "ssm.state_size", hp->gdn_dk);
        put_u32(w, a, "ssm.group_count", hp->gdn_hk);
        put_u32(w, a, "ssm.time_step_rank", hp->gdn_hv);
        put_u32(w, a, "ssm.inner_size", (int64_t)hp->gdn_dv * hp->gdn_hv);
        uint8_t *rec = qw_calloc((size_t)n_blk, 1);
        if (!rec) {
            meta_oom(w, "attention.recurrent_layers", (size_t)n_blk);
            return;
        }
        for (int l = 0; l < hp->n_layer; l++) rec[l] = hp->layer_kind[l] == QW_LAYER_GDN;
        qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "attention.recurrent_layers"), QW_GGUF_BOOL, rec,
                               (uint64_t)n_blk);
        free(rec);
        put_u32(w, a, "full_attention_interval", 4);
        put_u32(w, a, "rope.dimension_count", hp->n_rot);
    }
    if (qw_arch_has(a, QW_AF_HC)) {
        put_u32(w, a, "hyper_connection.count", hp->hc_count);
        put_u32(w, a, "hyper_connection.low_rank", hp->hc_lowrank);
    }
    if (qw_arch_has(a, QW_AF_GATE_ACT) && !hp->gdn_gate_sigmoid)
        qw_gguf_writer_set_str(w, qw_gguf_key(k, sizeof(k), a, "ssm.gate_activation"), "silu");
    if (qw_arch_has(a, QW_AF_QSA) && hp->idx_n_head > 0) {
        put_u32(w, a, "attention.indexer.head_count", hp->idx_n_head);
        put_u32(w, a, "attention.indexer.key_length", hp->idx_head_dim);
        put_u32(w, a, "attention.indexer.top_k", hp->idx_budget);
        int32_t *cr = qw_calloc((size_t)n_blk, sizeof(int32_t));
        if (!cr) {
            meta_oom(w, "attention.compress_ratios", (size_t)n_blk * sizeof(int32_t));
            return;
        }
        for (int l = 0; l < n_blk; l++)
            cr[l] = l >= hp->n_layer || hp->layer_kind[l] == QW_LAYER_QSA ? hp->idx_ratio : 0;
        qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "attention.compress_ratios"), QW_GGUF_I32, cr,
                               (uint64_t)n_blk);
        free(cr);
    }
    if (qw_arch_has(a, QW_AF_PLE) && hp->n_ple > 0) {
        int n = hp->ngram_n, nh = hp->ngram_heads, np = hp->n_ple;
        int32_t *layers = qw_calloc((size_t)np, sizeof(int32_t));
        uint64_t *mult = qw_calloc((size_t)np * n, sizeof(uint64_t));
        uint64_t *off = qw_calloc((size_t)np * nh, sizeof(uint64_t));
        uint64_t *voc = qw_calloc((size_t)np * nh, sizeof(uint64_t));
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
        qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "ple.head_offsets"), QW_GGUF_U64, off,
                               (uint64_t)np * nh);
        qw_gguf_writer_set_arr(w, qw_gguf_key(k, sizeof(k), a, "ple.head_vocab_sizes"), QW_GGUF_U64, voc,
                               (uint64_t)np * nh);
        free(layers);
        free(mult);
        free(off);
        free(voc);
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

/* Rows r0 .. r0+n of the output tensor as f32 (the source rows, reordered; generated by gen for a piece without
 * data); tmp: a row of scratch. */
static void fill_rows(const out_tensor *t, qw_row_gen gen, void *gen_user, int64_t r0, int64_t n, int64_t cols,
                      float *out, float *tmp) {
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
            QW_ASSERT(gen && !t->col_map);
            gen(pc, local, cols, o, gen_user);
        } else if (t->col_map) {
            qw_tensor_to_f32(pc, local * cols, cols, tmp);
            for (int64_t c = 0; c < cols; c++) o[c] = tmp[t->col_map[c]];
        } else {
            qw_tensor_to_f32(pc, local * cols, cols, o);
        }
    }
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
    qw_pool *pool;            /* the converting threads (NULL: the caller's alone) */
    int n_jobs;               /* pieces a batch is cut into, a few per thread */
    qw_row_gen gen;           /* rows of pieces without data (qwenc synth) */
    void *gen_user;
    float *f32, *tmp;         /* scratch: [cap_f32] rows of a batch, [n_jobs][cap_tmp] one row per job */
    size_t cap_f32, cap_tmp;
};

/* Elements of a batch's smallest piece (a few tens of microseconds of conversion). */
#define QW_PLAN_JOB_MIN 65536

/* Rows [r0, r0+n) of a tensor, converted on the pool in pieces of `step` rows. */
typedef struct {
    const qw_gguf_plan *pl;
    const out_tensor *t;
    int64_t r0, n, cols, step;
    size_t row_bytes;
    uint8_t *dst; /* the bytes of rows r0 .. r0+n */
} batch;

static void run_jobs(void *ctx, int64_t j0, int64_t j1) {
    const batch *bt = ctx;
    const qw_gguf_plan *pl = bt->pl;
    for (int64_t k = j0; k < j1; k++) {
        int64_t a = k * bt->step, c = QW_MIN(bt->step, bt->n - a);
        float *f32 = pl->f32 + a * bt->cols;
        fill_rows(bt->t, pl->gen, pl->gen_user, bt->r0 + a, c, bt->cols, f32, pl->tmp + (size_t)k * pl->cap_tmp);
        qw_quantize(bt->t->type, f32, bt->dst + (size_t)a * bt->row_bytes, c * bt->cols);
    }
}

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
    int nt = n_threads > 0 ? QW_MIN(n_threads, 64) : qw_cpu_count();
    pl->n_jobs = nt > 1 ? 4 * nt : 1;
    pl->gen = gen;
    pl->gen_user = gen_user;
    plan *p = &pl->p;
    p->m = m;
    if (setjmp(p->oom)) {
        qwenc_status st = qw_err_nomem(err, errlen, m->path, p->oom_bytes, 1);
        qw_gguf_plan_free(pl);
        return st;
    }
    qw_binder b = {.m = (qwenc_model *)m, .io = &plan_io, .ctx = p}; /* reads m: nothing is written to it */
    qwenc_status bst = qw_bind_model(&b);
    QW_ASSERT(bst == QWENC_OK);
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
    /* batches are milliseconds apart (the file is written between them): idle workers sleep at once */
    if (nt > 1) pl->pool = qw_pool_new_spin(nt, 0); /* NULL: the caller converts alone */
    *out = pl;
    return QWENC_OK;
}

void qw_gguf_plan_free(qw_gguf_plan *pl) {
    if (!pl) return;
    qw_pool_free(pl->pool);
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
        pl->tmp = qw_calloc((size_t)cols * (size_t)pl->n_jobs, sizeof(float));
        if (!pl->tmp) return qw_err_nomem(err, errlen, t->name, (size_t)cols * (size_t)pl->n_jobs, sizeof(float));
        pl->cap_tmp = (size_t)cols;
    }
    batch bt = {.pl = pl, .t = t, .r0 = r0, .n = n, .cols = cols, .row_bytes = row_bytes, .dst = dst};
    /* pieces of at least QW_PLAN_JOB_MIN elements: a small tensor is converted faster than a worker wakes */
    int64_t n_jobs = QW_MAX((int64_t)1, QW_MIN((int64_t)pl->n_jobs, n * cols / QW_PLAN_JOB_MIN));
    bt.step = (n + n_jobs - 1) / n_jobs;
    qw_pool_parallel_for(pl->pool, (n + bt.step - 1) / bt.step, 1, run_jobs, &bt);
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
