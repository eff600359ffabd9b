#!/usr/bin/env bash
# End-to-end tests of the server's reasoning and tool-call parsing, on two scripted models (tests/serve_model.py)
# whose greedy reply is fixed: Qwen3.5's XML tool calls with Qwen3.5's chat template, and Qwen3's JSON tool calls
# with Qwen3's. For each: the reply split into reasoning_content, content and tool_calls, streamed and not (the
# stream's deltas: index on every tool-call chunk, id and name on the first only, no raw tag in content); with
# enable_thinking false no reasoning; without tools the markup stays content; a tool round trip (the call and its
# result sent back) renders as the template renders it and reuses the first turn's prompt.
source "$(dirname "$0")/lib_cli.sh"
source "$(dirname "$0")/lib_serve.sh"

python3 tests/serve_model.py --expected >"$tmp/expected.json"
exp() { jget "$tmp/expected.json" "$1"; }
TOOLS='[{"type":"function","function":{"name":"get_weather","description":"The weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}]'
ASK='{"role":"user","content":"What is the weather in Paris?"}'

# calls FILE EXPR: the tool calls at EXPR of FILE as [[name, arguments parsed], ...]
calls() { jget "$1" "[[c['function']['name'] if 'function' in c else c['name'], json.loads(c['function']['arguments'] if 'function' in c else c['arguments'])] for c in $2]"; }
want_calls=$(jget "$tmp/expected.json" '[[c["name"], c["arguments"]] for c in j["tool_calls"]]')

for form in xml json; do
    echo "-- the $form form"
    python3 tests/serve_model.py "$tmp/$form" $form || { bad "serve_model.py $form"; continue; }
    start_server $form -m "$tmp/$form" -np 2 || continue

    # not streamed
    st=$(post /v1/chat/completions "{\"messages\":[$ASK],\"tools\":$TOOLS}")
    r=$(jget "$tmp/body" '[j["choices"][0]["message"].get("reasoning_content"), j["choices"][0]["message"]["content"], j["choices"][0]["finish_reason"]]')
    [ "$st" = 200 ] && [ "$r" = "$(jget "$tmp/expected.json" '[j["reasoning"], j["content"], "tool_calls"]')" ] && ok \
        || bad "$form: reasoning, content, finish_reason: $r"
    [ "$(calls "$tmp/body" 'j["choices"][0]["message"]["tool_calls"]')" = "$want_calls" ] && ok \
        || bad "$form: tool calls $(calls "$tmp/body" 'j["choices"][0]["message"]["tool_calls"]'), want $want_calls"
    r=$(jget "$tmp/body" '(lambda c: [all(x["id"].startswith("call_") and x["type"] == "function" and "index" not in x for x in c), len(set(x["id"] for x in c)) == len(c)])(j["choices"][0]["message"]["tool_calls"])')
    [ "$r" = "[true, true]" ] && ok || bad "$form: tool call ids and types: $(cat "$tmp/body")"
    cp "$tmp/body" "$tmp/turn1.json"

    # streamed: the same reply in deltas, and the format's promises (tests/serve_sse.py)
    curl -sN -m 60 "$URL/v1/chat/completions" -d "{\"messages\":[$ASK],\"tools\":$TOOLS,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$tmp/s"
    sse "$tmp/s" >"$tmp/s.json"
    [ "$(jget "$tmp/s.json" 'j["problems"]')" = "[]" ] && ok || bad "$form stream: $(jget "$tmp/s.json" 'j["problems"]')"
    r=$(jget "$tmp/s.json" '[j["reasoning"], j["content"], j["finish_reason"], j["usage"]["completion_tokens"] > 0]')
    [ "$r" = "$(jget "$tmp/expected.json" '[j["reasoning"], j["content"], "tool_calls", True]')" ] && ok || bad "$form stream: $r"
    [ "$(calls "$tmp/s.json" 'j["tool_calls"]')" = "$want_calls" ] && ok || bad "$form stream calls: $(jget "$tmp/s.json" 'j["tool_calls"]')"
    # enable_thinking false: no reasoning, the same calls
    post /v1/chat/completions "{\"messages\":[$ASK],\"tools\":$TOOLS,\"chat_template_kwargs\":{\"enable_thinking\":false}}" >/dev/null
    r=$(jget "$tmp/body" '["reasoning_content" in j["choices"][0]["message"], j["choices"][0]["message"]["content"]]')
    [ "$r" = "[false, \"$(exp 'j["content"]')\"]" ] && [ "$(calls "$tmp/body" 'j["choices"][0]["message"]["tool_calls"]')" = "$want_calls" ] \
        && ok || bad "$form without thinking: $(cat "$tmp/body")"
    curl -sN -m 60 "$URL/v1/chat/completions" -d "{\"messages\":[$ASK],\"tools\":$TOOLS,\"stream\":true,\"chat_template_kwargs\":{\"enable_thinking\":false}}" >"$tmp/s2"
    [ "$(jget <(sse "$tmp/s2") '[j["problems"], j["reasoning"]]')" = '[[], ""]' ] && ok || bad "$form stream without thinking: $(sse "$tmp/s2")"

    # without tools (or tool_choice none) the markup is content, never a call
    for extra in "" ",\"tools\":$TOOLS,\"tool_choice\":\"none\""; do
        post /v1/chat/completions "{\"messages\":[$ASK]$extra}" >/dev/null
        r=$(jget "$tmp/body" '["tool_calls" in j["choices"][0]["message"], "<tool_call>" in j["choices"][0]["message"]["content"], j["choices"][0]["finish_reason"]]')
        [ "$r" = '[false, true, "stop"]' ] && ok || bad "$form without tools ($extra): $r"
    done

    # the round trip: the calls and their results sent back
    python3 - "$tmp/turn1.json" "$TOOLS" >"$tmp/turn2.json" <<'EOF'
import json, sys
t1 = json.load(open(sys.argv[1]))
m = t1["choices"][0]["message"]
results = {"get_weather": '{"temp": 21, "sky": "clear"}', "get_time": '"12:00"'}
msgs = [{"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning_content"], "tool_calls": m["tool_calls"]}]
msgs += [{"role": "tool", "tool_call_id": c["id"], "content": results[c["function"]["name"]]} for c in m["tool_calls"]]
print(json.dumps({"messages": msgs, "tools": json.loads(sys.argv[2])}))
EOF
    st=$(post /apply-template "$(cat "$tmp/turn2.json")" "$tmp/prompt2.json")
    r=$(jget "$tmp/prompt2.json" '["<tool_response>\n{\"temp\": 21, \"sky\": \"clear\"}\n</tool_response>" in j["prompt"], "<tool_response>\n\"12:00\"\n</tool_response>" in j["prompt"], ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>" if "'$form'" == "xml" else "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}") in j["prompt"]]')
    [ "$st" = 200 ] && [ "$r" = "[true, true, true]" ] && ok || bad "$form round trip rendering: $r $(head -c 300 "$tmp/prompt2.json")"
    st=$(post /v1/chat/completions "$(cat "$tmp/turn2.json")")
    n1=$(jget "$tmp/turn1.json" 'j["usage"]["prompt_tokens"]')
    r=$(jget "$tmp/body" "[j['choices'][0]['finish_reason'], j['usage']['prompt_tokens_details']['cached_tokens'] >= $n1, j['usage']['prompt_tokens_details']['cached_tokens'] < j['usage']['prompt_tokens']]")
    [ "$st" = 200 ] && [ "$r" = '["tool_calls", true, true]' ] && ok || bad "$form round trip: $r $(head -c 400 "$tmp/body")"

    stop_server && ok || bad "$form server exit"
done
finish
