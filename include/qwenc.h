/*
 * qwenc.h - the public interface of the qwenc inference library.
 *
 * qwenc runs the Qwen hybrid model family (Qwen3.8-Flash-Next `qwen4_exp`, Qwen3.5 dense and MoE,
 * Qwen3-Next, Qwen3) and Llama 3 from the checkpoints users already have, giving the logits that the
 * Hugging Face transformers reference gives.
 *
 * Objects:
 *   qwenc_model    weights (memory-mapped from the checkpoint files, or quantized into memory at load) and
 *                  hyper-parameters; read-only after load, so one model may be shared by any number of sessions
 *                  and threads.
 *   qwenc_session  all per-sequence state: attention KV cache, DeltaNet conv + recurrent state, PLE
 *                  history, QSA indexer keys. A session is used by one thread at a time.
 *
 * Errors: every fallible call returns a qwenc_status and, when `err` is not NULL, writes a one-line
 * message of at most `errlen` bytes that names the file, tensor or field at fault. The library never
 * exits the process and never prints, except where a function says it writes to a FILE.
 */
#ifndef QWENC_H
#define QWENC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    QWENC_OK = 0,
    QWENC_ERR_IO,          /* a file could not be opened, read or mapped */
    QWENC_ERR_FORMAT,      /* a file is malformed: bad JSON, truncated safetensors, wrong shape */
    QWENC_ERR_UNSUPPORTED, /* well-formed but not something qwenc runs (unknown model_type, dtype) */
    QWENC_ERR_ARG,         /* bad argument from the caller (token id out of range, ...) */
    QWENC_ERR_NOMEM,       /* an allocation failed */
    QWENC_ERR_CONTEXT      /* the session's context is full */
} qwenc_status;

typedef struct qwenc_model qwenc_model;
typedef struct qwenc_session qwenc_session;

/* The version of this header, "MAJOR.MINOR.PATCH"; qwenc_version() gives the library's (the same when the
 * library was built with this header). */
#define QWENC_VERSION "0.1.0"
const char *qwenc_version(void);

/* A short name of a status, e.g. "format error". */
const char *qwenc_status_str(qwenc_status st);

typedef struct {
    int n_threads;       /* CPU threads for the forward (0: one per online core) */
    const char *kernels; /* CPU kernel variant: NULL or "auto" (the best this CPU runs), "amx", "avx512",
                          * "avx2", "neon", "scalar", or "ref" (the scalar reference, one thread: the oracle,
                          * slow) */
    const char *quant;   /* NULL: the tensor types of the file. Else a type of qwenc_gguf_types() ("Q8_0", "Q4_K",
                          * ...): the weights are converted at load, on n_threads threads, into the tensors
                          * qwenc_model_save_gguf would write at that type (the same per-tensor types, the same
                          * bytes, so the same logits) and held in memory; the mapped file's pages are released as
                          * each tensor is done. A .gguf is requantized the same way. */
    /* Called during that conversion after each batch of rows, with the arguments of qwenc_gguf_params.progress;
     * a non-zero return cancels the load (QWENC_ERR_ARG). NULL: not called. */
    int (*progress)(const char *tensor, const char *type, int i_tensor, int n_tensors, uint64_t bytes_done,
                    uint64_t bytes_total, void *user);
    void *progress_user;
    /* Quantized weights meet the activations: 0 (default) rounded once per matmul to 8 bits per block of 32, in
     * integer dot products, as llama.cpp does (faster; about 0.1 % on perplexity); 1: in f32, the exact product
     * of the dequantized weights (slower). Float weights (F32/F16/BF16) always meet f32 activations. */
    int f32_activations;
    /* Where the model runs: NULL or "auto" (the GPU when qwenc is built with the CUDA backend, a device is
     * there and the weights fit in its free memory; else the CPU), "cpu", "cuda" (an error without one), or
     * "cpu-guard": the CPU backend with every activation and state buffer inaccessible outside its own calls,
     * so engine code that touched one would fault (a test mode; slower). */
    const char *backend;
    /* The GPUs the routed experts spread over (with backend "cuda" or "auto"): NULL or "" one GPU (device 0);
     * "N": devices 0 .. N-1; or a list of device ids ("0,1,3"). Each GPU holds and runs a contiguous range of every
     * MoE layer's experts, equal ranges unless the first (which also runs the rest of the model) would then be more
     * than nine tenths full: then it takes what fits and the others share the rest. Each MoE layer
     * sends x and the routing to the others and adds their experts' rows into the first's (NCCL), so the logits are
     * one GPU's bits. A device listed twice makes ranks that share it (their exchanges are device copies: the split
     * tested on one GPU). Models without routed experts run on the first GPU alone. */
    const char *gpus;
    /* How params.gpus divides the model: NULL, "" or "expert" (above: the routed experts spread), or "layer": each GPU
     * holds and runs a contiguous range of the layers (weights, KV cache and recurrent state), about an equal share
     * of the bytes, the first also the embeddings, the n-gram table and the head; a step's work passes from GPU to
     * GPU, whose kernels read and write the activations in the first's memory (peer access, needed between them).
     * One GPU's bits. For any architecture, dense ones included. */
    const char *split;
    /* 1: leave the checkpoint's MTP draft head (mtp.*, a GGUF's nextn block) unloaded: no memory for it, and
     * speculative decoding drafts by prompt lookup only. 0 (default): load it when the file has one. */
    int no_draft_head;
} qwenc_model_params;

qwenc_model_params qwenc_model_default_params(void);

/* Load a model from a Hugging Face checkpoint directory (config.json + *.safetensors) or from a llama.cpp
 * GGUF file (architectures llama, qwen3, qwen35, qwen35moe, qwen3next, qwen4exp; docs/GGUF.md). */
qwenc_status qwenc_model_load(const char *path, qwenc_model **out, char *err, size_t errlen);
qwenc_status qwenc_model_load_params(const char *path, const qwenc_model_params *params, qwenc_model **out,
                                     char *err, size_t errlen);
void qwenc_model_free(qwenc_model *model);

int qwenc_model_n_vocab(const qwenc_model *model);
/* 1 when the model's MTP draft head is loaded (qwenc_session_draft_head). */
int qwenc_model_has_draft_head(const qwenc_model *model);
int qwenc_model_n_ctx_train(const qwenc_model *model);
/* The architecture name ("qwen4_exp", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3", "llama"). */
const char *qwenc_model_arch(const qwenc_model *model);
/* Write a human-readable description to f: architecture, layer plan, parameters per component, dtypes. */
void qwenc_model_print_info(const qwenc_model *model, FILE *f);
/* The CPU kernel variant the model runs with ("amx", "avx512", "avx2", "neon", "scalar", "ref") and its thread
 * count. */
const char *qwenc_model_kernels(const qwenc_model *model);
/* The backend the model runs on ("cpu", "cuda", "cpu-guard"). */
const char *qwenc_model_backend(const qwenc_model *model);
int qwenc_model_n_threads(const qwenc_model *model);
/*
 * Bytes of weights: *total, every tensor the text model uses; *per_token, those one decoded token reads:
 * every matrix of every layer and the lm_head, one embedding row, n_expert_used / n_expert of the routed
 * experts of each MoE layer (what any routing reads on average), and the PLE table rows of the token.
 * Not counted: the f32 norm and convolution vectors (a few KiB), the KV cache and the recurrent state.
 */
void qwenc_model_weight_bytes(const qwenc_model *model, int64_t *total, int64_t *per_token);

/* The device a model runs on, for a GPU backend: its name, free and total memory, and (when measure_bw is set: a
 * read kernel over 2 GiB, about a second) its memory's read bandwidth in bytes/s. On the CPU everything is 0 and
 * the name empty (the caller measures the host's memory itself, as qwenc bench does). */
typedef struct {
    char name[160];
    uint64_t free_bytes, total_bytes;
    double read_bw;
    uint64_t host_table_bytes; /* the n-gram table (PLE) read from pinned host memory: it did not fit (else 0) */
} qwenc_device_info;
void qwenc_model_device_info(const qwenc_model *model, int measure_bw, qwenc_device_info *out);
/* The GPUs a model runs on (params.gpus; 1 without a split, 0 on the CPU) and GPU r's device id, free and total
 * memory, and the bytes of weights it holds. */
int qwenc_model_n_gpus(const qwenc_model *model);
typedef struct {
    int device;
    uint64_t free_bytes, total_bytes, weight_bytes;
    int first_layer, n_layers; /* split "layer": the layers it runs (the last may be the MTP head's); else 0, 0 */
} qwenc_gpu_info;
void qwenc_model_gpu_info(const qwenc_model *model, int r, qwenc_gpu_info *out);
/* Microseconds that the exchanges between the GPUs take in a step of n_tok tokens (every MoE layer's: x and the
 * routing out, the experts' rows back), timed alone; 0 without a split. */
double qwenc_model_gpu_exchange_us(const qwenc_model *model, int n_tok);

/* ---- writing GGUF (qwenc quantize) ---- */
typedef struct {
    const char *type; /* tensor type as llama-quantize names it: "F32", "F16", "BF16", "Q8_0", "Q4_K" (= Q4_K_M),
                       * ... (qwenc_gguf_types); fragile tensors keep F32 or at least Q8_0 (docs/GGUF.md) */
    int n_threads;    /* quantizing threads (0: one per online core) */
    /* Called after each batch of rows is written; a non-zero return cancels (the partial file is removed). */
    int (*progress)(const char *tensor, const char *type, int i_tensor, int n_tensors, uint64_t bytes_done,
                    uint64_t bytes_total, void *user);
    void *user;
} qwenc_gguf_params;

qwenc_gguf_params qwenc_gguf_default_params(void);
/* The accepted type names, for messages. */
const char *qwenc_gguf_types(void);
/* Write the model as the GGUF llama.cpp's converter (+ llama-quantize) would write: its architecture,
 * metadata, tensor names, transformations and tensor types; streamed tensor by tensor. The model may have
 * been loaded from a checkpoint directory or from another GGUF (not the file being written). The file is
 * written as PATH.tmp.PID.N beside path and renamed to path once complete: path never holds a partial file,
 * and on error or cancel the temporary file is removed (so does qwenc_synth_gguf). */
qwenc_status qwenc_model_save_gguf(const qwenc_model *model, const char *path, const qwenc_gguf_params *params,
                                   char *err, size_t errlen);

/* ---- random models (qwenc synth) ---- */
typedef struct {
    const char *preset;  /* "flash-next" (qwen4exp) or "qwen3.5-35b-a3b" (qwen35moe): the released shapes */
    const char *arch;    /* NULL, or the preset's architecture (llama.cpp's or transformers' name) as a check */
    int n_layer;         /* 0: the preset's; else the first n_layer layers of its pattern (>= one attention) */
    int n_expert;        /* 0: the preset's; else this many experts (top-k capped at it) */
    int n_embd, n_vocab; /* 0: the preset's hidden size / vocabulary (smaller for tests) */
    long long ngram_base; /* 0: the preset's PLE ngram_vocab_size_base (flash-next: 2e7) */
    int mtp;             /* 1: with a random MTP draft head (the released shapes: one layer after the last) */
    unsigned long long seed;
} qwenc_synth_params;

qwenc_synth_params qwenc_synth_default_params(void);
/* The preset names, for messages. */
const char *qwenc_synth_presets(void);
/* Write a model with random weights (deterministic from the seed) at the preset's geometry as GGUF, with the
 * tensor types of params->type as qwenc_model_save_gguf chooses them. Each tensor is generated and quantized
 * batch by batch: memory use does not grow with the model. */
qwenc_status qwenc_synth_gguf(const qwenc_synth_params *sp, const char *path, const qwenc_gguf_params *params,
                              char *err, size_t errlen);
/* The same model held in memory, without a file, at the tensor types `qwenc synth --type type` writes
 * (params: as for qwenc_model_load_params; its quant is ignored, progress is called as the tensors are made).
 * On the CPU the weights are the bytes that file would hold (the same logits). On a GPU (params->backend "cuda",
 * or "auto" with a device where the weights fit in nine tenths of its free memory) the matrices are made in
 * device memory only, as random codes with scales of the same magnitude (the same bytes per token to read, not
 * the file's values): a model larger than the host's memory or disk can be measured (qwenc bench --synth). */
qwenc_status qwenc_model_synth(const qwenc_synth_params *sp, const char *type, const qwenc_model_params *params,
                               qwenc_model **out, char *err, size_t errlen);

typedef struct {
    int n_ctx;   /* maximum number of tokens the session holds (0: the model's training context, capped) */
    int n_batch; /* largest number of tokens one internal forward step processes; longer inputs are split;
                  * 0: 512; larger than 65536 counts as 65536 */
    int draft_head; /* 1: keep the caches of the model's MTP draft head, for qwenc_session_draft_head: the head then
                     * runs over every fed token (one more layer per token); ignored for a model without one */
} qwenc_session_params;

qwenc_session_params qwenc_session_default_params(void);

qwenc_status qwenc_session_init(const qwenc_model *model, const qwenc_session_params *params,
                                qwenc_session **out, char *err, size_t errlen);
void qwenc_session_free(qwenc_session *session);
/* Forget every token: the session is as new. */
void qwenc_session_reset(qwenc_session *session);
/* Number of tokens already fed to the session. */
int qwenc_session_n_past(const qwenc_session *session);
int qwenc_session_n_ctx(const qwenc_session *session);

/*
 * Feed n_tokens tokens that follow the ones already in the session. Any split of a sequence into calls
 * gives the same logits (up to f32 rounding). If logits is not NULL it receives, row by row, the
 * n_vocab logits of every fed position when logits_all is non-zero ([n_tokens][n_vocab]), else only
 * those of the last position ([n_vocab]). On error the session is left as before the call, except after
 * QWENC_ERR_NOMEM from inside a step: the session then answers QWENC_ERR_ARG until qwenc_session_reset.
 */
qwenc_status qwenc_session_forward(qwenc_session *session, const int32_t *tokens, int n_tokens,
                                   float *logits, int logits_all, char *err, size_t errlen);

/* The same as qwenc_session_forward without the logits: *best receives the arg max of the last position's logits
 * (the lowest id on ties), chosen where the model runs, so the logits never leave a GPU (greedy decoding). */
qwenc_status qwenc_session_forward_argmax(qwenc_session *session, const int32_t *tokens, int n_tokens, int32_t *best,
                                          char *err, size_t errlen);

#define QWENC_MAX_TOPK 64
/* The same as qwenc_session_forward without the logits: the k (1 .. QWENC_MAX_TOPK, at most n_vocab) largest logits
 * of the last position, largest first and the lower id first among equal values, into ids[k] and logits[k],
 * chosen where the model runs: from a GPU 8 k bytes come back instead of the n_vocab logits (sampling:
 * qwenc_sampler_top_k, qwenc_sampler_sample_top). */
qwenc_status qwenc_session_forward_topk(qwenc_session *session, const int32_t *tokens, int n_tokens, int k,
                                        int32_t *ids, float *logits, char *err, size_t errlen);
/* The whole logits[n_vocab] of the last position of the last qwenc_session_forward_topk call (QWENC_ERR_ARG when
 * another forward, a reset or a restore came after it): for the rare draw its top k cannot decide. */
qwenc_status qwenc_session_last_logits(qwenc_session *session, float *logits, char *err, size_t errlen);

/*
 * One decode step of several sessions of the same model: session i is fed tokens[i] (after its own past) and,
 * when logits is not NULL, its next logits go to logits + i * n_vocab. Each session's result is the one
 * qwenc_session_forward would give it. On error, the sessions before the failing one have taken their token.
 */
qwenc_status qwenc_session_forward_batch(qwenc_session *const *sessions, const int32_t *tokens, int n, float *logits,
                                         char *err, size_t errlen);

/* ---- speculative decoding: a step whose tokens can be taken back (drafts the model verifies).
 * qwenc_session_forward_draft feeds n_tokens (1 to QWENC_MAX_DRAFT + 1, within n_batch) and gives the logits of
 * every one, [n_tokens][n_vocab], each the bits qwenc_session_forward would give feeding the tokens one at a time.
 * qwenc_session_accept(session, n_keep) then leaves the session exactly as if only the first n_keep of them had
 * been fed (0 <= n_keep <= n_tokens): the caches by position, the DeltaNet conv and recurrent states and the PLE
 * history from what the step kept in backend memory (the recurrence of the kept tokens runs again; no weight is
 * read, nothing is copied to the host). Between the two calls every other step, snapshot or restore of the
 * session is refused; qwenc_session_reset drops the draft. The first draft step allocates that memory: about the
 * DeltaNet recurrent states once more, plus the layers' inputs of QWENC_MAX_DRAFT + 1 tokens. */
#define QWENC_MAX_DRAFT 15
qwenc_status qwenc_session_forward_draft(qwenc_session *session, const int32_t *tokens, int n_tokens, float *logits,
                                         char *err, size_t errlen);
qwenc_status qwenc_session_accept(qwenc_session *session, int n_keep, char *err, size_t errlen);

/* ---- the model's MTP draft head (a session made with params.draft_head on a model that has one).
 * The j-th call since the last token was fed (by qwenc_session_forward, or qwenc_session_accept) runs the head
 * at position n_past - 1 + j: it reads `token`, the token after that position (the first call: the token the
 * model's last logits gave; later calls: the previous call's draft), and the main model's hidden at n_past - 1
 * (the first call) or the head's own output of the previous call, and gives the draft logits [n_vocab] of the
 * position after and their arg max. At most QWENC_MAX_DRAFT calls in a row, within the context. The head's caches of the positions
 * that are later fed are rewritten from the main model's hidden as they are fed (so drafts never change what the
 * model computes, only how many tokens a draft step keeps). */
int qwenc_session_has_draft_head(const qwenc_session *session);
/* logits: the draft logits (NULL: not wanted); best: the largest one's id, the lowest on ties (NULL: not wanted),
 * chosen where the model runs, so a greedy chain of drafts never brings the logits to the host. */
qwenc_status qwenc_session_draft_head(qwenc_session *session, int32_t token, float *logits, int32_t *best,
                                      char *err, size_t errlen);
/* n head steps from `token`, each reading the previous one's arg max: the head's greedy chain of drafts
 * (drafts[0..n)), as speculative decoding takes them. */
qwenc_status qwenc_session_draft_greedy(qwenc_session *session, int32_t token, int n, int32_t *drafts, char *err,
                                        size_t errlen);

/* ---- snapshots: the exact state of a session at a point (every cache row and recurrent state its tokens
 * left, and its position), restored later into a session of the same model whose context holds as many tokens:
 * decoding then goes on exactly as from the snapshot's point (prefix reuse, speculative decoding). Kept in host
 * memory; a snapshot of n tokens costs about the KV cache of n tokens plus the recurrent states. */
typedef struct qwenc_snapshot qwenc_snapshot;
qwenc_status qwenc_session_snapshot(const qwenc_session *session, qwenc_snapshot **out, char *err, size_t errlen);
qwenc_status qwenc_session_restore(qwenc_session *session, const qwenc_snapshot *snap, char *err, size_t errlen);
int qwenc_snapshot_n_past(const qwenc_snapshot *snap);
size_t qwenc_snapshot_bytes(const qwenc_snapshot *snap);
void qwenc_snapshot_free(qwenc_snapshot *snap);

/* ---- profiling (qwenc bench --profile) ----
 * Where a session's forward steps spend their time, op by op: each op of the model's op table timed as the
 * forward waits for it (its threads included), matmuls counted per weight tensor. The logits are unchanged;
 * the timing costs two clock reads per op. */
typedef struct {
    const char *name; /* the op ("attention", "delta_rule", ...), "matmul TYPE NAME" per weight tensor with
                       * layer and expert numbers folded to '#' ("matmul q8_0 blk.#.ffn_down_exps.weight"), or
                       * "between ops (the model's own code)": the steps' wall time less the ops'. Valid until
                       * the next qwenc_session_profile call. */
    int64_t calls;    /* per step for "between ops" */
    double seconds;   /* a matmul_batch's time is shared among its jobs by their bytes */
    int64_t bytes;    /* bytes of weights the matmuls read (a tensor once per call); 0 for the other ops */
} qwenc_profile_entry;

typedef struct {
    double seconds;       /* wall time of the forward steps */
    int64_t tokens, steps;
} qwenc_profile_totals;

/* on != 0: time the session's forward steps from now on, the counts at zero (again if already on); 0: stop
 * and drop the counts. Fails only for lack of memory. */
qwenc_status qwenc_session_profile(qwenc_session *session, int on, char *err, size_t errlen);
/* Copies up to max entries, slowest first, and the totals; returns the number of entries there are (0 when
 * the session is not profiling). */
int qwenc_session_profile_read(const qwenc_session *session, qwenc_profile_entry *out, int max,
                               qwenc_profile_totals *totals);

/* ---- sampling ----
 * Order of the steps (as transformers' logits processors): repetition penalty, frequency and presence
 * penalties, temperature, top-k, top-p, min-p, then a draw from the remaining distribution.
 * temperature 0 is greedy (argmax; equal logits: the lowest id). The same seed gives the same draws. */
typedef struct {
    float temperature;       /* 0: greedy; default 0.8 */
    int top_k;               /* 0: off; default 40 */
    float top_p;             /* 1: off; default 0.95 */
    float min_p;             /* 0: off; default 0.05 */
    float repeat_penalty;    /* 1: off; logit / p if > 0 else logit * p, for tokens of the last repeat_last_n */
    int repeat_last_n;       /* default 64; -1: the whole history */
    float frequency_penalty; /* 0: off; logit -= f * count (OpenAI semantics) */
    float presence_penalty;  /* 0: off; logit -= p if count > 0 */
    uint64_t seed;
} qwenc_sampler_params;

typedef struct qwenc_sampler qwenc_sampler;

qwenc_sampler_params qwenc_sampler_default_params(void);
qwenc_status qwenc_sampler_init(const qwenc_sampler_params *params, int n_vocab, qwenc_sampler **out, char *err,
                                size_t errlen);
void qwenc_sampler_free(qwenc_sampler *sampler);
/* Forget the token history and restart the random sequence from the seed. */
void qwenc_sampler_reset(qwenc_sampler *sampler);
/* Add a token to the history the penalties look at (prompt tokens too, if they should count). */
void qwenc_sampler_accept(qwenc_sampler *sampler, int32_t token);
/* Choose the next token from n_vocab logits (not modified). */
int32_t qwenc_sampler_sample(qwenc_sampler *sampler, const float *logits);
/* 1 when qwenc_sampler_sample is the arg max of the logits as given (temperature 0 and no penalty): a caller may
 * then take the arg max where the model runs (qwenc_session_forward_argmax). */
int qwenc_sampler_is_greedy(const qwenc_sampler *sampler);
/* When a draw needs only the largest logits (temperature > 0, top_k > 0, no penalty): how many to give
 * qwenc_sampler_sample_top (top_k + 1, at most QWENC_MAX_TOPK; a caller takes them where the model runs,
 * qwenc_session_forward_topk); else 0. */
int qwenc_sampler_top_k(const qwenc_sampler *sampler);
/* The token qwenc_sampler_sample would choose from the whole logits, given their n = qwenc_sampler_top_k largest
 * (largest first, the lower id first among equal values) as ids and logits; the same draw from the same random
 * stream. -1 when these cannot decide (the top_k-th and the next are equal once divided by the temperature; then
 * nothing is drawn and the whole logits are needed: qwenc_session_last_logits). */
int32_t qwenc_sampler_sample_top(qwenc_sampler *sampler, const int32_t *ids, const float *logits, int n);
/* The distribution qwenc_sampler_sample draws from for these logits (after the penalties, temperature, top-k,
 * top-p and min-p), as n_vocab probabilities summing to 1 (greedy: 1 at the arg max); nothing is drawn. probs
 * may be logits. */
void qwenc_sampler_probs(qwenc_sampler *sampler, const float *logits, float *probs);
/* A draw from n_vocab non-negative weights (not all zero) with the sampler's random stream. */
int32_t qwenc_sampler_draw(qwenc_sampler *sampler, const float *probs);
/* Speculative sampling: `draft` was drawn from the distribution q [n_vocab]; the next token is the draft with
 * probability min(1, p(draft) / q(draft)) (*accepted = 1), else a draw from max(0, p - q) normalised, where p is
 * qwenc_sampler_probs of logits. Over the draft's draw, the token has the distribution p. */
int32_t qwenc_sampler_verify(qwenc_sampler *sampler, const float *logits, const float *q, int32_t draft,
                             int *accepted);

/* ---- generation ---- */
typedef enum {
    QWENC_STOP_NONE = 0,
    QWENC_STOP_EOS,      /* an end-of-sequence token was sampled */
    QWENC_STOP_STRING,   /* the text reached one of the stop strings */
    QWENC_STOP_LIMIT,    /* n_predict tokens were generated */
    QWENC_STOP_CONTEXT,  /* the session's context is full */
    QWENC_STOP_CALLER    /* the text callback asked to stop */
} qwenc_stop_reason;

const char *qwenc_stop_reason_str(qwenc_stop_reason r);

typedef struct {
    int n_predict;              /* most tokens to generate; -1: until the context is full; 0: none (the prompt
                                 * is fed, nothing is sampled) */
    const int32_t *eos;         /* stop ids (e.g. from qwenc_tokenizer_eos) */
    int n_eos;
    const char *const *stop;    /* stop strings: generation ends before the first occurrence */
    int n_stop;
    int skip_special;           /* leave special tokens out of the text */
    int n_draft;                /* speculative decoding: up to n_draft tokens (at most QWENC_MAX_DRAFT) drafted per
                                 * step (see draft_src) and verified by one draft step of the model; each position
                                 * is sampled as without drafting, so the tokens are the same (greedy or sampled,
                                 * for a given seed). 0: off; QWENC_DRAFT_AUTO: up to 8, each draft position used
                                 * while at least half its drafts are accepted */
    int draft_src;              /* where drafts come from: QWENC_DRAFT_SRC_AUTO (0: the model's MTP draft head when
                                 * the session keeps it, else prompt lookup), _LOOKUP (what followed the last
                                 * occurrence of the last tokens), _HEAD (the head's greedy chain; an error without
                                 * one) */
    int draft_sample;           /* with drafts from the head: 1 draws each draft from the head's distribution (the
                                 * sampler's steps applied to its logits) and keeps it by the speculative-sampling
                                 * rule (qwenc_sampler_verify): the text has the distribution of sampling without
                                 * drafts, but is not the same text for a seed; 0 (default): the head's greedy
                                 * drafts, each position sampled as without drafting (the same text). Greedy
                                 * decoding gives the same text either way. */
} qwenc_gen_params;
#define QWENC_DRAFT_AUTO (-1)
enum { QWENC_DRAFT_SRC_AUTO = 0, QWENC_DRAFT_SRC_LOOKUP = 1, QWENC_DRAFT_SRC_HEAD = 2 };

/* The prompt-lookup drafter qwenc_generate uses: up to k tokens (into out) that followed the latest earlier
 * occurrence of the last 3, 2 or 1 tokens of hist[0..n) (the longest that occurs). Returns how many. */
int qwenc_draft_lookup(const int32_t *hist, int n, int k, int32_t *out);

/* Receives the generated text as it becomes printable (whole UTF-8 characters, nothing that may still
 * turn out to begin a stop string). Return non-zero to stop. */
typedef int (*qwenc_text_fn)(const char *text, size_t len, void *user);

typedef struct {
    qwenc_stop_reason reason;
    int n_prompt, n_gen;         /* tokens fed from the prompt, tokens generated */
    double prompt_s, gen_s;      /* seconds spent on each */
    int32_t unfed;               /* the last sampled token, not yet fed to the session (-1 if none) */
    /* with n_draft: model steps while generating, tokens drafted and accepted, and per draft position (the i-th
     * token of a draft) how often it was drafted and accepted */
    int n_steps, n_drafted, n_accepted;
    int drafted_at[QWENC_MAX_DRAFT], accepted_at[QWENC_MAX_DRAFT];
} qwenc_gen_result;

struct qwenc_tokenizer;
/* Feed the prompt (at least one token), then sample and feed tokens until a stop condition. The session
 * keeps every fed token; the final sampled token is left unfed (result->unfed) so that a caller may feed
 * it with what follows (the next chat turn). result may be NULL. */
qwenc_status qwenc_generate(qwenc_session *session, const struct qwenc_tokenizer *tok, qwenc_sampler *sampler,
                            const int32_t *prompt, int n_prompt, const qwenc_gen_params *params,
                            qwenc_text_fn on_text, void *user, qwenc_gen_result *result, char *err,
                            size_t errlen);

/* ---- text: tokenizer ---- */
/*
 * A Hugging Face tokenizer.json (BPE models: byte-level as Qwen and Llama 3, or sentencepiece-style with
 * byte fallback), giving the ids that the `tokenizers` library gives; or the tokenizer stored in a llama.cpp
 * GGUF file (tokenizer.ggml.model "gpt2" with a pre-tokenizer qwenc knows: qwen2, qwen35, llama-bpe, gpt-2,
 * default), built as the tokenizer.json it was converted from (docs/GGUF.md). Read-only after load: one
 * tokenizer may be used by any number of threads at once. A qwenc_detok belongs to one thread.
 *
 * Text is bytes. Input that is not valid UTF-8 is read as the `tokenizers` library reads the Python string
 * bytes.decode("utf-8", errors="replace"): each maximal invalid subsequence becomes U+FFFD. Decoded text
 * is made valid UTF-8 the same way (as the library's decode does), so it can always be printed.
 */
typedef struct qwenc_tokenizer qwenc_tokenizer;

/* Load dir/tokenizer.json and, when present, dir/tokenizer_config.json (BOS/EOS, add_bos_token, chat
 * template), dir/generation_config.json and dir/config.json (EOS ids), dir/chat_template.jinja.
 * A path to a file is read as a GGUF and its tokenizer.* metadata loaded (BOS/EOS/EOT ids, add_bos_token,
 * tokenizer.chat_template; stop ids also the end-of-turn tokens llama.cpp stops at, e.g. <|im_end|>); a GGUF
 * without a tokenizer (tokenizer.ggml.model "none" or missing) or with an unknown tokenizer.ggml.pre is an
 * error naming the file. */
qwenc_status qwenc_tokenizer_load(const char *path, qwenc_tokenizer **out, char *err, size_t errlen);
/* The tokenizer of a model path as qwenc_model_load takes it: a directory's tokenizer.json; for a .gguf, its
 * own tokenizer, else (a file written without one) the tokenizer.json of the directory holding it. */
qwenc_status qwenc_tokenizer_load_model(const char *model_path, qwenc_tokenizer **out, char *err, size_t errlen);
void qwenc_tokenizer_free(qwenc_tokenizer *tok);

/* Highest token id + 1, added tokens included. */
int qwenc_tokenizer_n_vocab(const qwenc_tokenizer *tok);

/*
 * Encode len bytes of text into *ids (malloc'd, the caller frees; *n_ids may be 0).
 * add_bos: add the special tokens the tokenizer puts around a sequence (tokenizer_config.json
 * add_bos_token/add_eos_token when given, else the tokenizer.json TemplateProcessing post-processor),
 * as the library's encode(text, add_special_tokens=True).
 * parse_special: recognise special added tokens (<|im_start|>, ...) written in the text; when 0 they are
 * encoded as plain text (the library's encode_special_tokens=True). Non-special added tokens are always
 * recognised.
 */
qwenc_status qwenc_tokenize(const qwenc_tokenizer *tok, const char *text, size_t len, int add_bos,
                            int parse_special, int32_t **ids, int *n_ids, char *err, size_t errlen);

/* s[0..len) as valid UTF-8, malloc'd and NUL-terminated: each maximal part of an ill-formed sequence becomes
 * U+FFFD, as the tokenizer reads text (Python's bytes.decode("utf-8", errors="replace")). NULL when out of
 * memory. */
char *qwenc_utf8_repair(const char *s, size_t len);

/* Decode n ids into *text (malloc'd, NUL-terminated, valid UTF-8; *len without the NUL). skip_special
 * leaves special added tokens out. An id outside [0, n_vocab) is a QWENC_ERR_ARG. */
qwenc_status qwenc_detokenize(const qwenc_tokenizer *tok, const int32_t *ids, int n, int skip_special,
                              char **text, size_t *len, char *err, size_t errlen);

/*
 * Streaming decode: push ids as they are generated and print what comes back. The concatenation of every
 * push and the final flush equals qwenc_detokenize of the same ids; no piece ends inside a UTF-8
 * character (bytes of an incomplete character wait for the next token). *out points to an internal
 * NUL-terminated buffer, valid until the next call on d. Ids outside [0, n_vocab) are ignored.
 */
typedef struct qwenc_detok qwenc_detok;
qwenc_detok *qwenc_detok_new(const qwenc_tokenizer *tok, int skip_special);
size_t qwenc_detok_push(qwenc_detok *d, int32_t id, const char **out);
/* The rest at the end of the text (an incomplete character becomes U+FFFD); d is then as new. */
size_t qwenc_detok_flush(qwenc_detok *d, const char **out);
void qwenc_detok_free(qwenc_detok *d);

/* The BOS id from tokenizer_config.json bos_token (or the post-processor's leading special token when
 * there is no tokenizer_config.json); -1 if none. */
int qwenc_tokenizer_bos(const qwenc_tokenizer *tok);
/* Every stop id, without repeats: tokenizer_config.json eos_token, generation_config.json eos_token_id
 * (int or list), config.json eos_token_id (also under text_config). Returns the count; *ids stays valid
 * while tok lives. */
int qwenc_tokenizer_eos(const qwenc_tokenizer *tok, const int32_t **ids);
/* The bos_token and eos_token strings of tokenizer_config.json, "" if none (for chat templates). */
const char *qwenc_tokenizer_bos_str(const qwenc_tokenizer *tok);
const char *qwenc_tokenizer_eos_str(const qwenc_tokenizer *tok);
/* The chat template: chat_template.jinja if present (as transformers prefers it), else tokenizer_config.json
 * chat_template (a string, or the entry named "default" of a list); NULL if none. */
const char *qwenc_tokenizer_chat_template(const qwenc_tokenizer *tok);
/* The decoded bytes of one token, for display (may be part of a UTF-8 character); "" for an unknown id. */
const char *qwenc_tokenizer_token_text(const qwenc_tokenizer *tok, int32_t id);
/* The id of a token given by its vocabulary string (added tokens too, e.g. "<|im_end|>"); -1 if none. */
int32_t qwenc_tokenizer_token_id(const qwenc_tokenizer *tok, const char *token);
/* 1 if id is a special added token (skipped by skip_special), else 0. */
int qwenc_tokenizer_is_special(const qwenc_tokenizer *tok, int32_t id);

/* ---- text: chat templates ---- */
/*
 * Render a checkpoint's Jinja chat template for an OpenAI-style request body, giving the text that
 * transformers' tokenizer.apply_chat_template(messages, tools=..., tokenize=False, ...) gives, byte for byte.
 *
 * request_json: a JSON object with "messages" (array), optional "tools" (array, or null), and optional
 *   "chat_template_kwargs" (object): extra template variables, e.g. {"date_string": "26 Jul 2024"} or
 *   {"enable_thinking": false}; other members ("model", "temperature"...) are ignored.
 * add_generation_prompt: as in transformers (non-zero: end with the assistant turn's header).
 * enable_thinking: 1 / 0 sets the template variable enable_thinking to true / false, overriding
 *   chat_template_kwargs; -1 leaves it as chat_template_kwargs has it, else undefined.
 * bos_token / eos_token: the tokenizer's special-token strings; NULL leaves the variable undefined, as
 *   transformers does for a tokenizer without one (Qwen has no bos_token).
 * Variables are set in transformers' order: bos_token, eos_token, chat_template_kwargs, enable_thinking,
 *   then messages, tools (null when absent), documents (null), add_generation_prompt.
 *
 * The interpreter is the Jinja2 subset chat templates use (Qwen3, Qwen3.5, Qwen3-Coder, Llama 3.x, ChatML),
 * with transformers' environment: trim_blocks and lstrip_blocks on, tojson as json.dumps with
 * ensure_ascii=False, raise_exception(msg), strftime_now(fmt) (local time), loop controls.
 *
 * On success *out is a malloc'd NUL-terminated string (free() it). Errors, with a message naming the
 * template line: QWENC_ERR_FORMAT for a malformed template or request JSON, QWENC_ERR_UNSUPPORTED for a
 * Jinja construct outside the subset (names the tag, filter, test or method) or a rendering that holds a
 * NUL character, QWENC_ERR_ARG when the template raises for this request (raise_exception, an undefined
 * value used, a type error) or "messages" is empty, as transformers would. Thread-safe: no state is
 * shared between calls.
 */
qwenc_status qwenc_chat_render(const char *template_src, const char *request_json, int add_generation_prompt,
                               int enable_thinking, const char *bos_token, const char *eos_token, char **out,
                               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* QWENC_H */
