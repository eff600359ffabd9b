/*
 * mapfile.h - read-only memory mapping of a whole file. Weights are used straight from the mapping:
 * the page cache holds them and the process never copies them.
 */
#ifndef QW_MAPFILE_H
#define QW_MAPFILE_H

#include <sys/stat.h>

#include "core/common.h"

typedef struct {
    char *path;
    const uint8_t *data; /* [size] */
    size_t size;
} qw_mapfile;

qwenc_status qw_mapfile_open(qw_mapfile *mf, const char *path, char *err, size_t errlen);
void qw_mapfile_close(qw_mapfile *mf);
/* Drop the whole pages inside [p, p + n) of a mapping from the process's resident memory (after their data
 * was copied elsewhere); a later read faults them back in from the file. Advice only: nothing can fail. */
void qw_mapfile_release(const void *p, size_t n);

/* Ask the kernel to back [p, p + n) with 2 MiB pages (transparent huge pages; for a file mapping, where the
 * filesystem keeps large folios in the page cache): decode streams every weight once per token, and with
 * 4 KiB pages a page-table walk every 4 KiB was a sizeable part of it. Advice only: nothing can fail, and
 * where the kernel cannot do it nothing changes. */
void qw_advise_huge(void *p, size_t n);
#define QW_HUGE_PAGE_BYTES ((size_t)2 << 20) /* the page size qw_advise_huge asks for (x86-64, AArch64 4K) */

/* The opposite for tensors read a few rows at a time (the token embedding, the PLE table): 4 KiB pages and
 * no readahead (MADV_RANDOM), so a row looked up reads 4 KiB from the file rather than 2 MiB or the 128 KiB
 * around it, and so does the page it stays resident in (a model larger than memory keeps paging these).
 * Only the whole pages inside [p, p + n) change. */
void qw_advise_sparse(const void *p, size_t n);

/* Start reading the pages that hold [p, p + n) of a file mapping into the page cache and return without
 * waiting (MADV_WILLNEED), so a read of them soon after finds them there or on their way. Advice only. */
void qw_advise_willneed(const void *p, size_t n);

/* Open a file to read without ever blocking in open() (O_NONBLOCK, cleared once open): a FIFO, device,
 * socket or directory in its place is refused at once with an error naming it and its kind. Returns the
 * descriptor, its stat in *st; -1 with err filled (QWENC_ERR_IO) on failure. */
int qw_open_regular(const char *path, struct stat *st, char *err, size_t errlen);

/* The most a whole-file read takes by default: a tokenizer.json is the largest such file (the largest
 * released ones, 250k-token vocabularies with their merges, are ~35 MB); 256 MiB is 7x that. */
#define QW_READ_FILE_MAX ((size_t)256 << 20)
/* The limit for configuration files (config.json, generation_config.json, tokenizer_config.json,
 * model.safetensors.index.json, chat_template.jinja): those are kilobytes; the largest, a shard index of
 * ~100k tensors, ~10 MB. */
#define QW_READ_CONFIG_MAX ((size_t)64 << 20)

/* Read a whole regular file (qw_open_regular) of at most QW_READ_FILE_MAX bytes into a NUL-terminated heap
 * buffer; *len gets its length. A larger file is refused (QWENC_ERR_FORMAT) before it is read. */
qwenc_status qw_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen);
/* The same with a limit of max bytes. */
qwenc_status qw_read_file_max(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen);

#endif
