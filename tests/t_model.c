/*
 * t_model.c - model tests: unit tests of the new math (PLE hash vectors, RoPE, delta rule, QSA
 * selection, f16/bf16 conversion) and every fixture of tests/fixtures compared with the transformers
 * reference logits, fed all at once and token by token; every fixture again on the CPU backend's guard mode
 * (activations and state inaccessible outside the backend's calls), which must give the same bits, and a
 * deliberate host access to a session's state, which the guard must catch.
 *
 *   t_model [--backend NAME] [FIXTURE_DIR] run everything (default: the CPU backend, tests/fixtures)
 *   t_model --compare OUT REF VOCAB        compare two logits files (used by cli_model.sh)
 *
 * Built a second time as t_model_emu (QW_CUDA_EMU; `make test`) against the CUDA backend's kernels emulated on CPU
 * threads (tests/gpu/emu): its default backend is "cuda", so every fixture but the bundled model (tiny-flash, whose
 * 160 tokens one at a time take minutes there; its QSA steps are still run) runs the CUDA code paths against the same
 * reference logits.
 *
 * Fixture bar: relative L2 error of the whole logits matrix below 1e-4 and the same argmax at every
 * position. The reference is f32 transformers on the same bf16/f16/f32 weights, so the only difference
 * is f32 summation order (measured ~1e-6); 1e-4 leaves room for the longer sums of larger fixtures
 * while any real mistake (a wrong norm, a missed token, a wrong block) moves logits by > 1e-2.
 */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks/blocks.h"
#include "core/mapfile.h"
#include "qwenc.h"
#include "test_util.h"


/* ---------------------------------------------------------------- fixtures */






/* A fixture holds its checkpoint, or a file model.txt naming the model directory (relative to the
 * repository root) when the checkpoint lives elsewhere, e.g. the bundled model under models/. */
static char *fixture_model_dir(const char *dir) {
    char *path = qw_path_new(dir, "model.txt"), *txt = NULL, err[256];
    qwenc_status st = qw_read_file(path, &txt, NULL, err, sizeof(err));
    free(path);
    if (st) return strdup(dir);
    size_t n = strlen(txt);
    while (n && (txt[n - 1] == '\n' || txt[n - 1] == ' ' || txt[n - 1] == '\r')) txt[--n] = 0;
    return txt;
}

/* the backend the fixtures run on (t_model --backend NAME; default the CPU, or the emulated CUDA backend) */
#ifdef QW_CUDA_EMU
#define EMULATED 1
static const char *backend = "cuda";
#else
#define EMULATED 0
static const char *backend = "cpu";
#endif

static qwenc_status load_on(const char *dir, const char *be, qwenc_model **m, char *err, size_t errlen) {
    qwenc_model_params mp = qwenc_model_default_params();
    mp.backend = be;
    return qwenc_model_load_params(dir, &mp, m, err, errlen);
}

static void test_fixture(const char *dir) {
    char *path, err[1024];
    qwenc_model *m = NULL;
    char *mdir = fixture_model_dir(dir);
    qwenc_status lst = load_on(mdir, backend, &m, err, sizeof(err));
    free(mdir);
    if (lst) {
        CHECK(0, "%s: load: %s", dir, err);
        return;
    }
    int n = 0, V = qwenc_model_n_vocab(m);
    path = qw_path_new(dir, "tokens.txt");
    int32_t *ids = test_read_tokens(path, &n);
    free(path);
    CHECK(ids && n > 0, "%s: tokens.txt", dir);
    /* the first 20 tokens in one call: the full forward's first rows (causal); on tiny-flash (QSA budget 64 in
     * blocks of 4) a step whose queries all keep every position, so its QSA layer attends without the selection */
    static const struct {
        const char *ref;
        int batch; /* 0: all at once */
        int prefix; /* 0: every token */
        const char *label;
    } modes[] = {
        {"logits_full.f32", 0, 0, "all tokens in one call vs full forward"},
        {"logits_decode.f32", 1, 0, "token by token vs cached decode"},
        {"logits_full.f32", 7, 0, "chunks of 7 vs full forward"},
        {"logits_full.f32", 0, 20, "the first 20 in one call vs full forward"},
    };
    for (size_t k = 0; ids && k < sizeof(modes) / sizeof(modes[0]); k++) {
        path = qw_path_new(dir, modes[k].ref);
        size_t nref = 0;
        float *ref = test_read_f32(path, &nref);
        free(path);
        const int nt = modes[k].prefix && modes[k].prefix < n ? modes[k].prefix : n;
        float *out = test_run_model(m, ids, nt, modes[k].batch ? modes[k].batch : nt);
        if (ref && out && nref == (size_t)n * V) {
            test_cmp r = test_compare_logits(out, ref, (size_t)nt, (size_t)V);
            printf("  %-16s %-40s rel L2 %.2e  argmax mismatches %d\n", qwenc_model_arch(m), modes[k].label,
                   r.rel_l2, r.argmax_mismatch);
            CHECK(r.rel_l2 < 1e-4, "%s: %s: relative L2 error %.3e >= 1e-4", dir, modes[k].label, r.rel_l2);
            CHECK(r.argmax_mismatch == 0, "%s: %s: argmax differs at %d positions (first %d)", dir, modes[k].label,
                  r.argmax_mismatch, r.first_mismatch);
        } else {
            CHECK(0, "%s: %s: missing output or reference of the wrong size (%zu floats)", dir, modes[k].ref, nref);
        }
        free(ref);
        free(out);
    }
    /* backend-clean: the same forward with every activation and state buffer inaccessible outside the
     * backend's own calls (qwenc_model_params.backend "cpu-guard"); any engine code that touched one would
     * fault. Prompt at once and token by token, the same bits as the plain CPU backend. */
    qwenc_model *g = NULL;
    mdir = fixture_model_dir(dir);
    lst = strcmp(backend, "cpu") ? QWENC_ERR_UNSUPPORTED : load_on(mdir, "cpu-guard", &g, err, sizeof(err));
    free(mdir);
    if (lst == QWENC_ERR_UNSUPPORTED && strcmp(backend, "cpu")) { /* the guard is the CPU's: compared with it */
        free(ids);
        qwenc_model_free(m);
        return;
    }
    CHECK(!lst && !strcmp(qwenc_model_backend(g), "cpu-guard"), "%s: load on cpu-guard: %s", dir, err);
    for (int batch = n; !lst && ids && batch >= 1; batch = batch > 1 ? 1 : 0) {
        float *a = test_run_model(m, ids, n, batch), *b = test_run_model(g, ids, n, batch);
        CHECK(a && b && !memcmp(a, b, (size_t)n * V * sizeof(float)), "%s: cpu-guard, steps of %d: other logits", dir,
              batch);
        free(a);
        free(b);
    }
    qwenc_model_free(g);
    free(ids);
    qwenc_model_free(m);
}

static void on_segv(int sig) {
    (void)sig;
    _exit(77);
}

/* In a child: a session on `backend`, one step, then the host reads the first float of its state directly,
 * as engine code outside a backend must not. Returns the child's exit status (77: it faulted). */
static int host_read_child(const char *dir, const char *backend) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa = {.sa_handler = on_segv};
        sigaction(SIGSEGV, &sa, NULL);
        char err[512];
        qwenc_model *m = NULL;
        qwenc_session *s = NULL;
        qwenc_model_params mp = qwenc_model_default_params();
        mp.backend = backend;
        int32_t tok = 1;
        if (qwenc_model_load_params(dir, &mp, &m, err, sizeof(err)) || qwenc_session_init(m, NULL, &s, err, sizeof(err)) ||
            qwenc_session_forward(s, &tok, 1, NULL, 0, err, sizeof(err)))
            _exit(2);
        volatile float v = s->ls[0].mem[0]; /* the deliberate host access */
        (void)v;
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The guard can fail: a host read of a session's state faults on cpu-guard, and the same read is harmless on
 * the plain CPU backend (so it is the guard that catches it). */
static void test_guard_catches(const char *root) {
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s/qwen3", root);
    int plain = host_read_child(dir, "cpu"), guarded = host_read_child(dir, "cpu-guard");
    printf("guard: a host read of the state: cpu exits %d, cpu-guard exits %d (77: caught)\n", plain, guarded);
    CHECK(plain == 0, "guard: the host read on the plain CPU backend exited %d", plain);
    CHECK(guarded == 77, "guard: the host read on cpu-guard was not caught (exit %d)", guarded);
}

/* Forward n tokens (prefill of the first half in one call, then one at a time); the logits of every call
 * concatenated into out [calls][V]. Returns the number of calls. */
static int profiled_run(qwenc_model *m, const int32_t *ids, int n, float *out) {
    char err[256];
    qwenc_session *s = NULL;
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = n;
    if (qwenc_session_init(m, &sp, &s, err, sizeof(err))) return 0;
    int calls = 0, V = qwenc_model_n_vocab(m);
    for (int i = 0; i < n; calls++) {
        int T = i == 0 ? n / 2 : 1;
        if (qwenc_session_forward(s, ids + i, T, out + (size_t)calls * V, 0, err, sizeof(err))) break;
        i += T;
    }
    qwenc_session_free(s);
    return calls;
}

/*
 * qwenc_session_profile on the qwen4_exp fixture: profiling leaves every logit's bits as they are; the totals
 * count the tokens and steps fed; every entry was called, the entries' times add up to the steps' wall time
 * (what the ops do not take is "between ops"), the hybrid's ops (attention, delta_rule) appear, and the
 * lm_head's matmul is counted once per step with the same bytes each time; turned off, nothing is reported.
 */
static void test_profile(const char *root) {
    char dir[1100], err[1024];
    snprintf(dir, sizeof(dir), "%s/qwen4_exp", root);
    qwenc_model *m = NULL;
    if (load_on(dir, backend, &m, err, sizeof(err))) {
        CHECK(0, "profile: load %s: %s", dir, err);
        return;
    }
    int n = 12, V = qwenc_model_n_vocab(m);
    int32_t ids[12];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 11) % V);
    float *a = calloc((size_t)n * V, sizeof(float)), *b = calloc((size_t)n * V, sizeof(float));
    qwenc_session *s = NULL;
    qwenc_session_params sp = qwenc_session_default_params();
    sp.n_ctx = n;
    if (!a || !b || qwenc_session_init(m, &sp, &s, err, sizeof(err))) {
        CHECK(0, "profile: setup");
        goto done;
    }
    int calls = profiled_run(m, ids, n, a), steps = 0;
    CHECK(calls == 1 + n - n / 2, "profile: %d calls", calls);
    CHECK(qwenc_session_profile(s, 1, err, sizeof(err)) == QWENC_OK, "profile: on: %s", err);
    for (int i = 0; i < n; steps++) {
        int T = i == 0 ? n / 2 : 1;
        CHECK(qwenc_session_forward(s, ids + i, T, b + (size_t)steps * V, 0, err, sizeof(err)) == QWENC_OK,
              "profile: forward: %s", err);
        i += T;
    }
    CHECK(!memcmp(a, b, sizeof(float) * (size_t)calls * V), "profile: profiling changed the logits");
    qwenc_profile_entry e[256];
    qwenc_profile_totals tot;
    int ne = qwenc_session_profile_read(s, e, 256, &tot);
    CHECK(ne > 10 && ne <= 256, "profile: %d entries", ne);
    CHECK(tot.tokens == n && tot.steps == steps, "profile: totals %lld tokens, %lld steps (want %d, %d)",
          (long long)tot.tokens, (long long)tot.steps, n, steps);
    double sum = 0;
    int attention = 0, delta = 0, lm_head = 0, sorted = 1;
    for (int i = 0; i < ne && i < 256; i++) {
        CHECK(e[i].calls > 0 && e[i].seconds >= 0, "profile: %s: %lld calls, %g s", e[i].name, (long long)e[i].calls,
              e[i].seconds);
        sum += e[i].seconds;
        if (i && e[i].seconds > e[i - 1].seconds) sorted = 0;
        attention |= !strcmp(e[i].name, "attention");
        delta |= !strcmp(e[i].name, "delta_rule");
        if (strstr(e[i].name, "lm_head.weight")) {
            lm_head++;
            CHECK(!strncmp(e[i].name, "matmul ", 7) && e[i].calls == steps && e[i].bytes > 0 &&
                      e[i].bytes % ((int64_t)steps * V) == 0,
                  "profile: %s: %lld calls, %lld bytes", e[i].name, (long long)e[i].calls, (long long)e[i].bytes);
        } else if (strncmp(e[i].name, "matmul ", 7)) {
            CHECK(e[i].bytes == 0, "profile: %s reads %lld bytes of weights", e[i].name, (long long)e[i].bytes);
        }
    }
    CHECK(sorted, "profile: entries not slowest first");
    CHECK(attention && delta && lm_head == 1, "profile: attention %d, delta_rule %d, lm_head %d", attention, delta,
          lm_head);
    CHECK(fabs(sum - tot.seconds) <= 1e-9 + 1e-6 * tot.seconds, "profile: entries add up to %.9f s, steps took %.9f s",
          sum, tot.seconds);
    CHECK(qwenc_session_profile(s, 0, err, sizeof(err)) == QWENC_OK &&
              qwenc_session_profile_read(s, e, 256, &tot) == 0 && tot.steps == 0,
          "profile: still reported after off");
done:
    qwenc_session_free(s);
    free(a);
    free(b);
    qwenc_model_free(m);
}

static void test_fixtures(const char *root) {
    char *names[64];
    int n = test_list_fixtures(root, 1, names, 64);
    CHECK(n >= 0, "cannot open fixture directory %s", root);
    if (n < 0) return;
    CHECK(n >= 7, "expected at least 7 fixtures in %s, found %d", root, n);
    for (int i = 0; i < n; i++) {
        char p[1100];
        snprintf(p, sizeof(p), "%s/%s", root, names[i]);
        printf("fixture %s\n", names[i]);
        if (EMULATED && !strcmp(names[i], "tiny-flash")) /* its 160 tokens one by one: minutes on emulated kernels */
            printf("  (not on the emulated backend: the qwen4_exp fixtures have its architecture)\n");
        else
            test_fixture(p);
        free(names[i]);
    }
}

/* The QSA layers of a prompt step skip the selection exactly when every query keeps all it sees. tiny-flash: budget
 * 64 in blocks of 4, so the query at position i keeps everything while floor((i + 1) / 4) <= 16, up to i = 66.
 * Profiled: steps of 20 and 47 tokens from position 0 (the last query at 66) select nothing (their QSA layer's keys
 * are stored: qsa_keys) and a step of 20 after them selects (once a QSA layer); steps of 20 and 48 (the last query at
 * 67, 17 blocks) select in the second. */
static int profiled_calls(qwenc_session *s, const char *op) {
    qwenc_profile_entry e[256];
    qwenc_profile_totals tot;
    const int ne = qwenc_session_profile_read(s, e, 256, &tot);
    for (int i = 0; i < ne && i < 256; i++)
        if (!strcmp(e[i].name, op)) return (int)e[i].calls;
    return 0;
}

static void test_qsa_dense(const char *root) {
    char dir[1100], err[1024];
    snprintf(dir, sizeof(dir), "%s/tiny-flash", root);
    qwenc_model *m = NULL;
    char *mdir = fixture_model_dir(dir);
    const qwenc_status st = load_on(mdir, backend, &m, err, sizeof(err));
    free(mdir);
    if (st) {
        CHECK(0, "qsa dense steps: load %s: %s", dir, err);
        return;
    }
    enum { N = 90 };
    int32_t ids[N];
    const int V = qwenc_model_n_vocab(m);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 11) % V);
    static const int steps[2][3] = {{20, 47, 20}, {20, 48, 0}};
    static const int dense[2][3] = {{1, 1, 0}, {1, 0, 0}};
    for (int c = 0; c < 2; c++) {
        qwenc_session *s = NULL;
        qwenc_session_params sp = qwenc_session_default_params();
        sp.n_ctx = N;
        if (qwenc_session_init(m, &sp, &s, err, sizeof(err)) || qwenc_session_profile(s, 1, err, sizeof(err))) {
            CHECK(0, "qsa dense steps: session: %s", err);
            break;
        }
        int pos = 0, layers = 0;
        for (int k = 0; k < 3 && steps[c][k]; k++) {
            const int before = profiled_calls(s, "qsa_select");
            CHECK(!qwenc_session_forward(s, ids + pos, steps[c][k], NULL, 0, err, sizeof(err)),
                  "qsa dense steps: forward: %s", err);
            if (k == 0) layers = profiled_calls(s, "qsa_keys");
            const int sel = profiled_calls(s, "qsa_select") - before;
            CHECK(layers > 0 && sel == (dense[c][k] ? 0 : layers),
                  "qsa dense steps: %d tokens from %d: qsa_select %d calls (want %d; %d QSA layers)", steps[c][k], pos,
                  sel, dense[c][k] ? 0 : layers, layers);
            pos += steps[c][k];
        }
        qwenc_session_free(s);
    }
    qwenc_model_free(m);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--compare")) {
        size_t na = 0, nb = 0;
        float *a = test_read_f32(argv[2], &na), *b = test_read_f32(argv[3], &nb);
        size_t V = (size_t)atoi(argv[4]);
        int rc = 1;
        if (!a || !b || V == 0 || na != nb || na % V) {
            printf("compare: sizes differ (%zu vs %zu floats)\n", na, nb);
        } else {
            test_cmp r = test_compare_logits(a, b, na / V, V);
            printf("rel L2 %.3e, argmax mismatches %d\n", r.rel_l2, r.argmax_mismatch);
            rc = r.rel_l2 < 1e-4 && r.argmax_mismatch == 0 ? 0 : 1;
        }
        free(a);
        free(b);
        return rc;
    }
    if (argc > 2 && !strcmp(argv[1], "--backend")) {
        backend = argv[2];
        argc -= 2;
        argv += 2;
    }
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    printf("backend %s\n", backend);
    test_fixtures(root);
    test_profile(root);
    test_qsa_dense(root);
    if (!strcmp(backend, "cpu")) test_guard_catches(root);
    return test_summary();
}
