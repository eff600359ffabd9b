/* arena.c - scratch bump allocator (see arena.h). */
#include "core/arena.h"

#include <string.h>

/* measuring mode's addresses start here: aligned, not NULL, never read */
#define MEASURE_BASE ((char *)(uintptr_t)4096)

void qw_arena_init(qw_arena *a, void *base, size_t size) {
    memset(a, 0, sizeof(*a));
    a->base = base;
    a->size = size;
}

void qw_arena_init_measure(qw_arena *a) {
    memset(a, 0, sizeof(*a));
    a->base = MEASURE_BASE;
    a->size = SIZE_MAX / 2;
    a->measure = 1;
}

void qw_arena_reset(qw_arena *a) { a->used = 0; }

qw_arena_mark qw_arena_get_mark(const qw_arena *a) { return a->used; }

void qw_arena_restore(qw_arena *a, qw_arena_mark mk) {
    QW_ASSERT(mk <= a->used);
    a->used = mk;
}

void *qw_arena_alloc(qw_arena *a, size_t bytes) {
    bytes = QW_ARENA_BYTES(bytes);
    QW_ASSERT(bytes <= a->size - a->used); /* the memory plan covers every step */
    void *p = a->base + a->used;
    a->used += bytes;
    if (a->used > a->high_water) a->high_water = a->used;
    return p;
}

float *qw_arena_f32(qw_arena *a, size_t n) { return qw_arena_alloc(a, n * sizeof(float)); }
