#!/usr/bin/env bash
# The GPU tests, on a machine with an NVIDIA GPU and the CUDA toolkit: builds the CUDA backend (make cuda) and
# runs its tests: every weight kernel (tests/gpu/t_cuda_quant; t_cuda_quant_loop: again with the integer GEMM's
# group loop not unrolled, QWENC_CUDA_MMQ_UNROLL=0; t_cuda_quant_fast: with its terms as fused multiply-adds,
# QWENC_CUDA_MMQ_FAST=1, within the matrix-vector bound) and every op (tests/gpu/t_cuda_ops) against the
# CPU reference, every fixture's logits on the GPU against transformers (t_model --backend cuda: the CPU's
# tolerance; t_model_switches: again with the other paths, every delta rule of a call in its chunked form, dense
# prompt attention a query a block, the MoE's rows as pairs up to 1,024 of them, decode attention split along the
# keys from the first key and QSA selection a block a query, QWENC_CUDA_DR_CHUNK=1 QWENC_CUDA_ATT_QTILES=0
# QWENC_CUDA_PAIRS_MAX=1024 QWENC_CUDA_ATT_SPLIT_MIN=0 QWENC_CUDA_QSA_SPLIT=1 QWENC_CUDA_MMQ_UNROLL=0), snapshots,
# batched steps and draft steps on the GPU (t_session --backend cuda: their bits; t_session_switches: again with the
# MoE rows as pairs and decode attention split from the first key, QWENC_CUDA_PAIRS_MAX=1024
# QWENC_CUDA_ATT_SPLIT_MIN=0 QWENC_CUDA_QSA_SPLIT=8), the MTP
# draft head against its reference and speculative greedy decoding with it (t_mtp --backend cuda), and
# the text commands end to end (cli_text.sh: greedy text equal to transformers' on the bundled model), qwenc
# choosing the GPU by itself (--backend auto), the n-gram table read from host memory against the table on the
# device (tests/gpu/ple_host.sh), and the GPU against the CPU on random models of the two presets'
# geometry (tests/gpu/synth_check.sh), the fused paths' logits bit for bit against a build without them
# (tests/gpu/fusions.sh, build-unfused/), and the experts spread over GPUs against one (tests/gpu/split.sh).
# `make test` does not run this: it compiles the CUDA sources where nvcc exists, and the GPU tests say SKIP
# without a device.
#
#   bash tests/gpu_check.sh                 everything
#   bash tests/gpu_check.sh t_cuda_ops      only the programs named
# DEPS=DIR: a prefix holding the build's libraries and headers (DIR/usr/include, DIR/usr/lib/x86_64-linux-gnu)
# when the machine has them only unpacked there. -j: parallel jobs of the build (default: every core).
set -u
cd "$(dirname "$0")/.."
J=${J:-$(nproc)}
. tests/gpu/deps.sh
# NCCL from the nvidia-nccl Python wheel where neither the toolkit nor the system has it (docs/SCALE.md)
nvcc_dir=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
if [ -z "${NCCL_HOME:-}" ] && [ ! -f "$nvcc_dir/../include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    wheel=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)
    if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
        export NCCL_HOME=$wheel
        echo "gpu_check: NCCL from $wheel"
    fi
fi
flags=()
[ -n "${DEPS:-}" ] && flags=(CFLAGS="-O2 -g $dep_inc" LDFLAGS="$dep_ldflags")
if ! make -j"$J" cuda "${flags[@]}" >build-cuda.log 2>&1; then
    tail -n 40 build-cuda.log
    echo "gpu_check: make cuda failed (build-cuda.log)"
    echo "0 passed, 1 failed"
    exit 1
fi
progs=("$@")
[ ${#progs[@]} -eq 0 ] && progs=(t_cuda_quant t_cuda_quant_loop t_cuda_quant_fast t_cuda_ops t_model t_model_switches t_session t_session_switches t_mtp cli_text determinism ple_host synth_check fusions split)
total_pass=0; total_fail=0
for p in "${progs[@]}"; do
    echo "== $p"
    case $p in
        t_model) out=$(build-cuda/tests/t_model --backend cuda 2>&1) ;;
        t_cuda_quant_loop) out=$(QWENC_CUDA_MMQ_UNROLL=0 build-cuda/tests/gpu/t_cuda_quant 2>&1) ;;
        t_cuda_quant_fast) out=$(QWENC_CUDA_MMQ_FAST=1 build-cuda/tests/gpu/t_cuda_quant 2>&1) ;;
        t_model_switches)
            out=$(QWENC_CUDA_DR_CHUNK=1 QWENC_CUDA_ATT_QTILES=0 QWENC_CUDA_PAIRS_MAX=1024 QWENC_CUDA_ATT_SPLIT_MIN=0 \
                QWENC_CUDA_QSA_SPLIT=1 QWENC_CUDA_MMQ_UNROLL=0 build-cuda/tests/t_model --backend cuda 2>&1) ;;
        t_session) out=$(build-cuda/tests/t_session --backend cuda 2>&1) ;;
        t_session_switches)
            out=$(QWENC_CUDA_PAIRS_MAX=1024 QWENC_CUDA_ATT_SPLIT_MIN=0 QWENC_CUDA_QSA_SPLIT=8 \
                build-cuda/tests/t_session --backend cuda 2>&1) ;;
        t_mtp) out=$(build-cuda/tests/t_mtp --backend cuda 2>&1) ;;
        cli_*) out=$(QWENC=build-cuda/qwenc BUILD=build-cuda bash "tests/$p.sh" 2>&1) ;;
        determinism) out=$(QWENC=build-cuda/qwenc bash tests/gpu/determinism.sh 2>&1) ;;
        ple_host) out=$(QWENC=build-cuda/qwenc bash tests/gpu/ple_host.sh 2>&1) ;;
        split) out=$(QWENC=build-cuda/qwenc bash tests/gpu/split.sh 2>&1) ;;
        synth_check) out=$(QWENC=build-cuda/qwenc BUILD=build-cuda bash tests/gpu/synth_check.sh 2>&1) ;;
        fusions) out=$(bash tests/gpu/fusions.sh 2>&1) ;;
        *) out=$("build-cuda/tests/gpu/$p" 2>&1) ;;
    esac
    rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then echo "ERROR: $p ended (exit $rc) without a summary line"; total_fail=$((total_fail + 1)); continue; fi
    total_pass=$((total_pass + $(echo "$line" | cut -d' ' -f1)))
    total_fail=$((total_fail + $(echo "$line" | cut -d' ' -f3)))
done
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
