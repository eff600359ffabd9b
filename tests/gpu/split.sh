#!/usr/bin/env bash
# The routed experts spread over GPUs (--gpus) give the bits of one GPU: every MoE fixture's logits (all tokens at
# once: the grouped products; token by token: the pairs and the recorded graphs; the file's types and Q4_K) with
# the split against one GPU, byte for byte; greedy text, with and without MTP drafts (steps of several tokens,
# their own graphs); uneven shares and a GPU without experts (QWENC_GPU_SHARES); random weights made on the GPUs
# (--synth); bench's per-GPU lines; a device that is not there. The layers over GPUs (--split layer) the same way on
# every fixture (dense models too), with uneven shares, random weights, greedy text with MTP drafts, bench's lines,
# and t_session over three ranks (snapshots, batched steps, drafts). NCCL takes one rank per device, so on a
# one-GPU machine the ranks share device 0 (--gpus 0,0: their exchanges are device copies) and `--gpus 1` runs the
# NCCL path with a communicator of one rank; with 2 or more devices `--gpus 2` (and 4) run NCCL between them.
# Run by tests/gpu_check.sh.
source "$(dirname "$0")/../lib_cli.sh"
B=${QWENC:-build-cuda/qwenc}
n_dev=$(nvidia-smi -L 2>/dev/null | wc -l)
splits="1 0,0 0,0,0 0,0,0,0,0,0,0,0"
[ "$n_dev" -ge 2 ] && splits="$splits 2"
[ "$n_dev" -ge 4 ] && splits="$splits 4"
echo "devices: $n_dev; splits: $splits"

# every fixture of the list: its logits with --gpus G (each of $splits) and the options given, against one GPU's
split_logits() {
    local opts=$1 m model T q opt g
    shift
    for m in "$@"; do
        model=tests/fixtures/$m
        [ "$m" = tiny-flash ] && model=models/tiny-flash
        T=$(cat "tests/fixtures/$m/tokens.txt")
        quants=("")
        case $m in tiny-flash | qwen4_exp | qwen3_5) quants+=("--quant Q4_K") ;; esac
        for q in "${quants[@]}"; do
            for opt in "" "--batch 1"; do
                # shellcheck disable=SC2086
                if ! $B logits -m "$model" --tokens "$T" --out "$tmp/one.f32" --backend cuda $q $opt 2>"$tmp/err"; then
                    bad "$m $q $opt: one GPU failed: $(head -c 300 "$tmp/err")"
                    continue
                fi
                for g in $splits; do
                    # shellcheck disable=SC2086
                    $B logits -m "$model" --tokens "$T" --out "$tmp/split.f32" --backend cuda --gpus "$g" $opts $q \
                        $opt 2>"$tmp/err" && cmp -s "$tmp/one.f32" "$tmp/split.f32" && ok ||
                        bad "$m $q $opt --gpus $g $opts: not the bits of one GPU $(head -c 300 "$tmp/err")"
                done
            done
        done
    done
}
split_logits "" tiny-flash qwen4_exp qwen3_5_moe qwen3_next

# uneven shares, a GPU without experts
T=$(cat tests/fixtures/qwen4_exp/tokens.txt)
for opt in "" "--batch 1"; do
    # shellcheck disable=SC2086
    $B logits -m tests/fixtures/qwen4_exp --tokens "$T" --out "$tmp/one.f32" --backend cuda $opt 2>/dev/null
    for sh in 0,1 0.8,0.2 1,0,1; do
        g=0,0; [ "$sh" = 1,0,1 ] && g=0,0,0
        # shellcheck disable=SC2086
        QWENC_GPU_SHARES=$sh $B logits -m tests/fixtures/qwen4_exp --tokens "$T" --out "$tmp/split.f32" --backend cuda \
            --gpus $g $opt 2>"$tmp/err" && cmp -s "$tmp/one.f32" "$tmp/split.f32" && ok ||
            bad "qwen4_exp $opt shares $sh: not the bits of one GPU $(head -c 300 "$tmp/err")"
    done
done

# random weights made on the GPUs (--synth): each rank makes the parts it reads, the bytes one GPU makes
syn="--synth flash-next --layers 4 --experts 16 --hidden 256 --vocab 2048 --ngram-base 1009 --type Q4_K"
T=$(seq -s, 1 80)
# shellcheck disable=SC2086
$B logits $syn --tokens "$T" --out "$tmp/one.f32" --backend cuda 2>"$tmp/err" || bad "synth on one GPU: $(head -c 300 "$tmp/err")"
for g in 1 0,0,0; do
    # shellcheck disable=SC2086
    $B logits $syn --tokens "$T" --out "$tmp/split.f32" --backend cuda --gpus $g 2>"$tmp/err" &&
        cmp -s "$tmp/one.f32" "$tmp/split.f32" && ok || bad "synth --gpus $g: not the bits of one GPU $(head -c 300 "$tmp/err")"
done

# greedy text, one token a step and with drafts of 3 from the MTP head
for d in "" "--draft 3"; do
    # shellcheck disable=SC2086
    $B run -m models/tiny-flash -p "And it came to pass" -n 96 --temp 0 --backend cuda --no-display-prompt $d \
        >"$tmp/t1" 2>/dev/null
    for g in 1 0,0,0; do
        # shellcheck disable=SC2086
        $B run -m models/tiny-flash -p "And it came to pass" -n 96 --temp 0 --backend cuda --gpus "$g" \
            --no-display-prompt $d >"$tmp/t2" 2>"$tmp/err"
        [ -s "$tmp/t1" ] && cmp -s "$tmp/t1" "$tmp/t2" && ok || bad "greedy text $d --gpus $g: other text $(head -c 300 "$tmp/err")"
    done
done

# bench: every GPU's memory and the exchanges' time
$B bench -m models/tiny-flash --backend cuda --gpus 0,0 -p 16 -n 8 -r 1 >"$tmp/bench" 2>&1
grep -q "^GPU 1 .*device 0: .* GiB of weights" "$tmp/bench" && ok || bad "bench --gpus 0,0: no line for GPU 1: $(tail -n 5 "$tmp/bench")"
grep -qE "^exchanges +[0-9.]+ us a decode token" "$tmp/bench" && ok || bad "bench --gpus 0,0: no exchanges line: $(tail -n 5 "$tmp/bench")"

# --split layer: each GPU a range of layers, their state with them; every fixture (dense ones too), the file's types
# and Q4_K, all tokens at once and token by token (decode steps recorded as graphs across the ranks)
split_logits "--split layer" tiny-flash llama qwen3 qwen3_5 qwen3_5_moe qwen3_next qwen4_exp
# uneven shares: a first GPU without layers, one in the middle without any
T=$(cat tests/fixtures/qwen4_exp/tokens.txt)
$B logits -m tests/fixtures/qwen4_exp --tokens "$T" --out "$tmp/one.f32" --backend cuda --batch 1 2>/dev/null
for sh in 0,1 1,0,1 3,1; do
    g=0,0; [ "$sh" = 1,0,1 ] && g=0,0,0
    QWENC_GPU_SHARES=$sh $B logits -m tests/fixtures/qwen4_exp --tokens "$T" --out "$tmp/split.f32" --backend cuda \
        --gpus $g --split layer --batch 1 2>"$tmp/err" && cmp -s "$tmp/one.f32" "$tmp/split.f32" && ok ||
        bad "qwen4_exp --split layer shares $sh: not the bits of one GPU $(head -c 300 "$tmp/err")"
done
# random weights made where their layer runs
T=$(seq -s, 1 80)
# shellcheck disable=SC2086
$B logits $syn --tokens "$T" --out "$tmp/one.f32" --backend cuda 2>"$tmp/err" || bad "synth on one GPU: $(head -c 300 "$tmp/err")"
# shellcheck disable=SC2086
$B logits $syn --tokens "$T" --out "$tmp/split.f32" --backend cuda --gpus 0,0,0 --split layer 2>"$tmp/err" &&
    cmp -s "$tmp/one.f32" "$tmp/split.f32" && ok ||
    bad "synth --split layer: not the bits of one GPU $(head -c 300 "$tmp/err")"
# greedy text, one token a step and with the MTP head's drafts (the head's layer on the last GPU)
for d in "" "--draft 3"; do
    # shellcheck disable=SC2086
    $B run -m models/tiny-flash -p "And it came to pass" -n 96 --temp 0 --backend cuda --no-display-prompt $d \
        >"$tmp/t1" 2>/dev/null
    for g in 1 0,0,0; do
        # shellcheck disable=SC2086
        $B run -m models/tiny-flash -p "And it came to pass" -n 96 --temp 0 --backend cuda --gpus "$g" --split layer \
            --no-display-prompt $d >"$tmp/t2" 2>"$tmp/err"
        [ -s "$tmp/t1" ] && cmp -s "$tmp/t1" "$tmp/t2" && ok ||
            bad "greedy text $d --gpus $g --split layer: other text $(head -c 300 "$tmp/err")"
    done
done
# snapshots (each layer's state read back from its GPU), batched steps and drafts: t_session's checks over 3 ranks
out=$("$(dirname "$B")/tests/t_session" --backend cuda --gpus 0,0,0 --split layer 2>&1)
line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
[ -n "$line" ] && [ "$(echo "$line" | cut -d' ' -f3)" = 0 ] && [ "$(echo "$line" | cut -d' ' -f1)" -gt 0 ] && ok ||
    bad "t_session --split layer: ${line:-no summary}: $(printf '%s\n' "$out" | grep FAIL | head -n 3)"
# bench: the layers each GPU holds
$B bench -m models/tiny-flash --backend cuda --gpus 0,0 --split layer -p 16 -n 8 -r 1 >"$tmp/bench" 2>&1
grep -qE "^GPU 0 .*device 0: .* GiB of weights.*\(layers 0-[0-9]+ and the rest of the model\)" "$tmp/bench" &&
    grep -qE "^GPU 1 .*\(layers [0-9]+-[0-9]+\)" "$tmp/bench" && ok ||
    bad "bench --split layer: no layers in the GPU lines: $(tail -n 5 "$tmp/bench")"

# a device that is not there, and the CPU
expect_error "--gpus past the devices" "no CUDA device $n_dev" $B logits -m models/tiny-flash --tokens 1,2 --out "$tmp/x" \
    --backend cuda --gpus "0,$n_dev"
expect_error "--gpus on the CPU" "need --backend cuda" $B logits -m models/tiny-flash --tokens 1,2 --out "$tmp/x" \
    --backend cpu --gpus 2
finish
