/*
 * backend.cc (tests/gpu/emu) - what the emulated kernel files ask of src/cuda/backend.cu, on the host: the op table's
 * state (struct qwc in cuda/cuda_internal.cuh here), its settings, a scratch that grows, counters at zero, and weights
 * that are their host arrays, the 8-bit activations' buffers under backend.cu's rules (q8_state.cuh), cuBLAS's
 * products on the host, one rank.
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
int qwc_pairs_max(const qwc *c) { return c->pairs_max; }
cublasHandle_t qwc_cublas(const qwc *) { return NULL; }
int qwc_capture_spoil(qwc *c) { return c->recording; }

/* the 8-bit activations' buffers in host memory, under backend.cu's rules (q8_state.cuh) */
int qwc_q8_on(const qwc *c) { return c->q8 && c->q8s.buf; }
void *qwc_q8_buf(qwc *c, size_t *bytes) {
    *bytes = c->q8s.buf ? QWC_Q8_BYTES : 0;
    return c->q8s.buf;
}
void qwc_q8_keep(qwc *c, int on) { q8s_keep(c->q8s, on); }
int qwc_q8_same(const qwc *c, const qw_q8a *buf, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    return q8s_same(c->q8s, buf, x, ldx, cols, n_rows);
}
void qwc_q8_note(qwc *c, const qw_q8a *buf, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    q8s_note(c->q8s, buf, x, ldx, cols, n_rows);
}
qw_q8a *qwc_q8_big(qwc *c, size_t bytes) {
    return q8s_big(c->q8s, bytes, c->recording, [](size_t n) { return malloc(n); }, [](void *p) { free(p); });
}
qw_q8a *qwc_q8_for(qwc *c, int64_t n, int64_t row) {
    const int w = q8s_for(qwc_q8_on(c), n, row);
    return w == 1 ? c->q8s.buf : w == 2 ? qwc_q8_big(c, (size_t)(n / 32) * sizeof(qw_q8a)) : NULL;
}
void qwc_q8_made(qwc *c, const float *y, int64_t n) { q8s_made(c->q8s, y, n); }
const qw_q8a *qwc_q8_fresh(const qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    return q8s_fresh(c->q8s, x, ldx, cols, n_rows);
}

/* one rank: the experts are never split here */
int qwc_n_rank(const qwc *) { return 1; }
int qwc_split(const qwc *) { return 0; }
qwc *qwc_rank(qwc *c, int) { return c; }
int qwc_rank_lo(const qwc *, int r, int E) { return r ? E : 0; }
const qw_backend *qwc_backend(qwc *c) { return &c->be; }
void qwc_set_device(const qwc *) {}
}

/* the exchanges of experts split over ranks: not emulated (qwc_split is 0, so nothing calls them) */
[[noreturn]] static void absent(const char *what) {
    fprintf(stderr, "t_cuda_emu: %s is not emulated (tests/gpu/emu/backend.cc)\n", what);
    abort();
}
extern "C" {
void *qwc_ep_buf(qwc *, size_t) { absent("qwc_ep_buf"); }
void qwc_fork(qwc *) { absent("qwc_fork"); }
void qwc_join(qwc *) { absent("qwc_join"); }
void qwc_bcast(qwc *, void *const *, size_t, void *const *, size_t) { absent("qwc_bcast"); }
void qwc_reduce_sum(qwc *, float *const *, size_t) { absent("qwc_reduce_sum"); }
}

/* the pointer tables, kept as the backend keeps its device copies: by key, made once, the backend's own */
typedef std::vector<std::pair<const void *, std::vector<char>>> emu_tables;
static emu_tables &tables_of(qwc *c) {
    if (!c->tables) c->tables = new emu_tables;
    return *(emu_tables *)c->tables;
}
const void *qwc_table_lookup(qwc *c, const void *key, size_t bytes) {
    for (auto &t : tables_of(c))
        if (t.first == key && t.second.size() >= bytes) return t.second.data();
    return NULL;
}
const void *qwc_table(qwc *c, const void *key, const void *contents, size_t bytes) {
    emu_tables &ts = tables_of(c);
    for (auto &t : ts)
        if (t.first == key) {
            t.second.assign((const char *)contents, (const char *)contents + bytes);
            return t.second.data();
        }
    ts.push_back({key, std::vector<char>((const char *)contents, (const char *)contents + bytes)});
    return ts.back().second.data();
}
extern "C" {
int qwc_ple_host(const qwc *) { return 0; }
const void *qwc_host_mapped(qwc *, const void *host, size_t) { return host; }
}

/* cuBLAS's products on the host: C = alpha op(A) op(B) + beta C, column-major, f32 sums in k order (the GPU's order
 * is cuBLAS's own: the tests bound the difference) */
static std::vector<float> emu_rows(const void *p, cudaDataType t, cublasOperation_t op, int rows, int k, int ld,
                                   long long off) {
    std::vector<float> r((size_t)rows * k); /* op(P) [rows][k] row by row */
    for (int i = 0; i < rows; i++)
        for (int l = 0; l < k; l++) {
            const long long e = off + (op == CUBLAS_OP_T ? l + (long long)i * ld : i + (long long)l * ld);
            r[(size_t)i * k + l] = t == CUDA_R_16BF ? qw_bf16_to_f32(((const uint16_t *)p)[e]) : ((const float *)p)[e];
        }
    return r;
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType, int ldc, long long sc, int batch,
                                          cublasComputeType_t, int) {
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (int b = 0; b < batch; b++) {
        /* op(B) [k][n] read as its columns: B^T's rows */
        const std::vector<float> a = emu_rows(A, at, ta, m, k, lda, b * sa);
        const cublasOperation_t tbt = tb == CUBLAS_OP_T ? CUBLAS_OP_N : CUBLAS_OP_T;
        const std::vector<float> bt_ = emu_rows(B, bt, tbt, n, k, ldb, b * sb);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float *x = &a[(size_t)i * k], *y = &bt_[(size_t)j * k];
                float acc = 0;
                for (int l = 0; l < k; l++) acc += x[l] * y[l];
                float *c = (float *)C + b * sc + i + (long long)j * ldc;
                *c = be != 0.0f ? al * acc + be * *c : al * acc;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the backend as tests/gpu/t_cuda_ops.c makes it (t_cuda_ops_emu): the op files' table as backend.cu's
 * qwc_op_table makes it, on the reference backend's host memory */
extern "C" {
int qw_cuda_available(char *desc, size_t n) {
    snprintf(desc, n, "none: the CUDA backend's kernels emulated on CPU threads (tests/gpu/emu)");
    return 1;
}
/* memory: the reference's host memory; what writes it counts as a write, as backend.cu's do (qwc_q8_fresh) */
static void *emu_alloc(const qw_backend *, size_t bytes, qw_mem_kind kind) {
    QWC_WROTE();
    return qw_backend_ref()->alloc(qw_backend_ref(), bytes, kind);
}
static void emu_upload(const qw_backend *, void *dst, const void *src, size_t n) {
    QWC_WROTE();
    qw_backend_ref()->upload(qw_backend_ref(), dst, src, n);
}
static void emu_copy(const qw_backend *, void *dst, const void *src, size_t n) {
    QWC_WROTE();
    qw_backend_ref()->copy(qw_backend_ref(), dst, src, n);
}
static void emu_zero(const qw_backend *, void *p, size_t n) {
    QWC_WROTE();
    qw_backend_ref()->zero(qw_backend_ref(), p, n);
}
static void emu_release(qw_backend *be) {
    qwc *c = qwc_of(be);
    free(c->scratch);
    free(c->q8s.buf);
    free(c->q8s.big);
    delete (emu_tables *)c->tables;
    free(c);
}
qwenc_status qw_backend_cuda_new(int, qw_backend **out, char *, size_t) {
    qwc *c = (qwc *)calloc(1, sizeof(qwc));
    if (!c) abort();
    qw_backend &t = c->be;
    t.name = "cuda (emulated)";
    qwc_ops_fill(&t);
    qwc_attn_fill(&t);
    qwc_moe_fill(&t);
    qwc_model_ops_fill(&t);
    const qw_backend *h = qw_backend_ref();
    t.alloc = emu_alloc, t.free = h->free, t.upload = emu_upload, t.download = h->download, t.copy = emu_copy;
    t.zero = emu_zero, t.sync = h->sync;
    t.release = emu_release;
    c->dr_chunk = QWC_DR_CHUNK_MIN;
    c->pairs_max = QWC_PAIRS_MAX;
    c->q8s.buf = (qw_q8a *)malloc(QWC_Q8_BYTES);
    *out = &t;
    return QWENC_OK;
}
void qw_backend_cuda_set_dr_chunk(qw_backend *be, int min_tok) { qwc_of(be)->dr_chunk = min_tok; }
void qw_backend_cuda_set_q8_activations(qw_backend *be, int on) { qwc_of(be)->q8 = on != 0; }
}

/* ---- the rest of src/cuda/cuda.h, for the library linked with the emulation (t_model_emu: the fixtures on the
 * emulated backend): one device of ample memory, weights uploaded when first read (here: read where they are), no
 * split over ranks */
extern "C" {
void qw_backend_cuda_memory(const qw_backend *, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = (size_t)64 << 30;
}
double qw_backend_cuda_read_bandwidth(const qw_backend *) { return 1e9; }
qwenc_status qw_backend_cuda_weights_adopt(qw_backend *, const void *, size_t, char *err, size_t errlen) {
    snprintf(err, errlen, "weights_adopt: not emulated");
    return QWENC_ERR_UNSUPPORTED;
}
void qw_backend_cuda_weights_random(qw_backend *, const void *, qw_type, size_t, uint64_t) {
    absent("qw_backend_cuda_weights_random");
}
void qw_backend_cuda_set_ple_host(qw_backend *, int) {}
qwenc_status qw_backend_cuda_split(qw_backend *, const int *, int n, const double *, char *err, size_t errlen) {
    if (n <= 1) return QWENC_OK;
    snprintf(err, errlen, "--gpus: the emulation has one device");
    return QWENC_ERR_UNSUPPORTED;
}
qwenc_status qw_backend_cuda_split_layers(qw_backend *, const int *, int n, const int *, int, char *err,
                                          size_t errlen) {
    if (n <= 1) return QWENC_OK;
    snprintf(err, errlen, "--gpus: the emulation has one device");
    return QWENC_ERR_UNSUPPORTED;
}
int qw_backend_cuda_ranks(const qw_backend *) { return 1; }
void qw_backend_cuda_rank_info(const qw_backend *, int, int *device, size_t *free_bytes, size_t *total_bytes,
                               size_t *weight_bytes, int *first_layer, int *n_layers) {
    *device = 0, *free_bytes = *total_bytes = (size_t)64 << 30, *weight_bytes = 0;
    *first_layer = *n_layers = 0;
}
double qw_backend_cuda_exchange_us(qw_backend *, int, int, int, int) { return 0; }
}
