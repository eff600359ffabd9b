/*
 * arena.h - bump allocator over one region, for the scratch of a forward step.
 *
 * The region is the session's scratch, allocated once from the backend with the size the session's memory
 * plan measured (runtime/session.c): a step's allocations, made in the same order with the same sizes for
 * the same number of tokens, land at the same addresses every time, and the step allocates nothing.
 * Measuring mode hands out addresses from no memory at all and records the high water: the plan runs a
 * step that way, through a backend that computes nothing. Allocations follow a stack discipline (marks).
 */
#ifndef QW_ARENA_H
#define QW_ARENA_H

#include "core/common.h"

typedef struct {
    char *base;        /* the region; a fake base in measuring mode (never dereferenced) */
    size_t size;       /* its bytes (measuring mode: unbounded) */
    size_t used;       /* bytes handed out and not released */
    size_t high_water; /* the most `used` has been */
    int measure;
} qw_arena;

/* An arena over the region [base, base + size). */
void qw_arena_init(qw_arena *a, void *base, size_t size);
/* An arena that measures: its addresses must not be dereferenced. */
void qw_arena_init_measure(qw_arena *a);
/* Release everything. */
void qw_arena_reset(qw_arena *a);
/* The bytes qw_arena_alloc takes for a request of n bytes (its alignment). */
#define QW_ARENA_BYTES(n) (((size_t)(n) + 63) / 64 * 64)

/* Everything allocated after a mark is released by qw_arena_restore (stack discipline). */
typedef size_t qw_arena_mark;
qw_arena_mark qw_arena_get_mark(const qw_arena *a);
void qw_arena_restore(qw_arena *a, qw_arena_mark mk);
/* 64-byte aligned, uninitialised. Past the region's end is a broken invariant (the plan was measured on the
 * same calls): an assert. */
void *qw_arena_alloc(qw_arena *a, size_t bytes);
float *qw_arena_f32(qw_arena *a, size_t n);

#endif
