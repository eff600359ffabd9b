#!/usr/bin/env bash
# The GPU against the CPU on random models at the two presets' geometry, shrunk (qwenc synth files: llama.cpp's
# layout, so the DeltaNet's value heads in its tiled order, shared experts as wide as the routed ones, QSA, PLE and
# hyper-connections on flash-next), BF16 weights so that both sides take f32 activations: logits of 12 tokens one
# at a time and all at once. Bar: the CPU's tolerance against transformers (rel L2 < 1e-4, the same arg max at every
# position): the same f32 math, sums in another order. Run by tests/gpu_check.sh.
#
#   QWENC=build-cuda/qwenc BUILD=build-cuda bash tests/gpu/synth_check.sh
# GPU_BACKEND=cpu compares the CPU with itself (the script's own check, where there is no GPU).
set -u
cd "$(dirname "$0")/../.."
Q=${QWENC:-build-cuda/qwenc}
B=${BUILD:-build-cuda}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
toks=5,17,300,2,999,41,7,7,7,1000,3,1500
for p in flash-next qwen3.5-35b-a3b; do
    if ! "$Q" synth --preset "$p" --layers 4 --experts 16 --ngram-base 1000 --hidden 512 --vocab 2048 --type BF16 \
            -o "$dir/m.gguf" >/dev/null 2>"$dir/err"; then
        echo "FAIL $p: synth: $(cat "$dir/err")"; fail=$((fail + 1)); continue
    fi
    for b in 1 12; do
        "$Q" logits -m "$dir/m.gguf" --tokens $toks --batch $b --backend cpu -o "$dir/cpu.f32" 2>/dev/null
        "$Q" logits -m "$dir/m.gguf" --tokens $toks --batch $b --backend ${GPU_BACKEND:-cuda} -o "$dir/gpu.f32" 2>/dev/null
        r=$("$B/tests/t_model" --compare "$dir/gpu.f32" "$dir/cpu.f32" 2048 2>&1 | tail -n 1)
        l2=$(echo "$r" | sed -n 's/.*rel L2 \([0-9.e+-]*\).*/\1/p')
        am=$(echo "$r" | sed -n 's/.*argmax mismatches \([0-9]*\).*/\1/p')
        if [ -n "$l2" ] && awk -v x="$l2" 'BEGIN { exit !(x < 1e-4) }' && [ "${am:-1}" -eq 0 ]; then
            pass=$((pass + 1)); echo "ok   $p batch $b: $r"
        else
            fail=$((fail + 1)); echo "FAIL $p batch $b: ${r:-no logits}"
        fi
    done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
