/*
 * parse.c - the generated text of a chat reply split as it streams into content, reasoning (<think> ...
 * </think>) and Qwen tool calls, both forms:
 *
 *   Qwen3:               <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>
 *   Qwen3.5 / 3.6 / Coder: <tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>
 *
 * The parser holds back text that may be the beginning of a tag it looks for, so no part of a tag ever reaches
 * content. Reasoning is the text of a leading <think> block (or, when the prompt ends inside one, as Qwen3.5's
 * generation prompt does, the text up to </think>), without the whitespace around it; the content after
 * </think> or after a tool call starts at its first non-space character. Without tools in the request the
 * tool-call markup is content.
 *
 * A tool call is announced (index, id, name) as soon as its name is known, and its arguments follow as pieces
 * of one JSON object: for the XML form a parameter at a time ('{"a": 1', ', "b": "x"', '}'), each value typed
 * by the request's JSON schema for that parameter (a "string" parameter stays a string, others are read as JSON
 * when they parse), one leading and one trailing newline of a value dropped, as Qwen3-Coder's reference parser
 * does; for the JSON form, the call whole once </tool_call> arrives. A reply cut inside a call closes its
 * arguments so they are valid JSON; a call that does not parse is given back as content.
 */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

enum { M_START, M_REASON, M_CONTENT, M_TOOL };
enum { X_FORM, X_FN, X_PARAMS, X_VALUE, X_END, J_BODY }; /* stages inside a tool call */

struct srv_parser {
    int reasoning, mode;
    const cJSON *tools;   /* NULL: tool calls are not parsed */
    sbuf buf;             /* text not yet classified */
    int skip_ws;          /* drop the leading whitespace of what comes next */
    sbuf ws;              /* trailing whitespace held back (reasoning; content when tools are on) */
    int stage, n_calls, n_params;
    char *fn, *param;     /* the current call's function and parameter names */
    uint64_t rng;
};

static const char T_THINK[] = "<think>", T_UNTHINK[] = "</think>", T_CALL[] = "<tool_call>",
                  T_UNCALL[] = "</tool_call>", T_FN[] = "<function=", T_UNFN[] = "</function>",
                  T_PARAM[] = "<parameter=", T_UNPARAM[] = "</parameter>";

srv_parser *srv_parser_new(int reasoning, int think_open, const cJSON *tools) {
    srv_parser *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    static atomic_ullong counter;
    p->reasoning = reasoning;
    p->mode = reasoning && think_open ? M_REASON : reasoning ? M_START : M_CONTENT;
    p->skip_ws = p->mode == M_REASON;
    p->tools = tools && cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0 ? tools : NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    p->rng = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
             (atomic_fetch_add(&counter, 1) + 1) * 0x9E3779B97F4A7C15ull;
    return p;
}

void srv_parser_free(srv_parser *p) {
    if (!p) return;
    sb_free(&p->buf);
    sb_free(&p->ws);
    free(p->fn);
    free(p->param);
    free(p);
}

int srv_parser_n_tools(const srv_parser *p) { return p->n_calls; }

void srv_delta_clear(srv_delta *d) {
    d->content.n = d->reasoning.n = 0;
    if (d->content.p) d->content.p[0] = 0;
    if (d->reasoning.p) d->reasoning.p[0] = 0;
    for (int i = 0; i < d->n_tools; i++) {
        free(d->tools[i].id);
        free(d->tools[i].name);
        free(d->tools[i].args);
    }
    d->n_tools = 0;
}

void srv_delta_free(srv_delta *d) {
    srv_delta_clear(d);
    sb_free(&d->content);
    sb_free(&d->reasoning);
    free(d->tools);
    d->tools = NULL;
    d->cap_tools = 0;
}

/* ------------------------------------------------------------------ text helpers */

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Consume the first n bytes of the buffer. */
static void eat(srv_parser *p, size_t n) {
    memmove(p->buf.p, p->buf.p + n, p->buf.n - n + 1);
    p->buf.n -= n;
}

static void eat_ws(srv_parser *p) {
    size_t k = 0;
    while (k < p->buf.n && is_ws(p->buf.p[k])) k++;
    eat(p, k);
}

/* Where tag first occurs in the buffer (-1: nowhere). */
static long find(const srv_parser *p, const char *tag) {
    const char *f = p->buf.n ? memmem(p->buf.p, p->buf.n, tag, strlen(tag)) : NULL; /* the text may hold NULs */
    return f ? f - p->buf.p : -1;
}

/* The length of the longest tail of the buffer that is a proper prefix of tag. */
static size_t partial(const srv_parser *p, const char *tag) {
    size_t tl = strlen(tag);
    for (size_t k = tl - 1 < p->buf.n ? tl - 1 : p->buf.n; k > 0; k--)
        if (!memcmp(p->buf.p + p->buf.n - k, tag, k)) return k;
    return 0;
}

/* Whether the buffer begins with tag (1), is a proper prefix of it (-1: wait), or neither (0). */
static int starts_at(const srv_parser *p, size_t at, const char *tag) {
    size_t tl = strlen(tag), n = p->buf.n - at;
    if (n >= tl) return !memcmp(p->buf.p + at, tag, tl);
    return !memcmp(p->buf.p + at, tag, n) ? -1 : 0;
}

static int starts(const srv_parser *p, const char *tag) { return starts_at(p, 0, tag); }

/* Text for content or reasoning: leading whitespace dropped while skip_ws, trailing whitespace held back in ws
 * when hold (it is dropped if a closing tag follows). */
static int emit(srv_parser *p, sbuf *to, const char *s, size_t n, int hold) {
    if (p->skip_ws) {
        while (n && is_ws(*s)) s++, n--;
        if (!n) return 0;
        p->skip_ws = 0;
    }
    size_t body = n;
    if (hold)
        while (body && is_ws(s[body - 1])) body--;
    if (body) {
        if (sb_add(to, p->ws.p ? p->ws.p : "", p->ws.n) || sb_add(to, s, body)) return -1;
        p->ws.n = 0;
    }
    return sb_add(&p->ws, s + body, n - body);
}

/* Held-back whitespace: kept (flush) or dropped. */
static int flush_ws(srv_parser *p, sbuf *to, int keep) {
    int r = keep ? sb_add(to, p->ws.p ? p->ws.p : "", p->ws.n) : 0;
    p->ws.n = 0;
    return r;
}

/* ------------------------------------------------------------------ tool calls */

static srv_tool_delta *tool_delta(srv_delta *d, int index) {
    if (d->n_tools && d->tools[d->n_tools - 1].index == index) return &d->tools[d->n_tools - 1];
    if (d->n_tools == d->cap_tools) {
        int cap = d->cap_tools ? d->cap_tools * 2 : 4;
        srv_tool_delta *nt = realloc(d->tools, (size_t)cap * sizeof(*nt));
        if (!nt) return NULL;
        d->tools = nt;
        d->cap_tools = cap;
    }
    srv_tool_delta *t = &d->tools[d->n_tools++];
    memset(t, 0, sizeof(*t));
    t->index = index;
    t->args = calloc(1, 1);
    return t->args ? t : (d->n_tools--, NULL);
}

/* A call begins: its index, a fresh id and its name. */
static int call_begin(srv_parser *p, srv_delta *d, const char *name, size_t n) {
    srv_tool_delta *t = tool_delta(d, p->n_calls);
    if (!t) return -1;
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    t->id = malloc(5 + 24 + 1);
    t->name = malloc(n + 1);
    if (!t->id || !t->name) return -1;
    memcpy(t->id, "call_", 5);
    for (int i = 0; i < 24; i++) { /* xorshift64* */
        p->rng ^= p->rng >> 12;
        p->rng ^= p->rng << 25;
        p->rng ^= p->rng >> 27;
        t->id[5 + i] = abc[((p->rng * 0x2545F4914F6CDD1Dull) >> 33) % 62];
    }
    t->id[29] = 0;
    memcpy(t->name, name, n);
    t->name[n] = 0;
    return 0;
}

static int call_args(srv_parser *p, srv_delta *d, const char *s) {
    srv_tool_delta *t = tool_delta(d, p->n_calls);
    if (!t) return -1;
    size_t a = strlen(t->args), n = strlen(s);
    char *na = realloc(t->args, a + n + 1);
    if (!na) return -1;
    memcpy(na + a, s, n + 1);
    t->args = na;
    return 0;
}

/* The JSON schema "type" of a parameter of the request's function (NULL: not declared). */
static const cJSON *param_type(const srv_parser *p, const char *fn, const char *param) {
    const cJSON *t;
    cJSON_ArrayForEach(t, p->tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, fn)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"),
                                                              "properties");
        return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, param), "type");
    }
    return NULL;
}

static int type_is(const cJSON *type, const char *name) {
    if (cJSON_IsString(type)) return !strcmp(type->valuestring, name);
    const cJSON *e;
    cJSON_ArrayForEach(e, type) if (cJSON_IsString(e) && !strcmp(e->valuestring, name)) return 1;
    return 0;
}

/* The JSON text of one XML parameter value, typed by the schema. malloc'd. */
static char *typed_value(const srv_parser *p, const char *v, size_t n) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    char *raw = malloc(n + 1);
    if (!raw) return NULL;
    memcpy(raw, v, n);
    raw[n] = 0;
    const cJSON *type = param_type(p, p->fn, p->param);
    cJSON *j = NULL;
    if (type && !type_is(type, "string")) j = cJSON_Parse(raw);
    if (!j) j = cJSON_CreateString(raw);
    char *out = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    free(raw);
    return out;
}

/* A parameter's value is complete: '{"name": value' or ', "name": value'. */
static int param_done(srv_parser *p, srv_delta *d, size_t n) {
    char *val = typed_value(p, p->buf.p, n);
    cJSON *key = cJSON_CreateString(p->param ? p->param : "");
    char *k = key ? cJSON_PrintUnformatted(key) : NULL;
    cJSON_Delete(key);
    int r = -1;
    if (val && k) {
        sbuf s = {0};
        r = sb_printf(&s, "%s%s: %s", p->n_params ? ", " : "{", k, val) || call_args(p, d, s.p);
        sb_free(&s);
    }
    free(val);
    free(k);
    p->n_params++;
    eat(p, n);
    return r;
}

/* Give the text of a call that did not parse back as content. */
static int call_as_content(srv_parser *p, srv_delta *d, const char *closing) {
    int r = sb_str(&d->content, T_CALL) || sb_add(&d->content, p->buf.p, p->buf.n) || sb_str(&d->content, closing);
    eat(p, p->buf.n);
    p->mode = M_CONTENT;
    p->skip_ws = 0;
    return r;
}

/* <tool_call> and the w bytes of whitespace after it are no call's start: they are content, and the text after
 * them is read as content again (it may hold a call). */
static int form_as_content(srv_parser *p, srv_delta *d, size_t w) {
    int r = sb_str(&d->content, T_CALL) || sb_add(&d->content, p->buf.p, w);
    eat(p, w);
    p->mode = M_CONTENT;
    p->skip_ws = 0;
    return r;
}

/* The JSON form, once </tool_call> has arrived at k. */
static int json_call(srv_parser *p, srv_delta *d, long k) {
    char *body = malloc((size_t)k + 1);
    if (!body) return -1;
    memcpy(body, p->buf.p, (size_t)k);
    body[k] = 0;
    cJSON *j = cJSON_Parse(body);
    free(body);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    /* arguments written as a string (JSON encoded twice) count when the string holds a JSON object */
    cJSON *inner = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    if (inner && !cJSON_IsObject(inner)) {
        cJSON_Delete(inner);
        inner = NULL;
    }
    if (inner) args = inner;
    if (!cJSON_IsString(name) || (args && !cJSON_IsObject(args))) {
        cJSON_Delete(inner);
        cJSON_Delete(j); /* not a call: the text as written */
        size_t all = (size_t)k + strlen(T_UNCALL);
        int r = sb_str(&d->content, T_CALL) || sb_add(&d->content, p->buf.p, all);
        eat(p, all);
        p->mode = M_CONTENT;
        return r;
    }
    char *a = !args ? strdup("{}") : cJSON_PrintUnformatted(args);
    int r = !a || call_begin(p, d, name->valuestring, strlen(name->valuestring)) || call_args(p, d, a);
    free(a);
    cJSON_Delete(inner);
    cJSON_Delete(j);
    eat(p, (size_t)k + strlen(T_UNCALL));
    p->n_calls++;
    p->mode = M_CONTENT;
    p->skip_ws = 1;
    return r;
}

/* Progress inside a tool call; 1: more text is needed, 0: go on, -1: out of memory. */
static int tool_step(srv_parser *p, srv_delta *d, int final) {
    switch (p->stage) {
    case X_FORM: { /* the whitespace before the form is eaten only with it: not a call, it is content */
        size_t w = 0;
        while (w < p->buf.n && is_ws(p->buf.p[w])) w++;
        if (w == p->buf.n) return final ? (call_as_content(p, d, "") ? -1 : 0) : 1;
        if (p->buf.p[w] == '{') {
            eat(p, w);
            p->stage = J_BODY;
            return 0;
        }
        int s = starts_at(p, w, T_FN);
        if (s == 1) {
            eat(p, w + strlen(T_FN));
            p->stage = X_FN;
            return 0;
        }
        if (s == -1 && !final) return 1;
        return form_as_content(p, d, w) ? -1 : 0;
    }
    case J_BODY: {
        long k = find(p, T_UNCALL);
        if (k >= 0) return json_call(p, d, k) ? -1 : 0;
        if (!final) return 1;
        return call_as_content(p, d, "") ? -1 : 0;
    }
    case X_FN: {
        long k = find(p, ">");
        if (k < 0) {
            if (!final) return 1;
            sbuf t = {0}; /* "<tool_call><function=" + the rest, as written */
            int r = sb_str(&t, T_FN) || sb_add(&t, p->buf.p, p->buf.n);
            eat(p, p->buf.n);
            r = r || sb_add(&p->buf, t.p, t.n) || call_as_content(p, d, "");
            sb_free(&t);
            return r ? -1 : 0;
        }
        free(p->fn);
        p->fn = strndup(p->buf.p, (size_t)k);
        if (!p->fn || call_begin(p, d, p->buf.p, (size_t)k)) return -1;
        eat(p, (size_t)k + 1);
        p->n_params = 0;
        p->stage = X_PARAMS;
        return 0;
    }
    case X_PARAMS: {
        eat_ws(p);
        if (!p->buf.n) {
            if (!final) return 1;
            p->stage = X_END;
            return call_args(p, d, p->n_params ? "}" : "{}") ? -1 : 0; /* cut short: close the object */
        }
        int sp = starts(p, T_PARAM), sf = starts(p, T_UNFN);
        if (sp == 1) {
            long k = find(p, ">");
            if (k < 0) {
                if (!final) return 1;
                eat(p, p->buf.n);
                return 0;
            }
            free(p->param);
            p->param = strndup(p->buf.p + strlen(T_PARAM), (size_t)k - strlen(T_PARAM));
            if (!p->param) return -1;
            eat(p, (size_t)k + 1);
            p->stage = X_VALUE;
            return 0;
        }
        if (sf == 1) {
            eat(p, strlen(T_UNFN));
            p->stage = X_END;
            return call_args(p, d, p->n_params ? "}" : "{}") ? -1 : 0;
        }
        if ((sp == -1 || sf == -1) && !final) return 1;
        eat(p, 1); /* text between parameters is not part of the call */
        return 0;
    }
    case X_VALUE: {
        long k = -1;
        const char *ends[] = {T_UNPARAM, T_PARAM, T_UNFN};
        int which = -1;
        for (int i = 0; i < 3; i++) {
            long f = find(p, ends[i]);
            if (f >= 0 && (k < 0 || f < k)) k = f, which = i;
        }
        if (k < 0 && !final) return 1;
        if (param_done(p, d, k < 0 ? p->buf.n : (size_t)k)) return -1;
        if (which == 0) eat(p, strlen(T_UNPARAM));
        p->stage = X_PARAMS;
        return 0;
    }
    case X_END: {
        eat_ws(p);
        int s = starts(p, T_UNCALL);
        if (s == -1 && !final) return 1;
        if (s == 1) eat(p, strlen(T_UNCALL));
        p->n_calls++;
        p->mode = M_CONTENT;
        p->skip_ws = 1;
        return 0;
    }
    }
    return 0;
}

/* ------------------------------------------------------------------ the parser */

int srv_parser_feed(srv_parser *p, const char *text, size_t n, int final, srv_delta *d) {
    /* A NUL the model writes (a byte token) is taken as U+FFFD: the replies' JSON strings (cJSON) end at a NUL,
     * and the tags are searched in C strings. */
    if (sb_add(&p->buf, "", 0)) return -1; /* the buffer exists, even before any text */
    for (size_t at = 0; at < n;) {
        const char *z = memchr(text + at, 0, n - at);
        size_t k = z ? (size_t)(z - text) - at : n - at;
        if (sb_add(&p->buf, text + at, k) || (z && sb_add(&p->buf, "\xEF\xBF\xBD", 3))) return -1;
        at += k + (z != NULL);
    }
    for (;;) {
        switch (p->mode) {
        case M_START: { /* does the reply open with <think>? */
            size_t k = 0;
            while (k < p->buf.n && is_ws(p->buf.p[k])) k++;
            size_t tl = strlen(T_THINK), rest = p->buf.n - k;
            if (rest >= tl && !memcmp(p->buf.p + k, T_THINK, tl)) {
                eat(p, k + tl);
                p->mode = M_REASON;
                p->skip_ws = 1;
                continue;
            }
            if (!final && (rest == 0 || (rest < tl && !memcmp(p->buf.p + k, T_THINK, rest)))) return 0; /* may be it */
            p->mode = M_CONTENT;
            continue;
        }
        case M_REASON: {
            long k = find(p, T_UNTHINK);
            if (k >= 0) {
                if (emit(p, &d->reasoning, p->buf.p, (size_t)k, 1)) return -1;
                flush_ws(p, &d->reasoning, 0);
                eat(p, (size_t)k + strlen(T_UNTHINK));
                p->mode = M_CONTENT;
                p->skip_ws = 1;
                continue;
            }
            size_t keep = final ? 0 : partial(p, T_UNTHINK);
            if (emit(p, &d->reasoning, p->buf.p, p->buf.n - keep, 1)) return -1;
            eat(p, p->buf.n - keep);
            if (final) flush_ws(p, &d->reasoning, 0);
            return 0;
        }
        case M_CONTENT: {
            int hold = p->tools != NULL;
            long k = hold ? find(p, T_CALL) : -1;
            if (k >= 0) {
                if (emit(p, &d->content, p->buf.p, (size_t)k, 1)) return -1;
                flush_ws(p, &d->content, 0);
                eat(p, (size_t)k + strlen(T_CALL));
                p->mode = M_TOOL;
                p->stage = X_FORM;
                continue;
            }
            size_t keep = hold && !final ? partial(p, T_CALL) : 0;
            if (emit(p, &d->content, p->buf.p, p->buf.n - keep, hold)) return -1;
            eat(p, p->buf.n - keep);
            if (final && flush_ws(p, &d->content, 1)) return -1;
            return 0;
        }
        case M_TOOL: {
            int r = tool_step(p, d, final);
            if (r < 0) return -1;
            if (r == 1) return 0;
            continue;
        }
        }
    }
}
