/*
 * footprint.c - how many bytes of weights the model holds and how many one decoded token reads: the
 * numerator of the memory-bandwidth bound of decode (qwenc bench). See qwenc_model_weight_bytes.
 *
 * Walks the bound layers (model.h), so it counts exactly the matrices the forward multiplies; routed
 * experts count n_expert_used / n_expert of their bytes (the expected share under any routing that uses
 * every expert equally; the true share of one token is exactly that many experts), the embedding table
 * one row and a PLE table n_heads rows.
 */
#include <string.h>

#include "models/model.h"

static int64_t tensor_bytes(const qw_tensor *t) {
    if (!t || !t->data) return 0;
    return (int64_t)qw_type_row_size(t->type, qw_tensor_nelem(t));
}

static int64_t ffn_bytes(const qw_ffn_w *w) {
    return tensor_bytes(&w->gate) + tensor_bytes(&w->up) + tensor_bytes(&w->down);
}

static int64_t hc_bytes(const qw_hc_w *w) { return tensor_bytes(w->down) + tensor_bytes(w->up) + tensor_bytes(w->inject); }

/* The matrices of layer L, its routed experts' bytes times expert_share (not the n-gram table) */
static double layer_bytes(const qw_hparams *hp, const qw_layer *L, double expert_share) {
    const qw_attn_w *a = &L->attn;
    double n = (double)(tensor_bytes(a->wq) + tensor_bytes(a->wk) + tensor_bytes(a->wv) + tensor_bytes(a->wo) +
                        tensor_bytes(a->idx_qk));
    const qw_gdn_w *g = &L->gdn;
    n += (double)(tensor_bytes(g->qkv) + tensor_bytes(g->z) + tensor_bytes(g->b) + tensor_bytes(g->a) +
                  tensor_bytes(g->qkvz) + tensor_bytes(g->ba) + tensor_bytes(g->out));
    if (L->moe) {
        const qw_moe_w *w = &L->moe_w;
        n += (double)(tensor_bytes(w->router) + ffn_bytes(&w->shared) + tensor_bytes(w->shared_gate));
        double experts = 0;
        for (int e = 0; w->experts && e < hp->n_expert; e++) experts += (double)ffn_bytes(&w->experts[e]);
        n += experts * expert_share;
    } else {
        n += (double)ffn_bytes(&L->mlp);
    }
    n += (double)(hc_bytes(&L->hc_attn) + hc_bytes(&L->hc_mlp));
    if (L->ple) n += (double)(tensor_bytes(L->ple->key_proj) + tensor_bytes(L->ple->value_proj));
    return n;
}

int64_t qw_model_layer_bytes(const qwenc_model *m, int il) { return (int64_t)layer_bytes(&m->hp, &m->layers[il], 1.0); }

void qwenc_model_weight_bytes(const qwenc_model *m, int64_t *total, int64_t *per_token) {
    const qw_hparams *hp = &m->hp;
    int64_t all = 0;
    if (m->conv) /* quantized at load: the converted tensors replace the file's */
        all = (int64_t)m->conv->n_bytes;
    for (int64_t i = 0; !m->conv && m->gguf && i < m->gguf->n_tensors; i++) all += (int64_t)m->gguf->tensors[i].nbytes;
    for (int i = 0; !m->conv && i < m->ws.n_entries; i++) {
        const qw_tensor *t = &m->ws.entries[i].t;
        if (!strncmp(t->name, "mtp.", 4) || !strncmp(t->name, "model.visual.", 13)) continue;
        all += tensor_bytes(t);
    }
    double tok = (double)qw_type_row_size(m->tok_embd->type, hp->n_embd) + (double)tensor_bytes(m->output);
    tok += (double)hc_bytes(&m->hc_final);
    for (int il = 0; il < hp->n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        tok += layer_bytes(hp, L, hp->n_expert ? (double)hp->n_expert_used / hp->n_expert : 0);
        if (L->ple && L->ple->n_chunks) {
            const int64_t dh = hp->ple_dim / hp->ngram_heads;
            tok += (double)hp->ngram_heads * (double)qw_type_row_size(L->ple->chunks[0].type, dh);
        }
    }
    if (total) *total = all;
    if (per_token) *per_token = (int64_t)tok;
}

int64_t qw_model_ple_table_bytes(const qwenc_model *m) {
    for (int il = 0; il < m->hp.n_layer; il++) { /* one table, shared by the PLE layers */
        const qw_ple_w *p = m->layers[il].ple;
        if (!p || !p->n_chunks) continue;
        int64_t n = 0;
        for (int i = 0; i < p->n_chunks; i++) n += (int64_t)tensor_bytes(&p->chunks[i]);
        return n;
    }
    return 0;
}

int64_t qw_model_expert_bytes(const qwenc_model *m) {
    int64_t n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const qw_layer *L = &m->layers[il];
        if (!L->moe) continue;
        for (int e = 0; e < m->hp.n_expert; e++) n += ffn_bytes(&L->moe_w.experts[e]);
    }
    return n;
}
