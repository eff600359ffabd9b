/*
 * t_cuda_quant.c - the CUDA backend's weight kernels (src/cuda/quant.cu) against the host, for every weight type
 * qwenc reads: random weights quantized by the host's quantizers (tensor/quant.h), the device's results compared
 * with the host's dequantization (bit for bit) and with qw_ref_dot_row (double sums).
 *
 *   get_rows, gather_rows: bit-identical to qw_dequantize of the same rows.
 *   matmul, n_tok <= 16 (quant.cu's matrix-vector kernels) and matmul_pairs:
 *       |device - ref| <= (n/32 + 48) * 2^-24 * M + n * 2^-149,  M = sum_j (|a q_j| + |b|) |x_j|,
 *       n the row length, the weight w_j = a q_j + b (a the block or sub-block scale, b the min of Q4_1, Q5_1 and
 *       the K-quants' -dmin*m, else 0). The kernels sum f32 products over groups of at most 32 elements, scale
 *       each group's sum once (or use the exact w_j), add a lane's at most n/1024 + 1 items in turn, then a tree
 *       of at most 7 levels over lanes and warps: no term goes through more than 32 + 3 + n/32 + 8 roundings,
 *       and the host's w_j, rounded from a q_j + b, is within 2^-24 |w_j| of it (the +48 covers both).
 *       M comes from the host's dequantizer itself: with the min field zeroed it gives a q_j, with the scale
 *       zeroed b; for the types without a min, M = sum |w_j x_j|.
 *   matmul, n_tok > 16 (the host's exact w_j in f32 tiles, cuBLAS SGEMM in f32; BF16: x split exactly into three
 *       bf16 pieces and one bf16 GEMM with f32 accumulation, every product exact):
 *       |device - ref| <= (n + 4) * 2^-24 * sum_j |w_j x_j| + n * 2^-149: an f32 sum of n exact-operand
 *       products in any order and any tree.
 * Shapes: rows of one to 67 (odd counts, a last row group of 1..3), row lengths of one block, one chunk and a
 * partial one, 4096, and odd lengths for the plain types (the fallback kernel); 1..9, 17, 64, 300 tokens; weights
 * at a 16-byte boundary and 2 bytes off it, x 4 bytes off one (the fallback); a matrix of 262144 x 16384 Q8_0
 * (4.5 GB: byte offsets past 2^32, GEMM tiles) checked on sampled rows; and the decode-sized calls recorded as a
 * CUDA graph and replayed (no synchronisation or allocation inside them), giving the direct calls' bits.
 *
 * With 8-bit activations (the integer path of quantized weights, quant.cu's mvq_kernel, up to 16 tokens and the
 * pairs): against the host's integer reference qw_q8a_dot_ref on the host's rounding of x (kernels/q8a.h), within
 *       |device - ref| <= (n/32 + 48) * 2^-24 * qw_q8a_dot_abs + n * 2^-149
 * (the same exact integers; only the order of the f32 additions of the group terms differs: a lane's at most
 * n/1024 + 1 in turn, then 5 butterfly levels), and every token of a pass of n_tok the bits of a pass of one (a
 * draft step gives one-token steps' logits), and the recorded graph's replays the direct calls' bits. More than
 * 16 tokens (the tensor-core GEMM, src/cuda/mmq.cu), and its grouped form over several matrices (the MoE's
 * prompt steps; an empty group, a group of two tiles): qw_q8a_dot_ref's bits.
 *
 * The kernels run on a stand-in for the backend (stream, cuBLAS handle, scratch): weak definitions, so that the
 * library's own backend.cu, when linked, does not clash (the first check tells which one runs). Without a CUDA
 * device it prints SKIP and passes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_util.h"
#include "kernels/ops.h"
#include "kernels/q8a.h"
#include "tensor/quant.h"

/* ---- the CUDA runtime and cuBLAS functions used (C linkage, from libcudart / libcublas; the test is plain C
 * built without the toolkit's headers): enums as int, handles and streams as pointers */
int cudaGetDeviceCount(int *n);
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
int cudaStreamCreateWithFlags(void **s, unsigned flags);
int cudaStreamSynchronize(void *s);
int cudaStreamDestroy(void *s);
int cudaGetLastError(void);
const char *cudaGetErrorString(int e);
int cudaStreamBeginCapture(void *s, int mode);
int cudaStreamEndCapture(void *s, void **graph);
int cudaGraphInstantiate(void **exec, void *graph, unsigned long long flags);
int cudaGraphLaunch(void *exec, void *s);
int cudaGraphExecDestroy(void *exec);
int cudaGraphDestroy(void *graph);
int cublasCreate_v2(void **h);
int cublasSetStream_v2(void *h, void *s);
int cublasSetMathMode(void *h, int mode);
int cublasDestroy_v2(void *h);
enum { H2D = 1, D2H = 2, STREAM_NONBLOCKING = 1, CAPTURE_THREAD_LOCAL = 1, CUBLAS_PEDANTIC = 2 };

/* ---- the kernels under test (cuda_internal.cuh) */
struct qwc;
void qwc_matmul(struct qwc *c, float *y, const qw_tensor *w, const float *x, int n_tok);
void qwc_get_rows(struct qwc *c, float *y, const qw_tensor *w, const int32_t *ids, int n);
void qwc_gather_rows(struct qwc *c, float *y, const void *const *chunk_data, qw_type type, int64_t dh, int n_chunks,
                     int64_t chunk_rows, const int64_t *rows, int64_t n);
void qwc_matmul_pairs(struct qwc *c, float *y, const void *const *mats, qw_type type, int64_t rows, int64_t cols,
                      const float *x, int64_t x_stride, int n_pairs);
void qwc_mmq_tiles(struct qwc *c, int32_t *tiles, const int32_t *offs, int E);
int qwc_mmq_slices(int64_t rows, int64_t cols, int n_tok);
void qwc_mmq_grouped(struct qwc *c, float *y, int64_t ldy, const void *const *tab, qw_type t, int64_t rows,
                     int64_t cols, const qw_q8a *xq, const int32_t *offs, const int32_t *tiles, int E, int n_rows);

/* ---- the stand-in backend: what quant.cu asks of backend.cu. Its object sits in a zeroed 4 KiB block, so that
 * backend.cu's accessors, should they be linked instead, read zeros (and the first check fails) rather than
 * beyond the object. */
struct qwc {
    void *stream, *cublas, *scratch;
    size_t scratch_bytes;
    int q8;       /* 8-bit activations on */
    void *q8_buf; /* Q8_BYTES */
};
#define Q8_BYTES ((size_t)4 << 20)
static union {
    struct qwc q;
    char pad[4096];
} standin;
static struct qwc *C = &standin.q;

static void cuda_ok(int e, const char *what) {
    if (e) {
        printf("FAIL %s: CUDA error %d (%s)\n", what, e, cudaGetErrorString(e));
        printf("%d passed, %d failed\n", n_pass, n_fail + 1);
        exit(1);
    }
}

__attribute__((weak)) void qwc_die(const char *file, int line, const char *what, const char *msg) {
    printf("FAIL %s:%d: CUDA error in %s: %s\n", file, line, what, msg);
    printf("%d passed, %d failed\n", n_pass, n_fail + 1);
    fflush(stdout);
    abort();
}
__attribute__((weak)) void *qwc_stream(const struct qwc *c) { return c->stream; }
__attribute__((weak)) void *qwc_cublas(const struct qwc *c) { return c->cublas; }
__attribute__((weak)) int qwc_capture_spoil(struct qwc *c) {
    (void)c;
    return 0;
}
__attribute__((weak)) int qwc_q8_on(const struct qwc *c) { return c->q8 && c->q8_buf; }
__attribute__((weak)) void *qwc_q8_buf(struct qwc *c, size_t *bytes) {
    *bytes = c->q8_buf ? Q8_BYTES : 0;
    return c->q8_buf;
}
__attribute__((weak)) void qwc_q8_keep(struct qwc *c, int on) { (void)c, (void)on; }
__attribute__((weak)) int qwc_q8_same(const struct qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    (void)c, (void)x, (void)ldx, (void)cols, (void)n_rows;
    return 0;
}
__attribute__((weak)) void qwc_q8_note(struct qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    (void)c, (void)x, (void)ldx, (void)cols, (void)n_rows;
}
__attribute__((weak)) int qwc_q8_fresh(const struct qwc *c, const float *x, int64_t ldx, int64_t cols, int64_t n_rows) {
    (void)c, (void)x, (void)ldx, (void)cols, (void)n_rows;
    return 0;
}
__attribute__((weak)) void *qwc_q8_big(struct qwc *c, size_t bytes) { /* no prompt's buffer: the scratch serves */
    (void)c, (void)bytes;
    return NULL;
}
__attribute__((weak)) void *qwc_scratch(struct qwc *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return c->scratch;
    cuda_ok(cudaStreamSynchronize(c->stream), "scratch: sync");
    if (c->scratch) cuda_ok(cudaFree(c->scratch), "scratch: free");
    cuda_ok(cudaMalloc(&c->scratch, bytes), "scratch: cudaMalloc");
    c->scratch_bytes = bytes;
    return c->scratch;
}

/* ---- device memory */
static void *dalloc(size_t n) {
    void *p = NULL;
    cuda_ok(cudaMalloc(&p, n ? n : 1), "cudaMalloc");
    return p;
}
static void sync_ok(const char *what) { cuda_ok(cudaStreamSynchronize(C->stream), what); }
static void up(void *d, const void *h, size_t n) {
    cuda_ok(cudaMemcpyAsync(d, h, n, H2D, C->stream), "upload");
    sync_ok("upload");
}
static void down(void *h, const void *d, size_t n) {
    cuda_ok(cudaMemcpyAsync(h, d, n, D2H, C->stream), "download");
    sync_ok("kernels before a download");
}
static void *dup_to_device(const void *h, size_t n) {
    void *d = dalloc(n);
    up(d, h, n);
    return d;
}

/* ---- random data */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* xorshift64, [0, 1) */
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

/* Weights with outliers (they set block scales), stretches with an offset (non-zero mins), tiny values (f16
 * subnormals), and row 1 all zero. */
static void fill_weights(float *w, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v = nrand();
            if (c % 97 == 5) v *= 30.0f;
            if (c % 61 < 20) v += 0.7f;
            if (c % 53 == 7) v *= 1e-6f;
            w[r * cols + c] = r == 1 ? 0.0f : v;
        }
}
static void fill_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = nrand() * (i % 89 == 3 ? 100.0f : 1.0f);
}

/* ---- a matrix of one type, on the host and the device */
typedef struct {
    qw_type type;
    int64_t rows, cols, row_bytes;
    uint8_t *q;      /* host bytes */
    float *deq;      /* host dequantization [rows][cols] */
    float *aq, *b;   /* |a q| and |b| of every element (see the top comment) */
    uint8_t *dbuf;   /* device allocation; the data starts at dbuf + mis */
    int mis;
} mat;

/* the types with a min: d (or the super-block scale) at byte 0 of a block, the min (m, dmin) at byte 2 */
static int has_min(qw_type t) { return t == QW_TYPE_Q4_1 || t == QW_TYPE_Q5_1 || t == QW_TYPE_Q4_K || t == QW_TYPE_Q5_K; }

static void mat_make(mat *m, qw_type t, int64_t rows, int64_t cols, int mis) {
    m->type = t, m->rows = rows, m->cols = cols, m->mis = mis;
    m->row_bytes = (int64_t)qw_type_row_size(t, cols);
    size_t bytes = (size_t)(rows * m->row_bytes), n = (size_t)(rows * cols);
    float *wf = malloc(n * sizeof(float));
    fill_weights(wf, rows, cols);
    m->q = malloc(bytes + 1);
    for (int64_t r = 0; r < rows; r++) qw_quantize(t, wf + r * cols, m->q + r * m->row_bytes, cols);
    free(wf);
    m->deq = malloc(n * sizeof(float));
    m->aq = malloc(n * sizeof(float));
    m->b = malloc(n * sizeof(float));
    qw_dequantize(t, m->q, m->deq, (int64_t)n);
    if (has_min(t)) {
        int bb = qw_type_traits_of(t)->block_bytes;
        uint8_t *c = malloc(bytes + 1);
        memcpy(c, m->q, bytes);
        for (size_t i = 0; i < bytes; i += (size_t)bb) c[i + 2] = c[i + 3] = 0;
        qw_dequantize(t, c, m->aq, (int64_t)n);
        memcpy(c, m->q, bytes);
        for (size_t i = 0; i < bytes; i += (size_t)bb) c[i] = c[i + 1] = 0;
        qw_dequantize(t, c, m->b, (int64_t)n);
        free(c);
    } else {
        memcpy(m->aq, m->deq, n * sizeof(float));
        memset(m->b, 0, n * sizeof(float));
    }
    m->dbuf = dalloc(bytes + (size_t)mis);
    up(m->dbuf + mis, m->q, bytes);
}

static void mat_free(mat *m) {
    free(m->q), free(m->deq), free(m->aq), free(m->b);
    cuda_ok(cudaFree(m->dbuf), "cudaFree");
}

static qw_tensor mat_tensor(const mat *m, int device) {
    qw_tensor t = {.name = "w", .data = device ? (const void *)(m->dbuf + m->mis) : (const void *)m->q, .type = m->type,
                   .n_dims = 2, .shape = {m->rows, m->cols}};
    return t;
}

/* ---- comparisons */
#define U24 (1.0 / 16777216.0)
#define SUB 1.401298464324817e-45 /* 2^-149 */

typedef struct { /* the worst element of a comparison */
    double ratio, got, ref, bound;
    int64_t row;
    int tok;
} worst;

static double worst_mv[QW_TYPE_COUNT], worst_gemm[QW_TYPE_COUNT];

/* y [n_tok][rows] of device row r (host matrix row src(r)) against qw_ref_dot_row; gemm: the SGEMM bound */
static worst compare(const mat *m, const float *y, int64_t rows, const int64_t *src, const float *x, int64_t x_stride,
                     int n_tok, int gemm) {
    worst w = {0, 0, 0, 0, -1, -1};
    qw_tensor ht = mat_tensor(m, 0);
    const int64_t n = m->cols;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t sr = src ? src[r] : r;
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + t * x_stride;
            double ref = qw_ref_dot_row(&ht, sr, xt, n), mag = 0, M = 0;
            for (int64_t c = 0; c < n; c++) {
                mag += fabs((double)m->deq[sr * n + c] * xt[c]);
                M += (fabs((double)m->aq[sr * n + c]) + fabs((double)m->b[sr * n + c])) * fabs((double)xt[c]);
            }
            double bound = gemm ? (n + 4) * U24 * mag : (n / 32.0 + 48) * U24 * M;
            bound += n * SUB;
            double got = y[t * rows + r], err = fabs(got - ref), ratio = err / bound;
            if (!(err <= bound)) ratio = INFINITY; /* NaN too */
            if (ratio >= w.ratio) w = (worst){ratio, got, ref, bound, r, t};
        }
    }
    double *wt = gemm ? &worst_gemm[m->type] : &worst_mv[m->type];
    if (w.ratio > *wt) *wt = w.ratio;
    return w;
}

#define CHECK_WORST(w, ...)                                                                                       \
    CHECK((w).ratio <= 1.0, "%s: error %.3g times the bound at row %lld, token %d: device %.9g, reference %.9g, "  \
          "bound %.3g", (snprintf(desc, sizeof(desc), __VA_ARGS__), desc), (w).ratio, (long long)(w).row, (w).tok,  \
          (w).got, (w).ref, (w).bound)
static char desc[256];

/* ---- the checks */

/* matmul of m with n_tok tokens (x aligned, or 4 bytes off when xmis) */
static void check_matmul(const mat *m, int n_tok, int xmis) {
    const int64_t rows = m->rows, cols = m->cols;
    float *x = malloc((size_t)(n_tok * cols) * sizeof(float)), *y = malloc((size_t)(n_tok * rows) * sizeof(float));
    fill_x(x, n_tok * cols);
    float *dx = dalloc((size_t)(n_tok * cols + 4) * sizeof(float)), *dy = dalloc((size_t)(n_tok * rows) * sizeof(float));
    up(dx + xmis, x, (size_t)(n_tok * cols) * sizeof(float));
    qw_tensor t = mat_tensor(m, 1);
    qwc_matmul(C, dy, &t, dx + xmis, n_tok);
    down(y, dy, (size_t)(n_tok * rows) * sizeof(float));
    const int gemm = n_tok > 16;
    worst w = compare(m, y, rows, NULL, x, cols, n_tok, gemm);
    CHECK_WORST(w, "matmul %s [%lld, %lld] n_tok %d (%s, weights %+d bytes, x %+d)", qw_type_name(m->type),
                (long long)rows, (long long)cols, n_tok, gemm ? "gemm" : "matrix-vector", m->mis, 4 * xmis);
    free(x), free(y);
    cuda_ok(cudaFree(dx), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
}

/* the matrix-vector kernels' bound of a row's integer dot against qw_q8a_dot_ref (n columns) */
static double q8_bound(qw_type t, const uint8_t *row, const qw_q8a *xq, int64_t n) {
    return (n / 32.0 + 48) * U24 * qw_q8a_dot_abs(t, row, xq, n) + n * SUB;
}

/* y [n_tok][rows] against qw_q8a_dot_ref of the host's 8-bit rounding of each token's x */
static worst compare_q8(const mat *m, const float *y, const float *x, int64_t x_stride, int n_tok) {
    worst w = {0, 0, 0, 0, -1, -1};
    const int64_t n = m->cols, rows = m->rows;
    qw_q8a *xq = malloc((size_t)(n / 32) * sizeof(qw_q8a));
    for (int t = 0; t < n_tok; t++) {
        qw_q8a_quantize(x + t * x_stride, xq, n);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = m->q + r * m->row_bytes;
            double ref = qw_q8a_dot_ref(m->type, row, xq, n);
            double bound = q8_bound(m->type, row, xq, n);
            double got = y[t * rows + r], err = fabs(got - ref), ratio = err / bound;
            if (!(err <= bound)) ratio = INFINITY;
            if (ratio >= w.ratio) w = (worst){ratio, got, ref, bound, r, t};
        }
    }
    free(xq);
    return w;
}

static int n_sliced; /* narrow products checked in column slices */

/* QWENC_CUDA_MMQ_FAST set (as mmq.cu reads it: any value not starting with 0): the GEMM's terms as fused
 * multiply-adds, so its outputs are held to the matrix-vector kernels' bound, not to qw_q8a_dot_ref's bits */
static int mmq_fused(void) {
    const char *e = getenv("QWENC_CUDA_MMQ_FAST");
    return e && e[0] && e[0] != '0';
}

/* matmul with 8-bit activations: the integer reference, and each token the bits of a one-token call; the
 * tensor-core GEMM (more than 16 tokens) qw_q8a_dot_ref's bits, or, a narrow product cut into column slices, the
 * reference within the matrix-vector kernels' bound */
static void check_matmul_q8(const mat *m, int n_tok, int xmis) {
    const int64_t rows = m->rows, cols = m->cols;
    float *x = malloc((size_t)(n_tok * cols) * sizeof(float)), *y = malloc((size_t)(n_tok * rows) * sizeof(float));
    float *y1 = malloc((size_t)rows * sizeof(float));
    fill_x(x, n_tok * cols);
    float *dx = dalloc((size_t)(n_tok * cols + 4) * sizeof(float)), *dy = dalloc((size_t)(n_tok * rows) * sizeof(float));
    up(dx + xmis, x, (size_t)(n_tok * cols) * sizeof(float));
    qw_tensor t = mat_tensor(m, 1);
    C->q8 = 1;
    qwc_matmul(C, dy, &t, dx + xmis, n_tok);
    down(y, dy, (size_t)(n_tok * rows) * sizeof(float));
    const int slices = n_tok > 16 ? qwc_mmq_slices(rows, cols, n_tok) : 1;
    if (n_tok > 16 && (slices > 1 || mmq_fused())) {
        worst w = compare_q8(m, y, x, cols, n_tok);
        CHECK_WORST(w, "matmul q8 %s [%lld, %lld] n_tok %d (gemm in %d column slices%s, weights %+d bytes, x %+d)",
                    qw_type_name(m->type), (long long)rows, (long long)cols, n_tok, slices,
                    mmq_fused() ? ", fused terms" : "", m->mis, 4 * xmis);
        n_sliced += slices > 1;
        goto done;
    }
    if (n_tok > 16) { /* the tensor-core GEMM: qw_q8a_dot_ref's bits */
        int64_t bad = -1;
        float want = 0;
        qw_q8a *xq = malloc((size_t)(cols / 32) * sizeof(qw_q8a));
        for (int tk = 0; tk < n_tok && bad < 0; tk++) {
            qw_q8a_quantize(x + tk * cols, xq, cols);
            for (int64_t r = 0; r < rows && bad < 0; r++) {
                want = qw_q8a_dot_ref(m->type, m->q + r * m->row_bytes, xq, cols);
                if (memcmp(&want, &y[tk * rows + r], 4)) bad = tk * rows + r;
            }
        }
        CHECK(bad < 0, "matmul q8 %s [%lld, %lld] n_tok %d (gemm, weights %+d bytes, x %+d): token %lld row %lld is "
              "%.9g, qw_q8a_dot_ref %.9g", qw_type_name(m->type), (long long)rows, (long long)cols, n_tok, m->mis,
              4 * xmis, bad < 0 ? 0LL : (long long)(bad / rows), bad < 0 ? 0LL : (long long)(bad % rows),
              bad < 0 ? 0.0 : y[bad], (double)want);
        free(xq);
        goto done;
    }
    worst w = compare_q8(m, y, x, cols, n_tok);
    CHECK_WORST(w, "matmul q8 %s [%lld, %lld] n_tok %d (weights %+d bytes, x %+d)", qw_type_name(m->type),
                (long long)rows, (long long)cols, n_tok, m->mis, 4 * xmis);
    int same = 1;
    for (int k = 0; k < n_tok && n_tok > 1; k++) {
        qwc_matmul(C, dy, &t, dx + xmis + k * cols, 1);
        down(y1, dy, (size_t)rows * sizeof(float));
        same &= memcmp(y1, y + k * rows, (size_t)rows * sizeof(float)) == 0;
    }
    CHECK(same, "matmul q8 %s [%lld, %lld] n_tok %d: a token's outputs are not the bits of a one-token call",
          qw_type_name(m->type), (long long)rows, (long long)cols, n_tok);
done:
    C->q8 = 0;
    free(x), free(y), free(y1);
    cuda_ok(cudaFree(dx), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
}

/* get_rows: the first, the last, row 1 (all zero) and random rows, bit for bit */
static void check_get_rows(const mat *m) {
    int32_t ids[7] = {0, (int32_t)m->rows - 1, m->rows > 1 ? 1 : 0};
    for (int i = 3; i < 7; i++) ids[i] = (int32_t)(urand() * (double)m->rows);
    const int64_t cols = m->cols;
    int32_t *dids = dup_to_device(ids, sizeof(ids));
    float *dy = dalloc((size_t)(7 * cols) * sizeof(float)), *y = malloc((size_t)(7 * cols) * sizeof(float));
    qw_tensor t = mat_tensor(m, 1);
    qwc_get_rows(C, dy, &t, dids, 7);
    down(y, dy, (size_t)(7 * cols) * sizeof(float));
    int64_t bad = -1;
    for (int i = 0; i < 7 && bad < 0; i++)
        for (int64_t c = 0; c < cols; c++)
            if (memcmp(&y[i * cols + c], &m->deq[ids[i] * cols + c], 4)) {
                bad = i * cols + c;
                break;
            }
    CHECK(bad < 0, "get_rows %s [%lld, %lld] (weights %+d bytes): output %lld (row %d, column %lld) is %.9g, the host "
          "dequantizes %.9g", qw_type_name(m->type), (long long)m->rows, (long long)cols, m->mis, (long long)bad,
          bad < 0 ? 0 : ids[bad / cols], bad < 0 ? 0LL : (long long)(bad % cols), bad < 0 ? 0.0 : y[bad],
          bad < 0 ? 0.0 : m->deq[ids[bad / cols] * cols + bad % cols]);
    free(y);
    cuda_ok(cudaFree(dids), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
}

/* gather_rows from a table of the matrix's rows in chunks of 3 (each its own allocation; the last shorter) */
static void check_gather(const mat *m) {
    const int64_t chunk_rows = 3, cols = m->cols, n = 9;
    const int n_chunks = (int)((m->rows + chunk_rows - 1) / chunk_rows);
    void **chunks = malloc((size_t)n_chunks * sizeof(void *));
    for (int k = 0; k < n_chunks; k++) {
        int64_t r0 = k * chunk_rows, nr = m->rows - r0 < chunk_rows ? m->rows - r0 : chunk_rows;
        chunks[k] = dup_to_device(m->q + r0 * m->row_bytes, (size_t)(nr * m->row_bytes));
    }
    int64_t rows[9] = {m->rows - 1, 0};
    for (int i = 2; i < n; i++) rows[i] = (int64_t)(urand() * (double)m->rows);
    void *dchunks = dup_to_device(chunks, (size_t)n_chunks * sizeof(void *));
    int64_t *drows = dup_to_device(rows, sizeof(rows));
    float *dy = dalloc((size_t)(n * cols) * sizeof(float)), *y = malloc((size_t)(n * cols) * sizeof(float));
    qwc_gather_rows(C, dy, dchunks, m->type, cols, n_chunks, chunk_rows, drows, n);
    down(y, dy, (size_t)(n * cols) * sizeof(float));
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        for (int64_t c = 0; c < cols; c++)
            if (memcmp(&y[i * cols + c], &m->deq[rows[i] * cols + c], 4)) {
                bad = i * cols + c;
                break;
            }
    CHECK(bad < 0, "gather_rows %s dh %lld, %d chunks of %lld: output %lld (row %lld, column %lld) differs from the "
          "host's dequantization", qw_type_name(m->type), (long long)cols, n_chunks, (long long)chunk_rows,
          (long long)bad, bad < 0 ? 0LL : (long long)rows[bad / cols], bad < 0 ? 0LL : (long long)(bad % cols));
    for (int k = 0; k < n_chunks; k++) cuda_ok(cudaFree(chunks[k]), "cudaFree");
    free(chunks), free(y);
    cuda_ok(cudaFree(dchunks), "cudaFree"), cuda_ok(cudaFree(drows), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
}

/* matmul_pairs over 3 matrices of m's type and shape, 7 pairs; x per pair (stride cols, or cols + 1: the fallback)
 * or one x for all (stride 0); q8: with 8-bit activations, against the integer reference */
static void check_pairs(const mat *mats, int64_t x_stride, int q8) {
    enum { NP = 7 };
    static const int which[NP] = {0, 1, 2, 0, 2, 1, 1};
    const int64_t rows = mats[0].rows, cols = mats[0].cols, xn = x_stride ? (NP - 1) * x_stride + cols : cols;
    float *x = malloc((size_t)xn * sizeof(float)), *y = malloc((size_t)(NP * rows) * sizeof(float));
    fill_x(x, xn);
    const void *ptrs[NP];
    for (int p = 0; p < NP; p++) ptrs[p] = mats[which[p]].dbuf + mats[which[p]].mis;
    void *dptrs = dup_to_device(ptrs, sizeof(ptrs));
    float *dx = dup_to_device(x, (size_t)xn * sizeof(float)), *dy = dalloc((size_t)(NP * rows) * sizeof(float));
    C->q8 = q8;
    qwc_matmul_pairs(C, dy, dptrs, mats[0].type, rows, cols, dx, x_stride, NP);
    C->q8 = 0;
    down(y, dy, (size_t)(NP * rows) * sizeof(float));
    worst wp = {0, 0, 0, 0, -1, -1};
    int wpair = -1;
    for (int p = 0; p < NP; p++) {
        worst w = q8 ? compare_q8(&mats[which[p]], y + p * rows, x + p * x_stride, 0, 1)
                     : compare(&mats[which[p]], y + p * rows, rows, NULL, x + p * x_stride, 0, 1, 0);
        if (w.ratio >= wp.ratio) wp = w, wpair = p;
    }
    CHECK_WORST(wp, "matmul_pairs%s %s [%lld, %lld] x_stride %lld, pair %d", q8 ? " q8" : "", qw_type_name(mats[0].type),
                (long long)rows, (long long)cols, (long long)x_stride, wpair);
    free(x), free(y);
    cuda_ok(cudaFree(dptrs), "cudaFree"), cuda_ok(cudaFree(dx), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
}

/* The decode-sized calls recorded as a graph and replayed twice, with new inputs in between: each replay gives
 * the bits of the same calls made directly. */
static void check_graph(const mat *m) {
    const int64_t rows = m->rows, cols = m->cols, nt = 5;
    /* y: matmul [nt][rows], then matmul_pairs [rows], then get_rows [3][cols] */
    const size_t xb = (size_t)(nt * cols) * sizeof(float), yb = (size_t)((nt + 1) * rows + 3 * cols) * sizeof(float);
    float *x = malloc(xb), *y1 = malloc(yb), *y2 = malloc(yb);
    float *dx = dalloc(xb), *dy = dalloc(yb);
    int32_t ids[3] = {0, (int32_t)rows - 1, 1}, *dids = dup_to_device(ids, sizeof(ids));
    const void *ptr = m->dbuf + m->mis;
    void *dptr = dup_to_device(&ptr, sizeof(ptr));
    qw_tensor t = mat_tensor(m, 1);
    void *graph = NULL, *exec = NULL;
    cuda_ok(cudaStreamBeginCapture(C->stream, CAPTURE_THREAD_LOCAL), "begin capture");
    qwc_matmul(C, dy, &t, dx, 1);
    qwc_matmul(C, dy + rows, &t, dx + cols, (int)nt - 1);
    qwc_matmul_pairs(C, dy + nt * rows, dptr, m->type, rows, cols, dx, 0, 1);
    qwc_get_rows(C, dy + nt * rows + rows, &t, dids, 3);
    int e = cudaStreamEndCapture(C->stream, &graph);
    CHECK(e == 0, "graph %s: capture failed: %s (a synchronisation or an allocation in a decode-sized call)",
          qw_type_name(m->type), cudaGetErrorString(e));
    if (e) {
        cudaGetLastError();
        goto out;
    }
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
    for (int round = 0; round < 2; round++) {
        fill_x(x, nt * cols);
        up(dx, x, xb);
        cuda_ok(cudaGraphLaunch(exec, C->stream), "graph launch");
        down(y1, dy, yb);
        qwc_matmul(C, dy, &t, dx, 1);
        qwc_matmul(C, dy + rows, &t, dx + cols, (int)nt - 1);
        qwc_matmul_pairs(C, dy + nt * rows, dptr, m->type, rows, cols, dx, 0, 1);
        qwc_get_rows(C, dy + nt * rows + rows, &t, dids, 3);
        down(y2, dy, yb);
        CHECK(memcmp(y1, y2, yb) == 0, "graph %s [%lld, %lld]: replay %d differs from the direct "
              "calls", qw_type_name(m->type), (long long)rows, (long long)cols, round);
    }
    cuda_ok(cudaGraphExecDestroy(exec), "graph destroy");
    cuda_ok(cudaGraphDestroy(graph), "graph destroy");
out:
    free(x), free(y1), free(y2);
    cuda_ok(cudaFree(dx), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree"), cuda_ok(cudaFree(dids), "cudaFree");
    cuda_ok(cudaFree(dptr), "cudaFree");
}

/* qwc_mmq_grouped over 3 matrices of m's shape (one 2 bytes off), rows n0, 0 and n2 of x (an empty expert):
 * every output qw_q8a_dot_ref's bits */
static void check_mmq_grouped(const mat *mats, int n0, int n2) {
    enum { E = 3 };
    const int32_t offs[E + 1] = {0, n0, n0, n0 + n2};
    const int n = offs[E];
    const int64_t rows = mats[0].rows, cols = mats[0].cols, ng = cols / 32;
    float *x = malloc((size_t)(n * cols) * sizeof(float)), *y = malloc((size_t)(n * rows) * sizeof(float));
    qw_q8a *xq = malloc((size_t)(n * ng) * sizeof(qw_q8a));
    fill_x(x, n * cols);
    for (int r = 0; r < n; r++) qw_q8a_quantize(x + r * cols, xq + r * ng, cols);
    void *ptr[E];
    for (int e = 0; e < E; e++) ptr[e] = mats[e].dbuf + mats[e].mis;
    void *dtab = dup_to_device(ptr, sizeof(ptr));
    int32_t *doffs = dup_to_device(offs, sizeof(offs)), *dtiles = dalloc(2 * (E + 1) * sizeof(int32_t));
    qw_q8a *dxq = dup_to_device(xq, (size_t)(n * ng) * sizeof(qw_q8a));
    float *dy = dalloc((size_t)(n * rows) * sizeof(float));
    qwc_mmq_tiles(C, dtiles, doffs, E);
    qwc_mmq_grouped(C, dy, rows, dtab, mats[0].type, rows, cols, dxq, doffs, dtiles, E, n);
    down(y, dy, (size_t)(n * rows) * sizeof(float));
    int64_t bad = -1;
    float want = 0;
    for (int e = 0; e < E && bad < 0; e++)
        for (int r = offs[e]; r < offs[e + 1] && bad < 0; r++)
            for (int64_t o = 0; o < rows && bad < 0; o++) {
                const uint8_t *row = mats[e].q + o * mats[e].row_bytes;
                want = qw_q8a_dot_ref(mats[e].type, row, xq + r * ng, cols);
                if (mmq_fused()) { /* the matrix-vector kernels' bound */
                    if (!(fabs((double)y[r * rows + o] - want) <= q8_bound(mats[e].type, row, xq + r * ng, cols)))
                        bad = r * rows + o;
                } else if (memcmp(&want, &y[r * rows + o], 4)) {
                    bad = r * rows + o;
                }
            }
    CHECK(bad < 0, "mmq grouped %s [%lld, %lld], 3 experts: row %lld output %lld is %.9g, qw_q8a_dot_ref %.9g%s",
          qw_type_name(mats[0].type), (long long)rows, (long long)cols, bad < 0 ? 0LL : (long long)(bad / rows),
          bad < 0 ? 0LL : (long long)(bad % rows), bad < 0 ? 0.0 : y[bad], (double)want,
          mmq_fused() ? " (fused terms: past the bound)" : "");
    free(x), free(y), free(xq);
    cuda_ok(cudaFree(dtab), "cudaFree"), cuda_ok(cudaFree(doffs), "cudaFree"), cuda_ok(cudaFree(dtiles), "cudaFree");
    cuda_ok(cudaFree(dxq), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
}

/* The tensor-core GEMM's 64 x 64 tiles (taken when they make at least 264 blocks): 1029 rows of 256 by 1040
 * tokens, and grouped, 3 matrices of 1029 rows meeting 700, 0 and 340 rows; and 1040 tokens of 4096 columns */
static void check_mmq_big(qw_type t) {
    mat m;
    mat_make(&m, t, 1029, 256, 0);
    check_matmul_q8(&m, 1040, 0);
    mat_free(&m);
    mat_make(&m, t, 5, 4096, 0); /* x's 8-bit rows past the fixed buffer: rounded into the scratch */
    check_matmul_q8(&m, 1040, 0);
    mat_free(&m);
    mat pm[3];
    for (int k = 0; k < 3; k++) mat_make(&pm[k], t, 1029, 256, k == 1 ? 2 : 0);
    check_mmq_grouped(pm, 700, 340);
    for (int k = 0; k < 3; k++) mat_free(&pm[k]);
}

static void check_type(qw_type t) {
    const int be = qw_type_traits_of(t)->block_elems, plain = be == 1;
    /* one block; one chunk (32 items) and then one item more; 4096; odd lengths for the plain types */
    int64_t lens[6];
    int nl = 0;
    if (plain) {
        lens[nl++] = 7, lens[nl++] = 33, lens[nl++] = 256, lens[nl++] = 264, lens[nl++] = 4096;
    } else if (be == 32) {
        lens[nl++] = 32, lens[nl++] = 1024 + 32, lens[nl++] = 4096;
    } else {
        lens[nl++] = 256, lens[nl++] = 1024 + 256, lens[nl++] = 4096;
    }
    static const int toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64, 300};
    for (int li = 0; li < nl; li++) {
        const int64_t cols = lens[li];
        const int64_t rowsl[] = {1, 7, 67};
        for (int ri = 0; ri < 3; ri++) {
            const int64_t rows = rowsl[ri];
            if (cols == 4096 && rows == 1) continue;
            mat m;
            mat_make(&m, t, rows, cols, 0);
            for (size_t k = 0; k < sizeof(toks) / sizeof(toks[0]); k++)
                if (rows == 67 || toks[k] <= 9) check_matmul(&m, toks[k], 0);
            check_matmul(&m, 1, 1);
            check_matmul(&m, 3, 1);
            if (!plain) {
                static const int qtoks[] = {1, 2, 3, 5, 8, 9, 16, 17, 64, 130};
                for (size_t k = 0; k < sizeof(qtoks) / sizeof(qtoks[0]); k++)
                    if (rows == 67 || qtoks[k] <= 3) check_matmul_q8(&m, qtoks[k], 0);
                check_matmul_q8(&m, 2, 1);
            }
            check_get_rows(&m);
            check_gather(&m);
            mat_free(&m);
        }
        if (!plain && li == nl - 1) { /* a long row of few rows: cut into 4 parts (mvq_ks), the one-token bits */
            mat lr;
            mat_make(&lr, t, 5, 10240, 0);
            for (int nt = 1; nt <= 3; nt++) check_matmul_q8(&lr, nt, 0);
            check_matmul_q8(&lr, 2, 1);
            mat_free(&lr);
        }
        /* weights 2 bytes past a 16-byte boundary (4 for f32) */
        mat m;
        mat_make(&m, t, 7, cols, t == QW_TYPE_F32 ? 4 : 2);
        for (int nt = 1; nt <= 8; nt *= 2) check_matmul(&m, nt, 0);
        check_matmul(&m, 20, 0);
        if (!plain) check_matmul_q8(&m, 3, 0), check_matmul_q8(&m, 20, 0);
        check_get_rows(&m);
        mat_free(&m);
        /* the MoE's pairs: 3 matrices of 5 rows, one 2 bytes off */
        mat pm[3];
        for (int k = 0; k < 3; k++) mat_make(&pm[k], t, 5, cols, k == 1 ? (t == QW_TYPE_F32 ? 4 : 2) : 0);
        for (int q8 = 0; q8 <= !plain; q8++) {
            check_pairs(pm, cols, q8);
            check_pairs(pm, 0, q8);
            check_pairs(pm, cols + 1, q8);
        }
        if (!plain) check_mmq_grouped(pm, 70, 5); /* 32 x 32 tiles, one expert of three */
        if (li == nl - 1) check_graph(&pm[0]);
        if (!plain && li == nl - 1) { /* the integer path recorded and replayed */
            C->q8 = 1;
            check_graph(&pm[0]);
            C->q8 = 0;
        }
        for (int k = 0; k < 3; k++) mat_free(&pm[k]);
    }
}

/* 262144 x 16384 Q8_0 (4.56e9 bytes): row r is row r % 37 of a small matrix; sampled rows, among them those where
 * the byte offset crosses 2^31 and 2^32, checked against the host; both matmul paths, get_rows */
static void check_large(void) {
    const qw_type t = QW_TYPE_Q8_0;
    const int64_t rows = 262144, cols = 16384, nd = 37;
    mat small;
    mat_make(&small, t, nd, cols, 0);
    const size_t rb = (size_t)small.row_bytes, bytes = (size_t)rows * rb;
    uint8_t *big = malloc(bytes), *dbig = NULL;
    if (!big || cudaMalloc((void **)&dbig, bytes)) {
        cudaGetLastError();
        printf("SKIP the %lld x %lld matrix: %.1f GB of host or device memory not available\n", (long long)rows,
               (long long)cols, (double)bytes / 1e9);
        free(big);
        mat_free(&small);
        return;
    }
    for (int64_t r = 0; r < rows; r++) memcpy(big + (size_t)r * rb, small.q + (size_t)(r % nd) * rb, rb);
    up(dbig, big, bytes);
    free(big);
    enum { NS = 64 };
    int64_t sample[NS] = {0, 1, 36, 37, rows / 2, rows - 1, rows - 2, (INT64_C(1) << 31) / (int64_t)rb,
                          (INT64_C(1) << 31) / (int64_t)rb + 1, (INT64_C(1) << 32) / (int64_t)rb,
                          (INT64_C(1) << 32) / (int64_t)rb + 1};
    for (int i = 11; i < NS; i++) sample[i] = (int64_t)(urand() * (double)rows);
    int64_t src[NS];
    for (int i = 0; i < NS; i++) src[i] = sample[i] % nd;
    qw_tensor dt = {.name = "big", .data = dbig, .type = t, .n_dims = 2, .shape = {rows, cols}};
    static const int toks[] = {1, 20};
    for (int k = 0; k < 2; k++) {
        const int nt = toks[k];
        float *x = malloc((size_t)(nt * cols) * sizeof(float)), *y = malloc((size_t)(nt * rows) * sizeof(float));
        float *ys = malloc((size_t)(nt * NS) * sizeof(float));
        fill_x(x, nt * cols);
        float *dx = dup_to_device(x, (size_t)(nt * cols) * sizeof(float));
        float *dy = dalloc((size_t)(nt * rows) * sizeof(float));
        qwc_matmul(C, dy, &dt, dx, nt);
        down(y, dy, (size_t)(nt * rows) * sizeof(float));
        for (int tk = 0; tk < nt; tk++)
            for (int i = 0; i < NS; i++) ys[tk * NS + i] = y[tk * rows + sample[i]];
        worst w = compare(&small, ys, NS, src, x, cols, nt, nt > 16);
        if (w.row >= 0) w.row = sample[w.row];
        CHECK_WORST(w, "matmul q8_0 [%lld, %lld] n_tok %d (%s)", (long long)rows, (long long)cols, nt,
                    nt > 16 ? "gemm, tiles" : "matrix-vector");
        free(x), free(y), free(ys);
        cuda_ok(cudaFree(dx), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree");
    }
    int32_t ids[4] = {(int32_t)(rows - 1), (int32_t)((INT64_C(1) << 32) / (int64_t)rb + 1), 5, (int32_t)(rows / 2)};
    int32_t *dids = dup_to_device(ids, sizeof(ids));
    float *dy = dalloc((size_t)(4 * cols) * sizeof(float)), *y = malloc((size_t)(4 * cols) * sizeof(float));
    qwc_get_rows(C, dy, &dt, dids, 4);
    down(y, dy, (size_t)(4 * cols) * sizeof(float));
    int same = 1;
    for (int i = 0; i < 4; i++) same &= memcmp(y + i * cols, small.deq + (ids[i] % nd) * cols, (size_t)cols * 4) == 0;
    CHECK(same, "get_rows q8_0 [%lld, %lld]: rows past 2^32 bytes differ from the host's dequantization",
          (long long)rows, (long long)cols);
    free(y);
    cuda_ok(cudaFree(dids), "cudaFree"), cuda_ok(cudaFree(dy), "cudaFree"), cuda_ok(cudaFree(dbig), "cudaFree");
    mat_free(&small);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != 0 || n_dev == 0) {
        cudaGetLastError();
        printf("SKIP t_cuda_quant: no CUDA device\n");
        return test_summary();
    }
    cuda_ok(cudaStreamCreateWithFlags(&C->stream, STREAM_NONBLOCKING), "stream");
    cuda_ok(cublasCreate_v2(&C->cublas), "cuBLAS handle");
    cuda_ok(cublasSetStream_v2(C->cublas, C->stream), "cuBLAS stream");
    cuda_ok(cublasSetMathMode(C->cublas, CUBLAS_PEDANTIC), "cuBLAS math mode");
    C->q8_buf = dalloc(Q8_BYTES);
    CHECK(qwc_stream(C) == C->stream, "the test's stand-in backend is not the one linked (backend.cu's accessors "
          "were): the test cannot run");
    if (n_fail) return test_summary();

    static const qw_type types[] = {QW_TYPE_F32,  QW_TYPE_F16,  QW_TYPE_BF16, QW_TYPE_Q8_0,   QW_TYPE_Q4_0,
                                    QW_TYPE_Q4_1, QW_TYPE_Q5_0, QW_TYPE_Q5_1, QW_TYPE_Q4_K,   QW_TYPE_Q5_K,
                                    QW_TYPE_Q6_K, QW_TYPE_IQ4_NL, QW_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        const int before = n_fail;
        check_type(types[i]);
        if (qw_type_traits_of(types[i])->block_elems > 1) check_mmq_big(types[i]);
        printf("%-7s worst error / bound: matrix-vector %.3f, gemm %.3f%s\n", qw_type_name(types[i]),
               worst_mv[types[i]], worst_gemm[types[i]], n_fail > before ? " (failures above)" : "");
        fflush(stdout);
    }
    CHECK(n_sliced > 0, "no narrow product was cut into column slices: the sliced GEMM went untested");
    printf("narrow products in column slices: %d checked\n", n_sliced);
    worst_mv[QW_TYPE_Q8_0] = worst_gemm[QW_TYPE_Q8_0] = 0;
    check_large();
    printf("q8_0 262144 x 16384 worst error / bound: matrix-vector %.3f, gemm %.3f\n", worst_mv[QW_TYPE_Q8_0],
           worst_gemm[QW_TYPE_Q8_0]);

    if (C->scratch) cudaFree(C->scratch);
    cudaFree(C->q8_buf);
    cublasDestroy_v2(C->cublas);
    cudaStreamDestroy(C->stream);
    return test_summary();
}
