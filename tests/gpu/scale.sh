#!/usr/bin/env bash
# The numbers of docs/SCALE.md on a machine with two or more GPUs, in one go: the exactness of the splits over real
# GPUs (tests/gpu/split.sh runs --gpus 2, and 4 where there are 4), then `qwenc bench --synth` of the whole
# Flash-Next (random weights made in device memory, no file): Q4_K on one GPU against --gpus 2 (expert and layer
# splits), one session and 16 decoding together (-np 16), and Q8_0 (about 186 GB: two GPUs at least) over
# --gpus 2. Each bench line is its tg t/s column; bench itself prints each GPU's memory and the exchanges' share.
#
#   DEPS=DIR J=16 bash tests/gpu/scale.sh      (after make cuda; DEPS as for tests/gpu_check.sh; N=32 tokens a
#                                               test, R=2 repetitions)
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${QWENC:-build-cuda/qwenc}
N=${N:-32} R=${R:-2}
n_dev=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ ! -x "$B" ]; then echo "scale: $B missing (make cuda first)"; exit 1; fi
if [ "$n_dev" -lt 2 ]; then echo "scale: $n_dev GPU(s); the splits' numbers need 2 or more"; exit 1; fi
echo "devices: $n_dev"
bash tests/gpu_check.sh split | tail -n 3
tg() { # the t/s of the last tg row, and bench's lines about the GPUs
    local out
    out=$("$B" bench --backend cuda --synth flash-next -p 0 -n "$N" -r "$R" "$@" 2>&1)
    echo "$out" | grep -E '^(GPU|exchanges)' | sed 's/^/    /'
    echo "$out" | grep -E '^\|' | tail -n 1 | awk -F'|' '{print $8}' | tr -s ' '
}
for np in 1 16; do
    echo "q4_k -np $np, one GPU: $(tg --type q4_k -np $np | tail -n 1)"
    echo "q4_k -np $np, --gpus 2 (experts):"; tg --type q4_k -np $np --gpus 2
    echo "q4_k -np $np, --gpus 2 --split layer:"; tg --type q4_k -np $np --gpus 2 --split layer
done
echo "q8_0 -np 1, --gpus 2 (experts):"; tg --type q8_0 --gpus 2
echo "q8_0 -np 1, --gpus 2 --split layer:"; tg --type q8_0 --gpus 2 --split layer
