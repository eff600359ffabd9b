/* safetensors.c - parse and map safetensors checkpoints (see safetensors.h). */
#include "formats/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void hash_insert(qw_weightset *ws, int32_t idx) {
    size_t m = ws->n_slots - 1;
    for (size_t i = hash_str(ws->entries[idx].name) & m;; i = (i + 1) & m) {
        if (ws->slots[i] < 0) {
            ws->slots[i] = idx;
            return;
        }
    }
}

/* A larger table for every entry; 0 when out of memory (the old table is kept). */
static int hash_rebuild(qw_weightset *ws) {
    size_t need = 16;
    while (need < (size_t)ws->n_entries * 2 + 2) need *= 2;
    int32_t *slots = malloc(need * sizeof(int32_t));
    if (!slots) return 0;
    free(ws->slots);
    ws->n_slots = need;
    ws->slots = slots;
    for (size_t i = 0; i < need; i++) ws->slots[i] = -1;
    for (int i = 0; i < ws->n_entries; i++) hash_insert(ws, i);
    return 1;
}

const qw_tensor *qw_weightset_find(const qw_weightset *ws, const char *name) {
    if (!ws->n_slots) return NULL;
    size_t m = ws->n_slots - 1;
    for (size_t i = hash_str(name) & m; ws->slots[i] >= 0; i = (i + 1) & m)
        if (strcmp(ws->entries[ws->slots[i]].name, name) == 0) return &ws->entries[ws->slots[i]].t;
    return NULL;
}

/* O(1): t is the qw_tensor of some entry (the shard index asks this of every tensor of a checkpoint that may
 * have 100,000 of them). */
const char *qw_weightset_file_of(const qw_weightset *ws, const qw_tensor *t) {
    uintptr_t p = (uintptr_t)t, lo = (uintptr_t)ws->entries, hi = (uintptr_t)(ws->entries + ws->n_entries);
    if (ws->n_entries && p >= lo && p < hi) {
        const qw_st_entry *e = &ws->entries[(p - lo) / sizeof(qw_st_entry)];
        if (&e->t == t) return ws->files[e->file].path;
    }
    return ws->dir ? ws->dir : "?";
}

static qwenc_status parse_entry(qw_weightset *ws, int file, const cJSON *it, const uint8_t *base,
                                uint64_t data_size, char *err, size_t errlen) {
    const char *path = ws->files[file].path, *name = it->string;
    if (!cJSON_IsObject(it))
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: header entry '%s' is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return qw_err(err, errlen, QWENC_ERR_FORMAT,
                      "%s: tensor '%s': header entry needs \"dtype\", \"shape\" and two \"data_offsets\"",
                      path, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > QW_MAX_DIMS)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d)",
                      path, name, nd, QW_MAX_DIMS);
    qw_tensor t = {0};
    t.type = qw_type_from_safetensors(dt->valuestring);
    t.n_dims = nd;
    /* integers of JSON are doubles: a shape entry or offset must be a whole number below 2^53, where doubles
     * are exact, before it is converted */
    const double exact = 9007199254740992.0;
    uint64_t nel = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0 && d->valuedouble < exact) ||
            d->valuedouble != floor(d->valuedouble))
            return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: tensor '%s': shape entry %d is not a size", path, name, i);
        t.shape[i] = (int64_t)d->valuedouble;
        if (t.shape[i] && nel > (uint64_t)INT64_MAX / (uint64_t)t.shape[i])
            return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: tensor '%s': the number of elements of its shape overflows",
                          path, name);
        nel *= (uint64_t)t.shape[i];
    }
    const cJSON *ob = cJSON_GetArrayItem(off, 0), *oe = cJSON_GetArrayItem(off, 1);
    if (!cJSON_IsNumber(ob) || !cJSON_IsNumber(oe) || !(ob->valuedouble >= 0 && ob->valuedouble <= oe->valuedouble) ||
        !(oe->valuedouble < exact) || ob->valuedouble != floor(ob->valuedouble) ||
        oe->valuedouble != floor(oe->valuedouble))
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, name);
    uint64_t b = (uint64_t)ob->valuedouble, e = (uint64_t)oe->valuedouble;
    if (e > data_size)
        return qw_err(err, errlen, QWENC_ERR_FORMAT,
                      "%s: tensor '%s': data [%llu, %llu) extends past the end of the data (%llu bytes): "
                      "the file is truncated",
                      path, name, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
    size_t es = qw_type_size(t.type);
    if (es && (nel > (e - b) / es || nel * es != e - b))
        return qw_err(err, errlen, QWENC_ERR_FORMAT,
                      "%s: tensor '%s': %s shape of %llu elements needs %.0f bytes but data_offsets span %llu", path,
                      name, dt->valuestring, (unsigned long long)nel, (double)nel * (double)es,
                      (unsigned long long)(e - b));
    if (qw_weightset_find(ws, name))
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: tensor '%s' appears twice in the checkpoint", path,
                      name);
    if (ws->n_entries == ws->cap_entries) {
        int cap = ws->cap_entries ? ws->cap_entries * 2 : 256;
        qw_st_entry *ne = cap > 0 ? realloc(ws->entries, (size_t)cap * sizeof(*ne)) : NULL;
        if (!ne) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory adding tensor '%s'", path, name);
        ws->entries = ne;
        ws->cap_entries = cap;
        for (int i = 0; i < ws->n_entries; i++) ws->entries[i].t.name = ws->entries[i].name;
    }
    qw_st_entry *en = &ws->entries[ws->n_entries];
    if (!(en->name = strdup(name)))
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory adding tensor '%s'", path, name);
    en->file = file;
    en->t = t;
    en->t.name = en->name;
    en->t.data = base + b;
    ws->n_entries++;
    if ((size_t)ws->n_entries * 2 + 2 > ws->n_slots) {
        if (!hash_rebuild(ws)) {
            free(en->name);
            ws->n_entries--;
            return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory adding tensor '%s'", path, name);
        }
    } else {
        hash_insert(ws, ws->n_entries - 1);
    }
    return QWENC_OK;
}

qwenc_status qw_weightset_add_file(qw_weightset *ws, const char *path, char *err, size_t errlen) {
    qw_mapfile mf;
    qwenc_status st = qw_mapfile_open(&mf, path, err, errlen);
    if (st) return st;
    qw_mapfile *nf = realloc(ws->files, (size_t)(ws->n_files + 1) * sizeof(*nf));
    if (!nf) {
        qw_mapfile_close(&mf);
        return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", path);
    }
    ws->files = nf;
    int file = ws->n_files++;
    ws->files[file] = mf;
    if (mf.size < 8)
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: %zu bytes is too small for a safetensors file", path,
                      mf.size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | mf.data[i];
    if (hl > mf.size - 8)
        return qw_err(err, errlen, QWENC_ERR_FORMAT,
                      "%s: header length %llu exceeds the file size %zu: truncated or not a safetensors file",
                      path, (unsigned long long)hl, mf.size);
    const char *parse_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)mf.data + 8, (size_t)hl, &parse_end, 0);
    if (!cJSON_IsObject(root)) {
        long at = parse_end ? (long)(parse_end - (const char *)mf.data - 8) : -1;
        cJSON_Delete(root);
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: the header is not a valid JSON object (near byte %ld)",
                      path, at);
    }
    const uint8_t *base = mf.data + 8 + hl;
    uint64_t data_size = mf.size - 8 - hl;
    qwenc_status rs = QWENC_OK;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        rs = parse_entry(ws, file, it, base, data_size, err, errlen);
        if (rs) break;
    }
    cJSON_Delete(root);
    return rs;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static qwenc_status open_index(qw_weightset *ws, const char *dir, const char *ipath, char *err, size_t errlen) {
    char *txt = NULL;
    qwenc_status st = qw_read_file_max(ipath, QW_READ_CONFIG_MAX, &txt, NULL, err, errlen);
    if (st) return st;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: %s", ipath,
                      root ? "no \"weight_map\" object" : "not valid JSON");
    }
    /* the file names, sorted, each once */
    int n = 0, n_all = cJSON_GetArraySize(wm);
    if (n_all == 0) {
        cJSON_Delete(root);
        return qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: \"weight_map\" is empty: the index names no tensor", ipath);
    }
    const char **names = malloc((size_t)(n_all > 0 ? n_all : 1) * sizeof(char *));
    if (!names) st = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory for %d weight_map entries", ipath, n_all);
    for (const cJSON *it = wm->child; it && !st; it = it->next) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
            st = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name",
                        ipath, it->string);
            break;
        }
        names[n++] = it->valuestring;
    }
    if (!st && n) {
        qsort(names, (size_t)n, sizeof(char *), cmp_str);
        int u = 1;
        for (int i = 1; i < n; i++)
            if (strcmp(names[i], names[u - 1]) != 0) names[u++] = names[i];
        n = u;
    }
    for (int i = 0; i < n && !st; i++) {
        char *p = qw_path_new(dir, names[i]);
        st = p ? qw_weightset_add_file(ws, p, err, errlen) : qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", ipath);
        free(p);
    }
    for (const cJSON *it = wm->child; it && !st; it = it->next) {
        const qw_tensor *t = qw_weightset_find(ws, it->string);
        if (!t) {
            st = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: names tensor '%s' in %s, which does not contain it",
                        ipath, it->string, it->valuestring);
        } else if (!ends_with(qw_weightset_file_of(ws, t), it->valuestring)) {
            st = qw_err(err, errlen, QWENC_ERR_FORMAT, "%s: names tensor '%s' in %s, but it is in %s", ipath,
                        it->string, it->valuestring, qw_weightset_file_of(ws, t));
        }
    }
    free(names);
    cJSON_Delete(root);
    return st;
}

qwenc_status qw_weightset_open_dir(qw_weightset *ws, const char *dir, char *err, size_t errlen) {
    memset(ws, 0, sizeof(*ws));
    if (!(ws->dir = strdup(dir))) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    char *ipath = qw_path_new(dir, "model.safetensors.index.json");
    if (!ipath) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    struct stat sb;
    qwenc_status st;
    if (stat(ipath, &sb) == 0) {
        st = open_index(ws, dir, ipath, err, errlen);
        free(ipath);
        return st;
    }
    free(ipath);
    char *single = qw_path_new(dir, "model.safetensors");
    if (!single) return qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
    if (stat(single, &sb) == 0) {
        st = qw_weightset_add_file(ws, single, err, errlen);
        free(single);
        return st;
    }
    free(single);
    /* no standard name: take every *.safetensors file of the directory, in name order */
    DIR *d = opendir(dir);
    if (!d) return qw_err(err, errlen, QWENC_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int n = 0, cap = 0, oom = 0;
    char **names = NULL;
    for (struct dirent *de; !oom && (de = readdir(d));) {
        if (!ends_with(de->d_name, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(names, (size_t)cap * sizeof(char *));
            if (!nn) {
                oom = 1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) oom = 1;
        else n++;
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof(char *), cmp_str);
    st = oom ? qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory listing the directory", dir)
         : n ? QWENC_OK
             : qw_err(err, errlen, QWENC_ERR_IO, "%s: no model.safetensors, model.safetensors.index.json or "
                                                 "*.safetensors file in this directory", dir);
    for (int i = 0; i < n; i++) {
        if (!st) {
            char *p = qw_path_new(dir, names[i]);
            st = p ? qw_weightset_add_file(ws, p, err, errlen) : qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory", dir);
            free(p);
        }
        free(names[i]);
    }
    free(names);
    return st;
}

void qw_weightset_free(qw_weightset *ws) {
    for (int i = 0; i < ws->n_entries; i++) free(ws->entries[i].name);
    free(ws->entries);
    for (int i = 0; i < ws->n_files; i++) qw_mapfile_close(&ws->files[i]);
    free(ws->files);
    free(ws->slots);
    free(ws->dir);
    memset(ws, 0, sizeof(*ws));
}
