#!/usr/bin/env bash
# The n-gram table read from pinned host memory (what the GPU backend does when the table does not fit beside the
# rest of the weights; QWENC_CUDA_PLE_HOST=1 forces it) gives the bits of the table in device memory: the bundled
# model (safetensors) and its Q4_K GGUF, logits of its fixture window all at once and token by token, and 64
# greedy tokens. Run by tests/gpu_check.sh on a GPU machine.
source "$(dirname "$0")/../lib_cli.sh"
B=${QWENC:-build-cuda/qwenc}
T=$(cat tests/fixtures/tiny-flash/tokens.txt)
$B quantize -m models/tiny-flash --type Q4_K -o "$tmp/q4.gguf" >/dev/null 2>"$tmp/err" || bad "quantize: $(head -c 200 "$tmp/err")"
for m in models/tiny-flash "$tmp/q4.gguf"; do
    for opt in "" "--batch 1"; do
        for h in 0 1; do
            QWENC_CUDA_PLE_HOST=$h $B logits -m "$m" --tokens "$T" --out "$tmp/l$h.f32" --backend cuda $opt 2>"$tmp/err$h"
        done
        [ -s "$tmp/l0.f32" ] && cmp -s "$tmp/l0.f32" "$tmp/l1.f32" && ok ||
            bad "$m logits ${opt:-all at once}: the table in host memory gives other bits $(head -c 200 "$tmp/err1")"
        rm -f "$tmp/l0.f32" "$tmp/l1.f32"
    done
    for h in 0 1; do
        QWENC_CUDA_PLE_HOST=$h $B run -m "$m" -p "And it came to pass" -n 64 --temp 0 --backend cuda \
            --no-display-prompt >"$tmp/t$h" 2>/dev/null
    done
    [ -s "$tmp/t0" ] && cmp -s "$tmp/t0" "$tmp/t1" && ok || bad "$m: 64 greedy tokens differ with the table in host memory"
done
# the benchmark says where the table is
QWENC_CUDA_PLE_HOST=1 $B bench -m "$tmp/q4.gguf" --backend cuda -p 0 -n 16 -r 1 >"$tmp/bench" 2>&1
grep -q "^n-gram table .* in pinned host memory" "$tmp/bench" && ok || bad "bench does not say the table is in host memory: $(tail -n 3 "$tmp/bench")"
finish
