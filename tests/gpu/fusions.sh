#!/usr/bin/env bash
# The CUDA paths that fuse launches promise the bits of the launches they replace: the MoE's shared expert as more
# pairs of the routed experts' products (QWC_MOE_SHARED_PAIRS in src/cuda/moe.cu), the 8-bit rounding of
# activations by the kernels that write them (QWC_Q8_PRODUCERS in src/cuda/backend.cu), the convolution with its
# silu (QWC_FUSE_CONV_SILU in src/cuda/ops.cu), one token's products of one type on the same x in one launch
# (QWC_MVQ_BATCH in src/cuda/ops.cu), a block's output put into the streams with the next hyper-connection's norm
# (QWC_HC_INJECT_NORM in src/cuda/model_ops.cu), one token's hyper-connection up product inside its read
# (QWC_HC_UP_READ there), one token's MoE pairs reading its x in place (QWC_MOE_X_IN_PLACE in src/cuda/moe.cu), the
# routing's values in registers (QWC_MOE_ROUTE_REGS there; its rounds by the warp's integer reductions,
# QWC_MOE_ROUTE_REDUX), the shared gate's logits in the pairs' kernel
# (QWC_MOE_SG_IN_PAIRS there), the DeltaNet's gated norm (QWC_NORM_GATE in src/cuda/ops.cu) and one token's
# convolution, l2 norms and gate as one kernel (QWC_GDN_PREP there; several tokens' and a draft step's with q, k
# and v made apart, QWC_GDN_PREP_N), and the integer matrix-vector kernel's walk
# along Q8_0 and Q4_K rows (QWC_MVQ_WALK in src/cuda/quant.cu; not a fusion, the same promise), one token's MoE down
# products with their combine (QWC_MOE_DOWN_COMBINE there; 4 rows a block by default), and one token's matrix-vector products of few row groups
# at a row a warp (QWC_MV_ONE_ROW there; the same promise), each attention head's norm with its RoPE (QWC_NORM_ROPE
# in src/cuda/ops.cu), the keys' norm and RoPE with both cache stores (QWC_NORM_ROPE_KV there) and the delta rule
# with its gated norm (QWC_DR_GATE there), and small kernels' reads of weights before their programmatic wait and of
# state into L2 (QWC_EARLY_OPS in src/cuda/cuda_internal.cuh; the same promise), and a prompt's MoE rows rounded
# before they are gathered (QWC_MOE_GATHER_Q8 in src/cuda/moe.cu). This builds build-unfused/ with
# them off
# (FLAGS: other -D switches to set instead, for a path being tried) and compares the logits of build-cuda/
# (gpu_check's build) with its logits bit for bit: random models of Flash-Next's and Qwen3.5-35B-A3B's geometry,
# shrunk (their shared experts have the routed experts' width), Q4_K, Q8_0 and BF16 weights, 1, 4 and 12 tokens a
# step, and 12 with the MoE's rows grouped by expert (QWENC_CUDA_PAIRS_MAX=1). BENCH=1 also measures decode with and
# without the fusions. Run by tests/gpu_check.sh after its build.
#
#   DEPS=DIR J=16 bash tests/gpu/fusions.sh     (DEPS and J as for tests/gpu_check.sh)
set -u
cd "$(dirname "$0")/../.."
J=${J:-$(nproc)}
. tests/gpu/deps.sh
flags=()
[ -n "${DEPS:-}" ] && flags=(LDFLAGS="$dep_ldflags")
unfused="-DQWC_MOE_SHARED_PAIRS=0 -DQWC_Q8_PRODUCERS=0 -DQWC_FUSE_CONV_SILU=0 -DQWC_MVQ_BATCH=0 -DQWC_MVQ_PREFETCH=0"
unfused+=" -DQWC_CONV_STATE=0 -DQWC_MOE_GATE_IN_COMBINE=0 -DQWC_MOE_ROUTE_IN_PAIRS=0 -DQWC_HC_INJECT_NORM=0"
unfused+=" -DQWC_HC_UP_READ=0 -DQWC_MOE_X_IN_PLACE=0 -DQWC_MOE_ROUTE_REGS=0 -DQWC_NORM_GATE=0"
unfused+=" -DQWC_MOE_SG_IN_PAIRS=0 -DQWC_GDN_PREP=0 -DQWC_MVQ_WALK=0 -DQWC_MOE_DOWN_COMBINE=0"
unfused+=" -DQWC_MV_ONE_ROW=0 -DQWC_NORM_ROPE=0 -DQWC_NORM_ROPE_KV=0 -DQWC_DR_GATE=0 -DQWC_EARLY_OPS=0"
unfused+=" -DQWC_MOE_GATHER_Q8=0 -DQWC_MOE_ROUTE_REDUX=0 -DQWC_GDN_PREP_N=0"
off=${FLAGS:-$unfused}
if [ ! -x build-cuda/qwenc ]; then echo "fusions: build-cuda/qwenc missing (make cuda first)"; echo "0 passed, 1 failed"; exit 1; fi
echo "build-unfused/: $off"
if ! make -j"$J" CUDA=1 BUILD=build-unfused build-unfused/qwenc CFLAGS="-O2 -g $dep_inc" \
        NVCCFLAGS="-O3 -g -lineinfo $off" "${flags[@]}" >build-unfused.log 2>&1; then
    tail -n 30 build-unfused.log
    echo "0 passed, 1 failed"
    exit 1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
toks=5,17,300,2,999,41,7,7,7,1000,3,1500
for p in flash-next qwen3.5-35b-a3b; do
    for t in Q4_K Q8_0 BF16; do
        for b in 1 4 12 12g; do # 12g: the MoE's rows grouped by expert (no pairs), as a long prompt's are
            pm=() # the default pairs' limit, or none
            [ $b = 12g ] && pm=(QWENC_CUDA_PAIRS_MAX=1)
            syn="--synth $p --layers 4 --experts 16 --ngram-base 1000 --hidden 512 --vocab 2048 --type $t"
            env "${pm[@]}" build-cuda/qwenc logits $syn --tokens $toks --batch ${b%g} --backend cuda \
                -o "$dir/a.f32" 2>"$dir/err"
            env "${pm[@]}" build-unfused/qwenc logits $syn --tokens $toks --batch ${b%g} --backend cuda \
                -o "$dir/b.f32" 2>>"$dir/err"
            if [ -s "$dir/a.f32" ] && cmp -s "$dir/a.f32" "$dir/b.f32"; then
                pass=$((pass + 1)); echo "ok   $p $t batch $b: the same bits"
            else
                fail=$((fail + 1)); echo "FAIL $p $t batch $b: the logits differ from the unfused build's"
                head -n 3 "$dir/err"
            fi
            rm -f "$dir/a.f32" "$dir/b.f32"
        done
    done
done
if [ "${BENCH:-0}" = 1 ]; then
    cut="--synth flash-next --layers 8 --experts 64 --ngram-base 200003"
    for t in Q4_K Q8_0 BF16; do
        for b in build-cuda build-unfused; do
            echo "$b $t: $($b/qwenc bench $cut --type $t --backend cuda -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128')"
        done
    done
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
