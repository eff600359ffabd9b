/*
 * profile.h - per-op timing of a session's forward steps (qwenc_session_profile, `qwenc bench --profile`).
 *
 * A profiler is an op table (ops.h) that wraps the model's: each op is timed on the calling thread (the wall
 * time the forward waits for it, threads included) and forwarded unchanged, so the logits are the same bits.
 * Matmuls are counted per weight tensor, labelled by type and name with layer and expert numbers folded
 * ("matmul q8_0 blk.#.ffn_down_exps.weight"), with the bytes of weights they read; a matmul_batch's time is shared
 * among its jobs by those bytes. What the forward spends between ops (its own loops, copies) is the step's
 * wall time less the ops'. Overhead: two clock reads per op, a few microseconds per token.
 */
#ifndef QW_PROFILE_H
#define QW_PROFILE_H

#include "kernels/ops.h"
#include "qwenc.h"

typedef struct qw_prof qw_prof;

/* A profiler around `inner` (which must outlive it); NULL if out of memory. */
qw_prof *qw_prof_new(const qw_ops *inner);
/* Bytes of a profile, for the message when it cannot be allocated. */
size_t qw_prof_size(void);
void qw_prof_free(qw_prof *p);
/* The table to run the forward with. */
const qw_ops *qw_prof_ops(qw_prof *p);
/* Zero every count. */
void qw_prof_reset(qw_prof *p);
/* Count one forward step of n_tok tokens that took wall_s seconds. */
void qw_prof_step(qw_prof *p, int n_tok, double wall_s);
/* The entries, slowest first, as qwenc_session_profile_read describes them. */
int qw_prof_read(const qw_prof *p, qwenc_profile_entry *out, int max, qwenc_profile_totals *tot);
/* Seconds on a monotonic clock. */
double qw_prof_now(void);

#endif
