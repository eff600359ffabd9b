#!/usr/bin/env bash
# Hostile inputs through the CLI as a user meets them: absurd numbers in config.json and in GGUF metadata,
# special files in place of the model's files. Each must end with a message naming the file and the field
# (or the file and its kind) and exit 1: no abort, no sanitizer report, no wait on a FIFO. The library side
# of each, and out-of-memory, is tests/t_hostile.c.
source "$(dirname "$0")/lib_cli.sh"
T_HOSTILE=$BUILD/tests/t_hostile

# a copy of fixture $1 in $tmp/m whose config.json has field $2 set to the JSON value $3
with() {
    rm -rf "$tmp/m"; cp -r "tests/fixtures/$1" "$tmp/m"
    python3 - "$tmp/m/config.json" "$2" "$3" <<'EOF'
import json, sys
p, k, v = sys.argv[1:]
c = json.load(open(p))
c[k] = json.loads(v)
json.dump(c, open(p, "w"))
EOF
}

# --- config.json: the inputs found by hand (an abort on out of memory, signed overflows) and their kin
with llama num_hidden_layers 1000000000
expect_error "1e9 layers" '/m/config.json: "num_hidden_layers" is 1000000000, expected 1..1024' $QWENC info -m "$tmp/m"
with qwen4_exp heads_per_ngram 2147483647
expect_error "heads_per_ngram" '/m/config.json: "heads_per_ngram" is 2147483647, expected 1..64' $QWENC info -m "$tmp/m"
with qwen4_exp indexer_n_heads 2147483647
expect_error "indexer_n_heads" '"indexer_n_heads" is 2147483647, expected 1..1024' $QWENC info -m "$tmp/m"
for v in 0 -1; do
    with llama max_position_embeddings $v
    expect_error "context $v" "\"max_position_embeddings\" is $v, expected 1..1073741824" $QWENC info -m "$tmp/m"
done
with qwen3_5 linear_value_head_dim 1e300
expect_error "1e300" '"linear_value_head_dim" is 1e+300, expected 1..1024' $QWENC info -m "$tmp/m"
with qwen3_next num_experts_per_tok 9
expect_error "top-k past the experts" '"num_experts_per_tok" is 9, expected 1..8' $QWENC info -m "$tmp/m"

# --- files that are not regular files: refused at once (timeout: a FIFO would otherwise block open())
with llama vocab_size 256
rm "$tmp/m/config.json"; ln -s /dev/zero "$tmp/m/config.json"
expect_error "config.json -> /dev/zero" "/m/config.json: not a regular file (a character device)" \
    timeout 60 $QWENC info -m "$tmp/m"
rm "$tmp/m/config.json"; mkfifo "$tmp/m/config.json"
expect_error "config.json a FIFO" "/m/config.json: not a regular file (a FIFO)" timeout 60 $QWENC info -m "$tmp/m"
with llama vocab_size 256
rm "$tmp/m/model.safetensors"; mkfifo "$tmp/m/model.safetensors"
expect_error "model.safetensors a FIFO" "/m/model.safetensors: not a regular file (a FIFO)" \
    timeout 60 $QWENC info -m "$tmp/m"
mkdir "$tmp/tok"; mkfifo "$tmp/tok/tokenizer.json"
expect_error "tokenizer.json a FIFO" "/tok/tokenizer.json: not a regular file (a FIFO)" \
    timeout 60 $QWENC tokenize -m "$tmp/tok" hello

# --- GGUF metadata: a fixture written as GGUF, one key changed (t_hostile --gguf-set)
if $QWENC quantize -m tests/fixtures/qwen4_exp -t F32 -o "$tmp/base.gguf" >/dev/null 2>"$tmp/err"; then
    ok
    while IFS='|' read -r key type val want; do
        if "$T_HOSTILE" --gguf-set "$tmp/base.gguf" "$tmp/bad.gguf" "$key" "$type" "$val" 2>"$tmp/err"; then
            expect_error "GGUF $key = $val" "bad.gguf: metadata key '$key' is $want" $QWENC info -m "$tmp/bad.gguf"
        else
            bad "writing $key: $(cat "$tmp/err")"
        fi
    done <<'EOF'
qwen4exp.ple.heads_per_ngram|u32|2147483647|2147483647, expected 1..64
qwen4exp.attention.indexer.head_count|u32|2147483647|2147483647, expected 1..1024
qwen4exp.block_count|u32|1000000000|1000000000, expected 1..1024
qwen4exp.context_length|u32|0|0, expected 1..1073741824
qwen4exp.expert_count|u64|18446744073709551615|1.84467440737096e+19, expected 1..4096
EOF
else
    bad "quantize F32: $(cat "$tmp/err")"
fi
finish
