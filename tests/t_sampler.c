/*
 * t_sampler.c - sampling: greedy and its tie rule, seed reproducibility, that top-k / top-p / min-p
 * never emit an excluded token, the penalties, and that plain sampling follows the distribution.
 * Speculative sampling (qwenc_sampler_verify): a draft drawn from another distribution q and kept by the rule
 * gives tokens distributed as the sampler's own p (chi-square over 400,000 draws, for several q: close to p,
 * far from it, zero where p is not, and p truncated by top-k), and is kept as often as sum min(p, q).
 * Sampling from the top candidates (qwenc_sampler_sample_top, what a GPU brings back instead of the logits) draws
 * the token qwenc_sampler_sample draws from the whole logits, from the same random stream, over thousands of
 * draws at several temperatures, top-k, top-p and min-p; declines (draws nothing) when the top_k-th and the next
 * candidate divide to equal values; and qwenc_sampler_top_k says when it applies.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qwenc.h"
#include "test_util.h"

static qwenc_sampler_params plain(uint64_t seed) {
    qwenc_sampler_params p = qwenc_sampler_default_params();
    p.temperature = 1;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.seed = seed;
    return p;
}

static qwenc_sampler *mk(qwenc_sampler_params p, int V) {
    qwenc_sampler *s = NULL;
    char err[256];
    if (qwenc_sampler_init(&p, V, &s, err, sizeof(err))) printf("init: %s\n", err);
    return s;
}

/* logits whose softmax is probs */
static void from_probs(const double *probs, float *logits, int V) {
    for (int i = 0; i < V; i++) logits[i] = (float)log(probs[i]);
}

/* The rule over n trials: tokens tallied into cnt, the share of drafts kept returned. */
static double spec_trials(qwenc_sampler *s, const float *lg, const float *q, int V, int n, long *cnt) {
    long kept = 0;
    for (int t = 0; t < n; t++) {
        int32_t d = qwenc_sampler_draw(s, q);
        int acc = 0;
        int32_t x = qwenc_sampler_verify(s, lg, q, d, &acc);
        if (x >= 0 && x < V) cnt[x]++;
        kept += acc;
    }
    return (double)kept / n;
}

/* top-k by selection: the support of the distribution is exactly the k first by (logit, then lower id), on rows
 * with many equal logits. */
static void test_topk_select(void) {
    printf("top-k selection: the k largest, ties to the lower id\n");
    enum { V = 1000 };
    float lg[V], pr[V];
    uint64_t r = 12345;
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = (float)((r >> 33) % 23) * 0.25f; /* 23 distinct values: ties everywhere */
        }
        int k = 1 + trial % 97;
        qwenc_sampler_params sp = plain(trial);
        sp.top_k = k;
        qwenc_sampler *s = mk(sp, V);
        qwenc_sampler_probs(s, lg, pr);
        /* the k-th largest (logit, -id): count how many beat each kept token */
        for (int i = 0; i < V; i++) {
            int before = 0;
            for (int j = 0; j < V; j++) before += lg[j] > lg[i] || (lg[j] == lg[i] && j < i);
            bad += (before < k) != (pr[i] > 0);
        }
        qwenc_sampler_free(s);
    }
    CHECK(bad == 0, "top-k selection kept %d tokens it should not have (or dropped them)", bad);
}

/* the n largest of lg[0..V) (largest first, the lower id first among equals): what qwenc_session_forward_topk
 * gives */
static void top_of(const float *lg, int V, int n, int32_t *ids, float *vals) {
    for (int j = 0; j < n; j++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            int taken = 0;
            for (int t = 0; t < j && !taken; t++) taken = ids[t] == i;
            if (!taken && (best < 0 || lg[i] > lg[best])) best = i;
        }
        ids[j] = best;
        vals[j] = lg[best];
    }
}

static void test_sample_top(void) {
    printf("sampling from the top candidates: the draws of the whole logits\n");
    enum { V = 700 };
    static const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    static const int ks[] = {1, 2, 5, 40, 63};
    float lg[V], vals[64];
    int32_t ids[64];
    uint64_t r = 99;
    int bad = 0, draws = 0, declined = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int ki = 0; ki < 5; ki++) {
            qwenc_sampler_params sp = plain(1000 + ti * 10 + ki);
            sp.temperature = temps[ti];
            sp.top_k = ks[ki];
            sp.top_p = ki % 2 ? 0.9f : 1.0f;
            sp.min_p = ki == 3 ? 0.05f : 0.0f;
            qwenc_sampler *a = mk(sp, V), *b = mk(sp, V);
            int n = qwenc_sampler_top_k(b);
            CHECK(n == ks[ki] + 1, "top_k %d: qwenc_sampler_top_k gives %d, not %d", ks[ki], n, ks[ki] + 1);
            for (int d = 0; d < 120 && n; d++) {
                for (int i = 0; i < V; i++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    /* coarse values every 5th draw: ties inside the top candidates */
                    lg[i] = d % 5 ? (float)((double)(r >> 11) / 9007199254740992.0 * 12.0 - 6.0)
                                  : (float)((r >> 33) % 31) * 0.5f;
                }
                top_of(lg, V, n, ids, vals);
                int32_t x = qwenc_sampler_sample_top(b, ids, vals, n);
                if (x < 0) { /* (coarse values can tie at the boundary): then the whole logits */
                    declined++;
                    x = qwenc_sampler_sample(b, lg);
                }
                bad += x != qwenc_sampler_sample(a, lg);
                draws++;
            }
            qwenc_sampler_free(a);
            qwenc_sampler_free(b);
        }
    CHECK(bad == 0, "sample_top drew another token than sample in %d of %d draws", bad, draws);
    CHECK(declined > 0 && declined < draws / 4, "sample_top declined %d of %d draws (ties at the boundary expected "
          "in some of the coarse ones)", declined, draws);

    /* declines exactly when the k-th and the next divide to equal values: raw 1.5 + 2^-22 and 1.5 + 2^-23 at T = 3 */
    qwenc_sampler_params sp = plain(7);
    sp.temperature = 3.0f;
    sp.top_k = 2;
    qwenc_sampler *a = mk(sp, 8), *b = mk(sp, 8);
    float lt[8] = {5, 0x1.800004p+0f, 0x1.800002p+0f, 0, 0, 0, 0, 0};
    CHECK(lt[1] / 3.0f == lt[2] / 3.0f && lt[1] != lt[2], "the test's values divide to equal values");
    top_of(lt, 8, 3, ids, vals);
    CHECK(qwenc_sampler_sample_top(b, ids, vals, 3) == -1, "sample_top decides a tie at the boundary");
    CHECK(qwenc_sampler_sample(b, lt) == qwenc_sampler_sample(a, lt), "a declined sample_top drew from the stream");
    qwenc_sampler_free(a);
    qwenc_sampler_free(b);

    /* when it applies */
    qwenc_sampler_params q = qwenc_sampler_default_params();
    qwenc_sampler *c = mk(q, 1000);
    CHECK(qwenc_sampler_top_k(c) == 41, "default sampler: top_k %d, not 41", qwenc_sampler_top_k(c));
    qwenc_sampler_free(c);
    const char *why[5] = {"greedy", "repeat penalty", "presence penalty", "top-k off", "top-k 63 + 1 > 64"};
    for (int w = 0; w < 5; w++) {
        q = qwenc_sampler_default_params();
        if (w == 0) q.temperature = 0;
        if (w == 1) q.repeat_penalty = 1.1f;
        if (w == 2) q.presence_penalty = 0.5f;
        if (w == 3) q.top_k = 0;
        if (w == 4) q.top_k = 64;
        c = mk(q, 1000);
        CHECK(qwenc_sampler_top_k(c) == 0, "qwenc_sampler_top_k applies with %s", why[w]);
        qwenc_sampler_free(c);
    }
}

static void test_speculative(const double *probs, const float *lg) {
    printf("speculative sampling: the rule keeps the distribution\n");
    enum { V = 6, N = 400000 };
    static const float qs[4][V] = {
        {0.30f, 0.30f, 0.20f, 0.10f, 0.05f, 0.05f}, /* close to p */
        {0.02f, 0.03f, 0.05f, 0.10f, 0.30f, 0.50f}, /* far from it */
        {0.00f, 0.50f, 0.00f, 0.50f, 0.00f, 0.00f}, /* zero where p is not */
        {0.10f, 0.10f, 0.10f, 0.10f, 0.30f, 0.30f}, /* mass outside top-k 3 */
    };
    for (int k = 0; k < 4; k++) {
        qwenc_sampler_params sp = plain(100 + k);
        int topk = k == 3 ? 3 : 0;
        sp.top_k = topk;
        qwenc_sampler *s = mk(sp, V);
        double p[V], ptot = 0;
        for (int i = 0; i < V; i++) ptot += p[i] = topk && i >= topk ? 0 : probs[i];
        for (int i = 0; i < V; i++) p[i] /= ptot;
        float pf[V];
        qwenc_sampler_probs(s, lg, pf);
        double dmax = 0, overlap = 0;
        for (int i = 0; i < V; i++) dmax = fmax(dmax, fabs(pf[i] - p[i])), overlap += fmin(p[i], qs[k][i]);
        CHECK(dmax < 1e-6, "q%d: qwenc_sampler_probs differs from the distribution by %g", k, dmax);
        long cnt[V] = {0};
        double kept = spec_trials(s, lg, qs[k], V, N, cnt);
        double chi2 = 0;
        int df = -1, outside = 0;
        for (int i = 0; i < V; i++) {
            if (p[i] == 0) {
                outside += cnt[i] != 0;
                continue;
            }
            double e = p[i] * N;
            chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
            df++;
        }
        /* chi-square at p = 0.001: 20.5 for 5 degrees of freedom, 13.8 for 2 */
        double lim = df == 5 ? 20.5 : df == 2 ? 13.8 : 0;
        CHECK(lim > 0 && chi2 < lim && !outside, "q%d: chi-square %.2f (limit %.1f, %d df), %d tokens outside p", k,
              chi2, lim, df, outside);
        double sd = sqrt(overlap * (1 - overlap) / N);
        CHECK(fabs(kept - overlap) < 5 * sd + 1e-9, "q%d: %.4f of drafts kept, expected sum min(p, q) = %.4f", k, kept,
              overlap);
        printf("  q%d: chi-square %.2f (%d df), %.4f kept (expected %.4f)\n", k, chi2, df, kept, overlap);
        qwenc_sampler_free(s);
    }
    /* greedy: p is one-hot, so only the arg max is ever emitted */
    qwenc_sampler_params g = plain(7);
    g.temperature = 0;
    qwenc_sampler *s = mk(g, V);
    long cnt[V] = {0};
    spec_trials(s, lg, qs[1], V, 2000, cnt);
    CHECK(cnt[0] == 2000, "greedy speculative sampling emitted other tokens than the arg max");
    qwenc_sampler_free(s);
}

int main(void) {
    const double probs[6] = {0.35, 0.25, 0.2, 0.1, 0.06, 0.04};
    float lg[6];
    from_probs(probs, lg, 6);

    printf("greedy\n");
    qwenc_sampler_params p = plain(1);
    p.temperature = 0;
    qwenc_sampler *s = mk(p, 6);
    CHECK(qwenc_sampler_sample(s, lg) == 0, "greedy picks the largest logit");
    const float tie[4] = {1, 3, 3, 2};
    qwenc_sampler_free(s);
    s = mk(p, 4);
    CHECK(qwenc_sampler_sample(s, tie) == 1, "greedy tie goes to the lowest id");
    qwenc_sampler_free(s);

    test_sample_top();

    printf("seed reproducibility\n");
    int a[200], b[200], c[200];
    qwenc_sampler *s1 = mk(plain(42), 6), *s2 = mk(plain(42), 6), *s3 = mk(plain(43), 6);
    int diff = 0, same = 1;
    for (int i = 0; i < 200; i++) {
        a[i] = qwenc_sampler_sample(s1, lg);
        b[i] = qwenc_sampler_sample(s2, lg);
        c[i] = qwenc_sampler_sample(s3, lg);
        same &= a[i] == b[i];
        diff += a[i] != c[i];
    }
    CHECK(same, "the same seed gives the same draws");
    CHECK(diff > 20, "another seed gives other draws (%d of 200 differ)", diff);
    qwenc_sampler_reset(s1);
    int again = 1;
    for (int i = 0; i < 200; i++) again &= qwenc_sampler_sample(s1, lg) == a[i];
    CHECK(again, "reset restarts the random sequence");
    qwenc_sampler_free(s1);
    qwenc_sampler_free(s2);
    qwenc_sampler_free(s3);

    printf("distribution\n");
    s = mk(plain(7), 6);
    int cnt[6] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) cnt[qwenc_sampler_sample(s, lg)]++;
    for (int i = 0; i < 6; i++) /* 5 standard deviations of a binomial */
        CHECK(fabs(cnt[i] / (double)N - probs[i]) < 5 * sqrt(probs[i] * (1 - probs[i]) / N),
              "token %d drawn %.4f of the time, probability %.2f", i, cnt[i] / (double)N, probs[i]);
    qwenc_sampler_free(s);

    printf("top-k, top-p, min-p exclude what they cut\n");
    struct {
        const char *name;
        int top_k;
        float top_p, min_p, temp;
        int allowed; /* tokens 0 .. allowed-1 may appear */
    } cuts[] = {
        {"top-k 2", 2, 1, 0, 1, 2},
        {"top-p 0.5 (0.35+0.25 reaches it)", 0, 0.5f, 0, 1, 2},
        {"top-p 0.75 (needs 3 tokens)", 0, 0.75f, 0, 1, 3},
        {"min-p 0.5 (p >= 0.175)", 0, 1, 0.5f, 1, 3},
        {"min-p 0.3 after temperature 2", 0, 1, 0.3f, 2, 6},
        {"top-k 4 + top-p 0.9 + min-p 0.2", 4, 0.9f, 0.2f, 1, 4},
    };
    for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
        qwenc_sampler_params q = plain(100 + k);
        q.top_k = cuts[k].top_k;
        q.top_p = cuts[k].top_p;
        q.min_p = cuts[k].min_p;
        q.temperature = cuts[k].temp;
        s = mk(q, 6);
        int seen[6] = {0}, bad = 0;
        for (int i = 0; i < 5000; i++) {
            int t = qwenc_sampler_sample(s, lg);
            seen[t]++;
            bad += t >= cuts[k].allowed;
        }
        CHECK(bad == 0, "%s: %d draws outside the allowed set", cuts[k].name, bad);
        CHECK(seen[cuts[k].allowed - 1] > 0, "%s: the last allowed token is never drawn", cuts[k].name);
        qwenc_sampler_free(s);
    }
    /* min-p at temperature 2: probabilities flatten to sqrt(p): 0.04 -> 0.2/0.59 of the best, kept;
     * check the case that must drop the last token instead */
    {
        qwenc_sampler_params q = plain(5);
        q.min_p = 0.35f;
        q.temperature = 2;
        s = mk(q, 6);
        int bad = 0;
        for (int i = 0; i < 5000; i++) bad += qwenc_sampler_sample(s, lg) == 5; /* sqrt(.04/.35) = 0.338 */
        CHECK(bad == 0, "min-p after temperature drops token 5 (%d draws)", bad);
        qwenc_sampler_free(s);
    }

    printf("penalties\n");
    const float pl[3] = {2.0f, 1.0f, 0.5f};
    p = plain(1);
    p.temperature = 0;
    p.repeat_penalty = 4;
    s = mk(p, 3);
    qwenc_sampler_accept(s, 0);
    CHECK(qwenc_sampler_sample(s, pl) == 1, "repetition penalty: 2.0 / 4 = 0.5 falls below 1.0");
    qwenc_sampler_free(s);
    p.repeat_penalty = 1;
    p.presence_penalty = 1.2f;
    s = mk(p, 3);
    qwenc_sampler_accept(s, 0);
    qwenc_sampler_accept(s, 0);
    CHECK(qwenc_sampler_sample(s, pl) == 1, "presence penalty: 2.0 - 1.2 < 1.0");
    qwenc_sampler_free(s);
    p.presence_penalty = 0;
    p.frequency_penalty = 0.4f;
    s = mk(p, 3);
    qwenc_sampler_accept(s, 0);
    CHECK(qwenc_sampler_sample(s, pl) == 0, "frequency penalty once: 2.0 - 0.4 still first");
    qwenc_sampler_accept(s, 0);
    qwenc_sampler_accept(s, 0);
    CHECK(qwenc_sampler_sample(s, pl) == 1, "frequency penalty three times: 2.0 - 1.2 < 1.0");
    qwenc_sampler_free(s);

    printf("bad parameters\n");
    char err[256];
    p = plain(1);
    p.top_p = 0;
    CHECK(qwenc_sampler_init(&p, 3, &s, err, sizeof(err)) == QWENC_ERR_ARG && strstr(err, "top_p"), "top_p 0 rejected");

    test_speculative(probs, lg);
    test_topk_select();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
