/*
 * arena.h - bump allocator for the scratch activations of one forward call.
 *
 * qw_arena_reset() rewinds it at the start of every call. The owner reserves, before a call changes anything,
 * a bound of what the call will take (qw_arena_reserve: the one allocation, which may fail cleanly), so
 * the call itself allocates nothing. Should a call need more than its reservation anyway (a bound that is
 * too small: a bug), the arena grows by a new block, merged into one at the next reset.
 */
#ifndef QW_ARENA_H
#define QW_ARENA_H

#include "core/common.h"

typedef struct qw_arena_block {
    struct qw_arena_block *prev;
    size_t size, used;
    /* data follows, 64-byte aligned */
} qw_arena_block;

typedef struct {
    qw_arena_block *cur;
    size_t total;     /* bytes in all blocks */
    size_t high_water;
    size_t in_use;
} qw_arena;

/* An empty arena: allocates nothing. */
void qw_arena_init(qw_arena *a);
void qw_arena_free(qw_arena *a);
void qw_arena_reset(qw_arena *a);
/* Rewind the arena (everything allocated is released) and make it one block of at least `bytes`. 0 on success,
 * -1 when out of memory (the arena is then empty but still usable). */
int qw_arena_reserve(qw_arena *a, size_t bytes);
/* The bytes qw_arena_alloc takes for a request of n bytes (its alignment), for the owner's bounds. */
#define QW_ARENA_BYTES(n) (((size_t)(n) + 63) / 64 * 64)

/* Everything allocated after a mark is released by qw_arena_restore (stack discipline). */
typedef struct {
    qw_arena_block *block;
    size_t used, in_use;
} qw_arena_mark;
qw_arena_mark qw_arena_get_mark(const qw_arena *a);
void qw_arena_restore(qw_arena *a, qw_arena_mark mk);
/* 64-byte aligned, uninitialised. Aborts (an assert) only when the reservation was too small and growing
 * past it fails. */
void *qw_arena_alloc(qw_arena *a, size_t bytes);
float *qw_arena_f32(qw_arena *a, size_t n);
/* Zero-filled. */
float *qw_arena_f32z(qw_arena *a, size_t n);

#endif
