/*
 * t_sampler.c - sampling: greedy and its tie rule, seed reproducibility, that top-k / top-p / min-p
 * never emit an excluded token, the penalties, and that plain sampling follows the distribution.
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

    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
