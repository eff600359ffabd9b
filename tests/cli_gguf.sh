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
    if ! $QWENC quantize -m "$d" --type F32 -o "$tmp/$name.gguf" 2>"$tmp/err"; then
        bad "$name: quantize --type F32 failed: $(tail -c 300 "$tmp/err")"; continue
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
if $QWENC quantize -m "$tmp/qwen4_exp.gguf" --type Q8_0 -o "$tmp/q8.gguf" 2>"$tmp/err"; then
    out=$($QWENC info -m "$tmp/q8.gguf" 2>&1)
    case "$out" in *q8_0*f32*|*f32*q8_0*) ok ;; *) bad "Q8_0 file: info shows no q8_0 and f32 tensors";; esac
    toks=$(cat tests/fixtures/qwen4_exp/tokens.txt)
    $QWENC logits -m "$tmp/q8.gguf" --tokens "$toks" --out "$tmp/q.f32" 2>"$tmp/err" && ok \
        || bad "logits of a Q8_0 GGUF: $(cat "$tmp/err")"
else
    bad "quantize a GGUF to Q8_0: $(tail -c 300 "$tmp/err")"
fi
$QWENC quantize -m tests/fixtures/llama --type q4_k -o "$tmp/q4.gguf" 2>"$tmp/err" && ok || bad "lower-case type name"

# --- the bundled model's GGUF carries its tokenizer: run, tokenize, detokenize and chat-template read it
# from the file alone and agree with the checkpoint directory byte for byte
mkdir -p "$tmp/tf"
if $QWENC quantize -m models/tiny-flash --type F32 -o "$tmp/tf/m.gguf" 2>"$tmp/err"; then
    a=$($QWENC run -m models/tiny-flash -p "And it came to pass" -n 12 --temp 0 --no-display-prompt 2>/dev/null)
    b=$($QWENC run -m "$tmp/tf/m.gguf" -p "And it came to pass" -n 12 --temp 0 --no-display-prompt 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "run: the GGUF generates '$b', the checkpoint '$a'"
    # the corpus of the tokenizer tests as one text (invalid UTF-8 included), part of its 100 KB case, and
    # NFC text that must round-trip
    head -n 150 tests/tokenizers/long_100k.txt >"$tmp/long.txt"
    head -n 60 tests/fixtures/tiny-flash/valid.txt >"$tmp/kjv.txt"
    for f in tests/tokenizers/cases.txt "$tmp/long.txt" "$tmp/kjv.txt"; do
        $QWENC tokenize -m models/tiny-flash --file "$f" >"$tmp/ids_dir" 2>"$tmp/err" || bad "tokenize $f: $(cat "$tmp/err")"
        $QWENC tokenize -m "$tmp/tf/m.gguf" --file "$f" >"$tmp/ids_gguf" 2>"$tmp/err" || bad "tokenize $f (gguf): $(cat "$tmp/err")"
        [ -s "$tmp/ids_dir" ] && cmp -s "$tmp/ids_dir" "$tmp/ids_gguf" && ok || bad "tokenize $f: the GGUF's ids differ"
        if $QWENC detokenize -m "$tmp/tf/m.gguf" "$(cat "$tmp/ids_gguf")" >"$tmp/text_gguf" 2>"$tmp/err" &&
            $QWENC detokenize -m models/tiny-flash "$(cat "$tmp/ids_dir")" >"$tmp/text_dir" 2>"$tmp/err"; then
            [ -s "$tmp/text_dir" ] && cmp -s "$tmp/text_dir" "$tmp/text_gguf" && ok || bad "detokenize $f: the GGUF's text differs"
        else
            bad "detokenize $f: $(cat "$tmp/err")"
        fi
    done
    cmp -s "$tmp/kjv.txt" "$tmp/text_gguf" && ok || bad "detokenize(tokenize(text)) with the GGUF is not the text"
    req='{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who was Moses?"}]}'
    echo "$req" >"$tmp/req.json"
    a=$($QWENC chat-template -m models/tiny-flash --request "$tmp/req.json" --add-generation-prompt 2>&1)
    b=$($QWENC chat-template -m "$tmp/tf/m.gguf" --request "$tmp/req.json" --add-generation-prompt 2>&1)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "chat-template: the GGUF's template renders '$b', the checkpoint's '$a'"
    # --tokenizer DIR comes before the file's own tokenizer
    a=$($QWENC tokenize -m "$tmp/tf/m.gguf" --tokenizer tests/tokenizers/qwen3 "Hello world" 2>&1)
    [ "$a" = "9707,1879" ] && ok || bad "--tokenizer DIR with a GGUF: got '$a', want the Qwen3 ids 9707,1879"
else
    bad "quantize the bundled model: $(tail -c 300 "$tmp/err")"
fi
# a GGUF written without a tokenizer (a checkpoint without tokenizer.json): tokenizer.json beside it, else an error
expect_error "gguf without tokenizer" "qwen3.gguf has no tokenizer" $QWENC tokenize -m "$tmp/qwen3.gguf" "Hello"
mkdir -p "$tmp/bare"
cp "$tmp/qwen3.gguf" "$tmp/bare/m.gguf" && cp tests/tokenizers/qwen3/tokenizer.json "$tmp/bare/"
a=$($QWENC tokenize -m "$tmp/bare/m.gguf" "Hello world" 2>&1)
[ "$a" = "9707,1879" ] && ok || bad "a GGUF without a tokenizer reads tokenizer.json beside it: got '$a'"
# a checkpoint whose tokenizer llama.cpp cannot run is refused, naming why, and no file is left
mkdir -p "$tmp/spm"
cp tests/fixtures/llama/config.json "$tmp/spm/" && ln -s "$PWD/tests/fixtures/llama/model.safetensors" "$tmp/spm/"
cp tests/tokenizers/spm_bpe/tokenizer.json "$tmp/spm/"
expect_error "unwritable tokenizer" "cannot be written as a llama.cpp GGUF tokenizer" \
    $QWENC quantize -m "$tmp/spm" --type F32 -o "$tmp/spm.gguf"
[ ! -e "$tmp/spm.gguf" ] && ok || bad "a file was left after refusing the tokenizer"

# --- bad input
expect_error "unknown type" "one of F32, F16, BF16" $QWENC quantize -m tests/fixtures/qwen3 --type Q3_K -o "$tmp/x.gguf"
[ ! -e "$tmp/x.gguf" ] && ok || bad "a file was left for an unknown type"
expect_error "no type" "the type is required: --type TYPE" $QWENC quantize -m tests/fixtures/qwen3 -o "$tmp/x.gguf"
expect_error "no output" "-o OUT.gguf is required" $QWENC quantize -m tests/fixtures/qwen3 --type F16
expect_error "overwrite input" "overwrite" $QWENC quantize -m "$tmp/qwen3.gguf" --type F16 -o "$tmp/qwen3.gguf"
printf 'GGUF\003\000\000\000' >"$tmp/trunc.gguf"
expect_error "truncated gguf" "trunc.gguf" $QWENC info -m "$tmp/trunc.gguf"
head -c 4096 "$tmp/qwen3.gguf" >"$tmp/cut.gguf"
expect_error "cut gguf" "cut.gguf" $QWENC logits -m "$tmp/cut.gguf" --tokens 1,2 --out "$tmp/l.f32"
echo "not a gguf" >"$tmp/text.gguf"
expect_error "not a gguf" "text.gguf" $QWENC info -m "$tmp/text.gguf"

finish
