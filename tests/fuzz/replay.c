/*
 * replay.c - a main() for a fuzz target built without libFuzzer: every file named on the command line (or
 * found in a directory named there) is passed to LLVMFuzzerTestOneInput once, as libFuzzer would. Built by
 * `make test` with the project's compiler (and by `make asan` with the sanitizers), so the seeds and the
 * regression inputs of tests/fuzz run everywhere, clang or not. A finding aborts the program.
 *
 *   replay_<target> FILE|DIR...     prints "replay_<target>: N inputs" and exits 0
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int n_inputs;

static void run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        exit(2);
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        exit(2);
    }
    /* an exact-size copy, so that reading past the input is caught by the sanitizers as under libFuzzer */
    uint8_t *in = malloc(n ? n : 1);
    memcpy(in, buf, n);
    free(buf);
    fprintf(stderr, "replay: %s\n", path);
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    n_inputs++;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static void run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file or directory: %s\n", path);
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    struct dirent **ents;
    int n = scandir(path, &ents, NULL, by_name);
    for (int i = 0; i < n; i++) {
        if (ents[i]->d_name[0] != '.') {
            size_t len = strlen(path) + strlen(ents[i]->d_name) + 2;
            char *p = malloc(len);
            snprintf(p, len, "%s/%s", path, ents[i]->d_name);
            run_path(p);
            free(p);
        }
        free(ents[i]);
    }
    free(ents);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) run_path(argv[i]);
    const char *name = strrchr(argv[0], '/');
    printf("%s: %d inputs\n", name ? name + 1 : argv[0], n_inputs);
    return 0;
}
