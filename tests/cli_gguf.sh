#!/usr/bin/env bash
# End-to-end tests of `qwenc quantize` and of the model commands given a .gguf instead of a checkpoint
# directory: the files a user writes, the progress shown, the logits read back, and the errors bad input gives.
source "$(dirname "$0")/lib_cli.sh"

# --- every fixture: checkpoint -> F32 GGUF -> logits equal to the transformers reference (both modes)
for d in tests/fixtures/*/; do
    d=${d%/}; name=$(basename "$d")
    [ -f "$d/config.json" ] || continue
    toks=$(cat "$d/tokens.txt"); n=$(echo "$toks" | tr ',' '\n' | grep -c .)
    vocab=$(( $(stat -c %s "$d/logits_full.f32") / 4 / n ))
    if ! $QWENC quantize -m "$d" -t F32 -o "$tmp/$name.gguf" 2>"$tmp/err"; then
        bad "$name: quantize -t F32 failed: $(tail -c 300 "$tmp/err")"; continue
    fi
    grep -q "100%" "$tmp/err" && grep -q "output" "$tmp/err" && ok || bad "$name: no progress shown on stderr"
    for mode in full decode; do
        extra=(); [ $mode = decode ] && extra=(--batch 1)
        if $QWENC logits -m "$tmp/$name.gguf" --tokens "$toks" --out "$tmp/l.f32" "${extra[@]}" 2>"$tmp/err"; then
            if "$T_MODEL" --compare "$tmp/l.f32" "$d/logits_$mode.f32" "$vocab" >"$tmp/cmp"; then ok
            else bad "$name gguf $mode: $(cat "$tmp/cmp")"; fi
        else
            bad "$name gguf $mode: qwenc logits failed: $(cat "$tmp/err")"
        fi
    done
done

# --- info on a GGUF; a quantized GGUF written from a GGUF; requantizing keeps the architecture
out=$($QWENC info -m "$tmp/qwen4_exp.gguf" 2>&1)
for want in "architecture qwen4_exp" "GGUF v3" "DD+pleDS" "routed experts" "f32"; do
    case "$out" in *"$want"*) ok ;; *) bad "info on a GGUF lacks '$want'";; esac
done
if $QWENC quantize -m "$tmp/qwen4_exp.gguf" -t Q8_0 -o "$tmp/q8.gguf" 2>"$tmp/err"; then
    out=$($QWENC info -m "$tmp/q8.gguf" 2>&1)
    case "$out" in *q8_0*f32*|*f32*q8_0*) ok ;; *) bad "Q8_0 file: info shows no q8_0 and f32 tensors";; esac
    toks=$(cat tests/fixtures/qwen4_exp/tokens.txt)
    $QWENC logits -m "$tmp/q8.gguf" --tokens "$toks" --out "$tmp/q.f32" 2>"$tmp/err" && ok \
        || bad "logits of a Q8_0 GGUF: $(cat "$tmp/err")"
else
    bad "quantize a GGUF to Q8_0: $(tail -c 300 "$tmp/err")"
fi
$QWENC quantize -m tests/fixtures/llama -t q4_k -o "$tmp/q4.gguf" 2>"$tmp/err" && ok || bad "lower-case type name"

# --- run and tokenize with a .gguf read the tokenizer beside it
mkdir -p "$tmp/tf"
if $QWENC quantize -m models/tiny-flash -t F32 -o "$tmp/tf/m.gguf" 2>"$tmp/err"; then
    cp models/tiny-flash/tokenizer.json models/tiny-flash/tokenizer_config.json "$tmp/tf/"
    a=$($QWENC run -m models/tiny-flash -p "And it came to pass" -n 12 --temp 0 2>/dev/null)
    b=$($QWENC run -m "$tmp/tf/m.gguf" -p "And it came to pass" -n 12 --temp 0 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "run: the GGUF generates '$b', the checkpoint '$a'"
else
    bad "quantize the bundled model: $(tail -c 300 "$tmp/err")"
fi

# --- bad input
expect_error "unknown type" "one of F32, F16, BF16" $QWENC quantize -m tests/fixtures/qwen3 -t Q3_K -o "$tmp/x.gguf"
[ ! -e "$tmp/x.gguf" ] && ok || bad "a file was left for an unknown type"
expect_error "no type" "-t TYPE is required" $QWENC quantize -m tests/fixtures/qwen3 -o "$tmp/x.gguf"
expect_error "no output" "-o OUT.gguf is required" $QWENC quantize -m tests/fixtures/qwen3 -t F16
expect_error "overwrite input" "overwrite" $QWENC quantize -m "$tmp/qwen3.gguf" -t F16 -o "$tmp/qwen3.gguf"
printf 'GGUF\003\000\000\000' >"$tmp/trunc.gguf"
expect_error "truncated gguf" "trunc.gguf" $QWENC info -m "$tmp/trunc.gguf"
head -c 4096 "$tmp/qwen3.gguf" >"$tmp/cut.gguf"
expect_error "cut gguf" "cut.gguf" $QWENC logits -m "$tmp/cut.gguf" --tokens 1,2 --out "$tmp/l.f32"
echo "not a gguf" >"$tmp/text.gguf"
expect_error "not a gguf" "text.gguf" $QWENC info -m "$tmp/text.gguf"

finish
