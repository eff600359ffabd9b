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

/* An integer field; def < 0 with required=1 means the field must be present. */
static int64_t cfg_int(cfg_reader *r, const char *key, int64_t def, int required) {
    const cJSON *it = cfg_item(r, key);
    if (!it) {
        if (required) cfg_fail(r, QWENC_ERR_FORMAT, key, "missing (required for this model_type)");
        return def;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected an integer");
        return def;
    }
    return (int64_t)it->valuedouble;
}

static double cfg_num_in(cfg_reader *r, const cJSON *obj, const char *key, double def) {
    const cJSON *it = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!it || cJSON_IsNull(it)) return def;
    if (!cJSON_IsNumber(it)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected a number");
        return def;
    }
    return it->valuedouble;
}

static double cfg_num(cfg_reader *r, const char *key, double def) {
    const cJSON *it = cfg_item(r, key);
    if (!it) return def;
    if (!cJSON_IsNumber(it)) {
        cfg_fail(r, QWENC_ERR_FORMAT, key, "expected a number");
        return def;
    }
    return it->valuedouble;
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

static void read_rope(cfg_reader *r, qw_hparams *hp) {
    const cJSON *rp = cfg_item(r, "rope_parameters");
    if (!rp) rp = cfg_item(r, "rope_scaling");
    if (rp && !cJSON_IsObject(rp)) {
        cfg_fail(r, QWENC_ERR_FORMAT, "rope_parameters", "expected an object");
        rp = NULL;
    }
    hp->rope_theta = (float)cfg_num(r, "rope_theta", 10000.0);
    hp->rope_theta = (float)cfg_num_in(r, rp, "rope_theta", hp->rope_theta);
    double prf = cfg_num(r, "partial_rotary_factor", 1.0);
    prf = cfg_num_in(r, rp, "partial_rotary_factor", prf);
    hp->n_rot = (int)(hp->head_dim * prf);
    const cJSON *ty = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    if (!ty && rp) ty = cJSON_GetObjectItemCaseSensitive(rp, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "default";
    hp->rope_type = QW_ROPE_DEFAULT;
    if (strcmp(type, "default") == 0 || strcmp(type, "mrope") == 0) {
        hp->rope_type = QW_ROPE_DEFAULT;
    } else if (strcmp(type, "llama3") == 0) {
        hp->rope_type = QW_ROPE_LLAMA3;
        hp->rope_factor = (float)cfg_num_in(r, rp, "factor", 8.0);
        hp->rope_low_freq = (float)cfg_num_in(r, rp, "low_freq_factor", 1.0);
        hp->rope_high_freq = (float)cfg_num_in(r, rp, "high_freq_factor", 4.0);
        hp->rope_orig_ctx = (int)cfg_num_in(r, rp, "original_max_position_embeddings", 8192);
        if (hp->rope_factor <= 0 || hp->rope_low_freq <= 0 || hp->rope_high_freq <= hp->rope_low_freq ||
            hp->rope_orig_ctx <= 0)
            cfg_fail(r, QWENC_ERR_FORMAT, "rope_parameters",
                     "llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                     "original_max_position_embeddings > 0");
    } else if (strcmp(type, "linear") == 0) {
        hp->rope_type = QW_ROPE_LINEAR;
        hp->rope_factor = (float)cfg_num_in(r, rp, "factor", 1.0);
        if (hp->rope_factor <= 0) cfg_fail(r, QWENC_ERR_FORMAT, "rope_parameters", "factor must be > 0");
    } else {
        char msg[160];
        snprintf(msg, sizeof(msg), "rope_type \"%s\" is not supported (default, llama3, linear)", type);
        cfg_fail(r, QWENC_ERR_UNSUPPORTED, "rope_parameters", msg);
    }
}

/* layer_types list, or the full_attention_interval pattern. */
static void read_layer_types(cfg_reader *r, qw_hparams *hp) {
    const cJSON *lt = cfg_item(r, "layer_types");
    int interval = (int)cfg_int(r, "full_attention_interval", 4, 0);
    if (interval <= 0) cfg_fail(r, QWENC_ERR_FORMAT, "full_attention_interval", "must be positive");
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
    hp->n_expert = (int)cfg_int(r, "num_experts", 0, 1);
    hp->n_expert_used = (int)cfg_int(r, "num_experts_per_tok", 0, 1);
    hp->n_ff_exp = (int)cfg_int(r, "moe_intermediate_size", 0, 1);
    hp->n_ff_shexp = (int)cfg_int(r, "shared_expert_intermediate_size", 0, 1);
    hp->norm_topk_prob = hp->arch == QW_ARCH_QWEN35_MOE ? 1 : cfg_bool(r, "norm_topk_prob", 1);
    if (r->st) return;
    if (hp->n_expert < 0 || hp->n_ff_exp <= 0 || hp->n_ff_shexp <= 0)
        cfg_fail(r, QWENC_ERR_FORMAT, "num_experts",
                 "num_experts, moe_intermediate_size and shared_expert_intermediate_size must be positive");
    else if (hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert))
        cfg_fail(r, QWENC_ERR_FORMAT, "num_experts_per_tok", "must be between 1 and num_experts");
}

static void read_gdn(cfg_reader *r, qw_hparams *hp) {
    hp->gdn_conv_k = (int)cfg_int(r, "linear_conv_kernel_dim", 4, 0);
    hp->gdn_dk = (int)cfg_int(r, "linear_key_head_dim", 128, 0);
    hp->gdn_dv = (int)cfg_int(r, "linear_value_head_dim", 128, 0);
    hp->gdn_hk = (int)cfg_int(r, "linear_num_key_heads", 16, 0);
    hp->gdn_hv = (int)cfg_int(r, "linear_num_value_heads", 32, 0);
    if (r->st) return;
    if (hp->gdn_conv_k <= 0 || hp->gdn_dk <= 0 || hp->gdn_dv <= 0 || hp->gdn_hk <= 0 || hp->gdn_hv <= 0)
        cfg_fail(r, QWENC_ERR_FORMAT, "linear_num_value_heads", "linear attention sizes must be positive");
    else if (hp->gdn_hv % hp->gdn_hk != 0)
        cfg_fail(r, QWENC_ERR_FORMAT, "linear_num_value_heads", "must be a multiple of linear_num_key_heads");
}

/* qwen4_exp: hyper-connections, PLE, QSA indexer, output gate, and the 5.17 validation rules. */
static void read_qwen4exp(cfg_reader *r, qw_hparams *hp) {
    hp->hc_count = (int)cfg_int(r, "hc_count", 4, 0);
    hp->hc_lowrank = (int)cfg_int(r, "hc_lowrank", 320, 0);
    if (!r->st && (hp->hc_count <= 1 || hp->hc_lowrank <= 0))
        cfg_fail(r, QWENC_ERR_FORMAT, "hc_count", "hc_count must be > 1 and hc_lowrank > 0");

    const cJSON *og = cfg_item(r, "output_gate_type");
    const cJSON *act = cfg_item(r, "hidden_act");
    const char *gate = cJSON_IsString(og) ? og->valuestring : cJSON_IsString(act) ? act->valuestring : "silu";
    if (strcmp(gate, "sigmoid") == 0)
        hp->gdn_gate_sigmoid = 1;
    else if (strcmp(gate, "silu") != 0)
        cfg_fail(r, QWENC_ERR_UNSUPPORTED, "output_gate_type", "must be \"sigmoid\" or \"silu\"");

    int has_qsa = 0;
    for (int l = 0; l < hp->n_layer; l++) has_qsa |= hp->layer_kind[l] == QW_LAYER_QSA;
    hp->idx_n_head = (int)cfg_int(r, "indexer_n_heads", 0, has_qsa);
    int idx_kv = (int)cfg_int(r, "indexer_kv_heads", 0, has_qsa);
    hp->idx_head_dim = (int)cfg_int(r, "indexer_head_dim", 0, has_qsa);
    hp->idx_budget = (int)cfg_int(r, "indexer_budget", 0, has_qsa);
    hp->idx_ratio = (int)cfg_int(r, "indexer_compress_ratio", 0, has_qsa);
    if (!r->st && has_qsa) {
        if (hp->idx_n_head <= 0 || hp->idx_head_dim <= 0 || hp->idx_budget <= 0 || hp->idx_ratio <= 0)
            cfg_fail(r, QWENC_ERR_FORMAT, "indexer_n_heads", "indexer sizes must be positive");
        else if (idx_kv != 1)
            cfg_fail(r, QWENC_ERR_UNSUPPORTED, "indexer_kv_heads", "must be 1");
        else if (hp->idx_budget % hp->idx_ratio != 0)
            cfg_fail(r, QWENC_ERR_FORMAT, "indexer_budget", "must be a multiple of indexer_compress_ratio");
        else if (hp->n_rot > hp->idx_head_dim)
            cfg_fail(r, QWENC_ERR_FORMAT, "indexer_head_dim", "must be at least the rotary dimension");
    }

    const cJSON *ids = cfg_item(r, "ple_layer_ids");
    if (ids && !cJSON_IsArray(ids)) cfg_fail(r, QWENC_ERR_FORMAT, "ple_layer_ids", "expected a list");
    int n = ids && cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
    hp->ple_layers = qw_xcalloc((size_t)(n ? n : 1), sizeof(int));
    uint8_t *mark = qw_xcalloc((size_t)hp->n_layer + 1, 1);
    for (int i = 0; i < n; i++) {
        const cJSON *it = cJSON_GetArrayItem(ids, i);
        int id = cJSON_IsNumber(it) ? (int)it->valuedouble : -1;
        if (id < 1 || id > hp->n_layer) {
            cfg_fail(r, QWENC_ERR_FORMAT, "ple_layer_ids", "ids are one-indexed layer numbers in [1, num_hidden_layers]");
            break;
        }
        mark[id - 1] = 1; /* de-duplicated and sorted */
    }
    for (int l = 0; l < hp->n_layer; l++)
        if (mark[l]) {
            if (hp->layer_kind[l] != QW_LAYER_GDN)
                cfg_fail(r, QWENC_ERR_FORMAT, "ple_layer_ids", "every PLE layer must be a linear_attention layer");
            hp->ple_layers[hp->n_ple++] = l;
        }
    free(mark);
    if (hp->n_ple) {
        hp->ple_dim = (int)cfg_int(r, "ple_embed_dim", hp->n_embd, 0);
        hp->ple_conv_k = (int)cfg_int(r, "ple_conv_kernel_size", 4, 0);
        hp->ngram_n = (int)cfg_int(r, "ngram_size", 3, 0);
        int hpn = (int)cfg_int(r, "heads_per_ngram", 8, 0);
        hp->ngram_base = cfg_int(r, "ngram_vocab_size_base", 20000000, 0);
        hp->ngram_div = (int)cfg_int(r, "make_ngram_vocab_size_divisible_by", 128, 0);
        hp->ngram_seed = (uint64_t)cfg_int(r, "seed", 1234, 0);
        if (r->st) return;
        if (hp->ngram_n < 2 || hpn <= 0 || hp->ple_conv_k <= 0 || hp->ngram_base < 2 || hp->ngram_div <= 0 ||
            hp->ple_dim <= 0) {
            cfg_fail(r, QWENC_ERR_FORMAT, "ngram_size", "PLE sizes must be positive (ngram_size >= 2)");
            return;
        }
        hp->ngram_heads = (hp->ngram_n - 1) * hpn;
        if (hp->ple_dim % hp->ngram_heads != 0)
            cfg_fail(r, QWENC_ERR_FORMAT, "ple_embed_dim", "must be a multiple of (ngram_size-1)*heads_per_ngram");
        if (hp->eos_id < 0 || hp->eos_id >= hp->n_vocab)
            cfg_fail(r, QWENC_ERR_FORMAT, "eos_token_id", "PLE needs an eos_token_id inside the vocabulary");
    }
}

qwenc_status qw_hparams_load(qw_hparams *hp, const char *dir, char *err, size_t errlen) {
    memset(hp, 0, sizeof(*hp));
    char *path = qw_path_join(dir, "config.json");
    char *txt = NULL;
    qwenc_status st = qw_read_file(path, &txt, NULL, err, errlen);
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

    hp->n_vocab = (int)cfg_int(&r, "vocab_size", 0, 1);
    hp->n_embd = (int)cfg_int(&r, "hidden_size", 0, 1);
    hp->n_layer = (int)cfg_int(&r, "num_hidden_layers", 0, 1);
    hp->n_head = (int)cfg_int(&r, "num_attention_heads", 0, 1);
    hp->n_head_kv = (int)cfg_int(&r, "num_key_value_heads", hp->n_head, 0);
    if (r.st) goto done;
    if (hp->n_vocab <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0) {
        cfg_fail(&r, QWENC_ERR_FORMAT, "hidden_size",
                 "vocab_size, hidden_size, num_hidden_layers and the head counts must be positive");
        goto done;
    }
    if (hp->n_head % hp->n_head_kv != 0) {
        cfg_fail(&r, QWENC_ERR_FORMAT, "num_key_value_heads", "must divide num_attention_heads");
        goto done;
    }
    hp->head_dim = (int)cfg_int(&r, "head_dim", hp->n_embd / hp->n_head, 0);
    hp->norm_eps = (float)cfg_num(&r, "rms_norm_eps", 1e-6);
    hp->n_ctx_train = (int)cfg_int(&r, "max_position_embeddings", 4096, 0);
    hp->tie_embd = cfg_bool(&r, "tie_word_embeddings", hp->arch == QW_ARCH_QWEN35 ? 0 : 0);
    hp->eos_id = cfg_first_id(&r, "eos_token_id");
    hp->bos_id = cfg_first_id(&r, "bos_token_id");
    hp->n_ff = (int)cfg_int(&r, "intermediate_size", 0, hp->arch == QW_ARCH_LLAMA || hp->arch == QW_ARCH_QWEN3 ||
                                                           hp->arch == QW_ARCH_QWEN35);
    if (hp->head_dim <= 0) cfg_fail(&r, QWENC_ERR_FORMAT, "head_dim", "must be positive");
    if (r.st) goto done;
    read_rope(&r, hp);
    if (!r.st && (hp->n_rot <= 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim))
        cfg_fail(&r, QWENC_ERR_FORMAT, "partial_rotary_factor", "the rotary dimension must be even and in (0, head_dim]");
    if (r.st) goto done;

    hp->layer_kind = qw_xcalloc((size_t)hp->n_layer, sizeof(qw_layer_kind));
    hp->layer_moe = qw_xcalloc((size_t)hp->n_layer, 1);
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
        memset(hp->layer_moe, 1, (size_t)hp->n_layer);
        break;
    case QW_ARCH_QWEN3_NEXT: {
        read_gdn(&r, hp);
        read_layer_types(&r, hp);
        read_moe(&r, hp);
        int step = (int)cfg_int(&r, "decoder_sparse_step", 1, 0);
        const cJSON *only = cfg_item(&r, "mlp_only_layers");
        if (step <= 0) cfg_fail(&r, QWENC_ERR_FORMAT, "decoder_sparse_step", "must be positive");
        if (only && !cJSON_IsArray(only)) cfg_fail(&r, QWENC_ERR_FORMAT, "mlp_only_layers", "expected a list");
        if (r.st) break;
        int any_dense = 0;
        for (int l = 0; l < hp->n_layer; l++) {
            int dense = hp->n_expert == 0 || (l + 1) % step != 0;
            for (const cJSON *it = only ? only->child : NULL; it; it = it->next)
                dense |= cJSON_IsNumber(it) && (int)it->valuedouble == l;
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
