/*
 * model.h - the loaded model: hyper-parameters, the weights bound per layer (blocks/weights.h), the files
 * they are mapped from; loading, binding, GGUF reading and writing, quantizing at load.
 */
#ifndef QW_MODEL_H
#define QW_MODEL_H

#include "core/common.h"
#include "formats/gguf.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "kernels/ops.h"
#include "tensor/tensor.h"
#include "blocks/weights.h"

/* One forward step's context (runtime/session.h). */
typedef struct qw_fwd qw_fwd;

/* Weights converted at load (--quant): the tensors `qwenc quantize --type TYPE` would write, under their GGUF
 * names, their data in one owned buffer. The model's views point into it; the source stays mapped (for
 * qwenc info's listing) but its pages are released as each tensor is converted. */
typedef struct {
    char type[16];            /* the type name as given */
    qw_tensor *tensors;       /* [n_tensors] */
    int n_tensors;
    char *names;              /* [n_tensors][64] backing store of the tensor names */
    uint8_t *data;            /* every tensor's bytes, each at a 64-byte aligned offset */
    uint64_t n_bytes;         /* bytes of tensor data (without the alignment padding) */
} qw_converted;

struct qwenc_model {
    char *path;
    qwenc_model_params params;
    qw_hparams hp;
    qw_weightset ws;
    const char *prefix;        /* "model." or "model.language_model." */
    const qw_ops *ops;
    const qw_tensor *tok_embd; /* [V, H] */
    const qw_tensor *output;   /* [V, H] lm_head (tok_embd when tied) */
    float *out_norm;           /* [H] final norm (not qwen4_exp) */
    qw_hc_w hc_final;          /* qwen4_exp final stream mixer */
    qw_layer *layers;          /* [n_layer] */
    float *rope_inv_freq;      /* [n_rot/2] */
    int n_mtp_tensors;         /* mtp.* tensors present (draft head, used by speculative decoding) */
    int64_t n_mtp_params;
    int n_ignored_tensors;     /* vision tower and other tensors the text model does not use */
    qw_gguf *gguf;             /* the mapped file when loaded from a .gguf (ws is then empty), else NULL */
    char gguf_note[512];       /* what the GGUF lacked and qwenc assumed (printed by qwenc info) */
    qw_converted *conv;        /* weights quantized at load (params.quant), else NULL */
    void **owned;              /* f32 copies made at load, freed with the model */
    int n_owned, cap_owned;
};


/* Per-architecture entry points (llama.c, qwen35.c, qwen4exp.c). */
qwenc_status qw_llama_bind(qwenc_model *m, char *err, size_t errlen);
qwenc_status qw_qwen35_bind(qwenc_model *m, char *err, size_t errlen);
qwenc_status qw_qwen4exp_bind(qwenc_model *m, char *err, size_t errlen);
/* Run n_tok tokens through the layers; hidden [n_tok][n_embd] receives the final (pre lm_head) vectors. */
void qw_llama_forward(const qw_fwd *f, float *hidden);
void qw_qwen35_forward(const qw_fwd *f, float *hidden);
void qw_qwen4exp_forward(const qw_fwd *f, float *hidden);

/* ---- GGUF files (models/gguf_bind.c, gguf_save.c) ---- */
/* 1 when path names a file (read as GGUF) rather than a checkpoint directory. */
int qw_path_is_gguf(const char *path);
/* Hyper-parameters and every weight of a .gguf (m->path, m->ops set; fills the rest). */
qwenc_status qw_gguf_model_load(qwenc_model *m, const char *path, char *err, size_t errlen);

/* Rows of a tensor that has no data (data == NULL: qwenc synth generates them): out[0..cols) = row `row` of t. */
typedef void (*qw_row_gen)(const qw_tensor *t, int64_t row, int64_t cols, float *out, void *user);
/* qwenc_model_save_gguf, with gen supplying the rows of tensors without data (may be NULL when all have data). */
qwenc_status qw_model_save_gguf_gen(const qwenc_model *m, const char *path, const qwenc_gguf_params *params,
                                    qw_row_gen gen, void *gen_user, char *err, size_t errlen);

/* The tensors qwenc_model_save_gguf writes for a model, with their types: the GGUF names, the converter's
 * transformations and llama-quantize's per-tensor policy (gguf_map.h). Written to a file by qwenc quantize,
 * converted into memory by --quant (models/load_quant.c). Not thread-safe: one user at a time. */
typedef struct qw_gguf_plan qw_gguf_plan;
/* The plan for `type` (a name of qwenc_gguf_types), converting on n_threads threads (0: one per core); gen
 * supplies the rows of tensors without data (NULL when all have data). QWENC_ERR_ARG for an unknown type,
 * QWENC_ERR_NOMEM when out of memory. */
qwenc_status qw_gguf_plan_new(const qwenc_model *m, const char *type, int n_threads, qw_row_gen gen, void *gen_user,
                              qw_gguf_plan **out, char *err, size_t errlen);
void qw_gguf_plan_free(qw_gguf_plan *pl);
int qw_gguf_plan_n_tensors(const qw_gguf_plan *pl);
/* Bytes of the data of every tensor together (no alignment padding). */
uint64_t qw_gguf_plan_bytes(const qw_gguf_plan *pl);
/* Tensor i as the file holds it: GGUF name (valid while pl lives), type, shape in PyTorch order; data NULL. */
qw_tensor qw_gguf_plan_tensor(const qw_gguf_plan *pl, int i);
/* The bytes of the loaded model's views that rows [r0, r0+n) of tensor i read: fn(data, bytes, user) for each
 * piece's whole rows in that range (nothing for a vector made at load). A tensor with a row map may read any
 * piece for any row: every piece whole, once, with the first batch (r0 = 0) when `before` (the bytes about to
 * be read), else with the batch that reaches its last row (the bytes done with). */
void qw_gguf_plan_sources(const qw_gguf_plan *pl, int i, int64_t r0, int64_t n, int before,
                          void (*fn)(const void *data, size_t bytes, void *user), void *user);
/* Rows per conversion batch of tensor i (the f32 scratch of a batch is bounded, ~64 MiB). */
int64_t qw_gguf_plan_batch_rows(const qw_gguf_plan *pl, int i);
/* Rows [r0, r0+n) of tensor i converted to f32, reordered and quantized into dst (n rows of its type). Fails only
 * for lack of memory for the conversion's scratch (QWENC_ERR_NOMEM). */
qwenc_status qw_gguf_plan_rows(qw_gguf_plan *pl, int i, int64_t r0, int64_t n, void *dst, char *err, size_t errlen);

/* ---- quantizing at load (qwenc_model_params.quant; models/load_quant.c, gguf_bind.c) ---- */
/* Replace the bound weights of m by the tensors of the plan for m->params.quant, converted into one owned
 * buffer (m->conv), and bind the model from them as from the GGUF qwenc quantize would write. */
qwenc_status qw_model_quantize_at_load(qwenc_model *m, char *err, size_t errlen);
void qw_model_converted_free(qwenc_model *m);
/* Bind every weight of m from m->conv (GGUF names; models/gguf_bind.c). */
qwenc_status qw_gguf_bind_converted(qwenc_model *m, char *err, size_t errlen);

/* Dispatch to the architecture's forward. */
void qw_model_forward(const qw_fwd *f, float *hidden);

/* ---- weight binding (models/bind.c): first error wins, later calls return NULL ---- */
typedef struct {
    qwenc_model *m;
    char *err;
    size_t errlen;
    qwenc_status st;
    char name[256];
} qw_binder;

/* Format a tensor name; a leading '~' is replaced by the model's prefix ("model." ...). */
const char *qw_bind_name(qw_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether a tensor of that (prefixed) name exists. */
int qw_bind_has(qw_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A float matrix of shape [d0, d1]. */
const qw_tensor *qw_bind_mat(qw_binder *b, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A float tensor of any rank with the given shape. */
const qw_tensor *qw_bind_tensor(qw_binder *b, int n_dims, const int64_t *shape, const char *name);
/* A 1-D float vector [n] (or [ch, 1, k] conv kernel when k > 0) copied to f32. */
float *qw_bind_vec(qw_binder *b, int64_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
float *qw_bind_conv(qw_binder *b, int64_t ch, int64_t k, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Routed experts, per-expert or fused, and the shared expert of layer il. */
void qw_bind_moe(qw_binder *b, int il, qw_moe_w *w);
/* Dense SwiGLU MLP at ~layers.{il}.mlp. */
void qw_bind_mlp(qw_binder *b, int il, qw_ffn_w *w, int64_t n_ff);
/* Full / gated / QSA attention and Gated DeltaNet weights of layer il. */
void qw_bind_attn(qw_binder *b, int il, qw_attn_w *w, int qk_norm, int gated, int qsa);
void qw_bind_gdn(qw_binder *b, int il, qw_gdn_w *w);
/* Zeroed buffers freed with the model; NULL when out of memory. */
void *qw_model_own(qwenc_model *m, size_t bytes);
float *qw_model_own_f32(qwenc_model *m, int64_t n);
/* The same for a binder: NULL and b->st set (QWENC_ERR_NOMEM naming the model and `what`) on failure, or NULL
 * at once after an earlier error. */
void *qw_bind_own(qw_binder *b, size_t bytes, const char *what);

#endif
