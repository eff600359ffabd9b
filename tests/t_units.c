/*
 * t_units.c - hand-worked and published test vectors for the new math: the PLE n-gram hash (spec
 * qwen4_exp.md 3.3 and 1.4), RoPE tables and rotation (default and llama3 scaling), the gated delta
 * rule, QSA block selection with its tie and tail rules, top-k, f16/bf16 conversion, and qwenc_utf8_repair
 * (Python's bytes.decode("utf-8", errors="replace") on hand-made bytes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks/blocks.h"
#include "test_util.h"

static int close_to(double a, double b, double tol) { return fabs(a - b) <= tol * (1.0 + fabs(b)); }

/* ------------------------------------------------------------------ PLE hash */

static qw_hparams ple_hparams(int vocab, int hpn, int64_t base, int div, int eos) {
    qw_hparams hp;
    memset(&hp, 0, sizeof(hp));
    hp.n_vocab = vocab;
    hp.ngram_n = 3;
    hp.ngram_heads = 2 * hpn;
    hp.ngram_base = base;
    hp.ngram_div = div;
    hp.ngram_seed = 1234;
    hp.eos_id = eos;
    return hp;
}

static void test_ple_flash_next(void) {
    printf("PLE hash: Flash-Next constants and test vectors (spec 1.4, 3.3)\n");
    qw_hparams hp = ple_hparams(248320, 8, 20000000, 128, 248044);
    qw_ple_w w;
    memset(&w, 0, sizeof(w));
    int64_t prime[16], offset[16];
    w.prime = prime;
    w.offset = offset;
    qw_ple_constants(&hp, 0, w.mult, prime, offset, &w.n_rows);
    const uint64_t mult[3] = {23703573157769ull, 20109073645365ull, 8052911324071ull};
    for (int i = 0; i < 3; i++) CHECK(w.mult[i] == mult[i], "multiplier %d = %llu", i, (unsigned long long)w.mult[i]);
    const int64_t primes[16] = {20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                                20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171};
    int64_t off = 0;
    for (int h = 0; h < 16; h++) {
        CHECK(prime[h] == primes[h], "prime of head %d = %lld", h, (long long)prime[h]);
        CHECK(offset[h] == off, "offset of head %d = %lld", h, (long long)offset[h]);
        off += primes[h];
    }
    CHECK(off == 320001446 && w.n_rows == 320001536, "table rows %lld (sum %lld)", (long long)w.n_rows, (long long)off);

    const int32_t ids[8] = {248045, 846, 198, 9419, 248044, 271, 248069, 271};
    const int64_t want[8][4] = {
        {13981229, 146384625, 173637879, 312970430}, {4908448, 159207155, 170314019, 308659387},
        {4582007, 145212418, 163775156, 317942745},  {17028438, 144623762, 166642648, 301485535},
        {3091325, 150432651, 168696131, 301721116},  {6185323, 151005272, 175325449, 300146592},
        {3103499, 149641648, 178470897, 311554203},  {14994213, 145017346, 165781476, 310120988},
    };
    const int heads[4] = {0, 7, 8, 15};
    int32_t hist[2] = {248044, 248044};
    int64_t rows[8 * 16], rows2[8 * 16];
    qw_ple_rows(&hp, &w, hist, ids, 8, rows);
    for (int p = 0; p < 8; p++)
        for (int j = 0; j < 4; j++)
            CHECK(rows[p * 16 + heads[j]] == want[p][j], "position %d head %d: row %lld, expected %lld", p, heads[j],
                  (long long)rows[p * 16 + heads[j]], (long long)want[p][j]);
    /* the same rows when the sequence arrives in two pieces, the second with the last two ids as history */
    qw_ple_rows(&hp, &w, hist, ids, 3, rows2);
    int32_t hist2[2] = {ids[1], ids[2]};
    qw_ple_rows(&hp, &w, hist2, ids + 3, 5, rows2 + 3 * 16);
    CHECK(memcmp(rows, rows2, sizeof(rows)) == 0, "rows differ when the ids are fed in two calls");
}

static void test_ple_tiny(void) {
    printf("PLE hash: tiny-model constants (spec 3.3)\n");
    qw_hparams hp = ple_hparams(256, 2, 1000, 8, 5);
    uint64_t mult[8];
    int64_t prime[4], offset[4], n_rows;
    qw_ple_constants(&hp, 0, mult, prime, offset, &n_rows);
    const uint64_t wm[3] = {4295158889762567ull, 35454616657218897ull, 19285316470915801ull};
    const int64_t wp[4] = {1009, 1013, 1019, 1021}, wo[4] = {0, 1009, 2022, 3041};
    for (int i = 0; i < 3; i++) CHECK(mult[i] == wm[i], "tiny multiplier %d = %llu", i, (unsigned long long)mult[i]);
    for (int h = 0; h < 4; h++) CHECK(prime[h] == wp[h] && offset[h] == wo[h], "tiny head %d", h);
    CHECK(n_rows == 4064, "tiny table rows %lld", (long long)n_rows);
    /* a second PLE layer (ple_layer_index 1) takes the next primes */
    qw_ple_constants(&hp, 1, mult, prime, offset, &n_rows);
    CHECK(prime[0] == 1031 && prime[3] == 1049, "layer-1 primes %lld..%lld", (long long)prime[0], (long long)prime[3]);
    CHECK(qw_splitmix64(0) == 0xE220A8397B1DCDAFull, "splitmix64(0) = %llx", (unsigned long long)qw_splitmix64(0));
}

/* ------------------------------------------------------------------ RoPE */

static void test_rope(void) {
    printf("RoPE: inv_freq (default, llama3) and rotate-half rotation\n");
    qw_hparams hp;
    memset(&hp, 0, sizeof(hp));
    hp.n_rot = 64;
    hp.rope_theta = 1e7f;
    float inv[32];
    qw_rope_inv_freq(&hp, inv);
    for (int k = 0; k < 32; k++)
        CHECK(close_to(inv[k], pow(1e7, -2.0 * k / 64.0), 1e-6), "default inv_freq[%d] = %g", k, inv[k]);

    /* llama3: theta 5e5, 16 rotary dims, factor 8, low 1, high 4, original context 64:
     * wavelength 2pi/f above 64 -> f/8; below 16 -> f; in between interpolated */
    hp.n_rot = 16;
    hp.rope_theta = 500000.0f;
    hp.rope_type = QW_ROPE_LLAMA3;
    hp.rope_factor = 8;
    hp.rope_low_freq = 1;
    hp.rope_high_freq = 4;
    hp.rope_orig_ctx = 64;
    float l3[8];
    qw_rope_inv_freq(&hp, l3);
    int n_kept = 0, n_smooth = 0, n_scaled = 0;
    for (int k = 0; k < 8; k++) {
        double f = pow(500000.0, -2.0 * k / 16.0), wl = 2 * 3.14159265358979323846 / f, want;
        if (wl < 16) {
            want = f;
            n_kept++;
        } else if (wl > 64) {
            want = f / 8;
            n_scaled++;
        } else {
            double s = (64.0 / wl - 1) / (4 - 1);
            want = (1 - s) * f / 8 + s * f;
            n_smooth++;
        }
        CHECK(close_to(l3[k], want, 1e-5), "llama3 inv_freq[%d] = %g, expected %g", k, l3[k], want);
    }
    CHECK(n_kept && n_smooth && n_scaled, "llama3 case covers all three regimes (%d/%d/%d)", n_kept, n_smooth, n_scaled);

    /* rotation: pairs (i, i + n_rot/2) on the first n_rot dims, the rest untouched */
    float inv2[2] = {1.0f, 0.5f}, cs[4];
    qw_rope_cs(inv2, 4, 3, 1, cs);
    CHECK(close_to(cs[0], cos(3.0), 1e-6) && close_to(cs[1], cos(1.5), 1e-6) && close_to(cs[2], sin(3.0), 1e-6) &&
              close_to(cs[3], sin(1.5), 1e-6),
          "cos/sin table at position 3");
    float x[6] = {1, 2, 3, 4, 5, 6};
    qw_backend_ref()->rope(qw_backend_ref(), x, 1, 6, 1, 6, 4, cs);
    double c0 = cos(3.0), s0 = sin(3.0), c1 = cos(1.5), s1 = sin(1.5);
    CHECK(close_to(x[0], 1 * c0 - 3 * s0, 1e-6) && close_to(x[2], 3 * c0 + 1 * s0, 1e-6), "rotation of pair (0, 2)");
    CHECK(close_to(x[1], 2 * c1 - 4 * s1, 1e-6) && close_to(x[3], 4 * c1 + 2 * s1, 1e-6), "rotation of pair (1, 3)");
    CHECK(x[4] == 5 && x[5] == 6, "dims past n_rot untouched");
}

/* ------------------------------------------------------------------ delta rule */

static void test_delta_rule(void) {
    printf("Gated delta rule: two hand-worked steps\n");
    /* one qk head shared by two value heads (GQA mapping j / (hv/hk)); head 1 gets v scaled by 2 */
    float state[2 * 2 * 2] = {0};
    const float q[2][2] = {{1, 0}, {0, 1}}, k[2][2] = {{1, 0}, {0.6f, 0.8f}};
    const float v[2][2][2] = {{{2, 4}, {4, 8}}, {{1, 1}, {2, 2}}};
    const float g[2][2] = {{logf(0.5f), logf(0.5f)}, {logf(0.5f), logf(0.5f)}};
    const float beta[2][2] = {{0.5f, 0.5f}, {1, 1}};
    float o[2][2][2];
    qw_backend_ref()->delta_rule(qw_backend_ref(), &o[0][0][0], state, &q[0][0], &k[0][0], &v[0][0][0], &g[0][0], &beta[0][0], 2, 1, 2, 2, 2, 0);
    /* step 1: S = 0; u = 0.5 (v - 0) = [1, 2]; S = k u^T = [[1,2],[0,0]]; o = S^T q = [1, 2]
     * step 2: S = 0.5 S = [[.5,1],[0,0]]; S^T k = [.3,.6]; u = [1,1]-[.3,.6] = [.7,.4];
     *         S += k u^T -> [[.92,1.24],[.56,.32]]; o = S^T q = [.56, .32] */
    const float want[2][2] = {{1, 2}, {0.56f, 0.32f}};
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 2; c++) {
            CHECK(close_to(o[t][0][c], want[t][c], 1e-6), "step %d head 0 o[%d] = %g, expected %g", t, c, o[t][0][c],
                  want[t][c]);
            CHECK(close_to(o[t][1][c], 2 * want[t][c], 1e-6), "step %d head 1 o[%d] = %g", t, c, o[t][1][c]);
        }
    CHECK(close_to(state[0], 0.92, 1e-6) && close_to(state[1], 1.24, 1e-6) && close_to(state[2], 0.56, 1e-6) &&
              close_to(state[3], 0.32, 1e-6),
          "final state of head 0");
}

/* ------------------------------------------------------------------ QSA */

static void test_qsa(void) {
    printf("QSA: top-k ties, block selection, tail\n");
    int idx[4];
    const float s1[4] = {0, 1, 0, 0};
    qw_topk(s1, 4, 2, idx);
    CHECK(idx[0] == 1 && idx[1] == 0, "tie among zeros goes to the lowest index: got %d %d", idx[0], idx[1]);
    const float s2[5] = {0.1f, 0.5f, 0.2f, 0.5f, 0.3f};
    qw_topk(s2, 5, 3, idx);
    CHECK(idx[0] == 1 && idx[1] == 3 && idx[2] == 4, "top-3 order: got %d %d %d", idx[0], idx[1], idx[2]);

    int chosen[16];
    int32_t sel[64];
    /* R = 2, top 2 blocks. Query 10: 11 visible, 5 complete blocks, tail {10}. */
    const float sc[5] = {0.1f, 0.5f, 0.0f, 0.4f, 0.2f};
    int n = qw_qsa_positions(sc, 5, 2, 2, 10, chosen, sel);
    const int32_t want1[5] = {2, 3, 6, 7, 10};
    CHECK(n == 5 && memcmp(sel, want1, sizeof(want1)) == 0, "blocks 1,3 + tail 10 (got %d positions)", n);
    /* query 9: 10 visible = 5 complete blocks, empty tail: the query itself only if its block wins */
    n = qw_qsa_positions(sc, 5, 2, 2, 9, chosen, sel);
    CHECK(n == 4 && sel[3] == 7, "empty tail at a block boundary (got %d positions)", n);
    /* ties at the boundary: blocks 0, 2, 3, 4 all score 0; block 1 wins, then block 0 */
    const float tie[5] = {0, 0.3f, 0, 0, 0};
    n = qw_qsa_positions(tie, 5, 2, 2, 10, chosen, sel);
    const int32_t want2[5] = {0, 1, 2, 3, 10};
    CHECK(n == 5 && memcmp(sel, want2, sizeof(want2)) == 0, "tie broken towards the lower block");
    /* dense regime: no more complete blocks than the budget -> every position */
    n = qw_qsa_positions(sc, 2, 2, 2, 4, chosen, sel);
    CHECK(n == 5 && sel[0] == 0 && sel[4] == 4, "dense regime keeps every visible position");
}

/* ------------------------------------------------------------------ dtypes */

static void test_dtypes(void) {
    printf("f16 / bf16 conversion\n");
    CHECK(qw_f16_to_f32(0x3c00) == 1.0f && qw_f16_to_f32(0xc000) == -2.0f && qw_f16_to_f32(0x7bff) == 65504.0f,
          "f16 normal values");
    CHECK(qw_f16_to_f32(0x0001) == ldexpf(1, -24) && qw_f16_to_f32(0x03ff) == ldexpf(1023, -24), "f16 subnormals");
    CHECK(isinf(qw_f16_to_f32(0x7c00)) && isnan(qw_f16_to_f32(0x7e00)), "f16 inf and nan");
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = qw_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        bad += qw_f32_to_f16(f) != h;
    }
    CHECK(bad == 0, "f16 -> f32 -> f16 round trip fails for %d patterns", bad);
    CHECK(qw_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "f16 round half to even (down)");
    CHECK(qw_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "f16 round half to even (up)");
    CHECK(qw_f32_to_bf16(1.00390625f) == 0x3f80 && qw_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 round half to even");
    CHECK(qw_bf16_to_f32(0x3f80) == 1.0f && qw_bf16_to_f32(0xc040) == -3.0f, "bf16 to f32");
}

static void test_utf8_repair(void) {
    static const struct {
        const char *in, *want;
        size_t n;
    } cases[] = {
        {"caf\xc3\xa9", "caf\xc3\xa9", 5},                               /* valid */
        {"caf\xc3 \xff ok", "caf\xef\xbf\xbd \xef\xbf\xbd ok", 9},      /* cut lead, invalid byte */
        {"\xe2\x82", "\xef\xbf\xbd", 2},                                  /* one maximal subpart: one U+FFFD */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},  /* a surrogate: each byte */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd", 2},                      /* overlong */
        {"a\0b", "a\0b", 3},                                                /* NUL is valid */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *r = qwenc_utf8_repair(cases[i].in, cases[i].n);
        size_t wl = cases[i].n == 3 && cases[i].in[1] == 0 ? 3 : strlen(cases[i].want);
        CHECK(r && !memcmp(r, cases[i].want, wl) && r[wl] == 0, "utf8_repair case %zu", i);
        free(r);
    }
}

int main(void) {
    test_ple_flash_next();
    test_ple_tiny();
    test_rope();
    test_delta_rule();
    test_qsa();
    test_dtypes();
    test_utf8_repair();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
