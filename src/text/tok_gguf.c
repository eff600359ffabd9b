/*
 * tok_gguf.c - the tokenizer of a llama.cpp GGUF file: read from its tokenizer.* metadata, and written there
 * from a Hugging Face tokenizer directory (qwenc quantize).
 *
 * The keys are those of llama.cpp's converter (gguf-py SpecialVocab, convert_hf_to_gguf get_vocab_base) and
 * reader (src/llama-vocab.cpp): tokenizer.ggml.model "gpt2" (byte-level BPE), .pre (the pre-tokenizer, by
 * name), .tokens (the strings of every id: byte-level strings, added tokens as written), .token_type (1
 * normal, 3 control, 4 user-defined, 5 unused = a padding id without a token), .merges ("left right" in rank
 * order), .bos/eos/eot/eom/padding_token_id, .add_bos_token / .add_eos_token, tokenizer.chat_template.
 *
 * Reading builds the same qwenc_tokenizer the tokenizer.json path builds: the pre name stands for the
 * normalizer and pre-tokenizer of the Hugging Face tokenizer that llama.cpp gives that name (pre_defs below,
 * the very regexes of those tokenizer.json files), control tokens are special added tokens and user-defined
 * tokens non-special ones, both matched as whole tokens before BPE (normalized=false, no lstrip/rstrip), and
 * the decoder is ByteLevel. So a GGUF written from a tokenizer.json gives the ids of that tokenizer.json.
 * Known differences from llama.cpp, which reads the same file: qwenc applies the NFC normalizer of the Qwen
 * tokenizers (llama.cpp does not normalize) and the tokenizer.json regexes with their case-insensitive
 * contractions (llama.cpp's rewrites use [sS]-style classes, which miss U+017F and U+212A).
 *
 * Writing refuses, with the reason, a tokenizer llama.cpp could not run the same way: another model type,
 * normalizer, pre-tokenizer or decoder, byte fallback, added tokens with lstrip/rstrip/single_word, or a
 * post-processor adding more than BOS/EOS. Control tokens are the special added tokens and those that look
 * special to the converter (<|...|>); ids without a token are written "[PAD<id>]" with type unused.
 */
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/gguf.h"
#include "text/tok_gguf.h"
#include "text/tok_internal.h"

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

/* The Split regexes of the tokenizer.json files (Oniguruma syntax, compiled as the tokenizer.json path does). */
#define RE_QWEN2                                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* A tokenizer.ggml.pre name as the tokenizer.json steps it stands for. */
typedef struct {
    const char *name;
    int nfc;              /* an NFC normalizer first */
    const char *split[4]; /* Split(Isolated) regexes in turn, then ByteLevel without regex; none: ByteLevel
                           * with the GPT-2 regex */
    int ignore_merges;    /* a word that is a token is not merged (llama.cpp sets it for these names) */
    int add_bos;          /* llama.cpp's add_bos when the file has no tokenizer.ggml.add_bos_token */
    int write;            /* the name written for this pipeline (the others are aliases llama.cpp reads) */
} pre_def;

static const pre_def PRE_DEFS[] = {
    {"qwen2", 1, {RE_QWEN2}, 0, 0, 1},       /* Qwen2, Qwen2.5, Qwen3, Qwen3-Next */
    {"qwen35", 1, {RE_QWEN35}, 0, 0, 1},     /* Qwen3.5 / 3.6: letters keep their combining marks */
    {"llama-bpe", 0, {RE_LLAMA3}, 1, 1, 1},  /* Llama 3 */
    {"llama3", 0, {RE_LLAMA3}, 1, 1, 0},
    {"llama-v3", 0, {RE_LLAMA3}, 1, 1, 0},
    {"gpt-2", 0, {NULL}, 0, 0, 1},           /* GPT-2: ByteLevel with its own regex */
    /* llama.cpp's fallback for a file without a known pre-tokenizer: four splits in turn */
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                    "\\p{N}+", "[0-9][0-9][0-9]"}, 0, 0, 0},
};
#define N_PRE_DEFS ((int)(sizeof(PRE_DEFS) / sizeof(PRE_DEFS[0])))

static int n_split(const pre_def *d) {
    int n = 0;
    while (n < 4 && d->split[n]) n++;
    return n;
}

/* Texts of the tokens llama.cpp ends generation at in the families qwenc runs (llama-vocab.cpp's EOG list). */
static const char *const EOG_TEXTS[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
                                        "<|end|>", "<end_of_turn>"};

/* ---------------------------------------------------------------- reading */

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} rd;

static qwenc_status rd_bad(rd *r, qwenc_status st, const char *key, const char *what) {
    return qw_err(r->err, r->errlen, st, "%s: %s: %s", r->path, key, what);
}

static qwenc_status rd_nomem(rd *r, const char *key) { return rd_bad(r, QWENC_ERR_NOMEM, key, "out of memory"); }

/* An optional token id key: -1 when absent or outside the vocabulary (llama.cpp ignores those too). */
static int32_t opt_id(const qw_gguf *g, const char *key, int n_vocab) {
    const qw_gguf_kv *kv = qw_gguf_find_kv(g, key);
    if (!kv || kv->type == QW_GGUF_ARRAY || kv->type == QW_GGUF_STRING) return -1;
    int64_t v = qw_gguf_kv_i64(kv);
    return v >= 0 && v < n_vocab ? (int32_t)v : -1;
}

/* An optional bool key: def when absent. */
static int opt_bool(const qw_gguf *g, const char *key, int def) {
    const qw_gguf_kv *kv = qw_gguf_find_kv(g, key);
    if (!kv || kv->type == QW_GGUF_ARRAY || kv->type == QW_GGUF_STRING) return def;
    return qw_gguf_kv_i64(kv) != 0;
}

/* A new pre-tokenizer step, or NULL when out of memory. */
static qw_pre *add_pre(qwenc_tokenizer *t, qw_pre_kind kind) {
    qw_pre *np = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof(*t->pre));
    if (!np) return NULL;
    t->pre = np;
    qw_pre *p = &t->pre[t->n_pre++];
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    return p;
}

/* The normalizer, pre-tokenizer and decoder a pre name stands for. */
static qwenc_status build_pipeline(qwenc_tokenizer *t, rd *r, const pre_def *d) {
    if (d->nfc) {
        if (!(t->norm = calloc(1, sizeof(*t->norm)))) return rd_nomem(r, "tokenizer.ggml.pre");
        t->norm[0].kind = QW_NORM_NFC;
        t->n_norm = 1;
    }
    qwenc_status s;
    for (int i = 0; i < n_split(d); i++) {
        qw_pre *p = add_pre(t, QW_PRE_SPLIT);
        if (!p) return rd_nomem(r, "tokenizer.ggml.pre");
        p->behavior = QW_SPLIT_ISOLATED;
        if ((s = qw_regex_compile(&p->rx, d->split[i], 0, r->path, "tokenizer.ggml.pre", r->err, r->errlen))) return s;
    }
    qw_pre *bl = add_pre(t, QW_PRE_BYTELEVEL);
    if (!bl) return rd_nomem(r, "tokenizer.ggml.pre");
    if (!n_split(d)) {
        bl->use_regex = 1;
        if ((s = qw_regex_compile(&bl->rx, QW_GPT2_PATTERN, 0, r->path, "tokenizer.ggml.pre", r->err, r->errlen)))
            return s;
    }
    if (!(t->dec = calloc(1, sizeof(*t->dec)))) return rd_nomem(r, "tokenizer.ggml.pre");
    t->dec[0].kind = QW_DEC_BYTELEVEL;
    t->n_dec = 1;
    t->ignore_merges = d->ignore_merges;
    return QWENC_OK;
}

/* tokenizer.ggml.merges into t->merges ("left right", split at the first space after the first byte). */
static qwenc_status read_merges(qwenc_tokenizer *t, rd *r, const qw_gguf_kv *mk) {
    if (qw_pairmap_init(&t->merges, (size_t)mk->n)) return rd_nomem(r, "tokenizer.ggml.merges");
    qw_buf cat = {0};
    qwenc_status s = QWENC_OK;
    for (uint64_t i = 0; i < mk->n && !s; i++) {
        const char *m = qw_gguf_arr_str(mk, i), *sp = m[0] ? strchr(m + 1, ' ') : NULL;
        char key[64];
        snprintf(key, sizeof(key), "tokenizer.ggml.merges[%llu]", (unsigned long long)i);
        if (!sp) {
            s = rd_bad(r, QWENC_ERR_FORMAT, key, "a merge must be \"left right\"");
            break;
        }
        size_t al = (size_t)(sp - m), bl = strlen(sp + 1);
        cat.n = 0;
        qw_buf_add(&cat, m, al);
        qw_buf_add(&cat, sp + 1, bl);
        if (cat.oom) {
            s = rd_nomem(r, key);
            break;
        }
        int32_t ia = qw_strmap_get(&t->vocab, m, al), ib = qw_strmap_get(&t->vocab, sp + 1, bl);
        int32_t im = qw_strmap_get(&t->vocab, cat.p, cat.n);
        if (ia < 0) ia = qw_strmap_get(&t->added_map, m, al);
        if (ib < 0) ib = qw_strmap_get(&t->added_map, sp + 1, bl);
        if (im < 0) im = qw_strmap_get(&t->added_map, cat.p, cat.n);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *which = ia < 0 ? m : ib < 0 ? sp + 1 : cat.p;
            size_t wl = ia < 0 ? al : ib < 0 ? bl : cat.n;
            char msg[160];
            snprintf(msg, sizeof(msg), "token \"%.*s\" is not in tokenizer.ggml.tokens", (int)QW_MIN(wl, 60), which);
            s = rd_bad(r, QWENC_ERR_FORMAT, key, msg);
            break;
        }
        if (qw_pairmap_put(&t->merges, ia, ib, (int32_t)i, im)) s = rd_nomem(r, key);
    }
    free(cat.p);
    return s;
}

/* Tokens, types, added tokens and merges. */
static qwenc_status read_vocab(qwenc_tokenizer *t, rd *r, const qw_gguf *g) {
    const qw_gguf_kv *tk, *ty = NULL, *mk;
    qwenc_status s = qw_gguf_get_arr(g, "tokenizer.ggml.tokens", QW_GGUF_STRING, &tk, r->err, r->errlen);
    if (s) return s;
    if (tk->n == 0 || tk->n > (1u << 30)) return rd_bad(r, QWENC_ERR_FORMAT, "tokenizer.ggml.tokens", "no tokens, or too many");
    if (qw_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        if ((s = qw_gguf_get_arr(g, "tokenizer.ggml.token_type", QW_GGUF_I64, &ty, r->err, r->errlen))) return s;
        if (ty->n < tk->n) return rd_bad(r, QWENC_ERR_FORMAT, "tokenizer.ggml.token_type", "fewer types than tokens");
    }
    if ((s = qw_gguf_get_arr(g, "tokenizer.ggml.merges", QW_GGUF_STRING, &mk, r->err, r->errlen))) return s;

    int n = (int)tk->n, n_added = 0;
    t->n_vocab = n;
    t->token = calloc((size_t)n, sizeof(char *));
    t->token_len = calloc((size_t)n, sizeof(uint32_t));
    t->special = calloc((size_t)n, 1);
    int *type = malloc((size_t)n * sizeof(int));
    size_t *off = malloc((size_t)n * sizeof(size_t));
    if (!t->token || !t->token_len || !t->special || !type || !off) {
        free(type);
        free(off);
        return rd_nomem(r, "tokenizer.ggml.tokens");
    }
    qw_buf arena = {0};
    for (int i = 0; i < n; i++) {
        type[i] = ty ? (int)qw_gguf_arr_i64(ty, (uint64_t)i) : TT_NORMAL;
        n_added += type[i] == TT_CONTROL || type[i] == TT_USER_DEFINED;
        const char *str = qw_gguf_arr_str(tk, (uint64_t)i);
        off[i] = arena.n;
        t->token_len[i] = (uint32_t)strlen(str);
        qw_buf_add(&arena, str, t->token_len[i]);
        qw_buf_addc(&arena, 0);
    }
    t->arena = arena.p;
    int oom = arena.oom;
    oom = oom || qw_strmap_init(&t->vocab, (size_t)(n - n_added));
    oom = oom || qw_strmap_init(&t->added_map, (size_t)n_added + 1);
    oom = oom || !(t->added = calloc((size_t)n_added + 1, sizeof(*t->added)));
    if (oom) {
        free(type);
        free(off);
        return rd_nomem(r, "tokenizer.ggml.tokens");
    }
    for (int i = 0; i < n && !oom; i++) {
        if (type[i] == TT_UNUSED) {
            t->token_len[i] = 0; /* a padding id: no token, as an id missing from tokenizer.json */
            continue;
        }
        t->token[i] = t->arena + off[i];
        if (type[i] != TT_CONTROL && type[i] != TT_USER_DEFINED) oom = qw_strmap_put(&t->vocab, t->token[i], t->token_len[i], i);
    }
    /* added tokens: control (special) first, then user-defined, each in id order, as tokenizer.c orders them */
    for (int pass = 0; pass < 2 && !oom; pass++)
        for (int i = 0; i < n && !oom; i++) {
            if (type[i] != (pass == 0 ? TT_CONTROL : TT_USER_DEFINED) || !t->token_len[i]) continue;
            if (!qw_utf8_is_valid(t->token[i], t->token_len[i])) {
                /* matched in the text before it is split: a piece of a character would cut one in two */
                char key[64];
                snprintf(key, sizeof(key), "tokenizer.ggml.tokens[%d]", i);
                free(type);
                free(off);
                return rd_bad(r, QWENC_ERR_FORMAT, key, "a control or user-defined token is not valid UTF-8");
            }
            qw_added *a = &t->added[t->n_added++];
            a->id = i;
            a->content_len = a->match_len = t->token_len[i];
            a->content = malloc(a->content_len + 1);
            a->match = malloc(a->content_len + 1);
            if (!a->content || !a->match) {
                oom = 1;
                break;
            }
            memcpy(a->content, t->token[i], a->content_len + 1);
            memcpy(a->match, t->token[i], a->content_len + 1);
            a->special = (uint8_t)(pass == 0);
            t->special[i] = a->special;
            oom = qw_trie_add(&t->trie_raw, a->match, a->match_len, t->n_added - 1) ||
                  qw_strmap_put(&t->added_map, a->content, a->content_len, i);
        }
    free(type);
    free(off);
    t->unk_id = -1;
    if (oom || qw_tok_index_chars(t)) return rd_nomem(r, "tokenizer.ggml.tokens");
    return read_merges(t, r, mk);
}

/* BOS/EOS, what add_bos adds, the stop ids and the chat template; -1 when out of memory. */
static int read_specials(qwenc_tokenizer *t, const qw_gguf *g, const pre_def *d) {
    int n = t->n_vocab, oom = 0;
    t->bos_id = opt_id(g, "tokenizer.ggml.bos_token_id", n);
    int32_t eos = opt_id(g, "tokenizer.ggml.eos_token_id", n);
    oom |= !(t->bos_str = strdup(t->bos_id >= 0 && t->token[t->bos_id] ? t->token[t->bos_id] : ""));
    oom |= !(t->eos_str = strdup(eos >= 0 && t->token[eos] ? t->token[eos] : ""));
    if (opt_bool(g, "tokenizer.ggml.add_bos_token", d->add_bos) && t->bos_id >= 0)
        oom |= qw_tok_push_id(&t->prefix_ids, &t->n_prefix, t->bos_id);
    if (opt_bool(g, "tokenizer.ggml.add_eos_token", 0) && eos >= 0) oom |= qw_tok_push_id(&t->suffix_ids, &t->n_suffix, eos);
    oom |= qw_tok_add_eos(t, eos);
    oom |= qw_tok_add_eos(t, opt_id(g, "tokenizer.ggml.eot_token_id", n));
    oom |= qw_tok_add_eos(t, opt_id(g, "tokenizer.ggml.eom_token_id", n));
    for (size_t k = 0; k < sizeof(EOG_TEXTS) / sizeof(EOG_TEXTS[0]); k++)
        oom |= qw_tok_add_eos(t, qw_strmap_get(&t->added_map, EOG_TEXTS[k], strlen(EOG_TEXTS[k])));
    const qw_gguf_kv *ct = qw_gguf_find_kv(g, "tokenizer.chat_template");
    if (ct && ct->type == QW_GGUF_STRING) oom |= !(t->chat_template = strdup(ct->str));
    return oom ? -1 : 0;
}

qwenc_status qw_tok_load_gguf(const char *path, qwenc_tokenizer **out, int *none, char *err, size_t errlen) {
    *out = NULL;
    *none = 0;
    qw_gguf g;
    qwenc_status s = qw_gguf_open(&g, path, err, errlen);
    if (s) {
        qw_gguf_free(&g);
        return s;
    }
    rd r = {path, err, errlen};
    const qw_gguf_kv *mkv = qw_gguf_find_kv(&g, "tokenizer.ggml.model");
    const char *model = mkv && mkv->type == QW_GGUF_STRING ? mkv->str : NULL;
    if (!model || !strcmp(model, "none")) {
        *none = 1;
        qw_gguf_free(&g);
        return QWENC_OK;
    }
    const pre_def *d = NULL;
    char msg[256];
    if (strcmp(model, "gpt2") != 0) {
        snprintf(msg, sizeof(msg), "\"%.60s\" is not supported (qwenc reads \"gpt2\", byte-level BPE)", model);
        s = rd_bad(&r, QWENC_ERR_UNSUPPORTED, "tokenizer.ggml.model", msg);
    } else if (opt_bool(&g, "tokenizer.ggml.add_space_prefix", 0)) {
        s = rd_bad(&r, QWENC_ERR_UNSUPPORTED, "tokenizer.ggml.add_space_prefix", "true is not supported");
    } else if (opt_bool(&g, "tokenizer.ggml.normalizer.lowercase", 0)) {
        s = rd_bad(&r, QWENC_ERR_UNSUPPORTED, "tokenizer.ggml.normalizer.lowercase", "true is not supported");
    } else {
        /* no pre name: llama.cpp's "default" (it warns that quality degrades) */
        const qw_gguf_kv *pk = qw_gguf_find_kv(&g, "tokenizer.ggml.pre");
        const char *pre = pk && pk->type == QW_GGUF_STRING ? pk->str : "default";
        for (int i = 0; i < N_PRE_DEFS && !d; i++)
            if (!strcmp(pre, PRE_DEFS[i].name)) d = &PRE_DEFS[i];
        if (!d) {
            int o = snprintf(msg, sizeof(msg), "\"%.60s\" is not a pre-tokenizer qwenc knows (", pre);
            for (int i = 0; i < N_PRE_DEFS && o > 0 && o < (int)sizeof(msg); i++)
                o += snprintf(msg + o, sizeof(msg) - (size_t)o, "%s%s", i ? ", " : "", PRE_DEFS[i].name);
            if (o > 0 && o < (int)sizeof(msg) - 1) snprintf(msg + o, sizeof(msg) - (size_t)o, ")");
            s = rd_bad(&r, QWENC_ERR_UNSUPPORTED, "tokenizer.ggml.pre", msg);
        }
    }
    qwenc_tokenizer *t = NULL;
    if (!s && !(t = calloc(1, sizeof(*t)))) s = rd_nomem(&r, "tokenizer");
    if (!s) s = read_vocab(t, &r, &g);
    if (!s) s = build_pipeline(t, &r, d);
    if (!s && read_specials(t, &g, d)) s = rd_nomem(&r, "tokenizer");
    if (!s && qw_tok_build_pieces(t)) s = rd_nomem(&r, "tokenizer.ggml.tokens");
    qw_gguf_free(&g);
    if (s) {
        qwenc_tokenizer_free(t);
        return s;
    }
    *out = t;
    return QWENC_OK;
}

/* ---------------------------------------------------------------- writing */

/* The converter's rule (does_token_look_special) for added tokens not marked special. */
static int looks_special(const char *s, size_t n) {
    static const char *const names[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (n == strlen(names[i]) && !memcmp(s, names[i], n)) return 1;
    struct {
        const char *a, *b;
    } wrap[] = {{"<|", "|>"}, {"<\xef\xbd\x9c", "\xef\xbd\x9c>"}, {"<unused", ">"}};
    for (size_t i = 0; i < sizeof(wrap) / sizeof(wrap[0]); i++) {
        size_t la = strlen(wrap[i].a), lb = strlen(wrap[i].b);
        if (n >= la + lb && !memcmp(s, wrap[i].a, la) && !memcmp(s + n - lb, wrap[i].b, lb)) return 1;
    }
    return 0;
}

/* Does the loaded tokenizer run as llama.cpp runs pre name d? */
static int pipeline_is(const qwenc_tokenizer *t, const pre_def *d) {
    if (d->nfc ? !(t->n_norm == 1 && t->norm[0].kind == QW_NORM_NFC) : t->n_norm != 0) return 0;
    if (!!t->ignore_merges != d->ignore_merges) return 0;
    int ns = n_split(d);
    if (t->n_pre != ns + 1) return 0;
    for (int i = 0; i < ns; i++) {
        const qw_pre *p = &t->pre[i];
        if (p->kind != QW_PRE_SPLIT || p->behavior != QW_SPLIT_ISOLATED || p->invert || p->rx.literal ||
            strcmp(p->rx.src, d->split[i]) != 0)
            return 0;
    }
    const qw_pre *bl = &t->pre[ns];
    return bl->kind == QW_PRE_BYTELEVEL && !bl->add_prefix_space && bl->use_regex == (ns == 0);
}

/* The id of a special token of tokenizer_config.json ("<typ>_token"), else config.json "<typ>_token_id". */
static int32_t config_id(const qwenc_tokenizer *t, const cJSON *tc, const cJSON *cc, const char *typ) {
    char key[32];
    snprintf(key, sizeof(key), "%s_token", typ);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(tc, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (cJSON_IsString(v)) return qwenc_tokenizer_token_id(t, v->valuestring);
    snprintf(key, sizeof(key), "%s_token_id", typ);
    v = cJSON_GetObjectItemCaseSensitive(cc, key);
    if (!v) v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cc, "text_config"), key);
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < t->n_vocab) return (int32_t)v->valuedouble;
    return -1;
}

typedef struct {
    int32_t rank, a, b;
} merge_ref;

static int by_rank(const void *x, const void *y) {
    const merge_ref *a = x, *b = y;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

/* Why t cannot be written as a GGUF tokenizer (NULL: it can, as *def). */
static const char *unwritable(const qwenc_tokenizer *t, const pre_def **def) {
    *def = NULL;
    if (t->byte_fallback) return "model.byte_fallback is not in llama.cpp's BPE";
    if (t->subword_prefix || t->word_suffix) return "model.continuing_subword_prefix / end_of_word_suffix are not in llama.cpp's BPE";
    if (t->dec_none || t->n_dec != 1 || t->dec[0].kind != QW_DEC_BYTELEVEL) return "the decoder is not ByteLevel";
    for (int i = 0; i < N_PRE_DEFS && !*def; i++)
        if (PRE_DEFS[i].write && pipeline_is(t, &PRE_DEFS[i])) *def = &PRE_DEFS[i];
    if (!*def)
        return "the normalizer and pre_tokenizer are none of llama.cpp's qwen2, qwen35, llama-bpe, gpt-2 (NFC or no "
               "normalizer, the Split regex of that tokenizer, ByteLevel)";
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].lstrip || t->added[i].rstrip || t->added[i].single_word)
            return "an added token has lstrip, rstrip or single_word, which a GGUF cannot say";
    if (t->n_prefix > 1 || t->n_suffix > 1) return "the post-processor adds more than one token before or after a sequence";
    return NULL;
}

qwenc_status qw_tok_gguf_write(qw_gguf_writer *w, const char *dir, int n_vocab, int *written, char *err,
                               size_t errlen) {
    *written = 0;
    char *json = qw_path_new(dir, "tokenizer.json");
    if (!json) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    struct stat st;
    int have = stat(json, &st) == 0;
    free(json);
    if (!have) return QWENC_OK;
    qwenc_tokenizer *t = NULL;
    qwenc_status s = qwenc_tokenizer_load(dir, &t, err, errlen);
    if (!s) s = qw_tok_gguf_put(w, t, dir, n_vocab, err, errlen);
    qwenc_tokenizer_free(t);
    *written = s == QWENC_OK;
    return s;
}

qwenc_status qw_tok_gguf_put(qw_gguf_writer *w, const qwenc_tokenizer *t, const char *dir, int n_vocab, char *err,
                             size_t errlen) {
    char *json = qw_path_new(dir, "tokenizer.json");
    if (!json) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    cJSON *tc = NULL, *cc = NULL;
    char **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    merge_ref *mr = NULL;
    int n_merges = 0;
    const pre_def *d = NULL;
    qwenc_status s = qw_tok_load_json(dir, "tokenizer_config.json", 1, &tc, err, errlen);
    if (!s) s = qw_tok_load_json(dir, "config.json", 1, &cc, err, errlen);
    if (s) goto done;
    const char *why = unwritable(t, &d);
    if (why) {
        s = qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: cannot be written as a llama.cpp GGUF tokenizer: %s", json, why);
        goto done;
    }
    if (n_vocab <= 0) n_vocab = t->n_vocab;
    if (t->n_vocab > n_vocab) {
        s = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: the tokenizer has %d ids, more than the model's vocabulary (%d)", json,
                   t->n_vocab, n_vocab);
        goto done;
    }

    /* tokens and their types: added tokens as written, padding ids as "[PAD<id>]" */
    tokens = calloc((size_t)n_vocab, sizeof(char *));
    types = calloc((size_t)n_vocab, sizeof(int32_t));
    if (!tokens || !types) goto oom;
    for (int i = 0; i < n_vocab; i++) {
        if (i < t->n_vocab && t->token[i] && t->token_len[i]) {
            if (!(tokens[i] = malloc(t->token_len[i] + 1))) goto oom;
            memcpy(tokens[i], t->token[i], t->token_len[i]);
            tokens[i][t->token_len[i]] = 0;
            types[i] = TT_NORMAL;
            if (memchr(t->token[i], 0, t->token_len[i])) {
                s = qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: token %d holds a NUL byte", json, i);
                goto done;
            }
        } else {
            char pad[32];
            snprintf(pad, sizeof(pad), "[PAD%d]", i);
            if (!(tokens[i] = strdup(pad))) goto oom;
            types[i] = TT_UNUSED;
        }
    }
    for (int k = 0; k < t->n_added; k++) {
        const qw_added *a = &t->added[k];
        types[a->id] = a->special || looks_special(a->content, a->content_len) ? TT_CONTROL : TT_USER_DEFINED;
    }

    /* merges in rank order, as "left right" */
    if (!(mr = calloc((size_t)t->merges.n + 1, sizeof(*mr)))) goto oom;
    for (uint32_t k = 0; k < t->merges.cap; k++)
        if (t->merges.key[k] != UINT64_MAX)
            mr[n_merges++] = (merge_ref){t->merges.rank[k], (int32_t)(t->merges.key[k] >> 32),
                                         (int32_t)(t->merges.key[k] & 0xffffffffu)};
    qsort(mr, (size_t)n_merges, sizeof(*mr), by_rank);
    if (!(merges = calloc((size_t)n_merges + 1, sizeof(char *)))) goto oom;
    for (int k = 0; k < n_merges; k++) {
        const char *a = t->token[mr[k].a], *b = t->token[mr[k].b];
        size_t al = t->token_len[mr[k].a], bl = t->token_len[mr[k].b];
        if (memchr(a, ' ', al) || memchr(b, ' ', bl)) {
            s = qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: model.merges[%d] holds a space, which llama.cpp's merges "
                       "cannot", json, mr[k].rank);
            goto done;
        }
        if (!(merges[k] = malloc(al + bl + 2))) goto oom;
        memcpy(merges[k], a, al);
        merges[k][al] = ' ';
        memcpy(merges[k] + al + 1, b, bl);
        merges[k][al + 1 + bl] = 0;
    }

    qw_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    qw_gguf_writer_set_str(w, "tokenizer.ggml.pre", d->name);
    qw_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, (uint64_t)n_vocab);
    qw_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QW_GGUF_I32, types, (uint64_t)n_vocab);
    qw_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, (uint64_t)n_merges);
    /* special ids as gguf-py's SpecialVocab finds them; BOS/EOS are the ones the post-processor adds, if any */
    static const struct {
        const char *typ, *key;
    } ids[] = {{"bos", "tokenizer.ggml.bos_token_id"},   {"eos", "tokenizer.ggml.eos_token_id"},
               {"unk", "tokenizer.ggml.unknown_token_id"}, {"sep", "tokenizer.ggml.seperator_token_id"},
               {"pad", "tokenizer.ggml.padding_token_id"}, {"cls", "tokenizer.ggml.cls_token_id"},
               {"mask", "tokenizer.ggml.mask_token_id"}};
    for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
        int32_t id = config_id(t, tc, cc, ids[k].typ);
        if (k == 0 && t->n_prefix) id = t->prefix_ids[0];
        if (k == 1 && t->n_suffix) id = t->suffix_ids[0];
        if (id >= 0) qw_gguf_writer_set_u32(w, ids[k].key, (uint32_t)id);
    }
    /* written even when false: llama.cpp's default differs between pre names */
    qw_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", t->n_prefix > 0);
    qw_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", t->n_suffix > 0);
    if (t->chat_template) qw_gguf_writer_set_str(w, "tokenizer.chat_template", t->chat_template);
    goto done;
oom:
    s = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory writing the tokenizer", json);
done:
    if (tokens)
        for (int i = 0; i < n_vocab; i++) free(tokens[i]);
    free(tokens);
    if (merges)
        for (int k = 0; k < n_merges; k++) free(merges[k]);
    free(merges);
    free(types);
    free(mr);
    cJSON_Delete(tc);
    cJSON_Delete(cc);
    free(json);
    return s;
}
