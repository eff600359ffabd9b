/*
 * t_hostile.c - files and sizes a stranger may hand qwenc, and running out of memory: every one a clean error
 * naming the input, nothing that crashes, blocks or allocates absurdly.
 *
 *   t_hostile                                   run the tests (scratch files under $TMPDIR, removed after)
 *   t_hostile --gguf-set IN OUT KEY TYPE VALUE  copy the GGUF IN to OUT with metadata KEY set to VALUE of TYPE
 *                                               (u32, i32, u64, f32, or u32s: an array of VALUE entries 0, 1,
 *                                               ...), for tests/cli_hostile.sh
 *
 * 1. Hyper-parameter bounds: every row of the bounds table (formats/hfconfig.c) with a config.json field is
 *    set, in a fixture's config, below and above its range and to absurd values (2^31 - 1, -2^31, 1e300):
 *    each is refused with a message naming the field, the value and the range. The configs of the largest
 *    released models of each architecture parse.
 * 2. The same for GGUF metadata: a fixture written as GGUF, copied with one key changed.
 * 3. Files: a FIFO, /dev/zero and a directory in place of config.json, model.safetensors or tokenizer.json
 *    are refused at once (a FIFO would block open() forever); a file over the read limit is refused.
 * 4. Out of memory: the checked allocations are made to fail one at a time (qw_alloc_fail_at) while a model
 *    loads (safetensors, GGUF, quantized at load), a session starts and runs, a sampler starts and a GGUF is
 *    written: each run returns QWENC_ERR_NOMEM (or succeeds, where a fallback exists) and leaks nothing
 *    (make asan). A session under a real memory limit (setrlimit, in a child) fails with QWENC_ERR_NOMEM.
 * 5. Scratch: on every fixture, no forward step goes past the session's memory plan, decode steps take the
 *    same scratch, and once warm, decoding makes no checked allocation at all.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "formats/gguf.h"
#include "blocks/blocks.h"
#include "formats/hfconfig.h"
#include "kernels/cpu.h"
#include "models/model.h"
#include "test_util.h"

#define FIX "tests/fixtures"

static char tmpdir[512];

static const char *tmp_path(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", tmpdir, name);
    return out;
}

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* ---------------------------------------------------------------- 1. config.json bounds */

static cJSON *fixture_config(const char *fixture) {
    char path[256], *txt = NULL, err[512];
    snprintf(path, sizeof(path), "%s/%s/config.json", FIX, fixture);
    if (qw_read_file(path, &txt, NULL, err, sizeof(err))) {
        printf("FAIL %s\n", err);
        return NULL;
    }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    return j;
}

/* Parse the config with field (in obj, or at the top level) set to v; returns the status, message in err. */
static qwenc_status parse_with(cJSON *cfg, const char *obj, const char *field, double v, char *err, size_t errlen) {
    cJSON *dst = obj ? cJSON_GetObjectItemCaseSensitive(cfg, obj) : cfg;
    cJSON *num = cJSON_CreateNumber(v);
    if (cJSON_GetObjectItemCaseSensitive(dst, field))
        cJSON_ReplaceItemInObjectCaseSensitive(dst, field, num);
    else
        cJSON_AddItemToObject(dst, field, num);
    char *txt = cJSON_PrintUnformatted(cfg);
    qw_hparams hp;
    err[0] = 0;
    qwenc_status st = qw_hparams_parse(&hp, txt, "dir/config.json", err, errlen);
    if (!st) qw_hparams_free(&hp);
    free(txt);
    return st;
}

/* Qwen3.8-Flash-Next's config.json (spec/qwen4_exp.md, FIELD.md) */
static const char flash_next[] =
    "{\"model_type\": \"qwen4_exp\", \"vocab_size\": 248320, \"hidden_size\": 2560, \"num_hidden_layers\": 48, "
    "\"num_attention_heads\": 24, \"num_key_value_heads\": 2, \"head_dim\": 256, \"max_position_embeddings\": "
    "262144, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, "
    "\"partial_rotary_factor\": 0.25}, \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, "
    "\"linear_value_head_dim\": 128, \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 48, "
    "\"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 640, "
    "\"shared_expert_intermediate_size\": 640, \"eos_token_id\": 248044, \"full_attention_interval\": 4, "
    "\"hc_count\": 4, \"hc_lowrank\": 320, \"ple_layer_ids\": [2], \"ngram_size\": 3, \"heads_per_ngram\": 8, "
    "\"ngram_vocab_size_base\": 20000000, \"make_ngram_vocab_size_divisible_by\": 128, \"ple_embed_dim\": 2560, "
    "\"indexer_n_heads\": 4, \"indexer_kv_heads\": 1, \"indexer_head_dim\": 128, \"indexer_budget\": 2048, "
    "\"indexer_compress_ratio\": 4, \"output_gate_type\": \"sigmoid\"}";

/* The fixture whose model_type reads the field. */
static const char *fixture_of(qw_hp_field f, const char **obj) {
    *obj = NULL;
    switch (f) {
    case QW_HP_SPARSE_STEP: return "qwen3_next";
    case QW_HP_ROPE_ORIG_CTX: *obj = "rope_parameters"; return "llama";
    default: return "qwen4_exp";
    }
}

static void test_config_bounds(void) {
    int n_fields = 0;
    for (int f = 0; f < QW_HP_COUNT; f++) {
        const qw_hp_limit *lim = qw_hp_limit_of((qw_hp_field)f);
        if (!lim->config) continue;
        n_fields++;
        const char *obj;
        cJSON *cfg = fixture_config(fixture_of((qw_hp_field)f, &obj));
        if (!cfg) return;
        if (obj) CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cfg, obj)), "%s: no %s", lim->config, obj);
        double vals[5] = {(double)lim->lo - 1, (double)lim->hi + 1, 2147483647.0, -2147483648.0, 1e300};
        for (int i = 0; i < 5; i++) {
            double v = vals[i];
            if (v >= (double)lim->lo && v <= (double)lim->hi) continue; /* inside a bound reaching 2^31 - 1 */
            char err[1024], want_name[96], want_range[96], want_val[48];
            qwenc_status st = parse_with(cfg, obj, lim->config, v, err, sizeof(err));
            snprintf(want_name, sizeof(want_name), "dir/config.json: \"%s\" is ", lim->config);
            snprintf(want_range, sizeof(want_range), "expected %lld..%lld", (long long)lim->lo, (long long)lim->hi);
            if (v == 1e300)
                snprintf(want_val, sizeof(want_val), "is 1e+300,");
            else
                snprintf(want_val, sizeof(want_val), "is %.0f,", v);
            CHECK(st == QWENC_ERR_FORMAT && contains(err, want_name) && contains(err, want_range) &&
                      contains(err, want_val),
                  "%s = %g: status %d, message '%s'", lim->config, v, st, err);
        }
        cJSON_Delete(cfg);
    }
    CHECK(n_fields >= 30, "only %d fields with a config.json name", n_fields);

    /* the found-by-hand inputs, with their exact messages, and bounds that depend on other fields */
    struct {
        const char *fixture, *field;
        double v;
        const char *want;
    } cases[] = {
        {"llama", "num_hidden_layers", 1e9, "\"num_hidden_layers\" is 1000000000, expected 1..1024"},
        {"qwen4_exp", "heads_per_ngram", 2147483647, "\"heads_per_ngram\" is 2147483647, expected 1..64"},
        {"qwen4_exp", "indexer_n_heads", 2147483647, "\"indexer_n_heads\" is 2147483647, expected 1..1024"},
        {"llama", "max_position_embeddings", 0, "\"max_position_embeddings\" is 0, expected 1..1073741824"},
        {"llama", "max_position_embeddings", -1, "\"max_position_embeddings\" is -1, expected 1..1073741824"},
        {"qwen4_exp", "num_experts_per_tok", 9, "\"num_experts_per_tok\" is 9, expected 1..8 (1..num_experts)"},
        {"llama", "head_dim", 0.5, "field \"head_dim\": expected an integer"},
        {"llama", "rms_norm_eps", -1, "field \"rms_norm_eps\": is -1, expected a number in [0, 1]"},
        {"llama", "rope_theta", 0, "field \"rope_theta\": is 0, expected a number in (0, "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *cfg = fixture_config(cases[i].fixture);
        if (!cfg) return;
        char err[1024];
        qwenc_status st = parse_with(cfg, NULL, cases[i].field, cases[i].v, err, sizeof(err));
        CHECK(st == QWENC_ERR_FORMAT && contains(err, cases[i].want), "%s = %g: status %d, '%s'", cases[i].field,
              cases[i].v, st, err);
        cJSON_Delete(cfg);
    }
    /* a default that is out of range is named as such: head_dim = hidden_size / num_attention_heads */
    cJSON *cfg = fixture_config("llama");
    if (cfg) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "head_dim");
        char err[1024];
        qwenc_status st = parse_with(cfg, NULL, "hidden_size", 65536, err, sizeof(err));
        CHECK(st == QWENC_ERR_FORMAT && contains(err, "\"head_dim\" is 16384, expected 1..512 (its default)"),
              "default head_dim: %d '%s'", st, err);
        cJSON_Delete(cfg);
    }
    /* a PLE layer id past the layers */
    cfg = fixture_config("qwen4_exp");
    if (cfg) {
        cJSON_ReplaceItemInObjectCaseSensitive(cfg, "ple_layer_ids", cJSON_Parse("[2, 4294967297]"));
        char *txt = cJSON_PrintUnformatted(cfg), err[1024];
        qw_hparams hp;
        qwenc_status st = qw_hparams_parse(&hp, txt, "c.json", err, sizeof(err));
        CHECK(st == QWENC_ERR_FORMAT && contains(err, "\"ple_layer_ids\" entry 1 is 4294967297, expected 1..4"),
              "ple_layer_ids: %d '%s'", st, err);
        free(txt);
        cJSON_Delete(cfg);
    }
    /* Flash-Next with a PLE table on every DeltaNet layer (36) of 2 x 64 heads: 36 * 37 / 2 * 128 primes to
     * find, each field within its bounds */
    cfg = cJSON_Parse(flash_next);
    if (cfg) {
        cJSON *ids = cJSON_CreateArray();
        for (int l = 1; l <= 48; l++)
            if (l % 4) cJSON_AddItemToArray(ids, cJSON_CreateNumber(l));
        cJSON_ReplaceItemInObjectCaseSensitive(cfg, "ple_layer_ids", ids);
        char err[1024];
        qwenc_status st = parse_with(cfg, NULL, "heads_per_ngram", 64, err, sizeof(err));
        CHECK(st == QWENC_ERR_FORMAT && contains(err, "36 PLE layers") && contains(err, "need 85248 primes"),
              "PLE tables: %d '%s'", st, err);
        cJSON_Delete(cfg);
    }
}

/* The released geometries the bounds must admit (FIELD.md, spec/qwen35_family.md, the models' configs). */
static void test_real_configs(void) {
    static const struct {
        const char *name, *json;
        int n_layer, n_vocab;
    } cfgs[] = {
        {"Qwen3.8-Flash-Next",
         flash_next,
         48, 248320},
        {"Qwen3.5-397B-A17B",
         "{\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 248320, \"hidden_size\": 4096, \"num_hidden_layers\": "
         "60, \"num_attention_heads\": 32, \"num_key_value_heads\": 2, \"head_dim\": 256, \"max_position_embeddings\": "
         "262144, \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, \"linear_num_key_heads\": 16, "
         "\"linear_num_value_heads\": 64, \"num_experts\": 512, \"num_experts_per_tok\": 10, "
         "\"moe_intermediate_size\": 1024, \"shared_expert_intermediate_size\": 1024, \"eos_token_id\": 248044}",
         60, 248320},
        {"Qwen3-Next-80B-A3B",
         "{\"model_type\": \"qwen3_next\", \"vocab_size\": 151936, \"hidden_size\": 2048, \"num_hidden_layers\": 48, "
         "\"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256, \"max_position_embeddings\": "
         "262144, \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, \"intermediate_size\": 5120, "
         "\"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, \"num_experts\": 512, "
         "\"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512, "
         "\"decoder_sparse_step\": 1, \"mlp_only_layers\": []}",
         48, 151936},
        {"Llama-3.1-405B",
         "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 16384, \"num_hidden_layers\": 126, "
         "\"num_attention_heads\": 128, \"num_key_value_heads\": 8, \"intermediate_size\": 53248, "
         "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000, \"rope_scaling\": "
         "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 8192}, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, "
         "128009]}",
         126, 128256},
        {"Qwen3-32B",
         "{\"model_type\": \"qwen3\", \"vocab_size\": 151936, \"hidden_size\": 5120, \"num_hidden_layers\": 64, "
         "\"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"head_dim\": 128, \"intermediate_size\": 25600, "
         "\"max_position_embeddings\": 40960, \"rope_theta\": 1000000}",
         64, 151936},
        {"a 10M-token context (Llama 4 Scout's)",
         "{\"model_type\": \"llama\", \"vocab_size\": 202048, \"hidden_size\": 5120, \"num_hidden_layers\": 48, "
         "\"num_attention_heads\": 40, \"num_key_value_heads\": 8, \"head_dim\": 128, \"intermediate_size\": 16384, "
         "\"max_position_embeddings\": 10485760}",
         48, 202048},
    };
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        qw_hparams hp;
        char err[1024] = "";
        qwenc_status st = qw_hparams_parse(&hp, cfgs[i].json, cfgs[i].name, err, sizeof(err));
        CHECK(st == QWENC_OK, "%s refused: %s", cfgs[i].name, err);
        if (st) continue;
        CHECK(hp.n_layer == cfgs[i].n_layer && hp.n_vocab == cfgs[i].n_vocab, "%s: %d layers, vocab %d", cfgs[i].name,
              hp.n_layer, hp.n_vocab);
        if (hp.arch == QW_ARCH_QWEN4EXP)
            CHECK(hp.n_ple == 1 && hp.ngram_heads == 16 && hp.ple_dim / hp.ngram_heads == 160,
                  "Flash-Next PLE: %d layers, %d heads, %d dims", hp.n_ple, hp.ngram_heads, hp.ple_dim);
        qw_hparams_free(&hp);
    }
}

/* The PLE primes at the top of the bound on ngram_vocab_size_base: the (li * nh + h + 1)-th prime >= base, by
 * trial division here (the code under test uses Miller-Rabin). */
static int trial_prime(int64_t n) {
    if (n < 2) return 0;
    for (int64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return 0;
    return 1;
}

static void test_ple_primes(void) {
    qw_hparams hp;
    memset(&hp, 0, sizeof(hp));
    hp.n_vocab = 248320;
    hp.ngram_n = 3;
    hp.ngram_heads = 16;
    hp.ngram_base = qw_hp_limit_of(QW_HP_NGRAM_BASE)->hi - 300;
    hp.ngram_div = 128;
    uint64_t mult[8];
    int64_t prime[16], offset[16], n_rows;
    int li = 2;
    qw_ple_constants(&hp, li, mult, prime, offset, &n_rows);
    int64_t p = hp.ngram_base - 1;
    for (int k = 0; k < li * 16; k++)
        for (p++; !trial_prime(p); p++) {
        }
    int bad = 0;
    for (int h = 0; h < 16; h++) {
        for (p++; !trial_prime(p); p++) {
        }
        bad += prime[h] != p;
    }
    CHECK(bad == 0, "%d of 16 PLE primes above %lld differ from trial division", bad, (long long)hp.ngram_base);
}

/* ---------------------------------------------------------------- 2. GGUF metadata bounds */

/* Copy the GGUF in to out with key set to a value of type (u32, i32, u64, f32; u32s: an array of v entries). */
static qwenc_status gguf_set(const char *in, const char *out, const char *key, const char *type, double v, char *err,
                             size_t errlen) {
    qw_gguf g;
    qwenc_status st = qw_gguf_open(&g, in, err, errlen);
    if (st) return st;
    qw_gguf_writer *w = NULL;
    st = qw_gguf_writer_open(&w, out, err, errlen);
    if (st) {
        qw_gguf_free(&g);
        return st;
    }
    for (int64_t i = 0; i < g.n_kv; i++)
        if (strcmp(g.kv[i].key, key) && strcmp(g.kv[i].key, "general.alignment")) qw_gguf_writer_set_kv(w, &g.kv[i]);
    if (!strcmp(type, "u32")) qw_gguf_writer_set_u32(w, key, (uint32_t)v);
    else if (!strcmp(type, "i32")) qw_gguf_writer_set_i32(w, key, (int32_t)v);
    else if (!strcmp(type, "u64")) qw_gguf_writer_set_u64(w, key, v >= 1.8e19 ? UINT64_MAX : (uint64_t)v);
    else if (!strcmp(type, "f32")) qw_gguf_writer_set_f32(w, key, (float)v);
    else if (!strcmp(type, "u32s")) {
        uint32_t *a = calloc((size_t)v, sizeof(uint32_t));
        for (size_t j = 0; j < (size_t)v; j++) a[j] = (uint32_t)j;
        qw_gguf_writer_set_arr(w, key, QW_GGUF_U32, a, (uint64_t)v);
        free(a);
    }
    for (int64_t i = 0; i < g.n_tensors && !st; i++) {
        const qw_gguf_tensor *t = &g.tensors[i];
        st = qw_gguf_writer_add_tensor(w, t->name, t->t.type, t->n_dims, t->t.shape, err, errlen);
    }
    for (int64_t i = 0; i < g.n_tensors && !st; i++)
        st = qw_gguf_writer_write(w, g.tensors[i].t.data, (size_t)g.tensors[i].nbytes, err, errlen);
    if (st)
        qw_gguf_writer_abort(w);
    else
        st = qw_gguf_writer_close(w, err, errlen);
    qw_gguf_free(&g);
    return st;
}

static void test_gguf_bounds(const char *base) {
    struct {
        const char *key, *type;
        double v;
        const char *want;
    } cases[] = {
        /* found by hand: a signed overflow, then "array of at least 18446744073709551614 integers" */
        {"qwen4exp.ple.heads_per_ngram", "u32", 2147483647,
         "metadata key 'qwen4exp.ple.heads_per_ngram' is 2147483647, expected 1..64"},
        {"qwen4exp.block_count", "u32", 1e9, "metadata key 'qwen4exp.block_count' is 1000000000, expected 1..1024"},
        {"qwen4exp.block_count", "u64", 2e19, "metadata key 'qwen4exp.block_count' is 1.84467440737096e+19, expected"},
        {"qwen4exp.nextn_predict_layers", "u32", 4, "'qwen4exp.nextn_predict_layers' is 4, expected 0..3"},
        {"qwen4exp.context_length", "u32", 0, "metadata key 'qwen4exp.context_length' is 0, expected 1..1073741824"},
        {"qwen4exp.context_length", "i32", -1, "metadata key 'qwen4exp.context_length' is -1, expected 1.."},
        {"qwen4exp.embedding_length", "i32", 2147483647, "'qwen4exp.embedding_length' is 2147483647, expected 1..65536"},
        {"qwen4exp.attention.head_count", "u32", 0, "'qwen4exp.attention.head_count' is 0, expected 1..1024"},
        {"qwen4exp.attention.key_length", "u32", 4096, "'qwen4exp.attention.key_length' is 4096, expected 1..512"},
        {"qwen4exp.ssm.conv_kernel", "u32", 4000000000.0, "'qwen4exp.ssm.conv_kernel' is 4000000000, expected 1..64"},
        {"qwen4exp.ssm.inner_size", "u32", 6 * 2048, "'qwen4exp.ssm.inner_size' is 12288, expected 6..6144"},
        {"qwen4exp.expert_count", "u32", 100000, "'qwen4exp.expert_count' is 100000, expected 1..4096"},
        {"qwen4exp.expert_used_count", "u32", 9, "'qwen4exp.expert_used_count' is 9, expected 1..8"},
        {"qwen4exp.hyper_connection.count", "u32", 1, "'qwen4exp.hyper_connection.count' is 1, expected 2..64"},
        {"qwen4exp.attention.indexer.head_count", "u32", 2147483647,
         "'qwen4exp.attention.indexer.head_count' is 2147483647, expected 1..1024"},
        {"qwen4exp.attention.indexer.top_k", "u32", 0, "'qwen4exp.attention.indexer.top_k' is 0, expected 1.."},
        {"qwen4exp.ple.ngram_size", "u32", 9, "'qwen4exp.ple.ngram_size' is 9, expected 2..8"},
        {"qwen4exp.ple.conv_kernel", "u32", 0, "'qwen4exp.ple.conv_kernel' is 0, expected 1..64"},
        {"qwen4exp.embedding_length_per_layer_input", "u32", 65536,
         "'qwen4exp.embedding_length_per_layer_input' is 65536, expected 1..16384"},
        {"qwen4exp.ple.eos_token_id", "u32", 256, "'qwen4exp.ple.eos_token_id' is 256, expected 0..255"},
        {"qwen4exp.ple.layers", "u32s", 100000, "the length of metadata key 'qwen4exp.ple.layers' is 100000, expected 1..4"},
        {"qwen4exp.rope.freq_base", "f32", -1, "'qwen4exp.rope.freq_base' is -1, expected a number in (0, "},
        {"tokenizer.ggml.eos_token_id", "u64", 1e12, "'tokenizer.ggml.eos_token_id' is 1000000000000, expected -1.."},
    };
    char out[600];
    tmp_path(out, sizeof(out), "bad.gguf");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[1024] = "";
        qwenc_status st = gguf_set(base, out, cases[i].key, cases[i].type, cases[i].v, err, sizeof(err));
        CHECK(st == QWENC_OK, "writing %s: %s", cases[i].key, err);
        if (st) continue;
        qwenc_model *m = NULL;
        err[0] = 0;
        st = qwenc_model_load(out, &m, err, sizeof(err));
        CHECK(st == QWENC_ERR_FORMAT && contains(err, out) && contains(err, cases[i].want),
              "%s = %g: status %d, '%s'", cases[i].key, cases[i].v, st, err);
        qwenc_model_free(m);
    }
    unlink(out);
}

/* ---------------------------------------------------------------- 3. files */

static void test_files(void) {
    char dir[600], p[700], err[1024];
    char *buf = NULL;
    size_t len = 0;
    /* a FIFO: refused at once (open() without O_NONBLOCK would wait for a writer forever) */
    tmp_path(p, sizeof(p), "fifo");
    CHECK(mkfifo(p, 0600) == 0, "mkfifo: %s", strerror(errno));
    qwenc_status st = qw_read_file(p, &buf, &len, err, sizeof(err));
    CHECK(st == QWENC_ERR_IO && contains(err, p) && contains(err, "not a regular file (a FIFO)"), "FIFO: %d '%s'", st,
          err);
    qw_mapfile mf;
    st = qw_mapfile_open(&mf, p, err, sizeof(err));
    CHECK(st == QWENC_ERR_IO && contains(err, "(a FIFO)"), "FIFO mapped: %d '%s'", st, err);
    unlink(p);
    st = qw_read_file("/dev/zero", &buf, &len, err, sizeof(err));
    CHECK(st == QWENC_ERR_IO && contains(err, "/dev/zero: not a regular file (a character device)"), "/dev/zero: '%s'",
          err);
    st = qw_read_file(tmpdir, &buf, &len, err, sizeof(err));
    CHECK(st == QWENC_ERR_IO && contains(err, "(a directory)"), "directory: '%s'", err);

    /* the size limit: a file of max bytes is read whole, one of max + 1 refused with the file and the limit */
    tmp_path(p, sizeof(p), "big");
    FILE *f = fopen(p, "wb");
    for (int i = 0; i < 1000; i++) fputc('a' + i % 26, f);
    fclose(f);
    st = qw_read_file_max(p, 1000, &buf, &len, err, sizeof(err));
    CHECK(st == QWENC_OK && len == 1000 && buf[999] == 'a' + 999 % 26 && buf[1000] == 0, "1000 bytes: %d", st);
    free(buf);
    buf = NULL;
    st = qw_read_file_max(p, 999, &buf, &len, err, sizeof(err));
    CHECK(st == QWENC_ERR_FORMAT && contains(err, p) && contains(err, "1000 bytes") && contains(err, "999 bytes") &&
              !buf,
          "over the limit: %d '%s'", st, err);
    unlink(p);

    /* in a model directory: config.json a link to /dev/zero or a FIFO, model.safetensors a FIFO */
    static const struct {
        const char *file, *kind;
    } cases[] = {{"config.json", "character device"}, {"config.json", "FIFO"}, {"model.safetensors", "FIFO"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tmp_path(dir, sizeof(dir), "model");
        mkdir(dir, 0700);
        static const char *files[] = {"config.json", "model.safetensors"};
        for (int k = 0; k < 2; k++) {
            char src[512], cwd[400];
            snprintf(p, sizeof(p), "%s/%s", dir, files[k]);
            if (!getcwd(cwd, sizeof(cwd))) cwd[0] = 0;
            snprintf(src, sizeof(src), "%s/%s/llama/%s", cwd, FIX, files[k]);
            if (!strcmp(files[k], cases[i].file))
                CHECK(!strcmp(cases[i].kind, "FIFO") ? mkfifo(p, 0600) == 0 : symlink("/dev/zero", p) == 0, "%s", p);
            else
                CHECK(symlink(src, p) == 0, "symlink %s", src);
        }
        qwenc_model *m = NULL;
        snprintf(p, sizeof(p), "%s/%s: not a regular file (a %s)", dir, cases[i].file, cases[i].kind);
        st = qwenc_model_load(dir, &m, err, sizeof(err));
        CHECK(st == QWENC_ERR_IO && contains(err, p), "%s as a %s: %d '%s'", cases[i].file, cases[i].kind, st, err);
        qwenc_model_free(m);
        for (int k = 0; k < 2; k++) {
            snprintf(p, sizeof(p), "%s/%s", dir, files[k]);
            unlink(p);
        }
        rmdir(dir);
    }
    /* tokenizer.json a FIFO */
    tmp_path(dir, sizeof(dir), "tok");
    mkdir(dir, 0700);
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    CHECK(mkfifo(p, 0600) == 0, "mkfifo %s", p);
    qwenc_tokenizer *tok = NULL;
    st = qwenc_tokenizer_load(dir, &tok, err, sizeof(err));
    CHECK(st != QWENC_OK && contains(err, "tokenizer.json: not a regular file (a FIFO)"), "tokenizer.json FIFO: %d '%s'",
          st, err);
    qwenc_tokenizer_free(tok);
    unlink(p);
    rmdir(dir);
}

/* ---------------------------------------------------------------- 4. out of memory */

/* Run fn with the k-th checked allocation failing, for k = 0, 1, ... until a run makes fewer than k + 1: each
 * run must succeed exactly when the failure did not happen (or, with may_recover, also when it did: a fallback)
 * and otherwise fail with QWENC_ERR_NOMEM and a message saying so. Returns the number of allocations. */
static int fail_each(const char *what, qwenc_status (*fn)(void *, char *, size_t), void *arg, int may_recover) {
    int bad = 0;
    for (long k = 0; k < 100000; k++) {
        char err[1024] = "";
        qw_alloc_fail_at(k);
        qwenc_status st = fn(arg, err, sizeof(err));
        int fired = qw_alloc_fail_fired();
        qw_alloc_fail_at(-1);
        if (!fired) {
            CHECK(st == QWENC_OK, "%s without a failure: %d %s", what, st, err);
            CHECK(bad == 0, "%s: %d of its %ld allocations failing went wrong", what, bad, k);
            printf("%s: each of %ld checked allocations failing: a clean error\n", what, k);
            return (int)k;
        }
        int ok = (st == QWENC_ERR_NOMEM && contains(err, "out of memory")) || (may_recover && st == QWENC_OK);
        if (!ok && bad++ < 3) printf("FAIL %s, allocation %ld failing: status %d '%s'\n", what, k, st, err);
    }
    CHECK(0, "%s: no end to its allocations", what);
    return -1;
}

static qwenc_status do_load(void *arg, char *err, size_t errlen) {
    const qwenc_model_params *mp = ((void **)arg)[1];
    qwenc_model *m = NULL;
    qwenc_status st = qwenc_model_load_params(((void **)arg)[0], mp, &m, err, errlen);
    qwenc_model_free(m);
    return st;
}

typedef struct {
    const qwenc_model *m;
    const int32_t *ids;
    int n;
    const float *want; /* the logits of the last token, from a run without failures */
    int head;          /* the session keeps the MTP draft head: then head steps and a draft step too */
} run_arg;

/* A session: init, a prompt in two steps, two decode steps; then the logits of the last one checked. */
static qwenc_status session_run(void *arg, char *err, size_t errlen) {
    const run_arg *a = arg;
    qwenc_session_params sp = {.n_ctx = 32, .n_batch = 4, .draft_head = a->head};
    qwenc_session *s = NULL;
    qwenc_status st = qwenc_session_init(a->m, &sp, &s, err, errlen);
    if (st) return st;
    int V = qwenc_model_n_vocab(a->m);
    float *lg = malloc((size_t)V * sizeof(float));
    st = qwenc_session_forward(s, a->ids, a->n - 2, lg, 0, err, errlen);
    for (int i = a->n - 2; !st && i < a->n; i++) st = qwenc_session_forward(s, a->ids + i, 1, lg, 0, err, errlen);
    if (st == QWENC_ERR_NOMEM && s->lost) {
        /* the state is lost: refused until a reset, then as new */
        char e2[512];
        CHECK(qwenc_session_forward(s, a->ids, 1, lg, 0, e2, sizeof(e2)) == QWENC_ERR_ARG && contains(e2, "reset"),
              "a lost session went on: %s", e2);
        qwenc_session_reset(s); /* (the armed failure has happened: nothing else fails) */
        CHECK(qwenc_session_forward(s, a->ids, a->n, lg, 0, e2, sizeof(e2)) == QWENC_OK, "after the reset: %s", e2);
    }
    if (!st && a->want) {
        test_cmp c = test_compare_logits(lg, a->want, 1, (size_t)V);
        if (c.rel_l2 > 1e-5) st = qw_err(err, errlen, QWENC_ERR_FORMAT, "logits differ by %g", c.rel_l2);
    }
    if (!st && a->head) { /* two head steps, a draft step of three tokens keeping one */
        int32_t d[3] = {a->ids[0], 0, 0};
        st = qwenc_session_draft_head(s, d[0], NULL, &d[1], err, errlen);
        if (!st) st = qwenc_session_draft_head(s, d[1], lg, &d[2], err, errlen);
        float *l3 = st ? NULL : malloc((size_t)3 * V * sizeof(float));
        if (!st) st = qwenc_session_forward_draft(s, d, 3, l3, err, errlen);
        if (!st) st = qwenc_session_accept(s, 1, err, errlen);
        free(l3);
    }
    free(lg);
    qwenc_session_free(s);
    return st;
}

typedef struct {
    void *arg;
    char *err;
    size_t errlen;
    qwenc_status st;
} thread_run;

static void *session_thread(void *p) {
    thread_run *t = p;
    t->st = session_run(t->arg, t->err, t->errlen);
    return NULL;
}

/* session_run on a new thread each time: the kernels' per-thread scratch starts empty, so its allocations are
 * among those made to fail */
static qwenc_status do_session(void *arg, char *err, size_t errlen) {
    thread_run t = {arg, err, errlen, QWENC_OK};
    pthread_t th;
    if (pthread_create(&th, NULL, session_thread, &t)) return qw_err(err, errlen, QWENC_ERR_ARG, "no thread");
    pthread_join(th, NULL);
    return t.st;
}

static qwenc_status do_sampler(void *arg, char *err, size_t errlen) {
    qwenc_sampler_params p = qwenc_sampler_default_params();
    qwenc_sampler *s = NULL;
    qwenc_status st = qwenc_sampler_init(&p, *(int *)arg, &s, err, errlen);
    qwenc_sampler_free(s);
    return st;
}

static qwenc_status do_save(void *arg, char *err, size_t errlen) {
    char out[600];
    tmp_path(out, sizeof(out), "oom.gguf");
    qwenc_gguf_params gp = qwenc_gguf_default_params();
    gp.type = "Q8_0";
    gp.n_threads = 1;
    qwenc_status st = qwenc_model_save_gguf(arg, out, &gp, err, errlen);
    struct stat sb;
    if (st && stat(out, &sb) == 0) st = qw_err(err, errlen, QWENC_ERR_FORMAT, "a failed save left %s", out);
    unlink(out);
    return st;
}

static void test_out_of_memory(const char *gguf) {
    qwenc_model_params mp = qwenc_model_default_params();
    mp.n_threads = 1;
    static const char *dirs[] = {FIX "/llama", FIX "/qwen3_next", FIX "/qwen4_exp", FIX "/mtp/qwen3_5_moe"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        void *a[2] = {(void *)dirs[i], &mp};
        int n = fail_each(dirs[i], do_load, a, 0);
        CHECK(n > 10, "%s: only %d checked allocations", dirs[i], n);
    }
    void *a[2] = {(void *)gguf, &mp};
    fail_each("qwen4_exp GGUF", do_load, a, 0);
    qwenc_model_params q = mp;
    q.quant = "Q4_K";
    a[0] = FIX "/qwen4_exp";
    a[1] = &q;
    fail_each("qwen4_exp quantized at load", do_load, a, 0);

    /* sessions, also of models quantized at load: their matmuls take the kernels' integer scratch */
    static const struct {
        const char *dir, *quant;
        int head;
    } runs[] = {{FIX "/llama", NULL, 0},     {FIX "/qwen3_next", NULL, 0}, {FIX "/qwen4_exp", NULL, 0},
                {FIX "/llama", "Q8_0", 0},   {FIX "/qwen4_exp", "Q4_K", 0}, {FIX "/mtp/qwen4_exp", NULL, 1}};
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        qwenc_model *m = NULL;
        char err[1024], what[160];
        qwenc_model_params p = mp;
        p.quant = runs[i].quant;
        snprintf(what, sizeof(what), "a session of %s%s%s%s", runs[i].dir, p.quant ? " as " : "", p.quant ? p.quant : "",
                 runs[i].head ? " with the draft head" : "");
        if (qwenc_model_load_params(runs[i].dir, &p, &m, err, sizeof(err))) {
            CHECK(0, "%s: %s", runs[i].dir, err);
            continue;
        }
        int32_t ids[10] = {1, 5, 9, 33, 2, 7, 100, 3, 12, 64};
        run_arg r = {m, ids, 10, NULL, runs[i].head};
        int V = qwenc_model_n_vocab(m);
        float *want = malloc((size_t)V * sizeof(float));
        qwenc_session_params sp = {.n_ctx = 32, .n_batch = 4, .draft_head = runs[i].head};
        qwenc_session *s = NULL;
        if (!qwenc_session_init(m, &sp, &s, err, sizeof(err)) &&
            !qwenc_session_forward(s, ids, 10, want, 0, err, sizeof(err)))
            r.want = want;
        qwenc_session_free(s);
        CHECK(r.want != NULL, "%s: %s", what, err);
        /* the delta rule's chunked prefill falls back to the token-by-token form without its scratch */
        fail_each(what, do_session, &r, 1);
        if (i == 0) fail_each("a sampler", do_sampler, &V, 0);
        if (i == 2) fail_each("saving a GGUF", do_save, m, 0);
        free(want);
        qwenc_model_free(m);
    }
}

/* A session far larger than the process may have (RLIMIT_AS, in a child): QWENC_ERR_NOMEM, not an abort. Not
 * under AddressSanitizer, whose own reservations an address-space limit breaks (the checked allocations'
 * failure paths are tested above by injection). */
static void test_rlimit(void) {
#if defined(__SANITIZE_ADDRESS__)
    printf("skip the RLIMIT_AS test under AddressSanitizer\n");
#else
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        qwenc_model *m = NULL;
        char err[1024];
        qwenc_model_params mp = qwenc_model_default_params();
        mp.n_threads = 1;
        if (qwenc_model_load_params(FIX "/llama", &mp, &m, err, sizeof(err))) _exit(2);
        struct rlimit rl = {(rlim_t)4 << 30, (rlim_t)4 << 30};
        if (setrlimit(RLIMIT_AS, &rl)) _exit(3);
        qwenc_session_params sp = {.n_ctx = 1 << 30, .n_batch = 512};
        qwenc_session *s = NULL;
        qwenc_status st = qwenc_session_init(m, &sp, &s, err, sizeof(err));
        _exit(st == QWENC_ERR_NOMEM && contains(err, "1073741824 tokens") ? 0 : 4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "session under RLIMIT_AS: %s %d",
          WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
#endif
}

/* ---------------------------------------------------------------- 5. scratch */

static void test_scratch(void) {
    char *names[32];
    int n = test_list_fixtures(FIX, 0, names, 32);
    CHECK(n >= 7, "fixtures: %d", n);
    for (int i = 0; i < n; i++) {
        char dir[300], err[1024];
        snprintf(dir, sizeof(dir), "%s/%s", FIX, names[i]);
        qwenc_model_params mp = qwenc_model_default_params();
        mp.n_threads = 1;
        qwenc_model *m = NULL;
        if (qwenc_model_load_params(dir, &mp, &m, err, sizeof(err))) {
            CHECK(0, "%s: %s", dir, err);
            free(names[i]);
            continue;
        }
        qwenc_session_params sp = {.n_ctx = 96, .n_batch = 24};
        qwenc_session *s = NULL;
        if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) {
            CHECK(0, "%s: %s", dir, err);
            qwenc_model_free(m);
            free(names[i]);
            continue;
        }
        int V = qwenc_model_n_vocab(m), grew = 0, allocated = 0;
        float *lg = malloc((size_t)24 * V * sizeof(float));
        int32_t ids[96];
        for (int t = 0; t < 96; t++) ids[t] = (t * 37 + 11) % V;
        /* a prompt in steps of every size, then decoding: no step goes past the session's measured plan (past
         * its end the arena asserts), and every decode step takes the same scratch (the same addresses) */
        int at = 0;
        for (int T = 1; at + T <= 60 && T <= 24; at += T, T += 5) {
            if (qwenc_session_forward(s, ids + at, T, lg, 1, err, sizeof(err))) break;
            grew |= s->arena.high_water > s->arena.size;
        }
        CHECK(!grew, "%s: a prompt step went past the scratch plan", names[i]);
        size_t decode_used = 0;
        for (; !grew && at < 76; at++) {
            if (qwenc_session_forward(s, ids + at, 1, lg, 0, err, sizeof(err))) break;
            if (!decode_used) decode_used = s->arena.used;
            grew |= s->arena.high_water > s->arena.size || s->arena.used != decode_used;
        }
        CHECK(!grew, "%s: a decode step went past the plan or took other scratch", names[i]);
        /* nor any other: with every checked allocation failing from here on (a growth past the bound would
         * abort: checked above first) */
        unsigned long scratch_failed = qw_cpu_scratch_failures();
        qw_alloc_fail_at(0);
        for (; !grew && at < 96; at++)
            if (qwenc_session_forward(s, ids + at, 1, lg, 0, err, sizeof(err))) break;
        allocated = qw_alloc_fail_fired();
        qw_alloc_fail_at(-1);
        CHECK(grew || at == 96, "%s: decoding stopped at %d: %s", names[i], at, err);
        CHECK(!allocated && qw_cpu_scratch_failures() == scratch_failed, "%s: decoding allocated", names[i]);
        free(lg);
        qwenc_session_free(s);
        qwenc_model_free(m);
        free(names[i]);
    }
}

/* ---------------------------------------------------------------- main */

static int gguf_set_main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: t_hostile --gguf-set IN OUT KEY TYPE VALUE\n");
        return 2;
    }
    char err[1024];
    if (gguf_set(argv[2], argv[3], argv[4], argv[5], strtod(argv[6], NULL), err, sizeof(err))) {
        fprintf(stderr, "t_hostile: %s\n", err);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--gguf-set")) return gguf_set_main(argc, argv);
    /* a FIFO opened without O_NONBLOCK would hang the test: end it instead (no summary line: a failure) */
    alarm(600);
    if (!test_make_tmpdir(tmpdir, sizeof(tmpdir), "qwenc-hostile")) return 1;
    test_config_bounds();
    test_real_configs();
    test_ple_primes();
    test_files();
    test_scratch();

    char base[600], err[1024];
    tmp_path(base, sizeof(base), "qwen4_exp.gguf");
    qwenc_model *m = NULL;
    qwenc_gguf_params gp = qwenc_gguf_default_params();
    gp.type = "F32";
    qwenc_status st = qwenc_model_load(FIX "/qwen4_exp", &m, err, sizeof(err));
    if (!st) st = qwenc_model_save_gguf(m, base, &gp, err, sizeof(err));
    qwenc_model_free(m);
    CHECK(st == QWENC_OK, "qwen4_exp GGUF: %s", err);
    if (!st) {
        test_gguf_bounds(base);
        test_out_of_memory(base);
    }
    unlink(base);
    test_rlimit();
    rmdir(tmpdir);
    return test_summary();
}
