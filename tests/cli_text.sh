#!/usr/bin/env bash
# End-to-end tests of the text commands as a user runs them: run (greedy output equal to transformers'
# greedy generation on the bundled model), seeds, stop strings, chat (turns feed only new tokens, /reset),
# and tokenize / detokenize / chat-template on a directory that holds only tokenizer files.
source "$(dirname "$0")/lib_cli.sh"
M=models/tiny-flash
G=tests/fixtures/tiny-flash/greedy.json
jget() { python3 -c "import json,sys; v=json.load(open('$1'))$2; sys.stdout.write(v if isinstance(v,str) else ','.join(map(str,v)))"; }

# --- greedy generation equals transformers (first 32 tokens), plain and chat prompts
for i in 0 1; do
    kind=$(jget $G "['prompts'][$i]['kind']")
    jget $G "['prompts'][$i]['prompt']" >"$tmp/prompt"
    jget $G "['prompts'][$i]['output_text']" >"$tmp/want"
    ids=$($QWENC tokenize -m $M --file "$tmp/prompt" 2>&1)
    [ "$ids" = "$(jget $G "['prompts'][$i]['prompt_ids']")" ] && ok || bad "$kind prompt ids: $ids"
    $QWENC run -m $M -f "$tmp/prompt" -n 32 --temp 0 --no-display-prompt >"$tmp/got" 2>"$tmp/err"
    cmp -s "$tmp/got" "$tmp/want" && ok || bad "$kind greedy text differs from transformers: '$(cat "$tmp/got")'"
    grep -q "generated 32 tokens" "$tmp/err" && grep -q "stop: token limit" "$tmp/err" && ok || bad "$kind stats: $(cat "$tmp/err")"
done
# the chat prompt of greedy.json is what `run --chat` renders from the user message
user_msg=$(jget $G "['prompts'][1]['prompt'].split('<|im_start|>user\\n')[1].split('<|im_end|>')[0]")
$QWENC run -m $M --chat -p "$user_msg" -n 32 --temp 0 --no-display-prompt >"$tmp/got" 2>"$tmp/err"
jget $G "['prompts'][1]['output_text']" >"$tmp/want"
cmp -s "$tmp/got" "$tmp/want" && ok || bad "run --chat greedy: '$(cat "$tmp/got")' $(cat "$tmp/err")"
grep -q "load .* s | prompt 29 tokens .* tok/s) | generated 32 tokens .* tok/s)" "$tmp/err" && ok || bad "run stats line: $(cat "$tmp/err")"

# --- seeds: the same seed gives the same text, another seed other text
$QWENC run -m $M -p "And the LORD" -n 40 --seed 7 --no-display-prompt >"$tmp/a" 2>/dev/null
$QWENC run -m $M -p "And the LORD" -n 40 --seed 7 --no-display-prompt >"$tmp/b" 2>/dev/null
$QWENC run -m $M -p "And the LORD" -n 40 --seed 8 --no-display-prompt >"$tmp/c" 2>/dev/null
[ -s "$tmp/a" ] && cmp -s "$tmp/a" "$tmp/b" && ok || bad "same seed, different text"
cmp -s "$tmp/a" "$tmp/c" && bad "seeds 7 and 8 gave the same 40 tokens" || ok
$QWENC run -m $M -p "And the LORD" -n 40 --temp 0.9 --top-k 5 --top-p 0.9 --min-p 0.1 --repeat-penalty 1.1 \
    --presence-penalty 0.2 --frequency-penalty 0.1 --seed 3 --no-display-prompt >"$tmp/a" 2>"$tmp/err" && [ -s "$tmp/a" ] && ok || bad "sampling flags: $(cat "$tmp/err")"

# --- stop strings: the text ends before the first occurrence, which is never printed
$QWENC run -m $M -f <(jget $G "['prompts'][0]['prompt']") -n 32 --temp 0 --stop "Egypt" --no-display-prompt >"$tmp/got" 2>"$tmp/err"
[ "$(cat "$tmp/got")" = " I will go up and destroy the land of " ] && ok || bad "stop string: '$(cat "$tmp/got")'"
grep -q "stop: stop string" "$tmp/err" && ok || bad "stop reason: $(cat "$tmp/err")"

# --- chat: a second turn feeds only its own tokens; /reset starts over
printf 'The old man walked slowly down the road.\nAnd what did the dog do?\n/reset\nThe old man walked slowly down the road.\n/exit\n' |
    $QWENC chat -m $M -n 24 --temp 0 >"$tmp/chat" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && ok || bad "chat exit code $rc: $(cat "$tmp/err")"
turns=$(grep -c '^\[fed ' "$tmp/err")
[ "$turns" -eq 3 ] && ok || bad "chat: $turns turns reported, expected 3: $(cat "$tmp/err")"
read -r fed1 ctx1 < <(sed -n '1{s/^\[fed \([0-9]*\) tokens.*, \([0-9]*\) in context.*/\1 \2/p}' <(grep '^\[fed' "$tmp/err"))
read -r fed2 ctx2 < <(sed -n '2{s/^\[fed \([0-9]*\) tokens.*, \([0-9]*\) in context.*/\1 \2/p}' <(grep '^\[fed' "$tmp/err"))
[ -n "$fed2" ] && [ "$fed2" -lt "$ctx1" ] && [ "$ctx2" -gt "$ctx1" ] && ok ||
    bad "chat turn 2 fed $fed2 tokens with $ctx1 already in context (ctx after: $ctx2): it should feed only the new turn"
grep -q "(conversation reset)" "$tmp/err" && ok || bad "chat /reset not acknowledged"
r1=$(sed -n 1p "$tmp/chat"); r3=$(sed -n 3p "$tmp/chat")
[ -n "$r1" ] && [ "$r1" = "$r3" ] && ok || bad "chat after /reset: '$r3' differs from the first reply '$r1'"
# turn 2 continues exactly the conversation the template renders (reply 1 ended at its turn limit)
python3 - "$tmp" "$r1" <<'PY' >"$tmp/req.json"
import json, sys
print(json.dumps({"messages": [
    {"role": "user", "content": "The old man walked slowly down the road."},
    {"role": "assistant", "content": sys.argv[2]},
    {"role": "user", "content": "And what did the dog do?"}]}))
PY
$QWENC chat-template -m $M --request "$tmp/req.json" --add-generation-prompt >"$tmp/conv" 2>"$tmp/err" && ok || bad "chat-template: $(cat "$tmp/err")"
grep -q "^<|im_start|>assistant$" "$tmp/conv" && ok || bad "rendered conversation lacks the generation prompt"

# --- tokenize / detokenize / chat-template on a tokenizer-only directory (no config.json, no weights)
T=tests/tokenizers/qwen3
[ ! -e $T/config.json ] && ok || bad "$T should hold tokenizer files only"
[ "$($QWENC tokenize -m $T "Hello world")" = "9707,1879" ] && ok || bad "tokenize Hello world"
[ "$($QWENC tokenize -m $T "<|im_start|>user")" = "151644,872" ] && ok || bad "tokenize parses special tokens"
[ "$($QWENC tokenize -m $T --no-parse-special "<|im_start|>")" != "151644" ] && ok || bad "--no-parse-special"
printf 'caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x91\x8d\n' >"$tmp/utf8"
ids=$($QWENC tokenize -m $T --file "$tmp/utf8")
$QWENC detokenize -m $T "$ids" >"$tmp/back"
cmp -s "$tmp/back" "$tmp/utf8" && ok || bad "detokenize(tokenize(x)) != x"
python3 - >"$tmp/case" <<'PY'
import json
for c in json.load(open("tests/templates/expected.json"))["cases"]:
    if c["template"] == "qwen3" and c["conversation"] == "tools_def" and c["add_generation_prompt"] and c["enable_thinking"] is False:
        open("/dev/stdout", "w").write(c["output"]); break
PY
[ -s "$tmp/case" ] && ok || bad "no qwen3/tools_def case in tests/templates/expected.json"
$QWENC chat-template -m $T --request tests/templates/conversations/tools_def.json --add-generation-prompt --no-think >"$tmp/got" 2>"$tmp/err"
cmp -s "$tmp/got" "$tmp/case" && ok || bad "chat-template differs from transformers: $(diff "$tmp/got" "$tmp/case" | head -5) $(cat "$tmp/err")"

# --- perplexity: the fixture window (with an <|endoftext|> inside) as text, one chunk of 160 tokens:
# the mean NLL must equal the one computed from transformers' logits of the same tokens
$QWENC detokenize -m $M "$(cat tests/fixtures/tiny-flash/tokens.txt)" >"$tmp/win.txt"
$QWENC perplexity -m $M -f "$tmp/win.txt" -c 160 >"$tmp/ppl" 2>"$tmp/err" && ok || bad "perplexity: $(cat "$tmp/err")"
want=$(python3 - <<'PY'
import math, struct
toks = [int(x) for x in open("tests/fixtures/tiny-flash/tokens.txt").read().split(",")]
V = 6016
raw = open("tests/fixtures/tiny-flash/logits_full.f32", "rb").read()
nll = 0.0
for i in range(len(toks) - 1):
    row = struct.unpack_from("<%df" % V, raw, 4 * V * i)
    mx = max(row)
    nll += math.log(sum(math.exp(x - mx) for x in row)) + mx - row[toks[i + 1]]
print(nll / (len(toks) - 1))
PY
)
got=$(sed -n 's/.*mean NLL \([0-9.]*\) over 159 tokens.*/\1/p' "$tmp/ppl")
python3 -c "import sys; g, w = float('${got:-nan}'), float('$want'); sys.exit(0 if abs(g - w) <= 1e-4 * w else 1)" && ok ||
    bad "perplexity mean NLL '$got' (transformers' logits give $want): $(cat "$tmp/ppl")"

# --- errors
$QWENC run -m $M 2>"$tmp/err"; [ $? -eq 1 ] && grep -q "give a prompt" "$tmp/err" && ok || bad "run without prompt"
$QWENC run -m $T -p hi 2>"$tmp/err"; [ $? -eq 1 ] && grep -q "config.json" "$tmp/err" && ok || bad "run on a tokenizer-only dir: $(cat "$tmp/err")"
$QWENC tokenize -m tests/fixtures/qwen3 hi 2>"$tmp/err"; [ $? -eq 1 ] && grep -q "tokenizer.json" "$tmp/err" && ok || bad "tokenize without tokenizer.json: $(cat "$tmp/err")"
echo '{"messages": [' >"$tmp/broken.json"
$QWENC chat-template -m $T --request "$tmp/broken.json" 2>"$tmp/err"; [ $? -eq 1 ] && grep -q "broken.json" "$tmp/err" && ok || bad "broken request: $(cat "$tmp/err")"
$QWENC run -m $M -p hi --temp -1 2>"$tmp/err"; [ $? -eq 1 ] && grep -q -- "--temp must be >= 0" "$tmp/err" && ok || bad "bad temperature: $(cat "$tmp/err")"

finish
