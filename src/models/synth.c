/*
 * synth.c - `qwenc synth`: a model with random weights at a released geometry (or a shrunk one), written
 * straight to GGUF without ever holding its weights in memory.
 *
 * How: the preset and the overrides become the text of a Hugging Face config.json, parsed by the same code
 * as a checkpoint's (formats/hfconfig.c), so a synthetic model has exactly the hyper-parameters, layer plan
 * and PLE hash constants a checkpoint with that config would have. A qwenc_model is then laid out as the
 * binders would lay it out (models/bind.c, qwen4exp.c), except that every matrix is a tensor without data
 * (a name and a shape). gguf_save.c writes it like any model, asking gen_row() for the rows of those
 * tensors batch by batch: memory use is the save path's bounded batches plus the small f32 vectors.
 *
 * Values (deterministic from the seed, the tensor name and the row; independent of threads and batching):
 * matrices N(0, 0.02) (a matrix-vector product then keeps the activation scale: 0.02 * sqrt(2048) ~ 0.9);
 * zero-centred norm weights N(0, 0.02) (the neutral value is 0: the file stores 1 + w), the DeltaNet gated
 * norm 1 + N(0, 0.02); convolutions N(0, 0.1); A_log = log U(1, 16) and dt_bias = softplus^-1(dt) with
 * dt log-uniform in [1e-3, 1e-1], the initialisers of transformers' GatedDeltaNet / Mamba.
 *
 * Presets (spec/qwen4_exp.md 1.1, spec/qwen35_family.md 4): flash-next (qwen4_exp) and qwen3.5-35b-a3b
 * (qwen3_5_moe). Layers follow the preset's pattern (every 4th layer attention / QSA); a model shrunk below
 * four layers makes its last layer that is not the PLE layer attention, so every kind of layer is present.
 */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "blocks/blocks.h"
#include "models/gguf_map.h"
#include "models/model.h"

typedef struct {
    const char *name;      /* --preset */
    const char *model_type; /* transformers model_type */
    const char *gguf_arch;  /* llama.cpp's architecture */
    int n_embd, n_layer, n_head, n_head_kv, head_dim;
    int gdn_hk, gdn_hv;
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int n_vocab, eos;
    int qwen4exp;          /* hyper-connections, QSA indexer, PLE on layer 1 */
} synth_preset;

static const synth_preset presets[] = {
    {"flash-next", "qwen4_exp_text", "qwen4exp", 2560, 48, 24, 2, 256, 16, 48, 512, 10, 640, 640, 248320, 248044, 1},
    {"qwen3.5-35b-a3b", "qwen3_5_moe_text", "qwen35moe", 2048, 40, 16, 2, 256, 16, 32, 256, 8, 512, 512, 248320,
     248044, 0},
};

#define SYNTH_PLE_LAYER 1 /* flash-next: ple_layer_ids [2], one-indexed */

const char *qwenc_synth_presets(void) { return "flash-next (qwen4exp), qwen3.5-35b-a3b (qwen35moe)"; }

qwenc_synth_params qwenc_synth_default_params(void) {
    qwenc_synth_params p;
    memset(&p, 0, sizeof(p));
    p.seed = 42;
    return p;
}

/* ---------------------------------------------------------------- random numbers */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* uniform in (0, 1) */
static double unif(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* out[0..n) ~ N(mean, sigma) (Box-Muller) */
static void normals(uint64_t *s, float *out, int64_t n, float mean, float sigma) {
    for (int64_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(unif(s))), a = 6.283185307179586 * unif(s);
        out[i] = mean + sigma * (float)(r * cos(a));
        if (i + 1 < n) out[i + 1] = mean + sigma * (float)(r * sin(a));
    }
}

typedef struct {
    uint64_t seed;
} gen_state;

/* Row `row` of a tensor without data: N(0, 0.02), seeded by (seed, name, row). */
static void gen_row(const qw_tensor *t, int64_t row, int64_t cols, float *out, void *user) {
    const gen_state *g = user;
    uint64_t s = g->seed ^ fnv1a(t->name);
    s ^= splitmix64(&s) + (uint64_t)row * 0xD1B54A32D192ED03ull;
    normals(&s, out, cols, 0.0f, 0.02f);
}

/* ---------------------------------------------------------------- the model laid out */

typedef struct {
    qwenc_model *m;
    uint64_t s; /* the stream of the small f32 vectors */
    qw_tensor none; /* what mat() gives after running out of memory (st set) */
    qwenc_status st;
    char *err;
    size_t errlen;
} synth;

/* A buffer owned by the model; NULL and y->st set when out of memory (or after an earlier failure). */
static void *own(synth *y, size_t bytes) {
    if (y->st) return NULL;
    void *p = qw_model_own(y->m, bytes);
    if (!p) y->st = qw_err_nomem(y->err, y->errlen, y->m->path, bytes, 1);
    return p;
}

/* A matrix [d0, d1] without data, named for the generator. */
static const qw_tensor *mat(synth *y, int64_t d0, int64_t d1, const char *fmt, ...) {
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    qw_tensor *t = own(y, sizeof(qw_tensor));
    char *nm = own(y, strlen(name) + 1);
    if (y->st) return &y->none;
    memcpy(nm, name, strlen(name) + 1);
    t->name = nm;
    t->data = NULL;
    t->type = QW_TYPE_BF16; /* the released checkpoints' dtype: what llama-quantize keeps stays BF16 */
    t->n_dims = 2;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return t;
}

static float *vec(synth *y, int64_t n, float mean, float sigma) {
    float *v = own(y, (size_t)n * sizeof(float));
    if (v) normals(&y->s, v, n, mean, sigma);
    return v;
}

static void lay_ffn(synth *y, qw_ffn_w *w, int64_t I, const char *base) {
    int64_t H = y->m->hp.n_embd;
    w->gate = *mat(y, I, H, "%s.gate", base);
    w->up = *mat(y, I, H, "%s.up", base);
    w->down = *mat(y, H, I, "%s.down", base);
}

static void lay_moe(synth *y, int il, qw_moe_w *w) {
    const qw_hparams *hp = &y->m->hp;
    char base[64];
    w->router = mat(y, hp->n_expert, hp->n_embd, "blk.%d.router", il);
    w->experts = own(y, (size_t)hp->n_expert * sizeof(qw_ffn_w));
    if (!w->experts) return;
    for (int e = 0; e < hp->n_expert; e++) {
        snprintf(base, sizeof(base), "blk.%d.exp.%d", il, e);
        lay_ffn(y, &w->experts[e], hp->n_ff_exp, base);
    }
    snprintf(base, sizeof(base), "blk.%d.shexp", il);
    lay_ffn(y, &w->shared, hp->n_ff_shexp, base);
    w->shared_gate = mat(y, 1, hp->n_embd, "blk.%d.shexp_gate", il);
}

static void lay_attn(synth *y, int il, qw_attn_w *w, int qsa) {
    const qw_hparams *hp = &y->m->hp;
    int64_t H = hp->n_embd, hd = hp->head_dim;
    w->gated = 1;
    w->wq = mat(y, hp->n_head * hd * 2, H, "blk.%d.q", il);
    w->wk = mat(y, hp->n_head_kv * hd, H, "blk.%d.k", il);
    w->wv = mat(y, hp->n_head_kv * hd, H, "blk.%d.v", il);
    w->wo = mat(y, H, hp->n_head * hd, "blk.%d.o", il);
    w->q_norm = vec(y, hd, 0.0f, 0.02f);
    w->k_norm = vec(y, hd, 0.0f, 0.02f);
    if (qsa) {
        int64_t ihd = hp->idx_head_dim;
        w->idx_qk = mat(y, (hp->idx_n_head + 1) * ihd, H, "blk.%d.indexer", il);
        w->idx_q_norm = vec(y, ihd, 0.0f, 0.02f);
        w->idx_k_norm = vec(y, ihd, 0.0f, 0.02f);
    }
}

static void lay_gdn(synth *y, int il, qw_gdn_w *w) {
    const qw_hparams *hp = &y->m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    int hv = hp->gdn_hv;
    w->v_tiled = 1; /* random either way: skip the converter's reordering */
    w->qkv = mat(y, 2 * kd + vd, H, "blk.%d.qkv", il);
    w->z = mat(y, vd, H, "blk.%d.z", il);
    w->b = mat(y, hv, H, "blk.%d.b", il);
    w->a = mat(y, hv, H, "blk.%d.a", il);
    w->conv = vec(y, (2 * kd + vd) * hp->gdn_conv_k, 0.0f, 0.1f);
    w->dt_bias = own(y, (size_t)hv * sizeof(float));
    w->neg_exp_a = own(y, (size_t)hv * sizeof(float));
    if (y->st) return;
    for (int h = 0; h < hv; h++) {
        double dt = exp(log(1e-3) + unif(&y->s) * (log(1e-1) - log(1e-3)));
        w->dt_bias[h] = (float)(dt + log(-expm1(-dt))); /* softplus^-1(dt) */
        w->neg_exp_a[h] = -(float)(1.0 + 15.0 * unif(&y->s)); /* -exp(A_log), A_log = log U(1, 16) */
    }
    w->norm = vec(y, hp->gdn_dv, 1.0f, 0.02f);
    w->out = mat(y, H, vd, "blk.%d.out", il);
}

static void lay_hc(synth *y, qw_hc_w *w, const char *base, int inject) {
    const qw_hparams *hp = &y->m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd;
    w->norm = vec(y, CH, 0.0f, 0.02f);
    w->down = mat(y, hp->hc_lowrank, CH, "%s.down", base);
    w->up = mat(y, CH, hp->hc_lowrank, "%s.up", base);
    if (inject) w->inject = mat(y, hp->hc_count, CH, "%s.inject", base);
}

static qw_ple_w *lay_ple(synth *y, int il, int li) {
    qwenc_model *m = y->m;
    const qw_hparams *hp = &m->hp;
    int64_t CH = (int64_t)hp->hc_count * hp->n_embd, P = hp->ple_dim, nh = hp->ngram_heads;
    qw_ple_w *w = own(y, sizeof(qw_ple_w));
    if (!w) return NULL;
    w->li = li;
    w->prime = own(y, (size_t)nh * sizeof(int64_t));
    w->offset = own(y, (size_t)nh * sizeof(int64_t));
    if (y->st) return w;
    qw_ple_constants(hp, li, w->mult, w->prime, w->offset, &w->n_rows);
    w->key_proj = mat(y, CH, P, "blk.%d.ple_key", il);
    w->value_proj = mat(y, hp->n_embd, P, "blk.%d.ple_value", il);
    w->norm_key = vec(y, CH, 0.0f, 0.02f);
    w->norm_query = vec(y, CH, 0.0f, 0.02f);
    w->norm_conv = vec(y, CH, 0.0f, 0.02f);
    w->conv = vec(y, CH * hp->ple_conv_k, 0.0f, 0.1f);
    w->chunks = (qw_tensor *)mat(y, w->n_rows, P / nh, "blk.%d.ple_table", il);
    w->n_chunks = 1;
    w->chunk_rows = w->n_rows;
    return w;
}

static void lay_model(synth *y) {
    qwenc_model *m = y->m;
    const qw_hparams *hp = &m->hp;
    m->tok_embd = mat(y, hp->n_vocab, hp->n_embd, "token_embd");
    m->output = mat(y, hp->n_vocab, hp->n_embd, "output");
    m->layers = qw_calloc((size_t)hp->n_layer, sizeof(qw_layer));
    if (!m->layers) {
        y->st = qw_err_nomem(y->err, y->errlen, m->path, (size_t)hp->n_layer, sizeof(qw_layer));
        return;
    }
    char base[64];
    for (int il = 0; il < hp->n_layer && !y->st; il++) {
        qw_layer *L = &m->layers[il];
        L->kind = hp->layer_kind[il];
        L->moe = hp->layer_moe[il];
        if (hp->arch == QW_ARCH_QWEN4EXP) {
            snprintf(base, sizeof(base), "blk.%d.hc_attn", il);
            lay_hc(y, &L->hc_attn, base, 1);
            snprintf(base, sizeof(base), "blk.%d.hc_ffn", il);
            lay_hc(y, &L->hc_mlp, base, 1);
        } else {
            L->attn_norm = vec(y, hp->n_embd, 0.0f, 0.02f);
            L->ffn_norm = vec(y, hp->n_embd, 0.0f, 0.02f);
        }
        if (L->kind == QW_LAYER_GDN)
            lay_gdn(y, il, &L->gdn);
        else
            lay_attn(y, il, &L->attn, L->kind == QW_LAYER_QSA);
        lay_moe(y, il, &L->moe_w);
        for (int i = 0; i < hp->n_ple; i++)
            if (hp->ple_layers[i] == il) L->ple = lay_ple(y, il, i);
    }
    if (hp->arch == QW_ARCH_QWEN4EXP)
        lay_hc(y, &m->hc_final, "output_hc", 0);
    else
        m->out_norm = vec(y, hp->n_embd, 0.0f, 0.02f);
}

/* ---------------------------------------------------------------- config.json of the geometry */

static void put(char *buf, size_t n, size_t *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = *at < n ? vsnprintf(buf + *at, n - *at, fmt, ap) : 0;
    va_end(ap);
    if (k > 0) *at += (size_t)k;
}

/* The config.json a checkpoint of this geometry would have, in *out (QWENC_ERR_ARG for a bad override). */
static qwenc_status config_json(const synth_preset *pr, const qwenc_synth_params *sp, char **out, char *err,
                                size_t errlen) {
    *out = NULL;
    int L = sp->n_layer > 0 ? sp->n_layer : pr->n_layer, E = sp->n_expert > 0 ? sp->n_expert : pr->n_expert;
    int H = sp->n_embd > 0 ? sp->n_embd : pr->n_embd, V = sp->n_vocab > 0 ? sp->n_vocab : pr->n_vocab;
    int k = QW_MIN(pr->n_expert_used, E), eos = pr->eos < V ? pr->eos : V - 1;
    int64_t base = sp->ngram_base > 0 ? sp->ngram_base : 20000000;
    if (pr->qwen4exp && L < 2) {
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: %s needs --layers >= 2 (its PLE layer is layer 1)", pr->name);
    }
    if (H % 32 || H < 64) {
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: --hidden must be a multiple of 32 and at least 64, got %d", H);
    }
    if (V < 16) {
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: --vocab must be at least 16, got %d", V);
    }
    size_t n = 4096 + (size_t)L * 24, at = 0;
    char *j = qw_calloc(n, 1);
    if (!j) return qw_err_nomem(err, errlen, "synth: config.json", n, 1);
    put(j, n, &at, "{\"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d, "
                   "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
                   "\"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, "
                   "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, "
                   "\"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true}, "
                   "\"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128, "
                   "\"linear_num_key_heads\": %d, \"linear_num_value_heads\": %d, \"num_experts\": %d, "
                   "\"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"shared_expert_intermediate_size\": %d, "
                   "\"eos_token_id\": %d, \"bos_token_id\": %d, \"full_attention_interval\": 4",
        pr->model_type, V, H, L, pr->n_head, pr->n_head_kv, pr->head_dim, pr->gdn_hk, pr->gdn_hv, E, k, pr->n_ff_exp,
        pr->n_ff_shexp, eos, eos);
    /* every 4th layer attention; below four layers the last one that is not the PLE layer */
    int extra = -1;
    if (L < 4) extra = pr->qwen4exp && L - 1 == SYNTH_PLE_LAYER ? 0 : L - 1;
    put(j, n, &at, ", \"layer_types\": [");
    for (int l = 0; l < L; l++)
        put(j, n, &at, "%s\"%s\"", l ? ", " : "",
            (l + 1) % 4 == 0 || l == extra ? "full_attention" : "linear_attention");
    put(j, n, &at, "]");
    if (pr->qwen4exp)
        put(j, n, &at, ", \"hc_count\": 4, \"hc_lowrank\": 320, \"ple_layer_ids\": [%d], \"ngram_vocab_size_base\": %lld, "
                       "\"indexer_n_heads\": 4, \"indexer_kv_heads\": 1, \"indexer_head_dim\": 128, "
                       "\"indexer_budget\": 2048, \"indexer_compress_ratio\": 4, \"output_gate_type\": \"sigmoid\"",
            SYNTH_PLE_LAYER + 1, (long long)base);
    put(j, n, &at, "}\n");
    QW_ASSERT(at < n);
    *out = j;
    return QWENC_OK;
}

static const synth_preset *find_preset(const char *name) {
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        if (name && !strcmp(name, presets[i].name)) return &presets[i];
    return NULL;
}

qwenc_status qwenc_synth_gguf(const qwenc_synth_params *sp, const char *path, const qwenc_gguf_params *gp, char *err,
                              size_t errlen) {
    const synth_preset *pr = find_preset(sp->preset);
    if (!pr)
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: unknown preset \"%s\" (one of %s)",
                      sp->preset ? sp->preset : "", qwenc_synth_presets());
    if (sp->arch && strcmp(sp->arch, pr->gguf_arch) != 0 && strcmp(sp->arch, pr->model_type) != 0 &&
        strncmp(pr->model_type, sp->arch, strlen(sp->arch)) != 0)
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: preset %s is architecture %s, not %s", pr->name,
                      pr->gguf_arch, sp->arch);
    if (sp->n_layer < 0 || sp->n_expert < 0 || sp->n_embd < 0 || sp->n_vocab < 0 || sp->ngram_base < 0)
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: sizes must not be negative");
    if (sp->n_layer > 1024 || sp->n_expert > 4096 || sp->n_embd > 65536 || sp->n_vocab > (1 << 24))
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: at most 1024 layers, 4096 experts, hidden size 65536 and "
                      "vocabulary 16777216 (the bounds of config.json, formats/hfconfig.c)");
    char *json = NULL;
    qwenc_status st = config_json(pr, sp, &json, err, errlen);
    if (st) return st;
    char label[160];
    snprintf(label, sizeof(label), "synth-%s", pr->name);
    qwenc_model *m = qw_calloc(1, sizeof(*m));
    if (m) m->path = qw_strdup(label);
    if (!m || !m->path) {
        free(json);
        free(m);
        return qw_err_nomem(err, errlen, label, 1, sizeof(*m));
    }
    st = qw_hparams_parse(&m->hp, json, label, err, errlen);
    free(json);
    if (!st) {
        synth y = {.m = m, .s = sp->seed * 0x2545F4914F6CDD1Dull + 1, .err = err, .errlen = errlen};
        lay_model(&y);
        st = y.st;
        gen_state g = {.seed = sp->seed};
        if (!st) st = qw_model_save_gguf_gen(m, path, gp, gen_row, &g, err, errlen);
    }
    qwenc_model_free(m);
    return st;
}
