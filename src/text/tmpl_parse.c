/*
 * tmpl_parse.c - Jinja2 lexer and parser for chat templates, as transformers configures Jinja.
 *
 * Follows jinja2/lexer.py and jinja2/parser.py (Jinja 3.1) with the environment transformers builds in
 * chat_template_utils._compile_jinja_template: trim_blocks=True (the first newline after a block or
 * comment tag is removed), lstrip_blocks=True (spaces and tabs from the start of a line up to a block or
 * comment tag are removed), keep_trailing_newline=False (one final newline of the template is dropped),
 * newlines normalised to "\n", and the loopcontrols extension (break / continue) plus transformers'
 * {% generation %} tag. The "-" and "+" whitespace markers work as in Jinja.
 *
 * Operator precedence, lowest first (jinja2/parser.py): `x if c else y`, or, and, not, comparisons
 * (==, !=, <, <=, >, >=, in, not in; chained as in Python), + -, ~, * / // %, **, unary - +, then
 * postfix .attr [item] (call), then filters `|f`, tests `is t` and calls, which bind tighter than every
 * binary operator: `a + b | trim` is `a + (b|trim)`.
 *
 * A tag Jinja knows but this subset does not (include, extends, call, filter, with, raw...) fails at
 * parse time with "unsupported tag 'NAME'"; a filter or test name Jinja itself does not know fails at
 * parse time where Jinja's compiler rejects it (see check_expr); a known one that is not implemented
 * fails when it is reached.
 */
#include <errno.h>
#include <string.h>

#include "text/tmpl.h"

/* ---------------------------------------------------------------- lexer */

typedef enum { TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP, TK_EOF } tk_type;

typedef struct {
    tk_type type;
    int line;
    const char *s; /* TK_DATA, TK_NAME, TK_STRING (decoded), TK_OP: NUL-terminated */
    size_t n;
    int64_t i;
    double f;
} tp_tok;

typedef struct {
    tp_ctx *c;
    const char *src;
    size_t n, pos;
    int line;
    tp_tok *toks;
    size_t ntok, cap;
} lexer;

static void push_tok(lexer *L, tp_tok t) {
    if (L->ntok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tp_tok *nt = tp_alloc(L->c, cap * sizeof(tp_tok));
        if (L->ntok) memcpy(nt, L->toks, L->ntok * sizeof(tp_tok));
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->ntok++] = t;
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Length in bytes of the Python-whitespace run at s[0..n). */
static size_t ws_run(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        if (!tu_isspace(tu_next(s, n, &j))) break;
        i = j;
    }
    return i;
}

/* Python str.rstrip() length. */
static size_t rstrip_len(const char *s, size_t n) { return tu_strip(tv_str(s, n), NULL, 0, 2).u.s.n; }

static int is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_name_char(char ch) { return is_name_start(ch) || (ch >= '0' && ch <= '9'); }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A string literal's body decoded as Python's "unicode-escape" codec does (what Jinja applies). */
static tv_value decode_string(lexer *L, const char *s, size_t n, int line) {
    tp_buf b = {0};
    tp_buf_add(L->c, &b, "", 0);
    size_t i = 0;
    while (i < n) {
        if (s[i] != '\\') {
            size_t st = i;
            while (i < n && s[i] != '\\') i++;
            tp_buf_add(L->c, &b, s + st, i - st);
            continue;
        }
        if (i + 1 >= n) {
            tp_buf_addc(L->c, &b, '\\');
            break;
        }
        char e = s[i + 1];
        i += 2;
        int digits = 0;
        switch (e) {
        case '\n': break;
        case '\\': tp_buf_addc(L->c, &b, '\\'); break;
        case '\'': tp_buf_addc(L->c, &b, '\''); break;
        case '"': tp_buf_addc(L->c, &b, '"'); break;
        case 'a': tp_buf_addc(L->c, &b, '\a'); break;
        case 'b': tp_buf_addc(L->c, &b, '\b'); break;
        case 'f': tp_buf_addc(L->c, &b, '\f'); break;
        case 'n': tp_buf_addc(L->c, &b, '\n'); break;
        case 'r': tp_buf_addc(L->c, &b, '\r'); break;
        case 't': tp_buf_addc(L->c, &b, '\t'); break;
        case 'v': tp_buf_addc(L->c, &b, '\v'); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': tp_fail(L->c, QWENC_ERR_UNSUPPORTED, line, "unsupported \\N{...} escape in a string literal");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++) v = v * 8 + (uint32_t)(s[i++] - '0');
                tp_buf_addcp(L->c, &b, v);
            } else {
                tp_buf_addc(L->c, &b, '\\');
                tp_buf_addc(L->c, &b, e);
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = i < n ? hexval(s[i]) : -1;
                if (h < 0) tp_fail(L->c, QWENC_ERR_FORMAT, line, "truncated \\%c escape in a string literal", e);
                v = v * 16 + (uint32_t)h;
                i++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                tp_fail(L->c, QWENC_ERR_UNSUPPORTED, line, "escape \\%c%0*X in a string literal is not a Unicode scalar value",
                        e, digits, v);
            tp_buf_addcp(L->c, &b, v);
        }
    }
    return tp_buf_value(&b);
}

static const char *const OPS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};

/* Lex the inside of a {{ }} or {% %} tag up to and including its end (L->pos moves past it). */
static void lex_tag(lexer *L, int is_block, int tag_line) {
    const char *s = L->src;
    size_t n = L->n;
    char balance[256];
    int nb = 0;
    for (;;) {
        size_t p = L->pos;
        if (p >= n)
            tp_fail(L->c, QWENC_ERR_FORMAT, tag_line, "unexpected end of template: the %s tag opened here is not closed",
                    is_block ? "{% %}" : "{{ }}");
        if (nb == 0) {
            const char *end = is_block ? "%}" : "}}";
            int dash = s[p] == '-' && p + 3 <= n && memcmp(s + p + 1, end, 2) == 0;
            int plus = is_block && s[p] == '+' && p + 3 <= n && memcmp(s + p + 1, end, 2) == 0;
            int plain = p + 2 <= n && memcmp(s + p, end, 2) == 0;
            if (dash || plus || plain) {
                size_t q = p + (dash || plus ? 3 : 2);
                if (dash) q += ws_run(s + q, n - q);
                else if (plain && is_block && q < n && s[q] == '\n') q++;
                push_tok(L, (tp_tok){.type = is_block ? TK_BLOCK_END : TK_VAR_END, .line = L->line});
                L->line += count_nl(s + p, q - p);
                L->pos = q;
                return;
            }
        }
        size_t w = ws_run(s + p, n - p);
        if (w) {
            L->line += count_nl(s + p, w);
            L->pos += w;
            continue;
        }
        char ch = s[p];
        tp_tok t = {.line = L->line};
        if (is_digit(ch)) {
            size_t q = p;
            while (q < n && (is_digit(s[q]) || (s[q] == '_' && q + 1 < n && is_digit(s[q + 1])))) q++;
            int is_float = 0;
            if (q + 1 < n && s[q] == '.' && is_digit(s[q + 1])) {
                is_float = 1;
                q++;
                while (q < n && (is_digit(s[q]) || (s[q] == '_' && q + 1 < n && is_digit(s[q + 1])))) q++;
            }
            if (q < n && (s[q] == 'e' || s[q] == 'E')) {
                size_t k = q + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && is_digit(s[k])) {
                    is_float = 1;
                    q = k;
                    while (q < n && (is_digit(s[q]) || (s[q] == '_' && q + 1 < n && is_digit(s[q + 1])))) q++;
                }
            }
            char tmp[128];
            size_t k = 0;
            if (is_float) {
                for (size_t j = p; j < q && k + 1 < sizeof(tmp); j++)
                    if (s[j] != '_') tmp[k++] = s[j];
                tmp[k] = 0;
                t.type = TK_FLOAT;
                t.f = strtod(tmp, NULL);
            } else {
                int base = 10;
                size_t j = p;
                if (ch == '0' && p + 1 < n && strchr("xXoObB", s[p + 1]) && s[p + 1]) {
                    base = (s[p + 1] == 'x' || s[p + 1] == 'X') ? 16 : (s[p + 1] == 'o' || s[p + 1] == 'O') ? 8 : 2;
                    j = q = p + 2;
                    while (q < n && (s[q] == '_' || (hexval(s[q]) >= 0 && hexval(s[q]) < base))) q++;
                } else if (ch == '0') { /* "0(_?0)*": a leading zero cannot start a longer number */
                    q = p + 1;
                    while (q < n && (s[q] == '0' || (s[q] == '_' && q + 1 < n && s[q + 1] == '0'))) q++;
                }
                for (; j < q && k + 1 < sizeof(tmp); j++)
                    if (s[j] != '_') tmp[k++] = s[j];
                tmp[k] = 0;
                errno = 0;
                t.type = TK_INT;
                t.i = (int64_t)strtoll(tmp, NULL, base);
                if (errno == ERANGE) tp_fail(L->c, QWENC_ERR_UNSUPPORTED, L->line, "integer literal %s is outside the 64-bit range", tmp);
            }
            push_tok(L, t);
            L->pos = q;
            continue;
        }
        if (is_name_start(ch)) {
            size_t q = p;
            while (q < n && is_name_char(s[q])) q++;
            t.type = TK_NAME;
            t.n = q - p;
            char *nm = tp_alloc(L->c, t.n + 1);
            memcpy(nm, s + p, t.n);
            t.s = nm;
            push_tok(L, t);
            L->pos = q;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t q = p + 1;
            while (q < n && s[q] != ch) q += (s[q] == '\\' && q + 1 < n) ? 2 : 1;
            if (q >= n) tp_fail(L->c, QWENC_ERR_FORMAT, L->line, "unterminated string literal");
            tv_value v = decode_string(L, s + p + 1, q - p - 1, L->line);
            t.type = TK_STRING;
            t.s = v.u.s.p;
            t.n = v.u.s.n;
            push_tok(L, t);
            L->line += count_nl(s + p, q + 1 - p);
            L->pos = q + 1;
            continue;
        }
        const char *op = NULL;
        for (size_t k = 0; k < sizeof(OPS) / sizeof(OPS[0]); k++) {
            size_t len = strlen(OPS[k]);
            if (p + len <= n && memcmp(s + p, OPS[k], len) == 0) {
                op = OPS[k];
                break;
            }
        }
        if (!op) {
            size_t j = p;
            uint32_t cp = tu_next(s, n, &j);
            tp_fail(L->c, QWENC_ERR_FORMAT, L->line, "unexpected character '%.*s' (U+%04X) in a tag", (int)(j - p), s + p, cp);
        }
        if (*op == '(' || *op == '[' || *op == '{') {
            if (nb == (int)sizeof(balance)) tp_fail(L->c, QWENC_ERR_FORMAT, L->line, "brackets nested too deeply");
            balance[nb++] = *op;
        } else if (*op == ')' || *op == ']' || *op == '}') {
            char want = *op == ')' ? '(' : *op == ']' ? '[' : '{';
            if (nb == 0 || balance[nb - 1] != want) tp_fail(L->c, QWENC_ERR_FORMAT, L->line, "unexpected '%s'", op);
            nb--;
        }
        t.type = TK_OP;
        t.s = op;
        t.n = strlen(op);
        push_tok(L, t);
        L->pos = p + t.n;
    }
}

static void lex(lexer *L) {
    const char *s = L->src;
    size_t n = L->n;
    int line_starting = 1;
    for (;;) {
        size_t p = L->pos, t = p;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) {
            if (p < n) push_tok(L, (tp_tok){.type = TK_DATA, .line = L->line, .s = s + p, .n = n - p});
            break;
        }
        char kind = s[t + 1];
        char sign = (t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+')) ? s[t + 2] : 0;
        size_t text_n = t - p;
        if (sign == '-') {
            text_n = rstrip_len(s + p, text_n);
        } else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: drop the indentation before a block or comment tag alone on its line */
            size_t l_pos = text_n;
            while (l_pos > 0 && s[p + l_pos - 1] != '\n') l_pos--;
            if ((l_pos > 0 || line_starting) && l_pos < text_n && ws_run(s + p + l_pos, text_n - l_pos) == text_n - l_pos)
                text_n = l_pos;
        }
        if (text_n) push_tok(L, (tp_tok){.type = TK_DATA, .line = L->line, .s = s + p, .n = text_n});
        L->line += count_nl(s + p, t - p);
        int tag_line = L->line;
        L->pos = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t k = L->pos; k + 1 < n; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    e = s + k;
                    break;
                }
            if (!e) tp_fail(L->c, QWENC_ERR_FORMAT, tag_line, "unterminated comment: '{#' without '#}'");
            size_t k = (size_t)(e - s), q = k + 2;
            if (k > L->pos && s[k - 1] == '-') q += ws_run(s + q, n - q);
            else if (!(k > L->pos && s[k - 1] == '+') && q < n && s[q] == '\n') q++;
            L->line += count_nl(s + L->pos, q - L->pos);
            line_starting = q > 0 && s[q - 1] == '\n';
            L->pos = q;
            continue;
        }
        int is_block = kind == '%';
        push_tok(L, (tp_tok){.type = is_block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, .line = tag_line});
        lex_tag(L, is_block, tag_line);
        line_starting = L->pos > 0 && s[L->pos - 1] == '\n';
    }
    push_tok(L, (tp_tok){.type = TK_EOF, .line = L->line});
}

/* ---------------------------------------------------------------- parser */

typedef struct {
    tp_ctx *c;
    tp_tok *t;
    size_t i, ntok;
    int loop_depth; /* break / continue are allowed only inside a for body */
} parser;

static tp_tok *cur(parser *P) { return &P->t[P->i]; }
static tp_tok *peek(parser *P, size_t k) {
    size_t j = P->i + k;
    return &P->t[j < P->ntok ? j : P->ntok - 1];
}

static const char *tok_desc(tp_tok *t) {
    static _Thread_local char buf[96];
    switch (t->type) {
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "end of print statement '}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "end of statement block '%}'";
    case TK_EOF: return "end of template";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_STRING: return "string";
    default: snprintf(buf, sizeof(buf), "'%.60s'", t->s); return buf;
    }
}

_Noreturn static void perr(parser *P, const char *fmt, const char *arg) {
    tp_fail(P->c, QWENC_ERR_FORMAT, cur(P)->line, fmt, arg);
}

static int is_op(parser *P, const char *op) { return cur(P)->type == TK_OP && strcmp(cur(P)->s, op) == 0; }
static int is_name(parser *P, const char *nm) { return cur(P)->type == TK_NAME && strcmp(cur(P)->s, nm) == 0; }

static int skip_op(parser *P, const char *op) {
    if (!is_op(P, op)) return 0;
    P->i++;
    return 1;
}

static int skip_name(parser *P, const char *nm) {
    if (!is_name(P, nm)) return 0;
    P->i++;
    return 1;
}

static void expect_op(parser *P, const char *op) {
    if (!skip_op(P, op)) tp_fail(P->c, QWENC_ERR_FORMAT, cur(P)->line, "expected '%s', got %s", op, tok_desc(cur(P)));
}

static void expect_type(parser *P, tk_type ty) {
    if (cur(P)->type != ty) {
        tp_tok want = {.type = ty};
        char wanted[96];
        snprintf(wanted, sizeof(wanted), "%s", tok_desc(&want));
        tp_fail(P->c, QWENC_ERR_FORMAT, cur(P)->line, "expected %s, got %s", wanted, tok_desc(cur(P)));
    }
    P->i++;
}

static const char *expect_name(parser *P) {
    if (cur(P)->type != TK_NAME) perr(P, "expected a name, got %s", tok_desc(cur(P)));
    return P->t[P->i++].s;
}

static tp_node *mk(parser *P, tp_kind k, int line) {
    tp_node *n = tp_alloc(P->c, sizeof(tp_node));
    n->kind = k;
    n->line = line;
    return n;
}

static void add(parser *P, tp_nodes *v, tp_node *n) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        tp_node **nv = tp_alloc(P->c, cap * sizeof(tp_node *));
        if (v->n) memcpy(nv, v->v, v->n * sizeof(tp_node *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
}

static tp_node *parse_expression(parser *P, int with_condexpr);
static tp_node *parse_unary(parser *P, int with_filter);
static tp_node *parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);

/* Call arguments after '(' (already consumed): positional ones into n->args, keyword ones into vals. */
static void parse_call_args(parser *P, tp_node *n) {
    int require_comma = 0;
    size_t nkw = 0, capkw = 0;
    while (!is_op(P, ")")) {
        if (require_comma) {
            expect_op(P, ",");
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**"))
            tp_fail(P->c, QWENC_ERR_UNSUPPORTED, cur(P)->line, "unsupported construct: *args / **kwargs in a call");
        if (cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && strcmp(peek(P, 1)->s, "=") == 0) {
            const char *key = cur(P)->s;
            P->i += 2;
            if (nkw == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                const char **nk = tp_alloc(P->c, capkw * sizeof(char *));
                if (nkw) memcpy(nk, n->kwnames, nkw * sizeof(char *));
                n->kwnames = nk;
            }
            n->kwnames[nkw++] = key;
            add(P, &n->vals, parse_expression(P, 1));
        } else {
            if (nkw) perr(P, "invalid syntax for function call expression: positional argument after keyword argument%s", "");
            add(P, &n->args, parse_expression(P, 1));
        }
        require_comma = 1;
    }
    expect_op(P, ")");
}

static tp_node *parse_primary(parser *P) {
    tp_tok *t = cur(P);
    tp_node *n;
    if (t->type == TK_NAME) {
        P->i++;
        n = mk(P, E_CONST, t->line);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n->value = tv_bool(1);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n->value = tv_bool(0);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n->value = tv_none();
        else {
            n->kind = E_NAME;
            n->name = t->s;
        }
        return n;
    }
    if (t->type == TK_STRING) { /* adjacent literals concatenate */
        tp_buf b = {0};
        tp_buf_add(P->c, &b, "", 0);
        int line = t->line;
        while (cur(P)->type == TK_STRING) {
            tp_buf_add(P->c, &b, cur(P)->s, cur(P)->n);
            P->i++;
        }
        n = mk(P, E_CONST, line);
        n->value = tp_buf_value(&b);
        return n;
    }
    if (t->type == TK_INT || t->type == TK_FLOAT) {
        P->i++;
        n = mk(P, E_CONST, t->line);
        n->value = t->type == TK_INT ? tv_int(t->i) : tv_float(t->f);
        return n;
    }
    if (skip_op(P, "(")) {
        n = parse_tuple(P, 0, 1, NULL, 1);
        expect_op(P, ")");
        return n;
    }
    if (skip_op(P, "[")) {
        n = mk(P, E_LIST, t->line);
        while (!is_op(P, "]")) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(P, "]")) break;
            add(P, &n->args, parse_expression(P, 1));
        }
        expect_op(P, "]");
        return n;
    }
    if (skip_op(P, "{")) {
        n = mk(P, E_DICT, t->line);
        while (!is_op(P, "}")) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(P, "}")) break;
            add(P, &n->args, parse_expression(P, 1));
            expect_op(P, ":");
            add(P, &n->vals, parse_expression(P, 1));
        }
        expect_op(P, "}");
        return n;
    }
    perr(P, "unexpected %s", tok_desc(t));
}

/* The part of a subscript inside [ ]: an expression or a slice a:b:c. */
static tp_node *parse_subscribed(parser *P, tp_node *obj, int line) {
    tp_node *parts[3] = {NULL, NULL, NULL};
    if (!is_op(P, ":")) {
        tp_node *e = parse_expression(P, 1);
        if (!is_op(P, ":")) {
            tp_node *n = mk(P, E_GETITEM, line);
            n->a = obj;
            n->b = e;
            return n;
        }
        parts[0] = e;
    }
    expect_op(P, ":");
    if (!is_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) parts[1] = parse_expression(P, 1);
    if (skip_op(P, ":"))
        if (!is_op(P, "]") && !is_op(P, ",")) parts[2] = parse_expression(P, 1);
    tp_node *n = mk(P, E_SLICE, line);
    n->a = obj;
    for (int k = 0; k < 3; k++) add(P, &n->args, parts[k]);
    return n;
}

static tp_node *parse_postfix(parser *P, tp_node *n) {
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, ".")) {
            tp_tok *t = cur(P);
            if (t->type == TK_NAME) {
                P->i++;
                tp_node *g = mk(P, E_GETATTR, line);
                g->a = n;
                g->name = t->s;
                n = g;
            } else if (t->type == TK_INT) {
                P->i++;
                tp_node *g = mk(P, E_GETITEM, line);
                g->a = n;
                g->b = mk(P, E_CONST, line);
                g->b->value = tv_int(t->i);
                n = g;
            } else {
                perr(P, "expected a name or number after '.', got %s", tok_desc(t));
            }
        } else if (skip_op(P, "[")) {
            n = parse_subscribed(P, n, line);
            if (is_op(P, ",")) { /* x[a, b]: the key is the tuple (a, b) */
                if (n->kind != E_GETITEM) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "unsupported construct: slice in a tuple subscript");
                tp_node *key = mk(P, E_TUPLE, line);
                add(P, &key->args, n->b);
                while (skip_op(P, ",") && !is_op(P, "]")) add(P, &key->args, parse_expression(P, 1));
                n->b = key;
            }
            expect_op(P, "]");
        } else if (skip_op(P, "(")) {
            tp_node *call = mk(P, E_CALL, line);
            call->a = n;
            parse_call_args(P, call);
            n = call;
        } else {
            return n;
        }
    }
}

static const char *dotted_name(parser *P) {
    const char *nm = expect_name(P);
    while (is_op(P, ".")) {
        P->i++;
        const char *part = expect_name(P);
        size_t a = strlen(nm), b = strlen(part);
        char *j = tp_alloc(P->c, a + b + 2);
        memcpy(j, nm, a);
        j[a] = '.';
        memcpy(j + a + 1, part, b);
        nm = j;
    }
    return nm;
}

static tp_node *parse_filter_expr(parser *P, tp_node *n) {
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, "|")) {
            tp_node *f = mk(P, E_FILTER, line);
            f->a = n;
            f->name = dotted_name(P);
            if (skip_op(P, "(")) parse_call_args(P, f);
            n = f;
        } else if (is_name(P, "is")) {
            P->i++;
            tp_node *t = mk(P, E_TEST, line);
            t->a = n;
            t->op = skip_name(P, "not");
            t->name = dotted_name(P);
            tp_tok *c = cur(P);
            if (skip_op(P, "(")) {
                parse_call_args(P, t);
            } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT || c->type == TK_FLOAT ||
                        is_op(P, "(") || is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                if (is_name(P, "is")) perr(P, "you cannot chain multiple tests with is%s", "");
                add(P, &t->args, parse_postfix(P, parse_primary(P)));
            }
            n = t;
        } else if (skip_op(P, "(")) {
            tp_node *call = mk(P, E_CALL, line);
            call->a = n;
            parse_call_args(P, call);
            n = call;
        } else {
            return n;
        }
    }
}

static tp_node *parse_unary(parser *P, int with_filter) {
    int line = cur(P)->line;
    tp_node *n;
    if (++P->c->depth > 200) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "expression nested too deeply");
    if (skip_op(P, "-")) {
        n = mk(P, E_NEG, line);
        n->a = parse_unary(P, 0);
    } else if (skip_op(P, "+")) {
        n = mk(P, E_POS, line);
        n->a = parse_unary(P, 0);
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->c->depth--;
    return n;
}

static tp_node *binop(parser *P, int op, tp_node *a, tp_node *b, int line) {
    tp_node *n = mk(P, E_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static tp_node *parse_pow(parser *P) {
    tp_node *l = parse_unary(P, 1);
    while (is_op(P, "**")) {
        int line = cur(P)->line;
        P->i++;
        l = binop(P, OP_POW, l, parse_unary(P, 1), line);
    }
    return l;
}

static tp_node *parse_math2(parser *P) {
    tp_node *l = parse_pow(P);
    for (;;) {
        int line = cur(P)->line, op;
        if (is_op(P, "*")) op = OP_MUL;
        else if (is_op(P, "/")) op = OP_DIV;
        else if (is_op(P, "//")) op = OP_FLOORDIV;
        else if (is_op(P, "%")) op = OP_MOD;
        else return l;
        P->i++;
        l = binop(P, op, l, parse_pow(P), line);
    }
}

static tp_node *parse_concat(parser *P) {
    int line = cur(P)->line;
    tp_node *first = parse_math2(P);
    if (!is_op(P, "~")) return first;
    tp_node *n = mk(P, E_CONCAT, line);
    add(P, &n->args, first);
    while (skip_op(P, "~")) add(P, &n->args, parse_math2(P));
    return n;
}

static tp_node *parse_math1(parser *P) {
    tp_node *l = parse_concat(P);
    for (;;) {
        int line = cur(P)->line, op;
        if (is_op(P, "+")) op = OP_ADD;
        else if (is_op(P, "-")) op = OP_SUB;
        else return l;
        P->i++;
        l = binop(P, op, l, parse_concat(P), line);
    }
}

static tp_node *parse_compare(parser *P) {
    int line = cur(P)->line;
    tp_node *first = parse_math1(P), *n = NULL;
    size_t cap = 0;
    for (;;) {
        int op;
        if (is_op(P, "==")) op = CMP_EQ;
        else if (is_op(P, "!=")) op = CMP_NE;
        else if (is_op(P, "<")) op = CMP_LT;
        else if (is_op(P, "<=")) op = CMP_LE;
        else if (is_op(P, ">")) op = CMP_GT;
        else if (is_op(P, ">=")) op = CMP_GE;
        else if (is_name(P, "in")) op = CMP_IN;
        else if (is_name(P, "not") && peek(P, 1)->type == TK_NAME && !strcmp(peek(P, 1)->s, "in")) op = CMP_NOTIN;
        else break;
        P->i += op == CMP_NOTIN ? 2 : 1;
        if (!n) {
            n = mk(P, E_COMPARE, line);
            n->a = first;
        }
        if (n->args.n == cap) {
            cap = cap ? cap * 2 : 4;
            int *ops = tp_alloc(P->c, cap * sizeof(int));
            if (n->args.n) memcpy(ops, n->cmpops, n->args.n * sizeof(int));
            n->cmpops = ops;
        }
        n->cmpops[n->args.n] = op;
        add(P, &n->args, parse_math1(P));
    }
    return n ? n : first;
}

static tp_node *parse_not(parser *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        P->i++;
        tp_node *n = mk(P, E_NOT, line);
        if (++P->c->depth > 200) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "expression nested too deeply");
        n->a = parse_not(P);
        P->c->depth--;
        return n;
    }
    return parse_compare(P);
}

static tp_node *parse_and(parser *P) {
    tp_node *l = parse_not(P);
    while (is_name(P, "and")) {
        int line = cur(P)->line;
        P->i++;
        tp_node *n = mk(P, E_AND, line);
        n->a = l;
        n->b = parse_not(P);
        l = n;
    }
    return l;
}

static tp_node *parse_or(parser *P) {
    tp_node *l = parse_and(P);
    while (is_name(P, "or")) {
        int line = cur(P)->line;
        P->i++;
        tp_node *n = mk(P, E_OR, line);
        n->a = l;
        n->b = parse_and(P);
        l = n;
    }
    return l;
}

static tp_node *parse_condexpr(parser *P) {
    tp_node *e = parse_or(P);
    while (is_name(P, "if")) {
        int line = cur(P)->line;
        P->i++;
        tp_node *n = mk(P, E_COND, line);
        n->b = e;
        n->a = parse_or(P);
        if (++P->c->depth > 200) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "expression nested too deeply");
        n->c = skip_name(P, "else") ? parse_condexpr(P) : NULL;
        P->c->depth--;
        e = n;
    }
    return e;
}

static tp_node *parse_expression(parser *P, int with_condexpr) {
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

static int tuple_end(parser *P, const char *extra_end) {
    tp_tok *t = cur(P);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF || is_op(P, ")")) return 1;
    return extra_end && t->type == TK_NAME && strcmp(t->s, extra_end) == 0;
}

/* An expression or an unparenthesised tuple "a, b"; simplified: names only (assignment targets). */
static tp_node *parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens) {
    int line = cur(P)->line, is_tuple = 0;
    tp_node *t = mk(P, E_TUPLE, line);
    for (;;) {
        if (t->args.n) expect_op(P, ",");
        if (tuple_end(P, extra_end)) break;
        tp_node *e;
        if (simplified) {
            if (cur(P)->type != TK_NAME) perr(P, "can't assign to %s", tok_desc(cur(P)));
            e = mk(P, E_NAME, cur(P)->line);
            e->name = P->t[P->i++].s;
        } else {
            e = parse_expression(P, with_condexpr);
        }
        add(P, &t->args, e);
        if (is_op(P, ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (t->args.n) return t->args.v[0];
        if (!explicit_parens) perr(P, "expected an expression, got %s", tok_desc(cur(P)));
    }
    return t;
}

/* ---------------------------------------------------------------- statements */

static tp_nodes subparse(parser *P, const char *const *ends, const char *opener, int open_line);

static void end_block(parser *P) { expect_type(P, TK_BLOCK_END); }

/* The end of a tag that opens a body: Jinja accepts a Python-style ':' before '%}'. */
static void begin_body(parser *P) {
    skip_op(P, ":");
    expect_type(P, TK_BLOCK_END);
}

static int name_in(const char *nm, const char *const *set) {
    for (; set && *set; set++)
        if (!strcmp(nm, *set)) return 1;
    return 0;
}

static tp_node *parse_if(parser *P, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    tp_node *n = mk(P, S_IF, line);
    size_t cap = 0;
    tp_nodes *br = NULL;
    for (;;) {
        add(P, &n->args, parse_tuple(P, 0, 0, NULL, 0));
        begin_body(P);
        if (n->args.n > cap) {
            cap = cap ? cap * 2 : 4;
            tp_nodes *nb = tp_alloc(P->c, (cap + 1) * sizeof(tp_nodes));
            if (br) memcpy(nb, br, (n->args.n - 1) * sizeof(tp_nodes));
            br = nb;
        }
        br[n->args.n - 1] = subparse(P, ends, "if", line);
        const char *tag = P->t[P->i++].s;
        if (!strcmp(tag, "elif")) continue;
        if (!strcmp(tag, "else")) {
            begin_body(P);
            br[n->args.n] = subparse(P, endif, "if", line);
            P->i++;
        }
        end_block(P);
        break;
    }
    n->branches = br;
    return n;
}

static tp_node *parse_for(parser *P, int line) {
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    tp_node *n = mk(P, S_FOR, line);
    n->a = parse_tuple(P, 1, 1, "in", 0);
    if (!skip_name(P, "in")) perr(P, "expected 'in' in the for loop, got %s", tok_desc(cur(P)));
    n->b = parse_tuple(P, 0, 0, "recursive", 0);
    if (skip_name(P, "if")) n->c = parse_expression(P, 1);
    if (is_name(P, "recursive")) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "unsupported construct: recursive for loop");
    begin_body(P);
    P->loop_depth++;
    n->body = subparse(P, ends, "for", line);
    P->loop_depth--;
    if (!strcmp(P->t[P->i++].s, "else")) {
        begin_body(P);
        n->orelse = subparse(P, endfor, "for", line);
        P->i++;
    }
    end_block(P);
    return n;
}

static tp_node *parse_set(parser *P, int line) {
    static const char *const ends[] = {"endset", NULL};
    tp_node *target;
    if (cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && !strcmp(peek(P, 1)->s, ".")) {
        target = mk(P, E_GETATTR, line); /* ns.attr */
        target->a = mk(P, E_NAME, line);
        target->a->name = P->t[P->i].s;
        P->i += 2;
        target->name = expect_name(P);
    } else {
        target = parse_tuple(P, 1, 1, NULL, 0);
    }
    if (skip_op(P, "=")) {
        tp_node *n = mk(P, S_SET, line);
        n->a = target;
        n->b = parse_tuple(P, 0, 1, NULL, 0);
        end_block(P);
        return n;
    }
    if (is_op(P, "|")) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "unsupported construct: filtered block set");
    if (target->kind == E_TUPLE) perr(P, "a block set assigns a single name, got %s", "a tuple");
    begin_body(P);
    tp_node *n = mk(P, S_SET_BLOCK, line);
    n->a = target;
    n->body = subparse(P, ends, "set", line);
    P->i++;
    end_block(P);
    return n;
}

static tp_node *parse_macro(parser *P, int line) {
    static const char *const ends[] = {"endmacro", NULL};
    tp_node *n = mk(P, S_MACRO, line);
    n->name = expect_name(P);
    expect_op(P, "(");
    size_t cap = 0;
    while (!is_op(P, ")")) {
        if (n->args.n) expect_op(P, ",");
        if (is_op(P, ")")) break;
        const char *pn = expect_name(P);
        if (n->args.n == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nk = tp_alloc(P->c, cap * sizeof(char *));
            if (n->args.n) memcpy(nk, n->kwnames, n->args.n * sizeof(char *));
            n->kwnames = nk;
        }
        n->kwnames[n->args.n] = pn;
        tp_node *dflt = NULL;
        if (skip_op(P, "=")) dflt = parse_expression(P, 1);
        else if (n->args.n && n->args.v[n->args.n - 1])
            perr(P, "non-default argument '%s' follows default argument", pn);
        add(P, &n->args, dflt);
    }
    expect_op(P, ")");
    begin_body(P);
    int saved = P->loop_depth;
    P->loop_depth = 0;
    n->body = subparse(P, ends, "macro", line);
    P->loop_depth = saved;
    P->i++;
    end_block(P);
    return n;
}

static tp_node *parse_statement(parser *P) {
    static const char *const jinja_tags[] = {"block", "extends", "include", "import", "from", "call", "filter",
                                             "with", "autoescape", "raw", "do", "trans", "pluralize", "debug", NULL};
    static const char *const gen_ends[] = {"endgeneration", NULL};
    tp_tok *t = cur(P);
    int line = t->line;
    if (t->type != TK_NAME) perr(P, "tag name expected, got %s", tok_desc(t));
    const char *tag = t->s;
    P->i++;
    if (P->c->depth > 200) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "blocks nested too deeply");
    if (!strcmp(tag, "if")) return parse_if(P, line);
    if (!strcmp(tag, "for")) return parse_for(P, line);
    if (!strcmp(tag, "set")) return parse_set(P, line);
    if (!strcmp(tag, "macro")) return parse_macro(P, line);
    if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!P->loop_depth) perr(P, "'%s' outside of a for loop", tag);
        end_block(P);
        return mk(P, tag[0] == 'b' ? S_BREAK : S_CONTINUE, line);
    }
    if (!strcmp(tag, "generation")) { /* transformers' assistant-mask marker: renders its body */
        begin_body(P);
        tp_node *n = mk(P, S_BLOCK, line);
        n->body = subparse(P, gen_ends, "generation", line);
        P->i++;
        end_block(P);
        return n;
    }
    if (name_in(tag, jinja_tags)) tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "unsupported tag '%s'", tag);
    tp_fail(P->c, QWENC_ERR_UNSUPPORTED, line, "unknown tag '%s'", tag);
}

/* Template data and tags up to a block tag named in ends (left as the current token) or the end. */
static tp_nodes subparse(parser *P, const char *const *ends, const char *opener, int open_line) {
    tp_nodes body = {0};
    for (;;) {
        tp_tok *t = cur(P);
        switch (t->type) {
        case TK_DATA: {
            tp_node *n = mk(P, S_TEXT, t->line);
            n->value = tv_str(t->s, t->n);
            add(P, &body, n);
            P->i++;
            break;
        }
        case TK_VAR_BEGIN: {
            P->i++;
            tp_node *n = mk(P, S_OUTPUT, t->line);
            n->a = parse_tuple(P, 0, 1, NULL, 0);
            expect_type(P, TK_VAR_END);
            add(P, &body, n);
            break;
        }
        case TK_BLOCK_BEGIN:
            P->i++;
            if (cur(P)->type == TK_NAME && name_in(cur(P)->s, ends)) return body;
            if (cur(P)->type == TK_NAME && !strncmp(cur(P)->s, "end", 3))
                tp_fail(P->c, QWENC_ERR_FORMAT, cur(P)->line, "unexpected '%s'%s%s%s", cur(P)->s,
                        opener ? " inside a '" : "", opener ? opener : "", opener ? "' block" : "");
            P->c->depth++;
            add(P, &body, parse_statement(P));
            P->c->depth--;
            break;
        case TK_EOF:
            if (ends) {
                const char *const *e = ends;
                while (e[1] && strncmp(*e, "end", 3)) e++;
                tp_fail(P->c, QWENC_ERR_FORMAT, open_line, "unexpected end of template: the '%s' block opened here needs '%s'",
                        opener, *e);
            }
            return body;
        default: perr(P, "unexpected %s", tok_desc(t));
        }
    }
}

/* ---------------------------------------------------------------- filter and test names */

static void check_body(tp_ctx *c, const tp_nodes *body, int soft);

/* Jinja's compiler rejects a filter or test name it does not know, except in a "soft" frame (the body or
   test of an {% if %}, or a conditional expression, not inside a nested loop, macro or block set), where
   the check is left to run time. Mirror that, so a template fails to load exactly when Jinja's does. */
static void check_expr(tp_ctx *c, const tp_node *e, int soft) {
    if (!e) return;
    if (++c->depth > TP_MAX_DEPTH)
        tp_fail(c, QWENC_ERR_UNSUPPORTED, e->line, "expression nested too deeply (over %d levels)", TP_MAX_DEPTH);
    if (e->kind == E_COND) soft = 1;
    if ((e->kind == E_FILTER && !tp_filter_known(e->name)) || (e->kind == E_TEST && !tp_test_known(e->name))) {
        if (!soft)
            tp_fail(c, QWENC_ERR_UNSUPPORTED, e->line, "no %s named '%s'", e->kind == E_FILTER ? "filter" : "test", e->name);
    }
    check_expr(c, e->a, soft);
    check_expr(c, e->b, soft);
    check_expr(c, e->c, soft);
    for (size_t i = 0; i < e->args.n; i++) check_expr(c, e->args.v[i], soft);
    for (size_t i = 0; i < e->vals.n; i++) check_expr(c, e->vals.v[i], soft);
    c->depth--;
}

static void check_body(tp_ctx *c, const tp_nodes *body, int soft) {
    for (size_t k = 0; k < body->n; k++) {
        const tp_node *n = body->v[k];
        switch (n->kind) {
        case S_OUTPUT: check_expr(c, n->a, soft); break;
        case S_SET: check_expr(c, n->b, soft); break;
        case S_IF:
            for (size_t i = 0; i < n->args.n; i++) {
                check_expr(c, n->args.v[i], 1);
                check_body(c, &n->branches[i], 1);
            }
            check_body(c, &n->branches[n->args.n], 1);
            break;
        case S_FOR:
            check_expr(c, n->b, soft);
            check_expr(c, n->c, 0);
            check_body(c, &n->body, 0);
            check_body(c, &n->orelse, soft);
            break;
        case S_MACRO:
            for (size_t i = 0; i < n->args.n; i++) check_expr(c, n->args.v[i], 0);
            check_body(c, &n->body, 0);
            break;
        case S_SET_BLOCK:
        case S_BLOCK: check_body(c, &n->body, 0); break;
        default: break;
        }
    }
}

tp_nodes tp_parse(tp_ctx *c, const char *src, size_t n) {
    size_t ok = tu_valid_prefix(src, n);
    if (ok != n) tp_fail(c, QWENC_ERR_FORMAT, 1 + count_nl(src, ok), "the template is not valid UTF-8 (byte %zu)", ok);
    /* newlines normalised to \n, then one trailing newline dropped (keep_trailing_newline=False) */
    char *s = tp_alloc(c, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            s[m++] = src[i];
        }
    }
    if (m && s[m - 1] == '\n') m--;
    lexer L = {.c = c, .src = s, .n = m, .line = 1};
    lex(&L);
    parser P = {.c = c, .t = L.toks, .ntok = L.ntok};
    tp_nodes prog = subparse(&P, NULL, NULL, 0);
    check_body(c, &prog, 0);
    return prog;
}
