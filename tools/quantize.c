/*
 * quantize.c - `qwenc quantize -m HF_DIR|FILE.gguf -o OUT.gguf --type TYPE` (or `qwenc quantize MODEL OUT.gguf
 * TYPE`, as llama-quantize): write the model as the GGUF that llama.cpp's converter (+ llama-quantize for block
 * types) would write, with a progress bar on stderr. `qwenc synth --preset NAME ... --type TYPE -o OUT.gguf`:
 * the same for a model with random weights. The work is the library's (qwenc_model_save_gguf,
 * qwenc_synth_gguf), which writes a temporary file beside OUT.gguf and renames it when complete; this file
 * reports and draws (the progress bar is also the one of quantizing at load, --quant). SIGINT or SIGTERM
 * cancels through the progress callback: the library removes the temporary file and OUT.gguf is untouched.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* A bar redrawn in place on a terminal; one line per finished tensor otherwise (logs, pipes). */
int cli_show_progress(const char *tensor, const char *type, int i, int n, uint64_t done, uint64_t total, void *user) {
    cli_progress *ps = user;
    if (cli_stop_signal) return 1;
    if (total < ps->min_bytes) return 0;
    ps->shown = 1;
    double now = cli_now_s(), frac = total ? (double)done / (double)total : 1.0;
    if (ps->tty) {
        if (now - ps->last < 0.1 && done < total) return 0;
        ps->last = now;
        enum { W = 30 };
        char bar[W + 1];
        int fill = (int)(frac * W);
        for (int k = 0; k < W; k++) bar[k] = k < fill ? '=' : k == fill ? '>' : ' ';
        bar[W] = 0;
        fprintf(stderr, "\r[%s] %3d%%  %4d/%-4d %8.1f MiB  %-34.34s %-6s", bar, (int)(frac * 100), i + 1, n,
                done / 1048576.0, tensor, type);
        if (done >= total) fprintf(stderr, "\n");
    } else if (i != ps->last_tensor || done >= total) {
        ps->last_tensor = i;
        fprintf(stderr, "[%3d%%] %4d/%-4d %-40s %s\n", (int)(frac * 100), i + 1, n, tensor, type);
    }
    fflush(stderr);
    return 0;
}

/* The size of the written file, for the closing line. */
static void report_written(const char *path, double t0) {
    FILE *f = fopen(path, "rb");
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (f) fclose(f);
    fprintf(stderr, "qwenc: wrote %s: %.1f MiB in %.1f s\n", path, size / 1048576.0, cli_now_s() - t0);
}

/* The end of a write the library refused or a signal cancelled. */
static int write_failed(const char *cmd, const char *out, const char *err, const cli_progress *ps) {
    if (ps->tty && ps->shown) fprintf(stderr, "\n");
    int sig = cli_stop_signal;
    cli_signals(CLI_SIG_DEFAULT);
    if (sig) {
        fprintf(stderr, "qwenc: %s: interrupted; %s was not written\n", cmd, out);
        return 128 + sig;
    }
    fprintf(stderr, "qwenc: %s: %s\n", cmd, err);
    return 1;
}

int cmd_quantize(cli_opts *o) {
    if (!o->type) {
        fprintf(stderr, "qwenc: quantize: the type is required: --type TYPE, or the last argument (one of %s)\n",
                qwenc_gguf_types());
        return 1;
    }
    if (!o->out) {
        fprintf(stderr, "qwenc: quantize: -o OUT.gguf is required\n");
        return 1;
    }
    qwenc_model *m = cli_load_model(o);
    if (!m) return 1;
    cli_progress ps = {.tty = isatty(2), .t0 = cli_now_s(), .last_tensor = -1};
    qwenc_gguf_params gp = qwenc_gguf_default_params();
    gp.type = o->type;
    gp.n_threads = o->threads;
    gp.progress = cli_show_progress;
    gp.user = &ps;
    char err[1024];
    fprintf(stderr, "qwenc: writing %s (%s, %s) as %s\n", o->out, qwenc_model_arch(m), o->model, o->type);
    if (qwenc_model_has_draft_head(m))
        fprintf(stderr, "qwenc: with the MTP draft head (the block after the last layer, nextn_predict_layers 1)%s\n",
                strcmp(qwenc_model_arch(m), "qwen4_exp")
                    ? ""
                    : "; llama.cpp reads qwen4exp files only without it (--no-mtp leaves it out)");
    cli_signals(CLI_SIG_STOP);
    qwenc_status st = qwenc_model_save_gguf(m, o->out, &gp, err, sizeof(err));
    qwenc_model_free(m);
    if (st) return write_failed("quantize", o->out, err, &ps);
    cli_signals(CLI_SIG_DEFAULT);
    report_written(o->out, ps.t0);
    return 0;
}

int cmd_synth(cli_opts *o) {
    if (!o->preset || !o->type || !o->out) {
        fprintf(stderr, "qwenc: synth: --preset NAME (%s), --type TYPE (%s) and -o OUT.gguf are required\n",
                qwenc_synth_presets(), qwenc_gguf_types());
        return 1;
    }
    qwenc_synth_params sp = cli_synth_params(o, o->preset);
    cli_progress ps = {.tty = isatty(2), .t0 = cli_now_s(), .last_tensor = -1};
    qwenc_gguf_params gp = qwenc_gguf_default_params();
    gp.type = o->type;
    gp.n_threads = o->threads;
    gp.progress = cli_show_progress;
    gp.user = &ps;
    char err[1024];
    fprintf(stderr, "qwenc: writing %s (random %s, seed %llu) as %s\n", o->out, o->preset, sp.seed, o->type);
    cli_signals(CLI_SIG_STOP);
    if (qwenc_synth_gguf(&sp, o->out, &gp, err, sizeof(err))) return write_failed("synth", o->out, err, &ps);
    cli_signals(CLI_SIG_DEFAULT);
    report_written(o->out, ps.t0);
    return 0;
}
