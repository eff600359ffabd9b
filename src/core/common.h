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

/* Allocation that aborts on failure: used only at load/init time for small bookkeeping. */
void *qw_xcalloc(size_t n, size_t size);
char *qw_xstrdup(const char *s);

/* Join a directory and a file name into a new string. */
char *qw_path_join(const char *dir, const char *name);

#endif /* QW_COMMON_H */
