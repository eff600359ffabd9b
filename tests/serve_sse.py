#!/usr/bin/env python3
"""serve_sse.py - read a server-sent event stream of /v1/chat/completions or /v1/completions (as curl -N saved it),
check what OpenAI's stream format promises, and print its sum as JSON:

    {"content", "reasoning", "text", "tool_calls": [{"id", "name", "arguments"}], "finish_reason", "usage",
     "chunks", "problems": [...]}

Problems are what breaks the format: an event that is not JSON, no [DONE] at the end, chunks of several ids, a
first chat delta without the role, a tool-call delta without its index, an id / type / name after a call's first
delta, a call announced out of order, a raw tag (<think>, <tool_call>, <function=, <parameter=, and their closing
forms) in a content or reasoning delta, a usage chunk with choices, an error event.
"""
import json
import sys

TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
        "</parameter>"]


def main():
    events = []
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f.read().split("\n"):
            if line.startswith("data: "):
                events.append(line[6:])
    out = {"content": "", "reasoning": "", "text": "", "tool_calls": [], "finish_reason": None, "usage": None,
           "chunks": 0, "problems": [], "error": None}
    p = out["problems"]
    if not events or events[-1] != "[DONE]":
        p.append("the stream does not end with [DONE]")
    ids = set()
    first_delta = True
    for e in events:
        if e == "[DONE]":
            continue
        try:
            c = json.loads(e)
        except ValueError:
            p.append("an event is not JSON: " + e[:80])
            continue
        if "error" in c:
            out["error"] = c["error"]
            continue
        out["chunks"] += 1
        ids.add(c.get("id"))
        if c.get("usage"):
            out["usage"] = c["usage"]
            if c.get("choices"):
                p.append("the usage chunk has choices")
        for ch in c.get("choices", []):
            if ch.get("finish_reason"):
                out["finish_reason"] = ch["finish_reason"]
            if "text" in ch:
                out["text"] += ch["text"]
                continue
            d = ch.get("delta", {})
            if first_delta and d.get("role") != "assistant":
                p.append("the first delta has no role")
            first_delta = False
            for key, name in (("content", "content"), ("reasoning_content", "reasoning")):
                v = d.get(key)
                if v:
                    for t in TAGS:
                        if t in v:
                            p.append("a raw tag %s in a %s delta: %r" % (t, key, v))
                    out[name] += v
            for t in d.get("tool_calls") or []:
                if "index" not in t:
                    p.append("a tool-call delta without index")
                    continue
                i = t["index"]
                calls = out["tool_calls"]
                if i == len(calls):
                    if not t.get("id") or t.get("type") != "function" or not t.get("function", {}).get("name"):
                        p.append("the first delta of call %d lacks its id, type or name" % i)
                    calls.append({"id": t.get("id"), "name": t.get("function", {}).get("name"), "arguments": ""})
                elif i == len(calls) - 1:
                    if "id" in t or "type" in t or "name" in t.get("function", {}):
                        p.append("call %d repeats its id, type or name" % i)
                else:
                    p.append("call %d announced out of order" % i)
                    continue
                calls[i]["arguments"] += t.get("function", {}).get("arguments", "")
    if len(ids) > 1:
        p.append("chunks of several ids")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
