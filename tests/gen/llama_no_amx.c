/*
 * llama_no_amx.c - LD_PRELOAD shim that keeps ggml off its AMX path, for running llama.cpp's own tools
 * (llama-bench) on this VM, where ggml's AMX Q8_0/Q4_K kernels die with SIGILL on tileloadd even with
 * the tile permission. ggml registers its AMX buffer type only when
 * syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeds (ggml-cpu/amx/amx.cpp,
 * ggml_amx_init); this shim makes that one request fail with EPERM and forwards every other syscall().
 * llama-bench has no flag for it (tests/gen/llama_logits.c sets use_extra_bufts = false instead).
 *
 *   cc -O2 -shared -fPIC -o build/llama_no_amx.so tests/gen/llama_no_amx.c -ldl
 *   LD_PRELOAD=$PWD/build/llama_no_amx.so $LLAMA/build/bin/llama-bench -m FILE.gguf ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023

long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (n == SYS_arch_prctl && a[0] == ARCH_REQ_XCOMP_PERM) {
        errno = EPERM;
        return -1;
    }
    static long (*next)(long, ...);
    if (!next) next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
