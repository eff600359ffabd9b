/*
 * model.c - load a checkpoint directory: config.json -> hyper-parameters, safetensors -> mapped
 * tensors, then the architecture's binder checks and binds every weight (see model.h). With
 * params.quant the bound weights are then converted at load (models/load_quant.c).
 */
#include <string.h>

#include "blocks/blocks.h"
#include "kernels/cpu.h"
#include "models/gguf_map.h"

static const struct {
    qwenc_status (*bind)(qwenc_model *, char *, size_t);
    void (*forward)(const qw_fwd *, float *);
} arch_impl[QW_ARCH_COUNT] = {
    [QW_ARCH_LLAMA] = {qw_llama_bind, qw_llama_forward},
    [QW_ARCH_QWEN3] = {qw_llama_bind, qw_llama_forward},
    [QW_ARCH_QWEN35] = {qw_qwen35_bind, qw_qwen35_forward},
    [QW_ARCH_QWEN35_MOE] = {qw_qwen35_bind, qw_qwen35_forward},
    [QW_ARCH_QWEN3_NEXT] = {qw_qwen35_bind, qw_qwen35_forward},
    [QW_ARCH_QWEN4EXP] = {qw_qwen4exp_bind, qw_qwen4exp_forward},
};

void qw_model_forward(const qw_fwd *f, float *hidden) { arch_impl[f->hp->arch].forward(f, hidden); }

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* The tensors read a few rows per token (the token embedding unless it is also the lm_head, the PLE
 * n-gram tables) keep 4 KiB pages, which the rest of the mapping does not (core/mapfile.h). */
static void advise_sparse(const qwenc_model *m) {
    const qw_tensor *e = m->tok_embd;
    if (e && e != m->output) qw_advise_sparse(e->data, qw_type_row_size(e->type, qw_tensor_nelem(e)));
    for (int il = 0; m->layers && il < m->hp.n_layer; il++)
        for (int c = 0; m->layers[il].ple && c < m->layers[il].ple->n_chunks; c++) {
            const qw_tensor *t = &m->layers[il].ple->chunks[c];
            qw_advise_sparse(t->data, qw_type_row_size(t->type, qw_tensor_nelem(t)));
        }
}

qwenc_model_params qwenc_model_default_params(void) {
    qwenc_model_params p = {.n_threads = 0, .kernels = NULL, .quant = NULL, .progress = NULL, .progress_user = NULL};
    return p;
}

qwenc_status qwenc_model_load(const char *path, qwenc_model **out, char *err, size_t errlen) {
    return qwenc_model_load_params(path, NULL, out, err, errlen);
}

qwenc_status qwenc_model_load_params(const char *path, const qwenc_model_params *params, qwenc_model **out,
                                     char *err, size_t errlen) {
    *out = NULL;
    qwenc_model_params mp = params ? *params : qwenc_model_default_params();
    if (mp.n_threads < 0) return qw_err(err, errlen, QWENC_ERR_ARG, "model: n_threads must not be negative");
    qw_gguf_policy pol;
    if (mp.quant && !qw_gguf_policy_parse(&pol, mp.quant))
        return qw_err(err, errlen, QWENC_ERR_ARG, "unknown quantization type \"%s\" (one of %s)", mp.quant,
                      qw_gguf_policy_names());
    qwenc_model *m = qw_calloc(1, sizeof(*m));
    if (!m) return qw_err_nomem(err, errlen, path, 1, sizeof(*m));
    m->path = qw_strdup(path);
    if (!m->path) {
        free(m);
        return qw_err_nomem(err, errlen, path, strlen(path) + 1, 1);
    }
    m->params = mp;
    qwenc_status st = qw_ops_cpu_new(mp.n_threads, mp.kernels, &m->ops, err, errlen);
    if (st) {
        qwenc_model_free(m);
        return st;
    }
    m->params.kernels = m->ops->name; /* the caller's string need not outlive the call */
    qw_ops_cpu_set_f32_activations(m->ops, mp.f32_activations);
    if (qw_path_is_gguf(path)) { /* a .gguf file rather than a checkpoint directory: models/gguf_bind.c */
        st = qw_gguf_model_load(m, path, err, errlen);
        if (!st && mp.quant) st = qw_model_quantize_at_load(m, err, errlen);
        if (st) {
            qwenc_model_free(m);
            return st;
        }
        advise_sparse(m);
        *out = m;
        return QWENC_OK;
    }
    st = qw_hparams_load(&m->hp, path, err, errlen);
    if (!st) st = qw_weightset_open_dir(&m->ws, path, err, errlen);
    if (st) {
        qwenc_model_free(m);
        return st;
    }
    const qw_hparams *hp = &m->hp;
    m->prefix = qw_weightset_find(&m->ws, "model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                                       : "model.";
    qw_binder b = {.m = m, .err = err, .errlen = errlen};
    m->tok_embd = qw_bind_mat(&b, hp->n_vocab, hp->n_embd, "~embed_tokens.weight");
    if (!b.st) {
        if (hp->tie_embd && !qw_weightset_find(&m->ws, "lm_head.weight"))
            m->output = m->tok_embd;
        else
            m->output = qw_bind_mat(&b, hp->n_vocab, hp->n_embd, "lm_head.weight");
    }
    st = b.st;
    if (!st) {
        m->layers = qw_calloc((size_t)hp->n_layer, sizeof(qw_layer));
        st = m->layers ? arch_impl[hp->arch].bind(m, err, errlen)
                       : qw_err_nomem(err, errlen, path, (size_t)hp->n_layer, sizeof(qw_layer));
    }
    if (!st) {
        m->rope_inv_freq = qw_model_own_f32(m, hp->n_rot / 2);
        if (!m->rope_inv_freq) st = qw_err_nomem(err, errlen, path, (size_t)hp->n_rot / 2, sizeof(float));
    }
    if (st) {
        qwenc_model_free(m);
        return st;
    }
    qw_rope_inv_freq(hp, m->rope_inv_freq);
    for (int i = 0; i < m->ws.n_entries; i++) {
        const qw_tensor *t = &m->ws.entries[i].t;
        if (starts_with(t->name, "mtp.")) {
            m->n_mtp_tensors++;
            m->n_mtp_params += qw_tensor_nelem(t);
        } else if (starts_with(t->name, "model.visual.")) {
            m->n_ignored_tensors++;
        }
    }
    if (mp.quant) {
        st = qw_model_quantize_at_load(m, err, errlen);
        if (st) {
            qwenc_model_free(m);
            return st;
        }
    }
    advise_sparse(m);
    *out = m;
    return QWENC_OK;
}

void qwenc_model_free(qwenc_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    qw_model_converted_free(m);
    qw_weightset_free(&m->ws);
    if (m->gguf) qw_gguf_free(m->gguf);
    free(m->gguf);
    qw_hparams_free(&m->hp);
    qw_ops_cpu_free(m->ops);
    free(m->path);
    free(m);
}

int qwenc_model_n_vocab(const qwenc_model *m) { return m->hp.n_vocab; }
int qwenc_model_n_ctx_train(const qwenc_model *m) { return m->hp.n_ctx_train; }
const char *qwenc_model_arch(const qwenc_model *m) { return qw_arch_name(m->hp.arch); }
const char *qwenc_model_kernels(const qwenc_model *m) { return m->ops->name; }
int qwenc_model_n_threads(const qwenc_model *m) { return qw_ops_cpu_n_threads(m->ops); }

/* ---- qwenc info: parameters per component, by tensor-name pattern ---- */

typedef struct {
    const char *label;
    int64_t params;
    int n_tensors;
    int64_t by_type[QW_TYPE_COUNT];
} info_bucket;

static int info_bucket_of(const char *name) {
    static const char *pats[] = {
        /* order matters: the first match wins */
        "mtp.", "model.visual.", ".mlp.experts.", ".mlp.shared_expert", ".mlp.gate.", ".mlp.", ".linear_attn.",
        ".self_attn.indexer.", ".self_attn.", "ple.ple_embedding.", ".ple.", "hyper_connection", "embed_tokens",
        "lm_head", "norm",
    };
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++)
        if (strstr(name, pats[i])) return (int)i;
    return (int)(sizeof(pats) / sizeof(pats[0]));
}

/* The same buckets for llama.cpp's GGUF names (models/gguf_map.c); blocks past n_layer are the MTP head. */
static int info_bucket_of_gguf(const char *name, int n_layer) {
    static const struct {
        const char *pat;
        int bucket;
    } pats[] = {
        /* order matters: the first match wins */
        {"_exps.", 2}, {"_shexp.", 3}, {"ffn_gate_inp.", 4}, {"attn_norm.", 14}, {"post_attention_norm.", 14},
        {"ffn_norm.", 14}, {"output_norm.", 14}, {"ffn_", 5}, {"ssm_", 6}, {"attn_qkv.", 6}, {"attn_gate.", 6},
        {"indexer.", 7}, {"attn_", 8}, {"per_layer_token_embd.", 9}, {"ple_token_embd.", 9}, {"ple_", 10},
        {"hc_", 11}, {"token_embd.", 12}, {"output.", 13},
    };
    int il = -1;
    if (sscanf(name, "blk.%d.", &il) == 1 && il >= n_layer) return 0;
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++)
        if (strstr(name, pats[i].pat)) return pats[i].bucket;
    return 15;
}

static void print_count(FILE *f, int64_t n) {
    if (n >= 1000000000)
        fprintf(f, "%8.2fB", n / 1e9);
    else if (n >= 1000000)
        fprintf(f, "%8.2fM", n / 1e6);
    else if (n >= 1000)
        fprintf(f, "%8.2fK", n / 1e3);
    else
        fprintf(f, "%9lld", (long long)n);
}

void qwenc_model_print_info(const qwenc_model *m, FILE *f) {
    const qw_hparams *hp = &m->hp;
    fprintf(f, "model        %s\n", m->path);
    fprintf(f, "architecture %s (config model_type \"%s\")\n", qw_arch_name(hp->arch), hp->model_type);
    if (m->gguf)
        fprintf(f, "files        GGUF v%u, %lld tensors (llama.cpp architecture \"%s\")\n", m->gguf->version,
                (long long)m->gguf->n_tensors, hp->model_type);
    else
        fprintf(f, "files        %d safetensors file%s, %d tensors, prefix \"%s\"\n", m->ws.n_files,
                m->ws.n_files == 1 ? "" : "s", m->ws.n_entries, m->prefix);
    if (m->gguf_note[0]) fprintf(f, "note         %s\n", m->gguf_note);
    if (m->conv)
        fprintf(f, "quantized    at load to %s (the tensors of qwenc quantize --type %s): %d tensors, %.1f MiB\n",
                m->conv->type, m->conv->type, m->conv->n_tensors, (double)m->conv->n_bytes / 1048576.0);
    fprintf(f, "vocab        %d   hidden %d   layers %d   context %d\n", hp->n_vocab, hp->n_embd, hp->n_layer,
            hp->n_ctx_train);
    fprintf(f, "attention    %d heads, %d kv heads, head dim %d, rotary dims %d, theta %g%s\n", hp->n_head,
            hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta,
            hp->rope_type == QW_ROPE_LLAMA3   ? ", llama3 scaling"
            : hp->rope_type == QW_ROPE_LINEAR ? ", linear scaling"
                                              : "");
    if (hp->arch >= QW_ARCH_QWEN35)
        fprintf(f, "deltanet     %d key heads x %d, %d value heads x %d, conv %d, output gate %s\n", hp->gdn_hk,
                hp->gdn_dk, hp->gdn_hv, hp->gdn_dv, hp->gdn_conv_k, hp->gdn_gate_sigmoid ? "sigmoid" : "silu");
    if (hp->n_expert)
        fprintf(f, "moe          %d experts, top %d, expert width %d, shared expert width %d%s\n", hp->n_expert,
                hp->n_expert_used, hp->n_ff_exp, hp->n_ff_shexp, hp->norm_topk_prob ? ", renormalised" : "");
    if (hp->n_ff) fprintf(f, "mlp          width %d\n", hp->n_ff);
    if (hp->arch == QW_ARCH_QWEN4EXP) {
        fprintf(f, "streams      %d hyper-connection streams, low rank %d\n", hp->hc_count, hp->hc_lowrank);
        if (hp->idx_budget)
            fprintf(f, "qsa          indexer %d heads x %d, budget %d tokens in blocks of %d (top %d blocks)\n",
                    hp->idx_n_head, hp->idx_head_dim, hp->idx_budget, hp->idx_ratio, hp->idx_budget / hp->idx_ratio);
        for (int i = 0; i < hp->n_ple; i++) {
            const qw_ple_w *w = m->layers[hp->ple_layers[i]].ple;
            fprintf(f, "ple          layer %d: %d-grams, %d heads x %d dims, %lld table rows in %d piece%s\n",
                    hp->ple_layers[i], hp->ngram_n, hp->ngram_heads, hp->ple_dim / hp->ngram_heads,
                    (long long)w->n_rows, w->n_chunks, w->n_chunks == 1 ? "" : "s");
        }
    }
    fprintf(f, "layer plan   ");
    for (int l = 0; l < hp->n_layer; l++) {
        const qw_layer *L = &m->layers[l];
        char c = L->kind == QW_LAYER_GDN ? 'D' : L->kind == QW_LAYER_QSA ? 'S' : 'A';
        fprintf(f, "%c%s%s", c, L->ple ? "+ple" : "", hp->n_expert && !L->moe ? "+mlp" : "");
    }
    fprintf(f, "\n             (A attention, D Gated DeltaNet, S QSA sparse attention)\n");

    enum { NB = 16 };
    static const char *labels[NB] = {
        "mtp draft head", "vision (ignored)", "routed experts", "shared experts", "routers", "mlp",
        "deltanet", "qsa indexer", "attention", "ple n-gram table", "ple gating", "hyper-connections",
        "embeddings", "lm_head", "norms", "other",
    };
    info_bucket bk[NB];
    memset(bk, 0, sizeof(bk));
    int64_t total = 0;
    /* the tensors of the file, or those converted at load and the file's that were not converted */
    int n_file = m->gguf ? (int)m->gguf->n_tensors : m->ws.n_entries, n_conv = m->conv ? m->conv->n_tensors : 0;
    for (int i = 0; i < n_conv + n_file; i++) {
        const qw_tensor *t = i < n_conv ? &m->conv->tensors[i]
                             : m->gguf ? &m->gguf->tensors[i - n_conv].t
                                       : &m->ws.entries[i - n_conv].t;
        int k = i < n_conv || m->gguf ? info_bucket_of_gguf(t->name, hp->n_layer) : info_bucket_of(t->name);
        if (i >= n_conv && n_conv && k > 1) continue;
        int64_t n = qw_tensor_nelem(t);
        bk[k].params += n;
        bk[k].n_tensors++;
        bk[k].by_type[t->type] += n;
        if (k > 1) total += n;
    }
    if (hp->tie_embd && m->output == m->tok_embd) fprintf(f, "lm_head      tied to embed_tokens\n");
    fprintf(f, "parameters   (tensors, parameters, dtypes)\n");
    for (int k = 0; k < NB; k++) {
        if (!bk[k].n_tensors) continue;
        fprintf(f, "  %-18s %6d ", labels[k], bk[k].n_tensors);
        print_count(f, bk[k].params);
        fprintf(f, "  ");
        for (int t = 0; t < QW_TYPE_COUNT; t++)
            if (bk[k].by_type[t]) fprintf(f, " %s", qw_type_name((qw_type)t));
        fprintf(f, "\n");
    }
    fprintf(f, "  %-18s %6s ", "total (text model)", "");
    print_count(f, total);
    fprintf(f, "\n");
}
