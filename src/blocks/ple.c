/*
 * ple.c - the per-layer hashed n-gram embedding "PLE" of qwen4_exp (spec qwen4_exp.md 3.3).
 *
 * For each token, the n-grams ending at it (orders 2..n, cut at EOS) are hashed with per-order
 * multipliers into n_heads tables (consecutive primes >= ngram_vocab_size_base, laid end to end in one
 * padded table); the n_heads rows form e [P]. Then, per residual stream s:
 *   K = grouped ZRMS(W_key e; norm_key), V = W_val e, Q = grouped ZRMS(X; norm_query)
 *   sigma_s = <K[s], Q[s]> / sqrt(H); g_s = sign * sqrt(max(|sigma_s|, 1e-6)); G[s] = sigmoid(g_s) V
 *   Gn = grouped ZRMS(G; norm_conv); c = silu(depthwise conv of Gn, k taps, dilation n)
 *   X += G + c
 * State: the last (k-1)*n rows of Gn and the last n-1 token ids (EOS before the start).
 * Integer arithmetic: splitmix64 wraps mod 2^64; the n-gram products of ids < vocab never overflow.
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"
#include "core/mapfile.h"

uint64_t qw_splitmix64(uint64_t v) {
    v += 0x9E3779B97F4A7C15ull;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

/* a^e mod m for m < 2^32 (so every product fits in 64 bits) */
static uint64_t powmod32(uint64_t a, uint64_t e, uint64_t m) {
    uint64_t r = 1;
    for (a %= m; e; e >>= 1, a = a * a % m)
        if (e & 1) r = r * a % m;
    return r;
}

/* Below 2^32, Miller-Rabin with the bases 2, 7 and 61 is exact (no composite below 4,759,123,141 passes all
 * three): a few microseconds where trial division near 2^31 took a third of a millisecond, so a config's
 * n-gram tables cost little at load (formats/hfconfig.c bounds ngram_vocab_size_base by 2^31). Trial
 * division above. */
static int is_prime(int64_t n) {
    if (n < 2) return 0;
    static const int small[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61};
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++)
        if (n % small[i] == 0) return n == small[i];
    if (n >= (int64_t)1 << 32) {
        for (int64_t d = 67; d * d <= n; d += 2)
            if (n % d == 0) return 0;
        return 1;
    }
    uint64_t m = (uint64_t)n, d = m - 1;
    int r = 0;
    for (; !(d & 1); d >>= 1) r++;
    static const uint64_t bases[] = {2, 7, 61};
    for (int b = 0; b < 3; b++) {
        uint64_t x = powmod32(bases[b], d, m);
        if (x == 1 || x == m - 1) continue;
        int i = 1;
        for (; i < r && (x = x * x % m) != m - 1; i++) {
        }
        if (i == r) return 0;
    }
    return 1;
}

void qw_ple_constants(const qw_hparams *hp, int li, uint64_t *mult, int64_t *prime, int64_t *offset,
                      int64_t *n_rows) {
    int64_t hb = (int64_t)((INT64_MAX / hp->n_vocab) / 2);
    if (hb < 1) hb = 1;
    for (int i = 0; i < hp->ngram_n; i++) {
        uint64_t seed = hp->ngram_seed + 10007ull * (uint64_t)li + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        mult[i] = 2 * (qw_splitmix64(seed) % (uint64_t)hb) + 1;
    }
    /* head h of PLE layer li takes the (li*nh + h + 1)-th prime >= base */
    int nh = hp->ngram_heads;
    int64_t p = hp->ngram_base - 1, total = 0;
    for (int skip = 0; skip < li * nh; skip++)
        for (p++; !is_prime(p); p++) {
        }
    for (int h = 0; h < nh; h++) {
        for (p++; !is_prime(p); p++) {
        }
        prime[h] = p;
        offset[h] = total;
        total += p;
    }
    *n_rows = (total + hp->ngram_div - 1) / hp->ngram_div * hp->ngram_div;
}

void qw_ple_rows(const qw_hparams *hp, const qw_ple_w *w, const int32_t *hist, const int32_t *tokens, int n_tok,
                 int64_t *rows) {
    int n = hp->ngram_n, nh = hp->ngram_heads, hpn = nh / (n - 1), eos = hp->eos_id;
    for (int t = 0; t < n_tok; t++) {
        /* x[s] = token s steps back, EOS if an EOS lies at or between it and the current token */
        int64_t x[8];
        x[0] = tokens[t];
        int cut = 0;
        for (int s = 1; s < n; s++) {
            int src = t - s;
            int64_t id = src >= 0 ? tokens[src] : hist[n - 1 + src];
            if (id == eos) cut = 1;
            x[s] = cut ? eos : id;
        }
        for (int h = 0; h < nh; h++) {
            int order = 2 + h / hpn;
            uint64_t v = 0;
            for (int i = 0; i < order; i++) v ^= (uint64_t)x[i] * w->mult[i];
            rows[(int64_t)t * nh + h] = (int64_t)(v % (uint64_t)w->prime[h]) + w->offset[h];
        }
    }
}

/* The piece of the n-gram table that holds row r, and the row's index in it */
static const qw_tensor *table_row(const qw_ple_w *w, int64_t r, int32_t *local) {
    int64_t c = r / w->chunk_rows;
    if (c >= w->n_chunks) c = w->n_chunks - 1;
    *local = (int32_t)(r - c * w->chunk_rows);
    QW_ASSERT(*local >= 0 && *local < w->chunks[c].shape[0]);
    return &w->chunks[c];
}

/*
 * The table rows a step will read are known from its token ids alone: ask for their pages at the start of
 * the step (MADV_WILLNEED, which returns at once), so pages not in memory (a table larger than memory, or
 * a cold page cache) are read while the layers before the PLE layer run, all at once rather than one after
 * the other when get_rows touches them (the table is also mapped MADV_RANDOM: a fault reads its page, not
 * 128 KiB around it; model.c). flash-next Q4_K (3.2 M-row Q5_0 table, one PLE layer after the first),
 * decode on 2 threads from a dropped page cache on the AMD Zen 4 VM, three runs each: get_rows took 2.3-2.8
 * ms per token without either, 0.8-1.1 with MADV_RANDOM alone, 0.2-0.4 with both (a warm page cache:
 * 0.07-0.09; the advice costs nothing measurable there, in decode or in a 512-token prefill).
 */
void qw_ple_prefetch(const qw_fwd *f, const qw_ple_w *w) {
    const qw_hparams *hp = f->hp;
    int T = f->n_tok, nh = hp->ngram_heads;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    int64_t *rows = qw_arena_alloc(f->ar, (size_t)T * nh * sizeof(int64_t));
    qw_ple_rows(hp, w, f->s->ple_last, f->tokens, T, rows);
    for (int64_t i = 0; i < (int64_t)T * nh; i++) {
        int32_t local;
        const qw_tensor *chunk = table_row(w, rows[i], &local);
        size_t rb = qw_type_row_size(chunk->type, chunk->shape[1]);
        qw_advise_willneed((const char *)chunk->data + (size_t)local * rb, rb);
    }
    qw_arena_restore(f->ar, mk);
}

void qw_ple_forward(const qw_fwd *f, int il, const qw_ple_w *w, float *X) {
    const qw_hparams *hp = f->hp;
    const qw_ops *ops = f->ops;
    qw_layer_state *ls = &f->s->ls[il];
    int T = f->n_tok, C = hp->hc_count, H = hp->n_embd, P = hp->ple_dim, nh = hp->ngram_heads;
    int dh = P / nh, kc = hp->ple_conv_k, dil = hp->ngram_n, nhist = (kc - 1) * dil;
    int64_t CH = (int64_t)C * H;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    int64_t *rows = qw_arena_alloc(f->ar, (size_t)T * nh * sizeof(int64_t));
    qw_ple_rows(hp, w, f->s->ple_last, f->tokens, T, rows);
    float *e = qw_arena_f32(f->ar, (size_t)T * P);
    for (int64_t i = 0; i < (int64_t)T * nh; i++) {
        int32_t local;
        const qw_tensor *chunk = table_row(w, rows[i], &local);
        ops->get_rows(ops, e + i * dh, chunk, &local, 1);
    }

    float *K = qw_arena_f32(f->ar, (size_t)T * CH), *V = qw_arena_f32(f->ar, (size_t)T * H);
    float *Q = qw_arena_f32(f->ar, (size_t)T * CH);
    qw_matmul_job proj[2] = {{K, w->key_proj, e, T}, {V, w->value_proj, e, T}};
    ops->matmul_batch(ops, proj, 2);
    qw_norm_grouped(ops, K, K, w->norm_key, T, C, H, hp->norm_eps, 1);
    qw_norm_grouped(ops, Q, X, w->norm_query, T, C, H, hp->norm_eps, 1);

    /* G rows go after the remembered normalised history so the conv sees one contiguous sequence */
    float *G = qw_arena_f32(f->ar, (size_t)T * CH);
    float *hist = qw_arena_f32(f->ar, (size_t)(nhist + T) * CH);
    float *Gn = hist + (int64_t)nhist * CH;
    float inv_sqrt_h = 1.0f / sqrtf((float)H);
    for (int t = 0; t < T; t++)
        for (int s = 0; s < C; s++) {
            const float *k = K + t * CH + (int64_t)s * H, *q = Q + t * CH + (int64_t)s * H;
            double dot = 0;
            for (int i = 0; i < H; i++) dot += (double)k[i] * q[i];
            float sg = (float)dot * inv_sqrt_h;
            float mag = sqrtf(fmaxf(fabsf(sg), 1e-6f));
            float g = sg > 0 ? mag : sg < 0 ? -mag : 0.0f;
            float gate = 1.0f / (1.0f + expf(-g));
            float *dst = G + t * CH + (int64_t)s * H;
            for (int i = 0; i < H; i++) dst[i] = gate * V[(int64_t)t * H + i];
        }
    memcpy(hist, ls->ple_hist, (size_t)nhist * CH * sizeof(float));
    qw_norm_grouped(ops, Gn, G, w->norm_conv, T, C, H, hp->norm_eps, 1);
    float *c = qw_arena_f32(f->ar, (size_t)T * CH);
    ops->conv1d_dw(ops, c, hist, w->conv, T, (int)CH, kc, dil);
    memcpy(ls->ple_hist, hist + (int64_t)T * CH, (size_t)nhist * CH * sizeof(float));
    ops->silu(ops, c, (int64_t)T * CH);
    for (int64_t i = 0; i < (int64_t)T * CH; i++) X[i] += G[i] + c[i];
    qw_arena_restore(f->ar, mk);
}
