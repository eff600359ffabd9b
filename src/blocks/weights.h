/*
 * weights.h - the weights of each building block as a layer holds them, bound once at load (models/) and
 * read by the blocks' forward (blocks/).
 *
 * Big matrices are qw_tensor views into the mapped checkpoint (or, quantized at load, into the model's
 * converted buffer). Small vectors (norm weights, conv kernels, A_log, dt_bias) are converted to f32 once at
 * load: they are read at every token and are a negligible fraction of the bytes.
 */
#ifndef QW_WEIGHTS_H
#define QW_WEIGHTS_H

#include "formats/hfconfig.h"
#include "kernels/ops.h" /* qw_ffn_w: gate, up [I, H], down [H, I] */
#include "tensor/tensor.h"

typedef struct {
    const qw_tensor *wq; /* [n_head*hd*(gated?2:1), H]; gated: per head [q_h | gate_h] */
    const qw_tensor *wk, *wv; /* [n_head_kv*hd, H] */
    const qw_tensor *wo;      /* [H, n_head*hd] */
    float *q_norm, *k_norm;   /* [hd] or NULL */
    int gated;                /* sigma(gate) multiplies the head outputs before wo */
    int rope_interleaved;     /* llama GGUF: wq/wk rows of each head in llama.cpp's interleaved RoPE order
                               * (HF row i < hd/2 at 2i, row hd/2+i at 2i+1); undone on the activations */
    /* QSA indexer (NULL for plain attention) */
    const qw_tensor *idx_qk;  /* [(n_idx_head+1)*ihd, H]: queries then the one key */
    float *idx_q_norm, *idx_k_norm; /* [ihd] */
} qw_attn_w;

typedef struct {
    const qw_tensor *qkv, *z, *b, *a; /* split layout: [2*hk*dk + hv*dv, H], [hv*dv, H], [hv, H], [hv, H] */
    const qw_tensor *qkvz, *ba;       /* qwen3_next fused layout grouped by key head (qkv == NULL) */
    float *conv;                      /* [conv_ch][K] */
    float *dt_bias;                   /* [hv] */
    float *neg_exp_a;                 /* [hv] -exp(A_log) */
    float *norm;                      /* [dv] gated RMSNorm weight (plain w) */
    const qw_tensor *out;             /* [H, hv*dv] */
    int v_tiled;                      /* GGUF: value heads in llama.cpp's tiled order (value head i of key head
                                       * g at i*hk + g) in qkv, z, b, a, conv, dt_bias, A and out's columns */
} qw_gdn_w;

typedef struct {
    const qw_tensor *router;  /* [E, H] */
    qw_ffn_w *experts;        /* [E] */
    qw_ffn_w shared;          /* shared expert */
    const qw_tensor *shared_gate; /* [1, H] */
} qw_moe_w;

typedef struct {
    float *norm;              /* [C*H] hc_norm, zero-centred, grouped per stream */
    const qw_tensor *down;    /* [r, C*H] */
    const qw_tensor *up;      /* [C*H, r] */
    const qw_tensor *inject;  /* [C, C*H] or NULL (final mixer) */
} qw_hc_w;

typedef struct {
    int li;                   /* ple_layer_index: position in the sorted PLE layer list */
    const qw_tensor *key_proj;   /* [C*H, P] */
    const qw_tensor *value_proj; /* [H, P] */
    float *norm_key, *norm_query, *norm_conv; /* [C*H] */
    float *conv;              /* [C*H][k] */
    qw_tensor *chunks;        /* the n-gram table, in pieces of rows [*, dh] */
    int n_chunks;
    int64_t chunk_rows;       /* rows of every piece but the last */
    int64_t n_rows;           /* padded table rows */
    uint64_t mult[8];         /* [ngram_n] hash multipliers */
    int64_t *prime;           /* [n_heads] table size of each head */
    int64_t *offset;          /* [n_heads] first row of each head */
} qw_ple_w;

/* The MTP draft head's own tensors (its decoder layer is a qw_layer, qwenc_model.layers[n_layer]). */
typedef struct {
    const qw_tensor *fc;      /* Qwen3.5 family: [H, 2H] over concat(embedding, hidden) */
    const qw_tensor *fc_embd, *fc_hidden; /* qwen4_exp: [H, H] each */
    float *enorm;             /* [H] pre_fc_norm_embedding, zero-centred */
    float *hnorm;             /* [H], qwen4_exp [C*H] (one RMS over the streams): pre_fc_norm_hidden */
    float *norm;              /* Qwen3.5 family: [H] the head's final norm */
    qw_hc_w hc_final;         /* qwen4_exp: the head's stream mixer */
} qw_mtp_w;

typedef struct {
    qw_layer_kind kind;
    float *attn_norm, *ffn_norm; /* [H] pre-norms (not qwen4_exp) */
    qw_attn_w attn;
    qw_gdn_w gdn;
    int moe;
    qw_moe_w moe_w;
    qw_ffn_w mlp;
    qw_hc_w hc_attn, hc_mlp;  /* qwen4_exp */
    qw_ple_w *ple;            /* qwen4_exp PLE layers, else NULL */
} qw_layer;

#endif
