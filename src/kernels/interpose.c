/*
 * interpose.c - a backend that wraps another: every memory function and op calls the hooks' enter, the
 * inner backend's function unless enter said not to, and leave (ops.h, qw_backend_interpose). The profiler
 * times ops with it, the CPU backend's guard mode opens and closes its memory with it, and the session's
 * memory plan runs a step through it without computing anything.
 *
 * A composite op (composite.h) is called with the interposer as its backend, so the primitive ops it is made
 * of pass through the hooks too (the profiler sees a MoE step's matmuls per weight tensor); every other op
 * gets the inner backend, whose own state it reads. Hooks therefore see nested calls.
 */
#include "core/common.h"
#include "kernels/composite.h"

typedef struct {
    qw_backend be; /* first: the table handed out is a pointer to this member */
    const qw_backend *inner;
    qw_backend_hooks h;
    uint64_t composite; /* bit i: the inner's function i is a composite of composite.c */
} interposer;

enum {
    I_ALLOC, I_FREE, I_UPLOAD, I_DOWNLOAD, I_COPY, I_ZERO, I_SYNC,
    I_MATMUL, I_MATMUL_BATCH, I_GET_ROWS, I_STORE_ROWS, I_COPY_STRIDED, I_RMS_NORM, I_RMS_NORM_GROUPED, I_L2_NORM,
    I_SILU, I_SIGMOID, I_MUL, I_AXPY, I_DIVIDE, I_ACT_MUL, I_ROPE_TABLE, I_ROPE, I_ATTENTION, I_QSA_KEYS, I_QSA_SELECT,
    I_CONV1D_DW, I_CONV1D_STATE, I_GDN_GATE, I_DELTA_RULE, I_MOE_ROUTE, I_MOE_FFN, I_HC_READ, I_HC_INJECT, I_PLE_ROWS,
    I_PLE_HIST_PUSH, I_PLE_GATHER, I_PLE_GATE, I_ARGMAX, I_TOPK, I_RMS_NORM_GATE, I_COUNT
};

static const char *const names[I_COUNT] = {
    "alloc", "free", "upload", "download", "copy", "zero", "sync",
    "matmul", "matmul_batch", "get_rows", "store_rows", "copy_strided", "rms_norm", "rms_norm_grouped", "l2_norm",
    "silu", "sigmoid", "mul", "axpy", "divide", "act_mul", "rope_table", "rope", "attention", "qsa_keys", "qsa_select",
    "conv1d_dw", "conv1d_state", "gdn_gate", "delta_rule", "moe_route", "moe_ffn", "hc_read", "hc_inject", "ple_rows",
    "ple_hist_push", "ple_gather", "ple_gate", "argmax", "topk", "rms_norm_gate"};

_Static_assert((int)I_MATMUL == (int)QW_OP_FIRST, "ops.h's QW_OP_FIRST is the index of matmul");

const char *const *qw_backend_op_names(int *n) {
    if (n) *n = I_COUNT;
    return names;
}

static const interposer *I_(const qw_backend *be) { return (const interposer *)be; }

/* the backend an inner function i is called with: the interposer for a composite, else the inner one */
static const qw_backend *target(const interposer *I, int i) {
    return (I->composite >> i) & 1 ? &I->be : I->inner;
}

#define WRAP(idx, call)                                                                                            \
    do {                                                                                                           \
        const interposer *I = I_(be);                                                                              \
        if (I->h.enter(I->h.user, idx)) {                                                                          \
            const qw_backend *in = I->inner, *tb = target(I, idx);                                                 \
            (void)tb;                                                                                              \
            call;                                                                                                  \
        }                                                                                                          \
        I->h.leave(I->h.user, idx, NULL, 0);                                                                       \
    } while (0)

static void *x_alloc(const qw_backend *be, size_t bytes, qw_mem_kind kind) {
    const interposer *I = I_(be);
    void *p = I->h.enter(I->h.user, I_ALLOC) ? I->inner->alloc(I->inner, bytes, kind) : NULL;
    I->h.leave(I->h.user, I_ALLOC, NULL, 0);
    return p;
}
static void x_free(const qw_backend *be, void *p) { WRAP(I_FREE, in->free(in, p)); }
static void x_upload(const qw_backend *be, void *dst, const void *src, size_t n) {
    WRAP(I_UPLOAD, in->upload(in, dst, src, n));
}
static void x_download(const qw_backend *be, void *dst, const void *src, size_t n) {
    WRAP(I_DOWNLOAD, in->download(in, dst, src, n));
}
static void x_copy(const qw_backend *be, void *dst, const void *src, size_t n) { WRAP(I_COPY, in->copy(in, dst, src, n)); }
static void x_zero(const qw_backend *be, void *p, size_t n) { WRAP(I_ZERO, in->zero(in, p, n)); }
static void x_sync(const qw_backend *be) { WRAP(I_SYNC, in->sync(in)); }

static void x_matmul(const qw_backend *be, float *y, const qw_tensor *w, const float *x, int n_tok) {
    const interposer *I = I_(be);
    if (I->h.enter(I->h.user, I_MATMUL)) I->inner->matmul(I->inner, y, w, x, n_tok);
    qw_matmul_job job = {y, w, x, n_tok};
    I->h.leave(I->h.user, I_MATMUL, &job, 1);
}
static void x_matmul_batch(const qw_backend *be, const qw_matmul_job *jobs, int n_jobs) {
    const interposer *I = I_(be);
    if (I->h.enter(I->h.user, I_MATMUL_BATCH)) I->inner->matmul_batch(I->inner, jobs, n_jobs);
    I->h.leave(I->h.user, I_MATMUL_BATCH, jobs, n_jobs);
}
static void x_get_rows(const qw_backend *be, float *y, const qw_tensor *w, const int32_t *ids, int n) {
    WRAP(I_GET_ROWS, in->get_rows(tb, y, w, ids, n));
}
static void x_store_rows(const qw_backend *be, float *cache, const float *src, int n_tok, int64_t width,
                         const qw_step *step) {
    WRAP(I_STORE_ROWS, in->store_rows(tb, cache, src, n_tok, width, step));
}
static void x_copy_strided(const qw_backend *be, float *dst, const float *src, const qw_copy_layout *l) {
    WRAP(I_COPY_STRIDED, in->copy_strided(tb, dst, src, l));
}
static void x_rms_norm(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                       int zc) {
    WRAP(I_RMS_NORM, in->rms_norm(tb, y, x, w, n_rows, dim, eps, zc));
}
static void x_rms_norm_grouped(const qw_backend *be, float *y, const float *x, const float *w, int n_rows, int n_group,
                               int dim, float eps, int zc) {
    WRAP(I_RMS_NORM_GROUPED, in->rms_norm_grouped(tb, y, x, w, n_rows, n_group, dim, eps, zc));
}
static void x_l2_norm(const qw_backend *be, float *x, int n_rows, int dim, float eps, float scale, int n_scaled) {
    WRAP(I_L2_NORM, in->l2_norm(tb, x, n_rows, dim, eps, scale, n_scaled));
}
static void x_silu(const qw_backend *be, float *x, int64_t n) { WRAP(I_SILU, in->silu(tb, x, n)); }
static void x_sigmoid(const qw_backend *be, float *x, int64_t n) { WRAP(I_SIGMOID, in->sigmoid(tb, x, n)); }
static void x_mul(const qw_backend *be, float *y, const float *a, const float *b, int64_t n) {
    WRAP(I_MUL, in->mul(tb, y, a, b, n));
}
static void x_axpy(const qw_backend *be, float *y, const float *a, float s, int64_t n) {
    WRAP(I_AXPY, in->axpy(tb, y, a, s, n));
}
static void x_divide(const qw_backend *be, float *x, float d, int64_t n, int then_silu) {
    WRAP(I_DIVIDE, in->divide(tb, x, d, n, then_silu));
}
static void x_act_mul(const qw_backend *be, float *y, float *a, const float *b, int64_t n, int act) {
    WRAP(I_ACT_MUL, in->act_mul(tb, y, a, b, n, act));
}
static void x_rms_norm_gate(const qw_backend *be, float *y, const float *x, const float *w, float *z, int n_rows,
                            int dim, float eps, int act) {
    WRAP(I_RMS_NORM_GATE, in->rms_norm_gate(tb, y, x, w, z, n_rows, dim, eps, act));
}
static void x_rope_table(const qw_backend *be, float *cs, const float *inv_freq, int n_rot, int n_tok,
                         const qw_step *step) {
    WRAP(I_ROPE_TABLE, in->rope_table(tb, cs, inv_freq, n_rot, n_tok, step));
}
static void x_rope(const qw_backend *be, float *x, int n_tok, int row_stride, int n_head, int head_stride, int n_rot,
                   const float *cs) {
    WRAP(I_ROPE, in->rope(tb, x, n_tok, row_stride, n_head, head_stride, n_rot, cs));
}
static void x_attention(const qw_backend *be, float *out, const float *q, int q_stride, const float *kc,
                        const float *vc, int n_tok, int n_head, int n_head_kv, int hd, float scale, const int32_t *sel,
                        const int32_t *sel_off, void *work, const qw_step *step) {
    WRAP(I_ATTENTION,
         in->attention(tb, out, q, q_stride, kc, vc, n_tok, n_head, n_head_kv, hd, scale, sel, sel_off, work, step));
}
static size_t x_attention_work(const qw_backend *be, int n_ctx, int hd) {
    return I_(be)->inner->attention_work(I_(be)->inner, n_ctx, hd);
}
static void x_qsa_keys(const qw_backend *be, float *raw, float *blk, const float *key_rows, int64_t key_stride,
                       int n_tok, int ihd, int R, const float *k_norm, float eps, const float *inv_freq, int n_rot,
                       const qw_step *step) {
    WRAP(I_QSA_KEYS, in->qsa_keys(tb, raw, blk, key_rows, key_stride, n_tok, ihd, R, k_norm, eps, inv_freq, n_rot, step));
}
static void x_qsa_select(const qw_backend *be, int32_t *sel, int32_t *sel_off, const float *q, int64_t q_stride,
                         const float *blk, int n_tok, int n_head, int ihd, int R, int topk, void *work,
                         const qw_step *step) {
    WRAP(I_QSA_SELECT, in->qsa_select(tb, sel, sel_off, q, q_stride, blk, n_tok, n_head, ihd, R, topk, work, step));
}
static size_t x_qsa_select_work(const qw_backend *be, int n_ctx, int R, int topk) {
    return I_(be)->inner->qsa_select_work(I_(be)->inner, n_ctx, R, topk);
}
static void x_conv1d_dw(const qw_backend *be, float *y, const float *x, const float *w, int n_tok, int ch, int k,
                        int dil, int then_silu) {
    WRAP(I_CONV1D_DW, in->conv1d_dw(tb, y, x, w, n_tok, ch, k, dil, then_silu));
}
static void x_conv1d_state(const qw_backend *be, float *y, const float *x, float *hist, float *seq, const float *w,
                           int n_tok, int ch, int k, int dil, int then_silu, int keep_seq) {
    WRAP(I_CONV1D_STATE, in->conv1d_state(tb, y, x, hist, seq, w, n_tok, ch, k, dil, then_silu, keep_seq));
}
static void x_gdn_gate(const qw_backend *be, float *a, float *beta, const float *nea, const float *dtb, int n_tok,
                       int hv) {
    WRAP(I_GDN_GATE, in->gdn_gate(tb, a, beta, nea, dtb, n_tok, hv));
}
static void x_delta_rule(const qw_backend *be, float *o, float *state, const float *q, const float *k, const float *v,
                         const float *g, const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled) {
    WRAP(I_DELTA_RULE, in->delta_rule(tb, o, state, q, k, v, g, beta, n_tok, hk, hv, dk, dv, tiled));
}
static void x_moe_route(const qw_backend *be, int32_t *sel, float *wt, float *logits, int n_tok, int E, int k,
                        int norm) {
    WRAP(I_MOE_ROUTE, in->moe_route(tb, sel, wt, logits, n_tok, E, k, norm));
}
static void x_moe_ffn(const qw_backend *be, float *y, const float *x, int32_t *sel, float *wt, float *logits, int norm,
                      int n_tok, int k, const qw_ffn_w *experts, int E, const qw_ffn_w *shared, const qw_tensor *sg,
                      void *work) {
    WRAP(I_MOE_FFN, in->moe_ffn(tb, y, x, sel, wt, logits, norm, n_tok, k, experts, E, shared, sg, work));
}
static size_t x_moe_work(const qw_backend *be, int n_tok, int k, int E, int H, int I, int Is) {
    return I_(be)->inner->moe_work(I_(be)->inner, n_tok, k, E, H, I, Is);
}
static void x_hc_read(const qw_backend *be, float *a, float *m, float *u, const qw_tensor *up, const float *xn,
                      float *inj, int n_tok, int C, int H) {
    WRAP(I_HC_READ, in->hc_read(tb, a, m, u, up, xn, inj, n_tok, C, H));
}
static void x_hc_inject(const qw_backend *be, float *X, const float *inj, const float *y, int n_tok, int C, int H,
                        float *xn, const float *norm_w, float eps) {
    WRAP(I_HC_INJECT, in->hc_inject(tb, X, inj, y, n_tok, C, H, xn, norm_w, eps));
}
static void x_ple_rows(const qw_backend *be, int64_t *rows, const int32_t *tokens, const int32_t *hist, int n_tok,
                       int n, int nh, int32_t eos, const uint64_t *mult, const int64_t *prime, const int64_t *offset) {
    WRAP(I_PLE_ROWS, in->ple_rows(tb, rows, tokens, hist, n_tok, n, nh, eos, mult, prime, offset));
}
static void x_ple_hist_push(const qw_backend *be, int32_t *hist, const int32_t *tokens, int n_tok, int n) {
    WRAP(I_PLE_HIST_PUSH, in->ple_hist_push(tb, hist, tokens, n_tok, n));
}
static void x_ple_gather(const qw_backend *be, float *e, const int64_t *rows, int64_t n, const qw_tensor *chunks,
                         int n_chunks, int64_t chunk_rows, int prefetch) {
    WRAP(I_PLE_GATHER, in->ple_gather(tb, e, rows, n, chunks, n_chunks, chunk_rows, prefetch));
}
static void x_argmax(const qw_backend *be, int32_t *out, const float *x, int n_rows, int64_t n) {
    WRAP(I_ARGMAX, in->argmax(tb, out, x, n_rows, n));
}
static void x_topk(const qw_backend *be, int32_t *ids, float *vals, const float *x, int n_rows, int64_t n, int k,
                   void *work) {
    WRAP(I_TOPK, in->topk(tb, ids, vals, x, n_rows, n, k, work));
}
static void x_ple_gate(const qw_backend *be, float *G, const float *K, const float *Q, const float *V, int n_tok, int C,
                       int H) {
    WRAP(I_PLE_GATE, in->ple_gate(tb, G, K, Q, V, n_tok, C, H));
}

/* not an op: passed through, so that a dry run or a profile places memory and work as the backend would */
static void x_layer(const qw_backend *be, int il) { I_(be)->inner->layer(I_(be)->inner, il); }

static void x_release(qw_backend *be) {
    interposer *I = (interposer *)be;
    if (I->h.release) I->h.release(I->h.user);
    free(I);
}

static int no_enter(void *user, int op) {
    (void)user, (void)op;
    return 1;
}
static void no_leave(void *user, int op, const qw_matmul_job *jobs, int n_jobs) { (void)user, (void)op, (void)jobs, (void)n_jobs; }

qw_backend *qw_backend_interpose(const qw_backend *inner, const qw_backend_hooks *hooks) {
    interposer *I = qw_calloc(1, sizeof(*I));
    if (!I) return NULL;
    I->inner = inner;
    I->h = *hooks;
    if (!I->h.enter) I->h.enter = no_enter;
    if (!I->h.leave) I->h.leave = no_leave;
    const qw_backend *n = inner;
    /* the composites of composite.c, which take the interposer in place of the inner backend */
    struct {
        int i;
        int is;
    } comp[] = {
        {I_STORE_ROWS, n->store_rows == qw_op_store_rows},
        {I_COPY_STRIDED, n->copy_strided == qw_op_copy_strided},
        {I_RMS_NORM_GROUPED, n->rms_norm_grouped == qw_op_rms_norm_grouped},
        {I_DIVIDE, n->divide == qw_op_divide},
        {I_ACT_MUL, n->act_mul == qw_op_act_mul},
        {I_RMS_NORM_GATE, n->rms_norm_gate == qw_op_rms_norm_gate},
        {I_ROPE_TABLE, n->rope_table == qw_op_rope_table},
        {I_QSA_KEYS, n->qsa_keys == qw_op_qsa_keys},
        {I_QSA_SELECT, n->qsa_select == qw_op_qsa_select},
        {I_CONV1D_STATE, n->conv1d_state == qw_op_conv1d_state},
        {I_GDN_GATE, n->gdn_gate == qw_op_gdn_gate},
        {I_MOE_ROUTE, n->moe_route == qw_op_moe_route},
        {I_MOE_FFN, n->moe_ffn == qw_op_moe_ffn},
        {I_HC_READ, n->hc_read == qw_op_hc_read},
        {I_HC_INJECT, n->hc_inject == qw_op_hc_inject},
        {I_PLE_ROWS, n->ple_rows == qw_op_ple_rows},
        {I_PLE_HIST_PUSH, n->ple_hist_push == qw_op_ple_hist_push},
        {I_PLE_GATHER, n->ple_gather == qw_op_ple_gather},
        {I_PLE_GATE, n->ple_gate == qw_op_ple_gate},
        {I_ARGMAX, n->argmax == qw_op_argmax},
        {I_TOPK, n->topk == qw_op_topk},
    };
    for (size_t i = 0; i < sizeof(comp) / sizeof(comp[0]); i++)
        if (comp[i].is) I->composite |= 1ull << comp[i].i;
    I->be = (qw_backend){
        .name = inner->name,
        .host_memory = inner->host_memory,
        .alloc = x_alloc,
        .free = x_free,
        .upload = x_upload,
        .download = x_download,
        .copy = x_copy,
        .zero = x_zero,
        .sync = x_sync,
        .matmul = x_matmul,
        .matmul_batch = x_matmul_batch,
        .get_rows = x_get_rows,
        .store_rows = x_store_rows,
        .copy_strided = x_copy_strided,
        .rms_norm = x_rms_norm,
        .rms_norm_grouped = x_rms_norm_grouped,
        .l2_norm = x_l2_norm,
        .silu = x_silu,
        .sigmoid = x_sigmoid,
        .mul = x_mul,
        .axpy = x_axpy,
        .divide = x_divide,
        .act_mul = x_act_mul,
        .rms_norm_gate = x_rms_norm_gate,
        .rope_table = x_rope_table,
        .rope = x_rope,
        .attention = x_attention,
        .attention_work = x_attention_work,
        .qsa_keys = x_qsa_keys,
        .qsa_select = x_qsa_select,
        .qsa_select_work = x_qsa_select_work,
        .conv1d_dw = x_conv1d_dw,
        .conv1d_state = x_conv1d_state,
        .gdn_gate = x_gdn_gate,
        .delta_rule = x_delta_rule,
        .moe_route = x_moe_route,
        .moe_ffn = x_moe_ffn,
        .moe_work = x_moe_work,
        .hc_read = x_hc_read,
        .hc_inject = x_hc_inject,
        .ple_rows = x_ple_rows,
        .ple_hist_push = x_ple_hist_push,
        .ple_gather = x_ple_gather,
        .ple_gate = x_ple_gate,
        .argmax = x_argmax,
        .topk = inner->topk ? x_topk : NULL,
        .layer = inner->layer ? x_layer : NULL,
        .release = x_release,
    };
    return &I->be;
}

const qw_backend *qw_backend_interposed(const qw_backend *be) {
    return be && be->release == x_release ? I_(be)->inner : NULL;
}
