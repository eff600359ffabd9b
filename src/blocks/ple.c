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
 * The constants are computed here at load; the hashing, the row gathers and the gate are backend ops
 * (ple_rows, ple_gather, ple_gate; kernels/composite.c).
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

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
    qw_ple_hash(rows, tokens, hist, n_tok, hp->ngram_n, hp->ngram_heads, hp->eos_id, w->mult, w->prime, w->offset);
}

/*
 * The table rows a step will read are known from its token ids alone: ask for their pages at the start of
 * the step (a hint that returns at once), so pages not in memory (a table larger than memory, or a cold
 * page cache) are read while the layers before the PLE layer run, all at once rather than one after the
 * other when the gather touches them (docs/BENCH.md, PLE faults).
 */
void qw_ple_prefetch(const qw_fwd *f, const qw_ple_w *w) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, nh = hp->ngram_heads;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);
    int64_t *rows = qw_arena_alloc(f->ar, (size_t)T * nh * sizeof(int64_t));
    for (int i = 0; i < qw_fwd_n_seg(f); i++) {
        qw_seg g = qw_fwd_seg(f, i);
        be->ple_rows(be, rows + (int64_t)g.row0 * nh, f->tokens + g.row0, g.s->ple_hist, g.rows, hp->ngram_n, nh,
                     hp->eos_id, w->mult, w->prime, w->offset);
    }
    be->ple_gather(be, NULL, rows, (int64_t)T * nh, w->chunks, w->n_chunks, w->chunk_rows, 1);
    qw_arena_restore(f->ar, mk);
}

void qw_ple_forward(const qw_fwd *f, int il, const qw_ple_w *w, float *X) {
    const qw_hparams *hp = f->hp;
    const qw_backend *be = f->be;
    int T = f->n_tok, C = hp->hc_count, H = hp->n_embd, P = hp->ple_dim, nh = hp->ngram_heads;
    int kc = hp->ple_conv_k, dil = hp->ngram_n, nhist = (kc - 1) * dil;
    int64_t CH = (int64_t)C * H;
    qw_arena_mark mk = qw_arena_get_mark(f->ar);

    int64_t *rows = qw_arena_alloc(f->ar, (size_t)T * nh * sizeof(int64_t));
    qw_be_layer(be, -1); /* the table's rows where the table is: the model's own part */
    for (int i = 0; i < qw_fwd_n_seg(f); i++) { /* each session's n-grams end in its own history */
        qw_seg g = qw_fwd_seg(f, i);
        be->ple_rows(be, rows + (int64_t)g.row0 * nh, f->tokens + g.row0, g.s->ple_hist, g.rows, hp->ngram_n, nh,
                     hp->eos_id, w->mult, w->prime, w->offset);
    }
    float *e = qw_arena_f32(f->ar, (size_t)T * P);
    be->ple_gather(be, e, rows, (int64_t)T * nh, w->chunks, w->n_chunks, w->chunk_rows, 0);
    qw_be_layer(be, il);

    float *K = qw_arena_f32(f->ar, (size_t)T * CH), *V = qw_arena_f32(f->ar, (size_t)T * H);
    float *Q = qw_arena_f32(f->ar, (size_t)T * CH);
    qw_matmul_job proj[2] = {{K, w->key_proj, e, T}, {V, w->value_proj, e, T}};
    be->matmul_batch(be, proj, 2);
    be->rms_norm_grouped(be, K, K, w->norm_key, T * C, C, H, hp->norm_eps, 1);
    be->rms_norm_grouped(be, Q, X, w->norm_query, T * C, C, H, hp->norm_eps, 1);

    /* Gn rows go after room for the remembered normalised history so the conv sees one contiguous sequence (a
     * batched step's rows are copied beside each session's history) */
    float *G = qw_arena_f32(f->ar, (size_t)T * CH);
    float *hist = qw_arena_f32(f->ar, (size_t)(nhist + T) * CH);
    float *Gn = hist + (int64_t)nhist * CH;
    be->ple_gate(be, G, K, Q, V, T, C, H);
    be->rms_norm_grouped(be, Gn, G, w->norm_conv, T * C, C, H, hp->norm_eps, 1);
    float *c = qw_arena_f32(f->ar, (size_t)T * CH);
    const int at_once = qw_conv_rows(f, il, 1, c, Gn, w->conv, (int)CH, kc, dil, 1); /* a batched step's */
    for (int i = 0; i < qw_fwd_n_seg(f) && !at_once; i++) {
        qw_seg g = qw_fwd_seg(f, i);
        qw_layer_state *ls = &g.s->ls[il];
        qw_arena_mark ms = qw_arena_get_mark(f->ar);
        float *seq = hist; /* the history's rows, then the segment's (a draft's: kept for qwenc_session_accept) */
        if (f->draft) seq = g.s->dl[il].ple_seq;
        else if (f->seqs) seq = qw_arena_f32(f->ar, (size_t)(nhist + g.rows) * CH);
        be->conv1d_state(be, c + (int64_t)g.row0 * CH, Gn + (int64_t)g.row0 * CH, ls->ple_hist, seq, w->conv, g.rows,
                         (int)CH, kc, dil, 1, f->draft); /* and silu */
        qw_arena_restore(f->ar, ms);
    }
    /* X += G + c, summed as written: G + c first (c * 1 is exact) */
    be->axpy(be, G, c, 1.0f, (int64_t)T * CH);
    be->axpy(be, X, G, 1.0f, (int64_t)T * CH);
    qw_arena_restore(f->ar, mk);
}
