/*
 * tmpl.h - internals of the chat-template interpreter (a Jinja2 subset), shared by src/text/tmpl_*.c
 * and src/text/template.c. Nothing here is public: include/qwenc.h has qwenc_chat_render().
 *
 * Pieces:
 *   tmpl_value.c    values with Python semantics (str(), repr(), ==, <, truthiness), UTF-8 string helpers,
 *                   the arena every value lives in, JSON in (the request) and out (the tojson filter)
 *   tmpl_parse.c    Jinja lexer (whitespace control, trim_blocks + lstrip_blocks as transformers sets them)
 *                   and recursive-descent parser to the node trees below
 *   tmpl_eval.c     statements and expressions: scopes, loops, macros, attribute lookup, operators
 *   tmpl_filters.c  filters, tests, the methods of str / dict / list, global functions
 *
 * Invariants: every allocation of one render comes from its arena and is released at once when the
 * render ends; values are immutable except lists/dicts while a literal or a filter builds them and
 * namespace() objects, which `set ns.attr = v` updates in place. Errors do not return through every
 * level: tp_fail() formats the message and longjmps to the render entry, which frees the arena.
 */
#ifndef QW_TMPL_H
#define QW_TMPL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "core/common.h"

/* ---------------------------------------------------------------- context, arena, errors */

typedef struct tp_block tp_block;

/* Values nested deeper than this are refused (a RecursionError, as Python's recursion limit refuses them) by
 * printing, comparing, tojson and the request reader: a template can build a list 50,000 levels deep in a loop,
 * and every walk of it recurses. Real chat data nests a few levels. */
#define TV_MAX_DEPTH 400


typedef struct tp_ctx {
    tp_block *blocks;      /* arena: every allocation of this render */
    size_t arena_bytes;
    jmp_buf jmp;           /* tp_fail() jumps here */
    qwenc_status status;
    char msg[512];         /* the error message, without the "chat template line N:" prefix */
    int line;              /* template line of the error, 0 when not about a template line */
    int depth;             /* nesting of the parser, then of expression evaluation: bounded to protect the stack */
    int calls;             /* nesting of macro calls, bounded likewise */
    struct tp_scope *scope; /* innermost scope of the code being run */
    int cur_line;          /* template line being run: the line of an error raised with line 0 */
    uint64_t steps;        /* work done so far (tp_tick), bounded by TP_MAX_STEPS */
    const void *repr_path[TV_MAX_DEPTH + 1]; /* the lists and dicts being printed, innermost last (tv_repr_append) */
    int repr_n;
} tp_ctx;

/* Nesting of expression evaluation and of bodies being run (blocks, loops, macro calls), together: the depth of
 * the interpreter's recursion on the C stack (at most about 1 MiB under AddressSanitizer, less without; Python's
 * own recursion limit keeps Jinja templates well below it). */
#define TP_MAX_DEPTH 1000

/* The work one render may do: expression nodes evaluated, statements run, values compared. A template that
 * loops over range(100000) inside another such loop would otherwise run for hours; real templates need a few
 * hundred steps per message (Qwen3's and Llama 3.1's render 100,000 messages within the bound). */
#define TP_MAX_STEPS ((uint64_t)20 * 1000 * 1000)
_Noreturn void tp_too_long(tp_ctx *c);
static inline void tp_tick(tp_ctx *c, uint64_t n) {
    if ((c->steps += n) > TP_MAX_STEPS) tp_too_long(c);
}

void *tp_alloc(tp_ctx *c, size_t n); /* zero-filled */
void tp_arena_free(tp_ctx *c);
_Noreturn void tp_fail(tp_ctx *c, qwenc_status st, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---------------------------------------------------------------- values */

typedef enum {
    TV_UNDEF, /* jinja2.Undefined: prints as "", falsy, iterates as empty; most other uses raise */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,  /* Python list, or tuple when TV_F_TUPLE is set */
    TV_DICT,  /* insertion-ordered, like a Python dict built from JSON */
    TV_NS,    /* namespace(): a dict whose attributes may be assigned */
    TV_FUNC,  /* macro, global function or bound method */
    TV_LOOP   /* the `loop` variable of a for loop */
} tv_type;

enum { TV_F_SAFE = 1, /* markupsafe.Markup string (the |safe filter) */ TV_F_TUPLE = 2 };

typedef struct tv_list tv_list;
typedef struct tv_dict tv_dict;
typedef struct tv_func tv_func;
typedef struct tv_loop tv_loop;

typedef struct tv_value {
    uint8_t type;  /* tv_type */
    uint8_t flags; /* TV_F_* */
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s; /* UTF-8, not NUL-terminated */
        tv_list *l;
        tv_dict *d;     /* TV_DICT and TV_NS */
        tv_func *fn;
        tv_loop *loop;
        const char *undef; /* TV_UNDEF: the hint of the error raised when it is used, e.g. "'x' is undefined" */
    } u;
} tv_value;

struct tv_list {
    tv_value *items; /* [n] */
    size_t n, cap;
};

struct tv_dict {
    tv_value *keys, *vals; /* [n] */
    size_t n, cap;
    uint32_t *index;       /* [index_cap] once n > TV_DICT_INDEX_MIN: entry + 1 of each str, int, float, bool or
                              None key by its hash (open addressing, 0 empty); other keys are found by a scan */
    size_t index_cap;
};
#define TV_DICT_INDEX_MIN 16

struct tv_loop {
    tv_list *items; /* the (filtered) sequence iterated */
    size_t index0;
    int depth;      /* 1 for the outermost loop */
};

typedef enum {
    TF_MACRO,
    TF_GLOBAL,     /* range, namespace, dict, raise_exception, strftime_now */
    TF_METHOD,     /* a method of a str, dict, list or loop, bound to self */
} tf_kind;

struct tv_func {
    tf_kind kind;
    const char *name;
    tv_value self;              /* TF_METHOD */
    const struct tp_node *macro; /* TF_MACRO */
    struct tp_scope *closure;   /* TF_MACRO: the scope it was defined in */
};

tv_value tv_undef(tp_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tv_value tv_none(void);
tv_value tv_bool(int b);
tv_value tv_int(int64_t i);
tv_value tv_float(double f);
tv_value tv_str(const char *p, size_t n); /* does not copy */
tv_value tv_strz(const char *p);          /* does not copy */
tv_value tv_str_copy(tp_ctx *c, const char *p, size_t n);
tv_value tv_list_new(tp_ctx *c, size_t cap);
tv_value tv_dict_new(tp_ctx *c, size_t cap);
void tv_list_push(tp_ctx *c, tv_list *l, tv_value v);
/* Python d[k] = v: an existing key keeps its place. */
void tv_dict_set(tp_ctx *c, tv_dict *d, tv_value k, tv_value v);
/* Index of key k in d, or -1. */
long tv_dict_find(tp_ctx *c, const tv_dict *d, tv_value k);
tv_value *tv_dict_get_str(const tv_dict *d, const char *key);

/* Python type name of v, for messages ("str", "int", "NoneType", "dict"...). */
const char *tv_type_name(tv_value v);
int tv_truthy(tv_value v);
/* Python == (items that are the same list or dict are equal without a look inside, as in Python); raises a
 * RecursionError for values nested deeper than TV_MAX_DEPTH. */
int tv_eq(tp_ctx *c, tv_value a, tv_value b);
/* Python a < b for numbers, strings, lists; raises a TypeError otherwise. */
int tv_lt(tp_ctx *c, int line, tv_value a, tv_value b);
/* Number of items (len()); raises for values without one. */
size_t tv_len(tp_ctx *c, int line, tv_value v);
/* The items of an iterable as a list: list/tuple items, dict keys, str characters, nothing for Undefined. */
tv_list *tv_iter(tp_ctx *c, int line, tv_value v);

/* Growable byte buffer in the arena. */
typedef struct {
    char *p;
    size_t n, cap;
} tp_buf;
void tp_buf_add(tp_ctx *c, tp_buf *b, const char *s, size_t n);
void tp_buf_addz(tp_ctx *c, tp_buf *b, const char *s);
void tp_buf_addc(tp_ctx *c, tp_buf *b, char ch);
void tp_buf_addcp(tp_ctx *c, tp_buf *b, uint32_t cp); /* one code point as UTF-8 */
void tp_buf_fill(tp_ctx *c, tp_buf *b, char ch, int64_t n); /* n copies of ch (none if n <= 0), grown at once */
tv_value tp_buf_value(tp_buf *b);

/* str(v) appended to b (Undefined appends nothing), and repr(v): a list or dict met again inside itself prints as
 * [...] / {...} as Python prints it; deeper than TV_MAX_DEPTH is a RecursionError. */
void tv_str_append(tp_ctx *c, tp_buf *b, tv_value v);
void tv_repr_append(tp_ctx *c, tp_buf *b, tv_value v);
/* str(v) as a string value (v itself when it already is one). */
tv_value tv_to_str(tp_ctx *c, tv_value v);
/* Python repr() of a float ("1.0", "1e-05", "0.30000000000000004"). */
void tv_float_repr(double f, char out[32]);

typedef struct {
    int indent;           /* -1: none (separators ", " and ": "), else spaces per level */
    int ensure_ascii;
    int sort_keys;
    const char *item_sep; /* NULL: the default for indent */
    const char *key_sep;
} tv_json_opts;
/* json.dumps(v) as transformers' tojson filter calls it. */
void tv_json_append(tp_ctx *c, int line, tp_buf *b, tv_value v, const tv_json_opts *o, int level);
/* Parse JSON text as Python's json.loads does (ints stay ints, key order kept). what names the
   input in messages. */
tv_value tv_json_parse(tp_ctx *c, const char *text, size_t n, const char *what);

/* ---------------------------------------------------------------- UTF-8 helpers (code points as Python sees them) */

/* Decode the code point at s[*i] (advancing *i); invalid bytes decode as themselves (U+DC80.. style
   escapes are not needed: the input was validated). */
uint32_t tu_next(const char *s, size_t n, size_t *i);
size_t tu_len(const char *s, size_t n); /* number of code points */
int tu_isspace(uint32_t cp);           /* Python str.isspace() */
/* Byte offset of code point index k (clamped to n). */
size_t tu_offset(const char *s, size_t n, size_t k);
/* Python str.strip / lstrip / rstrip; chars NULL means whitespace. which: 1 left, 2 right, 3 both. */
tv_value tu_strip(tv_value s, const char *chars, size_t nchars, int which);
/* Number of bytes of the longest valid UTF-8 prefix of s. */
size_t tu_valid_prefix(const char *s, size_t n);

/* ---------------------------------------------------------------- syntax tree */

typedef enum {
    /* expressions */
    E_CONST, E_NAME, E_GETATTR, E_GETITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_BINOP, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_COMPARE, E_COND, E_CONCAT, E_LIST, E_TUPLE, E_DICT,
    /* statements */
    S_TEXT, S_OUTPUT, S_IF, S_FOR, S_SET, S_SET_BLOCK, S_MACRO, S_BREAK, S_CONTINUE, S_BLOCK
} tp_kind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW } tp_binop_kind;
typedef enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN } tp_cmp_kind;

typedef struct tp_node tp_node;
typedef struct {
    tp_node **v;
    size_t n, cap;
} tp_nodes;

struct tp_node {
    tp_kind kind;
    int line;
    int op;          /* tp_binop_kind for E_BINOP; 1 for a negated E_TEST ("is not") */
    const char *name; /* E_NAME, E_GETATTR attribute, E_FILTER / E_TEST name, S_MACRO name */
    tv_value value;  /* E_CONST */
    tp_node *a, *b, *c; /* operands: E_GETATTR/E_GETITEM/E_SLICE/E_CALL/E_FILTER/E_TEST/E_NEG/E_NOT a (the object);
                           E_GETITEM b (key); E_BINOP/E_AND/E_OR a, b; E_COND a (test) b (then) c (else, or NULL);
                           S_OUTPUT a; S_FOR a (target) b (iterable) c (loop filter, or NULL);
                           S_SET / S_SET_BLOCK a (target: E_NAME, E_TUPLE of names, or E_GETATTR ns.attr) b (value) */
    tp_nodes args;   /* call / filter / test positional args; E_LIST/E_TUPLE/E_CONCAT items; E_DICT keys;
                        E_COMPARE operands after the first (a); E_SLICE start, stop, step (NULL: omitted);
                        S_IF conditions; S_MACRO parameter defaults (NULL: none) */
    tp_nodes vals;   /* E_DICT values; E_CALL/E_FILTER/E_TEST keyword values */
    const char **kwnames; /* E_CALL/E_FILTER/E_TEST keyword names [vals.n]; S_MACRO param names [args.n] */
    int *cmpops;     /* E_COMPARE: tp_cmp_kind [args.n] */
    tp_nodes body;   /* S_FOR, S_MACRO, S_SET_BLOCK, S_BLOCK bodies */
    tp_nodes *branches; /* S_IF: one body per condition, then the else body: [args.n + 1] */
    tp_nodes orelse; /* S_FOR else body */
};

/* Parse a whole template; fails through tp_fail with the line of the error. */
tp_nodes tp_parse(tp_ctx *c, const char *src, size_t n);

/* ---------------------------------------------------------------- evaluation */

typedef struct tp_scope {
    struct tp_scope *parent;
    tv_dict vars;
} tp_scope;

tp_scope *tp_scope_new(tp_ctx *c, tp_scope *parent);
void tp_scope_set(tp_ctx *c, tp_scope *s, const char *name, tv_value v);

/* Render nodes into out, in the current scope; returns TP_BREAK / TP_CONTINUE when a loop control
   statement ends the body early, else 0. */
enum { TP_BREAK = 1, TP_CONTINUE = 2 };
int tp_exec(tp_ctx *c, const tp_nodes *body, tp_buf *out);
tv_value tp_eval(tp_ctx *c, const tp_node *e);
/* Call f with positional args and keyword args (names[i] = kw[i]). */
tv_value tp_call(tp_ctx *c, int line, tv_value f, const tv_value *args, size_t nargs, const char **names,
                 const tv_value *kw, size_t nkw);
/* Jinja's environment.getattr (attribute first, then item) and getitem (item first, then attribute). */
tv_value tp_getattr(tp_ctx *c, int line, tv_value obj, const char *name);
tv_value tp_getitem(tp_ctx *c, int line, tv_value obj, tv_value key);
/* Python `a OP b` for a tp_binop_kind (+ - * / // % **). */
tv_value tp_binop(tp_ctx *c, int line, int op, tv_value a, tv_value b);
/* Python `a OP b` for a tp_cmp_kind (the comparison tests use it). */
int tp_compare(tp_ctx *c, int line, int op, tv_value a, tv_value b);
/* Raise the UndefinedError an Undefined carries. */
_Noreturn void tp_undef_fail(tp_ctx *c, int line, tv_value u);

/* Filters, tests and methods (tmpl_filters.c). Names are checked at parse time against the filters and
   tests Jinja knows (is_known: 1 when Jinja has it, so a missing one fails to compile as in Jinja). */
int tp_filter_known(const char *name);
int tp_test_known(const char *name);
tv_value tp_filter(tp_ctx *c, int line, const char *name, tv_value v, const tv_value *args, size_t nargs,
                   const char **names, const tv_value *kw, size_t nkw);
int tp_test(tp_ctx *c, int line, const char *name, tv_value v, const tv_value *args, size_t nargs);
/* A method of a str / dict / list / loop value bound to it; an Undefined with an empty hint when the type
   has no such method, or with a SecurityError hint for the methods the immutable sandbox forbids. */
tv_value tp_method(tp_ctx *c, tv_value self, const char *name);
tv_value tp_call_method(tp_ctx *c, int line, const tv_func *f, const tv_value *args, size_t nargs,
                        const char **names, const tv_value *kw, size_t nkw);
tv_value tp_call_global(tp_ctx *c, int line, const tv_func *f, const tv_value *args, size_t nargs,
                        const char **names, const tv_value *kw, size_t nkw);
/* The global functions Jinja and transformers define (range, namespace, dict, raise_exception,
   strftime_now), or an Undefined. */
tv_value tp_global(tp_ctx *c, const char *name);
/* Stable merge sort of items by keys, as Python's sorted() (reverse keeps equal items in order). */
void tp_sort_by_keys(tp_ctx *c, int line, tv_value *items, tv_value *keys, size_t n, int reverse);
/* Python str.split / str.replace style helpers shared with filters. */
tv_value tp_str_replace(tp_ctx *c, tv_value s, tv_value old, tv_value new_, int64_t count);

#endif
