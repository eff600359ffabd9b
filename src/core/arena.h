/*
 * arena.h - bump allocator for the scratch activations of one forward call.
 *
 * qw_arena_reset() rewinds it at the start of every call. When a call needs more than the arena holds,
 * it grows once (a new block); the next reset merges the blocks into one, so steady-state decoding
 * allocates nothing.
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

void qw_arena_init(qw_arena *a, size_t size);
void qw_arena_free(qw_arena *a);
void qw_arena_reset(qw_arena *a);

/* Everything allocated after a mark is released by qw_arena_restore (stack discipline). */
typedef struct {
    qw_arena_block *block;
    size_t used, in_use;
} qw_arena_mark;
qw_arena_mark qw_arena_get_mark(const qw_arena *a);
void qw_arena_restore(qw_arena *a, qw_arena_mark mk);
/* 64-byte aligned, uninitialised. */
void *qw_arena_alloc(qw_arena *a, size_t bytes);
float *qw_arena_f32(qw_arena *a, size_t n);
/* Zero-filled. */
float *qw_arena_f32z(qw_arena *a, size_t n);

#endif
