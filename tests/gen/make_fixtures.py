#!/usr/bin/env python3
"""Generate the golden test fixtures of qwenc from Hugging Face transformers.

Every fixture is a tiny random model of one architecture, saved as a real checkpoint, plus the reference
outputs that transformers computes for it.  The C tests load the checkpoint with qwenc, run the same tokens and
compare against the stored logits / hidden states.

Recipe (identical for every fixture):
  1. build the model from a tiny config, re-randomise EVERY parameter (N(0, 0.3^2), fixed seed) so that every
     code path is exercised (HF's default init leaves e.g. the zero-centred norm weights and the PLE conv at 0);
  2. round the parameters to the storage dtype (bf16 / f16 / f32) and save with `save_pretrained`;
  3. optionally rewrite the saved safetensors into another on-disk layout (official Qwen layout: fused experts,
     merged n-gram table, F32 small tensors, extra `mtp.*` tensors) -- lossless, and re-checked after the rewrite;
  4. RELOAD the saved directory in float32 (`attn_implementation="eager"`, `experts_implementation="eager"`),
     check there are no missing / unexpected keys and that the reloaded weights equal the rounded originals;
  5. on CPU in float32 compute: one full forward over all T tokens (no cache, with output_hidden_states), and a
     token-by-token decode with the HF cache.

Files written per fixture into DIR/<name>/:
  config.json, generation_config.json, model.safetensors (or shards + model.safetensors.index.json)
  tokens.txt          the input ids, one comma-separated line
  logits_full.f32     [T][vocab] float32 little-endian, full forward (no cache)
  logits_decode.f32   [T][vocab] float32 little-endian, token-by-token decode with the HF cache
  hidden_full.f32     the `hidden_states` of the full forward, all entries concatenated in order,
                      each [T][width] float32 (widths listed in meta.json)
  meta.json           description, shapes and the self-consistency numbers of the reference

QSA (qwen4_exp): the indexer picks the top-k blocks with `topk`, whose order on exact ties is unspecified
(qwenc breaks ties towards the lower block index).  The qwen4_exp fixtures are therefore re-drawn until no
indexer `topk` call, in the full forward or in the decode, has a tie (or a near tie, gap <= TIE_GAP) between
the k-th and (k+1)-th largest available score.

Usage:  python3 tests/gen/make_fixtures.py [--out DIR] [--only NAME[,NAME...]]
Needs torch and transformers 5.17 (plus safetensors).  Runs on CPU only.
"""

import argparse
import copy
import json
import math
import os
import re
import shutil
import sys
import traceback

import numpy as np
import torch

import transformers
from safetensors.torch import load_file, save_file

T = 40  # tokens per fixture
VOCAB = 256
EOS = 5
TIE_GAP = 1e-4  # a QSA boundary gap at or below this counts as a tie (scores are O(1), fp32 noise ~1e-6)
MAX_TOKEN_ATTEMPTS = 60  # token re-draws per weight seed for the QSA tie check
MAX_WEIGHT_SEEDS = 6  # weight seeds tried for the QSA tie check
KEEP_FILES = re.compile(r"^(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|"
                        r"model\.safetensors\.index\.json)$")

# ----------------------------------------------------------------------------------------------------------------
# Tiny configurations

# qwen4_exp text config: exactly the spec recipe (qwen4_exp.md section 7).
QWEN4_KW = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=6, hc_count=4, hc_lowrank=16, ple_layer_ids=[2],
    ple_embed_dim=64, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=1000,
    make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4, seed=1234, indexer_n_heads=2,
    indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=3,
    norm_topk_prob=True, output_gate_type="sigmoid",
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    max_position_embeddings=4096, rms_norm_eps=1e-6, eos_token_id=EOS, bos_token_id=EOS,
    tie_word_embeddings=False)

# Tiny vision tower for the multimodal wrappers (never run: text-only inputs; its tensors must be skipped).
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                   spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)

# qwen3_next / qwen3_5 / qwen3_5_moe (qwen35_family.md section 5).
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=512,
              rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
              tie_word_embeddings=False, eos_token_id=EOS)
MOE = dict(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2)

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def fresh(d, **kw):
    """A deep copy of a config dict (HF may modify nested dicts such as rope_parameters in place)."""
    return copy.deepcopy(dict(d, **kw))


def hf(name):
    """A transformers class by name (looked up lazily so that one missing class only fails its fixture)."""
    return getattr(transformers, name)


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def log(*a):
    print(*a, flush=True)


@torch.no_grad()
def randomize(model, seed):
    """Re-randomise every parameter: N(0, 0.3^2) from a seeded CPU generator (named_parameters order)."""
    g = torch.Generator().manual_seed(seed)
    for _, p in model.named_parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@torch.no_grad()
def round_params(model, dtype):
    """Round ONLY the parameters to the storage dtype (kept in fp32 in memory)."""
    for _, p in model.named_parameters():
        p.copy_(p.to(dtype).float())


def clean_dir(d):
    """Remove whatever save_pretrained wrote that a checkpoint reader does not need."""
    for f in os.listdir(d):
        if not KEEP_FILES.match(f):
            p = os.path.join(d, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def safetensors_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


def load_reference(cls, d, notes, allow_unexpected=r"^mtp\."):
    """Reload a saved checkpoint in fp32 with eager attention / eager experts; fail on missing/unexpected keys
    (unexpected keys matching allow_unexpected -- the MTP head that transformers drops -- are only logged)."""
    attempts = [dict(attn_implementation="eager", experts_implementation="eager"),
                dict(attn_implementation="eager")]
    last = None
    for kw in attempts:
        try:
            res = cls.from_pretrained(d, dtype=torch.float32, output_loading_info=True, **kw)
            break
        except (TypeError, ValueError) as e:  # a class that rejects experts_implementation
            log(f"  from_pretrained({sorted(kw)}) rejected: {type(e).__name__}: {e}")
            last = e
    else:
        raise last
    if "experts_implementation" not in kw:
        notes.append("from_pretrained rejected experts_implementation; loaded with attn_implementation=eager only")
    model, info = res if isinstance(res, tuple) else (res, {})
    if not isinstance(info, dict):
        info = {k: getattr(info, k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
                if hasattr(info, k)}
    model.eval()
    info = {k: sorted(v, key=str) if isinstance(v, (set, list, tuple)) else v for k, v in info.items()}
    ignored = [k for k in info.get("unexpected_keys") or [] if re.match(allow_unexpected, str(k))]
    if ignored:
        log(f"  reload: {len(ignored)} unexpected keys ignored by design: {ignored}")
        info["unexpected_keys"] = [k for k in info["unexpected_keys"] if k not in ignored]
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            raise RuntimeError(f"reload of {d}: {key} = {info[key]}")
    for n, p in model.named_parameters():
        if p.dtype != torch.float32:
            raise RuntimeError(f"reload of {d}: parameter {n} is {p.dtype}, expected float32")
    impl = (getattr(model.config, "_attn_implementation", None), getattr(model.config, "_experts_implementation", None))
    log(f"  reloaded {cls.__name__} from {os.path.basename(d)}: attn={impl[0]} experts={impl[1]}; no missing/unexpected keys")
    return model


@torch.no_grad()
def compare_weights(ref_state, model, what):
    """The reloaded model must hold exactly the rounded weights that were saved."""
    sd = model.state_dict()
    if set(sd) != set(ref_state):
        raise RuntimeError(f"{what}: state_dict keys differ: only-saved {sorted(set(ref_state) - set(sd))[:5]} "
                           f"only-reloaded {sorted(set(sd) - set(ref_state))[:5]}")
    worst = 0.0
    for k, v in ref_state.items():
        if v.is_floating_point():
            worst = max(worst, (sd[k].float() - v.float()).abs().max().item() if v.numel() else 0.0)
        elif not torch.equal(sd[k], v):
            raise RuntimeError(f"{what}: integer buffer {k} differs after reload")
    if worst != 0.0:
        raise RuntimeError(f"{what}: reloaded weights differ from the saved ones by {worst}")


# ----------------------------------------------------------------------------------------------------------------
# QSA top-k tie monitor


def _topk_origin(frame):
    """Classify a topk call by the modules on the Python stack: 'indexer', 'router' or 'other'."""
    depth = 0
    while frame is not None and depth < 8:
        obj = frame.f_locals.get("self")
        if obj is not None:
            name = type(obj).__name__
            if "Indexer" in name:
                return "indexer"
            if any(s in name for s in ("Router", "Moe", "MoE", "Experts", "Gate")):
                return "router"
        frame = frame.f_back
        depth += 1
    return "other"


class TopkMonitor:
    """Patches torch.topk and Tensor.topk while active and records, for every call made by the QSA indexer:
    the number of rows (queries), how many were sparse (k < number of available blocks), how many had a tie or
    near tie at the selection boundary, and the smallest boundary gap.  Scores <= -1e30 or non-finite count as
    unavailable (masked blocks)."""

    def __init__(self):
        self.stats = {o: dict(calls=0, rows=0, sparse=0, ties=0, exact_ties=0, min_gap=math.inf)
                      for o in ("indexer", "router", "other")}

    def _observe(self, x, args, kwargs):
        names = ("k", "dim", "largest", "sorted")
        b = dict(zip(names, args))
        b.update(kwargs)
        origin = _topk_origin(sys._getframe(2))
        st = self.stats[origin]
        st["calls"] += 1
        if origin == "router" or not b.get("largest", True) or x.dim() == 0:
            return
        k = int(b["k"])
        dim = b.get("dim", -1)
        dim = -1 if dim is None else dim
        rows = x.detach().float().movedim(dim, -1).reshape(-1, x.shape[dim]).cpu()
        for row in rows:
            avail = row[torch.isfinite(row) & (row > -1e30)]
            st["rows"] += 1
            if k < avail.numel():
                st["sparse"] += 1
                s = torch.sort(avail, descending=True).values
                gap = (s[k - 1] - s[k]).item()
                st["min_gap"] = min(st["min_gap"], gap)
                if gap <= TIE_GAP:
                    st["ties"] += 1
                if gap == 0.0:
                    st["exact_ties"] += 1

    def __enter__(self):
        mon = self
        self._fn = torch.topk
        self._had_method = "topk" in torch.Tensor.__dict__
        self._method = torch.Tensor.topk
        orig_fn, orig_method = self._fn, self._method

        def topk_fn(input, *args, **kwargs):
            mon._observe(input, args, kwargs)
            return orig_fn(input, *args, **kwargs)

        def topk_method(self_t, *args, **kwargs):
            mon._observe(self_t, args, kwargs)
            return orig_method(self_t, *args, **kwargs)

        torch.topk = topk_fn
        torch.Tensor.topk = topk_method
        return self

    def __exit__(self, *exc):
        torch.topk = self._fn
        if self._had_method:
            torch.Tensor.topk = self._method
        else:
            del torch.Tensor.topk
        return False

    def qsa(self):
        """Stats of the indexer calls (falls back to unclassified calls if no indexer class was seen)."""
        st = self.stats["indexer"]
        if st["calls"] == 0 and self.stats["other"]["calls"] > 0:
            log("  WARNING: no topk call came from an *Indexer* module; using the unclassified calls")
            st = self.stats["other"]
        return st


# ----------------------------------------------------------------------------------------------------------------
# Reference computations


@torch.no_grad()
def run_full(model, ids):
    out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    logits = out.logits[0].float()
    hidden = [h[0].float() for h in out.hidden_states]
    return logits, hidden


@torch.no_grad()
def run_decode(model, ids):
    past, rows = None, []
    for t in range(ids.shape[1]):
        out = model(input_ids=ids[:, t:t + 1], past_key_values=past, use_cache=True)
        past = out.past_key_values
        rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


def draw_tokens(seed, eos_positions=()):
    """T random ids in [0, VOCAB); EOS exactly at eos_positions (and nowhere else if any are given)."""
    g = torch.Generator().manual_seed(seed)
    if not eos_positions:
        return torch.randint(0, VOCAB, (T,), generator=g)
    ids = torch.randint(0, VOCAB - 1, (T,), generator=g)
    ids = ids + (ids >= EOS).long()  # skip the EOS id
    ids[list(eos_positions)] = EOS
    return ids


# Safetensors rewrites (official layouts) -------------------------------------------------------------------------

EXPERT_RE = re.compile(r"^(?P<pre>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<p>gate_proj|up_proj|down_proj)\.weight$")
SHARD_RE = re.compile(r"^(?P<pre>.*\.ngram_embedding)\.shard_(?P<i>\d+)\.weight$")


def fuse_experts(tensors):
    """Per-expert {gate,up,down}_proj -> gate_up_proj [E, 2I, H] (gate rows then up rows) + down_proj [E, H, I]."""
    groups, out = {}, {}
    for k, v in tensors.items():
        m = EXPERT_RE.match(k)
        if m:
            groups.setdefault(m["pre"], {}).setdefault(int(m["e"]), {})[m["p"]] = v
        else:
            out[k] = v
    for pre, ex in groups.items():
        n = len(ex)
        assert sorted(ex) == list(range(n)), pre
        out[pre + ".gate_up_proj"] = torch.stack(
            [torch.cat([ex[e]["gate_proj"], ex[e]["up_proj"]], 0) for e in range(n)]).contiguous()
        out[pre + ".down_proj"] = torch.stack([ex[e]["down_proj"] for e in range(n)]).contiguous()
    return out, len(groups)


def merge_ngram_shards(tensors):
    """ngram_embedding.shard_{i}.weight (i = 0..N-1) -> one ngram_embedding.weight, concatenated in numeric order."""
    groups, out = {}, {}
    for k, v in tensors.items():
        m = SHARD_RE.match(k)
        if m:
            groups.setdefault(m["pre"], {})[int(m["i"])] = v
        else:
            out[k] = v
    for pre, sh in groups.items():
        assert sorted(sh) == list(range(len(sh))), pre
        out[pre + ".weight"] = torch.cat([sh[i] for i in range(len(sh))], 0).contiguous()
    return out, len(groups)


def small_tensors_to_f32(tensors):
    """linear_attn.A_log and linear_attn.norm.weight stored as F32, as in official Qwen checkpoints."""
    n = 0
    for k in list(tensors):
        if k.endswith("linear_attn.A_log") or k.endswith("linear_attn.norm.weight"):
            tensors[k] = tensors[k].float().contiguous()
            n += 1
    return tensors, n


def rewrite_single_file(d, fn):
    """Apply fn(dict name->tensor) -> dict to a single-file checkpoint, in place, metadata {"format": "pt"}."""
    files = safetensors_files(d)
    assert files == ["model.safetensors"], files
    path = os.path.join(d, "model.safetensors")
    tensors = load_file(path)
    tensors = fn(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


# ----------------------------------------------------------------------------------------------------------------
# One fixture


class Fixture:
    def __init__(self, name, make_model, storage_dtype, weight_seed, token_seed, eos_positions=(), qsa=False,
                 rewrite=None, max_shard_size=None, post=None, notes=()):
        self.name = name
        self.make_model = make_model  # () -> freshly constructed model (random init)
        self.storage_dtype = storage_dtype
        self.weight_seed = weight_seed
        self.token_seed = token_seed
        self.eos_positions = tuple(eos_positions)
        self.qsa = qsa
        self.rewrite = rewrite  # (tensors dict, description list) -> tensors dict, applied after the reference run
        self.max_shard_size = max_shard_size  # list of sizes to try, or None for a single file
        self.post = post  # (reloaded model) -> extra notes, for fixture-specific checks
        self.notes = list(notes)


def save_checkpoint(fx, model, d):
    """Round, save in the storage dtype, clean.  Returns the rounded fp32 state_dict for the reload check."""
    round_params(model, fx.storage_dtype)
    ref_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if os.path.exists(d):
        shutil.rmtree(d)
    model.to(fx.storage_dtype)
    if not fx.max_shard_size:
        model.save_pretrained(d)
    else:  # shrink the shard size until the checkpoint has at least 3 shards
        for size in fx.max_shard_size:
            if os.path.exists(d):
                shutil.rmtree(d)
            model.save_pretrained(d, max_shard_size=size)
            if len(safetensors_files(d)) >= 3:
                break
        n = len(safetensors_files(d))
        if n < 3 or not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
            raise RuntimeError(f"sharded save produced {n} shards")
        fx.notes.append(f"saved with max_shard_size={size}: {n} shards + model.safetensors.index.json")
    clean_dir(d)
    return ref_state


def build_and_reload(fx, d, weight_seed):
    model = fx.make_model()
    cls = type(model)
    randomize(model, weight_seed)
    ref_state = save_checkpoint(fx, model, d)
    del model
    model = load_reference(cls, d, fx.notes)
    compare_weights(ref_state, model, fx.name)
    return cls, model


def write_f32(path, t):
    t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tofile(path)


def make_fixture(fx, out_dir):
    d = os.path.join(out_dir, fx.name)
    log(f"== {fx.name}")
    attempts, qsa_info = 0, {}
    weight_seed = fx.weight_seed
    done = False
    for wtry in range(MAX_WEIGHT_SEEDS if fx.qsa else 1):
        weight_seed = fx.weight_seed + 1000 * wtry
        cls, model = build_and_reload(fx, d, weight_seed)
        for ttry in range(MAX_TOKEN_ATTEMPTS if fx.qsa else 1):
            attempts += 1
            token_seed = fx.token_seed + ttry
            ids = draw_tokens(token_seed, fx.eos_positions)[None]
            if not fx.qsa:
                logits, hidden = run_full(model, ids)
                dec = run_decode(model, ids)
                done = True
                break
            with TopkMonitor() as mon_f:
                logits, hidden = run_full(model, ids)
            sf = mon_f.qsa()
            if sf["ties"]:
                log(f"  attempt {attempts}: full forward has {sf['ties']} boundary tie(s) "
                    f"({sf['exact_ties']} exact), re-drawing")
                continue
            with TopkMonitor() as mon_d:
                dec = run_decode(model, ids)
            sd = mon_d.qsa()
            if sd["ties"]:
                log(f"  attempt {attempts}: decode has {sd['ties']} boundary tie(s), re-drawing")
                continue
            active = sf["rows"] > 0 and sd["rows"] > 0
            if not active:  # keep the fixture, but say loudly that the tie check did not see the indexer
                log("  !! QSA tie check saw no indexer topk call: the check is NOT active")
            qsa_info = dict(tie_check_active=active, tie_check_attempts=attempts, tie_gap_threshold=TIE_GAP,
                            selections_full=sf["rows"], sparse_selections_full=sf["sparse"],
                            selections_decode=sd["rows"], sparse_selections_decode=sd["sparse"],
                            min_boundary_gap_full=None if math.isinf(sf["min_gap"]) else sf["min_gap"],
                            min_boundary_gap_decode=None if math.isinf(sd["min_gap"]) else sd["min_gap"],
                            router_topk_calls_full=mon_f.stats["router"]["calls"])
            done = True
            break
        if done:
            break
        del model
    if not done:
        raise RuntimeError(f"{fx.name}: no tie-free token sequence found in {attempts} attempts")

    ids_list = ids[0].tolist()
    diff = (logits - dec).abs().max().item()
    rel = ((logits - dec).norm() / logits.norm()).item()
    widths = [h.shape[-1] for h in hidden]
    log(f"  T={T} logits max|.|={logits.abs().max().item():.4f} full-vs-decode max|d|={diff:.3g} rel_l2={rel:.3g}"
        f" hidden_states={len(hidden)} widths={widths}")

    with open(os.path.join(d, "tokens.txt"), "w") as f:
        f.write(",".join(str(i) for i in ids_list) + "\n")
    write_f32(os.path.join(d, "logits_full.f32"), logits)
    write_f32(os.path.join(d, "logits_decode.f32"), dec)
    write_f32(os.path.join(d, "hidden_full.f32"), torch.cat([h.reshape(-1) for h in hidden]))  # [entry][T][w]

    notes = list(fx.notes)
    notes.append(f"weights: N(0,0.3^2) seed {weight_seed}, rounded to {str(fx.storage_dtype)[6:]}; tokens seed "
                 f"{token_seed}; reference = reloaded checkpoint in float32 on CPU, eager attention/experts")
    if fx.qsa:
        log(f"  QSA: {qsa_info}")
        notes.append(f"no QSA boundary ties (every gap between the k-th and (k+1)-th block score > {TIE_GAP}) in "
                     f"the full forward and the decode; attempts {qsa_info['tie_check_attempts']}; sparse "
                     f"(query, layer) selections: {qsa_info['sparse_selections_full']} of "
                     f"{qsa_info['selections_full']} (full), {qsa_info['sparse_selections_decode']} of "
                     f"{qsa_info['selections_decode']} (decode)"
                     if qsa_info["tie_check_active"] else "QSA TIE CHECK INACTIVE: no indexer topk call was seen")
    if fx.eos_positions:
        notes.append(f"EOS id {EOS} at positions {list(fx.eos_positions)}")
    meta_extra = {}
    if fx.post is not None:
        notes += fx.post(model)

    # Optional rewrite into the official layout, then reload and re-check (reference stays the pre-rewrite one).
    if fx.rewrite is not None:
        desc = []
        rewrite_single_file(d, lambda t: fx.rewrite(t, desc))
        note = ("safetensors rewritten (lossless) after the reference run, which used the files as saved by "
                "save_pretrained: " + "; ".join(desc) + ". ")
        try:
            model2 = load_reference(cls, d, [])
            compare_weights(model.state_dict(), model2, fx.name + " (rewritten)")
            logits2, _ = run_full(model2, ids)
            d2 = (logits2 - logits).abs().max().item()
            note += f"HF reloads the rewritten files with identical weights (full logits max|d| = {d2:.3g})."
            meta_extra["rewritten_reload_logits_max_abs"] = d2
        except Exception as e:  # keep the fixture; say that HF itself cannot read this layout
            traceback.print_exc()
            note += f"HF could NOT reload the rewritten files: {type(e).__name__}: {e}"
        log("  " + note)
        notes.append(note)

    files = safetensors_files(d)
    dtypes = {}
    for fn in files:
        for k, v in read_safetensors_header(os.path.join(d, fn)).items():
            if k != "__metadata__":
                dtypes[v["dtype"]] = dtypes.get(v["dtype"], 0) + 1
    cfg = model.config
    text_cfg = getattr(cfg, "text_config", None) or cfg
    meta = dict(
        name=fx.name, **{"class": cls.__name__}, model_type=cfg.model_type, T=T, vocab=logits.shape[-1],
        n_hidden_states=len(hidden), hidden_widths=widths, max_abs_logit=logits.abs().max().item(),
        hf_full_vs_decode_max_abs=diff, hf_full_vs_decode_rel_l2=rel,
        storage_dtype=str(fx.storage_dtype).replace("torch.", ""),
        layer_types=getattr(text_cfg, "layer_types", None),
        safetensors_files=files, tensor_dtype_counts=dtypes,
        transformers_version=transformers.__version__, torch_version=torch.__version__,
        **qsa_info, **meta_extra, notes=notes)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    log(f"  wrote {d}: {sorted(os.listdir(d))}")
    return meta


# ----------------------------------------------------------------------------------------------------------------
# Fixture definitions


def qwen4_exp_model():
    return hf("Qwen4ExpForCausalLM")(hf("Qwen4ExpTextConfig")(**fresh(QWEN4_KW)))


def qwen4_exp_vlm_model():
    kw = fresh(QWEN4_KW, ple_layer_ids=[1, 3])
    del kw["output_gate_type"]  # unset -> hidden_act (silu) gate
    cfg = hf("Qwen4ExpConfig")(text_config=kw, vision_config=fresh(TINY_VISION))
    return hf("Qwen4ExpForConditionalGeneration")(cfg)


def official_qwen4_layout(tensors, desc):
    """Official Qwen3.8-Flash-Next layout: fused experts, one n-gram table per PLE layer, F32 small tensors,
    plus MTP tensors (ignored by transformers and by a text engine)."""
    tensors, n_fused = fuse_experts(tensors)
    tensors, n_merged = merge_ngram_shards(tensors)
    tensors, n_f32 = small_tensors_to_f32(tensors)
    H, C = QWEN4_KW["hidden_size"], QWEN4_KW["hc_count"]
    g = torch.Generator().manual_seed(77)
    mtp = {"mtp.fc_embedding.weight": (H, H), "mtp.fc_hidden.weight": (H, H),
           "mtp.pre_fc_norm_embedding.weight": (H,), "mtp.pre_fc_norm_hidden.weight": (C * H,)}
    for k, shape in mtp.items():
        tensors[k] = (torch.randn(shape, generator=g) * 0.3).to(torch.bfloat16)
    desc += [f"experts fused in {n_fused} layers (gate_up_proj [E,2I,H], down_proj [E,H,I])",
             f"n-gram shards merged into one ngram_embedding.weight in {n_merged} PLE layers",
             f"{n_f32} A_log / linear_attn.norm.weight tensors stored F32",
             f"{len(mtp)} fake mtp.* tensors added ({', '.join(mtp)})"]
    return tensors


def qwen3_5_model():
    return hf("Qwen3_5ForCausalLM")(hf("Qwen3_5TextConfig")(**fresh(COMMON, tie_word_embeddings=True),
                                                            intermediate_size=96))


def f32_small_tensors(tensors, desc):
    tensors, n = small_tensors_to_f32(tensors)
    desc.append(f"{n} A_log / linear_attn.norm.weight tensors stored F32")
    return tensors


def qwen3_5_moe_vlm_model():
    cfg = hf("Qwen3_5MoeConfig")(text_config=fresh(COMMON, **MOE), vision_config=fresh(TINY_VISION))
    return hf("Qwen3_5MoeForConditionalGeneration")(cfg)


def qwen3_5_moe_causal_model():
    return hf("Qwen3_5MoeForCausalLM")(hf("Qwen3_5MoeTextConfig")(**fresh(COMMON, **MOE)))


def fused_experts_only(tensors, desc):
    tensors, n = fuse_experts(tensors)
    desc.append(f"experts fused in {n} layers (gate_up_proj [E,2I,H], down_proj [E,H,I])")
    return tensors


def qwen3_next_model():
    cfg = hf("Qwen3NextConfig")(**fresh(COMMON, intermediate_size=96, **MOE, mlp_only_layers=[1],
                                     norm_topk_prob=False))
    assert list(cfg.mlp_only_layers) == [1] and cfg.norm_topk_prob is False
    return hf("Qwen3NextForCausalLM")(cfg)


def qwen3_model():
    cfg = hf("Qwen3Config")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32, intermediate_size=96,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True,
                            rms_norm_eps=1e-6, max_position_embeddings=512, eos_token_id=EOS)
    return hf("Qwen3ForCausalLM")(cfg)


def llama_model():
    cfg = hf("LlamaConfig")(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=False,
                            rope_parameters=fresh(LLAMA3_ROPE), max_position_embeddings=1024, rms_norm_eps=1e-5,
                            eos_token_id=EOS, bos_token_id=1)
    return hf("LlamaForCausalLM")(cfg)


def llama3_rope_check(model):
    """Which rotary frequencies the llama3 rule left untouched / smoothed / scaled (from the loaded inv_freq);
    all three kinds must occur.  Returns a note for meta.json."""
    rp = LLAMA3_ROPE
    inv = model.model.rotary_emb.inv_freq.double()
    dim = 2 * inv.numel()
    base = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    ratio = (inv / base).tolist()
    kind = ["untouched" if abs(r - 1) < 1e-5 else "scaled" if abs(r - 1 / rp["factor"]) < 1e-5 else "smoothed"
            for r in ratio]
    wavelen = (2 * math.pi / base).tolist()
    txt = ", ".join(f"k{i}: wavelen {w:.1f} {c} (x{r:.5f})" for i, (c, r, w) in enumerate(zip(kind, ratio, wavelen)))
    log("  llama3 rope frequencies: " + txt)
    if not {"untouched", "smoothed", "scaled"} <= set(kind):
        raise RuntimeError(f"llama3 rope: not every kind of frequency occurs: {kind}")
    return ["llama3 rope frequencies (inv_freq / unscaled inv_freq): " + txt]


QWEN4_EOS_POSITIONS = (1, 12, 13, 26, 35)  # EOS at position 1, a consecutive pair, and more

FIXTURES = {
    "qwen4_exp": lambda: Fixture("qwen4_exp", qwen4_exp_model, torch.bfloat16, weight_seed=1, token_seed=100,
                                 eos_positions=QWEN4_EOS_POSITIONS, qsa=True,
                                 notes=["spec qwen4_exp.md section 7 config: sigmoid output gate, ple_layer_ids [2], "
                                        "split_ngram_parts 4; layout as saved by save_pretrained (prefix model., "
                                        "per-expert experts, 4 n-gram shards, I64 PLE buffers)"]),
    "qwen4_exp_vlm": lambda: Fixture("qwen4_exp_vlm", qwen4_exp_vlm_model, torch.bfloat16, weight_seed=2,
                                     token_seed=200, eos_positions=(0, 9, 10, 22, 31), qsa=True,
                                     rewrite=official_qwen4_layout,
                                     notes=["Qwen4ExpForConditionalGeneration, text config of section 7 but "
                                            "output_gate_type unset (silu gate) and ple_layer_ids [1,3] (0-based "
                                            "layers 0 and 2); tiny vision tower saved under model.visual.* (not "
                                            "run); text-only input_ids"]),
    "qwen3_5": lambda: Fixture("qwen3_5", qwen3_5_model, torch.bfloat16, weight_seed=3, token_seed=300,
                               rewrite=f32_small_tensors,
                               notes=["Qwen3_5ForCausalLM, COMMON + intermediate_size 96, tie_word_embeddings "
                                      "true (no lm_head.weight in the file)"]),
    "qwen3_5_moe": lambda: Fixture("qwen3_5_moe", qwen3_5_moe_vlm_model, torch.bfloat16, weight_seed=4,
                                   token_seed=400, rewrite=fused_experts_only,
                                   notes=["Qwen3_5MoeForConditionalGeneration (COMMON + MOE text config, tiny "
                                          "vision tower under model.visual.*, not run); text-only input_ids"]),
    "qwen3_next": lambda: Fixture("qwen3_next", qwen3_next_model, torch.bfloat16, weight_seed=5, token_seed=500,
                                  max_shard_size=["200KB", "120KB", "60KB"],
                                  notes=["Qwen3NextForCausalLM, COMMON + intermediate_size 96 + MOE, "
                                         "mlp_only_layers [1] (layer 1 dense MLP), norm_topk_prob false; sharded "
                                         "save, per-expert layout as saved"]),
    "qwen3": lambda: Fixture("qwen3", qwen3_model, torch.float16, weight_seed=6, token_seed=600,
                             notes=["Qwen3ForCausalLM, tie_word_embeddings true, stored F16"]),
    "llama": lambda: Fixture("llama", llama_model, torch.float32, weight_seed=7, token_seed=700,
                             post=llama3_rope_check,
                             notes=["LlamaForCausalLM, head_dim 16, llama3 rope scaling " + json.dumps(LLAMA3_ROPE) +
                                    ", max_position_embeddings 1024, stored F32"]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}; CPU only")
    names = [n for n in args.only.split(",") if n] or list(FIXTURES)
    failed = []
    for name in names:
        try:
            fx = FIXTURES[name]()
            if name == "qwen3_5_moe":
                try:
                    make_fixture(fx, args.out)
                except Exception:
                    traceback.print_exc()
                    log("  Qwen3_5MoeForConditionalGeneration failed; falling back to Qwen3_5MoeForCausalLM")
                    fx = Fixture("qwen3_5_moe", qwen3_5_moe_causal_model, torch.bfloat16, weight_seed=4,
                                 token_seed=400, rewrite=fused_experts_only,
                                 notes=["Qwen3_5MoeForCausalLM (the ConditionalGeneration variant failed), "
                                        "COMMON + MOE, experts rewritten fused under the model. prefix"])
                    make_fixture(fx, args.out)
            else:
                make_fixture(fx, args.out)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            log(f"!! {name} FAILED")
    log(f"done: {len(names) - len(failed)} ok, failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
