/*
 * util.c - small helpers the server's files share: a growable byte buffer, UTF-8 repair for JSON output, the
 * clock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) return -1;
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int sb_str(sbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

int sb_printf(sbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n < sizeof(small)) return sb_add(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int r = sb_add(b, big, (size_t)n);
    free(big);
    return r;
}

void sb_free(sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* As the tokenizer reads text (Python's bytes.decode("utf-8", errors="replace")): each maximal part of an
 * ill-formed sequence becomes U+FFFD. A single token's bytes may be part of a character. */
char *srv_utf8_clean(const char *s, size_t len) {
    char *out = malloc(len * 3 + 1), *w = out;
    if (!out) return NULL;
    for (size_t i = 0; i < len;) {
        unsigned char b = (unsigned char)s[i];
        int need = b < 0x80 ? 0 : b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : -1;
        if (need == 0) {
            *w++ = (char)b;
            i++;
            continue;
        }
        /* the range of the second byte excludes overlong forms and surrogates */
        unsigned char lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80, hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
        int k = 1;
        for (; need > 0 && k <= need && i + k < len; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) break;
        }
        if (need > 0 && k == need + 1) {
            memcpy(w, s + i, (size_t)k);
            w += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
        }
        i += (size_t)k;
    }
    *w = 0;
    return out;
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
