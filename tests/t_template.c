/*
 * t_template.c - chat templates rendered by qwenc_chat_render compared byte for byte with transformers.
 *
 *   t_template [TEMPLATES_DIR]     (default tests/templates)
 *
 * TEMPLATES_DIR/expected.json is made by tests/gen/make_template_cases.py on the GPU machine: for every
 * (template, conversation, add_generation_prompt, enable_thinking) it holds the text transformers'
 * apply_chat_template renders, or the exception it raises (then qwenc must fail too, and for
 * raise_exception with the same message). "features" are small templates that pin one Jinja behaviour
 * each (whitespace control, Python value printing, tojson, filters, tests, scoping), checked the same way,
 * except that text holding a NUL character must give qwenc's NUL error (a C string cannot carry it).
 * Then hand-written checks of the error messages: unknown constructs name the construct and the line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/mapfile.h"
#include "qwenc.h"
#include "test_util.h"

static char *slurp(const char *dir, const char *sub, const char *name) {
    char path[1024], err[512];
    snprintf(path, sizeof(path), "%s/%s%s", dir, sub, name);
    char *buf = NULL;
    size_t len = 0;
    if (qw_read_file(path, &buf, &len, err, sizeof(err)) != QWENC_OK) {
        printf("FAIL %s\n", err);
        n_fail++;
        return NULL;
    }
    return buf;
}

/* Print where two renderings first differ, with some context, escaped. */
static void show_diff(const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("    first difference at byte %zu\n    got:  ", i);
    for (size_t k = from; got[k] && k < i + 60; k++) printf(got[k] == '\n' ? "\\n" : "%c", got[k]);
    printf("\n    want: ");
    for (size_t k = from; want[k] && k < i + 60; k++) printf(want[k] == '\n' ? "\\n" : "%c", want[k]);
    printf("\n");
}

/* Compare one rendering with the expected entry (its "output", or its "error"). */
static int check_entry(const char *label, const cJSON *entry, qwenc_status st, const char *got, const char *err) {
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(entry, "output");
    const cJSON *werr = cJSON_GetObjectItemCaseSensitive(entry, "error");
    if (cJSON_IsString(want)) {
        if (st != QWENC_OK) {
            printf("FAIL %s: expected text, got error: %s\n", label, err);
            return 0;
        }
        if (strcmp(got, want->valuestring) != 0) {
            printf("FAIL %s: rendering differs from transformers\n", label);
            show_diff(got, want->valuestring);
            return 0;
        }
        return 1;
    }
    if (!cJSON_IsString(werr)) {
        printf("FAIL %s: expected.json entry has neither output nor error\n", label);
        return 0;
    }
    if (st == QWENC_OK) {
        printf("FAIL %s: transformers raises (%s) but qwenc rendered %zu bytes\n", label, werr->valuestring, strlen(got));
        return 0;
    }
    /* raise_exception(msg) is a TemplateError with msg: the message must come through */
    const char *te = "TemplateError: ";
    if (!strncmp(werr->valuestring, te, strlen(te))) {
        const char *msg = werr->valuestring + strlen(te);
        if (!strstr(err, "raise_exception: ") || !strstr(err, msg)) {
            printf("FAIL %s: expected raise_exception '%s', got: %s\n", label, msg, err);
            return 0;
        }
    }
    return 1;
}

static void run_cases(const char *dir, const cJSON *root) {
    const cJSON *templates = cJSON_GetObjectItemCaseSensitive(root, "templates");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    int total = 0, ok = 0, raising = 0;
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cases) {
        const char *tname = cJSON_GetObjectItemCaseSensitive(cs, "template")->valuestring;
        const char *cname = cJSON_GetObjectItemCaseSensitive(cs, "conversation")->valuestring;
        int agp = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cs, "add_generation_prompt"));
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(cs, "enable_thinking");
        int think = cJSON_IsBool(th) ? cJSON_IsTrue(th) : -1;
        const cJSON *tinfo = cJSON_GetObjectItemCaseSensitive(templates, tname);
        const cJSON *bos = cJSON_GetObjectItemCaseSensitive(tinfo, "bos_token");
        const cJSON *eos = cJSON_GetObjectItemCaseSensitive(tinfo, "eos_token");
        char conv_file[256];
        snprintf(conv_file, sizeof(conv_file), "%s.json", cname);
        char *tpl = slurp(dir, "", cJSON_GetObjectItemCaseSensitive(tinfo, "file")->valuestring);
        char *req = slurp(dir, "conversations/", conv_file);
        if (!tpl || !req) {
            free(tpl);
            free(req);
            continue;
        }
        char *out = NULL, err[512] = "";
        qwenc_status st = qwenc_chat_render(tpl, req, agp, think, cJSON_IsString(bos) ? bos->valuestring : NULL,
                                            cJSON_IsString(eos) ? eos->valuestring : NULL, &out, err, sizeof(err));
        char label[512];
        snprintf(label, sizeof(label), "%s / %s / add_generation_prompt=%d enable_thinking=%d", tname, cname, agp, think);
        int good = check_entry(label, cs, st, out, err);
        total++;
        ok += good;
        raising += cJSON_GetObjectItemCaseSensitive(cs, "error") != NULL;
        if (good) n_pass++;
        else n_fail++;
        free(out);
        free(tpl);
        free(req);
    }
    printf("chat templates: %d of %d (template x conversation x flags) cases identical to transformers "
           "(%d of them raise in transformers and in qwenc)\n", ok, total, raising);
}

static void run_features(const char *dir, const cJSON *root) {
    char *feats = slurp(dir, "", "features.json");
    if (!feats) return;
    cJSON *fj = cJSON_Parse(feats);
    const cJSON *expected = cJSON_GetObjectItemCaseSensitive(root, "features");
    int total = 0, ok = 0;
    const cJSON *f, *e;
    cJSON_ArrayForEach(f, fj) {
        const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
        const char *tpl = cJSON_GetObjectItemCaseSensitive(f, "template")->valuestring;
        const cJSON *entry = NULL;
        cJSON_ArrayForEach(e, expected) {
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring, name)) entry = e;
        }
        if (!entry) {
            printf("FAIL feature %s: not in expected.json (rerun tests/gen/make_template_cases.py)\n", name);
            n_fail++;
            continue;
        }
        const char *req = cJSON_GetObjectItemCaseSensitive(entry, "request")->valuestring;
        char *out = NULL, err[512] = "";
        qwenc_status st = qwenc_chat_render(tpl, req, 0, -1, NULL, NULL, &out, err, sizeof(err));
        char label[256];
        snprintf(label, sizeof(label), "feature %s", name);
        int good;
        if (strstr(req, "\\u0000")) {
            /* text with a NUL character cannot come back as a C string: qwenc refuses it instead of truncating */
            good = st == QWENC_ERR_UNSUPPORTED && strstr(err, "NUL");
            if (!good) printf("FAIL %s: expected the NUL-character error, got status %d '%s'\n", label, st, err);
        } else {
            good = check_entry(label, entry, st, out, err);
        }
        total++;
        ok += good;
        if (good) n_pass++;
        else n_fail++;
        free(out);
    }
    printf("jinja features: %d of %d identical to transformers\n", ok, total);
    cJSON_Delete(fj);
    free(feats);
}

/* Render tpl for a request; returns the status, fills out (or "") and err. */
static qwenc_status render(const char *tpl, const char *req, const char *bos, char *out, size_t outlen, char *err) {
    char *o = NULL;
    err[0] = 0;
    qwenc_status st = qwenc_chat_render(tpl, req, 1, -1, bos, "<eos>", &o, err, 512);
    snprintf(out, outlen, "%s", o ? o : "");
    free(o);
    return st;
}

/* Values that recurse: a namespace holding itself prints as Python prints it (the inner dict as {...}, what
 * Jinja2 3.1 gives); a list or dict 50,000 levels deep (built in a loop) is a RecursionError naming the template
 * line when printed, compared, sorted, deduplicated, searched or serialized, not a stack overflow. */
static void run_value_limits(const char *req) {
    char out[1024], err[512];
    qwenc_status st = render("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "<Namespace {'a': <Namespace {...}>}>"), "namespace holding itself: %d '%s' %s",
          st, out, err);
    st = render("{% set ns = namespace(a=1) %}{% set ns.a = [ns, {'k': ns}] %}{{ ns }}|{{ ns.a }}", req, NULL, out,
                sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "<Namespace {'a': [<Namespace {...}>, {'k': <Namespace {...}>}]}>|"
                                         "[<Namespace {'a': [...]}>, {'k': <Namespace {'a': [...]}>}]"),
          "namespace in its own list: %d '%s' %s", st, out, err);
    const char *build = "{% set ns = namespace(x=1, y=1, d=1) %}\n{% for i in range(50000) %}"
                        "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% set ns.d = {'k': ns.d} %}{% endfor %}\n";
    static const struct {
        const char *use, *doing;
    } deep[] = {
        {"{{ ns.x }}", "repr"},
        {"{{ ns.d }}", "repr"},
        {"{{ ns.x | string }}", "repr"},
        {"{{ ns.x == ns.y }}", "comparison"},
        {"{{ ns.d != {'k': ns.d} }}", "comparison"},
        {"{{ [ns.x, ns.y] | unique | list }}", "comparison"},
        {"{{ [ns.x, ns.y] | sort }}", "comparison"},
        {"{{ ns.x < ns.y }}", "comparison"},
        {"{{ ns.x in [ns.y] }}", "comparison"},
        {"{{ ns.x | tojson }}", "JSON"},
    };
    char tpl[1024];
    for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) {
        snprintf(tpl, sizeof(tpl), "%s%s", build, deep[i].use);
        st = render(tpl, req, NULL, out, sizeof(out), err);
        CHECK(st == QWENC_ERR_ARG && strstr(err, "chat template line 3") && strstr(err, "RecursionError") &&
                  strstr(err, deep[i].doing),
              "50,000-deep value, %s: status %d, '%s'", deep[i].use, st, err);
    }
    /* identity: the same deep list equals itself without a look inside, as in Python */
    snprintf(tpl, sizeof(tpl), "%s{{ ns.x == ns.x }} {{ [ns.x] == [ns.x] }}", build);
    st = render(tpl, req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "True True"), "deep list == itself: %d '%s' %s", st, out, err);
    /* the request is read with the same limit */
    size_t k = 0;
    char *deep_req = malloc(4000);
    k += (size_t)sprintf(deep_req, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"x\": ");
    for (int i = 0; i < 1000; i++) deep_req[k++] = '[';
    for (int i = 0; i < 1000; i++) deep_req[k++] = ']';
    sprintf(deep_req + k, "}]}");
    st = render("{{ messages }}", deep_req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, "request JSON") && strstr(err, "nested too deeply"),
          "1000-deep request: status %d, '%s'", st, err);
    free(deep_req);
    /* big inputs cost linear work, not quadratic (which the step bound would refuse): a request object of
     * 100,000 members, unique over 20,000 items, tojson(sort_keys) over 100,000 keys */
    size_t big_cap = 100 + 100000 * 32;
    char *big = malloc(big_cap), *o = NULL;
    k = (size_t)sprintf(big, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": {\"x\": {");
    for (int i = 0; i < 100000; i++) k += (size_t)sprintf(big + k, "%s\"key%d\": %d", i ? ", " : "", 99999 - i, i);
    sprintf(big + k, "}}}");
    st = qwenc_chat_render("{{ x | length }} {{ x['key5'] }} {{ range(20000) | unique | list | length }} "
                           "{{ (x | tojson(sort_keys=true))[:28] }}",
                           big, 1, -1, NULL, NULL, &o, err, sizeof(err));
    CHECK(st == QWENC_OK && o && !strcmp(o, "100000 99994 20000 {\"key0\": 99999, \"key1\": 9999"),
          "100,000 keys: status %d, '%s' %s", st, o ? o : "", err);
    free(o);
    free(big);
    /* a template that would run for hours stops with an error naming its line */
    st = render("{% set r = range(100000) | list %}{% for i in range(100000) %}\n{% if -1 in r %}x{% endif %}{% endfor %}",
                req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "line 2") && strstr(err, "runs too long"),
          "10^10 iterations: status %d, '%s'", st, err);
    /* so does one that scans a long string (or walks a long list) in a loop: each scan costs its length */
    static const char *const scans[] = {
        "{% set s = 'a' * 10000000 %}{% for i in range(100000) %}\n{% if 'b' in s %}{% endif %}{% endfor %}",
        "{% set s = ' ' * 10000000 %}{% for i in range(100000) %}\n{{ s.strip() }}{% endfor %}",
        "{% set s = 'ab' * 5000000 %}{% for i in range(100000) %}\n{{ s.count('ab') }}{% endfor %}",
        "{% set s = 'a' * 10000000 %}{% for i in range(100000) %}\n{{ s[5000000] }}{% endfor %}",
        "{% set s = [''] * 1000000 %}{% for i in range(100000) %}\n{{ s | join }}{% endfor %}",
        "{% set s = [0] * 1000000 %}{% for i in range(100000) %}\n{{ s | sum }}{% endfor %}",
    };
    for (size_t i = 0; i < sizeof(scans) / sizeof(scans[0]); i++) {
        st = render(scans[i], req, NULL, out, sizeof(out), err);
        CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "line 2") && strstr(err, "runs too long"),
              "long scans in a loop (%zu): status %d, '%s'", i, st, err);
    }
    /* a substring search is linear: 'a' * 5e6 in 'a' * 1e7 is true at once (a naive search: 2.5e13 steps) */
    st = render("{{ ('a' * 5000000) in ('a' * 10000000) }} {{ ('a' * 10000000).find('a' * 4999999 ~ 'b') }}", req, NULL,
                out, sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "True -1"), "long substring search: status %d, '%s' %s", st, out, err);
}

static void run_errors(void) {
    char out[1024], err[512];
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    qwenc_status st;

    st = render("line one\n{% for m in messages %}\n{{ m.content }}\n{% include 'other.jinja' %}\n{% endfor %}", req, NULL,
                out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "line 4") && strstr(err, "include"),
          "unsupported tag: status %d, message '%s'", st, err);

    st = render("a\n\n{{ messages | frobnicate }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "line 3") && strstr(err, "frobnicate"),
          "unknown filter: status %d, message '%s'", st, err);

    st = render("{% if true %}\n{{ 'x' is frobnicated }}{% endif %}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "line 2") && strstr(err, "frobnicated"),
          "unknown test: status %d, message '%s'", st, err);

    st = render("{{ messages|groupby('role') }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "line 1") && strstr(err, "groupby"),
          "Jinja filter outside the subset: status %d, message '%s'", st, err);

    st = render("{% frob %}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "unknown tag 'frob'"), "unknown tag: status %d, message '%s'", st, err);

    /* |int of a float beyond 64 bits (Python makes a big integer; the fuzzer found the cast's undefined behaviour) */
    st = render("a\n{{ 1e32|int }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "line 2") && strstr(err, "OverflowError"), "1e32|int: status %d, '%s'", st, err);
    st = render("{{ '-1e19'|int }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "OverflowError"), "'-1e19'|int: status %d, '%s'", st, err);
    st = render("{{ 'nan'|float|int(7) }}|{{ '-inf'|int(8) }}|{{ -2.9|int }}|{{ '9.2e18'|int }}", req, NULL, out,
                sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "7|8|-2|9200000000000000000"), "NaN, inf|int: the default; others truncate: %d '%s' %s",
          st, out, err);

    st = render("{{ 'abc'.zfill(5) }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "zfill"), "string method outside the subset: status %d, '%s'", st, err);

    st = render("x\n{%- if messages|length > 0 %}\n  {{- raise_exception('Only ' ~ 2 ~ ' roles!') }}\n{%- endif %}", req,
                NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "line 3") && strstr(err, "raise_exception: Only 2 roles!"),
          "raise_exception: status %d, message '%s'", st, err);

    st = render("{% if true %}never closed", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, "line 1") && strstr(err, "endif"), "unclosed if: status %d, '%s'", st, err);

    st = render("{{ messages[0].content.nosuch() }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "nosuch"), "undefined call: status %d, '%s'", st, err);

    st = render("{{ messages }}", "{\"messages\": [1, 2,]}", NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, "request JSON"), "bad request JSON: status %d, '%s'", st, err);

    st = render("{{ messages }}", "{\"prompt\": \"x\"}", NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "messages"), "request without messages: status %d, '%s'", st, err);

    st = render("{{ messages }}", "{\"messages\": []}", NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "empty"), "empty messages (apply_chat_template refuses): status %d, '%s'", st, err);

    st = render("{{ messages }}", "{\"messages\": [{\"role\": \"user\"}], \"chat_template_kwargs\": {\"tools\": []}}",
                NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "tools"), "chat_template_kwargs setting tools: status %d, '%s'", st, err);

    st = render("{{ '\\u0000' }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "NUL"), "NUL in the output: status %d, '%s'", st, err);

    st = render("\xff{{ 1 }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, "UTF-8"), "invalid UTF-8 template: status %d, '%s'", st, err);

    /* bos_token NULL is undefined (as for a tokenizer without one); "" is defined */
    st = render("{{ bos_token is defined }}|{{ bos_token }}|{{ eos_token }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "False||<eos>"), "bos_token NULL: '%s' %s", out, err);
    st = render("{{ bos_token is defined }}|{{ bos_token }}", req, "<s>", out, sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, "True|<s>"), "bos_token set: '%s' %s", out, err);

    /* enable_thinking: the argument overrides chat_template_kwargs, -1 leaves it */
    const char *tk = "{{ enable_thinking is defined }}{{ enable_thinking }}";
    const char *req_kw = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                         "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
    char *o = NULL;
    st = qwenc_chat_render(tk, req_kw, 0, 1, NULL, NULL, &o, err, sizeof(err));
    CHECK(st == QWENC_OK && o && !strcmp(o, "TrueTrue"), "enable_thinking=1 over kwargs: '%s'", o ? o : err);
    free(o);
    st = qwenc_chat_render(tk, req_kw, 0, -1, NULL, NULL, &o, err, sizeof(err));
    CHECK(st == QWENC_OK && o && !strcmp(o, "TrueFalse"), "enable_thinking=-1 keeps kwargs: '%s'", o ? o : err);
    free(o);
    st = qwenc_chat_render(tk, req, 0, -1, NULL, NULL, &o, err, sizeof(err));
    CHECK(st == QWENC_OK && o && !strcmp(o, "False"), "enable_thinking unset: '%s'", o ? o : err);
    free(o);

    /* strftime_now reads the local clock like Python's datetime.now().strftime */
    char today[64];
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    strftime(today, sizeof(today), "%d %b %Y", &tmv);
    st = render("{{ strftime_now('%d %b %Y') }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_OK && !strcmp(out, today), "strftime_now: '%s' vs '%s' %s", out, today, err);

    /* deep nesting is an error, not a crash */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof(deep) - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof(deep) - k, " }}");
    st = render(deep, req, NULL, out, sizeof(out), err);
    CHECK(st != QWENC_OK && strstr(err, "nested"), "deep nesting: status %d, '%s'", st, err);
    char *chain = malloc(300000), *nest = malloc(300000), *nots = malloc(300000);
    k = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 100000; i++) k += (size_t)sprintf(chain + k, "+1");
    sprintf(chain + k, " }}");
    k = 0;
    for (int i = 0; i < 20000; i++) k += (size_t)sprintf(nest + k, "{%% if true %%}");
    nest[k] = 0;
    k = (size_t)sprintf(nots, "{{ ");
    for (int i = 0; i < 50000; i++) k += (size_t)sprintf(nots + k, "not ");
    sprintf(nots + k, "1 }}");
    const char *deep_ones[] = {chain, nest, nots};
    for (int i = 0; i < 3; i++) {
        st = render(deep_ones[i], req, NULL, out, sizeof(out), err);
        CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "too deeply"), "deep template %d: status %d, '%s'", i, st, err);
    }
    free(chain);
    free(nest);
    free(nots);
    st = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", req, NULL, out, sizeof(out), err);
    CHECK(st == QWENC_ERR_ARG && strstr(err, "Recursion"), "runaway macro recursion: status %d, '%s'", st, err);
    /* 99 macro calls, each inside 190 nested loops: 19,000 levels of C recursion (a stack overflow before) */
    char *mac = malloc(20000);
    k = (size_t)sprintf(mac, "{%% macro f(k) %%}");
    for (int i = 0; i < 190; i++) k += (size_t)sprintf(mac + k, "{%% for i in [1] %%}");
    k += (size_t)sprintf(mac + k, "{{ f(k + 1) if k < 99 else k }}");
    for (int i = 0; i < 190; i++) k += (size_t)sprintf(mac + k, "{%% endfor %%}");
    sprintf(mac + k, "{%% endmacro %%}{{ f(0) }}");
    st = render(mac, req, NULL, out, sizeof(out), err);
    CHECK(st != QWENC_OK && strstr(err, "nested") && strstr(err, "1000"), "macro calls in nested loops: status %d, '%s'", st,
          err);
    free(mac);

    st = qwenc_chat_render(NULL, req, 0, -1, NULL, NULL, &o, err, sizeof(err));
    CHECK(st == QWENC_ERR_ARG && o == NULL, "NULL template: status %d", st);
    run_value_limits(req);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/templates";
    char *exp = slurp(dir, "", "expected.json");
    cJSON *root = exp ? cJSON_Parse(exp) : NULL;
    if (!root) {
        printf("FAIL cannot parse %s/expected.json\n", dir);
        n_fail++;
    } else {
        run_cases(dir, root);
        run_features(dir, root);
    }
    run_errors();
    cJSON_Delete(root);
    free(exp);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
