/*
 * mma.cuh - the few PTX instructions of the integer GEMM (mmq.cu) and the tiled attention (attn.cu) as device
 * functions: the 8-bit integer MMA and cp.async's 4- and 16-byte copies into shared memory (also the weight kernels'
 * of quant.cu). tests/gpu/emu has a
 * header of this name that does the same on CPU threads (a warp's fragments through a slot a lane, the copies landing
 * at the waits that complete them), so that `make test` runs both.
 *
 * Fragments (PTX ISA, mma.m16n8k32 / m16n8k16 with .s8, row.col), gid = lane / 4, tig = lane % 4, byte j of a
 * word: A (16 x 32 rows by k): a[i] holds row gid + 8 (i % 2), k = 4 tig + j + 16 (i / 2); B (32 x 8, k by column):
 * b[i] holds k = 4 tig + j + 16 i, column gid; D (16 x 8): d[i] row gid + 8 (i / 2), column 2 tig + i % 2. The
 * k16 form has a[0], a[1] and b[0] of those.
 */
#ifndef QW_CUDA_MMA_CUH
#define QW_CUDA_MMA_CUH

#include <stdint.h>

/* d = A B (16 x 8 int32 sums of 32 products of signed bytes) */
__device__ __forceinline__ void mma32(int32_t *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}
/* d = A B over 16 products */
__device__ __forceinline__ void mma16(int32_t *d, uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

/* 4 bytes from src into shared dst, or zeros when !ok (then src is not read) */
__device__ __forceinline__ void cp_async4(uint32_t *dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(ok ? 4 : 0));
}
/* 16 bytes from src into shared dst (both 16-byte aligned), or zeros when !ok (then src is not read); through L2
 * only (.cg) */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(ok ? 16 : 0));
}
/* 16 bytes into shared dst (16-byte aligned) of which the first n (0..16) are read from global src, the rest zero;
 * through L2 only (.cg), so weights streaming through leave L1 to the activations */
__device__ __forceinline__ void cp_async16n(void *dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(n)
                 : "memory");
}
/* the copies issued so far as one group */
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* wait until at most one group (N = 1) or none (N = 0) is in flight */
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
