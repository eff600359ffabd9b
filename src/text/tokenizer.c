/*
 * tokenizer.c - loading a Hugging Face tokenizer directory, and the small public getters. A path to a file is
 * a GGUF, whose tokenizer.* keys tok_gguf.c reads into the same structure.
 *
 * tokenizer.json (format of the `tokenizers` library, tokenizer/serialization.rs) gives the model (BPE:
 * vocab, merges as "a b" strings or ["a", "b"] pairs, unk/byte_fallback/fuse_unk/ignore_merges), the added
 * tokens, the normalizer, pre-tokenizer, post-processor and decoder. The other files are optional:
 * tokenizer_config.json (bos/eos strings, add_bos_token/add_eos_token, chat_template), generation_config.json
 * and config.json (eos_token_id), chat_template.jinja (preferred over tokenizer_config's template, as
 * transformers does).
 *
 * Anything the file declares that qwenc does not implement is refused with QWENC_ERR_UNSUPPORTED naming
 * the field, rather than tokenized differently from the library.
 */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapfile.h"
#include "text/tok_internal.h"

#define JGET cJSON_GetObjectItemCaseSensitive

typedef struct {
    const char *file; /* for messages */
    char *err;
    size_t errlen;
} ld;

static int jbool(const cJSON *o, const char *key, int def) {
    const cJSON *v = JGET(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = JGET(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A token given as "text" or {"content": "text", ...} (tokenizer_config.json); NULL if neither. */
static const char *token_string(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

static qwenc_status unsupported(ld *l, const char *field, const char *what) {
    return qw_err(l->err, l->errlen, QWENC_ERR_UNSUPPORTED, "%s: %s: %s is not supported", l->file, field, what);
}

static qwenc_status bad(ld *l, const char *field, const char *what) {
    return qw_err(l->err, l->errlen, QWENC_ERR_FORMAT, "%s: %s: %s", l->file, field, what);
}

static qwenc_status nomem(ld *l, const char *field) {
    return qw_err(l->err, l->errlen, QWENC_ERR_NOMEM, "%s: %s: out of memory", l->file, field);
}

/* A copy of s into *out (NULL s: ""); QWENC_ERR_NOMEM naming field when out of memory. */
static qwenc_status dup_str(ld *l, const char *field, const char *s, char **out) {
    *out = strdup(s ? s : "");
    return *out ? QWENC_OK : nomem(l, field);
}

/* The same for a string that becomes part of the text being tokenized (a normalizer's or pre-tokenizer's
 * replacement): it must be valid UTF-8, as the regexes run on the text without checking it again. */
static qwenc_status text_str(ld *l, const char *field, const char *s, char **out) {
    *out = NULL;
    if (!qw_utf8_is_valid(s, strlen(s))) return bad(l, field, "a replacement string is not valid UTF-8");
    return dup_str(l, field, s, out);
}

/* cJSON strings end at a NUL, so a "\u0000" of tokenizer.json (a token of a NUL character) is read as the
 * noncharacter U+FDD0, which no vocabulary uses, and turned back into a NUL byte by unsentinel(). The
 * rewrite keeps the length; escaped backslashes are stepped over. */
static void rewrite_nul_escapes(char *json, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (json[i] != '\\') continue;
        if (json[i + 1] == 'u' && i + 5 < len && !memcmp(json + i + 2, "0000", 4)) memcpy(json + i + 2, "FDD0", 4);
        i++;
    }
}

/* Append s to out with each U+FDD0 (see rewrite_nul_escapes) as a NUL byte; returns the appended length. */
static size_t unsentinel(const char *s, size_t n, qw_buf *out) {
    size_t start = out->n;
    const char *p;
    while ((p = memmem(s, n, "\xef\xb7\x90", 3)) != NULL) {
        qw_buf_add(out, s, (size_t)(p - s));
        qw_buf_addc(out, 0);
        n -= (size_t)(p - s) + 3;
        s = p + 3;
    }
    qw_buf_add(out, s, n);
    return out->n - start;
}

/* Read and parse a JSON file. Missing file: *out = NULL and QWENC_OK when optional. */
qwenc_status qw_tok_load_json(const char *dir, const char *name, int optional, cJSON **out, char *err, size_t errlen) {
    *out = NULL;
    char *path = qw_path_new(dir, name);
    if (!path) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    struct stat st;
    if (optional && stat(path, &st) != 0) {
        free(path);
        return QWENC_OK;
    }
    char *buf;
    size_t len;
    /* tokenizer_config.json, generation_config.json and config.json are small; tokenizer.json is read by load_dir */
    qwenc_status s = qw_read_file_max(path, QW_READ_CONFIG_MAX, &buf, &len, err, errlen);
    if (s) {
        free(path);
        return s;
    }
    const char *at = NULL; /* where parsing stopped (cJSON_GetErrorPtr is shared between threads) */
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &at, 0);
    if (!j) {
        size_t off = (at && at >= buf && at <= buf + len) ? (size_t)(at - buf) : 0;
        s = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, off);
    }
    free(buf);
    free(path);
    *out = j;
    return s;
}

/* ---------------------------------------------------------------- patterns */

/* {"Regex": "..."} or {"String": "..."} */
static qwenc_status load_pattern(ld *l, const cJSON *pat, const char *field, qw_regex *rx) {
    const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
    if (!re && !lit) return bad(l, field, "expected {\"Regex\": ...} or {\"String\": ...}");
    return qw_regex_compile(rx, re ? re : lit, re == NULL, l->file, field, l->err, l->errlen);
}

static qwenc_status load_behavior(ld *l, const cJSON *o, const char *field, qw_split_behavior *b) {
    const char *s = jstr(o, "behavior");
    if (!s) return bad(l, field, "missing \"behavior\"");
    if (!strcmp(s, "Removed")) *b = QW_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = QW_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = QW_SPLIT_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = QW_SPLIT_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = QW_SPLIT_CONTIGUOUS;
    else return unsupported(l, field, s);
    return QWENC_OK;
}

/* ---------------------------------------------------------------- normalizer */

static qwenc_status load_normalizer(qwenc_tokenizer *t, ld *l, const cJSON *o, const char *field) {
    if (!o || cJSON_IsNull(o)) return QWENC_OK;
    const char *type = jstr(o, "type");
    char sub[160];
    if (!type) return bad(l, field, "missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = JGET(o, "normalizers"), *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            snprintf(sub, sizeof(sub), "%s.normalizers[%d]", field, i++);
            qwenc_status s = load_normalizer(t, l, it, sub);
            if (s) return s;
        }
        return QWENC_OK;
    }
    qw_norm *nn = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof(*t->norm));
    if (!nn) return nomem(l, field);
    t->norm = nn;
    qw_norm *n = &t->norm[t->n_norm];
    memset(n, 0, sizeof(*n));
    if (!strcmp(type, "NFC")) n->kind = QW_NORM_NFC;
    else if (!strcmp(type, "NFD")) n->kind = QW_NORM_NFD;
    else if (!strcmp(type, "NFKC")) n->kind = QW_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n->kind = QW_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n->kind = QW_NORM_LOWERCASE;
    else if (!strcmp(type, "Prepend")) {
        const char *p = jstr(o, "prepend");
        if (!p) return bad(l, field, "Prepend without \"prepend\"");
        n->kind = QW_NORM_PREPEND;
        qwenc_status s = text_str(l, field, p, &n->str);
        if (s) return s;
    } else if (!strcmp(type, "Replace")) {
        const char *c = jstr(o, "content");
        if (!c) return bad(l, field, "Replace without \"content\"");
        snprintf(sub, sizeof(sub), "%s.pattern", field);
        qwenc_status s = load_pattern(l, JGET(o, "pattern"), sub, &n->rx);
        if (s) return s;
        n->kind = QW_NORM_REPLACE;
        t->n_norm++; /* freed with t from here on */
        return text_str(l, field, c, &n->str);
    } else if (!strcmp(type, "Strip")) {
        n->kind = QW_NORM_STRIP;
        n->left = jbool(o, "strip_left", 1);
        n->right = jbool(o, "strip_right", 1);
    } else {
        snprintf(sub, sizeof(sub), "%s.type", field);
        return unsupported(l, sub, type);
    }
    t->n_norm++;
    return QWENC_OK;
}

/* ---------------------------------------------------------------- pre-tokenizer */

/* A new pre-tokenizer step of t, or NULL when out of memory. */
static qw_pre *new_pre(qwenc_tokenizer *t) {
    qw_pre *np = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof(*t->pre));
    if (!np) return NULL;
    t->pre = np;
    qw_pre *p = &t->pre[t->n_pre++];
    memset(p, 0, sizeof(*p));
    return p;
}

static qwenc_status load_pre(qwenc_tokenizer *t, ld *l, const cJSON *o, const char *field) {
    if (!o || cJSON_IsNull(o)) return QWENC_OK;
    const char *type = jstr(o, "type");
    char sub[160];
    qwenc_status s;
    if (!type) return bad(l, field, "missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = JGET(o, "pretokenizers"), *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            snprintf(sub, sizeof(sub), "%s.pretokenizers[%d]", field, i++);
            if ((s = load_pre(t, l, it, sub))) return s;
        }
        return QWENC_OK;
    }
    if (!strcmp(type, "Split")) {
        qw_pre *p = new_pre(t);
        if (!p) return nomem(l, field);
        p->kind = QW_PRE_SPLIT;
        p->invert = jbool(o, "invert", 0);
        snprintf(sub, sizeof(sub), "%s.pattern", field);
        if ((s = load_pattern(l, JGET(o, "pattern"), sub, &p->rx))) return s;
        return load_behavior(l, o, field, &p->behavior);
    }
    if (!strcmp(type, "ByteLevel")) {
        qw_pre *p = new_pre(t);
        if (!p) return nomem(l, field);
        p->kind = QW_PRE_BYTELEVEL;
        p->add_prefix_space = jbool(o, "add_prefix_space", 1);
        p->use_regex = jbool(o, "use_regex", 1);
        if (p->use_regex) return qw_regex_compile(&p->rx, QW_GPT2_PATTERN, 0, l->file, field, l->err, l->errlen);
        return QWENC_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        qw_pre *p = new_pre(t);
        if (!p) return nomem(l, field);
        p->kind = QW_PRE_METASPACE;
        const char *r = jstr(o, "replacement");
        if ((s = text_str(l, field, r ? r : "\xe2\x96\x81", &p->str))) return s;
        const char *scheme = jstr(o, "prepend_scheme");
        if (scheme) {
            if (!strcmp(scheme, "always")) p->prepend = 2;
            else if (!strcmp(scheme, "first")) p->prepend = 1;
            else if (!strcmp(scheme, "never")) p->prepend = 0;
            else return unsupported(l, field, scheme);
        } else {
            p->prepend = jbool(o, "add_prefix_space", 1) ? 2 : 0;
        }
        p->split = jbool(o, "split", 1);
        return QWENC_OK;
    }
    if (!strcmp(type, "Digits")) {
        qw_pre *p = new_pre(t);
        if (!p) return nomem(l, field);
        p->kind = QW_PRE_DIGITS;
        p->behavior = jbool(o, "individual_digits", 0) ? QW_SPLIT_ISOLATED : QW_SPLIT_CONTIGUOUS;
        return qw_regex_compile(&p->rx, "\\p{N}", 0, l->file, field, l->err, l->errlen);
    }
    snprintf(sub, sizeof(sub), "%s.type", field);
    return unsupported(l, sub, type);
}

/* ---------------------------------------------------------------- decoder */

/* A new decoder step of t, or NULL when out of memory. */
static qw_dec *new_dec(qwenc_tokenizer *t, qw_dec_kind kind) {
    qw_dec *nd = realloc(t->dec, (size_t)(t->n_dec + 1) * sizeof(*t->dec));
    if (!nd) return NULL;
    t->dec = nd;
    qw_dec *d = &t->dec[t->n_dec++];
    memset(d, 0, sizeof(*d));
    d->kind = kind;
    return d;
}

static qwenc_status load_decoder(qwenc_tokenizer *t, ld *l, const cJSON *o, const char *field, int *fused) {
    const char *type = jstr(o, "type");
    char sub[160];
    if (!type) return bad(l, field, "missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = JGET(o, "decoders"), *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            snprintf(sub, sizeof(sub), "%s.decoders[%d]", field, i++);
            qwenc_status s = load_decoder(t, l, it, sub, fused);
            if (s) return s;
        }
        return QWENC_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (!new_dec(t, QW_DEC_BYTELEVEL)) return nomem(l, field);
        *fused = 1;
    } else if (!strcmp(type, "ByteFallback")) {
        if (!new_dec(t, QW_DEC_BYTEFALLBACK)) return nomem(l, field);
    } else if (!strcmp(type, "Fuse")) {
        if (!new_dec(t, QW_DEC_FUSE)) return nomem(l, field);
        *fused = 1;
    } else if (!strcmp(type, "Replace")) {
        const cJSON *pat = JGET(o, "pattern");
        const char *from = jstr(pat, "String"), *to = jstr(o, "content");
        snprintf(sub, sizeof(sub), "%s.pattern", field);
        if (!from) return unsupported(l, sub, "a Replace decoder without a String pattern");
        if (!to) return bad(l, field, "Replace without \"content\"");
        qw_dec *d = new_dec(t, QW_DEC_REPLACE);
        if (!d) return nomem(l, field);
        qwenc_status s = text_str(l, field, from, &d->str);
        if (!s) s = text_str(l, field, to, &d->str2);
        if (s) return s;
    } else if (!strcmp(type, "Strip")) {
        const char *c = jstr(o, "content");
        const cJSON *start = JGET(o, "start"), *stop = JGET(o, "stop");
        if (!c || !cJSON_IsNumber(start) || !cJSON_IsNumber(stop)) return bad(l, field, "Strip needs content, start, stop");
        qw_dec *d = new_dec(t, QW_DEC_STRIP);
        if (!d) return nomem(l, field);
        qwenc_status s = text_str(l, field, c, &d->str);
        if (s) return s;
        d->start = start->valueint;
        d->stop = stop->valueint;
        if (*fused && d->stop > 0) return unsupported(l, field, "Strip with stop > 0 after Fuse");
        if (*fused && d->start > 0) t->dec_first = 1;
    } else if (!strcmp(type, "Metaspace")) {
        qw_dec *d = new_dec(t, QW_DEC_METASPACE);
        const char *r = jstr(o, "replacement"), *scheme = jstr(o, "prepend_scheme");
        if (!d) return nomem(l, field);
        qwenc_status s = text_str(l, field, r ? r : "\xe2\x96\x81", &d->str);
        if (s) return s;
        d->prepend = scheme ? strcmp(scheme, "never") != 0 : jbool(o, "add_prefix_space", 1);
        if (d->prepend) t->dec_first = 1;
    } else {
        snprintf(sub, sizeof(sub), "%s.type", field);
        return unsupported(l, sub, type);
    }
    return QWENC_OK;
}

/* ---------------------------------------------------------------- post-processor */

int qw_tok_push_id(int32_t **ids, int *n, int32_t id) {
    int32_t *p = realloc(*ids, (size_t)(*n + 1) * sizeof(**ids));
    if (!p) return -1;
    *ids = p;
    (*ids)[(*n)++] = id;
    return 0;
}

/* 1 if v is a token id of t (a number in [0, n_vocab)). */
static int is_id(const qwenc_tokenizer *t, const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < t->n_vocab && v->valuedouble == (int32_t)v->valuedouble;
}

static qwenc_status add_ids(qwenc_tokenizer *t, ld *l, const char *field, int32_t **ids, int *n, const cJSON *arr) {
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!is_id(t, it)) return bad(l, field, "a special token's id is not a token id of the vocabulary");
        if (qw_tok_push_id(ids, n, (int32_t)it->valuedouble)) return nomem(l, field);
    }
    return QWENC_OK;
}

/* The special tokens the post-processor puts before and after a single sequence. */
static qwenc_status load_post(qwenc_tokenizer *t, ld *l, const cJSON *o, const char *field) {
    if (!o || cJSON_IsNull(o)) return QWENC_OK;
    const char *type = jstr(o, "type");
    char sub[160];
    if (!type) return bad(l, field, "missing \"type\"");
    if (!strcmp(type, "ByteLevel")) return QWENC_OK;
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = JGET(o, "processors"), *it;
        int i = 0;
        cJSON_ArrayForEach(it, arr) {
            snprintf(sub, sizeof(sub), "%s.processors[%d]", field, i++);
            qwenc_status s = load_post(t, l, it, sub);
            if (s) return s;
        }
        return QWENC_OK;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = JGET(o, "single"), *specials = JGET(o, "special_tokens"), *it;
        int after = 0;
        cJSON_ArrayForEach(it, single) {
            if (JGET(it, "Sequence")) {
                after = 1;
                continue;
            }
            const char *name = jstr(JGET(it, "SpecialToken"), "id");
            const cJSON *sp = name ? JGET(specials, name) : NULL;
            if (!sp) return bad(l, field, "a SpecialToken of \"single\" is not in \"special_tokens\"");
            qwenc_status s = after ? add_ids(t, l, field, &t->suffix_ids, &t->n_suffix, JGET(sp, "ids"))
                                   : add_ids(t, l, field, &t->prefix_ids, &t->n_prefix, JGET(sp, "ids"));
            if (s) return s;
        }
        return QWENC_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetArrayItem(JGET(o, "cls"), 1), *sep = cJSON_GetArrayItem(JGET(o, "sep"), 1);
        if (!is_id(t, cls) || !is_id(t, sep)) return bad(l, field, "cls/sep must be [token, id] with an id of the vocabulary");
        if (qw_tok_push_id(&t->prefix_ids, &t->n_prefix, (int32_t)cls->valuedouble) ||
            qw_tok_push_id(&t->suffix_ids, &t->n_suffix, (int32_t)sep->valuedouble))
            return nomem(l, field);
        return QWENC_OK;
    }
    snprintf(sub, sizeof(sub), "%s.type", field);
    return unsupported(l, sub, type);
}

/* ---------------------------------------------------------------- model */

int qw_tok_index_chars(qwenc_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->byte_token[b] = qw_strmap_get(&t->vocab, name, 6);
    }
    if (!(t->char_id = malloc(QW_CHAR_TABLE * sizeof(int32_t)))) return -1;
    for (uint32_t cp = 0; cp < QW_CHAR_TABLE; cp++) {
        char s[4];
        int n = qw_utf8_encode(cp, s);
        t->char_id[cp] = (cp >= 0xd800 && cp < 0xe000) ? -1 : qw_strmap_get(&t->vocab, s, (size_t)n);
    }
    return 0;
}

static qwenc_status load_model(qwenc_tokenizer *t, ld *l, const cJSON *root, qw_buf *arena, size_t **tok_off) {
    const cJSON *m = JGET(root, "model");
    if (!cJSON_IsObject(m)) return bad(l, "model", "missing");
    const char *type = jstr(m, "type");
    if (type && strcmp(type, "BPE") != 0) return unsupported(l, "model.type", type);
    const cJSON *vocab = JGET(m, "vocab"), *merges = JGET(m, "merges"), *it;
    if (!cJSON_IsObject(vocab)) return bad(l, "model.vocab", "missing or not an object");
    if (!cJSON_IsArray(merges)) return bad(l, "model.merges", "missing or not an array");

    /* the vocabulary strings go into one arena; ids -> offsets first, pointers once it stops growing */
    int n_v = cJSON_GetArraySize(vocab), max_id = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e9)
            return bad(l, "model.vocab", "an id is not a non-negative integer");
        if ((int)it->valuedouble > max_id) max_id = (int)it->valuedouble;
    }
    const cJSON *added = JGET(root, "added_tokens");
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = JGET(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e9)
            return bad(l, "added_tokens", "an id is not a non-negative integer");
        if ((int)id->valuedouble > max_id) max_id = (int)id->valuedouble;
    }
    /* ids index arrays: a sparse vocabulary (one id of 10^9) would cost gigabytes for a small file */
    int n_tokens = n_v + cJSON_GetArraySize(added);
    if (max_id >= 2 * n_tokens + 1024) {
        char msg[160];
        snprintf(msg, sizeof(msg), "token id %d is far beyond the %d tokens of the file (ids must be nearly dense)",
                 max_id, n_tokens);
        return bad(l, "model.vocab", msg);
    }
    t->n_vocab = max_id + 1;
    size_t *off = malloc((size_t)t->n_vocab * sizeof(size_t));
    size_t *key_off = malloc((size_t)(n_v + 1) * sizeof(size_t)), *key_len = malloc((size_t)(n_v + 1) * sizeof(size_t));
    int32_t *key_id = malloc((size_t)(n_v + 1) * sizeof(int32_t));
    t->token_len = calloc((size_t)t->n_vocab, sizeof(uint32_t));
    *tok_off = off;
    if (!off || !key_off || !key_len || !key_id || !t->token_len) {
        free(key_off), free(key_len), free(key_id);
        return nomem(l, "model.vocab");
    }
    for (int i = 0; i < t->n_vocab; i++) off[i] = SIZE_MAX;
    int k = 0;
    cJSON_ArrayForEach(it, vocab) {
        key_off[k] = arena->n;
        key_id[k] = (int32_t)it->valuedouble;
        key_len[k] = unsentinel(it->string, strlen(it->string), arena);
        qw_buf_addc(arena, 0);
        off[key_id[k]] = key_off[k];
        t->token_len[key_id[k]] = (uint32_t)key_len[k];
        k++;
    }
    /* arena->p is final for these keys: added tokens are stored separately */
    int oom = arena->oom || qw_strmap_init(&t->vocab, (size_t)n_v);
    for (int i = 0; i < n_v && !oom; i++) oom = qw_strmap_put(&t->vocab, arena->p + key_off[i], key_len[i], key_id[i]);
    free(key_off);
    free(key_len);
    free(key_id);
    if (oom) return nomem(l, "model.vocab");

    const char *prefix = jstr(m, "continuing_subword_prefix"), *suffix = jstr(m, "end_of_word_suffix");
    if ((prefix && *prefix && dup_str(l, "model.continuing_subword_prefix", prefix, &t->subword_prefix)) ||
        (suffix && *suffix && dup_str(l, "model.end_of_word_suffix", suffix, &t->word_suffix)))
        return QWENC_ERR_NOMEM;
    size_t plen = t->subword_prefix ? strlen(t->subword_prefix) : 0;

    int n_m = cJSON_GetArraySize(merges), r = 0;
    if (qw_pairmap_init(&t->merges, (size_t)n_m)) return nomem(l, "model.merges");
    qw_buf cat = {0}, pa = {0}, pb = {0};
    char field[96];
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t al, bl;
        snprintf(field, sizeof(field), "model.merges[%d]", r);
        pa.n = pb.n = 0;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (!sp) {
                free(cat.p), free(pa.p), free(pb.p);
                return bad(l, field, "a merge string must be \"left right\"");
            }
            al = unsentinel(it->valuestring, (size_t)(sp - it->valuestring), &pa);
            bl = unsentinel(sp + 1, strlen(sp + 1), &pb);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            al = unsentinel(it->child->valuestring, strlen(it->child->valuestring), &pa);
            bl = unsentinel(it->child->next->valuestring, strlen(it->child->next->valuestring), &pb);
        } else {
            free(cat.p), free(pa.p), free(pb.p);
            return bad(l, field, "a merge must be \"left right\" or [\"left\", \"right\"]");
        }
        if (pa.oom || pb.oom || cat.oom) {
            free(cat.p), free(pa.p), free(pb.p);
            return nomem(l, field);
        }
        a = pa.p ? pa.p : "";
        b = pb.p ? pb.p : "";
        int32_t ia = qw_strmap_get(&t->vocab, a, al), ib = qw_strmap_get(&t->vocab, b, bl);
        cat.n = 0;
        qw_buf_add(&cat, a, al);
        if (bl >= plen) qw_buf_add(&cat, b + plen, bl - plen);
        if (cat.oom) {
            free(cat.p), free(pa.p), free(pb.p);
            return nomem(l, field);
        }
        int32_t im = qw_strmap_get(&t->vocab, cat.p, cat.n);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *which = ia < 0 ? a : ib < 0 ? b : cat.p;
            size_t wl = ia < 0 ? al : ib < 0 ? bl : cat.n;
            char msg[160];
            snprintf(msg, sizeof(msg), "token \"%.*s\" is not in model.vocab", (int)QW_MIN(wl, 60), which);
            free(cat.p), free(pa.p), free(pb.p);
            return bad(l, field, msg);
        }
        if (cat.oom || qw_pairmap_put(&t->merges, ia, ib, r, im)) {
            free(cat.p), free(pa.p), free(pb.p);
            return nomem(l, field);
        }
        r++;
    }
    free(cat.p), free(pa.p), free(pb.p);

    const char *unk = jstr(m, "unk_token");
    t->unk_id = unk ? qw_strmap_get(&t->vocab, unk, strlen(unk)) : -1;
    t->byte_fallback = jbool(m, "byte_fallback", 0);
    t->fuse_unk = jbool(m, "fuse_unk", 0);
    t->ignore_merges = jbool(m, "ignore_merges", 0);
    return qw_tok_index_chars(t) ? nomem(l, "model.vocab") : QWENC_OK;
}

static qwenc_status load_added(qwenc_tokenizer *t, ld *l, const cJSON *root) {
    const cJSON *arr = JGET(root, "added_tokens"), *it;
    int n = cJSON_GetArraySize(arr), i = 0;
    t->added = calloc((size_t)n + 1, sizeof(*t->added));
    t->special = calloc((size_t)t->n_vocab, 1);
    if (!t->added || !t->special || qw_strmap_init(&t->added_map, (size_t)n)) return nomem(l, "added_tokens");
    /* the library's trie lists the special tokens first, then the others, each in file order */
    for (int pass = 0; pass < 2; pass++) {
        i = 0;
        cJSON_ArrayForEach(it, arr) {
            char field[64];
            snprintf(field, sizeof(field), "added_tokens[%d]", i++);
            const char *content = jstr(it, "content");
            if (!content) return bad(l, field, "missing \"content\"");
            int special = jbool(it, "special", 0);
            if (special != (pass == 0)) continue;
            if (!qw_utf8_is_valid(content, strlen(content))) return bad(l, field, "\"content\" is not valid UTF-8");
            qw_added *a = &t->added[t->n_added++];
            a->id = (int32_t)JGET(it, "id")->valuedouble;
            qw_buf cb = {0};
            a->content_len = unsentinel(content, strlen(content), &cb);
            a->content = cb.p ? cb.p : strdup("");
            if (cb.oom || !a->content) return nomem(l, field);
            a->single_word = (uint8_t)jbool(it, "single_word", 0);
            a->lstrip = (uint8_t)jbool(it, "lstrip", 0);
            a->rstrip = (uint8_t)jbool(it, "rstrip", 0);
            a->normalized = (uint8_t)jbool(it, "normalized", !special);
            a->special = (uint8_t)special;
            t->special[a->id] = (uint8_t)special;
            if (a->normalized && t->n_norm) {
                qw_buf nb = {0};
                char why[256];
                qwenc_status s = qw_tok_normalize(t, a->content, a->content_len, &nb, why, sizeof(why));
                if (s) {
                    free(nb.p);
                    return qw_err(l->err, l->errlen, s, "%s: %s: %s", l->file, field, why);
                }
                a->match = nb.p ? nb.p : strdup("");
                a->match_len = nb.n;
            } else if ((a->match = malloc(a->content_len + 1))) {
                memcpy(a->match, a->content, a->content_len + 1);
                a->match_len = a->content_len;
            }
            if (!a->match || qw_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->match, a->match_len, t->n_added - 1))
                return nomem(l, field);
        }
    }
    for (int k = 0; k < t->n_added; k++)
        if (qw_strmap_put(&t->added_map, t->added[k].content, t->added[k].content_len, t->added[k].id))
            return nomem(l, "added_tokens");
    return QWENC_OK;
}

/* ---------------------------------------------------------------- config files */

int qw_tok_add_eos(qwenc_tokenizer *t, int32_t id) {
    if (id < 0) return 0;
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return 0;
    int32_t *p = realloc(t->eos_ids, (size_t)(t->n_eos + 1) * sizeof(int32_t));
    if (!p) return -1;
    t->eos_ids = p;
    t->eos_ids[t->n_eos++] = id;
    return 0;
}

/* eos_token_id (an id or a list of ids); ids outside the vocabulary are ignored. -1 when out of memory. */
static int add_eos_json(qwenc_tokenizer *t, const cJSON *v) {
    int oom = is_id(t, v) && qw_tok_add_eos(t, (int32_t)v->valuedouble);
    const cJSON *it;
    if (cJSON_IsArray(v))
        cJSON_ArrayForEach(it, v) oom |= is_id(t, it) && qw_tok_add_eos(t, (int32_t)it->valuedouble);
    return oom ? -1 : 0;
}

static qwenc_status load_configs(qwenc_tokenizer *t, const char *dir, char *err, size_t errlen) {
    cJSON *tc = NULL, *gc = NULL, *cc = NULL;
    qwenc_status s = qw_tok_load_json(dir, "tokenizer_config.json", 1, &tc, err, errlen);
    if (!s) s = qw_tok_load_json(dir, "generation_config.json", 1, &gc, err, errlen);
    if (!s) s = qw_tok_load_json(dir, "config.json", 1, &cc, err, errlen);
    if (s) goto done;
    t->bos_id = -1;
    int oom = 0;
    if (tc) {
        const char *bos = token_string(JGET(tc, "bos_token")), *eos = token_string(JGET(tc, "eos_token"));
        oom |= !(t->bos_str = strdup(bos ? bos : "")) || !(t->eos_str = strdup(eos ? eos : ""));
        if (bos) t->bos_id = qwenc_tokenizer_token_id(t, bos);
        if (eos) oom |= qw_tok_add_eos(t, qwenc_tokenizer_token_id(t, eos));
        /* transformers' flags, where given, replace what the post-processor adds on their side */
        const cJSON *ab = JGET(tc, "add_bos_token"), *ae = JGET(tc, "add_eos_token");
        int32_t eid = eos ? qwenc_tokenizer_token_id(t, eos) : -1;
        if (cJSON_IsBool(ab)) {
            t->n_prefix = 0;
            if (cJSON_IsTrue(ab) && t->bos_id >= 0) oom |= qw_tok_push_id(&t->prefix_ids, &t->n_prefix, t->bos_id);
        }
        if (cJSON_IsBool(ae)) {
            t->n_suffix = 0;
            if (cJSON_IsTrue(ae) && eid >= 0) oom |= qw_tok_push_id(&t->suffix_ids, &t->n_suffix, eid);
        }
        const cJSON *ct = JGET(tc, "chat_template"), *it;
        if (cJSON_IsString(ct)) oom |= !(t->chat_template = strdup(ct->valuestring));
        else if (cJSON_IsArray(ct))
            cJSON_ArrayForEach(it, ct) {
                const char *name = jstr(it, "name"), *tmpl = jstr(it, "template");
                if (name && tmpl && !strcmp(name, "default") && !t->chat_template)
                    oom |= !(t->chat_template = strdup(tmpl));
            }
    } else {
        oom |= !(t->bos_str = strdup("")) || !(t->eos_str = strdup(""));
        if (t->n_prefix > 0) t->bos_id = t->prefix_ids[0];
    }
    if (gc) oom |= add_eos_json(t, JGET(gc, "eos_token_id"));
    if (cc) {
        oom |= add_eos_json(t, JGET(cc, "eos_token_id"));
        oom |= add_eos_json(t, JGET(JGET(cc, "text_config"), "eos_token_id"));
    }
    if (oom) {
        s = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory reading the tokenizer's configuration", dir);
        goto done;
    }
    char *jpath = qw_path_new(dir, "chat_template.jinja");
    struct stat st;
    if (!jpath) {
        s = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    } else if (stat(jpath, &st) == 0) {
        char *buf;
        s = qw_read_file_max(jpath, QW_READ_CONFIG_MAX, &buf, NULL, err, errlen);
        if (!s) {
            free(t->chat_template);
            t->chat_template = buf;
        }
    }
    free(jpath);
done:
    cJSON_Delete(tc);
    cJSON_Delete(gc);
    cJSON_Delete(cc);
    return s;
}

/* ---------------------------------------------------------------- load / free */

/* A tokenizer from the text of a tokenizer.json (see tok_internal.h). */
qwenc_status qw_tok_from_json(char *json, size_t len, const char *path, const char *dir, qwenc_tokenizer **out,
                              char *err, size_t errlen) {
    *out = NULL;
    rewrite_nul_escapes(json, len);
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &at, 0);
    if (!root) {
        size_t off = (at && at >= json && at <= json + len) ? (size_t)(at - json) : 0;
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, off);
    }
    qwenc_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) {
        cJSON_Delete(root);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", path);
    }
    t->bos_id = -1;
    ld l = {path, err, errlen};
    qw_buf arena = {0};
    size_t *tok_off = NULL;
    int fused = 0;
    qwenc_status s = QWENC_OK;
    if (!cJSON_IsObject(root)) s = bad(&l, "top level", "not a JSON object");
    if (!s) s = load_model(t, &l, root, &arena, &tok_off);
    if (!s) s = load_normalizer(t, &l, JGET(root, "normalizer"), "normalizer");
    if (!s) s = load_pre(t, &l, JGET(root, "pre_tokenizer"), "pre_tokenizer");
    if (!s) s = load_added(t, &l, root);
    if (!s) s = load_post(t, &l, JGET(root, "post_processor"), "post_processor");
    if (!s) {
        const cJSON *d = JGET(root, "decoder");
        if (!d || cJSON_IsNull(d)) t->dec_none = 1;
        else s = load_decoder(t, &l, d, "decoder", &fused);
    }
    cJSON_Delete(root);
    if (!s) {
        /* token strings: the model vocabulary, overridden by the added tokens (as id_to_token) */
        t->token = calloc((size_t)t->n_vocab, sizeof(char *));
        if (!t->token) s = nomem(&l, "model.vocab");
    }
    if (!s) {
        for (int i = 0; i < t->n_vocab; i++)
            if (tok_off[i] != SIZE_MAX) t->token[i] = arena.p + tok_off[i];
        for (int i = 0; i < t->n_added; i++) {
            t->token[t->added[i].id] = t->added[i].content;
            t->token_len[t->added[i].id] = (uint32_t)t->added[i].content_len;
        }
        t->arena = arena.p;
        arena.p = NULL;
        if (dir) s = load_configs(t, dir, err, errlen);
        else {
            if (!(t->bos_str = strdup("")) || !(t->eos_str = strdup(""))) s = nomem(&l, "tokenizer");
            if (t->n_prefix > 0) t->bos_id = t->prefix_ids[0];
        }
    }
    if (!s && qw_tok_build_pieces(t)) s = nomem(&l, "decoder");
    free(tok_off);
    free(arena.p);
    if (s) {
        qwenc_tokenizer_free(t);
        return s;
    }
    *out = t;
    return QWENC_OK;
}

/* dir/tokenizer.json and the config files beside it. */
static qwenc_status load_dir(const char *dir, qwenc_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    char *path = qw_path_new(dir, "tokenizer.json"), *buf = NULL;
    if (!path) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    size_t len = 0;
    qwenc_status s = qw_read_file(path, &buf, &len, err, errlen);
    if (!s) s = qw_tok_from_json(buf, len, path, dir, out, err, errlen);
    free(buf);
    free(path);
    return s;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

qwenc_status qwenc_tokenizer_load(const char *path, qwenc_tokenizer **out, char *err, size_t errlen) {
    if (!path || !out) return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_tokenizer_load: NULL argument");
    *out = NULL;
    if (!is_file(path)) return load_dir(path, out, err, errlen);
    int none = 0;
    qwenc_status s = qw_tok_load_gguf(path, out, &none, err, errlen);
    if (!s && none)
        s = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s has no tokenizer (tokenizer.ggml.model is \"none\" or missing)", path);
    return s;
}

/* A .gguf's own tokenizer first, then tokenizer.json beside the file (what llama.cpp would not need). */
qwenc_status qwenc_tokenizer_load_model(const char *path, qwenc_tokenizer **out, char *err, size_t errlen) {
    if (!path || !out) return qw_err(err, errlen, QWENC_ERR_ARG, "qwenc_tokenizer_load_model: NULL argument");
    *out = NULL;
    if (!is_file(path)) return load_dir(path, out, err, errlen);
    int none = 0;
    qwenc_status s = qw_tok_load_gguf(path, out, &none, err, errlen);
    if (s || !none) return s;
    const char *slash = strrchr(path, '/');
    char *dir = strdup(slash ? path : ".");
    if (!dir) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", path);
    if (slash) dir[slash - path + (slash == path)] = 0; /* "/m.gguf" -> "/" */
    char *json = qw_path_new(dir, "tokenizer.json");
    if (!json) s = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", path);
    else if (is_file(json)) s = load_dir(dir, out, err, errlen);
    else
        s = qw_err(err, errlen, QWENC_ERR_FORMAT,
                   "%s has no tokenizer (tokenizer.ggml.model is \"none\" or missing) and there is no %s beside it", path,
                   json);
    free(json);
    free(dir);
    return s;
}

void qwenc_tokenizer_free(qwenc_tokenizer *t) {
    if (!t) return;
    qw_strmap_free(&t->vocab);
    qw_pairmap_free(&t->merges);
    qw_strmap_free(&t->added_map);
    free(t->char_id);
    free(t->subword_prefix);
    free(t->word_suffix);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].str);
        qw_regex_free(&t->norm[i].rx);
    }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) {
        free(t->pre[i].str);
        qw_regex_free(&t->pre[i].rx);
    }
    free(t->pre);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].match);
    }
    free(t->added);
    qw_trie_free(&t->trie_raw);
    qw_trie_free(&t->trie_norm);
    free(t->special);
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].str);
        free(t->dec[i].str2);
    }
    free(t->dec);
    if (t->piece)
        for (int i = 0; i < t->n_vocab; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->token);
    free(t->token_len);
    free(t->arena);
    free(t->prefix_ids);
    free(t->suffix_ids);
    free(t->eos_ids);
    free(t->bos_str);
    free(t->eos_str);
    free(t->chat_template);
    free(t);
}

/* ---------------------------------------------------------------- getters */

int qwenc_tokenizer_n_vocab(const qwenc_tokenizer *t) { return t->n_vocab; }
int qwenc_tokenizer_bos(const qwenc_tokenizer *t) { return t->bos_id; }

int qwenc_tokenizer_eos(const qwenc_tokenizer *t, const int32_t **ids) {
    if (ids) *ids = t->eos_ids;
    return t->n_eos;
}

const char *qwenc_tokenizer_bos_str(const qwenc_tokenizer *t) { return t->bos_str ? t->bos_str : ""; }
const char *qwenc_tokenizer_eos_str(const qwenc_tokenizer *t) { return t->eos_str ? t->eos_str : ""; }
const char *qwenc_tokenizer_chat_template(const qwenc_tokenizer *t) { return t->chat_template; }

const char *qwenc_tokenizer_token_text(const qwenc_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab || !t->piece) return "";
    return t->piece[id];
}

int32_t qwenc_tokenizer_token_id(const qwenc_tokenizer *t, const char *token) {
    if (!token) return -1;
    size_t n = strlen(token);
    int32_t id = qw_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : qw_strmap_get(&t->vocab, token, n);
}

int qwenc_tokenizer_is_special(const qwenc_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->special[id];
}
