/* arena.c - scratch bump allocator (see arena.h). */
#include "core/arena.h"

#include <string.h>

#define ARENA_ALIGN 64
#define HDR ((sizeof(qw_arena_block) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN)

/* NULL when out of memory */
static qw_arena_block *block_new(size_t size, qw_arena_block *prev) {
    if (size > SIZE_MAX - HDR - ARENA_ALIGN) return NULL;
    qw_arena_block *b = qw_aligned_alloc(ARENA_ALIGN, HDR + size);
    if (!b) return NULL;
    b->prev = prev;
    b->size = size;
    b->used = 0;
    return b;
}

static void free_blocks(qw_arena *a) {
    qw_arena_block *b = a->cur;
    while (b) {
        qw_arena_block *p = b->prev;
        free(b);
        b = p;
    }
    a->cur = NULL;
    a->total = 0;
}

void qw_arena_init(qw_arena *a) { memset(a, 0, sizeof(*a)); }

void qw_arena_free(qw_arena *a) {
    free_blocks(a);
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

int qw_arena_reserve(qw_arena *a, size_t bytes) {
    if (a->cur) a->cur->used = 0;
    a->in_use = 0;
    if (bytes < 4096) bytes = 4096;
    size_t need = QW_MAX(bytes, a->high_water);
    if (a->cur && !a->cur->prev && a->cur->size >= need) return 0;
    free_blocks(a);
    qw_arena_block *b = block_new(need, NULL);
    if (!b) return -1;
    a->cur = b;
    a->total = need;
    return 0;
}

void qw_arena_reset(qw_arena *a) {
    if (a->cur && (a->cur->prev || a->high_water > a->cur->size)) {
        /* merge: one block as large as everything used so far (when that fails, the next reservation
         * or allocation tries again) */
        size_t need = QW_MAX(a->total, a->high_water);
        free_blocks(a);
        a->cur = block_new(need, NULL);
        if (a->cur) a->total = need;
    }
    if (a->cur) a->cur->used = 0;
    a->in_use = 0;
}

void *qw_arena_alloc(qw_arena *a, size_t bytes) {
    bytes = QW_ARENA_BYTES(bytes);
    if (!a->cur || a->cur->used + bytes > a->cur->size) {
        size_t sz = QW_MAX(bytes, a->total);
        qw_arena_block *b = block_new(sz, a->cur);
        if (!b) {
            fprintf(stderr, "qwenc: scratch arena: out of memory growing by %zu bytes past its reservation\n", sz);
            QW_ASSERT(!"the scratch bound of a forward step was too small");
        }
        a->cur = b;
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
