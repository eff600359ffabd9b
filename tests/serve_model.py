#!/usr/bin/env python3
"""serve_model.py - write a scripted model for the server's tests: a one-layer Llama whose greedy reply is a
fixed script, so that the parsing of reasoning and of both forms of Qwen tool calls is tested end to end.

    python3 tests/serve_model.py OUT_DIR xml|json

The model is a bigram table: attention and MLP add nothing (o_proj and down_proj are zero), so the logits of a
position depend on its token alone. Each token of the script has its own embedding direction and the lm_head
maps it to the next token of the script; every other token maps to the script's first token. The tokenizer is
byte-level BPE without merges (a token per byte) plus the script's pieces as added tokens, so a prompt that
ends with the template's generation prompt enters the script where the template leaves off:

    ... assistant\\n            -> "<think>\\n" reasoning "\\n</think>\\n\\n" content tool calls <|im_end|>
    ... <think>\\n              -> reasoning ...   (Qwen3.5's prompt when thinking)
    ... \\n</think>\\n\\n        -> content ...     (enable_thinking false)

The pieces cut the tags at awkward places ("<tool_" | "call>..."), as a real tokenizer may, so that a
streaming parser must hold back a partial tag. The xml form is Qwen3.5's (<function=...><parameter=...>) with
Qwen3.5's chat template; the json form is Qwen3's (a JSON object in <tool_call>) with Qwen3's template.
The expected parse of each script is in EXPECTED below, written by hand from the script, and printed with
--expected.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPTS = {
    "xml": [
        "<think>\n", "The user asks about", " the weather.", "\n</think>\n\n",
        "Let me", " check.", "\n\n<tool_", "call>\n<function=get_", "weather>\n<parameter=ci", "ty>\nPar",
        "is\n</param", "eter>\n<parameter=days>\n3\n</parameter>\n</func", "tion>\n</tool_call>",
        "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "<|im_end|>",
    ],
    "json": [
        "<think>\n", "The user asks about", " the weather.", "\n</think>\n\n",
        "Let me", " check.", "\n\n<tool_", "call>\n{\"name\": \"get_wea", "ther\", \"arguments\": {\"city\": ",
        "\"Paris\", \"days\": 3}}\n</tool_", "call>", "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "<|im_end|>",
    ],
}
TEMPLATES = {"xml": "qwen3.5-4b.jinja", "json": "qwen3.jinja"}
EXPECTED = {
    "reasoning": "The user asks about the weather.",
    "content": "Let me check.",
    "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                   {"name": "get_time", "arguments": {}}],
}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: byte b is the character bs[b]."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, data) in tensors.items():
        raw = struct.pack("<%df" % len(data), *data)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--expected":
        print(json.dumps(EXPECTED))
        return
    if len(sys.argv) != 3 or sys.argv[2] not in SCRIPTS:
        sys.exit("usage: serve_model.py OUT_DIR xml|json  (or --expected)")
    out, form = sys.argv[1], sys.argv[2]
    script = SCRIPTS[form]
    os.makedirs(out, exist_ok=True)
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    added = SPECIAL + [p for p in script if p not in SPECIAL]
    ids = {p: 256 + i for i, p in enumerate(added)}
    V, H, F = 256 + len(added), 64, 96
    assert len(script) < H

    # the state of a token: 1 + its place in the script, 0 for every other token
    state = [0] * V
    for k, p in enumerate(script):
        state[ids[p]] = k + 1
    nxt = [ids[script[0]]] + [ids[script[k + 1]] if k + 1 < len(script) else ids["<|im_end|>"]
                              for k in range(len(script))]
    emb = [0.0] * (V * H)
    for t in range(V):
        emb[t * H + state[t]] = 1.0
    head = [0.0] * (V * H)
    for s, t in enumerate(nxt):
        head[t * H + s] = 4.0  # after the final norm a one-hot row is sqrt(H) = 8: logit 32 against 0
    zeros = lambda n: [0.0] * n
    ones = lambda n: [1.0] * n
    nh, nkv, hd = 4, 2, 16
    tensors = {
        "model.embed_tokens.weight": ([V, H], emb),
        "model.layers.0.input_layernorm.weight": ([H], ones(H)),
        "model.layers.0.self_attn.q_proj.weight": ([nh * hd, H], zeros(nh * hd * H)),
        "model.layers.0.self_attn.k_proj.weight": ([nkv * hd, H], zeros(nkv * hd * H)),
        "model.layers.0.self_attn.v_proj.weight": ([nkv * hd, H], zeros(nkv * hd * H)),
        "model.layers.0.self_attn.o_proj.weight": ([H, nh * hd], zeros(H * nh * hd)),
        "model.layers.0.post_attention_layernorm.weight": ([H], ones(H)),
        "model.layers.0.mlp.gate_proj.weight": ([F, H], zeros(F * H)),
        "model.layers.0.mlp.up_proj.weight": ([F, H], zeros(F * H)),
        "model.layers.0.mlp.down_proj.weight": ([H, F], zeros(H * F)),
        "model.norm.weight": ([H], ones(H)),
        "lm_head.weight": ([V, H], head),
    }
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": F,
        "num_hidden_layers": 1, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
        "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "vocab_size": V, "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"], "dtype": "float32",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": ids[p], "content": p, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": p in SPECIAL} for p in added],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "model_max_length": 4096}, f, indent=1)
    with open(os.path.join(HERE, "templates", TEMPLATES[form])) as f:
        tmpl = f.read()
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(tmpl)


if __name__ == "__main__":
    main()
