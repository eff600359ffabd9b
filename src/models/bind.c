/*
 * bind.c - the binder (bind.h): the blocks the architectures share, described once as roles, shapes and slots,
 * and the calls every io goes through. The tensors of a block are visited in the order its GGUF holds them.
 */
#include <stdarg.h>
#include <string.h>

#include "models/bind.h"

/* ---------------------------------------------------------------- allocation and errors */

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

qw_ple_w *qw_bind_ple_new(qw_binder *b, int li, qw_ple_w **slot) {
    int64_t nh = b->m->hp.ngram_heads;
    qw_ple_w *w = *slot = qw_bind_own(b, sizeof(qw_ple_w), "the PLE layer");
    if (!w) return NULL;
    w->li = li;
    w->prime = qw_bind_own(b, (size_t)nh * sizeof(int64_t), "the PLE hash table sizes");
    w->offset = qw_bind_own(b, (size_t)nh * sizeof(int64_t), "the PLE hash table offsets");
    return b->st ? NULL : w;
}


float *qw_bind_f32(qw_binder *b, int64_t n, const char *what) {
    return qw_bind_own(b, (size_t)n * sizeof(float), what);
}

void qw_bind_fail(qw_binder *b, qwenc_status st, const char *fmt, ...) {
    if (b->st) return;
    va_list ap;
    va_start(ap, fmt);
    if (b->err && b->errlen) vsnprintf(b->err, b->errlen, fmt, ap);
    va_end(ap);
    b->st = st;
}

/* ---------------------------------------------------------------- layouts */

/* *field = v, unless the io reads the model. */
static void set_flag(qw_binder *b, int *field, int v) {
    if (!b->io->reads) *field = v;
}

int qw_bind_file_layout(const qw_binder *b, qw_layout which) {
    const qw_hparams *hp = &b->m->hp;
    if (which == QW_LAYOUT_ROPE) return qw_arch_has(hp->arch, QW_AF_ROPE_INTERLEAVED);
    return qw_arch_has(hp->arch, QW_AF_V_TILED) && hp->gdn_hv != hp->gdn_hk;
}

/* A block's layout flag: 0 for a checkpoint, what the file needs for a GGUF; the plan reads it into b->layout. */
static void layout(qw_binder *b, qw_layout which, int *flag) {
    if (b->io->reads)
        b->layout = *flag ? b->layout | which : b->layout & ~(unsigned)which;
    else
        *flag = b->io->file_layout && qw_bind_file_layout(b, which);
}

/* ---------------------------------------------------------------- tensors */

void qw_bind_mat(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot) {
    if (!b->st) b->io->mat(b, role, il, d0, d1, slot);
}

void qw_bind_vec(qw_binder *b, qw_gt role, int il, int64_t n, float **slot) {
    if (!b->st) b->io->vec(b, role, il, n, 0, slot);
}

void qw_bind_conv(qw_binder *b, qw_gt role, int il, int64_t ch, int64_t k, float **slot) {
    if (!b->st) b->io->vec(b, role, il, ch, k, slot);
}

/* A matrix held by value (qw_ffn_w): the io sees a pointer to it. */
static void mat_value(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, qw_tensor *slot) {
    const qw_tensor *t = slot;
    qw_bind_mat(b, role, il, d0, d1, &t);
    if (t && t != slot && !b->io->reads) *slot = *t;
}

void qw_bind_embd(qw_binder *b) {
    const qw_hparams *hp = &b->m->hp;
    qw_bind_mat(b, QW_GT_TOKEN_EMBD, -1, hp->n_vocab, hp->n_embd, &b->m->tok_embd);
}

void qw_bind_output(qw_binder *b) {
    qwenc_model *m = b->m;
    if (b->st) return;
    int tied = b->io->reads ? m->output == m->tok_embd : m->hp.tie_embd && !b->io->has(b, QW_GT_OUTPUT, -1);
    if (!tied)
        qw_bind_mat(b, QW_GT_OUTPUT, -1, m->hp.n_vocab, m->hp.n_embd, &m->output);
    else if (!b->io->reads)
        m->output = m->tok_embd;
}

static void ffn(qw_binder *b, int il, qw_ffn_w *w, qw_gt gate, qw_gt up, qw_gt down, int64_t n_ff) {
    int64_t H = b->m->hp.n_embd;
    mat_value(b, gate, il, n_ff, H, &w->gate);
    mat_value(b, up, il, n_ff, H, &w->up);
    mat_value(b, down, il, H, n_ff, &w->down);
}

void qw_bind_mlp(qw_binder *b, int il, qw_ffn_w *w) {
    ffn(b, il, w, QW_GT_FFN_GATE, QW_GT_FFN_UP, QW_GT_FFN_DOWN, b->m->hp.n_ff);
}

void qw_bind_moe(qw_binder *b, int il, qw_moe_w *w) {
    const qw_hparams *hp = &b->m->hp;
    qw_bind_mat(b, QW_GT_FFN_GATE_INP, il, hp->n_expert, hp->n_embd, &w->router);
    if (!b->st) b->io->experts(b, il, w);
    qw_bind_mat(b, QW_GT_FFN_GATE_INP_SHEXP, il, 1, hp->n_embd, &w->shared_gate);
    ffn(b, il, &w->shared, QW_GT_FFN_GATE_SHEXP, QW_GT_FFN_UP_SHEXP, QW_GT_FFN_DOWN_SHEXP, hp->n_ff_shexp);
}

void qw_bind_attn(qw_binder *b, int il, qw_attn_w *w, int qk_norm, int gated, int qsa) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, hd = hp->head_dim, nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    set_flag(b, &w->gated, gated);
    layout(b, QW_LAYOUT_ROPE, &w->rope_interleaved);
    /* gated attention doubles q_proj: per head [q_h | gate_h] */
    int64_t nqg = gated ? 2 * nq : nq;
    if (b->io->attn_qkv) {
        if (!b->st) b->io->attn_qkv(b, il, nqg, nkv, w);
    } else {
        qw_bind_mat(b, QW_GT_ATTN_Q, il, nqg, H, &w->wq);
        qw_bind_mat(b, QW_GT_ATTN_K, il, nkv, H, &w->wk);
        qw_bind_mat(b, QW_GT_ATTN_V, il, nkv, H, &w->wv);
    }
    qw_bind_mat(b, QW_GT_ATTN_OUT, il, H, nq, &w->wo);
    if (qk_norm) {
        qw_bind_vec(b, QW_GT_ATTN_Q_NORM, il, hd, &w->q_norm);
        qw_bind_vec(b, QW_GT_ATTN_K_NORM, il, hd, &w->k_norm);
    }
    if (qsa) {
        int64_t ihd = hp->idx_head_dim;
        if (!b->st) b->io->indexer(b, il, hp->idx_n_head * ihd, ihd, w);
        qw_bind_vec(b, QW_GT_INDEXER_Q_NORM, il, ihd, &w->idx_q_norm);
        qw_bind_vec(b, QW_GT_INDEXER_K_NORM, il, ihd, &w->idx_k_norm);
    }
}

void qw_bind_gdn(qw_binder *b, int il, qw_gdn_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    layout(b, QW_LAYOUT_VHEADS, &w->v_tiled);
    if (!b->st) b->io->gdn_in(b, il, w);
    qw_bind_conv(b, QW_GT_SSM_CONV, il, 2 * kd + vd, hp->gdn_conv_k, &w->conv);
    qw_bind_vec(b, QW_GT_SSM_DT, il, hp->gdn_hv, &w->dt_bias);
    qw_bind_vec(b, QW_GT_SSM_A, il, hp->gdn_hv, &w->neg_exp_a);
    qw_bind_vec(b, QW_GT_SSM_NORM, il, hp->gdn_dv, &w->norm);
    qw_bind_mat(b, QW_GT_SSM_OUT, il, H, vd, &w->out);
}

void qw_bind_hc(qw_binder *b, int il, qw_hc_w *w, qw_gt norm, qw_gt down, qw_gt up, qw_gt inject) {
    const qw_hparams *hp = &b->m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, r = hp->hc_lowrank;
    qw_bind_vec(b, norm, il, CH, &w->norm);
    qw_bind_mat(b, down, il, r, CH, &w->down);
    qw_bind_mat(b, up, il, CH, r, &w->up);
    if (inject != QW_GT_COUNT) qw_bind_mat(b, inject, il, hp->hc_count, CH, &w->inject);
}

void qw_bind_ple_tables(qw_binder *b) {
    const qw_hparams *hp = &b->m->hp;
    for (int i = 0; i < hp->n_ple && !b->st; i++) {
        int il = hp->ple_layers[i];
        b->io->ple_table(b, il, i, &b->m->layers[il].ple);
    }
}

void qw_bind_ple(qw_binder *b, int il, qw_ple_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, P = hp->ple_dim;
    qw_bind_mat(b, QW_GT_PLE_KEY, il, CH, P, &w->key_proj);
    qw_bind_mat(b, QW_GT_PLE_VALUE, il, hp->n_embd, P, &w->value_proj);
    qw_bind_vec(b, QW_GT_PLE_NORM_KEY, il, CH, &w->norm_key);
    qw_bind_vec(b, QW_GT_PLE_NORM_QUERY, il, CH, &w->norm_query);
    qw_bind_vec(b, QW_GT_PLE_NORM_CONV, il, CH, &w->norm_conv);
    qw_bind_conv(b, QW_GT_PLE_CONV, il, CH, hp->ple_conv_k, &w->conv);
}

void qw_bind_mtp(qw_binder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    if (!hp->n_mtp || b->st) return;
    int il = hp->n_layer, hc = qw_arch_has(hp->arch, QW_AF_HC), qk_norm = qw_arch_has(hp->arch, QW_AF_QK_NORM);
    int64_t H = hp->n_embd, CH = (int64_t)hp->hc_count * H;
    qw_layer *L = &m->layers[il];
    qw_mtp_w *w = &m->mtp;
    if (hc) {
        qw_bind_mat(b, QW_GT_MTP_E_PROJ, il, H, H, &w->fc_embd);
        qw_bind_mat(b, QW_GT_MTP_H_PROJ, il, H, H, &w->fc_hidden);
    } else {
        qw_bind_mat(b, QW_GT_MTP_EH_PROJ, il, H, 2 * H, &w->fc);
    }
    qw_bind_vec(b, QW_GT_MTP_ENORM, il, H, &w->enorm);
    qw_bind_vec(b, QW_GT_MTP_HNORM, il, hc ? CH : H, &w->hnorm);
    if (hc) { /* a QSA decoder layer as the main ones (no PLE), then the head's stream mixer */
        qw_bind_hc(b, il, &L->hc_attn, QW_GT_HC_ATTN_NORM, QW_GT_HC_ATTN_DOWN, QW_GT_HC_ATTN_UP, QW_GT_HC_ATTN_INJECT);
        qw_bind_hc(b, il, &L->hc_mlp, QW_GT_HC_FFN_NORM, QW_GT_HC_FFN_DOWN, QW_GT_HC_FFN_UP, QW_GT_HC_FFN_INJECT);
        qw_bind_attn(b, il, &L->attn, qk_norm, 1, 1);
        qw_bind_moe(b, il, &L->moe_w);
        qw_bind_hc(b, il, &w->hc_final, QW_GT_MTP_HC_NORM, QW_GT_MTP_HC_DOWN, QW_GT_MTP_HC_UP, QW_GT_COUNT);
        return;
    }
    /* a gated full-attention decoder layer (pre-norm residual), then the head's norm */
    qw_bind_vec(b, QW_GT_ATTN_NORM, il, H, &L->attn_norm);
    qw_bind_vec(b, QW_GT_POST_ATTN_NORM, il, H, &L->ffn_norm);
    qw_bind_attn(b, il, &L->attn, qk_norm, 1, 0);
    if (L->moe)
        qw_bind_moe(b, il, &L->moe_w);
    else
        qw_bind_mlp(b, il, &L->mlp);
    qw_bind_vec(b, QW_GT_MTP_NORM, il, H, &w->norm);
}

/* ---------------------------------------------------------------- the model */

qwenc_status qw_bind_model(qw_binder *b) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    if (!b->io->reads) {
        int n = hp->n_layer + hp->n_mtp;
        m->layers = qw_calloc((size_t)n, sizeof(qw_layer));
        if (!m->layers) return b->st = qw_err_nomem(b->err, b->errlen, m->path, (size_t)n, sizeof(qw_layer));
        for (int il = 0; il < hp->n_layer; il++) {
            m->layers[il].kind = hp->layer_kind[il];
            m->layers[il].moe = hp->layer_moe[il];
        }
        if (hp->n_mtp) { /* the head's layer: attention (QSA in qwen4_exp), MoE where the source has a router */
            qw_layer *L = &m->layers[hp->n_layer];
            L->kind = qw_arch_has(hp->arch, QW_AF_QSA) ? QW_LAYER_QSA : QW_LAYER_ATTN;
            L->moe = qw_arch_has(hp->arch, QW_AF_MOE) ||
                     (qw_arch_has(hp->arch, QW_AF_MOE_STEP) && b->io->has(b, QW_GT_FFN_GATE_INP, hp->n_layer));
        }
    }
    qw_arch_get(hp->arch)->tensors(b);
    if (!b->st) b->io->rope(b);
    return b->st;
}
