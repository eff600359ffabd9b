/*
 * bind.h - one description of each architecture's tensors, run against four sources.
 *
 * An architecture's tensors function (qw_arch_def.tensors, in its own file) walks its model and names every
 * tensor by its role (qw_gt, gguf_map.h), its layer, its shape from the hyper-parameters and the field of
 * qw_layer / qwenc_model that holds it (the slot), in the order of its GGUF file; the block helpers below
 * (attention, DeltaNet, MoE, hyper-connections, PLE) do the same for the blocks the architectures share. What
 * a call does depends on the binder's io, the source:
 *   checkpoint   a Hugging Face directory: the checkpoint's name of the role, its shape and dtype checked;
 *                matrices as views into the mapped safetensors, vectors as f32 copies (hf_bind.c)
 *   GGUF         a llama.cpp GGUF, or the tensors converted at load (--quant): the GGUF name, the converter's
 *                transformation undone (gguf_bind.c)
 *   plan         the bound model read back into the tensors a GGUF holds, the converter's transformations
 *                applied (gguf_save.c: qwenc quantize, --quant)
 *   synth        tensors without data and random vectors at the shapes given (synth.c: qwenc synth)
 * So the set of tensors, their shapes and their order are written once, per architecture and per block.
 *
 * Slots are written by every io but the plan's, which only reads them (the model it reads is shared and
 * read-only). What a role's tensor looks like in each form (names, transformation, quantization category) is
 * the role table of gguf_map.c. A few structures are not one tensor per slot in every form: the fused q/k/v
 * of a GGUF, the indexer's one projection, the DeltaNet input projections (fused per key head in qwen3_next
 * checkpoints and GGUFs), the routed experts (per expert, fused or stacked) and the PLE table (shards, hash
 * constants); each io implements those as a whole.
 *
 * Errors: the first one wins (b->st); later calls do nothing.
 */
#ifndef QW_BIND_H
#define QW_BIND_H

#include "models/gguf_map.h"
#include "models/model.h"

/* The layout flags of a block: set when its tensors are bound in the GGUF file's order (views of a GGUF). */
typedef enum {
    QW_LAYOUT_ROPE = 1,   /* qw_attn_w.rope_interleaved */
    QW_LAYOUT_VHEADS = 2, /* qw_gdn_w.v_tiled */
} qw_layout;

typedef struct qw_bind_io qw_bind_io;

struct qw_binder {
    qwenc_model *m;
    const qw_bind_io *io;
    void *ctx;         /* the io's state */
    unsigned layout;   /* the plan: QW_LAYOUT_* of the block being read */
    char *err;
    size_t errlen;
    qwenc_status st;   /* the first error */
    char name[256];    /* scratch for tensor names */
};

struct qw_bind_io {
    int reads;       /* the plan: slots are read, never written */
    int file_layout; /* bound tensors are in the GGUF layout (qw_layout flags set as the file needs) */
    /* Whether the source holds role's tensor at layer il (-1: model-wide); not called on the plan. */
    int (*has)(qw_binder *b, qw_gt role, int il);
    /* A matrix [d0, d1] (PyTorch order). */
    void (*mat)(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot);
    /* An f32 vector [d0] (d1 == 0), or a depthwise convolution kernel [d0][d1] ([d0, 1, d1] in a checkpoint). */
    void (*vec)(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, float **slot);
    /* Attention q [nq, H], k and v [nkv, H] (ATTN_Q, ATTN_K, ATTN_V); NULL: three matrices. */
    void (*attn_qkv)(qw_binder *b, int il, int64_t nq, int64_t nkv, qw_attn_w *w);
    /* The QSA indexer's projection w->idx_qk [nq + nk, H]: queries then the key (INDEXER_Q, INDEXER_K). */
    void (*indexer)(qw_binder *b, int il, int64_t nq, int64_t nk, qw_attn_w *w);
    /* DeltaNet input projections: qkv, z, b, a (SSM_QKV, SSM_GATE, SSM_BETA, SSM_ALPHA or SSM_BA), or a
     * checkpoint's qkvz and ba fused per key head. */
    void (*gdn_in)(qw_binder *b, int il, qw_gdn_w *w);
    /* The routed experts w->experts [n_expert] (FFN_{GATE,UP,DOWN}_EXPS). */
    void (*experts)(qw_binder *b, int il, qw_moe_w *w);
    /* The PLE layer of layer il, the li-th: its hash constants and n-gram table (PLE_TABLE). */
    void (*ple_table)(qw_binder *b, int il, int li, qw_ple_w **slot);
    /* RoPE: m->rope_inv_freq (ROPE_FREQS). */
    void (*rope)(qw_binder *b);
};

/* Every tensor of b->m (its hyper-parameters set): the layers (allocated unless the io reads), the
 * architecture's tensors, RoPE. */
qwenc_status qw_bind_model(qw_binder *b);

/* ---- for the architectures' tensors functions ---- */
void qw_bind_mat(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot);
void qw_bind_vec(qw_binder *b, qw_gt role, int il, int64_t n, float **slot);
void qw_bind_conv(qw_binder *b, qw_gt role, int il, int64_t ch, int64_t k, float **slot);
/* token_embd [V, H]; output [V, H] (the token embedding when tied and absent). */
void qw_bind_embd(qw_binder *b);
void qw_bind_output(qw_binder *b);
/* Full, gated (q_proj per head [q_h | gate_h]) or QSA attention; qk_norm: per-head q/k norms. */
void qw_bind_attn(qw_binder *b, int il, qw_attn_w *w, int qk_norm, int gated, int qsa);
void qw_bind_gdn(qw_binder *b, int il, qw_gdn_w *w);
/* A dense SwiGLU MLP (FFN_GATE, FFN_UP, FFN_DOWN) of width hp->n_ff. */
void qw_bind_mlp(qw_binder *b, int il, qw_ffn_w *w);
/* Router, routed experts, the shared expert's gate and MLP. */
void qw_bind_moe(qw_binder *b, int il, qw_moe_w *w);
/* Hyper-connection: norm [C*H], down [r, C*H], up [C*H, r], inject [C, C*H] (QW_GT_COUNT: none). */
void qw_bind_hc(qw_binder *b, int il, qw_hc_w *w, qw_gt norm, qw_gt down, qw_gt up, qw_gt inject);
/* Every PLE layer's hash constants and table (the file holds the tables after token_embd). */
void qw_bind_ple_tables(qw_binder *b);
/* PLE layer il's projections, norms and convolution. */
void qw_bind_ple(qw_binder *b, int il, qw_ple_w *w);
/* The MTP draft head when hp->n_mtp: its own tensors and its decoder layer (layer n_layer). */
void qw_bind_mtp(qw_binder *b);

/* ---- for the ios ---- */
/* Whether a GGUF of b's architecture stores the layout `which` (the flag a GGUF's views get: the block helpers
 * set a block's flag to it when the io has file_layout, to 0 for a checkpoint; the plan reads it into
 * b->layout). */
int qw_bind_file_layout(const qw_binder *b, qw_layout which);
/* The first error: QWENC_ERR_FORMAT etc. with the message formatted. */
void qw_bind_fail(qw_binder *b, qwenc_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Zeroed buffers freed with the model (bookkeeping: views, the PLE layer); NULL and b->st set
 * (QWENC_ERR_NOMEM naming the model and `what`) on failure, or NULL at once after an earlier error. */
void *qw_bind_own(qw_binder *b, size_t bytes, const char *what);
/* A PLE layer's weights (*slot) with room for its per-head hash sizes and offsets; NULL on an error (b->st). */
qw_ple_w *qw_bind_ple_new(qw_binder *b, int li, qw_ple_w **slot);
/* The f32 vectors bound at load (norms, convolutions, A, dt_bias, RoPE frequencies): [n], zeroed. */
float *qw_bind_f32(qw_binder *b, int64_t n, const char *what);

#endif
