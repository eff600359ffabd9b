/* common.c - error formatting and checked allocation (see common.h). */
#include "core/common.h"

#include <stdarg.h>
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

void *qw_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "qwenc: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

char *qw_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = qw_xcalloc(n, 1);
    memcpy(p, s, n);
    return p;
}

char *qw_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = qw_xcalloc(a + b + 2, 1);
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
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
