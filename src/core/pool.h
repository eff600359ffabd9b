/*
 * pool.h - the one persistent thread pool and its one primitive, parallel_for over items (rows, heads).
 *
 * A pool of n threads is n-1 workers created once plus the calling thread, which takes part in every
 * job. Items are handed out in chunks from an atomic counter, so a fast thread takes more chunks; which
 * thread runs a chunk never changes what the chunk computes, so results do not depend on the thread
 * count as long as fn writes each output from one chunk only.
 *
 * Between jobs the workers spin for a short while (a decode step issues jobs back to back) and then
 * sleep on a condition variable. A call allocates nothing.
 *
 * Thread safety: one job runs at a time. A second thread calling parallel_for while a job runs (two
 * sessions sharing one model), or fn calling parallel_for itself, runs its items on the calling thread.
 */
#ifndef QW_POOL_H
#define QW_POOL_H

#include <stdint.h>

typedef struct qw_pool qw_pool;

/* fn processes items [i0, i1). */
typedef void (*qw_pool_fn)(void *ctx, int64_t i0, int64_t i1);

/* A pool of n_threads threads counting the caller (0: one per CPU this process may run on).
 * Returns NULL if the threads cannot be created. */
qw_pool *qw_pool_new(int n_threads);
/* The same with workers that spin spin_ns after a job before they sleep, and a caller that spins as long for
 * a descheduled worker's chunk before it yields its core (qw_pool_new: 5 ms, for a decode step's jobs
 * microseconds apart; 0 for jobs far apart, such as the GGUF writer's batches, so waiting burns no CPU). */
qw_pool *qw_pool_new_spin(int n_threads, int64_t spin_ns);
void qw_pool_free(qw_pool *pool);
/* Threads of a pool, the caller included (1 for a NULL pool). */
int qw_pool_n_threads(const qw_pool *pool);
/* CPUs this process may run on (sched affinity), at least 1. */
int qw_cpu_count(void);

/* Run fn over items [0, n_items) in chunks of `chunk` items (the last may be shorter) on every thread of
 * the pool, and return when all are done. A NULL pool runs fn(ctx, 0, n_items) on the caller. */
void qw_pool_parallel_for(qw_pool *pool, int64_t n_items, int64_t chunk, qw_pool_fn fn, void *ctx);

#endif
