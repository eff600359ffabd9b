/*
 * fuzz_tokenizer_json.c - fuzz target: loading a tokenizer.json (text/tokenizer.c: model, vocabulary,
 * merges, added tokens, normalizer, pre-tokenizer, post-processor, decoder; regexes compiled by PCRE2).
 *
 * Properties: the text is either refused with a message naming the file, or the tokenizer passes
 * fuzz_tok.h's checks (ids in range, decode and streaming decode agree, valid UTF-8 out).
 */
#include "fuzz_tok.h"

#define NAME "fuzz/tokenizer.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = fz_strndup(data, size), err[1024] = "";
    qwenc_tokenizer *tok = NULL;
    qwenc_status st = qw_tok_from_json(json, size, NAME, NULL, &tok, err, sizeof(err));
    free(json);
    fz_note("tokenizer", st, err);
    if (st) {
        FZ_CHECK_ERR(st, err, NAME);
        FZ_CHECK(!tok, "a tokenizer came back with an error");
        return 0;
    }
    fz_tok_exercise(tok);
    qwenc_tokenizer_free(tok);
    return 0;
}
