/*
 * t_tokenizer.c - the tokenizer against the Hugging Face `tokenizers` library, and its own contracts.
 *
 *   t_tokenizer [DIR]      DIR defaults to tests/tokenizers
 *
 * DIR/cases.txt is the corpus (see tests/gen/make_tokenizer_cases.py for its format). Every sub-directory
 * of DIR with an expected.txt is one tokenizer: its tokenizer files are in the directory itself, or in the
 * directory named by its file `tokenizer_dir` (a path relative to the repository root), or its
 * tokenizer_overlay.json names a sibling whose tokenizer.json it modifies (the whole file is then written
 * to a temporary directory). Adding a tokenizer is adding such a directory. For every case and tokenizer:
 *   - ids with special tokens recognised, with them as plain text, and with add_bos, equal the library's;
 *   - decoding the ids (with and without special tokens) equals the library's decode, which for lossless
 *     tokenizers is the case text itself (decode(encode(x)) == x);
 *   - streaming the ids one by one gives the same text, every piece whole UTF-8 characters.
 * Every tokenizer llama.cpp can run is also written as a GGUF (text/tok_gguf.h, as `qwenc quantize` writes it),
 * loaded back from the file and held to the same expectations; the others must be refused with a reason.
 * Then hand-made checks: errors that name the file, configs (BOS/EOS/chat template), GGUF tokenizers (special
 * ids, padding ids, unknown pre-tokenizer, missing keys, where a model's tokenizer is looked for), streaming
 * across split characters and invalid bytes, repair of invalid input.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/mapfile.h"
#include "formats/gguf.h"
#include "qwenc.h"
#include "test_util.h"
#include "text/tok_gguf.h"

/* ---------------------------------------------------------------- corpus and expected files */

typedef struct {
    char *name;
    char *text; /* [len] raw bytes */
    size_t len;
} tcase;

typedef struct {
    char *data;
    size_t len;
} bytes;

/* Undo the escapes of cases.txt / expected.txt (\\ \n \r \t \xNN). */
static bytes unescape(const char *s) {
    size_t n = strlen(s), o = 0;
    char *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char e = s[i + 1];
            if (e == 'n') out[o++] = '\n';
            else if (e == 'r') out[o++] = '\r';
            else if (e == 't') out[o++] = '\t';
            else if (e == '\\') out[o++] = '\\';
            else if (e == 'x' && i + 3 < n) {
                char hex[3] = {s[i + 2], s[i + 3], 0};
                out[o++] = (char)strtol(hex, NULL, 16);
                i += 2;
            } else {
                out[o++] = s[i];
                continue;
            }
            i++;
            continue;
        }
        out[o++] = s[i];
    }
    out[o] = 0;
    return (bytes){out, o};
}

/* Split a heap buffer into lines in place; returns the count. */
static int split_lines(char *buf, char ***lines) {
    int n = 0, cap = 256;
    *lines = malloc(sizeof(char *) * (size_t)cap);
    for (char *p = buf; *p;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        if (n == cap) *lines = realloc(*lines, sizeof(char *) * (size_t)(cap *= 2));
        (*lines)[n++] = p;
        if (!e) break;
        p = e + 1;
    }
    return n;
}

static tcase *read_cases(const char *dir, int *n_cases) {
    char path[1024], err[512];
    snprintf(path, sizeof(path), "%s/cases.txt", dir);
    char *buf;
    size_t len;
    *n_cases = 0;
    if (qw_read_file(path, &buf, &len, err, sizeof(err))) {
        CHECK(0, "%s", err);
        return NULL;
    }
    char **lines;
    int nl = split_lines(buf, &lines), n = 0;
    tcase *cs = calloc((size_t)nl, sizeof(*cs));
    for (int i = 0; i < nl; i++) {
        char *tab = strchr(lines[i], '\t');
        if (lines[i][0] == '#' || !tab) continue;
        *tab = 0;
        cs[n].name = strdup(lines[i]);
        if (tab[1] == '@') {
            snprintf(path, sizeof(path), "%s/%s", dir, tab + 2);
            if (qw_read_file(path, &cs[n].text, &cs[n].len, err, sizeof(err))) {
                CHECK(0, "%s", err);
                continue;
            }
        } else {
            bytes b = unescape(tab + 1);
            cs[n].text = b.data;
            cs[n].len = b.len;
        }
        n++;
    }
    free(lines);
    free(buf);
    *n_cases = n;
    return cs;
}

typedef struct {
    int32_t *v;
    int n;
    int same;    /* "=": same as the "special" ids */
    int present;
} idlist;

typedef enum { DEC_NONE, DEC_TEXT, DEC_EQUAL, DEC_HASH } dec_kind;

typedef struct {
    idlist special, plain, bos;
    dec_kind kind[2];
    const char *dec[2]; /* DEC_TEXT: escaped text; DEC_HASH: "LEN:HASH" */
} expect;

static idlist parse_ids(const char *s) {
    idlist l = {0};
    l.present = 1;
    if (!strcmp(s, "=")) {
        l.same = 1;
        return l;
    }
    l.v = malloc(sizeof(int32_t) * (strlen(s) / 2 + 1));
    for (const char *p = s; *p;) {
        l.v[l.n++] = (int32_t)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
    }
    return l;
}

static uint64_t fnv1a64(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Does decoded text (d, dl) match the expectation (kind, e) for case c? */
static int dec_matches(dec_kind kind, const char *e, const tcase *c, const char *d, size_t dl) {
    if (kind == DEC_EQUAL) return dl == c->len && memcmp(d, c->text, dl) == 0;
    if (kind == DEC_HASH) {
        char want[64];
        snprintf(want, sizeof(want), "%zu:%016llx", dl, (unsigned long long)fnv1a64(d, dl));
        return !strcmp(want, e);
    }
    bytes b = unescape(e);
    int ok = b.len == dl && memcmp(b.data, d, dl) == 0;
    free(b.data);
    return ok;
}

static int ids_equal(const int32_t *a, int na, const int32_t *b, int nb, int *first_diff) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    *first_diff = i;
    return na == nb && i == na;
}

/* ---------------------------------------------------------------- overlays */

static int write_bytes(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* Replace (or add) every member of src in dst. */
static void overlay_members(cJSON *dst, const cJSON *src) {
    const cJSON *it;
    cJSON_ArrayForEach(it, src) {
        cJSON *dup = cJSON_Duplicate(it, 1);
        if (cJSON_GetObjectItemCaseSensitive(dst, it->string)) cJSON_ReplaceItemInObjectCaseSensitive(dst, it->string, dup);
        else cJSON_AddItemToObject(dst, it->string, dup);
    }
}

/* root/name/tokenizer_overlay.json (see tests/gen/make_tokenizer_cases.py) applied to its base, written with
 * the directory's other files into a new temporary directory tmp[64]. Returns 1 on success. */
static int materialize_overlay(const char *root, const char *name, char *tmp) {
    char path[1200], err[512];
    char *ov_text = NULL, *base_text = NULL;
    size_t n;
    snprintf(path, sizeof(path), "%s/%s/tokenizer_overlay.json", root, name);
    if (qw_read_file(path, &ov_text, &n, err, sizeof(err))) return 0;
    cJSON *ov = cJSON_Parse(ov_text), *full = NULL;
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(ov, "base");
    int ok = 0;
    if (cJSON_IsString(base)) {
        snprintf(path, sizeof(path), "%s/%s/tokenizer.json", root, base->valuestring);
        if (qw_read_file(path, &base_text, &n, err, sizeof(err)) == QWENC_OK) full = cJSON_ParseWithLength(base_text, n);
    }
    cJSON *model = cJSON_GetObjectItemCaseSensitive(full, "model");
    snprintf(tmp, 64, "/tmp/qwenc_t_overlay_XXXXXX");
    if (full && model && mkdtemp(tmp)) {
        overlay_members(full, cJSON_GetObjectItemCaseSensitive(ov, "top"));
        overlay_members(model, cJSON_GetObjectItemCaseSensitive(ov, "model"));
        char *text = cJSON_PrintUnformatted(full);
        snprintf(path, sizeof(path), "%s/tokenizer.json", tmp);
        ok = text && write_bytes(path, text, strlen(text));
        free(text);
        /* the other files (tokenizer_config.json, ...) come along */
        snprintf(path, sizeof(path), "%s/%s", root, name);
        DIR *dp = opendir(path);
        struct dirent *de;
        while (ok && dp && (de = readdir(dp))) {
            if (de->d_name[0] == '.' || !strcmp(de->d_name, "expected.txt") || !strcmp(de->d_name, "tokenizer_overlay.json"))
                continue;
            char src[1200], dst[1200], *data;
            snprintf(src, sizeof(src), "%s/%s/%s", root, name, de->d_name);
            snprintf(dst, sizeof(dst), "%s/%s", tmp, de->d_name);
            ok = qw_read_file(src, &data, &n, err, sizeof(err)) == QWENC_OK && write_bytes(dst, data, n);
            free(data);
        }
        if (dp) closedir(dp);
    }
    cJSON_Delete(ov);
    cJSON_Delete(full);
    free(ov_text);
    free(base_text);
    return ok;
}

static void remove_dir(const char *dir) {
    DIR *dp = opendir(dir);
    struct dirent *de;
    char p[1200];
    while (dp && (de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        unlink(p);
    }
    if (dp) closedir(dp);
    rmdir(dir);
}

/* The directory holding the tokenizer files of root/name; *tmp is set when it is a temporary one. */
static int tokenizer_dir(const char *root, const char *name, char *dir, size_t dirlen, char *tmp) {
    char path[1200], err[512], *link = NULL;
    tmp[0] = 0;
    snprintf(dir, dirlen, "%s/%s", root, name);
    snprintf(path, sizeof(path), "%s/tokenizer_dir", dir);
    if (qw_read_file(path, &link, NULL, err, sizeof(err)) == QWENC_OK) {
        link[strcspn(link, "\r\n")] = 0;
        snprintf(dir, dirlen, "%s", link);
        free(link);
        return 1;
    }
    struct stat st;
    snprintf(path, sizeof(path), "%s/tokenizer_overlay.json", dir);
    if (stat(path, &st) == 0) {
        if (!materialize_overlay(root, name, tmp)) return 0;
        snprintf(dir, dirlen, "%s", tmp);
    }
    return 1;
}

/* ---------------------------------------------------------------- per-tokenizer corpus checks */

static int utf8_complete(const char *s, size_t n) {
    /* every piece must end on a character boundary and be valid */
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int l = u[i] < 0x80 ? 1 : u[i] < 0xc2 ? 0 : u[i] < 0xe0 ? 2 : u[i] < 0xf0 ? 3 : u[i] < 0xf5 ? 4 : 0;
        if (!l || i + (size_t)l > n) return 0;
        for (int k = 1; k < l; k++)
            if ((u[i + k] & 0xc0) != 0x80) return 0;
        i += (size_t)l;
    }
    return 1;
}

static void check_ids(const char *tname, const char *cname, const char *mode, const qwenc_tokenizer *t,
                      const tcase *c, int add_bos, int parse_special, const idlist *want, const idlist *special) {
    if (!want->present) return;
    const idlist *w = want->same ? special : want;
    int32_t *ids = NULL;
    int n = 0, d;
    char err[512];
    qwenc_status st = qwenc_tokenize(t, c->text, c->len, add_bos, parse_special, &ids, &n, err, sizeof(err));
    CHECK(st == QWENC_OK, "%s/%s: tokenize: %s", tname, cname, err);
    if (st == QWENC_OK) {
        int eq = ids_equal(ids, n, w->v, w->n, &d);
        CHECK(eq, "%s/%s (%s): %d ids, want %d; first difference at %d: got %d, want %d", tname, cname, mode, n,
              w->n, d, d < n ? ids[d] : -1, d < w->n ? w->v[d] : -1);
    }
    free(ids);
}

static void check_decode(const char *tname, const tcase *c, const qwenc_tokenizer *t, const idlist *ids, int skip,
                         dec_kind kind, const char *want) {
    char *text = NULL, err[512];
    size_t len = 0;
    qwenc_status st = qwenc_detokenize(t, ids->v, ids->n, skip, &text, &len, err, sizeof(err));
    CHECK(st == QWENC_OK, "%s/%s: detokenize: %s", tname, c->name, err);
    if (st) return;
    if (kind != DEC_NONE)
        CHECK(dec_matches(kind, want, c, text, len), "%s/%s: decode (skip_special=%d) differs from the library's: \"%.200s\"",
              tname, c->name, skip, text);
    /* streaming gives the same bytes, in whole characters */
    qwenc_detok *dt = qwenc_detok_new(t, skip);
    char *acc = malloc(len + 16);
    size_t an = 0;
    int whole = 1, over = 0;
    for (int i = 0; i <= ids->n; i++) {
        const char *piece;
        size_t pl = i < ids->n ? qwenc_detok_push(dt, ids->v[i], &piece) : qwenc_detok_flush(dt, &piece);
        whole &= utf8_complete(piece, pl) && strlen(piece) <= pl;
        if (an + pl > len) over = 1;
        else memcpy(acc + an, piece, pl);
        an += pl;
    }
    qwenc_detok_free(dt);
    CHECK(whole, "%s/%s: a streamed piece is not whole UTF-8 characters", tname, c->name);
    CHECK(!over && an == len && memcmp(acc, text, len) == 0, "%s/%s: streaming (skip_special=%d) differs from detokenize",
          tname, c->name, skip);
    free(acc);
    free(text);
}

/* Every case of root/name/expected.txt against tokenizer t (label: how it was loaded). */
static void run_cases(const char *root, const char *name, const char *label, const qwenc_tokenizer *t,
                      const tcase *cs, int n_cases) {
    char path[1100], err[512];
    snprintf(path, sizeof(path), "%s/%s/expected.txt", root, name);
    char *buf;
    size_t len;
    if (qw_read_file(path, &buf, &len, err, sizeof(err))) {
        CHECK(0, "%s", err);
        return;
    }
    char **lines;
    int nl = split_lines(buf, &lines), pass0 = n_pass, fail0 = n_fail, seen = 0;
    for (int i = 0; i < nl;) {
        if (strncmp(lines[i], "case ", 5) != 0) {
            i++;
            continue;
        }
        const char *cname = lines[i] + 5;
        const tcase *c = NULL;
        for (int k = 0; k < n_cases; k++)
            if (!strcmp(cs[k].name, cname)) c = &cs[k];
        expect e;
        memset(&e, 0, sizeof(e));
        for (i++; i < nl && strncmp(lines[i], "case ", 5) != 0; i++) {
            const char *ln = lines[i];
            if (!strncmp(ln, "ids special ", 12)) e.special = parse_ids(ln + 12);
            else if (!strncmp(ln, "ids plain ", 10)) e.plain = parse_ids(ln + 10);
            else if (!strncmp(ln, "ids bos ", 8)) e.bos = parse_ids(ln + 8);
            else if (!strncmp(ln, "dec ", 4) && (ln[4] == '0' || ln[4] == '1') && ln[5] == ' ') {
                e.kind[ln[4] - '0'] = DEC_TEXT;
                e.dec[ln[4] - '0'] = ln + 6;
            } else if (!strncmp(ln, "deq ", 4) && (ln[4] == '0' || ln[4] == '1')) {
                e.kind[ln[4] - '0'] = DEC_EQUAL;
            } else if (!strncmp(ln, "dech ", 5) && (ln[5] == '0' || ln[5] == '1') && ln[6] == ' ') {
                e.kind[ln[5] - '0'] = DEC_HASH;
                e.dec[ln[5] - '0'] = ln + 7;
            }
        }
        CHECK(c != NULL, "%s: expected.txt names case %s, not in cases.txt", label, cname);
        if (c && e.special.present) {
            seen++;
            check_ids(label, cname, "special", t, c, 0, 1, &e.special, &e.special);
            check_ids(label, cname, "plain", t, c, 0, 0, &e.plain, &e.special);
            check_ids(label, cname, "bos", t, c, 1, 1, &e.bos, &e.special);
            check_decode(label, c, t, &e.special, 0, e.kind[0], e.dec[0]);
            check_decode(label, c, t, &e.special, 1, e.kind[1], e.dec[1]);
        }
        free(e.special.v);
        free(e.plain.v);
        free(e.bos.v);
    }
    CHECK(seen == n_cases, "%s: expected.txt covers %d of the %d cases (regenerate it)", label, seen, n_cases);
    printf("%-20s %3d cases: %d checks passed, %d failed\n", label, seen, n_pass - pass0, n_fail - fail0);
    free(lines);
    free(buf);
}

/* The tokenizers llama.cpp cannot run as the library does (normalizers, splits, decoders a GGUF cannot name). */
static const char *const NOT_GGUF[] = {"bytelevel_bpe", "metaspace_bpe", "spm_bpe"};

/* Write a tokenizer alone into a GGUF at path: ref, loaded from dir, or (ref NULL) dir's, loaded by the writer
 * as `qwenc quantize` does; returns the writer's status, *written as it says. */
static qwenc_status write_tok_gguf(const qwenc_tokenizer *ref, const char *dir, const char *path, int n_vocab,
                                   int *written, char *err, size_t errlen) {
    qw_gguf_writer *w;
    qwenc_status st = qw_gguf_writer_open(&w, path, err, errlen);
    if (st) return st;
    if (ref) {
        st = qw_tok_gguf_put(w, ref, dir, n_vocab, err, errlen);
        *written = st == QWENC_OK;
    } else {
        st = qw_tok_gguf_write(w, dir, n_vocab, written, err, errlen);
    }
    if (st) {
        qw_gguf_writer_abort(w);
        return st;
    }
    return qw_gguf_writer_close(w, err, errlen);
}

/* The same tokenizer after a trip through a GGUF file: the corpus, the chat template, BOS and stop ids. */
static void run_gguf(const char *root, const char *name, const char *dir, const qwenc_tokenizer *ref,
                     const tcase *cs, int n_cases) {
    char path[256], label[64], err[512] = "";
    int refused = 0, written = 0;
    for (size_t i = 0; i < sizeof(NOT_GGUF) / sizeof(NOT_GGUF[0]); i++) refused |= !strcmp(name, NOT_GGUF[i]);
    snprintf(path, sizeof(path), "/tmp/qwenc_t_tok_%d_%s.gguf", (int)getpid(), name);
    snprintf(label, sizeof(label), "%s (gguf)", name);
    qwenc_status st = write_tok_gguf(ref, dir, path, 0, &written, err, sizeof(err));
    if (refused) {
        CHECK(st == QWENC_ERR_UNSUPPORTED && strstr(err, "tokenizer.json") && strstr(err, "llama.cpp"),
              "%s: writing a GGUF must be refused with a reason, got %s: %s", name, qwenc_status_str(st), err);
        unlink(path);
        return;
    }
    CHECK(st == QWENC_OK && written, "%s: write the GGUF tokenizer: %s", name, err);
    qwenc_tokenizer *t = NULL;
    if (!st) {
        st = qwenc_tokenizer_load(path, &t, err, sizeof(err));
        CHECK(st == QWENC_OK, "%s: load: %s", label, err);
    }
    unlink(path);
    if (!t) return;
    run_cases(root, name, label, t, cs, n_cases);
    const char *a = qwenc_tokenizer_chat_template(ref), *b = qwenc_tokenizer_chat_template(t);
    CHECK((!a && !b) || (a && b && !strcmp(a, b)), "%s: the chat template differs", label);
    CHECK(qwenc_tokenizer_n_vocab(t) == qwenc_tokenizer_n_vocab(ref), "%s: %d ids, tokenizer.json %d", label,
          qwenc_tokenizer_n_vocab(t), qwenc_tokenizer_n_vocab(ref));
    /* a tokenizer_config.json BOS is the file's; stop ids: the tokenizer_config EOS, plus the end-of-turn
     * tokens llama.cpp stops at (a GGUF carries no generation_config.json) */
    if (qwenc_tokenizer_bos(ref) >= 0) CHECK(qwenc_tokenizer_bos(t) == qwenc_tokenizer_bos(ref), "%s: bos", label);
    const int32_t *e1, *e2;
    int n1 = qwenc_tokenizer_eos(ref, &e1), n2 = qwenc_tokenizer_eos(t, &e2);
    CHECK(n1 == 0 || (n2 >= 1 && e2[0] == e1[0]), "%s: the first stop id is %d, tokenizer.json's %d", label,
          n2 ? e2[0] : -1, e1[0]);
    CHECK(!strcmp(qwenc_tokenizer_eos_str(t), qwenc_tokenizer_eos_str(ref)), "%s: eos string \"%s\", want \"%s\"",
          label, qwenc_tokenizer_eos_str(t), qwenc_tokenizer_eos_str(ref));
    /* the converter makes control tokens of added tokens that look special (Qwen's <|fim_prefix|>, ...) */
    for (int id = 0; id < qwenc_tokenizer_n_vocab(t); id++) {
        const char *tx = qwenc_tokenizer_token_text(t, id);
        size_t tl = strlen(tx);
        int looks = tl > 4 && !strncmp(tx, "<|", 2) && !strcmp(tx + tl - 2, "|>");
        int sp = qwenc_tokenizer_is_special(t, id), sr = qwenc_tokenizer_is_special(ref, id);
        if ((sp != sr && !(sp && looks)) || strcmp(tx, qwenc_tokenizer_token_text(ref, id)) != 0) {
            CHECK(0, "%s: token %d differs (special %d vs %d, text \"%s\" vs \"%s\")", label, id,
                  qwenc_tokenizer_is_special(t, id), qwenc_tokenizer_is_special(ref, id),
                  qwenc_tokenizer_token_text(t, id), qwenc_tokenizer_token_text(ref, id));
            break;
        }
    }
    qwenc_tokenizer_free(t);
}

static void run_tokenizer(const char *root, const char *name, const tcase *cs, int n_cases) {
    char dir[1024], err[512] = "", tmp[64];
    /* a tokenizer that is not redistributed (fetched.txt) and could not be fetched: said, not failed */
    char marker[1200], tj[1200];
    struct stat fst;
    snprintf(marker, sizeof(marker), "%s/%s/fetched.txt", root, name);
    snprintf(tj, sizeof(tj), "%s/%s/tokenizer.json", root, name);
    if (stat(marker, &fst) == 0 && stat(tj, &fst) != 0) {
        printf("SKIP %s: its tokenizer.json is fetched by tests/fetch_test_data.sh and is not here\n", name);
        return;
    }
    qwenc_tokenizer *t = NULL;
    qwenc_status st = QWENC_ERR_IO;
    int have_dir = tokenizer_dir(root, name, dir, sizeof(dir), tmp);
    if (have_dir) st = qwenc_tokenizer_load(dir, &t, err, sizeof(err));
    else snprintf(err, sizeof(err), "cannot write its tokenizer_overlay.json out");
    CHECK(st == QWENC_OK, "%s: load: %s", name, err);
    if (!st) {
        run_cases(root, name, name, t, cs, n_cases);
        run_gguf(root, name, dir, t, cs, n_cases);
    }
    if (tmp[0]) remove_dir(tmp);
    qwenc_tokenizer_free(t);
}

/* ---------------------------------------------------------------- hand-made checks */

static char tmpdir[64];

static void write_file(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *name) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    unlink(path);
}

/* load must fail with status want and a message containing every string of need (NULL-terminated). */
static void expect_load_error(const char *what, qwenc_status want, const char *const *need) {
    qwenc_tokenizer *t = NULL;
    char err[512] = "";
    qwenc_status st = qwenc_tokenizer_load(tmpdir, &t, err, sizeof(err));
    CHECK(st == want, "%s: status %s, want %s (%s)", what, qwenc_status_str(st), qwenc_status_str(want), err);
    for (int i = 0; need[i]; i++) CHECK(strstr(err, need[i]) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, need[i]);
    qwenc_tokenizer_free(t);
}

static const char *TINY =
    "{\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xc4\xa0\":3,\"\xc4\xa0" "ab\":4},"
    "\"merges\":[\"a b\",[\"\xc4\xa0\",\"ab\"]]}}";

static void test_errors(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/qwenc_t_tokenizer_XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    expect_load_error("missing tokenizer.json", QWENC_ERR_IO, (const char *const[]){"tokenizer.json", NULL});
    write_file("tokenizer.json", "{\"model\": {\"vocab\": {\"a\": 0}, ");
    expect_load_error("truncated JSON", QWENC_ERR_FORMAT, (const char *const[]){"tokenizer.json", "JSON", NULL});
    write_file("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a zz\"]}}");
    expect_load_error("merge of an unknown token", QWENC_ERR_FORMAT,
                      (const char *const[]){"tokenizer.json", "model.merges[0]", "zz", NULL});
    write_file("tokenizer.json", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}");
    expect_load_error("Unigram model", QWENC_ERR_UNSUPPORTED, (const char *const[]){"model.type", "Unigram", NULL});
    write_file("tokenizer.json", "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Whitespace\"}]},"
                                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}");
    expect_load_error("unknown pre-tokenizer", QWENC_ERR_UNSUPPORTED,
                      (const char *const[]){"pre_tokenizer.pretokenizers[0].type", "Whitespace", NULL});
    write_file("tokenizer.json", "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":"
                                 "\"Isolated\",\"invert\":false},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}");
    expect_load_error("bad regex", QWENC_ERR_UNSUPPORTED, (const char *const[]){"pre_tokenizer.pattern", "(a", NULL});
    write_file("tokenizer.json", TINY);
    write_file("tokenizer_config.json", "{\"bos_token\": \"<s>\",");
    expect_load_error("broken tokenizer_config.json", QWENC_ERR_FORMAT,
                      (const char *const[]){"tokenizer_config.json", NULL});

    /* a tiny valid tokenizer: both merge forms, config files, bad ids */
    write_file("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"ab\", "
                                        "\"add_bos_token\": true, \"chat_template\": \"from config\"}");
    write_file("generation_config.json", "{\"eos_token_id\": [4, 2]}");
    write_file("config.json", "{\"eos_token_id\": 3, \"text_config\": {\"eos_token_id\": [1]}}");
    write_file("chat_template.jinja", "from jinja");
    qwenc_tokenizer *t = NULL;
    char err[512];
    CHECK(qwenc_tokenizer_load(tmpdir, &t, err, sizeof(err)) == QWENC_OK, "tiny tokenizer: %s", err);
    if (t) {
        const int32_t *eos;
        int ne = qwenc_tokenizer_eos(t, &eos);
        CHECK(ne == 4 && eos[0] == 2 && eos[1] == 4 && eos[2] == 3 && eos[3] == 1,
              "eos ids from the three files, without repeats: got %d", ne);
        CHECK(qwenc_tokenizer_bos(t) == 5 && !strcmp(qwenc_tokenizer_bos_str(t), "<s>"), "bos from an AddedToken object");
        CHECK(!strcmp(qwenc_tokenizer_eos_str(t), "ab"), "eos string");
        CHECK(qwenc_tokenizer_chat_template(t) && !strcmp(qwenc_tokenizer_chat_template(t), "from jinja"),
              "chat_template.jinja is preferred");
        CHECK(qwenc_tokenizer_n_vocab(t) == 6, "n_vocab counts added tokens");
        int32_t *ids;
        int n;
        CHECK(qwenc_tokenize(t, " ab<s>ab", 8, 1, 1, &ids, &n, err, sizeof(err)) == QWENC_OK, "%s", err);
        CHECK(n == 4 && ids[0] == 5 && ids[1] == 4 && ids[2] == 5 && ids[3] == 2, "tiny encode (both merge forms)");
        free(ids);
        char *text;
        size_t len;
        int32_t bad_ids[] = {0, 6};
        CHECK(qwenc_detokenize(t, bad_ids, 2, 0, &text, &len, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "6"),
              "an id out of range is an error naming it: %s", err);
        CHECK(!strcmp(qwenc_tokenizer_token_text(t, 4), " ab") && !strcmp(qwenc_tokenizer_token_text(t, 99), ""),
              "token_text");
        CHECK(qwenc_tokenizer_token_id(t, "<s>") == 5 && qwenc_tokenizer_token_id(t, "zz") == -1, "token_id");
        CHECK(qwenc_tokenizer_is_special(t, 5) && !qwenc_tokenizer_is_special(t, 2), "is_special");
        qwenc_tokenizer_free(t);
    }
    remove_file("chat_template.jinja");
    remove_file("config.json");
    remove_file("generation_config.json");
    write_file("tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                                        "{\"name\": \"default\", \"template\": \"D\"}], \"eos_token\": null}");
    t = NULL;
    CHECK(qwenc_tokenizer_load(tmpdir, &t, err, sizeof(err)) == QWENC_OK, "tiny tokenizer 2: %s", err);
    if (t) {
        CHECK(qwenc_tokenizer_chat_template(t) && !strcmp(qwenc_tokenizer_chat_template(t), "D"),
              "the \"default\" entry of a template list");
        CHECK(qwenc_tokenizer_bos(t) == -1 && !strcmp(qwenc_tokenizer_eos_str(t), "") && qwenc_tokenizer_eos(t, NULL) == 0,
              "no bos/eos");
        qwenc_tokenizer_free(t);
    }
    remove_file("tokenizer_config.json");
    remove_file("tokenizer.json");
    rmdir(tmpdir);
}

/* A GGUF at tmpdir/name holding only tokenizer keys: model (NULL: none), pre (NULL: none), the TINY vocabulary
 * (unless !tokens) with <s> a control token, and merges {merge0, "\xc4\xa0 ab"}. Returns the path. */
static const char *raw_gguf(const char *name, const char *model, const char *pre, int tokens, const char *merge0) {
    static char path[256];
    char err[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    static const char *const toks[] = {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab", "<s>"};
    static const int32_t types[] = {1, 1, 1, 1, 1, 3};
    const char *merges[] = {merge0, "\xc4\xa0 ab"};
    qw_gguf_writer *w;
    if (qw_gguf_writer_open(&w, path, err, sizeof(err))) {
        CHECK(0, "%s", err);
        return path;
    }
    qw_gguf_writer_set_str(w, "general.architecture", "qwen3");
    if (model) qw_gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (pre) qw_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    if (tokens) {
        qw_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 6);
        qw_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", QW_GGUF_I32, types, 6);
    }
    qw_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    CHECK(qw_gguf_writer_close(w, err, sizeof(err)) == QWENC_OK, "%s", err);
    return path;
}

/* path must fail to load with status want and a message holding every string of need. */
static void expect_gguf_error(const char *what, const char *path, int model_path, qwenc_status want,
                              const char *const *need) {
    qwenc_tokenizer *t = NULL;
    char err[512] = "";
    qwenc_status st = model_path ? qwenc_tokenizer_load_model(path, &t, err, sizeof(err))
                                 : qwenc_tokenizer_load(path, &t, err, sizeof(err));
    CHECK(st == want && !t, "%s: status %s, want %s (%s)", what, qwenc_status_str(st), qwenc_status_str(want), err);
    CHECK(strstr(err, path) != NULL, "%s: message \"%s\" lacks the file", what, err);
    for (int i = 0; need[i]; i++) CHECK(strstr(err, need[i]) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, need[i]);
    qwenc_tokenizer_free(t);
}

/* GGUF tokenizers by hand: what the writer puts in the file, special and padding ids, and the errors. */
static void test_gguf(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/qwenc_t_tok_gguf_XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    write_file("tokenizer.json", TINY);
    write_file("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"ab\", "
                                        "\"add_bos_token\": true, \"chat_template\": \"from config\"}");
    write_file("config.json", "{\"pad_token_id\": 1}");
    write_file("chat_template.jinja", "from jinja");
    char path[256], err[512] = "";
    snprintf(path, sizeof(path), "%s/tiny.gguf", tmpdir);
    int written = 0;
    qwenc_status st = write_tok_gguf(NULL, tmpdir, path, 10, &written, err, sizeof(err));
    CHECK(st == QWENC_OK && written, "write the tiny tokenizer padded to 10 ids: %s", err);
    qw_gguf g;
    if (!st && qw_gguf_open(&g, path, err, sizeof(err)) == QWENC_OK) {
        const qw_gguf_kv *pre = qw_gguf_find_kv(&g, "tokenizer.ggml.pre"), *ty = qw_gguf_find_kv(&g, "tokenizer.ggml.token_type");
        const qw_gguf_kv *tk = qw_gguf_find_kv(&g, "tokenizer.ggml.tokens"), *mg = qw_gguf_find_kv(&g, "tokenizer.ggml.merges");
        const qw_gguf_kv *pad = qw_gguf_find_kv(&g, "tokenizer.ggml.padding_token_id");
        const qw_gguf_kv *ab = qw_gguf_find_kv(&g, "tokenizer.ggml.add_bos_token");
        CHECK(pre && pre->str && !strcmp(pre->str, "gpt-2"), "a ByteLevel(use_regex) tokenizer is written as pre gpt-2");
        CHECK(tk && tk->n == 10 && !strcmp(qw_gguf_arr_str(tk, 7), "[PAD7]") && !strcmp(qw_gguf_arr_str(tk, 5), "<s>"),
              "tokens padded to the model's vocabulary with [PAD<id>]");
        CHECK(ty && ty->n == 10 && qw_gguf_arr_i64(ty, 0) == 1 && qw_gguf_arr_i64(ty, 5) == 3 && qw_gguf_arr_i64(ty, 7) == 5,
              "token types: normal, control, unused");
        CHECK(mg && mg->n == 2 && !strcmp(qw_gguf_arr_str(mg, 0), "a b") && !strcmp(qw_gguf_arr_str(mg, 1), "\xc4\xa0 ab"),
              "merges as \"left right\" in rank order, from both tokenizer.json forms");
        CHECK(pad && qw_gguf_kv_i64(pad) == 1, "padding id from config.json pad_token_id");
        CHECK(ab && qw_gguf_kv_i64(ab) == 1, "add_bos_token written");
        qw_gguf_free(&g);
    }
    qwenc_tokenizer *t = NULL;
    CHECK(qwenc_tokenizer_load_model(path, &t, err, sizeof(err)) == QWENC_OK, "load the tiny GGUF: %s", err);
    if (t) {
        CHECK(qwenc_tokenizer_n_vocab(t) == 10, "n_vocab is the padded count");
        CHECK(qwenc_tokenizer_bos(t) == 5 && !strcmp(qwenc_tokenizer_bos_str(t), "<s>"), "bos");
        CHECK(!strcmp(qwenc_tokenizer_eos_str(t), "ab"), "eos string");
        const int32_t *eos;
        CHECK(qwenc_tokenizer_eos(t, &eos) >= 1 && eos[0] == 2, "eos id");
        CHECK(qwenc_tokenizer_chat_template(t) && !strcmp(qwenc_tokenizer_chat_template(t), "from jinja"),
              "the chat template qwenc uses is the one written");
        int32_t *ids;
        int n;
        CHECK(qwenc_tokenize(t, " ab<s>ab", 8, 1, 1, &ids, &n, err, sizeof(err)) == QWENC_OK, "%s", err);
        CHECK(n == 4 && ids[0] == 5 && ids[1] == 4 && ids[2] == 5 && ids[3] == 2, "tiny encode with add_bos_token");
        free(ids);
        CHECK(qwenc_tokenize(t, "<s>", 3, 0, 0, &ids, &n, err, sizeof(err)) == QWENC_OK && (n == 0 || ids[0] != 5),
              "a control token is plain text when special tokens are not parsed");
        free(ids);
        int32_t pad_ids[] = {4, 7};
        char *text = NULL;
        size_t len = 0;
        CHECK(qwenc_detokenize(t, pad_ids, 2, 0, &text, &len, err, sizeof(err)) == QWENC_OK && !strcmp(text, " ab"),
              "a padding id decodes to nothing: %s", err);
        free(text);
        CHECK(qwenc_tokenizer_is_special(t, 5) && !qwenc_tokenizer_is_special(t, 2), "control tokens are special");
        qwenc_tokenizer_free(t);
    }
    st = write_tok_gguf(NULL, tmpdir, path, 3, &written, err, sizeof(err));
    CHECK(st == QWENC_ERR_FORMAT && strstr(err, "tokenizer.json") && strstr(err, "(3)"),
          "a model vocabulary smaller than the tokenizer's is an error: %s", err);

    const char *p = raw_gguf("pre.gguf", "gpt2", "qwen9", 1, "a b");
    expect_gguf_error("unknown pre-tokenizer", p, 0, QWENC_ERR_UNSUPPORTED,
                      (const char *const[]){"tokenizer.ggml.pre", "\"qwen9\"", "qwen35", NULL});
    p = raw_gguf("notok.gguf", "gpt2", "qwen2", 0, "a b");
    expect_gguf_error("no tokens array", p, 0, QWENC_ERR_FORMAT, (const char *const[]){"tokenizer.ggml.tokens", NULL});
    p = raw_gguf("spm.gguf", "llama", NULL, 1, "a b");
    expect_gguf_error("sentencepiece model", p, 0, QWENC_ERR_UNSUPPORTED,
                      (const char *const[]){"tokenizer.ggml.model", "\"llama\"", NULL});
    p = raw_gguf("merge.gguf", "gpt2", "qwen2", 1, "a zz");
    expect_gguf_error("merge of an unknown token", p, 0, QWENC_ERR_FORMAT,
                      (const char *const[]){"tokenizer.ggml.merges[0]", "zz", NULL});
    p = raw_gguf("nopre.gguf", "gpt2", NULL, 1, "a b");
    t = NULL;
    CHECK(qwenc_tokenizer_load(p, &t, err, sizeof(err)) == QWENC_OK, "no pre name reads as llama.cpp's default: %s", err);
    if (t) {
        int32_t *ids;
        int n;
        CHECK(qwenc_tokenize(t, "ab", 2, 0, 1, &ids, &n, err, sizeof(err)) == QWENC_OK && n == 1 && ids[0] == 2,
              "default pre-tokenizer encodes");
        free(ids);
        qwenc_tokenizer_free(t);
    }
    /* no tokenizer in the file: an error for the file itself; for a model, tokenizer.json beside it */
    p = raw_gguf("none.gguf", "none", NULL, 0, "a b");
    expect_gguf_error("a GGUF without a tokenizer", p, 0, QWENC_ERR_FORMAT, (const char *const[]){"no tokenizer", NULL});
    t = NULL;
    CHECK(qwenc_tokenizer_load_model(p, &t, err, sizeof(err)) == QWENC_OK && qwenc_tokenizer_n_vocab(t) == 6,
          "a model GGUF without a tokenizer takes tokenizer.json beside it: %s", err);
    qwenc_tokenizer_free(t);
    remove_file("tokenizer.json");
    expect_gguf_error("a model GGUF without a tokenizer, nothing beside", p, 1, QWENC_ERR_FORMAT,
                      (const char *const[]){"no tokenizer", "tokenizer.json", NULL});
    const char *names[] = {"tiny.gguf", "pre.gguf", "notok.gguf", "spm.gguf", "merge.gguf", "nopre.gguf", "none.gguf",
                           "tokenizer_config.json", "config.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) remove_file(names[i]);
    rmdir(tmpdir);
}

/* Streaming across characters split over tokens, with invalid bytes, on the Qwen3 byte-level vocab. */
static void test_streaming(const char *root) {
    char dir[1024], err[512], tmp[64];
    qwenc_tokenizer *t = NULL;
    qwenc_status st = QWENC_ERR_IO;
    if (tokenizer_dir(root, "qwen3", dir, sizeof(dir), tmp)) st = qwenc_tokenizer_load(dir, &t, err, sizeof(err));
    if (tmp[0]) remove_dir(tmp);
    CHECK(st == QWENC_OK, "qwen3 for the streaming checks: %s", err);
    if (st) return;
    /* the single-byte tokens: byte-level characters of 0xE4 0xBD 0xA0 ("\u4f60": U+00E4, U+00BD, U+0142) and 'a' */
    int32_t e4 = qwenc_tokenizer_token_id(t, "\xc3\xa4"), bd = qwenc_tokenizer_token_id(t, "\xc2\xbd"),
            a0 = qwenc_tokenizer_token_id(t, "\xc5\x82"), a = qwenc_tokenizer_token_id(t, "a");
    CHECK(e4 >= 0 && bd >= 0 && a0 >= 0 && a >= 0, "byte tokens exist");
    CHECK(!strcmp(qwenc_tokenizer_token_text(t, e4), "\xe4"), "token_text of a byte token is the raw byte");
    qwenc_detok *d = qwenc_detok_new(t, 0);
    const char *p;
    size_t n1 = qwenc_detok_push(d, e4, &p), n2 = qwenc_detok_push(d, bd, &p);
    size_t n3 = qwenc_detok_push(d, a0, &p);
    CHECK(n1 == 0 && n2 == 0 && n3 == 3 && !memcmp(p, "\xe4\xbd\xa0", 3), "a character in three tokens comes out whole");
    n1 = qwenc_detok_push(d, e4, &p);
    n2 = qwenc_detok_push(d, a, &p);
    CHECK(n1 == 0 && n2 == 4 && !memcmp(p, "\xef\xbf\xbd" "a", 4), "an interrupted character becomes U+FFFD");
    n1 = qwenc_detok_push(d, e4, &p);
    n2 = qwenc_detok_push(d, bd, &p);
    n3 = qwenc_detok_flush(d, &p);
    CHECK(n1 == 0 && n2 == 0 && n3 == 3 && !memcmp(p, "\xef\xbf\xbd", 3), "flush turns an unfinished character into U+FFFD");
    n1 = qwenc_detok_push(d, -5, &p);
    CHECK(n1 == 0 && p && p[0] == 0, "a bad id is ignored");
    n1 = qwenc_detok_push(d, qwenc_tokenizer_token_id(t, "<|im_end|>"), &p);
    CHECK(n1 == 10 && !strcmp(p, "<|im_end|>"), "a special token comes out whole");
    qwenc_detok_free(d);
    d = qwenc_detok_new(t, 1);
    n1 = qwenc_detok_push(d, qwenc_tokenizer_token_id(t, "<|im_end|>"), &p);
    CHECK(n1 == 0, "skip_special drops special tokens");
    qwenc_detok_free(d);

    /* invalid input bytes are read as U+FFFD, as the library reads errors="replace" strings */
    int32_t *x, *y;
    int nx, ny;
    CHECK(!qwenc_tokenize(t, "a\xff\xfe" "b\xe4\xbd", 6, 0, 1, &x, &nx, err, sizeof(err)) &&
              !qwenc_tokenize(t, "a\xef\xbf\xbd\xef\xbf\xbd" "b\xef\xbf\xbd", 11, 0, 1, &y, &ny, err, sizeof(err)),
          "tokenize invalid: %s", err);
    int same = nx == ny;
    for (int i = 0; same && i < nx; i++) same = x[i] == y[i];
    CHECK(same, "invalid bytes encode as U+FFFD per maximal subpart");
    free(x);
    free(y);
    CHECK(qwenc_tokenize(t, "", 0, 0, 1, &x, &nx, err, sizeof(err)) == QWENC_OK && nx == 0 && x != NULL, "empty text");
    free(x);
    const int32_t *eos;
    int ne = qwenc_tokenizer_eos(t, &eos);
    CHECK(ne >= 1 && eos[0] == qwenc_tokenizer_token_id(t, "<|im_end|>"), "qwen3 eos is <|im_end|>");
    CHECK(qwenc_tokenizer_bos(t) == -1, "qwen3 has no bos");
    CHECK(qwenc_tokenizer_chat_template(t) != NULL, "qwen3 chat template");
    qwenc_tokenizer_free(t);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "tests/tokenizers";
    int n_cases;
    tcase *cs = read_cases(root, &n_cases);
    printf("%d cases in %s/cases.txt\n", n_cases, root);
    DIR *dp = opendir(root);
    char *names[256];
    int nn = 0;
    struct dirent *de;
    while (dp && (de = readdir(dp)) && nn < 256) {
        char p[1200];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s/expected.txt", root, de->d_name);
        if (de->d_name[0] != '.' && stat(p, &st) == 0) names[nn++] = strdup(de->d_name);
    }
    if (dp) closedir(dp);
    qsort(names, (size_t)nn, sizeof(char *), by_name);
    CHECK(nn > 0, "no tokenizer directories under %s", root);
    for (int i = 0; i < nn; i++) {
        run_tokenizer(root, names[i], cs, n_cases);
        free(names[i]);
    }
    test_errors();
    test_gguf();
    test_streaming(root);
    for (int i = 0; i < n_cases; i++) {
        free(cs[i].name);
        free(cs[i].text);
    }
    free(cs);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
