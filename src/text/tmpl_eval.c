/*
 * tmpl_eval.c - executes the parsed chat template: statements, expressions, scopes, macros.
 *
 * Scoping follows Jinja2's generated code: {% if %} shares its enclosing scope; every iteration of a
 * {% for %} body gets a fresh scope whose parent is the enclosing one (a {% set %} inside a loop does not
 * outlive the iteration; namespace() objects are how templates carry state out); a macro call gets a
 * scope whose parent is the scope the macro was defined in. Names not found in any scope resolve to the
 * global functions, then to Undefined.
 *
 * Lookups follow jinja2.sandbox.ImmutableSandboxedEnvironment: `a.b` tries the attribute (a dict
 * method such as items, a str method...) before the item, `a[b]` the item before the attribute; a miss is
 * an Undefined that fails only when used. Operators follow Python on the JSON values (int and float
 * arithmetic, str + str, floor division and modulo rounding toward minus infinity, chained comparisons).
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <string.h>

#include "text/tmpl.h"

/* ---------------------------------------------------------------- scopes */

tp_scope *tp_scope_new(tp_ctx *c, tp_scope *parent) {
    tp_scope *s = tp_alloc(c, sizeof(tp_scope));
    s->parent = parent;
    return s;
}

void tp_scope_set(tp_ctx *c, tp_scope *s, const char *name, tv_value v) { tv_dict_set(c, &s->vars, tv_strz(name), v); }

static tv_value lookup(tp_ctx *c, const char *name) {
    for (tp_scope *s = c->scope; s; s = s->parent) {
        tv_value *v = tv_dict_get_str(&s->vars, name);
        if (v) return *v;
    }
    tv_value g = tp_global(c, name);
    if (g.type != TV_UNDEF) return g;
    return tv_undef(c, "'%s' is undefined", name);
}

_Noreturn void tp_undef_fail(tp_ctx *c, int line, tv_value u) {
    tp_fail(c, QWENC_ERR_ARG, line, "UndefinedError: %s", u.u.undef);
}

/* ---------------------------------------------------------------- attribute and item lookup */

/* Jinja's object_type_repr, used in the hints of Undefined values. */
static const char *obj_repr(tv_value v) {
    switch ((tv_type)v.type) {
    case TV_NONE: return "None";
    case TV_BOOL: return "bool object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_STR: return "str object";
    case TV_LIST: return (v.flags & TV_F_TUPLE) ? "tuple object" : "list object";
    case TV_DICT: return "dict object";
    case TV_NS: return "jinja2.utils.Namespace object";
    case TV_LOOP: return "jinja2.runtime.LoopContext object";
    default: return "function object";
    }
}

static tv_value loop_attr(tp_ctx *c, tv_value lv, const char *name) {
    const tv_loop *L = lv.u.loop;
    size_t n = L->items->n, i = L->index0;
    if (!strcmp(name, "index0")) return tv_int((int64_t)i);
    if (!strcmp(name, "index")) return tv_int((int64_t)i + 1);
    if (!strcmp(name, "revindex")) return tv_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return tv_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return tv_bool(i == 0);
    if (!strcmp(name, "last")) return tv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return tv_int((int64_t)n);
    if (!strcmp(name, "depth")) return tv_int(L->depth);
    if (!strcmp(name, "depth0")) return tv_int(L->depth - 1);
    if (!strcmp(name, "previtem"))
        return i > 0 ? L->items->items[i - 1] : tv_undef(c, "there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? L->items->items[i + 1] : tv_undef(c, "there is no next item");
    return tp_method(c, lv, name);
}

tv_value tp_getattr(tp_ctx *c, int line, tv_value obj, const char *name) {
    switch ((tv_type)obj.type) {
    case TV_UNDEF: tp_undef_fail(c, line, obj);
    case TV_DICT: {
        tv_value m = tp_method(c, obj, name);
        if (m.type != TV_UNDEF || m.u.undef[0]) return m;
        tv_value *v = tv_dict_get_str(obj.u.d, name);
        if (v) return *v;
        break;
    }
    case TV_NS: {
        tv_value *v = tv_dict_get_str(obj.u.d, name);
        if (v) return *v;
        break;
    }
    case TV_STR:
    case TV_LIST: {
        tv_value m = tp_method(c, obj, name);
        if (m.type != TV_UNDEF || m.u.undef[0]) return m;
        break;
    }
    case TV_LOOP: {
        tv_value m = loop_attr(c, obj, name);
        if (m.type != TV_UNDEF || m.u.undef[0]) return m;
        break;
    }
    default: break;
    }
    return tv_undef(c, "'%s' has no attribute '%s'", obj_repr(obj), name);
}

static int as_index(tv_value k, int64_t *out) {
    if (k.type == TV_INT) *out = k.u.i;
    else if (k.type == TV_BOOL) *out = k.u.b;
    else return 0;
    return 1;
}

tv_value tp_getitem(tp_ctx *c, int line, tv_value obj, tv_value key) {
    int64_t i;
    switch ((tv_type)obj.type) {
    case TV_UNDEF: tp_undef_fail(c, line, obj);
    case TV_DICT: {
        long k = tv_dict_find(c, obj.u.d, key);
        if (k >= 0) return obj.u.d->vals[k];
        break;
    }
    case TV_LIST:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.u.l->items[i];
        }
        break;
    case TV_STR:
        if (as_index(key, &i)) {
            tp_tick(c, 1 + obj.u.s.n / 8);
            int64_t n = (int64_t)tu_len(obj.u.s.p, obj.u.s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t a = tu_offset(obj.u.s.p, obj.u.s.n, (size_t)i), b = a;
                tu_next(obj.u.s.p, obj.u.s.n, &b);
                return tv_str(obj.u.s.p + a, b - a);
            }
        }
        break;
    default: break;
    }
    if (key.type == TV_STR) {
        char *nm = tp_alloc(c, key.u.s.n + 1);
        memcpy(nm, key.u.s.p, key.u.s.n);
        if (obj.type == TV_DICT) {
            tv_value m = tp_method(c, obj, nm);
            if (m.type != TV_UNDEF || m.u.undef[0]) return m;
            return tv_undef(c, "'%s' has no attribute '%s'", obj_repr(obj), nm);
        }
        return tp_getattr(c, line, obj, nm);
    }
    tp_buf b = {0};
    tv_repr_append(c, &b, key);
    return tv_undef(c, "'%s' has no element %s", obj_repr(obj), b.p);
}

/* Python's PySlice_AdjustIndices: clamp start/stop of a slice of a sequence of length n. */
static void slice_indices(tp_ctx *c, int line, tv_value *parts, int64_t n, int64_t *start, int64_t *stop, int64_t *step) {
    int64_t v[3] = {0, 0, 1};
    for (int k = 0; k < 3; k++)
        if (parts[k].type != TV_NONE && !as_index(parts[k], &v[k]))
            tp_fail(c, QWENC_ERR_ARG, line, "TypeError: slice indices must be integers or None, not %s", tv_type_name(parts[k]));
    *step = v[2];
    if (*step == 0) tp_fail(c, QWENC_ERR_ARG, line, "ValueError: slice step cannot be zero");
    for (int k = 0; k < 2; k++) {
        int64_t x;
        if (parts[k].type == TV_NONE) {
            x = k == 0 ? (*step > 0 ? 0 : n - 1) : (*step > 0 ? n : -1);
        } else {
            x = v[k];
            if (x < 0) {
                x += n;
                if (x < 0) x = *step < 0 ? -1 : 0;
            } else if (x >= n) {
                x = *step < 0 ? n - 1 : n;
            }
        }
        if (k == 0) *start = x;
        else *stop = x;
    }
}

static tv_value do_slice(tp_ctx *c, int line, tv_value obj, tv_value *parts) {
    if (obj.type == TV_UNDEF) tp_undef_fail(c, line, obj);
    int64_t start, stop, step;
    if (obj.type == TV_LIST) {
        slice_indices(c, line, parts, (int64_t)obj.u.l->n, &start, &stop, &step);
        tv_value r = tv_list_new(c, 0);
        r.flags = obj.flags & TV_F_TUPLE;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) tv_list_push(c, r.u.l, obj.u.l->items[i]);
        return r;
    }
    if (obj.type == TV_STR) {
        size_t n = tu_len(obj.u.s.p, obj.u.s.n);
        size_t *off = tp_alloc(c, (n + 1) * sizeof(size_t));
        size_t pos = 0;
        for (size_t k = 0; k < n; k++) {
            off[k] = pos;
            tu_next(obj.u.s.p, obj.u.s.n, &pos);
        }
        off[n] = obj.u.s.n;
        slice_indices(c, line, parts, (int64_t)n, &start, &stop, &step);
        if (step == 1) return tv_str(obj.u.s.p + off[start < stop ? start : 0], start < stop ? off[stop] - off[start] : 0);
        tp_buf b = {0};
        tp_buf_add(c, &b, "", 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            tp_buf_add(c, &b, obj.u.s.p + off[i], off[i + 1] - off[i]);
        return tp_buf_value(&b);
    }
    /* Jinja compiles a slice to a plain Python subscript: other types raise */
    if (obj.type == TV_DICT) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: unhashable type: 'slice'");
    tp_fail(c, QWENC_ERR_ARG, line, "TypeError: '%s' object is not subscriptable", tv_type_name(obj));
}

/* ---------------------------------------------------------------- operators */

static int is_intlike(tv_value v) { return v.type == TV_INT || v.type == TV_BOOL; }
static int64_t ival(tv_value v) { return v.type == TV_INT ? v.u.i : v.u.b; }
static int is_num(tv_value v) { return is_intlike(v) || v.type == TV_FLOAT; }
static double fval(tv_value v) { return v.type == TV_FLOAT ? v.u.f : (double)ival(v); }

static const char *const OPNAME[] = {"+", "-", "*", "/", "//", "%", "**"};

_Noreturn static void op_type_error(tp_ctx *c, int line, int op, tv_value a, tv_value b) {
    if (op == OP_ADD && a.type == TV_STR)
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: can only concatenate str (not \"%s\") to str", tv_type_name(b));
    if (op == OP_ADD && a.type == TV_LIST)
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: can only concatenate %s (not \"%s\") to %s", tv_type_name(a),
                tv_type_name(b), tv_type_name(a));
    if (op == OP_MOD && a.type == TV_STR)
        tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported construct: printf-style string formatting with %%");
    tp_fail(c, QWENC_ERR_ARG, line, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", OPNAME[op],
            tv_type_name(a), tv_type_name(b));
}

_Noreturn static void int_overflow(tp_ctx *c, int line) {
    tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "integer result outside the 64-bit range");
}

/* HTML escaping as markupsafe.escape does it. */
static void html_escape(tp_ctx *c, tp_buf *b, tv_value s) {
    for (size_t i = 0; i < s.u.s.n; i++) {
        switch (s.u.s.p[i]) {
        case '&': tp_buf_addz(c, b, "&amp;"); break;
        case '<': tp_buf_addz(c, b, "&lt;"); break;
        case '>': tp_buf_addz(c, b, "&gt;"); break;
        case '"': tp_buf_addz(c, b, "&#34;"); break;
        case '\'': tp_buf_addz(c, b, "&#39;"); break;
        default: tp_buf_addc(c, b, s.u.s.p[i]);
        }
    }
}

static tv_value repeat(tp_ctx *c, int line, tv_value seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq.type == TV_STR) {
        if (seq.u.s.n && (uint64_t)k > (256u << 20) / seq.u.s.n)
            tp_fail(c, QWENC_ERR_ARG, line, "string repetition result larger than 256 MiB");
        tp_buf b = {0};
        tp_buf_add(c, &b, "", 0);
        for (int64_t i = 0; i < k; i++) tp_buf_add(c, &b, seq.u.s.p, seq.u.s.n);
        return tp_buf_value(&b);
    }
    if (seq.u.l->n && (uint64_t)k > (16u << 20) / seq.u.l->n) tp_fail(c, QWENC_ERR_ARG, line, "list repetition too large");
    tv_value r = tv_list_new(c, 0);
    r.flags = seq.flags;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++) tv_list_push(c, r.u.l, seq.u.l->items[j]);
    return r;
}

tv_value tp_binop(tp_ctx *c, int line, int op, tv_value a, tv_value b) {
    if (a.type == TV_UNDEF) tp_undef_fail(c, line, a);
    if (b.type == TV_UNDEF) tp_undef_fail(c, line, b);
    if (is_num(a) && is_num(b)) {
        int ints = is_intlike(a) && is_intlike(b);
        int64_t x = ints ? ival(a) : 0, y = ints ? ival(b) : 0, r;
        double fx = fval(a), fy = fval(b);
        switch (op) {
        case OP_ADD:
            if (!ints) return tv_float(fx + fy);
            if (__builtin_add_overflow(x, y, &r)) int_overflow(c, line);
            return tv_int(r);
        case OP_SUB:
            if (!ints) return tv_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &r)) int_overflow(c, line);
            return tv_int(r);
        case OP_MUL:
            if (!ints) return tv_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &r)) int_overflow(c, line);
            return tv_int(r);
        case OP_DIV:
            if (fy == 0) tp_fail(c, QWENC_ERR_ARG, line, "ZeroDivisionError: division by zero");
            return tv_float(fx / fy);
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints) {
                if (y == 0) tp_fail(c, QWENC_ERR_ARG, line, "ZeroDivisionError: integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) int_overflow(c, line);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return tv_int(op == OP_MOD ? m : q);
            } else {
                if (fy == 0) tp_fail(c, QWENC_ERR_ARG, line, "ZeroDivisionError: float %s", op == OP_MOD ? "modulo" : "floor division by zero");
                double mod = fmod(fx, fy), div = (fx - mod) / fy, fl;
                if (mod != 0) {
                    if ((fy < 0) != (mod < 0)) {
                        mod += fy;
                        div -= 1.0;
                    }
                } else {
                    mod = copysign(0.0, fy);
                }
                if (div != 0) {
                    fl = floor(div);
                    if (div - fl > 0.5) fl += 1.0;
                } else {
                    fl = copysign(0.0, fx / fy);
                }
                return tv_float(op == OP_MOD ? mod : fl);
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) int_overflow(c, line);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) int_overflow(c, line);
                }
                return tv_int(acc);
            }
            if (fx == 0 && fy < 0) tp_fail(c, QWENC_ERR_ARG, line, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
            return tv_float(pow(fx, fy));
        }
    }
    if (op == OP_ADD && a.type == TV_STR && b.type == TV_STR) {
        tp_buf buf = {0};
        tp_buf_add(c, &buf, "", 0);
        int safe = (a.flags | b.flags) & TV_F_SAFE;
        /* Markup + str escapes the str, str + Markup escapes the left operand (markupsafe) */
        if (safe && !(a.flags & TV_F_SAFE)) html_escape(c, &buf, a);
        else tp_buf_add(c, &buf, a.u.s.p, a.u.s.n);
        if (safe && !(b.flags & TV_F_SAFE)) html_escape(c, &buf, b);
        else tp_buf_add(c, &buf, b.u.s.p, b.u.s.n);
        tv_value r = tp_buf_value(&buf);
        r.flags = (uint8_t)safe;
        return r;
    }
    if (op == OP_ADD && a.type == TV_LIST && b.type == TV_LIST && (a.flags & TV_F_TUPLE) == (b.flags & TV_F_TUPLE)) {
        tv_value r = tv_list_new(c, a.u.l->n + b.u.l->n);
        r.flags = a.flags;
        for (size_t i = 0; i < a.u.l->n; i++) tv_list_push(c, r.u.l, a.u.l->items[i]);
        for (size_t i = 0; i < b.u.l->n; i++) tv_list_push(c, r.u.l, b.u.l->items[i]);
        return r;
    }
    if (op == OP_MUL && (a.type == TV_STR || a.type == TV_LIST) && is_intlike(b)) return repeat(c, line, a, ival(b));
    if (op == OP_MUL && (b.type == TV_STR || b.type == TV_LIST) && is_intlike(a)) return repeat(c, line, b, ival(a));
    op_type_error(c, line, op, a, b);
}

/* Python `a in b`. */
static int contains(tp_ctx *c, int line, tv_value item, tv_value seq) {
    switch ((tv_type)seq.type) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (item.type != TV_STR)
            tp_fail(c, QWENC_ERR_ARG, line, "TypeError: 'in <string>' requires string as left operand, not %s", tv_type_name(item));
        if (item.u.s.n == 0) return 1;
        if (item.u.s.n > seq.u.s.n) return 0;
        tp_tick(c, 1 + seq.u.s.n / 8);
        return memmem(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n) != NULL; /* linear (two-way) */
    case TV_LIST:
        for (size_t i = 0; i < seq.u.l->n; i++)
            if (tv_eq(c, seq.u.l->items[i], item)) return 1;
        return 0;
    case TV_DICT:
    case TV_NS:
        if (item.type == TV_LIST && !(item.flags & TV_F_TUPLE))
            tp_fail(c, QWENC_ERR_ARG, line, "TypeError: unhashable type: 'list'");
        if (item.type == TV_DICT) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: unhashable type: 'dict'");
        return tv_dict_find(c, seq.u.d, item) >= 0;
    case TV_LOOP:
        for (size_t i = 0; i < seq.u.loop->items->n; i++)
            if (tv_eq(c, seq.u.loop->items->items[i], item)) return 1;
        return 0;
    default:
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: argument of type '%s' is not iterable", tv_type_name(seq));
    }
}

static int compare(tp_ctx *c, int line, int op, tv_value a, tv_value b) {
    switch (op) {
    case CMP_EQ: return tv_eq(c, a, b);
    case CMP_NE: return !tv_eq(c, a, b);
    case CMP_LT: return tv_lt(c, line, a, b);
    case CMP_GT: return tv_lt(c, line, b, a);
    case CMP_LE: return tv_lt(c, line, a, b) || tv_eq(c, a, b); /* tv_lt raises for unorderable types, as Python does */
    case CMP_GE: return tv_lt(c, line, b, a) || tv_eq(c, a, b);
    case CMP_IN: return contains(c, line, a, b);
    default: return !contains(c, line, a, b);
    }
}

int tp_compare(tp_ctx *c, int line, int op, tv_value a, tv_value b) { return compare(c, line, op, a, b); }

/* ---------------------------------------------------------------- expressions */

static tv_value eval_node(tp_ctx *c, const tp_node *e);

static void eval_args(tp_ctx *c, const tp_node *e, tv_value **args, tv_value **kw) {
    *args = e->args.n ? tp_alloc(c, e->args.n * sizeof(tv_value)) : NULL;
    *kw = e->vals.n ? tp_alloc(c, e->vals.n * sizeof(tv_value)) : NULL;
    for (size_t i = 0; i < e->args.n; i++) (*args)[i] = tp_eval(c, e->args.v[i]);
    for (size_t i = 0; i < e->vals.n; i++) (*kw)[i] = tp_eval(c, e->vals.v[i]);
}

static tv_value call_macro(tp_ctx *c, int line, const tv_func *f, const tv_value *args, size_t nargs,
                           const char **names, const tv_value *kw, size_t nkw) {
    const tp_node *m = f->macro;
    size_t np = m->args.n;
    if (nargs > np) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: macro '%s' takes not more than %zu argument(s)", m->name, np);
    if (c->calls >= 100) tp_fail(c, QWENC_ERR_ARG, line, "RecursionError: macro '%s' nested more than 100 calls deep", m->name);
    tp_scope *s = tp_scope_new(c, f->closure);
    int *bound = tp_alloc(c, (np + 1) * sizeof(int));
    for (size_t i = 0; i < nargs; i++) {
        tp_scope_set(c, s, m->kwnames[i], args[i]);
        bound[i] = 1;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(m->kwnames[i], names[k])) i++;
        if (i == np) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: macro '%s' takes no keyword argument '%s'", m->name, names[k]);
        if (bound[i]) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: macro '%s' got multiple values for argument '%s'", m->name, names[k]);
        tp_scope_set(c, s, names[k], kw[k]);
        bound[i] = 1;
    }
    tp_scope *saved = c->scope;
    c->scope = s;
    c->calls++;
    for (size_t i = 0; i < np; i++) {
        if (bound[i]) continue;
        tv_value v = m->args.v[i] ? tp_eval(c, m->args.v[i]) : tv_undef(c, "parameter '%s' was not provided", m->kwnames[i]);
        tp_scope_set(c, s, m->kwnames[i], v);
    }
    tp_buf out = {0};
    tp_buf_add(c, &out, "", 0);
    tp_exec(c, &m->body, &out);
    c->calls--;
    c->scope = saved;
    return tp_buf_value(&out);
}

tv_value tp_call(tp_ctx *c, int line, tv_value f, const tv_value *args, size_t nargs, const char **names,
                 const tv_value *kw, size_t nkw) {
    if (f.type == TV_UNDEF) tp_undef_fail(c, line, f);
    if (f.type != TV_FUNC) tp_fail(c, QWENC_ERR_ARG, line, "TypeError: '%s' object is not callable", tv_type_name(f));
    switch (f.u.fn->kind) {
    case TF_MACRO: return call_macro(c, line, f.u.fn, args, nargs, names, kw, nkw);
    case TF_METHOD: return tp_call_method(c, line, f.u.fn, args, nargs, names, kw, nkw);
    default: return tp_call_global(c, line, f.u.fn, args, nargs, names, kw, nkw);
    }
}

/* A left-leaning chain such as 1 + 1 + ... + 1 is as deep as it is long: bound the recursion. */
tv_value tp_eval(tp_ctx *c, const tp_node *e) {
    if (++c->depth > TP_MAX_DEPTH)
        tp_fail(c, QWENC_ERR_UNSUPPORTED, e->line, "expression nested too deeply (over %d levels)", TP_MAX_DEPTH);
    c->cur_line = e->line;
    tp_tick(c, 1);
    tv_value v = eval_node(c, e);
    c->depth--;
    return v;
}

static tv_value eval_node(tp_ctx *c, const tp_node *e) {
    int line = e->line;
    switch (e->kind) {
    case E_CONST: return e->value;
    case E_NAME: return lookup(c, e->name);
    case E_GETATTR: return tp_getattr(c, line, tp_eval(c, e->a), e->name);
    case E_GETITEM: {
        tv_value obj = tp_eval(c, e->a);
        return tp_getitem(c, line, obj, tp_eval(c, e->b));
    }
    case E_SLICE: {
        tv_value obj = tp_eval(c, e->a), parts[3];
        for (int k = 0; k < 3; k++) parts[k] = e->args.v[k] ? tp_eval(c, e->args.v[k]) : tv_none();
        return do_slice(c, line, obj, parts);
    }
    case E_CALL: {
        tv_value f = tp_eval(c, e->a), *args, *kw;
        eval_args(c, e, &args, &kw);
        return tp_call(c, line, f, args, e->args.n, e->kwnames, kw, e->vals.n);
    }
    case E_FILTER: {
        tv_value v = tp_eval(c, e->a), *args, *kw;
        eval_args(c, e, &args, &kw);
        return tp_filter(c, line, e->name, v, args, e->args.n, e->kwnames, kw, e->vals.n);
    }
    case E_TEST: {
        tv_value v = tp_eval(c, e->a), *args, *kw;
        eval_args(c, e, &args, &kw);
        if (e->vals.n) tp_fail(c, QWENC_ERR_UNSUPPORTED, line, "unsupported construct: keyword arguments to test '%s'", e->name);
        return tv_bool(tp_test(c, line, e->name, v, args, e->args.n) != e->op);
    }
    case E_BINOP: {
        tv_value a = tp_eval(c, e->a);
        return tp_binop(c, line, e->op, a, tp_eval(c, e->b));
    }
    case E_NEG:
    case E_POS: {
        tv_value v = tp_eval(c, e->a);
        if (v.type == TV_UNDEF) tp_undef_fail(c, line, v);
        if (v.type == TV_FLOAT) return tv_float(e->kind == E_NEG ? -v.u.f : v.u.f);
        if (is_intlike(v)) {
            if (e->kind == E_NEG && ival(v) == INT64_MIN) int_overflow(c, line);
            return tv_int(e->kind == E_NEG ? -ival(v) : ival(v));
        }
        tp_fail(c, QWENC_ERR_ARG, line, "TypeError: bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+',
                tv_type_name(v));
    }
    case E_NOT: return tv_bool(!tv_truthy(tp_eval(c, e->a)));
    case E_AND: {
        tv_value a = tp_eval(c, e->a);
        return tv_truthy(a) ? tp_eval(c, e->b) : a;
    }
    case E_OR: {
        tv_value a = tp_eval(c, e->a);
        return tv_truthy(a) ? a : tp_eval(c, e->b);
    }
    case E_COMPARE: {
        tv_value a = tp_eval(c, e->a);
        for (size_t i = 0; i < e->args.n; i++) {
            tv_value b = tp_eval(c, e->args.v[i]);
            if (!compare(c, line, e->cmpops[i], a, b)) return tv_bool(0);
            a = b;
        }
        return tv_bool(1);
    }
    case E_COND:
        if (tv_truthy(tp_eval(c, e->a))) return tp_eval(c, e->b);
        if (e->c) return tp_eval(c, e->c);
        return tv_undef(c, "the inline if-expression on line %d evaluated to false and no else section was defined", line);
    case E_CONCAT: {
        tp_buf b = {0};
        tp_buf_add(c, &b, "", 0);
        for (size_t i = 0; i < e->args.n; i++) tv_str_append(c, &b, tp_eval(c, e->args.v[i]));
        return tp_buf_value(&b);
    }
    case E_LIST:
    case E_TUPLE: {
        tv_value l = tv_list_new(c, e->args.n);
        if (e->kind == E_TUPLE) l.flags = TV_F_TUPLE;
        for (size_t i = 0; i < e->args.n; i++) tv_list_push(c, l.u.l, tp_eval(c, e->args.v[i]));
        return l;
    }
    case E_DICT: {
        tv_value d = tv_dict_new(c, e->args.n);
        for (size_t i = 0; i < e->args.n; i++) {
            tv_value k = tp_eval(c, e->args.v[i]);
            if ((k.type == TV_LIST && !(k.flags & TV_F_TUPLE)) || k.type == TV_DICT)
                tp_fail(c, QWENC_ERR_ARG, line, "TypeError: unhashable type: '%s'", tv_type_name(k));
            tv_dict_set(c, d.u.d, k, tp_eval(c, e->vals.v[i]));
        }
        return d;
    }
    default: QW_ASSERT(!"statement node evaluated as an expression");
    }
    return tv_none();
}

/* ---------------------------------------------------------------- statements */

/* Bind a for / set target (a name or a tuple of names) in scope s. */
static void assign(tp_ctx *c, tp_scope *s, const tp_node *target, tv_value v, int line) {
    if (target->kind == E_NAME) {
        tp_scope_set(c, s, target->name, v);
        return;
    }
    size_t want = target->args.n;
    tv_list *items = tv_iter(c, line, v);
    if (items->n < want)
        tp_fail(c, QWENC_ERR_ARG, line, "ValueError: not enough values to unpack (expected %zu, got %zu)", want, items->n);
    if (items->n > want) tp_fail(c, QWENC_ERR_ARG, line, "ValueError: too many values to unpack (expected %zu)", want);
    for (size_t i = 0; i < want; i++) tp_scope_set(c, s, target->args.v[i]->name, items->items[i]);
}

static void exec_for(tp_ctx *c, const tp_node *n, tp_buf *out) {
    tv_value seq = tp_eval(c, n->b);
    tv_list *items = tv_iter(c, n->line, seq);
    tp_scope *outer = c->scope;
    if (n->c) { /* {% for x in xs if cond %}: filter first, so loop.length counts what is iterated */
        tv_list *kept = tv_list_new(c, items->n).u.l;
        for (size_t i = 0; i < items->n; i++) {
            c->scope = tp_scope_new(c, outer);
            assign(c, c->scope, n->a, items->items[i], n->line);
            if (tv_truthy(tp_eval(c, n->c))) tv_list_push(c, kept, items->items[i]);
        }
        c->scope = outer;
        items = kept;
    }
    if (items->n == 0) {
        c->scope = tp_scope_new(c, outer);
        tp_exec(c, &n->orelse, out);
        c->scope = outer;
        return;
    }
    tv_loop *L = tp_alloc(c, sizeof(tv_loop));
    L->items = items;
    L->depth = 1;
    tv_value lv = {.type = TV_LOOP};
    lv.u.loop = L;
    for (size_t i = 0; i < items->n; i++) {
        L->index0 = i;
        c->scope = tp_scope_new(c, outer);
        assign(c, c->scope, n->a, items->items[i], n->line);
        tp_scope_set(c, c->scope, "loop", lv);
        int ctl = tp_exec(c, &n->body, out);
        c->scope = outer;
        if (ctl == TP_BREAK) break;
    }
}

static void exec_set(tp_ctx *c, const tp_node *target, tv_value v, int line) {
    if (target->kind == E_GETATTR) {
        tv_value ns = lookup(c, target->a->name);
        if (ns.type != TV_NS)
            tp_fail(c, QWENC_ERR_ARG, line, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
        tv_dict_set(c, ns.u.d, tv_strz(target->name), v);
        return;
    }
    assign(c, c->scope, target, v, line);
}

static int exec_body(tp_ctx *c, const tp_nodes *body, tp_buf *out);

/* Bodies nest in bodies (blocks, loops, macro calls inside them): bounded with the expressions, as together they
 * are the depth of the C stack. */
int tp_exec(tp_ctx *c, const tp_nodes *body, tp_buf *out) {
    if (++c->depth > TP_MAX_DEPTH) tp_fail(c, QWENC_ERR_ARG, 0, "RecursionError: blocks and expressions nested more than %d levels deep", TP_MAX_DEPTH);
    int ctl = exec_body(c, body, out);
    c->depth--;
    return ctl;
}

static int exec_body(tp_ctx *c, const tp_nodes *body, tp_buf *out) {
    for (size_t k = 0; k < body->n; k++) {
        const tp_node *n = body->v[k];
        c->cur_line = n->line;
        tp_tick(c, 1);
        switch (n->kind) {
        case S_TEXT: tp_buf_add(c, out, n->value.u.s.p, n->value.u.s.n); break;
        case S_OUTPUT: tv_str_append(c, out, tp_eval(c, n->a)); break;
        case S_IF: {
            size_t i = 0;
            while (i < n->args.n && !tv_truthy(tp_eval(c, n->args.v[i]))) i++;
            int ctl = tp_exec(c, &n->branches[i], out);
            if (ctl) return ctl;
            break;
        }
        case S_FOR: exec_for(c, n, out); break;
        case S_SET: exec_set(c, n->a, tp_eval(c, n->b), n->line); break;
        case S_SET_BLOCK: {
            tp_buf b = {0};
            tp_buf_add(c, &b, "", 0);
            tp_exec(c, &n->body, &b);
            exec_set(c, n->a, tp_buf_value(&b), n->line);
            break;
        }
        case S_MACRO: {
            tv_func *f = tp_alloc(c, sizeof(tv_func));
            f->kind = TF_MACRO;
            f->name = n->name;
            f->macro = n;
            f->closure = c->scope;
            tv_value v = {.type = TV_FUNC};
            v.u.fn = f;
            tp_scope_set(c, c->scope, n->name, v);
            break;
        }
        case S_BREAK: return TP_BREAK;
        case S_CONTINUE: return TP_CONTINUE;
        case S_BLOCK: {
            int ctl = tp_exec(c, &n->body, out);
            if (ctl) return ctl;
            break;
        }
        default: QW_ASSERT(!"expression node executed as a statement");
        }
    }
    return 0;
}
