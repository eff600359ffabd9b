/*
 * common.h - small helpers shared by every part of the library: error messages, asserts, allocation.
 *
 * Recoverable errors travel as (qwenc_status, char *err, size_t errlen); qw_err() formats the message
 * once, at the place that knows the file or tensor at fault. Broken invariants use QW_ASSERT, which
 * prints file:line:expression and aborts.
 */
#ifndef QW_COMMON_H
#define QW_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "qwenc.h"

#define QW_ASSERT(x)                                                                      \
    do {                                                                                  \
        if (!(x)) {                                                                       \
            fprintf(stderr, "qwenc: %s:%d: assertion failed: %s\n", __FILE__, __LINE__, #x); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

#define QW_MIN(a, b) ((a) < (b) ? (a) : (b))
#define QW_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Write a formatted message into err (if not NULL) and return st. */
qwenc_status qw_err(char *err, size_t errlen, qwenc_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Checked allocation, for everything the library allocates: NULL when memory runs out or n * size overflows
 * size_t (n or size 0 counts as 1, so NULL always means failure). The caller reports it with qw_err_nomem(),
 * naming what was being allocated, and returns QWENC_ERR_NOMEM: the library never aborts for lack of memory. */
void *qw_calloc(size_t n, size_t size);
void *qw_malloc(size_t n, size_t size);
/* p is left as it was (and still owned by the caller) on failure. */
void *qw_realloc(void *p, size_t n, size_t size);
/* bytes rounded up to a multiple of align (a power of two, at least sizeof(void *)); free() it. */
void *qw_aligned_alloc(size_t align, size_t bytes);
char *qw_strdup(const char *s);
/* dir and name joined with one '/' into a new string. */
char *qw_path_new(const char *dir, const char *name);
/* QWENC_ERR_NOMEM with "<what>: out of memory allocating <n * size> bytes" (what names the file or object). */
qwenc_status qw_err_nomem(char *err, size_t errlen, const char *what, size_t n, size_t size);

/* For tests: the n-th checked allocation from now on (0: the next one) fails, once; n < 0 disarms.
 * qw_alloc_fail_fired() says whether the armed failure has happened. */
void qw_alloc_fail_at(long n);
int qw_alloc_fail_fired(void);

#endif /* QW_COMMON_H */
