/*
 * cli.h - what the command-line tool's files share: the parsed options and small helpers.
 * The tool uses the library only through include/qwenc.h.
 */
#ifndef QWENC_CLI_H
#define QWENC_CLI_H

#include "qwenc.h"

typedef struct {
    const char *model, *tokenizer, *tokens, *out, *prompt, *file, *system, *request, *positional;
    const char *type; /* quantize, synth: -t/--type, the GGUF tensor type */
    const char *preset, *arch; /* synth */
    int layers, experts, hidden, vocab, ngram_base; /* synth (0: the preset's) */
    const char *stop[16];
    int n_stop;
    int batch, ctx, n_predict, chat, no_think, add_gen, no_parse_special, show_special, seed_set;
    int threads, reps, json;  /* -t (0: one per core), -r (bench; 0: unset), --json (bench) */
    const char *kernels;      /* --kernels (NULL: the best for this CPU) */
    qwenc_sampler_params sp;
} cli_opts;

double cli_now_s(void);
/* Load a model (with the options' threads and kernels) / tokenizer, printing the error on stderr;
 * NULL on failure. */
qwenc_model *cli_load_model(const cli_opts *o);
/* The tokenizer of --tokenizer DIR, else of the model directory (for a .gguf: the directory holding it). */
qwenc_tokenizer *cli_load_tokenizer(const cli_opts *o);
/* A whole file ("-": stdin) as a NUL-terminated buffer; NULL (message printed) on failure. */
char *cli_slurp(const char *path, size_t *len);

/* The tokenizer's BOS string for chat templates; NULL (undefined in the template) when it has none. */
const char *cli_bos_token(const qwenc_tokenizer *tok);

int cmd_run(cli_opts *o);
int cmd_chat(cli_opts *o);
int cmd_bench(cli_opts *o);
int cmd_perplexity(cli_opts *o);
int cmd_quantize(cli_opts *o);
int cmd_synth(cli_opts *o);

#endif
