#!/usr/bin/env bash
# End-to-end tests of `qwenc synth`: random models at shrunk preset geometries load, show the geometry asked
# for, give finite logits (the same token by token as all at once), and are deterministic in the seed.
# Hidden size and vocabulary are shrunk too (--hidden, --vocab) so the files stay a few MiB.
source "$(dirname "$0")/lib_cli.sh"

# expect_info NAME FILE PATTERN...: every pattern is a line of `qwenc info`
expect_info() {
    local name=$1 f=$2; shift 2
    if ! $QWENC info -m "$f" >"$tmp/info" 2>"$tmp/err"; then bad "$name: info failed: $(cat "$tmp/err")"; return; fi
    for p in "$@"; do
        if grep -qE -- "$p" "$tmp/info"; then ok; else bad "$name: info lacks /$p/: $(cat "$tmp/info")"; fi
    done
}

# expect_logits NAME FILE VOCAB: finite, not all equal, and prefill == decode. The last check runs with f32
# activations (--f32-act, the exact path): prefill runs the DeltaNet recurrence in chunks and decode token by
# token, equal up to f32 rounding; with 8-bit activations (the default for quantized weights) such a rounding
# difference can tip an activation to the next step of its block's grid (a jump of max|x|/127, q8a.h), which
# no f32 tolerance bounds (measured here: rel L2 1e-3 with 8-bit activations, 1e-6 with f32 ones).
expect_logits() {
    local name=$1 f=$2 vocab=$3 toks=5,17,300,2,999,41,7,7,7,1000
    if ! $QWENC logits -m "$f" --tokens "$toks" --out "$tmp/full.f32" 2>"$tmp/err"; then
        bad "$name: logits failed: $(cat "$tmp/err")"; return
    fi
    local n=$(( $(stat -c %s "$tmp/full.f32") / 4 ))
    [ "$n" -eq $((10 * vocab)) ] && ok || bad "$name: $n logits, expected $((10 * vocab))"
    local nonfinite distinct
    nonfinite=$(od -An -v -f "$tmp/full.f32" | tr -s ' ' '\n' | grep -ciE 'nan|inf')
    [ "$nonfinite" -eq 0 ] && ok || bad "$name: $nonfinite non-finite logits"
    distinct=$(od -An -v -f "$tmp/full.f32" | tr -s ' ' '\n' | grep . | head -n "$vocab" | sort -u | wc -l)
    [ "$distinct" -gt $((vocab / 2)) ] && ok || bad "$name: only $distinct distinct logits in the first row"
    if $QWENC logits -m "$f" --f32-act --tokens "$toks" --out "$tmp/full.f32" 2>"$tmp/err" &&
        $QWENC logits -m "$f" --f32-act --tokens "$toks" --batch 1 --out "$tmp/dec.f32" 2>"$tmp/err"; then
        if "$T_MODEL" --compare "$tmp/dec.f32" "$tmp/full.f32" "$vocab" >"$tmp/cmp"; then ok
        else bad "$name: decode vs prefill: $(cat "$tmp/cmp")"; fi
    else
        bad "$name: logits --f32-act failed: $(cat "$tmp/err")"
    fi
}

small=(--hidden 256 --vocab 1024)

# --- flash-next: 2 layers (QSA + DeltaNet with the PLE), 4 experts (top-k capped), a small n-gram table
if $QWENC synth --arch qwen4exp --preset flash-next --layers 2 --experts 4 --ngram-base 1000 "${small[@]}" \
        --type Q8_0 -o "$tmp/fn.gguf" 2>"$tmp/err"; then
    ok
    grep -q "100%" "$tmp/err" && grep -q "ple_token_embd\|per_layer_token_embd" "$tmp/err" && ok \
        || bad "flash-next: no progress shown: $(tail -c 300 "$tmp/err")"
    expect_info flash-next "$tmp/fn.gguf" 'llama.cpp architecture "qwen4exp"' 'vocab +1024 +hidden 256 +layers 2' \
        '24 heads, 2 kv heads, head dim 256' '16 key heads x 128, 48 value heads x 128' \
        '4 experts, top 4, expert width 640, shared expert width 640' '4 hyper-connection streams, low rank 320' \
        'indexer 4 heads x 128, budget 2048 tokens in blocks of 4' 'ple +layer 1: 3-grams, 16 heads' \
        'layer plan +SD\+ple$' 'routed experts .* q8_0'
    expect_logits flash-next "$tmp/fn.gguf" 1024
    # deterministic in the seed (42 by default), different for another seed
    $QWENC synth --preset flash-next --layers 2 --experts 4 --ngram-base 1000 "${small[@]}" --seed 42 \
        --type Q8_0 -o "$tmp/fn2.gguf" 2>/dev/null
    cmp -s "$tmp/fn.gguf" "$tmp/fn2.gguf" && ok || bad "flash-next: --seed 42 did not give the same file"
    $QWENC synth --preset flash-next --layers 2 --experts 4 --ngram-base 1000 "${small[@]}" --seed 7 \
        --type Q8_0 -o "$tmp/fn3.gguf" 2>/dev/null
    [ -f "$tmp/fn3.gguf" ] && ! cmp -s "$tmp/fn.gguf" "$tmp/fn3.gguf" && ok \
        || bad "flash-next: --seed 7 gave the same file as --seed 42"
    # the same geometry, more threads: the same bytes
    $QWENC synth --preset flash-next --layers 2 --experts 4 --ngram-base 1000 "${small[@]}" --threads 3 \
        --type Q8_0 -o "$tmp/fn4.gguf" 2>/dev/null
    cmp -s "$tmp/fn.gguf" "$tmp/fn4.gguf" && ok || bad "flash-next: --threads 3 changed the file"
else
    bad "flash-next: synth failed: $(tail -c 400 "$tmp/err")"
fi

# --- qwen3.5-35b-a3b: 5 layers (attention at layer 3), Q4_K
if $QWENC synth --arch qwen35moe --preset qwen3.5-35b-a3b --layers 5 --experts 4 "${small[@]}" \
        --type Q4_K -o "$tmp/q35.gguf" 2>"$tmp/err"; then
    ok
    expect_info qwen3.5 "$tmp/q35.gguf" 'llama.cpp architecture "qwen35moe"' 'vocab +1024 +hidden 256 +layers 5' \
        '16 heads, 2 kv heads, head dim 256' '16 key heads x 128, 32 value heads x 128' \
        '4 experts, top 4, expert width 512, shared expert width 512' 'layer plan +DDDAD$' 'routed experts .* q4_K'
    expect_logits qwen3.5 "$tmp/q35.gguf" 1024
else
    bad "qwen3.5: synth failed: $(tail -c 400 "$tmp/err")"
fi

# --- one layer keeps an attention layer; 16 experts keep top-8
if $QWENC synth --preset qwen3.5-35b-a3b --layers 1 --experts 16 "${small[@]}" --type F16 -o "$tmp/one.gguf" 2>"$tmp/err"
then
    expect_info one-layer "$tmp/one.gguf" 'layer plan +A$' '16 experts, top 8,'
else
    bad "one layer: synth failed: $(tail -c 400 "$tmp/err")"
fi

# --- --synth PRESET: the same model made in memory (info, logits, bench), no file. On the CPU it holds the bytes
# synth writes: the logits are those of the file, bit for bit, with and without the draft head, and bench reads the
# same bytes per token.
geo=(--layers 2 --experts 4 --ngram-base 1000 "${small[@]}")
toks=5,17,300,2,999,41,7
for t in Q4_K Q8_0; do
    for mtp in "" --mtp; do
        if $QWENC synth --preset flash-next "${geo[@]}" $mtp --type $t -o "$tmp/m.gguf" 2>/dev/null &&
            $QWENC logits -m "$tmp/m.gguf" --tokens $toks -o "$tmp/file.f32" 2>"$tmp/err" &&
            $QWENC logits --synth flash-next "${geo[@]}" $mtp --type $t --tokens $toks -o "$tmp/mem.f32" 2>"$tmp/err"; then
            cmp -s "$tmp/file.f32" "$tmp/mem.f32" && ok || bad "--synth $t $mtp: logits differ from the file's"
        else
            bad "--synth $t $mtp: $(tail -c 300 "$tmp/err")"
        fi
    done
done
$QWENC synth --preset qwen3.5-35b-a3b --layers 5 --experts 4 "${small[@]}" --seed 9 --type Q6_K -o "$tmp/m.gguf" 2>/dev/null
$QWENC logits -m "$tmp/m.gguf" --tokens $toks -o "$tmp/file.f32" 2>/dev/null
$QWENC logits --synth qwen3.5-35b-a3b --layers 5 --experts 4 "${small[@]}" --seed 9 --type Q6_K --tokens $toks \
    -o "$tmp/mem.f32" 2>"$tmp/err" && cmp -s "$tmp/file.f32" "$tmp/mem.f32" && ok \
    || bad "--synth qwen3.5 Q6_K --seed 9: logits differ from the file's $(tail -c 300 "$tmp/err")"
$QWENC logits --synth qwen3.5-35b-a3b --layers 5 --experts 4 "${small[@]}" --type Q6_K --tokens $toks \
    -o "$tmp/mem42.f32" 2>/dev/null
! cmp -s "$tmp/mem42.f32" "$tmp/mem.f32" && ok || bad "--synth: --seed 9 gave the logits of seed 42"
expect_info_synth() {
    if $QWENC info --synth flash-next "${geo[@]}" --type Q8_0 >"$tmp/info" 2>"$tmp/err" &&
        grep -q '^files *none: random weights made in host memory' "$tmp/info" &&
        grep -q '^types *the tensors of qwenc synth --type Q8_0' "$tmp/info" &&
        grep -qE 'layer plan +SD\+ple$' "$tmp/info"; then ok; else bad "info --synth: $(cat "$tmp/info" "$tmp/err")"; fi
}
expect_info_synth
$QWENC synth --preset flash-next "${geo[@]}" --type Q8_0 -o "$tmp/m.gguf" 2>/dev/null
reads() { grep -o 'decode reads *[0-9.]* MiB' "$1"; }
if $QWENC bench -m "$tmp/m.gguf" -p 0 -n 4 -r 1 -t 1 >"$tmp/bf" 2>&1 &&
    $QWENC bench --synth flash-next "${geo[@]}" --type Q8_0 -p 0 -n 4 -r 1 -t 1 >"$tmp/bs" 2>&1; then
    grep -q '^| synth-flash-next ' "$tmp/bs" && ok || bad "bench --synth: the row does not name synth-flash-next"
    [ -n "$(reads "$tmp/bs")" ] && [ "$(reads "$tmp/bs")" = "$(reads "$tmp/bf")" ] && ok \
        || bad "bench --synth reads '$(reads "$tmp/bs")' per token, the file '$(reads "$tmp/bf")'"
else
    bad "bench --synth: $(tail -c 300 "$tmp/bs")"
fi
expect_error "--synth without --type" '--synth flash-next needs --type TYPE' $QWENC bench --synth flash-next
expect_error "--synth and -m" 'give -m MODEL or --synth PRESET, not both' \
    $QWENC info --synth flash-next --type Q8_0 -m "$tmp/m.gguf"
expect_error "--synth --quant" 'not --quant' $QWENC info --synth flash-next --type Q8_0 --quant Q4_K
expect_error "--layers without --synth" 'go with --synth PRESET' $QWENC bench -m "$tmp/m.gguf" --layers 2
expect_error "--synth unknown preset" 'unknown preset "nope"' $QWENC info --synth nope --type Q8_0
expect_error "--synth bad type" 'unknown tensor type "Q3_X"' $QWENC info --synth flash-next --type Q3_X
expect_error "--synth --backend cuda without one" '--backend cuda' \
    $QWENC info --synth flash-next "${geo[@]}" --type Q8_0 --backend cuda

# --- errors
expect_error "unknown preset" 'unknown preset "nope"' $QWENC synth --preset nope --type Q8_0 -o "$tmp/x.gguf"
expect_error "arch mismatch" 'is architecture qwen35moe, not qwen4exp' \
    $QWENC synth --arch qwen4exp --preset qwen3.5-35b-a3b --type Q8_0 -o "$tmp/x.gguf"
expect_error "flash-next 1 layer" 'needs --layers >= 2' \
    $QWENC synth --preset flash-next --layers 1 --type Q8_0 -o "$tmp/x.gguf"
expect_error "no output" '-o OUT.gguf are required' $QWENC synth --preset flash-next --type Q8_0
expect_error "bad type" 'unknown GGUF type "Q3_X"' \
    $QWENC synth --preset flash-next --layers 2 --experts 4 "${small[@]}" --type Q3_X -o "$tmp/x.gguf"
[ ! -e "$tmp/x.gguf" ] && ok || bad "a failed synth left $tmp/x.gguf behind"

finish
