/*
 * gguf.c - read (mapped, validated) and write (streamed) GGUF files; see gguf.h for the format.
 *
 * Reading walks the header with a bounds-checked cursor: nothing is read or allocated from a count or
 * length before it has been checked against the bytes left in the file. Errors say which file, and which
 * metadata key or tensor (by index and name) was being read.
 * The host must be little-endian, as GGUF is (checked at compile time).
 */
#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads and writes little-endian data in place: a big-endian host needs byte swapping"
#endif

static const char *const gguf_type_names[QW_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
/* bytes of one element; 0 for string and array (variable) */
static const uint8_t gguf_type_size[QW_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *qw_gguf_type_name(qw_gguf_type t) { return (unsigned)t < QW_GGUF_TYPE_COUNT ? gguf_type_names[t] : "?"; }

/* ggml's names of the type ids qwenc does not read, for error messages (ggml.h, enum ggml_type) */
static const char *ggml_type_name(int id) {
    static const char *const names[] = {
        [0] = "f32",      [1] = "f16",     [2] = "q4_0",    [3] = "q4_1",   [6] = "q5_0",   [7] = "q5_1",
        [8] = "q8_0",     [9] = "q8_1",    [10] = "q2_K",   [11] = "q3_K",  [12] = "q4_K",  [13] = "q5_K",
        [14] = "q6_K",    [15] = "q8_K",   [16] = "iq2_xxs", [17] = "iq2_xs", [18] = "iq3_xxs", [19] = "iq1_s",
        [20] = "iq4_nl",  [21] = "iq3_s",  [22] = "iq2_s",  [23] = "iq4_xs", [24] = "i8",    [25] = "i16",
        [26] = "i32",     [27] = "i64",    [28] = "f64",    [29] = "iq1_m", [30] = "bf16",  [34] = "tq1_0",
        [35] = "tq2_0",   [39] = "mxfp4",  [40] = "nvfp4",  [41] = "q1_0",  [42] = "q2_0",
    };
    return id >= 0 && id < (int)(sizeof(names) / sizeof(names[0])) && names[id] ? names[id] : NULL;
}

static int is_int_type(qw_gguf_type t) {
    return t == QW_GGUF_U8 || t == QW_GGUF_I8 || t == QW_GGUF_U16 || t == QW_GGUF_I16 || t == QW_GGUF_U32 ||
           t == QW_GGUF_I32 || t == QW_GGUF_U64 || t == QW_GGUF_I64;
}
static int is_signed_type(qw_gguf_type t) {
    return t == QW_GGUF_I8 || t == QW_GGUF_I16 || t == QW_GGUF_I32 || t == QW_GGUF_I64;
}

/* ------------------------------------------------------------------ hashing */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* A table of 2^k slots, at least twice n, all empty; NULL when out of memory. */
static int32_t *hash_alloc(size_t n, size_t *n_slots) {
    size_t m = 16;
    while (m < 2 * n + 2) m *= 2;
    int32_t *s = malloc(m * sizeof(int32_t));
    if (!s) return NULL;
    for (size_t i = 0; i < m; i++) s[i] = -1;
    *n_slots = m;
    return s;
}

/* Index of name in the table, or -1; with insert >= 0, insert that index when absent. */
static int32_t hash_lookup(int32_t *slots, size_t n_slots, const char *name, const char *(*key_of)(const void *, int32_t),
                           const void *ctx, int32_t insert) {
    if (!n_slots) return -1;
    size_t m = n_slots - 1;
    for (size_t i = hash_str(name) & m;; i = (i + 1) & m) {
        if (slots[i] < 0) {
            if (insert >= 0) slots[i] = insert;
            return -1;
        }
        if (strcmp(key_of(ctx, slots[i]), name) == 0) return slots[i];
    }
}

static const char *kv_key(const void *g, int32_t i) { return ((const qw_gguf *)g)->kv[i].key; }
static const char *tensor_key(const void *g, int32_t i) { return ((const qw_gguf *)g)->tensors[i].name; }

const qw_gguf_kv *qw_gguf_find_kv(const qw_gguf *g, const char *key) {
    int32_t i = hash_lookup(g->kv_slots, g->n_kv_slots, key, kv_key, g, -1);
    return i < 0 ? NULL : &g->kv[i];
}

const qw_gguf_tensor *qw_gguf_find_info(const qw_gguf *g, const char *name) {
    int32_t i = hash_lookup(g->t_slots, g->n_t_slots, name, tensor_key, g, -1);
    return i < 0 ? NULL : &g->tensors[i];
}

const qw_tensor *qw_gguf_find(const qw_gguf *g, const char *name) {
    const qw_gguf_tensor *t = qw_gguf_find_info(g, name);
    return t ? &t->t : NULL;
}

/* ------------------------------------------------------------------ reading */

typedef struct {
    const uint8_t *base, *p, *end;
    const char *path;
    char what[160]; /* what is being read, for messages: "metadata key 3 ('general.name')" */
    char *err;
    size_t errlen;
} cursor;

static uint64_t left(const cursor *c) { return (uint64_t)(c->end - c->p); }

static qwenc_status truncated(cursor *c, const char *item, uint64_t need) {
    return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT,
                  "%s: truncated file: %s of %s needs %" PRIu64 " bytes at offset %" PRIu64 " but only %" PRIu64
                  " remain",
                  c->path, item, c->what, need, (uint64_t)(c->p - c->base), left(c));
}

static qwenc_status rd_bytes(cursor *c, const char *item, void *out, uint64_t n) {
    if (left(c) < n) return truncated(c, item, n);
    memcpy(out, c->p, (size_t)n);
    c->p += n;
    return QWENC_OK;
}

static qwenc_status rd_u32(cursor *c, const char *item, uint32_t *v) { return rd_bytes(c, item, v, 4); }
static qwenc_status rd_u64(cursor *c, const char *item, uint64_t *v) { return rd_bytes(c, item, v, 8); }

/* A string: its bytes stay in the file; *s points at them, *len is their count. */
static qwenc_status rd_str(cursor *c, const char *item, const char **s, uint64_t *len) {
    qwenc_status st = rd_u64(c, item, len);
    if (st) return st;
    if (*len > left(c)) return truncated(c, item, *len);
    *s = (const char *)c->p;
    c->p += *len;
    return QWENC_OK;
}

static qwenc_status nomem(cursor *c, const char *item, uint64_t bytes) {
    return qw_err(c->err, c->errlen, QWENC_ERR_NOMEM, "%s: out of memory allocating %" PRIu64 " bytes for %s of %s",
                  c->path, bytes, item, c->what);
}

/* A NUL-terminated copy of n bytes of the file into *d. */
static qwenc_status dup_n(cursor *c, const char *item, const char *s, uint64_t n, char **d) {
    *d = malloc((size_t)n + 1);
    if (!*d) return nomem(c, item, n + 1);
    memcpy(*d, s, (size_t)n);
    (*d)[n] = 0;
    return QWENC_OK;
}

static qwenc_status read_kv(qw_gguf *g, cursor *c, int64_t i) {
    qw_gguf_kv *kv = &g->kv[i];
    const char *ks = NULL;
    uint64_t kl = 0;
    snprintf(c->what, sizeof(c->what), "metadata key %" PRId64, i);
    qwenc_status st = rd_str(c, "the key", &ks, &kl);
    if (st) return st;
    if (kl == 0) return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: metadata key %" PRId64 " is empty", c->path, i);
    if ((st = dup_n(c, "the key", ks, kl, &kv->key))) return st;
    if (strlen(kv->key) != kl)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: metadata key %" PRId64 " ('%s') contains a NUL byte",
                      c->path, i, kv->key);
    snprintf(c->what, sizeof(c->what), "metadata key %" PRId64 " ('%.100s')", i, kv->key);
    if (hash_lookup(g->kv_slots, g->n_kv_slots, kv->key, kv_key, g, (int32_t)i) >= 0)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' appears twice", c->path, kv->key);
    uint32_t type = 0;
    if ((st = rd_u32(c, "the value type", &type))) return st;
    kv->type = (qw_gguf_type)type;
    kv->n = 1;
    qw_gguf_type et = kv->type;
    if (type == QW_GGUF_ARRAY) {
        uint32_t at = 0;
        if ((st = rd_u32(c, "the array element type", &at)) || (st = rd_u64(c, "the array length", &kv->n))) return st;
        kv->arr_type = et = (qw_gguf_type)at;
        if (at == QW_GGUF_ARRAY)
            return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: %s is an array of arrays, which GGUF readers refuse",
                          c->path, c->what);
    }
    if ((unsigned)et >= QW_GGUF_TYPE_COUNT)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: %s has unknown value type %u", c->path, c->what,
                      (unsigned)et);
    if (et != QW_GGUF_STRING) {
        uint64_t sz = gguf_type_size[et];
        if (kv->n > left(c) / sz) return truncated(c, "the value", kv->n * sz);
        kv->data = c->p;
        c->p += kv->n * sz;
        return QWENC_OK;
    }
    if (type != QW_GGUF_ARRAY) {
        const char *s = NULL;
        uint64_t n = 0;
        if ((st = rd_str(c, "the string value", &s, &n))) return st;
        return dup_n(c, "the string value", s, n, &kv->str);
    }
    /* a string array: check every length first, then copy them into one block (pointers, then chars) */
    if (kv->n > left(c) / 8) return truncated(c, "the string array", kv->n * 8);
    const uint8_t *start = c->p;
    uint64_t chars = 0;
    for (uint64_t k = 0; k < kv->n; k++) {
        const char *s = NULL;
        uint64_t n = 0;
        if ((st = rd_str(c, "a string of the array", &s, &n))) return st;
        chars += n + 1;
    }
    char **strs = malloc((size_t)(kv->n * sizeof(char *) + chars) + 1);
    if (!strs) return nomem(c, "the string array", kv->n * sizeof(char *) + chars + 1);
    char *out = (char *)(strs + kv->n);
    c->p = start;
    for (uint64_t k = 0; k < kv->n; k++) {
        const char *s = NULL;
        uint64_t n = 0;
        rd_str(c, "a string of the array", &s, &n);
        memcpy(out, s, (size_t)n);
        out[n] = 0;
        strs[k] = out;
        out += n + 1;
    }
    kv->strs = strs;
    return QWENC_OK;
}

static qwenc_status read_tensor_info(qw_gguf *g, cursor *c, int64_t i) {
    qw_gguf_tensor *t = &g->tensors[i];
    const char *ns = NULL;
    uint64_t nl = 0;
    snprintf(c->what, sizeof(c->what), "tensor info %" PRId64, i);
    qwenc_status st = rd_str(c, "the name", &ns, &nl);
    if (st) return st;
    if ((st = dup_n(c, "the name", ns, nl, &t->name))) return st;
    t->t.name = t->name;
    if (strlen(t->name) != nl)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: the name of tensor %" PRId64 " ('%s') contains a NUL byte",
                      c->path, i, t->name);
    snprintf(c->what, sizeof(c->what), "tensor %" PRId64 " ('%.100s')", i, t->name);
    if (hash_lookup(g->t_slots, g->n_t_slots, t->name, tensor_key, g, (int32_t)i) >= 0)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' appears twice", c->path, t->name);
    uint32_t nd = 0;
    if ((st = rd_u32(c, "the number of dimensions", &nd))) return st;
    if (nd > QW_MAX_DIMS)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (at most %d)", c->path,
                      t->name, nd, QW_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t nel = 1;
    for (uint32_t d = 0; d < nd; d++) {
        if ((st = rd_bytes(c, "a dimension", &t->ne[d], 8))) return st;
        if (t->ne[d] < 0)
            return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' has dimension %u of size %" PRId64,
                          c->path, t->name, d, t->ne[d]);
        if (t->ne[d] && nel > (uint64_t)INT64_MAX / (uint64_t)t->ne[d])
            return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s': the number of elements overflows",
                          c->path, t->name);
        nel *= (uint64_t)t->ne[d];
    }
    uint32_t gt = 0;
    if ((st = rd_u32(c, "the type", &gt)) || (st = rd_u64(c, "the data offset", &t->offset))) return st;
    t->ggml_type = (int)gt;
    qw_type qt = qw_type_from_ggml((int)gt);
    if (qt == QW_TYPE_UNSUPPORTED) {
        const char *gn = ggml_type_name((int)gt);
        if (gn)
            return qw_err(c->err, c->errlen, QWENC_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has type %s (ggml type %u), which qwenc does not read (it reads f32, f16, "
                          "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, iq4_nl, iq4_xs)",
                          c->path, t->name, gn, gt);
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' has unknown ggml type %u", c->path, t->name,
                      gt);
    }
    const qw_type_traits *tt = qw_type_traits_of(qt);
    int64_t row = nd ? t->ne[0] : 1;
    if (row % tt->block_elems)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT,
                      "%s: tensor '%s' of type %s has rows of %" PRId64 " elements, not a multiple of its block of %d",
                      c->path, t->name, tt->name, row, tt->block_elems);
    if (nel / (uint64_t)tt->block_elems > UINT64_MAX / (uint64_t)tt->block_bytes)
        return qw_err(c->err, c->errlen, QWENC_ERR_FORMAT, "%s: tensor '%s': the size in bytes overflows", c->path,
                      t->name);
    t->nbytes = nel / (uint64_t)tt->block_elems * (uint64_t)tt->block_bytes;
    t->t.type = qt;
    t->t.n_dims = (int)nd;
    for (int d = 0; d < (int)nd; d++) t->t.shape[d] = t->ne[nd - 1 - d];
    return QWENC_OK;
}

static qwenc_status check_alignment(qw_gguf *g, const char *path, char *err, size_t errlen) {
    g->alignment = QW_GGUF_DEFAULT_ALIGNMENT;
    const qw_gguf_kv *kv = qw_gguf_find_kv(g, "general.alignment");
    if (!kv) return QWENC_OK;
    if (kv->type != QW_GGUF_U32)
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: metadata key 'general.alignment' must be u32 but is %s", path,
                      qw_gguf_type_name(kv->type));
    memcpy(&g->alignment, kv->data, 4);
    if (g->alignment == 0 || (g->alignment & (g->alignment - 1)))
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: general.alignment %u is not a power of two", path,
                      g->alignment);
    return QWENC_OK;
}

static qwenc_status parse(qw_gguf *g, const char *path, char *err, size_t errlen) {
    if (!g->file.size) return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: the file is empty, not a GGUF file", path);
    cursor c = {g->file.data, g->file.data, g->file.data + g->file.size, path, "the header", err, errlen};
    char magic[4];
    qwenc_status st = rd_bytes(&c, "the magic", magic, 4);
    if (st) return st;
    if (memcmp(magic, "GGUF", 4) != 0) {
        char shown[5];
        for (int i = 0; i < 4; i++) shown[i] = magic[i] >= 32 && magic[i] < 127 ? magic[i] : '?';
        shown[4] = 0;
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: not a GGUF file (it starts with '%s', not 'GGUF')", path,
                      shown);
    }
    if ((st = rd_u32(&c, "the version", &g->version))) return st;
    if (g->version != 2 && g->version != 3) {
        if (g->version && !(g->version & 0xFFFF))
            return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                          "%s: GGUF version %u looks byte-swapped: big-endian GGUF files are not supported", path,
                          g->version);
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)%s", path,
                      g->version, g->version == 1 ? "; convert the file again with a current llama.cpp" : "");
    }
    uint64_t nt = 0, nkv = 0;
    if ((st = rd_u64(&c, "the tensor count", &nt)) || (st = rd_u64(&c, "the metadata count", &nkv))) return st;
    /* every key/value takes at least 13 bytes (key length, one byte of key, type, one byte of value) and
     * every tensor info 24: bound the counts by the file before allocating for them */
    if (nkv > left(&c) / 13 || nt > left(&c) / 24)
        return qw_err(err, errlen, QWENC_ERR_FORMAT,
                      "%s: the header claims %" PRIu64 " metadata keys and %" PRIu64 " tensors, more than the %" PRIu64
                      " bytes that follow can hold: truncated or corrupt",
                      path, nkv, nt, left(&c));
    g->kv = calloc((size_t)nkv + 1, sizeof(qw_gguf_kv));
    g->tensors = calloc((size_t)nt + 1, sizeof(qw_gguf_tensor));
    g->kv_slots = hash_alloc((size_t)nkv, &g->n_kv_slots);
    g->t_slots = hash_alloc((size_t)nt, &g->n_t_slots);
    if (!g->kv || !g->tensors || !g->kv_slots || !g->t_slots)
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory for the index of %" PRIu64 " metadata keys and %"
                      PRIu64 " tensors", path, nkv, nt);
    for (int64_t i = 0; i < (int64_t)nkv; i++) {
        g->n_kv = i + 1; /* so that qw_gguf_free releases what was read */
        if ((st = read_kv(g, &c, i))) return st;
    }
    if ((st = check_alignment(g, path, err, errlen))) return st;
    for (int64_t i = 0; i < (int64_t)nt; i++) {
        g->n_tensors = i + 1;
        if ((st = read_tensor_info(g, &c, i))) return st;
    }
    uint64_t pos = (uint64_t)(c.p - c.base), a = g->alignment;
    g->data_offset = nt ? (pos + a - 1) / a * a : pos;
    uint64_t size = g->file.size;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        qw_gguf_tensor *t = &g->tensors[i];
        if (t->offset % a)
            return qw_err(err, errlen, QWENC_ERR_FORMAT,
                          "%s: tensor '%s' has data offset %" PRIu64 ", not a multiple of the alignment %u", path,
                          t->name, t->offset, g->alignment);
        if (g->data_offset > size || t->offset > size - g->data_offset || t->nbytes > size - g->data_offset - t->offset)
            return qw_err(err, errlen, QWENC_ERR_FORMAT,
                          "%s: tensor '%s': data [%" PRIu64 ", %" PRIu64 ") of the data section at %" PRIu64
                          " extends past the end of the file (%" PRIu64 " bytes): the file is truncated or the offset is bad",
                          path, t->name, t->offset, t->offset + t->nbytes, g->data_offset, size);
        t->t.data = g->file.data + g->data_offset + t->offset;
    }
    return QWENC_OK;
}

qwenc_status qw_gguf_open(qw_gguf *g, const char *path, char *err, size_t errlen) {
    memset(g, 0, sizeof(*g));
    qwenc_status st = qw_mapfile_open(&g->file, path, err, errlen);
    if (st) return st;
    st = parse(g, path, err, errlen);
    if (st) qw_gguf_free(g);
    return st;
}

void qw_gguf_free(qw_gguf *g) {
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str);
        free(g->kv[i].strs);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_slots);
    free(g->t_slots);
    qw_mapfile_close(&g->file);
    memset(g, 0, sizeof(*g));
}

/* ------------------------------------------------------------------ metadata accessors */

/* Element i of a numeric array or the scalar (i = 0), as signed / unsigned / double. */
static void num_at(const qw_gguf_kv *kv, uint64_t i, int64_t *s, uint64_t *u, double *f) {
    qw_gguf_type t = kv->type == QW_GGUF_ARRAY ? kv->arr_type : kv->type;
    QW_ASSERT(t != QW_GGUF_STRING && t != QW_GGUF_ARRAY && i < kv->n);
    const uint8_t *p = kv->data + i * gguf_type_size[t];
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } v;
    memcpy(&v, p, gguf_type_size[t]);
    switch (t) {
    case QW_GGUF_U8: *u = v.u8; break;
    case QW_GGUF_BOOL: *u = v.u8 != 0; break;
    case QW_GGUF_I8: *s = v.i8; break;
    case QW_GGUF_U16: *u = v.u16; break;
    case QW_GGUF_I16: *s = v.i16; break;
    case QW_GGUF_U32: *u = v.u32; break;
    case QW_GGUF_I32: *s = v.i32; break;
    case QW_GGUF_U64: *u = v.u64; break;
    case QW_GGUF_I64: *s = v.i64; break;
    case QW_GGUF_F32: *f = v.f32; return;
    case QW_GGUF_F64: *f = v.f64; return;
    default: QW_ASSERT(!"not a number");
    }
    if (is_signed_type(t)) {
        *u = (uint64_t)*s;
        *f = (double)*s;
    } else {
        *s = (int64_t)*u;
        *f = (double)*u;
    }
}

int64_t qw_gguf_arr_i64(const qw_gguf_kv *kv, uint64_t i) {
    int64_t s = 0;
    uint64_t u = 0;
    double f = 0;
    num_at(kv, i, &s, &u, &f);
    qw_gguf_type t = kv->type == QW_GGUF_ARRAY ? kv->arr_type : kv->type;
    if (t != QW_GGUF_F32 && t != QW_GGUF_F64) return s;
    /* a float read as an integer: truncated toward zero, saturated (NaN as 0) rather than undefined */
    if (!(f == f)) return 0;
    if (f >= 9223372036854775808.0) return INT64_MAX;
    if (f <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)f;
}

double qw_gguf_arr_f64(const qw_gguf_kv *kv, uint64_t i) {
    int64_t s = 0;
    uint64_t u = 0;
    double f = 0;
    num_at(kv, i, &s, &u, &f);
    return f;
}

const char *qw_gguf_arr_str(const qw_gguf_kv *kv, uint64_t i) {
    QW_ASSERT(kv->type == QW_GGUF_ARRAY && kv->arr_type == QW_GGUF_STRING && i < kv->n);
    return kv->strs[i];
}

double qw_gguf_kv_f64(const qw_gguf_kv *kv) { return qw_gguf_arr_f64(kv, 0); }
int64_t qw_gguf_kv_i64(const qw_gguf_kv *kv) { return qw_gguf_arr_i64(kv, 0); }

static qwenc_status lookup(const qw_gguf *g, const char *key, const qw_gguf_kv **kv, char *err, size_t errlen) {
    *kv = qw_gguf_find_kv(g, key);
    if (!*kv) return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' is missing", g->file.path, key);
    return QWENC_OK;
}

static qwenc_status wrong_type(const qw_gguf *g, const qw_gguf_kv *kv, const char *want, char *err, size_t errlen) {
    if (kv->type == QW_GGUF_ARRAY)
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' should be %s but is an array of %s",
                      g->file.path, kv->key, want, qw_gguf_type_name(kv->arr_type));
    return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' should be %s but is %s", g->file.path, kv->key,
                  want, qw_gguf_type_name(kv->type));
}

/* An integer value in [lo, hi] (signed view) or [0, uhi] for unsigned targets. */
static qwenc_status get_int(const qw_gguf *g, const char *key, int is_unsigned, int64_t lo, int64_t hi, uint64_t uhi,
                            int64_t *s_out, uint64_t *u_out, const char *want, char *err, size_t errlen) {
    const qw_gguf_kv *kv;
    qwenc_status st = lookup(g, key, &kv, err, errlen);
    if (st) return st;
    if (kv->type == QW_GGUF_ARRAY || !is_int_type(kv->type)) return wrong_type(g, kv, want, err, errlen);
    int64_t s = 0;
    uint64_t u = 0;
    double f = 0;
    num_at(kv, 0, &s, &u, &f);
    int neg = is_signed_type(kv->type) && s < 0;
    int ok = is_unsigned ? !neg && u <= uhi : (neg ? s >= lo : u <= (uint64_t)hi);
    if (!ok)
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: metadata key '%s' = %s%" PRIu64 " does not fit in %s",
                      g->file.path, key, neg ? "-" : "", neg ? (uint64_t)0 - (uint64_t)s : u, want);
    *s_out = s;
    *u_out = u;
    return QWENC_OK;
}

qwenc_status qw_gguf_get_u32(const qw_gguf *g, const char *key, uint32_t *out, char *err, size_t errlen) {
    int64_t s;
    uint64_t u;
    qwenc_status st = get_int(g, key, 1, 0, 0, UINT32_MAX, &s, &u, "u32", err, errlen);
    if (!st) *out = (uint32_t)u;
    return st;
}

qwenc_status qw_gguf_get_i32(const qw_gguf *g, const char *key, int32_t *out, char *err, size_t errlen) {
    int64_t s;
    uint64_t u;
    qwenc_status st = get_int(g, key, 0, INT32_MIN, INT32_MAX, 0, &s, &u, "i32", err, errlen);
    if (!st) *out = (int32_t)s;
    return st;
}

qwenc_status qw_gguf_get_u64(const qw_gguf *g, const char *key, uint64_t *out, char *err, size_t errlen) {
    int64_t s;
    uint64_t u;
    qwenc_status st = get_int(g, key, 1, 0, 0, UINT64_MAX, &s, &u, "u64", err, errlen);
    if (!st) *out = u;
    return st;
}

qwenc_status qw_gguf_get_i64(const qw_gguf *g, const char *key, int64_t *out, char *err, size_t errlen) {
    int64_t s;
    uint64_t u;
    qwenc_status st = get_int(g, key, 0, INT64_MIN, INT64_MAX, 0, &s, &u, "i64", err, errlen);
    if (!st) *out = s;
    return st;
}

qwenc_status qw_gguf_get_f32(const qw_gguf *g, const char *key, float *out, char *err, size_t errlen) {
    const qw_gguf_kv *kv;
    qwenc_status st = lookup(g, key, &kv, err, errlen);
    if (st) return st;
    if (kv->type != QW_GGUF_F32 && kv->type != QW_GGUF_F64) return wrong_type(g, kv, "f32", err, errlen);
    *out = (float)qw_gguf_kv_f64(kv);
    return QWENC_OK;
}

qwenc_status qw_gguf_get_bool(const qw_gguf *g, const char *key, int *out, char *err, size_t errlen) {
    const qw_gguf_kv *kv;
    qwenc_status st = lookup(g, key, &kv, err, errlen);
    if (st) return st;
    if (kv->type != QW_GGUF_BOOL) return wrong_type(g, kv, "bool", err, errlen);
    *out = kv->data[0] != 0;
    return QWENC_OK;
}

qwenc_status qw_gguf_get_str(const qw_gguf *g, const char *key, const char **out, char *err, size_t errlen) {
    const qw_gguf_kv *kv;
    qwenc_status st = lookup(g, key, &kv, err, errlen);
    if (st) return st;
    if (kv->type != QW_GGUF_STRING) return wrong_type(g, kv, "string", err, errlen);
    *out = kv->str;
    return QWENC_OK;
}

qwenc_status qw_gguf_get_arr(const qw_gguf *g, const char *key, int elem_type, const qw_gguf_kv **out, char *err,
                             size_t errlen) {
    const qw_gguf_kv *kv;
    qwenc_status st = lookup(g, key, &kv, err, errlen);
    if (st) return st;
    char want[48];
    snprintf(want, sizeof(want), "an array of %s",
             elem_type < 0                ? "anything"
             : elem_type == QW_GGUF_I64   ? "integers"
             : elem_type == QW_GGUF_F32   ? "floats"
                                          : qw_gguf_type_name((qw_gguf_type)elem_type));
    if (kv->type != QW_GGUF_ARRAY) return wrong_type(g, kv, want, err, errlen);
    qw_gguf_type at = kv->arr_type;
    int ok = elem_type < 0 || (elem_type == QW_GGUF_I64 ? is_int_type(at)
                               : elem_type == QW_GGUF_F32 ? at == QW_GGUF_F32 || at == QW_GGUF_F64
                                                          : (int)at == elem_type);
    if (!ok) return wrong_type(g, kv, want, err, errlen);
    *out = kv;
    return QWENC_OK;
}

/* ------------------------------------------------------------------ writing */

typedef struct {
    char *key;
    uint32_t type;
    uint8_t *blob; /* the serialized value: everything after the type field */
    size_t len;
} wkv;

typedef struct {
    char *name;
    uint32_t n_dims;
    int64_t ne[QW_GGUF_MAX_DIMS];
    uint32_t ggml_type;
    uint64_t offset, nbytes;
} wtensor;

struct qw_gguf_writer {
    FILE *f;
    char *path;          /* the file asked for (named in messages); it appears only at close */
    char *tmp;           /* the file written: a temporary name beside path */
    uint32_t alignment;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    uint64_t data_size;  /* padded bytes of the tensors declared so far */
    int header_written;
    size_t cur;          /* the tensor being written */
    uint64_t cur_done;   /* bytes of it written */
    int io_errno;        /* first write error */
    qwenc_status fail_st; /* set by qw_gguf_writer_fail (or an allocation failure): every later call returns it */
    char fail_msg[512];
};

static void wput(qw_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n && !w->io_errno) w->io_errno = errno ? errno : EIO;
}

static void wpad(qw_gguf_writer *w, uint64_t n) {
    static const uint8_t zeros[64];
    while (n) {
        size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
        wput(w, zeros, k);
        n -= k;
    }
}

/* The file is written under a temporary name in the same directory and renamed to path once complete, so
 * path never holds a partial file (interrupted, failed, or being written) and an existing file there stays
 * whole until the new one replaces it. */
qwenc_status qw_gguf_writer_open(qw_gguf_writer **wp, const char *path, char *err, size_t errlen) {
    static atomic_uint serial;
    *wp = NULL;
    size_t n = strlen(path) + 48;
    char *tmp = malloc(n);
    if (!tmp) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory opening the file for writing", path);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&serial, 1));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            remove(tmp);
        }
        free(tmp);
        return qw_err(err, errlen, e == ENOMEM ? QWENC_ERR_NOMEM : QWENC_ERR_IO, "%s: cannot create: %s", path,
                      strerror(e));
    }
    qw_gguf_writer *w = calloc(1, sizeof(*w));
    char *p = strdup(path);
    if (!w || !p) {
        free(w);
        free(p);
        fclose(f);
        remove(tmp);
        free(tmp);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory opening the file for writing", path);
    }
    w->f = f;
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    w->path = p;
    w->tmp = tmp;
    w->alignment = QW_GGUF_DEFAULT_ALIGNMENT;
    *wp = w;
    return QWENC_OK;
}

void qw_gguf_writer_fail(qw_gguf_writer *w, qwenc_status st, const char *msg) {
    if (w->fail_st || !st) return;
    w->fail_st = st;
    snprintf(w->fail_msg, sizeof(w->fail_msg), "%s", msg ? msg : "failed");
}

/* An allocation failed: the file fails as qw_gguf_writer_fail makes it fail. */
static void writer_nomem(qw_gguf_writer *w, const char *what, const char *name) {
    char msg[300];
    snprintf(msg, sizeof(msg), "%s: out of memory for %s '%.200s'", w->path, what, name);
    qw_gguf_writer_fail(w, QWENC_ERR_NOMEM, msg);
}

static qwenc_status failed(const qw_gguf_writer *w, char *err, size_t errlen) {
    return qw_err(err, errlen, w->fail_st, "%s", w->fail_msg);
}

/* A growing byte buffer for serialized values; oom is set (and nothing more is added) when it cannot grow. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} bbuf;

static void bput(bbuf *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void bput_str(bbuf *b, const char *s) {
    uint64_t n = strlen(s);
    bput(b, &n, 8);
    bput(b, s, (size_t)n);
}

/* Set (or replace) key with type and serialized value (ownership of blob passes to w). */
static void set_blob(qw_gguf_writer *w, const char *key, uint32_t type, bbuf b) {
    QW_ASSERT(!w->header_written && key && *key);
    if (b.oom || w->fail_st) {
        free(b.p);
        if (b.oom) writer_nomem(w, "metadata key", key);
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].blob);
            w->kv[i].type = type;
            w->kv[i].blob = b.p;
            w->kv[i].len = b.n;
            return;
        }
    char *k = strdup(key);
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        wkv *nk = k ? realloc(w->kv, cap * sizeof(*nk)) : NULL;
        if (!nk) {
            free(k);
            free(b.p);
            writer_nomem(w, "metadata key", key);
            return;
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    if (!k) {
        free(b.p);
        writer_nomem(w, "metadata key", key);
        return;
    }
    w->kv[w->n_kv++] = (wkv){k, type, b.p, b.n};
}

static void set_scalar(qw_gguf_writer *w, const char *key, qw_gguf_type t, const void *v) {
    bbuf b = {0};
    bput(&b, v, gguf_type_size[t]);
    set_blob(w, key, t, b);
}

void qw_gguf_writer_set_u8(qw_gguf_writer *w, const char *key, uint8_t v) { set_scalar(w, key, QW_GGUF_U8, &v); }
void qw_gguf_writer_set_i8(qw_gguf_writer *w, const char *key, int8_t v) { set_scalar(w, key, QW_GGUF_I8, &v); }
void qw_gguf_writer_set_u16(qw_gguf_writer *w, const char *key, uint16_t v) { set_scalar(w, key, QW_GGUF_U16, &v); }
void qw_gguf_writer_set_i16(qw_gguf_writer *w, const char *key, int16_t v) { set_scalar(w, key, QW_GGUF_I16, &v); }
void qw_gguf_writer_set_i32(qw_gguf_writer *w, const char *key, int32_t v) { set_scalar(w, key, QW_GGUF_I32, &v); }
void qw_gguf_writer_set_u64(qw_gguf_writer *w, const char *key, uint64_t v) { set_scalar(w, key, QW_GGUF_U64, &v); }
void qw_gguf_writer_set_i64(qw_gguf_writer *w, const char *key, int64_t v) { set_scalar(w, key, QW_GGUF_I64, &v); }
void qw_gguf_writer_set_f32(qw_gguf_writer *w, const char *key, float v) { set_scalar(w, key, QW_GGUF_F32, &v); }
void qw_gguf_writer_set_f64(qw_gguf_writer *w, const char *key, double v) { set_scalar(w, key, QW_GGUF_F64, &v); }

void qw_gguf_writer_set_u32(qw_gguf_writer *w, const char *key, uint32_t v) {
    if (strcmp(key, "general.alignment") == 0) {
        QW_ASSERT(v && !(v & (v - 1)) && w->n_t == 0); /* a power of two, before any tensor is placed */
        w->alignment = v;
    }
    set_scalar(w, key, QW_GGUF_U32, &v);
}

void qw_gguf_writer_set_bool(qw_gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    set_scalar(w, key, QW_GGUF_BOOL, &b);
}

void qw_gguf_writer_set_str(qw_gguf_writer *w, const char *key, const char *v) {
    QW_ASSERT(strcmp(key, "general.alignment") != 0);
    bbuf b = {0};
    bput_str(&b, v);
    set_blob(w, key, QW_GGUF_STRING, b);
}

void qw_gguf_writer_set_arr(qw_gguf_writer *w, const char *key, qw_gguf_type et, const void *data, uint64_t n) {
    QW_ASSERT((unsigned)et < QW_GGUF_TYPE_COUNT && gguf_type_size[et] && strcmp(key, "general.alignment") != 0);
    bbuf b = {0};
    uint32_t t = et;
    bput(&b, &t, 4);
    bput(&b, &n, 8);
    bput(&b, data, (size_t)n * gguf_type_size[et]);
    set_blob(w, key, QW_GGUF_ARRAY, b);
}

void qw_gguf_writer_set_arr_str(qw_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    bbuf b = {0};
    uint32_t t = QW_GGUF_STRING;
    bput(&b, &t, 4);
    bput(&b, &n, 8);
    for (uint64_t i = 0; i < n; i++) bput_str(&b, v[i]);
    set_blob(w, key, QW_GGUF_ARRAY, b);
}

void qw_gguf_writer_set_kv(qw_gguf_writer *w, const qw_gguf_kv *kv) {
    if (kv->type == QW_GGUF_STRING) {
        qw_gguf_writer_set_str(w, kv->key, kv->str);
    } else if (kv->type == QW_GGUF_ARRAY && kv->arr_type == QW_GGUF_STRING) {
        qw_gguf_writer_set_arr_str(w, kv->key, (const char *const *)kv->strs, kv->n);
    } else if (kv->type == QW_GGUF_ARRAY) {
        qw_gguf_writer_set_arr(w, kv->key, kv->arr_type, kv->data, kv->n);
    } else if (kv->type == QW_GGUF_U32) {
        uint32_t v;
        memcpy(&v, kv->data, 4);
        qw_gguf_writer_set_u32(w, kv->key, v);
    } else {
        set_scalar(w, kv->key, kv->type, kv->data);
    }
}

qwenc_status qw_gguf_writer_add_tensor(qw_gguf_writer *w, const char *name, qw_type type, int n_dims,
                                       const int64_t *shape, char *err, size_t errlen) {
    const qw_type_traits *tt = qw_type_traits_of(type);
    if (w->fail_st) return failed(w, err, errlen);
    if (w->header_written)
        return qw_err(err, errlen, QWENC_ERR_ARG, "%s: tensor '%s' declared after tensor data was written", w->path,
                      name);
    if (strlen(name) >= 64 || !*name)
        return qw_err(err, errlen, QWENC_ERR_ARG, "%s: tensor name '%s' must have 1 to 63 bytes (ggml's limit)",
                      w->path, name);
    if (n_dims < 1 || n_dims > QW_GGUF_MAX_DIMS)
        return qw_err(err, errlen, QWENC_ERR_ARG, "%s: tensor '%s' has %d dimensions (1 to %d)", w->path, name, n_dims,
                      QW_GGUF_MAX_DIMS);
    if (tt->ggml_type < 0 || type == QW_TYPE_Q8_K)
        return qw_err(err, errlen, QWENC_ERR_ARG, "%s: tensor '%s': type %s cannot be stored in GGUF", w->path, name,
                      tt->name);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return qw_err(err, errlen, QWENC_ERR_ARG, "%s: tensor '%s' declared twice", w->path, name);
    wtensor t = {0};
    uint64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0 || (shape[d] && nel > (uint64_t)INT64_MAX / (uint64_t)shape[d]))
            return qw_err(err, errlen, QWENC_ERR_ARG, "%s: tensor '%s': bad shape", w->path, name);
        nel *= (uint64_t)shape[d];
        t.ne[n_dims - 1 - d] = shape[d];
    }
    if (t.ne[0] % tt->block_elems)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "%s: tensor '%s': rows of %" PRId64 " elements are not a whole number of %s blocks of %d", w->path,
                      name, t.ne[0], tt->name, tt->block_elems);
    t.n_dims = (uint32_t)n_dims;
    t.ggml_type = (uint32_t)tt->ggml_type;
    t.nbytes = nel / (uint64_t)tt->block_elems * (uint64_t)tt->block_bytes;
    t.offset = w->data_size;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *nt = realloc(w->t, cap * sizeof(*nt));
        if (!nt) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory declaring tensor '%s'", w->path, name);
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = strdup(name)))
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory declaring tensor '%s'", w->path, name);
    w->data_size += (t.nbytes + w->alignment - 1) / w->alignment * w->alignment;
    w->t[w->n_t++] = t;
    return QWENC_OK;
}

/* Skip past tensors that are complete (including empty ones), padding after each. */
static void advance(qw_gguf_writer *w) {
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].nbytes) {
        uint64_t n = w->t[w->cur].nbytes, a = w->alignment;
        wpad(w, (n + a - 1) / a * a - n);
        w->cur++;
        w->cur_done = 0;
    }
}

static void write_header(qw_gguf_writer *w) {
    uint32_t version = 3;
    uint64_t nt = w->n_t, nkv = w->n_kv;
    wput(w, "GGUF", 4);
    wput(w, &version, 4);
    wput(w, &nt, 8);
    wput(w, &nkv, 8);
    uint64_t pos = 24;
    for (size_t i = 0; i < w->n_kv; i++) {
        uint64_t kl = strlen(w->kv[i].key);
        wput(w, &kl, 8);
        wput(w, w->kv[i].key, (size_t)kl);
        wput(w, &w->kv[i].type, 4);
        wput(w, w->kv[i].blob, w->kv[i].len);
        pos += 8 + kl + 4 + w->kv[i].len;
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        wput(w, &nl, 8);
        wput(w, t->name, (size_t)nl);
        wput(w, &t->n_dims, 4);
        wput(w, t->ne, 8 * (size_t)t->n_dims);
        wput(w, &t->ggml_type, 4);
        wput(w, &t->offset, 8);
        pos += 8 + nl + 4 + 8 * t->n_dims + 4 + 8;
    }
    if (w->n_t) {
        uint64_t a = w->alignment;
        wpad(w, (pos + a - 1) / a * a - pos);
    }
    w->header_written = 1;
    advance(w);
}

static qwenc_status io_error(qw_gguf_writer *w, char *err, size_t errlen) {
    return qw_err(err, errlen, QWENC_ERR_IO, "%s: write failed: %s", w->path, strerror(w->io_errno));
}

qwenc_status qw_gguf_writer_write(qw_gguf_writer *w, const void *data, size_t n, char *err, size_t errlen) {
    if (w->fail_st) return failed(w, err, errlen);
    if (!w->header_written) write_header(w);
    if (n == 0) return w->io_errno ? io_error(w, err, errlen) : QWENC_OK;
    if (w->cur >= w->n_t)
        return qw_err(err, errlen, QWENC_ERR_ARG, "%s: %zu bytes written after the last tensor", w->path, n);
    const wtensor *t = &w->t[w->cur];
    if (n > t->nbytes - w->cur_done)
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "%s: %zu bytes written to tensor '%s', which has only %" PRIu64 " of its %" PRIu64 " bytes left",
                      w->path, n, t->name, t->nbytes - w->cur_done, t->nbytes);
    wput(w, data, n);
    w->cur_done += n;
    advance(w);
    return w->io_errno ? io_error(w, err, errlen) : QWENC_OK;
}

static void writer_free(qw_gguf_writer *w) {
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].blob);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w->path);
    free(w->tmp);
    free(w);
}

qwenc_status qw_gguf_writer_close(qw_gguf_writer *w, char *err, size_t errlen) {
    qwenc_status st = w->fail_st ? failed(w, err, errlen) : QWENC_OK;
    if (!w->header_written && !st) write_header(w);
    if (!st && w->cur < w->n_t)
        st = qw_err(err, errlen, QWENC_ERR_ARG,
                    "%s: closed with tensor '%s' (%zu of %zu) at %" PRIu64 " of its %" PRIu64 " bytes", w->path,
                    w->t[w->cur].name, w->cur + 1, w->n_t, w->cur_done, w->t[w->cur].nbytes);
    /* on disk before the rename, so that a crash cannot leave path naming a file without its data */
    if (fflush(w->f) != 0 && !w->io_errno) w->io_errno = errno;
    if (!st && !w->io_errno && fsync(fileno(w->f)) != 0 && errno != EINVAL && errno != EROFS) w->io_errno = errno;
    if (fclose(w->f) != 0 && !w->io_errno) w->io_errno = errno;
    if (!st && w->io_errno) st = io_error(w, err, errlen);
    if (!st && rename(w->tmp, w->path) != 0)
        st = qw_err(err, errlen, QWENC_ERR_IO, "%s: cannot rename %s to it: %s", w->path, w->tmp, strerror(errno));
    if (st) remove(w->tmp);
    writer_free(w);
    return st;
}

void qw_gguf_writer_abort(qw_gguf_writer *w) {
    fclose(w->f);
    remove(w->tmp);
    writer_free(w);
}
