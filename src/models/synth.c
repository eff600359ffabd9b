/*
 * synth.c - `qwenc synth`: a model with random weights at a released geometry (or a shrunk one), written
 * straight to GGUF without ever holding its weights in memory.
 *
 * How: the preset and the overrides become the text of a Hugging Face config.json, parsed by the same code
 * as a checkpoint's (formats/hfconfig.c), so a synthetic model has exactly the hyper-parameters, layer plan
 * and PLE hash constants a checkpoint with that config would have. A qwenc_model is then laid out by the
 * architecture's own description of its tensors (models/bind.h) with this file's io: every matrix is a tensor
 * without data (a name and a shape), every vector is drawn. gguf_save.c writes it like any model, asking
 * gen_row() for the rows of those tensors batch by batch: memory use is the save path's bounded batches plus
 * the small f32 vectors.
 *
 * Values (deterministic from the seed, the tensor name and the row, or for the vectors the seed and their
 * order; independent of threads and batching):
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
#include "models/bind.h"

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
} gen_state; /* = qw_synth_row's user: a uint64_t seed */

/* Row `row` of a tensor without data: N(0, 0.02), seeded by (seed, name, row). */
static void gen_row(const qw_tensor *t, int64_t row, int64_t cols, float *out, void *user) {
    const gen_state *g = user;
    uint64_t s = g->seed ^ fnv1a(t->name);
    s ^= splitmix64(&s) + (uint64_t)row * 0xD1B54A32D192ED03ull;
    normals(&s, out, cols, 0.0f, 0.02f);
}

/* ---------------------------------------------------------------- the model laid out: the binder's synth io */

/* The name a matrix's rows are seeded by: blk.<il>.<name> for a layer's (the names of earlier versions, so a
 * seed gives the same file; a role without one is seeded by its GGUF name). */
static const char *const seed_names[QW_GT_COUNT] = {
    [QW_GT_TOKEN_EMBD] = "token_embd", [QW_GT_OUTPUT] = "output",
    [QW_GT_HC_HEAD_DOWN] = "output_hc.down", [QW_GT_HC_HEAD_UP] = "output_hc.up",
    [QW_GT_ATTN_Q] = "q", [QW_GT_ATTN_K] = "k", [QW_GT_ATTN_V] = "v", [QW_GT_ATTN_OUT] = "o",
    [QW_GT_SSM_QKV] = "qkv", [QW_GT_SSM_GATE] = "z", [QW_GT_SSM_BETA] = "b", [QW_GT_SSM_ALPHA] = "a",
    [QW_GT_SSM_OUT] = "out", [QW_GT_FFN_GATE_INP] = "router", [QW_GT_FFN_GATE_SHEXP] = "shexp.gate",
    [QW_GT_FFN_UP_SHEXP] = "shexp.up", [QW_GT_FFN_DOWN_SHEXP] = "shexp.down", [QW_GT_FFN_GATE_INP_SHEXP] = "shexp_gate",
    [QW_GT_HC_ATTN_DOWN] = "hc_attn.down", [QW_GT_HC_ATTN_UP] = "hc_attn.up", [QW_GT_HC_ATTN_INJECT] = "hc_attn.inject",
    [QW_GT_HC_FFN_DOWN] = "hc_ffn.down", [QW_GT_HC_FFN_UP] = "hc_ffn.up", [QW_GT_HC_FFN_INJECT] = "hc_ffn.inject",
    [QW_GT_PLE_KEY] = "ple_key", [QW_GT_PLE_VALUE] = "ple_value",
};

/* A vector to fill once every tensor is laid out (fill_vectors). */
typedef struct {
    float *v;
    int64_t n, k; /* [n] or a convolution [n / k][k] (k > 0) */
    qw_gt role;
    int il;
} synth_vec;

typedef struct {
    uint64_t s; /* the stream of the small f32 vectors */
    synth_vec *vecs;
    int n_vecs, cap_vecs;
} synth;

/* A matrix [d0, d1] without data, named for the generator. */
static const qw_tensor *mat_named(qw_binder *b, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static const qw_tensor *mat_named(qw_binder *b, int64_t d0, int64_t d1, const char *fmt, ...) {
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    qw_tensor *t = qw_bind_own(b, sizeof(qw_tensor), "a synthetic tensor");
    char *nm = qw_bind_own(b, strlen(name) + 1, "a synthetic tensor's name");
    if (b->st) return NULL;
    memcpy(nm, name, strlen(name) + 1);
    t->name = nm;
    t->data = NULL;
    t->type = QW_TYPE_BF16; /* the released checkpoints' dtype: what llama-quantize keeps stays BF16 */
    t->n_dims = 2;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return t;
}

static void synth_mat(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, const qw_tensor **slot) {
    char gguf[96];
    const char *seed = seed_names[role] ? seed_names[role] : qw_gt_name(gguf, sizeof(gguf), role, il);
    *slot = qw_gt_info_of(role)->per_layer && seed_names[role] ? mat_named(b, d0, d1, "blk.%d.%s", il, seed)
                                                              : mat_named(b, d0, d1, "%s", seed);
}

static void synth_vec_add(qw_binder *b, qw_gt role, int il, int64_t d0, int64_t d1, float **slot) {
    synth *y = b->ctx;
    int64_t n = d0 * (d1 ? d1 : 1);
    float *v = qw_bind_f32(b, n, "a synthetic vector");
    if (!v) return;
    if (y->n_vecs == y->cap_vecs) {
        int cap = y->cap_vecs ? 2 * y->cap_vecs : 64;
        synth_vec *nv = qw_realloc(y->vecs, (size_t)cap, sizeof(synth_vec));
        if (!nv) {
            qw_bind_fail(b, QWENC_ERR_NOMEM, "%s: out of memory for the list of synthetic vectors", b->m->path);
            return;
        }
        y->vecs = nv;
        y->cap_vecs = cap;
    }
    y->vecs[y->n_vecs++] = (synth_vec){.v = v, .n = n, .k = d1, .role = role, .il = il};
    *slot = v;
}

static void synth_indexer(qw_binder *b, int il, int64_t nq, int64_t nk, qw_attn_w *w) {
    w->idx_qk = mat_named(b, nq + nk, b->m->hp.n_embd, "blk.%d.indexer", il);
}

static void synth_gdn_in(qw_binder *b, int il, qw_gdn_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, kd = (int64_t)hp->gdn_hk * hp->gdn_dk, vd = (int64_t)hp->gdn_hv * hp->gdn_dv;
    synth_mat(b, QW_GT_SSM_QKV, il, 2 * kd + vd, H, &w->qkv);
    synth_mat(b, QW_GT_SSM_GATE, il, vd, H, &w->z);
    synth_mat(b, QW_GT_SSM_BETA, il, hp->gdn_hv, H, &w->b);
    synth_mat(b, QW_GT_SSM_ALPHA, il, hp->gdn_hv, H, &w->a);
}

static void synth_experts(qw_binder *b, int il, qw_moe_w *w) {
    const qw_hparams *hp = &b->m->hp;
    int64_t H = hp->n_embd, I = hp->n_ff_exp;
    w->experts = qw_bind_own(b, (size_t)hp->n_expert * sizeof(qw_ffn_w), "the experts' views");
    for (int e = 0; e < hp->n_expert && !b->st; e++) {
        const qw_tensor *g = mat_named(b, I, H, "blk.%d.exp.%d.gate", il, e);
        const qw_tensor *u = mat_named(b, I, H, "blk.%d.exp.%d.up", il, e);
        const qw_tensor *d = mat_named(b, H, I, "blk.%d.exp.%d.down", il, e);
        if (b->st) return;
        w->experts[e] = (qw_ffn_w){*g, *u, *d};
    }
}

static void synth_ple_table(qw_binder *b, int il, int li, qw_ple_w **slot) {
    const qw_hparams *hp = &b->m->hp;
    int64_t nh = hp->ngram_heads;
    qw_ple_w *w = qw_bind_ple_new(b, li, slot);
    if (!w) return;
    qw_ple_constants(hp, li, w->mult, w->prime, w->offset, &w->n_rows);
    w->chunks = (qw_tensor *)mat_named(b, w->n_rows, hp->ple_dim / nh, "blk.%d.ple_table", il);
    w->n_chunks = 1;
    w->chunk_rows = w->n_rows;
}

static void synth_rope(qw_binder *b) {
    const qw_hparams *hp = &b->m->hp;
    b->m->rope_inv_freq = qw_bind_f32(b, hp->n_rot / 2, "the RoPE frequencies");
    if (b->m->rope_inv_freq) qw_rope_inv_freq(hp, b->m->rope_inv_freq);
}

static int synth_has(qw_binder *b, qw_gt role, int il) {
    (void)b, (void)role, (void)il;
    return 0;
}

static const qw_bind_io synth_io = {
    .file_layout = 1, /* random either way: no reordering when written */
    .has = synth_has,
    .mat = synth_mat,
    .vec = synth_vec_add,
    .indexer = synth_indexer,
    .gdn_in = synth_gdn_in,
    .experts = synth_experts,
    .ple_table = synth_ple_table,
    .rope = synth_rope,
};

static int is_ple(qw_gt role) {
    return role == QW_GT_PLE_NORM_KEY || role == QW_GT_PLE_NORM_QUERY || role == QW_GT_PLE_NORM_CONV ||
           role == QW_GT_PLE_CONV;
}

/* One vector's values (see the top of the file); dt_bias draws A_log's in turn with its own, head by head. */
static void fill_vector(synth *y, const qwenc_model *m, synth_vec *e, synth_vec *a) {
    if (e->role == QW_GT_SSM_DT) {
        QW_ASSERT(a && a->n == e->n);
        for (int64_t h = 0; h < e->n; h++) {
            double dt = exp(log(1e-3) + unif(&y->s) * (log(1e-1) - log(1e-3)));
            e->v[h] = (float)(dt + log(-expm1(-dt))); /* softplus^-1(dt) */
            a->v[h] = -(float)(1.0 + 15.0 * unif(&y->s)); /* -exp(A_log), A_log = log U(1, 16) */
        }
    } else if (e->k) {
        normals(&y->s, e->v, e->n, 0.0f, 0.1f);
    } else {
        /* a zero-centred norm's neutral value is 0 (the file stores 1 + w); the others' 1 */
        int zc = (qw_gt_info_of(e->role)->xf & QW_XF_NORM) && qw_arch_has(m->hp.arch, QW_AF_NORM_PLUS_ONE);
        normals(&y->s, e->v, e->n, zc ? 0.0f : 1.0f, 0.02f);
    }
}

/* Every vector, from one stream in the order earlier versions drew them (so a seed gives the same file): layer
 * by layer (the model-wide ones last), a layer's PLE vectors after its others. */
static void fill_vectors(synth *y, const qwenc_model *m) {
    for (int i = 0, j; i < y->n_vecs; i = j) {
        for (j = i; j < y->n_vecs && y->vecs[j].il == y->vecs[i].il; j++) {
        }
        for (int ple = 0; ple < 2; ple++)
            for (int k = i; k < j; k++) {
                synth_vec *e = &y->vecs[k], *a = NULL;
                if (is_ple(e->role) != ple || e->role == QW_GT_SSM_A) continue;
                for (int l = k + 1; e->role == QW_GT_SSM_DT && l < j && !a; l++)
                    if (y->vecs[l].role == QW_GT_SSM_A) a = &y->vecs[l];
                fill_vector(y, m, e, a);
            }
    }
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

/* Check the parameters and bind m (its path set) at the preset's geometry: matrices without data (BF16, the
 * released dtype), the vectors drawn. */
qwenc_status qw_synth_bind(const qwenc_synth_params *sp, qwenc_model *m, char *err, size_t errlen) {
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
    st = qw_hparams_parse(&m->hp, json, m->path, err, errlen);
    free(json);
    if (st) return st;
    m->hp.n_mtp = sp->mtp != 0;
    synth y = {.s = sp->seed * 0x2545F4914F6CDD1Dull + 1};
    qw_binder b = {.m = m, .io = &synth_io, .ctx = &y, .err = err, .errlen = errlen};
    st = qw_bind_model(&b);
    if (!st) fill_vectors(&y, m);
    free(y.vecs);
    return st;
}

void qw_synth_row(const qw_tensor *t, int64_t row, int64_t cols, float *out, void *user) {
    gen_row(t, row, cols, out, user);
}

qwenc_status qw_synth_model_new(const qwenc_synth_params *sp, qwenc_model **out, char *err, size_t errlen) {
    *out = NULL;
    char label[160];
    snprintf(label, sizeof(label), "synth-%s", sp->preset ? sp->preset : "");
    qwenc_model *m = qw_calloc(1, sizeof(*m));
    if (m) m->path = qw_strdup(label);
    if (!m || !m->path) {
        free(m);
        return qw_err_nomem(err, errlen, label, 1, sizeof(*m));
    }
    *out = m;
    return QWENC_OK;
}

qwenc_status qwenc_synth_gguf(const qwenc_synth_params *sp, const char *path, const qwenc_gguf_params *gp, char *err,
                              size_t errlen) {
    qwenc_model *m = NULL;
    qwenc_status st = qw_synth_model_new(sp, &m, err, errlen);
    if (!st) st = qw_synth_bind(sp, m, err, errlen);
    gen_state g = {.seed = sp->seed};
    if (!st) st = qw_model_save_gguf_gen(m, path, gp, gen_row, &g, err, errlen);
    qwenc_model_free(m);
    return st;
}
