#!/usr/bin/env bash
# End-to-end tests of `qwenc info` and `qwenc logits` as a user runs them, and of the errors bad input
# must give: a message naming the file / tensor / field at fault and a non-zero exit, never a crash.
source "$(dirname "$0")/lib_cli.sh"

# --- info: what a user reads
out=$($QWENC info --model tests/fixtures/qwen4_exp 2>&1)
for want in "architecture qwen4_exp" "layer plan   D" "DD+pleDS" "qsa          indexer 2 heads x 16, budget 8" \
            "ple n-gram table" "routed experts" "bf16"; do
    case "$out" in *"$want"*) ok ;; *) bad "info qwen4_exp lacks '$want'";; esac
done
out=$($QWENC info -m tests/fixtures/qwen3_next 2>&1)
case "$out" in *"4 safetensors files"*) ok ;; *) bad "info qwen3_next: shard count";; esac
case "$out" in *"DD+mlpDA"*) ok ;; *) bad "info qwen3_next: layer plan with the dense layer";; esac
out=$($QWENC info -m tests/fixtures/qwen4_exp_vlm 2>&1)
case "$out" in *"mtp draft head"*) ok ;; *) bad "info qwen4_exp_vlm: mtp tensors";; esac
case "$out" in *'prefix "model.language_model."'*) ok ;; *) bad "info qwen4_exp_vlm: prefix";; esac

# --- logits in both --batch modes, every fixture, against the transformers reference
for d in tests/fixtures/*/; do
    d=${d%/}; name=$(basename "$d")
    [ -f "$d/logits_full.f32" ] || continue
    mdir=$d; [ -f "$d/model.txt" ] && mdir=$(cat "$d/model.txt")
    toks=$(cat "$d/tokens.txt"); n=$(echo "$toks" | tr ',' '\n' | grep -c .)
    vocab=$(( $(stat -c %s "$d/logits_full.f32") / 4 / n ))
    for mode in full decode; do
        extra=(); [ $mode = decode ] && extra=(--batch 1)
        if $QWENC logits --model "$mdir" --tokens "$toks" --out "$tmp/l.f32" "${extra[@]}" 2>"$tmp/err"; then
            if [ "$(stat -c %s "$tmp/l.f32")" -ne $((n * vocab * 4)) ]; then bad "$name $mode: output size"
            elif "$T_MODEL" --compare "$tmp/l.f32" "$d/logits_$mode.f32" "$vocab" >"$tmp/cmp"; then ok
            else bad "$name $mode: $(cat "$tmp/cmp")"; fi
        else
            bad "$name $mode: qwenc logits failed: $(cat "$tmp/err")"
        fi
    done
done

# --- a Q8_0 GGUF: the SIMD integer kernels (8-bit activations, kernels/q8a.h) give the logits of the scalar
# integer reference (rel L2 < 1e-4: the same integer products, only the f32 additions are ordered differently)
$QWENC quantize -m tests/fixtures/qwen3_5_moe --type Q8_0 -o "$tmp/q8.gguf" >/dev/null 2>&1 && ok || bad "quantize Q8_0"
toks=$(cat tests/fixtures/qwen3_5_moe/tokens.txt)
$QWENC logits -m "$tmp/q8.gguf" --kernels scalar --tokens "$toks" --out "$tmp/ref.f32" 2>/dev/null &&
$QWENC logits -m "$tmp/q8.gguf" --tokens "$toks" --out "$tmp/simd.f32" 2>/dev/null &&
"$T_MODEL" --compare "$tmp/simd.f32" "$tmp/ref.f32" 256 >"$tmp/cmp" && ok || bad "Q8_0 kernels vs reference: $(cat "$tmp/cmp")"
# with --f32-act the quantized weights meet f32 activations: the SIMD kernels give the exact reference's
# logits (rel L2 < 1e-4), and those differ from the 8-bit path (this random model magnifies rounding)
$QWENC logits -m "$tmp/q8.gguf" --kernels ref --tokens "$toks" --out "$tmp/exact.f32" 2>/dev/null &&
$QWENC logits -m "$tmp/q8.gguf" --f32-act --tokens "$toks" --out "$tmp/f32act.f32" 2>/dev/null &&
"$T_MODEL" --compare "$tmp/f32act.f32" "$tmp/exact.f32" 256 >"$tmp/cmp" && ok || bad "--f32-act vs reference: $(cat "$tmp/cmp")"
"$T_MODEL" --compare "$tmp/simd.f32" "$tmp/exact.f32" 256 >/dev/null && bad "8-bit activations equal the f32 reference" || ok

# --- bad input
q3=tests/fixtures/qwen3
mk() { rm -rf "$tmp/m"; cp -r "$1" "$tmp/m"; }
expect_error "no such dir" "cannot open" $QWENC info -m "$tmp/nowhere"
mk $q3; sed -i 's/"model_type": "qwen3"/"model_type": "qwen9"/' "$tmp/m/config.json"
expect_error "unknown model_type" 'config.json: field "model_type": unknown model_type "qwen9"' $QWENC info -m "$tmp/m"
mk $q3; head -c 200 $q3/config.json >"$tmp/m/config.json"
expect_error "broken config JSON" "config.json: not a valid JSON object" $QWENC info -m "$tmp/m"
mk $q3; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' "$tmp/m/config.json"
expect_error "missing tensor" "tensor 'model.layers.3.input_layernorm.weight' is missing" $QWENC info -m "$tmp/m"
mk $q3; sed -i 's/"intermediate_size": 96/"intermediate_size": 100/' "$tmp/m/config.json"
expect_error "wrong shape" "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], expected [100, 64]" $QWENC info -m "$tmp/m"
mk $q3; sed -i 's/"hidden_size": 64/"hidden_size": "64"/' "$tmp/m/config.json"
expect_error "field type" 'field "hidden_size": expected an integer' $QWENC info -m "$tmp/m"
mk $q3; size=$(stat -c %s $q3/model.safetensors); head -c $((size - 100)) $q3/model.safetensors >"$tmp/m/model.safetensors"
expect_error "truncated safetensors" "the file is truncated" $QWENC info -m "$tmp/m"
mk $q3; head -c 1000 $q3/model.safetensors >"$tmp/m/model.safetensors"
expect_error "header cut" "header length" $QWENC info -m "$tmp/m"
mk $q3; printf '}' | dd of="$tmp/m/model.safetensors" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_error "broken header JSON" "model.safetensors: the header is not a valid JSON object" $QWENC info -m "$tmp/m"
mk tests/fixtures/qwen3_next; rm "$tmp/m/model-00002-of-00004.safetensors"
expect_error "missing shard" "model-00002-of-00004.safetensors: cannot open" $QWENC info -m "$tmp/m"
mk tests/fixtures/qwen4_exp; sed -i 's/"ngram_vocab_size_base": 1000/"ngram_vocab_size_base": 1010/' "$tmp/m/config.json"
expect_error "PLE buffers disagree" "ple.ple_embedding.ngram_heads_vocab_sizes'[0] = 1009 but the config gives 1013" $QWENC info -m "$tmp/m"
mk tests/fixtures/qwen4_exp; sed -i 's/"seed": 1234/"seed": 99/' "$tmp/m/config.json"
expect_error "PLE seed" "layer_multipliers'[0]" $QWENC info -m "$tmp/m"
mk tests/fixtures/qwen4_exp; sed -i 's/"indexer_kv_heads": 1/"indexer_kv_heads": 2/' "$tmp/m/config.json"
expect_error "QSA validation" 'field "indexer_kv_heads": must be 1' $QWENC info -m "$tmp/m"
expect_error "token out of range" "token 256 at index 1 is outside the vocabulary [0, 256)" \
    $QWENC logits -m $q3 --tokens 1,256 --out "$tmp/x.f32"
expect_error "bad token list" "--tokens" $QWENC logits -m $q3 --tokens 1,x --out "$tmp/x.f32"
expect_error "bad batch" "--batch expects an integer >= 1" $QWENC logits -m $q3 --tokens 1 --batch 0 --out "$tmp/x.f32"
expect_error "unwritable output" "cannot write" $QWENC logits -m $q3 --tokens 1,2 --out "$tmp/nodir/x.f32"
expect_error "context" "exceed the session context of 2 tokens" $QWENC logits -m $q3 --tokens 1,2,3 --ctx 2 --out "$tmp/x.f32"
expect_error "unknown command" 'unknown command "frobnicate"' $QWENC frobnicate

finish
