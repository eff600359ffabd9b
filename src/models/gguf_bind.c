/*
 * gguf_bind.c - load a llama.cpp GGUF (llama, qwen3, qwen35, qwen35moe, qwen3next, qwen4exp) into the same
 * qw_layer structs the safetensors path fills, so the forward code is the same for both.
 *
 * Matrices are views into the mapped file, of any type the kernels read (F32, F16, BF16 and the block
 * types of tensor/quant.h). The converter's transformations (gguf_map.h, docs/GGUF.md) are undone here:
 *   norms stored as 1 + w     -> w (f32 copies, as the safetensors path makes)
 *   A stored as -exp(A_log)   -> used as is (qw_gdn_w.neg_exp_a is that value)
 *   conv [ch, K] (squeezed)   -> the f32 copy [ch][K]
 *   tiled value heads         -> views kept; qw_gdn_w.v_tiled tells gdn.c the order
 *   llama q/k permutation     -> views kept; qw_attn_w.rope_interleaved tells attn.c
 *   indexer q_proj + k_proj   -> one [(ni+1)*ihd, H] matrix (a view when adjacent in the file, else a copy)
 *   qwen3next ssm_ba          -> b and a rows gathered into two small copies
 *   stacked experts [E, I, H] -> one view per expert
 *   llama3 rope_freqs         -> divides the default inverse frequencies
 * Every failure names the file, the tensor, the shape expected and the shape found.
 *
 * The same binding serves a model quantized at load (--quant, models/load_quant.c): its tensors are those of
 * the GGUF qwenc quantize would write, held in memory (qw_converted), so the two bind identically.
 */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "blocks/blocks.h"
#include "models/gguf_map.h"

typedef struct {
    qwenc_model *m;
    const qw_gguf *g;           /* the file, or NULL: the tensors of m->conv */
    const qw_layer *src_layers; /* m->conv: the layers bound from the source (PLE hash constants) */
    char *err;
    size_t errlen;
    qwenc_status st;
    char name[128];
} gbinder;

int qw_path_is_gguf(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The tensor of that name in the file or in the converted tensors, or NULL. */
static const qw_tensor *gb_find(const gbinder *b, const char *name) {
    if (b->g) return qw_gguf_find(b->g, name);
    const qw_converted *c = b->m->conv;
    for (int i = 0; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i].name, name)) return &c->tensors[i];
    return NULL;
}

/* A zeroed buffer freed with the model; NULL and b->st set (naming what it was for) when out of memory. */
static void *gb_own(gbinder *b, size_t bytes, const char *what) {
    if (b->st) return NULL;
    void *p = qw_model_own(b->m, bytes);
    if (!p) {
        char w[320];
        snprintf(w, sizeof(w), "%s: %s", b->m->path, what);
        b->st = qw_err_nomem(b->err, b->errlen, w, bytes, 1);
    }
    return p;
}

static const char *shape_str(int n_dims, const int64_t *shape, char *buf, size_t n) {
    qw_tensor t = {.n_dims = n_dims};
    for (int i = 0; i < n_dims; i++) t.shape[i] = shape[i];
    return qw_shape_str(&t, buf, n);
}

/* The tensor `name` with the given shape (PyTorch order). Size-1 leading dimensions may be absent or present
 * (the converter writes the shared-expert gate as [1, H], other tools as [H]). */
static const qw_tensor *gb_named(gbinder *b, const char *name, int n_dims, const int64_t *shape, int required) {
    if (b->st) return NULL;
    const qw_tensor *t = gb_find(b, name);
    if (!t) {
        if (required)
            b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' is missing", b->m->path, name);
        return NULL;
    }
    int i = 0, j = 0, ok = 1;
    while (i < t->n_dims && t->shape[i] == 1 && t->n_dims - i > n_dims) i++;
    while (j < n_dims && shape[j] == 1 && n_dims - j > t->n_dims - i) j++;
    if (t->n_dims - i != n_dims - j) ok = 0;
    for (; ok && i < t->n_dims; i++, j++) ok = t->shape[i] == shape[j];
    if (!ok) {
        char s1[96], s2[96];
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", b->m->path,
                       name, qw_shape_str(t, s1, sizeof(s1)), shape_str(n_dims, shape, s2, sizeof(s2)));
        return NULL;
    }
    if (!qw_type_traits_of(t->type)->to_float) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qwenc does not read",
                       b->m->path, name, qw_type_name(t->type));
        return NULL;
    }
    return t;
}

static const qw_tensor *gb_tensor(gbinder *b, qw_gt role, int il, int n_dims, const int64_t *shape, int required) {
    qw_gt_name(b->name, sizeof(b->name), role, il);
    return gb_named(b, b->name, n_dims, shape, required);
}

static const qw_tensor *gb_mat(gbinder *b, qw_gt role, int il, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return gb_tensor(b, role, il, 2, s, 1);
}

/* A vector [n] as an f32 copy; minus_one undoes the converter's 1 + w. */
static float *gb_vec(gbinder *b, qw_gt role, int il, int64_t n, int minus_one) {
    int64_t s[1] = {n};
    const qw_tensor *t = gb_tensor(b, role, il, 1, s, 1);
    if (!t) return NULL;
    float *v = gb_own(b, (size_t)n * sizeof(float), t->name);
    if (!v) return NULL;
    qw_tensor_to_f32(t, 0, n, v);
    if (minus_one)
        for (int64_t i = 0; i < n; i++) v[i] -= 1.0f;
    return v;
}

/* A depthwise conv kernel [ch, k] (or unsqueezed [ch, 1, k]) as the f32 copy [ch][k]. */
static float *gb_conv(gbinder *b, qw_gt role, int il, int64_t ch, int64_t k) {
    int64_t s[2] = {ch, k};
    const qw_tensor *t = gb_tensor(b, role, il, 2, s, 0);
    if (!t && !b->st) {
        int64_t s3[3] = {ch, 1, k};
        t = gb_tensor(b, role, il, 3, s3, 1);
    }
    if (!t) return NULL;
    float *v = gb_own(b, (size_t)(ch * k) * sizeof(float), t->name);
    if (v) qw_tensor_to_f32(t, 0, ch * k, v);
    return v;
}

/* A new tensor made of rows of src (raw bytes, type kept): rows[i] for i < n. */
static const qw_tensor *gather_rows(gbinder *b, const qw_tensor *src, const int64_t *rows, int64_t n, const char *name) {
    int64_t len = qw_tensor_row_len(src);
    size_t rs = qw_type_row_size(src->type, len);
    uint8_t *data = gb_own(b, (size_t)n * rs, name);
    qw_tensor *t = gb_own(b, sizeof(qw_tensor), name);
    char *nm = gb_own(b, strlen(name) + 1, name);
    if (b->st) return NULL;
    for (int64_t i = 0; i < n; i++) memcpy(data + (size_t)i * rs, (const uint8_t *)src->data + (size_t)rows[i] * rs, rs);
    *t = *src;
    strcpy(nm, name);
    t->name = nm;
    t->data = data;
    t->n_dims = 2;
    t->shape[0] = n;
    t->shape[1] = len;
    return t;
}

static void bind_ffn(gbinder *b, int il, qw_ffn_w *w, qw_gt g, qw_gt u, qw_gt d, int64_t n_ff) {
    int64_t H = b->m->hp.n_embd;
    const qw_tensor *tg = gb_mat(b, g, il, n_ff, H), *tu = gb_mat(b, u, il, n_ff, H), *td = gb_mat(b, d, il, H, n_ff);
    if (b->st) return;
    w->gate = *tg;
    w->up = *tu;
    w->down = *td;
}

static void bind_moe(gbinder *b, int il, qw_moe_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t E = hp->n_expert, I = hp->n_ff_exp, H = hp->n_embd;
    w->router = gb_mat(b, QW_GT_FFN_GATE_INP, il, E, H);
    if (b->st) return;
    w->experts = gb_own(b, (size_t)E * sizeof(qw_ffn_w), "the experts' views");
    if (!w->experts) return;
    int64_t s_gu[3] = {E, 2 * I, H}, s_e[3] = {E, I, H}, s_d[3] = {E, H, I};
    char fused[96];
    snprintf(fused, sizeof(fused), "blk.%d.ffn_gate_up_exps.weight", il); /* convert_hf_to_gguf --fuse-gate-up-exps */
    const qw_tensor *gu = gb_named(b, fused, 3, s_gu, 0), *gt = NULL, *ut = NULL;
    if (!gu) {
        gt = gb_tensor(b, QW_GT_FFN_GATE_EXPS, il, 3, s_e, 1);
        ut = gb_tensor(b, QW_GT_FFN_UP_EXPS, il, 3, s_e, 1);
    }
    const qw_tensor *dt = gb_tensor(b, QW_GT_FFN_DOWN_EXPS, il, 3, s_d, 1);
    if (b->st) return;
    for (int64_t e = 0; e < E; e++) {
        w->experts[e].gate = gu ? qw_tensor_rows(gu, e * 2 * I, I, H) : qw_tensor_rows(gt, e * I, I, H);
        w->experts[e].up = gu ? qw_tensor_rows(gu, e * 2 * I + I, I, H) : qw_tensor_rows(ut, e * I, I, H);
        w->experts[e].down = qw_tensor_rows(dt, e * H, H, I);
    }
    bind_ffn(b, il, &w->shared, QW_GT_FFN_GATE_SHEXP, QW_GT_FFN_UP_SHEXP, QW_GT_FFN_DOWN_SHEXP, hp->n_ff_shexp);
    int64_t s_sg[2] = {1, H};
    w->shared_gate = gb_tensor(b, QW_GT_FFN_GATE_INP_SHEXP, il, 2, s_sg, 1);
}

static void bind_attn(gbinder *b, int il, qw_attn_w *w, int qk_norm, int gated, int qsa) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int64_t H = hp->n_embd, hd = hp->head_dim, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    int zc = qw_gguf_norm_plus_one(hp->arch);
    w->gated = gated;
    w->rope_interleaved = hp->arch == QW_ARCH_LLAMA;
    int64_t nqg = gated ? 2 * nq : nq;
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.attn_q.weight", il);
    if (!gb_find(b, name)) {
        /* convert_hf_to_gguf --fuse-qkv: one attn_qkv [q | k | v], bound as three row views */
        int64_t s[2] = {nqg + 2 * nkv, H};
        const qw_tensor *qkv = gb_tensor(b, QW_GT_SSM_QKV, il, 2, s, 0);
        qw_tensor *v = qkv ? gb_own(b, 3 * sizeof(qw_tensor), "the q, k, v views") : NULL;
        if (v) {
            v[0] = qw_tensor_rows(qkv, 0, nqg, H);
            v[1] = qw_tensor_rows(qkv, nqg, nkv, H);
            v[2] = qw_tensor_rows(qkv, nqg + nkv, nkv, H);
            w->wq = &v[0], w->wk = &v[1], w->wv = &v[2];
        }
    }
    if (!w->wq) {
        w->wq = gb_mat(b, QW_GT_ATTN_Q, il, nqg, H);
        w->wk = gb_mat(b, QW_GT_ATTN_K, il, nkv, H);
        w->wv = gb_mat(b, QW_GT_ATTN_V, il, nkv, H);
    }
    w->wo = gb_mat(b, QW_GT_ATTN_OUT, il, H, nq);
    if (qk_norm) {
        w->q_norm = gb_vec(b, QW_GT_ATTN_Q_NORM, il, hd, zc);
        w->k_norm = gb_vec(b, QW_GT_ATTN_K_NORM, il, hd, zc);
    }
    if (!qsa) return;
    int64_t ihd = hp->idx_head_dim, nqi = hp->idx_n_head * ihd;
    const qw_tensor *q = gb_mat(b, QW_GT_INDEXER_Q, il, nqi, H), *k = gb_mat(b, QW_GT_INDEXER_K, il, ihd, H);
    w->idx_q_norm = gb_vec(b, QW_GT_INDEXER_Q_NORM, il, ihd, 1);
    w->idx_k_norm = gb_vec(b, QW_GT_INDEXER_K_NORM, il, ihd, 1);
    if (b->st) return;
    /* indexer.py: one projection [(ni+1)*ihd, H], queries first */
    qw_tensor *t = gb_own(b, sizeof(qw_tensor), "the indexer's view");
    if (!t) return;
    *t = *q;
    t->shape[0] = nqi + ihd;
    size_t qb = qw_type_row_size(q->type, nqi * H);
    if (k->type == q->type && (const uint8_t *)k->data == (const uint8_t *)q->data + qb) {
        w->idx_qk = t; /* adjacent in the file: one view */
        return;
    }
    if (k->type == q->type) {
        uint8_t *d = gb_own(b, qb + qw_type_row_size(k->type, ihd * H), "the indexer's q and k rows");
        if (!d) return;
        memcpy(d, q->data, qb);
        memcpy(d + qb, k->data, qw_type_row_size(k->type, ihd * H));
        t->data = d;
    } else {
        float *d = gb_own(b, (size_t)((nqi + ihd) * H) * sizeof(float), "the indexer's q and k rows");
        if (!d) return;
        qw_tensor_to_f32(q, 0, nqi * H, d);
        qw_tensor_to_f32(k, 0, ihd * H, d + nqi * H);
        t->data = d;
        t->type = QW_TYPE_F32;
    }
    w->idx_qk = t;
}

static void bind_gdn(gbinder *b, int il, qw_gdn_w *w) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    int64_t ch = 2 * kd + vd, hv = hp->gdn_hv;
    w->v_tiled = qw_gguf_v_tiled(hp);
    w->qkv = gb_mat(b, QW_GT_SSM_QKV, il, ch, H);
    w->z = gb_mat(b, QW_GT_SSM_GATE, il, vd, H);
    if (hp->arch == QW_ARCH_QWEN3_NEXT) {
        /* ssm_ba rows per key head g: [b of its r value heads | a of them] */
        const qw_tensor *ba = gb_mat(b, QW_GT_SSM_BA, il, 2 * hv, H);
        if (ba) {
            int r = hp->gdn_hv / hp->gdn_hk;
            int64_t *rb = gb_own(b, (size_t)hv * sizeof(int64_t), "the ssm_ba row map");
            int64_t *ra = gb_own(b, (size_t)hv * sizeof(int64_t), "the ssm_ba row map");
            if (b->st) return;
            for (int64_t j = 0; j < hv; j++) {
                rb[j] = (j / r) * 2 * r + j % r;
                ra[j] = rb[j] + r;
            }
            w->b = gather_rows(b, ba, rb, hv, "ssm_ba (beta rows)");
            w->a = gather_rows(b, ba, ra, hv, "ssm_ba (alpha rows)");
        }
    } else {
        w->b = gb_mat(b, QW_GT_SSM_BETA, il, hv, H);
        w->a = gb_mat(b, QW_GT_SSM_ALPHA, il, hv, H);
    }
    w->conv = gb_conv(b, QW_GT_SSM_CONV, il, ch, hp->gdn_conv_k);
    w->dt_bias = gb_vec(b, QW_GT_SSM_DT, il, hv, 0);
    w->neg_exp_a = gb_vec(b, QW_GT_SSM_A, il, hv, 0);
    w->norm = gb_vec(b, QW_GT_SSM_NORM, il, hp->gdn_dv, 0);
    w->out = gb_mat(b, QW_GT_SSM_OUT, il, H, vd);
}

static void bind_hc(gbinder *b, int il, qw_hc_w *w, qw_gt norm, qw_gt down, qw_gt up, qw_gt inject) {
    const qw_hparams *hp = &b->m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, r = hp->hc_lowrank;
    w->norm = gb_vec(b, norm, il, CH, 1);
    w->down = gb_mat(b, down, il, r, CH);
    w->up = gb_mat(b, up, il, CH, r);
    if (inject != QW_GT_COUNT) w->inject = gb_mat(b, inject, il, hp->hc_count, CH);
}

/* The hash constants of the li-th PLE layer (layer il) from the metadata: one set per PLE layer, concatenated in
 * layer order (llama.cpp reads the first). */
static void ple_hash_from_file(gbinder *b, qw_ple_w *w, int il, int li) {
    const qw_hparams *hp = &b->m->hp;
    int64_t nh = hp->ngram_heads;
    char key[128];
    const qw_gguf_kv *mu = qw_gguf_find_kv(b->g, qw_gguf_key(key, sizeof(key), hp->arch, "ple.layer_multipliers"));
    const qw_gguf_kv *of = qw_gguf_find_kv(b->g, qw_gguf_key(key, sizeof(key), hp->arch, "ple.head_offsets"));
    const qw_gguf_kv *vs = qw_gguf_find_kv(b->g, qw_gguf_key(key, sizeof(key), hp->arch, "ple.head_vocab_sizes"));
    uint64_t n = (uint64_t)hp->ngram_n;
    if (!mu || !of || !vs || mu->n < (li + 1) * n || of->n < (li + 1) * (uint64_t)nh || vs->n < (li + 1) * (uint64_t)nh) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT,
                       "%s: ple.{layer_multipliers, head_offsets, head_vocab_sizes} hold too few entries for PLE layer "
                       "%d (%d of them): %llu per layer each way are needed",
                       b->m->path, il, li + 1, (unsigned long long)nh);
        return;
    }
    for (uint64_t i = 0; i < n; i++) w->mult[i] = (uint64_t)qw_gguf_arr_i64(mu, li * n + i);
    for (int64_t h = 0; h < nh; h++) {
        w->prime[h] = qw_gguf_arr_i64(vs, (uint64_t)(li * nh + h));
        w->offset[h] = qw_gguf_arr_i64(of, (uint64_t)(li * nh + h));
    }
}

/* The PLE table of the li-th PLE layer: llama.cpp's one table for the first, qwenc's per-layer name after. */
static const char *ple_table_name(char *buf, size_t n, int li, int il) {
    if (li == 0) return qw_gt_name(buf, n, QW_GT_PLE_TABLE, il);
    snprintf(buf, n, "blk.%d.ple_token_embd.weight", il);
    return buf;
}

static qw_ple_w *bind_ple(gbinder *b, int il, int li) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, P = hp->ple_dim, nh = hp->ngram_heads, dh = P / nh;
    qw_ple_w *w = gb_own(b, sizeof(qw_ple_w), "the PLE layer");
    if (!w) return NULL;
    w->li = li;
    w->key_proj = gb_mat(b, QW_GT_PLE_KEY, il, CH, P);
    w->value_proj = gb_mat(b, QW_GT_PLE_VALUE, il, hp->n_embd, P);
    w->norm_key = gb_vec(b, QW_GT_PLE_NORM_KEY, il, CH, 1);
    w->norm_query = gb_vec(b, QW_GT_PLE_NORM_QUERY, il, CH, 1);
    w->norm_conv = gb_vec(b, QW_GT_PLE_NORM_CONV, il, CH, 1);
    w->conv = gb_conv(b, QW_GT_PLE_CONV, il, CH, hp->ple_conv_k);
    if (b->st) return w;

    w->prime = gb_own(b, (size_t)nh * sizeof(int64_t), "the PLE hash table sizes");
    w->offset = gb_own(b, (size_t)nh * sizeof(int64_t), "the PLE hash table offsets");
    if (b->st) return w;
    if (b->g) {
        ple_hash_from_file(b, w, il, li);
        if (b->st) return w;
    } else { /* converted at load: the source model's constants, which the file would hold */
        const qw_ple_w *src = b->src_layers[il].ple;
        memcpy(w->mult, src->mult, sizeof(w->mult));
        memcpy(w->prime, src->prime, (size_t)nh * sizeof(int64_t));
        memcpy(w->offset, src->offset, (size_t)nh * sizeof(int64_t));
    }
    int64_t need = 0;
    for (int64_t h = 0; h < nh; h++) {
        if (w->prime[h] <= 0 || w->offset[h] < 0 || w->prime[h] > INT64_MAX - w->offset[h]) need = -1;
        if (need >= 0 && w->offset[h] + w->prime[h] > need) need = w->offset[h] + w->prime[h];
    }
    char tn[128];
    ple_table_name(tn, sizeof(tn), li, il);
    const qw_tensor *t = gb_find(b, tn);
    int64_t rows = t && t->n_dims == 2 ? t->shape[0] : 0;
    if (need < 0 || rows < need) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT,
                       "%s: PLE layer %d: table '%s' has %lld rows; the head ranges of ple.head_offsets / "
                       "head_vocab_sizes need %lld",
                       m->path, il, tn, (long long)rows, (long long)need);
        return w;
    }
    int64_t shape[2] = {rows, dh};
    t = gb_named(b, tn, 2, shape, 1);
    if (!t) return w;
    w->chunks = gb_own(b, sizeof(qw_tensor), "the n-gram table's view");
    if (!w->chunks) return w;
    w->n_chunks = 1;
    w->chunks[0] = *t;
    w->chunk_rows = w->n_rows = rows;
    return w;
}


static void bind_layers(gbinder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int zc = qw_gguf_norm_plus_one(hp->arch);
    for (int il = 0; il < hp->n_layer && !b->st; il++) {
        qw_layer *L = &m->layers[il];
        L->kind = hp->layer_kind[il];
        L->moe = hp->layer_moe[il];
        switch (hp->arch) {
        case QW_ARCH_LLAMA:
        case QW_ARCH_QWEN3:
            L->kind = QW_LAYER_ATTN;
            L->attn_norm = gb_vec(b, QW_GT_ATTN_NORM, il, hp->n_embd, 0);
            L->ffn_norm = gb_vec(b, QW_GT_FFN_NORM, il, hp->n_embd, 0);
            bind_attn(b, il, &L->attn, hp->arch == QW_ARCH_QWEN3, 0, 0);
            bind_ffn(b, il, &L->mlp, QW_GT_FFN_GATE, QW_GT_FFN_UP, QW_GT_FFN_DOWN, hp->n_ff);
            break;
        case QW_ARCH_QWEN35:
        case QW_ARCH_QWEN35_MOE:
        case QW_ARCH_QWEN3_NEXT:
            L->attn_norm = gb_vec(b, QW_GT_ATTN_NORM, il, hp->n_embd, zc);
            L->ffn_norm = gb_vec(b, QW_GT_POST_ATTN_NORM, il, hp->n_embd, zc);
            if (L->kind == QW_LAYER_GDN)
                bind_gdn(b, il, &L->gdn);
            else
                bind_attn(b, il, &L->attn, 1, 1, 0);
            if (L->moe)
                bind_moe(b, il, &L->moe_w);
            else
                bind_ffn(b, il, &L->mlp, QW_GT_FFN_GATE, QW_GT_FFN_UP, QW_GT_FFN_DOWN, hp->n_ff);
            break;
        case QW_ARCH_QWEN4EXP:
            bind_hc(b, il, &L->hc_attn, QW_GT_HC_ATTN_NORM, QW_GT_HC_ATTN_DOWN, QW_GT_HC_ATTN_UP, QW_GT_HC_ATTN_INJECT);
            bind_hc(b, il, &L->hc_mlp, QW_GT_HC_FFN_NORM, QW_GT_HC_FFN_DOWN, QW_GT_HC_FFN_UP, QW_GT_HC_FFN_INJECT);
            if (L->kind == QW_LAYER_GDN)
                bind_gdn(b, il, &L->gdn);
            else
                bind_attn(b, il, &L->attn, 1, 1, 1);
            bind_moe(b, il, &L->moe_w);
            for (int i = 0; i < hp->n_ple; i++)
                if (hp->ple_layers[i] == il) L->ple = bind_ple(b, il, i);
            break;
        default:
            break;
        }
    }
}

/* RoPE frequencies: the default ones of the metadata, divided by rope_freqs (llama3) when present. */
/* RoPE frequencies: the default ones of the hyper-parameters, divided by rope_freqs (llama3) when present. */
static void bind_rope(gbinder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int64_t s[1] = {hp->n_rot / 2};
    const qw_tensor *rf = gb_tensor(b, QW_GT_ROPE_FREQS, 0, 1, s, 0);
    /* a checkpoint's llama3 scaling (converted at load) travels as rope_freqs too */
    qw_hparams plain = *hp;
    if (rf) plain.rope_type = QW_ROPE_DEFAULT;
    m->rope_inv_freq = gb_own(b, (size_t)(hp->n_rot / 2) * sizeof(float), "the RoPE frequencies");
    if (!m->rope_inv_freq) return;
    qw_rope_inv_freq(&plain, m->rope_inv_freq);
    if (!rf) return;
    float *f = gb_own(b, (size_t)(hp->n_rot / 2) * sizeof(float), "the RoPE frequencies");
    if (!f) return;
    qw_tensor_to_f32(rf, 0, hp->n_rot / 2, f);
    for (int k = 0; k < hp->n_rot / 2; k++) m->rope_inv_freq[k] /= f[k];
}

/* Every weight, into m->layers (allocated by the caller). */
static qwenc_status bind_model(gbinder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    m->tok_embd = gb_mat(b, QW_GT_TOKEN_EMBD, 0, hp->n_vocab, hp->n_embd);
    m->output = gb_find(b, "output.weight") ? gb_mat(b, QW_GT_OUTPUT, 0, hp->n_vocab, hp->n_embd) : m->tok_embd;
    bind_layers(b);
    if (hp->arch == QW_ARCH_QWEN4EXP)
        bind_hc(b, 0, &m->hc_final, QW_GT_HC_HEAD_NORM, QW_GT_HC_HEAD_DOWN, QW_GT_HC_HEAD_UP, QW_GT_COUNT);
    else
        m->out_norm = gb_vec(b, QW_GT_OUTPUT_NORM, 0, hp->n_embd, qw_gguf_norm_plus_one(hp->arch));
    bind_rope(b);
    return b->st;
}

qwenc_status qw_gguf_model_load(qwenc_model *m, const char *path, char *err, size_t errlen) {
    m->gguf = qw_calloc(1, sizeof(qw_gguf));
    if (!m->gguf) return qw_err_nomem(err, errlen, path, 1, sizeof(qw_gguf));
    qwenc_status st = qw_gguf_open(m->gguf, path, err, errlen);
    if (!st) st = qw_hparams_from_gguf(&m->hp, m->gguf, path, m->gguf_note, sizeof(m->gguf_note), err, errlen);
    if (st) return st;
    const qw_hparams *hp = &m->hp;
    m->prefix = "";
    gbinder b = {.m = m, .g = m->gguf, .err = err, .errlen = errlen};
    m->layers = qw_calloc((size_t)hp->n_layer, sizeof(qw_layer));
    if (!m->layers) return qw_err_nomem(err, errlen, path, (size_t)hp->n_layer, sizeof(qw_layer));
    st = bind_model(&b);
    if (st) return st;
    /* the MTP draft head sits in blocks n_layer.. (nextn_predict_layers) */
    for (int64_t i = 0; i < m->gguf->n_tensors; i++) {
        int il = -1;
        const qw_gguf_tensor *t = &m->gguf->tensors[i];
        if (sscanf(t->name, "blk.%d.", &il) == 1 && il >= hp->n_layer) {
            m->n_mtp_tensors++;
            m->n_mtp_params += qw_tensor_nelem(&t->t);
        }
    }
    return QWENC_OK;
}

qwenc_status qw_gguf_bind_converted(qwenc_model *m, char *err, size_t errlen) {
    qw_layer *src = m->layers; /* the source's bindings: their buffers stay owned by m until it is freed */
    memset(&m->hc_final, 0, sizeof(m->hc_final));
    m->out_norm = NULL;
    m->layers = qw_calloc((size_t)m->hp.n_layer, sizeof(qw_layer));
    if (!m->layers) {
        m->layers = src;
        return qw_err_nomem(err, errlen, m->path, (size_t)m->hp.n_layer, sizeof(qw_layer));
    }
    gbinder b = {.m = m, .g = NULL, .src_layers = src, .err = err, .errlen = errlen};
    qwenc_status st = bind_model(&b);
    free(src);
    return st;
}
