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
    float *mem;              /* the one allocation behind them (made where the layer runs: qw_be_layer) */
    size_t n;                /* its floats */
} qw_layer_state;

/* A step of one shape recorded once as a graph and replayed (a backend with graphs): it runs op by op the first
 * time (every weight it reads then on the device, the backend's scratch grown), is recorded the second. */
typedef struct {
    void *g;
    float *lg;               /* where the recorded step leaves its logits */
    int seen, failed;
} qw_step_graph;

/* What a draft step (qwenc_session_forward_draft) keeps so that qwenc_session_accept can take its tokens back,
 * per layer, in backend memory: the windows of the convolutions as the step saw them (the state's rows, then the
 * step's), the recurrent state before the step and the delta rule's inputs of the step's tokens. */
typedef struct {
    float *conv_seq;         /* [K-1 + cap][conv_ch] (GDN) */
    float *ssm0;             /* [hv][dk][dv] (GDN) */
    float *q, *k, *v, *g, *b;/* [cap][hk*dk], [cap][hk*dk], [cap][hv*dv], [cap][hv], [cap][hv] (GDN) */
    float *ple_seq;          /* [(k-1)*n + cap][C*H] (PLE layers) */
    float *mem;              /* the one allocation behind them (where the layer runs) */
} qw_draft_layer;

struct qwenc_session {
    const qwenc_model *model;
    const qw_backend *be;    /* the model's backend, or the profiler around it */
    int n_ctx, n_batch, n_past;
    qw_layer_state *ls;      /* [n_layer] (host) pointers into each layer's state (backend memory) */
    /* backend memory: the step's inputs; the scratch of a step, sized by the plan */
    int32_t *ple_hist;       /* [8] the last ngram_n-1 token ids, oldest first (EOS before the start) */
    qw_step *step;           /* the step's position */
    int32_t *tokens;         /* [n_batch] the step's token ids */
    void *scratch;
    size_t scratch_bytes;
    qw_arena arena;          /* over scratch */
    struct qw_prof *prof;    /* qwenc_session_profile's timing table, or NULL */
    int32_t *best;           /* [1] the arg max of a step's last logits (qwenc_session_forward_argmax) */
    /* qwenc_session_forward_topk on a backend with its own memory and a topk op: the step's last logits (they stay
     * for qwenc_session_last_logits) and the k ids then k values; topk_k the k of the step being run and of gr_one[3] */
    float *top_logits;       /* [n_vocab] backend memory, or with top_host host memory */
    int top_host;            /* the top k is chosen on the host (a backend with host memory or without the op) */
    int32_t *top_out;        /* [2 * QWENC_MAX_TOPK] */
    int topk_k, gr_topk_k;
    int top_valid;           /* top_logits hold the last step's logits */
    int batch_planned;       /* the most sessions a batched step run in this session's scratch has been planned for */
    int lost;                /* a step failed half-way (out of memory): the state is unusable until a reset */
    /* a draft step not yet accepted (draft_n > 0): its tokens, the position and PLE token history before it */
    int draft_n, draft_past;
    int32_t draft_tokens[QWENC_MAX_DRAFT + 1];
    int32_t *draft_hist;     /* [8] backend memory */
    qw_draft_layer *dl;      /* [n_layer] (allocated by the first draft step) */
    /* the MTP draft head (params.draft_head on a model with one): its layer's state is ls[n_layer] */
    int mtp;
    int mtp_j;               /* head steps since a token was last fed */
    float *mtp_hid;          /* [n_batch + 1][qw_mtp_width]: row 0 the main model's hidden at n_past - 1 (the head
                              * has not read it: it waits for the token after); a step writes its rows from row 1 */
    float *mtp_chain;        /* [qw_mtp_width] the last head step's output hidden */
    int32_t *mtp_tok;        /* [n_batch] the head's input tokens */
    int32_t *mtp_best;       /* [1] the arg max of the head's last logits */
    /* a backend with graphs: one-token steps without logits, with them, with their arg max only and with their top k
     * only (gr_one);
     * the steps of speculative decoding by their number of tokens (draft steps, the head's catch-up rows,
     * accept's replay of n kept tokens) and the head's first and later steps */
    qw_step_graph gr_one[4];
    qw_step_graph gr_draft[QWENC_MAX_DRAFT + 2], gr_catch[QWENC_MAX_DRAFT + 2], gr_accept[QWENC_MAX_DRAFT + 2];
    qw_step_graph gr_head[2];
};

/* What a forward step hands to the model's forward and the blocks: shapes and backend addresses. A step is
 * one session's n_tok tokens, or (qwenc_session_forward_batch) one token of each of n_tok sessions: the blocks
 * run what reads or writes a session's state per segment (qw_fwd_seg below), everything else on all rows. */
struct qw_fwd {
    const qwenc_model *m;
    const qw_hparams *hp;
    const qw_backend *be;
    qwenc_session *s;        /* the session whose arena the step uses (the first of a batch) */
    qwenc_session *const *seqs; /* a batched step: row r is sessions[r]'s token; NULL: every row is s's */
    int n_ctx;               /* the largest context of the step's sessions */
    qw_arena *ar;
    int n_tok;
    const int32_t *tokens;   /* [n_tok] backend memory */
    const float *rope_cs;    /* [n_tok][n_rot] cos then sin at each row's position, backend memory */
    int draft;               /* a draft step of s: the blocks keep what taking tokens back needs (s->dl) */
    int qsa_dense;           /* the leading queries of the step that keep every position they see in the QSA
                              * selection (no more complete blocks than the budget's), in a step never recorded as a
                              * graph (0 in others): their attention is the dense causal one over the same keys, and
                              * a step whose queries all do skips the selection */
    float *mtp_hidden;       /* NULL, or [n_tok][qw_mtp_width]: the forward writes the draft head's input rows */
};

/* The segments of a step: rows [row0, row0 + rows) of one session, at that session's position (its step). */
typedef struct {
    qwenc_session *s;
    int row0, rows;
} qw_seg;
static inline int qw_fwd_n_seg(const qw_fwd *f) { return f->seqs ? f->n_tok : 1; }
static inline qw_seg qw_fwd_seg(const qw_fwd *f, int i) {
    qw_seg g = {f->seqs ? f->seqs[i] : f->s, f->seqs ? i : 0, f->seqs ? 1 : f->n_tok};
    return g;
}

#endif
