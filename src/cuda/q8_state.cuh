/*
 * q8_state.cuh - what the 8-bit activations' two buffers hold, and the rules of shared.cuh's qwc_q8_* functions, on
 * the state alone: src/cuda/backend.cu's qwc_q8_* are these over its struct qwc, and so are those of the emulation's
 * tests/gpu/emu/backend.cc, so that the emulated kernels meet the same rules.
 */
#ifndef QW_CUDA_Q8_STATE_CUH
#define QW_CUDA_Q8_STATE_CUH

#include "cuda/shared.cuh"

/* the fixed buffer: 104,857 blocks of 32 (16 tokens of 209,712 columns, 64 pairs of 52,428); the emulation's build
 * (t_cuda_ops_emu) makes it smaller, so that its prompts past it are shorter */
#ifndef QWC_Q8_BYTES
#define QWC_Q8_BYTES ((size_t)4 << 20)
#endif

/* The prompt's buffer (qwc_q8_big) is never used while a graph is recorded (no graph holds its address, so it can
 * grow), nor when it cannot have the bytes (the caller rounds into the scratch instead, for each job). QWC_Q8_BIG 0,
 * or QWENC_CUDA_Q8_BIG=0 in the environment: never (the same bits; to measure what it saves). */
#ifndef QWC_Q8_BIG
#define QWC_Q8_BIG 1
#endif
/* Kernels that write activations also round them (QWC_Q8_PRODUCERS 0: k_q8a rounds them before each product;
 * tests/gpu/fusions.sh compares the logits of the two bit for bit). */
#ifndef QWC_Q8_PRODUCERS
#define QWC_Q8_PRODUCERS 1
#endif

struct qwc_q8_state {
    qw_q8a *buf;      /* the fixed buffer, QWC_Q8_BYTES, made with the backend (recorded graphs keep its address) */
    qw_q8a *big;      /* a prompt's rows (qwc_q8_big), big_bytes */
    size_t big_bytes;
    int keep; /* the next product reads the x of the one before (qwc_q8_keep) */
    struct {
        const float *x;
        int64_t ldx, cols, rows;
    } held[2];           /* what buf [0] and big [1] hold for a chain (qwc_q8_note): the rounding of these rows */
    const float *made_y; /* or of these n floats, written by a kernel when qwc_writes was made_at */
    int64_t made_n;
    unsigned long long made_at;
    int made_big; /* ... into big, not buf */
};

static inline void q8s_keep(qwc_q8_state &s, int on) {
    s.keep = on;
    if (!on) s.held[0].x = s.held[1].x = NULL; /* a chain starts: nothing held counts until a product of it rounds
                                                 * its x */
}
static inline int q8s_same(const qwc_q8_state &s, const qw_q8a *buf, const float *x, int64_t ldx, int64_t cols,
                           int64_t n_rows) {
    const auto &h = s.held[buf != s.buf];
    return s.keep && h.x == x && h.ldx == ldx && h.cols == cols && h.rows == n_rows;
}
static inline void q8s_note(qwc_q8_state &s, const qw_q8a *buf, const float *x, int64_t ldx, int64_t cols,
                            int64_t n_rows) {
    auto &h = s.held[buf != s.buf];
    h.x = x, h.ldx = ldx, h.cols = cols, h.rows = n_rows;
}
/* the prompt's buffer of at least bytes: alloc(n) (NULL: none) after release(p) of the one it outgrew */
template <class A, class F>
static inline qw_q8a *q8s_big(qwc_q8_state &s, size_t bytes, int recording, A alloc, F release) {
    static int env = -1;
    if (!QWC_Q8_BIG || recording || !qwc_env_switch("QWENC_CUDA_Q8_BIG", 1, &env)) return NULL;
    if (bytes <= s.big_bytes) return s.big;
    if (s.big) release(s.big);
    s.big = NULL, s.big_bytes = 0, s.held[1].x = NULL;
    const size_t n = bytes + bytes / 4;
    s.big = (qw_q8a *)alloc(n); /* none: not an error, the scratch serves */
    s.big_bytes = s.big ? n : 0;
    return s.big;
}
/* qwc_q8_for's answer: 0 none, 1 the fixed buffer, 2 the prompt's (of (n / 32) blocks) */
static inline int q8s_for(int on, int64_t n, int64_t row) {
    if (!QWC_Q8_PRODUCERS || !on || n <= 0 || n % 32 || row % 32) return 0;
    return (size_t)(n / 32) * sizeof(qw_q8a) <= QWC_Q8_BYTES ? 1 : 2;
}
static inline void q8s_made(qwc_q8_state &s, const float *y, int64_t n) {
    const int big = (size_t)(n / 32) * sizeof(qw_q8a) > QWC_Q8_BYTES;
    s.held[big].x = NULL; /* the buffer no longer holds what a chain noted */
    s.made_y = y, s.made_n = n, s.made_at = qwc_writes, s.made_big = big;
}
static inline const qw_q8a *q8s_fresh(const qwc_q8_state &s, const float *x, int64_t ldx, int64_t cols,
                                      int64_t n_rows) {
    const int fresh = s.made_y == x && s.made_at == qwc_writes && ldx == cols && cols * n_rows == s.made_n;
    return !fresh ? NULL : s.made_big ? s.big : s.buf;
}

#endif
