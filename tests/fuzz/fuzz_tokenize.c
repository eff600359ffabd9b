/*
 * fuzz_tokenize.c - fuzz target: encoding text with real tokenizers (text/tok_encode.c, tok_decode.c).
 *
 * The tokenizers are the fixtures of tests/tokenizers (and models/tiny-flash), loaded once. Input: byte 0
 * picks the tokenizer (bits 0-2) and the flags add_bos (bit 3) and parse_special (bit 4); the rest is the
 * text. Properties: fuzz_tok.h's (every id in range, decode == streaming decode, valid UTF-8); for the
 * byte-level tokenizers without lossy steps (no normalizer but NFC, no lstrip/rstrip tokens) and text that
 * is valid UTF-8 already in NFC, decode(encode(text)) == text; without parse_special and add_bos, text never
 * encodes to a special token other than the unknown token (user text cannot forge <|im_end|>).
 */
#include <utf8proc.h>

#include "fuzz_tok.h"

static const struct {
    const char *dir;
    int lossless; /* decode(encode(x)) == x for valid NFC text */
} TOKS[] = {
    {"models/tiny-flash", 1},        {"tests/tokenizers/qwen3", 1},         {"tests/tokenizers/llama3", 1},
    {"tests/tokenizers/spm_bpe", 0}, {"tests/tokenizers/metaspace_bpe", 0}, {"tests/tokenizers/bytelevel_bpe", 0},
};
#define N_TOKS ((int)(sizeof(TOKS) / sizeof(TOKS[0])))

static qwenc_tokenizer *toks[N_TOKS];
static int loaded;

/* A tokenizer that cannot be loaded (llama3 is fetched by make test) leaves its inputs untested. */
static void load_all(void) {
    for (int i = 0; i < N_TOKS; i++) {
        char err[1024];
        if (qwenc_tokenizer_load(fz_path(TOKS[i].dir), &toks[i], err, sizeof(err))) {
            fprintf(stderr, "fuzz_tokenize: skipping %s: %s\n", TOKS[i].dir, err);
            continue;
        }
        loaded++;
    }
    if (!loaded) {
        fprintf(stderr, "fuzz_tokenize: no tokenizer could be loaded (run from the repository root or set QWENC_ROOT)\n");
        abort();
    }
}

/* 1 if s is valid UTF-8 and already in NFC. */
static int is_nfc(const char *s, size_t n) {
    if (!qw_utf8_is_valid(s, n) || memchr(s, 0, n)) return 0;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    int same = r >= 0 && (size_t)r == n && !memcmp(nfc, s, n);
    free(nfc);
    return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!loaded) load_all();
    if (size < 1) return 0;
    int k = (data[0] & 7) % N_TOKS, add_bos = (data[0] >> 3) & 1, parse_special = (data[0] >> 4) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (!toks[k]) return 0;
    char *dec = NULL;
    size_t dl = 0;
    int n = 0;
    int32_t *ids = fz_tok_roundtrip(toks[k], text, len, add_bos, parse_special, &n, &dec, &dl);
    if (!parse_special && !add_bos)
        for (int i = 0; i < n; i++)
            FZ_CHECK(!qwenc_tokenizer_is_special(toks[k], ids[i]) || ids[i] == toks[k]->unk_id,
                     "tokenizer %d: plain text gave special token %d at %d", k, ids[i], i);
    if (TOKS[k].lossless && !add_bos && is_nfc(text, len))
        FZ_CHECK(dl == len && !memcmp(dec, text, len), "tokenizer %d: decode(encode(x)) != x (%zu vs %zu bytes)", k, dl,
                 len);
    free(dec);
    free(ids);
    return 0;
}
