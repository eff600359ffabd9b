/*
 * qwenc.c - the command-line interface: main, loading, reading input files, signals, and the small commands
 * (info, logits, tokenize, detokenize, chat-template). The commands and their options are in opts.c; run and
 * chat in chat.c, bench, perplexity, quantize and synth in their own files. Every command goes through
 * include/qwenc.h only. Errors go to stderr as "qwenc: ..." with exit status 1.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* ------------------------------------------------------------------ loading */

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

qwenc_synth_params cli_synth_params(const cli_opts *o, const char *preset) {
    qwenc_synth_params sp = qwenc_synth_default_params();
    sp.preset = preset;
    sp.arch = o->arch;
    sp.n_layer = o->layers;
    sp.n_expert = o->experts;
    sp.n_embd = o->hidden;
    sp.n_vocab = o->vocab;
    sp.ngram_base = o->ngram_base;
    sp.mtp = o->synth_mtp;
    if (o->seed_set) sp.seed = o->sp.seed;
    return sp;
}

qwenc_model *cli_load_model(const cli_opts *o) {
    char err[1024];
    qwenc_model *m = NULL;
    qwenc_model_params mp = qwenc_model_default_params();
    mp.n_threads = o->threads;
    mp.kernels = o->kernels;
    mp.backend = o->backend;
    mp.gpus = o->gpus;
    mp.split = o->split;
    mp.f32_activations = o->f32_act;
    mp.quant = o->quant;
    mp.no_draft_head = o->no_mtp;
    cli_progress ps = {.tty = isatty(2), .t0 = cli_now_s(), .last_tensor = -1, .min_bytes = (uint64_t)256 << 20};
    if (o->quant || o->synth) {
        mp.progress = cli_show_progress;
        mp.progress_user = &ps;
    }
    if (o->synth) {
        qwenc_synth_params sp = cli_synth_params(o, o->synth);
        if (qwenc_model_synth(&sp, o->type, &mp, &m, err, sizeof(err))) {
            if (ps.shown && ps.tty) fprintf(stderr, "\n");
            fprintf(stderr, "qwenc: cannot make the model: %s\n", err);
            return NULL;
        }
        if (ps.shown)
            fprintf(stderr, "qwenc: made random %s weights (%s, seed %llu) on the %s in %.1f s\n", o->synth, o->type,
                    sp.seed, qwenc_model_backend(m), cli_now_s() - ps.t0);
        return m;
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

/* Whole file into memory (the prompt, a text or a request), bounded by CLI_MAX_INPUT. */
char *cli_slurp(const char *path, size_t *len) {
    int is_stdin = !strcmp(path, "-");
    const char *name = is_stdin ? "standard input" : path;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "qwenc: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    int is_dir = 0, too_big = 0;
    if (fstat(fileno(f), &st) == 0) {
        is_dir = S_ISDIR(st.st_mode);
        too_big = S_ISREG(st.st_mode) && (uint64_t)st.st_size > CLI_MAX_INPUT;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = is_dir || too_big ? NULL : malloc(cap);
    for (size_t r; buf && n <= CLI_MAX_INPUT && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap && n <= CLI_MAX_INPUT) { /* a byte past the limit is enough to refuse */
            size_t ncap = cap * 2 > CLI_MAX_INPUT + 2 ? CLI_MAX_INPUT + 2 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) free(buf);
            buf = nb;
            cap = ncap;
        }
    }
    too_big |= buf && n > CLI_MAX_INPUT;
    int bad = !is_dir && !too_big && (!buf || ferror(f));
    int errnum = errno;
    if (!is_stdin) fclose(f);
    if (is_dir || too_big || bad) {
        if (is_dir)
            fprintf(stderr, "qwenc: %s is a directory; give a file\n", name);
        else if (too_big)
            fprintf(stderr, "qwenc: %s holds more than %zu MiB, the most qwenc reads as a prompt, text or request\n",
                    name, CLI_MAX_INPUT >> 20);
        else
            fprintf(stderr, "qwenc: cannot read %s: %s\n", name, buf ? strerror(errnum) : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* ------------------------------------------------------------------ signals */

volatile sig_atomic_t cli_stop_signal;
static volatile sig_atomic_t sig_mode;

static void on_signal(int sig) {
    if (sig_mode == CLI_SIG_STOP && cli_stop_signal) { /* the second: stop now, as the signal would */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    cli_stop_signal = sig;
}

void cli_signals(int mode) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sig_mode = mode;
    sa.sa_handler = mode == CLI_SIG_DEFAULT ? SIG_DFL : on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ------------------------------------------------------------------ info / logits */

int cmd_info(cli_opts *o) {
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

int cmd_logits(cli_opts *o) {
    if (!o->tokens) return fprintf(stderr, "qwenc: logits: --tokens IDS is required\n"), 1;
    if (!o->out) return fprintf(stderr, "qwenc: logits: --out FILE is required\n"), 1;
    int n = 0;
    int32_t *ids = parse_ids(o->tokens, "--tokens", &n);
    if (!ids) return 1;
    if (o->ctx && n > o->ctx) {
        fprintf(stderr, "qwenc: logits: %d tokens exceed the session context of %d tokens (-c %d): raise -c, or "
                        "leave it out (the default is the number of tokens)\n", n, o->ctx, o->ctx);
        free(ids);
        return 1;
    }
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

int cmd_tokenize(cli_opts *o) {
    size_t len = 0;
    char *text = NULL;
    if (o->file) {
        text = cli_slurp(o->file, &len);
        if (!text) return 1;
    } else if (o->positional) {
        text = strdup(o->positional);
        len = strlen(text);
    } else {
        fprintf(stderr, "qwenc: tokenize: give TEXT or -f FILE\n");
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

int cmd_detokenize(cli_opts *o) {
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

int cmd_chat_template(cli_opts *o) {
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
    cli_opts o;
    int rc = cli_parse(argc, argv, &o);
    return rc >= 0 ? rc : o.cmd->fn(&o);
}
