/*
 * mma.cuh (tests/gpu/emu) - src/cuda/mma.cuh's instructions on the emulation's CPU threads: a warp's MMA through a
 * slot of fragment words a lane between two warp barriers (every lane takes part, as mma.sync's .aligned asks), each
 * lane then forming its four sums from the whole warp's fragments in the PTX ISA's layout (src/cuda/mma.cuh); the
 * sums are exact integers, so the order does not matter. cp.async's copies land when a wait completes their group
 * (emu_cp_issue below).
 */
#ifndef QW_CUDA_EMU_MMA_CUH
#define QW_CUDA_EMU_MMA_CUH

#include "cuda/cuda_internal.cuh"

inline uint32_t emu_frag[32][32][6]; /* [warp][lane]: a[0..3], b[0..1] */

/* signed byte j of w */
inline int emu_s8(uint32_t w, int j) { return (int)(int8_t)(uint8_t)(w >> (8 * j)); }

/* d = A B for K = 16 (k16) or 32: each lane's a[0 .. K / 8 - 1] and b[0 .. K / 16 - 1] exchanged through emu_frag */
inline void emu_mma(int32_t *d, const uint32_t *a, const uint32_t *b, int K) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, gid = l >> 2, tig = l & 3;
    for (int i = 0; i < K / 8; i++) emu_frag[w][l][i] = a[i];
    for (int i = 0; i < K / 16; i++) emu_frag[w][l][4 + i] = b[i];
    __syncwarp();
    for (int i = 0; i < 4; i++) {
        const int r = gid + 8 * (i / 2), c = 2 * tig + i % 2;
        int32_t s = 0;
        for (int k = 0; k < K; k++) {
            const int half = k / 16, kt = (k % 16) / 4, j = k % 4; /* A: reg r / 8 + 2 half; B: reg half */
            const int av = emu_s8(emu_frag[w][(r % 8) * 4 + kt][r / 8 + 2 * half], j);
            const int bv = emu_s8(emu_frag[w][c * 4 + kt][4 + half], j);
            s += av * bv;
        }
        d[i] = s;
    }
    __syncwarp();
}
inline void mma32(int32_t *d, const uint32_t *a, const uint32_t *b) { emu_mma(d, a, b, 32); }
inline void mma16(int32_t *d, uint32_t a0, uint32_t a1, uint32_t b) {
    const uint32_t a[2] = {a0, a1}, bb[1] = {b};
    emu_mma(d, a, bb, 16);
}

/* cp.async: a thread's copies are held (their bytes read at once: nothing writes a source while a kernel runs) and
 * land in shared memory only when a wait of that thread lets their group complete, so a read of a tile before its
 * wait, or before the barrier after the other threads' waits, sees what was there (NaN at a block's start) */
inline void emu_cp_issue(void *dst, const void *src, int n, int n_read) {
    emu_cp c;
    c.dst = dst, c.n = n, c.group = emu_cp_groups[threadIdx.x];
    memset(c.b, 0, sizeof(c.b));
    memcpy(c.b, src, (size_t)n_read);
    emu_cps[threadIdx.x].push_back(c);
}
inline void cp_async4(uint32_t *dst, const void *src, bool ok) { emu_cp_issue(dst, src, 4, ok ? 4 : 0); }
inline void cp_async16(void *dst, const void *src, bool ok) { emu_cp_issue(dst, src, 16, ok ? 16 : 0); }
inline void cp_async16n(void *dst, const void *src, int n) { emu_cp_issue(dst, src, 16, n); }
inline void cp_commit() { emu_cp_groups[threadIdx.x]++; }
template <int N> inline void cp_wait() {
    std::vector<emu_cp> &v = emu_cps[threadIdx.x];
    const unsigned done = emu_cp_groups[threadIdx.x] >= (unsigned)N ? emu_cp_groups[threadIdx.x] - N : 0;
    size_t keep = 0;
    for (size_t i = 0; i < v.size(); i++) {
        if (v[i].group < done) memcpy(v[i].dst, v[i].b, (size_t)v[i].n);
        else v[keep++] = v[i];
    }
    v.resize(keep);
}

#endif
