#!/usr/bin/env python3
"""Fixtures for the MTP draft head: a tiny random head added to four fixtures, and its reference draft logits.

transformers does not run the MTP head (it drops `mtp.*` on load), so the reference is assembled here from
transformers' own modules, following ../shared/spec (qwen35_family.md section 3, qwen4_exp.md section 3.10):

  qwen3_5 / qwen3_5_moe / qwen3_next (vLLM semantics):
      e = ZRMS(embed[x_{p+1}]; pre_fc_norm_embedding)     h = ZRMS(h_p; pre_fc_norm_hidden)
      u = fc . concat(e, h)                               (fc [H, 2H], embedding first)
      u = ZRMS(DecoderLayer(u); mtp.norm)                 (a full-attention layer with its own KV cache)
      draft logits = lm_head . u;  the next chained step feeds u back as h
    h_p is the main model's hidden after its final norm.
  qwen4_exp:
      ep = fc_embedding . ZRMS(embed[x_{p+1}]; pre_fc_norm_embedding)
      hn = ZRMS(X_p; pre_fc_norm_hidden)                  (ONE RMS over all C*H values)
      Z[s] = fc_hidden . hn[s] + ep                       (every stream s)
      Z = QSA decoder layer(Z)   (hyper-connections, QSA with its own KV and indexer keys, MoE; no PLE)
      draft logits = lm_head . HC_mix(mtp.hyper_connection_mixer, Z);  the next chained step feeds Z back as X
    X_p is the main model's C*H streams after its last layer, before its hyper_connection_mixer.

The decoder layer (and its final norm or stream mixer) is transformers' own: a one-layer text model of the
fixture's architecture (`type(model.model)(config)` with one full-attention / QSA layer and no PLE) whose
`layers.0.*` and `norm` / `hyper_connection_mixer` are the head's `mtp.layers.0.*` and `mtp.norm` /
`mtp.hyper_connection_mixer`. The one-layer model runs the head over a whole sequence at once (causal), which is
the head's KV cache filled position by position.

For each source fixture FX (tests/fixtures/FX, made by make_fixtures.py) this writes tests/fixtures/mtp/FX/:
  config.json          FX's, plus mtp_num_hidden_layers 1 (left out for qwen3_next, whose releases lack it)
  model.safetensors    FX's tensors (one file) plus the head's mtp.* tensors (bf16, random N(0, 0.3^2))
  tokens.txt           FX's T ids
  logits_full.f32      FX's reference logits (the main model is unchanged)
  chain.txt            three token ids c0 c1 c2 for the chained drafts
  mtp_logits.f32       [T-1][V]: the head at position p (input x_{p+1}, main hidden h_p), p = 0 .. T-2
  mtp_chain.f32        [3][V]: after the T tokens, the head at position T-1 with c0 and h_{T-1}, then at T with
                       c1 and its own output, then at T+1 with c2
  meta.json
The head's QSA indexer (qwen4_exp) must not meet a top-k tie. With random weights a block scores exactly 0
whenever every head's dot product is <= 0, and such ties are common; so the head's indexer query heads are paired
(W_{h+1} = -W_h, as the bundled model's training does: a block then scores sum |q_h . k| > 0), and the head's
weights are redrawn until no indexer call has a gap <= make_fixtures.TIE_GAP at the selection boundary.

Usage: python3 tests/gen/make_mtp_fixtures.py [--fixtures DIR] [--only qwen4_exp,...]   (CPU, float32)
"""

import argparse
import copy
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

SOURCES = {"qwen4_exp": 11, "qwen3_5": 13, "qwen3_5_moe": 14, "qwen3_next": 15}  # fixture -> head weight seed


def log(*a):
    print(*a, flush=True)


def text_model_of(model):
    """The module that holds the decoder layers (model.model or model.model.language_model)."""
    for _, mod in model.named_modules():
        if isinstance(getattr(mod, "layers", None), torch.nn.ModuleList) and hasattr(mod, "embed_tokens"):
            return mod
    raise RuntimeError("no text model with layers found")


@torch.no_grad()
def pair_indexer_heads(model):
    """Indexer query heads in pairs (h, h+1) with W_{h+1} = -W_h (relu(q.k) + relu(-q.k) = |q.k|)."""
    for _, mod in model.named_modules():
        if type(mod).__name__.endswith("Indexer"):
            w, ni, hd = mod.index_qk_proj.weight, mod.index_n_heads, mod.index_head_dim
            for h in range(0, ni - 1, 2):
                w[(h + 1) * hd:(h + 2) * hd] = -w[h * hd:(h + 1) * hd]


def zrms(x, w, eps):
    """Zero-centred RMSNorm over the last dimension, float32: x / rms(x) * (1 + w)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())


class MtpHead:
    """The head of one architecture: its own tensors (fc..., norms) and the one-layer text model (transformers)."""

    def __init__(self, model, seed=None, state=None):
        tm = text_model_of(model)
        self.main = model
        self.tm = tm
        cfg = copy.deepcopy(tm.config)
        self.qwen4 = hasattr(cfg, "hc_count")
        self.H = cfg.hidden_size
        self.C = cfg.hc_count if self.qwen4 else 1
        self.eps = cfg.rms_norm_eps
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["qwen_sparse_attention" if self.qwen4 else "full_attention"]
        if self.qwen4:
            cfg.ple_layer_ids = []
        if hasattr(cfg, "mlp_only_layers"):
            cfg.mlp_only_layers = []
        self.cfg = cfg
        self.mini = type(tm)(cfg).float().eval()
        H, C = self.H, self.C
        if self.qwen4:
            own = {"fc_embedding.weight": (H, H), "fc_hidden.weight": (H, H), "pre_fc_norm_embedding.weight": (H,),
                   "pre_fc_norm_hidden.weight": (C * H,)}
        else:
            own = {"fc.weight": (H, 2 * H), "pre_fc_norm_embedding.weight": (H,), "pre_fc_norm_hidden.weight": (H,)}
        self.own = {k: torch.zeros(s) for k, s in own.items()}
        if state is not None:
            self.load_state(state)
        elif seed is not None:
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for _, p in self.mini.named_parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
                for k in self.own:
                    self.own[k] = torch.randn(self.own[k].shape, generator=g) * 0.3
                if self.qwen4:
                    pair_indexer_heads(self.mini)
            self.round(torch.bfloat16)

    def state(self):
        """The head's tensors under their checkpoint names (mtp.*)."""
        out = {"mtp." + k: v for k, v in self.own.items()}
        for k, v in self.mini.state_dict().items():
            if k.startswith("embed_tokens.") or "rotary" in k:
                continue
            out["mtp." + k] = v
        return out

    def load_state(self, st):
        sd = self.mini.state_dict()
        with torch.no_grad():
            for k in self.own:
                self.own[k] = st["mtp." + k].float()
            for k in sd:
                if ("mtp." + k) in st:
                    sd[k].copy_(st["mtp." + k].float())

    def round(self, dtype):
        with torch.no_grad():
            for _, p in self.mini.named_parameters():
                p.copy_(p.to(dtype).float())
            for k in self.own:
                self.own[k] = self.own[k].to(dtype).float()

    def main_hidden(self, ids):
        """The main model's logits and the head's hidden input at every position: the final-norm output (qwen3.5
        family) or the streams entering hyper_connection_mixer (qwen4_exp)."""
        got = {}
        if self.qwen4:
            hook = self.tm.hyper_connection_mixer.register_forward_pre_hook(
                lambda mod, args: got.__setitem__("h", args[0].detach()))
        else:
            hook = self.tm.norm.register_forward_hook(lambda mod, args, out: got.__setitem__("h", out.detach()))
        with torch.no_grad():
            logits = self.main(input_ids=ids[None], use_cache=False).logits[0].float()
        hook.remove()
        return logits, got["h"][0].float()

    def run(self, toks, hid):
        """The head over rows p = 0..n-1 of each sequence (position p, input token toks[b, p], hidden hid[b, p]),
        causal: the draft logits [B][n][V] and the hidden each row feeds to the next chained step [B][n][W]."""
        emb = self.tm.embed_tokens.weight
        e = zrms(emb[toks], self.own["pre_fc_norm_embedding.weight"], self.eps)
        h = zrms(hid, self.own["pre_fc_norm_hidden.weight"], self.eps)
        B, n = toks.shape
        lm = self.main.lm_head.weight
        if not self.qwen4:
            u = torch.cat([e, h], dim=-1) @ self.own["fc.weight"].T
            out = self.mini(inputs_embeds=u, use_cache=False).last_hidden_state
            return out @ lm.T, out
        H, C = self.H, self.C
        ep = e @ self.own["fc_embedding.weight"].T
        z = (h.view(B, n, C, H) @ self.own["fc_hidden.weight"].T + ep[:, :, None, :]).reshape(B, n, C * H)
        got = {}
        pre = self.mini.layers[0].register_forward_pre_hook(lambda mod, args: (z.to(args[0].dtype),) + tuple(args[1:]))
        post = self.mini.layers[0].register_forward_hook(lambda mod, args, out: got.__setitem__("z", out))
        dummy = torch.zeros(B, n, H, device=z.device, dtype=z.dtype)
        try:
            mixed = self.mini(inputs_embeds=dummy, use_cache=False).last_hidden_state
        finally:
            pre.remove()
            post.remove()
        zo = got["z"]
        zo = zo[0] if isinstance(zo, tuple) else zo
        return mixed @ lm.T, zo

    def reference(self, ids, chain):
        """mtp_logits [T-1][V] (catch-up rows) and mtp_chain [len(chain)][V]."""
        with torch.no_grad():
            main_logits, hid = self.main_hidden(ids)
            T = ids.shape[0]
            toks, rows = list(ids[1:].tolist()), [hid[p] for p in range(T - 1)]
            lg, _ = self.run(torch.tensor(toks)[None], torch.stack(rows)[None])
            lg = lg[0].float()
            chain_lg = []
            h_next = hid[T - 1]
            for c in chain:
                toks.append(int(c))
                rows.append(h_next)
                out_lg, out_h = self.run(torch.tensor(toks)[None], torch.stack(rows)[None])
                chain_lg.append(out_lg[0, -1].float())
                h_next = out_h[0, -1].float()
            return main_logits, lg, torch.stack(chain_lg)


def load_fixture_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = getattr(transformers, cfg["architectures"][0])
    return mf.load_reference(cls, d, [])


def read_tensors(d):
    out = {}
    for f in mf.safetensors_files(d):
        out.update(load_file(os.path.join(d, f)))
    return out


def make(name, src_root, out_root):
    src = os.path.join(src_root, name)
    dst = os.path.join(out_root, "mtp", name)
    log(f"== mtp/{name} (from {src})")
    model = load_fixture_model(src)
    ids = torch.tensor([int(x) for x in open(os.path.join(src, "tokens.txt")).read().strip().split(",")])
    V = model.lm_head.weight.shape[0]
    chain = [int(x) for x in torch.randint(0, V, (3,), generator=torch.Generator().manual_seed(SOURCES[name]))]
    for attempt in range(8):
        head = MtpHead(model, seed=SOURCES[name] * 100 + attempt)
        with mf.TopkMonitor() as mon:
            main_logits, lg, chain_lg = head.reference(ids, chain)
        st = mon.qsa()
        log(f"  head seed {SOURCES[name] * 100 + attempt}: indexer rows {st['rows']} sparse {st['sparse']} "
            f"ties {st['ties']} min gap {st['min_gap']:.3g}")
        if not head.qwen4 or st["ties"] == 0:
            break
    else:
        raise RuntimeError("every head seed met a QSA tie")
    ref = torch.from_numpy(__import__("numpy").fromfile(os.path.join(src, "logits_full.f32"), dtype="<f4")).view(-1, V)
    d_main = (ref - main_logits).abs().max().item()
    log(f"  main logits vs the fixture's: max |d| {d_main:.3g}")
    if d_main > 1e-4:
        raise RuntimeError("the reloaded main model does not reproduce the fixture's logits")
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    tensors = read_tensors(src)
    for k, v in head.state().items():
        tensors[k] = v.to(torch.bfloat16).contiguous()
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    if name != "qwen3_next":
        if "text_config" in cfg:
            cfg["text_config"]["mtp_num_hidden_layers"] = 1
        else:
            cfg["mtp_num_hidden_layers"] = 1
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("generation_config.json", "tokens.txt", "logits_full.f32"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    open(os.path.join(dst, "chain.txt"), "w").write(",".join(map(str, chain)) + "\n")
    mf.write_f32(os.path.join(dst, "mtp_logits.f32"), lg)
    mf.write_f32(os.path.join(dst, "mtp_chain.f32"), chain_lg)
    meta = dict(name="mtp/" + name, source=name, T=int(ids.shape[0]), vocab=V, chain=chain,
                head_tensors=sorted(head.state()), qsa=mon.qsa() if head.qwen4 else None,
                max_abs_mtp_logit=lg.abs().max().item(), max_abs_chain_logit=chain_lg.abs().max().item(),
                main_logits_max_abs_diff=d_main, transformers_version=transformers.__version__,
                torch_version=torch.__version__)
    if meta["qsa"]:
        meta["qsa"] = {k: (None if v == float("inf") else v) for k, v in meta["qsa"].items()}
    json.dump(meta, open(os.path.join(dst, "meta.json"), "w"), indent=1)
    log(f"  wrote {dst}: {sorted(os.listdir(dst))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    names = [n for n in args.only.split(",") if n] or list(SOURCES)
    failed = []
    for n in names:
        try:
            make(n, args.fixtures, args.fixtures)
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            failed.append(f"{n}: {e}")
    if failed:
        log("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
