/*
 * model.c - the model's public entry points: load a checkpoint directory (models/hf_bind.c) or a GGUF
 * (models/gguf_bind.c), both bound by the architecture's description of its tensors (models/bind.h); with
 * params.quant the bound weights are then converted at load (models/load_quant.c). qwenc info's listing.
 */
#include <string.h>

#include "blocks/blocks.h"
#include "cuda/cuda.h"
#include "kernels/cpu.h"
#include "models/gguf_map.h"

void qw_model_forward(const qw_fwd *f, float *hidden) { qw_arch_get(f->hp->arch)->forward(f, hidden); }

/* The tensors read a few rows per token (the token embedding unless it is also the lm_head, the PLE
 * n-gram tables) keep 4 KiB pages, which the rest of the mapping does not (core/mapfile.h). */
static void advise_sparse(const qwenc_model *m) {
    const qw_tensor *e = m->tok_embd;
    if (e && e != m->output) qw_advise_sparse(e->data, qw_type_row_size(e->type, qw_tensor_nelem(e)));
    for (int il = 0; m->layers && il < m->hp.n_layer; il++)
        for (int c = 0; m->layers[il].ple && c < m->layers[il].ple->n_chunks; c++) {
            const qw_tensor *t = &m->layers[il].ple->chunks[c];
            qw_advise_sparse(t->data, qw_type_row_size(t->type, qw_tensor_nelem(t)));
        }
}

qwenc_model_params qwenc_model_default_params(void) {
    qwenc_model_params p = {.n_threads = 0, .kernels = NULL, .quant = NULL, .progress = NULL, .progress_user = NULL};
    return p;
}

qwenc_status qwenc_model_load(const char *path, qwenc_model **out, char *err, size_t errlen) {
    return qwenc_model_load_params(path, NULL, out, err, errlen);
}

/* The CPU backend the model is bound with: "cpu-guard" when asked for, else "cpu" (kernels/cpu.h). A GPU
 * comes in at the end of the load (model_device), when the parameters ask for one. */
static qwenc_status model_backend(qwenc_model *m, const qwenc_model_params *mp, char *err, size_t errlen) {
    const char *name = mp->backend ? mp->backend : "auto";
    int guard = !strcmp(name, "cpu-guard");
    if (strcmp(name, "cpu") && strcmp(name, "auto") && strcmp(name, "cuda") && !guard)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "unknown backend \"%s\" (auto, cpu, cuda, cpu-guard)", name);
    qwenc_status st = qw_backend_cpu_new(mp->n_threads, mp->kernels, guard, &m->be, err, errlen);
    if (st) return st;
    m->backend_name = guard ? "cpu-guard" : "cpu";
    qw_backend_cpu_set_f32_activations(m->be, mp->f32_activations);
    return QWENC_OK;
}

/* Whether quantized weights meet 8-bit activations on the GPU as they do on the CPU (params.f32_activations 0): the
 * integer kernels (cuda/quant.cu, mvq_kernel) are checked on the host (tests/t_qkernels.c: q8dot.h against the
 * CPU's integer reference) and on the GPU (tests/gpu/t_cuda_quant.c). 0 at build time: f32 activations for every
 * weight type on the GPU. */
#ifndef CUDA_Q8_ACTIVATIONS
#define CUDA_Q8_ACTIVATIONS 1
#endif

static void cuda_activations(qw_backend *gpu, const qwenc_model_params *mp) {
    qw_backend_cuda_set_q8_activations(gpu, CUDA_Q8_ACTIVATIONS && !mp->f32_activations);
}

/* params.gpus: "" (one GPU, device 0: *n 0), "N" (devices 0 .. N-1) or "a,b,c" (those ids, repeats allowed) into
 * devs; an error with a backend other than cuda or auto */
static qwenc_status parse_gpus(const char *g, const char *backend, int *devs, int *n, char *err, size_t errlen) {
    *n = 0;
    devs[0] = 0;
    if (!g || !*g) return QWENC_OK;
    if (strcmp(backend, "cuda") && strcmp(backend, "auto"))
        return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus %s with --backend %s: the GPUs need --backend cuda", g, backend);
    int list = strchr(g, ',') != NULL;
    const char *p = g;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || (*end && *end != ','))
            return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: \"%s\" is neither a count nor a list of device ids", g);
        if (*n == QW_MAX_GPUS)
            return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: at most %d GPUs (\"%s\")", QW_MAX_GPUS, g);
        devs[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: \"%s\" ends with a comma", g);
    }
    if (!list) { /* a count */
        int count = devs[0];
        if (count < 1 || count > QW_MAX_GPUS)
            return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: between 1 and %d GPUs, not %d", QW_MAX_GPUS, count);
        for (int i = 0; i < count; i++) devs[i] = i;
        *n = count;
    }
    return QWENC_OK;
}

/* QWENC_GPU_SHARES="a,b,..." in the environment: the n GPUs' shares (relative sizes) in place of share[] */
static qwenc_status forced_shares(double *share, int n, char *err, size_t errlen) {
    const char *force = getenv("QWENC_GPU_SHARES");
    for (int r = 0; force && *force && r < n; r++) {
        char *end = NULL;
        share[r] = strtod(force, &end);
        if (end == force || share[r] < 0 || (*end && *end != ','))
            return qw_err(err, errlen, QWENC_ERR_ARG, "QWENC_GPU_SHARES: not %d numbers >= 0 separated by commas", n);
        force = *end ? end + 1 : end;
    }
    return QWENC_OK;
}

/* The routed experts over the GPUs of params.gpus (the backend made on the first): nothing for one GPU given as
 * "" or for a model without routed experts. Each GPU gets an equal share of every layer's experts, unless the
 * first would then hold more than nine tenths of its free memory (it also holds everything else: rest bytes):
 * then it gets what fits there and the others share the remaining experts equally. QWENC_GPU_SHARES gives the
 * shares instead. */
static qwenc_status cuda_split(qwenc_model *m, qw_backend *gpu, const int *devs, int n, int64_t rest, size_t free0,
                               char *err, size_t errlen) {
    if (n == 0) return QWENC_OK;
    int moe = 0;
    for (int l = 0; l < m->hp.n_layer; l++) moe |= m->layers[l].moe;
    if (!moe) return QWENC_OK;
    double share[QW_MAX_GPUS], X = (double)qw_model_expert_bytes(m), room = 0.9 * (double)free0 - (double)rest;
    for (int r = 0; r < n; r++) share[r] = 1.0 / n;
    if (n > 1 && X > 0 && free0 > 0 && room < X / n) {
        share[0] = room > 0 ? room / X : 0;
        for (int r = 1; r < n; r++) share[r] = (1 - share[0]) / (n - 1);
    }
    qwenc_status st = forced_shares(share, n, err, errlen); /* tests: a GPU without experts */
    return st ? st : qw_backend_cuda_split(gpu, devs, n, share, err, errlen);
}

/* The layers' bytes (the MTP head's layer too when there is one); the number of layers */
static int layers_bytes(const qwenc_model *m, int64_t *sum) {
    int nl = m->hp.n_layer + (m->hp.n_mtp ? 1 : 0);
    *sum = 0;
    for (int il = 0; il < nl; il++) *sum += qw_model_layer_bytes(m, il);
    return nl;
}

/* The layers over the GPUs of params.gpus (--split layer): contiguous ranges in order, the MTP head's layer last,
 * so that each GPU holds its share of all the bytes (equal shares, or QWENC_GPU_SHARES), the first counting the
 * model's own parts too (rest bytes: embeddings, the head, the n-gram table unless it stays in host memory): a
 * layer goes to the GPU whose share holds its middle byte. by_count: the sizes are not known yet (random weights
 * made on the GPUs): every layer counts one, rest nothing. */
static qwenc_status cuda_split_layers(qwenc_model *m, qw_backend *gpu, const int *devs, int n, int64_t rest,
                                      int by_count, char *err, size_t errlen) {
    if (n == 0) return QWENC_OK;
    int64_t sum = 0;
    const int nl = layers_bytes(m, &sum);
    if (rest < 0) rest = 0; /* a file's total that leaves out a part the layers count */
    double share[QW_MAX_GPUS], cum[QW_MAX_GPUS + 1], tot = 0;
    for (int r = 0; r < n; r++) share[r] = 1.0;
    qwenc_status st = forced_shares(share, n, err, errlen);
    if (st) return st;
    for (int r = 0; r < n; r++) cum[r] = tot, tot += share[r];
    if (tot <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "QWENC_GPU_SHARES: every share is 0");
    cum[n] = tot;
    int *stage = qw_calloc((size_t)(nl ? nl : 1), sizeof(int));
    if (!stage) return qw_err_nomem(err, errlen, "--split layer", (size_t)nl, sizeof(int));
    const double all = by_count ? nl : (double)(rest + sum);
    double pos = by_count ? 0 : (double)rest;
    for (int il = 0, r = 0; il < nl; il++) {
        const double b = by_count ? 1 : (double)qw_model_layer_bytes(m, il), mid = (pos + b / 2) / all * tot;
        while (r < n - 1 && mid >= cum[r + 1]) r++;
        stage[il] = r;
        pos += b;
    }
    st = qw_backend_cuda_split_layers(gpu, devs, n, stage, nl, err, errlen); /* the backend keeps its copy */
    free(stage);
    return st;
}

/* params.split: 1 for "layer", 0 for the experts' split (NULL, "" or "expert"), -1 (an error) otherwise */
static int split_by_layer(const qwenc_model_params *mp, char *err, size_t errlen) {
    if (!mp->split || !*mp->split || !strcmp(mp->split, "expert")) return 0;
    if (!strcmp(mp->split, "layer")) return 1;
    qw_err(err, errlen, QWENC_ERR_ARG, "--split: expert or layer, not \"%s\"", mp->split);
    return -1;
}

/* "cuda": the model runs on the GPU (an error when there is none); "auto": on the GPU when there is one and the
 * weights fit in its free memory with a tenth to spare, else on the CPU. The weights stay bound on the host;
 * the GPU backend uploads each one the first time it is read. An n-gram table that does not fit beside the rest
 * stays in host memory, pinned, its rows read over the bus (QWENC_CUDA_PLE_HOST=1 / 0 forces it on / off). */
static qwenc_status model_device(qwenc_model *m, const qwenc_model_params *mp, char *err, size_t errlen) {
    const char *name = mp->backend ? mp->backend : "auto";
    int devs[QW_MAX_GPUS], n_dev = 0, by_layer = split_by_layer(mp, err, errlen);
    if (by_layer < 0) return QWENC_ERR_ARG;
    qwenc_status st = parse_gpus(mp->gpus, name, devs, &n_dev, err, errlen);
    if (st || (strcmp(name, "cuda") && strcmp(name, "auto"))) return st;
    char desc[320];
    if (!qw_cuda_available(desc, sizeof(desc))) {
        if (!strcmp(name, "auto") && !n_dev) return QWENC_OK;
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: %s", n_dev ? "--gpus" : "--backend cuda", desc);
    }
    qw_backend *gpu = NULL;
    st = qw_backend_cuda_new(devs[0], &gpu, err, errlen);
    if (st) return !strcmp(name, "auto") && !n_dev ? QWENC_OK : st;
    int64_t total = 0, per_token = 0, table = qw_model_ple_table_bytes(m);
    qwenc_model_weight_bytes(m, &total, &per_token);
    size_t free_b = 0, total_b = 0;
    qw_backend_cuda_memory(gpu, &free_b, &total_b);
    const char *force = getenv("QWENC_CUDA_PLE_HOST");
    double first = (double)total; /* what the first GPU holds: with a split, an equal share of the experts or layers */
    int64_t in_layers = 0;
    layers_bytes(m, &in_layers);
    if (n_dev > 1) first -= (double)(by_layer ? in_layers : qw_model_expert_bytes(m)) * (n_dev - 1) / n_dev;
    int host_table = table > 0 && (force && *force ? strcmp(force, "0") != 0 : first > 0.9 * (double)free_b);
    if (host_table) total -= table;
    if (!strcmp(name, "auto") && !n_dev && (double)total > 0.9 * (double)free_b) {
        gpu->release(gpu);
        return QWENC_OK;
    }
    st = by_layer ? cuda_split_layers(m, gpu, devs, n_dev, total - in_layers, 0, err, errlen)
                  : cuda_split(m, gpu, devs, n_dev, total - qw_model_expert_bytes(m), free_b, err, errlen);
    if (st) {
        gpu->release(gpu);
        return st;
    }
    qw_backend_cuda_set_ple_host(gpu, host_table);
    m->ple_host_bytes = host_table ? table : 0;
    cuda_activations(gpu, mp);
    m->be->release(m->be);
    m->be = gpu;
    m->backend_name = "cuda";
    m->params.kernels = gpu->name;
    m->params.backend = m->backend_name;
    return QWENC_OK;
}

qwenc_status qwenc_model_load_params(const char *path, const qwenc_model_params *params, qwenc_model **out,
                                     char *err, size_t errlen) {
    *out = NULL;
    qwenc_model_params mp = params ? *params : qwenc_model_default_params();
    if (mp.n_threads < 0) return qw_err(err, errlen, QWENC_ERR_ARG, "model: n_threads must not be negative");
    qw_gguf_policy pol;
    if (mp.quant && !qw_gguf_policy_parse(&pol, mp.quant))
        return qw_err(err, errlen, QWENC_ERR_ARG, "unknown quantization type \"%s\" (one of %s)", mp.quant,
                      qw_gguf_policy_names());
    qwenc_model *m = qw_calloc(1, sizeof(*m));
    if (!m) return qw_err_nomem(err, errlen, path, 1, sizeof(*m));
    m->path = qw_strdup(path);
    if (!m->path) {
        free(m);
        return qw_err_nomem(err, errlen, path, strlen(path) + 1, 1);
    }
    m->params = mp;
    qwenc_status st = model_backend(m, &mp, err, errlen);
    if (st) {
        qwenc_model_free(m);
        return st;
    }
    m->params.kernels = m->be->name; /* the caller's strings need not outlive the call */
    m->params.backend = m->backend_name;
    /* a .gguf file (models/gguf_bind.c) or a checkpoint directory (models/hf_bind.c) */
    st = qw_path_is_gguf(path) ? qw_gguf_model_load(m, path, err, errlen) : qw_hf_model_load(m, path, err, errlen);
    if (!st && mp.quant) st = qw_model_quantize_at_load(m, NULL, NULL, NULL, 0, err, errlen);
    if (!st) st = model_device(m, &mp, err, errlen);
    if (st) {
        qwenc_model_free(m);
        return st;
    }
    advise_sparse(m);
    *out = m;
    return QWENC_OK;
}

qwenc_status qwenc_model_synth(const qwenc_synth_params *sp, const char *type, const qwenc_model_params *params,
                               qwenc_model **out, char *err, size_t errlen) {
    *out = NULL;
    qwenc_model_params mp = params ? *params : qwenc_model_default_params();
    if (mp.n_threads < 0) return qw_err(err, errlen, QWENC_ERR_ARG, "model: n_threads must not be negative");
    qw_gguf_policy pol;
    if (!type || !qw_gguf_policy_parse(&pol, type))
        return qw_err(err, errlen, QWENC_ERR_ARG, "synth: %s tensor type \"%s\" (one of %s)", type ? "unknown" : "no",
                      type ? type : "", qw_gguf_policy_names());
    mp.quant = type;
    qwenc_model *m = NULL;
    qwenc_status st = qw_synth_model_new(sp, &m, err, errlen);
    if (st) return st;
    m->params = mp;
    qw_backend *gpu = NULL;
    const char *name = mp.backend ? mp.backend : "auto";
    int devs[QW_MAX_GPUS], n_dev = 0, by_layer = split_by_layer(&mp, err, errlen);
    st = by_layer < 0 ? QWENC_ERR_ARG : parse_gpus(mp.gpus, name, devs, &n_dev, err, errlen);
    if (!st) st = model_backend(m, &mp, err, errlen);
    if (!st) st = qw_synth_bind(sp, m, err, errlen);
    char desc[320];
    if (!st && (!strcmp(name, "cuda") || !strcmp(name, "auto"))) {
        if (qw_cuda_available(desc, sizeof(desc))) {
            st = qw_backend_cuda_new(devs[0], &gpu, err, errlen);
            if (st && !strcmp(name, "auto") && !n_dev) st = QWENC_OK;
        } else if (!strcmp(name, "cuda") || n_dev) {
            st = qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: %s", n_dev ? "--gpus" : "--backend cuda", desc);
        }
    }
    if (!st && gpu && !strcmp(name, "auto") && !n_dev) { /* on the GPU only if the weights fit */
        qw_gguf_plan *pl = NULL;
        st = qw_gguf_plan_new(m, type, mp.n_threads, NULL, NULL, &pl, err, errlen);
        size_t free_b = 0, total_b = 0;
        qw_backend_cuda_memory(gpu, &free_b, &total_b);
        if (!st && (double)qw_gguf_plan_bytes(pl) > 0.9 * (double)free_b) {
            gpu->release(gpu);
            gpu = NULL;
        }
        qw_gguf_plan_free(pl);
    }
    /* split before the weights are made: then each GPU makes the parts it reads (equal shares: the sizes are not
     * known yet) */
    if (!st && gpu)
        st = by_layer ? cuda_split_layers(m, gpu, devs, n_dev, 0, 1, err, errlen)
                      : cuda_split(m, gpu, devs, n_dev, 0, 0, err, errlen);
    uint64_t seed = sp->seed;
    if (!st) st = qw_model_quantize_at_load(m, qw_synth_row, &seed, gpu, seed, err, errlen);
    if (!st && gpu) {
        cuda_activations(gpu, &mp);
        m->be->release(m->be);
        m->be = gpu;
        gpu = NULL;
        m->backend_name = "cuda";
    }
    if (gpu) gpu->release(gpu);
    if (st) {
        qwenc_model_free(m);
        return st;
    }
    m->params.kernels = m->be->name;
    m->params.backend = m->backend_name;
    *out = m;
    return QWENC_OK;
}

void qwenc_model_free(qwenc_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    qw_model_converted_free(m);
    qw_weightset_free(&m->ws);
    if (m->gguf) qw_gguf_free(m->gguf);
    free(m->gguf);
    qw_hparams_free(&m->hp);
    if (m->be) m->be->release(m->be);
    free(m->path);
    free(m);
}

int qwenc_model_n_vocab(const qwenc_model *m) { return m->hp.n_vocab; }
int qwenc_model_has_draft_head(const qwenc_model *m) { return m->hp.n_mtp > 0; }
int qw_mtp_width(const qw_hparams *hp) { return qw_arch_has(hp->arch, QW_AF_HC) ? hp->hc_count * hp->n_embd : hp->n_embd; }
int qwenc_model_n_ctx_train(const qwenc_model *m) { return m->hp.n_ctx_train; }
const char *qwenc_model_arch(const qwenc_model *m) { return qw_arch_name(m->hp.arch); }
const char *qwenc_model_kernels(const qwenc_model *m) { return m->be->name; }
const char *qwenc_model_backend(const qwenc_model *m) { return m->backend_name; }
void qwenc_model_device_info(const qwenc_model *m, int measure_bw, qwenc_device_info *out) {
    memset(out, 0, sizeof(*out));
    if (strcmp(m->backend_name, "cuda")) return;
    qw_cuda_available(out->name, sizeof(out->name));
    size_t f = 0, t = 0;
    qw_backend_cuda_memory(m->be, &f, &t);
    out->free_bytes = f;
    out->total_bytes = t;
    out->host_table_bytes = (uint64_t)m->ple_host_bytes;
    if (measure_bw) out->read_bw = qw_backend_cuda_read_bandwidth(m->be);
}

int qwenc_model_n_gpus(const qwenc_model *m) {
    return strcmp(m->backend_name, "cuda") ? 0 : qw_backend_cuda_ranks(m->be);
}

void qwenc_model_gpu_info(const qwenc_model *m, int r, qwenc_gpu_info *out) {
    memset(out, 0, sizeof(*out));
    out->device = -1;
    if (strcmp(m->backend_name, "cuda")) return;
    size_t f = 0, t = 0, w = 0;
    qw_backend_cuda_rank_info(m->be, r, &out->device, &f, &t, &w, &out->first_layer, &out->n_layers);
    out->free_bytes = f, out->total_bytes = t, out->weight_bytes = w;
}

double qwenc_model_gpu_exchange_us(const qwenc_model *m, int n_tok) {
    if (strcmp(m->backend_name, "cuda")) return 0;
    int moe = 0;
    for (int l = 0; l < m->hp.n_layer; l++) moe += m->layers[l].moe;
    return moe ? qw_backend_cuda_exchange_us(m->be, n_tok, m->hp.n_embd, m->hp.n_expert_used, moe) : 0;
}

int qwenc_model_n_threads(const qwenc_model *m) {
    return strcmp(m->backend_name, "cuda") ? qw_backend_cpu_n_threads(m->be) : 1;
}

/* ---- qwenc info: parameters per component, by tensor-name pattern ---- */

typedef struct {
    const char *label;
    int64_t params;
    int n_tensors;
    int64_t by_type[QW_TYPE_COUNT];
} info_bucket;

static int info_bucket_of(const char *name) {
    static const char *pats[] = {
        /* order matters: the first match wins */
        "mtp.", "model.visual.", ".mlp.experts.", ".mlp.shared_expert", ".mlp.gate.", ".mlp.", ".linear_attn.",
        ".self_attn.indexer.", ".self_attn.", "ple.ple_embedding.", ".ple.", "hyper_connection", "embed_tokens",
        "lm_head", "norm",
    };
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++)
        if (strstr(name, pats[i])) return (int)i;
    return (int)(sizeof(pats) / sizeof(pats[0]));
}

/* The same buckets for llama.cpp's GGUF names (models/gguf_map.c); blocks past n_layer are the MTP head. */
static int info_bucket_of_gguf(const char *name, int n_layer) {
    static const struct {
        const char *pat;
        int bucket;
    } pats[] = {
        /* order matters: the first match wins */
        {"_exps.", 2}, {"_shexp.", 3}, {"ffn_gate_inp.", 4}, {"attn_norm.", 14}, {"post_attention_norm.", 14},
        {"ffn_norm.", 14}, {"output_norm.", 14}, {"ffn_", 5}, {"ssm_", 6}, {"attn_qkv.", 6}, {"attn_gate.", 6},
        {"indexer.", 7}, {"attn_", 8}, {"per_layer_token_embd.", 9}, {"ple_token_embd.", 9}, {"ple_", 10},
        {"hc_", 11}, {"token_embd.", 12}, {"output.", 13},
    };
    int il = -1;
    if (sscanf(name, "blk.%d.", &il) == 1 && il >= n_layer) return 0;
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++)
        if (strstr(name, pats[i].pat)) return pats[i].bucket;
    return 15;
}

static void print_count(FILE *f, int64_t n) {
    if (n >= 1000000000)
        fprintf(f, "%8.2fB", n / 1e9);
    else if (n >= 1000000)
        fprintf(f, "%8.2fM", n / 1e6);
    else if (n >= 1000)
        fprintf(f, "%8.2fK", n / 1e3);
    else
        fprintf(f, "%9lld", (long long)n);
}

void qwenc_model_print_info(const qwenc_model *m, FILE *f) {
    const qw_hparams *hp = &m->hp;
    fprintf(f, "model        %s\n", m->path);
    fprintf(f, "architecture %s (config model_type \"%s\")\n", qw_arch_name(hp->arch), hp->model_type);
    if (m->gguf)
        fprintf(f, "files        GGUF v%u, %lld tensors (llama.cpp architecture \"%s\")\n", m->gguf->version,
                (long long)m->gguf->n_tensors, hp->model_type);
    else if (m->ws.n_files)
        fprintf(f, "files        %d safetensors file%s, %d tensors, prefix \"%s\"\n", m->ws.n_files,
                m->ws.n_files == 1 ? "" : "s", m->ws.n_entries, m->prefix);
    else
        fprintf(f, "files        none: random weights made in %s memory\n", m->conv && m->conv->keys ? "device" : "host");
    if (m->gguf_note[0]) fprintf(f, "note         %s\n", m->gguf_note);
    if (m->conv && !m->ws.n_files && !m->gguf)
        fprintf(f, "types        the tensors of qwenc synth --type %s: %d tensors, %.1f MiB\n", m->conv->type,
                m->conv->n_tensors, (double)m->conv->n_bytes / 1048576.0);
    else if (m->conv)
        fprintf(f, "quantized    at load to %s (the tensors of qwenc quantize --type %s): %d tensors, %.1f MiB\n",
                m->conv->type, m->conv->type, m->conv->n_tensors, (double)m->conv->n_bytes / 1048576.0);
    fprintf(f, "vocab        %d   hidden %d   layers %d   context %d\n", hp->n_vocab, hp->n_embd, hp->n_layer,
            hp->n_ctx_train);
    fprintf(f, "attention    %d heads, %d kv heads, head dim %d, rotary dims %d, theta %g%s\n", hp->n_head,
            hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta,
            hp->rope_type == QW_ROPE_LLAMA3   ? ", llama3 scaling"
            : hp->rope_type == QW_ROPE_LINEAR ? ", linear scaling"
                                              : "");
    if (qw_arch_has(hp->arch, QW_AF_GDN))
        fprintf(f, "deltanet     %d key heads x %d, %d value heads x %d, conv %d, output gate %s\n", hp->gdn_hk,
                hp->gdn_dk, hp->gdn_hv, hp->gdn_dv, hp->gdn_conv_k, hp->gdn_gate_sigmoid ? "sigmoid" : "silu");
    if (hp->n_expert)
        fprintf(f, "moe          %d experts, top %d, expert width %d, shared expert width %d%s\n", hp->n_expert,
                hp->n_expert_used, hp->n_ff_exp, hp->n_ff_shexp, hp->norm_topk_prob ? ", renormalised" : "");
    if (hp->n_ff) fprintf(f, "mlp          width %d\n", hp->n_ff);
    if (qw_arch_has(hp->arch, QW_AF_HC))
        fprintf(f, "streams      %d hyper-connection streams, low rank %d\n", hp->hc_count, hp->hc_lowrank);
    if (hp->idx_budget)
        fprintf(f, "qsa          indexer %d heads x %d, budget %d tokens in blocks of %d (top %d blocks)\n",
                hp->idx_n_head, hp->idx_head_dim, hp->idx_budget, hp->idx_ratio, hp->idx_budget / hp->idx_ratio);
    for (int i = 0; i < hp->n_ple; i++) {
        const qw_ple_w *w = m->layers[hp->ple_layers[i]].ple;
        fprintf(f, "ple          layer %d: %d-grams, %d heads x %d dims, %lld table rows in %d piece%s\n",
                hp->ple_layers[i], hp->ngram_n, hp->ngram_heads, hp->ple_dim / hp->ngram_heads, (long long)w->n_rows,
                w->n_chunks, w->n_chunks == 1 ? "" : "s");
    }
    fprintf(f, "layer plan   ");
    for (int l = 0; l < hp->n_layer; l++) {
        const qw_layer *L = &m->layers[l];
        char c = L->kind == QW_LAYER_GDN ? 'D' : L->kind == QW_LAYER_QSA ? 'S' : 'A';
        fprintf(f, "%c%s%s", c, L->ple ? "+ple" : "", hp->n_expert && !L->moe ? "+mlp" : "");
    }
    fprintf(f, "\n             (A attention, D Gated DeltaNet, S QSA sparse attention)\n");
    if (hp->n_mtp) {
        const qw_layer *L = &m->layers[hp->n_layer];
        fprintf(f, "draft head   MTP, one %s layer%s (speculative decoding: --draft)\n",
                L->kind == QW_LAYER_QSA ? "QSA" : "attention", L->moe ? " with MoE" : "");
    } else if (m->n_mtp_tensors) {
        fprintf(f, "draft head   %d MTP tensors not loaded%s\n", m->n_mtp_tensors,
                m->params.no_draft_head ? " (--no-mtp)" : " (the head's layer is missing)");
    }

    enum { NB = 16 };
    static const char *labels[NB] = {
        "mtp draft head", "vision (ignored)", "routed experts", "shared experts", "routers", "mlp",
        "deltanet", "qsa indexer", "attention", "ple n-gram table", "ple gating", "hyper-connections",
        "embeddings", "lm_head", "norms", "other",
    };
    info_bucket bk[NB];
    memset(bk, 0, sizeof(bk));
    int64_t total = 0;
    /* the tensors of the file, or those converted at load and the file's that were not converted */
    int n_file = m->gguf ? (int)m->gguf->n_tensors : m->ws.n_entries, n_conv = m->conv ? m->conv->n_tensors : 0;
    for (int i = 0; i < n_conv + n_file; i++) {
        const qw_tensor *t = i < n_conv ? &m->conv->tensors[i]
                             : m->gguf ? &m->gguf->tensors[i - n_conv].t
                                       : &m->ws.entries[i - n_conv].t;
        int k = i < n_conv || m->gguf ? info_bucket_of_gguf(t->name, hp->n_layer) : info_bucket_of(t->name);
        if (i >= n_conv && n_conv && (k > 1 || (k == 0 && hp->n_mtp))) continue;
        int64_t n = qw_tensor_nelem(t);
        bk[k].params += n;
        bk[k].n_tensors++;
        bk[k].by_type[t->type] += n;
        if (k > 1) total += n;
    }
    if (hp->tie_embd && m->output == m->tok_embd) fprintf(f, "lm_head      tied to embed_tokens\n");
    fprintf(f, "parameters   (tensors, parameters, dtypes)\n");
    for (int k = 0; k < NB; k++) {
        if (!bk[k].n_tensors) continue;
        fprintf(f, "  %-18s %6d ", labels[k], bk[k].n_tensors);
        print_count(f, bk[k].params);
        fprintf(f, "  ");
        for (int t = 0; t < QW_TYPE_COUNT; t++)
            if (bk[k].by_type[t]) fprintf(f, " %s", qw_type_name((qw_type)t));
        fprintf(f, "\n");
    }
    fprintf(f, "  %-18s %6s ", "total (text model)", "");
    print_count(f, total);
    fprintf(f, "\n");
}
