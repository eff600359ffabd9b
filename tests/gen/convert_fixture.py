#!/usr/bin/env python3
"""Convert a test fixture with llama.cpp's own convert_hf_to_gguf.py, to check that qwenc reads the converter's
files (docs/GGUF.md). Not part of `make test`: it needs a llama.cpp source tree and torch + numpy.

    python3 tests/gen/convert_fixture.py LLAMA_CPP_DIR tests/fixtures/qwen3_5 OUT.gguf [f32|bf16|f16]

The fixtures have no tokenizer, which the converter requires, and transformers may be absent: a stub
`transformers` module makes AutoConfig fail (the converter then reads config.json itself, as it does for
remote-code models), and the vocabulary is written as tokenizer.ggml.model "none". Checkpoints of the
Qwen3.5 / Qwen3-Next family without MTP tensors are converted with --no-mtp (the converter asserts otherwise).
Everything else is the converter's code, unchanged.
"""
import sys
import types

llama_dir, model_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
outtype = sys.argv[4] if len(sys.argv) > 4 else "f32"

stub = types.ModuleType("transformers")


class _Unavailable:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers is not used by this wrapper")


stub.AutoConfig = _Unavailable
stub.AutoTokenizer = _Unavailable
sys.modules.setdefault("transformers", stub)

import torch  # noqa: E402

# dtypes newer torch releases have (the converter only names them in tables): placeholders for an older torch
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
              "uint16", "uint32", "uint64"):
    if not hasattr(torch, _name):
        setattr(torch, _name, type("missing_dtype_" + _name, (), {})())
sys.path.insert(0, llama_dir)
sys.path.insert(0, llama_dir + "/gguf-py")

import convert_hf_to_gguf  # noqa: E402
from conversion import base  # noqa: E402


def no_vocab(self):
    self.gguf_writer.add_tokenizer_model("none")


# the model classes load lazily, so replace the helpers every set_vocab ends in
for _helper in ("set_vocab", "_set_vocab_gpt2", "_set_vocab_sentencepiece", "_set_vocab_llama_hf", "_set_vocab_qwen"):
    setattr(base.TextModel, _helper, no_vocab)

args = [model_dir, "--outfile", out, "--outtype", outtype]
if any(k in open(model_dir + "/config.json").read() for k in ("qwen3_5", "qwen3_next")):
    args.append("--no-mtp")
sys.argv = ["convert_hf_to_gguf.py"] + args
convert_hf_to_gguf.main()
