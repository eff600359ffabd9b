/* simple.c - the qwenc library in a few lines: open a model and a session, tokenize a prompt, and stream
 * a greedy continuation through a callback.   usage: simple MODEL_DIR_OR_GGUF PROMPT [N_TOKENS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwenc.h"

static int print_text(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    return 0; /* non-zero would stop the generation */
}

int main(int argc, char **argv) {
    if (argc < 3) return fprintf(stderr, "usage: %s MODEL PROMPT [N_TOKENS]\n", argv[0]), 2;
    char err[512];
    qwenc_model *model = NULL;
    qwenc_tokenizer *tok = NULL;
    qwenc_session *session = NULL;
    qwenc_sampler *sampler = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    qwenc_gen_result res;
    qwenc_sampler_params sp = qwenc_sampler_default_params();
    sp.temperature = 0; /* greedy: the same text every run */
    qwenc_gen_params gp = {.n_predict = argc > 3 ? atoi(argv[3]) : 32};
    qwenc_status st = qwenc_model_load(argv[1], &model, err, sizeof(err));
    if (!st) st = qwenc_tokenizer_load_model(argv[1], &tok, err, sizeof(err));
    if (!st) st = qwenc_session_init(model, NULL, &session, err, sizeof(err));
    if (!st) st = qwenc_sampler_init(&sp, qwenc_model_n_vocab(model), &sampler, err, sizeof(err));
    if (!st) st = qwenc_tokenize(tok, argv[2], strlen(argv[2]), 1, 1, &ids, &n_ids, err, sizeof(err));
    if (!st) gp.n_eos = qwenc_tokenizer_eos(tok, &gp.eos); /* stop at the model's end-of-sequence ids */
    if (!st) st = qwenc_generate(session, tok, sampler, ids, n_ids, &gp, print_text, NULL, &res, err, sizeof(err));
    if (st) fprintf(stderr, "simple: %s\n", err);
    else fprintf(stderr, "\n%d prompt tokens, %d generated (%s)\n", res.n_prompt, res.n_gen, qwenc_stop_reason_str(res.reason));
    free(ids);
    qwenc_sampler_free(sampler);
    qwenc_session_free(session);
    qwenc_tokenizer_free(tok);
    qwenc_model_free(model);
    return st ? 1 : 0;
}
