/*
 * cache.c - the server's prefix cache: session snapshots keyed by the exact tokens they hold, within a byte
 * budget, least recently used out first.
 *
 * An entry is the snapshot of a session that was fed tokens[0..n) (qwenc_session_snapshot: every cache row and
 * recurrent state those tokens left), the tokens themselves and the hash of them; an entry taken at the end of
 * a prompt also keeps that position's logits, so that the same prompt again needs nothing fed at all. A lookup
 * hashes every prefix of the prompt once and compares each entry's hash at its own length, then the tokens,
 * so it costs one pass over the prompt plus one over the entries. Used by the scheduler thread alone; the
 * sizes it publishes for /metrics are atomics.
 */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

struct srv_cache_entry {
    int32_t *tokens;
    int n;
    uint64_t hash;
    qwenc_snapshot *snap;
    float *logits;   /* [n_vocab] the next-token logits after tokens[n-1], or NULL */
    size_t bytes;    /* what the entry holds in memory */
    uint64_t used;   /* the clock of its last use */
};

struct srv_cache {
    size_t budget, bytes;
    int n_vocab;
    srv_cache_entry *e;
    int n, cap;
    uint64_t clock;
    srv_stats *st;
};

#define HASH_SEED 0x9E3779B97F4A7C15ull

/* The running hash after one more token: splitmix64's finalizer over the hash mixed with the token. */
static uint64_t hash_step(uint64_t x, int32_t token) {
    uint64_t z = x ^ ((uint64_t)(uint32_t)token + HASH_SEED + (x << 6) + (x >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void srv_prefix_hashes(const int32_t *tokens, int n, uint64_t *h) {
    h[0] = HASH_SEED;
    for (int i = 0; i < n; i++) h[i + 1] = hash_step(h[i], tokens[i]);
}

uint64_t srv_hash(const int32_t *tokens, int n) {
    uint64_t x = HASH_SEED;
    for (int i = 0; i < n; i++) x = hash_step(x, tokens[i]);
    return x;
}

srv_cache *srv_cache_new(size_t budget, int n_vocab, srv_stats *st) {
    srv_cache *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->budget = budget;
    c->n_vocab = n_vocab;
    c->st = st;
    return c;
}

static void entry_free(srv_cache_entry *e) {
    free(e->tokens);
    free(e->logits);
    qwenc_snapshot_free(e->snap);
}

static void publish(srv_cache *c) {
    atomic_store(&c->st->cache_bytes, (long long)c->bytes);
    atomic_store(&c->st->cache_entries, c->n);
}

void srv_cache_free(srv_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_free(&c->e[i]);
    free(c->e);
    free(c);
}

srv_cache_entry *srv_cache_find(srv_cache *c, const int32_t *prompt, int n, const uint64_t *h) {
    srv_cache_entry *best = NULL;
    for (int i = 0; i < c->n; i++) {
        srv_cache_entry *e = &c->e[i];
        if (e->n > n || (e->n == n && !e->logits) || (best && e->n <= best->n)) continue;
        if (h[e->n] != e->hash || memcmp(e->tokens, prompt, (size_t)e->n * sizeof(int32_t))) continue;
        best = e;
    }
    if (best) best->used = ++c->clock;
    return best;
}

int srv_cache_entry_n(const srv_cache_entry *e) { return e->n; }
const qwenc_snapshot *srv_cache_entry_snap(const srv_cache_entry *e) { return e->snap; }
const float *srv_cache_entry_logits(const srv_cache_entry *e) { return e->logits; }

static srv_cache_entry *find_exact(srv_cache *c, const int32_t *tokens, int n, uint64_t hash) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].n == n && c->e[i].hash == hash && !memcmp(c->e[i].tokens, tokens, (size_t)n * sizeof(int32_t)))
            return &c->e[i];
    return NULL;
}

int srv_cache_has(srv_cache *c, const int32_t *tokens, int n, uint64_t hash) {
    return find_exact(c, tokens, n, hash) != NULL;
}

/* Drop the least recently used entries until `need` more bytes fit. */
static void make_room(srv_cache *c, size_t need) {
    while (c->n && c->bytes + need > c->budget) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[lru].used) lru = i;
        c->bytes -= c->e[lru].bytes;
        entry_free(&c->e[lru]);
        c->e[lru] = c->e[--c->n];
    }
}

int srv_cache_put(srv_cache *c, qwenc_session *session, const int32_t *tokens, int n, uint64_t hash,
                  const float *logits) {
    if (n <= 0 || c->budget == 0) return -1;
    srv_cache_entry *old = find_exact(c, tokens, n, hash);
    if (old) { /* the same state: keep it, and take the logits if it had none */
        old->used = ++c->clock;
        if (logits && !old->logits && (old->logits = malloc((size_t)c->n_vocab * sizeof(float)))) {
            memcpy(old->logits, logits, (size_t)c->n_vocab * sizeof(float));
            old->bytes += (size_t)c->n_vocab * sizeof(float);
            c->bytes += (size_t)c->n_vocab * sizeof(float);
            publish(c);
        }
        return 0;
    }
    /* an entry larger than the whole budget is not kept (its size is known once it is taken) */
    qwenc_snapshot *snap = NULL;
    char err[256];
    if (qwenc_session_snapshot(session, &snap, err, sizeof(err))) return -1;
    size_t bytes = qwenc_snapshot_bytes(snap) + (size_t)n * sizeof(int32_t) +
                   (logits ? (size_t)c->n_vocab * sizeof(float) : 0) + sizeof(srv_cache_entry);
    if (bytes > c->budget) {
        qwenc_snapshot_free(snap);
        return -1;
    }
    make_room(c, bytes);
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        srv_cache_entry *ne = realloc(c->e, (size_t)cap * sizeof(*ne));
        if (!ne) {
            qwenc_snapshot_free(snap);
            return -1;
        }
        c->e = ne;
        c->cap = cap;
    }
    srv_cache_entry e = {.n = n, .hash = hash, .snap = snap, .bytes = bytes, .used = ++c->clock};
    e.tokens = malloc((size_t)n * sizeof(int32_t));
    if (logits) e.logits = malloc((size_t)c->n_vocab * sizeof(float));
    if (!e.tokens || (logits && !e.logits)) {
        entry_free(&e);
        return -1;
    }
    memcpy(e.tokens, tokens, (size_t)n * sizeof(int32_t));
    if (logits) memcpy(e.logits, logits, (size_t)c->n_vocab * sizeof(float));
    c->e[c->n++] = e;
    c->bytes += bytes;
    publish(c);
    return 0;
}
