/*
 * hfconfig.c - config.json -> qw_hparams (see hfconfig.h).
 *
 * Follows the configuration classes of transformers 5.17: LlamaConfig, Qwen3Config, Qwen3_5TextConfig,
 * Qwen3_5MoeTextConfig, Qwen3NextConfig and Qwen4ExpTextConfig (defaults, layer_types rules, the
 * validation of Qwen4ExpTextConfig.validate_architecture).
 */
#include "formats/hfconfig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "core/mapfile.h"

static const char *arch_names[QW_ARCH_COUNT] = {
    [QW_ARCH_LLAMA] = "llama",           [QW_ARCH_QWEN3] = "qwen3",
    [QW_ARCH_QWEN35] = "qwen3_5",        [QW_ARCH_QWEN35_MOE] = "qwen3_5_moe",
    [QW_ARCH_QWEN3_NEXT] = "qwen3_next", [QW_ARCH_QWEN4EXP] = "qwen4_exp",
};

const char *qw_arch_name(qw_arch a) { return a < QW_ARCH_COUNT ? arch_names[a] : "?"; }

/* ---------------------------------------------------------------- bounds of the hyper-parameters */

/*
 * Every integer read from a config.json or from GGUF metadata (models/gguf_map.c) is checked against its row
 * here before it is used, multiplied or allocated with, so a hostile file gets an error naming the field and
 * the value, never an overflow or an absurd allocation. The bounds are generous but finite: each admits the
 * largest released value by a wide margin (released models, then the bound):
 *   layers           126 (Llama 3.1 405B), 94 (Qwen3-235B), 60 (Qwen3.5-397B), 48 (Flash-Next)       1024
 *   hidden size      16384 (Llama 3.1 405B)                                                           65536
 *   attention heads  128 query heads (Llama 3.1 405B), 1..128 kv heads                                1024
 *   head dim         64..256 (Qwen3.5: 256); the attention kernel holds at most 512 (kernels/cpu.c)   512
 *   vocabulary       262144 (Gemma 3), 248320 (Qwen3.5, Flash-Next), 128256 (Llama 3)                 2^24
 *   MLP widths       53248 (Llama 3.1 405B), experts 640..2560                                        2^20
 *   context          262144 (Flash-Next), 1010000 (Qwen2.5-1M), 10M (Llama 4 Scout)                  2^30
 *   experts          512 top-10 (Flash-Next, Qwen3-Next, Qwen3.5-397B), 384 (Kimi K2)                 4096
 *   DeltaNet         heads 16 key / 64 value, dims 128 (the delta-rule kernel holds dv <= 1024),     1024
 *                    conv kernel 4                                                                    64
 *   hyper-connection 4 streams, low rank 320                                                          64, 65536
 *   QSA indexer      4 heads x 128 dims (DeepSeek's indexer: 64 x 128), budget 2048, ratio 4         1024, 1024,
 *                                                                                                     2^24, 65536
 *   PLE              n-grams of 3 (the hash keeps at most 8 ids: qw_ple_w.mult, session.ple_last),
 *                    8 heads per n-gram, 2560 = 16 heads x 160 dims, vocabulary base 2e7 (a table of
 *                    320,001,536 rows), divisor 128, conv kernel 4         8, 64, 65536, 2^31, 2^20, 64
 * With these bounds every width the forward computes in int (q rows 2 * heads * head_dim, the DeltaNet conv
 * channels, streams x hidden) fits, as the static asserts below check.
 */
#define HP_LAYER_MAX 1024
#define HP_EMBD_MAX 65536
#define HP_HEAD_MAX 1024
#define HP_HEAD_DIM_MAX 512
#define HP_GDN_MAX 1024
#define HP_HC_MAX 64
#define HP_IDX_MAX 1024
#define HP_WIDTH_MAX (1 << 20)
static const qw_hp_limit limits[QW_HP_COUNT] = {
    [QW_HP_VOCAB] = {"vocab_size", "vocab_size", 1, 1 << 24},
    [QW_HP_EMBD] = {"hidden_size", "embedding_length", 1, HP_EMBD_MAX},
    [QW_HP_LAYER] = {"num_hidden_layers", "block_count", 1, HP_LAYER_MAX},
    [QW_HP_MTP_LAYER] = {NULL, "nextn_predict_layers", 0, HP_LAYER_MAX},
    [QW_HP_HEAD] = {"num_attention_heads", "attention.head_count", 1, HP_HEAD_MAX},
    [QW_HP_HEAD_KV] = {"num_key_value_heads", "attention.head_count_kv", 1, HP_HEAD_MAX},
    [QW_HP_HEAD_DIM] = {"head_dim", "attention.key_length", 1, HP_HEAD_DIM_MAX},
    [QW_HP_ROT] = {NULL, "rope.dimension_count", 1, HP_HEAD_DIM_MAX},
    [QW_HP_FF] = {"intermediate_size", "feed_forward_length", 0, HP_WIDTH_MAX},
    [QW_HP_CTX] = {"max_position_embeddings", "context_length", 1, 1 << 30},
    [QW_HP_ROPE_ORIG_CTX] = {"original_max_position_embeddings", NULL, 1, 1 << 30},
    [QW_HP_TOKEN_ID] = {"eos_token_id", NULL, -1, INT32_MAX},
    [QW_HP_GDN_CONV] = {"linear_conv_kernel_dim", "ssm.conv_kernel", 1, 64},
    [QW_HP_GDN_DK] = {"linear_key_head_dim", "ssm.state_size", 1, HP_GDN_MAX},
    [QW_HP_GDN_DV] = {"linear_value_head_dim", NULL, 1, HP_GDN_MAX},
    [QW_HP_GDN_HK] = {"linear_num_key_heads", "ssm.group_count", 1, HP_GDN_MAX},
    [QW_HP_GDN_HV] = {"linear_num_value_heads", "ssm.time_step_rank", 1, HP_GDN_MAX},
    [QW_HP_GDN_INNER] = {NULL, "ssm.inner_size", 1, HP_GDN_MAX * HP_GDN_MAX},
    [QW_HP_ATTN_INTERVAL] = {"full_attention_interval", "full_attention_interval", 1, HP_LAYER_MAX},
    [QW_HP_EXPERT] = {"num_experts", "expert_count", 0, 4096},
    [QW_HP_EXPERT_USED] = {"num_experts_per_tok", "expert_used_count", 0, 4096},
    [QW_HP_FF_EXP] = {"moe_intermediate_size", "expert_feed_forward_length", 1, HP_WIDTH_MAX},
    [QW_HP_FF_SHEXP] = {"shared_expert_intermediate_size", "expert_shared_feed_forward_length", 1, HP_WIDTH_MAX},
    [QW_HP_SPARSE_STEP] = {"decoder_sparse_step", NULL, 1, HP_LAYER_MAX},
    [QW_HP_HC_COUNT] = {"hc_count", "hyper_connection.count", 2, HP_HC_MAX},
    [QW_HP_HC_LOWRANK] = {"hc_lowrank", "hyper_connection.low_rank", 1, HP_EMBD_MAX},
    [QW_HP_IDX_HEAD] = {"indexer_n_heads", "attention.indexer.head_count", 1, HP_IDX_MAX},
    [QW_HP_IDX_HEAD_DIM] = {"indexer_head_dim", "attention.indexer.key_length", 1, HP_IDX_MAX},
    [QW_HP_IDX_BUDGET] = {"indexer_budget", "attention.indexer.top_k", 1, 1 << 24},
    [QW_HP_IDX_RATIO] = {"indexer_compress_ratio", "attention.compress_ratios", 1, 65536},
    [QW_HP_PLE_DIM] = {"ple_embed_dim", NULL, 1, HP_EMBD_MAX},
    [QW_HP_PLE_DH] = {NULL, "embedding_length_per_layer_input", 1, HP_EMBD_MAX},
    [QW_HP_PLE_CONV] = {"ple_conv_kernel_size", "ple.conv_kernel", 1, 64},
    [QW_HP_NGRAM_N] = {"ngram_size", "ple.ngram_size", 2, 8},
    [QW_HP_NGRAM_HPN] = {"heads_per_ngram", "ple.heads_per_ngram", 1, 64},
    [QW_HP_NGRAM_BASE] = {"ngram_vocab_size_base", NULL, 2, (int64_t)1 << 31},
    [QW_HP_NGRAM_DIV] = {"make_ngram_vocab_size_divisible_by", NULL, 1, 1 << 20},
    [QW_HP_SEED] = {"seed", NULL, 0, (int64_t)1 << 53},
};
_Static_assert((int64_t)2 * HP_HEAD_MAX * HP_HEAD_DIM_MAX <= INT32_MAX, "gated q rows fit in int");
_Static_assert((int64_t)(HP_IDX_MAX + 1) * HP_IDX_MAX <= INT32_MAX, "indexer rows fit in int");
_Static_assert((int64_t)3 * HP_GDN_MAX * HP_GDN_MAX <= INT32_MAX, "DeltaNet conv channels fit in int");
_Static_assert((int64_t)HP_HC_MAX * HP_EMBD_MAX <= INT32_MAX, "streams x hidden fit in int");

/* PLE: the primes found at load for the hash tables (blocks/ple.c qw_ple_constants): layer li's heads take the
 * primes after those of the li layers before it, each layer counting them again, so L layers of nh heads
 * search nh * L * (L + 1) / 2 primes, a few microseconds each. Flash-Next: 16 (1 layer of 16 heads); 48 PLE
 * layers of 16 heads would be 18816. */
#define HP_PLE_PRIMES_MAX 65536

const qw_hp_limit *qw_hp_limit_of(qw_hp_field f) { return (unsigned)f < QW_HP_COUNT ? &limits[f] : NULL; }

qwenc_status qw_hp_check(double v, int64_t lo, int64_t hi, const char *path, const char *name, const char *note,
                         char *err, size_t errlen) {
    if (v == floor(v) && v >= (double)lo && v <= (double)hi) return QWENC_OK;
    char val[40];
    if (v == floor(v) && fabs(v) < 9e18)
        snprintf(val, sizeof(val), "%lld", (long long)v);
    else
        snprintf(val, sizeof(val), "%.15g", v);
    return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: %s is %s, expected %lld..%lld%s%s%s", path, name, val,
                  (long long)lo, (long long)hi, note ? " (" : "", note ? note : "", note ? ")" : "");
}

qwenc_status qw_hparams_check(const qw_hparams *hp, const char *path, int gguf, char *err, size_t errlen) {
    int64_t primes = (int64_t)hp->ngram_heads * hp->n_ple * (hp->n_ple + 1) / 2;
    if (hp->n_ple > 0 && !gguf && primes > HP_PLE_PRIMES_MAX)
        return qw_err(err, errlen, QWENC_ERR_FORMAT,
                      "%s: %d PLE layers (ple_layer_ids) of %d n-gram heads ((ngram_size - 1) x heads_per_ngram) "
                      "need %lld primes for their hash tables, expected at most %d",
                      path, hp->n_ple, hp->ngram_heads, (long long)primes, HP_PLE_PRIMES_MAX);
    return QWENC_OK;
}

/* The JSON being read: text_config (if any) first, then the top level. */
typedef struct {
    const cJSON *text, *top;
    const char *path;
    char *err;
    size_t errlen;
    qwenc_status st; /* first error */
} cfg_reader;

static const cJSON *cfg_item(const cfg_reader *r, const char *key) {
    const cJSON *it = r->text ? cJSON_GetObjectItemCaseSensitive(r->text, key) : NULL;
    if (!it || cJSON_IsNull(it)) it = cJSON_GetObjectItemCaseSensitive(r->top, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static void cfg_fail(cfg_reader *r, qwenc_status st, const char *key, const char *what) {
    if (r->st) return;
    r->st = qw_err(r->err, r->errlen, st, "%s: field \"%s\": %s", r->path, key, what);
}

/* A value out of bounds: the first error names the field (note: where the value came from, or NULL). */
static void cfg_range(cfg_reader *r, const char *key, double v, int64_t lo, int64_t hi, const char *note) {
    if (r->st) return;
    char name[80];
    snprintf(name, sizeof(name), "\"%s\"", key);
    r->st = qw_hp_check(v, lo, hi, r->path, name, note, r->err, r->errlen);
}

/* An integer field in lo..hi, def when absent (an error when required); the value returned is always in
 * lo..hi (lo after an error), so nothing computed from it can overflow. */
static int64_t cfg_int_in(cfg_reader *r, const char *key, int64_t def, int required, int64_t lo, int64_t hi) {
    const cJSON *it = cfg_item(r, key);
    double v = (double)def;
    if (!it) {
        if (required) {
            cfg_fail(r, QWENC_ERR_FORMAT, key, "missing (required for this model_type)");
            return lo;
        }
    } else if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected an integer");
        return lo;
    } else {
        v = it->valuedouble;
    }
    if (!(v >= (double)lo && v <= (double)hi)) {
        cfg_range(r, key, v, lo, hi, it ? NULL : "its default");
        return lo;
    }
    return (int64_t)v;
}

/* An integer field with the bounds of its row of limits[]. */
static int64_t cfg_hp(cfg_reader *r, qw_hp_field f, int64_t def, int required) {
    return cfg_int_in(r, limits[f].config, def, required, limits[f].lo, limits[f].hi);
}

/* A number in (lo, hi] (open_lo) or [lo, hi], def when absent; def after an error. */
static double cfg_real(cfg_reader *r, const cJSON *it, const char *key, double def, double lo, double hi,
                       int open_lo) {
    if (!it || cJSON_IsNull(it)) return def;
    if (!cJSON_IsNumber(it)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected a number");
        return def;
    }
    double v = it->valuedouble;
    if (!(open_lo ? v > lo : v >= lo) || !(v <= hi)) {
        char msg[96];
        snprintf(msg, sizeof(msg), "is %.15g, expected a number in %c%g, %g]", v, open_lo ? '(' : '[', lo, hi);
        cfg_fail(r, QWENC_ERR_FORMAT, key, msg);
        return def;
    }
    return v;
}

static double cfg_num_in(cfg_reader *r, const cJSON *obj, const char *key, double def, double lo, double hi,
                         int open_lo) {
    return cfg_real(r, obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL, key, def, lo, hi, open_lo);
}

static double cfg_num(cfg_reader *r, const char *key, double def, double lo, double hi, int open_lo) {
    return cfg_real(r, cfg_item(r, key), key, def, lo, hi, open_lo);
}

static int cfg_bool(cfg_reader *r, const char *key, int def) {
    const cJSON *it = cfg_item(r, key);
    if (!it) return def;
    if (!cJSON_IsBool(it)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected true or false");
        return def;
    }
    return cJSON_IsTrue(it);
}

/* First element of an int-or-list field (eos_token_id); -1 if absent. */
static int cfg_first_id(cfg_reader *r, const char *key) {
    const cJSON *it = cfg_item(r, key);
    if (!it) return -1;
    if (cJSON_IsArray(it)) it = cJSON_GetArrayItem(it, 0);
    if (!it) return -1;
    if (!cJSON_IsNumber(it)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected an integer or a list of integers");
        return -1;
    }
    const qw_hp_limit *lim = &limits[QW_HP_TOKEN_ID];
    if (!(it->valuedouble >= (double)lim->lo && it->valuedouble <= (double)lim->hi) ||
        it->valuedouble != floor(it->valuedouble)) {
        cfg_range(r, key, it->valuedouble, lim->lo, lim->hi, NULL);
        return -1;
    }
    return (int)it->valuedouble;
}

static int arch_from_model_type(const char *mt, qw_arch *a) {
    static const struct {
        const char *name;
        qw_arch arch;
    } map[] = {
        {"llama", QW_ARCH_LLAMA},           {"qwen3", QW_ARCH_QWEN3},
        {"qwen3_5", QW_ARCH_QWEN35},        {"qwen3_5_text", QW_ARCH_QWEN35},
        {"qwen3_5_moe", QW_ARCH_QWEN35_MOE}, {"qwen3_5_moe_text", QW_ARCH_QWEN35_MOE},
        {"qwen3_next", QW_ARCH_QWEN3_NEXT}, {"qwen4_exp", QW_ARCH_QWEN4EXP},
        {"qwen4_exp_text", QW_ARCH_QWEN4EXP},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(mt, map[i].name) == 0) {
            *a = map[i].arch;
            return 1;
        }
    return 0;
}

/* Ratios and bases of the RoPE parameters: finite and positive (the largest released: theta 1e7, llama3 factor
 * 8, linear factors up to 32). */
#define HP_ROPE_MAX 1e18

static void read_rope(cfg_reader *r, qw_hparams *hp) {
    const cJSON *rp = cfg_item(r, "rope_parameters");
    if (!rp) rp = cfg_item(r, "rope_scaling");
    if (rp && !cJSON_IsObject(rp)) {
        cfg_fail(r, QWENC_ERR_FORMAT, "rope_parameters", "expected an object");
        rp = NULL;
    }
    hp->rope_theta = (float)cfg_num(r, "rope_theta", 10000.0, 0, HP_ROPE_MAX, 1);
    hp->rope_theta = (float)cfg_num_in(r, rp, "rope_theta", hp->rope_theta, 0, HP_ROPE_MAX, 1);
    double prf = cfg_num(r, "partial_rotary_factor", 1.0, 0, 1, 1);
    prf = cfg_num_in(r, rp, "partial_rotary_factor", prf, 0, 1, 1);
    hp->n_rot = (int)(hp->head_dim * prf);
    const cJSON *ty = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    if (!ty && rp) ty = cJSON_GetObjectItemCaseSensitive(rp, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "default";
    hp->rope_type = QW_ROPE_DEFAULT;
    if (strcmp(type, "default") == 0 || strcmp(type, "mrope") == 0) {
        hp->rope_type = QW_ROPE_DEFAULT;
    } else if (strcmp(type, "llama3") == 0) {
        hp->rope_type = QW_ROPE_LLAMA3;
        hp->rope_factor = (float)cfg_num_in(r, rp, "factor", 8.0, 0, HP_ROPE_MAX, 1);
        hp->rope_low_freq = (float)cfg_num_in(r, rp, "low_freq_factor", 1.0, 0, HP_ROPE_MAX, 1);
        hp->rope_high_freq = (float)cfg_num_in(r, rp, "high_freq_factor", 4.0, 0, HP_ROPE_MAX, 1);
        const qw_hp_limit *oc = &limits[QW_HP_ROPE_ORIG_CTX];
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(rp, oc->config);
        double orig = 8192;
        if (it && !cJSON_IsNull(it) && !cJSON_IsNumber(it)) cfg_fail(r, QWENC_ERR_FORMAT, oc->config, "expected an integer");
        if (cJSON_IsNumber(it)) orig = it->valuedouble;
        cfg_range(r, oc->config, orig, oc->lo, oc->hi, NULL);
        hp->rope_orig_ctx = r->st ? 8192 : (int)orig;
        if (!r->st && hp->rope_high_freq <= hp->rope_low_freq)
            cfg_fail(r, QWENC_ERR_FORMAT, "rope_parameters",
                     "llama3 scaling needs low_freq_factor < high_freq_factor");
    } else if (strcmp(type, "linear") == 0) {
        hp->rope_type = QW_ROPE_LINEAR;
        hp->rope_factor = (float)cfg_num_in(r, rp, "factor", 1.0, 0, HP_ROPE_MAX, 1);
    } else {
        char msg[160];
        snprintf(msg, sizeof(msg), "rope_type \"%.40s\" is not supported (default, llama3, linear)", type);
        cfg_fail(r, QWENC_ERR_UNSUPPORTED, "rope_parameters", msg);
    }
}

/* layer_types list, or the full_attention_interval pattern. */
static void read_layer_types(cfg_reader *r, qw_hparams *hp) {
    const cJSON *lt = cfg_item(r, "layer_types");
    int interval = (int)cfg_hp(r, QW_HP_ATTN_INTERVAL, 4, 0);
    qw_layer_kind attn = hp->arch == QW_ARCH_QWEN4EXP ? QW_LAYER_QSA : QW_LAYER_ATTN;
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer) {
            char msg[96];
            snprintf(msg, sizeof(msg), "expected a list of num_hidden_layers = %d strings", hp->n_layer);
            cfg_fail(r, QWENC_ERR_FORMAT, "layer_types", msg);
            return;
        }
        for (int l = 0; l < hp->n_layer; l++) {
            const cJSON *s = cJSON_GetArrayItem(lt, l);
            if (!cJSON_IsString(s)) {
                cfg_fail(r, QWENC_ERR_FORMAT, "layer_types", "entries must be strings");
                return;
            }
            if (strcmp(s->valuestring, "linear_attention") == 0) {
                hp->layer_kind[l] = QW_LAYER_GDN;
            } else if (hp->arch == QW_ARCH_QWEN4EXP || strcmp(s->valuestring, "full_attention") == 0) {
                /* qwen4_exp: every non-linear entry is QSA (names differ across upstream revisions) */
                hp->layer_kind[l] = attn;
            } else {
                char msg[128];
                snprintf(msg, sizeof(msg), "layer %d: \"%.40s\" is not linear_attention or full_attention", l,
                         s->valuestring);
                cfg_fail(r, QWENC_ERR_UNSUPPORTED, "layer_types", msg);
                return;
            }
        }
    } else {
        for (int l = 0; l < hp->n_layer; l++)
            hp->layer_kind[l] = (interval > 0 && (l + 1) % interval == 0) ? attn : QW_LAYER_GDN;
    }
}

static void read_moe(cfg_reader *r, qw_hparams *hp) {
    hp->n_expert = (int)cfg_hp(r, QW_HP_EXPERT, 0, 1);
    hp->n_expert_used = (int)cfg_hp(r, QW_HP_EXPERT_USED, 0, 1);
    hp->n_ff_exp = (int)cfg_hp(r, QW_HP_FF_EXP, 0, 1);
    hp->n_ff_shexp = (int)cfg_hp(r, QW_HP_FF_SHEXP, 0, 1);
    hp->norm_topk_prob = hp->arch == QW_ARCH_QWEN35_MOE ? 1 : cfg_bool(r, "norm_topk_prob", 1);
    if (!r->st && hp->n_expert > 0)
        cfg_range(r, limits[QW_HP_EXPERT_USED].config, hp->n_expert_used, 1, hp->n_expert, "1..num_experts");
}

static void read_gdn(cfg_reader *r, qw_hparams *hp) {
    hp->gdn_conv_k = (int)cfg_hp(r, QW_HP_GDN_CONV, 4, 0);
    hp->gdn_dk = (int)cfg_hp(r, QW_HP_GDN_DK, 128, 0);
    hp->gdn_dv = (int)cfg_hp(r, QW_HP_GDN_DV, 128, 0);
    hp->gdn_hk = (int)cfg_hp(r, QW_HP_GDN_HK, 16, 0);
    hp->gdn_hv = (int)cfg_hp(r, QW_HP_GDN_HV, 32, 0);
    if (!r->st && hp->gdn_hv % hp->gdn_hk != 0)
        cfg_fail(r, QWENC_ERR_FORMAT, "linear_num_value_heads", "must be a multiple of linear_num_key_heads");
}

/* qwen4_exp: hyper-connections, PLE, QSA indexer, output gate, and the 5.17 validation rules. */
static void read_qwen4exp(cfg_reader *r, qw_hparams *hp) {
    hp->hc_count = (int)cfg_hp(r, QW_HP_HC_COUNT, 4, 0);
    hp->hc_lowrank = (int)cfg_hp(r, QW_HP_HC_LOWRANK, 320, 0);

    const cJSON *og = cfg_item(r, "output_gate_type");
    const cJSON *act = cfg_item(r, "hidden_act");
    const char *gate = cJSON_IsString(og) ? og->valuestring : cJSON_IsString(act) ? act->valuestring : "silu";
    if (strcmp(gate, "sigmoid") == 0)
        hp->gdn_gate_sigmoid = 1;
    else if (strcmp(gate, "silu") != 0)
        cfg_fail(r, QWENC_ERR_UNSUPPORTED, "output_gate_type", "must be \"sigmoid\" or \"silu\"");

    int has_qsa = 0;
    for (int l = 0; l < hp->n_layer; l++) has_qsa |= hp->layer_kind[l] == QW_LAYER_QSA;
    if (has_qsa) {
        hp->idx_n_head = (int)cfg_hp(r, QW_HP_IDX_HEAD, 0, 1);
        int idx_kv = (int)cfg_int_in(r, "indexer_kv_heads", 0, 1, 0, HP_IDX_MAX);
        hp->idx_head_dim = (int)cfg_hp(r, QW_HP_IDX_HEAD_DIM, 0, 1);
        hp->idx_budget = (int)cfg_hp(r, QW_HP_IDX_BUDGET, 0, 1);
        hp->idx_ratio = (int)cfg_hp(r, QW_HP_IDX_RATIO, 0, 1);
        if (r->st)
            ;
        else if (idx_kv != 1)
            cfg_fail(r, QWENC_ERR_UNSUPPORTED, "indexer_kv_heads", "must be 1");
        else if (hp->idx_budget % hp->idx_ratio != 0)
            cfg_fail(r, QWENC_ERR_FORMAT, "indexer_budget", "must be a multiple of indexer_compress_ratio");
        else if (hp->n_rot > hp->idx_head_dim)
            cfg_fail(r, QWENC_ERR_FORMAT, "indexer_head_dim", "must be at least the rotary dimension");
    }
    if (r->st) return;

    const cJSON *ids = cfg_item(r, "ple_layer_ids");
    if (ids && !cJSON_IsArray(ids)) cfg_fail(r, QWENC_ERR_FORMAT, "ple_layer_ids", "expected a list");
    int n = ids && cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
    uint8_t *mark = qw_calloc((size_t)hp->n_layer, 1);
    if (!mark) {
        if (!r->st) r->st = qw_err_nomem(r->err, r->errlen, r->path, (size_t)hp->n_layer, 1);
        return;
    }
    int n_mark = 0, i = 0;
    for (const cJSON *it = ids && cJSON_IsArray(ids) ? ids->child : NULL; it && !r->st; it = it->next, i++) {
        char name[48];
        snprintf(name, sizeof(name), "\"ple_layer_ids\" entry %d", i);
        double id = cJSON_IsNumber(it) ? it->valuedouble : -1;
        r->st = qw_hp_check(id, 1, hp->n_layer, r->path, name, "a one-indexed layer number, at most num_hidden_layers",
                            r->err, r->errlen);
        if (r->st) break;
        n_mark += !mark[(int)id - 1];
        mark[(int)id - 1] = 1; /* de-duplicated and sorted */
    }
    (void)n;
    if (!r->st && n_mark) {
        hp->ple_layers = qw_calloc((size_t)n_mark, sizeof(int));
        if (!hp->ple_layers) r->st = qw_err_nomem(r->err, r->errlen, r->path, (size_t)n_mark, sizeof(int));
    }
    for (int l = 0; l < hp->n_layer && !r->st; l++)
        if (mark[l]) {
            if (hp->layer_kind[l] != QW_LAYER_GDN)
                cfg_fail(r, QWENC_ERR_FORMAT, "ple_layer_ids", "every PLE layer must be a linear_attention layer");
            hp->ple_layers[hp->n_ple++] = l;
        }
    free(mark);
    if (hp->n_ple && !r->st) {
        hp->ple_dim = (int)cfg_hp(r, QW_HP_PLE_DIM, hp->n_embd, 0);
        hp->ple_conv_k = (int)cfg_hp(r, QW_HP_PLE_CONV, 4, 0);
        hp->ngram_n = (int)cfg_hp(r, QW_HP_NGRAM_N, 3, 0);
        int hpn = (int)cfg_hp(r, QW_HP_NGRAM_HPN, 8, 0);
        hp->ngram_base = cfg_hp(r, QW_HP_NGRAM_BASE, 20000000, 0);
        hp->ngram_div = (int)cfg_hp(r, QW_HP_NGRAM_DIV, 128, 0);
        hp->ngram_seed = (uint64_t)cfg_hp(r, QW_HP_SEED, 1234, 0);
        if (r->st) return;
        hp->ngram_heads = (hp->ngram_n - 1) * hpn;
        if (hp->ple_dim % hp->ngram_heads != 0)
            cfg_fail(r, QWENC_ERR_FORMAT, "ple_embed_dim", "must be a multiple of (ngram_size-1)*heads_per_ngram");
        if (hp->eos_id < 0 || hp->eos_id >= hp->n_vocab)
            cfg_fail(r, QWENC_ERR_FORMAT, "eos_token_id", "PLE needs an eos_token_id inside the vocabulary");
    }
}

qwenc_status qw_hparams_load(qw_hparams *hp, const char *dir, char *err, size_t errlen) {
    memset(hp, 0, sizeof(*hp));
    char *path = qw_path_new(dir, "config.json");
    if (!path) return qw_err_nomem(err, errlen, dir, strlen(dir) + 13, 1);
    char *txt = NULL;
    qwenc_status st = qw_read_file_max(path, QW_READ_CONFIG_MAX, &txt, NULL, err, errlen);
    if (st) {
        free(path);
        return st;
    }
    st = qw_hparams_parse(hp, txt, path, err, errlen);
    free(txt);
    free(path);
    return st;
}

qwenc_status qw_hparams_parse(qw_hparams *hp, const char *txt, const char *path, char *err, size_t errlen) {
    memset(hp, 0, sizeof(*hp));
    qwenc_status st = QWENC_OK;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(txt, &end, 0);
    if (!cJSON_IsObject(root)) {
        int line = 1;
        for (const char *p = txt; end && p < end; p++) line += *p == '\n';
        st = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: not a valid JSON object (error near line %d)", path,
                    line);
        cJSON_Delete(root);
        return st;
    }
    cfg_reader r = {.top = root, .path = path, .err = err, .errlen = errlen};
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(tc)) r.text = tc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt) && r.text) mt = cJSON_GetObjectItemCaseSensitive(r.text, "model_type");
    if (!cJSON_IsString(mt)) {
        cfg_fail(&r, QWENC_ERR_FORMAT, "model_type", "missing");
    } else if (!arch_from_model_type(mt->valuestring, &hp->arch)) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "unknown model_type \"%.40s\" (supported: qwen4_exp, qwen4_exp_text, qwen3_5, qwen3_5_text, "
                 "qwen3_5_moe, qwen3_5_moe_text, qwen3_next, qwen3, llama)",
                 mt->valuestring);
        cfg_fail(&r, QWENC_ERR_UNSUPPORTED, "model_type", msg);
    } else {
        snprintf(hp->model_type, sizeof(hp->model_type), "%s", mt->valuestring);
    }
    if (r.st) goto done;

    hp->n_vocab = (int)cfg_hp(&r, QW_HP_VOCAB, 0, 1);
    hp->n_embd = (int)cfg_hp(&r, QW_HP_EMBD, 0, 1);
    hp->n_layer = (int)cfg_hp(&r, QW_HP_LAYER, 0, 1);
    hp->n_head = (int)cfg_hp(&r, QW_HP_HEAD, 0, 1);
    if (r.st) goto done;
    hp->n_head_kv = (int)cfg_hp(&r, QW_HP_HEAD_KV, hp->n_head, 0);
    if (r.st) goto done;
    if (hp->n_head % hp->n_head_kv != 0) {
        cfg_fail(&r, QWENC_ERR_FORMAT, "num_key_value_heads", "must divide num_attention_heads");
        goto done;
    }
    hp->head_dim = (int)cfg_hp(&r, QW_HP_HEAD_DIM, hp->n_embd / hp->n_head, 0);
    hp->norm_eps = (float)cfg_num(&r, "rms_norm_eps", 1e-6, 0, 1, 0);
    hp->n_ctx_train = (int)cfg_hp(&r, QW_HP_CTX, 4096, 0);
    hp->tie_embd = cfg_bool(&r, "tie_word_embeddings", hp->arch == QW_ARCH_QWEN35 ? 0 : 0);
    hp->eos_id = cfg_first_id(&r, "eos_token_id");
    hp->bos_id = cfg_first_id(&r, "bos_token_id");
    hp->n_ff = (int)cfg_hp(&r, QW_HP_FF, 0, hp->arch == QW_ARCH_LLAMA || hp->arch == QW_ARCH_QWEN3 ||
                                               hp->arch == QW_ARCH_QWEN35);
    if (r.st) goto done;
    read_rope(&r, hp);
    if (!r.st && (hp->n_rot <= 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim))
        cfg_fail(&r, QWENC_ERR_FORMAT, "partial_rotary_factor", "the rotary dimension must be even and in (0, head_dim]");
    if (r.st) goto done;

    hp->layer_kind = qw_calloc((size_t)hp->n_layer, sizeof(qw_layer_kind));
    hp->layer_moe = qw_calloc((size_t)hp->n_layer, 1);
    if (!hp->layer_kind || !hp->layer_moe) {
        r.st = qw_err_nomem(err, errlen, path, (size_t)hp->n_layer, sizeof(qw_layer_kind) + 1);
        goto done;
    }
    switch (hp->arch) {
    case QW_ARCH_LLAMA:
    case QW_ARCH_QWEN3:
        hp->attn_bias = cfg_bool(&r, "attention_bias", 0);
        hp->mlp_bias = cfg_bool(&r, "mlp_bias", 0);
        if (hp->arch == QW_ARCH_QWEN3 && cfg_bool(&r, "use_sliding_window", 0))
            cfg_fail(&r, QWENC_ERR_UNSUPPORTED, "use_sliding_window", "sliding-window attention is not supported");
        if (hp->n_ff <= 0) cfg_fail(&r, QWENC_ERR_FORMAT, "intermediate_size", "must be positive");
        break;
    case QW_ARCH_QWEN35:
        read_gdn(&r, hp);
        read_layer_types(&r, hp);
        if (hp->n_ff <= 0) cfg_fail(&r, QWENC_ERR_FORMAT, "intermediate_size", "must be positive");
        break;
    case QW_ARCH_QWEN35_MOE:
        read_gdn(&r, hp);
        read_layer_types(&r, hp);
        read_moe(&r, hp);
        if (!r.st && hp->n_expert <= 0) cfg_fail(&r, QWENC_ERR_FORMAT, "num_experts", "must be positive");
        memset(hp->layer_moe, 1, (size_t)hp->n_layer);
        break;
    case QW_ARCH_QWEN3_NEXT: {
        read_gdn(&r, hp);
        read_layer_types(&r, hp);
        read_moe(&r, hp);
        int step = (int)cfg_hp(&r, QW_HP_SPARSE_STEP, 1, 0);
        const cJSON *only = cfg_item(&r, "mlp_only_layers");
        if (only && !cJSON_IsArray(only)) cfg_fail(&r, QWENC_ERR_FORMAT, "mlp_only_layers", "expected a list");
        if (r.st) break;
        int any_dense = 0;
        for (int l = 0; l < hp->n_layer; l++) {
            int dense = hp->n_expert == 0 || (l + 1) % step != 0;
            for (const cJSON *it = only ? only->child : NULL; it; it = it->next)
                dense |= cJSON_IsNumber(it) && it->valuedouble == (double)l;
            hp->layer_moe[l] = !dense;
            any_dense |= dense;
        }
        if (any_dense && hp->n_ff <= 0)
            cfg_fail(&r, QWENC_ERR_FORMAT, "intermediate_size", "dense MLP layers need a positive intermediate_size");
        break;
    }
    case QW_ARCH_QWEN4EXP:
        read_gdn(&r, hp);
        read_layer_types(&r, hp);
        read_moe(&r, hp);
        if (!r.st && hp->n_expert <= 0) cfg_fail(&r, QWENC_ERR_FORMAT, "num_experts", "must be positive");
        memset(hp->layer_moe, 1, (size_t)hp->n_layer);
        if (!r.st) read_qwen4exp(&r, hp);
        break;
    default:
        break;
    }
    if (!r.st) r.st = qw_hparams_check(hp, path, 0, err, errlen);
done:
    st = r.st;
    cJSON_Delete(root);
    if (st) qw_hparams_free(hp);
    return st;
}

void qw_hparams_free(qw_hparams *hp) {
    free(hp->layer_kind);
    free(hp->layer_moe);
    free(hp->ple_layers);
    hp->layer_kind = NULL;
    hp->layer_moe = NULL;
    hp->ple_layers = NULL;
}
