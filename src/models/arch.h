/*
 * arch.h - the architectures qwenc runs: one registry entry each (arch.c), holding everything that differs
 * between them outside their own file: the names they go by, the function that describes their tensors
 * (models/bind.h), their forward, and the properties the readers, binders and writers ask about.
 *
 * Nothing outside the registry compares architectures: code asks for a property (qw_arch_has(a, QW_AF_GDN)),
 * so adding an architecture is its own file (its tensors and its forward, declared in model.h), an enum value,
 * one registry line and its fixtures.
 */
#ifndef QW_ARCH_H
#define QW_ARCH_H

#include "formats/hfconfig.h"

typedef struct qw_binder qw_binder;
typedef struct qw_fwd qw_fwd;

/* Properties of an architecture (qw_arch_def.flags). */
enum {
    /* hyper-parameters (config.json, GGUF metadata) */
    QW_AF_MLP = 1 << 0,       /* every layer has a dense MLP: intermediate_size / feed_forward_length required */
    QW_AF_MOE = 1 << 1,       /* every layer is a sparse MoE: num_experts required */
    QW_AF_MOE_STEP = 1 << 2,  /* MoE layers by decoder_sparse_step and mlp_only_layers (a GGUF: the layers that
                               * have ffn_gate_inp); the dense ones need intermediate_size */
    QW_AF_TOPK_NORM = 1 << 3, /* the top-k expert weights are always renormalised (norm_topk_prob not read) */
    QW_AF_GDN = 1 << 4,       /* Gated DeltaNet layers (layer_types; GGUF ssm.* and recurrent_layers) */
    QW_AF_QSA = 1 << 5,       /* the layers that are not linear attention are QSA sparse attention */
    QW_AF_HC = 1 << 6,        /* hyper-connection streams (hc_count, hc_lowrank) instead of a final norm */
    QW_AF_PLE = 1 << 7,       /* hashed n-gram embeddings on chosen layers (ple_layer_ids) */
    QW_AF_GATE_ACT = 1 << 8,  /* the DeltaNet output gate is configurable (output_gate_type: sigmoid or silu) */
    /* tensors */
    QW_AF_QK_NORM = 1 << 9,   /* RMSNorm on each attention q and k head */
    /* llama.cpp's GGUF layout */
    QW_AF_NORM_PLUS_ONE = 1 << 10,   /* zero-centred RMSNorm weights w stored as 1 + w (not the DeltaNet norm) */
    QW_AF_V_TILED = 1 << 11,         /* DeltaNet value heads in tiled order when there are more value than key heads */
    QW_AF_SSM_BA = 1 << 12,          /* DeltaNet beta and alpha fused per key head (ssm_ba), value heads grouped */
    QW_AF_ROPE_INTERLEAVED = 1 << 13, /* q/k rows of each head permuted for interleaved RoPE */
    QW_AF_ROPE_FREQS = 1 << 14,      /* llama3 RoPE scaling written as rope_freqs.weight */
    QW_AF_MROPE = 1 << 15,           /* rope.dimension_sections written (interleaved M-RoPE) */
    QW_AF_VOCAB_KEY = 1 << 16,       /* <arch>.vocab_size and rope.dimension_count follow the attention keys */
};

typedef struct {
    qw_arch arch;
    const char *name;           /* transformers' model_type: qwenc_model_arch(), qwenc info */
    const char *model_types[3]; /* the config.json model_type values read as this architecture */
    const char *gguf;           /* llama.cpp's general.architecture */
    /* Every tensor of the architecture, as roles (models/bind.h), in the order of its GGUF file. */
    void (*tensors)(qw_binder *b);
    /* Run f->n_tok tokens through the layers; hidden [n_tok][n_embd] receives the final (pre lm_head) vectors;
     * with f->mtp_hidden set, the draft head's input rows too (model.h, qw_mtp_width). */
    void (*forward)(const qw_fwd *f, float *hidden);
    /* The MTP draft head (model.h), NULL where the architecture has none. */
    void (*mtp_forward)(const qw_fwd *f, const float *h_in, float *h_next, float *out);
    unsigned flags;             /* QW_AF_* */
} qw_arch_def;

/* transformers' name of an architecture ("?" for none). */
const char *qw_arch_name(qw_arch a);
/* The registry entry of a (valid) architecture. */
const qw_arch_def *qw_arch_get(qw_arch a);
static inline int qw_arch_has(qw_arch a, unsigned flags) { return (qw_arch_get(a)->flags & flags) != 0; }
/* The architecture a config.json model_type / a GGUF general.architecture names: 1 if known. */
int qw_arch_from_model_type(const char *model_type, qw_arch *a);
int qw_arch_from_gguf(const char *name, qw_arch *a);
/* The names known, for messages, written into buf: every model_type ("llama, qwen3, qwen3_5, qwen3_5_text, ...")
 * or every GGUF architecture ("llama, qwen3, qwen35, ..."). */
const char *qw_arch_list(char *buf, size_t n, int gguf);

#endif
