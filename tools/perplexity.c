/*
 * perplexity.c - `qwenc perplexity -m MODEL -f TEXT [-c N]`: how well the model predicts a text.
 *
 * The text is tokenized (with BOS if the tokenizer adds one; special-token text is read as the special
 * token unless --no-parse-special, as the Hugging Face tokenizer does) and cut into consecutive chunks of N tokens
 * (default 512; the last, shorter chunk is kept if it has at least 2 tokens). Each chunk starts a fresh
 * session; every token after the first of a chunk is scored by the log-softmax of the logits at the
 * position before it, in double precision. Perplexity = exp(mean negative log-likelihood). Progress goes
 * to stderr as [chunk]running-ppl, llama.cpp style; the result to stdout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cmd_perplexity(cli_opts *o) {
    if (!o->file) return fprintf(stderr, "qwenc: perplexity: -f TEXT_FILE is required\n"), 1;
    if (o->ctx == 1) /* every chunk's first token has nothing before it: a chunk of 1 scores nothing */
        return fprintf(stderr, "qwenc: perplexity: -c 1 leaves no token to score (each chunk scores its tokens "
                               "after the first): give -c 2 or more (default 512)\n"), 1;
    size_t len = 0;
    char *text = cli_slurp(o->file, &len);
    if (!text) return 1;
    int rc = 1, n = 0, chunk = o->ctx ? o->ctx : 512;
    int32_t *ids = NULL;
    float *logits = NULL;
    char err[1024];
    qwenc_session *s = NULL;
    qwenc_model *m = NULL;
    qwenc_tokenizer *tok = cli_load_tokenizer(o);
    if (!tok || !(m = cli_load_model(o))) goto done;
    if (qwenc_tokenize(tok, text, len, 1, !o->no_parse_special, &ids, &n, err, sizeof(err))) {
        fprintf(stderr, "qwenc: %s: %s\n", o->file, err);
        goto done;
    }
    if (n < 2) {
        fprintf(stderr, "qwenc: perplexity: %s is %d token%s long; at least 2 are needed (one to score after "
                        "another): give a longer text\n", o->file, n, n == 1 ? "" : "s");
        goto done;
    }
    if (chunk > n) chunk = n; /* a text shorter than a chunk is one chunk: no room for tokens that never come */
    int V = qwenc_model_n_vocab(m);
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = chunk;
    if (o->batch) sp.n_batch = o->batch;
    if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) {
        fprintf(stderr, "qwenc: %s\n", err);
        goto done;
    }
    logits = malloc((size_t)chunk * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "qwenc: out of memory for %d x %d logits\n", chunk, V);
        goto done;
    }
    double nll = 0, nll2 = 0, t0 = cli_now_s();
    long scored = 0;
    int n_chunks = 0;
    fprintf(stderr, "qwenc: %d tokens in chunks of %d\n", n, chunk);
    for (int start = 0; start + 1 < n; start += chunk) {
        int c = n - start < chunk ? n - start : chunk;
        if (c < 2) break;
        qwenc_session_reset(s);
        if (qwenc_session_forward(s, ids + start, c, logits, 1, err, sizeof(err))) {
            fprintf(stderr, "\nqwenc: %s\n", err);
            goto done;
        }
        for (int i = 0; i + 1 < c; i++) {
            const float *l = logits + (size_t)i * V;
            float mx = l[0];
            for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
            double sum = 0;
            for (int v = 0; v < V; v++) sum += exp((double)l[v] - mx);
            double x = log(sum) + mx - l[ids[start + i + 1]];
            nll += x;
            nll2 += x * x;
            scored++;
        }
        n_chunks++;
        fprintf(stderr, "[%d]%.4f,", n_chunks, exp(nll / scored));
    }
    if (scored == 0 || !isfinite(nll)) { /* cannot happen with chunks of 2 or more and finite logits */
        fprintf(stderr, "qwenc: perplexity: %s\n", scored ? "the model gave non-finite logits" : "no token scored");
        goto done;
    }
    double mean = nll / scored, sd = sqrt(fmax(nll2 / scored - mean * mean, 0) / (scored > 1 ? scored - 1 : 1));
    fprintf(stderr, "\nqwenc: %ld tokens scored in %.2f s\n", scored, cli_now_s() - t0);
    /* the spread of the mean NLL carried to the perplexity, first order */
    printf("perplexity %.4f +/- %.4f (mean NLL %.6f over %ld tokens, %d chunks of up to %d)\n", exp(mean),
           exp(mean) * sd, mean, scored, n_chunks, chunk);
    rc = 0;
done:
    free(logits);
    qwenc_session_free(s);
    qwenc_model_free(m);
    qwenc_tokenizer_free(tok);
    free(ids);
    free(text);
    return rc;
}
