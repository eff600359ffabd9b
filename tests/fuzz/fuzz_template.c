/*
 * fuzz_template.c - fuzz target: a chat template's source (text/tmpl_parse.c, tmpl_eval.c, tmpl_filters.c,
 * tmpl_value.c), rendered for a fixed request (tests/templates/conversations/multi_tool_responses.json:
 * messages with tool calls and tool results, a tools list, non-ASCII text).
 *
 * Input: byte 0 sets add_generation_prompt (bit 0) and enable_thinking (bits 1-2: -1, 0, 1); the rest is
 * the template. Properties: the render succeeds with NUL-free output (valid UTF-8 when the template is), or fails
 * with a known status and a message; it never recurses without bound, aborts, or runs for more than a few seconds.
 */
#include "fuzz_util.h"

static char *request;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!request && !(request = fz_read("tests/templates/conversations/multi_tool_responses.json", NULL))) abort();
    if (size < 1) return 0;
    char *src = fz_strndup(data + 1, size - 1), *out = NULL, err[1024] = "";
    int think = (data[0] >> 1) & 3;
    qwenc_status st = qwenc_chat_render(src, request, data[0] & 1, think == 3 ? 1 : think - 1, "<s>", "</s>", &out,
                                        err, sizeof(err));
    fz_note("render", st, err);
    if (st) {
        FZ_CHECK(st >= QWENC_ERR_FORMAT && st <= QWENC_ERR_NOMEM && err[0] && !out, "status %d, '%s'", (int)st, err);
    } else {
        FZ_CHECK(out, "no output");
        FZ_CHECK(!fz_utf8_valid(src, strlen(src)) || fz_utf8_valid(out, strlen(out)),
                 "a valid UTF-8 template rendered invalid UTF-8");
        free(out);
    }
    free(src);
    return 0;
}
