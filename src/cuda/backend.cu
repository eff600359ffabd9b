/*
 * backend.cu - the CUDA backend (cuda.h): device memory, the weights' device copies, the op table, graphs.
 *
 * One device, one stream: every op is a kernel (or a cuBLAS call) on it, so ops are ordered without
 * synchronisation and the host waits only in sync and download. Weights reach the ops as host views (the
 * model is bound on the host, its big matrices mapped from the file): the first op that reads a weight
 * uploads it and keeps the device copy, keyed by its host address (weights never change after load), so
 * the first forward step uploads the model and later steps find every weight on the device. A step's ops
 * can be recorded as a CUDA graph (graph_begin / graph_end) and replayed: every op reads its position from
 * the step in device memory, and the weight lookups happen while recording.
 */
#include <pthread.h>
#include <stdio.h>
#if QWC_NCCL
#include <nccl.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"
#include "cuda/ops_internal.cuh"
#include "cuda/q8_state.cuh"

extern "C" {
#include "core/common.h"
#include "cuda/cuda.h"
}

void qwc_die(const char *file, int line, const char *what, const char *msg) {
    fprintf(stderr, "qwenc: %s:%d: CUDA error in %s: %s\n", file, line, what, msg);
    abort();
}

/* a weight's device copy, by host address */
typedef struct {
    const void *host;
    void *dev;
    size_t bytes, pad; /* dev - pad is the allocation (a random part made on the GPU: aligned as in its tensor) */
    int table;         /* made by qwc_table (device pointers), not a weight's bytes */
} wentry;

/* a tensor of random weights to be made where it is read (qw_backend_cuda_weights_random on a split backend) */
typedef struct {
    const uint8_t *key;
    size_t bytes;
    qw_type type;
    uint64_t seed;
} rspec;

#define MAX_PINNED 64 /* host buffers pinned and mapped (qwc_host_mapped) */

struct qwc {
    qw_backend be; /* first: the table handed out is a pointer to this member */
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *scratch;
    size_t scratch_bytes;
    pthread_mutex_t lock; /* the weight map (sessions on several threads share a model) */
    wentry *map;
    size_t map_cap, map_n;
    size_t weight_bytes;
    int capturing, capture_spoiled;
    int qsa_blocks;
    /* weights made on the device (qw_backend_cuda_weights_adopt): host addresses [region_key, + region_bytes)
     * stand for region_dev at the same offset; the host never holds those bytes */
    const uint8_t *region_key;
    uint8_t *region_dev;
    size_t region_bytes;
    /* split (qw_backend_cuda_split) before the weights were adopted: the range is not allocated; each GPU makes the
     * parts of its tensors it reads (lazy), from the tensors' seeds (specs, on rank 0, sorted by key) */
    int lazy, specs_sorted;
    rspec *specs;
    size_t n_specs, cap_specs;
    int ple_host;  /* the n-gram table read from host memory (qw_backend_cuda_set_ple_host) */
    size_t mapped_bytes; /* host memory pinned and mapped for the device: n_pinned buffers */
    uint8_t *pinned[MAX_PINNED];
    int n_pinned;
    int q8;        /* quantized weights meet 8-bit activations */
    int dr_chunk;  /* the delta rule's chunked form for calls of at least this many tokens (0: never) */
    int pairs_max; /* the MoE's rows up to which each pair is its own product */
    unsigned *counts; /* QWC_COUNTS zeroed counters in device memory (qwc_counts) */
    qwc_q8_state q8s; /* their buffers and what they hold (q8_state.cuh) */
    /* the routed experts split over ranks (qw_backend_cuda_split): rank[0] is this backend, the others are backends
     * of their own (root: rank 0) that hold their experts and run them; copies: some ranks share a device, and
     * the exchanges are device copies (NCCL takes one rank a device) */
    int n_rank, copies;
    qwc *rank[QWC_MAX_RANKS];
    double cum[QWC_MAX_RANKS + 1]; /* rank r's experts: [E cum[r], E cum[r + 1]) rounded */
    qwc *root;
#if QWC_NCCL
    ncclComm_t comm[QWC_MAX_RANKS];
#endif
    /* or, layers (qw_backend_cuda_split_layers), the ranks hold layers: layer il's weights, state and ops are rank
     * stage[il]'s, the rest rank 0's; cur is the rank ops go to now. One chain of work: when cur changes, the new
     * rank's stream waits for the old one's work (hop), so every op comes after every op issued before it */
    int layers, cur, n_stage;
    int *stage; /* [n_stage] */
    cudaEvent_t ev;   /* this rank's fork and join point (rank 0: the fork, a peer: its join) */
    void *ep_buf;     /* this rank's exchange buffers (qwc_ep_buf), grow-only: */
    size_t ep_bytes;
    void *kb_buf;     /* a recorded step's own scratch (qwc_keep_buf), grow-only: */
    size_t kb_bytes;
    void **ep_old;    /* the buffers both outgrew, kept for the graphs recorded with them */
    int n_ep_old;
};

#define QWC_COUNTS 4096

static qwc *C(const qw_backend *be) { return (qwc *)be; }

/* the chain of work moves to rank r (layers split: a no-op otherwise), r's device made current. quiet: errors are
 * left to the caller (the end of a recording that CUDA may have invalidated) */
static void hop(qwc *c, int r, int quiet = 0) {
    if (!c->layers) return;
    if (r != c->cur) {
        qwc *a = c->rank[c->cur], *b = c->rank[r];
        QWC_CHECK(cudaSetDevice(a->device));
        cudaError_t e = cudaEventRecord(a->ev, a->stream);
        QWC_CHECK(cudaSetDevice(b->device));
        if (e == cudaSuccess) e = cudaStreamWaitEvent(b->stream, a->ev, 0);
        if (!quiet) QWC_CHECK(e);
        c->cur = r;
    }
    QWC_CHECK(cudaSetDevice(c->rank[r]->device));
}

qwc *qwc_of(const qw_backend *be) {
    qwc *c = C(be);
    if (!c->layers) return c;
    qwc *p = c->rank[c->cur];
    QWC_CHECK(cudaSetDevice(p->device)); /* the calling thread's */
    return p;
}

/* a graph is being recorded on this backend or, for a rank, on its root */
static int recording(const qwc *c) { return c->capturing || (c->root && c->root->capturing); }

const qw_backend *qwc_backend(qwc *c) { return &c->be; }

cudaStream_t qwc_stream(const qwc *c) { return c->stream; }
cublasHandle_t qwc_cublas(const qwc *c) { return c->cublas; }

int qwc_dr_chunk_min(const qwc *c) { return c->dr_chunk; }
int qwc_pairs_max(const qwc *c) { return c->pairs_max; }
unsigned *qwc_counts(qwc *c, int n) { return n <= QWC_COUNTS ? c->counts : NULL; }

int qwc_recording(const qwc *c) { return recording(c); }

/* the 8-bit activations' buffers (q8_state.cuh) */
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
    return q8s_big(
        c->q8s, bytes, recording(c),
        [](size_t n) {
            void *p = NULL;
            if (cudaMalloc(&p, n) == cudaSuccess) return p;
            (void)cudaGetLastError();
            return (void *)NULL;
        },
        [c](void *p) {
            QWC_CHECK(cudaStreamSynchronize(c->stream));
            QWC_CHECK(cudaFree(p));
        });
}
qw_q8a *qwc_q8_for(qwc *c, int64_t n, int64_t row) {
    const int w = q8s_for(qwc_q8_on(c), n, row);
    return w == 1 ? c->q8s.buf : w == 2 ? qwc_q8_big(c, (size_t)(n / 32) * sizeof(qw_q8a)) : NULL;
}
void qwc_q8_made(qwc *c, const float *y, int64_t n) { q8s_made(c->q8s, y, n); }
const qw_q8a *qwc_q8_fresh(const qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    return q8s_fresh(c->q8s, x, ldx, cols, n_rows);
}

int qwc_capture_spoil(qwc *c) {
    if (!recording(c)) return 0;
    (c->root ? c->root : c)->capture_spoiled = 1;
    return 1;
}

/* n bytes of device memory for a buffer that grows (what: its name in the message when there is none) */
static void *grow_alloc(size_t n, const char *what) {
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        char m[128];
        snprintf(m, sizeof(m), "out of device memory for %zu bytes of %s", n, what);
        qwc_die(__FILE__, __LINE__, "cudaMalloc", m);
    }
    return p;
}

void *qwc_scratch(qwc *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return c->scratch;
    if (recording(c)) qwc_die(__FILE__, __LINE__, "qwc_scratch", "the scratch must grow while a graph is recorded");
    QWC_CHECK(cudaStreamSynchronize(c->stream));
    if (c->scratch) QWC_CHECK(cudaFree(c->scratch));
    size_t n = bytes + bytes / 4;
    c->scratch = grow_alloc(n, "scratch");
    c->scratch_bytes = n;
    return c->scratch;
}

/* ---------------------------------------------------------------- weights */

static size_t slot_of(const qwc *c, const void *host) {
    uint64_t h = (uint64_t)(uintptr_t)host * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (c->map_cap - 1);
}

static int map_grow(qwc *c) {
    size_t cap = c->map_cap ? 2 * c->map_cap : 4096;
    wentry *m = (wentry *)qw_calloc(cap, sizeof(wentry));
    if (!m) return -1;
    wentry *old = c->map;
    size_t old_cap = c->map_cap;
    c->map = m;
    c->map_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].host) {
            size_t s = slot_of(c, old[i].host);
            while (c->map[s].host) s = (s + 1) & (cap - 1);
            c->map[s] = old[i];
        }
    free(old);
    return 0;
}

/* the entry of key (a free one when absent), under the lock */
static wentry *entry_of(qwc *c, const void *key) {
    if (c->map_n * 2 >= c->map_cap && map_grow(c)) qwc_die(__FILE__, __LINE__, "qwc_weight", "out of host memory");
    size_t s = slot_of(c, key);
    while (c->map[s].host && c->map[s].host != key) s = (s + 1) & (c->map_cap - 1);
    return &c->map[s];
}

/* the device address of a key inside the adopted range, else NULL */
static void *in_region(const qwc *c, const void *key) {
    const uint8_t *k = (const uint8_t *)key;
    return c->region_dev && k >= c->region_key && k < c->region_key + c->region_bytes
               ? c->region_dev + (k - c->region_key)
               : NULL;
}

static int spec_cmp(const void *a, const void *b) {
    const uint8_t *x = ((const rspec *)a)->key, *y = ((const rspec *)b)->key;
    return x < y ? -1 : x > y;
}

/* The random tensor holding key when the weights are made where they are read (rank 0's list), else NULL */
static const rspec *lazy_spec(qwc *c, const void *key) {
    qwc *o = c->root ? c->root : c;
    const uint8_t *k = (const uint8_t *)key;
    if (!o->lazy || k < o->region_key || k >= o->region_key + o->region_bytes) return NULL;
    if (!o->specs_sorted) { /* rank 0's thread made them all before the first forward */
        qsort(o->specs, o->n_specs, sizeof(rspec), spec_cmp);
        o->specs_sorted = 1;
    }
    size_t lo = 0, hi = o->n_specs; /* the last spec with key <= k */
    while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        if (o->specs[mid].key <= k) lo = mid;
        else hi = mid;
    }
    if (!o->n_specs || o->specs[lo].key > k || k >= o->specs[lo].key + o->specs[lo].bytes)
        qwc_die(__FILE__, __LINE__, "qwc_weight", "a weight in the random range that no random tensor holds");
    return &o->specs[lo];
}

/* The device copy of `bytes` of `contents` kept under `key`, made when absent, shorter, or of the other kind (a
 * weight's bytes against a table), so that a key reused by the host (memory freed and handed out again) never
 * reads what an earlier owner of that address left there as the other kind */
static const void *stored(qwc *c, const void *key, const void *contents, size_t bytes, int table) {
    if (!key) return NULL;
    if (!table)
        if (void *r = in_region(c, key)) return r;
    pthread_mutex_lock(&c->lock);
    wentry *e = entry_of(c, key);
    if (!e->host || e->bytes < bytes || e->table != table) {
        if (recording(c)) qwc_die(__FILE__, __LINE__, "qwc_weight", "a weight first read while a graph is recorded");
        const rspec *r = lazy_spec(c, key);
        const size_t off = r ? (size_t)((const uint8_t *)key - r->key) : 0, pad = off % 4;
        void *a = NULL;
        if (cudaMalloc(&a, (bytes ? bytes : 1) + (r ? 4 : 0)) != cudaSuccess) {
            char m[128];
            snprintf(m, sizeof(m), "out of device memory %s %zu bytes of weights (%.1f GiB already there)",
                     r ? "making" : "uploading", bytes, (double)c->weight_bytes / (1 << 30));
            qwc_die(__FILE__, __LINE__, "cudaMalloc", m);
        }
        uint8_t *d = (uint8_t *)a + pad;
        if (r) { /* made here: each part's bytes as its whole tensor has them, at the tensors' alignment (a read may
                  * span neighbouring tensors; bytes between them are zeros) */
            const uint8_t *k0 = (const uint8_t *)key, *k1 = k0 + bytes;
            const qwc *o = c->root ? c->root : c;
            QWC_WROTE();
            QWC_CHECK(cudaMemsetAsync(d, 0, bytes, c->stream));
            for (const rspec *q = r; q < o->specs + o->n_specs && q->key < k1; q++) {
                const uint8_t *p0 = q->key > k0 ? q->key : k0, *p1 = q->key + q->bytes < k1 ? q->key + q->bytes : k1;
                if (p1 > p0) qwc_fill_random(c, d + (p0 - k0), q->type, (size_t)(p1 - p0), q->seed, (size_t)(p0 - q->key));
            }
        } else {
            /* on the backend's stream, so every op issued later reads it complete: a plain cudaMemcpy from pageable
             * memory returns once the bytes are staged, and the non-blocking stream does not wait for its DMA */
            QWC_WROTE();
            QWC_CHECK(cudaMemcpyAsync(d, contents, bytes, cudaMemcpyHostToDevice, c->stream));
        }
        if (e->host) {
            QWC_CHECK(cudaFree((uint8_t *)e->dev - e->pad));
            c->weight_bytes -= e->bytes;
        } else {
            c->map_n++;
        }
        e->host = key;
        e->dev = d;
        e->pad = pad;
        e->bytes = bytes;
        e->table = table;
        c->weight_bytes += bytes;
    }
    void *d = e->dev;
    pthread_mutex_unlock(&c->lock);
    return d;
}

const void *qwc_weight(qwc *c, const void *host, size_t bytes) { return stored(c, host, host, bytes, 0); }

const void *qwc_table(qwc *c, const void *key, const void *contents, size_t bytes) {
    return stored(c, key, contents, bytes, 1);
}

int qwc_ple_host(const qwc *c) { return c->ple_host; }

const void *qwc_host_mapped(qwc *c, const void *host, size_t bytes) {
    if (!host) return NULL;
    if (void *r = in_region(c, host)) return r; /* made on the device: already there */
    if (lazy_spec(c, host)) return qwc_weight(c, host, bytes); /* made on the device where it is read */
    pthread_mutex_lock(&c->lock);
    if (recording(c)) qwc_die(__FILE__, __LINE__, "qwc_host_mapped", "host memory first mapped while a graph is recorded");
    if (c->n_pinned == MAX_PINNED) qwc_die(__FILE__, __LINE__, "qwc_host_mapped", "more than 64 host ranges to pin");
    /* a pinned copy, not the file's pages pinned in place: those pages also hold the neighbouring weights, which
     * are then copied to the device from memory CUDA knows only in part */
    void *p = NULL, *d = NULL;
    cudaError_t r = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped);
    if (r != cudaSuccess) {
        char m[200];
        snprintf(m, sizeof(m), "%.2f GiB of pinned host memory for the n-gram table (%.2f GiB pinned already): %s",
                 (double)bytes / (1 << 30), (double)c->mapped_bytes / (1 << 30), cudaGetErrorString(r));
        qwc_die(__FILE__, __LINE__, "cudaHostAlloc", m);
    }
    memcpy(p, host, bytes);
    QWC_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    c->pinned[c->n_pinned++] = (uint8_t *)p;
    c->mapped_bytes += bytes;
    pthread_mutex_unlock(&c->lock);
    return d;
}

const void *qwc_table_lookup(qwc *c, const void *key, size_t bytes) {
    pthread_mutex_lock(&c->lock);
    wentry *e = entry_of(c, key);
    void *d = e->host && e->table && e->bytes >= bytes ? e->dev : NULL;
    pthread_mutex_unlock(&c->lock);
    return d;
}

int qwc_qsa_reserve(qwc *c, int blocks) { /* the root's: one value for every rank */
    qwc *o = c->root ? c->root : c;
    if (blocks <= o->qsa_blocks) return 0;
    o->qsa_blocks = blocks;
    return 1;
}
int qwc_qsa_max_blocks(const qwc *c) { return (c->root ? c->root : c)->qsa_blocks; }

qw_backend qwc_op_table(void) {
    qw_backend t;
    memset(&t, 0, sizeof(t));
    t.name = "cuda";
    t.host_memory = 0;
    qwc_ops_fill(&t);
    qwc_attn_fill(&t);
    qwc_moe_fill(&t);
    qwc_model_ops_fill(&t);
    return t;
}

static size_t tensor_bytes(const qw_tensor *t) {
    int64_t cols = t->shape[t->n_dims - 1], rows = cols ? qw_tensor_nelem(t) / cols : 0;
    return (size_t)rows * qw_type_row_size(t->type, cols);
}

qw_tensor qwc_tensor(qwc *c, const qw_tensor *t) {
    qw_tensor d = *t;
    d.data = qwc_weight(c, t->data, tensor_bytes(t));
    return d;
}

/* ---------------------------------------------------------------- memory */

/* Memory and copies: on the rank the layer set by ops.h's layer runs on (its device: a layer's state lives with it),
 * on the stream of the chain of work (cudaMemcpyDefault: either side may be another GPU's memory). */
static void *cu_alloc(const qw_backend *be, size_t bytes, qw_mem_kind kind) {
    (void)kind;
    qwc *c = qwc_of(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear it: out of memory is reported to the caller */
        return NULL;
    }
    QWC_WROTE();
    QWC_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
    return p;
}

static void cu_free(const qw_backend *be, void *p) {
    if (!p) return;
    QWC_CHECK(cudaStreamSynchronize(qwc_of(be)->stream));
    cudaPointerAttributes a;
    if (C(be)->layers && cudaPointerGetAttributes(&a, p) == cudaSuccess && a.device >= 0)
        QWC_CHECK(cudaSetDevice(a.device)); /* the GPU it was allocated on (a layer's state) */
    QWC_CHECK(cudaFree(p));
}

static void cu_upload(const qw_backend *be, void *dst, const void *src, size_t n) {
    QWC_WROTE();
    qwc *c = qwc_of(be);
    if (C(be)->n_rank) QWC_CHECK(cudaSetDevice(c->device)); /* a step's first op: the first GPU's thread */
    if (n) QWC_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, c->stream));
}

static void cu_download(const qw_backend *be, void *dst, const void *src, size_t n) {
    if (!n) return;
    qwc *c = qwc_of(be);
    QWC_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, c->stream));
    QWC_CHECK(cudaStreamSynchronize(c->stream));
}

static void cu_copy(const qw_backend *be, void *dst, const void *src, size_t n) {
    QWC_WROTE();
    if (n) QWC_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, qwc_of(be)->stream));
}

static void cu_zero(const qw_backend *be, void *p, size_t n) {
    QWC_WROTE();
    if (n) QWC_CHECK(cudaMemsetAsync(p, 0, n, qwc_of(be)->stream));
}

static void cu_sync(const qw_backend *be) { QWC_CHECK(cudaStreamSynchronize(qwc_of(be)->stream)); }

/* ops.h's layer: the chain of work moves to the layer's rank (layers split; else nothing) */
static void cu_layer(const qw_backend *be, int il) {
    qwc *c = C(be);
    if (c->layers) hop(c, il >= 0 && il < c->n_stage ? c->stage[il] : 0);
}

/* ---------------------------------------------------------------- graphs */

/* A graph is recorded on rank 0's stream; the other ranks' streams join it at the hops and rejoin it at the end. */
static int cu_graph_begin(const qw_backend *be) {
    qwc *c = C(be);
    hop(c, 0);
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    c->capturing = 1;
    c->capture_spoiled = 0;
    return 0;
}

static void *cu_graph_end(const qw_backend *be) {
    qwc *c = C(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    hop(c, 0, 1);
    c->capturing = 0;
    if (cudaStreamEndCapture(c->stream, &g) != cudaSuccess || c->capture_spoiled ||
        cudaGraphInstantiate(&x, g, 0) != cudaSuccess) {
        cudaGetLastError();
        x = NULL;
    }
    if (g) cudaGraphDestroy(g);
    return x;
}

static void cu_graph_launch(const qw_backend *be, void *graph) {
    hop(C(be), 0); /* the graph starts and ends there */
    QWC_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, C(be)->stream));
}

static void cu_graph_free(const qw_backend *be, void *graph) {
    (void)be;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* ---------------------------------------------------------------- the backend */

static void cu_release(qw_backend *be) {
    qwc *c = C(be);
    for (int r = 1; r < c->n_rank; r++) {
        if (c->rank[r] != c) cu_release(&c->rank[r]->be);
    }
#if QWC_NCCL
    if (!c->copies)
        for (int r = 0; r < c->n_rank; r++)
            if (c->comm[r]) ncclCommDestroy(c->comm[r]);
#endif
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    if (c->ev) cudaEventDestroy(c->ev);
    if (c->ep_buf) cudaFree(c->ep_buf);
    if (c->kb_buf) cudaFree(c->kb_buf);
    for (int i = 0; i < c->n_ep_old; i++) cudaFree(c->ep_old[i]);
    free(c->ep_old);
    for (size_t i = 0; i < c->map_cap; i++)
        if (c->map[i].host) cudaFree((uint8_t *)c->map[i].dev - c->map[i].pad);
    for (int i = 0; i < c->n_pinned; i++) cudaFreeHost(c->pinned[i]);
    free(c->map);
    if (c->region_dev) cudaFree(c->region_dev);
    free(c->specs);
    free(c->stage);
    if (c->q8s.buf) cudaFree(c->q8s.buf);
    if (c->counts) cudaFree(c->counts);
    if (c->scratch) cudaFree(c->scratch);
    if (c->q8s.big) cudaFree(c->q8s.big);
    cublasDestroy(c->cublas);
    cudaStreamDestroy(c->stream);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

extern "C" int qw_cuda_available(char *desc, size_t n) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        if (desc && n) snprintf(desc, n, "no CUDA device is visible");
        return 0;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        cudaGetLastError();
        if (desc && n) snprintf(desc, n, "the CUDA device cannot be queried");
        return 0;
    }
    if (desc && n)
        snprintf(desc, n, "%s, %.0f GiB, compute capability %d.%d", p.name, (double)p.totalGlobalMem / (1 << 30),
                 p.major, p.minor);
    return 1;
}

/* every 16 bytes of the buffer read once, summed so that nothing is left out */
__global__ void k_read(const uint4 *p, size_t n, unsigned *out) {
    QWC_PDL_ENTRY();
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) out[0] = acc; /* never in practice: keeps the loads */
}

extern "C" double qw_backend_cuda_read_bandwidth(const qw_backend *be) {
    if (!be || be->release != cu_release) return 0;
    qwc *c = C(be);
    size_t bytes = (size_t)2 << 30;
    void *buf = NULL;
    unsigned *out = NULL;
    if (cudaMalloc(&buf, bytes) != cudaSuccess || cudaMalloc(&out, sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        if (buf) cudaFree(buf);
        return 0;
    }
    QWC_CHECK(cudaMemsetAsync(buf, 1, bytes, c->stream));
    cudaDeviceProp p;
    QWC_CHECK(cudaGetDeviceProperties(&p, c->device));
    cudaEvent_t a, b;
    QWC_CHECK(cudaEventCreate(&a));
    QWC_CHECK(cudaEventCreate(&b));
    double best = 0;
    for (int pass = 0; pass < 6; pass++) {
        QWC_CHECK(cudaEventRecord(a, c->stream));
        qwc_launch(k_read, p.multiProcessorCount * 8, 512, 0, c->stream, (const uint4 *)buf, bytes / 16, out);
        QWC_CHECK(cudaEventRecord(b, c->stream));
        QWC_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        QWC_CHECK(cudaEventElapsedTime(&ms, a, b));
        if (pass && ms > 0 && bytes / (ms * 1e-3) > best) best = bytes / (ms * 1e-3); /* the first pass warms up */
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(buf);
    cudaFree(out);
    return best;
}

extern "C" void qw_backend_cuda_memory(const qw_backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (!be || be->release != cu_release) return;
    QWC_CHECK(cudaSetDevice(C(be)->device));
    cudaMemGetInfo(free_bytes, total_bytes);
}

extern "C" void qw_backend_cuda_set_q8_activations(qw_backend *be, int on) {
    if (!be || be->release != cu_release) return;
    for (int r = 0; r < qwc_n_rank(C(be)); r++) qwc_rank(C(be), r)->q8 = on != 0;
}

extern "C" void qw_backend_cuda_set_dr_chunk(qw_backend *be, int min_tok) {
    if (!be || be->release != cu_release) return;
    for (int r = 0; r < qwc_n_rank(C(be)); r++) qwc_rank(C(be), r)->dr_chunk = min_tok > 0 ? min_tok : 0;
}

extern "C" void qw_backend_cuda_set_ple_host(qw_backend *be, int on) {
    if (be && be->release == cu_release) C(be)->ple_host = on != 0;
}

extern "C" qwenc_status qw_backend_cuda_weights_adopt(qw_backend *be, const void *keys, size_t bytes, char *err,
                                                     size_t errlen) {
    if (!be || be->release != cu_release)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "weights on the device: not a CUDA backend");
    qwc *c = C(be);
    if (c->region_key)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "weights on the device: the backend already has a range");
    if (c->n_rank) { /* split: each GPU makes the parts it reads */
        c->region_key = (const uint8_t *)keys;
        c->region_bytes = bytes;
        c->lazy = 1;
        return QWENC_OK;
    }
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        return qw_err(err, errlen, QWENC_ERR_NOMEM,
                      "out of device memory for %.2f GiB of weights (%.2f GiB free of %.2f GiB)",
                      (double)bytes / (1 << 30), (double)f / (1 << 30), (double)t / (1 << 30));
    }
    c->region_key = (const uint8_t *)keys;
    c->region_dev = (uint8_t *)d;
    c->region_bytes = bytes;
    return QWENC_OK;
}

extern "C" void qw_backend_cuda_weights_random(qw_backend *be, const void *key, qw_type type, size_t bytes,
                                               uint64_t seed) {
    qwc *c = C(be);
    const uint8_t *k = (const uint8_t *)key;
    if (!c->region_key || k < c->region_key || k + bytes > c->region_key + c->region_bytes)
        qwc_die(__FILE__, __LINE__, "qw_backend_cuda_weights_random", "the range is not inside the adopted one");
    if (c->lazy) { /* made where it is read */
        if (c->n_specs == c->cap_specs) {
            const size_t cap = c->cap_specs ? 2 * c->cap_specs : 1024;
            rspec *n = (rspec *)realloc(c->specs, cap * sizeof(rspec));
            if (!n) qwc_die(__FILE__, __LINE__, "qw_backend_cuda_weights_random", "out of host memory");
            c->specs = n, c->cap_specs = cap;
        }
        c->specs[c->n_specs++] = rspec{k, bytes, type, seed};
        c->specs_sorted = 0;
        return;
    }
    qwc_fill_random(c, (uint8_t *)in_region(c, key), type, bytes, seed, 0);
}

extern "C" qwenc_status qw_backend_cuda_new(int device, qw_backend **out, char *err, size_t errlen) {
    *out = NULL;
    char desc[320];
    if (!qw_cuda_available(desc, sizeof(desc))) return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "cuda: %s", desc);
    if (cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "cuda: device %d cannot be used", device);
    }
    qwc *c = (qwc *)qw_calloc(1, sizeof(qwc));
    if (!c) return qw_err_nomem(err, errlen, "cuda backend", 1, sizeof(qwc));
    c->device = device;
    pthread_mutex_init(&c->lock, NULL);
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&c->cublas) != CUBLAS_STATUS_SUCCESS) {
        cudaGetLastError();
        pthread_mutex_destroy(&c->lock);
        free(c);
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "cuda: cannot create a stream and a cuBLAS handle");
    }
    cublasSetStream(c->cublas, c->stream);
    if (cudaMalloc(&c->q8s.buf, QWC_Q8_BYTES) != cudaSuccess) { /* without it, f32 activations throughout */
        cudaGetLastError();
        c->q8s.buf = NULL;
    }
    if (cudaMalloc(&c->counts, QWC_COUNTS * sizeof(unsigned)) != cudaSuccess ||
        cudaMemsetAsync(c->counts, 0, QWC_COUNTS * sizeof(unsigned), c->stream) != cudaSuccess) {
        cudaGetLastError(); /* without them, the kernels that would count run as the ops they join */
        if (c->counts) cudaFree(c->counts);
        c->counts = NULL;
    }
    cublasSetMathMode(c->cublas, CUBLAS_PEDANTIC_MATH); /* f32 products, f32 sums: no TF32 */
    const char *dr = getenv("QWENC_CUDA_DR_CHUNK");
    c->dr_chunk = dr && dr[0] ? atoi(dr) : QWC_DR_CHUNK_MIN;
    if (c->dr_chunk < 0) c->dr_chunk = 0;
    const char *pm = getenv("QWENC_CUDA_PAIRS_MAX");
    c->pairs_max = pm && pm[0] ? atoi(pm) : QWC_PAIRS_MAX;
    if (c->pairs_max < 1) c->pairs_max = 1;
    if (c->pairs_max > QWC_PAIRS_LIMIT) c->pairs_max = QWC_PAIRS_LIMIT;
    c->be = qwc_op_table();
    c->be.alloc = cu_alloc;
    c->be.free = cu_free;
    c->be.upload = cu_upload;
    c->be.download = cu_download;
    c->be.copy = cu_copy;
    c->be.zero = cu_zero;
    c->be.sync = cu_sync;
    c->be.graph_begin = cu_graph_begin;
    c->be.graph_end = cu_graph_end;
    c->be.graph_launch = cu_graph_launch;
    c->be.graph_free = cu_graph_free;
    c->be.layer = cu_layer;
    c->be.release = cu_release;
    *out = &c->be;
    return QWENC_OK;
}

/* ---------------------------------------------------------------- the experts over several GPUs */

int qwc_n_rank(const qwc *c) { return c->n_rank > 0 ? c->n_rank : 1; }
int qwc_split(const qwc *c) { return c->n_rank > 0 && !c->layers; }
int qwc_rank_lo(const qwc *c, int r, int E) {
    if (r <= 0 || !c->n_rank) return 0;
    if (r >= c->n_rank) return E;
    const int lo = (int)(E * c->cum[r] + 0.5);
    return lo < 0 ? 0 : lo > E ? E : lo;
}
qwc *qwc_rank(qwc *c, int r) { return c->n_rank > 0 ? c->rank[r] : c; }
void qwc_set_device(const qwc *c) { QWC_CHECK(cudaSetDevice(c->device)); }

/* *buf (of *have bytes) grown to hold bytes: the buffer it outgrows kept until the backend goes, since graphs
 * recorded with it may still run (what: the buffer's name in messages) */
static void *keep_grow(qwc *c, void **buf, size_t *have, size_t bytes, const char *what) {
    if (bytes <= *have) return *buf;
    if (recording(c)) qwc_die(__FILE__, __LINE__, what, "the buffer must grow while a graph is recorded");
    if (*buf) {
        void **o = (void **)realloc(c->ep_old, (size_t)(c->n_ep_old + 1) * sizeof(void *));
        if (!o) qwc_die(__FILE__, __LINE__, what, "out of host memory");
        c->ep_old = o;
        c->ep_old[c->n_ep_old++] = *buf;
        *buf = NULL;
    }
    size_t n = bytes + bytes / 2;
    *buf = grow_alloc(n, what);
    *have = n;
    return *buf;
}

void *qwc_ep_buf(qwc *c, size_t bytes) { return keep_grow(c, &c->ep_buf, &c->ep_bytes, bytes, "exchange buffers"); }

void *qwc_keep_buf(qwc *c, size_t bytes) { return keep_grow(c, &c->kb_buf, &c->kb_bytes, bytes, "step scratch"); }

void qwc_fork(qwc *c) {
    QWC_CHECK(cudaEventRecord(c->ev, c->stream));
    for (int r = 1; r < c->n_rank; r++) QWC_CHECK(cudaStreamWaitEvent(c->rank[r]->stream, c->ev, 0));
}

void qwc_join(qwc *c) {
    for (int r = 1; r < c->n_rank; r++) {
        qwc *p = c->rank[r];
        QWC_CHECK(cudaSetDevice(p->device));
        QWC_CHECK(cudaEventRecord(p->ev, p->stream));
    }
    QWC_CHECK(cudaSetDevice(c->device));
    for (int r = 1; r < c->n_rank; r++) QWC_CHECK(cudaStreamWaitEvent(c->stream, c->rank[r]->ev, 0));
}

#if QWC_NCCL
#define QWC_NCCL_CHECK(x)                                                                                         \
    do {                                                                                                          \
        ncclResult_t r_ = (x);                                                                                    \
        if (r_ != ncclSuccess) qwc_die(__FILE__, __LINE__, #x, ncclGetErrorString(r_));                          \
    } while (0)
#endif

void qwc_bcast(qwc *c, void *const *buf, size_t bytes, void *const *buf2, size_t bytes2) {
    QWC_WROTE();
    if (c->copies) { /* after qwc_fork: each peer copies on its own stream */
        for (int r = 1; r < c->n_rank; r++) {
            QWC_CHECK(cudaMemcpyAsync(buf[r], buf[0], bytes, cudaMemcpyDeviceToDevice, c->rank[r]->stream));
            if (buf2) QWC_CHECK(cudaMemcpyAsync(buf2[r], buf2[0], bytes2, cudaMemcpyDeviceToDevice, c->rank[r]->stream));
        }
        return;
    }
#if QWC_NCCL
    QWC_NCCL_CHECK(ncclGroupStart()); /* one launch a rank for both */
    for (int r = 0; r < c->n_rank; r++) {
        QWC_NCCL_CHECK(ncclBroadcast(buf[0], buf[r], bytes, ncclUint8, 0, c->comm[r], c->rank[r]->stream));
        if (buf2) QWC_NCCL_CHECK(ncclBroadcast(buf2[0], buf2[r], bytes2, ncclUint8, 0, c->comm[r], c->rank[r]->stream));
    }
    QWC_NCCL_CHECK(ncclGroupEnd());
#endif
}

/* buf[0] += buf[r] (r >= 1): the copies' way, on rank 0's stream after qwc_join */
__global__ void k_ep_add(float *y, const float *x, int64_t n) {
    QWC_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

void qwc_reduce_sum(qwc *c, float *const *buf, size_t n) {
    if (c->copies) {
        qwc_join(c);
        for (int r = 1; r < c->n_rank; r++) {
            qwc_launch(k_ep_add, qwc_blocks((int64_t)n, 256), 256, 0, c->stream, buf[0], (const float *)buf[r], (int64_t)n);
            QWC_LAUNCHED();
        }
        return;
    }
    QWC_WROTE();
#if QWC_NCCL
    QWC_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->n_rank; r++)
        QWC_NCCL_CHECK(ncclReduce(buf[r], buf[0], n, ncclFloat, ncclSum, 0, c->comm[r], c->rank[r]->stream));
    QWC_NCCL_CHECK(ncclGroupEnd());
#endif
    qwc_join(c);
}

/* ranks 1 .. n-1 released: one GPU again */
static void drop_ranks(qwc *c, int n) {
    for (int r = 1; r < n; r++)
        if (c->rank[r]) cu_release(&c->rank[r]->be), c->rank[r] = NULL;
    c->n_rank = 0;
}

/* The checks both splits make of their devices: *copies set when a device is listed twice */
static qwenc_status split_devices(const qw_backend *be, const int *devices, int n, int *copies, char *err,
                                  size_t errlen) {
    if (!be || be->release != cu_release)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "--gpus: not a CUDA backend");
    const qwc *c = C(be);
    if (n < 1 || n > QWC_MAX_RANKS)
        return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: between 1 and %d GPUs, not %d", QWC_MAX_RANKS, n);
    if (c->n_rank) return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "--gpus: the backend is already split");
    if (devices[0] != c->device)
        return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: the first GPU must be the backend's (%d)", c->device);
    int count = 0;
    cudaGetDeviceCount(&count);
    *copies = 0;
    for (int r = 0; r < n; r++) {
        if (devices[r] < 0 || devices[r] >= count)
            return qw_err(err, errlen, QWENC_ERR_ARG, "--gpus: there is no CUDA device %d (%d visible)", devices[r], count);
        for (int q = 0; q < r; q++) *copies |= devices[q] == devices[r];
    }
    return QWENC_OK;
}

/* Ranks 1 .. n-1: a backend of its own on each device, root c; on failure none is left */
static qwenc_status make_ranks(qwc *c, const int *devices, int n, char *err, size_t errlen) {
    c->rank[0] = c;
    qwenc_status st = QWENC_OK;
    QWC_CHECK(cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming));
    for (int r = 1; r < n && !st; r++) {
        qw_backend *pb = NULL;
        st = qw_backend_cuda_new(devices[r], &pb, err, errlen);
        if (st) break;
        qwc *p = C(pb);
        p->root = c;
        p->q8 = c->q8;
        p->dr_chunk = c->dr_chunk;
        p->pairs_max = c->pairs_max;
        QWC_CHECK(cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming));
        c->rank[r] = p;
    }
    QWC_CHECK(cudaSetDevice(c->device));
    if (st) drop_ranks(c, n);
    return st;
}

extern "C" qwenc_status qw_backend_cuda_split(qw_backend *be, const int *devices, int n, const double *share, char *err,
                                              size_t errlen) {
    int copies = 0;
    qwenc_status st = split_devices(be, devices, n, &copies, err, errlen);
    if (st) return st;
    qwc *c = C(be);
#if !QWC_NCCL
    if (!copies && n > 1)
        return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                      "--gpus: this qwenc was built without NCCL (no nccl.h under the CUDA toolkit or /usr at "
                      "build time; make cuda NCCL_HOME=DIR names another, docs/SCALE.md)");
#endif
    c->copies = copies;
    double sum = 0;
    for (int r = 0; r < n; r++) {
        c->cum[r] = sum;
        sum += share ? share[r] : 1.0 / n;
    }
    for (int r = 0; r <= n; r++) c->cum[r] = r == n ? 1.0 : c->cum[r] / sum;
    st = make_ranks(c, devices, n, err, errlen);
    if (st) return st;
#if QWC_NCCL
    if (!copies) {
        ncclResult_t nr = ncclCommInitAll(c->comm, n, devices);
        if (nr != ncclSuccess) {
            memset(c->comm, 0, sizeof(c->comm));
            st = qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "--gpus: NCCL could not join the GPUs: %s (%s)",
                        ncclGetErrorString(nr), ncclGetLastError(NULL));
            QWC_CHECK(cudaSetDevice(c->device));
            drop_ranks(c, n); /* back to one GPU */
            return st;
        }
    }
#endif
    QWC_CHECK(cudaSetDevice(c->device));
    c->n_rank = n;
    return QWENC_OK;
}

extern "C" qwenc_status qw_backend_cuda_split_layers(qw_backend *be, const int *devices, int n, const int *stage,
                                                     int n_layers, char *err, size_t errlen) {
    int copies = 0;
    qwenc_status st = split_devices(be, devices, n, &copies, err, errlen);
    if (st) return st;
    qwc *c = C(be);
    for (int il = 0; il < n_layers; il++)
        if (stage[il] < 0 || stage[il] >= n)
            return qw_err(err, errlen, QWENC_ERR_ARG, "--split layer: layer %d on GPU %d of %d", il, stage[il], n);
    /* a later GPU's kernels read and write the first's activations in place: peer access both ways */
    for (int r = 1; r < n; r++) {
        const int d = devices[r], d0 = c->device;
        if (d == d0) continue;
        int ab = 0, ba = 0;
        cudaDeviceCanAccessPeer(&ab, d, d0);
        cudaDeviceCanAccessPeer(&ba, d0, d);
        if (!ab || !ba)
            return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                          "--split layer: GPUs %d and %d cannot read each other's memory (no peer access); "
                          "--split expert needs only NCCL", d0, d);
        for (int k = 0; k < 2; k++) {
            QWC_CHECK(cudaSetDevice(k ? d0 : d));
            cudaError_t e = cudaDeviceEnablePeerAccess(k ? d : d0, 0);
            if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
                QWC_CHECK(cudaSetDevice(d0));
                return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED, "--split layer: peer access from GPU %d to %d: %s",
                              k ? d0 : d, k ? d : d0, cudaGetErrorString(e));
            }
            cudaGetLastError();
        }
    }
    QWC_CHECK(cudaSetDevice(c->device));
    int *at = (int *)malloc((size_t)(n_layers > 0 ? n_layers : 1) * sizeof(int));
    if (!at) return qw_err_nomem(err, errlen, "--split layer", (size_t)n_layers, sizeof(int));
    memcpy(at, stage, (size_t)n_layers * sizeof(int));
    st = make_ranks(c, devices, n, err, errlen);
    if (st) {
        free(at);
        return st;
    }
    c->n_rank = n;
    c->layers = 1;
    c->cur = 0;
    c->stage = at;
    c->n_stage = n_layers;
    return QWENC_OK;
}

extern "C" int qw_backend_cuda_ranks(const qw_backend *be) {
    return be && be->release == cu_release ? qwc_n_rank(C(be)) : 0;
}

extern "C" void qw_backend_cuda_rank_info(const qw_backend *be, int r, int *device, size_t *free_bytes,
                                          size_t *total_bytes, size_t *weight_bytes, int *first_layer,
                                          int *n_layers) {
    *device = -1, *free_bytes = *total_bytes = *weight_bytes = 0;
    *first_layer = *n_layers = 0;
    if (!be || be->release != cu_release || r < 0 || r >= qwc_n_rank(C(be))) return;
    const qwc *o = C(be);
    for (int il = 0; o->layers && il < o->n_stage; il++)
        if (o->stage[il] == r && !(*n_layers)++) *first_layer = il;
    qwc *c = qwc_rank(C(be), r);
    *device = c->device;
    *weight_bytes = c->weight_bytes + (c->region_dev ? c->region_bytes : 0);
    QWC_CHECK(cudaSetDevice(c->device));
    cudaMemGetInfo(free_bytes, total_bytes);
    QWC_CHECK(cudaSetDevice(C(be)->device));
}

extern "C" double qw_backend_cuda_exchange_us(qw_backend *be, int n_tok, int H, int k, int n_layers) {
    if (!be || be->release != cu_release || !qwc_split(C(be)) || n_layers < 1) return 0;
    qwc *c = C(be);
    const int N = c->n_rank;
    const size_t xb = ((size_t)n_tok * H * 4 + 255) / 256 * 256, sb = ((size_t)n_tok * k * 4 + 255) / 256 * 256;
    const size_t ob = (size_t)n_tok * k * H * 4;
    void *xs[QWC_MAX_RANKS], *ss[QWC_MAX_RANKS];
    float *os[QWC_MAX_RANKS];
    for (int r = 0; r < N; r++) {
        qwc *p = c->rank[r];
        QWC_CHECK(cudaSetDevice(p->device));
        char *b = (char *)qwc_ep_buf(p, xb + sb + ob);
        QWC_CHECK(cudaMemsetAsync(b, 0, xb + sb + ob, p->stream));
        xs[r] = b, ss[r] = b + xb, os[r] = (float *)(b + xb + sb);
    }
    QWC_CHECK(cudaSetDevice(c->device));
    cudaEvent_t a, z;
    QWC_CHECK(cudaEventCreate(&a));
    QWC_CHECK(cudaEventCreate(&z));
    float best = 0;
    for (int pass = 0; pass < 4; pass++) { /* the first warms up; the best of the rest */
        QWC_CHECK(cudaEventRecord(a, c->stream));
        for (int l = 0; l < n_layers; l++) { /* a MoE layer's exchanges: x and the routing out, the experts' rows back */
            qwc_fork(c);
            qwc_bcast(c, xs, (size_t)n_tok * H * 4, ss, (size_t)n_tok * k * 4);
            qwc_reduce_sum(c, os, (size_t)n_tok * k * H);
        }
        QWC_CHECK(cudaEventRecord(z, c->stream));
        QWC_CHECK(cudaEventSynchronize(z));
        float ms = 0;
        QWC_CHECK(cudaEventElapsedTime(&ms, a, z));
        if (pass && (best == 0 || ms < best)) best = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(z);
    return best * 1e3;
}
