/*
 * opts.c - the command line: the commands, one table of options (which commands take each, its value, its
 * default), parsing argv into cli_opts, and `qwenc CMD --help` printed from that same table.
 *
 * Spellings follow llama.cpp where the meaning is the same (-m, -p, -f, -n, -c/--ctx-size, -b/--batch-size,
 * -t/--threads, -s/--seed, -sys/--system-prompt, -e/--escape, --temp, --top-k, ...), and every valued long
 * option also takes the form --flag=value. -t is the thread count everywhere; the tensor type of quantize
 * and synth is --type (or quantize's last argument, as llama-quantize takes it); the old `-t TYPE` still
 * works, with a notice. An option that another command takes but this one does not is an error naming both;
 * every value is parsed and range-checked here, before a model is loaded.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

enum {
    C_RUN = 1u << 0,
    C_CHAT = 1u << 1,
    C_INFO = 1u << 2,
    C_LOGITS = 1u << 3,
    C_TOKENIZE = 1u << 4,
    C_DETOKENIZE = 1u << 5,
    C_TEMPLATE = 1u << 6,
    C_BENCH = 1u << 7,
    C_PPL = 1u << 8,
    C_QUANTIZE = 1u << 9,
    C_SYNTH = 1u << 10,
    C_SERVE = 1u << 11,
    C_ALL = (1u << 12) - 1,
    C_GEN = C_RUN | C_CHAT,
    C_SAMPLE = C_GEN | C_SERVE, /* take sampling options */
    C_TOK = C_TOKENIZE | C_DETOKENIZE | C_TEMPLATE,
    C_LOAD = C_RUN | C_CHAT | C_INFO | C_LOGITS | C_BENCH | C_PPL | C_SERVE, /* load a model to run it */
    C_WRITE = C_QUANTIZE | C_SYNTH,
    C_SYNSRC = C_INFO | C_LOGITS | C_BENCH, /* take --synth PRESET instead of -m */
    C_GEOM = C_SYNTH | C_SYNSRC,            /* take synth's geometry options */
};

static const cli_cmd commands[] = {
    {"run", C_RUN, cmd_run, "-m MODEL (-p TEXT | -f FILE) [options]",
     "generate text from a prompt and stream it to stdout\n"
     "The prompt is printed first, as llama-cli does (--no-display-prompt: only the generated text);\n"
     "Ctrl-C stops the generation and prints the statistics."},
    {"chat", C_CHAT, cmd_chat, "-m MODEL [options]",
     "interactive multi-turn chat in the terminal, or over a pipe (a message per line)\n"
     "/reset starts over, /exit or Ctrl-D quits; Ctrl-C stops a reply, and at the prompt quits."},
    {"serve", C_SERVE, cmd_serve, "-m MODEL [--host ADDR] [--port N] [-np N] [options]",
     "an OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, ...\n"
     "Streaming, tool calls, reasoning, parallel slots and exact prefix reuse; see docs/SERVER.md.\n"
     "SIGINT or SIGTERM: no new connections, requests in flight get 10 s to finish\n"
     "(a second signal ends them at once, with an error)."},
    {"info", C_INFO, cmd_info, "-m MODEL [options]", "architecture, layer plan, parameters per component, dtypes"},
    {"logits", C_LOGITS, cmd_logits, "-m MODEL --tokens IDS -o FILE [options]",
     "write the logits of a token sequence (T x vocab float32 little-endian) to a file"},
    {"tokenize", C_TOKENIZE, cmd_tokenize, "-m MODEL (TEXT | -f FILE) [options]",
     "print the token ids of TEXT (or of the raw bytes of FILE), without BOS"},
    {"detokenize", C_DETOKENIZE, cmd_detokenize, "-m MODEL IDS",
     "print the text of comma-separated token ids (exactly its bytes, no newline added)"},
    {"chat-template", C_TEMPLATE, cmd_chat_template, "-m MODEL --request FILE.json [options]",
     "print the prompt the model's chat template renders for an OpenAI-style request body"},
    {"bench", C_BENCH, cmd_bench, "-m MODEL [options]",
     "prompt processing (pp) and generation (tg) speed, peak memory, the decode bandwidth bound\n"
     "As llama-bench: a row per test and thread count."},
    {"perplexity", C_PPL, cmd_perplexity, "-m MODEL -f FILE [options]",
     "perplexity of the model on a text, in chunks of -c tokens"},
    {"quantize", C_QUANTIZE, cmd_quantize,
     "-m MODEL -o OUT.gguf --type TYPE [options]\n"
     "       qwenc quantize -m MODEL -o OUT.gguf TYPE\n"
     "       qwenc quantize MODEL OUT.gguf TYPE",
     "write the model as the GGUF llama.cpp's converter and llama-quantize would write\n"
     "See docs/GGUF.md. OUT.gguf appears only when complete: it is written under a temporary name\n"
     "beside it and renamed at the end; Ctrl-C removes the temporary file."},
    {"synth", C_SYNTH, cmd_synth, "--preset NAME -o OUT.gguf --type TYPE [options]",
     "write a model with random weights at a released geometry as GGUF (no -m)"},
};
#define N_COMMANDS (int)(sizeof(commands) / sizeof(commands[0]))

typedef enum {
    O_HELP, O_VERSION, O_MODEL, O_TOKENIZER, O_THREADS, O_THREADS_LIST, O_BACKEND, O_GPUS, O_SPLIT, O_KERNELS, O_QUANT, O_F32ACT, O_CTX, O_BATCH,
    O_PROMPT, O_FILE, O_NPREDICT, O_CHAT, O_SYSTEM, O_NOTHINK, O_STOP, O_ESCAPE, O_NOESCAPE, O_NODISPLAY,
    O_SPECIAL, O_CTXSHIFT, O_DRAFT, O_DRAFT_SRC, O_DRAFT_SAMPLE, O_NO_MTP, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REPPEN, O_REPLASTN, O_PRESPEN, O_FREQPEN, O_SEED,
    O_TOKENS, O_OUT, O_NOPARSESPECIAL, O_REQUEST, O_ADDGEN, O_BENCH_P, O_BENCH_N, O_BENCH_NP, O_BENCH_DRAFT,
    O_BENCH_DEPTH, O_REPS, O_JSON, O_PROFILE,
    O_TYPE, O_PRESET, O_SYNTH_SRC, O_ARCH, O_LAYERS, O_EXPERTS, O_HIDDEN, O_VOCAB, O_NGRAM, O_SYNTH_MTP,
    O_HOST, O_PORT, O_APIKEY, O_APIKEYFILE, O_PARALLEL, O_ALIAS, O_CACHERAM, O_MAXQUEUE, O_TIMEOUT, O_MAXBODY, O_QUIET,
} opt_id;

typedef struct {
    opt_id id;
    const char *names; /* spellings, '|'-separated; the first long one names the option in messages */
    unsigned cmds;     /* the commands that take it */
    const char *arg;   /* the value's name in the help; NULL: a flag without a value */
    const char *help;  /* lines separated by '\n'; the default in parentheses */
} opt_def;

/* In the order each command's help lists them. An option may appear once per group of commands, with the help
 * that fits them. */
static const opt_def options[] = {
    {O_MODEL, "-m|--model", C_ALL & ~C_SYNTH & ~C_TOK, "PATH",
     "Hugging Face checkpoint directory (config.json, *.safetensors,\ntokenizer.json) or a llama.cpp .gguf file"},
    {O_SYNTH_SRC, "--synth", C_SYNSRC, "PRESET",
     "instead of -m: a model of random weights at a preset's geometry\n"
     "(flash-next, qwen3.5-35b-a3b), made in memory at --type TYPE with\n"
     "synth's --layers, --experts, ... (no file); on the CPU the bytes\n"
     "`qwenc synth` would write, on a GPU random codes made in its memory"},
    {O_MODEL, "-m|--model", C_TOK, "PATH",
     "a checkpoint directory (only its tokenizer files are needed)\nor a .gguf file"},
    {O_TOKENIZER, "--tokenizer", C_GEN | C_PPL | C_TOK | C_SERVE, "PATH",
     "the tokenizer of PATH: a directory's tokenizer.json, or a .gguf's\n"
     "own (default: the model's; for a .gguf without one, the\ntokenizer.json beside it)"},
    /* run, chat */
    {O_PROMPT, "-p|--prompt", C_RUN, "TEXT", "the prompt"},
    {O_FILE, "-f|--file", C_RUN, "FILE", "read the prompt from FILE (-: standard input)"},
    {O_NPREDICT, "-n|--n-predict|--predict", C_RUN, "N",
     "tokens to generate (default 256; -1: until the context is full; 0: none,\nthe prompt is only processed)"},
    {O_NPREDICT, "-n|--n-predict|--predict", C_CHAT, "N",
     "most tokens per reply (default -1: until the end of the turn)"},
    {O_CHAT, "--chat", C_RUN, NULL, "wrap the prompt in the model's chat template, as a user message"},
    {O_DRAFT, "--draft", C_SERVE, "N",
     "speculative decoding while one request generates: drafts of up to N\n"
     "tokens (at most 15) from the model's MTP draft head (else from its\n"
     "text), verified in one step; the same replies (default 0: off)"},
    {O_DRAFT, "--draft", C_GEN, "N|auto",
     "speculative decoding: draft up to N tokens per step (at most 15) with\n"
     "the model's MTP draft head, or from the text so far (prompt lookup),\n"
     "and verify them in one step of the model; the same text as without.\n"
     "auto: up to 8, each position while half its drafts are accepted\n"
     "(default 0: off)"},
    {O_DRAFT_SRC, "--draft-src", C_GEN, "auto|head|lookup",
     "where --draft takes drafts from: the model's MTP draft head (head),\n"
     "prompt lookup (lookup), or the head when the model has one (auto)"},
    {O_DRAFT_SAMPLE, "--draft-sample", C_GEN, NULL,
     "sampling with the head's drafts: draw them from the head's distribution\n"
     "and keep them by the speculative-sampling rule (more are kept; the\n"
     "text has the distribution of sampling without drafts, not its bytes)"},
    {O_NO_MTP, "--no-mtp", C_ALL & ~C_SYNTH & ~C_TOK, NULL,
     "leave the model's MTP draft head unloaded (its memory is not used)"},
    {O_SYSTEM, "-sys|--system-prompt|--system", C_GEN, "TEXT", "system message (run: implies --chat)"},
    {O_NOTHINK, "--no-think", C_GEN | C_TEMPLATE, NULL,
     "ask the template for a reply without reasoning (enable_thinking=false)"},
    /* serve */
    {O_HOST, "--host", C_SERVE, "ADDR",
     "address to listen on (default 127.0.0.1: this machine only;\n0.0.0.0 or :: for every interface)"},
    {O_PORT, "--port", C_SERVE, "N", "port to listen on (default 8080; 0: any free port, printed)"},
    {O_APIKEY, "--api-key", C_SERVE, "KEY",
     "require the header Authorization: Bearer KEY on every request\nbut GET /health"},
    {O_APIKEYFILE, "--api-key-file", C_SERVE, "FILE", "the same, with KEY on the first line of FILE"},
    {O_PARALLEL, "-np|--parallel", C_SERVE, "N",
     "slots: requests generated at once, each with its own state\n(default 4)"},
    {O_ALIAS, "--alias", C_SERVE, "NAME", "the model's id in the API (default: the last part of -m)"},
    {O_CACHERAM, "--cache-ram", C_SERVE, "MiB",
     "memory for the prefix cache's snapshots (default 2048; 0: off)"},
    {O_MAXQUEUE, "--max-queue", C_SERVE, "N",
     "requests that may wait for a slot; more get 503 (default 64)"},
    {O_TIMEOUT, "--timeout", C_SERVE, "S", "close a connection idle for S seconds (default 60)"},
    {O_MAXBODY, "--max-body", C_SERVE, "MiB", "largest request body; larger ones get 413 (default 16)"},
    {O_QUIET, "-q|--quiet", C_SERVE, NULL, "no line per request on stderr"},
    {O_NOTHINK, "--no-think", C_SERVE, NULL,
     "requests that do not set chat_template_kwargs.enable_thinking get\nfalse (default: the template's default)"},
    {O_CTX, "-c|--ctx-size|--ctx", C_SERVE, "N",
     "tokens of each slot: prompt and reply (default: the model's training\ncontext, at most 4096)"},
    {O_BATCH, "-b|--batch-size|--batch", C_SERVE, "N",
     "prompt tokens fed per scheduler step, between two decode steps of the\nrequests generating (default 64)"},
    {O_NPREDICT, "-n|--n-predict|--predict", C_SERVE, "N",
     "max_tokens of a request that gives none (default -1: until the end\nof the turn or a full context)"},
    {O_STOP, "--stop", C_GEN, "TEXT", "stop before TEXT, which is not printed (repeatable, up to 16)"},
    {O_ESCAPE, "-e|--escape", C_GEN, NULL,
     "read escapes in -p, --system and --stop: \\n \\r \\t \\\\ \\' \\\" \\a \\b \\f \\v \\xNN"},
    {O_NOESCAPE, "--no-escape", C_GEN, NULL, "take -p, --system and --stop as written (the default)"},
    {O_NODISPLAY, "--no-display-prompt", C_RUN, NULL, "print only the generated text, not the prompt before it"},
    {O_SPECIAL, "--show-special|-sp|--special", C_GEN, NULL, "print special tokens (<|im_end|>, ...) in the output"},
    {O_CTXSHIFT, "--context-shift", C_CHAT, NULL,
     "when a turn does not fit in the context, drop the oldest turns: the session\n"
     "starts over with the system message and the latest turns that fit\n"
     "(default: say that the context is full and offer /reset)"},
    {O_CTX, "-c|--ctx-size|--ctx", C_GEN, "N",
     "context size in tokens (default: the model's training context,\nat most 4096)"},
    {O_CTX, "-c|--ctx-size|--ctx", C_LOGITS, "N", "context size in tokens (default: the number of --tokens)"},
    {O_CTX, "-c|--ctx-size|--ctx", C_PPL, "N",
     "tokens per chunk, each scored in a fresh context (default 512, at least 2)"},
    {O_BATCH, "-b|--batch-size|--batch", C_GEN | C_PPL, "N", "most tokens per forward step of a prompt (default 512)"},
    {O_BATCH, "-b|--batch-size|--batch", C_LOGITS, "N", "tokens per forward call (default: all; 1: token by token)"},
    /* sampling */
    {O_TEMP, "--temp|--temperature", C_SAMPLE, "T", "temperature, >= 0; 0: greedy (default 0.8)"},
    {O_TOPK, "--top-k", C_SAMPLE, "K", "keep the K most likely tokens, >= 0; 0: off (default 40)"},
    {O_TOPP, "--top-p", C_SAMPLE, "P",
     "keep the most likely tokens up to probability P, in (0, 1]; 1: off\n(default 0.95)"},
    {O_MINP, "--min-p", C_SAMPLE, "P", "drop tokens below P x the top probability, in [0, 1]; 0: off (default 0.05)"},
    {O_REPPEN, "--repeat-penalty", C_SAMPLE, "P",
     "penalty of tokens seen in the last --repeat-last-n, > 0; 1: off\n(default 1)"},
    {O_REPLASTN, "--repeat-last-n", C_SAMPLE, "N", "tokens the repeat penalty looks back at; -1: all (default 64)"},
    {O_PRESPEN, "--presence-penalty", C_SAMPLE, "P", "in [-2, 2]; 0: off (default 0)"},
    {O_FREQPEN, "--frequency-penalty", C_SAMPLE, "P", "in [-2, 2]; 0: off (default 0)"},
    {O_SEED, "-s|--seed", C_GEN, "N", "random seed (default -1: a random one, printed with the statistics)"},
    {O_SEED, "-s|--seed", C_SERVE, "N", "seed of a request that gives none (default -1: a random one each)"},
    /* logits, tokenize, detokenize, chat-template */
    {O_TOKENS, "--tokens", C_LOGITS, "IDS", "comma-separated token ids (required)"},
    {O_TOKENS, "--tokens", C_DETOKENIZE, "IDS", "the ids (or give them as the argument)"},
    {O_OUT, "-o|--out", C_LOGITS, "FILE", "where to write the logits (required)"},
    {O_FILE, "-f|--file", C_TOKENIZE, "FILE", "tokenize the bytes of FILE instead of TEXT (-: standard input)"},
    {O_FILE, "-f|--file", C_PPL, "FILE", "the text to score (required; -: standard input)"},
    {O_NOPARSESPECIAL, "--no-parse-special", C_TOKENIZE | C_PPL, NULL,
     "read special-token text (<|im_start|>, ...) as plain text"},
    {O_REQUEST, "--request", C_TEMPLATE, "FILE",
     "request body: JSON with \"messages\" and optional \"tools\"\n(required; -: standard input)"},
    {O_ADDGEN, "--add-generation-prompt", C_TEMPLATE, NULL, "end with the header of the assistant's turn"},
    /* bench */
    {O_BENCH_P, "-p|--n-prompt", C_BENCH, "N[,N...]", "prompt tokens of each pp test (default 512; 0: no pp test)"},
    {O_BENCH_N, "-n|--n-gen", C_BENCH, "N[,N...]", "generated tokens of each tg test (default 128; 0: no tg test)"},
    {O_BENCH_NP, "-np|--parallel", C_BENCH, "N[,N...]",
     "sessions decoding together in each tg test: every step one batched\n"
     "forward of N tokens, one per session (as qwenc serve -np N decodes);\n"
     "t/s is all sessions' tokens together (default 1)"},
    {O_BENCH_DRAFT, "--draft", C_BENCH, "K[,K...]",
     "also each tg test in draft steps: K+1 tokens fed as a draft and one\n"
     "kept (the cost of verifying K drafted tokens); t/s is steps per second"},
    {O_BENCH_DEPTH, "-d|--n-depth|--depth", C_BENCH, "N",
     "tokens of context each test starts after, fed untimed before every\n"
     "run (decode and prompts at that depth of a conversation; default 0)"},
    {O_REPS, "-r|--repetitions|--reps", C_BENCH, "N", "timed runs of each test (default 5)"},
    {O_JSON, "--json", C_BENCH, NULL,
     "JSON instead of the table: one object; with lists, one object\nper line and test"},
    {O_PROFILE, "--profile", C_BENCH, NULL, "also time every op of the timed runs: where a token's time goes"},
    /* quantize, synth */
    {O_TYPE, "--type", C_WRITE, "TYPE",
     "tensor type (required): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,\n"
     "Q4_K (= Q4_K_M), Q4_K_S, Q5_K (= Q5_K_M), Q5_K_S, Q6_K, IQ4_NL, IQ4_XS"},
    {O_TYPE, "--type", C_SYNSRC, "TYPE", "with --synth: the tensor type, as synth's (required)"},
    {O_OUT, "-o|--out", C_WRITE, "OUT.gguf", "the file to write (required)"},
    {O_PRESET, "--preset", C_SYNTH, "NAME", "flash-next (qwen4exp) or qwen3.5-35b-a3b (qwen35moe) (required)"},
    {O_ARCH, "--arch", C_SYNTH, "ARCH", "the preset's architecture, checked"},
    {O_LAYERS, "--layers", C_GEOM, "N", "the first N layers of the preset's pattern (default: all)"},
    {O_EXPERTS, "--experts", C_GEOM, "N", "routed experts (default: the preset's)"},
    {O_HIDDEN, "--hidden", C_GEOM, "N", "hidden size (default: the preset's)"},
    {O_VOCAB, "--vocab", C_GEOM, "N", "vocabulary size (default: the preset's)"},
    {O_NGRAM, "--ngram-base", C_GEOM, "N", "PLE n-gram table base size (default: the preset's)"},
    {O_SYNTH_MTP, "--mtp", C_GEOM, NULL, "also an MTP draft head (random, as the other weights)"},
    {O_SEED, "-s|--seed", C_GEOM, "N", "seed of the random weights (default 42)"},
    /* loading and threads */
    {O_THREADS, "-t|--threads", C_LOAD & ~C_BENCH, "N", "CPU threads (default 0: one per core)"},
    {O_THREADS_LIST, "-t|--threads", C_BENCH, "N[,N...]",
     "CPU threads; every test runs at each (default 0: one per core)"},
    {O_THREADS, "-t|--threads", C_WRITE, "N",
     "quantizing threads (default 0: one per core); -t TYPE, the old\nspelling of --type TYPE, still works"},
    {O_BACKEND, "--backend", C_LOAD, "NAME",
     "where the model runs: auto (default: the GPU when there is one and\n"
     "the model fits, else the CPU), cpu, cuda, or cpu-guard (the CPU with\n"
     "activations and state inaccessible outside the backend: a test mode)"},
    {O_GPUS, "--gpus", C_LOAD, "N|LIST",
     "spread the model over N GPUs (devices 0..N-1) or the listed device\n"
     "ids (0,1,3), as --split says: the logits of one GPU"},
    {O_SPLIT, "--split", C_LOAD, "HOW",
     "how --gpus divides the model: expert (the default: routed experts\n"
     "spread, NCCL between the GPUs, the rest on the first) or layer (each\n"
     "GPU a range of layers with their state; any architecture)"},
    {O_KERNELS, "--kernels", C_LOAD, "NAME",
     "CPU kernels: auto (default: the best for this CPU), amx, avx512,\n"
     "avx2, neon, scalar, ref (the scalar reference, one thread)"},
    {O_QUANT, "--quant", C_LOAD, "TYPE",
     "quantize the weights at load as `quantize --type TYPE` would (the same\n"
     "bytes, held in memory; a .gguf is requantized)"},
    {O_F32ACT, "--f32-act", C_LOAD & ~C_INFO, NULL,
     "quantized weights meet f32 activations (exact, slower; default:\n"
     "activations rounded to 8 bits per block of 32 for integer dot\nproducts, as llama.cpp)"},
    {O_HELP, "-h|--help", C_ALL, NULL, "print this help"},
    {O_VERSION, "--version", C_ALL, NULL, "print the version"},
};
#define N_OPTIONS (int)(sizeof(options) / sizeof(options[0]))

/* ------------------------------------------------------------------ help */

/* "-m, --model PATH" */
static void opt_label(const opt_def *d, char *buf, size_t n) {
    size_t k = 0;
    for (const char *p = d->names; *p && k + 3 < n; p++) {
        if (*p == '|') {
            buf[k++] = ',';
            buf[k++] = ' ';
        } else {
            buf[k++] = *p;
        }
    }
    buf[k] = 0;
    if (d->arg) snprintf(buf + k, n - k, " %s", d->arg);
}

static void print_option(FILE *f, const opt_def *d) {
    enum { COL = 30 };
    char label[96];
    opt_label(d, label, sizeof(label));
    if (strlen(label) + 4 > COL)
        fprintf(f, "  %s\n%*s", label, COL, "");
    else
        fprintf(f, "  %-*s", COL - 2, label);
    for (const char *p = d->help; *p; p++) {
        fputc(*p, f);
        if (*p == '\n') fprintf(f, "%*s", COL, "");
    }
    fputc('\n', f);
}

static void print_lines(FILE *f, const char *text, const char *indent) {
    fputs(indent, f);
    for (const char *p = text; *p; p++) {
        fputc(*p, f);
        if (*p == '\n') fputs(indent, f);
    }
    fputc('\n', f);
}

void cli_usage_command(FILE *f, const cli_cmd *c) {
    fprintf(f, "usage: qwenc %s %s\n\n", c->name, c->synopsis);
    print_lines(f, c->about, "");
    fprintf(f, "\noptions:\n");
    for (int i = 0; i < N_OPTIONS; i++)
        if (options[i].cmds & c->bit) print_option(f, &options[i]);
}

void cli_usage(FILE *f) {
    fprintf(f, "qwenc %s - inference of the Qwen hybrid models and Llama 3 on the CPU\n\n"
               "usage: qwenc COMMAND [options]      qwenc COMMAND --help: the options of COMMAND\n\ncommands:\n",
            qwenc_version());
    for (int i = 0; i < N_COMMANDS; i++) {
        const char *nl = strchr(commands[i].about, '\n');
        int len = nl ? (int)(nl - commands[i].about) : (int)strlen(commands[i].about);
        fprintf(f, "  %-15s%.*s\n", commands[i].name, len, commands[i].about);
    }
    fprintf(f, "\noptions most commands take:\n");
    static const opt_id common[] = {O_MODEL, O_THREADS, O_CTX, O_BACKEND, O_KERNELS, O_QUANT, O_HELP, O_VERSION};
    for (size_t k = 0; k < sizeof(common) / sizeof(common[0]); k++)
        for (int i = 0; i < N_OPTIONS; i++)
            if (options[i].id == common[k]) {
                print_option(f, &options[i]);
                break;
            }
    fprintf(f, "\nllama.cpp's spellings are accepted where the meaning is the same (--ctx-size, -s, -sys, -b, -e,\n"
               "--flag=value, ...); -t is always the thread count (the type of quantize and synth is --type).\n"
               "examples:\n"
               "  qwenc run -m models/tiny-flash -p \"And it came to pass\" -n 64\n"
               "  qwenc chat -m MODEL_DIR -sys \"You are terse.\"\n"
               "  qwenc quantize -m MODEL_DIR -o model-q4_k.gguf Q4_K\n"
               "  qwenc bench -m model-q4_k.gguf -p 128,512 -n 32 -t 4,8\n");
}

/* ------------------------------------------------------------------ values */

static int parse_int(const char *s, const char *opt, int min, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == 0 || *end != 0 || v < min || v > INT_MAX) {
        fprintf(stderr, "qwenc: %s expects an integer >= %d, got \"%s\"\n", opt, min, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

/* A number in [lo, hi] (lo excluded when lo_open); the range is named in the message. */
static int parse_float(const char *s, const char *opt, double lo, int lo_open, double hi, const char *what,
                       float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *s == 0 || *end != 0 || !isfinite(v)) {
        fprintf(stderr, "qwenc: %s expects a number, got \"%s\"\n", opt, s);
        return 0;
    }
    if (v < lo || (lo_open && v == lo) || v > hi) {
        fprintf(stderr, "qwenc: %s must be %s, got %s\n", opt, what, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* "16,32" into up to CLI_MAX_LIST integers >= min. */
static int parse_list(const char *s, const char *opt, int min, int *v, int *n) {
    *n = 0;
    char buf[32];
    for (const char *p = s;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (*n == CLI_MAX_LIST) {
            fprintf(stderr, "qwenc: %s takes at most %d values, got \"%s\"\n", opt, CLI_MAX_LIST, s);
            return 0;
        }
        if (len == 0 || len >= sizeof(buf)) {
            fprintf(stderr, "qwenc: %s expects integers >= %d separated by commas, got \"%s\"\n", opt, min, s);
            return 0;
        }
        memcpy(buf, p, len);
        buf[len] = 0;
        if (!parse_int(buf, opt, min, &v[(*n)++])) return 0;
        if (!c) return 1;
        p = c + 1;
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int cli_unescape(char *s, const char *opt) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (*r != '\\' || !r[1]) {
            *w++ = *r;
            continue;
        }
        char c = *++r;
        switch (c) {
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'a': *w++ = '\a'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'v': *w++ = '\v'; break;
        case '\\': case '\'': case '"': case '?': *w++ = c; break;
        case 'x': {
            int hi = hexval(r[1]), lo = hi >= 0 ? hexval(r[2]) : -1;
            if (hi < 0) { /* not an escape: kept as written, as llama.cpp does */
                *w++ = '\\';
                *w++ = 'x';
                break;
            }
            int v = lo >= 0 ? hi * 16 + lo : hi;
            r += lo >= 0 ? 2 : 1;
            if (v == 0) {
                fprintf(stderr, "qwenc: %s: \\x00 (a NUL byte) cannot be given with -e; put the text in a file "
                                "for -f\n", opt);
                return 0;
            }
            *w++ = (char)v;
            break;
        }
        default: /* an unknown escape stays as written */
            *w++ = '\\';
            *w++ = c;
        }
    }
    *w = 0;
    return 1;
}

/* ------------------------------------------------------------------ parsing */

/* The option spelled `name` (no "=value") for command bit `cmd`; *other: an option of that spelling exists
 * for another command. */
static const opt_def *find_option(const char *name, size_t len, unsigned cmd, int *other) {
    *other = 0;
    for (int i = 0; i < N_OPTIONS; i++) {
        for (const char *p = options[i].names; *p;) {
            const char *bar = strchr(p, '|');
            size_t l = bar ? (size_t)(bar - p) : strlen(p);
            if (l == len && !memcmp(p, name, len)) {
                if (options[i].cmds & cmd) return &options[i];
                *other = 1;
            }
            p += l + (bar != NULL);
        }
    }
    return NULL;
}

static int is_integer(const char *s) {
    if (*s == '-') s++;
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

/* Store one option's value; 0 (message printed) if it does not parse. */
static int set_option(cli_opts *o, const opt_def *d, const char *opt, char *v) {
    switch (d->id) {
    case O_HELP: case O_VERSION: return 1; /* handled by the caller */
    case O_MODEL: o->model = v; return 1;
    case O_TOKENIZER: o->tokenizer = v; return 1;
    case O_THREADS:
        if (o->cmd->bit & C_WRITE && !strcmp(opt, "-t") && !is_integer(v)) { /* the old `-t TYPE` */
            fprintf(stderr, "qwenc: note: -t %s is the old spelling of --type %s (-t is now the thread count, as in "
                            "every command)\n", v, v);
            o->type = v;
            return 1;
        }
        if (!is_integer(v)) {
            fprintf(stderr, "qwenc: %s expects a number of threads (an integer >= 0), got \"%s\"\n", opt, v);
            return 0;
        }
        return parse_int(v, opt, 0, &o->threads);
    case O_THREADS_LIST: return parse_list(v, opt, 0, o->bench_t, &o->n_bench_t);
    case O_BACKEND:
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "cpu-guard")) {
            fprintf(stderr, "qwenc: %s expects auto, cpu, cuda or cpu-guard, got \"%s\"\n", opt, v);
            return 0;
        }
        o->backend = v;
        return 1;
    case O_GPUS: o->gpus = v; return 1;
    case O_SPLIT:
        if (strcmp(v, "expert") && strcmp(v, "layer")) {
            fprintf(stderr, "qwenc: %s expects expert or layer, got \"%s\"\n", opt, v);
            return 0;
        }
        o->split = v;
        return 1;
    case O_KERNELS: o->kernels = v; return 1;
    case O_QUANT: o->quant = v; return 1;
    case O_F32ACT: o->f32_act = 1; return 1;
    case O_CTX: return parse_int(v, opt, 1, &o->ctx);
    case O_BATCH: return parse_int(v, opt, 1, &o->batch);
    case O_PROMPT: o->prompt = v; return 1;
    case O_FILE: o->file = v; return 1;
    case O_NPREDICT: return parse_int(v, opt, -1, &o->n_predict);
    case O_DRAFT:
        if (!strcmp(v, "auto")) {
            o->draft = QWENC_DRAFT_AUTO;
            return 1;
        }
        if (!parse_int(v, opt, 0, &o->draft)) return 0;
        if (o->draft > QWENC_MAX_DRAFT)
            return fprintf(stderr, "qwenc: --draft must be at most %d, got %d\n", QWENC_MAX_DRAFT, o->draft), 0;
        return 1;
    case O_DRAFT_SRC:
        if (!strcmp(v, "auto")) o->draft_src = QWENC_DRAFT_SRC_AUTO;
        else if (!strcmp(v, "head")) o->draft_src = QWENC_DRAFT_SRC_HEAD;
        else if (!strcmp(v, "lookup")) o->draft_src = QWENC_DRAFT_SRC_LOOKUP;
        else return fprintf(stderr, "qwenc: --draft-src takes auto, head or lookup, got \"%s\"\n", v), 0;
        return 1;
    case O_NO_MTP: o->no_mtp = 1; return 1;
    case O_DRAFT_SAMPLE: o->draft_sample = 1; return 1;
    case O_CHAT: o->chat = 1; return 1;
    case O_SYSTEM: o->system = v; return 1;
    case O_NOTHINK: o->no_think = 1; return 1;
    case O_STOP:
        if (o->n_stop == 16) {
            fprintf(stderr, "qwenc: at most 16 %s strings\n", opt);
            return 0;
        }
        o->stop[o->n_stop++] = v;
        return 1;
    case O_ESCAPE: o->escape = 1; return 1;
    case O_NOESCAPE: o->escape = 0; return 1;
    case O_NODISPLAY: o->no_display_prompt = 1; return 1;
    case O_SPECIAL: o->show_special = 1; return 1;
    case O_CTXSHIFT: o->context_shift = 1; return 1;
    case O_TEMP: return parse_float(v, opt, 0, 0, INFINITY, ">= 0 (0: greedy)", &o->sp.temperature);
    case O_TOPK: return parse_int(v, opt, 0, &o->sp.top_k);
    case O_TOPP: return parse_float(v, opt, 0, 1, 1, "in (0, 1] (1: off)", &o->sp.top_p);
    case O_MINP: return parse_float(v, opt, 0, 0, 1, "in [0, 1] (0: off)", &o->sp.min_p);
    case O_REPPEN: return parse_float(v, opt, 0, 1, INFINITY, "> 0 (1: off)", &o->sp.repeat_penalty);
    case O_REPLASTN: return parse_int(v, opt, -1, &o->sp.repeat_last_n);
    case O_PRESPEN: return parse_float(v, opt, -2, 0, 2, "in [-2, 2] (0: off)", &o->sp.presence_penalty);
    case O_FREQPEN: return parse_float(v, opt, -2, 0, 2, "in [-2, 2] (0: off)", &o->sp.frequency_penalty);
    case O_SEED: {
        if (!strcmp(v, "-1")) { /* llama.cpp's "random" */
            o->seed_set = 0;
            return 1;
        }
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (errno || !*v || *end || v[0] == '-' || v[0] == '+') {
            fprintf(stderr, "qwenc: %s expects a non-negative integer (or -1: random), got \"%s\"\n", opt, v);
            return 0;
        }
        o->sp.seed = s;
        o->seed_set = 1;
        return 1;
    }
    case O_TOKENS: o->tokens = v; return 1;
    case O_OUT: o->out = v; return 1;
    case O_NOPARSESPECIAL: o->no_parse_special = 1; return 1;
    case O_REQUEST: o->request = v; return 1;
    case O_ADDGEN: o->add_gen = 1; return 1;
    case O_BENCH_P: return parse_list(v, opt, 0, o->bench_p, &o->n_bench_p);
    case O_BENCH_N: return parse_list(v, opt, 0, o->bench_n, &o->n_bench_n);
    case O_BENCH_NP: return parse_list(v, opt, 1, o->bench_np, &o->n_bench_np);
    case O_BENCH_DRAFT:
        if (!parse_list(v, opt, 1, o->bench_draft, &o->n_bench_draft)) return 0;
        for (int i = 0; i < o->n_bench_draft; i++)
            if (o->bench_draft[i] > QWENC_MAX_DRAFT)
                return fprintf(stderr, "qwenc: --draft must be at most %d, got %d\n", QWENC_MAX_DRAFT, o->bench_draft[i]), 0;
        return 1;
    case O_BENCH_DEPTH: return parse_int(v, opt, 0, &o->bench_depth);
    case O_REPS: return parse_int(v, opt, 1, &o->reps);
    case O_JSON: o->json = 1; return 1;
    case O_PROFILE: o->profile = 1; return 1;
    case O_TYPE: o->type = v; return 1;
    case O_PRESET: o->preset = v; return 1;
    case O_SYNTH_SRC: o->synth = v; return 1;
    case O_ARCH: o->arch = v; return 1;
    case O_LAYERS: return parse_int(v, opt, 1, &o->layers);
    case O_EXPERTS: return parse_int(v, opt, 1, &o->experts);
    case O_HIDDEN: return parse_int(v, opt, 1, &o->hidden);
    case O_VOCAB: return parse_int(v, opt, 1, &o->vocab);
    case O_NGRAM: return parse_int(v, opt, 2, &o->ngram_base);
    case O_SYNTH_MTP: o->synth_mtp = 1; return 1;
    case O_HOST: o->host = v; return 1;
    case O_PORT:
        if (!parse_int(v, opt, 0, &o->port)) return 0;
        if (o->port > 65535) {
            fprintf(stderr, "qwenc: %s expects a port in [0, 65535], got %s\n", opt, v);
            return 0;
        }
        return 1;
    case O_APIKEY:
        if (!*v) {
            fprintf(stderr, "qwenc: %s: the key is empty\n", opt);
            return 0;
        }
        o->api_key = v;
        return 1;
    case O_APIKEYFILE: o->api_key_file = v; return 1;
    case O_PARALLEL: return parse_int(v, opt, 1, &o->parallel);
    case O_ALIAS: o->alias = v; return 1;
    case O_CACHERAM: return parse_int(v, opt, 0, &o->cache_ram);
    case O_MAXQUEUE: return parse_int(v, opt, 0, &o->max_queue);
    case O_TIMEOUT: return parse_int(v, opt, 1, &o->timeout);
    case O_MAXBODY: return parse_int(v, opt, 1, &o->max_body);
    case O_QUIET: o->quiet = 1; return 1;
    }
    return 1;
}

void cli_print_version(FILE *f) {
    fprintf(f, "qwenc %s\n", qwenc_version());
#if defined(__clang__)
    fprintf(f, "built with clang %s", __clang_version__);
#elif defined(__GNUC__)
    fprintf(f, "built with gcc %s", __VERSION__);
#endif
#if defined(__x86_64__)
    fprintf(f, " for x86_64\n");
#elif defined(__aarch64__)
    fprintf(f, " for aarch64\n");
#else
    fprintf(f, "\n");
#endif
}

const cli_cmd *cli_find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

/* The arguments that are not options: TEXT (tokenize), IDS (detokenize), TYPE or MODEL OUT TYPE (quantize). */
static int take_positionals(cli_opts *o) {
    const char *c = o->cmd->name;
    int max = o->cmd->bit & (C_TOKENIZE | C_DETOKENIZE) ? 1 : o->cmd->bit == C_QUANTIZE ? 3 : 0;
    if (o->n_pos > max || (o->cmd->bit == C_QUANTIZE && o->n_pos == 2)) {
        const char *extra = o->pos[max && o->n_pos != 2 ? max : 0];
        struct stat st;
        if (max == 0)
            fprintf(stderr, "qwenc: %s takes no argument \"%s\" (%s; see qwenc %s --help)\n", c, extra,
                    stat(extra, &st) == 0 && !o->model ? "a model is given as -m PATH"
                    : o->cmd->bit == C_RUN         ? "the prompt is -p \"TEXT\", quoted if it holds spaces"
                                                   : "options start with -",
                    c);
        else if (o->cmd->bit == C_QUANTIZE)
            fprintf(stderr, "qwenc: quantize takes TYPE, or MODEL OUT.gguf TYPE, as arguments; got %d (see qwenc "
                            "quantize --help)\n", o->n_pos);
        else
            fprintf(stderr, "qwenc: unexpected argument \"%s\" (quote text that contains spaces)\n", extra);
        return 0;
    }
    if (o->cmd->bit == C_QUANTIZE) {
        if (o->n_pos == 3) {
            if (o->model || o->out) {
                fprintf(stderr, "qwenc: quantize: give MODEL OUT.gguf TYPE, or -m and -o, not both\n");
                return 0;
            }
            o->model = o->pos[0];
            o->out = o->pos[1];
        }
        if (o->n_pos) {
            if (o->type) {
                fprintf(stderr, "qwenc: quantize: the type is given twice (--type %s and \"%s\")\n", o->type,
                        o->pos[o->n_pos - 1]);
                return 0;
            }
            o->type = o->pos[o->n_pos - 1];
        }
    } else if (o->n_pos) {
        o->positional = o->pos[0];
    }
    return 1;
}

int cli_parse(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof(*o));
    o->sp = qwenc_sampler_default_params();
    o->n_predict = CLI_UNSET;
    o->port = o->parallel = o->cache_ram = o->max_queue = o->timeout = o->max_body = CLI_UNSET;
    if (argc < 2) {
        cli_usage(stderr);
        return 1;
    }
    const char *name = argv[1];
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
        cli_usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        cli_print_version(stdout);
        return 0;
    }
    if (!strcmp(name, "help")) {
        const cli_cmd *c = argc > 2 ? cli_find_command(argv[2]) : NULL;
        if (c)
            cli_usage_command(stdout, c);
        else
            cli_usage(stdout);
        return 0;
    }
    o->cmd = cli_find_command(name);
    if (!o->cmd) {
        fprintf(stderr, "qwenc: unknown command \"%s\" (see qwenc --help)\n", name);
        return 1;
    }
    unsigned bit = o->cmd->bit;
    for (int i = 2; i < argc; i++) {
        char *a = argv[i];
        if (a[0] != '-' || !strcmp(a, "-") || (a[1] >= '0' && a[1] <= '9')) {
            if (o->n_pos == (int)(sizeof(o->pos) / sizeof(o->pos[0]))) {
                fprintf(stderr, "qwenc: %s: too many arguments (\"%s\")\n", name, a);
                return 1;
            }
            o->pos[o->n_pos++] = a;
            continue;
        }
        char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        int other;
        const opt_def *d = find_option(a, len, bit, &other);
        if (!d) {
            if (other)
                fprintf(stderr, "qwenc: %s does not take %.*s (see qwenc %s --help)\n", name, (int)len, a, name);
            else
                fprintf(stderr, "qwenc: unknown option %.*s (see qwenc %s --help)\n", (int)len, a, name);
            return 1;
        }
        if (d->id == O_HELP) {
            cli_usage_command(stdout, o->cmd);
            return 0;
        }
        if (d->id == O_VERSION) {
            cli_print_version(stdout);
            return 0;
        }
        char opt[64];
        snprintf(opt, sizeof(opt), "%.*s", (int)len, a);
        char *v = NULL;
        if (!d->arg) {
            if (eq) {
                fprintf(stderr, "qwenc: %s takes no value (got \"%s\")\n", opt, a);
                return 1;
            }
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            fprintf(stderr, "qwenc: option %s needs a value %s (see qwenc %s --help)\n", opt, d->arg, name);
            return 1;
        }
        if (!set_option(o, d, opt, v)) return 1;
    }
    if (!take_positionals(o)) return 1;
    if (o->synth && o->model) {
        fprintf(stderr, "qwenc: %s: give -m MODEL or --synth PRESET, not both\n", name);
        return 1;
    }
    if (o->synth && (!o->type || o->quant)) {
        fprintf(stderr, "qwenc: %s: --synth %s needs --type TYPE (one of %s)%s\n", name, o->synth,
                qwenc_gguf_types(), o->quant ? ", not --quant" : "");
        return 1;
    }
    if (!o->synth && bit & C_SYNSRC && (o->type || o->layers || o->experts || o->hidden || o->vocab || o->ngram_base ||
                                        o->synth_mtp || o->seed_set)) {
        fprintf(stderr, "qwenc: %s: --type, --layers, --experts, --hidden, --vocab, --ngram-base, --mtp and --seed "
                        "go with --synth PRESET\n", name);
        return 1;
    }
    if (!o->model && !o->synth && bit != C_SYNTH) {
        fprintf(stderr, "qwenc: %s: -m MODEL is required (a checkpoint directory or a .gguf file; see qwenc %s "
                        "--help)\n", name, name);
        return 1;
    }
    if (bit == C_RUN && o->system) o->chat = 1;
    if (o->escape) {
        if (o->prompt && !cli_unescape((char *)o->prompt, "-p")) return 1;
        if (o->system && !cli_unescape((char *)o->system, "--system")) return 1;
        for (int i = 0; i < o->n_stop; i++)
            if (!cli_unescape((char *)o->stop[i], "--stop")) return 1;
    }
    return -1;
}
