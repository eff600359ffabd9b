#!/usr/bin/env bash
# End-to-end tests of inputs a new user gives by mistake or on purpose: -n 0 (nothing generated), the prompt
# echoed by run, a prompt that does not fit (the remedy named), degenerate perplexity runs (errors, not
# "-nan"), a NUL byte in a -f prompt (kept, or refused with --chat naming the offset), /dev/zero and other
# endless or huge inputs (refused at 256 MiB; stdin and pipes still read), and quantize / synth writing OUT
# only when complete (a killed run leaves neither OUT nor its temporary file, and an existing OUT untouched).
source "$(dirname "$0")/lib_cli.sh"
M=models/tiny-flash
P="And the LORD spake unto Moses"

# wait_for CMD...: poll until CMD succeeds (at most 60 s); no timing is asserted
wait_for() { for _ in $(seq 1200); do "$@" && return 0; sleep 0.05; done; return 1; }

# --- run echoes the prompt, then the generation; -n 0 generates nothing
$QWENC run -m $M -p "$P" -n 8 --temp 0 --no-display-prompt >"$tmp/gen" 2>/dev/null
$QWENC run -m $M -p "$P" -n 8 --temp 0 >"$tmp/both" 2>/dev/null
[ -s "$tmp/gen" ] && [ "$(cat "$tmp/both")" = "$P$(cat "$tmp/gen")" ] && ok || bad "run echo: '$(cat "$tmp/both")'"
$QWENC run -m $M -p "$P" -n 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$P" ] && ok || bad "run -n 0 printed '$(cat "$tmp/out")' (rc $rc)"
grep -q "generated 0 tokens .* stop: token limit" "$tmp/err" && ok || bad "run -n 0 stats: $(cat "$tmp/err")"
$QWENC run -m $M -p "$P" -n 1 --temp 0 >/dev/null 2>"$tmp/err"
grep -q "generated 1 tokens" "$tmp/err" && ok || bad "run -n 1 stats: $(cat "$tmp/err")"
printf 'The old man walked slowly down the road.\nAnd what did the dog do?\n' |
    $QWENC chat -m $M -n 0 >"$tmp/out" 2>"$tmp/err"
[ "$(grep -c '^\[fed [0-9]* tokens, generated 0 tokens' "$tmp/err")" -eq 2 ] && ok || bad "chat -n 0: $(cat "$tmp/err")"
[ -z "$(tr -d '\n' <"$tmp/out")" ] && ok || bad "chat -n 0 printed '$(cat "$tmp/out")'"

# --- a prompt that does not fit names the remedy
expect_error "prompt and -n exceed -c" "and -n 100 exceed the context of 8 tokens: raise -c (the model was trained on 4096)" \
    $QWENC run -m $M -p "$P" -n 100 -c 8
expect_error "prompt exceeds -c" "exceeds the context of 4 tokens: raise -c" $QWENC run -m $M -p "$P" -n -1 -c 4
n_p=$($QWENC tokenize -m $M "$P" | tr ',' '\n' | grep -c .)
$QWENC run -m $M -p "$P" -n 3 -c $((n_p + 2)) --temp 0 >/dev/null 2>"$tmp/err" && ok || bad "prompt + 3 in $((n_p + 2)): $(cat "$tmp/err")"

# --- perplexity: degenerate runs are errors with the remedy, nothing on stdout
head -c 3000 tests/fixtures/tiny-flash/valid.txt >"$tmp/text.txt"
expect_error "perplexity -c 1" "give -c 2 or more" $QWENC perplexity -m $M -f "$tmp/text.txt" -c 1
[ ! -s "$tmp/out" ] && ok || bad "perplexity -c 1 printed $(cat "$tmp/out")"
printf 'x' >"$tmp/one.txt"
expect_error "one-token text" "is 1 token long; at least 2 are needed (one to score after another): give a longer text" \
    $QWENC perplexity -m $M -f "$tmp/one.txt"
: >"$tmp/empty.txt"
expect_error "empty text" "is 0 tokens long" $QWENC perplexity -m $M -f "$tmp/empty.txt"
# a text shorter than a chunk is one chunk; -c 2 scores one token per chunk
$QWENC perplexity -m $M -f "$tmp/text.txt" -c 2 >"$tmp/out" 2>"$tmp/err" && grep -qE "^perplexity [0-9.]+ .* chunks of up to 2\)" "$tmp/out" \
    && ok || bad "perplexity -c 2: $(cat "$tmp/out") $(tail -c 300 "$tmp/err")"
printf 'And the LORD spake' >"$tmp/short.txt"
$QWENC perplexity -m $M -f "$tmp/short.txt" >"$tmp/out" 2>"$tmp/err" && grep -q "over 3 tokens, 1 chunks of up to 4)" "$tmp/out" \
    && ok || bad "perplexity of 4 tokens: $(cat "$tmp/out") $(tail -c 300 "$tmp/err")"

# --- a NUL byte in a -f prompt: read with the rest (it used to cut the prompt); --chat refuses it by offset
printf 'And the\0 LORD spake' >"$tmp/nul.txt"
printf 'And the' >"$tmp/head.txt"
$QWENC run -m $M -f "$tmp/nul.txt" -n 0 >"$tmp/out" 2>"$tmp/err" && cmp -s "$tmp/out" "$tmp/nul.txt" && ok \
    || bad "run -f with a NUL byte echoes '$(od -c "$tmp/out" | head -2)'"
n_nul=$($QWENC tokenize -m $M -f "$tmp/nul.txt" | tr ',' '\n' | grep -c .)
n_head=$($QWENC tokenize -m $M -f "$tmp/head.txt" | tr ',' '\n' | grep -c .)
run_n() { $QWENC run -m $M -f "$1" -n 0 2>&1 >/dev/null | sed -n 's/.*| prompt \([0-9]*\) tokens.*/\1/p'; }
r_nul=$(run_n "$tmp/nul.txt"); r_head=$(run_n "$tmp/head.txt")
[ -n "$r_nul" ] && [ "$n_nul" -gt "$n_head" ] && [ $((r_nul - n_nul)) -eq $((r_head - n_head)) ] && ok \
    || bad "NUL prompt: run fed $r_nul tokens, tokenize gives $n_nul (the part before the NUL: $r_head vs $n_head)"
expect_error "--chat with a NUL" "nul.txt: a NUL byte at offset 7; a chat message cannot hold one" \
    $QWENC run -m $M -f "$tmp/nul.txt" --chat

# --- endless and huge inputs: refused once 256 MiB have come, or from a regular file's size; streams still work
for c in "run -m $M -f /dev/zero" "perplexity -m $M -f /dev/zero" "tokenize -m $M -f /dev/zero" \
         "chat-template -m $M --request /dev/zero"; do
    expect_error "$c" "/dev/zero holds more than 256 MiB" $QWENC $c
done
truncate -s 300M "$tmp/huge.txt"
expect_error "a 300 MiB file" "huge.txt holds more than 256 MiB" $QWENC tokenize -m $M -f "$tmp/huge.txt"
rm -f "$tmp/huge.txt"
expect_error "a directory" "is a directory" $QWENC run -m $M -f "$tmp"
head -c $((256 * 1048576 + 1)) /dev/zero | $QWENC tokenize -m $M -f - >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "standard input holds more than 256 MiB" "$tmp/err" && ok || bad "stdin over the limit: $(cat "$tmp/err")"
want=$($QWENC tokenize -m $M "$P")
[ "$(printf '%s' "$P" | $QWENC tokenize -m $M -f -)" = "$want" ] && ok || bad "tokenize -f - (a pipe)"
[ "$($QWENC tokenize -m $M -f <(printf '%s' "$P"))" = "$want" ] && ok || bad "tokenize -f <(...)"
[ "$(printf '%s' "$P" | $QWENC run -m $M -f - -n 0 2>/dev/null)" = "$P" ] && ok || bad "run -f - (a pipe)"
echo '{"messages": [{"role": "user", "content": "hi"}]}' >"$tmp/req.json"
[ "$($QWENC chat-template -m $M --request - <"$tmp/req.json")" = "$($QWENC chat-template -m $M --request "$tmp/req.json")" ] \
    && ok || bad "chat-template --request -"

# --- quantize / synth: OUT appears only when complete
d=$tmp/q; mkdir "$d"
$QWENC quantize -m $M -o "$d/m.gguf" --type Q8_0 2>/dev/null && [ "$(ls "$d")" = "m.gguf" ] && ok || bad "quantize left: $(ls "$d")"
expect_error "unwritable directory" "$tmp/nodir/m.gguf: cannot create" $QWENC quantize -m $M -o "$tmp/nodir/m.gguf" --type Q8_0
# a synth of some 300 MiB, killed once it has written its first batch: a temporary file beside OUT is being
# written (OUT holds what it held), and after the signal neither is left, OUT untouched
big=(synth --preset qwen3.5-35b-a3b --layers 1 --experts 8 --vocab 65536 --type Q8_0 -t 1)
for sig in TERM INT; do
    rm -rf "$d"; mkdir "$d"
    [ $sig = TERM ] && echo "an older file" >"$d/big.gguf"
    $QWENC "${big[@]}" -o "$d/big.gguf" 2>"$tmp/err" & pid=$!
    if wait_for grep -q '^\[ *[0-9]*%\]' "$tmp/err"; then
        tmps=$(ls "$d" | grep -c '^big\.gguf\.tmp\.')
        kill -$sig $pid; wait $pid; rc=$?
        [ "$tmps" -eq 1 ] && ok || bad "$sig: no temporary file while writing: $(ls "$d")"
        want_rc=$([ $sig = TERM ] && echo 143 || echo 130)
        [ $rc -eq "$want_rc" ] && grep -q "synth: interrupted; $d/big.gguf was not written" "$tmp/err" && ok \
            || bad "$sig: rc $rc, $(tail -2 "$tmp/err")"
        if [ $sig = TERM ]; then
            [ "$(ls "$d")" = "big.gguf" ] && [ "$(cat "$d/big.gguf")" = "an older file" ] && ok \
                || bad "$sig: the directory holds $(ls -l "$d"), the older file should be untouched"
        else
            [ -z "$(ls "$d")" ] && ok || bad "$sig: left $(ls "$d")"
        fi
    else
        kill -9 $pid 2>/dev/null; wait $pid
        bad "$sig: synth showed no progress: $(tail -c 300 "$tmp/err")"
    fi
done

finish
