/*
 * qwenc.h - the public interface of the qwenc inference library.
 *
 * qwenc runs the Qwen hybrid model family (Qwen3.8-Flash-Next `qwen4_exp`, Qwen3.5 dense and MoE,
 * Qwen3-Next, Qwen3) and Llama 3 from the checkpoints users already have, giving the logits that the
 * Hugging Face transformers reference gives.
 *
 * Objects:
 *   qwenc_model    weights (memory-mapped from the checkpoint files) and hyper-parameters; read-only
 *                  after load, so one model may be shared by any number of sessions and threads.
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

/* A short name of a status, e.g. "format error". */
const char *qwenc_status_str(qwenc_status st);

/* Load a model from a Hugging Face checkpoint directory (config.json + *.safetensors). */
qwenc_status qwenc_model_load(const char *path, qwenc_model **out, char *err, size_t errlen);
void qwenc_model_free(qwenc_model *model);

int qwenc_model_n_vocab(const qwenc_model *model);
int qwenc_model_n_ctx_train(const qwenc_model *model);
/* The architecture name ("qwen4_exp", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3", "llama"). */
const char *qwenc_model_arch(const qwenc_model *model);
/* Write a human-readable description to f: architecture, layer plan, parameters per component, dtypes. */
void qwenc_model_print_info(const qwenc_model *model, FILE *f);

typedef struct {
    int n_ctx;   /* maximum number of tokens the session holds (0: the model's training context, capped) */
    int n_batch; /* largest number of tokens one internal forward step processes; longer inputs are split */
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
 * those of the last position ([n_vocab]). On error the session is left as before the call.
 */
qwenc_status qwenc_session_forward(qwenc_session *session, const int32_t *tokens, int n_tokens,
                                   float *logits, int logits_all, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* QWENC_H */
