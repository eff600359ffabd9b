/*
 * fuzz_chat_request.c - fuzz target: a chat request body (the JSON reader of text/tmpl_value.c and what
 * the real templates of tests/templates do with whatever messages, tools and chat_template_kwargs it holds).
 *
 * Input: byte 0 picks the template (bits 0-2), add_generation_prompt (bit 3) and enable_thinking (bits 4-5:
 * -1, 0, 1); the rest is the request JSON. Properties: as fuzz_template.c's (output valid UTF-8: the reader
 * refuses invalid UTF-8 and the templates are valid); an error about the request
 * names it ("request JSON") unless the template raised (its line is named then) or rendered a NUL.
 */
#include "fuzz_util.h"

static const struct {
    const char *file, *bos, *eos;
} TEMPLATES[] = {
    {"tests/templates/qwen3.jinja", NULL, "<|im_end|>"},
    {"tests/templates/qwen3.5-4b.jinja", NULL, "<|im_end|>"},
    {"tests/templates/qwen3-coder.jinja", NULL, "<|im_end|>"},
    {"tests/templates/llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"},
    {"tests/templates/llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>"},
    {"tests/templates/chatml.jinja", NULL, "<|im_end|>"},
    {"tests/templates/qwen3-0.6b.jinja", NULL, "<|im_end|>"},
    {"models/tiny-flash/tokenizer_config.json", NULL, "<|im_end|>"}, /* replaced by its chat_template below */
};
#define N_TEMPLATES ((int)(sizeof(TEMPLATES) / sizeof(TEMPLATES[0])))

static char *src[N_TEMPLATES];

static void load_all(void) {
    for (int i = 0; i < N_TEMPLATES - 1; i++)
        if (!(src[i] = fz_read(TEMPLATES[i].file, NULL))) abort();
    /* the bundled model's template, from its tokenizer */
    qwenc_tokenizer *tok = NULL;
    char err[1024];
    if (qwenc_tokenizer_load(fz_path("models/tiny-flash"), &tok, err, sizeof(err))) {
        fprintf(stderr, "fuzz_chat_request: %s\n", err);
        abort();
    }
    const char *t = qwenc_tokenizer_chat_template(tok);
    src[N_TEMPLATES - 1] = strdup(t ? t : "{% for m in messages %}{{ m.content }}{% endfor %}");
    qwenc_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!src[0]) load_all();
    if (size < 1) return 0;
    int k = data[0] & 7, think = (data[0] >> 4) & 3;
    char *req = fz_strndup(data + 1, size - 1), *out = NULL, err[1024] = "";
    qwenc_status st = qwenc_chat_render(src[k], req, (data[0] >> 3) & 1, think == 3 ? 1 : think - 1, TEMPLATES[k].bos,
                                        TEMPLATES[k].eos, &out, err, sizeof(err));
    fz_note("render", st, err);
    if (st) {
        FZ_CHECK(st >= QWENC_ERR_FORMAT && st <= QWENC_ERR_NOMEM && !out, "status %d, '%s'", (int)st, err);
        FZ_CHECK(strstr(err, "request JSON") || strstr(err, "chat template") || st == QWENC_ERR_NOMEM,
                 "the message names neither the request nor a template line: '%s'", err);
    } else {
        FZ_CHECK(out, "no output");
        FZ_CHECK(fz_utf8_valid(out, strlen(out)), "rendered invalid UTF-8");
        free(out);
    }
    free(req);
    return 0;
}
