/*
 * tok_decode.c - token ids back to text, whole (qwenc_detokenize) and streaming (qwenc_detok_*).
 *
 * The decoder of tokenizer.json (ByteLevel; Replace, ByteFallback, Fuse, Strip, Metaspace as used by
 * sentencepiece-style files) is applied to each token once, at load, giving the bytes of every token
 * ("pieces"). Decoding concatenates pieces and replaces invalid UTF-8 by U+FFFD (maximal subparts, as the
 * library's String::from_utf8_lossy), so the output is always valid UTF-8 and equals the library's decode
 * wherever the pieces form valid text. Two decoder rules look at the position of a token: Metaspace drops
 * the replacement character of the first token and Strip after Fuse cuts the start of the whole text;
 * the first token is decoded on the spot for them.
 *
 * Known difference: ByteFallback in the library turns a run of <0xNN> tokens that is not valid UTF-8 into
 * one U+FFFD per byte; here the run is repaired like any other bytes (one U+FFFD per maximal subpart).
 * Valid runs (all that encoding produces) decode the same.
 *
 * Streaming keeps at most 3 bytes of an unfinished character between pushes and emits everything else,
 * so the concatenated output of pushes + flush is byte-identical to qwenc_detokenize.
 */
#include <string.h>

#include "text/tok_internal.h"

/* Replace every occurrence of `from` in s[0..n) by `to`, into out. */
static void replace_all(const char *s, size_t n, const char *from, const char *to, qw_buf *out) {
    size_t fl = strlen(from), tl = strlen(to), i = 0;
    while (i < n) {
        if (fl && i + fl <= n && memcmp(s + i, from, fl) == 0) {
            qw_buf_add(out, to, tl);
            i += fl;
        } else {
            qw_buf_addc(out, s[i++]);
        }
    }
}

/* Run the decoder steps on one token string. first: the token is the first of the text. */
static void decode_token(const qwenc_tokenizer *tok, int32_t id, int first, qw_buf *res) {
    qw_buf a = {0}, b = {0};
    qw_buf_add(&a, tok->token[id] ? tok->token[id] : "", tok->token[id] ? tok->token_len[id] : 0);
    int fused = 0;
    for (int i = 0; i < tok->n_dec; i++) {
        const qw_dec *d = &tok->dec[i];
        b.n = 0;
        qw_buf_add(&b, "", 0);
        switch (d->kind) {
        case QW_DEC_BYTELEVEL: {
            /* every character must be of the byte alphabet, else the token is kept as it is */
            int ok = 1;
            for (size_t k = 0; k < a.n && ok;) {
                int l = qw_utf8_valid_len((const uint8_t *)a.p + k, a.n - k);
                if (!l) {
                    ok = 0;
                    break;
                }
                int dl;
                int byte = qw_cp_to_byte(qw_utf8_decode((const uint8_t *)a.p + k, &dl));
                if (byte < 0) ok = 0;
                else qw_buf_addc(&b, (char)byte);
                k += (size_t)l;
            }
            if (!ok) {
                b.n = 0;
                qw_buf_add(&b, a.p, a.n);
            }
            fused = 1; /* the library's ByteLevel decoder joins all tokens into one string */
            break;
        }
        case QW_DEC_REPLACE:
            replace_all(a.p, a.n, d->str, d->str2, &b);
            break;
        case QW_DEC_BYTEFALLBACK: {
            int hex = a.n == 6 && memcmp(a.p, "<0x", 3) == 0 && a.p[5] == '>';
            unsigned v = 0;
            for (int k = 3; hex && k < 5; k++) {
                char ch = a.p[k];
                int dv = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
                         : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
                if (dv < 0) hex = 0;
                else v = v * 16 + (unsigned)dv;
            }
            if (hex) qw_buf_addc(&b, (char)v);
            else qw_buf_add(&b, a.p, a.n);
            break;
        }
        case QW_DEC_FUSE:
            fused = 1;
            qw_buf_add(&b, a.p, a.n);
            break;
        case QW_DEC_STRIP: {
            size_t cl = strlen(d->str), s0 = 0, e0 = a.n;
            if (!fused || first)
                for (int k = 0; k < d->start && cl && s0 + cl <= e0 && memcmp(a.p + s0, d->str, cl) == 0; k++) s0 += cl;
            if (!fused)
                for (int k = 0; k < d->stop && cl && e0 >= s0 + cl && memcmp(a.p + e0 - cl, d->str, cl) == 0; k++)
                    e0 -= cl;
            qw_buf_add(&b, a.p + s0, e0 - s0);
            break;
        }
        case QW_DEC_METASPACE:
            if (first && d->prepend) replace_all(a.p, a.n, d->str, "", &b);
            else replace_all(a.p, a.n, d->str, " ", &b);
            break;
        }
        qw_buf t2 = a;
        a = b;
        b = t2;
    }
    res->n = 0;
    qw_buf_add(res, a.p ? a.p : "", a.n);
    if (a.oom || b.oom) res->oom = 1;
    free(a.p);
    free(b.p);
}

int qw_tok_build_pieces(qwenc_tokenizer *tok) {
    tok->piece = calloc((size_t)tok->n_vocab, sizeof(*tok->piece));
    tok->piece_len = calloc((size_t)tok->n_vocab, sizeof(*tok->piece_len));
    if (!tok->piece || !tok->piece_len) return -1;
    qw_buf b = {0};
    for (int32_t id = 0; id < tok->n_vocab && !b.oom; id++) {
        b.n = 0;
        if (tok->token[id]) decode_token(tok, id, 0, &b);
        if (!(tok->piece[id] = malloc(b.n + 1))) b.oom = 1;
        else {
            if (b.n) memcpy(tok->piece[id], b.p, b.n);
            tok->piece[id][b.n] = 0;
            tok->piece_len[id] = (uint32_t)b.n;
        }
    }
    free(b.p);
    return b.oom ? -1 : 0;
}

/* Bytes of token id at its position: the cached piece, or decoded on the spot for a first token. */
static const char *token_bytes(const qwenc_tokenizer *tok, int32_t id, int first, qw_buf *tmp, size_t *len) {
    if (first && tok->dec_first) {
        decode_token(tok, id, 1, tmp);
        *len = tmp->n;
        return tmp->p;
    }
    *len = tok->piece_len[id];
    return tok->piece[id];
}

qwenc_status qwenc_detokenize(const qwenc_tokenizer *tok, const int32_t *ids, int n, int skip_special, char **text,
                              size_t *len, char *err, size_t errlen) {
    if (!tok || !text || (!ids && n > 0) || n < 0)
        return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_detokenize: bad argument");
    *text = NULL;
    if (len) *len = 0;
    qw_buf raw = {0}, tmp = {0}, out = {0};
    int first = 1;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_vocab) {
            free(raw.p);
            free(tmp.p);
            return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_detokenize: token id %d (position %d) is not in [0, %d)",
                          (int)id, i, tok->n_vocab);
        }
        if (skip_special && tok->special[id]) continue;
        if (tok->dec_none && !first) qw_buf_addc(&raw, ' ');
        size_t l;
        const char *p = token_bytes(tok, id, first, &tmp, &l);
        qw_buf_add(&raw, p, l);
        first = 0;
    }
    qw_utf8_repair(raw.p ? raw.p : "", raw.n, &out);
    if (!out.p) qw_buf_add(&out, "", 0);
    int oom = raw.oom || tmp.oom || out.oom;
    free(raw.p);
    free(tmp.p);
    if (oom) {
        free(out.p);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "qwenc_detokenize: out of memory decoding %d tokens", n);
    }
    *text = out.p;
    if (len) *len = out.n;
    return QWENC_OK;
}

/* ---------------------------------------------------------------- streaming */

struct qwenc_detok {
    const qwenc_tokenizer *tok;
    int skip_special;
    int first;
    uint8_t pend[4]; /* the start of a character whose last bytes have not come yet */
    int n_pend;
    qw_buf in, out, tmp;
};

qwenc_detok *qwenc_detok_new(const qwenc_tokenizer *tok, int skip_special) {
    if (!tok) return NULL;
    qwenc_detok *d = calloc(1, sizeof(*d));
    if (!d) return NULL;
    d->tok = tok;
    d->skip_special = skip_special;
    d->first = 1;
    qw_buf_add(&d->out, "", 0);
    if (d->out.oom) {
        free(d);
        return NULL;
    }
    return d;
}

void qwenc_detok_free(qwenc_detok *d) {
    if (!d) return;
    free(d->in.p);
    free(d->out.p);
    free(d->tmp.p);
    free(d);
}

/* Move the complete characters of d->in to d->out (invalid bytes as U+FFFD); keep an unfinished tail. */
static void emit(qwenc_detok *d, int final) {
    const uint8_t *s = (const uint8_t *)d->in.p;
    size_t n = d->in.n, i = 0;
    d->n_pend = 0;
    while (i < n) {
        int l = qw_utf8_valid_len(s + i, n - i);
        if (l) {
            qw_buf_add(&d->out, s + i, (size_t)l);
            i += (size_t)l;
            continue;
        }
        int p = qw_utf8_partial_len(s + i, n - i);
        if (p > 0 && i + (size_t)p == n && !final) { /* may still complete */
            memcpy(d->pend, s + i, (size_t)p);
            d->n_pend = p;
            break;
        }
        qw_buf_add(&d->out, "\xef\xbf\xbd", 3);
        i += p ? (size_t)p : 1;
    }
}

size_t qwenc_detok_push(qwenc_detok *d, int32_t id, const char **out) {
    d->out.n = 0;
    d->out.p[0] = 0;
    *out = d->out.p;
    const qwenc_tokenizer *tok = d->tok;
    if (id < 0 || id >= tok->n_vocab || (d->skip_special && tok->special[id])) return 0;
    d->in.n = 0;
    qw_buf_add(&d->in, d->pend, (size_t)d->n_pend);
    if (tok->dec_none && !d->first) qw_buf_addc(&d->in, ' ');
    size_t l;
    const char *p = token_bytes(tok, id, d->first, &d->tmp, &l);
    qw_buf_add(&d->in, p, l);
    d->first = 0;
    emit(d, 0);
    *out = d->out.p;
    return d->out.n;
}

size_t qwenc_detok_flush(qwenc_detok *d, const char **out) {
    d->out.n = 0;
    d->out.p[0] = 0;
    d->in.n = 0;
    qw_buf_add(&d->in, d->pend, (size_t)d->n_pend);
    emit(d, 1);
    d->n_pend = 0;
    d->first = 1;
    *out = d->out.p;
    return d->out.n;
}
