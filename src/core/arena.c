/* arena.c - scratch bump allocator (see arena.h). */
#include "core/arena.h"

#include <string.h>

#define ARENA_ALIGN 64
#define HDR ((sizeof(qw_arena_block) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN)

static qw_arena_block *block_new(size_t size, qw_arena_block *prev) {
    qw_arena_block *b = aligned_alloc(ARENA_ALIGN, (HDR + size + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!b) {
        fprintf(stderr, "qwenc: out of memory allocating %zu bytes of scratch\n", size);
        abort();
    }
    b->prev = prev;
    b->size = size;
    b->used = 0;
    return b;
}

void qw_arena_init(qw_arena *a, size_t size) {
    memset(a, 0, sizeof(*a));
    if (size < 4096) size = 4096;
    a->cur = block_new(size, NULL);
    a->total = size;
}

void qw_arena_free(qw_arena *a) {
    qw_arena_block *b = a->cur;
    while (b) {
        qw_arena_block *p = b->prev;
        free(b);
        b = p;
    }
    memset(a, 0, sizeof(*a));
}

qw_arena_mark qw_arena_get_mark(const qw_arena *a) {
    qw_arena_mark mk = {a->cur, a->cur ? a->cur->used : 0, a->in_use};
    return mk;
}

void qw_arena_restore(qw_arena *a, qw_arena_mark mk) {
    while (a->cur && a->cur != mk.block) { /* blocks added while growing past the mark */
        qw_arena_block *p = a->cur->prev;
        a->total -= a->cur->size;
        free(a->cur);
        a->cur = p;
    }
    QW_ASSERT(a->cur == mk.block);
    if (a->cur) a->cur->used = mk.used;
    a->in_use = mk.in_use;
}

void qw_arena_reset(qw_arena *a) {
    if (a->cur && (a->cur->prev || a->high_water > a->cur->size)) {
        /* merge: one block as large as everything used so far */
        size_t need = QW_MAX(a->total, a->high_water);
        qw_arena_block *b = a->cur;
        while (b) {
            qw_arena_block *p = b->prev;
            free(b);
            b = p;
        }
        a->cur = block_new(need, NULL);
        a->total = need;
    }
    if (a->cur) a->cur->used = 0;
    a->in_use = 0;
}

void *qw_arena_alloc(qw_arena *a, size_t bytes) {
    bytes = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (!a->cur || a->cur->used + bytes > a->cur->size) {
        size_t sz = QW_MAX(bytes, a->total);
        a->cur = block_new(sz, a->cur);
        a->total += sz;
    }
    void *p = (uint8_t *)a->cur + HDR + a->cur->used;
    a->cur->used += bytes;
    a->in_use += bytes;
    if (a->in_use > a->high_water) a->high_water = a->in_use;
    return p;
}

float *qw_arena_f32(qw_arena *a, size_t n) { return qw_arena_alloc(a, n * sizeof(float)); }

float *qw_arena_f32z(qw_arena *a, size_t n) {
    float *p = qw_arena_f32(a, n);
    memset(p, 0, n * sizeof(float));
    return p;
}
