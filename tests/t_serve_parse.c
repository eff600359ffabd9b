/*
 * t_serve_parse.c - the server's reply parser (src/server/parse.c) on hand-written replies: reasoning split
 * from content, both forms of Qwen tool calls, replies cut short, markup that is not a call, and tool-call
 * markup without tools. Each reply is fed whole, a byte at a time, and cut in two at every byte; every way
 * must give the expected reasoning, content and calls (written here by hand), a call's id and name only on its
 * first delta, calls begun in order, and the arguments valid JSON.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "test_util.h"

typedef struct {
    sbuf reasoning, content;
    char *name[8], *args[8], *id[8];
    int n_calls, bad; /* bad: an invariant of the deltas broke (printed) */
} result;

static void result_free(result *r) {
    sb_free(&r->reasoning);
    sb_free(&r->content);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->name[i]);
        free(r->args[i]);
        free(r->id[i]);
    }
}

static void take(result *r, const srv_delta *d) {
    sb_add(&r->reasoning, d->reasoning.p ? d->reasoning.p : "", d->reasoning.n);
    sb_add(&r->content, d->content.p ? d->content.p : "", d->content.n);
    for (int i = 0; i < d->n_tools; i++) {
        const srv_tool_delta *t = &d->tools[i];
        if (t->index == r->n_calls && t->index < 8) { /* a new call: id and name now */
            if (!t->id || !t->name || strncmp(t->id, "call_", 5)) r->bad = 1;
            r->id[r->n_calls] = t->id ? strdup(t->id) : NULL;
            r->name[r->n_calls] = strdup(t->name ? t->name : "");
            r->args[r->n_calls++] = strdup("");
        } else if (t->index != r->n_calls - 1 || t->id || t->name) {
            r->bad = 1; /* out of order, or id / name repeated */
        }
        if (t->index >= r->n_calls) continue;
        char **a = &r->args[t->index];
        size_t la = strlen(*a), lt = strlen(t->args ? t->args : "");
        *a = realloc(*a, la + lt + 1);
        memcpy(*a + la, t->args ? t->args : "", lt + 1);
    }
}

/* Feed text cut at the given points (ascending, within the text) and collect. */
static void run(result *r, const char *text, const size_t *cuts, int n_cuts, int reasoning, int think_open,
                const cJSON *tools) {
    memset(r, 0, sizeof(*r));
    sb_add(&r->reasoning, "", 0);
    sb_add(&r->content, "", 0);
    srv_parser *p = srv_parser_new(reasoning, think_open, tools);
    srv_delta d = {0};
    size_t at = 0, n = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        srv_delta_clear(&d);
        if (srv_parser_feed(p, text + at, end - at, i == n_cuts, &d)) r->bad = 1;
        take(r, &d);
        at = end;
    }
    srv_delta_free(&d);
    srv_parser_free(p);
}

typedef struct {
    const char *name, *text;
    int reasoning, think_open, with_tools;
    const char *want_reasoning, *want_content;
    int n_calls;
    const char *call_name[2], *call_args[2]; /* args compared as JSON */
} case_t;

static int same_json(const char *a, const char *b) {
    cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
    int same = x && y && cJSON_Compare(x, y, 1);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return same;
}

static int check(const case_t *c, const result *r, const char *how) {
    int ok = !r->bad && !strcmp(r->reasoning.p, c->want_reasoning) && !strcmp(r->content.p, c->want_content) &&
             r->n_calls == c->n_calls;
    for (int i = 0; ok && i < c->n_calls; i++)
        ok = !strcmp(r->name[i], c->call_name[i]) && same_json(r->args[i], c->call_args[i]) &&
             (i == 0 || strcmp(r->id[i], r->id[0]));
    if (!ok) {
        printf("  %s (%s): reasoning [%s] content [%s] %d calls%s", c->name, how, r->reasoning.p, r->content.p,
               r->n_calls, r->bad ? " (bad deltas)" : "");
        for (int i = 0; i < r->n_calls; i++) printf(" %s(%s)", r->name[i], r->args[i]);
        printf("\n");
    }
    return ok;
}

static void test_case(const case_t *c, const cJSON *tools) {
    const cJSON *t = c->with_tools ? tools : NULL;
    size_t n = strlen(c->text);
    result r;
    run(&r, c->text, NULL, 0, c->reasoning, c->think_open, t);
    CHECK(check(c, &r, "whole"), "%s: fed whole", c->name);
    result_free(&r);
    size_t *cuts = malloc((n + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    run(&r, c->text, cuts, n ? (int)n - 1 : 0, c->reasoning, c->think_open, t);
    CHECK(check(c, &r, "byte by byte"), "%s: fed a byte at a time", c->name);
    result_free(&r);
    int bad_at = -1;
    for (size_t k = 1; k < n && bad_at < 0; k++) {
        run(&r, c->text, &k, 1, c->reasoning, c->think_open, t);
        if (!check(c, &r, "cut in two")) bad_at = (int)k;
        result_free(&r);
    }
    CHECK(bad_at < 0, "%s: cut in two at byte %d", c->name, bad_at);
    free(cuts);
}

int main(void) {
    const char *tools_json =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"code\":{\"type\":\"string\"},"
        "\"opts\":{\"type\":\"object\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\"}}}]";
    cJSON *tools = cJSON_Parse(tools_json);
    static const case_t cases[] = {
        {"Qwen3.5 XML form, thinking open in the prompt",
         "The user asks about the weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
         "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
         "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
         1, 1, 1, "The user asks about the weather.", "Let me check.", 2, {"get_weather", "get_time"},
         {"{\"city\":\"Paris\",\"days\":3}", "{}"}},
        {"Qwen3 JSON form, <think> in the reply",
         "<think>\nThe user asks about the weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", "
         "\"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
         "\"arguments\": {}}\n</tool_call>",
         1, 0, 1, "The user asks about the weather.", "Let me check.", 2, {"get_weather", "get_time"},
         {"{\"city\":\"Paris\",\"days\":3}", "{}"}},
        {"string parameters stay strings; multi-line values keep inner newlines",
         "<tool_call>\n<function=get_weather>\n<parameter=code>\n42\n</parameter>\n<parameter=city>\nNew\nYork\n"
         "</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>",
         1, 0, 1, "", "", 1, {"get_weather"}, {"{\"code\":\"42\",\"city\":\"New\\nYork\",\"opts\":{\"a\":[1,2]}}"}},
        {"parameters without </parameter> (Qwen3-Coder tolerates it)",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\n2\n</function>\n</tool_call>",
         1, 0, 1, "", "", 1, {"get_weather"}, {"{\"city\":\"Rome\",\"days\":2}"}},
        {"cut inside a parameter: the arguments are closed",
         "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", 1, 0, 1, "", "Sure.", 1,
         {"get_weather"}, {"{\"city\":\"Par\"}"}},
        {"cut inside the reasoning", "<think>\nhmm, let me", 1, 0, 1, "hmm, let me", "", 0, {NULL}, {NULL}},
        {"a JSON call that does not parse is content",
         "<tool_call>\n{\"name\": oops}\n</tool_call> then", 1, 0, 1, "", "<tool_call>{\"name\": oops}\n</tool_call> then",
         0, {NULL}, {NULL}},
        {"without tools the markup is content",
         "ok <tool_call>\n<function=f>\n</function>\n</tool_call>", 1, 0, 0, "",
         "ok <tool_call>\n<function=f>\n</function>\n</tool_call>", 0, {NULL}, {NULL}},
        {"angle brackets that are no tag, and trailing space kept", "a < b <tool and <think> x \n", 1, 0, 1, "",
         "a < b <tool and <think> x \n", 0, {NULL}, {NULL}},
        {"reasoning off: <think> is content", "<think>\nx\n</think>\n\ny", 0, 0, 1, "", "<think>\nx\n</think>\n\ny", 0,
         {NULL}, {NULL}},
        {"a reply that only thinks, then answers", "\n\n<think>\n\n</think>\n\nThe answer.", 1, 0, 0, "", "The answer.",
         0, {NULL}, {NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        printf("%s\n", cases[i].name);
        test_case(&cases[i], tools);
    }
    cJSON_Delete(tools);
    return test_summary();
}
