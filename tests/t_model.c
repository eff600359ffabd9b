/*
 * t_model.c - model tests: unit tests of the new math (PLE hash vectors, RoPE, delta rule, QSA
 * selection, f16/bf16 conversion) and every fixture of tests/fixtures compared with the transformers
 * reference logits, fed all at once and token by token.
 *
 *   t_model [FIXTURE_DIR]                  run everything (default tests/fixtures)
 *   t_model --compare OUT REF VOCAB        compare two logits files (used by cli_model.sh)
 *
 * Fixture bar: relative L2 error of the whole logits matrix below 1e-4 and the same argmax at every
 * position. The reference is f32 transformers on the same bf16/f16/f32 weights, so the only difference
 * is f32 summation order (measured ~1e-6); 1e-4 leaves room for the longer sums of larger fixtures
 * while any real mistake (a wrong norm, a missed token, a wrong block) moves logits by > 1e-2.
 */
#include <dirent.h>
#include <math.h>
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
    char *path = qw_path_join(dir, "model.txt"), *txt = NULL, err[256];
    qwenc_status st = qw_read_file(path, &txt, NULL, err, sizeof(err));
    free(path);
    if (st) return strdup(dir);
    size_t n = strlen(txt);
    while (n && (txt[n - 1] == '\n' || txt[n - 1] == ' ' || txt[n - 1] == '\r')) txt[--n] = 0;
    return txt;
}

static void test_fixture(const char *dir) {
    char *path, err[1024];
    qwenc_model *m = NULL;
    char *mdir = fixture_model_dir(dir);
    qwenc_status lst = qwenc_model_load(mdir, &m, err, sizeof(err));
    free(mdir);
    if (lst) {
        CHECK(0, "%s: load: %s", dir, err);
        return;
    }
    int n = 0, V = qwenc_model_n_vocab(m);
    path = qw_path_join(dir, "tokens.txt");
    int32_t *ids = test_read_tokens(path, &n);
    free(path);
    CHECK(ids && n > 0, "%s: tokens.txt", dir);
    static const struct {
        const char *ref;
        int batch; /* 0: all at once */
        const char *label;
    } modes[] = {
        {"logits_full.f32", 0, "all tokens in one call vs full forward"},
        {"logits_decode.f32", 1, "token by token vs cached decode"},
        {"logits_full.f32", 7, "chunks of 7 vs full forward"},
    };
    for (size_t k = 0; ids && k < sizeof(modes) / sizeof(modes[0]); k++) {
        path = qw_path_join(dir, modes[k].ref);
        size_t nref = 0;
        float *ref = test_read_f32(path, &nref);
        free(path);
        float *out = test_run_model(m, ids, n, modes[k].batch ? modes[k].batch : n);
        if (ref && out && nref == (size_t)n * V) {
            test_cmp r = test_compare_logits(out, ref, (size_t)n, (size_t)V);
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
    free(ids);
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
        test_fixture(p);
        free(names[i]);
    }
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
    const char *root = argc > 1 ? argv[1] : "tests/fixtures";
    test_fixtures(root);
    return test_summary();
}
