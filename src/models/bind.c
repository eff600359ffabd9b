/*
 * bind.c - find the checkpoint tensors a model needs, check their shapes and dtypes, and hold views of
 * them (see model.h). Every failure names the tensor, the expected and the found shape, and the file.
 *
 * Layouts accepted (transformers 5.17 conversion_mapping + official checkpoints):
 *   prefix "model." or "model.language_model." (resolved once into m->prefix, written '~' here);
 *   routed experts per expert (mlp.experts.{e}.{gate,up,down}_proj.weight) or fused
 *   (mlp.experts.gate_up_proj [E, 2I, H], gate rows first, and mlp.experts.down_proj [E, H, I]).
 */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "models/model.h"

static const char *vname(qw_binder *b, const char *fmt, va_list ap) {
    char tmp[256];
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    if (tmp[0] == '~')
        snprintf(b->name, sizeof(b->name), "%s%s", b->m->prefix, tmp + 1);
    else
        snprintf(b->name, sizeof(b->name), "%s", tmp);
    return b->name;
}

const char *qw_bind_name(qw_binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vname(b, fmt, ap);
    va_end(ap);
    return b->name;
}

int qw_bind_has(qw_binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vname(b, fmt, ap);
    va_end(ap);
    return qw_weightset_find(&b->m->ws, b->name) != NULL;
}

void *qw_model_own(qwenc_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **no = qw_realloc(m->owned, (size_t)cap, sizeof(void *));
        if (!no) return NULL;
        m->owned = no;
        m->cap_owned = cap;
    }
    void *p = qw_calloc(bytes, 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

float *qw_model_own_f32(qwenc_model *m, int64_t n) { return qw_model_own(m, (size_t)n * sizeof(float)); }

void *qw_bind_own(qw_binder *b, size_t bytes, const char *what) {
    if (b->st) return NULL;
    void *p = qw_model_own(b->m, bytes);
    if (!p) {
        char w[320];
        snprintf(w, sizeof(w), "%s: %s", b->m->path, what);
        b->st = qw_err_nomem(b->err, b->errlen, w, bytes, 1);
    }
    return p;
}

const qw_tensor *qw_bind_tensor(qw_binder *b, int n_dims, const int64_t *shape, const char *name) {
    if (b->st) return NULL;
    const qw_tensor *t = qw_weightset_find(&b->m->ws, name);
    if (!t) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' is missing from the checkpoint",
                       b->m->path, name);
        return NULL;
    }
    int ok = t->n_dims == n_dims;
    for (int i = 0; ok && i < n_dims; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        qw_tensor want = {.n_dims = n_dims};
        for (int i = 0; i < n_dims; i++) want.shape[i] = shape[i];
        char s1[96], s2[96];
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s",
                       qw_weightset_file_of(&b->m->ws, t), name, qw_shape_str(t, s1, sizeof(s1)),
                       qw_shape_str(&want, s2, sizeof(s2)));
        return NULL;
    }
    if (t->type != QW_TYPE_F32 && t->type != QW_TYPE_F16 && t->type != QW_TYPE_BF16) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has dtype %s; safetensors weights must be F32, F16 or BF16",
                       qw_weightset_file_of(&b->m->ws, t), name, qw_type_name(t->type));
        return NULL;
    }
    return t;
}

const qw_tensor *qw_bind_mat(qw_binder *b, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (b->st) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vname(b, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {d0, d1};
    return qw_bind_tensor(b, 2, shape, b->name);
}

float *qw_bind_vec(qw_binder *b, int64_t n, const char *fmt, ...) {
    if (b->st) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vname(b, fmt, ap);
    va_end(ap);
    int64_t shape[1] = {n};
    const qw_tensor *t = qw_bind_tensor(b, 1, shape, b->name);
    if (!t) return NULL;
    float *v = qw_bind_own(b, (size_t)n * sizeof(float), b->name);
    if (v) qw_tensor_to_f32(t, 0, n, v);
    return v;
}

float *qw_bind_conv(qw_binder *b, int64_t ch, int64_t k, const char *fmt, ...) {
    if (b->st) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vname(b, fmt, ap);
    va_end(ap);
    int64_t shape[3] = {ch, 1, k};
    const qw_tensor *t = qw_bind_tensor(b, 3, shape, b->name);
    if (!t) return NULL;
    float *v = qw_bind_own(b, (size_t)(ch * k) * sizeof(float), b->name);
    if (v) qw_tensor_to_f32(t, 0, ch * k, v);
    return v;
}

static void bind_ffn(qw_binder *b, qw_ffn_w *w, int64_t n_ff, int64_t h, const char *base) {
    const qw_tensor *g = qw_bind_mat(b, n_ff, h, "%s.gate_proj.weight", base);
    const qw_tensor *u = qw_bind_mat(b, n_ff, h, "%s.up_proj.weight", base);
    const qw_tensor *d = qw_bind_mat(b, h, n_ff, "%s.down_proj.weight", base);
    if (b->st) return;
    w->gate = *g;
    w->up = *u;
    w->down = *d;
}

void qw_bind_mlp(qw_binder *b, int il, qw_ffn_w *w, int64_t n_ff) {
    char base[160];
    snprintf(base, sizeof(base), "%slayers.%d.mlp", b->m->prefix, il);
    bind_ffn(b, w, n_ff, b->m->hp.n_embd, base);
}

void qw_bind_moe(qw_binder *b, int il, qw_moe_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t E = hp->n_expert, I = hp->n_ff_exp, H = hp->n_embd;
    w->router = qw_bind_mat(b, E, H, "~layers.%d.mlp.gate.weight", il);
    if (b->st) return;
    w->experts = qw_bind_own(b, (size_t)E * sizeof(qw_ffn_w), "the experts' views");
    if (!w->experts) return;
    if (qw_bind_has(b, "~layers.%d.mlp.experts.gate_up_proj", il)) {
        int64_t s_gu[3] = {E, 2 * I, H}, s_d[3] = {E, H, I};
        char n_gu[256], n_d[256];
        snprintf(n_gu, sizeof(n_gu), "%s", qw_bind_name(b, "~layers.%d.mlp.experts.gate_up_proj", il));
        snprintf(n_d, sizeof(n_d), "%s", qw_bind_name(b, "~layers.%d.mlp.experts.down_proj", il));
        const qw_tensor *gu = qw_bind_tensor(b, 3, s_gu, n_gu);
        const qw_tensor *dn = qw_bind_tensor(b, 3, s_d, n_d);
        if (b->st) return;
        for (int64_t e = 0; e < E; e++) {
            w->experts[e].gate = qw_tensor_rows(gu, e * 2 * I, I, H);
            w->experts[e].up = qw_tensor_rows(gu, e * 2 * I + I, I, H);
            w->experts[e].down = qw_tensor_rows(dn, e * H, H, I);
        }
    } else {
        for (int64_t e = 0; e < E && !b->st; e++) {
            char base[160];
            snprintf(base, sizeof(base), "%slayers.%d.mlp.experts.%lld", b->m->prefix, il, (long long)e);
            bind_ffn(b, &w->experts[e], I, H, base);
        }
    }
    char base[160];
    snprintf(base, sizeof(base), "%slayers.%d.mlp.shared_expert", b->m->prefix, il);
    bind_ffn(b, &w->shared, hp->n_ff_shexp, H, base);
    w->shared_gate = qw_bind_mat(b, 1, H, "~layers.%d.mlp.shared_expert_gate.weight", il);
}

void qw_bind_attn(qw_binder *b, int il, qw_attn_w *w, int qk_norm, int gated, int qsa) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, hd = hp->head_dim, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    /* gated attention doubles q_proj: per head [q_h | gate_h] */
    w->gated = gated;
    w->wq = qw_bind_mat(b, gated ? 2 * nq : nq, H, "~layers.%d.self_attn.q_proj.weight", il);
    w->wk = qw_bind_mat(b, nkv, H, "~layers.%d.self_attn.k_proj.weight", il);
    w->wv = qw_bind_mat(b, nkv, H, "~layers.%d.self_attn.v_proj.weight", il);
    w->wo = qw_bind_mat(b, H, nq, "~layers.%d.self_attn.o_proj.weight", il);
    if (qk_norm) {
        w->q_norm = qw_bind_vec(b, hd, "~layers.%d.self_attn.q_norm.weight", il);
        w->k_norm = qw_bind_vec(b, hd, "~layers.%d.self_attn.k_norm.weight", il);
    }
    if (qsa) {
        int64_t ihd = hp->idx_head_dim;
        w->idx_qk = qw_bind_mat(b, (hp->idx_n_head + 1) * ihd, H, "~layers.%d.self_attn.indexer.index_qk_proj.weight", il);
        w->idx_q_norm = qw_bind_vec(b, ihd, "~layers.%d.self_attn.indexer.q_layernorm.weight", il);
        w->idx_k_norm = qw_bind_vec(b, ihd, "~layers.%d.self_attn.indexer.k_layernorm.weight", il);
    }
}

void qw_bind_gdn(qw_binder *b, int il, qw_gdn_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    int64_t ch = 2 * kd + vd, hv = hp->gdn_hv;
    if (qw_bind_has(b, "~layers.%d.linear_attn.in_proj_qkvz.weight", il)) {
        w->qkvz = qw_bind_mat(b, ch + vd, H, "~layers.%d.linear_attn.in_proj_qkvz.weight", il);
        w->ba = qw_bind_mat(b, 2 * hv, H, "~layers.%d.linear_attn.in_proj_ba.weight", il);
    } else {
        w->qkv = qw_bind_mat(b, ch, H, "~layers.%d.linear_attn.in_proj_qkv.weight", il);
        w->z = qw_bind_mat(b, vd, H, "~layers.%d.linear_attn.in_proj_z.weight", il);
        w->b = qw_bind_mat(b, hv, H, "~layers.%d.linear_attn.in_proj_b.weight", il);
        w->a = qw_bind_mat(b, hv, H, "~layers.%d.linear_attn.in_proj_a.weight", il);
    }
    w->conv = qw_bind_conv(b, ch, hp->gdn_conv_k, "~layers.%d.linear_attn.conv1d.weight", il);
    w->dt_bias = qw_bind_vec(b, hv, "~layers.%d.linear_attn.dt_bias", il);
    w->neg_exp_a = qw_bind_vec(b, hv, "~layers.%d.linear_attn.A_log", il);
    if (w->neg_exp_a)
        for (int64_t j = 0; j < hv; j++) w->neg_exp_a[j] = -expf(w->neg_exp_a[j]);
    w->norm = qw_bind_vec(b, hp->gdn_dv, "~layers.%d.linear_attn.norm.weight", il);
    w->out = qw_bind_mat(b, H, vd, "~layers.%d.linear_attn.out_proj.weight", il);
}
