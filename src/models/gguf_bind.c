/*
 * gguf_bind.c - the GGUF io of the binder (bind.h): a llama.cpp GGUF (llama, qwen3, qwen35, qwen35moe,
 * qwen3next, qwen4exp) bound into the same qw_layer structs a checkpoint fills, so the forward is the same
 * for both.
 *
 * Matrices are views into the mapped file, of any type the kernels read (F32, F16, BF16 and the block
 * types of tensor/quant.h). The converter's transformations (the role table, gguf_map.c; docs/GGUF.md) are
 * undone here:
 *   norms stored as 1 + w     -> w (f32 copies, as the checkpoint path makes)
 *   A stored as -exp(A_log)   -> used as is (qw_gdn_w.neg_exp_a is that value)
 *   conv [ch, K] (squeezed)   -> the f32 copy [ch][K]
 *   tiled value heads         -> views kept; qw_gdn_w.v_tiled tells gdn.c the order
 *   llama q/k permutation     -> views kept; qw_attn_w.rope_interleaved tells attn.c
 *   attn_qkv (--fuse-qkv)     -> three row views
 *   indexer q_proj + k_proj   -> one [(ni+1)*ihd, H] matrix (a view when adjacent in the file, else a copy)
 *   qwen3next ssm_ba          -> b and a rows gathered into two small copies
 *   stacked experts [E, I, H] -> one view per expert (ffn_gate_up_exps, --fuse-gate-up-exps, too)
 *   llama3 rope_freqs         -> divides the default inverse frequencies
 *   PLE hash constants        -> read from the metadata (the tables name the layers)
 * Every failure names the file, the tensor, the shape expected and the shape found.
 *
 * The same binding serves a model quantized at load (--quant, models/load_quant.c): its tensors are those of
 * the GGUF qwenc quantize would write, held in memory (qw_converted), so the two bind identically.
 */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "blocks/blocks.h"
#include "models/bind.h"

typedef struct {
    const qw_gguf *g;           /* the file, or NULL: the tensors of m->conv */
    const qw_layer *src_layers; /* m->conv: the layers bound from the source (PLE hash constants) */
} gguf_src;

int qw_path_is_gguf(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static const gguf_src *src_of(const qw_binder *b) { return b->ctx; }

/* The tensor of that name in the file or in the converted tensors, or NULL. */
static const qw_tensor *find(const qw_binder *b, const char *name) {
    if (src_of(b)->g) return qw_gguf_find(src_of(b)->g, name);
    const qw_converted *c = b->m->conv;
    for (int i = 0; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i].name, name)) return &c->tensors[i];
    return NULL;
}

static const char *shape_str(int n_dims, const int64_t *shape, char *buf, size_t n) {
    qw_tensor t = {.n_dims = n_dims};
    for (int i = 0; i < n_dims; i++) t.shape[i] = shape[i];
    return qw_shape_str(&t, buf, n);
}

/* The tensor `name` with the given shape (PyTorch order). Size-1 leading dimensions may be absent or present
 * (the converter writes the shared-expert gate as [1, H], other tools as [H]). */
static const qw_tensor *named(qw_binder *b, const char *name, int n_dims, const int64_t *shape, int required) {
    if (b->st) return NULL;
    const qw_tensor *t = find(b, name);
    if (!t) {
        if (required) qw_bind_fail(b, QWENC_ERR_FORMAT, "%s: tensor '%s' is missing", b->m->path, name);
        return NULL;
    }
    int i = 0, j = 0, ok = 1;
    while (i < t->n_dims && t->shape[i] == 1 && t->n_dims - i > n_dims) i++;
    while (j < n_dims && shape[j] == 1 && n_dims - j > t->n_dims - i) j++;
    if (t->n_dims - i != n_dims - j) ok = 0;
    for (; ok && i < t->n_dims; i++, j++) ok = t->shape[i] == shape[j];
    if (!ok) {
        char s1[96], s2[96];
        qw_bind_fail(b, QWENC_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", b->m->path, name,
                     qw_shape_str(t, s1, sizeof(s1)), shape_str(n_dims, shape, s2, sizeof(s2)));
        return NULL;
    }
    if (!qw_type_traits_of(t->type)->to_float) {
        qw_bind_fail(b, QWENC_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qwenc does not read", b->m->path,
                     name, qw_type_name(t->type));
        return NULL;
    }
    return t;
}

static const qw_tensor *role_tensor(qw_binder *b, qw_gt role, int il, int n_dims, const int64_t *shape, int required) {
    char name[128];
    return named(b, qw_gt_name(name, sizeof(name), role, il), n_dims, shape, required);
}

static int gguf_has(qw_binder *b, qw_gt role, int il) {
    char name[128];
    return find(b, qw_gt_name(name, sizeof(name), role, il)) != NULL;
}

static void gguf_mat(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot) {
    int64_t s[2] = {d0, d1};
    *slot = role_tensor(b, role, il, 2, s, 1);
}

/* A vector [d0] as an f32 copy (a norm stored as 1 + w back to w), or a depthwise conv kernel [d0, d1] (or
 * unsqueezed [d0, 1, d1]) as the f32 copy [d0][d1]. */
static void gguf_vec(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, float **slot) {
    int64_t s[3] = {d0, d1, 0}, n = d0 * (d1 ? d1 : 1);
    const qw_tensor *t = role_tensor(b, role, il, d1 ? 2 : 1, s, d1 == 0);
    if (d1 && !t && !b->st) {
        int64_t s3[3] = {d0, 1, d1};
        t = role_tensor(b, role, il, 3, s3, 1);
    }
    float *v = t ? qw_bind_f32(b, n, t->name) : NULL;
    if (!v) return;
    qw_tensor_to_f32(t, 0, n, v);
    if ((qw_gt_info_of(role)->xf & QW_XF_NORM) && qw_arch_has(b->m->hp.arch, QW_AF_NORM_PLUS_ONE))
        for (int64_t i = 0; i < n; i++) v[i] -= 1.0f;
    *slot = v;
}

/* A new tensor made of rows of src (raw bytes, type kept): rows[i] for i < n. */
static const qw_tensor *gather_rows(qw_binder *b, const qw_tensor *src, const int64_t *rows, int64_t n,
                                   const char *name) {
    int64_t len = qw_tensor_row_len(src);
    size_t rs = qw_type_row_size(src->type, len);
    uint8_t *data = qw_bind_own(b, (size_t)n * rs, name);
    qw_tensor *t = qw_bind_own(b, sizeof(qw_tensor), name);
    char *nm = qw_bind_own(b, strlen(name) + 1, name);
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

/* attn_q, attn_k, attn_v, or convert_hf_to_gguf --fuse-qkv's one attn_qkv [q | k | v], bound as three row views */
static void gguf_attn_qkv(qw_binder *b, int il, int64_t nq, int64_t nkv, qw_attn_w *w) {
    int64_t H = b->m->hp.n_embd;
    if (!gguf_has(b, QW_GT_ATTN_Q, il)) {
        int64_t s[2] = {nq + 2 * nkv, H};
        const qw_tensor *qkv = role_tensor(b, QW_GT_SSM_QKV, il, 2, s, 0); /* the same name: attn_qkv */
        qw_tensor *v = qkv ? qw_bind_own(b, 3 * sizeof(qw_tensor), "the q, k, v views") : NULL;
        if (v) {
            v[0] = qw_tensor_rows(qkv, 0, nq, H);
            v[1] = qw_tensor_rows(qkv, nq, nkv, H);
            v[2] = qw_tensor_rows(qkv, nq + nkv, nkv, H);
            w->wq = &v[0], w->wk = &v[1], w->wv = &v[2];
            return;
        }
    }
    gguf_mat(b, QW_GT_ATTN_Q, il, nq, H, &w->wq);
    gguf_mat(b, QW_GT_ATTN_K, il, nkv, H, &w->wk);
    gguf_mat(b, QW_GT_ATTN_V, il, nkv, H, &w->wv);
}

/* indexer.py: one projection [(ni+1)*ihd, H], queries first */
static void gguf_indexer(qw_binder *b, int il, int64_t nq, int64_t nk, qw_attn_w *w) {
    int64_t H = b->m->hp.n_embd;
    const qw_tensor *q, *k;
    gguf_mat(b, QW_GT_INDEXER_Q, il, nq, H, &q);
    gguf_mat(b, QW_GT_INDEXER_K, il, nk, H, &k);
    if (b->st) return;
    qw_tensor *t = qw_bind_own(b, sizeof(qw_tensor), "the indexer's view");
    if (!t) return;
    *t = *q;
    t->shape[0] = nq + nk;
    size_t qb = qw_type_row_size(q->type, nq * H);
    if (k->type == q->type && (const uint8_t *)k->data == (const uint8_t *)q->data + qb) {
        w->idx_qk = t; /* adjacent in the file: one view */
        return;
    }
    if (k->type == q->type) {
        uint8_t *d = qw_bind_own(b, qb + qw_type_row_size(k->type, nk * H), "the indexer's q and k rows");
        if (!d) return;
        memcpy(d, q->data, qb);
        memcpy(d + qb, k->data, qw_type_row_size(k->type, nk * H));
        t->data = d;
    } else {
        float *d = qw_bind_own(b, (size_t)((nq + nk) * H) * sizeof(float), "the indexer's q and k rows");
        if (!d) return;
        qw_tensor_to_f32(q, 0, nq * H, d);
        qw_tensor_to_f32(k, 0, nk * H, d + nq * H);
        t->data = d;
        t->type = QW_TYPE_F32;
    }
    w->idx_qk = t;
}

static void gguf_gdn_in(qw_binder *b, int il, qw_gdn_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    int64_t hv = hp->gdn_hv;
    gguf_mat(b, QW_GT_SSM_QKV, il, 2 * kd + vd, H, &w->qkv);
    gguf_mat(b, QW_GT_SSM_GATE, il, vd, H, &w->z);
    if (!qw_arch_has(hp->arch, QW_AF_SSM_BA)) {
        gguf_mat(b, QW_GT_SSM_BETA, il, hv, H, &w->b);
        gguf_mat(b, QW_GT_SSM_ALPHA, il, hv, H, &w->a);
        return;
    }
    /* ssm_ba rows per key head g: [b of its r value heads | a of them] */
    const qw_tensor *ba;
    gguf_mat(b, QW_GT_SSM_BA, il, 2 * hv, H, &ba);
    int r = hp->gdn_hv / hp->gdn_hk;
    int64_t *rb = qw_bind_own(b, (size_t)hv * sizeof(int64_t), "the ssm_ba row map");
    int64_t *ra = qw_bind_own(b, (size_t)hv * sizeof(int64_t), "the ssm_ba row map");
    if (b->st) return;
    for (int64_t j = 0; j < hv; j++) {
        rb[j] = (j / r) * 2 * r + j % r;
        ra[j] = rb[j] + r;
    }
    w->b = gather_rows(b, ba, rb, hv, "ssm_ba (beta rows)");
    w->a = gather_rows(b, ba, ra, hv, "ssm_ba (alpha rows)");
}

static void gguf_experts(qw_binder *b, int il, qw_moe_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t E = hp->n_expert, I = hp->n_ff_exp, H = hp->n_embd;
    w->experts = qw_bind_own(b, (size_t)E * sizeof(qw_ffn_w), "the experts' views");
    if (!w->experts) return;
    int64_t s_gu[3] = {E, 2 * I, H}, s_e[3] = {E, I, H}, s_d[3] = {E, H, I};
    char fused[96];
    snprintf(fused, sizeof(fused), "blk.%d.ffn_gate_up_exps.weight", il); /* convert_hf_to_gguf --fuse-gate-up-exps */
    const qw_tensor *gu = named(b, fused, 3, s_gu, 0), *gt = NULL, *ut = NULL;
    if (!gu) {
        gt = role_tensor(b, QW_GT_FFN_GATE_EXPS, il, 3, s_e, 1);
        ut = role_tensor(b, QW_GT_FFN_UP_EXPS, il, 3, s_e, 1);
    }
    const qw_tensor *dt = role_tensor(b, QW_GT_FFN_DOWN_EXPS, il, 3, s_d, 1);
    if (b->st) return;
    for (int64_t e = 0; e < E; e++) {
        w->experts[e].gate = gu ? qw_tensor_rows(gu, e * 2 * I, I, H) : qw_tensor_rows(gt, e * I, I, H);
        w->experts[e].up = gu ? qw_tensor_rows(gu, e * 2 * I + I, I, H) : qw_tensor_rows(ut, e * I, I, H);
        w->experts[e].down = qw_tensor_rows(dt, e * H, H, I);
    }
}

/* The hash constants of the li-th PLE layer (layer il) from the metadata: one set per PLE layer, concatenated in
 * layer order (llama.cpp reads the first). */
static void ple_hash_from_file(qw_binder *b, const qw_gguf *g, qw_ple_w *w, int il, int li) {
    const qw_hparams *hp = &b->m->hp;
    int64_t nh = hp->ngram_heads;
    char key[128];
    const qw_gguf_kv *mu = qw_gguf_find_kv(g, qw_gguf_key(key, sizeof(key), hp->arch, "ple.layer_multipliers"));
    const qw_gguf_kv *of = qw_gguf_find_kv(g, qw_gguf_key(key, sizeof(key), hp->arch, "ple.head_offsets"));
    const qw_gguf_kv *vs = qw_gguf_find_kv(g, qw_gguf_key(key, sizeof(key), hp->arch, "ple.head_vocab_sizes"));
    uint64_t n = (uint64_t)hp->ngram_n;
    if (!mu || !of || !vs || mu->n < (li + 1) * n || of->n < (li + 1) * (uint64_t)nh || vs->n < (li + 1) * (uint64_t)nh) {
        qw_bind_fail(b, QWENC_ERR_FORMAT,
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

static void gguf_ple_table(qw_binder *b, int il, int li, qw_ple_w **slot) {
    const qw_hparams *hp = &b->m->hp;
    int64_t nh = hp->ngram_heads, dh = hp->ple_dim / nh;
    qw_ple_w *w = qw_bind_ple_new(b, li, slot);
    if (!w) return;
    if (src_of(b)->g) {
        ple_hash_from_file(b, src_of(b)->g, w, il, li);
        if (b->st) return;
    } else { /* converted at load: the source model's constants, which the file would hold */
        const qw_ple_w *src = src_of(b)->src_layers[il].ple;
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
    qw_gguf_ple_table_name(tn, sizeof(tn), li, il);
    const qw_tensor *t = find(b, tn);
    int64_t rows = t && t->n_dims == 2 ? t->shape[0] : 0;
    if (need < 0 || rows < need) {
        qw_bind_fail(b, QWENC_ERR_FORMAT,
                     "%s: PLE layer %d: table '%s' has %lld rows; the head ranges of ple.head_offsets / "
                     "head_vocab_sizes need %lld",
                     b->m->path, il, tn, (long long)rows, (long long)need);
        return;
    }
    int64_t shape[2] = {rows, dh};
    t = named(b, tn, 2, shape, 1);
    if (!t) return;
    w->chunks = qw_bind_own(b, sizeof(qw_tensor), "the n-gram table's view");
    if (!w->chunks) return;
    w->n_chunks = 1;
    w->chunks[0] = *t;
    w->chunk_rows = w->n_rows = rows;
}

/* RoPE frequencies: the default ones of the hyper-parameters, divided by rope_freqs (llama3) when present. */
static void gguf_rope(qw_binder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int64_t s[1] = {hp->n_rot / 2};
    const qw_tensor *rf = role_tensor(b, QW_GT_ROPE_FREQS, -1, 1, s, 0);
    /* a checkpoint's llama3 scaling (converted at load) travels as rope_freqs too */
    qw_hparams plain = *hp;
    if (rf) plain.rope_type = QW_ROPE_DEFAULT;
    m->rope_inv_freq = qw_bind_f32(b, hp->n_rot / 2, "the RoPE frequencies");
    if (!m->rope_inv_freq) return;
    qw_rope_inv_freq(&plain, m->rope_inv_freq);
    if (!rf) return;
    float *f = qw_bind_f32(b, hp->n_rot / 2, "the RoPE frequencies");
    if (!f) return;
    qw_tensor_to_f32(rf, 0, hp->n_rot / 2, f);
    for (int k = 0; k < hp->n_rot / 2; k++) m->rope_inv_freq[k] /= f[k];
}

static const qw_bind_io gguf_io = {
    .file_layout = 1,
    .has = gguf_has,
    .mat = gguf_mat,
    .vec = gguf_vec,
    .attn_qkv = gguf_attn_qkv,
    .indexer = gguf_indexer,
    .gdn_in = gguf_gdn_in,
    .experts = gguf_experts,
    .ple_table = gguf_ple_table,
    .rope = gguf_rope,
};

qwenc_status qw_gguf_model_load(qwenc_model *m, const char *path, char *err, size_t errlen) {
    m->gguf = qw_calloc(1, sizeof(qw_gguf));
    if (!m->gguf) return qw_err_nomem(err, errlen, path, 1, sizeof(qw_gguf));
    qwenc_status st = qw_gguf_open(m->gguf, path, err, errlen);
    if (!st) st = qw_hparams_from_gguf(&m->hp, m->gguf, path, m->gguf_note, sizeof(m->gguf_note), err, errlen);
    if (st) return st;
    m->prefix = "";
    gguf_src src = {.g = m->gguf};
    qw_binder b = {.m = m, .io = &gguf_io, .ctx = &src, .err = err, .errlen = errlen};
    st = qw_bind_model(&b);
    if (st) return st;
    /* the MTP draft head sits in blocks n_layer.. (nextn_predict_layers) */
    for (int64_t i = 0; i < m->gguf->n_tensors; i++) {
        int il = -1;
        const qw_gguf_tensor *t = &m->gguf->tensors[i];
        if (sscanf(t->name, "blk.%d.", &il) == 1 && il >= m->hp.n_layer) {
            m->n_mtp_tensors++;
            m->n_mtp_params += qw_tensor_nelem(&t->t);
        }
    }
    return QWENC_OK;
}

qwenc_status qw_gguf_bind_converted(qwenc_model *m, char *err, size_t errlen) {
    qw_layer *layers = m->layers; /* the source's bindings: their buffers stay owned by m until it is freed */
    memset(&m->hc_final, 0, sizeof(m->hc_final));
    m->out_norm = NULL;
    m->layers = NULL;
    gguf_src src = {.g = NULL, .src_layers = layers};
    qw_binder b = {.m = m, .io = &gguf_io, .ctx = &src, .err = err, .errlen = errlen};
    qwenc_status st = qw_bind_model(&b);
    free(layers);
    return st;
}
