/*
 * gguf_map.h - how qwenc's models sit in llama.cpp's GGUF files: metadata keys, the tensor roles (their GGUF and
 * checkpoint names and the transformations llama.cpp's converter applies), and the per-tensor type policy of
 * `qwenc quantize` (llama-quantize's choices plus qwenc's floor for fragile tensors). The architectures' own
 * properties (names, layouts) are their registry entries (models/arch.h).
 *
 * Upstream definitions followed (node-llama-cpp 3.22.1's llama.cpp): convert_hf_to_gguf.py with
 * conversion/{base,llama,qwen,qwen4exp}.py, gguf-py/gguf/{constants,tensor_mapping,gguf_writer}.py for
 * the names and key types, src/models/{llama,qwen3,qwen35,qwen35moe,qwen3next,qwen4exp}.cpp for what the
 * runtime requires, src/llama-quant.cpp for the tensor types of a quantized file. docs/GGUF.md is the prose
 * version of these tables.
 *
 * Layout conventions: qwenc's structs hold the Hugging Face layout unless a flag says otherwise
 * (qw_gdn_w.v_tiled, qw_attn_w.rope_interleaved); loading a GGUF binds views with those flags set, and
 * writing one applies the converter's transformation only where the source is in the HF layout (bind.h).
 */
#ifndef QW_GGUF_MAP_H
#define QW_GGUF_MAP_H

#include "formats/gguf.h"
#include "models/arch.h"

/* llama.cpp's architecture name ("qwen4exp", "qwen35moe", ...) of a qwenc architecture (models/arch.c). */
const char *qw_gguf_arch_name(qw_arch a);

/* A metadata key of the architecture: "<arch>.<suffix>", e.g. qw_gguf_key(b, QW_ARCH_QWEN35, "ssm.conv_kernel"). */
const char *qw_gguf_key(char *buf, size_t n, qw_arch a, const char *suffix);

/* Every tensor role of the six architectures. Layer roles are written blk.<il>.<name>. */
typedef enum {
    /* model-wide */
    QW_GT_TOKEN_EMBD,
    QW_GT_OUTPUT,
    QW_GT_OUTPUT_NORM,
    QW_GT_ROPE_FREQS,
    QW_GT_HC_HEAD_NORM,
    QW_GT_HC_HEAD_DOWN,
    QW_GT_HC_HEAD_UP,
    QW_GT_PLE_TABLE,
    /* per layer */
    QW_GT_ATTN_NORM,
    QW_GT_FFN_NORM,
    QW_GT_POST_ATTN_NORM,
    QW_GT_ATTN_Q,
    QW_GT_ATTN_K,
    QW_GT_ATTN_V,
    QW_GT_ATTN_OUT,
    QW_GT_ATTN_Q_NORM,
    QW_GT_ATTN_K_NORM,
    QW_GT_INDEXER_Q,
    QW_GT_INDEXER_K,
    QW_GT_INDEXER_Q_NORM,
    QW_GT_INDEXER_K_NORM,
    QW_GT_SSM_QKV,
    QW_GT_SSM_GATE,
    QW_GT_SSM_BETA,
    QW_GT_SSM_ALPHA,
    QW_GT_SSM_BA,
    QW_GT_SSM_CONV,
    QW_GT_SSM_DT,
    QW_GT_SSM_A,
    QW_GT_SSM_NORM,
    QW_GT_SSM_OUT,
    QW_GT_FFN_GATE,
    QW_GT_FFN_UP,
    QW_GT_FFN_DOWN,
    QW_GT_FFN_GATE_INP,
    QW_GT_FFN_GATE_EXPS,
    QW_GT_FFN_UP_EXPS,
    QW_GT_FFN_DOWN_EXPS,
    QW_GT_FFN_GATE_SHEXP,
    QW_GT_FFN_UP_SHEXP,
    QW_GT_FFN_DOWN_SHEXP,
    QW_GT_FFN_GATE_INP_SHEXP,
    QW_GT_HC_ATTN_NORM,
    QW_GT_HC_ATTN_DOWN,
    QW_GT_HC_ATTN_UP,
    QW_GT_HC_ATTN_INJECT,
    QW_GT_HC_FFN_NORM,
    QW_GT_HC_FFN_DOWN,
    QW_GT_HC_FFN_UP,
    QW_GT_HC_FFN_INJECT,
    QW_GT_PLE_KEY,
    QW_GT_PLE_VALUE,
    QW_GT_PLE_NORM_KEY,
    QW_GT_PLE_NORM_QUERY,
    QW_GT_PLE_NORM_CONV,
    QW_GT_PLE_CONV,
    /* the MTP draft head, in the block after the last layer (blk.<n_layer>.nextn.*; checkpoint mtp.*) */
    QW_GT_MTP_EH_PROJ,
    QW_GT_MTP_E_PROJ,
    QW_GT_MTP_H_PROJ,
    QW_GT_MTP_ENORM,
    QW_GT_MTP_HNORM,
    QW_GT_MTP_NORM,
    QW_GT_MTP_HC_NORM,
    QW_GT_MTP_HC_DOWN,
    QW_GT_MTP_HC_UP,
    QW_GT_COUNT
} qw_gt;

/* How a role's tensor differs between the bound model (the Hugging Face layout) and a GGUF (qw_gt_info.xf). */
enum {
    QW_XF_NORM = 1,    /* an RMSNorm weight w: 1 + w in the file of a QW_AF_NORM_PLUS_ONE architecture; F32 */
    QW_XF_NEG_EXP = 2, /* A_log in a checkpoint; bound and in the file as -exp(A_log) */
    QW_XF_ROPE = 4,    /* the rows of each head in interleaved RoPE order (QW_AF_ROPE_INTERLEAVED): HF row i of
                        * a head of hd rows (rotate-half order) at row qw_gguf_rope_row(i, hd) */
    QW_XF_VHEADS = 8,  /* one row per DeltaNet value head, in tiled order (QW_AF_V_TILED) */
    QW_XF_VROWS = 16,  /* the last hv * dv rows are the value heads' (dv each), in tiled order */
    QW_XF_VCOLS = 32,  /* columns, dv per value head, in tiled order */
};

typedef struct {
    const char *gguf; /* name after "blk.<il>." for layer roles, the whole name otherwise */
    int per_layer;
    const char *hf;   /* the checkpoint's tensor: after "<prefix>layers.<il>." for layer roles (after
                       * "mtp.layers.0." in the MTP head's layer il = n_layer), whole where it starts with "mtp.",
                       * else after the prefix ("model." or "model.language_model.") where it starts with '~', else
                       * whole;
                       * NULL where the role is not one tensor of the checkpoint (its io's function says) */
    unsigned xf;      /* QW_XF_* */
    int fragile;      /* never stored below Q8_0 by qwenc quantize */
    const char *how;  /* the converter's transformation, in words ("" when it copies the tensor) */
} qw_gt_info;

const qw_gt_info *qw_gt_info_of(qw_gt t);
/* The GGUF name of role t at layer il (il ignored for model-wide roles), written into buf. */
const char *qw_gt_name(char *buf, size_t n, qw_gt t, int il);

/* The n-gram table of the li-th PLE layer (layer il): llama.cpp's per_layer_token_embd.weight for the first,
 * qwenc's blk.<il>.ple_token_embd.weight for the others (llama.cpp reads one PLE layer). */
const char *qw_gguf_ple_table_name(char *buf, size_t n, int li, int il);

/* Value head j = g*r + i of key head g (HF, grouped) sits at i*hk + g in tiled order. */
static inline int qw_gguf_vhead_tiled(int j, int hk, int r) { return (j % r) * hk + j / r; }
/* llama: HF row i of a head of hd rows is stored at row qw_gguf_rope_row(i, hd). */
static inline int qw_gguf_rope_row(int i, int hd) { return i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1; }

/* ---- hyper-parameters from metadata (gguf_map.c) ---- */

/* Fill hp from the metadata (and the presence of some tensors) of g. Where the file lacks what the
 * checkpoint had (converter limits, docs/GGUF.md), the assumption made is appended to note. */
qwenc_status qw_hparams_from_gguf(qw_hparams *hp, const qw_gguf *g, const char *path, char *note, size_t notelen,
                                  char *err, size_t errlen);

/* ---- tensor types of a written file (llama-quantize + qwenc's floor) ---- */

typedef struct {
    int ftype;        /* llama_ftype written to general.file_type */
    qw_type base;     /* the type most weights get */
    qw_type keep;     /* the float type of what llama-quantize leaves alone (the converter's output type) */
    int quantized;    /* base is a block type */
    int n_layer, n_expert, n_gqa, tied;
    int n_attn_v, i_attn_v, i_ffn_down; /* llama-quantize's counters */
} qw_gguf_policy;

/* Parse a target as llama-quantize names it (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K = Q4_K_M,
 * Q4_K_S, Q5_K = Q5_K_M, Q5_K_S, Q6_K, IQ4_NL, IQ4_XS; any case) into p->ftype and p->base. 0 if unknown. */
int qw_gguf_policy_parse(qw_gguf_policy *p, const char *name);
/* The list of accepted names, for usage messages. */
const char *qw_gguf_policy_names(void);
/* The type of one tensor. conv_f32: the converter forces it to F32 (norms, 1-D, router, conv, biases).
 * shape in PyTorch order (shape[n_dims-1] is the row). Call in file order (llama-quantize counts). */
qw_type qw_gguf_policy_type(qw_gguf_policy *p, qw_gt role, const char *name, int n_dims, const int64_t *shape,
                            int conv_f32);

#endif
