/* simple.c - the qwenc library in a few lines: open a model and a session, tokenize a prompt, and stream a
 * greedy continuation through a callback. README.md shows this file from its first #include on, and
 * tests/cli_example.sh checks that the two agree.   usage: simple [MODEL] [PROMPT] [N_TOKENS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "qwenc.h"

static int print_text(const char *text, size_t len, void *user) { /* the text, as it is generated */
    (void)user;
    return fwrite(text, 1, len, stdout) != len; /* non-zero stops the generation */
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/tiny-flash", *prompt = argc > 2 ? argv[2] : "In the beginning";
    qwenc_model *model = NULL; qwenc_tokenizer *tok = NULL; qwenc_session *session = NULL;
    qwenc_sampler *sampler = NULL; int32_t *ids = NULL; int n_ids = 0; char err[512];
    qwenc_sampler_params sp = qwenc_sampler_default_params();
    sp.temperature = 0; /* greedy: the same text every time */
    qwenc_gen_params gp = {.n_predict = argc > 3 ? atoi(argv[3]) : 32};
    qwenc_status st = qwenc_model_load(path, &model, err, sizeof(err));
    if (!st) st = qwenc_tokenizer_load_model(path, &tok, err, sizeof(err));
    if (!st) st = qwenc_session_init(model, NULL, &session, err, sizeof(err));
    if (!st) st = qwenc_sampler_init(&sp, qwenc_model_n_vocab(model), &sampler, err, sizeof(err));
    if (!st) st = qwenc_tokenize(tok, prompt, strlen(prompt), 1, 1, &ids, &n_ids, err, sizeof(err));
    if (!st) gp.n_eos = qwenc_tokenizer_eos(tok, &gp.eos); /* stop at the end-of-sequence ids */
    if (!st) st = qwenc_generate(session, tok, sampler, ids, n_ids, &gp, print_text, NULL, NULL, err, sizeof(err));
    if (st) fprintf(stderr, "simple: %s\n", err); /* names the file, tensor or field at fault */
    free(ids); qwenc_sampler_free(sampler); qwenc_session_free(session);
    qwenc_tokenizer_free(tok); qwenc_model_free(model);
    return st != QWENC_OK;
}
