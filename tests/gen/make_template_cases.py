#!/usr/bin/env python3
"""
make_template_cases.py - expected chat-template renderings for tests/t_template.c, made by transformers.

For every (template, conversation, add_generation_prompt, enable_thinking) combination under
tests/templates/ it renders the conversation with transformers' own chat-template renderer (the
function that apply_chat_template calls, with the Jinja environment transformers builds: trim_blocks,
lstrip_blocks, its tojson, raise_exception, strftime_now, loop controls) and records the text, or the
exception when transformers raises. It also renders tests/templates/features.json, small templates
that pin down one Jinja behaviour each, with the same compiled environment (each entry also records the
request JSON that passes its variables to qwenc_chat_render: "messages" as the messages, the others as
chat_template_kwargs).

An empty "messages" raises, as apply_chat_template does before rendering anything.
How the template variables are built, as apply_chat_template does: the tokenizer's special tokens
(bos_token / eos_token from tests/templates/templates.json, left out when null), then the request's
"chat_template_kwargs", then enable_thinking when the case sets it; messages, tools (None when the
request has none) and add_generation_prompt come from the renderer itself. Every conversation carries
date_string in its chat_template_kwargs so the Llama 3.2 template does not read the clock.

As a cross-check, each case is also rendered through PreTrainedTokenizerFast.apply_chat_template on a
tokenizer with an empty vocabulary and the same special tokens; disagreements are counted in the output.

Run (no network needed):  python3 tests/gen/make_template_cases.py [OUT.json]
Default output: tests/templates/expected.json. Sources of the transformers functions used are written
beside the output (transformers_sources.txt) for review.
"""
import glob
import inspect
import json
import os
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "templates")
THINK = [None, True, False]


def load(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def variables(req, tok, think):
    kw = {}
    for k in ("bos_token", "eos_token"):
        if tok.get(k) is not None:
            kw[k] = tok[k]
    kw.update(req.get("chat_template_kwargs", {}))
    if think is not None:
        kw["enable_thinking"] = think
    return kw


def render_direct(tpl, req, agp, kw):
    if len(req["messages"]) == 0:  # apply_chat_template refuses an empty conversation before rendering
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if not hasattr(ctu, "render_jinja_template"):
        return render_tokenizer(make_tokenizer({}), tpl, req, agp, None, kw)
    out = ctu.render_jinja_template(conversations=[req["messages"]], tools=req.get("tools"), chat_template=tpl,
                                    add_generation_prompt=agp, **kw)
    if isinstance(out, tuple):
        out = out[0]
    return out[0]


def make_tokenizer(tok):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    special = {k: tok[k] for k in ("bos_token", "eos_token") if tok.get(k) is not None}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **special)


def render_tokenizer(t, tpl, req, agp, think, extra):
    kw = dict(extra)
    if think is not None:
        kw["enable_thinking"] = think
    return t.apply_chat_template(req["messages"], tools=req.get("tools"), chat_template=tpl, tokenize=False,
                                 add_generation_prompt=agp, **kw)


def compile_template(src):
    if hasattr(ctu, "_compile_jinja_template"):
        return ctu._compile_jinja_template(src)
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    return PreTrainedTokenizerBase._compile_jinja_template(None, src)


def err_text(e):
    return "%s: %s" % (type(e).__name__, e)


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "expected.json")
    manifest = json.loads(load(os.path.join(ROOT, "templates.json")))
    convs = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "conversations", "*.json")))
    result = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
              "templates": manifest, "cases": [], "features": [], "tokenizer_path_mismatches": 0,
              "tokenizer_path_errors": []}
    n_err = 0
    for tname in sorted(manifest):
        tok = manifest[tname]
        tpl = load(os.path.join(ROOT, tok["file"]))
        try:
            t = make_tokenizer(tok)
        except Exception as e:  # the cross-check is optional; record why it did not run
            t = None
            result["tokenizer_path_errors"].append("%s: %s" % (tname, err_text(e)))
        for cname in convs:
            req = json.loads(load(os.path.join(ROOT, "conversations", cname + ".json")))
            for agp in (False, True):
                for think in THINK:
                    case = {"template": tname, "conversation": cname, "add_generation_prompt": agp,
                            "enable_thinking": think}
                    try:
                        case["output"] = render_direct(tpl, req, agp, variables(req, tok, think))
                    except Exception as e:
                        case["error"] = err_text(e)
                        n_err += 1
                    if t is not None:
                        try:
                            other = render_tokenizer(t, tpl, req, agp, think, req.get("chat_template_kwargs", {}))
                        except Exception as e:
                            other = {"error": err_text(e)}
                        if ("output" in case) != isinstance(other, str) or \
                                (isinstance(other, str) and other != case["output"]):
                            result["tokenizer_path_mismatches"] += 1
                            result["tokenizer_path_errors"].append("%s/%s/%s/%s" % (tname, cname, agp, think))
                    result["cases"].append(case)
    for feat in json.loads(load(os.path.join(ROOT, "features.json"))):
        # the request qwenc_chat_render gets: the variables as chat_template_kwargs (json.dumps keeps 2.0 a float)
        kwargs = dict(feat["vars"])
        messages = kwargs.pop("messages", [{"role": "user", "content": "hi"}])
        entry = {"name": feat["name"], "request": json.dumps({"messages": messages, "chat_template_kwargs": kwargs},
                                                             ensure_ascii=False)}
        try:
            entry["output"] = compile_template(feat["template"]).render(**feat["vars"])
        except Exception as e:
            entry["error"] = err_text(e)
        result["features"].append(entry)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    src = [inspect.getsource(ctu)]
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        src.append(inspect.getsource(PreTrainedTokenizerBase.apply_chat_template))
    except Exception as e:
        src.append(err_text(e))
    with open(os.path.join(os.path.dirname(out_path), "transformers_sources.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n#################\n\n".join(src))
    print("%d cases (%d raise), %d features, tokenizer-path mismatches %d" % (
        len(result["cases"]), n_err, len(result["features"]), result["tokenizer_path_mismatches"]))


if __name__ == "__main__":
    main()
