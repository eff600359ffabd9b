#!/usr/bin/env bash
# End-to-end tests of `qwenc serve` on the bundled model, over loopback with curl: the endpoints, replies equal to
# `qwenc run`'s for the same prompt and sampling (greedy, seeded, stop strings), streaming (the deltas sum to the
# reply, one id, usage only when asked), log-probabilities, tokenize / detokenize / apply-template against the CLI,
# /metrics, and every error status with OpenAI's error JSON naming the parameter.
source "$(dirname "$0")/lib_cli.sh"
source "$(dirname "$0")/lib_serve.sh"
M=models/tiny-flash
Q='Tell me about the city by the sea.'

start_server main -m $M -np 2 -c 512 --max-body 1 --max-queue 1 || { finish; exit 1; }

# --- health, models
[ "$(get /health)" = 200 ] && [ "$(jget "$tmp/body" 'j["status"]')" = ok ] && ok || bad "/health: $(cat "$tmp/body")"
[ "$(get /v1/models)" = 200 ] && [ "$(jget "$tmp/body" 'j["data"][0]["id"]')" = tiny-flash ] && ok \
    || bad "/v1/models: $(cat "$tmp/body")"

# --- a chat reply is `qwenc run --chat`'s: greedy, then seeded sampling with penalties
want=$($QWENC run -m $M --chat -p "$Q" -n 24 --temp 0 --no-display-prompt 2>/dev/null)
st=$(post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_tokens\":24,\"temperature\":0}")
got=$(jget "$tmp/body" 'j["choices"][0]["message"]["content"]')
[ "$st" = 200 ] && [ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "greedy chat: [$got], run gives [$want]"
[ "$(jget "$tmp/body" 'j["choices"][0]["finish_reason"]')" = length ] && \
    [ "$(jget "$tmp/body" '[j["usage"][k] for k in ("prompt_tokens","completion_tokens","total_tokens")]')" = \
      "$(jget "$tmp/body" '[j["usage"]["prompt_tokens"], 24, j["usage"]["prompt_tokens"] + 24]')" ] && \
    [ "$(jget "$tmp/body" 'j["object"] + " " + j["id"][:9]')" = "chat.completion chatcmpl-" ] && ok \
    || bad "chat reply shape: $(cat "$tmp/body")"
want=$($QWENC run -m $M --chat -p "$Q" -n 40 --temp 0.9 -s 7 --repeat-penalty 1.3 --top-k 20 --no-display-prompt 2>/dev/null)
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_tokens\":40,\"temperature\":0.9,\"seed\":7,\"repeat_penalty\":1.3,\"top_k\":20}" >/dev/null
got=$(jget "$tmp/body" 'j["choices"][0]["message"]["content"]')
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "seeded chat: [$got], run -s 7 gives [$want]"

# --- completions: the prompt as run reads it; stop strings as run's --stop
P='And it came to pass'
want=$($QWENC run -m $M -p "$P" -n 30 --temp 0 --no-display-prompt 2>/dev/null)
post /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":30,\"temperature\":0}" >/dev/null
got=$(jget "$tmp/body" 'j["choices"][0]["text"]')
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "completion: [$got], run gives [$want]"
want=$($QWENC run -m $M -p "$P" -n 30 --temp 0 --stop , --stop . --no-display-prompt 2>/dev/null)
post /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":30,\"temperature\":0,\"stop\":[\",\",\".\"]}" >/dev/null
got=$(jget "$tmp/body" 'j["choices"][0]["text"]')
[ "$got" = "$want" ] && [ "$(jget "$tmp/body" 'j["choices"][0]["finish_reason"]')" = stop ] && case "$got" in *,*|*.*) false;; esac \
    && ok || bad "stop strings: [$got] ($(jget "$tmp/body" 'j["choices"][0]["finish_reason"]')), run gives [$want]"
post /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":8,\"temperature\":0,\"echo\":true}" >/dev/null
case "$(jget "$tmp/body" 'j["choices"][0]["text"]')" in "$P"?*) ok ;; *) bad "echo: $(cat "$tmp/body")" ;; esac

# --- streaming: the deltas sum to the reply; one id; usage only with include_usage
body="{\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}],\"max_tokens\":20,\"temperature\":0"
post /v1/chat/completions "$body}" "$tmp/whole" >/dev/null
curl -sN -m 60 "$URL/v1/chat/completions" -d "$body,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$tmp/s1"
sse "$tmp/s1" >"$tmp/s1.json"
[ "$(jget "$tmp/s1.json" 'j["problems"]')" = "[]" ] && ok || bad "stream: $(jget "$tmp/s1.json" 'j["problems"]')"
[ "$(jget "$tmp/s1.json" 'j["content"]')" = "$(jget "$tmp/whole" 'j["choices"][0]["message"]["content"]')" ] && ok \
    || bad "stream content [$(jget "$tmp/s1.json" 'j["content"]')] differs from the reply's"
[ "$(jget "$tmp/s1.json" '[j["usage"]["completion_tokens"], j["usage"]["prompt_tokens"], j["finish_reason"]]')" = \
  "$(jget "$tmp/whole" '[j["usage"]["completion_tokens"], j["usage"]["prompt_tokens"], "length"]')" ] && ok \
    || bad "stream usage: $(jget "$tmp/s1.json" 'j["usage"]')"
grep -q '"usage":null' "$tmp/s1" && ok || bad "with include_usage, chunks carry \"usage\": null"
curl -sN -m 60 "$URL/v1/chat/completions" -d "$body,\"stream\":true}" >"$tmp/s2"
sse "$tmp/s2" >"$tmp/s2.json"
[ "$(jget "$tmp/s2.json" '[j["problems"], j["usage"]]')" = "[[], null]" ] && ! grep -q usage "$tmp/s2" && ok \
    || bad "stream without include_usage: $(cat "$tmp/s2.json")"
curl -sN -m 60 "$URL/v1/completions" -d "{\"prompt\":\"$P\",\"max_tokens\":30,\"temperature\":0,\"stream\":true}" >"$tmp/s3"
[ "$(jget <(sse "$tmp/s3") 'j["text"]')" = "$($QWENC run -m $M -p "$P" -n 30 --temp 0 --no-display-prompt 2>/dev/null)" ] \
    && ok || bad "streamed completion: $(head -c 300 "$tmp/s3")"

# --- log-probabilities: one entry per token, the greedy token first among its alternatives, sorted
post /v1/chat/completions "$body,\"logprobs\":true,\"top_logprobs\":3}" >/dev/null
r=$(jget "$tmp/body" '(lambda c: [len(c) == j["usage"]["completion_tokens"], all(e["token"] == e["top_logprobs"][0]["token"] and len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 and [t["logprob"] for t in e["top_logprobs"]] == sorted([t["logprob"] for t in e["top_logprobs"]], reverse=True) for e in c), "".join(e["token"] for e in c) == j["choices"][0]["message"]["content"]])(j["choices"][0]["logprobs"]["content"])')
[ "$r" = "[true, true, true]" ] && ok || bad "chat logprobs: $r"
post /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":5,\"temperature\":0,\"logprobs\":2}" >/dev/null
r=$(jget "$tmp/body" '(lambda l: [len(l["tokens"]), len(l["token_logprobs"]), len(l["top_logprobs"]), all(len(t) == 2 for t in l["top_logprobs"])])(j["choices"][0]["logprobs"])')
[ "$r" = "[5, 5, 5, true]" ] && ok || bad "completion logprobs: $r"

# --- tokenize, detokenize, apply-template: what the CLI gives
post /tokenize '{"content":"Hello world, and the LORD"}' >/dev/null
[ "$(jget "$tmp/body" 'j["tokens"]' | tr -d ' ')" = "[$($QWENC tokenize -m $M 'Hello world, and the LORD')]" ] && ok \
    || bad "/tokenize: $(cat "$tmp/body") vs $($QWENC tokenize -m $M 'Hello world, and the LORD')"
post /detokenize "{\"tokens\":$(jget "$tmp/body" 'j["tokens"]')}" "$tmp/detok" >/dev/null
[ "$(jget "$tmp/detok" 'j["content"]')" = "Hello world, and the LORD" ] && ok || bad "/detokenize: $(cat "$tmp/detok")"
echo "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"$Q\"}]}" >"$tmp/req.json"
post /apply-template "$(cat "$tmp/req.json")" >/dev/null
[ "$(jget "$tmp/body" 'j["prompt"]')" = "$($QWENC chat-template -m $M --request "$tmp/req.json" --add-generation-prompt)" ] \
    && ok || bad "/apply-template: $(cat "$tmp/body")"

# --- errors: OpenAI's error JSON, the right status, the parameter named
err() { # NAME STATUS PARAM|- MESSAGE-PART STATUS-GOT
    local name=$1 want=$2 param=$3 part=$4 got=$5
    local p m
    p=$(jget "$tmp/body" 'j["error"]["param"]') m=$(jget "$tmp/body" 'j["error"]["message"]')
    if [ "$got" = "$want" ] && { [ "$param" = - ] || [ "$p" = "$param" ]; } && case "$m" in *"$part"*) true;; *) false;; esac; then ok
    else bad "$name: status $got (want $want), $(head -c 300 "$tmp/body")"; fi
}
err "malformed JSON" 400 - "not valid JSON" "$(post /v1/chat/completions '{"messages": [')"
err "bad temperature" 400 temperature "'temperature' must be a number >= 0, got a string" \
    "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}')"
err "top_p out of range" 400 top_p "in (0, 1]" "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"top_p":1.5}')"
err "n = 2" 400 n "must be 1" "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":2}')"
err "json_object" 400 response_format "grammar-constrained" \
    "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}')"
err "tool_choice required" 400 tool_choice "grammar-constrained" \
    "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}')"
err "bad role" 400 "messages[1].role" "got robot" \
    "$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"},{"role":"robot","content":"y"}]}')"
err "image content" 400 "messages[0].content" "only text content" \
    "$(post /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}')"
err "no messages" 400 messages "non-empty array" "$(post /v1/chat/completions '{"model":"x"}')"
long=$(python3 -c 'print("And it came to pass " * 150)')
err "prompt longer than the context" 400 messages "more than the context of 512 tokens" \
    "$(post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}]}")"
[ "$(jget "$tmp/body" 'j["error"]["code"]')" = context_length_exceeded ] && ok || bad "context error code: $(cat "$tmp/body")"
err "unknown path" 404 - "no endpoint POST /v1/nothing" "$(post /v1/nothing '{}')"
err "wrong method" 405 - "takes POST, not GET" "$(get /v1/chat/completions)"
curl -s -m 10 -D "$tmp/hdr" -o /dev/null "$URL/v1/completions"
grep -qi '^allow: POST' "$tmp/hdr" && ok || bad "405 without Allow: $(cat "$tmp/hdr")"
python3 -c 'import json; print(json.dumps({"prompt": "x" * (1100 * 1024)}))' >"$tmp/big.json"
st=$(curl -s -m 30 -o "$tmp/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$tmp/big.json" "$URL/v1/completions")
err "body too large" 413 - "larger than 1048576 bytes" "$st"
st=$(curl -s -m 30 -o "$tmp/body" -w '%{http_code}' -H "X-Big: $(head -c 70000 /dev/zero | tr '\0' a)" "$URL/health")
[ "$st" = 431 ] || [ "$st" = 413 ] && ok || bad "headers over 64 KiB: status $st"
[ "$(get /health)" = 200 ] && ok || bad "the server does not answer after the refusals"

# --- 503: a full queue (2 slots, a queue of 1; three long streams take them)
cpids=""
for i in 1 2 3; do
    curl -sN -m 60 "$URL/v1/completions" -d "{\"prompt\":\"$P $i\",\"max_tokens\":-1,\"temperature\":0,\"stream\":true}" >"$tmp/long$i" &
    cpids="$cpids $!"
done
busy() { [ "$(curl -s -m 5 "$URL/metrics" | sed -n 's/^qwenc_requests_deferred //p')" = 1 ]; }
for _ in $(seq 200); do busy && break; sleep 0.05; done
err "queue full" 503 - "the queue is full" "$(post /v1/completions "{\"prompt\":\"$P\",\"max_tokens\":1}")"
wait $cpids

# --- /metrics: Prometheus text with the counts of what was asked
get /metrics >/dev/null
n_chat=$(sed -n 's/^qwenc_requests_total{endpoint="chat_completions"} //p' "$tmp/body")
[ "${n_chat:-0}" -ge 10 ] && grep -q '^# TYPE qwenc_tokens_predicted_total counter' "$tmp/body" && \
    grep -q '^qwenc_prefix_cache_hits_total [1-9]' "$tmp/body" && grep -q '^qwenc_responses_total{status="413"} 1$' "$tmp/body" \
    && ok || bad "/metrics: $(head -c 600 "$tmp/body")"
stop_server && ok || bad "the server did not exit 0 on SIGTERM: $(tail -n 3 "$tmp/main.log")"

# --- an API key: 401 without it or with a wrong one, /health open
start_server key -m $M -np 1 --api-key s3cret || { finish; exit 1; }
err "no key" 401 - "API key is required" "$(post /v1/completions '{"prompt":"x","max_tokens":1}')"
st=$(curl -s -m 10 -o "$tmp/body" -w '%{http_code}' -H 'Authorization: Bearer wrong' "$URL/v1/models")
err "wrong key" 401 - "not valid" "$st"
st=$(curl -s -m 10 -o "$tmp/body" -w '%{http_code}' -H 'Authorization: Bearer s3cret' -d '{"prompt":"x","max_tokens":1}' "$URL/v1/completions")
[ "$st" = 200 ] && [ "$(get /health)" = 200 ] && ok || bad "with the key: $st $(cat "$tmp/body")"
stop_server && ok || bad "key server exit"

# --- options checked before anything starts
expect_error "serve: a port out of range" "--port expects a port in [0, 65535]" $QWENC serve -m $M --port 70000
finish
