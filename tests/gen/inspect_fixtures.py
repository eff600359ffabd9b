#!/usr/bin/env python3
"""Check and summarise the golden fixtures without torch (standard library only).

For every DIR/<name>/ with a meta.json: parse each safetensors header (and the shard index if any), check that
the data section is exactly covered by the tensors, that the reference files have the sizes meta.json implies,
and print a short table of tensor names / dtypes / shapes.

Usage:  python3 tests/gen/inspect_fixtures.py [--dir DIR] [--tensors]
"""

import argparse
import json
import os
import re
import sys

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data_len = os.path.getsize(path) - 8 - n
    return header, data_len


def check_file(path):
    """Returns {name: (dtype, shape)}; raises on a malformed file."""
    header, data_len = read_header(path)
    meta = header.pop("__metadata__", {})
    spans, out = [], {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        n = DTYPE_SIZE[t["dtype"]]
        for d in t["shape"]:
            n *= d
        if b - a != n:
            raise ValueError(f"{path}: {name}: {b - a} bytes for {t['dtype']}{t['shape']}")
        spans.append((a, b))
        out[name] = (t["dtype"], tuple(t["shape"]))
    spans.sort()
    pos = 0
    for a, b in spans:
        if a != pos:
            raise ValueError(f"{path}: gap or overlap at byte {pos}")
        pos = b
    if pos != data_len:
        raise ValueError(f"{path}: tensors cover {pos} of {data_len} data bytes")
    if meta.get("format") != "pt":
        raise ValueError(f"{path}: metadata {meta}")
    return out


def summarise(names):
    """Collapse layer / expert / shard indices so that the table stays short."""
    groups = {}
    for name, (dt, shape) in names.items():
        key = re.sub(r"\.(\d+)\.", ".{i}.", re.sub(r"shard_\d+", "shard_{i}", name))
        g = groups.setdefault((key, dt), [0, set()])
        g[0] += 1
        g[1].add(shape)
    return groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    ap.add_argument("--tensors", action="store_true", help="print the (collapsed) tensor table")
    args = ap.parse_args()
    bad = 0
    for fx in sorted(os.listdir(args.dir)):
        d = os.path.join(args.dir, fx)
        if not os.path.isfile(os.path.join(d, "meta.json")):
            continue
        meta = json.load(open(os.path.join(d, "meta.json")))
        try:
            files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
            names = {}
            for f in files:
                for k, v in check_file(os.path.join(d, f)).items():
                    if k in names:
                        raise ValueError(f"{k} in two files")
                    names[k] = v
            idx = os.path.join(d, "model.safetensors.index.json")
            if os.path.exists(idx):
                wm = json.load(open(idx))["weight_map"]
                if set(wm) != set(names) or set(wm.values()) != set(files):
                    raise ValueError("index weight_map does not match the shards")
            T, V = meta["T"], meta["vocab"]
            tokens = [int(x) for x in open(os.path.join(d, "tokens.txt")).read().strip().split(",")]
            if len(tokens) != T or not all(0 <= t < V for t in tokens):
                raise ValueError("tokens.txt")
            for f in ("logits_full.f32", "logits_decode.f32"):
                if os.path.getsize(os.path.join(d, f)) != 4 * T * V:
                    raise ValueError(f"{f} size")
            if os.path.getsize(os.path.join(d, "hidden_full.f32")) != 4 * T * sum(meta["hidden_widths"]):
                raise ValueError("hidden_full.f32 size")
            dts = {}
            for dt, _ in names.values():
                dts[dt] = dts.get(dt, 0) + 1
            print(f"{fx:14s} {meta['class']:34s} {len(files)} file(s) {len(names):4d} tensors {dts} "
                  f"full-vs-decode {meta['hf_full_vs_decode_max_abs']:.2g}  OK")
            if args.tensors:
                for (key, dt), (n, shapes) in sorted(summarise(names).items()):
                    sh = " ".join(str(list(s)) for s in sorted(shapes))
                    print(f"    {key:70s} {dt:5s} x{n:<3d} {sh}")
        except Exception as e:  # report and go on with the next fixture
            bad += 1
            print(f"{fx:14s} BAD: {e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
