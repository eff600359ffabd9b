/*
 * t_arch.c - the architecture registry (models/arch.h) and what config.json reading takes from it.
 *
 * 1. Every entry is whole and consistent: it sits at its enum value, its names map back to it (model_types
 *    through qw_arch_from_model_type, the GGUF name through qw_arch_from_gguf) and no name belongs to two
 *    architectures; it has a tensors function and a forward; its properties agree (exactly one FFN kind;
 *    the DeltaNet layouts, QSA, hyper-connections and PLE only on DeltaNet architectures).
 * 2. The messages for an unknown model_type and an unknown GGUF architecture list every name of the registry.
 * 3. Every fixture's config.json reads as the architecture its model_type names; attention_bias, mlp_bias and
 *    use_sliding_window set are refused for every architecture (none qwenc runs has them), naming the file.
 */
#include <cjson/cJSON.h>

#include "models/arch.h"
#include "models/gguf_map.h"
#include "test_util.h"

static void test_registry(void) {
    printf("registry: every entry whole, its names its own\n");
    for (int a = 0; a < QW_ARCH_COUNT; a++) {
        const qw_arch_def *d = qw_arch_get((qw_arch)a);
        CHECK(d->arch == (qw_arch)a && d->name && d->gguf && d->tensors && d->forward, "entry %d incomplete", a);
        CHECK(d->model_types[0] && !strcmp(d->model_types[0], d->name), "%s: the first model_type is its name", d->name);
        CHECK(!strcmp(qw_arch_name((qw_arch)a), d->name) && !strcmp(qw_gguf_arch_name((qw_arch)a), d->gguf),
              "%s: qw_arch_name / qw_gguf_arch_name", d->name);
        for (int k = 0; k < 3 && d->model_types[k]; k++) {
            qw_arch got = QW_ARCH_COUNT;
            CHECK(qw_arch_from_model_type(d->model_types[k], &got) && got == (qw_arch)a, "model_type %s -> %d",
                  d->model_types[k], (int)got);
        }
        qw_arch got = QW_ARCH_COUNT;
        CHECK(qw_arch_from_gguf(d->gguf, &got) && got == (qw_arch)a, "GGUF %s -> %d", d->gguf, (int)got);
        unsigned f = d->flags;
        int ffn = !!(f & QW_AF_MLP) + !!(f & QW_AF_MOE) + !!(f & QW_AF_MOE_STEP);
        CHECK(ffn == 1, "%s: %d FFN kinds (one of MLP, MOE, MOE_STEP)", d->name, ffn);
        CHECK(!(f & QW_AF_TOPK_NORM) || (f & (QW_AF_MOE | QW_AF_MOE_STEP)), "%s: TOPK_NORM without experts", d->name);
        unsigned gdn_only = QW_AF_V_TILED | QW_AF_SSM_BA | QW_AF_QSA | QW_AF_PLE | QW_AF_GATE_ACT;
        CHECK(!(f & gdn_only) || (f & QW_AF_GDN), "%s: DeltaNet properties without DeltaNet layers", d->name);
        CHECK(!((f & QW_AF_V_TILED) && (f & QW_AF_SSM_BA)), "%s: value heads both tiled and grouped", d->name);
        CHECK(!(f & QW_AF_PLE) || (f & QW_AF_HC), "%s: PLE needs the hyper-connection streams", d->name);
        CHECK(!(f & QW_AF_ROPE_FREQS) || !(f & QW_AF_MROPE), "%s: rope_freqs and M-RoPE sections", d->name);
    }
    /* no name belongs to two architectures (qw_arch_from_* return the first) */
    for (int a = 0; a < QW_ARCH_COUNT; a++)
        for (int b = a + 1; b < QW_ARCH_COUNT; b++) {
            const qw_arch_def *x = qw_arch_get((qw_arch)a), *y = qw_arch_get((qw_arch)b);
            CHECK(strcmp(x->gguf, y->gguf) != 0, "GGUF name %s twice", x->gguf);
            for (int i = 0; i < 3 && x->model_types[i]; i++)
                for (int j = 0; j < 3 && y->model_types[j]; j++)
                    CHECK(strcmp(x->model_types[i], y->model_types[j]) != 0, "model_type %s twice", x->model_types[i]);
        }
    qw_arch got;
    CHECK(!qw_arch_from_model_type("qwen9", &got) && !qw_arch_from_gguf("gpt2", &got) &&
              !qw_arch_from_model_type("", &got),
          "unknown names are not found");
}

/* The message of parsing json names every registered model_type. */
static void test_messages(void) {
    printf("messages: the names known, from the registry\n");
    char err[1024];
    qw_hparams hp;
    qwenc_status st = qw_hparams_parse(&hp, "{\"model_type\": \"qwen9\"}", "c.json", err, sizeof(err));
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "c.json: field \"model_type\": unknown model_type \"qwen9\""),
          "unknown model_type: %d '%s'", st, err);
    for (int a = 0; a < QW_ARCH_COUNT; a++)
        for (int k = 0; k < 3 && qw_arch_get((qw_arch)a)->model_types[k]; k++)
            CHECK(strstr(err, qw_arch_get((qw_arch)a)->model_types[k]) != NULL, "'%s' does not list %s", err,
                  qw_arch_get((qw_arch)a)->model_types[k]);

    char dir[512], path[700];
    if (!test_make_tmpdir(dir, sizeof(dir), "t_arch")) return;
    snprintf(path, sizeof(path), "%s/gpt2.gguf", dir);
    qw_gguf_writer *w = NULL;
    if (qw_gguf_writer_open(&w, path, err, sizeof(err)) == QWENC_OK) {
        qw_gguf_writer_set_str(w, "general.architecture", "gpt2");
        if (qw_gguf_writer_close(w, err, sizeof(err)) == QWENC_OK) {
            qwenc_model *m = NULL;
            st = qwenc_model_load(path, &m, err, sizeof(err));
            CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "general.architecture \"gpt2\" is not one qwenc runs"),
                  "unknown GGUF architecture: %d '%s'", st, err);
            for (int a = 0; a < QW_ARCH_COUNT; a++)
                CHECK(strstr(err, qw_arch_get((qw_arch)a)->gguf) != NULL, "'%s' does not list %s", err,
                      qw_arch_get((qw_arch)a)->gguf);
            qwenc_model_free(m);
        }
    }
    unlink(path);
    rmdir(dir);
}

static cJSON *read_config(const char *root, const char *fixture) {
    char path[700];
    snprintf(path, sizeof(path), "%s/%s/config.json", root, fixture);
    uint8_t *txt = test_read_all(path, NULL);
    cJSON *j = txt ? cJSON_Parse((const char *)txt) : NULL;
    free(txt);
    CHECK(j != NULL, "%s: cannot read", path);
    return j;
}

/* Parse cfg (with field set to true when field is not NULL) as dir/config.json. */
static qwenc_status parse(cJSON *cfg, const char *field, qw_hparams *hp, char *err, size_t errlen) {
    if (field) {
        cJSON *dst = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
        if (!cJSON_IsObject(dst)) dst = cfg;
        cJSON_DeleteItemFromObjectCaseSensitive(dst, field);
        cJSON_AddItemToObject(dst, field, cJSON_CreateTrue());
    }
    char *txt = cJSON_PrintUnformatted(cfg);
    err[0] = 0;
    qwenc_status st = qw_hparams_parse(hp, txt, "dir/config.json", err, errlen);
    free(txt);
    return st;
}

static void test_configs(const char *root) {
    printf("configs: each fixture's architecture; unsupported fields refused for every one\n");
    char *names[32];
    int n = test_list_fixtures(root, 0, names, 32);
    CHECK(n >= QW_ARCH_COUNT, "%d fixtures under %s, expected one per architecture at least", n, root);
    int seen[QW_ARCH_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        cJSON *cfg = read_config(root, names[i]);
        if (!cfg) continue;
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
        qw_arch want = QW_ARCH_COUNT;
        CHECK(cJSON_IsString(mt) && qw_arch_from_model_type(mt->valuestring, &want), "%s: model_type", names[i]);
        char err[1024];
        qw_hparams hp;
        qwenc_status st = parse(cfg, NULL, &hp, err, sizeof(err));
        CHECK(st == QWENC_OK && hp.arch == want, "%s: status %d, arch %d (expected %d): %s", names[i], st,
              (int)hp.arch, (int)want, err);
        if (!st) {
            seen[hp.arch] = 1;
            qw_hparams_free(&hp);
        }
        static const struct {
            const char *field, *want;
        } refused[] = {
            {"attention_bias", "dir/config.json: attention_bias / mlp_bias are not supported"},
            {"mlp_bias", "dir/config.json: attention_bias / mlp_bias are not supported"},
            {"use_sliding_window", "dir/config.json: field \"use_sliding_window\": sliding-window attention is not "
                                   "supported"},
        };
        for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++) {
            cJSON *c = cJSON_Duplicate(cfg, 1);
            st = parse(c, refused[k].field, &hp, err, sizeof(err));
            CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, refused[k].want), "%s with %s true: %d '%s'", names[i],
                  refused[k].field, st, err);
            if (!st) qw_hparams_free(&hp);
            cJSON_Delete(c);
        }
        cJSON_Delete(cfg);
        free(names[i]);
    }
    for (int a = 0; a < QW_ARCH_COUNT; a++) CHECK(seen[a], "no fixture of %s", qw_arch_name((qw_arch)a));
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    test_registry();
    test_messages();
    test_configs(root);
    return test_summary();
}
