#!/usr/bin/env bash
# The CUDA paths written but not yet enabled, tried on a GPU machine in one go: the MoE's shared expert as more
# pairs of the routed experts' decode products (QWC_MOE_SHARED_PAIRS in src/cuda/moe.cu) and the 8-bit rounding of
# activations by the kernels that write them (norms, act_mul, divide, hc_read: QWC_Q8_PRODUCERS in
# src/cuda/backend.cu), the convolution with its silu in one launch (QWC_FUSE_CONV_SILU in src/cuda/ops.cu), one
# token's products of one type on the same x in one launch (QWC_MVQ_BATCH in src/cuda/ops.cu). All promise the
# default build's bits. It runs the default gpu_check, then a separate build
# (build-trial/) with both on: its suite, the logits of random models whose shared expert has the experts' width
# (Flash-Next's and Qwen3.5-35B-A3B's geometry, shrunk) bit for bit against the default build's, and the decode
# benchmarks with and without them. Enable them in the sources once this passes (a failure: build with one at a
# time to see which).
#
#   DEPS=DIR J=16 bash tests/gpu/trial.sh     (DEPS and J as for tests/gpu_check.sh)
set -u
cd "$(dirname "$0")/../.."
J=${J:-$(nproc)}
. tests/gpu/deps.sh
flags=()
[ -n "${DEPS:-}" ] && flags=(LDFLAGS="$dep_ldflags")
echo "== the default build: gpu_check"
bash tests/gpu_check.sh | tail -n 1
pending="-DQWC_MOE_SHARED_PAIRS=1 -DQWC_Q8_PRODUCERS=1 -DQWC_FUSE_CONV_SILU=1 -DQWC_MVQ_BATCH=1"
echo "== the trial build (build-trial/): $pending"
if ! make -j"$J" CUDA=1 BUILD=build-trial build-trial/qwenc build-trial/tests/t_model build-trial/tests/t_session \
        build-trial/tests/t_mtp build-trial/tests/gpu/t_cuda_ops CFLAGS="-O2 -g $dep_inc" \
        NVCCFLAGS="-O3 -g -lineinfo $pending" "${flags[@]}" >build-trial.log 2>&1; then
    tail -n 30 build-trial.log
    echo "0 passed, 1 failed"
    exit 1
fi
pass=0 fail=0
for t in gpu/t_cuda_ops t_model t_session t_mtp; do
    line=$(build-trial/tests/$t --backend cuda 2>&1 | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    echo "$t: ${line:-no summary}"
    [ -n "$line" ] || { fail=$((fail + 1)); continue; }
    pass=$((pass + $(echo "$line" | cut -d' ' -f1))) fail=$((fail + $(echo "$line" | cut -d' ' -f3)))
done
line=$(QWENC=build-trial/qwenc BUILD=build-trial bash tests/gpu/synth_check.sh 2>&1 | tail -n 1)
echo "synth_check (GPU vs CPU): $line"
pass=$((pass + $(echo "$line" | cut -d' ' -f1))) fail=$((fail + $(echo "$line" | cut -d' ' -f3)))
# the same products, so the same bits: decode (one token a step) and a draft-sized step of 4 tokens, quantized and
# 16-bit weights, both presets (their shared experts have the experts' width)
toks=5,17,300,2,999,41,7,7,7,1000,3,1500
for p in flash-next qwen3.5-35b-a3b; do
    for t in Q4_K Q8_0 BF16; do
        for b in 1 4; do
            syn="--synth $p --layers 4 --experts 16 --ngram-base 1000 --hidden 512 --vocab 2048 --type $t"
            build-cuda/qwenc logits $syn --tokens $toks --batch $b --backend cuda -o /tmp/trial.a.f32 2>/dev/null
            build-trial/qwenc logits $syn --tokens $toks --batch $b --backend cuda -o /tmp/trial.b.f32 2>/dev/null
            if [ -s /tmp/trial.a.f32 ] && cmp -s /tmp/trial.a.f32 /tmp/trial.b.f32; then
                pass=$((pass + 1))
            else
                fail=$((fail + 1)); echo "FAIL $p $t batch $b: the logits differ from the default build's"
            fi
            rm -f /tmp/trial.a.f32 /tmp/trial.b.f32
        done
    done
done
echo "$pass passed, $fail failed"
echo "== decode, default build vs trial build"
cut="--synth flash-next --layers 8 --experts 64 --ngram-base 200003"
for t in Q4_K Q8_0 BF16; do
    for b in build-cuda build-trial; do
        echo "$b $t: $($b/qwenc bench $cut --type $t --backend cuda -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128')"
    done
done
for b in build-cuda build-trial; do
    echo "$b whole Q4_K: $($b/qwenc bench --synth flash-next --type Q4_K --backend cuda -p 0 -n 64 -r 2 2>&1 | grep -E 'tg64')"
done
[ "$fail" -eq 0 ]
