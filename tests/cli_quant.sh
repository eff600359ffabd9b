#!/usr/bin/env bash
# End-to-end tests of `--quant TYPE` (quantizing at load) on the bundled model and a fixture: the logits and
# the perplexity equal, bit for bit, those of the GGUF `qwenc quantize --type TYPE` writes from the same checkpoint;
# info shows the converted types; the other model commands accept the option; bad input gives named errors.
# (tests/t_load_quant.c compares the converted tensors with the file's byte for byte on every fixture.)
source "$(dirname "$0")/lib_cli.sh"

M=models/tiny-flash
toks=$(cat tests/fixtures/tiny-flash/tokens.txt)
for ty in Q8_0 Q4_K; do
    if ! $QWENC quantize -m $M --type $ty -o "$tmp/tf-$ty.gguf" 2>"$tmp/err"; then
        bad "quantize -t $ty: $(tail -c 300 "$tmp/err")"; continue
    fi
    $QWENC logits -m "$tmp/tf-$ty.gguf" --tokens "$toks" --out "$tmp/file.f32" 2>"$tmp/err" \
        || bad "logits of the $ty GGUF: $(cat "$tmp/err")"
    if $QWENC logits -m $M --quant $ty --tokens "$toks" --out "$tmp/load.f32" 2>"$tmp/err"; then
        cmp -s "$tmp/file.f32" "$tmp/load.f32" && ok || bad "tiny-flash --quant $ty: logits differ from the GGUF's"
        [ ! -s "$tmp/err" ] && ok || bad "--quant on a small model printed on stderr: $(head -c 300 "$tmp/err")"
    else
        bad "logits --quant $ty: $(cat "$tmp/err")"
    fi
done

# a fixture, token by token through the caches
d=tests/fixtures/qwen4_exp
ftoks=$(cat $d/tokens.txt)
$QWENC quantize -m $d --type Q4_K -o "$tmp/fx.gguf" 2>/dev/null &&
$QWENC logits -m "$tmp/fx.gguf" --tokens "$ftoks" --batch 1 --out "$tmp/file.f32" 2>/dev/null &&
$QWENC logits -m $d --quant q4_k --tokens "$ftoks" --batch 1 --out "$tmp/load.f32" 2>"$tmp/err" &&
cmp -s "$tmp/file.f32" "$tmp/load.f32" && ok || bad "qwen4_exp --quant q4_k --batch 1: logits differ ($(cat "$tmp/err"))"

# perplexity of a piece of the held-back text: the same numbers as the Q8_0 GGUF's
head -c 2500 tests/fixtures/tiny-flash/valid.txt >"$tmp/text.txt"
if $QWENC perplexity -m $M --quant Q8_0 -f "$tmp/text.txt" -c 128 >"$tmp/ppl-load" 2>"$tmp/err" &&
   $QWENC perplexity -m "$tmp/tf-Q8_0.gguf" --tokenizer $M -f "$tmp/text.txt" -c 128 >"$tmp/ppl-file" 2>/dev/null; then
    grep -q "^perplexity " "$tmp/ppl-load" && cmp -s "$tmp/ppl-load" "$tmp/ppl-file" && ok \
        || bad "perplexity --quant Q8_0 '$(cat "$tmp/ppl-load")', the GGUF's '$(cat "$tmp/ppl-file")'"
else
    bad "perplexity --quant Q8_0: $(tail -c 300 "$tmp/err")"
fi

# run, bench and info take the option; run generates the GGUF's text
cp $M/tokenizer.json $M/tokenizer_config.json "$tmp/"
a=$($QWENC run -m $M --quant Q8_0 -p "And it came to pass" -n 10 --temp 0 --no-display-prompt 2>/dev/null)
b=$($QWENC run -m "$tmp/tf-Q8_0.gguf" -p "And it came to pass" -n 10 --temp 0 --no-display-prompt 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "run --quant Q8_0 generates '$a', the GGUF '$b'"
$QWENC bench -m $M --quant Q4_K -p 8 -n 4 -r 1 --json >"$tmp/bench" 2>"$tmp/err" && grep -q '"tg' "$tmp/bench" && ok \
    || bad "bench --quant: $(tail -c 300 "$tmp/err")"
out=$($QWENC info -m $M --quant Q4_K 2>&1)
for want in "quantized    at load to Q4_K" "q4_K" "q6_K" "safetensors"; do
    case "$out" in *"$want"*) ok ;; *) bad "info --quant Q4_K lacks '$want'";; esac
done
case "$($QWENC info -m $M 2>&1)" in *quantized*|*q4_K*) bad "info without --quant shows quantized tensors";; *) ok;; esac
# a .gguf is requantized
out=$($QWENC info -m "$tmp/tf-Q4_K.gguf" --quant Q8_0 2>&1)
case "$out" in *"GGUF v3"*"at load to Q8_0"*) ok ;; *) bad "info of a GGUF --quant Q8_0: $out";; esac

# bad input
expect_error "unknown --quant type" 'unknown quantization type "Q3_K" (one of F32, F16, BF16, Q8_0' \
    $QWENC logits -m $M --quant Q3_K --tokens 1,2 --out "$tmp/x.f32"
expect_error "unknown --quant type (run)" "IQ4_XS" $QWENC run -m $M --quant q2 -p hi -n 1
expect_error "--quant without a value" "--quant needs a value" $QWENC info -m $M --quant
expect_error "quantize --quant" "quantize does not take --quant" $QWENC quantize -m $M --quant Q8_0 --type Q4_K -o "$tmp/y.gguf"

finish
