#!/usr/bin/env bash
# The GPU gives the same bits every run: logits of the bundled model's fixture window fed all at once (the GEMM
# path), in steps of 16 (the matrix-vector path) and token by token (recorded graphs), three runs each, and
# 300 greedy tokens twice. Run by tests/gpu_check.sh on a GPU machine.
source "$(dirname "$0")/../lib_cli.sh"
B=${QWENC:-build-cuda/qwenc}
T=$(cat tests/fixtures/tiny-flash/tokens.txt)
for mode in 0 16 1; do
    opt=""
    [ "$mode" -gt 0 ] && opt="--batch $mode"
    for i in 1 2 3; do $B logits -m models/tiny-flash --tokens "$T" --out "$tmp/l$i.f32" --backend cuda $opt 2>"$tmp/err"; done
    cmp -s "$tmp/l1.f32" "$tmp/l2.f32" && cmp -s "$tmp/l1.f32" "$tmp/l3.f32" && ok ||
        bad "logits ${opt:-all at once}: three runs, not the same bits $(head -c 200 "$tmp/err")"
done
for i in 1 2; do
    $B run -m models/tiny-flash -p "And it came to pass" -n 300 --temp 0 --backend cuda --no-display-prompt >"$tmp/t$i" 2>/dev/null
done
[ -s "$tmp/t1" ] && cmp -s "$tmp/t1" "$tmp/t2" && ok || bad "300 greedy tokens twice: other text"
finish
