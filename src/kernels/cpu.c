/*
 * cpu.c - the CPU backend: the op table of ops.h run on the thread pool with the best dot kernels for
 * this CPU (chosen once, from cpuid), and the portable scalar variant of those kernels.
 *
 * How the work is split (each output is computed by one thread, in an order that does not depend on
 * the thread count, so the logits are bit-identical for any number of threads):
 *   matmul       rows of W in chunks; a chunk does its rows for every token (token tiles of ~256 KiB of
 *                activations), so each weight row is read once per call; decode is one row-chunked pass,
 *                each chunk's rows read one after another (one sequential stream per thread); quantized
 *                weights go to the kernel in blocks of QROW_BLOCK bytes of rows with all of a token tile
 *                (up to the table's qtile_nt tokens; a chunk's rows and up to 8 MiB of tokens at once when
 *                the table takes that many in one call, as avx512, amx and avx2 do), activations rounded
 *                once per matmul (q8a.h)
 *   attention    (token, kv head, up to 4 of its query heads): K and V rows are read once for the heads
 *                that share them; keys in blocks of 64: f32 scores and a per-block softmax-weighted sum of
 *                values, merged across blocks in double (flash-attention style, no scratch)
 *   delta_rule   value heads (each head's state is touched by one thread, its tokens in order); from
 *                QW_DELTA_CHUNK_MIN_TOK tokens on, the chunked form of delta_chunk.c
 *   rms_norm, l2_norm, rope, silu, sigmoid, mul, axpy
 *                rows / tokens / element ranges when large, each range by the scalar reference code
 *                itself or by the kernel table's vector form of it (so these are bit-identical to ref.c)
 *   conv1d_dw    (token, block of 256 channels), ref.c's sums in a vectorisable order, the same bits
 *   get_rows     the reference (a few rows per token)
 * Weight types without a kernel (quantized types handled only by qw_ref_dot_row) fall back to the
 * reference dot per row, inside the same parallel loop.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "kernels/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/common.h"
#include "core/pool.h"
#include "kernels/composite.h"
#include "kernels/delta_chunk.h"
#include "kernels/qtiles.h"

/* ------------------------------------------------------------------ scalar kernels */

/* The scalar variant keeps 8 f32 lanes per output, like avx2.c, so it vectorises where the compiler can. */
#define SC_LANES 8

/* the weight at element c of a row, as f32 (the type is a constant once inlined) */
static inline __attribute__((always_inline)) float sc_weight(qw_type type, const char *row, int64_t c) {
    if (type == QW_TYPE_F32) {
        float v;
        memcpy(&v, row + c * 4, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, row + c * 2, 2);
    return type == QW_TYPE_BF16 ? qw_bf16_to_f32(h) : qw_f16_to_f32(h);
}

static inline __attribute__((always_inline)) float sc_dot(qw_type type, const char *row, const float *x, int64_t n) {
    float acc[SC_LANES] = {0};
    int64_t c = 0;
    for (; c + SC_LANES <= n; c += SC_LANES)
        for (int l = 0; l < SC_LANES; l++) acc[l] += sc_weight(type, row, c + l) * x[c + l];
    for (int l = 0; c + l < n; l++) acc[l] += sc_weight(type, row, c + l) * x[c + l];
    for (int w = SC_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static inline __attribute__((always_inline)) void sc_tile(qw_type type, float *y, int64_t ldy, const void *w,
                                                          size_t ws, const float *x, int64_t ldx, int nr, int nt,
                                                          int64_t n) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[t * ldy + r] = sc_dot(type, (const char *)w + r * ws, x + t * ldx, n);
}

static void sc_tile_f32(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                        int64_t n) {
    sc_tile(QW_TYPE_F32, y, ldy, w, ws, x, ldx, nr, nt, n);
}
static void sc_tile_bf16(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                         int64_t n) {
    sc_tile(QW_TYPE_BF16, y, ldy, w, ws, x, ldx, nr, nt, n);
}
static void sc_tile_f16(float *y, int64_t ldy, const void *w, size_t ws, const float *x, int64_t ldx, int nr, int nt,
                        int64_t n) {
    sc_tile(QW_TYPE_F16, y, ldy, w, ws, x, ldx, nr, nt, n);
}

static void sc_decay_acc(float *S, float d, float *acc, float k, int n) {
    for (int i = 0; i < n; i++) {
        S[i] *= d;
        acc[i] += k * S[i];
    }
}

static void sc_rank1_acc(float *S, const float *u, float k, float *acc, float q, int n) {
    for (int i = 0; i < n; i++) {
        S[i] += k * u[i];
        acc[i] += q * S[i];
    }
}

static void sc_scale_axpy(float *y, float s, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = y[i] * s + a * x[i];
}

/* the integer dot of q8a.h, one output at a time (the reference itself: the same sums in the same order) */
static void sc_qtile(float *y, int64_t ldy, qw_type type, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,
                     int nr, int nt, int64_t n) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[t * ldy + r] = qw_q8a_dot_ref(type, (const char *)w + r * ws, x + t * ldx, n);
}
#define SC_QTILE(v, T, name)                                                                                        \
    static void sc_qtile_##name(float *y, int64_t ldy, const void *w, size_t ws, const qw_q8a *x, int64_t ldx,    \
                                int nr, int nt, int64_t n) {                                                       \
        sc_qtile(y, ldy, T, w, ws, x, ldx, nr, nt, n);                                                             \
    }
QW_QTILE_LIST(SC_QTILE, -)
#define SC_QTILE_INIT(v, T, name) [T] = sc_qtile_##name,

static const qw_cpu_kernels kernels_scalar = {
    .name = "scalar",
    .lanes = SC_LANES,
    .tile_nr = 4,
    .tile_nt = 4,
    .tile = {[QW_TYPE_F32] = sc_tile_f32, [QW_TYPE_BF16] = sc_tile_bf16, [QW_TYPE_F16] = sc_tile_f16},
    .qtile = {QW_QTILE_LIST(SC_QTILE_INIT, -)},
    .decay_acc = sc_decay_acc,
    .rank1_acc = sc_rank1_acc,
    .scale_axpy = sc_scale_axpy,
};

/* ------------------------------------------------------------------ the kernels' scratch (qtiles.h) */

typedef struct {
    size_t cap[QW_QTILE_SCRATCH];
    void *p[QW_QTILE_SCRATCH];
} scratch_set;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_made;
/* kernel scratch that could not be allocated, ever (qw_cpu_scratch_failures) */
static atomic_ulong scratch_failures;

static void scratch_free(void *v) {
    scratch_set *b = v;
    for (int i = 0; i < QW_QTILE_SCRATCH; i++) free(b->p[i]);
    free(b);
}
static void scratch_init(void) { scratch_key_made = pthread_key_create(&scratch_key, scratch_free) == 0; }

unsigned long qw_cpu_scratch_failures(void) { return atomic_load(&scratch_failures); }

static void *scratch_failed(void) {
    atomic_fetch_add(&scratch_failures, 1);
    return NULL;
}

void *qw_qtile_scratch(int slot, size_t bytes) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_key_made) return scratch_failed();
    scratch_set *b = pthread_getspecific(scratch_key);
    if (!b) {
        b = qw_calloc(1, sizeof(*b));
        if (!b) return scratch_failed();
        if (pthread_setspecific(scratch_key, b) != 0) {
            free(b);
            return scratch_failed();
        }
    }
    if (bytes > b->cap[slot]) {
        free(b->p[slot]);
        b->cap[slot] = 0;
        size_t cap = bytes > SIZE_MAX / 2 ? bytes : (bytes + bytes / 4 + 63) / 64 * 64;
        b->p[slot] = qw_aligned_alloc(64, cap);
        if (!b->p[slot]) return scratch_failed();
        b->cap[slot] = cap;
    }
    return b->p[slot];
}

qw_rp_scratch qw_rp_scratch_get(const qw_q8a *x, int64_t ldx, int nt, int64_t ng, int sub, int o, int has_min,
                                int rows) {
    qw_rp_scratch b = {.ldo = ng * sub};
    b.ofs = qw_qtile_scratch(2, (size_t)nt * b.ldo * (sizeof(int32_t) + sizeof(float)));
    if (!b.ofs) return b; /* wq NULL: the caller skips the call */
    b.dsm = (float *)(b.ofs + (size_t)nt * b.ldo);
    qw_q8a_group_terms(x, ldx, nt, ng, sub, o, b.ofs, has_min ? b.dsm : NULL);
    size_t wq_bytes = (size_t)ng * 8 * 4 * rows, a_bytes = (size_t)ng * sub * rows * sizeof(float);
    b.wq = qw_qtile_scratch(1, wq_bytes + a_bytes + (size_t)ng * rows * sizeof(float));
    if (!b.wq) return b;
    b.A = (float *)(b.wq + wq_bytes);
    b.B = b.A + (size_t)ng * sub * rows;
    return b;
}

/* ------------------------------------------------------------------ dispatch (once, from cpuid) */

static const qw_cpu_kernels *available[5];
static pthread_once_t available_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
/* F16C from cpuid leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
}

/* AMX tiles with int8 products: AMX-TILE and AMX-INT8 in cpuid (leaf 7, EDX bits 24 and 25), the tile
 * state enabled by the OS (XCR0 bits 17 and 18) and, on Linux, this process's permission for the tile
 * data, asked for once: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Without that permission the
 * first tile load dies with SIGILL. */
static int has_amx_int8(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0; /* OSXSAVE: xgetbv may run */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo >> 17 & 3) != 3) return 0;
#if defined(__linux__)
    long ret = 158; /* SYS_arch_prctl (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18) */
    __asm__ volatile("syscall" : "+a"(ret) : "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
    return ret == 0;
#else
    return 0;
#endif
}
#endif

static void detect(void) {
    int n = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    int fma_f16c = __builtin_cpu_supports("fma") && has_f16c();
    unsigned a = 0, b = 0, c = 0, d = 0; /* vendor "GenuineIntel": b, d, c = "Genu", "ineI", "ntel" (decode's prefetch differs) */
    int intel = __get_cpuid(0, &a, &b, &c, &d) && b == 0x756E6547 && d == 0x49656E69 && c == 0x6C65746E;
    if (fma_f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        if (has_amx_int8()) available[n++] = &qw_kernels_amx;
        available[n++] = intel ? &qw_kernels_avx512_intel : &qw_kernels_avx512;
    }
    if (fma_f16c && __builtin_cpu_supports("avx2")) available[n++] = intel ? &qw_kernels_avx2_intel : &qw_kernels_avx2;
#endif
#if defined(__aarch64__)
    /* the dot-product instructions (sdot) from the kernel's hwcaps; Apple's CPUs all have them */
#if defined(__linux__)
    int dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int dotprod = 1;
#else
    int dotprod = 0;
#endif
    available[n++] = dotprod ? &qw_kernels_neon_dotprod : &qw_kernels_neon;
#endif
    available[n++] = &kernels_scalar;
    available[n] = NULL;
}

const qw_cpu_kernels *const *qw_cpu_kernels_available(void) {
    pthread_once(&available_once, detect);
    return available;
}

const qw_cpu_kernels *qw_cpu_kernels_find(const char *name) {
    const qw_cpu_kernels *const *k = qw_cpu_kernels_available();
    if (!name || !strcmp(name, "auto")) return k[0];
    for (; *k; k++)
        if (!strcmp((*k)->name, name)) return *k;
    return NULL;
}

/* ------------------------------------------------------------------ the backend */

typedef struct {
    void *p;
    size_t bytes;
} guard_region;

typedef struct {
    qw_backend ops; /* first: the table handed out is a pointer to this member */
    const qw_cpu_kernels *k;
    qw_pool *pool; /* NULL: one thread */
    int n_threads;
    int f32_act; /* quantized weights meet f32 activations (no integer dots) */
    /* guard mode (qw_backend_cpu_new): activation and state memory is mapped apart and inaccessible outside
     * the backend's calls; the interposer handed out in its place opens it around each call */
    int guard;
    qw_backend *guarded;
    pthread_mutex_t guard_lock;
    guard_region *regions;
    int n_regions, cap_regions;
    int guard_depth; /* calls in progress (a composite op's nested calls) */
} cpu_backend;

static const cpu_backend *backend_of(const qw_backend *ops) { return (const cpu_backend *)ops; }

/* Below this many multiply-adds (or elements) an op runs on the calling thread: waking the pool costs
 * more than it saves. */
#define PAR_MIN_WORK (1 << 15)

/* Chunks of at least `align` items, about 4 per thread so a slow thread does not hold the others up. */
static int64_t chunk_for(const cpu_backend *b, int64_t n, int64_t align) {
    int64_t c = (n + 4 * b->n_threads - 1) / (4 * b->n_threads);
    c = (c + align - 1) / align * align;
    return c > 0 ? c : align;
}

/* ---- matmul */

typedef struct {
    float *y;
    const qw_tensor *w;
    const float *x;
    int64_t rows, cols;
    int n_tok;
    qw_tile_fn tile; /* NULL (and qtile NULL): reference dot per row */
    qw_qtile_fn qtile; /* integer dots against xq */
    const qw_q8a *xq;  /* [n_tok][cols / 32]: x rounded to 8 bits, when qtile */
    size_t row_bytes;
    int tile_nr, tile_nt;
    int qtile_nt; /* tokens per qtile call */
    int64_t tok_tile; /* tokens whose activations stay in cache while a chunk's rows pass over them */
    int whole;        /* the kernel takes the whole token tile and all of a chunk's rows in one call */
} matmul_ctx;

#define QROW_BLOCK (128 << 10)
#define ROW_STREAM_MIN (1 << 20)

static void matmul_rows(void *arg, int64_t r0, int64_t r1) {
    const matmul_ctx *c = arg;
    if (c->qtile) {
        int64_t ldq = c->cols / QW_Q8A_BLOCK;
        const char *wd = c->w->data;
        if (c->n_tok == 1) { /* decode: all the chunk's rows in one call (cpu.h) */
            c->qtile(c->y + r0, c->rows, wd + (size_t)r0 * c->row_bytes, c->row_bytes, c->xq, ldq, (int)(r1 - r0), 1,
                     c->cols);
            return;
        }
        /* blocks of rows (QROW_BLOCK bytes of weights, which stay in L2 while every tile_nt tokens of the
         * token tile pass over them in one qtile call: the kernel prepares those tokens once per call). A
         * table that takes the whole token tile in one call (avx512, amx, avx2) keeps its own blocks of rows
         * in cache (16 or 8 repacked rows at a time), so it gets all the chunk's rows and prepares the
         * tokens once per chunk, not once per block of rows. */
        int64_t rb = c->whole ? r1 - r0
                              : QW_MAX(c->tile_nr, QROW_BLOCK / (int64_t)c->row_bytes / c->tile_nr * c->tile_nr);
        for (int64_t t0 = 0; t0 < c->n_tok; t0 += c->tok_tile) {
            int64_t t1 = QW_MIN(c->n_tok, t0 + c->tok_tile);
            for (int64_t r = r0; r < r1; r += rb) {
                int nr = (int)QW_MIN(rb, r1 - r);
                for (int64_t t = t0; t < t1; t += c->qtile_nt)
                    c->qtile(c->y + t * c->rows + r, c->rows, wd + (size_t)r * c->row_bytes, c->row_bytes,
                             c->xq + t * ldq, ldq, nr, (int)QW_MIN(c->qtile_nt, t1 - t), c->cols);
            }
        }
        return;
    }
    if (!c->tile) {
        for (int64_t r = r0; r < r1; r++)
            for (int t = 0; t < c->n_tok; t++)
                c->y[(int64_t)t * c->rows + r] = (float)qw_ref_dot_row(c->w, r, c->x + (int64_t)t * c->cols, c->cols);
        return;
    }
    const char *wd = c->w->data;
    for (int64_t t0 = 0; t0 < c->n_tok; t0 += c->tok_tile) {
        int64_t t1 = QW_MIN(c->n_tok, t0 + c->tok_tile);
        /* one token and a matrix that streams from memory: a row at a time, one sequential stream, which the
         * hardware prefetcher follows (avx512_q.c, qtile_any). Small matrices, read from cache, keep the
         * 4-row tiles, faster there (docs/BENCH.md, CPU kernels: Decode (one token)). Every tile shape gives
         * the same bits (cpu.h). */
        int step = c->n_tok == 1 && (int64_t)c->row_bytes * c->rows >= ROW_STREAM_MIN ? 1 : c->tile_nr;
        for (int64_t r = r0; r < r1; r += step) {
            int nr = (int)QW_MIN(step, r1 - r);
            for (int64_t t = t0; t < t1; t += c->tile_nt) {
                int nt = (int)QW_MIN(c->tile_nt, t1 - t);
                c->tile(c->y + t * c->rows + r, c->rows, wd + (size_t)r * c->row_bytes, c->row_bytes,
                        c->x + t * c->cols, c->cols, nr, nt, c->cols);
            }
        }
    }
}

static void matmul_setup(const cpu_backend *b, matmul_ctx *c, float *y, const qw_tensor *w, const float *x, int n_tok) {
    *c = (matmul_ctx){.y = y, .w = w, .x = x, .rows = w->shape[0], .cols = qw_tensor_row_len(w), .n_tok = n_tok};
    c->tile = w->type < QW_TYPE_COUNT ? b->k->tile[w->type] : NULL;
    c->qtile = w->type < QW_TYPE_COUNT && !b->f32_act ? b->k->qtile[w->type] : NULL;
    c->tile_nr = b->k->tile_nr;
    c->tile_nt = b->k->tile_nt;
    c->qtile_nt = b->k->qtile_nt > 0 ? b->k->qtile_nt : c->tile_nt;
    if (c->tile || c->qtile) c->row_bytes = qw_type_row_size(w->type, c->cols);
    int64_t tok_bytes = c->qtile ? c->cols / QW_Q8A_BLOCK * (int64_t)sizeof(qw_q8a) : c->cols * 4;
    c->tok_tile = (256 << 10) / (tok_bytes + 1) / c->tile_nt * c->tile_nt;
    /* A kernel that takes every token in one call (avx512, amx, avx2) repacks each block of rows once per call
     * and passes all the tokens over it: token tiles would repeat the packing once per tile (docs/BENCH.md,
     * CPU kernels: Prefill, 16 tokens or more (AVX-512)). Up to 8 MiB of activations per call (a session's
     * default step of 512 tokens stays whole for rows of up to 13,107 elements), so a longer step does not
     * stream them from memory for every block of rows. */
    c->whole = c->qtile && c->qtile_nt >= n_tok;
    if (c->whole) c->tok_tile = QW_MIN(n_tok, QW_MAX(16, (8 << 20) / (tok_bytes + 1) / 16 * 16));
    if (c->tok_tile < c->tile_nt) c->tok_tile = c->tile_nt;
}

/* Rows per chunk of a one-token matmul (or batch of them: row_bytes is their mean). The threads stream their rows
 * from memory and finish each chunk at times that differ by up to a chunk's time, which the last one to finish makes
 * the others wait, so the chunks are small: at most a sixteenth of a thread's rows (docs/BENCH.md, CPU kernels:
 * Decode's chunks and element-wise ops). Not below 256 KiB of weights, where a chunk's start (its activations
 * prepared, the prefetch stream begun) would start to count.
 */
static int64_t decode_chunk(const cpu_backend *b, int64_t n, size_t row_bytes, int align) {
    int64_t per16 = (n + 16 * b->n_threads - 1) / (16 * b->n_threads);
    int64_t min_rows = row_bytes ? (256 << 10) / (int64_t)row_bytes : per16;
    return QW_MIN(chunk_for(b, n, align), (QW_MAX(per16, min_rows) + align - 1) / align * align);
}

/* The calling thread's scratch for 8-bit activations (slot 3 of the kernels' scratch): grown, never shrunk, so
 * decoding allocates nothing once the largest matmul has run, and freed when the thread ends. (Per thread: a
 * model's table may be used by several threads at once.) NULL when out of memory. */
static qw_q8a *q8a_scratch(int64_t n_blocks) {
    if (n_blocks <= 0) return NULL;
    return qw_qtile_scratch(3, (size_t)n_blocks * sizeof(qw_q8a));
}

/* Blocks of 8-bit activations a matmul needs (0 when it takes f32 activations). */
static int64_t q8a_blocks(const matmul_ctx *c) { return c->qtile ? c->n_tok * (c->cols / QW_Q8A_BLOCK) : 0; }

typedef struct {
    const float *x;
    qw_q8a *xq;
    int64_t cols;
    void (*quantize)(const float *x, qw_q8a *y, int64_t n);
} q8a_ctx;

static void q8a_rows(void *arg, int64_t t0, int64_t t1) {
    const q8a_ctx *c = arg;
    c->quantize(c->x + t0 * c->cols, c->xq + t0 * (c->cols / QW_Q8A_BLOCK), (t1 - t0) * c->cols);
}

/* Round the matmul's activations into xq (its q8a_blocks of scratch), on the pool for many tokens. */
static void q8a_fill(const cpu_backend *b, matmul_ctx *c, qw_q8a *xq) {
    q8a_ctx qc = {.x = c->x, .xq = xq, .cols = c->cols, .quantize = b->k->q8a_quantize ? b->k->q8a_quantize : qw_q8a_quantize};
    c->xq = xq;
    if (b->n_threads == 1 || c->n_tok * c->cols < PAR_MIN_WORK)
        q8a_rows(&qc, 0, c->n_tok);
    else
        qw_pool_parallel_for(b->pool, c->n_tok, chunk_for(b, c->n_tok, 1), q8a_rows, &qc);
}

static void cpu_matmul(const qw_backend *ops, float *y, const qw_tensor *w, const float *x, int n_tok) {
    const cpu_backend *b = backend_of(ops);
    matmul_ctx c;
    matmul_setup(b, &c, y, w, x, n_tok);
    if (c.qtile) {
        qw_q8a *xq = q8a_scratch(q8a_blocks(&c));
        if (!xq) return; /* out of memory: counted (qw_cpu_scratch_failures), the matmul skipped */
        q8a_fill(b, &c, xq);
    }
    if (b->n_threads == 1 || c.rows * c.cols * n_tok < PAR_MIN_WORK) {
        matmul_rows(&c, 0, c.rows);
        return;
    }
    int64_t chunk = n_tok == 1 ? decode_chunk(b, c.rows, c.row_bytes, c.tile_nr) : chunk_for(b, c.rows, c.tile_nr);
    qw_pool_parallel_for(b->pool, c.rows, chunk, matmul_rows, &c);
}

/* Several matmuls as one index space of rows (job j owns rows start[j] .. start[j+1]), so small matmuls
 * such as a token's routed experts share one parallel region instead of one each. */
#define BATCH_MAX_JOBS 64

typedef struct {
    matmul_ctx mc[BATCH_MAX_JOBS];
    int64_t start[BATCH_MAX_JOBS + 1];
    int n;
} batch_ctx;

static void batch_rows(void *arg, int64_t g0, int64_t g1) {
    const batch_ctx *bc = arg;
    for (int j = 0; j < bc->n; j++) {
        int64_t a = QW_MAX(g0, bc->start[j]), z = QW_MIN(g1, bc->start[j + 1]);
        if (a < z) matmul_rows((void *)&bc->mc[j], a - bc->start[j], z - bc->start[j]);
    }
}

static void cpu_matmul_batch(const qw_backend *ops, const qw_matmul_job *jobs, int n_jobs) {
    const cpu_backend *b = backend_of(ops);
    for (int j0 = 0; j0 < n_jobs; j0 += BATCH_MAX_JOBS) {
        batch_ctx bc;
        bc.n = QW_MIN(BATCH_MAX_JOBS, n_jobs - j0);
        bc.start[0] = 0;
        int64_t work = 0, n_q8a = 0, bytes = 0;
        int one_tok = 1;
        for (int j = 0; j < bc.n; j++) {
            const qw_matmul_job *jb = &jobs[j0 + j];
            matmul_setup(b, &bc.mc[j], jb->y, jb->w, jb->x, jb->n_tok);
            bc.start[j + 1] = bc.start[j] + bc.mc[j].rows;
            work += bc.mc[j].rows * bc.mc[j].cols * jb->n_tok;
            n_q8a += q8a_blocks(&bc.mc[j]);
            bytes += bc.mc[j].rows * (int64_t)bc.mc[j].row_bytes;
            one_tok &= jb->n_tok == 1;
        }
        /* jobs reading the same activations (an expert's gate and up) share one rounded copy */
        qw_q8a *xq = q8a_scratch(n_q8a);
        if (!xq && n_q8a) return; /* out of memory: counted, the batch skipped */
        for (int j = 0; j < bc.n; j++) {
            matmul_ctx *mc = &bc.mc[j];
            if (!mc->qtile) continue;
            for (int i = 0; i < j && !mc->xq; i++)
                if (bc.mc[i].qtile && bc.mc[i].x == mc->x && bc.mc[i].cols == mc->cols && bc.mc[i].n_tok == mc->n_tok)
                    mc->xq = bc.mc[i].xq;
            if (!mc->xq) {
                q8a_fill(b, mc, xq);
                xq += q8a_blocks(mc);
            }
        }
        int64_t total = bc.start[bc.n];
        if (b->n_threads == 1 || work < PAR_MIN_WORK)
            batch_rows(&bc, 0, total);
        else
            qw_pool_parallel_for(b->pool, total,
                                 one_tok ? decode_chunk(b, total, (size_t)(bytes / total), b->k->tile_nr)
                                         : chunk_for(b, total, b->k->tile_nr),
                                 batch_rows, &bc);
    }
}

/* ---- attention */

#define ATTN_MAX_HD 512
#define ATTN_BLOCK 64
#define ATTN_MAX_HPU 4 /* query heads of one kv head done together: K and V rows are read once for all */

typedef struct {
    const cpu_backend *b;
    float *out;
    const float *q, *kc, *vc;
    int q_stride, pos0, n_head, n_head_kv, hd;
    float scale;
    const int32_t *sel, *sel_off;
    int hpu;          /* query heads per unit (they share one kv head) */
    int units_per_kv; /* ceil(group / hpu) */
} attn_ctx;

/*
 * Query heads h0 .. h0+nq-1 of token t, all reading kv head kvh. For each block of keys: f32 scores
 * (the dot kernels, consecutive key positions a tile at a time), the block's max m_b, p_j = exp(s_j - m_b)
 * and sum_j p_j v_j in f32; blocks are merged in double with the running max, as the exact softmax. Each
 * head's numbers do not depend on which heads share its unit.
 */
static void attn_unit(const attn_ctx *c, int t, int kvh, int h0, int nq) {
    const qw_cpu_kernels *k = c->b->k;
    int hd = c->hd, nk = c->sel ? c->sel_off[t + 1] - c->sel_off[t] : c->pos0 + t + 1;
    const int32_t *keys = c->sel ? c->sel + c->sel_off[t] : NULL;
    const float *q0 = c->q + (int64_t)t * c->q_stride + (int64_t)h0 * hd;
    size_t kv_stride = (size_t)c->n_head_kv * hd; /* floats between consecutive positions */
    double acc[ATTN_MAX_HPU][ATTN_MAX_HD], m[ATTN_MAX_HPU], l[ATTN_MAX_HPU];
    float blk[ATTN_MAX_HPU][ATTN_MAX_HD], s[ATTN_MAX_HPU][ATTN_BLOCK];
    if (nk == 0) { /* no visible key: zeros, as the reference gives */
        for (int i = 0; i < nq; i++) memset(c->out + ((int64_t)t * c->n_head + h0 + i) * hd, 0, (size_t)hd * sizeof(float));
        return;
    }
    for (int i0 = 0; i0 < nk; i0 += ATTN_BLOCK) {
        int nb = QW_MIN(ATTN_BLOCK, nk - i0);
        for (int j = 0; j < nb;) {
            int64_t pos = keys ? keys[i0 + j] : i0 + j;
            int nr = 1;
            while (nr < k->tile_nr && j + nr < nb && (!keys || keys[i0 + j + nr] == pos + nr)) nr++;
            for (int i = 0; i < nq; i += k->tile_nt)
                k->tile[QW_TYPE_F32](&s[i][j], ATTN_BLOCK, c->kc + pos * kv_stride + (int64_t)kvh * hd, kv_stride * 4,
                                     q0 + (int64_t)i * hd, hd, nr, QW_MIN(k->tile_nt, nq - i), hd);
            j += nr;
        }
        for (int i = 0; i < nq; i++) {
            float mb = -INFINITY, lb = 0;
            for (int j = 0; j < nb; j++) {
                s[i][j] *= c->scale;
                mb = s[i][j] > mb ? s[i][j] : mb;
            }
            for (int j = 0; j < nb; j++) lb += s[i][j] = expf(s[i][j] - mb);
            memset(blk[i], 0, (size_t)hd * sizeof(float));
            for (int j = 0; j < nb; j++) {
                int64_t pos = keys ? keys[i0 + j] : i0 + j;
                k->scale_axpy(blk[i], 1.0f, s[i][j], c->vc + pos * kv_stride + (int64_t)kvh * hd, hd);
            }
            if (i0 == 0) {
                m[i] = mb;
                l[i] = lb;
                for (int d = 0; d < hd; d++) acc[i][d] = blk[i][d];
                continue;
            }
            double mn = m[i] > mb ? m[i] : mb, ra = exp(m[i] - mn), rb = exp(mb - mn);
            l[i] = l[i] * ra + lb * rb;
            for (int d = 0; d < hd; d++) acc[i][d] = acc[i][d] * ra + blk[i][d] * rb;
            m[i] = mn;
        }
    }
    for (int i = 0; i < nq; i++) {
        float *oh = c->out + ((int64_t)t * c->n_head + h0 + i) * hd;
        for (int d = 0; d < hd; d++) oh[d] = (float)(acc[i][d] / l[i]);
    }
}

/* unit u: token u / (n_head_kv * units_per_kv), then kv head, then its chunk of query heads */
static void attn_units(void *arg, int64_t u0, int64_t u1) {
    const attn_ctx *c = arg;
    int group = c->n_head / c->n_head_kv;
    for (int64_t u = u0; u < u1; u++) {
        int64_t per_tok = (int64_t)c->n_head_kv * c->units_per_kv;
        int t = (int)(u / per_tok), r = (int)(u % per_tok), kvh = r / c->units_per_kv, hc = r % c->units_per_kv;
        int h0 = kvh * group + hc * c->hpu;
        attn_unit(c, t, kvh, h0, QW_MIN(c->hpu, group - hc * c->hpu));
    }
}

static void cpu_attention(const qw_backend *ops, float *out, const float *q, int q_stride, const float *kc,
                          const float *vc, int n_tok, int n_head, int n_head_kv, int hd, float scale,
                          const int32_t *sel, const int32_t *sel_off, void *work, const qw_step *step) {
    (void)work; /* blocks need no scratch beyond the stack */
    const cpu_backend *b = backend_of(ops);
    int pos0 = step->pos0;
    QW_ASSERT(hd <= ATTN_MAX_HD && n_head % n_head_kv == 0);
    attn_ctx c = {.b = b, .out = out, .q = q, .kc = kc, .vc = vc, .q_stride = q_stride, .pos0 = pos0,
                  .n_head = n_head, .n_head_kv = n_head_kv, .hd = hd, .scale = scale, .sel = sel, .sel_off = sel_off};
    /* as many heads per unit as share a kv head (up to 4), fewer when that would leave threads idle */
    int group = n_head / n_head_kv;
    c.hpu = QW_MIN(group, ATTN_MAX_HPU);
    while (c.hpu > 1 && (int64_t)n_tok * n_head_kv * ((group + c.hpu - 1) / c.hpu) < 2 * b->n_threads) c.hpu /= 2;
    c.units_per_kv = (group + c.hpu - 1) / c.hpu;
    int64_t units = (int64_t)n_tok * n_head_kv * c.units_per_kv;
    int64_t work_est = (int64_t)n_tok * n_head * (pos0 + n_tok) * hd;
    if (b->n_threads == 1 || work_est < PAR_MIN_WORK) {
        attn_units(&c, 0, units);
        return;
    }
    qw_pool_parallel_for(b->pool, units, chunk_for(b, units, 1), attn_units, &c);
}

/* ---- QSA block scores by the kernel variant's qsa_scores, over the threads (the selection is the composite's) */

typedef struct {
    const qw_cpu_kernels *k;
    const float *q, *blk;
    float *score;
    int n_head, ihd;
    float inv_sqrt;
} qsa_ctx;

static void qsa_blocks(void *arg, int64_t b0, int64_t b1) {
    const qsa_ctx *c = arg;
    c->k->qsa_scores(c->score + b0, c->q, c->blk + b0 * c->ihd, (int)(b1 - b0), c->n_head, c->ihd, c->inv_sqrt);
}

static void cpu_qsa_select(const qw_backend *ops, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                           const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                           const qw_step *step) {
    const cpu_backend *b = backend_of(ops);
    if (!b->k->qsa_scores) {
        qw_op_qsa_select(ops, sel, sel_off, q, q_stride, blk, n_tok, n_head, ihd, R, topk, work, step);
        return;
    }
    int pos0 = step->pos0, blk_now = (pos0 + n_tok) / R;
    float *score = work;
    int *chosen = (int *)(score + blk_now + 1);
    int64_t n = 0;
    for (int t = 0; t < n_tok; t++) {
        int i = pos0 + t, n_b = (i + 1) / R;
        sel_off[t] = (int32_t)n;
        if (n_b > topk) { /* more blocks than the budget: score them (else all are kept) */
            qsa_ctx c = {.k = b->k, .q = q + t * q_stride, .blk = blk, .score = score, .n_head = n_head, .ihd = ihd,
                         .inv_sqrt = 1.0f / sqrtf((float)ihd)};
            if (b->n_threads == 1 || (int64_t)n_b * n_head * ihd < PAR_MIN_WORK)
                qsa_blocks(&c, 0, n_b);
            else
                qw_pool_parallel_for(b->pool, n_b, chunk_for(b, n_b, 8), qsa_blocks, &c);
        }
        n += qw_qsa_positions(score, n_b, topk, R, i, chosen, sel + n);
    }
    sel_off[n_tok] = (int32_t)n;
}

/* ---- delta rule */

#define DR_MAX_DV 1024

typedef struct {
    const cpu_backend *b;
    float *o, *state;
    const float *q, *k, *v, *g, *beta;
    int n_tok, hk, hv, dk, dv, tiled;
} dr_ctx;

/* Value head j over all tokens, in order: S = exp(g) S; u = beta (v - S^T k); S += k u^T; o = S^T q. */
static void dr_heads(void *arg, int64_t j0, int64_t j1) {
    const dr_ctx *c = arg;
    /* prefill: the chunked form, unless its scratch cannot be allocated */
    if (c->n_tok >= QW_DELTA_CHUNK_MIN_TOK && qw_delta_chunk_heads(c->b->k, c->o, c->state, c->q, c->k, c->v, c->g,
                                                                   c->beta, c->n_tok, c->hk, c->hv, c->dk, c->dv, c->tiled, j0, j1))
        return;
    const qw_cpu_kernels *K = c->b->k;
    int rep = c->hv / c->hk, dk = c->dk, dv = c->dv;
    float kv[DR_MAX_DV], u[DR_MAX_DV];
    for (int64_t j = j0; j < j1; j++) {
        float *S = c->state + j * dk * dv; /* [dk][dv] */
        for (int t = 0; t < c->n_tok; t++) {
            const int64_t hq = c->tiled ? j % c->hk : j / rep; /* its q/k head */
            const float *qj = c->q + ((int64_t)t * c->hk + hq) * dk;
            const float *kj = c->k + ((int64_t)t * c->hk + hq) * dk;
            const float *vj = c->v + ((int64_t)t * c->hv + j) * dv;
            float *oj = c->o + ((int64_t)t * c->hv + j) * dv;
            float decay = expf(c->g[(int64_t)t * c->hv + j]), bt = c->beta[(int64_t)t * c->hv + j];
            memset(kv, 0, (size_t)dv * sizeof(float));
            for (int r = 0; r < dk; r++) K->decay_acc(S + (int64_t)r * dv, decay, kv, kj[r], dv);
            for (int i = 0; i < dv; i++) u[i] = bt * (vj[i] - kv[i]);
            memset(oj, 0, (size_t)dv * sizeof(float));
            for (int r = 0; r < dk; r++) K->rank1_acc(S + (int64_t)r * dv, u, kj[r], oj, qj[r], dv);
        }
    }
}

static void cpu_delta_rule(const qw_backend *ops, float *o, float *state, const float *q, const float *k, const float *v,
                           const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled) {
    const cpu_backend *b = backend_of(ops);
    QW_ASSERT(dv <= DR_MAX_DV);
    dr_ctx c = {.b = b, .o = o, .state = state, .q = q, .k = k, .v = v, .g = g, .beta = beta, .n_tok = n_tok,
                .hk = hk, .hv = hv, .dk = dk, .dv = dv, .tiled = tiled};
    if (b->n_threads == 1 || (int64_t)n_tok * hv * dk * dv < PAR_MIN_WORK) {
        dr_heads(&c, 0, hv);
        return;
    }
    qw_pool_parallel_for(b->pool, hv, 1, dr_heads, &c);
}

/* ---- ops split into ranges, each range done by the table's kernel or the reference code */

typedef struct {
    const qw_backend *ref;
    const qw_cpu_kernels *ks; /* its sigmoid, silu, rms_norm_row, axpy and mul where it has them (else ref's) */
    float *y;
    const float *x, *a, *w;
    int dim, k, dil, n_head, head_stride, n_rot;
    float eps, s;
    int zc, n_scaled;
} range_ctx;

static void rms_rows(void *arg, int64_t r0, int64_t r1) {
    const range_ctx *c = arg;
    if (c->ks && c->ks->rms_norm_row) {
        for (int64_t r = r0; r < r1; r++)
            c->ks->rms_norm_row(c->y + r * c->dim, c->x + r * c->dim, c->w, c->dim, c->eps, c->zc);
        return;
    }
    c->ref->rms_norm(c->ref, c->y + r0 * c->dim, c->x + r0 * c->dim, c->w, (int)(r1 - r0), c->dim, c->eps, c->zc);
}

static void cpu_rms_norm(const qw_backend *ops, float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                         int zc) {
    const cpu_backend *b = backend_of(ops);
    range_ctx c = {.ref = qw_backend_ref(), .ks = b->k, .y = y, .x = x, .w = w, .dim = dim, .eps = eps, .zc = zc};
    if (b->n_threads == 1 || (int64_t)n_rows * dim < PAR_MIN_WORK) {
        rms_rows(&c, 0, n_rows);
        return;
    }
    qw_pool_parallel_for(b->pool, n_rows, chunk_for(b, n_rows, 1), rms_rows, &c);
}

static void l2_rows(void *arg, int64_t r0, int64_t r1) {
    const range_ctx *c = arg;
    int64_t ns = c->n_scaled - r0; /* the scaled rows of this range */
    ns = ns < 0 ? 0 : ns;
    c->ref->l2_norm(c->ref, c->y + r0 * c->dim, (int)(r1 - r0), c->dim, c->eps, c->s, (int)QW_MIN(ns, r1 - r0));
}

static void cpu_l2_norm(const qw_backend *ops, float *x, int n_rows, int dim, float eps, float scale, int n_scaled) {
    const cpu_backend *b = backend_of(ops);
    range_ctx c = {.ref = qw_backend_ref(), .y = x, .dim = dim, .eps = eps, .s = scale, .n_scaled = n_scaled};
    if (b->n_threads == 1 || (int64_t)n_rows * dim < PAR_MIN_WORK) {
        l2_rows(&c, 0, n_rows);
        return;
    }
    qw_pool_parallel_for(b->pool, n_rows, chunk_for(b, n_rows, 1), l2_rows, &c);
}

static void rope_toks(void *arg, int64_t t0, int64_t t1) {
    const range_ctx *c = arg;
    c->ref->rope(c->ref, c->y + t0 * c->dim, (int)(t1 - t0), c->dim, c->n_head, c->head_stride, c->n_rot,
                 c->a + t0 * c->n_rot);
}

static void cpu_rope(const qw_backend *ops, float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot,
                     const float *cs) {
    const cpu_backend *b = backend_of(ops);
    range_ctx c = {.ref = qw_backend_ref(), .y = x, .a = cs, .dim = row_stride, .n_head = n_head,
                   .head_stride = head_stride, .n_rot = n_rot};
    if (b->n_threads == 1 || (int64_t)n_tok * n_head * n_rot < PAR_MIN_WORK) {
        rope_toks(&c, 0, n_tok);
        return;
    }
    qw_pool_parallel_for(b->pool, n_tok, chunk_for(b, n_tok, 1), rope_toks, &c);
}

/* conv1d_dw in units of (token, block of CONV_BLOCK channels), so one decoded token spreads over the threads
 * too: each channel's sum is ref.c's, j = 0 .. k-1 in double from 0 (each product of two floats is exact in
 * double), written channel-inner so the compiler can vectorise it; the bits are the reference's. */
#define CONV_BLOCK 256

static void conv_units(void *arg, int64_t u0, int64_t u1) {
    const range_ctx *c = arg;
    int64_t nb = (c->dim + CONV_BLOCK - 1) / CONV_BLOCK;
    double acc[CONV_BLOCK];
    for (int64_t u = u0; u < u1; u++) {
        int64_t t = u / nb, c0 = u % nb * CONV_BLOCK, n = QW_MIN((int64_t)CONV_BLOCK, c->dim - c0);
        const float *w = c->w + c0 * c->k;
        for (int64_t i = 0; i < n; i++) acc[i] = 0;
        for (int j = 0; j < c->k; j++) {
            const float *x = c->x + (t + (int64_t)j * c->dil) * c->dim + c0;
            for (int64_t i = 0; i < n; i++) acc[i] += (double)w[i * c->k + j] * x[i];
        }
        float *y = c->y + t * c->dim + c0;
        for (int64_t i = 0; i < n; i++) y[i] = (float)acc[i];
    }
}

static void cpu_conv1d_dw(const qw_backend *ops, float *y, const float *x, const float *w, int n_tok, int ch, int k,
                          int dil, int then_silu) {
    const cpu_backend *b = backend_of(ops);
    range_ctx c = {.y = y, .x = x, .w = w, .dim = ch, .k = k, .dil = dil};
    int64_t units = (int64_t)n_tok * ((ch + CONV_BLOCK - 1) / CONV_BLOCK);
    if (b->n_threads == 1 || (int64_t)n_tok * ch * k < PAR_MIN_WORK)
        conv_units(&c, 0, units);
    else
        qw_pool_parallel_for(b->pool, units, chunk_for(b, units, 1), conv_units, &c);
    if (then_silu) ops->silu(ops, y, (int64_t)n_tok * ch);
}

/* element-wise ops */
static void silu_range(void *arg, int64_t i0, int64_t i1) {
    const range_ctx *c = arg;
    if (c->ks && c->ks->silu)
        c->ks->silu(c->y + i0, i1 - i0);
    else
        c->ref->silu(c->ref, c->y + i0, i1 - i0);
}
static void sigmoid_range(void *arg, int64_t i0, int64_t i1) {
    const range_ctx *c = arg;
    if (c->ks && c->ks->sigmoid)
        c->ks->sigmoid(c->y + i0, i1 - i0);
    else
        c->ref->sigmoid(c->ref, c->y + i0, i1 - i0);
}
static void mul_range(void *arg, int64_t i0, int64_t i1) {
    const range_ctx *c = arg;
    if (c->ks && c->ks->mul)
        c->ks->mul(c->y + i0, c->a + i0, c->x + i0, i1 - i0);
    else
        c->ref->mul(c->ref, c->y + i0, c->a + i0, c->x + i0, i1 - i0);
}
static void axpy_range(void *arg, int64_t i0, int64_t i1) {
    const range_ctx *c = arg;
    if (c->ks && c->ks->axpy)
        c->ks->axpy(c->y + i0, c->a + i0, c->s, i1 - i0);
    else
        c->ref->axpy(c->ref, c->y + i0, c->a + i0, c->s, i1 - i0);
}

/* an element-wise op over n elements, split over the threads from min_work elements on, in ranges of a multiple
 * of `align` */
static void elementwise(const cpu_backend *b, qw_pool_fn fn, range_ctx *c, int64_t n, int64_t min_work,
                        int64_t align) {
    if (b->n_threads == 1 || n < min_work) {
        fn(c, 0, n);
        return;
    }
    qw_pool_parallel_for(b->pool, n, chunk_for(b, n, align), fn, c);
}

/* sigmoid and silu cost an e^x per element (expd.h), some twenty times a multiply-add: split from 4096
 * elements on, in ranges of 1024, so decode's gates of 2048-8192 elements do not run on the calling thread
 * while the others wait */
#define EXP_MIN_WORK 4096
#define EXP_ALIGN 1024

static void cpu_silu(const qw_backend *ops, float *x, int64_t n) {
    range_ctx c = {.ref = qw_backend_ref(), .ks = backend_of(ops)->k, .y = x};
    elementwise(backend_of(ops), silu_range, &c, n, EXP_MIN_WORK, EXP_ALIGN);
}
static void cpu_sigmoid(const qw_backend *ops, float *x, int64_t n) {
    range_ctx c = {.ref = qw_backend_ref(), .ks = backend_of(ops)->k, .y = x};
    elementwise(backend_of(ops), sigmoid_range, &c, n, EXP_MIN_WORK, EXP_ALIGN);
}
static void cpu_mul(const qw_backend *ops, float *y, const float *a, const float *b, int64_t n) {
    range_ctx c = {.ref = qw_backend_ref(), .ks = backend_of(ops)->k, .y = y, .a = a, .x = b};
    elementwise(backend_of(ops), mul_range, &c, n, PAR_MIN_WORK, 4096);
}
static void cpu_axpy(const qw_backend *ops, float *y, const float *a, float s, int64_t n) {
    range_ctx c = {.ref = qw_backend_ref(), .ks = backend_of(ops)->k, .y = y, .a = a, .s = s};
    elementwise(backend_of(ops), axpy_range, &c, n, PAR_MIN_WORK, 4096);
}

static void cpu_get_rows(const qw_backend *ops, float *y, const qw_tensor *w, const int32_t *ids, int n) {
    (void)ops;
    qw_backend_ref()->get_rows(qw_backend_ref(), y, w, ids, n);
}

static size_t cpu_attention_work(const qw_backend *ops, int n_ctx, int hd) {
    (void)ops, (void)n_ctx, (void)hd;
    return 0; /* attention keeps its blocks on the stack */
}

/* ---- memory: host memory; in guard mode, activations and state in their own mappings */

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static void guard_set(cpu_backend *b, int open) {
    for (int i = 0; i < b->n_regions; i++)
        if (mprotect(b->regions[i].p, b->regions[i].bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) abort();
}

static void *cpu_alloc(const qw_backend *ops, size_t bytes, qw_mem_kind kind) {
    cpu_backend *b = (cpu_backend *)backend_of(ops);
    if (!b->guard || kind == QW_MEM_WEIGHTS) return qw_host_alloc(ops, bytes, kind);
    size_t n = page_round(bytes ? bytes : 1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    pthread_mutex_lock(&b->guard_lock);
    if (b->n_regions == b->cap_regions) {
        int cap = b->cap_regions ? 2 * b->cap_regions : 16;
        guard_region *r = qw_realloc(b->regions, (size_t)cap, sizeof(*r));
        if (!r) {
            pthread_mutex_unlock(&b->guard_lock);
            munmap(p, n);
            return NULL;
        }
        b->regions = r;
        b->cap_regions = cap;
    }
    b->regions[b->n_regions++] = (guard_region){p, n};
    pthread_mutex_unlock(&b->guard_lock);
    return p;
}

static void cpu_free(const qw_backend *ops, void *p) {
    cpu_backend *b = (cpu_backend *)backend_of(ops);
    if (!p) return;
    if (b->guard) {
        pthread_mutex_lock(&b->guard_lock);
        for (int i = 0; i < b->n_regions; i++)
            if (b->regions[i].p == p) {
                munmap(p, b->regions[i].bytes);
                b->regions[i] = b->regions[--b->n_regions];
                pthread_mutex_unlock(&b->guard_lock);
                return;
            }
        pthread_mutex_unlock(&b->guard_lock);
    }
    qw_host_free(ops, p);
}

static void cpu_release(qw_backend *ops) {
    cpu_backend *b = (cpu_backend *)backend_of(ops);
    qw_pool_free(b->pool);
    for (int i = 0; i < b->n_regions; i++) munmap(b->regions[i].p, b->regions[i].bytes);
    free(b->regions);
    if (b->guard) pthread_mutex_destroy(&b->guard_lock);
    free(b);
}

static const qw_backend cpu_table = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = qw_host_copy,
    .download = qw_host_copy,
    .copy = qw_host_copy,
    .zero = qw_host_zero,
    .sync = qw_host_sync,
    .matmul = cpu_matmul,
    .matmul_batch = cpu_matmul_batch,
    .get_rows = cpu_get_rows,
    .store_rows = qw_op_store_rows,
    .copy_strided = qw_op_copy_strided,
    .rms_norm = cpu_rms_norm,
    .rms_norm_grouped = qw_op_rms_norm_grouped,
    .l2_norm = cpu_l2_norm,
    .silu = cpu_silu,
    .sigmoid = cpu_sigmoid,
    .mul = cpu_mul,
    .axpy = cpu_axpy,
    .divide = qw_op_divide,
    .act_mul = qw_op_act_mul,
    .rms_norm_gate = qw_op_rms_norm_gate,
    .rope_table = qw_op_rope_table,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .attention_work = cpu_attention_work,
    .qsa_keys = qw_op_qsa_keys,
    .qsa_select = cpu_qsa_select,
    .qsa_select_work = qw_op_qsa_select_work,
    .conv1d_dw = cpu_conv1d_dw,
    .conv1d_state = qw_op_conv1d_state,
    .gdn_gate = qw_op_gdn_gate,
    .delta_rule = cpu_delta_rule,
    .moe_route = qw_op_moe_route,
    .moe_ffn = qw_op_moe_ffn,
    .moe_work = qw_op_moe_work,
    .hc_read = qw_op_hc_read,
    .hc_inject = qw_op_hc_inject,
    .ple_rows = qw_op_ple_rows,
    .ple_hist_push = qw_op_ple_hist_push,
    .argmax = qw_op_argmax,
    .topk = qw_op_topk,
    .ple_gather = qw_op_ple_gather,
    .ple_gate = qw_op_ple_gate,
    .release = cpu_release,
};

/* guard mode: the outermost call of the backend opens the guarded memory and closes it on its way out (a
 * composite op's own calls come back through the interposer, nested). One thread at a time. */
static int guard_enter(void *user, int op) {
    (void)op;
    cpu_backend *b = user;
    if (b->guard_depth++ == 0) guard_set(b, 1);
    return 1;
}

static void guard_leave(void *user, int op, const qw_matmul_job *jobs, int n_jobs) {
    (void)op, (void)jobs, (void)n_jobs;
    cpu_backend *b = user;
    if (--b->guard_depth == 0) guard_set(b, 0);
}

static void guard_release(void *user) { cpu_release(&((cpu_backend *)user)->ops); }

qwenc_status qw_backend_cpu_new(int n_threads, const char *kernels, int guard, qw_backend **out, char *err,
                                size_t errlen) {
    *out = NULL;
    cpu_backend *b = qw_calloc(1, sizeof(*b));
    if (!b) return qw_err_nomem(err, errlen, "cpu backend", 1, sizeof(*b));
    b->n_threads = 1;
    if (kernels && !strcmp(kernels, "ref")) {
        b->ops = *qw_backend_ref();
        b->ops.alloc = cpu_alloc;
        b->ops.free = cpu_free;
        b->ops.release = cpu_release;
    } else {
        b->k = qw_cpu_kernels_find(kernels);
        if (!b->k) {
            char names[128] = "";
            for (const qw_cpu_kernels *const *k = qw_cpu_kernels_available(); *k; k++)
                snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s, ", (*k)->name);
            free(b);
            return qw_err(err, errlen, QWENC_ERR_UNSUPPORTED,
                          "kernels \"%s\" are not available on this CPU (available: %sref)", kernels, names);
        }
        b->ops = cpu_table;
        b->ops.name = b->k->name;
        b->n_threads = n_threads > 0 ? n_threads : qw_cpu_count();
        if (b->n_threads > 1 && !(b->pool = qw_pool_new(b->n_threads))) {
            int n = b->n_threads;
            free(b);
            return qw_err(err, errlen, QWENC_ERR_NOMEM, "cannot start %d threads", n);
        }
    }
    if (guard) {
        b->guard = 1;
        pthread_mutex_init(&b->guard_lock, NULL);
        qw_backend_hooks h = {.enter = guard_enter, .leave = guard_leave, .release = guard_release, .user = b};
        if (!(b->guarded = qw_backend_interpose(&b->ops, &h))) {
            cpu_release(&b->ops);
            return qw_err_nomem(err, errlen, "cpu backend guard", 1, sizeof(qw_backend));
        }
        *out = b->guarded;
        return QWENC_OK;
    }
    *out = &b->ops;
    return QWENC_OK;
}

/* the CPU backend under a guard interposer, or the backend itself */
static cpu_backend *cpu_of(const qw_backend *be) {
    for (const qw_backend *inner; (inner = qw_backend_interposed(be));) be = inner;
    return (cpu_backend *)backend_of(be);
}

int qw_backend_cpu_n_threads(const qw_backend *be) { return cpu_of(be)->n_threads; }

void qw_backend_cpu_set_f32_activations(const qw_backend *be, int on) {
    cpu_backend *b = cpu_of(be);
    if (b->ops.matmul == cpu_matmul) b->f32_act = on;
}

/* The best kernels on the calling thread only: for callers without a model (tools, tests). */
static cpu_backend default_backend;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void default_init(void) {
    default_backend.k = qw_cpu_kernels_find(NULL);
    default_backend.ops = cpu_table;
    default_backend.ops.name = default_backend.k->name;
    default_backend.ops.release = NULL;
    default_backend.n_threads = 1;
}

const qw_backend *qw_backend_cpu_default(void) {
    pthread_once(&default_once, default_init);
    return &default_backend.ops;
}
