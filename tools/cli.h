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
    int profile;              /* --profile (bench): time every op of the timed runs */
    const char *kernels;      /* --kernels (NULL: the best for this CPU) */
    int f32_act;              /* --f32-act: quantized weights meet f32 activations */
    const char *quant;        /* --quant TYPE: quantize the weights at load (NULL: the file's types) */
    qwenc_sampler_params sp;
} cli_opts;

double cli_now_s(void);

/* Progress of writing or quantizing (tools/quantize.c): a bar redrawn on a terminal, else a line per tensor. */
typedef struct {
    int tty;
    double t0, last;
    int last_tensor;
    uint64_t min_bytes; /* draw nothing for a job of fewer bytes (quantizing a small model at load) */
    int shown;          /* something was drawn */
} cli_progress;
/* A qwenc_gguf_params / qwenc_model_params progress callback; user is a cli_progress. Never cancels. */
int cli_show_progress(const char *tensor, const char *type, int i, int n, uint64_t done, uint64_t total, void *user);
/* Load a model (with the options' threads and kernels) / tokenizer, printing the error on stderr;
 * NULL on failure. */
qwenc_model *cli_load_model(const cli_opts *o);
/* The tokenizer of --tokenizer DIR|FILE.gguf, else the model's (a .gguf's own, else tokenizer.json beside it). */
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
