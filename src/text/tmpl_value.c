/*
 * tmpl_value.c - the values of the chat-template interpreter and their Python behaviour.
 *
 * Transformers renders chat templates with Jinja2 on Python objects made by json.loads, so the text a
 * template prints is Python's: str() of a float is repr() ("1.0", "1e-05"), of a list is its repr
 * (['a', None]), json.dumps writes ", " and ": " separators and keeps non-ASCII text as it is
 * (transformers' tojson passes ensure_ascii=False). This file reproduces those rules: float repr (the
 * shortest string that reads back, in Python's layout), str.__repr__ quoting and escaping, ==, <, len(),
 * truthiness, and a JSON reader that keeps ints apart from floats and objects in key order.
 *
 * All memory comes from the render's arena (tp_alloc); nothing is freed before the render ends.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <utf8proc.h>

#include "text/tmpl.h"

/* ---------------------------------------------------------------- arena and errors */

struct tp_block {
    tp_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define TP_ARENA_MAX ((size_t)256 << 20) /* a render that needs more is an error, not an abort */

void *tp_alloc(tp_ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    tp_block *b = c->blocks;
    if (!b || b->used + n > b->size) {
        size_t size = n > 65536 ? n : 65536;
        if (c->arena_bytes + size > TP_ARENA_MAX)
            tp_fail(c, QWENC_ERR_NOMEM, 0, "chat template rendering needs more than %zu MiB", TP_ARENA_MAX >> 20);
        b = malloc(sizeof(tp_block) + size);
        if (!b) tp_fail(c, QWENC_ERR_NOMEM, 0, "out of memory (%zu bytes) while rendering the chat template", size);
        b->size = size;
        b->used = 0;
        b->next = c->blocks;
        c->blocks = b;
        c->arena_bytes += size;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void tp_arena_free(tp_ctx *c) {
    while (c->blocks) {
        tp_block *n = c->blocks->next;
        free(c->blocks);
        c->blocks = n;
    }
    c->arena_bytes = 0;
}

_Noreturn void tp_fail(tp_ctx *c, qwenc_status st, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
    va_end(ap);
    c->status = st;
    c->line = line ? line : c->cur_line;
    longjmp(c->jmp, 1);
}

_Noreturn void tp_too_long(tp_ctx *c) {
    tp_fail(c, QWENC_ERR_UNSUPPORTED, 0, "the template runs too long (more than %llu steps)",
            (unsigned long long)TP_MAX_STEPS);
}

/* ---------------------------------------------------------------- constructors */

tv_value tv_undef(tp_ctx *c, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    size_t n = strlen(tmp);
    char *p = tp_alloc(c, n + 1);
    memcpy(p, tmp, n);
    tv_value v = {.type = TV_UNDEF};
    v.u.undef = p;
    return v;
}

tv_value tv_none(void) { return (tv_value){.type = TV_NONE}; }
tv_value tv_bool(int b) { tv_value v = {.type = TV_BOOL}; v.u.b = !!b; return v; }
tv_value tv_int(int64_t i) { tv_value v = {.type = TV_INT}; v.u.i = i; return v; }
tv_value tv_float(double f) { tv_value v = {.type = TV_FLOAT}; v.u.f = f; return v; }

tv_value tv_str(const char *p, size_t n) {
    tv_value v = {.type = TV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

tv_value tv_strz(const char *p) { return tv_str(p, strlen(p)); }

tv_value tv_str_copy(tp_ctx *c, const char *p, size_t n) {
    char *q = tp_alloc(c, n + 1);
    if (n) memcpy(q, p, n);
    return tv_str(q, n);
}

tv_value tv_list_new(tp_ctx *c, size_t cap) {
    tv_value v = {.type = TV_LIST};
    v.u.l = tp_alloc(c, sizeof(tv_list));
    if (cap) {
        v.u.l->items = tp_alloc(c, cap * sizeof(tv_value));
        v.u.l->cap = cap;
    }
    return v;
}

tv_value tv_dict_new(tp_ctx *c, size_t cap) {
    tv_value v = {.type = TV_DICT};
    v.u.d = tp_alloc(c, sizeof(tv_dict));
    if (cap) {
        v.u.d->keys = tp_alloc(c, cap * sizeof(tv_value));
        v.u.d->vals = tp_alloc(c, cap * sizeof(tv_value));
        v.u.d->cap = cap;
    }
    return v;
}

void tv_list_push(tp_ctx *c, tv_list *l, tv_value v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        tv_value *it = tp_alloc(c, cap * sizeof(tv_value));
        if (l->n) memcpy(it, l->items, l->n * sizeof(tv_value));
        l->items = it;
        l->cap = cap;
    }
    l->items[l->n++] = v;
}

/* Dicts made from a request can hold many keys (a JSON object of 100,000 members): past TV_DICT_INDEX_MIN
 * entries the keys Python can hash, and that a template can only compare by value, get a hash index. Keys that
 * are equal hash alike: numbers by their integer value when they have one (1 == 1.0 == True, as in Python). */
static int indexable(tv_value k) {
    return k.type == TV_STR || k.type == TV_INT || k.type == TV_BOOL || k.type == TV_FLOAT || k.type == TV_NONE;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static uint64_t str_hash(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ULL;
    return mix64(h);
}

static uint64_t key_hash(tv_value k) {
    switch ((tv_type)k.type) {
    case TV_STR: return str_hash(k.u.s.p, k.u.s.n);
    case TV_INT: return mix64((uint64_t)k.u.i);
    case TV_BOOL: return mix64((uint64_t)k.u.b);
    case TV_FLOAT:
        if (k.u.f == floor(k.u.f) && k.u.f >= -9223372036854775808.0 && k.u.f < 9223372036854775808.0)
            return mix64((uint64_t)(int64_t)k.u.f);
        {
            uint64_t bits;
            memcpy(&bits, &k.u.f, 8);
            return mix64(bits ^ 0x9e3779b97f4a7c15ULL);
        }
    default: return 0x51ed270b27c4a3f5ULL;
    }
}

static void index_put(tv_dict *d, size_t i) {
    size_t m = d->index_cap - 1;
    for (size_t s = key_hash(d->keys[i]) & m;; s = (s + 1) & m)
        if (!d->index[s]) {
            d->index[s] = (uint32_t)i + 1;
            return;
        }
}

static void index_build(tp_ctx *c, tv_dict *d) {
    size_t cap = 64;
    while (cap < 4 * d->n) cap *= 2;
    d->index = tp_alloc(c, cap * sizeof(uint32_t));
    d->index_cap = cap;
    for (size_t i = 0; i < d->n; i++)
        if (indexable(d->keys[i])) index_put(d, i);
}

long tv_dict_find(tp_ctx *c, const tv_dict *d, tv_value k) {
    if (d->index && indexable(k)) {
        size_t m = d->index_cap - 1;
        for (size_t s = key_hash(k) & m; d->index[s]; s = (s + 1) & m)
            if (tv_eq(c, d->keys[d->index[s] - 1], k)) return (long)d->index[s] - 1;
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (tv_eq(c, d->keys[i], k)) return (long)i;
    return -1;
}

tv_value *tv_dict_get_str(const tv_dict *d, const char *key) {
    size_t n = strlen(key);
    if (d->index) {
        size_t m = d->index_cap - 1;
        for (size_t s = str_hash(key, n) & m; d->index[s]; s = (s + 1) & m) {
            const tv_value *k = &d->keys[d->index[s] - 1];
            if (k->type == TV_STR && k->u.s.n == n && memcmp(k->u.s.p, key, n) == 0) return &d->vals[d->index[s] - 1];
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].type == TV_STR && d->keys[i].u.s.n == n && memcmp(d->keys[i].u.s.p, key, n) == 0)
            return &d->vals[i];
    return NULL;
}

void tv_dict_set(tp_ctx *c, tv_dict *d, tv_value k, tv_value v) {
    long i = tv_dict_find(c, d, k);
    if (i >= 0) {
        d->vals[i] = v;
        return;
    }
    if (d->n >= UINT32_MAX - 1) tp_fail(c, QWENC_ERR_ARG, 0, "a dict of more than 2^32 entries");
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        tv_value *nk = tp_alloc(c, cap * sizeof(tv_value)), *nv = tp_alloc(c, cap * sizeof(tv_value));
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof(tv_value));
            memcpy(nv, d->vals, d->n * sizeof(tv_value));
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n] = v;
    d->n++;
    if (d->index && 2 * d->n > d->index_cap) d->index = NULL; /* rebuilt larger below */
    if (!d->index && d->n > TV_DICT_INDEX_MIN) index_build(c, d);
    else if (d->index && indexable(k)) index_put(d, d->n - 1);
}

/* ---------------------------------------------------------------- buffers */

void tp_buf_add(tp_ctx *c, tp_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = tp_alloc(c, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tp_buf_addz(tp_ctx *c, tp_buf *b, const char *s) { tp_buf_add(c, b, s, strlen(s)); }

void tp_buf_fill(tp_ctx *c, tp_buf *b, char ch, int64_t n) {
    if (n <= 0) return;
    if ((uint64_t)n > TP_ARENA_MAX) /* more than a render may hold: fail before growing to it */
        tp_fail(c, QWENC_ERR_NOMEM, 0, "chat template rendering needs more than %zu MiB", TP_ARENA_MAX >> 20);
    size_t k = (size_t)n;
    tp_buf_add(c, b, "", 0);
    if (b->n + k + 1 > b->cap) { /* room for all of it, then fill in place */
        size_t cap = b->cap;
        while (b->n + k + 1 > cap) cap *= 2;
        char *p = tp_alloc(c, cap);
        memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memset(b->p + b->n, ch, k);
    b->n += k;
    b->p[b->n] = 0;
}
void tp_buf_addc(tp_ctx *c, tp_buf *b, char ch) { tp_buf_add(c, b, &ch, 1); }

void tp_buf_addcp(tp_ctx *c, tp_buf *b, uint32_t cp) {
    char tmp[4];
    size_t n;
    if (cp < 0x80) {
        tmp[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        tmp[0] = (char)(0xC0 | (cp >> 6));
        tmp[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        tmp[0] = (char)(0xE0 | (cp >> 12));
        tmp[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        tmp[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        tmp[0] = (char)(0xF0 | (cp >> 18));
        tmp[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        tmp[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        tmp[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    tp_buf_add(c, b, tmp, n);
}

tv_value tp_buf_value(tp_buf *b) { return tv_str(b->p ? b->p : "", b->n); }

/* ---------------------------------------------------------------- UTF-8 */

uint32_t tu_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    uint32_t c0 = u[k];
    int len = c0 < 0x80 ? 1 : c0 < 0xE0 ? 2 : c0 < 0xF0 ? 3 : 4;
    if (k + (size_t)len > n) len = 1;
    uint32_t cp;
    switch (len) {
    case 1: cp = c0; break;
    case 2: cp = ((c0 & 0x1F) << 6) | (u[k + 1] & 0x3F); break;
    case 3: cp = ((c0 & 0x0F) << 12) | ((u[k + 1] & 0x3F) << 6) | (u[k + 2] & 0x3F); break;
    default: cp = ((c0 & 0x07) << 18) | ((u[k + 1] & 0x3F) << 12) | ((u[k + 2] & 0x3F) << 6) | (u[k + 3] & 0x3F); break;
    }
    *i = k + (size_t)len;
    return cp;
}

size_t tu_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t tu_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (k > 0 && i < n) {
        tu_next(s, n, &i);
        k--;
    }
    return i;
}

int tu_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int in_chars(uint32_t cp, const char *chars, size_t nchars) {
    size_t i = 0;
    while (i < nchars)
        if (tu_next(chars, nchars, &i) == cp) return 1;
    return 0;
}

tv_value tu_strip(tv_value s, const char *chars, size_t nchars, int which) {
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    if (!chars) { /* ASCII whitespace first, a byte at a time (long runs of spaces are what takes time) */
        while ((which & 1) && a < b && tu_isspace((unsigned char)p[a]) && (unsigned char)p[a] < 0x80) a++;
        while ((which & 2) && b > a && tu_isspace((unsigned char)p[b - 1]) && (unsigned char)p[b - 1] < 0x80) b--;
    }
    if (which & 1) {
        while (a < b) {
            size_t j = a;
            uint32_t cp = tu_next(p, b, &j);
            if (chars ? !in_chars(cp, chars, nchars) : !tu_isspace(cp)) break;
            a = j;
        }
    }
    if (which & 2) {
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)p[j] & 0xC0) == 0x80) j--;
            size_t k = j;
            uint32_t cp = tu_next(p, b, &k);
            if (chars ? !in_chars(cp, chars, nchars) : !tu_isspace(cp)) break;
            b = j;
        }
    }
    tv_value r = tv_str(p + a, b - a);
    r.flags = s.flags & TV_F_SAFE;
    return r;
}

size_t tu_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c0 = u[i];
        size_t len;
        uint32_t min;
        if (c0 < 0x80) {
            i++;
            continue;
        } else if (c0 >= 0xC2 && c0 <= 0xDF) {
            len = 2, min = 0x80;
        } else if (c0 >= 0xE0 && c0 <= 0xEF) {
            len = 3, min = 0x800;
        } else if (c0 >= 0xF0 && c0 <= 0xF4) {
            len = 4, min = 0x10000;
        } else {
            return i;
        }
        if (i + len > n) return i;
        for (size_t k = 1; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return i;
        size_t j = i;
        uint32_t cp = tu_next(s, n, &j);
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

/* ---------------------------------------------------------------- Python semantics */

const char *tv_type_name(tv_value v) {
    switch ((tv_type)v.type) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return (v.flags & TV_F_SAFE) ? "Markup" : "str";
    case TV_LIST: return (v.flags & TV_F_TUPLE) ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_FUNC: return v.u.fn->kind == TF_MACRO ? "Macro" : "function";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

int tv_truthy(tv_value v) {
    switch ((tv_type)v.type) {
    case TV_UNDEF:
    case TV_NONE: return 0;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.u.s.n != 0;
    case TV_LIST: return v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(tv_value v) { return v.type == TV_BOOL || v.type == TV_INT || v.type == TV_FLOAT; }
static double num_f(tv_value v) { return v.type == TV_FLOAT ? v.u.f : v.type == TV_INT ? (double)v.u.i : v.u.b; }

_Noreturn static void too_deep(tp_ctx *c, const char *doing) {
    tp_fail(c, QWENC_ERR_ARG, 0, "RecursionError: maximum recursion depth exceeded %s (values nested more than %d levels)",
            doing, TV_MAX_DEPTH);
}

static int eq_rec(tp_ctx *c, tv_value a, tv_value b, int depth) {
    tp_tick(c, 1);
    if (is_num(a) && is_num(b)) {
        if (a.type != TV_FLOAT && b.type != TV_FLOAT) return (a.type == TV_INT ? a.u.i : a.u.b) == (b.type == TV_INT ? b.u.i : b.u.b);
        return num_f(a) == num_f(b);
    }
    if (a.type != b.type) return 0;
    if (depth > TV_MAX_DEPTH && (a.type == TV_LIST || a.type == TV_DICT)) too_deep(c, "in comparison");
    switch ((tv_type)a.type) {
    case TV_UNDEF:
    case TV_NONE: return 1;
    case TV_STR:
        if (a.u.s.n != b.u.s.n) return 0;
        tp_tick(c, a.u.s.n / 8);
        return memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case TV_LIST:
        if ((a.flags & TV_F_TUPLE) != (b.flags & TV_F_TUPLE) || a.u.l->n != b.u.l->n) return 0;
        if (a.u.l == b.u.l) return 1; /* Python compares items by identity first */
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_rec(c, a.u.l->items[i], b.u.l->items[i], depth + 1)) return 0;
        return 1;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        if (a.u.d == b.u.d) return 1;
        for (size_t i = 0; i < a.u.d->n; i++) {
            long j = tv_dict_find(c, b.u.d, a.u.d->keys[i]);
            if (j < 0 || !eq_rec(c, a.u.d->vals[i], b.u.d->vals[j], depth + 1)) return 0;
        }
        return 1;
    case TV_NS: return a.u.d == b.u.d;
    case TV_FUNC: return a.u.fn == b.u.fn;
    case TV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int tv_eq(tp_ctx *c, tv_value a, tv_value b) { return eq_rec(c, a, b, 0); }

static int lt_rec(tp_ctx *c, int line, tv_value a, tv_value b, int depth) {
    tp_tick(c, 1);
    if (is_num(a) && is_num(b)) {
        if (a.type != TV_FLOAT && b.type != TV_FLOAT) return (a.type == TV_INT ? a.u.i : a.u.b) < (b.type == TV_INT ? b.u.i : b.u.b);
        return num_f(a) < num_f(b);
    }
    if (a.type == TV_UNDEF) tp_undef_fail(c, line, a);
    if (b.type == TV_UNDEF) tp_undef_fail(c, line, b);
    if (a.type == TV_STR && b.type == TV_STR) {
        size_t n = QW_MIN(a.u.s.n, b.u.s.n);
        tp_tick(c, n / 8);
        int r = memcmp(a.u.s.p, b.u.s.p, n);
        return r < 0 || (r == 0 && a.u.s.n < b.u.s.n);
    }
    if (a.type == TV_LIST && b.type == TV_LIST && (a.flags & TV_F_TUPLE) == (b.flags & TV_F_TUPLE)) {
        if (depth > TV_MAX_DEPTH) too_deep(c, "in comparison");
        size_t n = QW_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++)
            if (!eq_rec(c, a.u.l->items[i], b.u.l->items[i], depth + 1))
                return lt_rec(c, line, a.u.l->items[i], b.u.l->items[i], depth + 1);
        return a.u.l->n < b.u.l->n;
    }
    tp_fail(c, QWENC_ERR_ARG, line, "TypeError: '<' not supported between instances of '%s' and '%s'",
            tv_type_name(a), tv_type_name(b));
}

int tv_lt(tp_ctx *c, int line, tv_value a, tv_value b) { return lt_rec(c, line, a, b, 0); }

size_t tv_len(tp_ctx *c, int line, tv_value v) {
    switch ((tv_type)v.type) {
    case TV_UNDEF: return 0;
    case TV_STR: tp_tick(c, v.u.s.n / 8); return tu_len(v.u.s.p, v.u.s.n);
    case TV_LIST: return v.u.l->n;
    case TV_DICT: return v.u.d->n;
    case TV_LOOP: return v.u.loop->items->n;
    default: tp_fail(c, QWENC_ERR_ARG, line, "TypeError: object of type '%s' has no len()", tv_type_name(v));
    }
}

tv_list *tv_iter(tp_ctx *c, int line, tv_value v) {
    switch ((tv_type)v.type) {
    case TV_UNDEF: return tv_list_new(c, 0).u.l;
    case TV_LIST: return v.u.l;
    case TV_DICT: {
        tv_list *l = tv_list_new(c, v.u.d->n).u.l;
        for (size_t i = 0; i < v.u.d->n; i++) tv_list_push(c, l, v.u.d->keys[i]);
        return l;
    }
    case TV_STR: {
        tv_list *l = tv_list_new(c, v.u.s.n).u.l;
        size_t i = 0;
        while (i < v.u.s.n) {
            size_t j = i;
            tu_next(v.u.s.p, v.u.s.n, &j);
            tv_list_push(c, l, tv_str(v.u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    default: tp_fail(c, QWENC_ERR_ARG, line, "TypeError: '%s' object is not iterable", tv_type_name(v));
    }
}

/* ---------------------------------------------------------------- str() and repr() */

void tv_float_repr(double f, char out[32]) {
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    /* shortest %.{p}e that reads back: the digits Python's repr uses */
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof(e), "%.*e", p, f);
        if (strtod(e, NULL) == f) break;
    }
    /* split "-d.ddde+XX" into sign, digits, exponent */
    char digits[24];
    int nd = 0, neg = 0;
    const char *q = e;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(q + 1);
    int decpt = exp10 + 1; /* value = 0.digits * 10^decpt */
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt <= -4 || decpt > 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        return;
    }
    if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, digits, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        *o++ = '.';
        *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = 0;
}

/* Python's str.isprintable() for one code point. */
static int py_printable(uint32_t cp) {
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7F) return 0;
    if (cp < 0x7F) return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

static void str_repr(tp_ctx *c, tp_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    tp_buf_addc(c, b, q);
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t cp = tu_next(s, n, &i);
        char tmp[16];
        if (cp == (uint32_t)q || cp == '\\') {
            tp_buf_addc(c, b, '\\');
            tp_buf_addc(c, b, (char)cp);
        } else if (cp == '\t') {
            tp_buf_addz(c, b, "\\t");
        } else if (cp == '\n') {
            tp_buf_addz(c, b, "\\n");
        } else if (cp == '\r') {
            tp_buf_addz(c, b, "\\r");
        } else if (py_printable(cp)) {
            tp_buf_add(c, b, s + st, i - st);
        } else {
            if (cp <= 0xFF) snprintf(tmp, sizeof(tmp), "\\x%02x", cp);
            else if (cp <= 0xFFFF) snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
            else snprintf(tmp, sizeof(tmp), "\\U%08x", cp);
            tp_buf_addz(c, b, tmp);
        }
    }
    tp_buf_addc(c, b, q);
}

static void scalar_str(tp_ctx *c, tp_buf *b, tv_value v) {
    char tmp[40];
    switch ((tv_type)v.type) {
    case TV_NONE: tp_buf_addz(c, b, "None"); break;
    case TV_BOOL: tp_buf_addz(c, b, v.u.b ? "True" : "False"); break;
    case TV_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i);
        tp_buf_addz(c, b, tmp);
        break;
    case TV_FLOAT:
        tv_float_repr(v.u.f, tmp);
        tp_buf_addz(c, b, tmp);
        break;
    default: break;
    }
}

/* 1 if list or dict p is being printed by a caller of this repr (Python's Py_ReprEnter). */
static int repr_entered(const tp_ctx *c, const void *p) {
    for (int i = 0; i < c->repr_n; i++)
        if (c->repr_path[i] == p) return 1;
    return 0;
}

void tv_repr_append(tp_ctx *c, tp_buf *b, tv_value v) {
    tp_tick(c, 1);
    if (v.type == TV_LIST || v.type == TV_DICT || v.type == TV_NS) {
        const void *p = v.type == TV_LIST ? (const void *)v.u.l : (const void *)v.u.d;
        int tup = v.type == TV_LIST && (v.flags & TV_F_TUPLE);
        if (v.type == TV_NS) tp_buf_addz(c, b, "<Namespace ");
        if (repr_entered(c, p)) {
            tp_buf_addz(c, b, v.type != TV_LIST ? "{...}" : tup ? "(...)" : "[...]");
        } else {
            if (c->repr_n >= TV_MAX_DEPTH) too_deep(c, "while getting the repr of an object");
            c->repr_path[c->repr_n++] = p;
            if (v.type == TV_LIST) {
                tp_buf_addc(c, b, tup ? '(' : '[');
                for (size_t i = 0; i < v.u.l->n; i++) {
                    if (i) tp_buf_addz(c, b, ", ");
                    tv_repr_append(c, b, v.u.l->items[i]);
                }
                if (tup && v.u.l->n == 1) tp_buf_addc(c, b, ',');
                tp_buf_addc(c, b, tup ? ')' : ']');
            } else {
                tp_buf_addc(c, b, '{');
                for (size_t i = 0; i < v.u.d->n; i++) {
                    if (i) tp_buf_addz(c, b, ", ");
                    tv_repr_append(c, b, v.u.d->keys[i]);
                    tp_buf_addz(c, b, ": ");
                    tv_repr_append(c, b, v.u.d->vals[i]);
                }
                tp_buf_addc(c, b, '}');
            }
            c->repr_n--;
        }
        if (v.type == TV_NS) tp_buf_addc(c, b, '>');
        return;
    }
    switch ((tv_type)v.type) {
    case TV_UNDEF: tp_buf_addz(c, b, "Undefined"); break;
    case TV_STR:
        if (v.flags & TV_F_SAFE) {
            tp_buf_addz(c, b, "Markup(");
            str_repr(c, b, v.u.s.p, v.u.s.n);
            tp_buf_addc(c, b, ')');
        } else {
            str_repr(c, b, v.u.s.p, v.u.s.n);
        }
        break;
    case TV_FUNC:
        tp_buf_addz(c, b, v.u.fn->kind == TF_MACRO ? "<Macro '" : "<function '");
        tp_buf_addz(c, b, v.u.fn->name);
        tp_buf_addz(c, b, "'>");
        break;
    case TV_LOOP: {
        char tmp[64];
        snprintf(tmp, sizeof(tmp), "<LoopContext %zu/%zu>", v.u.loop->index0 + 1, v.u.loop->items->n);
        tp_buf_addz(c, b, tmp);
        break;
    }
    default: scalar_str(c, b, v); break;
    }
}

void tv_str_append(tp_ctx *c, tp_buf *b, tv_value v) {
    if (v.type == TV_UNDEF) return;
    if (v.type == TV_STR) {
        tp_buf_add(c, b, v.u.s.p, v.u.s.n);
        return;
    }
    tv_repr_append(c, b, v);
}

tv_value tv_to_str(tp_ctx *c, tv_value v) {
    if (v.type == TV_STR) return v;
    if (v.type == TV_UNDEF) return tv_str("", 0);
    tp_buf b = {0};
    tv_str_append(c, &b, v);
    return tp_buf_value(&b);
}

/* ---------------------------------------------------------------- JSON out (json.dumps) */

static void json_str(tp_ctx *c, tp_buf *b, const char *s, size_t n, int ensure_ascii) {
    tp_buf_addc(c, b, '"');
    size_t i = 0;
    char tmp[16];
    while (i < n) {
        size_t st = i;
        uint32_t cp = tu_next(s, n, &i);
        switch (cp) {
        case '"': tp_buf_addz(c, b, "\\\""); continue;
        case '\\': tp_buf_addz(c, b, "\\\\"); continue;
        case '\n': tp_buf_addz(c, b, "\\n"); continue;
        case '\r': tp_buf_addz(c, b, "\\r"); continue;
        case '\t': tp_buf_addz(c, b, "\\t"); continue;
        case '\b': tp_buf_addz(c, b, "\\b"); continue;
        case '\f': tp_buf_addz(c, b, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(tmp, sizeof(tmp), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
            }
            tp_buf_addz(c, b, tmp);
        } else {
            tp_buf_add(c, b, s + st, i - st);
        }
    }
    tp_buf_addc(c, b, '"');
}

static void json_newline(tp_ctx *c, tp_buf *b, const tv_json_opts *o, int level) {
    tp_buf_addc(c, b, '\n');
    for (int i = 0; i < o->indent * level; i++) tp_buf_addc(c, b, ' ');
}

/* A dict key as json.dumps converts it to a string. */
static tv_value json_key(tp_ctx *c, int line, tv_value k) {
    char tmp[40];
    switch ((tv_type)k.type) {
    case TV_STR: return k;
    case TV_NONE: return tv_strz("null");
    case TV_BOOL: return tv_strz(k.u.b ? "true" : "false");
    case TV_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)k.u.i);
        return tv_str_copy(c, tmp, strlen(tmp));
    case TV_FLOAT:
        if (isnan(k.u.f)) return tv_strz("NaN");
        if (isinf(k.u.f)) return tv_strz(k.u.f < 0 ? "-Infinity" : "Infinity");
        tv_float_repr(k.u.f, tmp);
        return tv_str_copy(c, tmp, strlen(tmp));
    default:
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: keys must be str, int, float, bool or None, not %s", tv_type_name(k));
    }
}

void tv_json_append(tp_ctx *c, int line, tp_buf *b, tv_value v, const tv_json_opts *o, int level) {
    const char *item_sep = o->item_sep ? o->item_sep : (o->indent >= 0 ? "," : ", ");
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    char tmp[40];
    tp_tick(c, 1);
    if (level > TV_MAX_DEPTH)
        tp_fail(c, QWENC_ERR_ARG, line,
                "RecursionError: maximum recursion depth exceeded while encoding a JSON object (values nested more than "
                "%d levels)", TV_MAX_DEPTH);
    switch ((tv_type)v.type) {
    case TV_NONE: tp_buf_addz(c, b, "null"); break;
    case TV_BOOL: tp_buf_addz(c, b, v.u.b ? "true" : "false"); break;
    case TV_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i);
        tp_buf_addz(c, b, tmp);
        break;
    case TV_FLOAT:
        if (isnan(v.u.f)) tp_buf_addz(c, b, "NaN");
        else if (isinf(v.u.f)) tp_buf_addz(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            tv_float_repr(v.u.f, tmp);
            tp_buf_addz(c, b, tmp);
        }
        break;
    case TV_STR: json_str(c, b, v.u.s.p, v.u.s.n, o->ensure_ascii); break;
    case TV_LIST:
        if (v.u.l->n == 0) {
            tp_buf_addz(c, b, "[]");
            break;
        }
        tp_buf_addc(c, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tp_buf_addz(c, b, item_sep);
            if (o->indent >= 0) json_newline(c, b, o, level + 1);
            tv_json_append(c, line, b, v.u.l->items[i], o, level + 1);
        }
        if (o->indent >= 0) json_newline(c, b, o, level);
        tp_buf_addc(c, b, ']');
        break;
    case TV_DICT: {
        if (v.u.d->n == 0) {
            tp_buf_addz(c, b, "{}");
            break;
        }
        size_t n = v.u.d->n;
        size_t *order = tp_alloc(c, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys) {
            tv_value *idx = tp_alloc(c, n * sizeof(tv_value)), *keys = tp_alloc(c, n * sizeof(tv_value));
            for (size_t i = 0; i < n; i++) {
                if (v.u.d->keys[i].type != TV_STR)
                    tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "tojson(sort_keys=true) supports only string keys, found %s",
                            tv_type_name(v.u.d->keys[i]));
                idx[i] = tv_int((int64_t)i);
                keys[i] = v.u.d->keys[i];
            }
            tp_sort_by_keys(c, line, idx, keys, n, 0);
            for (size_t i = 0; i < n; i++) order[i] = (size_t)idx[i].u.i;
        }
        tp_buf_addc(c, b, '{');
        for (size_t k = 0; k < n; k++) {
            size_t i = order[k];
            if (k) tp_buf_addz(c, b, item_sep);
            if (o->indent >= 0) json_newline(c, b, o, level + 1);
            tv_value key = json_key(c, line, v.u.d->keys[i]);
            json_str(c, b, key.u.s.p, key.u.s.n, o->ensure_ascii);
            tp_buf_addz(c, b, key_sep);
            tv_json_append(c, line, b, v.u.d->vals[i], o, level + 1);
        }
        if (o->indent >= 0) json_newline(c, b, o, level);
        tp_buf_addc(c, b, '}');
        break;
    }
    default:
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: Object of type %s is not JSON serializable", tv_type_name(v));
    }
}

/* ---------------------------------------------------------------- JSON in (json.loads) */

typedef struct {
    tp_ctx *c;
    const char *s;
    size_t n, i;
    const char *what;
    int depth;
} json_rd;

_Noreturn static void jfail(json_rd *r, const char *why) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < r->i && k < r->n; k++) {
        if (r->s[k] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    tp_fail(r->c, QWENC_ERR_FORMAT, 0, "%s: %s at line %zu column %zu", r->what, why, line, col);
}

static void jws(json_rd *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int jlit(json_rd *r, const char *lit) {
    size_t n = strlen(lit);
    if (r->i + n <= r->n && memcmp(r->s + r->i, lit, n) == 0) {
        r->i += n;
        return 1;
    }
    return 0;
}

static int hex4(json_rd *r, uint32_t *out) {
    if (r->i + 4 > r->n) return 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char ch = r->s[r->i + k];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (uint32_t)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (uint32_t)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (uint32_t)(ch - 'A' + 10);
        else return 0;
    }
    r->i += 4;
    *out = v;
    return 1;
}

static tv_value jstring(json_rd *r) {
    r->i++; /* opening quote */
    tp_buf b = {0};
    for (;;) {
        if (r->i >= r->n) jfail(r, "unterminated string");
        unsigned char ch = (unsigned char)r->s[r->i];
        if (ch == '"') {
            r->i++;
            break;
        }
        if (ch < 0x20) jfail(r, "invalid control character in string");
        if (ch != '\\') {
            size_t st = r->i;
            while (r->i < r->n && r->s[r->i] != '"' && r->s[r->i] != '\\' && (unsigned char)r->s[r->i] >= 0x20) r->i++;
            tp_buf_add(r->c, &b, r->s + st, r->i - st);
            continue;
        }
        r->i++;
        if (r->i >= r->n) jfail(r, "unterminated string");
        char e = r->s[r->i++];
        uint32_t cp;
        switch (e) {
        case '"': tp_buf_addc(r->c, &b, '"'); break;
        case '\\': tp_buf_addc(r->c, &b, '\\'); break;
        case '/': tp_buf_addc(r->c, &b, '/'); break;
        case 'b': tp_buf_addc(r->c, &b, '\b'); break;
        case 'f': tp_buf_addc(r->c, &b, '\f'); break;
        case 'n': tp_buf_addc(r->c, &b, '\n'); break;
        case 'r': tp_buf_addc(r->c, &b, '\r'); break;
        case 't': tp_buf_addc(r->c, &b, '\t'); break;
        case 'u':
            if (!hex4(r, &cp)) jfail(r, "invalid \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (!(r->i + 2 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u')) jfail(r, "unpaired surrogate escape");
                r->i += 2;
                if (!hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF) jfail(r, "unpaired surrogate escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                jfail(r, "unpaired surrogate escape");
            }
            tp_buf_addcp(r->c, &b, cp);
            break;
        default: r->i--; jfail(r, "invalid escape in string");
        }
    }
    return tp_buf_value(&b);
}

static tv_value jvalue(json_rd *r);

static tv_value jnumber(json_rd *r) {
    size_t st = r->i;
    int is_float = 0;
    if (r->s[r->i] == '-') r->i++;
    if (r->i < r->n && r->s[r->i] == '0') {
        r->i++;
    } else if (r->i < r->n && r->s[r->i] >= '1' && r->s[r->i] <= '9') {
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    } else {
        if (jlit(r, "Infinity")) return tv_float(-INFINITY);
        jfail(r, "invalid number");
    }
    if (r->i + 1 < r->n && r->s[r->i] == '.' && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9') {
        is_float = 1;
        r->i++;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        size_t k = r->i + 1;
        if (k < r->n && (r->s[k] == '+' || r->s[k] == '-')) k++;
        if (k < r->n && r->s[k] >= '0' && r->s[k] <= '9') {
            is_float = 1;
            r->i = k;
            while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
        }
    }
    char tmp[400];
    size_t len = r->i - st;
    if (len >= sizeof(tmp)) jfail(r, "number too long");
    memcpy(tmp, r->s + st, len);
    tmp[len] = 0;
    if (is_float) return tv_float(strtod(tmp, NULL));
    errno = 0;
    long long v = strtoll(tmp, NULL, 10);
    if (errno == ERANGE) {
        r->i = st;
        jfail(r, "integer outside the 64-bit range");
    }
    return tv_int(v);
}

static tv_value jvalue(json_rd *r) {
    jws(r);
    if (r->i >= r->n) jfail(r, "unexpected end of input");
    if (++r->depth > TV_MAX_DEPTH) jfail(r, "nested too deeply");
    char ch = r->s[r->i];
    tv_value v;
    if (ch == '{') {
        r->i++;
        v = tv_dict_new(r->c, 0);
        jws(r);
        if (r->i < r->n && r->s[r->i] == '}') {
            r->i++;
        } else {
            for (;;) {
                jws(r);
                if (r->i >= r->n || r->s[r->i] != '"') jfail(r, "expected a string key");
                tv_value k = jstring(r);
                jws(r);
                if (r->i >= r->n || r->s[r->i] != ':') jfail(r, "expected ':'");
                r->i++;
                tv_dict_set(r->c, v.u.d, k, jvalue(r));
                jws(r);
                if (r->i < r->n && r->s[r->i] == ',') {
                    r->i++;
                    continue;
                }
                if (r->i < r->n && r->s[r->i] == '}') {
                    r->i++;
                    break;
                }
                jfail(r, "expected ',' or '}'");
            }
        }
    } else if (ch == '[') {
        r->i++;
        v = tv_list_new(r->c, 0);
        jws(r);
        if (r->i < r->n && r->s[r->i] == ']') {
            r->i++;
        } else {
            for (;;) {
                tv_list_push(r->c, v.u.l, jvalue(r));
                jws(r);
                if (r->i < r->n && r->s[r->i] == ',') {
                    r->i++;
                    continue;
                }
                if (r->i < r->n && r->s[r->i] == ']') {
                    r->i++;
                    break;
                }
                jfail(r, "expected ',' or ']'");
            }
        }
    } else if (ch == '"') {
        v = jstring(r);
    } else if (jlit(r, "true")) {
        v = tv_bool(1);
    } else if (jlit(r, "false")) {
        v = tv_bool(0);
    } else if (jlit(r, "null")) {
        v = tv_none();
    } else if (jlit(r, "NaN")) {
        v = tv_float(NAN);
    } else if (jlit(r, "Infinity")) {
        v = tv_float(INFINITY);
    } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
        v = jnumber(r);
    } else {
        jfail(r, "unexpected character");
    }
    r->depth--;
    return v;
}

tv_value tv_json_parse(tp_ctx *c, const char *text, size_t n, const char *what) {
    json_rd r = {c, text, n, 0, what, 0};
    size_t ok = tu_valid_prefix(text, n);
    if (ok != n) {
        r.i = ok;
        jfail(&r, "invalid UTF-8");
    }
    tv_value v = jvalue(&r);
    jws(&r);
    if (r.i != n) jfail(&r, "extra data after the JSON value");
    return v;
}
