/*
 * load_quant.c - quantizing at load (qwenc_model_params.quant, `qwenc ... --quant TYPE`).
 *
 * The bound model (a checkpoint directory, or a .gguf, which is then requantized) is converted into the tensors
 * `qwenc quantize --type TYPE` would write: gguf_save.c's plan, with llama.cpp's tensor names, the converter's
 * transformations, llama-quantize's per-tensor types and qwenc's Q8_0 floor for the fragile tensors
 * (gguf_map.h), and the reference quantizers of tensor/quant.h. The tensors are held in one owned buffer
 * (qw_converted) and the model is bound again from them exactly as from that file (gguf_bind.c). So a model
 * quantized at load holds the bytes of the GGUF written from the same source and computes the same logits.
 *
 * A synthetic model (qwenc_model_synth) is converted the same way, its rows from synth's generator: on the CPU it
 * then holds the bytes `qwenc synth` writes. On a GPU (dev) the tensors that are not F32 are made in device memory
 * as random weights of their types and sizes, and the host keeps only their addresses, in a reserved mapping
 * never written (a stray read gets zeros, not a fault): how a model larger than the host's memory is measured.
 *
 * Memory: the buffer is allocated once and its pages are committed as the tensors are written; after each
 * batch of rows, the whole pages of the mapped source rows it read are released (madvise), so the peak stays
 * near the converted size plus one conversion batch (~64 MiB of f32 and the source rows behind it; a tensor
 * whose rows the converter reorders keeps its source pages until it is done).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda/cuda.h"
#include "models/model.h"

/* 1 when [p, p+n) lies inside one of the model's mapped files. Views may also point into buffers made at load
 * (gathered GGUF rows), whose pages must never be dropped: anonymous memory would read back as zeros. */
static int in_mapping(const qwenc_model *m, const void *p, size_t n) {
    const uint8_t *a = p;
    for (int i = 0; i <= m->ws.n_files; i++) {
        const qw_mapfile *f = i < m->ws.n_files ? &m->ws.files[i] : m->gguf ? &m->gguf->file : NULL;
        if (f && f->data && a >= f->data && n <= f->size && a - f->data <= (ptrdiff_t)(f->size - n)) return 1;
    }
    return 0;
}

/* Release source pages already converted (a later tensor reading them again faults them back in). */
static void release(const void *data, size_t bytes, void *user) {
    if (in_mapping(user, data, bytes)) qw_mapfile_release(data, bytes);
}

static void converted_free(qw_converted *c) {
    if (!c) return;
    free(c->tensors);
    free(c->names);
    free(c->data);
    if (c->keys) munmap(c->keys, c->keys_bytes);
    free(c);
}

/* The rows of tensor t (every dimension but the last). */
static int64_t n_rows(const qw_tensor *t) {
    int64_t r = 1;
    for (int d = 0; d < t->n_dims - 1; d++) r *= t->shape[d];
    return r;
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

qwenc_status qw_model_quantize_at_load(qwenc_model *m, qw_row_gen gen, void *gen_user, qw_backend *dev, uint64_t seed,
                                       char *err, size_t errlen) {
    const qwenc_model_params *mp = &m->params;
    qw_gguf_plan *pl = NULL;
    qwenc_status st = qw_gguf_plan_new(m, mp->quant, mp->n_threads, gen, gen_user, &pl, err, errlen);
    if (st) return st;
    int n = qw_gguf_plan_n_tensors(pl);
    qw_converted *c = qw_calloc(1, sizeof(*c));
    size_t *offset = qw_calloc((size_t)n + 1, sizeof(size_t)); /* in data, or (on the device) in keys */
    if (c) {
        c->tensors = qw_calloc((size_t)n, sizeof(qw_tensor));
        c->names = qw_calloc((size_t)n, 64);
    }
    if (!c || !c->tensors || !c->names || !offset) {
        st = qw_err_nomem(err, errlen, m->path, (size_t)n, sizeof(qw_tensor) + 64 + sizeof(size_t));
        goto done;
    }
    for (size_t k = 0; mp->quant[k] && k + 1 < sizeof(c->type); k++) c->type[k] = (char)toupper((unsigned char)mp->quant[k]);
    c->n_tensors = n;
    size_t host_end = 0, dev_end = 0;
    for (int i = 0; i < n; i++) {
        qw_tensor t = qw_gguf_plan_tensor(pl, i);
        size_t bytes = qw_type_row_size(t.type, qw_tensor_nelem(&t)), *end = dev && t.type != QW_TYPE_F32 ? &dev_end : &host_end;
        offset[i] = *end;
        *end += (bytes + 63) & ~(size_t)63;
        c->n_bytes += bytes;
    }
    size_t cap = (host_end + QW_HUGE_PAGE_BYTES - 1) / QW_HUGE_PAGE_BYTES * QW_HUGE_PAGE_BYTES; /* whole pages */
    c->data = qw_aligned_alloc(QW_HUGE_PAGE_BYTES, cap ? cap : QW_HUGE_PAGE_BYTES);
    if (c->data) qw_advise_huge(c->data, cap);
    if (!c->data) {
        st = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: out of memory allocating %zu bytes (%.1f MiB) for the "
                    "weights quantized to %s", m->path, cap, (double)cap / 1048576.0, c->type);
        goto done;
    }
    if (dev_end) {
        void *k = mmap(NULL, dev_end, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (k == MAP_FAILED) {
            st = qw_err(err, errlen, QWENC_ERR_NOMEM, "%s: cannot reserve %.1f GiB of addresses for the weights on the "
                        "device", m->path, (double)dev_end / (1 << 30));
            goto done;
        }
        c->keys = k;
        c->keys_bytes = dev_end;
        st = qw_backend_cuda_weights_adopt(dev, c->keys, dev_end, err, errlen);
        if (st) goto done;
    }
    uint64_t done = 0, total = qw_gguf_plan_bytes(pl);
    for (int i = 0; i < n && !st; i++) {
        qw_tensor *t = &c->tensors[i];
        *t = qw_gguf_plan_tensor(pl, i);
        snprintf(c->names + (size_t)i * 64, 64, "%s", t->name);
        t->name = c->names + (size_t)i * 64;
        int64_t rows = n_rows(t), per = qw_gguf_plan_batch_rows(pl, i);
        size_t row_bytes = qw_type_row_size(t->type, t->shape[t->n_dims - 1]);
        if (dev && t->type != QW_TYPE_F32) {
            t->data = c->keys + offset[i];
            qw_backend_cuda_weights_random(dev, t->data, t->type, (size_t)rows * row_bytes, seed ^ name_hash(t->name));
            done += (uint64_t)rows * row_bytes;
            if (mp->progress && mp->progress(t->name, qw_type_name(t->type), i, n, done, total, mp->progress_user))
                st = qw_err(err, errlen, QWENC_ERR_ARG, "%s: loading cancelled while making random weights", m->path);
            continue;
        }
        t->data = c->data + offset[i];
        for (int64_t r0 = 0; r0 < rows && !st; r0 += per) {
            int64_t k = QW_MIN(per, rows - r0);
            st = qw_gguf_plan_rows(pl, i, r0, k, c->data + offset[i] + (size_t)r0 * row_bytes, err, errlen);
            if (st) break;
            qw_gguf_plan_sources(pl, i, r0, k, 0, release, m);
            done += (uint64_t)k * row_bytes;
            if (mp->progress && mp->progress(t->name, qw_type_name(t->type), i, n, done, total, mp->progress_user))
                st = qw_err(err, errlen, QWENC_ERR_ARG, "%s: loading cancelled while quantizing to %s", m->path, c->type);
        }
        qw_gguf_plan_sources(pl, i, 0, rows, 0, release, m); /* the pages batch boundaries split */
    }
done:
    free(offset);
    qw_gguf_plan_free(pl);
    if (st) {
        converted_free(c);
        return st;
    }
    m->conv = c;
    m->params.quant = c->type; /* the caller's string need not outlive the load */
    return qw_gguf_bind_converted(m, err, errlen);
}

void qw_model_converted_free(qwenc_model *m) {
    converted_free(m->conv);
    m->conv = NULL;
}
