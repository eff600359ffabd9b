/*
 * emu.cc - the block scheduler of tests/gpu/emu/cuda/cuda_internal.cuh: a block's threads as coroutines of the
 * calling thread, run in turn until each waits at a barrier or returns; a barrier opens when every thread it waits
 * for is there. A coroutine starts on its own stack through makecontext / swapcontext and from then on switches with
 * _setjmp / _longjmp, which leave the signal mask alone (swapcontext's system call each switch would make the
 * emulation several times slower). Under AddressSanitizer each switch of stacks is announced to it (the fiber
 * annotations), so that it follows the coroutines' stacks.
 */
#undef _FORTIFY_SOURCE /* its longjmp check refuses a jump to another stack, which is the point here */
#include <setjmp.h>

#include "cuda/ops_internal.cuh"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

alignas(16) float sm[EMU_SMEM_FLOATS], kb[EMU_SMEM_FLOATS], score[EMU_SMEM_FLOATS], nh[EMU_SMEM_FLOATS],
    qk[EMU_SMEM_FLOATS], rp[EMU_SMEM_FLOATS];
alignas(16) unsigned char taken[4 * EMU_SMEM_FLOATS];
dim3 threadIdx, blockIdx, blockDim, gridDim;
uint64_t emu_slot[32][32];
int emu_launches;

namespace {
constexpr size_t STACK = 256 << 10; /* a thread's stack */
struct fiber {
    ucontext_t ctx; /* its start */
    jmp_buf jb;     /* where it waits */
    char *stack;
    int state, started;
    void *fake; /* AddressSanitizer's record of the stack it left */
};
std::vector<fiber> &fibers = *new std::vector<fiber>; /* reused by every block, never freed: the stacks stay
                                                        * reachable to the end */
ucontext_t sched;  /* the scheduler's context at a coroutine's start (never resumed: coroutines _longjmp back) */
jmp_buf sched_jb; /* where a coroutine that waits or returns goes */
unsigned cur;
const std::function<void()> *body;
[[maybe_unused]] const void *sched_bottom;
[[maybe_unused]] size_t sched_size;

/* from thread cur back to the scheduler (dying: it has returned, and its stack is left for good) */
void to_sched(bool dying) {
    fiber &f = fibers[cur];
#if EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake, sched_bottom, sched_size);
#endif
    if (dying) _longjmp(sched_jb, 1); /* its stack is not returned to */
    if (!_setjmp(f.jb)) _longjmp(sched_jb, 1);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake, nullptr, nullptr);
#endif
}

void entry() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &sched_bottom, &sched_size);
#endif
    (*body)();
    fibers[cur].state = EMU_DONE;
    to_sched(true);
}
/* run thread i until it waits or returns */
__attribute__((noinline)) void resume(unsigned i) {
    cur = i;
    threadIdx = dim3(i, 0, 0);
    [[maybe_unused]] void *fake = nullptr;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&fake, fibers[i].stack, STACK);
#endif
    if (!_setjmp(sched_jb)) {
        if (fibers[i].started) _longjmp(fibers[i].jb, 1);
        fibers[i].started = 1;
        swapcontext(&sched, &fibers[i].ctx); /* its start; it comes back by _longjmp */
    }
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}
} // namespace

void emu_wait(int where) {
    fibers[cur].state = where;
    to_sched(false);
}

void emu_run(unsigned n, const std::function<void()> &b) {
    body = &b;
    if (fibers.size() < n) fibers.resize(n);
    for (unsigned i = 0; i < n; i++) {
        fiber &f = fibers[i];
        if (!f.stack && !(f.stack = (char *)malloc(STACK))) abort();
        f.state = EMU_READY, f.started = 0;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = nullptr; /* entry never returns */
        makecontext(&f.ctx, entry, 0);
    }
    for (;;) {
        bool ran = false;
        for (unsigned i = 0; i < n; i++) {
            if (fibers[i].state != EMU_READY) continue;
            resume(i);
            ran = true;
        }
        if (ran) continue;
        /* every thread waits or has returned: a warp whose live threads all wait at its barrier goes on */
        bool opened = false;
        for (unsigned w0 = 0; w0 < n; w0 += 32) {
            unsigned live = 0, waiting = 0;
            for (unsigned i = w0; i < n && i < w0 + 32; i++) {
                live += fibers[i].state != EMU_DONE;
                waiting += fibers[i].state == EMU_AT_WARP;
            }
            if (live && waiting == live) {
                for (unsigned i = w0; i < n && i < w0 + 32; i++)
                    if (fibers[i].state == EMU_AT_WARP) fibers[i].state = EMU_READY;
                opened = true;
            }
        }
        if (opened) continue;
        unsigned live = 0, at_block = 0;
        for (unsigned i = 0; i < n; i++) {
            live += fibers[i].state != EMU_DONE;
            at_block += fibers[i].state == EMU_AT_BLOCK;
        }
        if (!live) return;
        if (at_block != live) {
            fprintf(stderr, "emu: block (%u, %u, %u) deadlocks: %u of its %u live threads at __syncthreads, the others "
                    "at a warp's barrier\n", blockIdx.x, blockIdx.y, blockIdx.z, at_block, live);
            abort();
        }
        for (unsigned i = 0; i < n; i++)
            if (fibers[i].state == EMU_AT_BLOCK) fibers[i].state = EMU_READY;
    }
}

void emu_trace(const char *args, dim3 grid, dim3 block, size_t smem) {
    static int on = -1;
    if (!qwc_env_switch("QWC_EMU_TRACE", 0, &on)) return;
    int depth = 0, n = 0;
    for (; args[n] && (depth || args[n] != ','); n++) depth += args[n] == '<' ? 1 : args[n] == '>' ? -1 : 0;
    fprintf(stderr, "emu launch %.*s grid %u,%u,%u block %u smem %zu\n", n, args, grid.x, grid.y, grid.z, block.x,
            smem);
}
