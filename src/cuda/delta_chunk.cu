/*
 * delta_chunk.cu - the gated delta rule (ops.h delta_rule) over a prompt in the chunked form of
 * kernels/delta_chunk.c: chunks of 64 tokens, so that the prompt's tokens run as small matrix products instead of a
 * read-modify-write of every state column per token (k_delta_rule4 in ops.cu, which decode steps and short calls
 * keep).
 *
 * The math (delta_chunk.c has its derivation): for value head j and a chunk of n <= 64 tokens entering with state S
 * [dk][dv], e_i = exp(g_i), gam_i = e_0 ... e_i, D_ij = e_{j+1} ... e_i (j <= i, D_ii = 1),
 *   (I + A) U = beta (V - gam K S),  A_ij = beta_i D_ij (k_i . k_j) for j < i,
 *   O = gam (Q S) + (D o Q K^T) U,   S_new = gam_{n-1} S + (K o D_{n-1,.})^T U.
 * U is linear in S: U = Uh - Wh S with Uh = (I + A)^-1 beta V and Wh = (I + A)^-1 (beta gam K) (the "WY" form of
 * flash-linear-attention), and neither depends on the state. So the work splits in two kernels:
 *   k_dc_prep, a block per (value head, chunk), all chunks at once: the decays, the two Gram matrices times D
 *     (A, and Aq = D o Q K^T, stored), and Uh and Wh by forward substitution, a column a thread (Uh into o, whose
 *     rows it will be replaced by; Wh, Aq, gam and D_{n-1,.} into the backend's scratch);
 *   k_dc_run, a block per (value head, 32 state columns), the chunks in order with its slab of S in shared memory:
 *     U = Uh - Wh S and P = Q S, then O = gam P + Aq U (over Uh in o), then S = gam_{n-1} S + (K o D_{n-1,.})^T U.
 * A call goes through in windows of DC_WIN tokens (the prep of a window, then its run), which bounds the scratch:
 * hv (64 dk + 64 64 + 128) floats a chunk, 38 MB for Flash-Next's 48 heads of dk 128.
 *
 * Numerics: f32 throughout, fused multiply-adds; the decays are products of factors <= 1 formed only for j <= i (no
 * overflow however negative g is); the substitution is the recurrence's own correction, carried by contractions
 * (delta_chunk.c). Splitting U into Uh - Wh S rounds the two parts apart: each is of the size of v or of S^T k, so
 * the error stays within delta_chunk.c's bound, which t_cuda_ops checks against the reference: |chunked - ref| <=
 * 1e-5 ceil(n_tok / 64) B, B the largest entry of the states, values and outputs. Not the bits of the token-by-token
 * kernel (nor of the CPU's chunked form, which orders its sums otherwise); for a given call the same bits every run.
 *
 * Calls of at least qwc_dr_chunk_min tokens take it (QWENC_CUDA_DR_CHUNK=N in the environment: N tokens; 0: never),
 * and never fewer than DC_MIN_TOK, with dk 32, 64 or 128 and q, k 16-byte aligned; others run token by token.
 */
#include "cuda/ops_internal.cuh"

constexpr int DC_C = 64;          /* tokens a chunk */
constexpr int DC_T = 256;         /* threads a block */
constexpr int DC_CW = 32;         /* state columns a run block */
constexpr int DC_AP = DC_C + 4;   /* row stride of a 64 x 64 matrix in shared memory (rows 16-byte aligned) */
constexpr int DC_WIN = 16 * DC_C; /* tokens a window */
/* more tokens than any step recorded as a graph has (runtime/session.c: at most QWENC_MAX_DRAFT + 2), so that the bits
 * of a step do not depend on whether it was recorded */
constexpr int DC_MIN_TOK = QWENC_MAX_DRAFT + 3;

/* element i of a float4 (i a constant once unrolled) */
__device__ __forceinline__ float dc_at(const float4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* floats of k_dc_prep's shared memory (K and Q rows, A and D, e, gam, beta) and of k_dc_run's (at most 28 KiB) */
template <int DK> constexpr int dc_prep_smem() { return 2 * DC_C * (DK + 4) + 2 * DC_C * DC_AP + 3 * DC_C; }
template <int DK> constexpr int dc_run_smem() { return (DK + DC_C) * (DC_CW + 4) + 2 * DC_C; }

/*
 * Block (j, chunk c) of a window of n_tok tokens (q, k, v, g, beta at the window's first token): writes Uh's rows of
 * the chunk into o, and into the scratch wh [chunk][hv][64][DK] (Wh; rows past n zero), aq [chunk][hv][64][64]
 * (D_ij q_i . k_j for j <= i, zeros above), gd [chunk][hv][2][64] (gam_i, then D_{n-1,i}; zeros past n).
 */
template <int DK>
__global__ void __launch_bounds__(DC_T, 2)
    k_dc_prep(float *o, float *wh, float *aq, float *gd, const float *q, const float *k, const float *v,
              const float *g, const float *beta, int n_tok, int hk, int hv, int dv, int tiled) {
    QWC_PDL_ENTRY();
    constexpr int KP = DK + 4;
    extern __shared__ __align__(16) float sm[];
    float *ks = sm, *qs = ks + DC_C * KP, *A = qs + DC_C * KP, *D = A + DC_C * DC_AP, *e = D + DC_C * DC_AP;
    float *gam = e + DC_C, *bt = gam + DC_C;
    const int j = blockIdx.x, ch = blockIdx.y, tid = threadIdx.x, t0 = ch * DC_C, n = min(DC_C, n_tok - t0);
    const int hq = tiled ? j % hk : j / (hv / hk);
    const int64_t blk = (int64_t)ch * hv + j;
    for (int x = tid; x < DC_C * (DK / 4); x += DC_T) { /* the chunk's keys and queries, zero past n */
        const int i = x / (DK / 4), r = 4 * (x % (DK / 4));
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), qv = kv;
        if (i < n) {
            const int64_t at = ((int64_t)(t0 + i) * hk + hq) * DK + r;
            kv = *(const float4 *)(k + at);
            qv = *(const float4 *)(q + at);
        }
        *(float4 *)(ks + i * KP + r) = kv;
        *(float4 *)(qs + i * KP + r) = qv;
    }
    if (tid < DC_C) {
        const int64_t at = (int64_t)(t0 + tid) * hv + j;
        e[tid] = tid < n ? expf(g[at]) : 0.0f;
        bt[tid] = tid < n ? beta[at] : 0.0f;
    }
    __syncthreads();
    if (tid < DC_C) { /* row i of D: D_ij = e_{j+1} ... e_i, built from the diagonal down; gam_i = e_0 D_i0 */
        const int i = tid;
        float *Di = D + i * DC_AP;
        for (int c = i + 1; c < DC_C; c++) Di[c] = 0.0f;
        if (i < n) {
            float d = 1.0f;
            Di[i] = 1.0f;
            for (int c = i - 1; c >= 0; c--) {
                d *= e[c + 1];
                Di[c] = d;
            }
            gam[i] = d * e[0];
        } else {
            for (int c = 0; c <= i; c++) Di[c] = 0.0f;
            gam[i] = 0.0f;
        }
    }
    __syncthreads();
    { /* the Gram matrices, a 4 x 4 tile a thread (those on and below the diagonal), times D (and beta_i) */
        const int ti = tid / 16, tj = tid % 16;
        float gk[4][4], gq[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) gk[a][b] = gq[a][b] = 0.0f;
        if (tj <= ti)
            for (int r = 0; r < DK; r += 4) {
                float4 kj[4], ki[4], qi[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    kj[a] = *(const float4 *)(ks + (4 * tj + a) * KP + r);
                    ki[a] = *(const float4 *)(ks + (4 * ti + a) * KP + r);
                    qi[a] = *(const float4 *)(qs + (4 * ti + a) * KP + r);
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        gk[a][b] = __fmaf_rn(ki[a].x, kj[b].x, gk[a][b]);
                        gk[a][b] = __fmaf_rn(ki[a].y, kj[b].y, gk[a][b]);
                        gk[a][b] = __fmaf_rn(ki[a].z, kj[b].z, gk[a][b]);
                        gk[a][b] = __fmaf_rn(ki[a].w, kj[b].w, gk[a][b]);
                        gq[a][b] = __fmaf_rn(qi[a].x, kj[b].x, gq[a][b]);
                        gq[a][b] = __fmaf_rn(qi[a].y, kj[b].y, gq[a][b]);
                        gq[a][b] = __fmaf_rn(qi[a].z, kj[b].z, gq[a][b]);
                        gq[a][b] = __fmaf_rn(qi[a].w, kj[b].w, gq[a][b]);
                    }
            }
        float *aqb = aq + blk * DC_C * DC_C;
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = 4 * ti + a;
            float w[4];
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int c = 4 * tj + b;
                const float d = D[i * DC_AP + c]; /* 0 above the diagonal and past n */
                A[i * DC_AP + c] = c < i ? gk[a][b] * (bt[i] * d) : 0.0f;
                w[b] = gq[a][b] * d;
            }
            *(float4 *)(aqb + i * DC_C + 4 * tj) = make_float4(w[0], w[1], w[2], w[3]);
        }
    }
    __syncthreads();
    /* Uh and Wh: (I + A) X = Y for Y's columns beta v (c < dv) and beta gam k (dv <= c < dv + DK), a column a thread,
     * its 64 rows in registers (rows past n are zeros) */
    float *whb = wh + blk * DC_C * DK;
    for (int col = tid; col < dv + DK; col += DC_T) {
        const bool isv = col < dv;
        const float *vc = v + (int64_t)t0 * hv * dv + (int64_t)j * dv + col;
        float x[DC_C];
#pragma unroll
        for (int i = 0; i < DC_C; i++) {
            float y;
            if (isv)
                y = i < n ? bt[i] * vc[(int64_t)i * hv * dv] : 0.0f;
            else
                y = (bt[i] * gam[i]) * ks[i * KP + col - dv];
            float s0 = 0.0f, s1 = 0.0f;
            const float *Ai = A + i * DC_AP;
#pragma unroll
            for (int c = 0; c + 4 <= i; c += 4) {
                const float4 a4 = *(const float4 *)(Ai + c);
                s0 = __fmaf_rn(a4.x, x[c], s0);
                s1 = __fmaf_rn(a4.y, x[c + 1], s1);
                s0 = __fmaf_rn(a4.z, x[c + 2], s0);
                s1 = __fmaf_rn(a4.w, x[c + 3], s1);
            }
#pragma unroll
            for (int c = i & ~3; c < i; c++) {
                if (c & 1)
                    s1 = __fmaf_rn(Ai[c], x[c], s1);
                else
                    s0 = __fmaf_rn(Ai[c], x[c], s0);
            }
            x[i] = y - (s0 + s1);
        }
        if (isv) {
            float *oc = o + (int64_t)t0 * hv * dv + (int64_t)j * dv + col;
#pragma unroll
            for (int i = 0; i < DC_C; i++)
                if (i < n) oc[(int64_t)i * hv * dv] = x[i];
        } else {
#pragma unroll
            for (int i = 0; i < DC_C; i++) whb[i * DK + col - dv] = x[i];
        }
    }
    if (tid < DC_C) {
        gd[blk * 2 * DC_C + tid] = gam[tid];
        gd[blk * 2 * DC_C + DC_C + tid] = D[(n - 1) * DC_AP + tid];
    }
}

/*
 * Block (j, columns c0 = 32 blockIdx.y ...) of the window's chunks in order, after k_dc_prep: the slab of S in
 * shared memory from state and back. Products a thread: rows 4 rg .. 4 rg + 3 and columns 2 cg, 2 cg + 1 of U, P and
 * O (rg = tid / 16, cg = tid % 16), reading Wh's and Q's rows and Aq's from memory (the 16 threads of a row group
 * read the same addresses); rows RPT rc .. of S's columns 4 cc .. 4 cc + 3 (rc = tid / 8, cc = tid % 8) for its
 * update.
 */
template <int DK>
__global__ void __launch_bounds__(DC_T, 2)
    k_dc_run(float *o, float *state, const float *wh, const float *aq, const float *gd, const float *q, const float *k,
             int n_tok, int hk, int hv, int dv, int tiled) {
    QWC_PDL_ENTRY();
    constexpr int SP = DC_CW + 4, RPT = DK / 32;
    extern __shared__ __align__(16) float sm[]; /* dc_run_smem: S's slab, U, gam and D_{n-1,.} */
    float *Ss = sm, *Us = Ss + DK * SP, *sg = Us + DC_C * SP;
    const int j = blockIdx.x, c0 = blockIdx.y * DC_CW, tid = threadIdx.x;
    const int hq = tiled ? j % hk : j / (hv / hk);
    const int64_t qk_row = (int64_t)hk * DK, v_row = (int64_t)hv * dv;
    float *S = state + (int64_t)j * DK * dv;
    for (int x = tid; x < DK * DC_CW; x += DC_T) {
        const int r = x / DC_CW, c = x % DC_CW;
        Ss[r * SP + c] = c0 + c < dv ? S[(int64_t)r * dv + c0 + c] : 0.0f;
    }
    const int rg = tid / 16, cg = tid % 16, i0 = 4 * rg, ca = 2 * cg;
    const int r0 = (tid / 8) * RPT, cc = 4 * (tid % 8);
    const int n_ch = (n_tok + DC_C - 1) / DC_C;
    for (int ch = 0; ch < n_ch; ch++) {
        const int t0 = ch * DC_C, n = min(DC_C, n_tok - t0);
        const int64_t blk = (int64_t)ch * hv + j;
        const float *whc = wh + blk * DC_C * DK, *aqc = aq + blk * DC_C * DC_C;
        const float *qc = q + (int64_t)t0 * qk_row + (int64_t)hq * DK;
        const float *kc = k + (int64_t)t0 * qk_row + (int64_t)hq * DK;
        float *oc = o + (int64_t)t0 * v_row + (int64_t)j * dv + c0;
        __syncthreads(); /* S in place, the chunk before done with Us and sg */
        if (tid < 2 * DC_C) sg[tid] = gd[blk * 2 * DC_C + tid];
        /* U = Uh - Wh S, P = Q S */
        float u[4][2], p[4][2];
#pragma unroll
        for (int a = 0; a < 4; a++) u[a][0] = u[a][1] = p[a][0] = p[a][1] = 0.0f;
        for (int r = 0; r < DK; r += 4) {
            float4 wa[4], qa[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                wa[a] = __ldg((const float4 *)(whc + (i0 + a) * DK + r));
                qa[a] = i0 + a < n ? __ldg((const float4 *)(qc + (i0 + a) * qk_row + r))
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int rr = 0; rr < 4; rr++) {
                const float2 s2 = *(const float2 *)(Ss + (r + rr) * SP + ca);
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    const float w1 = dc_at(wa[a], rr), q1 = dc_at(qa[a], rr);
                    u[a][0] = __fmaf_rn(w1, s2.x, u[a][0]);
                    u[a][1] = __fmaf_rn(w1, s2.y, u[a][1]);
                    p[a][0] = __fmaf_rn(q1, s2.x, p[a][0]);
                    p[a][1] = __fmaf_rn(q1, s2.y, p[a][1]);
                }
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = i0 + a;
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int c = ca + b;
                const float uh = i < n && c0 + c < dv ? oc[i * v_row + c] : 0.0f;
                Us[i * SP + c] = i < n ? uh - u[a][b] : 0.0f;
            }
        }
        __syncthreads();
        /* O = gam P + Aq U over Uh's rows (this thread's: it read them above) */
        float acc[4][2];
#pragma unroll
        for (int a = 0; a < 4; a++) acc[a][0] = acc[a][1] = 0.0f;
        for (int c = 0; c < i0 + 4; c += 4) {
            float4 a4[4];
#pragma unroll
            for (int a = 0; a < 4; a++) a4[a] = __ldg((const float4 *)(aqc + (i0 + a) * DC_C + c));
#pragma unroll
            for (int cr = 0; cr < 4; cr++) {
                const float2 u2 = *(const float2 *)(Us + (c + cr) * SP + ca);
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    const float w1 = dc_at(a4[a], cr);
                    acc[a][0] = __fmaf_rn(w1, u2.x, acc[a][0]);
                    acc[a][1] = __fmaf_rn(w1, u2.y, acc[a][1]);
                }
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int i = i0 + a;
#pragma unroll
            for (int b = 0; b < 2; b++)
                if (i < n && c0 + ca + b < dv) oc[i * v_row + ca + b] = __fmaf_rn(sg[i], p[a][b], acc[a][b]);
        }
        /* S = gam_{n-1} S + (K o D_{n-1,.})^T U: the slab's reads above are done (the barrier after them) */
        float sa[RPT][4];
#pragma unroll
        for (int a = 0; a < RPT; a++) sa[a][0] = sa[a][1] = sa[a][2] = sa[a][3] = 0.0f;
        for (int i = 0; i < n; i++) {
            const float dl = sg[DC_C + i];
            const float4 u4 = *(const float4 *)(Us + i * SP + cc);
#pragma unroll
            for (int a = 0; a < RPT; a++) {
                const float kd = __ldg(kc + i * qk_row + r0 + a) * dl;
                sa[a][0] = __fmaf_rn(kd, u4.x, sa[a][0]);
                sa[a][1] = __fmaf_rn(kd, u4.y, sa[a][1]);
                sa[a][2] = __fmaf_rn(kd, u4.z, sa[a][2]);
                sa[a][3] = __fmaf_rn(kd, u4.w, sa[a][3]);
            }
        }
        const float gl = sg[n - 1];
#pragma unroll
        for (int a = 0; a < RPT; a++) {
            float4 *s4 = (float4 *)(Ss + (r0 + a) * SP + cc);
            float4 s = *s4;
            s.x = __fmaf_rn(gl, s.x, sa[a][0]);
            s.y = __fmaf_rn(gl, s.y, sa[a][1]);
            s.z = __fmaf_rn(gl, s.z, sa[a][2]);
            s.w = __fmaf_rn(gl, s.w, sa[a][3]);
            *s4 = s;
        }
    }
    __syncthreads();
    for (int x = tid; x < DK * DC_CW; x += DC_T) {
        const int r = x / DC_CW, c = x % DC_CW;
        if (c0 + c < dv) S[(int64_t)r * dv + c0 + c] = Ss[r * SP + c];
    }
}

template <int DK>
static void dc_window(cudaStream_t st, float *o, float *state, const float *q, const float *k, const float *v,
                      const float *g, const float *beta, int n_tok, int hk, int hv, int dv, int tiled, float *scratch) {
    const int n_ch = (n_tok + DC_C - 1) / DC_C;
    float *wh = scratch, *aq = wh + (int64_t)n_ch * hv * DC_C * DK, *gd = aq + (int64_t)n_ch * hv * DC_C * DC_C;
    const size_t sh = (size_t)dc_prep_smem<DK>() * sizeof(float);
    QWC_CHECK(cudaFuncSetAttribute(k_dc_prep<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    qwc_launch(k_dc_prep<DK>, dim3((unsigned)hv, (unsigned)n_ch), DC_T, sh, st, o, wh, aq, gd, q, k, v, g, beta, n_tok,
               hk, hv, dv, tiled);
    QWC_LAUNCHED();
    qwc_launch(k_dc_run<DK>, dim3((unsigned)hv, (unsigned)((dv + DC_CW - 1) / DC_CW)), DC_T,
               (size_t)dc_run_smem<DK>() * sizeof(float), st, o, state, wh, aq, gd, q, k, n_tok, hk, hv, dv, tiled);
    QWC_LAUNCHED();
}

int qwc_delta_chunk(qwc *c, float *o, float *state, const float *q, const float *k, const float *v, const float *g,
                    const float *beta, int n_tok, int hk, int hv, int dk, int dv, int tiled) {
    const int min_tok = qwc_dr_chunk_min(c);
    if (min_tok <= 0 || n_tok < min_tok || n_tok < DC_MIN_TOK || (dk != 32 && dk != 64 && dk != 128) || dv <= 0 || hk <= 0 || hv % hk ||
        (((uintptr_t)q | (uintptr_t)k) & 15) || qwc_recording(c))
        return 0;
    const int win = n_tok < DC_WIN ? n_tok : DC_WIN, n_ch = (win + DC_C - 1) / DC_C;
    const size_t floats = (size_t)n_ch * hv * ((size_t)DC_C * dk + DC_C * DC_C + 2 * DC_C);
    float *scratch = (float *)qwc_scratch(c, floats * sizeof(float));
    cudaStream_t st = qwc_stream(c);
    const int64_t kd = (int64_t)hk * dk, vd = (int64_t)hv * dv;
    for (int t0 = 0; t0 < n_tok; t0 += DC_WIN) {
        const int nt = n_tok - t0 < DC_WIN ? n_tok - t0 : DC_WIN;
        float *ow = o + t0 * vd;
        const float *qw = q + t0 * kd, *kw = k + t0 * kd, *vw = v + t0 * vd, *gw = g + (int64_t)t0 * hv;
        const float *bw = beta + (int64_t)t0 * hv;
        if (dk == 128)
            dc_window<128>(st, ow, state, qw, kw, vw, gw, bw, nt, hk, hv, dv, tiled, scratch);
        else if (dk == 64)
            dc_window<64>(st, ow, state, qw, kw, vw, gw, bw, nt, hk, hv, dv, tiled, scratch);
        else
            dc_window<32>(st, ow, state, qw, kw, vw, gw, bw, nt, hk, hv, dv, tiled, scratch);
    }
    return 1;
}
