/*
 * fuzz_util.h - what the fuzz targets of tests/fuzz share: the input as a file (a memfd, so the real
 * open/map path of the library reads it), paths of the repository's fixtures, and FZ_CHECK for the
 * properties a target asserts. A failed check aborts: libFuzzer reports it as a crash and keeps the input.
 *
 * Each target is built twice: with clang and libFuzzer (make fuzz, build-fuzz/fuzz_<target>), and with the
 * project's compiler and tests/fuzz/replay.c (make test, BUILD/fuzz/replay_<target>), which feeds it the
 * seeds and the regression inputs. Fixtures are found under $QWENC_ROOT (default: the current directory,
 * the repository root when run by make).
 */
#ifndef QW_FUZZ_UTIL_H
#define QW_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create; the Makefile defines it for every target */
#endif
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mapfile.h"
#include "qwenc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...)                                                      \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "fuzz check failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* The input as a regular file: one memfd, rewritten for every input; returns its /proc/self/fd path. */
static inline const char *fz_as_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-input", 0);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) {
        perror("fuzz input memfd");
        abort();
    }
    return path;
}

/* A path under the repository root ($QWENC_ROOT or the current directory); static buffer. */
static inline const char *fz_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("QWENC_ROOT");
    snprintf(buf, sizeof(buf), "%s/%s", root && *root ? root : ".", rel);
    return buf;
}

/* A whole fixture file (NUL-terminated), or NULL with a message. */
static inline char *fz_read(const char *rel, size_t *len) {
    char *buf = NULL, err[512];
    size_t n = 0;
    if (qw_read_file(fz_path(rel), &buf, &n, err, sizeof(err))) {
        fprintf(stderr, "fuzz: %s\n", err);
        return NULL;
    }
    if (len) *len = n;
    return buf;
}

/* A NUL-terminated copy of the input (for the APIs that take C strings). */
static inline char *fz_strndup(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* 1 if s[0..n) is valid UTF-8 (Python's strings are: what a template renders from valid text must be too). */
static inline int fz_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3 : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
        if (!len || i + len > n) return 0;
        unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        if (len > 1 && (u[i + 1] < lo || u[i + 1] > hi)) return 0;
        for (size_t k = 2; k < len; k++)
            if ((u[i + k] & 0xc0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

/* With FUZZ_VERBOSE set in the environment, say what became of each input (to check that seeds parse). */
static inline void fz_note(const char *what, int st, const char *err) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "  %s: %s\n", what, st ? err : "ok");
}

/* An error message must exist and name the input. */
#define FZ_CHECK_ERR(st, err, name) \
    FZ_CHECK((st) > 0 && (st) <= QWENC_ERR_CONTEXT && (err)[0] && strstr((err), (name)), "status %d, message '%s' does not name '%s'", (int)(st), (err), (name))

#endif
