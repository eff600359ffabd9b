#!/usr/bin/env python3
"""Train the MTP draft head of the bundled model tiny-flash and write it into the checkpoint with its reference.

The main model stays frozen; only the head learns (qwen4_exp.md section 3.10; the head's math is
make_mtp_fixtures.MtpHead, built from transformers' own modules). For every position p of a training window the
head reads the main model's streams X_p (after the last layer, before the stream mixer) and the next token
x_{p+1}, and is trained to predict what the main model predicts at p+1: the cross-entropy against the main model's
next-token distribution there (distillation; one step, teacher forcing). Greedy drafts are accepted when they
agree with the main model's argmax, which this objective targets more directly than the text's own next token.

Start: the head's decoder layer and its stream mixer are copies of the main model's last QSA layer (layer 5) and
of its mixer (the indexer keeps its paired-head initialisation, so its top-k meets no exact ties), fc_hidden is
the identity and fc_embedding 0.5 x the identity, the two norms zero (weight 1). AdamW, bf16 autocast, cosine
schedule, on the corpus of the model card (prep_default_corpus.py), tokenised with the model's own tokenizer.

Writes into OUT_ROOT:
  models/tiny-flash/model.safetensors   the checkpoint with the head's mtp.* tensors (bf16) added
  models/tiny-flash/config.json         with mtp_num_hidden_layers 1
  tests/fixtures/tiny-flash/chain.txt, mtp_logits.f32, mtp_chain.f32   the head's reference on the fixture's
                                        tokens (CPU, float32; see make_mtp_fixtures.py)
  mtp_stats.json                        training curve and the held-back agreement of the head's top-1 with the
                                        main model's next greedy token (the acceptance of a first greedy draft)

Usage (GPU machine; corpus/ from prep_default_corpus.py):
  python3 tests/gen/train_mtp_head.py --corpus corpus --out-root OUT_ROOT [--train-seconds 150]
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import make_mtp_fixtures as mm  # noqa: E402
import train_default_model as tdm  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL = os.path.join(ROOT, "models", "tiny-flash")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny-flash")
SOURCE_LAYER = 5


def log(*a):
    print(*a, flush=True)


def token_stream(tok, path, eos):
    docs = tdm.read_docs(path)
    stream = []
    for e in tok.encode_batch(docs, add_special_tokens=False):
        stream += e.ids
        stream.append(eos)
    return torch.tensor(stream, dtype=torch.long)


@torch.no_grad()
def warm_start(head):
    main_sd = head.tm.state_dict()
    sd = head.mini.state_dict()
    n = 0
    for k in sd:
        src = k.replace("layers.0.", f"layers.{SOURCE_LAYER}.", 1) if k.startswith("layers.0.") else k
        if k.startswith("embed_tokens."):
            continue
        sd[k].copy_(main_sd[src])
        n += 1
    H = head.H
    head.own["fc_hidden.weight"] = torch.eye(H)
    head.own["fc_embedding.weight"] = 0.5 * torch.eye(H)
    head.own["pre_fc_norm_embedding.weight"].zero_()
    head.own["pre_fc_norm_hidden.weight"].zero_()
    return n


def head_loss(head, main, x, S):
    """Cross-entropy of the head's drafts at p (predicting x_{p+2}) against the main model's distribution at p+1,
    over a batch of windows x [B, S+2]."""
    got = {}
    hook = head.tm.hyper_connection_mixer.register_forward_pre_hook(lambda m, a: got.__setitem__("h", a[0]))
    with torch.no_grad():
        target = main(input_ids=x[:, :S + 1], use_cache=False).logits[:, 1:S + 1].float().softmax(-1)
    hook.remove()
    X = got["h"][:, :S].float()
    lg, _ = head.run(x[:, 1:S + 1], X)
    return -(target * lg.float().log_softmax(-1)).sum(-1).mean(), lg


@torch.no_grad()
def evaluate(head, main, stream, S, batch, dev):
    """Held-back: loss, top-1 accuracy against the text, and agreement with the main model's greedy next token."""
    n = (len(stream) - 2) // S
    xs = torch.stack([stream[i * S:i * S + S + 2] for i in range(n)]).to(dev)
    tot, acc, agree, rows = 0.0, 0, 0, 0
    for i in range(0, n, batch):
        x = xs[i:i + batch]
        got = {}
        hook = head.tm.hyper_connection_mixer.register_forward_pre_hook(lambda m, a: got.__setitem__("h", a[0]))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            main_lg = main(input_ids=x[:, :S + 2], use_cache=False).logits.float()
        hook.remove()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lg, _ = head.run(x[:, 1:S + 1], got["h"][:, :S].float())
        lg = lg.float()
        tot += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 2:S + 2].reshape(-1), reduction="sum").item()
        d = lg.argmax(-1)
        acc += (d == x[:, 2:S + 2]).sum().item()
        agree += (d == main_lg[:, 1:S + 1].argmax(-1)).sum().item()
        rows += d.numel()
    return dict(loss=tot / rows, top1_text=acc / rows, top1_main_greedy=agree / rows, rows=rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out-root", required=True)
    ap.add_argument("--train-seconds", type=float, default=400.0, help="a cap on the training time")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    log(f"transformers {transformers.__version__}, torch {torch.__version__}")
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    eos = cfg["eos_token_id"]
    train_ids = token_stream(tok, os.path.join(args.corpus, "train.txt"), eos)
    valid_ids = torch.tensor(tok.encode(open(os.path.join(args.corpus, "valid.txt"), encoding="utf-8").read(),
                                        add_special_tokens=False).ids, dtype=torch.long)
    log(f"tokens: train {len(train_ids)}, valid {len(valid_ids)}")

    main_m = transformers.Qwen4ExpForCausalLM.from_pretrained(MODEL, dtype=torch.float32).to(dev).eval()
    for p in main_m.parameters():
        p.requires_grad_(False)
    tdm.set_experts_impl(main_m, "grouped_mm")
    head = mm.MtpHead(main_m)
    head.mini.to(dev)
    n_copied = warm_start(head)
    head.own = {k: torch.nn.Parameter(v.to(dev)) for k, v in head.own.items()}
    tdm.patch_indexer(main_m, True)  # the vectorised QSA selection (class-wide: the head's layer too)
    head.mini.train()
    params = list(head.mini.parameters()) + list(head.own.values())
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    S, data = args.seq, train_ids.to(dev)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    stats = dict(copied_tensors=n_copied, source_layer=SOURCE_LAYER, seq=S, batch=args.batch, lr=args.lr,
                 curve=[], train_tokens=len(train_ids), valid_tokens=len(valid_ids))
    stats["valid_start"] = evaluate(head, main_m, valid_ids, S, args.batch, dev)
    log(f"start: {stats['valid_start']}")
    t0, step, total = time.time(), 0, args.steps
    while step < total and time.time() - t0 < args.train_seconds:
        T_ = total
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / T_, 1.0))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        x = data[torch.randint(0, len(data) - S - 2, (args.batch,), device=dev, generator=g)[:, None]
                 + torch.arange(S + 2, device=dev)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = head_loss(head, main_m, x, S)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0:
            log(f"  step {step} loss {loss.item():.4f} lr {lr:.2e} {time.time() - t0:.0f}s")
            stats["curve"].append([step, round(loss.item(), 4)])
        step += 1
    stats["steps"] = step
    stats["train_seconds"] = round(time.time() - t0, 1)
    head.mini.eval()
    stats["valid_end"] = evaluate(head, main_m, valid_ids, S, args.batch, dev)
    log(f"end: {stats['valid_end']}")

    # the head into the checkpoint (bf16) and its reference on the fixture's tokens (CPU, float32, transformers'
    # own indexer)
    tdm.patch_indexer(main_m, False)
    state = {k: v.detach().float().cpu().to(torch.bfloat16) for k, v in head.state().items()}
    out_model = os.path.join(args.out_root, "models", "tiny-flash")
    os.makedirs(out_model, exist_ok=True)
    tensors = load_file(os.path.join(MODEL, "model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    tensors.update({k: v.contiguous() for k, v in state.items()})
    save_file(tensors, os.path.join(out_model, "model.safetensors"), metadata={"format": "pt"})
    cfg["mtp_num_hidden_layers"] = 1
    json.dump(cfg, open(os.path.join(out_model, "config.json"), "w"), indent=2)
    stats["head_tensors"] = {k: list(v.shape) for k, v in state.items()}
    stats["head_params"] = sum(v.numel() for v in state.values())

    cpu_main = mf.load_reference(transformers.Qwen4ExpForCausalLM, out_model, [])
    ref_head = mm.MtpHead(cpu_main, state=state)
    ids = torch.tensor([int(x) for x in open(os.path.join(FIXTURE, "tokens.txt")).read().strip().split(",")])
    chain = [int(x) for x in ids[:3].flip(0)]
    with mf.TopkMonitor() as mon:
        main_lg, lg, chain_lg = ref_head.reference(ids, chain)
    st = mon.qsa()
    stats["fixture_qsa"] = {k: (None if v == float("inf") else v) for k, v in st.items()}
    log(f"  fixture: indexer rows {st['rows']} sparse {st['sparse']} ties {st['ties']} min gap {st['min_gap']:.3g}")
    ref = torch.from_numpy(np.fromfile(os.path.join(FIXTURE, "logits_full.f32"), dtype="<f4")).view(ids.shape[0], -1)
    stats["fixture_main_logits_max_abs_diff"] = (ref - main_lg).abs().max().item()
    out_fx = os.path.join(args.out_root, "tests", "fixtures", "tiny-flash")
    os.makedirs(out_fx, exist_ok=True)
    open(os.path.join(out_fx, "chain.txt"), "w").write(",".join(map(str, chain)) + "\n")
    mf.write_f32(os.path.join(out_fx, "mtp_logits.f32"), lg)
    mf.write_f32(os.path.join(out_fx, "mtp_chain.f32"), chain_lg)
    stats["fixture_mtp_top1_main_greedy"] = (lg.argmax(-1) == main_lg[1:].argmax(-1)).float().mean().item()
    json.dump(stats, open(os.path.join(args.out_root, "mtp_stats.json"), "w"), indent=1)
    log(json.dumps({k: v for k, v in stats.items() if k not in ("curve", "head_tensors")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
