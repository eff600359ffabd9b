/*
 * safetensors.h - the tensors of a Hugging Face checkpoint: one `model.safetensors`, or the shards named
 * by `model.safetensors.index.json`, every file memory-mapped, every tensor found by name in O(1).
 *
 * Format (safetensors): u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
 * offsets are relative to the first byte after the header. Every offset, size and dtype is validated
 * against the file so that a truncated or corrupt file is an error naming the file and tensor.
 */
#ifndef QW_SAFETENSORS_H
#define QW_SAFETENSORS_H

#include "core/common.h"
#include "core/mapfile.h"
#include "tensor/tensor.h"

typedef struct {
    char *name;
    qw_tensor t;    /* t.name points at name; t.data into the file mapping */
    int file;       /* index into qw_weightset.files */
} qw_st_entry;

typedef struct {
    char *dir;
    qw_mapfile *files; /* [n_files] */
    int n_files;
    qw_st_entry *entries; /* [n_entries] */
    int n_entries, cap_entries;
    int32_t *slots; /* open-addressing hash of entry indices, -1 empty; [n_slots] */
    size_t n_slots;
} qw_weightset;

/* Open every safetensors file of a checkpoint directory. */
qwenc_status qw_weightset_open_dir(qw_weightset *ws, const char *dir, char *err, size_t errlen);
/* Open one safetensors file (added to ws; ws must be zeroed or already opened). */
qwenc_status qw_weightset_add_file(qw_weightset *ws, const char *path, char *err, size_t errlen);
void qw_weightset_free(qw_weightset *ws);
/* The tensor of that exact name, or NULL. */
const qw_tensor *qw_weightset_find(const qw_weightset *ws, const char *name);
/* The file a tensor was read from (for messages). */
const char *qw_weightset_file_of(const qw_weightset *ws, const qw_tensor *t);

#endif
