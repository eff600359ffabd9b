#!/usr/bin/env bash
# End-to-end tests of the command line itself, as a llama.cpp user types it: --version, the help of each
# command (only its own options), every option another command takes refused with a message naming both,
# values checked before a model loads (the message names the flag), llama.cpp's spellings meaning what the
# qwenc ones mean (--ctx-size, -s, -sys, -b, -e, --flag=value), bench comma lists, -t as the thread count
# and the type of quantize as --type or its last argument (the old -t TYPE with a notice).
source "$(dirname "$0")/lib_cli.sh"
M=models/tiny-flash
NOWHERE=$tmp/no-such-model # option errors must come before the model is opened

# --- version: the one in include/qwenc.h
want=$(sed -n 's/^#define QWENC_VERSION "\(.*\)"$/\1/p' include/qwenc.h)
[ -n "$want" ] && ok || bad "no QWENC_VERSION in include/qwenc.h"
for args in "--version" "version" "run --version"; do
    out=$($QWENC $args 2>&1); rc=$?
    [ $rc -eq 0 ] && [ "$(echo "$out" | head -1)" = "qwenc $want" ] && ok || bad "qwenc $args: rc $rc, '$out'"
done

# --- help: the command list, and each command's own options
commands="run chat info logits tokenize detokenize chat-template bench perplexity quantize synth"
top=$($QWENC --help); rc=$?
[ $rc -eq 0 ] && ok || bad "qwenc --help exit $rc"
for c in $commands; do
    echo "$top" | grep -qE "^  $c +[a-z]" && ok || bad "qwenc --help does not list $c"
    $QWENC $c --help >"$tmp/help-$c" 2>"$tmp/err"; rc=$?
    [ $rc -eq 0 ] && [ "$(head -1 "$tmp/help-$c" | cut -d' ' -f1-3)" = "usage: qwenc $c" ] && ok \
        || bad "qwenc $c --help: rc $rc, $(head -2 "$tmp/help-$c") $(cat "$tmp/err")"
    $QWENC $c -h | cmp -s - "$tmp/help-$c" && ok || bad "qwenc $c -h differs from --help"
    $QWENC help $c | cmp -s - "$tmp/help-$c" && ok || bad "qwenc help $c differs from $c --help"
    # the spellings of each option the command lists (the first column of "  -x, --long ARG   help")
    sed -n 's/^  \(-[^ ]*\(, -[^ ]*\)*\).*/\1/p' "$tmp/help-$c" | tr -d ',' | tr ' ' '\n' | grep '^-' | sort -u >"$tmp/opts-$c"
done
has() { grep -qE -- "^  ($2|.*, $2)[ ,]" "$tmp/help-$1"; }
has run --temp && has run --no-display-prompt && has run -sys && has run --ctx-size && ok || bad "run --help lacks its options"
has run --preset || has run --request || has run --json && bad "run --help shows other commands' options" || ok
has tokenize --temp || has tokenize --threads && bad "tokenize --help shows sampling or threads" || ok
has quantize --type && has quantize -t && ! has quantize --quant && ok || bad "quantize --help: --type, -t, no --quant"
grep -q -- "-t, --threads N *quantizing threads" "$tmp/help-quantize" && ok || bad "quantize -t is not the thread count"
grep -q -- "-p, --n-prompt N\[,N...\]" "$tmp/help-bench" && ok || bad "bench -p does not take a list"
grep -q "(default 256" "$tmp/help-run" && grep -q "(default 0.8)" "$tmp/help-run" && ok || bad "run --help lacks defaults"

# every option some command lists is refused, naming the option and the command, by a command that does not
# list it (and before anything is loaded)
cat "$tmp"/opts-* | sort -u >"$tmp/all-opts"
n_checked=0
margs() { [ "$1" = synth ] || echo "-m $NOWHERE"; }
for c in $commands; do
    while read -r opt; do
        grep -qxF -- "$opt" "$tmp/opts-$c" && continue
        $QWENC $c $(margs $c) "$opt" 1 >"$tmp/out" 2>"$tmp/err"; rc=$?
        if [ $rc -eq 1 ] && grep -qxF -- "qwenc: $c does not take $opt (see qwenc $c --help)" "$tmp/err"; then
            n_checked=$((n_checked + 1))
        else
            bad "qwenc $c $opt: rc $rc, $(cat "$tmp/err")"
        fi
    done <"$tmp/all-opts"
done
echo "($n_checked inapplicable options checked)"; [ "$n_checked" -gt 200 ] && ok || bad "only $n_checked inapplicable options checked"
# every option a command lists is taken by it (a valued one with the value 1, which may be out of range: then
# the message names the option)
for c in $commands; do
    while read -r opt; do
        case $opt in -h|--help|--version) continue;; esac
        $QWENC $c $(margs $c) "$opt" 1 --help >"$tmp/out" 2>"$tmp/err"; rc=$?
        if [ $rc -eq 0 ] && grep -q "^usage: qwenc $c" "$tmp/out"; then ok
        elif [ $rc -eq 1 ] && grep -qF -- "$opt" "$tmp/err" && ! grep -qE "does not take|unknown option" "$tmp/err"; then ok
        else bad "qwenc $c $opt 1: rc $rc, $(cat "$tmp/err")"; fi
    done <"$tmp/opts-$c"
done

# --- bad values: refused before the model loads, the message naming the flag
expect_error "--temp < 0" "--temp must be >= 0" $QWENC run -m "$NOWHERE" -p hi --temp -0.5
expect_error "--temp not a number" '--temp expects a number, got "warm"' $QWENC run -m "$NOWHERE" -p hi --temp warm
expect_error "--top-p 0" "--top-p must be in (0, 1]" $QWENC run -m "$NOWHERE" -p hi --top-p 0
expect_error "--top-p 1.5" "--top-p must be in (0, 1]" $QWENC chat -m "$NOWHERE" --top-p=1.5
expect_error "--min-p 2" "--min-p must be in [0, 1]" $QWENC run -m "$NOWHERE" -p hi --min-p 2
expect_error "--top-k -1" "--top-k expects an integer >= 0" $QWENC run -m "$NOWHERE" -p hi --top-k -1
expect_error "--repeat-penalty 0" "--repeat-penalty must be > 0" $QWENC run -m "$NOWHERE" -p hi --repeat-penalty 0
expect_error "--repeat-last-n -2" "--repeat-last-n expects an integer >= -1" $QWENC run -m "$NOWHERE" -p hi --repeat-last-n -2
expect_error "--presence-penalty 3" "--presence-penalty must be in [-2, 2]" $QWENC run -m "$NOWHERE" -p hi --presence-penalty 3
expect_error "--frequency-penalty nan" "--frequency-penalty expects a number" $QWENC run -m "$NOWHERE" -p hi --frequency-penalty nan
expect_error "-n -2" "-n expects an integer >= -1" $QWENC run -m "$NOWHERE" -p hi -n -2
expect_error "--n-predict=x" '--n-predict expects an integer >= -1, got "x"' $QWENC run -m "$NOWHERE" -p hi --n-predict=x
expect_error "-c 0" "-c expects an integer >= 1" $QWENC run -m "$NOWHERE" -p hi -c 0
expect_error "--ctx-size=abc" '--ctx-size expects an integer >= 1, got "abc"' $QWENC run -m "$NOWHERE" -p hi --ctx-size=abc
expect_error "-b 0" "-b expects an integer >= 1" $QWENC perplexity -m "$NOWHERE" -f x -b 0
expect_error "--batch-size=0" "--batch-size expects an integer >= 1" $QWENC logits -m "$NOWHERE" --tokens 1 -o x --batch-size=0
expect_error "-s -5" "-s expects a non-negative integer (or -1: random)" $QWENC run -m "$NOWHERE" -p hi -s -5
expect_error "-t TYPE in run" '-t expects a number of threads (an integer >= 0), got "Q4_K"' $QWENC run -m "$NOWHERE" -p hi -t Q4_K
expect_error "bench -p list" '-p expects an integer >= 0, got "x"' $QWENC bench -m "$NOWHERE" -p 16,x
expect_error "bench -t list" "-t expects integers >= 0 separated by commas" $QWENC bench -m "$NOWHERE" -t 1,,2
expect_error "flag with a value" '--json takes no value (got "--json=1")' $QWENC bench -m "$NOWHERE" --json=1
expect_error "missing value" "option -m needs a value PATH" $QWENC info -m
expect_error "unknown option" "unknown option --frobnicate (see qwenc run --help)" $QWENC run -m "$NOWHERE" --frobnicate
expect_error "stray argument" 'run takes no argument "world"' $QWENC run -m "$NOWHERE" -p hello world
expect_error "no model" "run: -m MODEL is required" $QWENC run -p hi
expect_error "-e \\x00" '\x00 (a NUL byte) cannot be given with -e' $QWENC run -m "$NOWHERE" -e -p 'a\x00b'

# --- llama.cpp's spellings mean the same
gen() { $QWENC run -m $M -p "And the LORD" --no-display-prompt "$@" 2>/dev/null; }
a=$(gen -n 12 --temp 0.9 --seed 5)
[ -n "$a" ] && ok || bad "run gave no text"
for args in "--n-predict 12 --temp 0.9 -s 5" "--predict=12 --temperature=0.9 --seed=5" "-n 12 --temp 0.9 -s 5 -b 1 -c 64"; do
    [ "$(gen $args)" = "$a" ] && ok || bad "run $args differs from -n 12 --temp 0.9 --seed 5"
done
[ "$(gen -n 12 --temp 0.9 -s 6)" != "$a" ] && ok || bad "-s 6 gave the text of --seed 5"
for c in "-c 16" "--ctx-size 16" "--ctx-size=16" "--ctx=16"; do
    expect_error "run $c" "exceed the context of 16 tokens: raise -c" $QWENC run -m $M -p "And the LORD" -n 100 $c
done
# -sys / --system-prompt / --system: a system message (run: in the chat template)
base=$($QWENC run -m $M -p hi --chat --system "Be brief." -n 0 2>/dev/null)
case "$base" in *"Be brief."*hi*) ok;; *) bad "run --chat --system does not echo the system message: '$base'";; esac
for s in "-sys" "--system-prompt"; do
    [ "$($QWENC run -m $M -p hi $s "Be brief." -n 0 2>/dev/null)" = "$base" ] && ok || bad "run $s differs from --chat --system"
done
[ "$($QWENC run -m $M -p hi --system-prompt="Be brief." -n 0 2>/dev/null)" = "$base" ] && ok || bad "--system-prompt=TEXT"
# -e reads escapes in the prompt, as llama.cpp does; without it they stay as written
$QWENC run -m $M -e -p 'And\tthe\nLORD \x41\\ \"q\"' -n 0 >"$tmp/esc" 2>/dev/null
printf 'And\tthe\nLORD A\\ "q"' | cmp -s - "$tmp/esc" && ok || bad "-e: '$(cat "$tmp/esc")'"
$QWENC run -m $M -p 'And\nthe' -n 0 >"$tmp/raw" 2>/dev/null
printf 'And\\nthe' | cmp -s - "$tmp/raw" && ok || bad "without -e the escapes must stay: '$(cat "$tmp/raw")'"
$QWENC run -m $M -e --no-escape -p 'And\nthe' -n 0 >"$tmp/raw" 2>/dev/null
printf 'And\\nthe' | cmp -s - "$tmp/raw" && ok || bad "--no-escape after -e: '$(cat "$tmp/raw")'"
# -e applies to --stop too
$QWENC run -m $M -p "And the LORD" -n 24 --temp 0 --no-display-prompt >"$tmp/full" 2>/dev/null
stop=$(head -c 12 "$tmp/full" | tail -c 5)
$QWENC run -m $M -p "And the LORD" -n 24 --temp 0 --no-display-prompt -e --stop "$(printf '%s' "$stop" | sed 's/ /\\x20/g')" \
    >"$tmp/cut" 2>/dev/null
[ -n "$stop" ] && [ "$(cat "$tmp/cut")$stop" = "$(head -c 12 "$tmp/full")" ] && ok \
    || bad "-e --stop: '$(cat "$tmp/cut")' then '$stop' is not the start of '$(head -c 40 "$tmp/full")'"

# --- bench: comma lists, a row per test and thread count
F=tests/fixtures/qwen4_exp
if $QWENC bench -m $F -p 4,8 -n 2,3 -t 1,2 -r 1 --json >"$tmp/b.json" 2>"$tmp/err"; then
    python3 - "$tmp/b.json" >"$tmp/check" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
got = sorted((r["n_threads"], r["test"], r["n_prompt"], r["n_gen"]) for r in rows)
want = sorted((t, f"{k}{n}", n if k == "pp" else 0, n if k == "tg" else 0)
              for t in (1, 2) for k, ns in (("pp", (4, 8)), ("tg", (2, 3))) for n in ns)
print(("ok " if got == want else "bad ") + f"rows {got}")
for r in rows:
    key = "pp_tps" if r["test"].startswith("pp") else "tg_tps"
    other = "tg_tps" if key == "pp_tps" else "pp_tps"
    print(("ok " if isinstance(r[key], (int, float)) and r[key] > 0 and r[other] is None else "bad ") + f"{r['test']} {key}")
PY
    while read -r status what; do [ "$status" = ok ] && ok || bad "bench lists --json: $what"; done <"$tmp/check"
else
    bad "bench lists: $(cat "$tmp/err")"
fi
out=$($QWENC bench -m $F -p 4,8 -n 2 -r 1 2>&1)
[ "$(echo "$out" | grep -cE '^\| qwen4_exp .* \| +(pp4|pp8|tg2) \|')" -eq 3 ] && ok || bad "bench -p 4,8 -n 2 table: $out"

# --- quantize: --type, the type as the last argument (llama-quantize's order too), the old -t TYPE with a notice
$QWENC quantize -m $M -o "$tmp/a.gguf" --type Q8_0 2>"$tmp/err" && ok || bad "quantize --type: $(tail -c 300 "$tmp/err")"
grep -q "old spelling" "$tmp/err" && bad "quantize --type printed the old-spelling notice" || ok
for args in "-m $M -o $tmp/b.gguf Q8_0" "$M $tmp/b.gguf Q8_0" "-m $M -o $tmp/b.gguf --type=q8_0 -t 1"; do
    rm -f "$tmp/b.gguf"
    $QWENC quantize $args 2>"$tmp/err" && cmp -s "$tmp/a.gguf" "$tmp/b.gguf" && ok || bad "quantize $args: $(tail -c 300 "$tmp/err")"
done
rm -f "$tmp/b.gguf"
$QWENC quantize -m $M -t Q8_0 -o "$tmp/b.gguf" 2>"$tmp/err" && cmp -s "$tmp/a.gguf" "$tmp/b.gguf" && ok || bad "quantize -t Q8_0 (old spelling)"
grep -q "note: -t Q8_0 is the old spelling of --type Q8_0" "$tmp/err" && ok || bad "no notice for -t TYPE: $(head -3 "$tmp/err")"
expect_error "type twice" "the type is given twice" $QWENC quantize -m $M -o "$tmp/c.gguf" --type Q8_0 Q4_K
expect_error "two arguments" "quantize takes TYPE, or MODEL OUT.gguf TYPE" $QWENC quantize $M "$tmp/c.gguf"
expect_error "synth -t TYPE still works" 'unknown preset "nope"' $QWENC synth --preset nope -t Q8_0 -o "$tmp/c.gguf"
grep -q "old spelling" "$tmp/err" && ok || bad "synth -t TYPE: no notice"

# --gpus and --split: bad values named before any GPU is looked for
expect_error "--gpus not a count" '--gpus: "two" is neither a count nor a list of device ids' $QWENC run -m $M -p hi --gpus two
expect_error "--gpus 0" "--gpus: between 1 and 8 GPUs, not 0" $QWENC run -m $M -p hi --gpus 0
expect_error "--gpus trailing comma" '--gpus: "0,1," ends with a comma' $QWENC run -m $M -p hi --gpus 0,1,
expect_error "--gpus 9 ids" "--gpus: at most 8 GPUs" $QWENC run -m $M -p hi --gpus 0,1,2,3,4,5,6,7,0
expect_error "--gpus on the CPU" "--gpus 2 with --backend cpu: the GPUs need --backend cuda" $QWENC run -m $M -p hi --gpus 2 --backend cpu
expect_error "--split layer on the CPU" "--gpus 2 with --backend cpu: the GPUs need --backend cuda" \
    $QWENC run -m $M -p hi --split layer --gpus 2 --backend cpu
expect_error "--split other" '--split expects expert or layer, got "rows"' $QWENC run -m $M -p hi --split rows
expect_error "--gpus with --synth, no GPU" "--gpus: " $QWENC bench --synth flash-next --layers 2 --experts 4 --vocab 256 --type Q8_0 --backend cuda --gpus 2

finish
