/*
 * session.h - a session's state (KV cache, DeltaNet conv and recurrent states, PLE history, QSA keys) and
 * the context one forward step hands to the model's forward and the blocks.
 */
#ifndef QW_SESSION_H
#define QW_SESSION_H

#include "core/arena.h"
#include "models/model.h"

/* Per-layer state owned by a session. */
typedef struct {
    float *k, *v;            /* [n_ctx][n_head_kv][hd] attention / QSA layers */
    float *idx_raw;          /* [n_ctx][ihd] raw indexer keys (QSA) */
    float *idx_blk;          /* [n_ctx/R][ihd] pooled, normed, RoPE'd key of every complete block (QSA) */
    float *conv;             /* [K-1][conv_ch] last conv inputs (GDN) */
    float *ssm;              /* [hv][dk][dv] recurrent state (GDN) */
    float *ple_hist;         /* [(k-1)*n][C*H] last normalised gated values (PLE layers) */
} qw_layer_state;

struct qwenc_session {
    const qwenc_model *model;
    int n_ctx, n_batch, n_past;
    qw_layer_state *ls;      /* [n_layer] */
    int32_t ple_last[8];     /* the last ngram_n-1 token ids, oldest first (EOS before the start) */
    float *state_mem;        /* one allocation behind every state buffer */
    size_t state_floats;
    qw_arena arena;          /* per-call scratch */
    struct qw_prof *prof;    /* qwenc_session_profile's timing table, or NULL */
    int lost;                /* a step failed half-way (out of memory): the state is unusable until a reset */
};

/* What a forward call hands to the blocks. */
struct qw_fwd {
    const qwenc_model *m;
    const qw_hparams *hp;
    const qw_ops *ops;
    qwenc_session *s;
    qw_arena *ar;
    int n_tok, pos0;
    const int32_t *tokens;   /* [n_tok] */
    const float *rope_cs;    /* [n_tok][n_rot] cos then sin at positions pos0.. */
};

#endif
