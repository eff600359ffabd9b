/*
 * tok_internal.h - the tokenizer's data, shared by the files of src/text/tok*.c:
 *   tokenizer.c   loading tokenizer.json and the config files, the public getters
 *   tok_encode.c  text -> ids: UTF-8 repair, added tokens, normalizer, pre-tokenizer, BPE
 *   tok_decode.c  ids -> text, whole and streaming
 *   tok_util.c    hash maps, the added-token trie, UTF-8 helpers, the byte-level alphabet
 *   tok_gguf.c    the tokenizer of a llama.cpp GGUF file (tokenizer.ggml.*), read and written
 *
 * The pipeline is the one of the Hugging Face `tokenizers` library (tokenizer/mod.rs encode_single_sequence):
 * added tokens are split off the raw text first, every other piece is normalized, pre-tokenized into words,
 * and each word goes through the BPE model. Everything here is read-only after load.
 *
 * Out of memory: nothing here aborts. The maps and the trie return -1 when they cannot grow (and are left as they
 * were); a qw_buf or qw_ivec that cannot grow sets its oom flag and ignores what is added from then on (its n
 * bytes at p stay valid), so a caller checks the flag once after a series of additions and returns
 * QWENC_ERR_NOMEM.
 */
#ifndef QW_TOK_INTERNAL_H
#define QW_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/common.h"

/* ---------------------------------------------------------------- small containers */

/* Open-addressing map from byte strings (not owned) to int32. */
typedef struct {
    const char **key; /* [cap] NULL: empty slot */
    uint32_t *klen;   /* [cap] */
    int32_t *val;     /* [cap] */
    uint32_t cap, n;  /* cap is a power of two, n <= cap/2 */
} qw_strmap;

/* 0, or -1 when out of memory (m is then empty). */
int qw_strmap_init(qw_strmap *m, size_t expect);
void qw_strmap_free(qw_strmap *m);
/* Insert or overwrite; -1 when the map cannot grow. */
int qw_strmap_put(qw_strmap *m, const char *key, size_t len, int32_t val);
/* The value, or -1. */
int32_t qw_strmap_get(const qw_strmap *m, const char *key, size_t len);

/* Map from a pair of token ids to the merge (rank, result id). */
typedef struct {
    uint64_t *key;   /* [cap] ((uint64)left << 32 | right); UINT64_MAX: empty */
    int32_t *rank;   /* [cap] */
    int32_t *merged; /* [cap] */
    uint32_t cap, n;
} qw_pairmap;

int qw_pairmap_init(qw_pairmap *m, size_t expect); /* 0, or -1 when out of memory */
void qw_pairmap_free(qw_pairmap *m);
int qw_pairmap_put(qw_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged); /* -1: cannot grow */
/* 1 and fills rank/merged if the pair merges, else 0. */
int qw_pairmap_get(const qw_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged);

/* Growable byte buffer, NUL-terminated once anything was added. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom; /* an addition failed for lack of memory (and was dropped) */
} qw_buf;

/* Room for extra more bytes (and the NUL): 0, or -1 with b->oom set. */
int qw_buf_reserve(qw_buf *b, size_t extra);
void qw_buf_add(qw_buf *b, const void *data, size_t len);
void qw_buf_addc(qw_buf *b, char c);

/* Growable int32 vector. */
typedef struct {
    int32_t *p;
    size_t n, cap;
    int oom;
} qw_ivec;

void qw_ivec_push(qw_ivec *v, int32_t x);

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the valid UTF-8 sequence starting at s[0] (at most n bytes), or 0 if s does not start with one. */
int qw_utf8_valid_len(const uint8_t *s, size_t n);
/* Length of the longest prefix of s (n bytes) that could still become a valid sequence: 0 when s[0] is not
 * the start of one. Used to tell "incomplete" (wait for more bytes) from "invalid". */
int qw_utf8_partial_len(const uint8_t *s, size_t n);
/* Decode one valid sequence (as checked by qw_utf8_valid_len); returns the code point and sets *len. */
uint32_t qw_utf8_decode(const uint8_t *s, int *len);
int qw_utf8_encode(uint32_t cp, char *out);
/* Append s with each maximal invalid subsequence replaced by U+FFFD (the Unicode "maximal subpart"
 * practice, as Python's errors="replace" and Rust's from_utf8_lossy). Returns 1 if anything was replaced. */
int qw_utf8_repair(const char *s, size_t n, qw_buf *out);
/* 1 if s is valid UTF-8. */
int qw_utf8_is_valid(const char *s, size_t n);
/* Unicode White_Space (Rust char::is_whitespace, Oniguruma \s). */
int qw_is_white_space(uint32_t cp);

/* The byte-level alphabet of GPT-2: each byte is shown as one printable code point. */
extern const uint16_t qw_byte_to_cp[256];
/* The byte of a byte-level code point, or -1. */
int qw_cp_to_byte(uint32_t cp);

/* ---------------------------------------------------------------- tokenizer parts */

typedef enum { QW_SPLIT_REMOVED, QW_SPLIT_ISOLATED, QW_SPLIT_PREV, QW_SPLIT_NEXT, QW_SPLIT_CONTIGUOUS } qw_split_behavior;

/* The GPT-2 split of ByteLevel(use_regex=true) (pre_tokenizers/byte_level.rs). */
#define QW_GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* A compiled pattern (HF Split/Replace pattern: {"Regex": ...} or {"String": ...}). */
typedef struct {
    pcre2_code *re;
    char *src;   /* the pattern as written (to name a pre-tokenizer in a GGUF file) */
    int literal; /* src is a {"String": ...} */
} qw_regex;

typedef enum {
    QW_NORM_NFC,
    QW_NORM_NFD,
    QW_NORM_NFKC,
    QW_NORM_NFKD,
    QW_NORM_LOWERCASE,
    QW_NORM_PREPEND,  /* str */
    QW_NORM_REPLACE,  /* rx -> str */
    QW_NORM_STRIP     /* left / right */
} qw_norm_kind;

typedef struct {
    qw_norm_kind kind;
    char *str;
    qw_regex rx;
    int left, right;
} qw_norm;

typedef enum {
    QW_PRE_SPLIT,     /* rx, behavior, invert */
    QW_PRE_BYTELEVEL, /* add_prefix_space, use_regex (GPT-2 pattern in rx) */
    QW_PRE_METASPACE, /* str = replacement, prepend (0 never, 1 first, 2 always), split */
    QW_PRE_DIGITS     /* rx = \p{N}, behavior isolated or contiguous */
} qw_pre_kind;

typedef struct {
    qw_pre_kind kind;
    qw_regex rx;
    qw_split_behavior behavior;
    int invert;
    int add_prefix_space, use_regex;
    char *str;
    int prepend, split;
} qw_pre;

typedef struct {
    int32_t id;
    char *content;    /* as written in tokenizer.json */
    size_t content_len;
    char *match;      /* the text matched: content, normalized when `normalized` */
    size_t match_len;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} qw_added;

/* A byte trie over added-token strings; leftmost-longest matching like HF's Aho-Corasick. */
typedef struct {
    int32_t *child;   /* [n_nodes] first child node or -1 */
    int32_t *sibling; /* [n_nodes] next sibling or -1 */
    uint8_t *byte;    /* [n_nodes] */
    int32_t *token;   /* [n_nodes] index into tok->added, or -1 */
    int n_nodes, cap;
    uint8_t first[256]; /* 1 if some token starts with this byte */
} qw_trie;

typedef enum {
    QW_DEC_BYTELEVEL,
    QW_DEC_REPLACE,      /* str -> str2 */
    QW_DEC_BYTEFALLBACK,
    QW_DEC_FUSE,
    QW_DEC_STRIP,        /* str (one character), start, stop */
    QW_DEC_METASPACE     /* str = replacement, prepend */
} qw_dec_kind;

typedef struct {
    qw_dec_kind kind;
    char *str, *str2;
    int start, stop, prepend;
} qw_dec;

struct qwenc_tokenizer {
    int n_vocab;             /* highest id + 1 */
    char **token;            /* [n_vocab] vocabulary string of each id (NULL: no token; may hold NUL bytes) */
    uint32_t *token_len;     /* [n_vocab] */
    char *arena;             /* the model vocabulary strings token[] and vocab point into */

    /* BPE model */
    qw_strmap vocab;         /* model vocabulary: string -> id */
    qw_pairmap merges;
    int32_t unk_id;          /* -1 if none */
    int byte_fallback, fuse_unk, ignore_merges;
    char *subword_prefix;    /* continuing_subword_prefix or NULL */
    char *word_suffix;       /* end_of_word_suffix or NULL */
    int32_t byte_token[256]; /* id of "<0xNN>" for byte fallback, -1 if missing */
    int32_t *char_id;        /* [QW_CHAR_TABLE] id of the one-character token of each code point, -1 */

    qw_norm *norm;
    int n_norm;
    qw_pre *pre;
    int n_pre;

    qw_added *added;         /* [n_added] */
    int n_added;
    qw_trie trie_raw;        /* added tokens with normalized=false, matched on the raw text */
    qw_trie trie_norm;       /* normalized=true, matched on each normalized piece */
    uint8_t *special;        /* [n_vocab] 1 for special added tokens */
    qw_strmap added_map;     /* added token content -> id */

    qw_dec *dec;
    int n_dec;
    int dec_none;            /* no decoder: tokens are joined with spaces */
    int dec_first;           /* the first token decodes differently (Metaspace, Strip after Fuse) */
    char **piece;            /* [n_vocab] decoded bytes of each token (not the first-token form) */
    uint32_t *piece_len;     /* [n_vocab] */

    int32_t *prefix_ids, *suffix_ids; /* what add_bos adds around a sequence */
    int n_prefix, n_suffix;

    int32_t bos_id;
    char *bos_str, *eos_str, *chat_template;
    int32_t *eos_ids;
    int n_eos;
};

#define QW_CHAR_TABLE 0x3000

/* tok_encode.c (QWENC_ERR_NOMEM with a message naming file and field when out of memory) */
qwenc_status qw_regex_compile(qw_regex *rx, const char *pattern, int literal, const char *file, const char *field,
                              char *err, size_t errlen);
void qw_regex_free(qw_regex *rx);
/* Normalize (all steps) n bytes of valid UTF-8 into out. */
qwenc_status qw_tok_normalize(const qwenc_tokenizer *tok, const char *s, size_t n, qw_buf *out, char *err,
                              size_t errlen);

/* tok_decode.c: fill tok->piece from tok->token and the decoder steps; -1 when out of memory. */
int qw_tok_build_pieces(qwenc_tokenizer *tok);

/* tokenizer.c: shared with tok_gguf.c */
struct cJSON;
/* Read and parse dir/name; a missing file is *out = NULL and QWENC_OK when optional. */
qwenc_status qw_tok_load_json(const char *dir, const char *name, int optional, struct cJSON **out, char *err,
                              size_t errlen);
/* A tokenizer from the text of a tokenizer.json: json holds len bytes (rewritten in place), path names it in
 * messages; dir, when not NULL, is the directory whose optional config files (tokenizer_config.json,
 * generation_config.json, config.json, chat_template.jinja) are read as qwenc_tokenizer_load reads them. */
qwenc_status qw_tok_from_json(char *json, size_t len, const char *path, const char *dir, qwenc_tokenizer **out,
                              char *err, size_t errlen);
/* Fill byte_token[] and char_id[] from the model vocabulary (after it is complete); -1 when out of memory. */
int qw_tok_index_chars(qwenc_tokenizer *t);
int qw_tok_push_id(int32_t **ids, int *n, int32_t id); /* -1 when out of memory */
/* Add a stop id unless negative or already there; -1 when out of memory. */
int qw_tok_add_eos(qwenc_tokenizer *t, int32_t id);

/* tok_gguf.c: the tokenizer of the GGUF file path; *none = 1 (and QWENC_OK, *out NULL) when the file has
 * none (tokenizer.ggml.model missing or "none"). */
qwenc_status qw_tok_load_gguf(const char *path, qwenc_tokenizer **out, int *none, char *err, size_t errlen);

/* tok_util.c: add a token's string to trie t (load time); -1 when out of memory. */
int qw_trie_add(qw_trie *t, const char *s, size_t len, int32_t token);
void qw_trie_free(qw_trie *t);

#endif
