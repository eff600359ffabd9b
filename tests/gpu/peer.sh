#!/usr/bin/env bash
# qwenc beside llama.cpp's CUDA build on the same GGUF files, in the same run (the CUDA issue's speed peer): builds
# llama-bench from a llama.cpp source tree (CUDA, this GPU's architecture, flash attention off as in the issue's
# reference numbers), writes the Flash-Next cut (8 layers, 64 experts) at each type with `qwenc synth`, and prints
# both tools' pp512 / tg128 lines for each file. Needs cmake, ninja and the CUDA toolkit; qwenc's build-cuda/.
#
#   LLAMA_SRC=DIR bash tests/gpu/peer.sh [TYPE ...]        (default: Q8_0 BF16 Q4_K)
#
# LLAMA_SRC: a llama.cpp tree, e.g. the git bundle in the npm package node-llama-cpp (package/llama/
# gitRelease.bundle: git clone it). Only ggml's CPU and CUDA backends, src, common and tools/llama-bench are built;
# a tools/CMakeLists.txt that adds only llama-bench keeps the rest of tools/ out. MODELS: where the files go
# (default /tmp/peer-models; the three cuts take 18 GB). ARCH: CUDA architectures (default 90a).
set -u
cd "$(dirname "$0")/../.."
: "${LLAMA_SRC:?set LLAMA_SRC to a llama.cpp source tree}"
Q=${QWENC:-build-cuda/qwenc}
M=${MODELS:-/tmp/peer-models}
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(Q8_0 BF16 Q4_K)
[ -x "$Q" ] || { echo "peer: $Q missing (make cuda first)"; exit 1; }
b="$LLAMA_SRC/build-peer"
if [ ! -x "$b/bin/llama-bench" ]; then
    cmake -S "$LLAMA_SRC" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90a}" -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON -DGGML_CCACHE=OFF >"$b.log" 2>&1 &&
        cmake --build "$b" --target llama-bench -j "$(nproc)" >>"$b.log" 2>&1 ||
        { tail -n 30 "$b.log"; echo "peer: the llama.cpp build failed ($b.log)"; exit 1; }
fi
mkdir -p "$M"
for t in "${types[@]}"; do
    f="$M/cut-$t.gguf"
    [ -s "$f" ] || "$Q" synth --preset flash-next --layers 8 --experts 64 --ngram-base 200003 --type "$t" -o "$f" \
        >/dev/null || { echo "peer: qwenc synth $t failed"; exit 1; }
    echo "== $f"
    "$b/bin/llama-bench" -m "$f" -ngl 99 -fa 0 -p 512 -n 128 -r 3 -o md 2>&1 | grep -E '^\| [^-m]' | tail -n 2
    "$Q" bench -m "$f" --backend cuda -p 512 -n 128 -r 3 2>&1 | grep -E '^\|' | tail -n 2
done
