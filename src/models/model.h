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
#include "models/arch.h"

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
    /* weights made on a GPU (qw_model_quantize_at_load's dev): the tensors that are not F32 have addresses in
     * this reserved, never written mapping (reads give zeros) that stand for their device copies */
    uint8_t *keys;
    size_t keys_bytes;
} qw_converted;

struct qwenc_model {
    char *path;
    qwenc_model_params params;
    qw_hparams hp;
    qw_weightset ws;
    const char *prefix;        /* "model." or "model.language_model." */
    qw_backend *be;            /* where the weights are read and the forward runs (owned) */
    const char *backend_name;  /* "cpu" or "cpu-guard" */
    int64_t ple_host_bytes;    /* on a GPU: the n-gram table's bytes read from host memory (0: in device memory) */
    const qw_tensor *tok_embd; /* [V, H] */
    const qw_tensor *output;   /* [V, H] lm_head (tok_embd when tied) */
    float *out_norm;           /* [H] final norm (not qwen4_exp) */
    qw_hc_w hc_final;          /* qwen4_exp final stream mixer */
    qw_layer *layers;          /* [n_layer] */
    float *rope_inv_freq;      /* [n_rot/2] */
    qw_mtp_w mtp;              /* the MTP draft head when hp.n_mtp (its layer: layers[hp.n_layer]) */
    int n_mtp_tensors;         /* the draft head's tensors in the source (bound or not) */
    int64_t n_mtp_params;
    int n_ignored_tensors;     /* vision tower and other tensors the text model does not use */
    qw_gguf *gguf;             /* the mapped file when loaded from a .gguf (ws is then empty), else NULL */
    char gguf_note[512];       /* what the GGUF lacked and qwenc assumed (printed by qwenc info) */
    qw_converted *conv;        /* weights quantized at load (params.quant), else NULL */
    void **owned;              /* f32 copies made at load, freed with the model */
    int n_owned, cap_owned;
};


/* Per architecture (llama.c: llama, qwen3; qwen35.c: qwen3_5, qwen3_5_moe, qwen3_next; qwen4exp.c: qwen4_exp):
 * every tensor, as roles (models/bind.h), and the forward (models/arch.h, qw_arch_def). */
void qw_llama_tensors(qw_binder *b);
void qw_qwen35_tensors(qw_binder *b);
void qw_qwen4exp_tensors(qw_binder *b);
/* Run n_tok tokens through the layers; hidden [n_tok][n_embd] receives the final (pre lm_head) vectors. */
void qw_llama_forward(const qw_fwd *f, float *hidden);
void qw_qwen35_forward(const qw_fwd *f, float *hidden);
void qw_qwen4exp_forward(const qw_fwd *f, float *hidden);
/* The MTP draft head over f->n_tok rows (row r: input token f->tokens[r] at its position, h_in row r the hidden
 * of the position before, qw_mtp_width wide): h_next [n_tok][qw_mtp_width] what a chained step reads next,
 * out [n_tok][n_embd] the lm_head's input. */
void qw_qwen35_mtp_forward(const qw_fwd *f, const float *h_in, float *h_next, float *out);
void qw_qwen4exp_mtp_forward(const qw_fwd *f, const float *h_in, float *h_next, float *out);
/* Floats per token of the hidden the draft head reads: the final norm's output, or qwen4_exp's C*H streams. */
int qw_mtp_width(const qw_hparams *hp);

/* ---- checkpoint directories (models/hf_bind.c) ---- */
/* Hyper-parameters and every weight of a checkpoint directory (m->path, m->be set; fills the rest). */
qwenc_status qw_hf_model_load(qwenc_model *m, const char *path, char *err, size_t errlen);

/* ---- GGUF files (models/gguf_bind.c, gguf_save.c) ---- */
/* 1 when path names a file (read as GGUF) rather than a checkpoint directory. */
int qw_path_is_gguf(const char *path);
/* Hyper-parameters and every weight of a .gguf (m->path, m->be set; fills the rest). */
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
 * buffer (m->conv), and bind the model from them as from the GGUF qwenc quantize would write. gen supplies the
 * rows of tensors without data (a synthetic model; NULL when all have data). dev: a CUDA backend to make the
 * tensors that are not F32 in, as random weights of their types (qw_backend_cuda_weights_random, seeded by
 * seed and the tensor's name), never held on the host (m->conv->keys); NULL: every tensor on the host. */
qwenc_status qw_model_quantize_at_load(qwenc_model *m, qw_row_gen gen, void *gen_user, qw_backend *dev, uint64_t seed,
                                       char *err, size_t errlen);
void qw_model_converted_free(qwenc_model *m);
/* The bytes of the n-gram table (PLE) that a token's rows are gathered from; 0 without one. */
int64_t qw_model_ple_table_bytes(const qwenc_model *m);
/* The bytes of the routed experts of the text model's MoE layers (what --gpus spreads) */
int64_t qw_model_expert_bytes(const qwenc_model *m);
/* The bytes of layer il's matrices (il = n_layer: the MTP head's layer), every expert counted (--split layer) */
int64_t qw_model_layer_bytes(const qwenc_model *m, int il);
/* Bind every weight of m from m->conv (GGUF names; models/gguf_bind.c). */
qwenc_status qw_gguf_bind_converted(qwenc_model *m, char *err, size_t errlen);

/* ---- synthetic models (models/synth.c) ---- */
/* An empty model named synth-PRESET (QWENC_ERR_NOMEM), for qw_synth_bind. */
qwenc_status qw_synth_model_new(const qwenc_synth_params *sp, qwenc_model **out, char *err, size_t errlen);
/* Check sp and bind m (m->path set) at the preset's geometry: matrices without data, the vectors drawn. */
qwenc_status qw_synth_bind(const qwenc_synth_params *sp, qwenc_model *m, char *err, size_t errlen);
/* The rows of those matrices (a qw_row_gen; user: a uint64_t, the seed): what qwenc synth writes. */
void qw_synth_row(const qw_tensor *t, int64_t row, int64_t cols, float *out, void *user);

/* Dispatch to the architecture's forward. */
void qw_model_forward(const qw_fwd *f, float *hidden);

/* Zeroed buffers freed with the model; NULL when out of memory (the binders' qw_bind_own, models/bind.h). */
void *qw_model_own(qwenc_model *m, size_t bytes);

#endif
