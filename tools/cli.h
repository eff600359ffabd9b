/*
 * cli.h - what the command-line tool's files share: the commands, the parsed options and small helpers.
 * The tool uses the library only through include/qwenc.h.
 */
#ifndef QWENC_CLI_H
#define QWENC_CLI_H

#include <limits.h>
#include <signal.h>

#include "qwenc.h"

#define CLI_UNSET INT_MIN /* an integer option not given */
#define CLI_MAX_LIST 16   /* values of a bench list (-p 16,32) */
/* The most a prompt, text or request file may hold: read whole into memory and tokenized. */
#define CLI_MAX_INPUT ((size_t)256 << 20)

typedef struct cli_opts cli_opts;

typedef struct {
    const char *name;
    unsigned bit; /* the command's bit in the option table's masks (opts.c) */
    int (*fn)(cli_opts *);
    const char *synopsis, *about;
} cli_cmd;

struct cli_opts {
    const cli_cmd *cmd;
    const char *model, *tokenizer, *tokens, *out, *prompt, *file, *system, *request;
    const char *positional; /* tokenize TEXT, detokenize IDS */
    const char *pos[3];     /* the arguments that are not options, as given */
    int n_pos;
    const char *type;       /* quantize, synth: --type, the GGUF tensor type */
    const char *preset, *arch; /* synth */
    const char *synth;         /* info, logits, bench: --synth PRESET, a random model in memory instead of -m */
    int layers, experts, hidden, vocab, ngram_base; /* synth (0: the preset's) */
    int synth_mtp;            /* synth --mtp */
    const char *stop[16];
    int n_stop;
    int batch, ctx, n_predict, chat, no_think, add_gen, no_parse_special, show_special, seed_set;
    int draft;                /* --draft N: speculative decoding, drafts of up to N tokens (0: off) */
    int draft_src;            /* --draft-src: QWENC_DRAFT_SRC_* */
    int draft_sample;         /* --draft-sample: head drafts drawn and kept by the speculative-sampling rule */
    int no_mtp;               /* --no-mtp: leave the model's MTP draft head unloaded */
    int escape, no_display_prompt, context_shift;
    int threads, reps, json;  /* -t (0: one per core), -r (bench; 0: unset), --json (bench) */
    int bench_p[CLI_MAX_LIST], n_bench_p, bench_n[CLI_MAX_LIST], n_bench_n, bench_t[CLI_MAX_LIST], n_bench_t;
    int bench_np[CLI_MAX_LIST], n_bench_np; /* bench -np: sessions decoding together */
    int bench_draft[CLI_MAX_LIST], n_bench_draft; /* bench --draft: tokens drafted per step */
    int bench_depth;          /* bench -d: tokens of context fed before each test (untimed) */
    int profile;              /* --profile (bench): time every op of the timed runs */
    const char *backend;      /* --backend (NULL: auto) */
    const char *gpus;         /* --gpus N|LIST (NULL: one GPU) */
    const char *split;        /* --split expert|layer (NULL: expert) */
    const char *kernels;      /* --kernels (NULL: the best for this CPU) */
    int f32_act;              /* --f32-act: quantized weights meet f32 activations */
    const char *quant;        /* --quant TYPE: quantize the weights at load (NULL: the file's types) */
    /* serve (CLI_UNSET: the server's default) */
    const char *host, *api_key, *api_key_file, *alias;
    int port, parallel, cache_ram, max_queue, timeout, max_body, quiet;
    qwenc_sampler_params sp;
};

/* Parse argv (opts.c). Returns -1 when o->cmd should run, else the exit status (help, version, or an error
 * already printed). */
int cli_parse(int argc, char **argv, cli_opts *o);
void cli_usage(FILE *f);
void cli_usage_command(FILE *f, const cli_cmd *c);
void cli_print_version(FILE *f);
/* Escapes as llama.cpp's -e reads them (\n \r \t \\ \' \" \xNN ...), in place; 0 (message printed, naming opt)
 * for \x00. */
int cli_unescape(char *s, const char *opt);

double cli_now_s(void);

/*
 * SIGINT and SIGTERM. cli_signals(CLI_SIG_STOP): the first signal sets cli_stop_signal, for the running job
 * to stop at its next check; a second one ends the process as the signal would. CLI_SIG_KEEP: every signal
 * only sets cli_stop_signal (chat decides what each means). CLI_SIG_DEFAULT: the default actions again.
 * The handlers interrupt blocking reads (no SA_RESTART).
 */
enum { CLI_SIG_DEFAULT, CLI_SIG_STOP, CLI_SIG_KEEP };
extern volatile sig_atomic_t cli_stop_signal; /* the signal number, 0 if none */
void cli_signals(int mode);

/* Progress of writing or quantizing (tools/quantize.c): a bar redrawn on a terminal, else a line per tensor. */
typedef struct {
    int tty;
    double t0, last;
    int last_tensor;
    uint64_t min_bytes; /* draw nothing for a job of fewer bytes (quantizing a small model at load) */
    int shown;          /* something was drawn */
} cli_progress;
/* A qwenc_gguf_params / qwenc_model_params progress callback; user is a cli_progress. Cancels (returns 1)
 * once cli_stop_signal is set. */
int cli_show_progress(const char *tensor, const char *type, int i, int n, uint64_t done, uint64_t total, void *user);
/* Load a model (with the options' threads and kernels) / tokenizer, printing the error on stderr;
 * NULL on failure. */
qwenc_model *cli_load_model(const cli_opts *o);
/* The synthetic model's parameters of the options: preset (synth's --preset or --synth), --arch, --layers,
 * --experts, --hidden, --vocab, --ngram-base, --mtp, --seed. */
qwenc_synth_params cli_synth_params(const cli_opts *o, const char *preset);
/* The tokenizer of --tokenizer DIR|FILE.gguf, else the model's (a .gguf's own, else tokenizer.json beside it). */
qwenc_tokenizer *cli_load_tokenizer(const cli_opts *o);
/* A whole file ("-": stdin; pipes and terminals too) as a NUL-terminated buffer of *len bytes (which may hold
 * NUL bytes). NULL (message printed, naming the file) if it cannot be read, is a directory or holds more
 * than CLI_MAX_INPUT bytes (a regular file is refused from its size, a stream once it has sent that much). */
char *cli_slurp(const char *path, size_t *len);

/* The tokenizer's BOS string for chat templates; NULL (undefined in the template) when it has none. */
const char *cli_bos_token(const qwenc_tokenizer *tok);

int cmd_run(cli_opts *o);
int cmd_chat(cli_opts *o);
int cmd_info(cli_opts *o);
int cmd_logits(cli_opts *o);
int cmd_tokenize(cli_opts *o);
int cmd_detokenize(cli_opts *o);
int cmd_chat_template(cli_opts *o);
int cmd_bench(cli_opts *o);
int cmd_perplexity(cli_opts *o);
int cmd_quantize(cli_opts *o);
int cmd_synth(cli_opts *o);
int cmd_serve(cli_opts *o);

#endif
