#!/usr/bin/env bash
# make_llama_refs.sh LLAMA - llama.cpp's own logits on quantized GGUFs of the fixtures, for
# tests/cli_llama_ref.sh (which has no llama.cpp to run).
#
# For each fixture llama.cpp runs exactly (tests/fixtures/FX, docs/GGUF.md) and each type, `qwenc quantize`
# writes the GGUF, build/llama_logits runs it (all tokens in one batch, F32 KV cache, flash attention off,
# no AMX repacking) and the logits go to tests/fixtures/FX/llama_TYPE.f32; tests/fixtures/llama_refs.txt
# gets "FX TYPE SHA256-OF-THE-GGUF", so the test knows it quantizes the very file llama.cpp saw.
# LLAMA: a llama.cpp source tree whose CPU build is in LLAMA/build (node-llama-cpp 3.22.1's bundle).
set -euo pipefail
cd "$(dirname "$0")/../.."
LLAMA=${1:?usage: tests/gen/make_llama_refs.sh LLAMA_SOURCE_DIR}
make -s build/qwenc
cc -O2 -std=c11 -o build/llama_logits tests/gen/llama_logits.c -I"$LLAMA/include" -I"$LLAMA/ggml/include" \
   -L"$LLAMA/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA/build/bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=tests/fixtures/llama_refs.txt
echo "# fixture type sha256 of the qwenc-quantized GGUF (tests/gen/make_llama_refs.sh)" >"$out"
for fx in llama qwen3 qwen3_5 qwen3_5_moe; do
    for ty in Q8_0 Q4_K; do
        build/qwenc quantize -m tests/fixtures/$fx --type $ty -o "$tmp/q.gguf" 2>/dev/null
        build/llama_logits "$tmp/q.gguf" "$(cat tests/fixtures/$fx/tokens.txt)" tests/fixtures/$fx/llama_$ty.f32 >/dev/null
        echo "$fx $ty $(sha256sum "$tmp/q.gguf" | cut -d' ' -f1)" >>"$out"
    done
done
cat "$out"
