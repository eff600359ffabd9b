/*
 * hfconfig.h - hyper-parameters of a model, read once from a Hugging Face config.json.
 *
 * Accepts the flat layout and the multimodal one (fields inside "text_config"; the text fields win and
 * the top level fills in what they lack). Defaults follow transformers 5.17 for each model_type; every
 * missing required field and every inconsistent value is an error naming config.json and the field.
 */
#ifndef QW_HFCONFIG_H
#define QW_HFCONFIG_H

#include "core/common.h"

/* The architectures: each has a registry entry (models/arch.c) with its names and properties, which code asks
 * for (qw_arch_has) rather than comparing architectures. */
typedef enum {
    QW_ARCH_LLAMA = 0,
    QW_ARCH_QWEN3,
    QW_ARCH_QWEN35,     /* qwen3_5 dense */
    QW_ARCH_QWEN35_MOE, /* qwen3_5_moe */
    QW_ARCH_QWEN3_NEXT,
    QW_ARCH_QWEN4EXP,
    QW_ARCH_COUNT
} qw_arch;

typedef enum {
    QW_LAYER_ATTN = 0, /* full softmax attention */
    QW_LAYER_GDN,      /* Gated DeltaNet ("linear_attention") */
    QW_LAYER_QSA       /* Qwen sparse attention with block indexer */
} qw_layer_kind;

typedef enum { QW_ROPE_DEFAULT = 0, QW_ROPE_LLAMA3, QW_ROPE_LINEAR } qw_rope_type;

typedef struct {
    qw_arch arch;
    char model_type[48]; /* as found in config.json (top level) */

    int n_vocab, n_embd, n_layer;
    int n_head, n_head_kv, head_dim;
    int n_ff;            /* dense MLP width (intermediate_size), 0 if none */
    float norm_eps;
    int tie_embd;
    int n_ctx_train;

    /* rope */
    qw_rope_type rope_type;
    float rope_theta;
    int n_rot;           /* rotated dims per head: int(head_dim * partial_rotary_factor) */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;

    /* Gated DeltaNet */
    int gdn_conv_k;      /* linear_conv_kernel_dim */
    int gdn_dk, gdn_dv;  /* linear_key_head_dim, linear_value_head_dim */
    int gdn_hk, gdn_hv;  /* linear_num_key_heads, linear_num_value_heads */
    int gdn_gate_sigmoid; /* output gate sigma (qwen4_exp "sigmoid") instead of silu */

    /* MoE */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int norm_topk_prob;

    /* hyper-connections (qwen4_exp) */
    int hc_count, hc_lowrank;

    /* PLE hashed n-gram embedding (qwen4_exp) */
    int n_ple;           /* number of PLE layers */
    int *ple_layers;     /* [n_ple] 0-based layer index, ascending */
    int ple_dim, ple_conv_k, ngram_n, ngram_heads;
    int64_t ngram_base;
    int ngram_div;
    uint64_t ngram_seed;

    /* QSA indexer */
    int idx_n_head, idx_head_dim, idx_budget, idx_ratio;

    /* MTP draft head (speculative decoding): 0, or 1 when the model's head is bound; its decoder layer is
     * qwenc_model.layers[n_layer] (a checkpoint's mtp.layers.0, a GGUF's blk.<n_layer>) */
    int n_mtp;

    int eos_id;          /* first eos_token_id, -1 if none */
    int bos_id;

    qw_layer_kind *layer_kind; /* [n_layer] */
    uint8_t *layer_moe;        /* [n_layer] 1: sparse MoE FFN, 0: dense MLP */
} qw_hparams;

/* ---- bounds of the integer hyper-parameters (hfconfig.c): one table for both readers ---- */
typedef enum {
    QW_HP_VOCAB, QW_HP_EMBD, QW_HP_LAYER, QW_HP_MTP_LAYER, QW_HP_HEAD, QW_HP_HEAD_KV, QW_HP_HEAD_DIM, QW_HP_ROT,
    QW_HP_FF, QW_HP_CTX, QW_HP_ROPE_ORIG_CTX, QW_HP_TOKEN_ID,
    QW_HP_GDN_CONV, QW_HP_GDN_DK, QW_HP_GDN_DV, QW_HP_GDN_HK, QW_HP_GDN_HV, QW_HP_GDN_INNER, QW_HP_ATTN_INTERVAL,
    QW_HP_EXPERT, QW_HP_EXPERT_USED, QW_HP_FF_EXP, QW_HP_FF_SHEXP, QW_HP_SPARSE_STEP,
    QW_HP_HC_COUNT, QW_HP_HC_LOWRANK,
    QW_HP_IDX_HEAD, QW_HP_IDX_HEAD_DIM, QW_HP_IDX_BUDGET, QW_HP_IDX_RATIO,
    QW_HP_PLE_DIM, QW_HP_PLE_DH, QW_HP_PLE_CONV, QW_HP_NGRAM_N, QW_HP_NGRAM_HPN, QW_HP_NGRAM_BASE, QW_HP_NGRAM_DIV,
    QW_HP_SEED,
    QW_HP_COUNT
} qw_hp_field;

typedef struct {
    const char *config; /* the config.json field, NULL where config.json has none */
    const char *gguf;   /* the GGUF metadata key after "<arch>.", NULL where the metadata has none */
    int64_t lo, hi;     /* the values accepted, lo..hi */
} qw_hp_limit;

const qw_hp_limit *qw_hp_limit_of(qw_hp_field f);
/* QWENC_OK when lo <= v <= hi (v a whole number); else QWENC_ERR_FORMAT with "<path>: <name> is <v>, expected
 * <lo>..<hi>" and, when note is not NULL, " (<note>)". name is the field as the message shows it: "\"head_dim\""
 * for config.json, "metadata key 'qwen4exp.ple.heads_per_ngram'" for a GGUF. */
qwenc_status qw_hp_check(double v, int64_t lo, int64_t hi, const char *path, const char *name, const char *note,
                         char *err, size_t errlen);
/* The checks across fields of a filled qw_hparams that the per-field bounds leave open (the primes of the PLE
 * hash tables, which a GGUF gives rather than asks for); gguf: the fields as a GGUF's metadata names them.
 * Called by both readers before anything is derived from the totals. */
qwenc_status qw_hparams_check(const qw_hparams *hp, const char *path, int gguf, char *err, size_t errlen);

/* Parse config.json of directory dir (the path is used in messages). */
qwenc_status qw_hparams_load(qw_hparams *hp, const char *dir, char *err, size_t errlen);
/* The same from the text of a config.json (path names it in messages). */
qwenc_status qw_hparams_parse(qw_hparams *hp, const char *json, const char *path, char *err, size_t errlen);
void qw_hparams_free(qw_hparams *hp);
/* hp->layer_kind and hp->layer_moe for hp->n_layer layers, zeroed; QWENC_ERR_NOMEM naming path on failure. */
qwenc_status qw_hparams_alloc_layers(qw_hparams *hp, const char *path, char *err, size_t errlen);

#endif
