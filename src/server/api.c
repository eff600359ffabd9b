/*
 * api.c - the OpenAI API over the scheduler: requests checked field by field (a bad one is a 400 naming it),
 * chat messages rendered with the model's template and tokenized, jobs submitted, and their output turned into
 * OpenAI's JSON, whole or as server-sent events. Runs on the HTTP threads; only the job (its mutex) is shared
 * with the scheduler.
 *
 * Follows the OpenAI reference for /v1/chat/completions and /v1/completions (fields, chunk shapes, usage with
 * prompt_tokens_details.cached_tokens, stream_options.include_usage, logprobs), with llama-server's names where
 * OpenAI has none (top_k, min_p, repeat_penalty, n_probs, /tokenize, /detokenize, /apply-template, "timings").
 * What qwenc cannot honour is refused with a 400 that says so: n > 1, response_format json_object or json_schema
 * and tool_choice "required" or a named function (they need grammar-constrained sampling), non-text content.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

struct srv_gen {
    srv *s;
    srv_endpoint ep;
    srv_job *job;
    int stream, include_usage, chat;
    int logprobs;            /* chat: logprobs true; completions: logprobs N >= 0 */
    char id[48];
    long long created;
    srv_parser *parser;      /* chat */
    cJSON *tools;            /* the request's tools (the parser reads their schemas) */
    char *echo;              /* completions with echo: the prompt's text */
    int started, finished;   /* the first event / the final events were written */
    size_t text_offset;      /* completions' logprobs text_offset */
    /* the answer so far, for a reply that does not stream */
    sbuf content, reasoning, text;
    cJSON *tool_calls;       /* array */
    cJSON *lp;               /* chat: logprobs.content array; completions: the logprobs object */
    srv_delta d;
    /* the job's end, once taken */
    int done;
    qwenc_stop_reason reason;
    int err_status;
    char err[256];
};

/* ------------------------------------------------------------------ replies */

void srv_reply_json(srv_reply *r, int status, cJSON *j) {
    r->status = status;
    r->ctype = "application/json";
    r->body = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!r->body) { /* out of memory: a fixed body */
        r->status = 500;
        r->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    }
    r->len = r->body ? strlen(r->body) : 0;
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 500: return "server_error";
    case 503: return "unavailable_error";
    default: return "invalid_request_error";
    }
}

static cJSON *error_json(int status, const char *param, const char *code, const char *msg) {
    cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "type", error_type(status));
    if (param) cJSON_AddStringToObject(o, "param", param);
    else cJSON_AddNullToObject(o, "param");
    if (code) cJSON_AddStringToObject(o, "code", code);
    else cJSON_AddNullToObject(o, "code");
    return e;
}

void srv_reply_error(srv_reply *r, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    char *clean = qwenc_utf8_repair(msg, strlen(msg)); /* messages may quote the request */
    srv_reply_json(r, status, error_json(status, param, code, clean ? clean : msg));
    snprintf(r->log, sizeof(r->log), "%.*s", (int)sizeof(r->log) - 1, clean ? clean : msg);
    free(clean);
}

/* ------------------------------------------------------------------ request fields */

typedef struct {
    const cJSON *body;
    srv_reply *r;
    int bad; /* an error reply is in r */
} fields;

static const cJSON *field(fields *f, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->body, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static const char *json_kind(const cJSON *v) {
    return cJSON_IsString(v) ? "a string" : cJSON_IsNumber(v) ? "a number" : cJSON_IsBool(v) ? "a boolean"
           : cJSON_IsArray(v) ? "an array" : cJSON_IsObject(v) ? "an object" : "null";
}

/* A number in [lo, hi] (lo excluded when lo_open); 1 if given. */
static int get_num(fields *f, const char *name, double lo, int lo_open, double hi, float *out) {
    const cJSON *v = field(f, name);
    if (!v || f->bad) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || (lo_open && v->valuedouble == lo) ||
        v->valuedouble > hi) {
        char range[64];
        if (isinf(hi)) snprintf(range, sizeof(range), "%s %g", lo_open ? ">" : ">=", lo);
        else snprintf(range, sizeof(range), "in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
        if (cJSON_IsNumber(v))
            srv_reply_error(f->r, 400, name, "invalid_value", "'%s' must be a number %s, got %g", name, range,
                            v->valuedouble);
        else
            srv_reply_error(f->r, 400, name, "invalid_type", "'%s' must be a number %s, got %s", name, range,
                            json_kind(v));
        f->bad = 1;
        return 0;
    }
    *out = (float)v->valuedouble;
    return 1;
}

static int get_int(fields *f, const char *name, long long lo, long long hi, long long *out) {
    const cJSON *v = field(f, name);
    if (!v || f->bad) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi) {
        if (cJSON_IsNumber(v))
            srv_reply_error(f->r, 400, name, "invalid_value", "'%s' must be an integer in [%lld, %lld], got %g", name,
                            lo, hi, v->valuedouble);
        else
            srv_reply_error(f->r, 400, name, "invalid_type", "'%s' must be an integer, got %s", name, json_kind(v));
        f->bad = 1;
        return 0;
    }
    *out = (long long)v->valuedouble;
    return 1;
}

static int get_bool(fields *f, const char *name, int *out) {
    const cJSON *v = field(f, name);
    if (!v || f->bad) return 0;
    if (!cJSON_IsBool(v)) {
        srv_reply_error(f->r, 400, name, "invalid_type", "'%s' must be true or false, got %s", name, json_kind(v));
        f->bad = 1;
        return 0;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

static void bad(fields *f, const char *param, const char *fmt, const char *a, const char *b) {
    if (f->bad) return;
    srv_reply_error(f->r, 400, param, "invalid_value", fmt, a, b);
    f->bad = 1;
}

/* Sampling, limits and stop strings: the server's defaults, then the request's. */
static void get_sampling(srv *s, fields *f, srv_job *j) {
    qwenc_sampler_params *sp = &j->sp;
    *sp = s->p.sp;
    get_num(f, "temperature", 0, 0, INFINITY, &sp->temperature);
    get_num(f, "top_p", 0, 1, 1, &sp->top_p);
    get_num(f, "min_p", 0, 0, 1, &sp->min_p);
    get_num(f, "presence_penalty", -2, 0, 2, &sp->presence_penalty);
    get_num(f, "frequency_penalty", -2, 0, 2, &sp->frequency_penalty);
    get_num(f, "repetition_penalty", 0, 1, INFINITY, &sp->repeat_penalty);
    get_num(f, "repeat_penalty", 0, 1, INFINITY, &sp->repeat_penalty);
    long long v;
    if (get_int(f, "top_k", 0, 1 << 30, &v)) sp->top_k = (int)v;
    if (get_int(f, "repeat_last_n", -1, 1 << 30, &v)) sp->repeat_last_n = (int)v;
    static atomic_ullong counter;
    if (get_int(f, "seed", -1, (long long)1 << 62, &v) && v >= 0) {
        sp->seed = (uint64_t)v;
    } else if (!s->p.seed_set) { /* as `qwenc run` without -s: a random one */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp->seed = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (atomic_fetch_add(&counter, 1) << 20);
    }
    j->n_predict = s->p.n_predict;
    if (get_int(f, "max_tokens", -1, 1 << 30, &v)) j->n_predict = (int)v;
    if (get_int(f, "max_completion_tokens", -1, 1 << 30, &v)) j->n_predict = (int)v;
    if (get_int(f, "n_predict", -1, 1 << 30, &v)) j->n_predict = (int)v;
    if (get_int(f, "n", 1, 1 << 30, &v) && v != 1)
        bad(f, "n", "'n' must be 1: qwenc answers one choice per request%s%s", "", "");
    const cJSON *stop = field(f, "stop");
    if (stop && !f->bad) {
        int ok = cJSON_IsString(stop) || cJSON_IsArray(stop);
        if (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) > SRV_MAX_STOP) ok = 0;
        const cJSON *e;
        if (cJSON_IsArray(stop)) cJSON_ArrayForEach(e, stop) ok &= cJSON_IsString(e);
        if (!ok) {
            srv_reply_error(f->r, 400, "stop", "invalid_value", "'stop' must be a string or an array of at most %d "
                            "strings", SRV_MAX_STOP);
            f->bad = 1;
            return;
        }
        if (cJSON_IsString(stop)) {
            if (*stop->valuestring) j->stop[j->n_stop++] = strdup(stop->valuestring);
        } else {
            cJSON_ArrayForEach(e, stop) if (*e->valuestring) j->stop[j->n_stop++] = strdup(e->valuestring);
        }
    }
}

/* ------------------------------------------------------------------ chat messages */

/* A message's content as the template takes it: a string (text parts joined), or NULL. */
static cJSON *content_text(fields *f, const cJSON *c, int i) {
    if (!c || cJSON_IsNull(c)) return cJSON_CreateNull();
    if (cJSON_IsString(c)) return cJSON_CreateString(c->valuestring);
    char where[64];
    snprintf(where, sizeof(where), "messages[%d].content", i);
    if (!cJSON_IsArray(c)) {
        bad(f, where, "'%s' must be a string or an array of text parts, got %s", where, json_kind(c));
        return NULL;
    }
    sbuf t = {0};
    sb_add(&t, "", 0);
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            char what[96];
            snprintf(what, sizeof(what), "%s[%d] is of type %s", where, k,
                     cJSON_IsString(type) ? type->valuestring : "(none)");
            bad(f, where, "only text content is supported: %s%s", what, "");
            sb_free(&t);
            return NULL;
        }
        sb_str(&t, text->valuestring);
        k++;
    }
    cJSON *r = cJSON_CreateString(t.p);
    sb_free(&t);
    return r;
}

/* The messages as the template reads them: roles checked, content as text, "developer" as "system", "reasoning"
 * as "reasoning_content", and tool-call arguments as objects (Qwen's templates iterate over them). */
static cJSON *template_messages(fields *f, const cJSON *msgs) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        bad(f, "messages", "'messages' must be a non-empty array of messages%s%s", "", "");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        char where[64];
        snprintf(where, sizeof(where), "messages[%d].role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const char *r = cJSON_IsString(role) ? role->valuestring : NULL;
        if (!cJSON_IsObject(m) || !r ||
            (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant") &&
             strcmp(r, "tool"))) {
            bad(f, where, "'%s' must be one of system, developer, user, assistant, tool; got %s", where,
                r ? r : cJSON_IsObject(m) ? "none" : "a message that is not an object");
            break;
        }
        cJSON *n = cJSON_Duplicate(m, 1);
        cJSON_ReplaceItemInObjectCaseSensitive(n, "role", cJSON_CreateString(strcmp(r, "developer") ? r : "system"));
        cJSON *content = content_text(f, cJSON_GetObjectItemCaseSensitive(m, "content"), i);
        if (!content) {
            cJSON_Delete(n);
            break;
        }
        if (cJSON_GetObjectItemCaseSensitive(n, "content")) cJSON_ReplaceItemInObjectCaseSensitive(n, "content", content);
        else cJSON_AddItemToObject(n, "content", content);
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
        if (cJSON_IsString(reasoning) && !cJSON_GetObjectItemCaseSensitive(m, "reasoning_content"))
            cJSON_AddStringToObject(n, "reasoning_content", reasoning->valuestring);
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(n, "tool_calls"), *c;
        cJSON_ArrayForEach(c, calls) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (cJSON_IsString(args)) {
                cJSON *parsed = cJSON_Parse(args->valuestring);
                if (cJSON_IsObject(parsed)) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
                else cJSON_Delete(parsed);
            }
        }
        cJSON_AddItemToArray(out, n);
        i++;
    }
    if (f->bad) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

/* Render the first n messages (all with the generation prompt when gen). NULL (message in err) on failure. */
static char *render(srv *s, const cJSON *msgs, int n, int gen, const cJSON *tools, const cJSON *kwargs, char *err,
                    size_t errlen) {
    cJSON *req = cJSON_CreateObject(), *m = cJSON_AddArrayToObject(req, "messages");
    for (int i = 0; i < n; i++) cJSON_AddItemReferenceToArray(m, cJSON_GetArrayItem(msgs, i));
    if (tools) cJSON_AddItemReferenceToObject(req, "tools", (cJSON *)tools);
    if (kwargs) cJSON_AddItemReferenceToObject(req, "chat_template_kwargs", (cJSON *)kwargs);
    char *json = cJSON_PrintUnformatted(req), *out = NULL;
    cJSON_Delete(req);
    const char *bos = qwenc_tokenizer_bos_str(s->tok);
    if (!json || qwenc_chat_render(s->tmpl, json, gen, -1, bos && *bos ? bos : NULL, qwenc_tokenizer_eos_str(s->tok),
                                   &out, err, errlen))
        out = NULL;
    if (!json) snprintf(err, errlen, "out of memory");
    free(json);
    return out;
}

/* Where the first n messages end in the prompt's tokens, if their rendering is a prefix of the prompt's in text
 * and in tokens; 0 if not. */
static int boundary(srv *s, const cJSON *msgs, int n, const cJSON *tools, const cJSON *kwargs, const char *text,
                    const int32_t *ids, int n_ids) {
    char err[256];
    char *pre = render(s, msgs, n, 0, tools, kwargs, err, sizeof(err));
    int at = 0;
    size_t len = pre ? strlen(pre) : 0;
    if (pre && len && !strncmp(pre, text, len)) {
        int32_t *pi = NULL;
        int np = 0;
        if (!qwenc_tokenize(s->tok, pre, len, 0, 1, &pi, &np, err, sizeof(err)) && np > 0 && np < n_ids &&
            !memcmp(pi, ids, (size_t)np * sizeof(int32_t)))
            at = np;
        free(pi);
    }
    free(pre);
    return at;
}

static void add_bound(srv_job *j, int at) {
    if (at > 0 && at <= j->n_prompt && (j->n_bounds == 0 || at > j->bounds[j->n_bounds - 1]) && j->n_bounds < 4)
        j->bounds[j->n_bounds++] = at;
}

/* ------------------------------------------------------------------ starting a generation */

static void gen_free_parts(srv_gen *g) {
    srv_parser_free(g->parser);
    cJSON_Delete(g->tools);
    cJSON_Delete(g->tool_calls);
    cJSON_Delete(g->lp);
    free(g->echo);
    sb_free(&g->content);
    sb_free(&g->reasoning);
    sb_free(&g->text);
    srv_delta_free(&g->d);
}

void srv_gen_free(srv_gen *g) {
    if (!g) return;
    if (g->job) {
        if (!g->done) atomic_store(&g->job->cancel, SRV_CANCEL_CLIENT); /* it is not read anymore */
        srv_job_release(g->job);
    }
    gen_free_parts(g);
    free(g);
}

static void make_id(char *id, size_t n, const char *prefix) {
    static atomic_ullong counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (atomic_fetch_add(&counter, 1) + 1) * 0x9E3779B97F4A7C15ull;
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t k = (size_t)snprintf(id, n, "%s", prefix);
    for (int i = 0; i < 24 && k + 1 < n; i++, k++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        id[k] = abc[((x * 0x2545F4914F6CDD1Dull) >> 33) % 62];
    }
    id[k] = 0;
}

/* The chat request into the job's prompt; 0 or an error reply. */
static int chat_prompt(srv *s, fields *f, srv_gen *g, srv_job *j, int *think_open) {
    if (!s->tmpl) {
        srv_reply_error(f->r, 400, NULL, "no_chat_template", "the model has no chat template (chat_template.jinja or "
                        "tokenizer_config.json chat_template): use /v1/completions");
        return -1;
    }
    const cJSON *rf = field(f, "response_format"), *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (rf && (!cJSON_IsString(type) || strcmp(type->valuestring, "text"))) {
        bad(f, "response_format", "response_format %s needs grammar-constrained output, which qwenc does not have; "
            "only {\"type\": \"text\"} is accepted%s", cJSON_IsString(type) ? type->valuestring : "without a type", "");
        return -1;
    }
    const cJSON *tools = field(f, "tools"), *choice = field(f, "tool_choice"), *kw = field(f, "chat_template_kwargs");
    if (tools) {
        int ok = cJSON_IsArray(tools);
        const cJSON *t;
        if (ok) cJSON_ArrayForEach(t, tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            ok &= cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name"));
        }
        if (!ok) {
            bad(f, "tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {\"name\": ..., "
                "\"parameters\": ...}}%s%s", "", "");
            return -1;
        }
    }
    int use_tools = tools != NULL;
    if (choice) {
        const char *c = cJSON_IsString(choice) ? choice->valuestring : NULL;
        if (c && !strcmp(c, "none")) {
            use_tools = 0;
        } else if (!c || strcmp(c, "auto")) {
            bad(f, "tool_choice", "tool_choice %s needs grammar-constrained output, which qwenc does not have; use "
                "\"auto\" or \"none\"%s", c ? c : "naming a function", "");
            return -1;
        }
    }
    if (kw && !cJSON_IsObject(kw)) {
        bad(f, "chat_template_kwargs", "'chat_template_kwargs' must be an object, got %s%s", json_kind(kw), "");
        return -1;
    }
    int reasoning = 1;
    const cJSON *rfmt = field(f, "reasoning_format");
    if (rfmt && cJSON_IsString(rfmt) && !strcmp(rfmt->valuestring, "none")) reasoning = 0;
    cJSON *msgs = template_messages(f, field(f, "messages"));
    if (!msgs) {
        bad(f, "messages", "'messages' is required%s%s", "", "");
        return -1;
    }
    cJSON *kwargs = kw ? cJSON_Duplicate(kw, 1) : cJSON_CreateObject();
    if (s->p.no_think && !cJSON_GetObjectItemCaseSensitive(kwargs, "enable_thinking"))
        cJSON_AddFalseToObject(kwargs, "enable_thinking");
    const cJSON *tools_in = use_tools ? tools : NULL;
    char err[1024];
    char *text = render(s, msgs, cJSON_GetArraySize(msgs), 1, tools_in, kwargs, err, sizeof(err));
    int rc = -1;
    if (!text) {
        srv_reply_error(f->r, 400, "messages", "template_error", "the chat template cannot render these messages: %s",
                        err);
        goto done;
    }
    if (qwenc_tokenize(s->tok, text, strlen(text), 0, 1, &j->prompt, &j->n_prompt, err, sizeof(err))) {
        srv_reply_error(f->r, 500, NULL, NULL, "tokenizer: %s", err);
        goto done;
    }
    int n_msgs = cJSON_GetArraySize(msgs);
    if (j->n_prompt > 0) { /* snapshot points: after the first message, before the last, the prompt's end */
        if (n_msgs >= 2) add_bound(j, boundary(s, msgs, 1, tools_in, kwargs, text, j->prompt, j->n_prompt));
        if (n_msgs >= 3) add_bound(j, boundary(s, msgs, n_msgs - 1, tools_in, kwargs, text, j->prompt, j->n_prompt));
        add_bound(j, j->n_prompt);
    }
    size_t tl = strlen(text);
    while (tl && (text[tl - 1] == '\n' || text[tl - 1] == ' ')) tl--;
    *think_open = tl >= 7 && !memcmp(text + tl - 7, "<think>", 7);
    g->parser = srv_parser_new(reasoning, *think_open, NULL);
    if (use_tools) {
        g->tools = cJSON_Duplicate(tools, 1);
        srv_parser_free(g->parser);
        g->parser = srv_parser_new(reasoning, *think_open, g->tools);
    }
    rc = g->parser ? 0 : -1;
    if (rc) srv_reply_error(f->r, 500, NULL, NULL, "out of memory");
done:
    free(text);
    cJSON_Delete(msgs);
    cJSON_Delete(kwargs);
    return rc;
}

/* The completion request's prompt (a string, an array of one string, or an array of token ids). */
static int completion_prompt(srv *s, fields *f, srv_gen *g, srv_job *j) {
    const cJSON *p = field(f, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    char err[512];
    if (cJSON_IsString(p)) {
        if (qwenc_tokenize(s->tok, p->valuestring, strlen(p->valuestring), 1, 1, &j->prompt, &j->n_prompt, err,
                           sizeof(err))) {
            srv_reply_error(f->r, 500, NULL, NULL, "tokenizer: %s", err);
            return -1;
        }
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(p, 0))) {
        int n = cJSON_GetArraySize(p), V = qwenc_model_n_vocab(s->model), i = 0;
        j->prompt = malloc((size_t)n * sizeof(int32_t));
        const cJSON *e;
        cJSON_ArrayForEach(e, p) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                e->valuedouble >= V) {
                srv_reply_error(f->r, 400, "prompt", "invalid_value", "prompt[%d] is not a token id in [0, %d)", i, V);
                return -1;
            }
            if (j->prompt) j->prompt[i] = (int32_t)e->valuedouble;
            i++;
        }
        j->n_prompt = n;
    } else {
        bad(f, "prompt", "'prompt' must be a string or an array of token ids (one prompt per request)%s%s", "", "");
        return -1;
    }
    int echo = 0;
    get_bool(f, "echo", &echo);
    if (echo) {
        char *t = NULL;
        size_t len = 0;
        if (!qwenc_detokenize(s->tok, j->prompt, j->n_prompt, 1, &t, &len, err, sizeof(err))) g->echo = t;
    }
    add_bound(j, j->n_prompt);
    return 0;
}

int srv_gen_start(srv *s, srv_endpoint ep, const char *body, size_t n, srv_gen **out, srv_reply *r) {
    *out = NULL;
    cJSON *req = cJSON_ParseWithLength(body, n);
    if (!req || !cJSON_IsObject(req)) {
        const char *at = cJSON_GetErrorPtr();
        if (!req && at && at >= body && at <= body + n)
            srv_reply_error(r, 400, NULL, "invalid_json", "the request body is not valid JSON (at byte %td)", at - body);
        else
            srv_reply_error(r, 400, NULL, "invalid_json", "the request body must be a JSON object");
        cJSON_Delete(req);
        return -1;
    }
    srv_gen *g = calloc(1, sizeof(*g));
    srv_job *j = srv_job_new();
    fields f = {.body = req, .r = r};
    int think_open = 0;
    if (!g || !j) {
        srv_reply_error(r, 500, NULL, NULL, "out of memory");
        goto fail;
    }
    g->s = s;
    g->ep = ep;
    g->chat = ep == EP_CHAT;
    g->created = (long long)time(NULL);
    make_id(g->id, sizeof(g->id), g->chat ? "chatcmpl-" : "cmpl-");
    get_sampling(s, &f, j);
    get_bool(&f, "stream", &g->stream);
    const cJSON *so = field(&f, "stream_options");
    if (so && !f.bad) {
        fields fo = {.body = so, .r = r};
        get_bool(&fo, "include_usage", &g->include_usage);
        f.bad = fo.bad;
    }
    long long k;
    if (g->chat) {
        int lp = 0;
        get_bool(&f, "logprobs", &lp);
        if (get_int(&f, "top_logprobs", 0, SRV_MAX_TOP, &k)) j->n_top = lp ? (int)k : -1;
        else if (lp) j->n_top = 0;
    } else if (get_int(&f, "logprobs", 0, SRV_MAX_TOP, &k)) {
        j->n_top = (int)k;
    }
    if (get_int(&f, "n_probs", 0, SRV_MAX_TOP, &k) && k > 0) j->n_top = (int)k;
    g->logprobs = j->n_top >= 0;
    if (f.bad) goto fail;
    if ((g->chat ? chat_prompt(s, &f, g, j, &think_open) : completion_prompt(s, &f, g, j)) || f.bad) goto fail;
    if (j->n_prompt == 0) {
        srv_reply_error(r, 400, g->chat ? "messages" : "prompt", "empty_prompt", "the prompt has no tokens");
        goto fail;
    }
    if (j->n_prompt > s->n_ctx) {
        srv_reply_error(r, 400, g->chat ? "messages" : "prompt", "context_length_exceeded",
                        "the prompt is %d tokens, more than the context of %d tokens a request may use (qwenc serve "
                        "-c)", j->n_prompt, s->n_ctx);
        goto fail;
    }
    int st = srv_sched_submit(s->sched, j);
    if (st) {
        if (atomic_load(&s->stopping))
            srv_reply_error(r, 503, NULL, "shutting_down", "the server is shutting down");
        else
            srv_reply_error(r, 503, NULL, "queue_full", "the server is busy: every slot is taken and the queue is full "
                            "(qwenc serve --parallel, --max-queue); retry later");
        goto fail;
    }
    g->job = j;
    g->tool_calls = cJSON_CreateArray();
    if (g->logprobs) g->lp = g->chat ? cJSON_CreateArray() : cJSON_CreateObject();
    if (g->lp && !g->chat) {
        cJSON_AddArrayToObject(g->lp, "tokens");
        cJSON_AddArrayToObject(g->lp, "token_logprobs");
        cJSON_AddArrayToObject(g->lp, "top_logprobs");
        cJSON_AddArrayToObject(g->lp, "text_offset");
    }
    cJSON_Delete(req);
    *out = g;
    return 0;
fail:
    cJSON_Delete(req);
    srv_job_release(j);
    if (g) gen_free_parts(g);
    free(g);
    return -1;
}

int srv_gen_stream(const srv_gen *g) { return g->stream; }
srv_job *srv_gen_job(const srv_gen *g) { return g->job; }

/* ------------------------------------------------------------------ output */

/* A token's text as JSON wants it (valid UTF-8) and its bytes. */
static cJSON *token_entry(srv *s, int32_t id, float lp, int with_bytes) {
    const char *t = qwenc_tokenizer_token_text(s->tok, id);
    char *clean = qwenc_utf8_repair(t, strlen(t));
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "id", id); /* as llama-server: the token id beside its text */
    cJSON_AddStringToObject(e, "token", clean ? clean : "");
    cJSON_AddNumberToObject(e, "logprob", lp);
    if (with_bytes) {
        cJSON *b = cJSON_AddArrayToObject(e, "bytes");
        for (const unsigned char *p = (const unsigned char *)t; *p; p++) cJSON_AddItemToArray(b, cJSON_CreateNumber(*p));
    }
    free(clean);
    return e;
}

/* The log-probability records as OpenAI gives them: chat entries appended to arr, completion lists to obj. */
static void add_probs(srv_gen *g, const srv_tokprob *pr, int n, cJSON *arr, cJSON *obj) {
    for (int i = 0; i < n; i++) {
        if (g->chat) {
            cJSON *e = token_entry(g->s, pr[i].id, pr[i].lp, 1), *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < pr[i].n_top; k++)
                cJSON_AddItemToArray(top, token_entry(g->s, pr[i].top[k].id, pr[i].top[k].lp, 1));
            cJSON_AddItemToArray(arr, e);
        } else {
            const char *t = qwenc_tokenizer_token_text(g->s->tok, pr[i].id);
            char *clean = qwenc_utf8_repair(t, strlen(t));
            cJSON_AddItemToArray(cJSON_GetObjectItem(obj, "tokens"), cJSON_CreateString(clean ? clean : ""));
            cJSON_AddItemToArray(cJSON_GetObjectItem(obj, "token_logprobs"), cJSON_CreateNumber(pr[i].lp));
            cJSON *top = cJSON_CreateObject();
            for (int k = 0; k < pr[i].n_top; k++) {
                const char *tt = qwenc_tokenizer_token_text(g->s->tok, pr[i].top[k].id);
                char *c2 = qwenc_utf8_repair(tt, strlen(tt));
                if (c2 && !cJSON_GetObjectItemCaseSensitive(top, c2)) cJSON_AddNumberToObject(top, c2, pr[i].top[k].lp);
                free(c2);
            }
            cJSON_AddItemToArray(cJSON_GetObjectItem(obj, "top_logprobs"), top);
            cJSON_AddItemToArray(cJSON_GetObjectItem(obj, "text_offset"), cJSON_CreateNumber((double)g->text_offset));
            g->text_offset += strlen(t);
            free(clean);
        }
    }
}

static const char *finish_reason(const srv_gen *g) {
    int tools = g->parser && srv_parser_n_tools(g->parser) > 0;
    switch (g->reason) {
    case QWENC_STOP_LIMIT: case QWENC_STOP_CONTEXT: return "length";
    default: return tools ? "tool_calls" : "stop";
    }
}

static cJSON *usage_json(const srv_gen *g) {
    const srv_job *j = g->job;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_gen);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", j->n_cached);
    return u;
}

/* llama-server's "timings": what the prompt and the generation took. */
static cJSON *timings_json(const srv_gen *g) {
    const srv_job *j = g->job;
    cJSON *t = cJSON_CreateObject();
    double prompt_ms = j->t_first > 0 ? (j->t_first - j->t_start) * 1e3 : 0, gen_ms = j->t_first > 0 ? (j->t_end - j->t_first) * 1e3 : 0;
    int fed = j->n_prompt - j->n_cached;
    cJSON_AddNumberToObject(t, "cache_n", j->n_cached);
    cJSON_AddNumberToObject(t, "prompt_n", fed);
    cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? fed / (prompt_ms / 1e3) : 0);
    cJSON_AddNumberToObject(t, "predicted_n", j->n_gen);
    cJSON_AddNumberToObject(t, "predicted_ms", gen_ms);
    cJSON_AddNumberToObject(t, "predicted_per_second", gen_ms > 0 ? j->n_gen / (gen_ms / 1e3) : 0);
    cJSON_AddNumberToObject(t, "queue_ms", j->t_start > 0 ? (j->t_start - j->t_submit) * 1e3 : 0);
    return t;
}

/* What every answer of a generation starts with: id, object, created, model, system_fingerprint. */
static cJSON *envelope(const srv_gen *g, const char *object) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", g->id);
    cJSON_AddStringToObject(c, "object", object);
    cJSON_AddNumberToObject(c, "created", (double)g->created);
    cJSON_AddStringToObject(c, "model", g->s->p.alias);
    cJSON_AddStringToObject(c, "system_fingerprint", "qwenc-" QWENC_VERSION);
    return c;
}

/* A chunk's envelope, with its one choice (NULL: none, the usage chunk). */
static cJSON *chunk(srv_gen *g, cJSON **choice) {
    cJSON *c = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(c, "choices");
    if (choice) {
        *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(*choice, "index", 0);
        cJSON_AddItemToArray(choices, *choice);
    }
    return c;
}

static void send_event(srv_gen *g, sbuf *out, cJSON *c) {
    if (g->include_usage && !cJSON_GetObjectItem(c, "usage")) cJSON_AddNullToObject(c, "usage");
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    if (s) {
        sb_str(out, "data: ");
        sb_str(out, s);
        sb_str(out, "\n\n");
    }
    free(s);
}

/* A chat chunk with one delta; finish: the finish_reason (NULL: null). logprobs: its entries or NULL. */
static void chat_event(srv_gen *g, sbuf *out, cJSON *delta, const char *finish, cJSON *logprobs) {
    cJSON *choice, *c = chunk(g, &choice);
    cJSON_AddItemToObject(choice, "delta", delta);
    if (logprobs) cJSON_AddItemToObject(cJSON_AddObjectToObject(choice, "logprobs"), "content", logprobs);
    else cJSON_AddNullToObject(choice, "logprobs");
    if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
    else cJSON_AddNullToObject(choice, "finish_reason");
    send_event(g, out, c);
}

static void completion_event(srv_gen *g, sbuf *out, const char *text, const char *finish, cJSON *logprobs) {
    cJSON *choice, *c = chunk(g, &choice);
    cJSON_AddStringToObject(choice, "text", text);
    if (logprobs) cJSON_AddItemToObject(choice, "logprobs", logprobs);
    else cJSON_AddNullToObject(choice, "logprobs");
    if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
    else cJSON_AddNullToObject(choice, "finish_reason");
    send_event(g, out, c);
}

/* A tool call delta as OpenAI writes it: index always, id, type and name on the first only. */
static cJSON *tool_json(const srv_tool_delta *t) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", t->index);
    if (t->id) {
        cJSON_AddStringToObject(c, "id", t->id);
        cJSON_AddStringToObject(c, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    if (t->name) cJSON_AddStringToObject(f, "name", t->name);
    cJSON_AddStringToObject(f, "arguments", t->args ? t->args : "");
    return c;
}

/* The parser's delta: into the answer (no stream) or as events. */
static void use_delta(srv_gen *g, sbuf *out, cJSON *lp) {
    srv_delta *d = &g->d;
    if (!g->stream) {
        sb_add(&g->reasoning, d->reasoning.p ? d->reasoning.p : "", d->reasoning.n);
        sb_add(&g->content, d->content.p ? d->content.p : "", d->content.n);
        for (int i = 0; i < d->n_tools; i++) {
            const srv_tool_delta *t = &d->tools[i];
            cJSON *c = cJSON_GetArrayItem(g->tool_calls, t->index);
            if (!c) { /* a message's tool_calls carry no index */
                c = tool_json(t);
                cJSON_DeleteItemFromObjectCaseSensitive(c, "index");
                cJSON_AddItemToArray(g->tool_calls, c);
            } else {
                cJSON *fn = cJSON_GetObjectItem(c, "function");
                sbuf s = {0};
                sb_str(&s, cJSON_GetObjectItem(fn, "arguments")->valuestring);
                sb_str(&s, t->args);
                cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", cJSON_CreateString(s.p ? s.p : ""));
                sb_free(&s);
            }
        }
        cJSON_Delete(lp);
        return;
    }
    if (d->reasoning.n) {
        cJSON *delta = cJSON_CreateObject();
        cJSON_AddStringToObject(delta, "reasoning_content", d->reasoning.p);
        chat_event(g, out, delta, NULL, NULL);
    }
    if (d->content.n || (lp && cJSON_GetArraySize(lp))) {
        cJSON *delta = cJSON_CreateObject();
        cJSON_AddStringToObject(delta, "content", d->content.p ? d->content.p : "");
        chat_event(g, out, delta, NULL, lp);
        lp = NULL;
    }
    for (int i = 0; i < d->n_tools; i++) {
        cJSON *delta = cJSON_CreateObject(), *calls = cJSON_AddArrayToObject(delta, "tool_calls");
        cJSON_AddItemToArray(calls, tool_json(&d->tools[i]));
        chat_event(g, out, delta, NULL, NULL);
    }
    cJSON_Delete(lp);
}

int srv_gen_take(srv_gen *g, sbuf *out) {
    if (g->finished) return 1;
    srv_job *j = g->job;
    sbuf text = {0};
    srv_tokprob *probs = NULL;
    int n_probs = 0;
    pthread_mutex_lock(&j->mu);
    text = j->text;
    j->text = (sbuf){0};
    probs = j->probs;
    n_probs = j->n_probs;
    j->probs = NULL;
    j->n_probs = j->cap_probs = 0;
    g->done = j->done;
    g->reason = j->reason;
    g->err_status = j->err_status;
    snprintf(g->err, sizeof(g->err), "%s", j->err);
    pthread_mutex_unlock(&j->mu);

    if (g->stream && !g->started) { /* the first event: the role, or the echoed prompt */
        g->started = 1;
        if (g->chat) {
            cJSON *delta = cJSON_CreateObject();
            cJSON_AddStringToObject(delta, "role", "assistant");
            cJSON_AddStringToObject(delta, "content", "");
            chat_event(g, out, delta, NULL, NULL);
        } else if (g->echo) {
            completion_event(g, out, g->echo, NULL, NULL);
        }
    }
    cJSON *lp = NULL;
    if (n_probs) {
        lp = g->chat ? cJSON_CreateArray() : cJSON_CreateObject();
        if (!g->chat)
            for (int i = 0; i < 4; i++)
                cJSON_AddArrayToObject(lp, (const char *[]){"tokens", "token_logprobs", "top_logprobs", "text_offset"}[i]);
        if (g->stream) {
            add_probs(g, probs, n_probs, lp, lp);
        } else {
            add_probs(g, probs, n_probs, g->lp, g->lp);
            cJSON_Delete(lp);
            lp = NULL;
        }
    }
    free(probs);
    int final = g->done && !g->err_status;
    if (g->chat) {
        srv_delta_clear(&g->d);
        srv_parser_feed(g->parser, text.p ? text.p : "", text.n, final, &g->d);
        use_delta(g, out, lp);
    } else if (g->stream) {
        if (text.n || lp) completion_event(g, out, text.p ? text.p : "", NULL, lp);
    } else {
        sb_add(&g->text, text.p ? text.p : "", text.n);
        cJSON_Delete(lp);
    }
    sb_free(&text);
    if (!g->done) return 0;
    if (g->stream) {
        if (g->err_status) {
            cJSON *e = error_json(g->err_status, NULL, NULL, g->err);
            char *s = cJSON_PrintUnformatted(e);
            cJSON_Delete(e);
            sb_printf(out, "data: %s\n\n", s ? s : "{}");
            free(s);
        } else {
            if (g->chat) chat_event(g, out, cJSON_CreateObject(), finish_reason(g), NULL);
            else completion_event(g, out, "", finish_reason(g), NULL);
            if (g->include_usage) {
                cJSON *c = chunk(g, NULL);
                cJSON_AddItemToObject(c, "usage", usage_json(g));
                cJSON_AddItemToObject(c, "timings", timings_json(g));
                send_event(g, out, c);
            }
        }
        sb_str(out, "data: [DONE]\n\n");
    }
    g->finished = 1;
    return 1;
}

void srv_gen_reply(srv_gen *g, srv_reply *r) {
    if (g->err_status) {
        srv_reply_error(r, g->err_status, NULL, NULL, "%s", g->err);
        return;
    }
    cJSON *c = envelope(g, g->chat ? "chat.completion" : "text_completion");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    if (g->chat) {
        cJSON *m = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        int n_tools = cJSON_GetArraySize(g->tool_calls);
        if (n_tools && !g->content.n) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", g->content.p ? g->content.p : "");
        if (g->reasoning.n) cJSON_AddStringToObject(m, "reasoning_content", g->reasoning.p);
        if (n_tools) {
            cJSON_AddItemToObject(m, "tool_calls", g->tool_calls);
            g->tool_calls = NULL;
        }
    } else {
        sbuf t = {0};
        sb_str(&t, g->echo ? g->echo : "");
        sb_add(&t, g->text.p ? g->text.p : "", g->text.n);
        cJSON_AddStringToObject(choice, "text", t.p);
        sb_free(&t);
    }
    if (g->lp) {
        if (g->chat) cJSON_AddItemToObject(cJSON_AddObjectToObject(choice, "logprobs"), "content", g->lp);
        else cJSON_AddItemToObject(choice, "logprobs", g->lp);
        g->lp = NULL;
    } else {
        cJSON_AddNullToObject(choice, "logprobs");
    }
    cJSON_AddStringToObject(choice, "finish_reason", finish_reason(g));
    cJSON_AddItemToObject(c, "usage", usage_json(g));
    cJSON_AddItemToObject(c, "timings", timings_json(g));
    srv_reply_json(r, 200, c);
}

void srv_gen_log(const srv_gen *g, char *buf, size_t n) {
    const srv_job *j = g->job;
    if (g->err_status) {
        snprintf(buf, n, "%s", g->err);
        return;
    }
    snprintf(buf, n, "prompt %d tokens (%d cached), %d generated, %.3f s, %s%s", j->n_prompt, j->n_cached, j->n_gen,
             j->t_end > j->t_submit ? j->t_end - j->t_submit : 0.0,
             g->reason == QWENC_STOP_CALLER ? "cancelled" : finish_reason(g), g->stream ? ", streamed" : "");
}

/* ------------------------------------------------------------------ the other endpoints */

static void metrics(srv *s, srv_reply *r) {
    srv_stats *st = &s->st;
    sbuf b = {0};
    static const char *ep_names[EP_COUNT] = {"health", "models", "metrics", "chat_completions", "completions",
                                             "tokenize", "detokenize", "apply_template"};
    sb_str(&b, "# HELP qwenc_requests_total Requests by endpoint.\n# TYPE qwenc_requests_total counter\n");
    for (int i = 0; i < EP_COUNT; i++)
        sb_printf(&b, "qwenc_requests_total{endpoint=\"%s\"} %lld\n", ep_names[i], atomic_load(&st->requests[i]));
    static const char *classes[6] = {"2xx", "400", "401", "404", "413", "5xx"};
    sb_str(&b, "# HELP qwenc_responses_total Responses by status.\n# TYPE qwenc_responses_total counter\n");
    for (int i = 0; i < 6; i++)
        sb_printf(&b, "qwenc_responses_total{status=\"%s\"} %lld\n", classes[i], atomic_load(&st->status[i]));
    double pus = (double)atomic_load(&st->prompt_us), dus = (double)atomic_load(&st->decode_us);
    long long fed = atomic_load(&st->prompt_tokens) - atomic_load(&st->cached_tokens);
    long long gen = atomic_load(&st->gen_tokens);
#define METRIC(name, type, help, fmt, val) \
    sb_printf(&b, "# HELP qwenc_" name " " help "\n# TYPE qwenc_" name " " type "\nqwenc_" name " " fmt "\n", val)
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of the requests, cached or not.", "%lld",
           atomic_load(&st->prompt_tokens));
    METRIC("prompt_tokens_cached_total", "counter", "Prompt tokens restored from a slot or the prefix cache.", "%lld",
           atomic_load(&st->cached_tokens));
    METRIC("tokens_predicted_total", "counter", "Tokens generated.", "%lld", gen);
    METRIC("prompt_seconds_total", "counter", "Time spent feeding prompts.", "%.6f", pus / 1e6);
    METRIC("decode_seconds_total", "counter", "Time spent in decode steps.", "%.6f", dus / 1e6);
    METRIC("decode_steps_total", "counter", "Decode steps (one forward for every generating slot).", "%lld",
           atomic_load(&st->decode_steps));
    METRIC("prompt_tokens_per_second", "gauge", "Prompt tokens fed per second of prompt work.", "%.3f",
           pus > 0 ? fed / (pus / 1e6) : 0.0);
    METRIC("predicted_tokens_per_second", "gauge", "Tokens generated per second of decode work, all slots together.",
           "%.3f", dus > 0 ? gen / (dus / 1e6) : 0.0);
    METRIC("prefix_cache_hits_total", "counter", "Requests that reused a cached prefix.", "%lld",
           atomic_load(&st->cache_hits));
    METRIC("prefix_cache_misses_total", "counter", "Requests fed from the first token.", "%lld",
           atomic_load(&st->cache_misses));
    METRIC("prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.", "%lld", atomic_load(&st->cache_bytes));
    METRIC("prefix_cache_entries", "gauge", "Snapshots the prefix cache holds.", "%lld", atomic_load(&st->cache_entries));
    METRIC("draft_tokens_total", "counter", "Tokens drafted (--draft).", "%lld", atomic_load(&st->drafted));
    METRIC("draft_accepted_total", "counter", "Drafted tokens accepted.", "%lld", atomic_load(&st->draft_accepted));
    METRIC("requests_cancelled_total", "counter", "Requests ended because the client left or the server stopped.",
           "%lld", atomic_load(&st->cancelled));
    METRIC("requests_processing", "gauge", "Requests in a slot.", "%d", atomic_load(&st->active));
    METRIC("requests_deferred", "gauge", "Requests in the queue (queue depth).", "%d", atomic_load(&st->queued));
    METRIC("slots", "gauge", "Slots (--parallel).", "%d", s->p.n_parallel);
#undef METRIC
    r->status = 200;
    r->ctype = "text/plain; version=0.0.4";
    r->body = b.p ? b.p : strdup("");
    r->len = b.n;
}

/* /tokenize {"content", "add_special", "parse_special", "with_pieces"} -> {"tokens"} */
static void tokenize(srv *s, cJSON *req, srv_reply *r) {
    fields f = {.body = req, .r = r};
    const cJSON *content = field(&f, "content");
    int add_special = 0, parse_special = 1, pieces = 0;
    get_bool(&f, "add_special", &add_special);
    get_bool(&f, "parse_special", &parse_special);
    get_bool(&f, "with_pieces", &pieces);
    if (f.bad) return;
    if (!cJSON_IsString(content)) {
        srv_reply_error(r, 400, "content", "invalid_type", "'content' must be a string, got %s", json_kind(content));
        return;
    }
    int32_t *ids = NULL;
    int n = 0;
    char err[512];
    if (qwenc_tokenize(s->tok, content->valuestring, strlen(content->valuestring), add_special, parse_special, &ids, &n,
                       err, sizeof(err))) {
        srv_reply_error(r, 500, NULL, NULL, "tokenizer: %s", err);
        return;
    }
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < n; i++) {
        if (!pieces) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            continue;
        }
        const char *t = qwenc_tokenizer_token_text(s->tok, ids[i]);
        char *clean = qwenc_utf8_repair(t, strlen(t));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", ids[i]);
        cJSON_AddStringToObject(e, "piece", clean ? clean : "");
        cJSON_AddItemToArray(a, e);
        free(clean);
    }
    free(ids);
    srv_reply_json(r, 200, o);
}

/* /detokenize {"tokens"} -> {"content"} */
static void detokenize(srv *s, cJSON *req, srv_reply *r) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tokens"), *e;
    if (!cJSON_IsArray(t)) {
        srv_reply_error(r, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
        return;
    }
    int n = cJSON_GetArraySize(t), i = 0;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    cJSON_ArrayForEach(e, t) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= qwenc_tokenizer_n_vocab(s->tok)) {
            srv_reply_error(r, 400, "tokens", "invalid_value", "tokens[%d] is not a token id in [0, %d)", i,
                            qwenc_tokenizer_n_vocab(s->tok));
            free(ids);
            return;
        }
        if (ids) ids[i] = (int32_t)e->valuedouble;
        i++;
    }
    char *text = NULL, err[512];
    size_t len = 0;
    if (!ids || qwenc_detokenize(s->tok, ids, n, 0, &text, &len, err, sizeof(err))) {
        srv_reply_error(r, 500, NULL, NULL, "detokenizer: %s", ids ? err : "out of memory");
        free(ids);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "content", text);
    free(text);
    free(ids);
    srv_reply_json(r, 200, o);
}

/* /apply-template: a chat request -> {"prompt"}, the text the model would read */
static void apply_template(srv *s, cJSON *req, srv_reply *r) {
    fields f = {.body = req, .r = r};
    srv_gen g = {.s = s};
    srv_job *j = srv_job_new();
    int think_open = 0;
    if (!j) {
        srv_reply_error(r, 500, NULL, NULL, "out of memory");
        return;
    }
    if (!chat_prompt(s, &f, &g, j, &think_open) && !f.bad) {
        char *text = NULL, err[512];
        size_t len = 0;
        if (qwenc_detokenize(s->tok, j->prompt, j->n_prompt, 0, &text, &len, err, sizeof(err))) {
            srv_reply_error(r, 500, NULL, NULL, "detokenizer: %s", err);
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "prompt", text);
            cJSON_AddNumberToObject(o, "n_tokens", j->n_prompt);
            srv_reply_json(r, 200, o);
        }
        free(text);
    }
    gen_free_parts(&g);
    srv_job_release(j);
}

void srv_api_simple(srv *s, srv_endpoint ep, const char *body, size_t n, srv_reply *r) {
    if (ep == EP_HEALTH) {
        cJSON *o = cJSON_CreateObject();
        int ready = atomic_load(&s->ready);
        cJSON_AddStringToObject(o, "status", ready ? "ok" : "loading model");
        srv_reply_json(r, ready ? 200 : 503, o);
        return;
    }
    if (ep == EP_METRICS) {
        metrics(s, r);
        return;
    }
    if (ep == EP_MODELS) {
        cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
        cJSON_AddStringToObject(m, "id", s->p.alias);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)s->t_start);
        cJSON_AddStringToObject(m, "owned_by", "qwenc");
        cJSON *meta = cJSON_AddObjectToObject(m, "meta");
        cJSON_AddStringToObject(meta, "arch", qwenc_model_arch(s->model));
        cJSON_AddNumberToObject(meta, "n_vocab", qwenc_model_n_vocab(s->model));
        cJSON_AddNumberToObject(meta, "n_ctx_train", qwenc_model_n_ctx_train(s->model));
        cJSON_AddNumberToObject(meta, "n_ctx", s->n_ctx);
        cJSON_AddNumberToObject(meta, "n_parallel", s->p.n_parallel);
        srv_reply_json(r, 200, o);
        return;
    }
    cJSON *req = cJSON_ParseWithLength(body, n);
    if (!cJSON_IsObject(req)) {
        srv_reply_error(r, 400, NULL, "invalid_json", "the request body must be a JSON object");
    } else if (ep == EP_TOKENIZE) {
        tokenize(s, req, r);
    } else if (ep == EP_DETOKENIZE) {
        detokenize(s, req, r);
    } else {
        apply_template(s, req, r);
    }
    cJSON_Delete(req);
}
