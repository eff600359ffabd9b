/*
 * tok_encode.c - text to token ids, step by step as the Hugging Face `tokenizers` library does it
 * (tokenizer/mod.rs encode_single_sequence, added_vocabulary.rs, normalizers/, pre_tokenizers/,
 * models/bpe/{model,word}.rs):
 *
 *   1. bytes that are not valid UTF-8 become U+FFFD (maximal subparts), the string Python would pass;
 *   2. added tokens with normalized=false are found in the raw text (leftmost-longest, lstrip/rstrip/
 *      single_word; special ones only when parse_special);
 *   3. every other piece is normalized on its own, then searched for the normalized=true added tokens;
 *   4. the pre-tokenizer cuts the rest into words (Split with its regex and behaviour, ByteLevel with the
 *      byte alphabet and optional GPT-2 regex, Metaspace, Digits);
 *   5. each word goes through BPE: merges applied lowest rank first, leftmost on ties, with a binary heap
 *      as word.rs merge_all does (so the result is the library's even where merges compete), unknown
 *      characters through byte fallback or the unk token.
 *
 * Regexes are PCRE2 (JIT) compiled with PCRE2_UTF|PCRE2_UCP. The text is checked as UTF-8 once and every
 * match runs with PCRE2_NO_UTF_CHECK, so the split loop stays linear. The library's regex engine is
 * Oniguruma; the few escapes whose meaning differs (\s, \w, \h and their negations) are rewritten into
 * explicit classes with Oniguruma's Unicode meaning before compiling.
 */
#include <limits.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tok_internal.h"

/* ---------------------------------------------------------------- regex */

/* Oniguruma's Unicode classes, written for PCRE2 (inside a [...] without the brackets). */
static const char ONIG_SPACE[] =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";
static const char ONIG_WORD[] = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
static const char ONIG_HEX[] = "0-9a-fA-F";

/* Rewrite the escapes that mean something else in PCRE2 (see the file comment). */
static char *onig_to_pcre2(const char *p) {
    qw_buf b = {0};
    int in_class = 0;
    size_t i = 0, n = strlen(p);
    while (i < n) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            const char *cls = (e == 's' || e == 'S') ? ONIG_SPACE
                              : (e == 'w' || e == 'W') ? ONIG_WORD
                              : (e == 'h' || e == 'H') ? ONIG_HEX
                                                       : NULL;
            int neg = e == 'S' || e == 'W' || e == 'H';
            if (cls && !(in_class && neg)) {
                if (!in_class) qw_buf_add(&b, neg ? "[^" : "[", neg ? 2 : 1);
                qw_buf_add(&b, cls, strlen(cls));
                if (!in_class) qw_buf_addc(&b, ']');
            } else {
                qw_buf_add(&b, p + i, 2);
            }
            i += 2;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            qw_buf_addc(&b, c);
            i++;
            if (i < n && p[i] == '^') qw_buf_addc(&b, p[i++]);
            if (i < n && p[i] == ']') qw_buf_addc(&b, p[i++]); /* a leading ] is literal */
            continue;
        }
        if (c == '[' && in_class && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *end = strstr(p + i + 2, ":]");
            size_t len = end ? (size_t)(end - (p + i)) + 2 : 1;
            qw_buf_add(&b, p + i, len);
            i += len;
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        qw_buf_addc(&b, c);
        i++;
    }
    if (!b.p) qw_buf_add(&b, "", 0);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

qwenc_status qw_regex_compile(qw_regex *rx, const char *pattern, int literal, const char *file, const char *field,
                              char *err, size_t errlen) {
    char *pat = literal ? strdup(pattern) : onig_to_pcre2(pattern);
    if (!pat)
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: %s: out of memory compiling a regex", file, field);
    int code;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    rx->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &code, &off, NULL);
    free(pat);
    if (!rx->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof(msg));
        return qw_err(err, errlen, code == PCRE2_ERROR_HEAP_FAILED ? QWENC_ERR_NOMEM : QWENC_ERR_UNSUPPORTED,
                      "%s: %s: cannot compile regex \"%.200s\": %s at offset %zu", file, field, pattern,
                      (const char *)msg, (size_t)off);
    }
    if (!(rx->src = strdup(pattern))) {
        pcre2_code_free(rx->re);
        rx->re = NULL;
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: %s: out of memory compiling a regex", file, field);
    }
    rx->literal = literal;
    pcre2_jit_compile(rx->re, PCRE2_JIT_COMPLETE); /* without JIT (unsupported CPU) pcre2_match interprets */
    return QWENC_OK;
}

void qw_regex_free(qw_regex *rx) {
    if (rx->re) pcre2_code_free(rx->re);
    rx->re = NULL;
    free(rx->src);
    rx->src = NULL;
}

/* ---------------------------------------------------------------- encoding context */

typedef struct {
    size_t off, len; /* in ctx->pb */
    int first;       /* starts at offset 0 of the whole input (Metaspace prepend_scheme "first") */
} piece;

typedef struct {
    size_t s, e;
    int match;
} span;

typedef struct {
    int32_t id, prev, next;
    uint32_t len; /* bytes; 0 once merged into the symbol on its left */
} sym;

typedef struct {
    int32_t rank, pos, merged;
} hitem;

typedef struct {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    qw_buf nb[2]; /* normalizer output, ping-pong */
    qw_buf pb;    /* text of the pieces of the current segment */
    qw_buf tmp;
    piece *pc[2];
    size_t npc[2], cpc[2];
    span *sp;
    size_t nsp, csp;
    sym *sy;
    size_t csy;
    hitem *hp;
    size_t chp;
    int oom; /* an array could not grow (and the item was dropped): the result is QWENC_ERR_NOMEM */
} enc_ctx;

static void ctx_free(enc_ctx *c);

/* 0, or -1 when out of memory (c is then freed). */
static int ctx_init(enc_ctx *c) {
    memset(c, 0, sizeof(*c));
    c->md = pcre2_match_data_create(1, NULL);
    c->mctx = pcre2_match_context_create(NULL);
    c->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!c->md || !c->mctx) {
        ctx_free(c);
        return -1;
    }
    if (c->jit) pcre2_jit_stack_assign(c->mctx, NULL, c->jit); /* without it, the default 32 KiB stack */
    return 0;
}

/* Whether anything of c could not grow. */
static int ctx_oom(const enc_ctx *c) {
    return c->oom || c->nb[0].oom || c->nb[1].oom || c->pb.oom || c->tmp.oom;
}

static qwenc_status enc_nomem(char *err, size_t errlen) {
    return qw_err(err, errlen, QWENC_ERR_NOMEM, "tokenizer: out of memory encoding the text");
}

static void ctx_free(enc_ctx *c) {
    if (c->md) pcre2_match_data_free(c->md);
    if (c->mctx) pcre2_match_context_free(c->mctx);
    if (c->jit) pcre2_jit_stack_free(c->jit);
    free(c->nb[0].p);
    free(c->nb[1].p);
    free(c->pb.p);
    free(c->tmp.p);
    free(c->pc[0]);
    free(c->pc[1]);
    free(c->sp);
    free(c->sy);
    free(c->hp);
}

/* Room for element n of array ptr (capacity cap) of c; when it cannot grow, c->oom is set and the calling
 * (void) function returns without adding. */
#define GROW(ptr, n, cap)                                            \
    do {                                                             \
        if ((n) >= (cap)) {                                          \
            size_t nc_ = (cap) ? (cap) * 2 : 256;                    \
            while (nc_ <= (n)) nc_ *= 2;                             \
            void *np_ = c->oom ? NULL : realloc((ptr), nc_ * sizeof(*(ptr))); \
            if (!np_) {                                              \
                c->oom = 1;                                          \
                return;                                              \
            }                                                        \
            (ptr) = np_;                                             \
            (cap) = nc_;                                             \
        }                                                            \
    } while (0)

static void push_piece(enc_ctx *c, int k, size_t off, size_t len, int first) {
    if (len == 0) return; /* the library drops empty splits */
    GROW(c->pc[k], c->npc[k], c->cpc[k]);
    c->pc[k][c->npc[k]++] = (piece){off, len, first};
}

static void push_span(enc_ctx *c, size_t s, size_t e, int match) {
    GROW(c->sp, c->nsp, c->csp);
    c->sp[c->nsp++] = (span){s, e, match};
}

/* ---------------------------------------------------------------- matching */

/* c->sp = the matches of rx in s[0..n) and the gaps between them, covering s (tokenizers pattern.rs
 * find_matches). Empty matches are skipped. */
static qwenc_status find_matches(enc_ctx *c, const qw_regex *rx, const char *s, size_t n, char *err,
                                 size_t errlen) {
    c->nsp = 0;
    size_t prev = 0, at = 0;
    while (at < n) {
        int rc = pcre2_match(rx->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer regex failed: %s",
                          (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step over one character */
            int l = qw_utf8_valid_len((const uint8_t *)s + ms, n - ms);
            at = ms + (l ? (size_t)l : 1);
            continue;
        }
        if (prev < ms) push_span(c, prev, ms, 0);
        push_span(c, ms, me, 1);
        prev = at = me;
    }
    if (prev < n) push_span(c, prev, n, 0);
    return QWENC_OK;
}

/* Every occurrence of a literal string, as find_matches does for a regex. */
static void find_literal(enc_ctx *c, const char *lit, const char *s, size_t n) {
    c->nsp = 0;
    size_t ll = strlen(lit), prev = 0, at = 0;
    while (ll && at + ll <= n) {
        const char *hit = memchr(s + at, lit[0], n - at);
        if (!hit || (size_t)(hit - s) + ll > n) break;
        size_t ms = (size_t)(hit - s);
        if (memcmp(hit, lit, ll) != 0) {
            at = ms + 1;
            continue;
        }
        if (prev < ms) push_span(c, prev, ms, 0);
        push_span(c, ms, ms + ll, 1);
        prev = at = ms + ll;
    }
    if (prev < n) push_span(c, prev, n, 0);
}

/* Turn c->sp into pieces of list k per the split behaviour (normalizer.rs NormalizedString::split):
 * piece offsets are base + span offsets; `first` goes to the piece at relative offset 0. */
static void apply_behavior(enc_ctx *c, int k, qw_split_behavior b, int invert, size_t base, int first) {
    size_t n = c->nsp;
    if (invert)
        for (size_t i = 0; i < n; i++) c->sp[i].match = !c->sp[i].match;
    size_t out = 0; /* merge in place into c->sp[0..out) */
    int prev_match = 0;
    switch (b) {
    case QW_SPLIT_ISOLATED:
        out = n;
        break;
    case QW_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!c->sp[i].match) c->sp[out++] = c->sp[i];
        break;
    case QW_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (out > 0 && c->sp[i].match == prev_match) c->sp[out - 1].e = c->sp[i].e;
            else c->sp[out++] = c->sp[i];
            prev_match = c->sp[i].match;
        }
        break;
    case QW_SPLIT_PREV:
        for (size_t i = 0; i < n; i++) {
            int m = c->sp[i].match;
            if (m && !prev_match && out > 0) c->sp[out - 1].e = c->sp[i].e;
            else c->sp[out++] = c->sp[i];
            prev_match = m;
        }
        break;
    case QW_SPLIT_NEXT: {
        /* walk backwards: a match joins the piece after it, unless the previous (right) one matched */
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            int m = c->sp[i].match;
            if (m && !prev_match && w < n) c->sp[w].s = c->sp[i].s;
            else c->sp[--w] = c->sp[i];
            prev_match = m;
        }
        memmove(c->sp, c->sp + w, (n - w) * sizeof(*c->sp));
        out = n - w;
        break;
    }
    }
    for (size_t i = 0; i < out; i++) push_piece(c, k, base + c->sp[i].s, c->sp[i].e - c->sp[i].s, first && c->sp[i].s == 0);
}

/* ---------------------------------------------------------------- normalizer */

static int has_byte_at_least(const char *s, size_t n, uint8_t lim) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= lim) return 1;
    return 0;
}

/* One normalizer step from s into out (out is emptied first). */
static qwenc_status norm_step(const qw_norm *nm, enc_ctx *c, const char *s, size_t n, qw_buf *out, char *err,
                              size_t errlen) {
    out->n = 0;
    switch (nm->kind) {
    case QW_NORM_NFC:
    case QW_NORM_NFD:
    case QW_NORM_NFKC:
    case QW_NORM_NFKD: {
        /* Below U+0300 every character is NFC-stable and nothing composes with it; ASCII is stable in all
         * four forms. */
        int quick = nm->kind == QW_NORM_NFC ? !has_byte_at_least(s, n, 0xcc) : !has_byte_at_least(s, n, 0x80);
        if (quick) {
            qw_buf_add(out, s, n);
            return QWENC_OK;
        }
        int opt = UTF8PROC_STABLE;
        if (nm->kind == QW_NORM_NFC || nm->kind == QW_NORM_NFKC) opt |= UTF8PROC_COMPOSE;
        else opt |= UTF8PROC_DECOMPOSE;
        if (nm->kind == QW_NORM_NFKC || nm->kind == QW_NORM_NFKD) opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
        if (r < 0)
            return qw_err(err, errlen, r == UTF8PROC_ERROR_NOMEM ? QWENC_ERR_NOMEM : QWENC_ERR_ARG,
                          "tokenizer: normalizer: %s", utf8proc_errmsg(r));
        qw_buf_add(out, dst, (size_t)r);
        free(dst);
        return QWENC_OK;
    }
    case QW_NORM_LOWERCASE:
        for (size_t i = 0; i < n;) {
            if ((uint8_t)s[i] < 0x80) {
                char ch = s[i++];
                qw_buf_addc(out, (ch >= 'A' && ch <= 'Z') ? (char)(ch + 32) : ch);
                continue;
            }
            int l;
            uint32_t cp = qw_utf8_decode((const uint8_t *)s + i, &l);
            i += (size_t)l;
            char enc[8];
            if (cp == 0x130) { /* the one unconditional multi-character lowercase: I with dot above */
                qw_buf_add(out, "i\xcc\x87", 3);
                continue;
            }
            qw_buf_add(out, enc, (size_t)qw_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc));
        }
        return QWENC_OK;
    case QW_NORM_PREPEND:
        if (n) qw_buf_add(out, nm->str, strlen(nm->str));
        qw_buf_add(out, s, n);
        return QWENC_OK;
    case QW_NORM_REPLACE: {
        qwenc_status st = find_matches(c, &nm->rx, s, n, err, errlen);
        if (st) return st;
        size_t cl = strlen(nm->str);
        for (size_t i = 0; i < c->nsp; i++) {
            if (c->sp[i].match) qw_buf_add(out, nm->str, cl);
            else qw_buf_add(out, s + c->sp[i].s, c->sp[i].e - c->sp[i].s);
        }
        if (!out->p) qw_buf_add(out, "", 0);
        return QWENC_OK;
    }
    case QW_NORM_STRIP: {
        size_t a = 0, b = n;
        while (nm->left && a < b) {
            int l = qw_utf8_valid_len((const uint8_t *)s + a, b - a);
            int dl;
            if (!l || !qw_is_white_space(qw_utf8_decode((const uint8_t *)s + a, &dl))) break;
            a += (size_t)l;
        }
        while (nm->right && b > a) {
            size_t k = b - 1;
            while (k > a && ((uint8_t)s[k] & 0xc0) == 0x80) k--;
            int dl;
            if (!qw_is_white_space(qw_utf8_decode((const uint8_t *)s + k, &dl))) break;
            b = k;
        }
        qw_buf_add(out, s + a, b - a);
        return QWENC_OK;
    }
    }
    return QWENC_OK;
}

qwenc_status qw_tok_normalize(const qwenc_tokenizer *tok, const char *s, size_t n, qw_buf *out, char *err,
                              size_t errlen) {
    enc_ctx c;
    if (ctx_init(&c)) return enc_nomem(err, errlen);
    qw_buf a = {0};
    qw_buf_add(&a, s, n);
    qwenc_status st = QWENC_OK;
    for (int i = 0; i < tok->n_norm && !st; i++) {
        out->n = 0;
        st = norm_step(&tok->norm[i], &c, a.p, a.n, out, err, errlen);
        qw_buf t = a;
        a = *out;
        *out = t;
    }
    out->n = 0;
    qw_buf_add(out, a.p, a.n);
    if (!st && (a.oom || out->oom || ctx_oom(&c))) st = enc_nomem(err, errlen);
    free(a.p);
    ctx_free(&c);
    return st;
}

/* Normalize s with every step; *res points into one of c->nb. */
static qwenc_status normalize(const qwenc_tokenizer *tok, enc_ctx *c, const char *s, size_t n, const char **res,
                              size_t *rlen, char *err, size_t errlen) {
    const char *cur = s;
    size_t cn = n;
    for (int i = 0; i < tok->n_norm; i++) {
        qw_buf *out = &c->nb[i & 1];
        qwenc_status st = norm_step(&tok->norm[i], c, cur, cn, out, err, errlen);
        if (st) return st;
        if (!out->p) qw_buf_add(out, "", 0);
        if (ctx_oom(c)) return enc_nomem(err, errlen);
        cur = out->p;
        cn = out->n;
    }
    *res = cur;
    *rlen = cn;
    return QWENC_OK;
}

/* ---------------------------------------------------------------- pre-tokenizer */

/* Append pb[off..off+n) to pb itself (the buffer may move, so reserve before taking the pointer). */
static void pb_append_self(enc_ctx *c, size_t off, size_t n) {
    if (qw_buf_reserve(&c->pb, n)) return;
    memcpy(c->pb.p + c->pb.n, c->pb.p + off, n);
    c->pb.n += n;
    c->pb.p[c->pb.n] = 0;
}

/* Append the byte-level form of pb[off..off+n) (each byte as its alphabet character) to pb. */
static void add_byte_level(enc_ctx *c, size_t off, size_t n) {
    if (qw_buf_reserve(&c->pb, 2 * n)) return;
    const char *s = c->pb.p + off;
    char *o = c->pb.p + c->pb.n;
    for (size_t i = 0; i < n; i++) {
        uint16_t cp = qw_byte_to_cp[(uint8_t)s[i]];
        if (cp < 0x80) *o++ = (char)cp;
        else {
            *o++ = (char)(0xc0 | cp >> 6);
            *o++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    c->pb.n = (size_t)(o - c->pb.p);
    c->pb.p[c->pb.n] = 0;
}

/* One pre-tokenizer step: every piece of list `from` becomes pieces of list `to`. */
static qwenc_status pre_step(const qw_pre *p, enc_ctx *c, int from, int to, char *err, size_t errlen) {
    c->npc[to] = 0;
    for (size_t i = 0; i < c->npc[from]; i++) {
        piece pc = c->pc[from][i];
        qwenc_status st;
        switch (p->kind) {
        case QW_PRE_SPLIT:
        case QW_PRE_DIGITS:
            st = find_matches(c, &p->rx, c->pb.p + pc.off, pc.len, err, errlen);
            if (st) return st;
            apply_behavior(c, to, p->behavior, p->invert, pc.off, pc.first);
            break;
        case QW_PRE_BYTELEVEL: {
            if (p->add_prefix_space && c->pb.p[pc.off] != ' ') {
                size_t off = c->pb.n;
                qw_buf_addc(&c->pb, ' ');
                pb_append_self(c, pc.off, pc.len);
                if (ctx_oom(c)) return enc_nomem(err, errlen);
                pc.off = off;
                pc.len++;
            }
            size_t nsp = 1;
            if (p->use_regex) {
                st = find_matches(c, &p->rx, c->pb.p + pc.off, pc.len, err, errlen);
                if (st) return st;
                nsp = c->nsp;
            } else {
                c->nsp = 0;
                push_span(c, 0, pc.len, 0);
            }
            for (size_t k = 0; k < nsp; k++) {
                size_t off = c->pb.n;
                add_byte_level(c, pc.off + c->sp[k].s, c->sp[k].e - c->sp[k].s);
                push_piece(c, to, off, c->pb.n - off, pc.first && c->sp[k].s == 0);
            }
            break;
        }
        case QW_PRE_METASPACE: {
            /* spaces become the replacement, which may be prepended, then the piece splits before each one */
            size_t rl = strlen(p->str), off = c->pb.n;
            qw_buf_reserve(&c->pb, pc.len * rl + rl);
            for (size_t k = 0; k < pc.len; k++) {
                char ch = c->pb.p[pc.off + k];
                if (ch == ' ') qw_buf_add(&c->pb, p->str, rl);
                else qw_buf_addc(&c->pb, ch);
            }
            size_t len = c->pb.n - off;
            int starts = len >= rl && memcmp(c->pb.p + off, p->str, rl) == 0;
            if (!starts && (p->prepend == 2 || (p->prepend == 1 && pc.first))) {
                size_t off2 = c->pb.n;
                qw_buf_add(&c->pb, p->str, rl);
                pb_append_self(c, off, len);
                if (ctx_oom(c)) return enc_nomem(err, errlen);
                off = off2;
                len += rl;
            }
            if (p->split) {
                find_literal(c, p->str, c->pb.p + off, len);
                apply_behavior(c, to, QW_SPLIT_NEXT, 0, off, pc.first);
            } else {
                push_piece(c, to, off, len, pc.first);
            }
            break;
        }
        }
        if (ctx_oom(c)) return enc_nomem(err, errlen);
    }
    return QWENC_OK;
}

/* ---------------------------------------------------------------- BPE */

static void heap_push(enc_ctx *c, size_t *n, hitem it) {
    GROW(c->hp, *n, c->chp);
    size_t i = (*n)++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        hitem p = c->hp[par];
        if (p.rank < it.rank || (p.rank == it.rank && p.pos <= it.pos)) break;
        c->hp[i] = p;
        i = par;
    }
    c->hp[i] = it;
}

static hitem heap_pop(enc_ctx *c, size_t *n) {
    hitem top = c->hp[0], last = c->hp[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        hitem best = last;
        if (l < *n && (c->hp[l].rank < best.rank || (c->hp[l].rank == best.rank && c->hp[l].pos < best.pos))) {
            m = l;
            best = c->hp[l];
        }
        if (r < *n && (c->hp[r].rank < best.rank || (c->hp[r].rank == best.rank && c->hp[r].pos < best.pos))) {
            m = r;
            best = c->hp[r];
        }
        if (m == i) break;
        c->hp[i] = c->hp[m];
        i = m;
    }
    if (*n > 0) c->hp[i] = last;
    return top;
}

/* The vocabulary id of one character of a word (with the subword prefix / word suffix when the model has
 * them), or -1. */
static int32_t char_token(const qwenc_tokenizer *tok, enc_ctx *c, const char *s, size_t l, int is_first, int is_last,
                          const char **str, size_t *slen) {
    int pre = tok->subword_prefix && !is_first, suf = tok->word_suffix && is_last;
    if (!pre && !suf) {
        *str = s;
        *slen = l;
        int dl;
        uint32_t cp = qw_utf8_decode((const uint8_t *)s, &dl);
        if (cp < QW_CHAR_TABLE) return tok->char_id[cp];
        return qw_strmap_get(&tok->vocab, s, l);
    }
    c->tmp.n = 0;
    if (pre) qw_buf_add(&c->tmp, tok->subword_prefix, strlen(tok->subword_prefix));
    qw_buf_add(&c->tmp, s, l);
    if (suf) qw_buf_add(&c->tmp, tok->word_suffix, strlen(tok->word_suffix));
    if (c->tmp.oom) { /* found by the caller's check */
        *str = s;
        *slen = l;
        return -1;
    }
    *str = c->tmp.p;
    *slen = c->tmp.n;
    return qw_strmap_get(&tok->vocab, c->tmp.p, c->tmp.n);
}

static void add_sym(enc_ctx *c, size_t *n, int32_t id, uint32_t len) {
    GROW(c->sy, *n, c->csy);
    int32_t i = (int32_t)(*n)++;
    c->sy[i] = (sym){id, i - 1, -1, len};
    if (i > 0) c->sy[i - 1].next = i;
}

/* Encode one pre-token word (model.rs BPE::tokenize + merge_word, word.rs merge_all). */
static void bpe_word(const qwenc_tokenizer *tok, enc_ctx *c, const char *w, size_t n, qw_ivec *out) {
    if (tok->ignore_merges) {
        int32_t id = qw_strmap_get(&tok->vocab, w, n);
        if (id >= 0) {
            qw_ivec_push(out, id);
            return;
        }
    }
    size_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        int l = qw_utf8_valid_len((const uint8_t *)w + i, n - i);
        if (!l) l = 1; /* words are valid UTF-8; a stray byte is taken alone */
        const char *str;
        size_t slen;
        int32_t id = char_token(tok, c, w + i, (size_t)l, i == 0, i + (size_t)l == n, &str, &slen);
        if (id >= 0) {
            if (unk >= 0) {
                add_sym(c, &ns, unk, unk_len);
                unk = -1;
            }
            add_sym(c, &ns, id, (uint32_t)l);
        } else {
            int done = 0;
            if (tok->byte_fallback) {
                int all = 1;
                for (size_t k = 0; k < slen; k++) all &= tok->byte_token[(uint8_t)str[k]] >= 0;
                if (all) {
                    for (size_t k = 0; k < slen; k++) add_sym(c, &ns, tok->byte_token[(uint8_t)str[k]], 1);
                    done = 1;
                }
            }
            if (!done && tok->unk_id >= 0) {
                if (unk >= 0 && tok->fuse_unk) {
                    unk_len += (uint32_t)l;
                } else {
                    if (unk >= 0) add_sym(c, &ns, unk, unk_len);
                    unk = tok->unk_id;
                    unk_len = (uint32_t)l;
                }
            }
        }
        i += (size_t)l;
    }
    if (unk >= 0) add_sym(c, &ns, unk, unk_len);
    if (ns == 0) return;

    sym *s = c->sy;
    size_t nh = 0;
    int32_t rank, merged;
    for (size_t i = 0; i + 1 < ns; i++)
        if (qw_pairmap_get(&tok->merges, s[i].id, s[i + 1].id, &rank, &merged))
            heap_push(c, &nh, (hitem){rank, (int32_t)i, merged});
    while (nh > 0) {
        hitem top = heap_pop(c, &nh);
        s = c->sy;
        sym *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t nx = cur->next;
        /* an entry whose pair has changed since it was queued is stale */
        if (!qw_pairmap_get(&tok->merges, cur->id, s[nx].id, &rank, &merged) || merged != top.merged) continue;
        cur->id = top.merged;
        cur->len += s[nx].len;
        cur->next = s[nx].next;
        s[nx].len = 0;
        if (cur->next >= 0) s[cur->next].prev = top.pos;
        if (cur->prev >= 0 && qw_pairmap_get(&tok->merges, s[cur->prev].id, cur->id, &rank, &merged))
            heap_push(c, &nh, (hitem){rank, cur->prev, merged});
        s = c->sy;
        cur = &s[top.pos];
        if (cur->next >= 0 && qw_pairmap_get(&tok->merges, cur->id, s[cur->next].id, &rank, &merged))
            heap_push(c, &nh, (hitem){rank, top.pos, merged});
    }
    for (int32_t i = 0; i >= 0; i = c->sy[i].next) qw_ivec_push(out, c->sy[i].id);
}

/* ---------------------------------------------------------------- pipeline */

/* Pre-tokenize and BPE one normalized piece of text. */
static qwenc_status encode_words(const qwenc_tokenizer *tok, enc_ctx *c, const char *s, size_t n, int first,
                                 qw_ivec *out, char *err, size_t errlen) {
    if (n == 0) return QWENC_OK;
    c->pb.n = 0;
    qw_buf_add(&c->pb, s, n);
    c->npc[0] = 0;
    push_piece(c, 0, 0, n, first);
    if (ctx_oom(c)) return enc_nomem(err, errlen);
    int k = 0;
    for (int i = 0; i < tok->n_pre; i++) {
        qwenc_status st = pre_step(&tok->pre[i], c, k, !k, err, errlen);
        if (st) return st;
        k = !k;
    }
    for (size_t i = 0; i < c->npc[k] && !ctx_oom(c); i++) bpe_word(tok, c, c->pb.p + c->pc[k][i].off, c->pc[k][i].len, out);
    return ctx_oom(c) || out->oom ? enc_nomem(err, errlen) : QWENC_OK;
}

static int is_word_char(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200c || cp == 0x200d) return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* The code point that ends at s[end-1] (s valid UTF-8). */
static uint32_t cp_before(const char *s, size_t end) {
    size_t k = end - 1;
    while (k > 0 && ((uint8_t)s[k] & 0xc0) == 0x80) k--;
    int l;
    return qw_utf8_decode((const uint8_t *)s + k, &l);
}

/* Find the next added token in s[from..n): leftmost start, longest there. */
static int trie_find(const qw_trie *t, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    if (t->n_nodes == 0) return -1;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t p = from; p < n; p++) {
        if (!t->first[u[p]]) continue;
        int32_t node = 0, best = -1;
        size_t end = 0;
        for (size_t q = p; q < n; q++) {
            int32_t ch = t->child[node];
            while (ch >= 0 && t->byte[ch] != u[q]) ch = t->sibling[ch];
            if (ch < 0) break;
            node = ch;
            if (t->token[node] >= 0) {
                best = t->token[node];
                end = q + 1;
            }
        }
        if (best >= 0) {
            *ms = p;
            *me = end;
            return best;
        }
    }
    return -1;
}

typedef qwenc_status (*text_fn)(const qwenc_tokenizer *tok, enc_ctx *c, const char *s, size_t n, int first,
                                int parse_special, qw_ivec *out, char *err, size_t errlen);

/* Split s at the added tokens of trie t (added_vocabulary.rs find_matches): the tokens go to out, the text
 * between them to fn. */
static qwenc_status split_added(const qwenc_tokenizer *tok, const qw_trie *t, enc_ctx *c, const char *s, size_t n,
                                int first, int parse_special, text_fn fn, qw_ivec *out, char *err, size_t errlen) {
    size_t cursor = 0, pos = 0, ms, me;
    int ti;
    qwenc_status st;
    while ((ti = trie_find(t, s, n, pos, &ms, &me)) >= 0) {
        const qw_added *a = &tok->added[ti];
        pos = me;
        if (a->special && !parse_special) continue;
        if (a->single_word) {
            int ok_left = ms == 0 || !is_word_char(cp_before(s, ms));
            int l, ok_right = me == n || !is_word_char(qw_utf8_decode((const uint8_t *)s + me, &l));
            if (!ok_left || !ok_right) continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            while (start > cursor && qw_is_white_space(cp_before(s, start))) {
                size_t k = start - 1;
                while (k > 0 && ((uint8_t)s[k] & 0xc0) == 0x80) k--;
                start = k;
            }
        }
        if (a->rstrip) {
            int l;
            while (stop < n && qw_is_white_space(qw_utf8_decode((const uint8_t *)s + stop, &l))) stop += (size_t)l;
        }
        if (cursor < start) {
            st = fn(tok, c, s + cursor, start - cursor, first && cursor == 0, parse_special, out, err, errlen);
            if (st) return st;
        }
        qw_ivec_push(out, a->id);
        cursor = pos = stop;
    }
    if (cursor < n) return fn(tok, c, s + cursor, n - cursor, first && cursor == 0, parse_special, out, err, errlen);
    return QWENC_OK;
}

static qwenc_status text_words(const qwenc_tokenizer *tok, enc_ctx *c, const char *s, size_t n, int first,
                               int parse_special, qw_ivec *out, char *err, size_t errlen) {
    (void)parse_special;
    return encode_words(tok, c, s, n, first, out, err, errlen);
}

/* A piece between raw added tokens: normalize it, then look for the normalized added tokens. */
static qwenc_status text_normalize(const qwenc_tokenizer *tok, enc_ctx *c, const char *s, size_t n, int first,
                                   int parse_special, qw_ivec *out, char *err, size_t errlen) {
    const char *ns = s;
    size_t nn = n;
    if (tok->n_norm) {
        qwenc_status st = normalize(tok, c, s, n, &ns, &nn, err, errlen);
        if (st) return st;
    }
    if (tok->trie_norm.n_nodes == 0) return encode_words(tok, c, ns, nn, first, out, err, errlen);
    /* the normalized text lives in c->nb, which encode_words does not touch */
    return split_added(tok, &tok->trie_norm, c, ns, nn, first, parse_special, text_words, out, err, errlen);
}

qwenc_status qwenc_tokenize(const qwenc_tokenizer *tok, const char *text, size_t len, int add_bos, int parse_special,
                            int32_t **ids, int *n_ids, char *err, size_t errlen) {
    if (!tok || !ids || !n_ids || (!text && len))
        return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_tokenize: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    qw_buf fixed = {0};
    if (len && !qw_utf8_is_valid(text, len)) {
        qw_utf8_repair(text, len, &fixed);
        if (fixed.oom) {
            free(fixed.p);
            return enc_nomem(err, errlen);
        }
        text = fixed.p;
        len = fixed.n;
    }
    enc_ctx c;
    if (ctx_init(&c)) {
        free(fixed.p);
        return enc_nomem(err, errlen);
    }
    qw_ivec v = {0};
    if (add_bos)
        for (int i = 0; i < tok->n_prefix; i++) qw_ivec_push(&v, tok->prefix_ids[i]);
    qwenc_status st = QWENC_OK;
    if (len) st = split_added(tok, &tok->trie_raw, &c, text, len, 1, parse_special, text_normalize, &v, err, errlen);
    if (add_bos && !st)
        for (int i = 0; i < tok->n_suffix; i++) qw_ivec_push(&v, tok->suffix_ids[i]);
    if (!st && ctx_oom(&c)) st = enc_nomem(err, errlen);
    ctx_free(&c);
    free(fixed.p);
    if (!st && v.oom) st = enc_nomem(err, errlen);
    if (!st && v.n > INT_MAX) st = qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_tokenize: %zu tokens do not fit an int", v.n);
    if (!st && !v.p && !(v.p = malloc(sizeof(int32_t)))) st = enc_nomem(err, errlen);
    if (st) {
        free(v.p);
        return st;
    }
    *ids = v.p;
    *n_ids = (int)v.n;
    return QWENC_OK;
}
