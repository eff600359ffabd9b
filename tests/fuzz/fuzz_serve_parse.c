/*
 * fuzz_serve_parse.c - fuzz target: the server's reply parser (src/server/parse.c), which splits what the model
 * generates - text a prompt can steer - into content, reasoning and tool-call deltas.
 *
 * Input: byte 0 holds the flags: reasoning split (bit 0), a <think> block opened by the prompt (bit 1), the
 * request's tools given (bit 2), the seed of the cuts (bits 3-7); the rest is the generated text. Properties:
 * the text fed whole and fed in pieces cut where the seed says give the same reasoning, content and calls (names
 * and arguments); a call's id and name come on its first delta only, and calls begin in order; each call's
 * arguments are one JSON object once the reply is complete; valid UTF-8 in gives valid UTF-8 out.
 */
#include <cjson/cJSON.h>

#include "fuzz_util.h"
#include "server/server.h"

#define MAX_CALLS 64

typedef struct {
    sbuf reasoning, content;
    sbuf args[MAX_CALLS];
    char *name[MAX_CALLS];
    int n_calls;
} result;

static void result_free(result *r) {
    sb_free(&r->reasoning);
    sb_free(&r->content);
    for (int i = 0; i < r->n_calls && i < MAX_CALLS; i++) {
        sb_free(&r->args[i]);
        free(r->name[i]);
    }
}

static void take(result *r, const srv_delta *d) {
    FZ_CHECK(!sb_add(&r->reasoning, d->reasoning.p ? d->reasoning.p : "", d->reasoning.n), "out of memory");
    FZ_CHECK(!sb_add(&r->content, d->content.p ? d->content.p : "", d->content.n), "out of memory");
    for (int i = 0; i < d->n_tools; i++) {
        const srv_tool_delta *t = &d->tools[i];
        if (t->index == r->n_calls) { /* a call begins: its id and name now */
            FZ_CHECK(t->id && t->name && !strncmp(t->id, "call_", 5), "call %d begins without id or name", t->index);
            if (r->n_calls < MAX_CALLS) {
                r->name[r->n_calls] = strdup(t->name);
                FZ_CHECK(r->name[r->n_calls] && !sb_add(&r->args[r->n_calls], "", 0), "out of memory");
            }
            r->n_calls++;
        } else {
            FZ_CHECK(t->index == r->n_calls - 1 && !t->id && !t->name,
                     "delta of call %d (calls begun: %d) out of order, or its id / name repeated", t->index,
                     r->n_calls);
        }
        if (t->index < MAX_CALLS && t->args)
            FZ_CHECK(!sb_add(&r->args[t->index], t->args, strlen(t->args)), "out of memory");
    }
}

static uint32_t next(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Feed text whole (seed 0) or in pieces of 1 to 16 bytes drawn from seed. */
static void run(result *r, const char *text, size_t n, uint32_t seed, int reasoning, int think_open,
                const cJSON *tools) {
    memset(r, 0, sizeof(*r));
    FZ_CHECK(!sb_add(&r->reasoning, "", 0) && !sb_add(&r->content, "", 0), "out of memory");
    srv_parser *p = srv_parser_new(reasoning, think_open, tools);
    FZ_CHECK(p, "srv_parser_new: out of memory");
    srv_delta d = {0};
    size_t at = 0;
    do {
        size_t k = seed ? 1 + next(&seed) % 16 : n - at;
        if (k > n - at) k = n - at;
        srv_delta_clear(&d);
        FZ_CHECK(!srv_parser_feed(p, text + at, k, at + k == n, &d), "srv_parser_feed failed");
        take(r, &d);
        at += k;
    } while (at < n);
    srv_delta_free(&d);
    srv_parser_free(p);
}

static cJSON *tools;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tools)
        tools = cJSON_Parse(
            "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
            "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"t\":{\"type\":\"number\"},"
            "\"ok\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"list\":{\"type\":\"array\"}}}}},"
            "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\"}}}]");
    if (size < 1 || !tools) return 0;
    int reasoning = data[0] & 1, think_open = (data[0] >> 1) & 1;
    const cJSON *t = (data[0] >> 2) & 1 ? tools : NULL;
    uint32_t seed = 0x9E3779B9u ^ (uint32_t)(data[0] >> 3) * 2654435761u;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    result whole, cut;
    run(&whole, text, n, 0, reasoning, think_open, t);
    run(&cut, text, n, seed ? seed : 1, reasoning, think_open, t);
    size_t rat = 0;
    while (rat < whole.reasoning.n && rat < cut.reasoning.n && whole.reasoning.p[rat] == cut.reasoning.p[rat]) rat++;
    FZ_CHECK(whole.reasoning.n == cut.reasoning.n && rat == whole.reasoning.n,
             "reasoning differs from byte %zu: whole [%.200s], in pieces [%.200s]", rat, whole.reasoning.p + rat,
             cut.reasoning.p + rat);
    size_t at = 0;
    while (at < whole.content.n && at < cut.content.n && whole.content.p[at] == cut.content.p[at]) at++;
    FZ_CHECK(whole.content.n == cut.content.n && at == whole.content.n,
             "content differs from byte %zu: whole [%.200s], in pieces [%.200s]", at, whole.content.p + at,
             cut.content.p + at);
    FZ_CHECK(whole.n_calls == cut.n_calls, "%d calls whole, %d in pieces", whole.n_calls, cut.n_calls);
    for (int i = 0; i < whole.n_calls && i < MAX_CALLS; i++) {
        FZ_CHECK(!strcmp(whole.name[i], cut.name[i]), "call %d: name %s whole, %s in pieces", i, whole.name[i],
                 cut.name[i]);
        FZ_CHECK(whole.args[i].n == cut.args[i].n && !memcmp(whole.args[i].p, cut.args[i].p, whole.args[i].n),
                 "call %d: arguments differ whole / in pieces", i);
        cJSON *j = cJSON_ParseWithLength(whole.args[i].p, whole.args[i].n);
        FZ_CHECK(cJSON_IsObject(j), "call %d: arguments are not a JSON object: %.200s", i, whole.args[i].p);
        cJSON_Delete(j);
    }
    if (fz_utf8_valid(text, n)) {
        FZ_CHECK(fz_utf8_valid(whole.content.p, whole.content.n), "valid UTF-8 in, content not valid UTF-8");
        FZ_CHECK(fz_utf8_valid(whole.reasoning.p, whole.reasoning.n), "valid UTF-8 in, reasoning not valid UTF-8");
        for (int i = 0; i < whole.n_calls && i < MAX_CALLS; i++)
            FZ_CHECK(fz_utf8_valid(whole.args[i].p, whole.args[i].n), "call %d: arguments not valid UTF-8", i);
    }
    result_free(&whole);
    result_free(&cut);
    return 0;
}
