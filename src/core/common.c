/* common.c - error formatting and checked allocation (see common.h). */
#include "core/common.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>

qwenc_status qw_err(char *err, size_t errlen, qwenc_status st, const char *fmt, ...) {
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* the failure armed by qw_alloc_fail_at: checked allocations left before it, -1 when disarmed */
static atomic_long fail_countdown = -1;
static atomic_int fail_fired;

void qw_alloc_fail_at(long n) {
    atomic_store(&fail_fired, 0);
    atomic_store(&fail_countdown, n < 0 ? -1 : n);
}

int qw_alloc_fail_fired(void) { return atomic_load(&fail_fired); }

/* 1 when this allocation is the one armed to fail */
static int injected_failure(void) {
    if (atomic_load_explicit(&fail_countdown, memory_order_relaxed) < 0) return 0;
    if (atomic_fetch_sub(&fail_countdown, 1) != 0) return 0;
    atomic_store(&fail_fired, 1);
    return 1;
}

/* n * size in *bytes (0 counts as 1); 0 when it overflows */
static int total_bytes(size_t n, size_t size, size_t *bytes) {
    if (!n) n = 1;
    if (!size) size = 1;
    if (n > SIZE_MAX / size) return 0;
    *bytes = n * size;
    return 1;
}

void *qw_calloc(size_t n, size_t size) {
    size_t b;
    if (!total_bytes(n, size, &b) || injected_failure()) return NULL;
    return calloc(b, 1);
}

void *qw_malloc(size_t n, size_t size) {
    size_t b;
    if (!total_bytes(n, size, &b) || injected_failure()) return NULL;
    return malloc(b);
}

void *qw_realloc(void *p, size_t n, size_t size) {
    size_t b;
    if (!total_bytes(n, size, &b) || injected_failure()) return NULL;
    return realloc(p, b);
}

void *qw_aligned_alloc(size_t align, size_t bytes) {
    if (!bytes) bytes = 1;
    if (bytes > SIZE_MAX - align || injected_failure()) return NULL;
    return aligned_alloc(align, (bytes + align - 1) / align * align);
}

char *qw_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = qw_malloc(n, 1);
    if (p) memcpy(p, s, n);
    return p;
}

char *qw_path_new(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = qw_malloc(a + b + 2, 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

qwenc_status qw_err_nomem(char *err, size_t errlen, const char *what, size_t n, size_t size) {
    size_t b;
    if (!total_bytes(n, size, &b))
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory allocating %zu x %zu bytes", what, n, size);
    if (b >= (size_t)1 << 20)
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory allocating %zu bytes (%.1f MiB)", what, b,
                      (double)b / 1048576.0);
    return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory allocating %zu bytes", what, b);
}

const char *qwenc_status_str(qwenc_status st) {
    switch (st) {
    case QWENC_OK: return "ok";
    case QWENC_ERR_IO: return "i/o error";
    case QWENC_ERR_FORMAT: return "format error";
    case QWENC_ERR_UNSUPPORTED: return "unsupported";
    case QWENC_ERR_ARG: return "bad argument";
    case QWENC_ERR_NOMEM: return "out of memory";
    case QWENC_ERR_CONTEXT: return "context full";
    }
    return "unknown error";
}
