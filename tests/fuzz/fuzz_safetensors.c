/*
 * fuzz_safetensors.c - fuzz target: one safetensors file (formats/safetensors.c: the header length, the
 * JSON header, every entry's dtype, shape and data_offsets).
 *
 * Properties: a file is either refused with a message naming it, or every tensor it lists is found by
 * name, has a shape whose element count fits in int64, and (for a dtype qwenc reads) data that lies inside
 * the file and is exactly as long as the shape says.
 */
#include "fuzz_util.h"
#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_as_file(data, size);
    char err[1024] = "";
    qw_weightset ws;
    memset(&ws, 0, sizeof(ws));
    qwenc_status st = qw_weightset_add_file(&ws, path, err, sizeof(err));
    fz_note("safetensors", st, err);
    if (st) {
        FZ_CHECK_ERR(st, err, path);
        qw_weightset_free(&ws);
        return 0;
    }
    FZ_CHECK(ws.n_files == 1 && ws.files[0].size == size, "mapped %zu bytes of %zu", ws.files[0].size, size);
    const uint8_t *lo = ws.files[0].data, *hi = lo + size;
    for (int i = 0; i < ws.n_entries; i++) {
        const qw_st_entry *e = &ws.entries[i];
        FZ_CHECK(qw_weightset_find(&ws, e->name) == &e->t, "tensor '%s' not found by name", e->name);
        FZ_CHECK(e->t.n_dims >= 0 && e->t.n_dims <= QW_MAX_DIMS, "tensor '%s': %d dims", e->name, e->t.n_dims);
        uint64_t nel = 1;
        for (int d = 0; d < e->t.n_dims; d++) {
            FZ_CHECK(e->t.shape[d] >= 0, "tensor '%s': negative dimension", e->name);
            FZ_CHECK(e->t.shape[d] == 0 || nel <= (uint64_t)INT64_MAX / (uint64_t)e->t.shape[d],
                     "tensor '%s': element count overflows", e->name);
            nel *= (uint64_t)e->t.shape[d];
        }
        size_t es = qw_type_size(e->t.type);
        const uint8_t *p = e->t.data;
        FZ_CHECK(p >= lo + 8 && p <= hi, "tensor '%s': data outside the file", e->name);
        if (es) {
            FZ_CHECK(nel <= (uint64_t)(hi - p) / es, "tensor '%s': %llu elements of %zu bytes pass the end of the file",
                     e->name, (unsigned long long)nel, es);
            if (nel) {
                volatile uint8_t x = p[0] ^ p[nel * es - 1];
                (void)x;
            }
        }
        FZ_CHECK(strcmp(qw_weightset_file_of(&ws, &e->t), path) == 0, "file_of '%s'", e->name);
    }
    qw_weightset_free(&ws);
    return 0;
}
