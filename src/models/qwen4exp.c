/*
 * qwen4exp.c - Qwen3.8-Flash-Next (transformers qwen4_exp; spec qwen4_exp.md 3.0):
 * four residual streams joined by hyper-connections, Gated DeltaNet and QSA sparse-attention layers,
 * a 512-expert MoE with shared expert in every layer, the hashed n-gram embedding (PLE) on chosen
 * DeltaNet layers, and a final stream mixer in place of a final norm.
 *
 *   X = [e | e | ... | e] (C copies of the token embedding)
 *   per layer l: if PLE layer: X += PLE(X, ids)
 *                (a, inj) = HC(attn_hyper_connection, X); X[s] += inj[s] * mixer(a)
 *                (a, inj) = HC(mlp_hyper_connection, X);  X[s] += inj[s] * moe(a)
 *   hidden = HC_mix(hyper_connection_mixer, X)
 */
#include <string.h>

#include "blocks/blocks.h"

static void bind_hc(qw_binder *b, qw_hc_w *w, const char *base, int inject) {
    const qw_hparams *hp = &b->m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, r = hp->hc_lowrank;
    w->norm = qw_bind_vec(b, CH, "%s.hc_norm.weight", base);
    w->down = qw_bind_mat(b, r, CH, "%s.input_mix_weight_down.weight", base);
    w->up = qw_bind_mat(b, CH, r, "%s.input_mix_weight_up.weight", base);
    if (inject) w->inject = qw_bind_mat(b, hp->hc_count, CH, "%s.block_inject_weight.weight", base);
}

/* Compare a stored I64 buffer with the value qwenc derives from the config. */
static void check_i64(qw_binder *b, const char *name, const int64_t *want, int n) {
    if (b->st) return;
    const qw_tensor *t = qw_weightset_find(&b->m->ws, name);
    if (!t) return; /* the buffers are optional: qwenc derives them */
    if (t->type != QW_TYPE_I64 || t->n_dims != 1 || t->shape[0] != n) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' should be I64 [%d]",
                       qw_weightset_file_of(&b->m->ws, t), name, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)t->data + 8 * i, 8);
        if (v != want[i]) {
            b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT,
                           "%s: tensor '%s'[%d] = %lld but the config gives %lld (ngram_vocab_size_base, seed, "
                           "vocab_size or ple_layer_ids disagree with the checkpoint)",
                           qw_weightset_file_of(&b->m->ws, t), name, i, (long long)v, (long long)want[i]);
            return;
        }
    }
}

static qw_ple_w *bind_ple(qw_binder *b, int il, int li) {
    qwenc_model *m = b->m;
    const qw_hparams *hp = &m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, P = hp->ple_dim, nh = hp->ngram_heads, dh = P / nh;
    qw_ple_w *w = qw_bind_own(b, sizeof(qw_ple_w), "the PLE layer");
    if (!w) return NULL;
    w->li = li;
    w->prime = qw_bind_own(b, (size_t)nh * sizeof(int64_t), "the PLE hash table sizes");
    w->offset = qw_bind_own(b, (size_t)nh * sizeof(int64_t), "the PLE hash table offsets");
    if (b->st) return w;
    qw_ple_constants(hp, li, w->mult, w->prime, w->offset, &w->n_rows);
    w->key_proj = qw_bind_mat(b, CH, P, "~layers.%d.ple.key_proj.weight", il);
    w->value_proj = qw_bind_mat(b, hp->n_embd, P, "~layers.%d.ple.value_proj.weight", il);
    w->norm_key = qw_bind_vec(b, CH, "~layers.%d.ple.norm_key.weight", il);
    w->norm_query = qw_bind_vec(b, CH, "~layers.%d.ple.norm_query.weight", il);
    w->norm_conv = qw_bind_vec(b, CH, "~layers.%d.ple.norm_conv.weight", il);
    w->conv = qw_bind_conv(b, CH, hp->ple_conv_k, "~layers.%d.ple.conv1d.weight", il);
    if (b->st) return w;

    int64_t mult[8];
    for (int i = 0; i < hp->ngram_n; i++) mult[i] = (int64_t)w->mult[i];
    check_i64(b, qw_bind_name(b, "~layers.%d.ple.ple_embedding.layer_multipliers", il), mult, hp->ngram_n);
    check_i64(b, qw_bind_name(b, "~layers.%d.ple.ple_embedding.ngram_heads_vocab_sizes", il), w->prime, (int)nh);
    check_i64(b, qw_bind_name(b, "~layers.%d.ple.ple_embedding.ngram_heads_offsets", il), w->offset, (int)nh);

    /* the table: one tensor, or shards concatenated in numeric order (torch.chunk: equal pieces, last shorter) */
    if (qw_bind_has(b, "~layers.%d.ple.ple_embedding.ngram_embedding.weight", il)) {
        w->chunks = qw_bind_own(b, sizeof(qw_tensor), "the n-gram table's view");
        if (!w->chunks) return w;
        w->n_chunks = 1;
        const qw_tensor *t = qw_bind_mat(b, w->n_rows, dh, "~layers.%d.ple.ple_embedding.ngram_embedding.weight", il);
        if (t) w->chunks[0] = *t;
        w->chunk_rows = w->n_rows;
        return w;
    }
    int n = 0;
    while (qw_bind_has(b, "~layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", il, n)) n++;
    if (n == 0) {
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT,
                       "%s: tensor '%s' is missing from the checkpoint (nor are there shard_0.. pieces)", m->path,
                       qw_bind_name(b, "~layers.%d.ple.ple_embedding.ngram_embedding.weight", il));
        return w;
    }
    w->chunks = qw_bind_own(b, (size_t)n * sizeof(qw_tensor), "the n-gram table shards' views");
    if (!w->chunks) return w;
    w->n_chunks = n;
    int64_t total = 0;
    for (int i = 0; i < n && !b->st; i++) {
        const qw_tensor *t = qw_weightset_find(&m->ws, qw_bind_name(b, "~layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", il, i));
        int64_t rows = t->n_dims == 2 ? t->shape[0] : -1;
        if (i == 0) w->chunk_rows = rows;
        if (rows <= 0 || (i < n - 1 && rows != w->chunk_rows) || rows > w->chunk_rows) {
            b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT,
                           "%s: n-gram table shard '%s' has %lld rows; every shard but the last must have %lld "
                           "and the last no more",
                           m->path, t->name, (long long)rows, (long long)w->chunk_rows);
            break;
        }
        const qw_tensor *v = qw_bind_mat(b, rows, dh, "%s", t->name);
        if (v) w->chunks[i] = *v;
        total += rows;
    }
    if (!b->st && total != w->n_rows)
        b->st = qw_err(b->err, b->errlen, QWENC_ERR_FORMAT,
                       "%s: the %d n-gram table shards of layer %d hold %lld rows; the config implies %lld", m->path,
                       n, il, (long long)total, (long long)w->n_rows);
    return w;
}

qwenc_status qw_qwen4exp_bind(qwenc_model *m, char *err, size_t errlen) {
    const qw_hparams *hp = &m->hp;
    qw_binder b = {.m = m, .err = err, .errlen = errlen};
    char base[192];
    for (int il = 0; il < hp->n_layer && !b.st; il++) {
        qw_layer *L = &m->layers[il];
        L->kind = hp->layer_kind[il];
        L->moe = 1;
        snprintf(base, sizeof(base), "%slayers.%d.attn_hyper_connection", m->prefix, il);
        bind_hc(&b, &L->hc_attn, base, 1);
        snprintf(base, sizeof(base), "%slayers.%d.mlp_hyper_connection", m->prefix, il);
        bind_hc(&b, &L->hc_mlp, base, 1);
        if (L->kind == QW_LAYER_GDN)
            qw_bind_gdn(&b, il, &L->gdn);
        else
            qw_bind_attn(&b, il, &L->attn, 1, 1, 1);
        qw_bind_moe(&b, il, &L->moe_w);
        for (int i = 0; i < hp->n_ple; i++)
            if (hp->ple_layers[i] == il) L->ple = bind_ple(&b, il, i);
    }
    snprintf(base, sizeof(base), "%shyper_connection_mixer", m->prefix);
    bind_hc(&b, &m->hc_final, base, 0);
    return b.st;
}

void qw_qwen4exp_forward(const qw_fwd *f, float *hidden) {
    const qwenc_model *m = f->m;
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, H = hp->n_embd, C = hp->hc_count;
    int64_t CH = (int64_t)C * H;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    float *X = qw_arena_f32(f->ar, (size_t)T * CH);
    float *a = qw_arena_f32(f->ar, (size_t)T * H), *y = qw_arena_f32(f->ar, (size_t)T * H);
    float *inj = qw_arena_f32(f->ar, (size_t)T * C);
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layers[il].ple) qw_ple_prefetch(f, m->layers[il].ple);
    f->ops->get_rows(f->ops, a, m->tok_embd, f->tokens, T);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) memcpy(X + t * CH + (int64_t)c * H, a + (int64_t)t * H, (size_t)H * sizeof(float));
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        if (L->ple) qw_ple_forward(f, il, L->ple, X);
        qw_hc_forward(f, &L->hc_attn, X, a, inj);
        if (L->kind == QW_LAYER_GDN)
            qw_gdn_forward(f, il, &L->gdn, hp->gdn_gate_sigmoid, a, y);
        else
            qw_attn_forward(f, il, &L->attn, 1, a, y);
        qw_hc_inject(f, X, inj, y);
        qw_hc_forward(f, &L->hc_mlp, X, a, inj);
        qw_moe_forward(f, &L->moe_w, a, y);
        qw_hc_inject(f, X, inj, y);
    }
    qw_hc_forward(f, &m->hc_final, X, hidden, NULL);
    qw_arena_restore(f->ar, mk);
}
