/*
 * fuzz_st_index.c - fuzz target: model.safetensors.index.json, the shard index of a sharded checkpoint
 * (formats/safetensors.c: weight_map, shard names, every tensor in the shard it is said to be in).
 *
 * A scratch directory holds links to the four shards of tests/fixtures/qwen3_next; each input is written
 * there as the index and the directory opened. Properties: either a message naming the index, or every
 * tensor the index names is found, in the file it names.
 */
#include <dirent.h>

#include "fuzz_util.h"
#include "formats/safetensors.h"

static char dir[512], index_path[600];

static void cleanup(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char p[1200];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void setup(void) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/qwenc-fuzz-index-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(cleanup);
    for (int i = 1; i <= 4; i++) {
        char rel[128], link[700], target[4096];
        snprintf(rel, sizeof(rel), "tests/fixtures/qwen3_next/model-%05d-of-00004.safetensors", i);
        if (!realpath(fz_path(rel), target)) {
            fprintf(stderr, "fuzz_st_index: %s is missing (run from the repository root or set QWENC_ROOT)\n", rel);
            abort();
        }
        snprintf(link, sizeof(link), "%s/model-%05d-of-00004.safetensors", dir, i);
        if (symlink(target, link) != 0) {
            perror("symlink");
            abort();
        }
    }
    snprintf(index_path, sizeof(index_path), "%s/model.safetensors.index.json", dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) setup();
    FILE *f = fopen(index_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(index_path);
        abort();
    }
    char err[1024] = "";
    qw_weightset ws;
    qwenc_status st = qw_weightset_open_dir(&ws, dir, err, sizeof(err));
    fz_note("index", st, err);
    if (st) {
        FZ_CHECK_ERR(st, err, dir);
    } else {
        FZ_CHECK(ws.n_files >= 1 && ws.n_files <= 4, "%d files", ws.n_files);
        for (int i = 0; i < ws.n_entries; i++)
            FZ_CHECK(qw_weightset_find(&ws, ws.entries[i].name) == &ws.entries[i].t, "tensor '%s' not found",
                     ws.entries[i].name);
    }
    qw_weightset_free(&ws);
    return 0;
}
