/*
 * qwenc.c - the command-line interface. Every subcommand goes through include/qwenc.h only.
 *
 *   qwenc info   --model DIR
 *   qwenc logits --model DIR --tokens 3,17,9 --out FILE [--batch N] [--ctx N]
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qwenc.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: qwenc <command> [options]\n"
            "\n"
            "commands:\n"
            "  info    --model DIR                       architecture, layer plan, parameters, dtypes\n"
            "  logits  --model DIR --tokens IDS --out FILE [--batch N] [--ctx N]\n"
            "          run the model over the comma-separated token ids IDS and write one row of\n"
            "          float32 little-endian logits per input position (T x vocab) to FILE.\n"
            "          --batch N feeds N tokens per forward call (default: all in one call; 1: token by token)\n"
            "\n"
            "options:\n"
            "  -m, --model DIR   a Hugging Face checkpoint directory (config.json + *.safetensors)\n"
            "  -h, --help        this help\n");
}

static int fail(const char *fmt, const char *a) {
    fprintf(stderr, "qwenc: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 1;
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

/* Parse "3,17,9" into a new array. */
static int32_t *parse_tokens(const char *s, int *n) {
    int cap = 16;
    *n = 0;
    int32_t *v = malloc((size_t)cap * sizeof(int32_t));
    if (!v) return NULL;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            fprintf(stderr, "qwenc: --tokens: \"%.20s\" is not a non-negative integer (token %d)\n", p, *n);
            free(v);
            return NULL;
        }
        if (*n == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof(int32_t));
            if (!nv) {
                free(v);
                return NULL;
            }
            v = nv;
        }
        v[(*n)++] = (int32_t)x;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (*p == ',') {
            p++;
            if (!*p) break;
        } else if (*p) {
            fprintf(stderr, "qwenc: --tokens: unexpected character '%c' after token %d\n", *p, *n - 1);
            free(v);
            return NULL;
        }
    }
    if (*n == 0) {
        fprintf(stderr, "qwenc: --tokens: no token ids given\n");
        free(v);
        return NULL;
    }
    return v;
}

typedef struct {
    const char *model, *tokens, *out;
    int batch, ctx;
} cli_opts;

static int parse_opts(int argc, char **argv, cli_opts *o) {
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) return fail("option %s needs a value (see qwenc --help)", a), 0;
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--tokens"))
            o->tokens = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--batch")) {
            if (!parse_int(v, "--batch", 1, &o->batch)) return 0;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (!parse_int(v, "--ctx", 1, &o->ctx)) return 0;
        } else
            return fail("unknown option %s (see qwenc --help)", a), 0;
    }
    if (!o->model) return fail("%s: --model DIR is required", argv[1]), 0;
    return 1;
}

static qwenc_model *load_model(const char *path) {
    char err[1024];
    qwenc_model *m = NULL;
    qwenc_status st = qwenc_model_load(path, &m, err, sizeof(err));
    if (st) {
        fprintf(stderr, "qwenc: cannot load model: %s\n", err);
        return NULL;
    }
    return m;
}

static int cmd_info(const cli_opts *o) {
    qwenc_model *m = load_model(o->model);
    if (!m) return 1;
    qwenc_model_print_info(m, stdout);
    qwenc_model_free(m);
    return 0;
}

static int cmd_logits(const cli_opts *o) {
    if (!o->tokens) return fail("%s", "logits: --tokens IDS is required");
    if (!o->out) return fail("%s", "logits: --out FILE is required");
    int n = 0;
    int32_t *ids = parse_tokens(o->tokens, &n);
    if (!ids) return 1;
    qwenc_model *m = load_model(o->model);
    if (!m) {
        free(ids);
        return 1;
    }
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
    if (fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V || fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "qwenc: error writing %s\n", o->out);
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    if (f) fclose(f);
    free(logits);
    qwenc_session_free(s);
    qwenc_model_free(m);
    free(ids);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    cli_opts o = {0};
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") && strcmp(cmd, "logits")) {
        fprintf(stderr, "qwenc: unknown command \"%s\" (see qwenc --help)\n", cmd);
        return 1;
    }
    if (!parse_opts(argc, argv, &o)) return 1;
    if (!strcmp(cmd, "info")) return cmd_info(&o);
    return cmd_logits(&o);
}
