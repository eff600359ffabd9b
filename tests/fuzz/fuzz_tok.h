/*
 * fuzz_tok.h - the checks every fuzz target runs on a tokenizer it managed to load or was given: every id
 * encoding gives is in [0, n_vocab), decoding succeeds and gives valid UTF-8, streaming decode gives the
 * same bytes as whole decode, and the getters stay in range.
 */
#ifndef QW_FUZZ_TOK_H
#define QW_FUZZ_TOK_H

#include "fuzz_util.h"
#include "text/tok_internal.h"

/* Encode text (len bytes) with tok, check the ids, decode them both ways; returns the ids (caller frees). */
static inline int32_t *fz_tok_roundtrip(const qwenc_tokenizer *tok, const char *text, size_t len, int add_bos,
                                        int parse_special, int *n_out, char **decoded, size_t *dec_len) {
    char err[1024] = "";
    int32_t *ids = NULL;
    int n = 0;
    qwenc_status st = qwenc_tokenize(tok, text, len, add_bos, parse_special, &ids, &n, err, sizeof(err));
    FZ_CHECK(st == QWENC_OK, "tokenize failed: %s", err);
    int nv = qwenc_tokenizer_n_vocab(tok);
    for (int i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d at %d outside [0, %d)", ids[i], i, nv);
    for (int skip = 0; skip < 2; skip++) {
        char *out = NULL;
        size_t ol = 0;
        st = qwenc_detokenize(tok, ids, n, skip, &out, &ol, err, sizeof(err));
        FZ_CHECK(st == QWENC_OK && out, "detokenize failed: %s", err);
        FZ_CHECK(strlen(out) <= ol && out[ol] == 0, "decoded text not terminated");
        FZ_CHECK(qw_utf8_is_valid(out, ol), "decoded text is not valid UTF-8");
        /* streaming: the pieces concatenate to the whole decode */
        qwenc_detok *d = qwenc_detok_new(tok, skip);
        FZ_CHECK(d, "detok_new failed");
        char *cat = malloc(ol + 64);
        size_t cl = 0, cap = ol + 64;
        for (int i = 0; i <= n; i++) {
            const char *piece = NULL;
            size_t pl = i < n ? qwenc_detok_push(d, ids[i], &piece) : qwenc_detok_flush(d, &piece);
            FZ_CHECK(qw_utf8_is_valid(piece, pl), "a streamed piece is not valid UTF-8");
            if (cl + pl > cap) {
                cap = 2 * (cl + pl);
                cat = realloc(cat, cap);
            }
            memcpy(cat + cl, piece, pl);
            cl += pl;
        }
        qwenc_detok_free(d);
        FZ_CHECK(cl == ol && !memcmp(cat, out, ol), "streamed decode differs from decode (%zu vs %zu bytes)", cl, ol);
        free(cat);
        if (skip == 0 && decoded) {
            *decoded = out;
            *dec_len = ol;
        } else {
            free(out);
        }
    }
    *n_out = n;
    return ids;
}

/* The whole contract on a few fixed texts, plus the getters. */
static inline void fz_tok_exercise(const qwenc_tokenizer *tok) {
    static const char *const texts[] = {
        "Hello, world! It's 2024: 12345 tokens.",
        " leading  and\ttrailing \n\n spaces ",
        "<|im_start|>user\nHi<|im_end|>\n<s></s><unk><think>x</think>",
        "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 e\xcc\x81 \xef\xbc\xa1",
        "bad \xff\xfe utf8 \xe4\xb8",
    };
    for (size_t k = 0; k < sizeof(texts) / sizeof(texts[0]); k++) {
        int n = 0;
        int32_t *ids = fz_tok_roundtrip(tok, texts[k], strlen(texts[k]), (int)(k & 1), (int)(k != 2), &n, NULL, NULL);
        free(ids);
    }
    int nv = qwenc_tokenizer_n_vocab(tok);
    FZ_CHECK(nv > 0, "n_vocab %d", nv);
    int bos = qwenc_tokenizer_bos(tok);
    FZ_CHECK(bos >= -1 && bos < nv, "bos %d outside the vocabulary of %d", bos, nv);
    const int32_t *eos = NULL;
    int ne = qwenc_tokenizer_eos(tok, &eos);
    for (int i = 0; i < ne; i++) FZ_CHECK(eos[i] >= 0 && eos[i] < nv, "eos %d outside the vocabulary of %d", eos[i], nv);
    FZ_CHECK(qwenc_tokenizer_bos_str(tok) && qwenc_tokenizer_eos_str(tok), "NULL bos/eos string");
    for (int i = 0; i < nv && i < 4096; i++) {
        const char *s = qwenc_tokenizer_token_text(tok, i);
        FZ_CHECK(s, "NULL token text for %d", i);
        (void)qwenc_tokenizer_is_special(tok, i);
    }
    FZ_CHECK(qwenc_tokenizer_token_text(tok, -1)[0] == 0 && qwenc_tokenizer_token_text(tok, nv)[0] == 0,
             "out-of-range token text not empty");
}

#endif
