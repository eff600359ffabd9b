/*
 * tok_util.c - the tokenizer's small parts: hash maps (vocabulary, merges), a byte trie for added tokens,
 * UTF-8 validation and repair, Unicode White_Space, the GPT-2 byte-level alphabet.
 *
 * UTF-8 repair follows the Unicode "maximal subpart" practice (Unicode 15, ch. 3, U+FFFD substitution),
 * which is what Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy both do, so a
 * repaired text is the string the Hugging Face library would have been given.
 */
#include <string.h>

#include "text/tok_internal.h"

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const char *s, size_t n) {
    /* FNV-1a with a final avalanche: short keys (most tokens are 1-8 bytes) hash fast and spread well. */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint32_t cap_for(size_t expect) {
    uint32_t cap = 16;
    while (cap < expect * 2 + 2) cap *= 2;
    return cap;
}

int qw_strmap_init(qw_strmap *m, size_t expect) {
    m->cap = cap_for(expect);
    m->n = 0;
    m->key = calloc(m->cap, sizeof(*m->key));
    m->klen = calloc(m->cap, sizeof(*m->klen));
    m->val = calloc(m->cap, sizeof(*m->val));
    if (m->key && m->klen && m->val) return 0;
    qw_strmap_free(m);
    return -1;
}

void qw_strmap_free(qw_strmap *m) {
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof(*m));
}

static int strmap_grow(qw_strmap *m) {
    qw_strmap old = *m;
    if (qw_strmap_init(m, old.cap)) {
        *m = old;
        return -1;
    }
    for (uint32_t i = 0; i < old.cap; i++)
        if (old.key[i]) qw_strmap_put(m, old.key[i], old.klen[i], old.val[i]); /* cannot grow again */
    qw_strmap_free(&old);
    return 0;
}

int qw_strmap_put(qw_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
    uint32_t mask = m->cap - 1, i = (uint32_t)hash_bytes(key, len) & mask;
    while (m->key[i]) {
        if (m->klen[i] == len && (len == 0 || memcmp(m->key[i], key, len) == 0)) {
            m->val[i] = val;
            return 0;
        }
        i = (i + 1) & mask;
    }
    m->key[i] = key;
    m->klen[i] = (uint32_t)len;
    m->val[i] = val;
    m->n++;
    return 0;
}

int32_t qw_strmap_get(const qw_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    uint32_t mask = m->cap - 1, i = (uint32_t)hash_bytes(key, len) & mask;
    while (m->key[i]) {
        if (m->klen[i] == len && (len == 0 || memcmp(m->key[i], key, len) == 0)) return m->val[i];
        i = (i + 1) & mask;
    }
    return -1;
}

int qw_pairmap_init(qw_pairmap *m, size_t expect) {
    m->cap = cap_for(expect);
    m->n = 0;
    m->key = malloc(m->cap * sizeof(*m->key));
    m->rank = calloc(m->cap, sizeof(*m->rank));
    m->merged = calloc(m->cap, sizeof(*m->merged));
    if (!m->key || !m->rank || !m->merged) {
        qw_pairmap_free(m);
        return -1;
    }
    memset(m->key, 0xff, m->cap * sizeof(*m->key));
    return 0;
}

void qw_pairmap_free(qw_pairmap *m) {
    free(m->key);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof(*m));
}

int qw_pairmap_put(qw_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    if ((m->n + 1) * 2 > m->cap) {
        qw_pairmap old = *m;
        if (qw_pairmap_init(m, old.cap)) {
            *m = old;
            return -1;
        }
        for (uint32_t i = 0; i < old.cap; i++)
            if (old.key[i] != UINT64_MAX)
                qw_pairmap_put(m, (int32_t)(old.key[i] >> 32), (int32_t)(uint32_t)old.key[i], old.rank[i],
                               old.merged[i]);
        qw_pairmap_free(&old);
    }
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = m->cap - 1, i = (uint32_t)hash_u64(k) & mask;
    while (m->key[i] != UINT64_MAX && m->key[i] != k) i = (i + 1) & mask;
    if (m->key[i] == UINT64_MAX) m->n++;
    m->key[i] = k;
    m->rank[i] = rank;
    m->merged[i] = merged;
    return 0;
}

int qw_pairmap_get(const qw_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    if (!m->cap) return 0;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = m->cap - 1, i = (uint32_t)hash_u64(k) & mask;
    while (m->key[i] != UINT64_MAX) {
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return 1;
        }
        i = (i + 1) & mask;
    }
    return 0;
}

/* ---------------------------------------------------------------- buffers */

int qw_buf_reserve(qw_buf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void qw_buf_add(qw_buf *b, const void *data, size_t len) {
    if (qw_buf_reserve(b, len)) return;
    if (len) memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = 0;
}

void qw_buf_addc(qw_buf *b, char c) {
    if (qw_buf_reserve(b, 1)) return;
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

void qw_ivec_push(qw_ivec *v, int32_t x) {
    if (v->oom) return;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof(*p));
        if (!p) {
            v->oom = 1;
            return;
        }
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

/* ---------------------------------------------------------------- trie */

/* A new node, or -1 when out of memory. */
static int32_t trie_node(qw_trie *t, uint8_t byte) {
    if (t->n_nodes == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        int32_t *child = realloc(t->child, (size_t)cap * sizeof(*t->child));
        if (child) t->child = child;
        int32_t *sibling = realloc(t->sibling, (size_t)cap * sizeof(*t->sibling));
        if (sibling) t->sibling = sibling;
        uint8_t *bytes = realloc(t->byte, (size_t)cap * sizeof(*t->byte));
        if (bytes) t->byte = bytes;
        int32_t *token = realloc(t->token, (size_t)cap * sizeof(*t->token));
        if (token) t->token = token;
        if (!child || !sibling || !bytes || !token) return -1;
        t->cap = cap;
    }
    int32_t i = t->n_nodes++;
    t->child[i] = t->sibling[i] = t->token[i] = -1;
    t->byte[i] = byte;
    return i;
}

int qw_trie_add(qw_trie *t, const char *s, size_t len, int32_t token) {
    if (len == 0) return 0;
    if (t->n_nodes == 0 && trie_node(t, 0) < 0) return -1; /* root */
    t->first[(uint8_t)s[0]] = 1;
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t ch = t->child[node];
        while (ch >= 0 && t->byte[ch] != c) ch = t->sibling[ch];
        if (ch < 0) {
            if ((ch = trie_node(t, c)) < 0) return -1; /* the nodes added so far lead to no token: harmless */
            t->sibling[ch] = t->child[node];
            t->child[node] = ch;
        }
        node = ch;
    }
    if (t->token[node] < 0) t->token[node] = token; /* the first token given a string keeps it */
    return 0;
}

void qw_trie_free(qw_trie *t) {
    free(t->child);
    free(t->sibling);
    free(t->byte);
    free(t->token);
    memset(t, 0, sizeof(*t));
}

/* ---------------------------------------------------------------- UTF-8 */

int qw_utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    if ((size_t)len > n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

int qw_utf8_partial_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    int len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    int k = 1;
    if ((size_t)k < n && k < len) {
        if (s[1] < lo || s[1] > hi) return 1;
        k = 2;
        while ((size_t)k < n && k < len && (s[k] & 0xc0) == 0x80) k++;
    }
    return k;
}

uint32_t qw_utf8_decode(const uint8_t *s, int *len) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xe0) {
        *len = 2;
        return (uint32_t)(c & 0x1f) << 6 | (s[1] & 0x3f);
    }
    if (c < 0xf0) {
        *len = 3;
        return (uint32_t)(c & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 | (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}

int qw_utf8_encode(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

int qw_utf8_is_valid(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs eight bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int l = qw_utf8_valid_len(u + i, n - i);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

int qw_utf8_repair(const char *s, size_t n, qw_buf *out) {
    const uint8_t *u = (const uint8_t *)s;
    int replaced = 0;
    size_t i = 0, run = 0; /* valid bytes not yet copied start at run */
    qw_buf_reserve(out, n);
    while (i < n) {
        int l = qw_utf8_valid_len(u + i, n - i);
        if (l) {
            i += (size_t)l;
            continue;
        }
        qw_buf_add(out, s + run, i - run);
        qw_buf_add(out, "\xef\xbf\xbd", 3);
        int p = qw_utf8_partial_len(u + i, n - i);
        i += p ? (size_t)p : 1;
        run = i;
        replaced = 1;
    }
    qw_buf_add(out, s + run, n - run);
    return replaced;
}

char *qwenc_utf8_repair(const char *s, size_t len) {
    qw_buf b = {0};
    qw_buf_reserve(&b, len);
    qw_utf8_repair(s, len, &b);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

int qw_is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0d);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ---------------------------------------------------------------- byte-level alphabet */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
 * themselves; the other 68 bytes map, in order, to U+0100.. */
const uint16_t qw_byte_to_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10a, 0x10b, 0x10c, 0x10d, 0x10e, 0x10f,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11a, 0x11b, 0x11c, 0x11d, 0x11e, 0x11f,
    0x120, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f,
    0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x3b, 0x3c, 0x3d, 0x3e, 0x3f,
    0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f,
    0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f,
    0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f,
    0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x7b, 0x7c, 0x7d, 0x7e, 0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12a, 0x12b, 0x12c, 0x12d, 0x12e, 0x12f, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13a, 0x13b, 0x13c, 0x13d, 0x13e, 0x13f, 0x140, 0x141,
    0x142, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0x143, 0xae, 0xaf,
    0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf,
    0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf,
    0xd0, 0xd1, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf,
    0xe0, 0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xeb, 0xec, 0xed, 0xee, 0xef,
    0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff,
};

int qw_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) {
        int b = (int)cp;
        if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae) return b;
        return -1;
    }
    if (cp > 0x143) return -1;
    /* U+0100.. are the non-printable bytes in increasing order: 0x00-0x20, 0x7F-0xA0, 0xAD */
    int k = (int)(cp - 0x100);
    if (k <= 0x20) return k;
    if (k <= 0x42) return 0x7f + (k - 0x21);
    return 0xad;
}
