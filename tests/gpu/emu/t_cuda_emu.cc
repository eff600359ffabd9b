/*
 * t_cuda_emu.cc - the CUDA backend's chunked delta rule (src/cuda/delta_chunk.cu) run on CPU threads through
 * tests/gpu/emu/cuda/ops_internal.cuh, against the token-by-token rule in double, so that `make test` checks the
 * kernels' indexing and math on every machine (tests/gpu/t_cuda_ops.c runs the same cases on a GPU). The bound is
 * t_kernels.c's for the chunked form: |chunked - reference| <= 1e-5 ceil(T / 64) B, B the largest entry of the
 * states, values and outputs (kernels/delta_chunk.c derives it). Cases: dk 32, 64 and 128, partial chunks and
 * partial slabs of 32 state columns, grouped and tiled value heads, decays near 0 and near -30 and mixed, betas 0,
 * 1 and mixed, a zero state, a prompt over two windows; and the calls it must leave to the token kernel (too few
 * tokens, the setting off, another dk, unaligned rows, a graph being recorded), which launch nothing.
 */
#include "cuda/ops_internal.cuh"

alignas(16) float sm[EMU_SMEM_FLOATS];
thread_local dim3 threadIdx;
dim3 blockIdx, blockDim, gridDim;
std::barrier<> *emu_barrier;
int emu_launches;

#include "../../../src/cuda/delta_chunk.cu"

#include "../../test_check.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) { return test_frand(&rng); } /* uniform in [-1, 1) */

/* the rule token by token in double (kernels/ref.c's definition), state S [hv][dk][dv] */
static void rule_ref(std::vector<double> &o, std::vector<double> &S, const float *q, const float *k, const float *v,
                     const float *g, const float *beta, int T, int hk, int hv, int dk, int dv, int tiled) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < hv; j++) {
            const int hq = tiled ? j % hk : j / (hv / hk);
            const float *qt = q + ((size_t)t * hk + hq) * dk, *kt = k + ((size_t)t * hk + hq) * dk;
            double *Sj = S.data() + (size_t)j * dk * dv;
            const double e = exp((double)g[(size_t)t * hv + j]), b = beta[(size_t)t * hv + j];
            for (int c = 0; c < dv; c++) {
                double kv = 0, acc = 0;
                for (int r = 0; r < dk; r++) {
                    Sj[(size_t)r * dv + c] *= e;
                    kv += Sj[(size_t)r * dv + c] * kt[r];
                }
                const double u = b * (v[((size_t)t * hv + j) * dv + c] - kv);
                for (int r = 0; r < dk; r++) {
                    Sj[(size_t)r * dv + c] += kt[r] * u;
                    acc += Sj[(size_t)r * dv + c] * qt[r];
                }
                o[((size_t)t * hv + j) * dv + c] = acc;
            }
        }
}

/* one call: 1 when the chunked form took it; err: its largest error over B (the bound's unit) */
struct inputs {
    int T, hk, hv, dk, dv, tiled;
    std::vector<float> q, k, v, g, beta, S0;
};

static inputs make_inputs(int T, int hk, int hv, int dk, int dv, int gm, int bm, int zero_state, int tiled) {
    inputs in = {T, hk, hv, dk, dv, tiled, {}, {}, {}, {}, {}, {}};
    const size_t nq = (size_t)T * hk * dk;
    in.q.resize(nq + 4), in.k.resize(nq + 4); /* + 4: room for the unaligned case's shifted rows */
    for (size_t i = 0; i < nq; i++) in.q[i] = frand(), in.k[i] = frand();
    for (size_t r = 0; r < (size_t)T * hk; r++) { /* unit keys, queries of norm 1 / sqrt(dk), as the model makes */
        double a = 0, b = 0;
        for (int d = 0; d < dk; d++) {
            a += (double)in.q[r * dk + d] * in.q[r * dk + d];
            b += (double)in.k[r * dk + d] * in.k[r * dk + d];
        }
        for (int d = 0; d < dk; d++) {
            in.q[r * dk + d] = (float)(in.q[r * dk + d] / sqrt(a * dk));
            in.k[r * dk + d] = (float)(in.k[r * dk + d] / sqrt(b));
        }
    }
    in.v.resize((size_t)T * hv * dv);
    for (auto &x : in.v) x = frand();
    in.g.resize((size_t)T * hv), in.beta.resize((size_t)T * hv);
    test_dr_gates(in.g.data(), in.beta.data(), T, hv, gm, bm, frand);
    in.S0.resize((size_t)hv * dk * dv);
    for (auto &x : in.S0) x = zero_state ? 0.0f : 0.5f * frand();
    return in;
}

int main(void) {
    /* g and beta: test_dr_gates' modes (tests/test_check.h) */
    static const struct {
        int T, hk, hv, dk, dv, gm, bm, zero_state;
    } cases[] = {
        {20, 1, 1, 32, 32, 0, 0, 0},  {33, 1, 2, 64, 24, 3, 0, 0},   {63, 2, 4, 32, 17, 1, 2, 0},
        {64, 2, 2, 128, 32, 0, 0, 0}, {65, 1, 3, 64, 40, 3, 3, 0},   {77, 1, 1, 128, 48, 0, 0, 1},
        {130, 2, 4, 64, 72, 2, 0, 0}, {200, 1, 2, 128, 128, 4, 3, 0}, {1100, 1, 1, 32, 40, 1, 2, 0},
    };
    qwc c = {1, 0, 0, NULL};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int T = cases[ci].T, hk = cases[ci].hk, hv = cases[ci].hv, dk = cases[ci].dk, dv = cases[ci].dv;
        const int tiled = (int)(ci % 2);
        inputs in = make_inputs(T, hk, hv, dk, dv, cases[ci].gm, cases[ci].bm, cases[ci].zero_state, tiled);
        const size_t no = (size_t)T * hv * dv, ns = in.S0.size();
        std::vector<float> o(no, NAN), S = in.S0;
        std::vector<double> ro(no), rS(in.S0.begin(), in.S0.end());
        rule_ref(ro, rS, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, hk, hv, dk, dv, tiled);
        emu_launches = 0;
        const int took = qwc_delta_chunk(&c, o.data(), S.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                         in.beta.data(), T, hk, hv, dk, dv, tiled);
        double B = 0, worst = 0;
        for (size_t i = 0; i < ns; i++) B = fmax(B, fmax(fabs(in.S0[i]), fabs(rS[i])));
        for (size_t i = 0; i < no; i++) B = fmax(B, fmax(fabs(in.v[i]), fabs(ro[i])));
        for (size_t i = 0; i < no; i++) worst = fmax(worst, o[i] == o[i] ? fabs(o[i] - ro[i]) : INFINITY);
        for (size_t i = 0; i < ns; i++) worst = fmax(worst, S[i] == S[i] ? fabs(S[i] - rS[i]) : INFINITY);
        const double tol = 1e-5 * ((T + 63) / 64) * B;
        const int windows = (T + DC_WIN - 1) / DC_WIN;
        printf("  T %4d hk %d hv %d dk %3d dv %3d g %d beta %d: max error %.2e of %.2e (%.1f%% of the bound)\n", T,
               hk, hv, dk, dv, cases[ci].gm, cases[ci].bm, worst, B, 100 * worst / tol);
        CHECK(took && emu_launches == 2 * windows, "case %zu: taken %d, %d launches (%d windows)", ci, took,
              emu_launches, windows);
        CHECK(worst <= tol, "case %zu (T %d, dk %d, dv %d): max error %.3g > bound %.3g", ci, T, dk, dv, worst, tol);
    }
    /* the calls it leaves to the token kernel: nothing launched, nothing written */
    {
        inputs in = make_inputs(80, 1, 2, 64, 32, 0, 0, 0, 0);
        std::vector<float> o(in.v.size(), NAN), S = in.S0;
        const float *q = in.q.data(), *k = in.k.data(), *v = in.v.data(), *g = in.g.data(), *b = in.beta.data();
        struct {
            const char *what;
            int setting, recording, T, dk, shift;
        } no[] = {
            {"the setting off", 0, 0, 80, 64, 0},          {"fewer tokens than the setting", 100, 0, 80, 64, 0},
            {"fewer tokens than a graph may hold", 1, 0, QWENC_MAX_DRAFT + 2, 64, 0},
            {"dk 48", 1, 0, 80, 48, 0},                    {"rows not 16-byte aligned", 1, 0, 80, 64, 1},
            {"a graph being recorded", 1, 1, 80, 64, 0},
        };
        for (auto &x : no) {
            qwc d = {x.setting, x.recording, 0, NULL};
            emu_launches = 0;
            const int took = qwc_delta_chunk(&d, o.data(), S.data(), q + x.shift, k + x.shift, v, g, b, x.T, 1, 2,
                                             x.dk, 32, 0);
            bool same = true;
            for (size_t i = 0; i < o.size(); i++) same = same && o[i] != o[i];
            for (size_t i = 0; i < S.size(); i++) same = same && S[i] == in.S0[i];
            CHECK(!took && !emu_launches && same, "%s: taken %d, %d launches", x.what, took, emu_launches);
            free(d.scratch);
        }
        /* and the shortest call it takes */
        qwc d = {1, 0, 0, NULL};
        CHECK(qwc_delta_chunk(&d, o.data(), S.data(), q, k, v, g, b, QWENC_MAX_DRAFT + 3, 1, 2, 64, 32, 0),
              "%d tokens: not taken", QWENC_MAX_DRAFT + 3);
        free(d.scratch);
    }
    free(c.scratch);
    return test_summary();
}
