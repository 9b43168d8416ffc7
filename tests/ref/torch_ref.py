"""Independent PyTorch reference for Loom's CPU backend.

Written from the Hugging Face architecture definitions (LlamaForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM) and PEFT's LoRA convention;
shares no code with the C side. Reads safetensors with a tiny parser (json + numpy), runs every sequence on its own
(no packing), in float64 by default so that the comparison measures the C backend's fp32
error rather than the reference's, gets gradients from autograd and steps with
torch.optim.AdamW + torch.nn.utils.clip_grad_norm_.

    check_dump(model_dir, dump_dir) -> list of (quantity, worst_rel, ok)
    check_curve(model_dir, dump_dir, report) adds an SFT loss curve to a report
"""
import json
import math
import os
import struct

import numpy as np
import torch

LORA_ALPHA = 32.0

# ---- safetensors ------------------------------------------------------------------------

_NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
       "I64": np.int64, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """name -> numpy array (BF16 widened to float32)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b:base + e]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, _NP[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    """name -> numpy array (F32 or F64) as a safetensors file (tests that edit a model)."""
    names = sorted(tensors)
    header, off, blobs = {}, 0, []
    for n in names:
        a = np.ascontiguousarray(tensors[n])
        dt = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}[a.dtype]
        header[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_model_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        out.update(read_safetensors(os.path.join(model_dir, fn)))
    return out


# ---- model ------------------------------------------------------------------------------

class RefModel:
    def __init__(self, model_dir, dtype=torch.float64):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.cfg = cfg
        self.dtype = dtype
        self.arch = cfg["architectures"][0]
        assert self.arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                             "Qwen3MoeForCausalLM"), self.arch
        self.H = cfg["hidden_size"]
        self.nq = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads") or self.nq
        self.d = cfg.get("head_dim") or self.H // self.nq
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.tie = cfg.get("tie_word_embeddings", False)
        self.moe = self.arch == "Qwen3MoeForCausalLM"
        self.qk_norm = self.arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
        self.qkv_bias = self.arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False)
        self.o_bias = self.arch != "Qwen2ForCausalLM" and cfg.get("attention_bias", False)
        # Qwen3MoeConfig's defaults
        self.E = cfg.get("num_experts", 128) if self.moe else 0
        self.K = cfg.get("num_experts_per_tok", 8)
        self.norm_topk = cfg.get("norm_topk_prob", False)
        self.sparse_step = cfg.get("decoder_sparse_step", 1)
        self.mlp_only = cfg.get("mlp_only_layers") or []
        w = read_model_weights(model_dir)
        if self.moe:
            w = self._unfuse_experts(w)
        self.W = {k: torch.tensor(v.astype(np.float64), dtype=dtype) for k, v in w.items()}
        self.head = self.W["model.embed_tokens.weight"] if self.tie else self.W["lm_head.weight"]
        self.inv_freq = self._inv_freq()

    def sparse(self, i):
        """Qwen3MoeDecoderLayer: a sparse MoE block, else Qwen3MoeMLP."""
        return self.moe and i not in self.mlp_only and self.E > 0 and (i + 1) % self.sparse_step == 0

    def _unfuse_experts(self, w):
        """transformers 5's fused experts (gate_up_proj [E, 2I, H], gate rows first as its
        chunk(2) takes them; down_proj [E, H, I]) as the per-expert tensors of the Hub
        layout, so that LoRA module names are the same in both."""
        for key in [k for k in w if k.endswith(".mlp.experts.gate_up_proj")]:
            pre = key[:-len("gate_up_proj")]
            gu, dn = w.pop(key), w.pop(pre + "down_proj")
            half = gu.shape[1] // 2
            for e in range(gu.shape[0]):
                w[f"{pre}{e}.gate_proj.weight"] = gu[e, :half]
                w[f"{pre}{e}.up_proj.weight"] = gu[e, half:]
                w[f"{pre}{e}.down_proj.weight"] = dn[e]
        return w

    def route(self, h, p):
        """Qwen3MoeSparseMoeBlock's router: softmax over all experts, the top K, renormalised
        when norm_topk_prob. Returns (weights [n, K], experts [n, K], probs). transformers
        takes torch.topk, which leaves the order of equal probabilities unspecified (it
        changes with E and K); a stable descending sort gives the same experts for distinct
        probabilities and Loom's rule, the lower index first, for equal ones."""
        probs = torch.softmax(h @ self.W[p + "mlp.gate.weight"].T, dim=-1)
        top_w, top_e = torch.sort(probs, dim=-1, descending=True, stable=True)
        top_w, top_e = top_w[:, :self.K], top_e[:, :self.K]
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_w, top_e, probs

    def moe_block(self, h, p, lora, counts=None):
        """The experts' SwiGLU outputs summed with the routing weights (index_add_ per expert,
        as transformers' loop does). counts: a list that gets each expert's token count."""
        top_w, top_e, probs = self.route(h, p)
        out = torch.zeros_like(h)
        for e in range(self.E):
            tok, slot = torch.where(top_e == e)
            if counts is not None:
                counts.append(int(tok.numel()))
            if tok.numel() == 0:
                continue
            x = h[tok]
            q = f"{p}mlp.experts.{e}."
            y = self.linear(torch.nn.functional.silu(self.linear(x, q + "gate_proj", lora)) *
                            self.linear(x, q + "up_proj", lora), q + "down_proj", lora)
            out = out.index_add(0, tok, y * top_w[tok, slot, None])
        # the smallest gap between a chosen and the best unchosen probability: a near-tie
        # there would let fp32 rounding pick another expert (reported by check_dump)
        srt = probs.sort(dim=-1, descending=True).values
        self.min_route_gap = min(getattr(self, "min_route_gap", 1.0),
                                 float((srt[:, self.K - 1] - srt[:, self.K]).min()) if self.K < self.E else 1.0)
        return out

    def _inv_freq(self):
        # transformers' _compute_default_rope_parameters / _compute_llama3_parameters
        base = self.cfg.get("rope_theta", 10000.0)
        d = self.d
        inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        rs = self.cfg.get("rope_scaling")
        if rs and rs.get("rope_type", rs.get("type")) == "llama3":
            factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
            old = rs["original_max_position_embeddings"]
            low_wl, high_wl = old / lo, old / hi
            wl = 2 * math.pi / inv
            inv_l = torch.where(wl > low_wl, inv / factor, inv)
            smooth = (old / wl - lo) / (hi - lo)
            smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
            medium = ~(wl < high_wl) & ~(wl > low_wl)
            inv = torch.where(medium, smoothed, inv_l)
        return inv.to(self.dtype)

    def rmsnorm(self, x, w):
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + self.eps))

    def linear(self, x, module, lora):
        y = x @ self.W[module + ".weight"].T
        b = self.W.get(module + ".bias")
        if b is not None:
            y = y + b
        if lora is not None and module in lora["mods"]:
            A, B = lora["mods"][module]
            y = y + lora["scale"] * ((x @ A.T) @ B.T)
        return y

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def forward(self, tokens, lora=None, counts=None):
        """tokens: LongTensor [n] -> logits [n, V]. lora: {"scale", "mods": {module: (A, B)}}.
        counts (MoE): a list that gets, sparse layer by sparse layer, each expert's tokens."""
        n = tokens.shape[0]
        x = self.W["model.embed_tokens.weight"][tokens]
        pos = torch.arange(n, dtype=self.dtype)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((n, n), float("-inf"), dtype=self.dtype).triu(1)
        rep = self.nq // self.nkv
        for i in range(self.L):
            p = f"model.layers.{i}."
            res = x
            h = self.rmsnorm(x, self.W[p + "input_layernorm.weight"])
            q = self.linear(h, p + "self_attn.q_proj", lora).view(n, self.nq, self.d)
            k = self.linear(h, p + "self_attn.k_proj", lora).view(n, self.nkv, self.d)
            v = self.linear(h, p + "self_attn.v_proj", lora).view(n, self.nkv, self.d)
            if self.qk_norm:
                q = self.rmsnorm(q, self.W[p + "self_attn.q_norm.weight"])
                k = self.rmsnorm(k, self.W[p + "self_attn.k_norm.weight"])
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, n, d]
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            k = k.repeat_interleave(rep, dim=0)  # HF repeat_kv: kv head g serves q heads g*rep..
            v = v.repeat_interleave(rep, dim=0)
            s = (q @ k.transpose(1, 2)) / math.sqrt(self.d) + mask
            a = torch.softmax(s, dim=-1) @ v  # [nq, n, d]
            a = a.transpose(0, 1).reshape(n, self.nq * self.d)
            x = res + self.linear(a, p + "self_attn.o_proj", lora)
            res = x
            h = self.rmsnorm(x, self.W[p + "post_attention_layernorm.weight"])
            if self.sparse(i):
                x = res + self.moe_block(h, p, lora, counts)
                continue
            g = self.linear(h, p + "mlp.gate_proj", lora)
            u = self.linear(h, p + "mlp.up_proj", lora)
            x = res + self.linear(torch.nn.functional.silu(g) * u, p + "mlp.down_proj", lora)
        x = self.rmsnorm(x, self.W["model.norm.weight"])
        logits = x @ self.head.T
        if lora is not None and "model.unembed_tokens" in lora["mods"]:
            A, B = lora["mods"]["model.unembed_tokens"]
            logits = logits + lora["scale"] * ((x @ A.T) @ B.T)
        return logits


# ---- losses (docs/protocol.md §8) -------------------------------------------------------

def token_losses(kind, lp, weights, q, adv, clip_low, clip_high, beta):
    if kind == "cross_entropy":
        return -lp * weights
    live = adv != 0
    # Positions with A == 0 are padding: q there may be -1000 (ratio inf). Give them a
    # harmless q so that no inf reaches autograd, then zero their loss.
    q_safe = torch.where(live, q, lp.detach())
    ratio = torch.exp(lp - q_safe)
    if kind == "importance_sampling":
        loss = -(ratio * adv)
    elif kind == "ppo":
        loss = -torch.minimum(ratio * adv, torch.clamp(ratio, clip_low, clip_high) * adv)
    elif kind == "cispo":
        loss = -(torch.clamp(ratio, clip_low, clip_high).detach() * lp * adv)
    elif kind == "dro":
        loss = -(lp * adv - 0.5 * beta * (lp - q_safe) ** 2)
    else:
        raise ValueError(kind)
    return torch.where(live, loss, torch.zeros_like(loss))


# ---- comparison -------------------------------------------------------------------------

RTOL, ATOL = 1e-4, 1e-5
# Issue 4's bar: every tensor within 1e-5 relative, measured per tensor as
# ||got - ref||_2 / ||ref||_2 (fp32 against an fp64 reference; element-wise relative
# error of near-zero entries is dominated by fp32 rounding and is bounded by RTOL/ATOL).
NORM_RTOL = 1e-5

# Bars per quantity, (rtol, atol, norm_rtol), by the precision the backend computes in.
# "fp32" is the CPU backend's: the defaults above, except the AdamW update (the difference
# of two fp32 parameter tensors, so fp32 rounding of the parameters bounds its precision
# near 1e-5: element-wise 1e-3, no norm bar). "bf16" is for backends with bf16 GEMM inputs
# (cuda): an emulation of that rounding on this reference gives log-probs 7e-4 and LoRA
# gradients 1e-2 per tensor; the bars leave 3-5x for bf16 attention probabilities and
# dlogits. After AdamW the parameters move by about lr*sign(g): where a gradient element
# is within bf16 noise of 0 its update may flip sign, so the update itself is held only to
# a loose norm bar (AdamW's arithmetic is checked bitwise against the CPU backend by
# tests/gpu/test_gpu_backend.c).
PROFILES = {
    "fp32": {"adamw_update": (1e-3, 1e-3, None)},
    "bf16": {
        "logprobs": (5e-2, 1e-2, 3e-3),
        "solo_vs_ref": (5e-2, 1e-2, 3e-3),
        "solo_vs_packed": (5e-2, 1e-2, 2e-2),
        "elementwise_loss": (5e-2, 1e-2, 2e-2),
        "loss_sum": (1e-2, 0.0, 1e-2),
        "grads": (1.0, 5e-2, 5e-2),
        "grad_norm": (3e-2, 0.0, 3e-2),
        "params_after_adamw": (0.0, 5e-2, 2e-2),
        "adam_exp_avg": (1.0, 5e-2, 5e-2),
        "adam_exp_avg_sq": (1.0, 1e-1, 1e-1),
        "adamw_update": (0.0, 2.1, 0.5),
    },
}


class Report:
    def __init__(self, label, tolerance="fp32"):
        self.label = label
        self.bars = PROFILES[tolerance]
        self.worst = {}   # quantity -> (worst scaled rel error, ok)
        self.worst_norm = {}  # quantity -> (worst ||got-ref|| / ||ref|| over its tensors, ok)
        self.failures = []

    def compare_exact(self, quantity, name, got, ref):
        """Integers that must be equal (expert routing counts)."""
        got, ref = np.asarray(got).reshape(-1), np.asarray(ref).reshape(-1)
        ok = got.shape == ref.shape and bool(np.all(got == ref))
        diff = int(np.sum(np.abs(got - ref))) if got.shape == ref.shape else -1
        prev = self.worst.get(quantity, (0.0, True))
        self.worst[quantity] = (max(prev[0], float(abs(diff))), prev[1] and ok)
        if not ok:
            self.failures.append(f"{quantity} {name}: got {got.tolist()} ref {ref.tolist()}")

    def compare(self, quantity, name, got, ref, slack=None):
        """|got - ref| <= rtol*|ref| + atol*max|ref| elementwise and ||got - ref|| <=
        norm_rtol*||ref|| (the quantity's bars in this report's profile); tracks the worst
        relative error |got - ref| / max(|ref|, 0.1*max|ref|) per quantity. slack: per
        element, a difference the inputs' own tolerance explains (adamw_slack), taken off
        |got - ref| before the bars apply."""
        rtol, atol, norm_rtol = self.bars.get(quantity, (RTOL, ATOL, NORM_RTOL))
        got = np.asarray(got, dtype=np.float64).reshape(-1)
        ref = np.asarray(ref, dtype=np.float64).reshape(-1)
        if got.shape != ref.shape:
            self.failures.append(f"{quantity} {name}: shape {got.shape} vs {ref.shape}")
            self.worst[quantity] = (float("inf"), False)
            return
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        diff = np.abs(got - ref)
        if slack is not None:
            diff = np.maximum(diff - np.asarray(slack, dtype=np.float64).reshape(-1), 0.0)
        ok = bool(np.all(np.isfinite(got))) and bool(np.all(diff <= rtol * np.abs(ref) + atol * scale))
        rel = float(np.max(diff / np.maximum(np.abs(ref), max(0.1 * scale, 1e-30)))) if ref.size else 0.0
        if not np.all(np.isfinite(got)):
            rel = float("inf")
        prev = self.worst.get(quantity, (0.0, True))
        self.worst[quantity] = (max(prev[0], rel), prev[1] and ok)
        ref_norm = float(np.linalg.norm(ref))
        nrel = float(np.linalg.norm(diff)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(got))
        if not np.all(np.isfinite(got)):
            nrel = float("inf")
        nok = norm_rtol is None or nrel <= norm_rtol
        prevn = self.worst_norm.get(quantity, (0.0, True))
        self.worst_norm[quantity] = (max(prevn[0], nrel), prevn[1] and nok)
        if not nok:
            self.failures.append(f"{quantity} {name}: ||got-ref||/||ref|| = {nrel:.3g} > {norm_rtol:g}")
        if not ok:
            i = int(np.argmax(diff - rtol * np.abs(ref)))
            self.failures.append(f"{quantity} {name}: worst at {i}: got {got[i]:.9g} ref {ref[i]:.9g} "
                                 f"(max|ref| {scale:.3g})")


def adamw_slack(grad, dgrad, state, lr, betas, eps, prev):
    """The part of an AdamW update's difference that the gradient's own difference dgrad
    (the C side's gradient minus the reference's, as clipped) explains: the update's
    derivative times dgrad, plus two fp32 ulps of the parameter the update is the
    difference of. AdamW divides by sqrt(v̂) + eps: where |g| is near eps (an expert
    reached by a token or two, common in MoE adapters) a gradient right to 1e-7 of its
    tensor's scale moves the update by a sizeable fraction of lr; that is the update's
    conditioning, and the gradient itself is held to its own bars ("grads")."""
    g = grad.double().abs()
    t = state["step"]
    t = float(t.item() if torch.is_tensor(t) else t)
    b1, b2 = betas
    m = state["exp_avg"].double().abs() / (1 - b1 ** t)
    sv = (state["exp_avg_sq"].double() / (1 - b2 ** t)).sqrt()
    sens = (1 - b1) / (1 - b1 ** t) / (sv + eps) + \
        m * (1 - b2) * g / ((1 - b2 ** t) * sv.clamp_min(1e-30) * (sv + eps) ** 2)
    return (lr * sens * dgrad.abs()).numpy() + 2.0 ** -22 * np.abs(prev)


def _seq_inputs(D, i):
    g = lambda k: D[f"in.seq{i}.{k}"]
    return (torch.tensor(g("tokens").astype(np.int64)), torch.tensor(g("targets").astype(np.int64)),
            torch.tensor(g("weights").astype(np.float64)), torch.tensor(g("sampler_logprobs").astype(np.float64)),
            torch.tensor(g("advantages").astype(np.float64)))


def check_dump(model_dir, dump_dir, label, dtype=torch.float64, tolerance="fp32"):
    with open(os.path.join(dump_dir, "case.json")) as f:
        case = json.load(f)
    D = read_safetensors(os.path.join(dump_dir, "dump.safetensors"))
    model = RefModel(model_dir, dtype)
    rep = Report(label, tolerance)
    nad = len(case["adapters"])

    # adapters: PEFT names -> leaf tensors
    params, loras = [], []
    for a, ad in enumerate(case["adapters"]):
        prefix = f"init.ad{a}.param."
        names = sorted(k[len(prefix):] for k in D if k.startswith(prefix))
        P = {n: torch.tensor(D[prefix + n].astype(np.float64), dtype=dtype, requires_grad=True) for n in names}
        mods = {}
        for n in names:
            if n.endswith(".lora_A.weight"):
                mod = n[len("base_model.model."):-len(".lora_A.weight")]
                mods[mod] = (P[n], P[n.replace("lora_A", "lora_B")])
        params.append(P)
        loras.append({"scale": LORA_ALPHA / ad["rank"], "mods": mods})
    opts = [torch.optim.AdamW(list(params[a].values()), lr=case["adam"][a]["lr"],
                              betas=(case["adam"][a]["beta1"], case["adam"][a]["beta2"]),
                              eps=case["adam"][a]["eps"], weight_decay=case["adam"][a]["weight_decay"])
            for a in range(nad)]

    ref_step0_lp = {}
    for step in range(case["steps"]):
        if step > 0:
            # Each step from the state the C side reached: the previous step's parameters and
            # AdamW moments were compared above; carrying the reference's own state on would
            # add the earlier step's ill-conditioned updates (adamw_slack) to this one.
            with torch.no_grad():
                for a in range(nad):
                    for n, t in params[a].items():
                        t.copy_(torch.tensor(D[f"step{step - 1}.ad{a}.param.{n}"].astype(np.float64)))
                        st = opts[a].state[t]
                        st["exp_avg"].copy_(torch.tensor(D[f"step{step - 1}.ad{a}.exp_avg.{n}"].astype(np.float64)))
                        st["exp_avg_sq"].copy_(
                            torch.tensor(D[f"step{step - 1}.ad{a}.exp_avg_sq.{n}"].astype(np.float64)))
        for P in params:
            for t in P.values():
                t.grad = None
        total = torch.zeros((), dtype=dtype)
        for i, s in enumerate(case["seqs"]):
            tok, tgt, w, q, adv = _seq_inputs(D, i)
            lora = loras[s["adapter"]] if s["adapter"] >= 0 else None
            counts = []
            logits = model.forward(tok, lora, counts)
            key = f"step{step}.seq{i}.expert_counts"
            if key in D:  # the routing itself: each expert's tokens per sparse layer, exactly
                rep.compare_exact("expert_counts", f"step{step}.seq{i}", D[key], counts)
            K = s.get("k", 1)
            # 2-D cross_entropy (docs/protocol.md §8): targets/weights [n, K], loss[i] = -sum_j w[i,j] lp[i,j]
            lp = torch.log_softmax(logits, dim=-1).gather(1, tgt.view(-1, K))
            if not s["has_weights"]:
                w = torch.ones_like(w)
            if K > 1:
                loss = -(lp * w.view(-1, K)).sum(-1)
                lp = lp.reshape(-1)
            else:
                lp = lp[:, 0]
                loss = token_losses(s["loss"], lp, w, q, adv, s["clip_low"], s["clip_high"], s["beta"])
            rep.compare("logprobs", f"step{step}.seq{i}", D[f"step{step}.seq{i}.logprobs"], lp.detach())
            rep.compare("elementwise_loss", f"step{step}.seq{i}", D[f"step{step}.seq{i}.loss"], loss.detach())
            if step == 0:
                ref_step0_lp[i] = (lp.detach(), loss.detach())
            if s["adapter"] >= 0 and not s["forward_only"]:
                total = total + loss.sum()
        got_sum = sum(float(np.sum(D[f"step{step}.seq{i}.loss"], dtype=np.float64))
                      for i, s in enumerate(case["seqs"]) if s["adapter"] >= 0 and not s["forward_only"])
        rep.compare("loss_sum", f"step{step}", [got_sum], [float(total)])
        total.backward()
        for P in params:  # an expert no token of the adapter reached: a zero gradient, as in Loom
            for t in P.values():
                if t.grad is None:
                    t.grad = torch.zeros_like(t)
        dgrads = []
        for a in range(nad):
            dgrads.append({})
            for n, t in params[a].items():
                rep.compare("grads", f"step{step}.ad{a}.{n}", D[f"step{step}.ad{a}.grad.{n}"], t.grad)
                dgrads[a][n] = torch.tensor(D[f"step{step}.ad{a}.grad.{n}"].astype(np.float64)) - t.grad.double()
        # optimizer, per adapter: clip to the same max norm the C side used, then AdamW
        for a in range(nad):
            before = {n: t.detach().clone() for n, t in params[a].items()}
            clip = float(D[f"step{step}.ad{a}.grad_clip_norm"][0])
            ps = list(params[a].values())
            norm = math.sqrt(sum(float((t.grad.double() ** 2).sum()) for t in ps))
            rep.compare("grad_norm", f"step{step}.ad{a}", D[f"step{step}.ad{a}.grad_norm"], [norm])
            coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0  # torch's clip coefficient
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(ps, clip)
            for g in opts[a].param_groups:
                g["lr"] = case["adam"][a]["lr"] * (case["lr_factor_step1"] if step == 1 else 1.0)
            opts[a].step()
            grp = opts[a].param_groups[0]
            for n, t in params[a].items():
                got = D[f"step{step}.ad{a}.param.{n}"]
                prev = D[f"init.ad{a}.param.{n}"] if step == 0 else D[f"step{step - 1}.ad{a}.param.{n}"]
                st = opts[a].state[t]
                slack = adamw_slack(t.grad, dgrads[a][n] * coef, st, grp["lr"], grp["betas"], grp["eps"], prev)
                rep.compare("params_after_adamw", f"step{step}.ad{a}.{n}", got, t.detach(), slack)
                # The AdamW state the update is computed from, against torch.optim.AdamW's.
                rep.compare("adam_exp_avg", f"step{step}.ad{a}.{n}", D[f"step{step}.ad{a}.exp_avg.{n}"],
                            st["exp_avg"])
                rep.compare("adam_exp_avg_sq", f"step{step}.ad{a}.{n}", D[f"step{step}.ad{a}.exp_avg_sq.{n}"],
                            st["exp_avg_sq"])
                # The update itself, to catch errors far below the parameters' magnitude
                # (its bars: PROFILES).
                rep.compare("adamw_update", f"step{step}.ad{a}.{n}", got.astype(np.float64) - prev,
                            (t.detach() - before[n]).numpy(), slack)

    # each adapter alone (C) vs packed (C) and vs the reference: only the summation order
    # of the GEMMs differs, so the reference tolerance applies (bf16: PROFILES)
    for i, s in enumerate(case["seqs"]):
        if f"solo.seq{i}.logprobs" in D:
            rep.compare("solo_vs_packed", f"seq{i}.logprobs", D[f"solo.seq{i}.logprobs"],
                        D[f"step0.seq{i}.logprobs"])
            rep.compare("solo_vs_ref", f"seq{i}.logprobs", D[f"solo.seq{i}.logprobs"], ref_step0_lp[i][0])
    rep.min_route_gap = getattr(model, "min_route_gap", None)
    for a in range(nad):
        for n in params[a]:
            key = f"solo.ad{a}.grad.{n}"
            if key in D:
                rep.compare("solo_vs_packed", f"ad{a}.{n}", D[key], D[f"step0.ad{a}.grad.{n}"])
    return rep


# (relative to the step's loss, relative to the first step's loss): fp32: measured 2e-6 at
# worst over 12 steps (Loom vs float64). bf16: the drift of a bf16 run compounds while its
# loss falls ~20-fold, so late steps are held to 5 % of their loss or 0.5 % of the first
# step's, whichever is larger; measured on an H200 (2026-11-26, cuda backend): worst 0.91 at
# a loss of 15.9 (5.7 % of it, 0.31 % of the first step's 289.6; llama), 4.98 %/0.14 %
# (llama3 RoPE), 1.8 %/0.1 % (qwen3, qwen2)
CURVE_TOL = {"fp32": (1e-4, 0.0), "bf16": (5e-2, 5e-3)}


def check_curve(model_dir, dump_dir, rep, dtype=torch.float64, tolerance="fp32"):
    """`test_cpu_ref curve`'s SFT loop (cross_entropy summed over 4 sequences, AdamW lr 1e-2,
    betas 0.9/0.95, eps 1e-8, no weight decay, 12 steps) from the same initial adapter, in
    float64: each step's loss sum within CURVE_TOL of Loom's. Unlike the per-step checks of
    check_dump, the two runs go on from their own states: the curve measures the drift of a
    short training run."""
    D = read_safetensors(os.path.join(dump_dir, "curve.safetensors"))
    model = RefModel(model_dir, dtype)
    prefix = "init.ad0.param."
    names = sorted(k[len(prefix):] for k in D if k.startswith(prefix))
    P = {n: torch.tensor(D[prefix + n].astype(np.float64), dtype=dtype, requires_grad=True) for n in names}
    mods = {n[len("base_model.model."):-len(".lora_A.weight")]: (P[n], P[n.replace("lora_A", "lora_B")])
            for n in names if n.endswith(".lora_A.weight")}
    rank = P[names[0]].shape[0] if ".lora_A." in names[0] else P[names[0]].shape[1]
    lora = {"scale": LORA_ALPHA / rank, "mods": mods}
    opt = torch.optim.AdamW(list(P.values()), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    toks = torch.tensor(D["tokens"].astype(np.int64))
    got = D["curve"].astype(np.float64)
    ref = []
    for _ in range(len(got)):
        for t in P.values():
            t.grad = None
        total = torch.zeros((), dtype=dtype)
        for seq in toks:
            lp = torch.log_softmax(model.forward(seq[:-1], lora), dim=-1).gather(1, seq[1:].view(-1, 1))
            total = total - lp.sum()
        total.backward()
        for t in P.values():
            if t.grad is None:
                t.grad = torch.zeros_like(t)
        opt.step()
        ref.append(float(total))
    rtol, first_tol = CURVE_TOL[tolerance]
    ref = np.array(ref)
    rel = np.abs(got - ref) / np.abs(ref)
    bar = np.maximum(rtol * np.abs(ref), first_tol * abs(ref[0]))  # absolute, per step
    scaled = np.abs(got - ref) / bar  # ≤ 1 passes
    worst = float(rel.max())
    ok = bool(np.all(np.isfinite(got))) and bool(np.all(scaled <= 1.0))
    rep.worst["sft_curve"] = (worst, ok)
    rep.worst_norm["sft_curve"] = (worst, ok)
    if not ok:
        i = int(np.nanargmax(np.where(np.isfinite(scaled), scaled, np.inf)))
        rep.failures.append(f"sft_curve step {i}: Loom {got[i]:.9g} reference {ref[i]:.9g} (rel {rel[i]:.3g}; bar "
                            f"{bar[i]:.3g}: {rtol:g} of the step's loss or {first_tol:g} of the first step's)")
    rep.curve = (got, ref)
    return rep
