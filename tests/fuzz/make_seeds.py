#!/usr/bin/env python3
"""make_seeds.py - write the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the fixtures.

    python3 tests/fuzz/make_seeds.py        (from the repository root; rewrites tests/fuzz/corpus/)

The seeds are committed; run this again only when a fixture format changes. Everything is derived from the
repository's own fixtures and kept small (the whole corpus is a few hundred KB), so fuzzing starts from inputs
that reach deep into each parser rather than from nothing:

  gguf            small GGUF files written here: every metadata type, arrays, tensors of several ggml types,
                  general.alignment, version 2; and byte-level BPE tokenizers (tokenizer.ggml.*) with each
                  pre-tokenizer name qwenc reads, control / user-defined / unused tokens, merges
  safetensors     headers like the fixtures' (real tensor names) with tiny shapes, every dtype, padding
  st_index        the qwen3_next fixture's model.safetensors.index.json and cut-down variants
  hfconfig        every fixture's config.json
  tokenizer_json  every committed tokenizer.json cut down to a few hundred tokens and merges (ids remapped,
                  normalizer, pre-tokenizer, post-processor, decoder and added tokens kept)
  tokenize        the cases of tests/tokenizers/cases.txt behind a byte choosing tokenizer and flags
  template        the chat templates of tests/templates and the bundled model, and the snippets of
                  tests/templates/features.json, behind a flags byte
  chat_request    the conversations of tests/templates/conversations behind a byte choosing template and flags

Llama 3's tokenizer is not committed (license): nothing derived from it is written.
"""
import json
import os
import shutil
import struct

OUT = "tests/fuzz/corpus"


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- GGUF

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
              I64: "<q", F64: "<d"}
# ggml type id -> (block elements, block bytes)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 12: (256, 144),
        13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136), 30: (1, 2)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        for x in items:
            out += gval(et, x)
        return out
    return struct.pack(SCALAR_FMT[t], v)


def gguf(kvs, tensors=(), version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ne (ggml order), ggml type)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    offset, sizes = 0, []
    for name, ne, gt in tensors:
        nel = 1
        for d in ne:
            nel *= d
        be, bb = GGML[gt]
        size = nel // be * bb
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne)
        out += struct.pack("<IQ", gt, offset)
        sizes.append(size)
        offset += (size + alignment - 1) // alignment * alignment
    if tensors:
        out += b"\0" * (-len(out) % alignment)
        for i, size in enumerate(sizes):
            out += bytes((i * 7 + k) & 0xFF for k in range(size)) + b"\0" * (-size % alignment)
    return out


def byte_alphabet():
    """GPT-2's bytes_to_unicode."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def tokenizer_kvs(pre, add_bos=None, types=True):
    toks = byte_alphabet()
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "w"),
                 ("Ġw", "o"), ("Ġwo", "r"), ("l", "d"), ("Ġwor", "ld"), ("H", "e"), ("l", "l"), ("He", "ll"),
                 ("Hell", "o"), ("1", "2"), ("Ċ", "Ċ")]:
        merges.append(a + " " + b)
        if a + b not in toks:
            toks.append(a + b)
    n_normal = len(toks)
    toks += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "[PAD300]"]
    tt = [1] * n_normal + [3, 3, 3, 4, 4, 5]
    kvs = [("general.architecture", STR, "qwen3"), ("tokenizer.ggml.model", STR, "gpt2")]
    if pre is not None:
        kvs.append(("tokenizer.ggml.pre", STR, pre))
    kvs += [("tokenizer.ggml.tokens", ARR, (STR, toks))]
    if types:
        kvs.append(("tokenizer.ggml.token_type", ARR, (I32, tt)))
    kvs += [("tokenizer.ggml.merges", ARR, (STR, merges)),
            ("tokenizer.ggml.bos_token_id", U32, n_normal),
            ("tokenizer.ggml.eos_token_id", U32, n_normal + 2),
            ("tokenizer.ggml.padding_token_id", U32, n_normal),
            ("tokenizer.chat_template", STR, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                             "<|im_end|>\n{% endfor %}")]
    if add_bos is not None:
        kvs.append(("tokenizer.ggml.add_bos_token", BOOL, add_bos))
        kvs.append(("tokenizer.ggml.add_eos_token", BOOL, 0))
    return kvs


def gguf_seeds():
    kvs = [("general.architecture", STR, "llama"), ("general.name", STR, "seed \u00e9\u4e2d"),
           ("general.alignment", U32, 64), ("u8", U8, 200), ("i8", I8, -3), ("u16", U16, 60000), ("i16", I16, -30000),
           ("u32", U32, 4000000000), ("i32", I32, -2000000000), ("f32", F32, 0.5), ("bool", BOOL, 1),
           ("u64", U64, 2 ** 63 + 5), ("i64", I64, -(2 ** 62)), ("f64", F64, 1e-300),
           ("llama.block_count", U32, 2), ("llama.context_length", U32, 4096),
           ("arr.i32", ARR, (I32, [1, -2, 3])), ("arr.f32", ARR, (F32, [0.25, -1.0])), ("arr.bool", ARR, (BOOL, [1, 0])),
           ("arr.str", ARR, (STR, ["a", "", "\u00fc"])), ("arr.empty", ARR, (U8, [])), ("arr.u64", ARR, (U64, [7]))]
    tensors = [("token_embd.weight", [4, 2], 0), ("blk.0.attn_norm.weight", [8], 1), ("blk.0.ffn_up.weight", [32, 2], 8),
               ("blk.0.ffn_down.weight", [256], 12), ("blk.0.empty", [0, 4], 0), ("output.weight", [32, 1], 2),
               ("blk.1.q6", [256], 14), ("blk.1.bf16", [2, 2], 30), ("blk.1.iq4_xs", [256], 23)]
    write("gguf", "all_types.gguf", gguf(kvs, tensors, alignment=64))
    write("gguf", "v2_one_tensor.gguf", gguf([("general.architecture", STR, "qwen3")], [("a", [2, 3, 1, 1], 0)], version=2))
    write("gguf", "metadata_only.gguf", gguf([("general.architecture", STR, "qwen35"), ("x", ARR, (F64, [1.5]))]))
    write("gguf", "empty.gguf", gguf([]))
    write("gguf", "tok_qwen2.gguf", gguf(tokenizer_kvs("qwen2")))
    write("gguf", "tok_qwen35.gguf", gguf(tokenizer_kvs("qwen35", add_bos=0)))
    write("gguf", "tok_llama_bpe.gguf", gguf(tokenizer_kvs("llama-bpe", add_bos=1), [("token_embd.weight", [4, 1], 0)]))
    write("gguf", "tok_gpt2.gguf", gguf(tokenizer_kvs("gpt-2")))
    write("gguf", "tok_default_no_types.gguf", gguf(tokenizer_kvs(None, types=False)))


# ---------------------------------------------------------------- safetensors

ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
           "F8_E4M3": 1}


def safetensors(entries, meta=None, pad=True):
    """entries: [(name, dtype, shape)]"""
    header, data = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dt, shape in entries:
        n = 1
        for d in shape:
            n *= d
        size = n * ST_SIZE[dt]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += bytes((len(data) + k) & 0xFF for k in range(size))
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    for fx in ["qwen3", "qwen4_exp"]:
        with open("tests/fixtures/%s/model.safetensors" % fx, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        entries = []
        for name, e in list(hdr.items())[:24]:
            if name == "__metadata__":
                continue
            entries.append((name, e["dtype"], [min(d, 3) for d in e["shape"]]))
        write("safetensors", fx + "_like.safetensors", safetensors(entries, meta={"format": "pt"}))
    entries = [("t_" + dt.lower(), dt, [2, 3]) for dt in ST_SIZE]
    entries += [("scalar", "F32", []), ("empty", "F16", [0, 5]), ("rank4", "BF16", [1, 2, 1, 2])]
    write("safetensors", "dtypes.safetensors", safetensors(entries, pad=False))
    write("safetensors", "empty_header.safetensors", safetensors([], meta={}))


# ---------------------------------------------------------------- shard index

def st_index_seeds():
    src = "tests/fixtures/qwen3_next/model.safetensors.index.json"
    with open(src) as f:
        idx = json.load(f)
    write("st_index", "qwen3_next.json", json.dumps(idx, separators=(",", ":")))
    wm = idx["weight_map"]
    by_file = {}
    for k, v in wm.items():
        by_file.setdefault(v, []).append(k)
    small = {}
    for v, ks in sorted(by_file.items()):
        for k in ks[:2]:
            small[k] = v
    write("st_index", "two_per_shard.json", json.dumps({"metadata": {"total_size": 1}, "weight_map": small}, indent=1))
    first = sorted(by_file)[0]
    write("st_index", "one_shard.json", json.dumps({"weight_map": {k: first for k in by_file[first]}}))


# ---------------------------------------------------------------- config.json

def hfconfig_seeds():
    for fx in sorted(os.listdir("tests/fixtures")):
        p = os.path.join("tests/fixtures", fx, "config.json")
        if os.path.exists(p):
            shutil.copy(p, os.path.join(OUT, "hfconfig", fx + ".json"))
    shutil.copy("models/tiny-flash/config.json", os.path.join(OUT, "hfconfig", "tiny-flash.json"))


# ---------------------------------------------------------------- tokenizer.json

def trim_tokenizer(path, keep):
    with open(path, encoding="utf-8") as f:
        t = json.load(f)
    model = t["model"]
    vocab = {k: v for k, v in model["vocab"].items() if v < keep}
    remap = {}
    nxt = keep
    for a in t.get("added_tokens", []):
        if a["id"] < keep:
            remap[a["id"]] = a["id"]
        else:
            remap[a["id"]] = nxt
            nxt += 1
        a["id"] = remap[a["id"]]
    merges = []
    prefix = model.get("continuing_subword_prefix") or ""
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        merged = a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)
        if a in vocab and b in vocab and merged in vocab:
            merges.append(m)
        if len(merges) >= 200:
            break
    model["vocab"] = vocab
    model["merges"] = merges

    def fix_ids(o):
        if isinstance(o, dict):
            if "ids" in o and isinstance(o["ids"], list):
                o["ids"] = [remap.get(i, i) for i in o["ids"]]
            for v in o.values():
                fix_ids(v)
        elif isinstance(o, list):
            for v in o:
                fix_ids(v)
    fix_ids(t.get("post_processor"))
    return json.dumps(t, ensure_ascii=False, separators=(",", ":"))


def tokenizer_json_seeds():
    for name, path, keep in [("bytelevel_bpe", "tests/tokenizers/bytelevel_bpe/tokenizer.json", 400),
                             ("metaspace_bpe", "tests/tokenizers/metaspace_bpe/tokenizer.json", 400),
                             ("spm_bpe", "tests/tokenizers/spm_bpe/tokenizer.json", 400),
                             ("tiny-flash", "models/tiny-flash/tokenizer.json", 400),
                             ("qwen3", "tests/tokenizers/qwen3/tokenizer.json", 400)]:
        write("tokenizer_json", name + ".json", trim_tokenizer(path, keep))


# ---------------------------------------------------------------- text cases, templates, requests

def unescape(s):
    out, i = bytearray(), 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            e = s[i + 1]
            if e in "nrt\\":
                out += {"n": b"\n", "r": b"\r", "t": b"\t", "\\": b"\\"}[e]
                i += 2
                continue
            if e == "x":
                out.append(int(s[i + 2:i + 4], 16))
                i += 4
                continue
        out += c.encode()
        i += 1
    return bytes(out)


def tokenize_seeds():
    i = 0
    with open("tests/tokenizers/cases.txt", encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#") or "\t" not in line:
                continue
            name, text = line.split("\t", 1)
            if text.startswith("@"):
                continue
            flags = (i % 6) | ((i // 6) % 2) << 3 | ((i // 12) % 2) << 4
            write("tokenize", name, bytes([flags]) + unescape(text))
            i += 1


def template_seeds():
    for fn in sorted(os.listdir("tests/templates")):
        if fn.endswith(".jinja"):
            with open(os.path.join("tests/templates", fn), "rb") as f:
                write("template", fn, b"\x01" + f.read())
    with open("models/tiny-flash/tokenizer_config.json", encoding="utf-8") as f:
        ct = json.load(f).get("chat_template")
    if ct:
        write("template", "tiny-flash.jinja", b"\x07" + ct.encode())
    with open("tests/templates/features.json", encoding="utf-8") as f:
        for k, feat in enumerate(json.load(f)):
            write("template", "feature_" + feat["name"], bytes([k % 8]) + feat["template"].encode())


def chat_request_seeds():
    for k, fn in enumerate(sorted(os.listdir("tests/templates/conversations"))):
        with open(os.path.join("tests/templates/conversations", fn), "rb") as f:
            body = json.dumps(json.loads(f.read()), ensure_ascii=False, separators=(",", ":")).encode()
        write("chat_request", fn, bytes([(k % 8) | ((k // 8) % 2) << 3 | (k % 3) << 4]) + body)
    write("chat_request", "kwargs.json", b"\x08" + json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "tools": None,
         "chat_template_kwargs": {"enable_thinking": False, "date_string": "26 Jul 2024", "custom": [1, 2.5, None]}}
    ).encode())


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    for t in ["hfconfig"]:
        os.makedirs(os.path.join(OUT, t))
    gguf_seeds()
    safetensors_seeds()
    st_index_seeds()
    hfconfig_seeds()
    tokenizer_json_seeds()
    tokenize_seeds()
    template_seeds()
    chat_request_seeds()


if __name__ == "__main__":
    main()
