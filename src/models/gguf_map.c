/*
 * gguf_map.c - the tables of gguf_map.h: architecture names, tensor roles and names, the hyper-parameters
 * a GGUF's metadata gives, and the tensor-type policy of qwenc quantize.
 *
 * Metadata read here (keys "<arch>.<suffix>" unless written in full), with the converter call that writes it:
 *   block_count, context_length, embedding_length, feed_forward_length, vocab_size (llama),
 *   attention.{head_count, head_count_kv, key_length, layer_norm_rms_epsilon}, rope.{freq_base,
 *   dimension_count, scaling.type, scaling.factor}, expert_{count, used_count, feed_forward_length,
 *   shared_feed_forward_length}, nextn_predict_layers             TextModel / LlamaModel / Qwen2MoeModel
 *   ssm.{conv_kernel, state_size, group_count, time_step_rank, inner_size}, attention.recurrent_layers,
 *   full_attention_interval                                       Qwen3NextModel
 *   hyper_connection.{count, low_rank}, attention.indexer.{head_count, key_length, top_k},
 *   attention.compress_ratios, ple.{layers, ngram_size, heads_per_ngram, conv_kernel, eos_token_id,
 *   layer_multipliers, head_offsets, head_vocab_sizes}, embedding_length_per_layer_input   Qwen4ExpTextModel
 * and qwenc's own keys for what the converter drops (written by qwenc quantize, ignored by llama.cpp):
 *   expert_weights_norm (a llama.cpp key qwen3next does not read) for norm_topk_prob = false,
 *   ssm.gate_activation "silu" for a qwen4_exp checkpoint whose DeltaNet output gate is silu.
 */
#include "models/gguf_map.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

const char *qw_gguf_arch_name(qw_arch a) { return (unsigned)a < QW_ARCH_COUNT ? qw_arch_get(a)->gguf : "?"; }

const char *qw_gguf_key(char *buf, size_t n, qw_arch a, const char *suffix) {
    snprintf(buf, n, "%s.%s", qw_gguf_arch_name(a), suffix);
    return buf;
}

/* The roles: GGUF name, per layer, checkpoint name, transformation, fragile, the converter's transformation in
 * words. */
#define ZC "+1 folded in (zero-centred archs); F32"
#define VH "tiled head order"
static const qw_gt_info gt_info[QW_GT_COUNT] = {
    [QW_GT_TOKEN_EMBD] = {"token_embd.weight", 0, "~embed_tokens.weight", 0, 0, ""},
    [QW_GT_OUTPUT] = {"output.weight", 0, "lm_head.weight", 0, 0, "absent when tied to the embedding"},
    [QW_GT_OUTPUT_NORM] = {"output_norm.weight", 0, "~norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_ROPE_FREQS] = {"rope_freqs.weight", 0, NULL, 0, 1,
                          "generated from llama3 rope_parameters: the divisor of each frequency; F32"},
    [QW_GT_HC_HEAD_NORM] = {"output_hc_norm.weight", 0, "~hyper_connection_mixer.hc_norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_HC_HEAD_DOWN] = {"output_hc_down.weight", 0, "~hyper_connection_mixer.input_mix_weight_down.weight", 0, 0,
                            ""},
    [QW_GT_HC_HEAD_UP] = {"output_hc_up.weight", 0, "~hyper_connection_mixer.input_mix_weight_up.weight", 0, 0, ""},
    [QW_GT_PLE_TABLE] = {"per_layer_token_embd.weight", 0, NULL, 0, 0,
                         "ple.ple_embedding.ngram_embedding.weight or its shards shard_{i}, concatenated in index "
                         "order (the first PLE layer; blk.<il>.ple_token_embd.weight for the others)"},
    [QW_GT_ATTN_NORM] = {"attn_norm.weight", 1, "input_layernorm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_FFN_NORM] = {"ffn_norm.weight", 1, "post_attention_layernorm.weight", QW_XF_NORM, 1, "llama, qwen3; F32"},
    [QW_GT_POST_ATTN_NORM] = {"post_attention_norm.weight", 1, "post_attention_layernorm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_ATTN_Q] = {"attn_q.weight", 1, "self_attn.q_proj.weight", QW_XF_ROPE, 0,
                      "llama: rows of each head permuted for interleaved RoPE; qwen35/4exp: [q_h | gate_h] per head"},
    [QW_GT_ATTN_K] = {"attn_k.weight", 1, "self_attn.k_proj.weight", QW_XF_ROPE, 0,
                      "llama: rows of each head permuted"},
    [QW_GT_ATTN_V] = {"attn_v.weight", 1, "self_attn.v_proj.weight", 0, 0, ""},
    [QW_GT_ATTN_OUT] = {"attn_output.weight", 1, "self_attn.o_proj.weight", 0, 0, ""},
    [QW_GT_ATTN_Q_NORM] = {"attn_q_norm.weight", 1, "self_attn.q_norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_ATTN_K_NORM] = {"attn_k_norm.weight", 1, "self_attn.k_norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_INDEXER_Q] = {"indexer.q_proj.weight", 1, NULL, 0, 0,
                         "self_attn.indexer.index_qk_proj.weight rows [0, n_idx_head*ihd): the queries"},
    [QW_GT_INDEXER_K] = {"indexer.k_proj.weight", 1, NULL, 0, 0,
                         "self_attn.indexer.index_qk_proj.weight, the last ihd rows: the key"},
    [QW_GT_INDEXER_Q_NORM] = {"indexer.q_norm.weight", 1, "self_attn.indexer.q_layernorm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_INDEXER_K_NORM] = {"indexer.k_norm.weight", 1, "self_attn.indexer.k_layernorm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_SSM_QKV] = {"attn_qkv.weight", 1, "linear_attn.in_proj_qkv.weight", QW_XF_VROWS, 0,
                       "value rows in " VH "; qwen3next: q, k, v rows of in_proj_qkvz"},
    [QW_GT_SSM_GATE] = {"attn_gate.weight", 1, "linear_attn.in_proj_z.weight", QW_XF_VROWS, 0,
                        "rows in " VH "; qwen3next: z rows of in_proj_qkvz"},
    [QW_GT_SSM_BETA] = {"ssm_beta.weight", 1, "linear_attn.in_proj_b.weight", QW_XF_VHEADS, 1, "rows in " VH},
    [QW_GT_SSM_ALPHA] = {"ssm_alpha.weight", 1, "linear_attn.in_proj_a.weight", QW_XF_VHEADS, 1, "rows in " VH},
    [QW_GT_SSM_BA] = {"ssm_ba.weight", 1, "linear_attn.in_proj_ba.weight", 0, 1,
                      "qwen3next: copied (grouped by key head)"},
    [QW_GT_SSM_CONV] = {"ssm_conv1d.weight", 1, "linear_attn.conv1d.weight", QW_XF_VROWS, 1,
                        "[ch, 1, K] squeezed to [ch, K]; value channels in " VH "; F32"},
    [QW_GT_SSM_DT] = {"ssm_dt.bias", 1, "linear_attn.dt_bias", QW_XF_VHEADS, 1, VH "; F32"},
    [QW_GT_SSM_A] = {"ssm_a", 1, "linear_attn.A_log", QW_XF_NEG_EXP | QW_XF_VHEADS, 1,
                     "stored as -exp(A_log); " VH "; F32"},
    [QW_GT_SSM_NORM] = {"ssm_norm.weight", 1, "linear_attn.norm.weight", 0, 1, "plain weight (no +1); F32"},
    [QW_GT_SSM_OUT] = {"ssm_out.weight", 1, "linear_attn.out_proj.weight", QW_XF_VCOLS, 0, "columns in " VH},
    [QW_GT_FFN_GATE] = {"ffn_gate.weight", 1, "mlp.gate_proj.weight", 0, 0, ""},
    [QW_GT_FFN_UP] = {"ffn_up.weight", 1, "mlp.up_proj.weight", 0, 0, ""},
    [QW_GT_FFN_DOWN] = {"ffn_down.weight", 1, "mlp.down_proj.weight", 0, 0, ""},
    [QW_GT_FFN_GATE_INP] = {"ffn_gate_inp.weight", 1, "mlp.gate.weight", 0, 1, "router; F32"},
    [QW_GT_FFN_GATE_EXPS] = {"ffn_gate_exps.weight", 1, NULL, 0, 0,
                             "mlp.experts.{e}.gate_proj.weight stacked to [E, I, H], or the first half of each "
                             "expert's rows of mlp.experts.gate_up_proj"},
    [QW_GT_FFN_UP_EXPS] = {"ffn_up_exps.weight", 1, NULL, 0, 0,
                           "mlp.experts.{e}.up_proj.weight stacked to [E, I, H], or the second half of "
                           "mlp.experts.gate_up_proj"},
    [QW_GT_FFN_DOWN_EXPS] = {"ffn_down_exps.weight", 1, NULL, 0, 0,
                             "mlp.experts.{e}.down_proj.weight stacked to [E, H, I], or mlp.experts.down_proj"},
    [QW_GT_FFN_GATE_SHEXP] = {"ffn_gate_shexp.weight", 1, "mlp.shared_expert.gate_proj.weight", 0, 0, ""},
    [QW_GT_FFN_UP_SHEXP] = {"ffn_up_shexp.weight", 1, "mlp.shared_expert.up_proj.weight", 0, 0, ""},
    [QW_GT_FFN_DOWN_SHEXP] = {"ffn_down_shexp.weight", 1, "mlp.shared_expert.down_proj.weight", 0, 0, ""},
    [QW_GT_FFN_GATE_INP_SHEXP] = {"ffn_gate_inp_shexp.weight", 1, "mlp.shared_expert_gate.weight", 0, 1, "[1, H]; F32"},
    [QW_GT_HC_ATTN_NORM] = {"hc_attn_norm.weight", 1, "attn_hyper_connection.hc_norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_HC_ATTN_DOWN] = {"hc_attn_down.weight", 1, "attn_hyper_connection.input_mix_weight_down.weight", 0, 0,
                            ""},
    [QW_GT_HC_ATTN_UP] = {"hc_attn_up.weight", 1, "attn_hyper_connection.input_mix_weight_up.weight", 0, 0, ""},
    [QW_GT_HC_ATTN_INJECT] = {"hc_attn_inject.weight", 1, "attn_hyper_connection.block_inject_weight.weight", 0, 1,
                              ""},
    [QW_GT_HC_FFN_NORM] = {"hc_ffn_norm.weight", 1, "mlp_hyper_connection.hc_norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_HC_FFN_DOWN] = {"hc_ffn_down.weight", 1, "mlp_hyper_connection.input_mix_weight_down.weight", 0, 0, ""},
    [QW_GT_HC_FFN_UP] = {"hc_ffn_up.weight", 1, "mlp_hyper_connection.input_mix_weight_up.weight", 0, 0, ""},
    [QW_GT_HC_FFN_INJECT] = {"hc_ffn_inject.weight", 1, "mlp_hyper_connection.block_inject_weight.weight", 0, 1, ""},
    [QW_GT_PLE_KEY] = {"ple_key.weight", 1, "ple.key_proj.weight", 0, 0, ""},
    [QW_GT_PLE_VALUE] = {"ple_value.weight", 1, "ple.value_proj.weight", 0, 0, ""},
    [QW_GT_PLE_NORM_KEY] = {"ple_norm_key.weight", 1, "ple.norm_key.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_PLE_NORM_QUERY] = {"ple_norm_query.weight", 1, "ple.norm_query.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_PLE_NORM_CONV] = {"ple_norm_conv.weight", 1, "ple.norm_conv.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_PLE_CONV] = {"ple_conv1d.weight", 1, "ple.conv1d.weight", 0, 1, "[C*H, 1, k] squeezed to [C*H, k]"},
    [QW_GT_MTP_EH_PROJ] = {"nextn.eh_proj.weight", 1, "mtp.fc.weight", 0, 0, "qwen3.5 family: [H, 2H], embedding first"},
    [QW_GT_MTP_E_PROJ] = {"nextn.e_proj.weight", 1, "mtp.fc_embedding.weight", 0, 0, "qwen4exp (qwenc's name)"},
    [QW_GT_MTP_H_PROJ] = {"nextn.h_proj.weight", 1, "mtp.fc_hidden.weight", 0, 0, "qwen4exp (qwenc's name)"},
    [QW_GT_MTP_ENORM] = {"nextn.enorm.weight", 1, "mtp.pre_fc_norm_embedding.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_MTP_HNORM] = {"nextn.hnorm.weight", 1, "mtp.pre_fc_norm_hidden.weight", QW_XF_NORM, 1,
                         ZC "; qwen4exp: [C*H], one RMS over the streams"},
    [QW_GT_MTP_NORM] = {"nextn.shared_head_norm.weight", 1, "mtp.norm.weight", QW_XF_NORM, 1, ZC},
    [QW_GT_MTP_HC_NORM] = {"nextn.hc_head_norm.weight", 1, "mtp.hyper_connection_mixer.hc_norm.weight", QW_XF_NORM, 1,
                           ZC " (qwen4exp, qwenc's name)"},
    [QW_GT_MTP_HC_DOWN] = {"nextn.hc_head_down.weight", 1, "mtp.hyper_connection_mixer.input_mix_weight_down.weight", 0,
                           0, "qwen4exp (qwenc's name)"},
    [QW_GT_MTP_HC_UP] = {"nextn.hc_head_up.weight", 1, "mtp.hyper_connection_mixer.input_mix_weight_up.weight", 0, 0,
                         "qwen4exp (qwenc's name)"},
};

const qw_gt_info *qw_gt_info_of(qw_gt t) {
    QW_ASSERT((unsigned)t < QW_GT_COUNT);
    return &gt_info[t];
}

const char *qw_gt_name(char *buf, size_t n, qw_gt t, int il) {
    const qw_gt_info *gi = qw_gt_info_of(t);
    if (gi->per_layer)
        snprintf(buf, n, "blk.%d.%s", il, gi->gguf);
    else
        snprintf(buf, n, "%s", gi->gguf);
    return buf;
}

const char *qw_gguf_ple_table_name(char *buf, size_t n, int li, int il) {
    if (li == 0) return qw_gt_name(buf, n, QW_GT_PLE_TABLE, il);
    snprintf(buf, n, "blk.%d.ple_token_embd.weight", il);
    return buf;
}

/* ------------------------------------------------------------------ hyper-parameters */

typedef struct {
    const qw_gguf *g;
    qw_arch arch;
    const char *path;
    char *err;
    size_t errlen;
    qwenc_status st;
} meta_reader;

static const qw_gguf_kv *mr_find(meta_reader *r, const char *suffix, char *key, size_t n) {
    qw_gguf_key(key, n, r->arch, suffix);
    return qw_gguf_find_kv(r->g, key);
}

/* A value of key out of lo..hi: the first error names the key (note: where the value came from, or NULL). */
static void mr_range(meta_reader *r, const char *key, double v, int64_t lo, int64_t hi, const char *note) {
    if (r->st) return;
    char name[160];
    snprintf(name, sizeof(name), "metadata key '%s'", key);
    r->st = qw_hp_check(v, lo, hi, r->path, name, note, r->err, r->errlen);
}

static int is_float_type(qw_gguf_type t) { return t == QW_GGUF_F32 || t == QW_GGUF_F64; }

/* An integer key in lo..hi (a per-layer array is accepted when all its entries agree); def when absent (an
 * error when required). The value returned is always in lo..hi (lo after an error): nothing computed from it
 * can overflow. */
static int64_t mr_int_in(meta_reader *r, const char *suffix, int64_t def, int required, int64_t lo, int64_t hi) {
    char key[128];
    const qw_gguf_kv *kv = mr_find(r, suffix, key, sizeof(key));
    if (r->st) return lo;
    double v = (double)def;
    if (!kv) {
        if (required) {
            r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' is missing (required for %s)",
                           r->path, key, qw_gguf_arch_name(r->arch));
            return lo;
        }
    } else if (kv->type == QW_GGUF_ARRAY) {
        if (kv->n == 0 || kv->arr_type == QW_GGUF_STRING || kv->arr_type == QW_GGUF_ARRAY || is_float_type(kv->arr_type)) {
            r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' should be an integer", r->path, key);
            return lo;
        }
        v = qw_gguf_arr_f64(kv, 0);
        for (uint64_t i = 1; i < kv->n; i++)
            if (qw_gguf_arr_f64(kv, i) != v) {
                r->st = qw_err(r->err, r->errlen, QWENC_ERR_UNSUPPORTED,
                               "%s: metadata key '%s' differs between layers; qwenc supports one value", r->path, key);
                return lo;
            }
    } else if (kv->type == QW_GGUF_STRING || is_float_type(kv->type)) {
        r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' should be an integer, found %s",
                       r->path, key, qw_gguf_type_name(kv->type));
        return lo;
    } else {
        v = qw_gguf_kv_f64(kv);
    }
    if (!(v >= (double)lo && v <= (double)hi)) {
        mr_range(r, key, v, lo, hi, kv ? NULL : "its default");
        return lo;
    }
    return (int64_t)v;
}

/* An integer key with the bounds of its row of the hyper-parameter limits (formats/hfconfig.c). */
static int64_t mr_hp(meta_reader *r, qw_hp_field f, int64_t def, int required) {
    const qw_hp_limit *lim = qw_hp_limit_of(f);
    return mr_int_in(r, lim->gguf, def, required, lim->lo, lim->hi);
}

/* A number in (lo, hi] (open_lo) or [lo, hi]; def when absent (an error when required) and after an error. */
static double mr_num(meta_reader *r, const char *suffix, double def, int required, double lo, double hi, int open_lo) {
    char key[128];
    const qw_gguf_kv *kv = mr_find(r, suffix, key, sizeof(key));
    if (r->st) return def;
    if (!kv) {
        if (required)
            r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' is missing", r->path, key);
        return def;
    }
    if (kv->type == QW_GGUF_ARRAY || kv->type == QW_GGUF_STRING) {
        r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' should be a number", r->path, key);
        return def;
    }
    double v = qw_gguf_kv_f64(kv);
    if (!(open_lo ? v > lo : v >= lo) || !(v <= hi)) {
        r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' is %.15g, expected a number in %c%g, %g]",
                       r->path, key, v, open_lo ? '(' : '[', lo, hi);
        return def;
    }
    return v;
}

/* An integer array of at least n_min entries, or NULL (an error when required). */
static const qw_gguf_kv *mr_arr(meta_reader *r, const char *suffix, uint64_t n_min, int required) {
    char key[128];
    const qw_gguf_kv *kv = mr_find(r, suffix, key, sizeof(key));
    if (r->st) return NULL;
    if (!kv) {
        if (required)
            r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' is missing", r->path, key);
        return NULL;
    }
    if (kv->type != QW_GGUF_ARRAY || kv->arr_type == QW_GGUF_STRING || kv->arr_type == QW_GGUF_ARRAY ||
        is_float_type(kv->arr_type) || kv->n < n_min) {
        r->st = qw_err(r->err, r->errlen, QWENC_ERR_FORMAT,
                       "%s: metadata key '%s' should be an array of at least %llu integers", r->path, key,
                       (unsigned long long)n_min);
        return NULL;
    }
    return kv;
}

static void mr_fail(meta_reader *r, qwenc_status st, const char *what) {
    if (!r->st) r->st = qw_err(r->err, r->errlen, st, "%s: %s", r->path, what);
}

static void add_note(char *note, size_t n, const char *text) {
    if (!note || !n) return;
    size_t l = strlen(note);
    snprintf(note + l, n - l, "%s%s", l ? "; " : "", text);
}

/* An optional token id key (tokenizer.ggml.eos_token_id ...): -1 when absent; an error when not in
 * -1..INT32_MAX. */
static int opt_token_id(meta_reader *r, const char *key) {
    const qw_gguf_kv *kv = qw_gguf_find_kv(r->g, key);
    if (!kv || kv->type == QW_GGUF_ARRAY || kv->type == QW_GGUF_STRING) return -1;
    double v = qw_gguf_kv_f64(kv);
    if (!(v >= -1 && v <= INT32_MAX) || v != floor(v)) {
        mr_range(r, key, v, -1, INT32_MAX, NULL);
        return -1;
    }
    return (int)v;
}

static void read_gdn(meta_reader *r, qw_hparams *hp) {
    hp->gdn_conv_k = (int)mr_hp(r, QW_HP_GDN_CONV, 0, 1);
    hp->gdn_dk = (int)mr_hp(r, QW_HP_GDN_DK, 0, 1);
    hp->gdn_hk = (int)mr_hp(r, QW_HP_GDN_HK, 0, 1);
    hp->gdn_hv = (int)mr_hp(r, QW_HP_GDN_HV, 0, 1);
    int64_t inner = mr_hp(r, QW_HP_GDN_INNER, 0, 1);
    if (r->st) return;
    if (inner % hp->gdn_hv || hp->gdn_hv % hp->gdn_hk) {
        mr_fail(r, QWENC_ERR_FORMAT,
                "ssm.inner_size must be a multiple of ssm.time_step_rank and ssm.time_step_rank of ssm.group_count");
        return;
    }
    const qw_hp_limit *dv = qw_hp_limit_of(QW_HP_GDN_DV);
    char key[128];
    qw_gguf_key(key, sizeof(key), r->arch, "ssm.inner_size");
    mr_range(r, key, (double)inner, hp->gdn_hv * dv->lo, hp->gdn_hv * dv->hi,
             "the value head dim, ssm.inner_size / ssm.time_step_rank, is at most 1024");
    hp->gdn_dv = (int)(inner / hp->gdn_hv);
}

static void read_layer_kinds(meta_reader *r, qw_hparams *hp) {
    qw_layer_kind attn = qw_arch_has(hp->arch, QW_AF_QSA) ? QW_LAYER_QSA : QW_LAYER_ATTN;
    char key[128];
    const qw_gguf_kv *rec = mr_find(r, "attention.recurrent_layers", key, sizeof(key));
    if (rec) {
        if (rec->type != QW_GGUF_ARRAY || rec->arr_type == QW_GGUF_STRING || rec->arr_type == QW_GGUF_ARRAY ||
            rec->n < (uint64_t)hp->n_layer) {
            mr_fail(r, QWENC_ERR_FORMAT, "attention.recurrent_layers should be an array of one flag per layer");
            return;
        }
        for (int l = 0; l < hp->n_layer; l++) hp->layer_kind[l] = qw_gguf_arr_f64(rec, l) != 0 ? QW_LAYER_GDN : attn;
        return;
    }
    int interval = (int)mr_hp(r, QW_HP_ATTN_INTERVAL, 4, 0);
    for (int l = 0; l < hp->n_layer && !r->st; l++)
        hp->layer_kind[l] = (l + 1) % interval == 0 ? attn : QW_LAYER_GDN;
}

static void read_moe(meta_reader *r, qw_hparams *hp) {
    const qw_hp_limit *e = qw_hp_limit_of(QW_HP_EXPERT);
    hp->n_expert = (int)mr_int_in(r, e->gguf, 0, 1, 1, e->hi); /* (a config.json may say 0: dense qwen3_next) */
    hp->n_expert_used = (int)mr_hp(r, QW_HP_EXPERT_USED, 0, 1);
    hp->n_ff_exp = (int)mr_hp(r, QW_HP_FF_EXP, 0, 1);
    hp->n_ff_shexp = (int)mr_hp(r, QW_HP_FF_SHEXP, 0, 1);
    /* llama.cpp always renormalises the top-k weights of these architectures */
    hp->norm_topk_prob =
        qw_arch_has(hp->arch, QW_AF_TOPK_NORM) ? 1 : (int)mr_int_in(r, "expert_weights_norm", 1, 0, 0, 1);
    if (r->st) return;
    char key[128];
    mr_range(r, qw_gguf_key(key, sizeof(key), r->arch, qw_hp_limit_of(QW_HP_EXPERT_USED)->gguf), hp->n_expert_used, 1,
             hp->n_expert, "1..expert_count");
}

/* QW_AF_HC */
static void read_hc(meta_reader *r, qw_hparams *hp) {
    hp->hc_count = (int)mr_hp(r, QW_HP_HC_COUNT, 0, 1);
    hp->hc_lowrank = (int)mr_hp(r, QW_HP_HC_LOWRANK, 0, 1);
}

/* QW_AF_GATE_ACT: qwenc's ssm.gate_activation */
static void read_gate(meta_reader *r, qw_hparams *hp) {
    char key[128];
    const qw_gguf_kv *gate = mr_find(r, "ssm.gate_activation", key, sizeof(key));
    hp->gdn_gate_sigmoid = 1; /* llama.cpp's qwen4exp always gates with sigmoid */
    if (gate && gate->type == QW_GGUF_STRING && strcmp(gate->str, "silu") == 0) hp->gdn_gate_sigmoid = 0;
}

/* QW_AF_QSA: the indexer and the compress ratio */
static void read_qsa(meta_reader *r, qw_hparams *hp, char *note, size_t notelen) {
    if (r->st) return;
    char key[128];
    int has_qsa = 0;
    for (int l = 0; l < hp->n_layer; l++) has_qsa |= hp->layer_kind[l] == QW_LAYER_QSA;
    if (has_qsa) {
        hp->idx_n_head = (int)mr_hp(r, QW_HP_IDX_HEAD, 0, 1);
        hp->idx_head_dim = (int)mr_hp(r, QW_HP_IDX_HEAD_DIM, 0, 1);
        hp->idx_budget = (int)mr_hp(r, QW_HP_IDX_BUDGET, 0, 1);
        const qw_hp_limit *lr = qw_hp_limit_of(QW_HP_IDX_RATIO);
        const qw_gguf_kv *cr = mr_find(r, lr->gguf, key, sizeof(key));
        int ratio = 0;
        if (cr && (cr->type == QW_GGUF_STRING || is_float_type(cr->type) ||
                   (cr->type == QW_GGUF_ARRAY && (cr->arr_type == QW_GGUF_STRING || cr->arr_type == QW_GGUF_ARRAY ||
                                                  is_float_type(cr->arr_type))))) {
            mr_fail(r, QWENC_ERR_FORMAT, "attention.compress_ratios should be integers");
        } else if (cr) {
            /* 0: a layer the converter marks dense; else the ratio, one for every QSA layer */
            uint64_t n = cr->type == QW_GGUF_ARRAY ? cr->n : 1;
            for (int l = 0; l < hp->n_layer && (uint64_t)l < n && !r->st; l++) {
                if (cr->type == QW_GGUF_ARRAY && hp->layer_kind[l] != QW_LAYER_QSA) continue;
                double v = qw_gguf_arr_f64(cr, cr->type == QW_GGUF_ARRAY ? (uint64_t)l : 0);
                mr_range(r, key, v, 0, lr->hi, NULL);
                if (r->st || v == 0) continue;
                if (ratio && (int)v != ratio) mr_fail(r, QWENC_ERR_UNSUPPORTED, "attention.compress_ratios differ between QSA layers");
                ratio = (int)v;
            }
        }
        if (r->st) return;
        if (!ratio) {
            /* the converter writes 0 for layers transformers >= 5.16 names qwen_sparse_attention */
            ratio = 4;
            add_note(note, notelen,
                     "attention.compress_ratios is 0 for the QSA layers (llama.cpp's converter under transformers "
                     ">= 5.16; llama.cpp then runs them dense): qwenc assumes indexer_compress_ratio 4, the "
                     "released Flash-Next value");
        }
        hp->idx_ratio = ratio;
        if (hp->idx_budget % hp->idx_ratio || hp->n_rot > hp->idx_head_dim)
            mr_fail(r, QWENC_ERR_FORMAT,
                    "attention.indexer.top_k must be a multiple of the compress ratio and attention.indexer.key_length "
                    "at least rope.dimension_count");
    }
}

/* QW_AF_PLE: the PLE layers and their geometry (the hash constants are read with the tables, gguf_bind.c) */
static void read_ple(meta_reader *r, qw_hparams *hp) {
    char key[128];
    const qw_gguf_kv *ple = mr_find(r, "ple.layers", key, sizeof(key));
    if (!ple || r->st) return;
    if (ple->type != QW_GGUF_ARRAY || ple->arr_type == QW_GGUF_STRING || ple->arr_type == QW_GGUF_ARRAY ||
        is_float_type(ple->arr_type) || ple->n == 0) {
        mr_fail(r, QWENC_ERR_FORMAT, "ple.layers should be a non-empty array of layer indices");
        return;
    }
    char name[160];
    snprintf(name, sizeof(name), "the length of metadata key '%s'", key);
    r->st = qw_hp_check((double)ple->n, 1, hp->n_layer, r->path, name, "at most one entry per layer", r->err, r->errlen);
    if (r->st) return;
    hp->ple_layers = qw_calloc(ple->n, sizeof(int));
    if (!hp->ple_layers) {
        r->st = qw_err_nomem(r->err, r->errlen, r->path, ple->n, sizeof(int));
        return;
    }
    hp->n_ple = (int)ple->n;
    for (uint64_t i = 0; i < ple->n; i++) {
        double il = qw_gguf_arr_f64(ple, i);
        if (!(il >= 0 && il < hp->n_layer) || (i && il <= hp->ple_layers[i - 1]) ||
            hp->layer_kind[(int)il] != QW_LAYER_GDN) {
            mr_fail(r, QWENC_ERR_FORMAT, "ple.layers must be ascending linear-attention layer indices");
            return;
        }
        hp->ple_layers[i] = (int)il;
    }
    hp->ngram_n = (int)mr_hp(r, QW_HP_NGRAM_N, 0, 1);
    int hpn = (int)mr_hp(r, QW_HP_NGRAM_HPN, 0, 1);
    hp->ple_conv_k = (int)mr_hp(r, QW_HP_PLE_CONV, 0, 1);
    int64_t eos = mr_int_in(r, "ple.eos_token_id", 0, 1, 0, hp->n_vocab - 1);
    int64_t dh = mr_hp(r, QW_HP_PLE_DH, 0, 1);
    if (r->st) return;
    hp->ngram_heads = (hp->ngram_n - 1) * hpn;
    const qw_hp_limit *pd = qw_hp_limit_of(QW_HP_PLE_DIM);
    mr_range(r, qw_gguf_key(key, sizeof(key), r->arch, qw_hp_limit_of(QW_HP_PLE_DH)->gguf), (double)dh, 1,
             pd->hi / hp->ngram_heads,
             "the PLE width, (ple.ngram_size - 1) x ple.heads_per_ngram x this, is at most 65536");
    if (r->st) return;
    hp->ple_dim = (int)(hp->ngram_heads * dh);
    hp->eos_id = (int)eos;
    /* the hash constants come from ple.{layer_multipliers, head_offsets, head_vocab_sizes} (gguf_bind.c);
     * the config fields they were derived from are not in the file */
    hp->ngram_base = 0;
    hp->ngram_div = 1;
    mr_arr(r, "ple.layer_multipliers", (uint64_t)hp->ngram_n, 1);
    mr_arr(r, "ple.head_offsets", (uint64_t)hp->ngram_heads, 1);
    mr_arr(r, "ple.head_vocab_sizes", (uint64_t)hp->ngram_heads, 1);
}

qwenc_status qw_hparams_from_gguf(qw_hparams *hp, const qw_gguf *g, const char *path, char *note, size_t notelen,
                                  char *err, size_t errlen) {
    memset(hp, 0, sizeof(*hp));
    if (note && notelen) note[0] = 0;
    const char *an = NULL;
    qwenc_status st = qw_gguf_get_str(g, "general.architecture", &an, err, errlen);
    if (st) return st;
    if (!qw_arch_from_gguf(an, &hp->arch)) {
        char names[160];
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                      "%s: general.architecture \"%.40s\" is not one qwenc runs (%s)", path, an,
                      qw_arch_list(names, sizeof(names), 1));
    }
    snprintf(hp->model_type, sizeof(hp->model_type), "%s", an);
    meta_reader r = {.g = g, .arch = hp->arch, .path = path, .err = err, .errlen = errlen};

    int64_t n_all = mr_hp(&r, QW_HP_LAYER, 0, 1);
    int64_t n_mtp = mr_hp(&r, QW_HP_MTP_LAYER, 0, 0);
    if (!r.st && n_mtp >= n_all) {
        char key[128];
        mr_range(&r, qw_gguf_key(key, sizeof(key), hp->arch, "nextn_predict_layers"), (double)n_mtp, 0, n_all - 1,
                 "fewer than block_count");
    }
    hp->n_layer = (int)(n_all - n_mtp);
    hp->n_mtp = (int)QW_MIN(n_mtp, 1); /* one head layer is bound (qwen4exp and the Qwen3.5 family have one) */
    hp->n_embd = (int)mr_hp(&r, QW_HP_EMBD, 0, 1);
    hp->n_ctx_train = (int)mr_hp(&r, QW_HP_CTX, 4096, 0);
    hp->n_head = (int)mr_hp(&r, QW_HP_HEAD, 0, 1);
    if (r.st) goto done;
    hp->n_head_kv = (int)mr_hp(&r, QW_HP_HEAD_KV, hp->n_head, 0);
    if (r.st) goto done;
    if (hp->n_head % hp->n_head_kv) {
        mr_fail(&r, QWENC_ERR_FORMAT, "attention.head_count must be a multiple of attention.head_count_kv");
        goto done;
    }
    hp->head_dim = (int)mr_hp(&r, QW_HP_HEAD_DIM, hp->n_embd / hp->n_head, 0);
    int64_t vlen = mr_int_in(&r, "attention.value_length", hp->head_dim, 0, qw_hp_limit_of(QW_HP_HEAD_DIM)->lo,
                             qw_hp_limit_of(QW_HP_HEAD_DIM)->hi);
    hp->norm_eps = (float)mr_num(&r, "attention.layer_norm_rms_epsilon", 0, 1, 0, 1, 0);
    hp->n_rot = (int)mr_hp(&r, QW_HP_ROT, hp->head_dim, 0);
    hp->rope_theta = (float)mr_num(&r, "rope.freq_base", 10000.0, 0, 0, 1e18, 1);
    if (r.st) goto done;
    if (vlen != hp->head_dim) mr_fail(&r, QWENC_ERR_UNSUPPORTED, "attention.value_length must equal key_length");
    if (hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        mr_fail(&r, QWENC_ERR_FORMAT, "rope.dimension_count must be even and in (0, attention.key_length]");
    {
        char key[128];
        const qw_gguf_kv *ty = mr_find(&r, "rope.scaling.type", key, sizeof(key));
        const char *type = ty && ty->type == QW_GGUF_STRING ? ty->str : "none";
        double factor = mr_num(&r, "rope.scaling.factor", 0, 0, 0, 1e18, 0);
        if (strcmp(type, "linear") == 0 && factor > 0) {
            hp->rope_type = QW_ROPE_LINEAR;
            hp->rope_factor = (float)factor;
        } else if (strcmp(type, "none") != 0 && strcmp(type, "linear") != 0) {
            char msg[160];
            snprintf(msg, sizeof(msg), "rope.scaling.type \"%.40s\" is not supported (none, linear; llama3 is rope_freqs)",
                     type);
            mr_fail(&r, QWENC_ERR_UNSUPPORTED, msg);
        }
    }
    /* vocabulary: the llama key, else the tokenizer's list, else the embedding rows */
    {
        char key[128];
        const qw_hp_limit *lv = qw_hp_limit_of(QW_HP_VOCAB);
        const qw_gguf_kv *vs = mr_find(&r, "vocab_size", key, sizeof(key));
        const qw_gguf_kv *toks = qw_gguf_find_kv(g, "tokenizer.ggml.tokens");
        const qw_tensor *te = qw_gguf_find(g, "token_embd.weight");
        if (vs && vs->type != QW_GGUF_ARRAY && vs->type != QW_GGUF_STRING) {
            hp->n_vocab = (int)mr_hp(&r, QW_HP_VOCAB, 0, 1);
        } else if (toks && toks->type == QW_GGUF_ARRAY) {
            if (!r.st)
                r.st = qw_hp_check((double)toks->n, lv->lo, lv->hi, path,
                                   "the length of metadata key 'tokenizer.ggml.tokens'", NULL, err, errlen);
            hp->n_vocab = r.st ? 0 : (int)toks->n;
        } else if (te && te->n_dims == 2) {
            if (!r.st)
                r.st = qw_hp_check((double)te->shape[0], lv->lo, lv->hi, path, "the rows of tensor 'token_embd.weight'",
                                   NULL, err, errlen);
            hp->n_vocab = r.st ? 0 : (int)te->shape[0];
        }
        if (hp->n_vocab <= 0) mr_fail(&r, QWENC_ERR_FORMAT, "no vocabulary size (vocab_size, tokenizer.ggml.tokens or token_embd.weight)");
    }
    hp->tie_embd = qw_gguf_find(g, "output.weight") == NULL;
    hp->eos_id = opt_token_id(&r, "tokenizer.ggml.eos_token_id");
    hp->bos_id = opt_token_id(&r, "tokenizer.ggml.bos_token_id");
    hp->n_ff = (int)mr_hp(&r, QW_HP_FF, 0, qw_arch_has(hp->arch, QW_AF_MLP));
    if (r.st) goto done;

    if ((r.st = qw_hparams_alloc_layers(hp, path, err, errlen))) goto done;
    unsigned af = qw_arch_get(hp->arch)->flags;
    if (af & QW_AF_GDN) {
        read_gdn(&r, hp);
        read_layer_kinds(&r, hp);
    }
    if ((af & QW_AF_MLP) && hp->n_ff <= 0) mr_fail(&r, QWENC_ERR_FORMAT, "feed_forward_length must be positive");
    if (af & (QW_AF_MOE | QW_AF_MOE_STEP)) {
        read_moe(&r, hp);
        for (int l = 0; l < hp->n_layer && !r.st; l++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp.weight", l);
            /* qwen3next's dense (mlp_only) layers: qwenc writes ffn_{gate,up,down} for them */
            hp->layer_moe[l] = !(af & QW_AF_MOE_STEP) || qw_gguf_find(g, name) != NULL;
            if (!hp->layer_moe[l] && hp->n_ff <= 0)
                mr_fail(&r, QWENC_ERR_FORMAT, "a dense layer needs feed_forward_length");
        }
    }
    if (af & QW_AF_HC) read_hc(&r, hp);
    if (af & QW_AF_GATE_ACT) read_gate(&r, hp);
    if (af & QW_AF_QSA) read_qsa(&r, hp, note, notelen);
    if (af & QW_AF_PLE) read_ple(&r, hp);
    if (!r.st) r.st = qw_hparams_check(hp, path, 1, err, errlen);
done:
    if (r.st) qw_hparams_free(hp);
    return r.st;
}

/* ------------------------------------------------------------------ tensor types */

static const struct {
    const char *name;
    int ftype;
    qw_type base;
} ftypes[] = {
    {"F32", 0, QW_TYPE_F32},      {"F16", 1, QW_TYPE_F16},       {"BF16", 32, QW_TYPE_BF16},
    {"Q8_0", 7, QW_TYPE_Q8_0},    {"Q4_0", 2, QW_TYPE_Q4_0},     {"Q4_1", 3, QW_TYPE_Q4_1},
    {"Q5_0", 8, QW_TYPE_Q5_0},    {"Q5_1", 9, QW_TYPE_Q5_1},     {"Q4_K", 15, QW_TYPE_Q4_K},
    {"Q4_K_M", 15, QW_TYPE_Q4_K}, {"Q4_K_S", 14, QW_TYPE_Q4_K},  {"Q5_K", 17, QW_TYPE_Q5_K},
    {"Q5_K_M", 17, QW_TYPE_Q5_K}, {"Q5_K_S", 16, QW_TYPE_Q5_K},  {"Q6_K", 18, QW_TYPE_Q6_K},
    {"IQ4_NL", 25, QW_TYPE_IQ4_NL}, {"IQ4_XS", 30, QW_TYPE_IQ4_XS},
};
/* the llama_ftype values the rules below test */
enum { FT_Q4_K_S = 14, FT_Q4_K_M = 15, FT_Q5_K_M = 17, FT_IQ4_NL = 25, FT_IQ4_XS = 30 };

int qw_gguf_policy_parse(qw_gguf_policy *p, const char *name) {
    for (size_t i = 0; i < sizeof(ftypes) / sizeof(ftypes[0]); i++) {
        const char *a = ftypes[i].name, *b = name;
        while (*a && *b && toupper((unsigned char)*b) == *a) a++, b++;
        if (*a || *b) continue;
        p->ftype = ftypes[i].ftype;
        p->base = ftypes[i].base;
        p->quantized = qw_type_is_quantized(p->base);
        return 1;
    }
    return 0;
}

const char *qw_gguf_policy_names(void) {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K (= Q4_K_M), Q4_K_S, Q5_K (= Q5_K_M), Q5_K_S, Q6_K, "
           "IQ4_NL, IQ4_XS";
}

/* llama-quantize's categories (llama-quant.cpp tensor_get_category) */
typedef enum { CAT_OTHER, CAT_OUTPUT, CAT_TOKEN_EMBD, CAT_QKV, CAT_V, CAT_K, CAT_Q, CAT_ATTN_OUT, CAT_UP, CAT_GATE, CAT_DOWN } qcat;

static qcat category(const char *name) {
    if (strcmp(name, "output.weight") == 0) return CAT_OUTPUT;
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "per_layer_token_embd.weight") == 0) return CAT_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight")) return CAT_QKV;
    if (strstr(name, "attn_v.weight")) return CAT_V;
    if (strstr(name, "attn_k.weight")) return CAT_K;
    if (strstr(name, "attn_q.weight")) return CAT_Q;
    if (strstr(name, "attn_output.weight")) return CAT_ATTN_OUT;
    if (strstr(name, "ffn_up")) return CAT_UP;
    if (strstr(name, "ffn_gate")) return CAT_GATE;
    if (strstr(name, "ffn_down")) return CAT_DOWN;
    return CAT_OTHER;
}

/* llama-quant.cpp tensor_allows_quantization, for the names these architectures have */
static int allows_quantization(const char *name, int n_dims) {
    size_t n = strlen(name);
    if (n_dims < 2 || n < 6 || strcmp(name + n - 6, "weight") != 0) return 0;
    return !strstr(name, "_norm.weight") && !strstr(name, "ffn_gate_inp.weight") && !strstr(name, "ssm_conv1d") &&
           !strstr(name, "indexer.k_proj.weight") && !strstr(name, "indexer.q_proj.weight");
}

static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama-quant.cpp tensor_type_fallback: a row that is not a whole number of blocks */
static qw_type fallback(qw_type t, int64_t ncols) {
    int be = qw_type_traits_of(t)->block_elems;
    if (ncols % be == 0) return t;
    switch (t) {
    case QW_TYPE_IQ4_XS: t = QW_TYPE_IQ4_NL; break;
    case QW_TYPE_Q4_K: t = QW_TYPE_Q5_0; break;
    case QW_TYPE_Q5_K: t = QW_TYPE_Q5_1; break;
    case QW_TYPE_Q6_K: t = QW_TYPE_Q8_0; break;
    default: break;
    }
    if (ncols % qw_type_traits_of(t)->block_elems) t = QW_TYPE_F16;
    return t;
}

qw_type qw_gguf_policy_type(qw_gguf_policy *p, qw_gt role, const char *name, int n_dims, const int64_t *shape,
                            int conv_f32) {
    if (conv_f32) return QW_TYPE_F32;
    if (!p->quantized) return p->base;
    if (!allows_quantization(name, n_dims)) return p->keep;
    int64_t ncols = shape[n_dims - 1];
    qcat cat = category(name);
    qw_type t = p->base;
    int ft = p->ftype;
    if (cat == CAT_OUTPUT || (p->tied && cat == CAT_TOKEN_EMBD)) {
        if (ncols % qw_type_traits_of(t)->block_elems)
            t = QW_TYPE_Q8_0;
        else if (t != QW_TYPE_Q8_0)
            t = QW_TYPE_Q6_K;
    } else if (cat == CAT_TOKEN_EMBD) {
        /* the base type for the ftypes qwenc writes */
    } else if (cat == CAT_QKV || cat == CAT_V) {
        if ((ft == FT_IQ4_NL || ft == FT_IQ4_XS) && p->n_gqa >= 4)
            t = QW_TYPE_Q5_K;
        else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) && use_more_bits(p->i_attn_v, p->n_attn_v))
            t = QW_TYPE_Q6_K;
        else if (ft == FT_Q4_K_S && p->i_attn_v < 4)
            t = QW_TYPE_Q5_K;
        if (p->n_expert == 8) t = QW_TYPE_Q8_0;
        p->i_attn_v++;
    } else if (cat == CAT_K) {
        if (p->n_expert == 8) t = QW_TYPE_Q8_0;
    } else if (cat == CAT_DOWN) {
        int i_layer = p->i_ffn_down, n_layer = p->n_layer;
        if (p->n_expert > 1 && sscanf(name, "blk.%d.", &i_layer) != 1) i_layer = 0;
        if (ft == FT_Q4_K_M) {
            if (use_more_bits(i_layer, n_layer)) t = QW_TYPE_Q6_K;
        } else if (i_layer < n_layer / 8 && (ft == FT_IQ4_NL || ft == FT_IQ4_XS)) {
            t = QW_TYPE_Q5_K;
        } else if (ft == FT_Q5_K_M && use_more_bits(i_layer, n_layer)) {
            t = QW_TYPE_Q6_K;
        } else if (ft == FT_Q4_K_S && i_layer < n_layer / 8) {
            t = QW_TYPE_Q5_K;
        }
        p->i_ffn_down++;
    } else if (cat == CAT_ATTN_OUT) {
        if (p->n_expert == 8 && (ft == FT_IQ4_NL || ft == FT_Q4_K_S || ft == FT_Q4_K_M || ft == FT_IQ4_XS))
            t = QW_TYPE_Q5_K;
    }
    t = fallback(t, ncols);
    /* qwenc's floor: the tensors that steer every token (hyper-connection inject, DeltaNet beta/alpha,
     * PLE conv) keep Q8_0 or the converter's float type */
    if (qw_gt_info_of(role)->fragile && qw_type_is_quantized(t) && t != QW_TYPE_Q8_0)
        t = ncols % 32 == 0 ? QW_TYPE_Q8_0 : p->keep;
    return t;
}
