/*
 * backend.cc (tests/gpu/emu) - what the emulated kernel files ask of src/cuda/backend.cu, on the host: the op table's
 * state (struct qwc in cuda/cuda_internal.cuh here), its settings, a scratch that grows, counters at zero, and weights
 * that are their host arrays, no 8-bit activations' buffers. What quant.cu does (products, gathers; its kernels are
 * not emulated) is done on the host by the reference's definitions, and its one-launch paths decline.
 */
#include "cuda/ops_internal.cuh"

qwc *qwc_of(const qw_backend *be) { return (qwc *)(void *)be; }
const void *qwc_weight(qwc *, const void *host, size_t) { return host; }
qw_tensor qwc_tensor(qwc *, const qw_tensor *t) { return *t; }
int qwc_qsa_reserve(qwc *c, int blocks) {
    if (blocks <= c->qsa_blocks) return 0;
    c->qsa_blocks = blocks;
    return 1;
}
int qwc_qsa_max_blocks(const qwc *c) { return c->qsa_blocks; }

extern "C" {
void qwc_die(const char *file, int line, const char *what, const char *msg) {
    fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, msg);
    abort();
}
cudaStream_t qwc_stream(const qwc *) { return 0; }
int qwc_dr_chunk_min(const qwc *c) { return c->dr_chunk; }
int qwc_recording(const qwc *c) { return c->recording; }
unsigned *qwc_counts(qwc *c, int n) { return n <= 4096 ? c->counts : NULL; }
/* grows as the backend's does; new bytes are NaN, as a reused device buffer holds what it held */
void *qwc_scratch(qwc *c, size_t bytes) {
    if (bytes > c->scratch_bytes) {
        free(c->scratch);
        c->scratch = (float *)malloc(bytes);
        if (!c->scratch) abort();
        c->scratch_bytes = bytes;
        for (size_t i = 0; i < bytes / sizeof(float); i++) c->scratch[i] = NAN;
    }
    return c->scratch;
}
/* the buffer recorded steps use: here the same growing scratch (nothing is recorded) */
void *qwc_keep_buf(qwc *c, size_t bytes) { return qwc_scratch(c, bytes); }
/* no 8-bit activations' buffers: the kernels that could round their output into one do not */
qw_q8a *qwc_q8_for(qwc *, int64_t, int64_t) { return NULL; }
void qwc_q8_made(qwc *, const float *, int64_t) {}
const qw_q8a *qwc_q8_fresh(const qwc *, const float *, int64_t, int64_t, int64_t) { return NULL; }
void qwc_q8_keep(qwc *, int) {}
}

/* quant.cu's products, by the reference backend (kernels/ref.c) on the host: the emulation checks the ops around
 * them, not the products (t_cuda_quant does, on a GPU); the one-launch paths say they do not take the call */
extern "C" {
void qwc_matmul(qwc *, float *y, const qw_tensor *w, const float *x, int n_tok) {
    qw_backend_ref()->matmul(qw_backend_ref(), y, w, x, n_tok);
}
void qwc_get_rows(qwc *, float *y, const qw_tensor *w, const int32_t *ids, int n) {
    qw_backend_ref()->get_rows(qw_backend_ref(), y, w, ids, n);
}
int qwc_matmul_group(qwc *, const qw_tensor *, float *const *, int, const float *) { return 0; }
int qwc_hc_up_read(qwc *, float *, const qw_tensor *, const float *, const float *, float *, int, int, qw_q8a *) {
    return 0;
}
int qwc_ple_host(const qwc *) { return 0; }
}


/* the pointer tables (kept as the backend keeps its device copies: by key, made once), and the n-gram table's rows
 * dequantized on the host as quant.cu's gather does on the device */
static std::vector<std::pair<const void *, std::vector<char>>> tables;
const void *qwc_table_lookup(qwc *, const void *key, size_t bytes) {
    for (auto &t : tables)
        if (t.first == key && t.second.size() == bytes) return t.second.data();
    return NULL;
}
const void *qwc_table(qwc *, const void *key, const void *contents, size_t bytes) {
    for (auto &t : tables)
        if (t.first == key) {
            t.second.assign((const char *)contents, (const char *)contents + bytes);
            return t.second.data();
        }
    tables.push_back({key, std::vector<char>((const char *)contents, (const char *)contents + bytes)});
    return tables.back().second.data();
}
extern "C" {
const void *qwc_host_mapped(qwc *, const void *host, size_t) { return host; }
void qwc_gather_rows(qwc *, float *y, const void *const *chunk_data, qw_type type, int64_t dh, int n_chunks,
                     int64_t chunk_rows, const int64_t *rows, int64_t n) {
    const size_t rb = qw_type_row_size(type, dh);
    for (int64_t i = 0; i < n; i++) {
        const int64_t c = rows[i] / chunk_rows, r = rows[i] % chunk_rows;
        if (c >= n_chunks) qwc_die(__FILE__, __LINE__, "qwc_gather_rows", "a row past the table");
        qw_type_traits_of(type)->to_float((const char *)chunk_data[c] + r * rb, y + i * dh, dh);
    }
}
}

/* ---- the backend as tests/gpu/t_cuda_ops.c makes it (t_cuda_ops_emu): the op files' table as backend.cu's
 * qwc_op_table makes it, on the reference backend's host memory */
extern "C" {
int qwc_q8_on(const qwc *c) { return c->q8_on; }
int qw_cuda_available(char *desc, size_t n) {
    snprintf(desc, n, "none: the CUDA backend's kernels emulated on CPU threads (tests/gpu/emu)");
    return 1;
}
static void emu_release(qw_backend *be) {
    qwc *c = qwc_of(be);
    free(c->scratch);
    free(c);
}
qwenc_status qw_backend_cuda_new(int, qw_backend **out, char *, size_t) {
    qwc *c = (qwc *)calloc(1, sizeof(qwc));
    if (!c) abort();
    qw_backend &t = c->be;
    t.name = "cuda (emulated)";
    qwc_ops_fill(&t);
    qwc_attn_fill(&t);
    qwc_model_ops_fill(&t);
    const qw_backend *h = qw_backend_ref();
    t.alloc = h->alloc, t.free = h->free, t.upload = h->upload, t.download = h->download, t.copy = h->copy;
    t.zero = h->zero, t.sync = h->sync;
    t.release = emu_release;
    c->dr_chunk = QWC_DR_CHUNK_MIN;
    *out = &t;
    return QWENC_OK;
}
void qw_backend_cuda_set_dr_chunk(qw_backend *be, int min_tok) { qwc_of(be)->dr_chunk = min_tok; }
void qw_backend_cuda_set_q8_activations(qw_backend *be, int on) { qwc_of(be)->q8_on = on; }
}
