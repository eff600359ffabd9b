#!/usr/bin/env bash
# End-to-end tests of the server's slots and prefix cache on the bundled model: 8 concurrent greedy clients (on 4
# slots, prompts long enough to be fed in several chunks while other slots decode) each get exactly the reply the
# same request gets alone; a 3-turn conversation reports as cached the prefix the server had processed and
# answers as a fresh server does; a client that leaves (streaming or not) frees its slot; SIGTERM lets a request
# finish, refuses new connections, and a second signal ends a long stream with an error event; a bounded load
# (SERVE_LOAD requests, default 2000, over 16 connections) has no failure and a resident size that stays flat once
# the prefix cache is full.
source "$(dirname "$0")/lib_cli.sh"
source "$(dirname "$0")/lib_serve.sh"
M=models/tiny-flash

# --- 8 clients at once, each reply as when alone (the odd ones stream)
python3 - "$tmp" <<'EOF'
import json, sys
seeds = ["The old man walked slowly to the sea", "And the LORD spake unto Moses", "She looked at him and",
         "The jury said that the city", "In the beginning was the word", "He had been in his room all day",
         "Go ye into the land of Canaan", "The house stood on a hill"]
for i, s in enumerate(seeds):
    content = (s + ". ") * (1 + 3 * (i % 4))  # 10 to 120 tokens: several prompt chunks of 64 for some
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 48, "temperature": 0}
    if i % 2:
        body["stream"] = True
    json.dump(body, open("%s/req%d.json" % (sys.argv[1], i), "w"))
EOF
reply() { # FILE: the reply's text, streamed or not
    if grep -q '^data: ' "$1"; then jget <(sse "$1") 'j["content"]'; else jget "$1" 'j["choices"][0]["message"]["content"]'; fi
}
start_server alone -m $M -np 4 || { finish; exit 1; }
for i in 0 1 2 3 4 5 6 7; do curl -sN -m 60 "$URL/v1/chat/completions" -d @"$tmp/req$i.json" >"$tmp/alone$i"; done
stop_server
start_server together -m $M -np 4 || { finish; exit 1; }
cpids=""
for i in 0 1 2 3 4 5 6 7; do
    curl -sN -m 60 "$URL/v1/chat/completions" -d @"$tmp/req$i.json" >"$tmp/together$i" &
    cpids="$cpids $!"
done
wait $cpids
same=0
for i in 0 1 2 3 4 5 6 7; do
    a=$(reply "$tmp/alone$i") b=$(reply "$tmp/together$i")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then same=$((same + 1)); else echo "  request $i: alone [$a] together [$b]"; fi
done
[ $same = 8 ] && ok || bad "$same of 8 concurrent replies equal the reply alone"
get /metrics >/dev/null
steps=$(sed -n 's/^qwenc_decode_steps_total //p' "$tmp/body") gen=$(sed -n 's/^qwenc_tokens_predicted_total //p' "$tmp/body")
[ -n "$steps" ] && [ "$steps" -lt "$gen" ] && ok || bad "decode steps $steps for $gen tokens: the slots did not decode together"
stop_server

# --- a 3-turn conversation: what the server had processed is reused, and the answer is a fresh server's
start_server conv -m $M -np 2 || { finish; exit 1; }
conv_py='
import json, sys
tmp, turn = sys.argv[1], int(sys.argv[2])
users = ["Tell me about the city by the sea.", "And what did the king say?", "Where did they go then?"]
msgs = [{"role": "system", "content": "You speak as the scriptures do."}]
for t in range(turn + 1):
    msgs.append({"role": "user", "content": users[t]})
    if t < turn:
        r = json.load(open("%s/turn%d.json" % (tmp, t)))
        msgs.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
print(json.dumps({"messages": msgs, "max_tokens": 40, "temperature": 0, "logprobs": True}))'
for t in 0 1 2; do
    python3 -c "$conv_py" "$tmp" $t >"$tmp/conv$t.json"
    post /apply-template "$(cat "$tmp/conv$t.json")" "$tmp/tmpl$t.json" >/dev/null
    post /tokenize "{\"content\":$(jget "$tmp/tmpl$t.json" 'json.dumps(j["prompt"])')}" "$tmp/ids$t.json" >/dev/null
    st=$(post /v1/chat/completions "$(cat "$tmp/conv$t.json")" "$tmp/turn$t.json")
    [ "$st" = 200 ] || bad "turn $t: $st $(cat "$tmp/turn$t.json")"
done
# what the slot holds after a turn: its prompt and the tokens generated, but the last one sampled (the end id, or
# the token that reached max_tokens) which is never fed; a later prompt that starts with all of it continues the
# slot, else the snapshot at the end of the previous prompt is restored
check_py='
import json, sys
tmp, t = sys.argv[1], int(sys.argv[2])
prev = json.load(open("%s/ids%d.json" % (tmp, t - 1)))["tokens"]
r = json.load(open("%s/turn%d.json" % (tmp, t - 1)))
gen = [e["id"] for e in r["choices"][0]["logprobs"]["content"]]
held = prev + (gen if r["choices"][0]["finish_reason"] == "stop" else gen[:-1])
now = json.load(open("%s/ids%d.json" % (tmp, t)))["tokens"]
want = len(held) if now[:len(held)] == held and len(held) < len(now) else len(prev)
u = json.load(open("%s/turn%d.json" % (tmp, t)))["usage"]
print(u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"], want, len(now))'
for t in 1 2; do
    read -r cached n want n_now < <(python3 -c "$check_py" "$tmp" $t)
    [ "$cached" = "$want" ] && [ "$n" = "$n_now" ] && [ "$cached" -gt 0 ] && ok \
        || bad "turn $((t + 1)): cached_tokens $cached of $n, want $want of $n_now"
done
stop_server
for t in 1 2; do
    start_server fresh$t -m $M -np 2 || { finish; exit 1; }
    post /v1/chat/completions "$(cat "$tmp/conv$t.json")" "$tmp/fresh$t.json" >/dev/null
    a=$(jget "$tmp/turn$t.json" 'j["choices"][0]["message"]["content"]') b=$(jget "$tmp/fresh$t.json" 'j["choices"][0]["message"]["content"]')
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(jget "$tmp/fresh$t.json" 'j["usage"]["prompt_tokens_details"]["cached_tokens"]')" = 0 ] \
        && ok || bad "turn $((t + 1)) with the cache [$a], a fresh server [$b]"
    stop_server
done

# --- a client that leaves frees its slot (one slot: the next request would wait for the runaway generation)
start_server leave -m $M -np 1 -c 4096 || { finish; exit 1; }
metric() { curl -s -m 5 "$URL/metrics" | sed -n "s/^qwenc_$1 //p"; }
long='{"prompt":"And it came to pass","max_tokens":-1,"temperature":0'
curl -sN -m 60 "$URL/v1/completions" -d "$long,\"stream\":true}" >"$tmp/left" &
cpid=$!
for _ in $(seq 200); do [ -s "$tmp/left" ] && break; sleep 0.05; done
kill "$cpid"; wait "$cpid" 2>/dev/null
for _ in $(seq 100); do [ "$(metric requests_processing)" = 0 ] && break; sleep 0.05; done
[ "$(metric requests_processing)" = 0 ] && [ "$(metric requests_cancelled_total)" = 1 ] && ok \
    || bad "a stream left: $(metric requests_processing) processing, $(metric requests_cancelled_total) cancelled"
curl -s -m 1 "$URL/v1/completions" -d "$long}" >/dev/null 2>&1 # not streamed: curl gives up after 1 s
for _ in $(seq 100); do [ "$(metric requests_processing)" = 0 ] && break; sleep 0.05; done
[ "$(metric requests_processing)" = 0 ] && [ "$(metric requests_cancelled_total)" = 2 ] && ok \
    || bad "a request left: $(metric requests_processing) processing, $(metric requests_cancelled_total) cancelled"
st=$(post /v1/completions '{"prompt":"And it came to pass","max_tokens":4,"temperature":0}')
[ "$st" = 200 ] && [ "$(jget "$tmp/body" 'j["usage"]["completion_tokens"]')" = 4 ] && ok || bad "after leaving: $st"
grep -q "the client left: generation cancelled" "$tmp/leave.log" && ok || bad "no log of the cancellation"

# --- SIGTERM: a request in flight finishes; no new connections; the server exits 0
curl -sN -m 60 "$URL/v1/completions" -d '{"prompt":"And it came to pass","max_tokens":300,"temperature":0,"stream":true}' >"$tmp/inflight" &
cpid=$!
for _ in $(seq 200); do [ -s "$tmp/inflight" ] && break; sleep 0.05; done
kill -TERM "$SPID"
for _ in $(seq 200); do grep -q "no new connections" "$tmp/leave.log" && break; sleep 0.05; done
curl -s -m 5 -o /dev/null "$URL/health"; rc=$?
wait "$cpid"
wait "$SPID"; src=$?
[ "$rc" = 7 ] && ok || bad "a new connection after SIGTERM: curl exit $rc, want 7 (refused)"
[ "$(jget <(sse "$tmp/inflight") '[j["problems"], j["finish_reason"], j["usage"], j["error"]]')" = '[[], "length", null, null]' ] \
    && ok || bad "the request in flight at SIGTERM: $(tail -c 300 "$tmp/inflight")"
[ "$src" = 0 ] && grep -q "qwenc: stopped" "$tmp/leave.log" && ok || bad "exit $src after SIGTERM: $(tail -n 3 "$tmp/leave.log")"
# a second signal ends a long stream at once, with an error event
start_server term -m $M -np 1 -c 4096 || { finish; exit 1; }
curl -sN -m 60 "$URL/v1/completions" -d "$long,\"stream\":true}" >"$tmp/cut" &
cpid=$!
for _ in $(seq 200); do [ -s "$tmp/cut" ] && break; sleep 0.05; done
kill -TERM "$SPID"
for _ in $(seq 200); do grep -q "no new connections" "$tmp/term.log" && break; sleep 0.05; done
kill -TERM "$SPID"
wait "$cpid"
wait "$SPID"; src=$?
[ "$src" = 0 ] && [ "$(jget <(sse "$tmp/cut") '[j["error"]["message"], j["problems"]]')" = '["the server is shutting down", []]' ] \
    && grep -q "ended 1 request with an error" "$tmp/term.log" && ok \
    || bad "a second SIGTERM: exit $src, $(tail -c 300 "$tmp/cut"); $(tail -n 2 "$tmp/term.log")"

# --- a bounded load: no failure, resident memory flat once the cache is full
N=${SERVE_LOAD:-2000}
# under AddressSanitizer (make asan) each request is several times slower and freed memory is held in quarantine:
# 200 requests, and the resident size is not a measure of leaks there (LeakSanitizer is)
asan=0
ldd "$QWENC" 2>/dev/null | grep -q libasan && asan=1 N=${SERVE_LOAD:-200}
start_server load -m $M -np 4 --cache-ram 8 -q || { finish; exit 1; }
load_cfg() { # COUNT FILE: curl --config for COUNT requests over 20 prompts, a quarter streamed
    python3 - "$1" "$URL" >"$2" <<'EOF'
import json, sys
n, url = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    body = {"messages": [{"role": "user", "content": "Tell me about the city number %d by the sea." % (i % 20)}],
            "max_tokens": 8, "temperature": 0.7, "seed": i}
    if i % 4 == 0:
        body["stream"] = True
    print('url = "%s/v1/chat/completions"\ndata = %s\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"' %
          (url, json.dumps(json.dumps(body))))
EOF
}
rss() { sed -n 's/^VmRSS:[^0-9]*\([0-9]*\) kB/\1/p' "/proc/$SPID/status"; }
load_cfg $((N / 2)) "$tmp/warm.cfg"
load_cfg "$N" "$tmp/load.cfg"
timeout 60 curl -s --no-progress-meter --parallel --parallel-max 16 -H 'Content-Type: application/json' --config "$tmp/warm.cfg" >"$tmp/warm.codes"
rss0=$(rss)
timeout 60 curl -s --no-progress-meter --parallel --parallel-max 16 -H 'Content-Type: application/json' --config "$tmp/load.cfg" >"$tmp/load.codes"
rss1=$(rss)
n200=$(grep -c '^200$' "$tmp/load.codes")
[ "$n200" = "$N" ] && ok || bad "load: $n200 of $N requests answered 200 ($(sort "$tmp/load.codes" | uniq -c | tr '\n' ' '))"
[ "$asan" = 1 ] || { [ -n "$rss0" ] && [ $((rss1 - rss0)) -lt 8192 ] && ok || bad "load: resident size $rss0 kB after warm-up, $rss1 kB after $N more"; }
[ "$(metric requests_processing)" = 0 ] && [ "$(metric prefix_cache_bytes)" -le $((8 << 20)) ] && ok \
    || bad "load: $(metric requests_processing) processing, cache $(metric prefix_cache_bytes) bytes"
echo "  load: $N requests, resident $rss0 kB -> $rss1 kB"
stop_server
finish
