/*
 * sampler.c - next-token choice from logits (see qwenc.h for the order of the steps).
 *
 * Candidates are kept as (id, logit) pairs sorted by logit once, so top-k, top-p and min-p are prefix
 * cuts of one sorted list. The random source is xoshiro256** seeded through splitmix64: the same seed
 * gives the same sequence on every machine. All buffers are allocated at init; sampling allocates nothing.
 */
#include <math.h>
#include <string.h>

#include "blocks/blocks.h"

typedef struct {
    int32_t id;
    float logit;
} cand;

struct qwenc_sampler {
    qwenc_sampler_params p;
    int n_vocab;
    cand *c;          /* [n_vocab] */
    float *prob;      /* [n_vocab] */
    float *full;      /* [n_vocab] the whole distribution (qwenc_sampler_verify) */
    int32_t *count;   /* [n_vocab] occurrences in the history */
    int32_t *hist;    /* [hist_cap] ring of recent tokens for the repetition penalty */
    int hist_cap, hist_len, hist_pos;
    uint64_t rng[4];
};

qwenc_sampler_params qwenc_sampler_default_params(void) {
    qwenc_sampler_params p = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                              .repeat_penalty = 1.0f, .repeat_last_n = 64, .frequency_penalty = 0,
                              .presence_penalty = 0, .seed = 0};
    return p;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

qwenc_status qwenc_sampler_init(const qwenc_sampler_params *params, int n_vocab, qwenc_sampler **out, char *err,
                                size_t errlen) {
    *out = NULL;
    qwenc_sampler_params p = params ? *params : qwenc_sampler_default_params();
    if (n_vocab <= 0) return qw_err(err, errlen, QWENC_ERR_ARG, "sampler: vocabulary size must be positive");
    if (!(p.temperature >= 0) || p.top_k < 0 || !(p.top_p > 0 && p.top_p <= 1) || !(p.min_p >= 0 && p.min_p <= 1) ||
        !(p.repeat_penalty > 0) || p.repeat_last_n < -1 || !isfinite(p.frequency_penalty) ||
        !isfinite(p.presence_penalty))
        return qw_err(err, errlen, QWENC_ERR_ARG,
                      "sampler: need temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, "
                      "repeat_penalty > 0, repeat_last_n >= -1");
    qwenc_sampler *s = qw_calloc(1, sizeof(*s));
    if (!s) return qw_err_nomem(err, errlen, "sampler", 1, sizeof(*s));
    s->p = p;
    s->n_vocab = n_vocab;
    s->c = qw_calloc((size_t)n_vocab, sizeof(cand));
    s->prob = qw_calloc((size_t)n_vocab, sizeof(float));
    s->count = qw_calloc((size_t)n_vocab, sizeof(int32_t));
    s->full = qw_calloc((size_t)n_vocab, sizeof(float));
    s->hist_cap = p.repeat_last_n > 0 ? p.repeat_last_n : 1;
    s->hist = qw_calloc((size_t)s->hist_cap, sizeof(int32_t));
    if (!s->c || !s->prob || !s->count || !s->full || !s->hist) {
        int hist = s->c && s->prob && s->count && s->full;
        qwenc_sampler_free(s);
        if (hist) return qw_err_nomem(err, errlen, "sampler: repeat_last_n history", (size_t)p.repeat_last_n, 4);
        return qw_err_nomem(err, errlen, "sampler: candidates, probabilities and counts", (size_t)n_vocab,
                            sizeof(cand) + 2 * sizeof(float) + sizeof(int32_t));
    }
    qwenc_sampler_reset(s);
    *out = s;
    return QWENC_OK;
}

void qwenc_sampler_free(qwenc_sampler *s) {
    if (!s) return;
    free(s->full);
    free(s->c);
    free(s->prob);
    free(s->count);
    free(s->hist);
    free(s);
}

void qwenc_sampler_reset(qwenc_sampler *s) {
    memset(s->count, 0, (size_t)s->n_vocab * sizeof(int32_t));
    s->hist_len = s->hist_pos = 0;
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = qw_splitmix64(x += 0x9E3779B97F4A7C15ull);
}

void qwenc_sampler_accept(qwenc_sampler *s, int32_t tok) {
    if (tok < 0 || tok >= s->n_vocab) return;
    s->count[tok]++;
    s->hist[s->hist_pos] = tok;
    s->hist_pos = (s->hist_pos + 1) % s->hist_cap;
    if (s->hist_len < s->hist_cap) s->hist_len++;
}

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Reorder c[0..n) so that its first k are the k first of the sorted order (in any order): quickselect with
 * cand_cmp (a total order: ids differ), expected O(n). */
static void select_first(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand piv = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp(&c[i], &piv) < 0) i++;
            while (cand_cmp(&c[j], &piv) > 0) j--;
            if (i <= j) {
                cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

static int cut(qwenc_sampler *s, int n);

/* The candidates a draw is made from: s->c[0..n) with weights s->prob[0..n) (not normalised), n returned;
 * greedy: -1 - the arg max. */
static int candidates(qwenc_sampler *s, const float *logits) {
    const qwenc_sampler_params *p = &s->p;
    int V = s->n_vocab;
    for (int i = 0; i < V; i++) {
        s->c[i].id = i;
        s->c[i].logit = logits[i];
    }
    /* repetition penalty over the distinct tokens of the window */
    if (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) {
        int n = p->repeat_last_n < 0 ? V : s->hist_len;
        if (p->repeat_last_n < 0) {
            for (int i = 0; i < V; i++)
                if (s->count[i]) {
                    float *l = &s->c[i].logit;
                    *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
                }
        } else {
            for (int j = 0; j < n; j++) {
                int id = s->hist[j];
                int seen = 0; /* once per distinct token */
                for (int k = 0; k < j && !seen; k++) seen = s->hist[k] == id;
                if (seen) continue;
                float *l = &s->c[id].logit;
                *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
            }
        }
    }
    if (p->frequency_penalty != 0 || p->presence_penalty != 0)
        for (int i = 0; i < V; i++)
            if (s->count[i]) s->c[i].logit -= p->frequency_penalty * s->count[i] + p->presence_penalty;

    if (p->temperature <= 0) { /* greedy */
        int best = 0;
        for (int i = 1; i < V; i++)
            if (s->c[i].logit > s->c[best].logit) best = i;
        return -1 - best;
    }
    for (int i = 0; i < V; i++) s->c[i].logit /= p->temperature;
    int n = V;
    if (p->top_k > 0 && p->top_k < n) { /* only the top k need sorting: the same k, in the same order */
        n = p->top_k;
        select_first(s->c, V, n);
    }
    return cut(s, n);
}

/* The first n candidates (those top-k keeps; logits divided by the temperature) sorted, weighed and cut by top-p
 * and min-p: the count left. */
static int cut(qwenc_sampler *s, int n) {
    const qwenc_sampler_params *p = &s->p;
    qsort(s->c, (size_t)n, sizeof(cand), cand_cmp);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s->prob[i] = expf(s->c[i].logit - s->c[0].logit);
    if (p->top_p < 1.0f) { /* smallest prefix whose probability reaches top_p */
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += s->prob[i] / sum;
            if (acc >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) { /* drop candidates below min_p times the best probability */
        int m = 1;
        while (m < n && s->prob[m] >= p->min_p * s->prob[0]) m++;
        n = m;
    }
    return n;
}

/* a draw from the first n candidates' weights */
static int32_t draw_candidates(qwenc_sampler *s, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s->prob[i];
    double r = rng_uniform(s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i];
        if (r < acc) return s->c[i].id;
    }
    return s->c[n - 1].id;
}

int32_t qwenc_sampler_sample(qwenc_sampler *s, const float *logits) {
    int n = candidates(s, logits);
    if (n < 0) return -1 - n;
    return draw_candidates(s, n);
}

int qwenc_sampler_top_k(const qwenc_sampler *s) {
    const qwenc_sampler_params *p = &s->p;
    int penalties = (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) || p->frequency_penalty != 0 ||
                    p->presence_penalty != 0;
    if (p->temperature <= 0 || penalties || p->top_k <= 0 || p->top_k >= s->n_vocab || p->top_k + 1 > QWENC_MAX_TOPK)
        return 0;
    return p->top_k + 1;
}

int32_t qwenc_sampler_sample_top(qwenc_sampler *s, const int32_t *ids, const float *logits, int n) {
    const qwenc_sampler_params *p = &s->p;
    int k = p->top_k;
    if (n != qwenc_sampler_top_k(s) || n < 2) return -1;
    /* the top k of the divided logits are the first k unless the k-th and the next divide to equal values (the
     * division keeps the order, and can only make values equal) */
    if (!(logits[k - 1] / p->temperature != logits[k] / p->temperature)) return -1;
    for (int i = 0; i < k; i++) {
        if (ids[i] < 0 || ids[i] >= s->n_vocab) return -1;
        s->c[i].id = ids[i];
        s->c[i].logit = logits[i] / p->temperature;
    }
    return draw_candidates(s, cut(s, k));
}

int qwenc_sampler_is_greedy(const qwenc_sampler *s) {
    const qwenc_sampler_params *p = &s->p;
    return p->temperature <= 0 && (p->repeat_penalty == 1.0f || p->repeat_last_n == 0) && p->frequency_penalty == 0 &&
           p->presence_penalty == 0;
}

void qwenc_sampler_probs(qwenc_sampler *s, const float *logits, float *probs) {
    int n = candidates(s, logits); /* (the candidates hold copies: probs may be logits) */
    memset(probs, 0, (size_t)s->n_vocab * sizeof(float));
    if (n < 0) {
        probs[-1 - n] = 1;
        return;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s->prob[i];
    for (int i = 0; i < n; i++) probs[s->c[i].id] = (float)(s->prob[i] / sum);
}

int32_t qwenc_sampler_draw(qwenc_sampler *s, const float *probs) {
    double sum = 0;
    int32_t last = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (probs[i] > 0) sum += probs[i], last = i;
    double r = rng_uniform(s->rng) * sum, acc = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (probs[i] > 0 && r < (acc += probs[i])) return i;
    return last;
}

int32_t qwenc_sampler_verify(qwenc_sampler *s, const float *logits, const float *q, int32_t draft, int *accepted) {
    float *p = s->full;
    qwenc_sampler_probs(s, logits, p);
    *accepted = 0;
    if (draft >= 0 && draft < s->n_vocab && q[draft] > 0 && rng_uniform(s->rng) * q[draft] < p[draft]) {
        *accepted = 1; /* with probability min(1, p / q) */
        return draft;
    }
    double rest = 0; /* else a draw from max(0, p - q), normalised */
    for (int i = 0; i < s->n_vocab; i++) rest += p[i] > q[i] ? p[i] - q[i] : 0;
    if (!(rest > 0)) return qwenc_sampler_draw(s, p);
    for (int i = 0; i < s->n_vocab; i++) p[i] = p[i] > q[i] ? p[i] - q[i] : 0;
    return qwenc_sampler_draw(s, p);
}
