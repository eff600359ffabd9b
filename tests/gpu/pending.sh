#!/usr/bin/env bash
# The CUDA paths built in but off by default until a GPU run shows them faster: `check` builds the backend and
# runs the gpu_check programs that take those paths (t_cuda_quant_unroll, t_cuda_ops, t_model_switches,
# t_session_switches); `prompt`, `decode` and `deep` (decode after thousands of tokens of context) measure each
# path against the default in one binary (tests/ab.sh, the sets interleaved) on the benchmarks it is for. A path
# that passes and is faster becomes the default (its switch's default in src/cuda/, docs/BENCH.md's paragraph on
# it) and leaves this list. Each step takes some 3-6 minutes on an H200, so each fits a call of its own where
# calls are limited to 10 minutes.
#
#   bash tests/gpu/pending.sh [check] [prompt] [decode] [deep]      all four when none is named
#
# ROUNDS (2) rounds of each set. Each step ends with a line saying how many comparisons or programs failed.
set -u
cd "$(dirname "$0")/../.." || exit 1
fn='--backend cuda --synth flash-next --type q4_k'
cut='--backend cuda --synth flash-next --layers 8 --experts 64 --ngram-base 200003 --type q4_k'
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(check prompt decode deep)
export QWENC=${QWENC:-build-cuda/qwenc} ROUNDS=${ROUNDS:-2}
fails=0

ab() { # a line naming the comparison, then ab.sh's table
    echo "== ab.sh $*"
    if ! bash tests/ab.sh "$@"; then
        echo "== failed: ab.sh $*"
        fails=$((fails + 1))
    fi
}

for step in "${steps[@]}"; do
    case $step in
        check)
            bash tests/gpu_check.sh t_cuda_quant_unroll t_cuda_ops t_model_switches t_session_switches ||
                fails=$((fails + 1))
            ;;
        prompt | decode | deep)
            if [ ! -x "$QWENC" ]; then
                echo "pending.sh: $QWENC is not there: run the check step (or make cuda) first" >&2
                exit 1
            fi
            ;;&
        prompt)
            # prompts: the chunked delta rule, the integer GEMM's unrolled group loop (the whole model's pp4096)
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_DR_CHUNK=64' 'QWENC_CUDA_MMQ_UNROLL=1' 'QWENC_CUDA_DR_CHUNK=64 QWENC_CUDA_MMQ_UNROLL=1' \
                -- $fn -p 4096 -n 0
            # dense prompt attention a tile of queries a block (every layer of Qwen3.5-35B-A3B's prefill)
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_ATT_QTILES=1' 'QWENC_CUDA_MMQ_UNROLL=1' \
                -- --backend cuda --synth qwen3.5-35b-a3b --type q4_k -p 4096 -n 0
            # the cut's pp512 (the target's test)
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_MMQ_UNROLL=1' 'QWENC_CUDA_DR_CHUNK=64' -- $cut -p 512 -n 0
            ;;
        decode)
            # decode: each matrix asked for into L2 whole by its first block (the whole model, the cut at Q4_K and Q8_0)
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_MV_BULK=1' -- $fn -p 0 -n 32
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_MV_BULK=1' -- $cut -p 0 -n 128
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_MV_BULK=1' -- ${cut%q4_k}q8_0 -p 0 -n 128
            # batched decode: the attention rows in one launch each, the MoE's rows as pairs past 64
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_ATT_ROWS=1' 'QWENC_CUDA_PAIRS_MAX=256' 'QWENC_CUDA_ATT_ROWS=1 QWENC_CUDA_PAIRS_MAX=256' \
                -- $fn -p 0 -n 16 -np 8,16
            ;;
        deep)
            # decode deep in a conversation: attention and the QSA selection split along the keys (Flash-Next's QSA
            # layers past 2,048 positions score every block of 4 keys and attend to 2,048 selected keys; Qwen3.5's
            # full-attention layers attend to every key)
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_ATT_SPLIT=16' 'QWENC_CUDA_ATT_SPLIT=64' 'QWENC_CUDA_QSA_SPLIT=16' \
                'QWENC_CUDA_ATT_SPLIT=64 QWENC_CUDA_QSA_SPLIT=16' -- $fn -p 0 -n 32 -d 4096
            ab - 'QWENC_CUDA_ATT_SPLIT=16' 'QWENC_CUDA_ATT_SPLIT=64' \
                -- --backend cuda --synth qwen3.5-35b-a3b --type q4_k -p 0 -n 32 -d 16384
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_ATT_SPLIT=16' -- $cut -p 0 -n 128
            ;;
        *) echo "pending.sh: no step '$step' (check, prompt, decode, deep)" >&2; exit 1 ;;
    esac
    echo "== step $step done, $fails failed so far"
done
[ "$fails" -eq 0 ]
