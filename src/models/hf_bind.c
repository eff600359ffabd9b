/*
 * hf_bind.c - the checkpoint io of the binder (bind.h): a Hugging Face directory's tensors found by their
 * checkpoint names (the role table, gguf_map.c), shapes and dtypes checked, matrices held as views into the
 * mapped safetensors, vectors copied to f32. Every failure names the tensor, the expected and the found
 * shape, and the file.
 *
 * Layouts accepted (transformers 5.17 conversion_mapping + official checkpoints):
 *   prefix "model." or "model.language_model." (resolved once into m->prefix, written '~' here);
 *   routed experts per expert (mlp.experts.{e}.{gate,up,down}_proj.weight) or fused
 *   (mlp.experts.gate_up_proj [E, 2I, H], gate rows first, and mlp.experts.down_proj [E, H, I]);
 *   DeltaNet input projections split (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) or fused per key head
 *   (qwen3_next: in_proj_qkvz, in_proj_ba);
 *   the PLE n-gram table as one tensor or as shards, its hash buffers (optional) checked against the config.
 *   the MTP draft head (mtp.*: its own tensors, and its decoder layer mtp.layers.0 bound as layer n_layer),
 *   when its layer is there (mtp.layers.0.self_attn.o_proj.weight) and not declined (no_draft_head).
 * Not bound: the vision tower (model.visual.*, counted).
 */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "blocks/blocks.h"
#include "models/bind.h"

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* A tensor name from fmt; a leading '~' is replaced by the model's prefix ("model." ...), and "~layers.<il>." of
 * the draft head's layer (il >= n_layer) by "mtp.layers.<il - n_layer>.". */
static const char *vname(qw_binder *b, const char *fmt, va_list ap) {
    char tmp[256];
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    int il, at = 0;
    if (sscanf(tmp, "~layers.%d.%n", &il, &at) == 1 && at > 0 && il >= b->m->hp.n_layer)
        snprintf(b->name, sizeof(b->name), "mtp.layers.%d.%s", il - b->m->hp.n_layer, tmp + at);
    else if (tmp[0] == '~')
        snprintf(b->name, sizeof(b->name), "%s%s", b->m->prefix, tmp + 1);
    else
        snprintf(b->name, sizeof(b->name), "%s", tmp);
    return b->name;
}

static const char *name_of(qw_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *name_of(qw_binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vname(b, fmt, ap);
    va_end(ap);
    return b->name;
}

/* The checkpoint name of role at layer il, in b->name. */
static const char *role_name(qw_binder *b, qw_gt role, int il) {
    const qw_gt_info *gi = qw_gt_info_of(role);
    QW_ASSERT(gi->hf);
    return gi->per_layer && !starts_with(gi->hf, "mtp.") ? name_of(b, "~layers.%d.%s", il, gi->hf)
                                                          : name_of(b, "%s", gi->hf);
}

static const qw_tensor *find(qw_binder *b, const char *name) { return qw_weightset_find(&b->m->ws, name); }

/* The float tensor `name` of the given shape. */
static const qw_tensor *tensor(qw_binder *b, int n_dims, const int64_t *shape, const char *name) {
    if (b->st) return NULL;
    const qw_tensor *t = find(b, name);
    if (!t) {
        qw_bind_fail(b, QWENC_ERR_FORMAT, "%s: tensor '%s' is missing from the checkpoint", b->m->path, name);
        return NULL;
    }
    int ok = t->n_dims == n_dims;
    for (int i = 0; ok && i < n_dims; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        qw_tensor want = {.n_dims = n_dims};
        for (int i = 0; i < n_dims; i++) want.shape[i] = shape[i];
        char s1[96], s2[96];
        qw_bind_fail(b, QWENC_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s",
                     qw_weightset_file_of(&b->m->ws, t), name, qw_shape_str(t, s1, sizeof(s1)),
                     qw_shape_str(&want, s2, sizeof(s2)));
        return NULL;
    }
    if (t->type != QW_TYPE_F32 && t->type != QW_TYPE_F16 && t->type != QW_TYPE_BF16) {
        qw_bind_fail(b, QWENC_ERR_UNSUPPORTED,
                     "%s: tensor '%s' has dtype %s; safetensors weights must be F32, F16 or BF16",
                     qw_weightset_file_of(&b->m->ws, t), name, qw_type_name(t->type));
        return NULL;
    }
    return t;
}

static const qw_tensor *matrix(qw_binder *b, int64_t d0, int64_t d1, const char *name) {
    int64_t shape[2] = {d0, d1};
    return tensor(b, 2, shape, name);
}

static int hf_has(qw_binder *b, qw_gt role, int il) { return find(b, role_name(b, role, il)) != NULL; }

static void hf_mat(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot) {
    *slot = matrix(b, d0, d1, role_name(b, role, il));
}

/* [d0] or a depthwise conv kernel [d0, 1, d1], copied to f32; A_log becomes -exp(A_log). */
static void hf_vec(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, float **slot) {
    int64_t shape[3] = {d0, 1, d1}, n = d0 * (d1 ? d1 : 1);
    const char *name = role_name(b, role, il);
    const qw_tensor *t = d1 ? tensor(b, 3, shape, name) : tensor(b, 1, shape, name);
    float *v = t ? qw_bind_f32(b, n, t->name) : NULL;
    if (!v) return;
    qw_tensor_to_f32(t, 0, n, v);
    if (qw_gt_info_of(role)->xf & QW_XF_NEG_EXP)
        for (int64_t j = 0; j < n; j++) v[j] = -expf(v[j]);
    *slot = v;
}

static void hf_indexer(qw_binder *b, int il, int64_t nq, int64_t nk, qw_attn_w *w) {
    const char *name = name_of(b, "~layers.%d.self_attn.indexer.index_qk_proj.weight", il);
    w->idx_qk = matrix(b, nq + nk, b->m->hp.n_embd, name);
}

static void hf_gdn_in(qw_binder *b, int il, qw_gdn_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    int64_t ch = 2 * kd + vd, hv = hp->gdn_hv;
    const char *qkvz = name_of(b, "~layers.%d.linear_attn.in_proj_qkvz.weight", il);
    if (find(b, qkvz)) { /* qwen3_next: fused per key head [q_g | k_g | v_g | z_g], [b_g | a_g] */
        w->qkvz = matrix(b, ch + vd, H, qkvz);
        hf_mat(b, QW_GT_SSM_BA, il, 2 * hv, H, &w->ba);
        return;
    }
    hf_mat(b, QW_GT_SSM_QKV, il, ch, H, &w->qkv);
    hf_mat(b, QW_GT_SSM_GATE, il, vd, H, &w->z);
    hf_mat(b, QW_GT_SSM_BETA, il, hv, H, &w->b);
    hf_mat(b, QW_GT_SSM_ALPHA, il, hv, H, &w->a);
}

static void hf_experts(qw_binder *b, int il, qw_moe_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t E = hp->n_expert, I = hp->n_ff_exp, H = hp->n_embd;
    w->experts = qw_bind_own(b, (size_t)E * sizeof(qw_ffn_w), "the experts' views");
    if (!w->experts) return;
    if (find(b, name_of(b, "~layers.%d.mlp.experts.gate_up_proj", il))) {
        int64_t s_gu[3] = {E, 2 * I, H}, s_d[3] = {E, H, I};
        const qw_tensor *gu = tensor(b, 3, s_gu, b->name);
        const qw_tensor *dn = tensor(b, 3, s_d, name_of(b, "~layers.%d.mlp.experts.down_proj", il));
        if (b->st) return;
        for (int64_t e = 0; e < E; e++) {
            w->experts[e].gate = qw_tensor_rows(gu, e * 2 * I, I, H);
            w->experts[e].up = qw_tensor_rows(gu, e * 2 * I + I, I, H);
            w->experts[e].down = qw_tensor_rows(dn, e * H, H, I);
        }
        return;
    }
    for (int64_t e = 0; e < E && !b->st; e++) {
        const char *fmt[3] = {"~layers.%d.mlp.experts.%lld.gate_proj.weight",
                              "~layers.%d.mlp.experts.%lld.up_proj.weight",
                              "~layers.%d.mlp.experts.%lld.down_proj.weight"};
        qw_tensor *dst[3] = {&w->experts[e].gate, &w->experts[e].up, &w->experts[e].down};
        for (int k = 0; k < 3; k++) {
            const qw_tensor *t = matrix(b, k < 2 ? I : H, k < 2 ? H : I, name_of(b, fmt[k], il, (long long)e));
            if (t) *dst[k] = *t;
        }
    }
}

/* Compare a stored I64 buffer with the value qwenc derives from the config. */
static void check_i64(qw_binder *b, const char *name, const int64_t *want, int n) {
    if (b->st) return;
    const qw_tensor *t = find(b, name);
    if (!t) return; /* the buffers are optional: qwenc derives them */
    if (t->type != QW_TYPE_I64 || t->n_dims != 1 || t->shape[0] != n) {
        qw_bind_fail(b, QWENC_ERR_FORMAT, "%s: tensor '%s' should be I64 [%d]", qw_weightset_file_of(&b->m->ws, t),
                     name, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)t->data + 8 * i, 8);
        if (v != want[i]) {
            qw_bind_fail(b, QWENC_ERR_FORMAT,
                         "%s: tensor '%s'[%d] = %lld but the config gives %lld (ngram_vocab_size_base, seed, "
                         "vocab_size or ple_layer_ids disagree with the checkpoint)",
                         qw_weightset_file_of(&b->m->ws, t), name, i, (long long)v, (long long)want[i]);
            return;
        }
    }
}

/* The hash constants from the config (checked against the checkpoint's buffers), the table as one tensor or as
 * shards concatenated in numeric order (torch.chunk: equal pieces, the last shorter). */
static void hf_ple_table(qw_binder *b, int il, int li, qw_ple_w **slot) {
    const qw_hparams *hp = &b->m->hp;
    int64_t nh = hp->ngram_heads, dh = hp->ple_dim / nh;
    qw_ple_w *w = qw_bind_ple_new(b, li, slot);
    if (!w) return;
    qw_ple_constants(hp, li, w->mult, w->prime, w->offset, &w->n_rows);
    int64_t mult[8];
    for (int i = 0; i < hp->ngram_n; i++) mult[i] = (int64_t)w->mult[i];
    check_i64(b, name_of(b, "~layers.%d.ple.ple_embedding.layer_multipliers", il), mult, hp->ngram_n);
    check_i64(b, name_of(b, "~layers.%d.ple.ple_embedding.ngram_heads_vocab_sizes", il), w->prime, (int)nh);
    check_i64(b, name_of(b, "~layers.%d.ple.ple_embedding.ngram_heads_offsets", il), w->offset, (int)nh);
    if (b->st) return;

    if (find(b, name_of(b, "~layers.%d.ple.ple_embedding.ngram_embedding.weight", il))) {
        w->chunks = qw_bind_own(b, sizeof(qw_tensor), "the n-gram table's view");
        if (!w->chunks) return;
        w->n_chunks = 1;
        const qw_tensor *t = matrix(b, w->n_rows, dh, b->name);
        if (t) w->chunks[0] = *t;
        w->chunk_rows = w->n_rows;
        return;
    }
    int n = 0;
    while (find(b, name_of(b, "~layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", il, n))) n++;
    if (n == 0) {
        qw_bind_fail(b, QWENC_ERR_FORMAT,
                     "%s: tensor '%s' is missing from the checkpoint (nor are there shard_0.. pieces)", b->m->path,
                     name_of(b, "~layers.%d.ple.ple_embedding.ngram_embedding.weight", il));
        return;
    }
    w->chunks = qw_bind_own(b, (size_t)n * sizeof(qw_tensor), "the n-gram table shards' views");
    if (!w->chunks) return;
    w->n_chunks = n;
    int64_t total = 0;
    for (int i = 0; i < n && !b->st; i++) {
        const qw_tensor *t = find(b, name_of(b, "~layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", il, i));
        int64_t rows = t->n_dims == 2 ? t->shape[0] : -1;
        if (i == 0) w->chunk_rows = rows;
        if (rows <= 0 || (i < n - 1 && rows != w->chunk_rows) || rows > w->chunk_rows) {
            qw_bind_fail(b, QWENC_ERR_FORMAT,
                         "%s: n-gram table shard '%s' has %lld rows; every shard but the last must have %lld "
                         "and the last no more",
                         b->m->path, t->name, (long long)rows, (long long)w->chunk_rows);
            break;
        }
        const qw_tensor *v = matrix(b, rows, dh, t->name);
        if (v) w->chunks[i] = *v;
        total += rows;
    }
    if (!b->st && total != w->n_rows)
        qw_bind_fail(b, QWENC_ERR_FORMAT,
                     "%s: the %d n-gram table shards of layer %d hold %lld rows; the config implies %lld",
                     b->m->path, n, il, (long long)total, (long long)w->n_rows);
}

/* The frequencies of the config's RoPE (default, linear or llama3 scaling). */
static void hf_rope(qw_binder *b) {
    const qw_hparams *hp = &b->m->hp;
    b->m->rope_inv_freq = qw_bind_f32(b, hp->n_rot / 2, "the RoPE frequencies");
    if (b->m->rope_inv_freq) qw_rope_inv_freq(hp, b->m->rope_inv_freq);
}

static const qw_bind_io hf_io = {
    .has = hf_has,
    .mat = hf_mat,
    .vec = hf_vec,
    .indexer = hf_indexer,
    .gdn_in = hf_gdn_in,
    .experts = hf_experts,
    .ple_table = hf_ple_table,
    .rope = hf_rope,
};

qwenc_status qw_hf_model_load(qwenc_model *m, const char *path, char *err, size_t errlen) {
    qwenc_status st = qw_hparams_load(&m->hp, path, err, errlen);
    if (!st) st = qw_weightset_open_dir(&m->ws, path, err, errlen);
    if (st) return st;
    m->prefix = qw_weightset_find(&m->ws, "model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                                       : "model.";
    m->hp.n_mtp = !m->params.no_draft_head && qw_weightset_find(&m->ws, "mtp.layers.0.self_attn.o_proj.weight");
    qw_binder b = {.m = m, .io = &hf_io, .err = err, .errlen = errlen};
    st = qw_bind_model(&b);
    if (st) return st;
    for (int i = 0; i < m->ws.n_entries; i++) {
        const qw_tensor *t = &m->ws.entries[i].t;
        if (starts_with(t->name, "mtp.")) {
            m->n_mtp_tensors++;
            m->n_mtp_params += qw_tensor_nelem(t);
        } else if (starts_with(t->name, "model.visual.")) {
            m->n_ignored_tensors++;
        }
    }
    return QWENC_OK;
}
