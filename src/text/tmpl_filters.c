/*
 * tmpl_filters.c - the filters, tests, methods and global functions a chat template can call.
 *
 * Filters and tests follow jinja2/filters.py and jinja2/tests.py (Jinja 3.1) with autoescape off, as in
 * transformers, except tojson, which is transformers' own: json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False) (no HTML escaping, ", " / ": " separators unless indent is given).
 * Methods are those of Python's str, dict and list that templates use; the ones that would modify a
 * value (list.append, dict.update...) are refused, as jinja2.sandbox.ImmutableSandboxedEnvironment
 * refuses them. Globals: range, namespace, dict (Jinja), raise_exception and strftime_now
 * (transformers).
 *
 * Text case mapping uses utf8proc's simple mappings; Python uses the full ones, which differ only for
 * a few characters (German sharp s, dotted capital I...).
 *
 * Work: a filter, test or method costs render steps (tp_tick) in proportion to the string it is applied to, the
 * items it walks without allocating, and the bytes a substring search scans, so a loop over such calls on a long string
 * stops at the render's bound instead of running for hours.
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "text/tmpl.h"

/* ---------------------------------------------------------------- argument binding */

#define MAXP 6

/* Bind positional and keyword arguments to the parameters of a filter / method; given[i] says which
   were passed. */
static void bind(tp_ctx *c, int line, const char *what, const char *const *params, const tv_value *args,
                 size_t nargs, const char **names, const tv_value *kw, size_t nkw, tv_value *out, int *given) {
    size_t np = 0;
    while (params[np]) np++;
    for (size_t i = 0; i < MAXP; i++) {
        out[i] = tv_none();
        given[i] = 0;
    }
    if (nargs > np) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s takes at most %zu argument(s) (%zu given)", what, np, nargs);
    for (size_t i = 0; i < nargs; i++) {
        out[i] = args[i];
        given[i] = 1;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(params[i], names[k])) i++;
        if (i == np) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s got an unexpected keyword argument '%s'", what, names[k]);
        if (given[i]) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s got multiple values for argument '%s'", what, names[k]);
        out[i] = kw[k];
        given[i] = 1;
    }
}

static int64_t need_int(tp_ctx *c, int line, const char *what, tv_value v) {
    if (v.type == TV_INT) return v.u.i;
    if (v.type == TV_BOOL) return v.u.b;
    tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s expects an integer, got %s", what, tv_type_name(v));
}

static tv_value need_str(tp_ctx *c, int line, const char *what, tv_value v) {
    if (v.type == TV_STR) return v;
    if (v.type == TV_UNDEF) tp_undef_fail(c, line, v);
    tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s expects a string, got %s", what, tv_type_name(v));
}

static char *cstr(tp_ctx *c, tv_value s) {
    char *p = tp_alloc(c, s.u.s.n + 1);
    memcpy(p, s.u.s.p, s.u.s.n);
    return p;
}

/* ---------------------------------------------------------------- string helpers */

typedef enum { CASE_LOWER, CASE_UPPER, CASE_TITLE } case_kind;

static uint32_t map_case(uint32_t cp, case_kind k) {
    utf8proc_int32_t r = k == CASE_LOWER ? utf8proc_tolower((utf8proc_int32_t)cp)
                         : k == CASE_UPPER ? utf8proc_toupper((utf8proc_int32_t)cp)
                                           : utf8proc_totitle((utf8proc_int32_t)cp);
    return (uint32_t)r;
}

static tv_value str_case(tp_ctx *c, tv_value s, case_kind k) {
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    size_t i = 0;
    while (i < s.u.s.n) tp_buf_addcp(c, &b, map_case(tu_next(s.u.s.p, s.u.s.n, &i), k));
    return tp_buf_value(&b);
}

static int is_cased(uint32_t cp) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

static int is_alpha(uint32_t cp) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

static int is_numeric(uint32_t cp) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

/* Python str.capitalize(): first character title-cased, the rest lower-cased. */
static tv_value str_capitalize(tp_ctx *c, tv_value s) {
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    size_t i = 0;
    int first = 1;
    while (i < s.u.s.n) {
        uint32_t cp = tu_next(s.u.s.p, s.u.s.n, &i);
        tp_buf_addcp(c, &b, map_case(cp, first ? CASE_TITLE : CASE_LOWER));
        first = 0;
    }
    return tp_buf_value(&b);
}

/* Python str.title(): a letter after a cased letter is lower-cased, any other is title-cased. */
static tv_value str_title(tp_ctx *c, tv_value s) {
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    size_t i = 0;
    int prev_cased = 0;
    while (i < s.u.s.n) {
        uint32_t cp = tu_next(s.u.s.p, s.u.s.n, &i);
        tp_buf_addcp(c, &b, map_case(cp, prev_cased ? CASE_LOWER : CASE_TITLE));
        prev_cased = is_cased(cp);
    }
    return tp_buf_value(&b);
}

/* Jinja's title filter: words start after runs of "-", whitespace, "(", "{", "[" or "<". */
static tv_value jinja_title(tp_ctx *c, tv_value s) {
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    size_t i = 0;
    int start = 1;
    while (i < s.u.s.n) {
        uint32_t cp = tu_next(s.u.s.p, s.u.s.n, &i);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tu_isspace(cp);
        tp_buf_addcp(c, &b, map_case(cp, start ? CASE_UPPER : CASE_LOWER));
        start = sep;
    }
    return tp_buf_value(&b);
}

/* The work of scanning n bytes, in render steps. */
static void tick_bytes(tp_ctx *c, size_t n) { tp_tick(c, 1 + n / 8); }

/* The work of a filter, test or method on v: on a string, most walk it once. (On a list, those that walk it
 * allocate as they go, compare, or tick per item: length stays O(1), as in Python.) */
static void tick_value(tp_ctx *c, tv_value v) { tp_tick(c, 1 + (v.type == TV_STR ? v.u.s.n / 8 : 0)); }

static long find_bytes(tp_ctx *c, tv_value s, tv_value sub, size_t from) {
    if (sub.u.s.n == 0) return from <= s.u.s.n ? (long)from : -1;
    if (from > s.u.s.n) return -1;
    const char *hit = memmem(s.u.s.p + from, s.u.s.n - from, sub.u.s.p, sub.u.s.n); /* linear (two-way) */
    tick_bytes(c, (hit ? (size_t)(hit - s.u.s.p) + sub.u.s.n : s.u.s.n) - from);
    return hit ? (long)(hit - s.u.s.p) : -1;
}

/* s reversed, in the arena (searching it forward searches s backward, in linear time). */
static tv_value reversed(tp_ctx *c, tv_value s) {
    char *r = tp_alloc(c, s.u.s.n + 1);
    for (size_t k = 0; k < s.u.s.n; k++) r[k] = s.u.s.p[s.u.s.n - 1 - k];
    return tv_str(r, s.u.s.n);
}

static long rfind_bytes(tp_ctx *c, tv_value s, tv_value sub) {
    if (sub.u.s.n > s.u.s.n) return -1;
    if (sub.u.s.n == 0) return (long)s.u.s.n;
    long k = find_bytes(c, reversed(c, s), reversed(c, sub), 0);
    return k < 0 ? -1 : (long)(s.u.s.n - (size_t)k - sub.u.s.n);
}

tv_value tp_str_replace(tp_ctx *c, tv_value s, tv_value old, tv_value new_, int64_t count) {
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    if (old.u.s.n == 0) { /* Python inserts new before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (i < s.u.s.n) {
            if (count < 0 || done < count) {
                tp_buf_add(c, &b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            size_t j = i;
            tu_next(s.u.s.p, s.u.s.n, &j);
            tp_buf_add(c, &b, s.u.s.p + i, j - i);
            i = j;
        }
        if (count < 0 || done < count) tp_buf_add(c, &b, new_.u.s.p, new_.u.s.n);
        return tp_buf_value(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        long k = find_bytes(c, s, old, i);
        if (k < 0) break;
        tp_buf_add(c, &b, s.u.s.p + i, (size_t)k - i);
        tp_buf_add(c, &b, new_.u.s.p, new_.u.s.n);
        i = (size_t)k + old.u.s.n;
        done++;
    }
    tp_buf_add(c, &b, s.u.s.p + i, s.u.s.n - i);
    return tp_buf_value(&b);
}

/* Python str.split / str.rsplit. */
static tv_value str_split(tp_ctx *c, int line, tv_value s, tv_value sep, int64_t maxsplit, int from_right) {
    tv_value out = tv_list_new(c, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.type == TV_NONE) {
        /* runs of whitespace separate; leading / trailing whitespace gives no empty strings */
        size_t *st = tp_alloc(c, (n + 1) * sizeof(size_t) * 2), nw = 0;
        size_t i = 0;
        while (i < n) {
            size_t j = i;
            if (tu_isspace(tu_next(p, n, &j))) {
                i = j;
                continue;
            }
            size_t a = i;
            while (i < n) {
                j = i;
                if (tu_isspace(tu_next(p, n, &j))) break;
                i = j;
            }
            st[2 * nw] = a;
            st[2 * nw + 1] = i;
            nw++;
        }
        if (maxsplit < 0 || (size_t)maxsplit + 1 >= nw) {
            for (size_t k = 0; k < nw; k++) tv_list_push(c, out.u.l, tv_str(p + st[2 * k], st[2 * k + 1] - st[2 * k]));
            return out;
        }
        size_t keep = (size_t)maxsplit;
        if (!from_right) {
            for (size_t k = 0; k < keep; k++) tv_list_push(c, out.u.l, tv_str(p + st[2 * k], st[2 * k + 1] - st[2 * k]));
            tv_value rest = tu_strip(tv_str(p + st[2 * keep], n - st[2 * keep]), NULL, 0, 0);
            tv_list_push(c, out.u.l, rest);
        } else {
            size_t first = nw - keep;
            tv_list_push(c, out.u.l, tv_str(p, st[2 * (first - 1) + 1])); /* keeps its leading whitespace */
            for (size_t k = first; k < nw; k++) tv_list_push(c, out.u.l, tv_str(p + st[2 * k], st[2 * k + 1] - st[2 * k]));
        }
        return out;
    }
    sep = need_str(c, line, "split()", sep);
    if (sep.u.s.n == 0) tp_fail(c, QWENC_ERR_ARG, line, "ValueError: empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            long k = (maxsplit < 0 || done < maxsplit) ? find_bytes(c, s, sep, i) : -1;
            if (k < 0) break;
            tv_list_push(c, out.u.l, tv_str(p + i, (size_t)k - i));
            i = (size_t)k + sep.u.s.n;
            done++;
        }
        tv_list_push(c, out.u.l, tv_str(p + i, n - i));
        return out;
    }
    /* from the right: the occurrences a forward search finds in the reversed string, which are the ones Python's
     * rsplit takes (non-overlapping, rightmost first); pieces collected backwards, then reversed. Reversed [i, k)
     * is s[n - k, n - i). */
    tv_value rs = reversed(c, s), rsep = reversed(c, sep), rev = tv_list_new(c, 0);
    size_t i = 0;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
        long k = find_bytes(c, rs, rsep, i);
        if (k < 0) break;
        tv_list_push(c, rev.u.l, tv_str(p + n - (size_t)k, (size_t)k - i));
        i = (size_t)k + sep.u.s.n;
        done++;
    }
    tv_list_push(c, rev.u.l, tv_str(p, n - i));
    for (size_t k = rev.u.l->n; k-- > 0;) tv_list_push(c, out.u.l, rev.u.l->items[k]);
    return out;
}

/* Python str.splitlines(keepends). */
static tv_value str_splitlines(tp_ctx *c, tv_value s, int keepends) {
    tv_value out = tv_list_new(c, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0, start = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp = tu_next(p, n, &j);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            i = j;
            continue;
        }
        if (cp == '\r' && j < n && p[j] == '\n') j++;
        tv_list_push(c, out.u.l, tv_str(p + start, (keepends ? j : i) - start));
        start = i = j;
    }
    if (start < n) tv_list_push(c, out.u.l, tv_str(p + start, n - start));
    return out;
}

static tv_value str_join(tp_ctx *c, int line, tv_value sep, tv_list *items, int strict) {
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    tp_tick(c, items->n); /* a list of empty strings allocates nothing */
    for (size_t i = 0; i < items->n; i++) {
        if (i) tp_buf_add(c, &b, sep.u.s.p, sep.u.s.n);
        if (strict && items->items[i].type != TV_STR)
            tp_fail(c, QWENC_ERR_ARG, line, "TypeError: sequence item %zu: expected str instance, %s found", i,
                    tv_type_name(items->items[i]));
        tv_str_append(c, &b, items->items[i]);
    }
    return tp_buf_value(&b);
}

static int str_all(tv_value s, int (*pred)(uint32_t)) {
    if (s.u.s.n == 0) return 0;
    size_t i = 0;
    while (i < s.u.s.n)
        if (!pred(tu_next(s.u.s.p, s.u.s.n, &i))) return 0;
    return 1;
}

static int is_digit_cp(uint32_t cp) {
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_ND || (cat == UTF8PROC_CATEGORY_NO && (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 ||
                                                                          (cp >= 0x2070 && cp <= 0x2089) ||
                                                                          (cp >= 0x2460 && cp <= 0x249B)));
}
static int is_alnum_cp(uint32_t cp) { return is_alpha(cp) || is_numeric(cp); }
static int is_word_cp(uint32_t cp) { return is_alnum_cp(cp) || cp == '_'; }

/* islower / isupper: at least one cased character, and no cased character of the other case. */
static int str_case_is(tv_value s, int upper) {
    int cased = 0;
    size_t i = 0;
    while (i < s.u.s.n) {
        uint32_t cp = tu_next(s.u.s.p, s.u.s.n, &i);
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        if (cat == UTF8PROC_CATEGORY_LT || cat == (upper ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU)) return 0;
        if (cat == (upper ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL)) cased = 1;
    }
    return cased;
}

static tv_value pad_center(tp_ctx *c, tv_value s, int64_t width) {
    int64_t len = (int64_t)tu_len(s.u.s.p, s.u.s.n), marg = width - len;
    if (marg <= 0) return s;
    int64_t left = marg / 2 + (marg & width & 1);
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    tp_buf_fill(c, &b, ' ', left);
    tp_buf_add(c, &b, s.u.s.p, s.u.s.n);
    tp_buf_fill(c, &b, ' ', marg - left);
    return tp_buf_value(&b);
}

/* ---------------------------------------------------------------- sorting and attribute getters */

/* Jinja's make_attrgetter: "a.b.0" looks up a, then b, then item 0, each with getitem semantics. */
static tv_value get_attr_path(tp_ctx *c, int line, tv_value item, tv_value attr) {
    if (attr.type != TV_STR) return tp_getitem(c, line, item, attr);
    size_t i = 0;
    const char *p = attr.u.s.p;
    size_t n = attr.u.s.n;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        tv_value part = tv_str(p + i, j - i);
        int digits = j > i;
        for (size_t k = i; k < j; k++) digits &= p[k] >= '0' && p[k] <= '9';
        if (digits) part = tv_int(strtoll(cstr(c, part), NULL, 10));
        if (item.type == TV_UNDEF) return item;
        item = tp_getitem(c, line, item, part);
        if (j >= n) return item;
        i = j + 1;
    }
}

static tv_value ignore_case(tp_ctx *c, tv_value v) { return v.type == TV_STR ? str_case(c, v, CASE_LOWER) : v; }

/* Stable merge sort of items by keys (Python's sorted(); reverse keeps equal items in order). */
void tp_sort_by_keys(tp_ctx *c, int line, tv_value *items, tv_value *keys, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    tp_sort_by_keys(c, line, items, keys, h, reverse);
    tp_sort_by_keys(c, line, items + h, keys + h, n - h, reverse);
    tv_value *ti = tp_alloc(c, n * sizeof(tv_value)), *tk = tp_alloc(c, n * sizeof(tv_value));
    size_t a = 0, b = h, k = 0;
    while (a < h && b < n) {
        int take_b = reverse ? tv_lt(c, line, keys[a], keys[b]) : tv_lt(c, line, keys[b], keys[a]);
        size_t s = take_b ? b++ : a++;
        ti[k] = items[s];
        tk[k++] = keys[s];
    }
    while (a < h) {
        ti[k] = items[a];
        tk[k++] = keys[a++];
    }
    while (b < n) {
        ti[k] = items[b];
        tk[k++] = keys[b++];
    }
    memcpy(items, ti, n * sizeof(tv_value));
    memcpy(keys, tk, n * sizeof(tv_value));
}

static tv_value copy_list(tp_ctx *c, tv_list *src) {
    tv_value r = tv_list_new(c, src->n);
    for (size_t i = 0; i < src->n; i++) tv_list_push(c, r.u.l, src->items[i]);
    return r;
}

static tv_value tuple2(tp_ctx *c, tv_value a, tv_value b) {
    tv_value t = tv_list_new(c, 2);
    t.flags = TV_F_TUPLE;
    tv_list_push(c, t.u.l, a);
    tv_list_push(c, t.u.l, b);
    return t;
}

/* ---------------------------------------------------------------- tests */

static const char *const TESTS[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
                                    "false", "filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable",
                                    "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
                                    "sequence", "string", "test", "true", "undefined", "upper", NULL};

static const char *const FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join", "last",
    "length", "list", "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr", "replace", "reverse",
    "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson", "trim",
    "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL};

static int in_list(const char *const *l, const char *name) {
    for (; *l; l++)
        if (!strcmp(*l, name)) return 1;
    return 0;
}

int tp_filter_known(const char *name) { return in_list(FILTERS, name); }
int tp_test_known(const char *name) { return in_list(TESTS, name); }

static void need_args(tp_ctx *c, int line, const char *name, size_t nargs, size_t want) {
    if (nargs != want)
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: test '%s' takes %zu argument(s), %zu given", name, want, nargs);
}

int tp_test(tp_ctx *c, int line, const char *name, tv_value v, const tv_value *args, size_t nargs) {
    tv_type t = (tv_type)v.type;
    static const char *const ONE_ARG[] = {"divisibleby", "sameas", "eq", "equalto", "ne", "lt", "lessthan", "le", "gt",
                                          "greaterthan", "ge", "in", "filter", "test", NULL};
    if (!tp_test_known(name)) tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "no test named '%s'", name);
    need_args(c, line, name, nargs, in_list(ONE_ARG, name) ? 1 : 0);
    tick_value(c, v);
    if (!strcmp(name, "defined")) return t != TV_UNDEF;
    if (!strcmp(name, "undefined")) return t == TV_UNDEF;
    if (!strcmp(name, "none")) return t == TV_NONE;
    if (!strcmp(name, "boolean")) return t == TV_BOOL;
    if (!strcmp(name, "true")) return t == TV_BOOL && v.u.b;
    if (!strcmp(name, "false")) return t == TV_BOOL && !v.u.b;
    if (!strcmp(name, "integer")) return t == TV_INT;
    if (!strcmp(name, "float")) return t == TV_FLOAT;
    if (!strcmp(name, "number")) return t == TV_INT || t == TV_FLOAT || t == TV_BOOL;
    if (!strcmp(name, "string")) return t == TV_STR;
    if (!strcmp(name, "mapping")) return t == TV_DICT;
    if (!strcmp(name, "iterable")) return t == TV_UNDEF || t == TV_STR || t == TV_LIST || t == TV_DICT || t == TV_LOOP;
    if (!strcmp(name, "sequence")) return t == TV_UNDEF || t == TV_STR || t == TV_LIST || t == TV_DICT;
    if (!strcmp(name, "callable")) return t == TV_FUNC || t == TV_UNDEF || t == TV_LOOP;
    if (!strcmp(name, "escaped")) return t == TV_STR && (v.flags & TV_F_SAFE);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        tv_value s = tv_to_str(c, v);
        return str_case_is(s, name[0] == 'u');
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        tv_value d = tv_int(2);
        if (name[0] == 'd') d = args[0];
        tv_value r = tp_binop(c, line, OP_MOD, v, d);
        int zero = !tv_truthy(r);
        return name[0] == 'o' ? !zero : zero;
    }
    if (!strcmp(name, "sameas")) {
        tv_value o = args[0];
        if (v.type != o.type) return 0;
        switch (t) {
        case TV_NONE: return 1;
        case TV_BOOL: return v.u.b == o.u.b;
        case TV_INT: return v.u.i == o.u.i;
        case TV_FLOAT: return 0;
        case TV_STR: return v.u.s.p == o.u.s.p && v.u.s.n == o.u.s.n;
        case TV_LIST: return v.u.l == o.u.l;
        case TV_DICT:
        case TV_NS: return v.u.d == o.u.d;
        default: return tv_eq(c, v, o);
        }
    }
    static const struct { const char *name; int op; } CMP[] = {
        {"eq", CMP_EQ}, {"equalto", CMP_EQ}, {"ne", CMP_NE}, {"lt", CMP_LT}, {"lessthan", CMP_LT}, {"le", CMP_LE},
        {"gt", CMP_GT}, {"greaterthan", CMP_GT}, {"ge", CMP_GE}, {"in", CMP_IN}};
    for (size_t k = 0; k < sizeof(CMP) / sizeof(CMP[0]); k++)
        if (!strcmp(name, CMP[k].name)) return tp_compare(c, line, CMP[k].op, v, args[0]);
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.type != TV_STR) return 0;
        char *nm = cstr(c, v);
        return name[0] == 'f' ? tp_filter_known(nm) : tp_test_known(nm);
    }
    tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported test '%s'", name);
}

/* ---------------------------------------------------------------- filters */

/* select / reject: the named test with its arguments, or truthiness when no test is named. */
static int passes(tp_ctx *c, int line, tv_value item, const tv_value *args, size_t nargs) {
    if (nargs == 0) return tv_truthy(item);
    char *nm = cstr(c, need_str(c, line, "select / reject test name", args[0]));
    if (!tp_test_known(nm)) tp_fail(c, QWENC_ERR_ARG, line, "TemplateRuntimeError: no test named '%s'", nm);
    return tp_test(c, line, nm, item, args + 1, nargs - 1);
}

static tv_value select_reject(tp_ctx *c, int line, tv_value v, const tv_value *args, size_t nargs, int by_attr, int want) {
    tv_list *items = tv_iter(c, line, v);
    tv_value out = tv_list_new(c, 0);
    if (by_attr && nargs == 0) tp_fail(c, QWENC_ERR_ARG, line, "FilterArgumentError: missing parameter for attribute name");
    for (size_t i = 0; i < items->n; i++) {
        tv_value x = by_attr ? get_attr_path(c, line, items->items[i], args[0]) : items->items[i];
        if (passes(c, line, x, by_attr ? args + 1 : args, nargs - (size_t)by_attr) == want)
            tv_list_push(c, out.u.l, items->items[i]);
    }
    return out;
}

/* Python's int(x) of a float, for |int: NaN and the infinities raise what Jinja's filter turns into its
 * default; a finite value beyond the 64-bit integers (Python would make a big integer) is an error. */
static tv_value float_to_int(tp_ctx *c, int line, double f, tv_value dflt) {
    if (!isfinite(f)) return dflt;
    if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0))
        tp_fail(c, QWENC_ERR_ARG, line, "OverflowError: %g is beyond the integers a template can hold (64 bits)", f);
    return tv_int((int64_t)f);
}

static tv_value do_round(tp_ctx *c, int line, tv_value v, int64_t prec, const char *method) {
    if (v.type != TV_INT && v.type != TV_FLOAT && v.type != TV_BOOL)
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: type %s doesn't define __round__ method", tv_type_name(v));
    double x = v.type == TV_FLOAT ? v.u.f : (double)(v.type == TV_INT ? v.u.i : v.u.b);
    if (!strcmp(method, "common")) {
        if (v.type != TV_FLOAT) return v.type == TV_BOOL ? tv_int(v.u.b) : v;
        if (!isfinite(x)) return v;
        if (prec >= 0 && prec < 300) { /* correctly rounded, half to even, as Python's round() */
            char tmp[400];
            snprintf(tmp, sizeof(tmp), "%.*f", (int)prec, x);
            return tv_float(strtod(tmp, NULL));
        }
        double p10 = pow(10.0, (double)-prec);
        return tv_float(nearbyint(x / p10) * p10);
    }
    double p10 = pow(10.0, (double)prec);
    if (!strcmp(method, "floor")) return tv_float(floor(x * p10) / p10);
    if (!strcmp(method, "ceil")) return tv_float(ceil(x * p10) / p10);
    tp_fail(c, QWENC_ERR_ARG, line, "FilterArgumentError: method must be common, ceil or floor");
}

/* Python int(str): optional sign, digits with single underscores between them, surrounding whitespace. */
static int parse_int_str(tp_ctx *c, tv_value s, int base, int64_t *out) {
    tv_value t = tu_strip(s, NULL, 0, 3);
    char *p = cstr(c, t), *q = p, *w = p;
    for (; *q; q++) {
        if (*q == '_') {
            if (q == p || q[1] == 0 || q[1] == '_' || q[-1] == '+' || q[-1] == '-') return 0;
            continue;
        }
        *w++ = *q;
    }
    *w = 0;
    if (!*p) return 0;
    char *end;
    long long v = strtoll(p, &end, base);
    if (*end || end == p) return 0;
    *out = v;
    return 1;
}

static int parse_float_str(tp_ctx *c, tv_value s, double *out) {
    tv_value t = tu_strip(s, NULL, 0, 3);
    char *p = cstr(c, t), *end;
    if (!*p) return 0;
    for (char *q = p; *q; q++)
        if (*q == 'x' || *q == 'X') return 0; /* strtod reads hex floats; Python's float() does not */
    double v = strtod(p, &end);
    if (*end) return 0;
    *out = v;
    return 1;
}

static tv_value do_indent(tp_ctx *c, tv_value s, tv_value width, int first, int blank) {
    tv_value ind;
    if (width.type == TV_STR) {
        ind = width;
    } else {
        int64_t w = width.type == TV_INT ? width.u.i : 4;
        tp_buf ib = {0};
        tp_buf_add(c, &ib, "", 0);
        tp_buf_fill(c, &ib, ' ', w);
        ind = tp_buf_value(&ib);
    }
    tp_buf sb = {0};
    tp_buf_add(c, &sb, s.u.s.p, s.u.s.n);
    tp_buf_addc(c, &sb, '\n'); /* Jinja appends a newline so that splitlines keeps a final empty line */
    tv_list *lines = str_splitlines(c, tp_buf_value(&sb), 0).u.l;
    tp_buf b = {0};
    tp_buf_add(c, &b, "", 0);
    if (first) tp_buf_add(c, &b, ind.u.s.p, ind.u.s.n);
    for (size_t i = 0; i < lines->n; i++) {
        tv_value l = lines->items[i];
        if (i) {
            tp_buf_addc(c, &b, '\n');
            if (blank || l.u.s.n) tp_buf_add(c, &b, ind.u.s.p, ind.u.s.n);
        }
        tp_buf_add(c, &b, l.u.s.p, l.u.s.n);
    }
    return tp_buf_value(&b);
}

/* min / max / sum / unique / sort / dictsort need keys computed once per item. */
static tv_value *keys_of(tp_ctx *c, int line, tv_list *items, tv_value attr, int has_attr, int case_sensitive) {
    tv_value *keys = tp_alloc(c, (items->n + 1) * sizeof(tv_value));
    for (size_t i = 0; i < items->n; i++) {
        tv_value k = has_attr ? get_attr_path(c, line, items->items[i], attr) : items->items[i];
        keys[i] = case_sensitive ? k : ignore_case(c, k);
    }
    return keys;
}

tv_value tp_filter(tp_ctx *c, int line, const char *name, tv_value v, const tv_value *args, size_t nargs,
                   const char **names, const tv_value *kw, size_t nkw) {
    if (!tp_filter_known(name)) tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "no filter named '%s'", name);
    tick_value(c, v);
    tv_value a[MAXP];
    int g[MAXP];
    char what[64];
    snprintf(what, sizeof(what), "filter '%s'", name);
#define BIND(...)                                                                    \
    do {                                                                             \
        static const char *const P_[] = {__VA_ARGS__, NULL};                         \
        bind(c, line, what, P_, args, nargs, names, kw, nkw, a, g);                  \
    } while (0)
#define BIND0() bind(c, line, what, (const char *const[]){NULL}, args, nargs, names, kw, nkw, a, g)

    if (!strcmp(name, "tojson")) {
        BIND("ensure_ascii", "indent", "separators", "sort_keys");
        tv_json_opts o = {.indent = -1, .ensure_ascii = g[0] && tv_truthy(a[0]), .sort_keys = g[3] && tv_truthy(a[3])};
        if (g[1] && a[1].type != TV_NONE) {
            if (a[1].type == TV_STR)
                tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported construct: tojson with a string indent");
            int64_t ind = need_int(c, line, "tojson indent", a[1]);
            o.indent = ind < 0 ? 0 : (int)QW_MIN(ind, 64);
        }
        if (g[2] && a[2].type != TV_NONE) {
            tv_list *sp = tv_iter(c, line, a[2]);
            if (sp->n != 2) tp_fail(c, QWENC_ERR_ARG, line, "ValueError: tojson separators must be a pair");
            o.item_sep = cstr(c, need_str(c, line, "tojson separators", sp->items[0]));
            o.key_sep = cstr(c, need_str(c, line, "tojson separators", sp->items[1]));
        }
        tp_buf b = {0};
        tp_buf_add(c, &b, "", 0);
        tv_json_append(c, line, &b, v, &o, 0);
        return tp_buf_value(&b);
    }
    if (!strcmp(name, "trim")) {
        BIND("chars");
        tv_value s = tv_to_str(c, v);
        if (g[0] && a[0].type != TV_NONE) {
            tv_value ch = need_str(c, line, "trim chars", a[0]);
            return tu_strip(s, ch.u.s.p, ch.u.s.n, 3);
        }
        return tu_strip(s, NULL, 0, 3);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        BIND0();
        return tv_int((int64_t)tv_len(c, line, v));
    }
    if (!strcmp(name, "string")) {
        BIND0();
        return tv_to_str(c, v);
    }
    if (!strcmp(name, "safe")) {
        BIND0();
        tv_value s = tv_to_str(c, v);
        s.flags |= TV_F_SAFE;
        return s;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) {
        BIND0();
        if (v.type == TV_STR && (v.flags & TV_F_SAFE) && name[0] != 'f') return v;
        tv_value s = tv_to_str(c, v);
        tp_buf b = {0};
        tp_buf_add(c, &b, "", 0);
        for (size_t i = 0; i < s.u.s.n; i++) {
            switch (s.u.s.p[i]) {
            case '&': tp_buf_addz(c, &b, "&amp;"); break;
            case '<': tp_buf_addz(c, &b, "&lt;"); break;
            case '>': tp_buf_addz(c, &b, "&gt;"); break;
            case '"': tp_buf_addz(c, &b, "&#34;"); break;
            case '\'': tp_buf_addz(c, &b, "&#39;"); break;
            default: tp_buf_addc(c, &b, s.u.s.p[i]);
            }
        }
        tv_value r = tp_buf_value(&b);
        r.flags = TV_F_SAFE;
        return r;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        BIND0();
        return str_case(c, tv_to_str(c, v), name[0] == 'l' ? CASE_LOWER : CASE_UPPER);
    }
    if (!strcmp(name, "capitalize")) {
        BIND0();
        return str_capitalize(c, tv_to_str(c, v));
    }
    if (!strcmp(name, "title")) {
        BIND0();
        return jinja_title(c, tv_to_str(c, v));
    }
    if (!strcmp(name, "center")) {
        BIND("width");
        return pad_center(c, tv_to_str(c, v), g[0] ? need_int(c, line, "center width", a[0]) : 80);
    }
    if (!strcmp(name, "wordcount")) {
        BIND0();
        tv_value s = tv_to_str(c, v);
        int64_t n = 0;
        int in_word = 0;
        size_t i = 0;
        while (i < s.u.s.n) {
            int w = is_word_cp(tu_next(s.u.s.p, s.u.s.n, &i));
            if (w && !in_word) n++;
            in_word = w;
        }
        return tv_int(n);
    }
    if (!strcmp(name, "replace")) {
        BIND("old", "new", "count");
        if (!g[0] || !g[1]) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: filter 'replace' needs old and new");
        int64_t count = (g[2] && a[2].type != TV_NONE) ? need_int(c, line, "replace count", a[2]) : -1;
        return tp_str_replace(c, tv_to_str(c, v), tv_to_str(c, a[0]), tv_to_str(c, a[1]), count);
    }
    if (!strcmp(name, "indent")) {
        BIND("width", "first", "blank");
        return do_indent(c, tv_to_str(c, v), g[0] ? a[0] : tv_int(4), g[1] && tv_truthy(a[1]), g[2] && tv_truthy(a[2]));
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        BIND("default_value", "boolean");
        if (v.type == TV_UNDEF || (g[1] && tv_truthy(a[1]) && !tv_truthy(v))) return g[0] ? a[0] : tv_str("", 0);
        return v;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        BIND0();
        tv_list *items = tv_iter(c, line, v);
        if (!items->n) return tv_undef(c, "No %s item, sequence was empty.", name);
        return items->items[name[0] == 'f' ? 0 : items->n - 1];
    }
    if (!strcmp(name, "list")) {
        BIND0();
        return copy_list(c, tv_iter(c, line, v));
    }
    if (!strcmp(name, "reverse")) {
        BIND0();
        if (v.type == TV_STR) {
            tv_list *ch = tv_iter(c, line, v);
            tp_buf b = {0};
            tp_buf_add(c, &b, "", 0);
            for (size_t i = ch->n; i-- > 0;) tp_buf_add(c, &b, ch->items[i].u.s.p, ch->items[i].u.s.n);
            return tp_buf_value(&b);
        }
        tv_list *items = tv_iter(c, line, v);
        tv_value r = tv_list_new(c, items->n);
        for (size_t i = items->n; i-- > 0;) tv_list_push(c, r.u.l, items->items[i]);
        return r;
    }
    if (!strcmp(name, "items")) {
        BIND0();
        if (v.type == TV_UNDEF) return tv_list_new(c, 0);
        if (v.type != TV_DICT) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: Can only get item pairs from a mapping.");
        tv_value r = tv_list_new(c, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) tv_list_push(c, r.u.l, tuple2(c, v.u.d->keys[i], v.u.d->vals[i]));
        return r;
    }
    if (!strcmp(name, "dictsort")) {
        BIND("case_sensitive", "by", "reverse");
        if (v.type != TV_DICT) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: dictsort needs a mapping, got %s", tv_type_name(v));
        int by_value = 0;
        if (g[1]) {
            tv_value by = need_str(c, line, "dictsort by", a[1]);
            if (by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5)) by_value = 1;
            else if (!(by.u.s.n == 3 && !memcmp(by.u.s.p, "key", 3)))
                tp_fail(c, QWENC_ERR_ARG, line, "FilterArgumentError: You can only sort by either \"key\" or \"value\"");
        }
        size_t n = v.u.d->n;
        tv_value *items = tp_alloc(c, (n + 1) * sizeof(tv_value)), *keys = tp_alloc(c, (n + 1) * sizeof(tv_value));
        for (size_t i = 0; i < n; i++) {
            items[i] = tuple2(c, v.u.d->keys[i], v.u.d->vals[i]);
            tv_value k = by_value ? v.u.d->vals[i] : v.u.d->keys[i];
            keys[i] = (g[0] && tv_truthy(a[0])) ? k : ignore_case(c, k);
        }
        tp_sort_by_keys(c, line, items, keys, n, g[2] && tv_truthy(a[2]));
        tv_value r = tv_list_new(c, n);
        for (size_t i = 0; i < n; i++) tv_list_push(c, r.u.l, items[i]);
        return r;
    }
    if (!strcmp(name, "join")) {
        BIND("d", "attribute");
        tv_list *items = tv_iter(c, line, v);
        if (g[1] && a[1].type != TV_NONE) {
            tv_value m = tv_list_new(c, items->n);
            for (size_t i = 0; i < items->n; i++) tv_list_push(c, m.u.l, get_attr_path(c, line, items->items[i], a[1]));
            items = m.u.l;
        }
        return str_join(c, line, g[0] ? tv_to_str(c, a[0]) : tv_str("", 0), items, 0);
    }
    if (!strcmp(name, "map")) {
        tv_list *items = tv_iter(c, line, v);
        tv_value out = tv_list_new(c, items->n);
        if (nargs == 0) {
            BIND("attribute", "default");
            if (!g[0]) return out;
            for (size_t i = 0; i < items->n; i++) {
                tv_value x = get_attr_path(c, line, items->items[i], a[0]);
                if (x.type == TV_UNDEF && g[1]) x = a[1];
                tv_list_push(c, out.u.l, x);
            }
            return out;
        }
        tv_value fname = need_str(c, line, "map filter name", args[0]);
        char *fn = cstr(c, fname);
        if (!tp_filter_known(fn)) tp_fail(c, QWENC_ERR_ARG, line, "TemplateRuntimeError: no filter named '%s'", fn);
        for (size_t i = 0; i < items->n; i++)
            tv_list_push(c, out.u.l, tp_filter(c, line, fn, items->items[i], args + 1, nargs - 1, names, kw, nkw));
        return out;
    }
    if (!strcmp(name, "select")) return select_reject(c, line, v, args, nargs, 0, 1);
    if (!strcmp(name, "reject")) return select_reject(c, line, v, args, nargs, 0, 0);
    if (!strcmp(name, "selectattr")) return select_reject(c, line, v, args, nargs, 1, 1);
    if (!strcmp(name, "rejectattr")) return select_reject(c, line, v, args, nargs, 1, 0);
    if (!strcmp(name, "sort") || !strcmp(name, "unique") || !strcmp(name, "min") || !strcmp(name, "max")) {
        int is_sort = name[0] == 's';
        if (is_sort) BIND("reverse", "case_sensitive", "attribute");
        else BIND("case_sensitive", "attribute");
        int cs_i = is_sort ? 1 : 0, at_i = is_sort ? 2 : 1;
        tv_list *items = tv_iter(c, line, v);
        int has_attr = g[at_i] && a[at_i].type != TV_NONE;
        tv_value *keys = keys_of(c, line, items, a[at_i], has_attr, g[cs_i] && tv_truthy(a[cs_i]));
        if (is_sort) {
            tv_value r = copy_list(c, items);
            tp_sort_by_keys(c, line, r.u.l->items, keys, r.u.l->n, g[0] && tv_truthy(a[0]));
            return r;
        }
        if (name[0] == 'u') {
            tv_value r = tv_list_new(c, 0), seen = tv_dict_new(c, 0); /* a dict as the set of keys seen */
            for (size_t i = 0; i < items->n; i++) {
                if (tv_dict_find(c, seen.u.d, keys[i]) >= 0) continue;
                tv_dict_set(c, seen.u.d, keys[i], tv_none());
                tv_list_push(c, r.u.l, items->items[i]);
            }
            return r;
        }
        if (!items->n) return tv_undef(c, "No aggregated item, sequence was empty.");
        size_t best = 0;
        for (size_t i = 1; i < items->n; i++)
            if (name[1] == 'i' ? tv_lt(c, line, keys[i], keys[best]) : tv_lt(c, line, keys[best], keys[i])) best = i;
        return items->items[best];
    }
    if (!strcmp(name, "sum")) {
        BIND("attribute", "start");
        tv_list *items = tv_iter(c, line, v);
        tv_value acc = g[1] ? a[1] : tv_int(0);
        tp_tick(c, items->n);
        for (size_t i = 0; i < items->n; i++) {
            tv_value x = (g[0] && a[0].type != TV_NONE) ? get_attr_path(c, line, items->items[i], a[0]) : items->items[i];
            acc = tp_binop(c, line, OP_ADD, acc, x);
        }
        return acc;
    }
    if (!strcmp(name, "abs")) {
        BIND0();
        if (v.type == TV_INT) return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.type == TV_BOOL) return tv_int(v.u.b);
        if (v.type == TV_FLOAT) return tv_float(fabs(v.u.f));
        if (v.type == TV_UNDEF) tp_undef_fail(c, line, v);
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: bad operand type for abs(): '%s'", tv_type_name(v));
    }
    if (!strcmp(name, "round")) {
        BIND("precision", "method");
        const char *method = g[1] ? cstr(c, need_str(c, line, "round method", a[1])) : "common";
        return do_round(c, line, v, g[0] ? need_int(c, line, "round precision", a[0]) : 0, method);
    }
    if (!strcmp(name, "int")) {
        BIND("default", "base");
        tv_value dflt = g[0] ? a[0] : tv_int(0);
        int base = g[1] ? (int)need_int(c, line, "int base", a[1]) : 10;
        int64_t r;
        double f;
        if (v.type == TV_INT) return v;
        if (v.type == TV_BOOL) return tv_int(v.u.b);
        if (v.type == TV_FLOAT) return float_to_int(c, line, v.u.f, dflt);
        if (v.type == TV_STR) {
            if (parse_int_str(c, v, base, &r)) return tv_int(r);
            if (parse_float_str(c, v, &f)) return float_to_int(c, line, f, dflt);
        }
        return dflt;
    }
    if (!strcmp(name, "float")) {
        BIND("default");
        double f;
        if (v.type == TV_FLOAT) return v;
        if (v.type == TV_INT) return tv_float((double)v.u.i);
        if (v.type == TV_BOOL) return tv_float(v.u.b);
        if (v.type == TV_STR && parse_float_str(c, v, &f)) return tv_float(f);
        return g[0] ? a[0] : tv_float(0.0);
    }
    if (!strcmp(name, "attr")) {
        BIND("name");
        tv_value nm = need_str(c, line, "attr name", a[0]);
        if (v.type == TV_DICT) {
            tv_value m = tp_method(c, v, cstr(c, nm));
            return m.type == TV_UNDEF ? tv_undef(c, "'dict object' has no attribute '%s'", cstr(c, nm)) : m;
        }
        return tp_getattr(c, line, v, cstr(c, nm));
    }
    tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported filter '%s'", name);
#undef BIND
#undef BIND0
}

/* ---------------------------------------------------------------- methods */

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format", "format_map",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};
static const char *const DICT_METHODS[] = {"copy", "fromkeys", "get", "items", "keys", "values", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const LIST_METHODS[] = {"copy", "count", "index", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};

static tv_value bound(tp_ctx *c, tv_value self, const char *name) {
    tv_func *f = tp_alloc(c, sizeof(tv_func));
    f->kind = TF_METHOD;
    f->name = name;
    f->self = self;
    tv_value v = {.type = TV_FUNC};
    v.u.fn = f;
    return v;
}

tv_value tp_method(tp_ctx *c, tv_value self, const char *name) {
    const char *const *ok = NULL, *const *unsafe = NULL;
    switch ((tv_type)self.type) {
    case TV_STR: ok = STR_METHODS; break;
    case TV_DICT: ok = DICT_METHODS, unsafe = DICT_UNSAFE; break;
    case TV_LIST: ok = (self.flags & TV_F_TUPLE) ? LIST_METHODS + 1 : LIST_METHODS, unsafe = (self.flags & TV_F_TUPLE) ? NULL : LIST_UNSAFE; break;
    case TV_LOOP:
        if (!strcmp(name, "cycle") || !strcmp(name, "changed")) return bound(c, self, name);
        break;
    default: break;
    }
    if (ok && in_list(ok, name)) return bound(c, self, name);
    if (unsafe && in_list(unsafe, name))
        return tv_undef(c, "SecurityError: access to attribute '%s' of '%s' object is unsafe.", name, tv_type_name(self));
    return tv_undef(c, "%s", "");
}

static tv_value str_method(tp_ctx *c, int line, const tv_func *f, const tv_value *args, size_t nargs,
                           const char **names, const tv_value *kw, size_t nkw) {
    tv_value s = f->self, a[MAXP];
    int g[MAXP];
    const char *m = f->name;
    char what[64];
    snprintf(what, sizeof(what), "str.%s()", m);
#define MBIND(...)                                                             \
    do {                                                                       \
        static const char *const P_[] = {__VA_ARGS__, NULL};                   \
        bind(c, line, what, P_, args, nargs, names, kw, nkw, a, g);            \
    } while (0)
#define MBIND0() bind(c, line, what, (const char *const[]){NULL}, args, nargs, names, kw, nkw, a, g)
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        MBIND("prefix");
        if (!g[0]) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s takes exactly one argument", what);
        tv_list *cands;
        if (a[0].type == TV_LIST && (a[0].flags & TV_F_TUPLE)) {
            cands = a[0].u.l;
        } else {
            if (a[0].type != TV_STR)
                tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s first arg must be str or a tuple of str, not %s", m, tv_type_name(a[0]));
            cands = tv_list_new(c, 1).u.l;
            tv_list_push(c, cands, a[0]);
        }
        for (size_t i = 0; i < cands->n; i++) {
            tv_value p = need_str(c, line, what, cands->items[i]);
            if (p.u.s.n > s.u.s.n) continue;
            const char *at = m[0] == 's' ? s.u.s.p : s.u.s.p + s.u.s.n - p.u.s.n;
            if (memcmp(at, p.u.s.p, p.u.s.n) == 0) return tv_bool(1);
        }
        return tv_bool(0);
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        MBIND("chars");
        int which = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
        if (g[0] && a[0].type != TV_NONE) {
            tv_value ch = need_str(c, line, what, a[0]);
            return tu_strip(s, ch.u.s.p, ch.u.s.n, which);
        }
        return tu_strip(s, NULL, 0, which);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        MBIND("sep", "maxsplit");
        return str_split(c, line, s, g[0] ? a[0] : tv_none(), g[1] ? need_int(c, line, what, a[1]) : -1, m[0] == 'r');
    }
    if (!strcmp(m, "splitlines")) {
        MBIND("keepends");
        return str_splitlines(c, s, g[0] && tv_truthy(a[0]));
    }
    if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "casefold")) {
        MBIND0();
        return str_case(c, s, m[0] == 'u' ? CASE_UPPER : CASE_LOWER);
    }
    if (!strcmp(m, "title")) {
        MBIND0();
        return str_title(c, s);
    }
    if (!strcmp(m, "capitalize")) {
        MBIND0();
        return str_capitalize(c, s);
    }
    if (!strcmp(m, "replace")) {
        MBIND("old", "new", "count");
        if (!g[0] || !g[1]) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: replace expected at least 2 arguments");
        return tp_str_replace(c, s, need_str(c, line, what, a[0]), need_str(c, line, what, a[1]),
                              g[2] ? need_int(c, line, what, a[2]) : -1);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex") || !strcmp(m, "count")) {
        MBIND("sub");
        tv_value sub = need_str(c, line, what, a[0]);
        if (m[0] == 'c') {
            if (sub.u.s.n == 0) return tv_int((int64_t)tu_len(s.u.s.p, s.u.s.n) + 1);
            int64_t n = 0;
            size_t i = 0;
            long k;
            while ((k = find_bytes(c, s, sub, i)) >= 0) {
                n++;
                i = (size_t)k + sub.u.s.n;
            }
            return tv_int(n);
        }
        long k = m[0] == 'r' ? rfind_bytes(c, s, sub) : find_bytes(c, s, sub, 0);
        if (k < 0 && (!strcmp(m, "index") || !strcmp(m, "rindex")))
            tp_fail(c, QWENC_ERR_ARG, line, "ValueError: substring not found");
        return tv_int(k < 0 ? -1 : (int64_t)tu_len(s.u.s.p, (size_t)k));
    }
    if (!strcmp(m, "join")) {
        MBIND("iterable");
        return str_join(c, line, s, tv_iter(c, line, a[0]), 1);
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        MBIND("affix");
        tv_value p = need_str(c, line, what, a[0]);
        if (p.u.s.n > s.u.s.n) return s;
        if (m[6] == 'p') return memcmp(s.u.s.p, p.u.s.p, p.u.s.n) ? s : tv_str(s.u.s.p + p.u.s.n, s.u.s.n - p.u.s.n);
        return memcmp(s.u.s.p + s.u.s.n - p.u.s.n, p.u.s.p, p.u.s.n) ? s : tv_str(s.u.s.p, s.u.s.n - p.u.s.n);
    }
    if (!strcmp(m, "center")) {
        MBIND("width");
        return pad_center(c, s, need_int(c, line, what, a[0]));
    }
    static const char *const PREDICATES[] = {"isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace",
                                             "islower", "isupper", NULL};
    if (!in_list(PREDICATES, m)) tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported string method '%s'", m);
    MBIND0();
    if (!strcmp(m, "isdigit") || !strcmp(m, "isdecimal")) return tv_bool(str_all(s, is_digit_cp));
    if (!strcmp(m, "isnumeric")) return tv_bool(str_all(s, is_numeric));
    if (!strcmp(m, "isalpha")) return tv_bool(str_all(s, is_alpha));
    if (!strcmp(m, "isalnum")) return tv_bool(str_all(s, is_alnum_cp));
    if (!strcmp(m, "isspace")) return tv_bool(str_all(s, tu_isspace));
    if (!strcmp(m, "islower")) return tv_bool(str_case_is(s, 0));
    return tv_bool(str_case_is(s, 1));
#undef MBIND
#undef MBIND0
}

tv_value tp_call_method(tp_ctx *c, int line, const tv_func *f, const tv_value *args, size_t nargs,
                        const char **names, const tv_value *kw, size_t nkw) {
    tv_value self = f->self, a[MAXP];
    int g[MAXP];
    const char *m = f->name;
    tick_value(c, self);
    char what[64];
    snprintf(what, sizeof(what), "%s.%s()", tv_type_name(self), m);
    if (self.type == TV_STR) return str_method(c, line, f, args, nargs, names, kw, nkw);
    if (self.type == TV_DICT) {
        if (!strcmp(m, "get")) {
            bind(c, line, what, (const char *const[]){"key", "default", NULL}, args, nargs, names, kw, nkw, a, g);
            long k = tv_dict_find(c, self.u.d, a[0]);
            return k >= 0 ? self.u.d->vals[k] : a[1];
        }
        bind(c, line, what, (const char *const[]){NULL}, args, nargs, names, kw, nkw, a, g);
        tv_dict *d = self.u.d;
        if (!strcmp(m, "copy")) {
            tv_value r = tv_dict_new(c, d->n);
            for (size_t i = 0; i < d->n; i++) tv_dict_set(c, r.u.d, d->keys[i], d->vals[i]);
            return r;
        }
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            tv_value r = tv_list_new(c, d->n);
            for (size_t i = 0; i < d->n; i++)
                tv_list_push(c, r.u.l, m[0] == 'i' ? tuple2(c, d->keys[i], d->vals[i]) : m[0] == 'k' ? d->keys[i] : d->vals[i]);
            return r;
        }
    } else if (self.type == TV_LIST) {
        if (!strcmp(m, "copy")) {
            bind(c, line, what, (const char *const[]){NULL}, args, nargs, names, kw, nkw, a, g);
            return copy_list(c, self.u.l);
        }
        bind(c, line, what, (const char *const[]){"value", NULL}, args, nargs, names, kw, nkw, a, g);
        int64_t n = 0;
        for (size_t i = 0; i < self.u.l->n; i++) {
            if (!tv_eq(c, self.u.l->items[i], a[0])) continue;
            if (m[0] == 'i') return tv_int((int64_t)i);
            n++;
        }
        if (m[0] == 'i') tp_fail(c, QWENC_ERR_ARG, line, "ValueError: value is not in list");
        return tv_int(n);
    } else if (self.type == TV_LOOP && !strcmp(m, "cycle")) {
        if (nargs == 0) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: no items for cycling given");
        return args[self.u.loop->index0 % nargs];
    }
    tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported method '%s' of %s", m, tv_type_name(self));
}

/* ---------------------------------------------------------------- globals */

static const char *const GLOBALS[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", "lipsum", "cycler", "joiner", NULL};

tv_value tp_global(tp_ctx *c, const char *name) {
    for (size_t i = 0; GLOBALS[i]; i++)
        if (!strcmp(GLOBALS[i], name)) {
            tv_func *f = tp_alloc(c, sizeof(tv_func));
            f->kind = TF_GLOBAL;
            f->name = GLOBALS[i];
            tv_value v = {.type = TV_FUNC};
            v.u.fn = f;
            return v;
        }
    return tv_undef(c, "'%s' is undefined", name);
}

tv_value tp_call_global(tp_ctx *c, int line, const tv_func *f, const tv_value *args, size_t nargs,
                        const char **names, const tv_value *kw, size_t nkw) {
    const char *g = f->name;
    if (!strcmp(g, "raise_exception")) {
        tv_value msg = nargs ? tv_to_str(c, args[0]) : tv_str("", 0);
        tp_fail(c, QWENC_ERR_ARG, line, "raise_exception: %.*s", (int)QW_MIN(msg.u.s.n, 400), msg.u.s.p);
    }
    if (!strcmp(g, "namespace") || !strcmp(g, "dict")) {
        tv_value d = tv_dict_new(c, nkw);
        if (nargs > 1) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: %s expected at most 1 positional argument", g);
        if (nargs == 1) {
            if (args[0].type != TV_DICT && args[0].type != TV_NS)
                tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "%s() takes a mapping as its positional argument, got %s", g,
                        tv_type_name(args[0]));
            for (size_t i = 0; i < args[0].u.d->n; i++) tv_dict_set(c, d.u.d, args[0].u.d->keys[i], args[0].u.d->vals[i]);
        }
        for (size_t i = 0; i < nkw; i++) tv_dict_set(c, d.u.d, tv_strz(names[i]), kw[i]);
        if (g[0] == 'n') d.type = TV_NS;
        return d;
    }
    if (!strcmp(g, "range")) {
        if (nkw) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: range expected 1 to 3 arguments, got %zu", nargs);
        int64_t start = 0, stop, step = 1;
        if (nargs == 1) {
            stop = need_int(c, line, "range()", args[0]);
        } else {
            start = need_int(c, line, "range()", args[0]);
            stop = need_int(c, line, "range()", args[1]);
            if (nargs == 3) step = need_int(c, line, "range()", args[2]);
        }
        if (step == 0) tp_fail(c, QWENC_ERR_ARG, line, "ValueError: range() arg 3 must not be zero");
        double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step) : ceil(((double)start - (double)stop) / (double)-step);
        if (count > 100000)
            tp_fail(c, QWENC_ERR_ARG, line, "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        tv_value r = tv_list_new(c, count > 0 ? (size_t)count : 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) tv_list_push(c, r.u.l, tv_int(i));
        return r;
    }
    if (!strcmp(g, "strftime_now")) {
        if (nargs != 1 || nkw) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: strftime_now() takes exactly one argument");
        char *fmt = cstr(c, need_str(c, line, "strftime_now()", args[0]));
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char out[512];
        size_t n = strftime(out, sizeof(out), fmt, &tmv);
        return tv_str_copy(c, out, n);
    }
    tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported function '%s'", g);
}

