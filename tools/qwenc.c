/*
 * qwenc.c - the command-line interface. Every subcommand goes through include/qwenc.h only.
 *
 *   qwenc run        -m DIR -p PROMPT [-n N] [sampling] [--chat] [--system TEXT] [--no-think] [--stop S]
 *   qwenc chat       -m DIR [sampling] [--system TEXT] [--no-think]
 *   qwenc info       -m DIR
 *   qwenc logits     -m DIR --tokens 3,17,9 --out FILE [--batch N] [--ctx N]
 *   qwenc tokenize   -m DIR [--file F | TEXT]
 *   qwenc detokenize -m DIR 1,2,3
 *   qwenc chat-template -m DIR --request F.json [--add-generation-prompt] [--no-think]
 *   qwenc quantize   -m DIR|FILE.gguf -t TYPE -o OUT.gguf
 *   qwenc synth      --preset NAME [--arch A] [--layers N] [--experts E] [--ngram-base B] -t TYPE -o OUT.gguf
 *   qwenc bench      -m DIR [-p 512] [-n 128] [-t THREADS] [-r REPS] [--json] [--profile]
 * Every command that loads a model takes -t/--threads N, --kernels NAME, --quant TYPE and --f32-act.
 *
 * Flags follow llama.cpp's names where it has them. Errors go to stderr with exit status 1.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: qwenc <command> [options]\n"
            "\n"
            "commands:\n"
            "  run        generate text from a prompt and stream it to stdout\n"
            "  chat       interactive multi-turn chat in the terminal (/reset, /exit)\n"
            "  info       architecture, layer plan, parameters per component, dtypes\n"
            "  logits     write the logits of a token sequence (T x vocab float32 little-endian) to a file\n"
            "  tokenize   print the token ids of TEXT (or of the raw bytes of --file F), without BOS\n"
            "  detokenize print the text of comma-separated token ids (exactly its bytes, no newline added)\n"
            "  chat-template  print the prompt a chat template renders for an OpenAI-style request\n"
            "  bench      prompt processing and generation speed, peak memory, the decode bandwidth bound\n"
            "  perplexity perplexity of the model on a text file (-f FILE, chunks of -c N tokens, default 512)\n"
            "  quantize   write the model as a llama.cpp GGUF: -t TYPE -o OUT.gguf (see docs/GGUF.md)\n"
            "  synth      write a model with random weights at a released geometry as GGUF (no -m)\n"
            "\n"
            "model:\n"
            "  -m, --model DIR        Hugging Face checkpoint directory (config.json, *.safetensors,\n"
            "                         tokenizer.json), or a llama.cpp .gguf file; tokenize/detokenize/\n"
            "                         chat-template need only the tokenizer files\n"
            "  --tokenizer DIR        take tokenizer.json (and its configs) from DIR, or the tokenizer of a .gguf\n"
            "                         (default: the model's; a .gguf without one: tokenizer.json beside it)\n"
            "  -c, --ctx N            context size of the session (default: training context, at most 4096)\n"
            "  -t, --threads N        CPU threads (default 0: one per core)\n"
            "  --kernels NAME         CPU kernels: auto (default: the best for this CPU), amx, avx512, avx2,\n"
            "                         neon, scalar, ref (the scalar reference, one thread)\n"
            "  --f32-act              quantized weights meet f32 activations (exact, slower; default: activations\n"
            "                         rounded to 8 bits per block of 32 for integer dot products, as llama.cpp)\n"
            "  --quant TYPE           quantize the weights at load as `quantize -t TYPE` would (same types and\n"
            "                         bytes, held in memory; a .gguf is requantized); TYPE as for quantize\n"
            "\n"
            "run / chat:\n"
            "  -p, --prompt TEXT      the prompt (run)           -f, --file F   read the prompt from a file\n"
            "  -n, --n-predict N      tokens to generate (run default 256, chat: until end of turn; -1: no limit)\n"
            "  --chat                 (run) wrap the prompt in the model's chat template\n"
            "  --system TEXT          system message for --chat and chat\n"
            "  --no-think             ask the template for a reply without reasoning (enable_thinking=false)\n"
            "  --stop S               stop before the text S (repeatable)\n"
            "  --temp T               temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K              (default 40, 0 = off)      --top-p P      (default 0.95, 1 = off)\n"
            "  --min-p P              (default 0.05, 0 = off)    --seed S       (default: random, printed)\n"
            "  --repeat-penalty P     (default 1 = off)          --repeat-last-n N  (default 64, -1 = all)\n"
            "  --presence-penalty P   --frequency-penalty P      (default 0 = off)\n"
            "  --show-special         print special tokens in the output\n"
            "\n"
            "logits:\n"
            "  --tokens IDS  --out FILE  --batch N (tokens per forward call; default all, 1 = token by token)\n"
            "\n"
            "bench (llama-bench-like: prompt processing and generation speed, the decode bandwidth bound):\n"
            "  -p N  prompt tokens (default 512, 0 = skip)    -n N  generated tokens (default 128, 0 = skip)\n"
            "  -r N  repetitions (default 5)                  --json  one JSON object instead of the table\n"
            "  --profile  also time every op of the timed runs: a table per test of where a token's time goes\n"
            "\n"
            "quantize:\n"
            "  -t, --type TYPE        F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K (= Q4_K_M), Q4_K_S,\n"
            "                         Q5_K (= Q5_K_M), Q5_K_S, Q6_K, IQ4_NL, IQ4_XS\n"
            "  -o, --out OUT.gguf\n"
            "\n"
            "synth (-t TYPE -o OUT.gguf as quantize; --threads N quantizing threads):\n"
            "  --preset NAME          flash-next (qwen4exp) or qwen3.5-35b-a3b (qwen35moe)\n"
            "  --arch A               the preset's architecture, checked   --seed S  (default 42)\n"
            "  --layers N  --experts E  --ngram-base B  --hidden N  --vocab N   shrink the geometry\n"
            "\n"
            "tokenize / chat-template:\n"
            "  --no-parse-special     treat special-token text as plain text (tokenize)\n"
            "  --request F.json       request body with \"messages\" and optional \"tools\" (chat-template)\n"
            "  --add-generation-prompt\n");
}

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

static int parse_float(const char *s, const char *opt, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *s == 0 || *end != 0 || !isfinite(v)) {
        fprintf(stderr, "qwenc: %s expects a number, got \"%s\"\n", opt, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_opts(int argc, char **argv, cli_opts *o) {
    o->sp = qwenc_sampler_default_params();
    o->n_predict = INT_MIN; /* unset */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        /* flags without a value */
        if (!strcmp(a, "--chat")) { o->chat = 1; continue; }
        if (!strcmp(a, "--no-think")) { o->no_think = 1; continue; }
        if (!strcmp(a, "--add-generation-prompt")) { o->add_gen = 1; continue; }
        if (!strcmp(a, "--no-parse-special")) { o->no_parse_special = 1; continue; }
        if (!strcmp(a, "--show-special")) { o->show_special = 1; continue; }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--profile")) { o->profile = 1; continue; }
        if (!strcmp(a, "--f32-act")) { o->f32_act = 1; continue; }
        if (a[0] != '-' || !strcmp(a, "-")) {
            if (o->positional) {
                fprintf(stderr, "qwenc: unexpected argument \"%s\" (quote text that contains spaces)\n", a);
                return 0;
            }
            o->positional = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "qwenc: option %s needs a value (see qwenc --help)\n", a);
            return 0;
        }
        const char *v = argv[++i];
        int ok = 1;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if ((!strcmp(a, "-t") && (!strcmp(argv[1], "quantize") || !strcmp(argv[1], "synth"))) ||
                 !strcmp(a, "--type")) o->type = v;
        else if (!strcmp(a, "--preset")) o->preset = v;
        else if (!strcmp(a, "--arch")) o->arch = v;
        else if (!strcmp(a, "--layers")) ok = parse_int(v, a, 1, &o->layers);
        else if (!strcmp(a, "--experts")) ok = parse_int(v, a, 1, &o->experts);
        else if (!strcmp(a, "--hidden")) ok = parse_int(v, a, 1, &o->hidden);
        else if (!strcmp(a, "--vocab")) ok = parse_int(v, a, 1, &o->vocab);
        else if (!strcmp(a, "--ngram-base")) ok = parse_int(v, a, 2, &o->ngram_base);
        else if (!strcmp(a, "--tokens")) o->tokens = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->file = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--request")) o->request = v;
        else if (!strcmp(a, "--tokenizer")) o->tokenizer = v;
        else if (!strcmp(a, "--kernels")) o->kernels = v;
        else if (!strcmp(a, "--quant")) o->quant = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) ok = parse_int(v, a, 0, &o->threads);
        else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) ok = parse_int(v, a, 1, &o->reps);
        else if (!strcmp(a, "--batch")) ok = parse_int(v, a, 1, &o->batch);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) ok = parse_int(v, a, 1, &o->ctx);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) ok = parse_int(v, a, -1, &o->n_predict);
        else if (!strcmp(a, "--temp")) ok = parse_float(v, a, &o->sp.temperature);
        else if (!strcmp(a, "--top-k")) ok = parse_int(v, a, 0, &o->sp.top_k);
        else if (!strcmp(a, "--top-p")) ok = parse_float(v, a, &o->sp.top_p);
        else if (!strcmp(a, "--min-p")) ok = parse_float(v, a, &o->sp.min_p);
        else if (!strcmp(a, "--repeat-penalty")) ok = parse_float(v, a, &o->sp.repeat_penalty);
        else if (!strcmp(a, "--repeat-last-n")) ok = parse_int(v, a, -1, &o->sp.repeat_last_n);
        else if (!strcmp(a, "--presence-penalty")) ok = parse_float(v, a, &o->sp.presence_penalty);
        else if (!strcmp(a, "--frequency-penalty")) ok = parse_float(v, a, &o->sp.frequency_penalty);
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            ok = !errno && *v && !*end && v[0] != '-';
            if (!ok) fprintf(stderr, "qwenc: --seed expects a non-negative integer, got \"%s\"\n", v);
            o->sp.seed = s;
            o->seed_set = 1;
        } else if (!strcmp(a, "--stop")) {
            if (o->n_stop == 16) {
                fprintf(stderr, "qwenc: at most 16 --stop strings\n");
                return 0;
            }
            o->stop[o->n_stop++] = v;
        } else {
            fprintf(stderr, "qwenc: unknown option %s (see qwenc --help)\n", a);
            return 0;
        }
        if (!ok) return 0;
    }
    if (!o->model && strcmp(argv[1], "synth") != 0) {
        fprintf(stderr, "qwenc: %s: --model DIR is required\n", argv[1]);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ loading */

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

qwenc_model *cli_load_model(const cli_opts *o) {
    char err[1024];
    qwenc_model *m = NULL;
    qwenc_model_params mp = qwenc_model_default_params();
    mp.n_threads = o->threads;
    mp.kernels = o->kernels;
    mp.f32_activations = o->f32_act;
    mp.quant = o->quant;
    cli_progress ps = {.tty = isatty(2), .t0 = cli_now_s(), .last_tensor = -1, .min_bytes = (uint64_t)256 << 20};
    if (o->quant) {
        mp.progress = cli_show_progress;
        mp.progress_user = &ps;
    }
    if (qwenc_model_load_params(o->model, &mp, &m, err, sizeof(err))) {
        if (ps.shown && ps.tty) fprintf(stderr, "\n");
        fprintf(stderr, "qwenc: cannot load model: %s\n", err);
        return NULL;
    }
    if (ps.shown)
        fprintf(stderr, "qwenc: quantized %s to %s at load in %.1f s\n", o->model, o->quant, cli_now_s() - ps.t0);
    return m;
}

qwenc_tokenizer *cli_load_tokenizer(const cli_opts *o) {
    char err[1024];
    qwenc_tokenizer *t = NULL;
    /* --tokenizer first; a .gguf model's own tokenizer, else tokenizer.json beside the file */
    qwenc_status s = o->tokenizer ? qwenc_tokenizer_load(o->tokenizer, &t, err, sizeof(err))
                                  : qwenc_tokenizer_load_model(o->model, &t, err, sizeof(err));
    if (s) {
        fprintf(stderr, "qwenc: cannot load tokenizer: %s\n", err);
        return NULL;
    }
    return t;
}

const char *cli_bos_token(const qwenc_tokenizer *tok) {
    const char *b = qwenc_tokenizer_bos_str(tok);
    return b && *b ? b : NULL;
}

/* Whole file into memory (the prompt or a request). */
char *cli_slurp(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "qwenc: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "qwenc: cannot read %s\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* ------------------------------------------------------------------ info / logits */

static int cmd_info(cli_opts *o) {
    qwenc_model *m = cli_load_model(o);
    if (!m) return 1;
    qwenc_model_print_info(m, stdout);
    qwenc_model_free(m);
    return 0;
}

/* Parse "3,17,9" into a new array. */
static int32_t *parse_ids(const char *s, const char *what, int *n) {
    int cap = 16;
    *n = 0;
    int32_t *v = malloc((size_t)cap * sizeof(int32_t));
    for (const char *p = s; v && *p;) {
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            fprintf(stderr, "qwenc: %s: \"%.20s\" is not a non-negative integer (token %d)\n", what, p, *n);
            free(v);
            return NULL;
        }
        if (*n == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!nv) free(v);
            v = nv;
            if (!v) break;
        }
        v[(*n)++] = (int32_t)x;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (*p == ',') {
            p++;
        } else if (*p) {
            fprintf(stderr, "qwenc: %s: unexpected character '%c' after token %d\n", what, *p, *n - 1);
            free(v);
            return NULL;
        }
    }
    if (v && *n == 0) {
        fprintf(stderr, "qwenc: %s: no token ids given\n", what);
        free(v);
        return NULL;
    }
    return v;
}

static int cmd_logits(cli_opts *o) {
    if (!o->tokens) return fprintf(stderr, "qwenc: logits: --tokens IDS is required\n"), 1;
    if (!o->out) return fprintf(stderr, "qwenc: logits: --out FILE is required\n"), 1;
    int n = 0;
    int32_t *ids = parse_ids(o->tokens, "--tokens", &n);
    if (!ids) return 1;
    qwenc_model *m = cli_load_model(o);
    if (!m) return free(ids), 1;
    int rc = 1;
    char err[1024];
    int V = qwenc_model_n_vocab(m);
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = o->ctx ? o->ctx : n;
    sp.n_batch = o->batch ? o->batch : n;
    qwenc_session *s = NULL;
    float *logits = malloc((size_t)n * V * sizeof(float));
    FILE *f = NULL;
    if (!logits) {
        fprintf(stderr, "qwenc: out of memory for %d x %d logits\n", n, V);
        goto done;
    }
    if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) {
        fprintf(stderr, "qwenc: %s\n", err);
        goto done;
    }
    int step = o->batch ? o->batch : n;
    for (int i = 0; i < n; i += step) {
        int c = n - i < step ? n - i : step;
        if (qwenc_session_forward(s, ids + i, c, logits + (size_t)i * V, 1, err, sizeof(err))) {
            fprintf(stderr, "qwenc: %s\n", err);
            goto done;
        }
    }
    f = fopen(o->out, "wb");
    if (!f) {
        fprintf(stderr, "qwenc: cannot write %s: %s\n", o->out, strerror(errno));
        goto done;
    }
    int wr = fwrite(logits, sizeof(float), (size_t)n * V, f) == (size_t)n * V;
    if (fclose(f) != 0 || !wr) {
        fprintf(stderr, "qwenc: error writing %s\n", o->out);
        f = NULL;
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    free(logits);
    qwenc_session_free(s);
    qwenc_model_free(m);
    free(ids);
    return rc;
}

/* ------------------------------------------------------------------ tokenizer commands */

static int cmd_tokenize(cli_opts *o) {
    size_t len = 0;
    char *text = NULL;
    if (o->file) {
        text = cli_slurp(o->file, &len);
        if (!text) return 1;
    } else if (o->positional) {
        text = strdup(o->positional);
        len = strlen(text);
    } else {
        fprintf(stderr, "qwenc: tokenize: give TEXT or --file F\n");
        return 1;
    }
    qwenc_tokenizer *t = cli_load_tokenizer(o);
    int rc = 1;
    int32_t *ids = NULL;
    int n = 0;
    char err[1024];
    if (t) {
        if (qwenc_tokenize(t, text, len, 0, !o->no_parse_special, &ids, &n, err, sizeof(err))) {
            fprintf(stderr, "qwenc: %s\n", err);
        } else {
            for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
            printf("\n");
            rc = 0;
        }
    }
    free(ids);
    free(text);
    qwenc_tokenizer_free(t);
    return rc;
}

static int cmd_detokenize(cli_opts *o) {
    const char *src = o->tokens ? o->tokens : o->positional;
    if (!src) return fprintf(stderr, "qwenc: detokenize: give the ids, e.g. qwenc detokenize -m DIR 1,2,3\n"), 1;
    int n = 0;
    int32_t *ids = parse_ids(src, "detokenize", &n);
    if (!ids) return 1;
    qwenc_tokenizer *t = cli_load_tokenizer(o);
    int rc = 1;
    char err[1024], *text = NULL;
    size_t len = 0;
    if (t) {
        if (qwenc_detokenize(t, ids, n, 0, &text, &len, err, sizeof(err))) {
            fprintf(stderr, "qwenc: %s\n", err);
        } else {
            fwrite(text, 1, len, stdout); /* exactly the decoded bytes */
            rc = 0;
        }
    }
    free(text);
    free(ids);
    qwenc_tokenizer_free(t);
    return rc;
}

static int cmd_chat_template(cli_opts *o) {
    if (!o->request) return fprintf(stderr, "qwenc: chat-template: --request F.json is required\n"), 1;
    char *req = cli_slurp(o->request, NULL);
    if (!req) return 1;
    qwenc_tokenizer *t = cli_load_tokenizer(o);
    int rc = 1;
    char err[1024], *out = NULL;
    if (t) {
        const char *tmpl = qwenc_tokenizer_chat_template(t);
        if (!tmpl) {
            fprintf(stderr, "qwenc: %s has no chat template (tokenizer_config.json \"chat_template\" or "
                            "chat_template.jinja)\n", o->model);
        } else if (qwenc_chat_render(tmpl, req, o->add_gen, o->no_think ? 0 : -1, cli_bos_token(t),
                                     qwenc_tokenizer_eos_str(t), &out, err, sizeof(err))) {
            fprintf(stderr, "qwenc: %s: %s\n", o->request, err);
        } else {
            fputs(out, stdout);
            rc = 0;
        }
    }
    free(out);
    free(req);
    qwenc_tokenizer_free(t);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    static const struct {
        const char *name;
        int (*fn)(cli_opts *);
    } cmds[] = {
        {"run", cmd_run},
        {"chat", cmd_chat},
        {"info", cmd_info},
        {"logits", cmd_logits},
        {"tokenize", cmd_tokenize},
        {"detokenize", cmd_detokenize},
        {"chat-template", cmd_chat_template},
        {"bench", cmd_bench},
        {"perplexity", cmd_perplexity},
        {"quantize", cmd_quantize},
        {"synth", cmd_synth},
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(argv[1], cmds[i].name)) {
            cli_opts o;
            memset(&o, 0, sizeof(o));
            if (!parse_opts(argc, argv, &o)) return 1;
            return cmds[i].fn(&o);
        }
    fprintf(stderr, "qwenc: unknown command \"%s\" (see qwenc --help)\n", argv[1]);
    return 1;
}
