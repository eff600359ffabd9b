#!/usr/bin/env bash
# The CUDA paths whose settings still wait on a GPU run: `check` builds the backend and runs the gpu_check programs
# that take them (t_cuda_quant_loop, t_cuda_ops, t_model, t_model_switches, t_session, t_session_switches, t_mtp);
# `split` measures decode attention split along the keys (QWENC_CUDA_ATT_SPLIT) against a block a head at several
# depths, for the threshold below which a query keeps the per-head kernel (QWENC_CUDA_ATT_SPLIT_MIN: ATT_SPLIT_MIN
# in src/cuda/attn.cu), and the split count deep in a conversation (ATT_SPLIT); `defaults` measures this round's
# defaults against the settings before them, in one binary
# (tests/ab.sh, the sets interleaved); `mmq` a prompt's MoE with its rows rounded before they are gathered
# (QWENC_CUDA_MOE_GATHER_Q8), the integer GEMM's skipped n tiles (QWENC_CUDA_MMQ_SKIP) and a prompt's products
# taking their input's rounding from its writer or the batch's first job (QWENC_CUDA_Q8_BIG), together, then
# attention's tiles copied a stage ahead (QWENC_CUDA_ATT_ASYNC), in prompts and deep decode; `fast` the integer
# GEMM's group terms as fused multiply-adds (QWENC_CUDA_MMQ_FAST=1, opt-in) against the reference's operations;
# `redux` the MoE routing's rounds by the warp's integer reductions (QWC_MOE_ROUTE_REDUX, a build switch: the
# default build against build-noredux/, built with it off, the two binaries' benches alternating; the same bits,
# which fusions.sh checks); `multi` steps of several tokens (draft steps, 4 sessions) with a batch's products of up to
# 8 tokens on one x grouped (QWENC_CUDA_MVQ_BATCH_TOK) and the DeltaNet's convolution, q, k, v, norms and gate as one
# kernel (QWENC_CUDA_GDN_PREP_N), each off and both, against both on. Each step fits a call where calls are limited
# to 10 minutes.
#
# Each of these has been timed once (docs/BENCH.md, "The paths that waited, timed"); the steps repeat those
# comparisons on another machine or after a change, beside the numbers of docs/BENCH.md's tables of defaults (H100:
# cut Q4_K pp512 19,856-20,085, tg128 809; whole with 192 experts pp4096 3,931-3,954, tg32 after 4,096 tokens
# 154.7, 16 sessions 436.3).
#
#   bash tests/gpu/pending.sh [check] [split] [defaults] [mmq] [fast] [redux] [multi]    all seven when none is named
#
# ROUNDS (2) rounds of each set; FN: the bench options of the whole model (default: the whole Flash-Next at Q4_K,
# 111 GiB; on an 80 GiB GPU, '--backend cuda --synth flash-next --experts 192 --type q4_k'). Each step ends with a
# line saying how many comparisons or programs failed.
set -u
cd "$(dirname "$0")/../.." || exit 1
fn=${FN:-'--backend cuda --synth flash-next --type q4_k'}
cut='--backend cuda --synth flash-next --layers 8 --experts 64 --ngram-base 200003 --type q4_k'
q35='--backend cuda --synth qwen3.5-35b-a3b --type q4_k'
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(check split defaults mmq fast redux multi)
export QWENC=${QWENC:-build-cuda/qwenc} ROUNDS=${ROUNDS:-2}
fails=0

ab() { # a line naming the comparison, then ab.sh's table
    echo "== ab.sh $*"
    if ! bash tests/ab.sh "$@"; then
        echo "== failed: ab.sh $*"
        fails=$((fails + 1))
    fi
}

# the settings before this round's defaults
old='QWENC_CUDA_DR_CHUNK=0 QWENC_CUDA_MMQ_UNROLL=0 QWENC_CUDA_ATT_QTILES=0 QWENC_CUDA_PAIRS_MAX=64'
old="$old QWENC_CUDA_ATT_ROWS=0 QWENC_CUDA_ATT_SPLIT=1 QWENC_CUDA_QSA_SPLIT=1"

for step in "${steps[@]}"; do
    case $step in
        check)
            bash tests/gpu_check.sh t_cuda_quant_loop t_cuda_ops t_model t_model_switches t_session \
                t_session_switches t_mtp || fails=$((fails + 1))
            ;;
        split | defaults | mmq | fast | redux | multi)
            if [ ! -x "$QWENC" ]; then
                echo "pending.sh: $QWENC is not there: run the check step (or make cuda) first" >&2
                exit 1
            fi
            ;;&
        split)
            # a block a head against split 16 ways from the first key, 32 tokens decoded after D of context
            for d in 128 384 768 1536; do
                # shellcheck disable=SC2086
                ab 'QWENC_CUDA_ATT_SPLIT=1' 'QWENC_CUDA_ATT_SPLIT_MIN=0' -- $cut -p 0 -n 32 -d $d
            done
            for d in 384 1536; do
                # shellcheck disable=SC2086
                ab 'QWENC_CUDA_ATT_SPLIT=1' 'QWENC_CUDA_ATT_SPLIT_MIN=0' -- $q35 -p 0 -n 32 -d $d
            done
            # the split count (16 by default) deep in a conversation, with the merge's weights taken once a head
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_ATT_SPLIT=32' 'QWENC_CUDA_ATT_SPLIT=64' -- $fn -p 0 -n 32 -d 4096
            # shellcheck disable=SC2086
            ab - 'QWENC_CUDA_ATT_SPLIT=32' 'QWENC_CUDA_ATT_SPLIT=64' -- $q35 -p 0 -n 32 -d 16384
            ;;
        defaults)
            # shellcheck disable=SC2086
            ab "$old" - -- $cut -p 512 -n 128
            # shellcheck disable=SC2086
            ab "$old" - -- $fn -p 4096 -n 32
            # shellcheck disable=SC2086
            ab "$old" - -- $fn -p 0 -n 32 -d 4096
            # shellcheck disable=SC2086
            ab "$old" - -- $fn -p 0 -n 16 -np 16
            # shellcheck disable=SC2086
            ab "$old" - -- $q35 -p 4096 -n 32
            ;;
        mmq)
            # prompts as they were; then with the MoE's rows rounded before they are gathered, the integer GEMM
            # skipping a warp's empty n tiles (an expert's part-filled last token tile) and the products taking
            # their input's rounding from its writer or the batch's first job; then also attention's tiles copied
            # a stage ahead: the default. Then decode deep in a conversation with attention's copies in place.
            for o in "$fn -p 4096" "$q35 -p 4096" "$cut -p 512"; do
                # shellcheck disable=SC2086
                ab 'QWENC_CUDA_MMQ_SKIP=0 QWENC_CUDA_MOE_GATHER_Q8=0 QWENC_CUDA_Q8_BIG=0 QWENC_CUDA_ATT_ASYNC=0' \
                    'QWENC_CUDA_ATT_ASYNC=0' - -- $o -n 0
            done
            # shellcheck disable=SC2086
            ab 'QWENC_CUDA_ATT_ASYNC=0' - -- $fn -p 0 -n 32 -d 4096
            ;;
        fast)
            # the integer GEMM's terms as fused multiply-adds (QWENC_CUDA_MMQ_FAST=1; opt-in)
            for o in "$fn -p 4096" "$q35 -p 4096" "$cut -p 512"; do
                # shellcheck disable=SC2086
                ab - 'QWENC_CUDA_MMQ_FAST=1' -- $o -n 0
            done
            ;;
        redux)
            # the routing's rounds by the warp's reductions against the butterfly, decode on three models
            # shellcheck source=tests/gpu/deps.sh
            . tests/gpu/deps.sh
            if ! make -j"${J:-16}" CUDA=1 BUILD=build-noredux build-noredux/qwenc CFLAGS="-O2 -g $dep_inc" \
                    LDFLAGS="$dep_ldflags" NVCCFLAGS="-O3 -g -lineinfo -DQWC_MOE_ROUTE_REDUX=0" \
                    >build-noredux.log 2>&1; then
                tail -n 20 build-noredux.log
                fails=$((fails + 1))
            else
                for o in "$fn -p 0 -n 32" "$cut -p 0 -n 128" "$q35 -p 0 -n 32"; do
                    echo "== $o"
                    for r in $(seq "$ROUNDS"); do
                        for b in build-noredux build-cuda; do
                            # shellcheck disable=SC2086
                            line=$("$b/qwenc" bench $o -r 1 2>/dev/null | grep -E '\| +tg[0-9]+ ') ||
                                fails=$((fails + 1))
                            echo "$b round $r: $line"
                        done
                    done
                done
            fi
            ;;
        multi)
            # draft steps of 2 and 4 tokens (a random MTP head) and 4 sessions a step, the whole model and the cut
            off='QWENC_CUDA_MVQ_BATCH_TOK=0 QWENC_CUDA_GDN_PREP_N=0'
            for o in "$fn --mtp -p 0 -n 32 --draft 1,3" "$fn -p 0 -n 32 -np 4" "$cut --mtp -p 0 -n 128 --draft 1,3"; do
                # shellcheck disable=SC2086
                ab "$off" 'QWENC_CUDA_MVQ_BATCH_TOK=0' 'QWENC_CUDA_GDN_PREP_N=0' - -- $o
            done
            ;;
        *) echo "pending.sh: no step '$step' (check, split, defaults, mmq, fast, redux, multi)" >&2; exit 1 ;;
    esac
    echo "== step $step done, $fails failed so far"
done
[ "$fails" -eq 0 ]
