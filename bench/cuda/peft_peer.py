#!/usr/bin/env python3
"""PyTorch + PEFT peer of Loom's CUDA backend (issue: the CUDA backend), run on the same GPU.

bf16 base weights (random, built from a transformers config: no hub), SDPA attention,
LoRA r=32 (alpha 32, no dropout) on q,k,v,o,gate,up,down, loss = sum of the per-token
log-probabilities (cross_entropy with reduction="sum" on fp32 logits), forward_backward
without an optimizer step. Prints forward and forward+backward tokens/s, MFU and peak
memory for each row of the issue's table, the gradient-checkpointing rows, and eight
tenants (PEFT switching adapters between passes) against one adapter on the same tokens.

--rows decode (its own choice: "all" is still the training rows above, table + ckpt +
tenants): HF `generate` with PEFT on the same random-weight models, the peer of
`bench_cuda --decode`. Decode: batch 32 (8 prompts of 128 random tokens, each repeated 4
times, as Loom's 8 requests × 4 samples), do_sample at temperature 1 with no top-k/top-p,
use_cache, every row generating its full length (min_new_tokens); step = (t(1 + N new
tokens) − t(1)) / N, N = --steps (128); rows for 8 adapters mixed in one batch (PEFT's
`adapter_names=`, 4 rows each; when this PEFT refuses, the row has an "error" and a note is
printed), one adapter, and the base model (adapters disabled). Time to first token: a
2048-token prompt, max_new_tokens 1, batch 1 (one adapter) and batch 8 (8 adapters mixed,
else one), median of 5 after a warm-up. Rows carry "kind": "train", "tenants", "decode" or
"ttft", for bench_cuda --peer and ratio.py.

MFU (the issue's and bench/cuda/NOTES.md's convention): 4·N·T for forward+backward
(2·N·T forward only), N = the parameters of every matmul (all linear layers and the output
head, tied or not), plus causal attention 2·d·nq·n(n+1) per layer and sequence of n
tokens forward, three times that for forward+backward; against 989 TFLOP/s (H100 dense
bf16).

  python3 bench/cuda/peft_peer.py [--iters N] [--rows all|table|ckpt|tenants|decode]
                                  [--geo NAME[,NAME...]] [--steps N] [--json FILE]
"""
import argparse
import gc
import json
import sys
import time

import torch

PEAK = 989e12

GEOS = {
    "Qwen3-0.6B": dict(arch="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=40960),
    "Llama-3.2-1B": dict(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=131072),
    "Qwen3-8B": dict(arch="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     tie_word_embeddings=False, rope_theta=1000000.0, max_position_embeddings=40960),
}

# (geometry, batch, seq_len, gradient checkpointing)
TABLE = [("Qwen3-0.6B", 16, 512, False), ("Qwen3-0.6B", 1, 8192, False), ("Qwen3-0.6B", 1, 32768, False),
         ("Llama-3.2-1B", 4, 2048, False), ("Qwen3-8B", 8, 512, False), ("Qwen3-8B", 2, 2048, False),
         ("Qwen3-8B", 1, 8192, False)]
CKPT = [("Qwen3-0.6B", 1, 32768, True), ("Qwen3-8B", 2, 2048, True), ("Qwen3-8B", 1, 8192, True),
        ("Qwen3-8B", 1, 32768, True)]
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# decode rows: geometries in this order (the Qwen3-8B first, as bench_cuda --decode)
DECODE_ORDER = ["Qwen3-8B", "Qwen3-0.6B", "Llama-3.2-1B"]
DEC_PROMPTS, DEC_PER_PROMPT, DEC_PROMPT, TTFT_PROMPT, DEC_ADAPTERS = 8, 4, 128, 2048, 8


def matmul_params(g):
    H, I, d = g["hidden_size"], g["intermediate_size"], g["head_dim"]
    qd, kvd = g["num_attention_heads"] * d, g["num_key_value_heads"] * d
    layer = H * qd + 2 * H * kvd + qd * H + 3 * H * I
    return layer * g["num_hidden_layers"] + g["vocab_size"] * H


def flops(g, batch, n, backward):
    T = batch * n
    attn = 2 * g["head_dim"] * g["num_attention_heads"] * n * (n + 1) * g["num_hidden_layers"] * batch
    return (4 if backward else 2) * matmul_params(g) * T + (3 if backward else 1) * attn


def build(name):
    import transformers
    g = dict(GEOS[name])
    arch = g.pop("arch")
    cls = transformers.Qwen3Config if arch == "qwen3" else transformers.LlamaConfig
    cfg = cls(**g)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        except TypeError:  # older transformers
            model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16,
                                                                  attn_implementation="sdpa")
    model = model.to("cuda")  # a no-op unless from_config ignored the device context
    model.config.use_cache = False
    return model


def add_lora(model, names):
    import peft
    cfg = peft.LoraConfig(r=32, lora_alpha=32, lora_dropout=0.0, target_modules=MODULES, bias="none")
    pm = peft.get_peft_model(model, cfg, adapter_name=names[0])
    for n in names[1:]:
        pm.add_adapter(n, cfg)
    pm.set_adapter(names[0])
    return pm


def step(pm, ids, backward):
    V = pm.config.vocab_size
    if backward:
        out = pm(input_ids=ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V).float(), ids[:, 1:].reshape(-1),
                                                 reduction="sum")
        loss.backward()
    else:
        with torch.no_grad():
            out = pm(input_ids=ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V).float(), ids[:, 1:].reshape(-1),
                                                     reduction="sum")
    return loss


def timed(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def run_row(pm, name, batch, n, ckpt, iters):
    g = GEOS[name]
    row = dict(kind="train", geometry=name, batch=batch, seq=n, tokens=batch * n, checkpointing=ckpt)
    if ckpt:
        pm.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        pm.base_model.model.gradient_checkpointing_disable()
    ids = torch.randint(0, g["vocab_size"], (batch, n + 1), device="cuda")
    try:
        pm.eval()
        torch.cuda.reset_peak_memory_stats()
        t = timed(lambda: step(pm, ids, False), iters)
        row["fwd_tok_s"] = batch * n / t
        row["fwd_mfu"] = flops(g, batch, n, False) / t / PEAK
        pm.train()
        torch.cuda.reset_peak_memory_stats()

        def fb():
            pm.zero_grad(set_to_none=True)
            step(pm, ids, True)
        t = timed(fb, iters)
        row["fb_tok_s"] = batch * n / t
        row["fb_mfu"] = flops(g, batch, n, True) / t / PEAK
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except torch.cuda.OutOfMemoryError:
        row["oom"] = True
    pm.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    return row


def run_tenants(pm, iters):
    """8 adapters × 512 tokens, one pass per adapter (PEFT switches between passes), against
    one adapter on the same 8 × 512 tokens in one pass."""
    V = pm.config.vocab_size
    ids = torch.randint(0, V, (8, 513), device="cuda")
    pm.train()
    pm.base_model.model.gradient_checkpointing_disable()

    def one():
        pm.set_adapter("a0")
        pm.zero_grad(set_to_none=True)
        step(pm, ids, True)

    def eight():
        pm.zero_grad(set_to_none=True)
        for i in range(8):
            pm.set_adapter(f"a{i}")
            step(pm, ids[i:i + 1], True)
    t1 = timed(one, iters)
    t8 = timed(eight, iters)
    pm.set_adapter("a0")
    return dict(kind="tenants", geometry="Qwen3-0.6B", tenants=8, tokens=8 * 512, one_tok_s=8 * 512 / t1,
                eight_tok_s=8 * 512 / t8, ratio=t1 / t8)


def generate(pm, ids, new, names):
    """Seconds of one generate call making `new` tokens for every row of ids; names: the
    adapter of each row (PEFT's mixed batch), or None for the active adapter."""
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              use_cache=True, pad_token_id=0, attention_mask=torch.ones_like(ids))
    if names is not None:
        kw["adapter_names"] = names
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = pm.generate(input_ids=ids, **kw)
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    if out.shape[1] != ids.shape[1] + new:  # the step arithmetic needs every row to run every step
        raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} of {new} new tokens")
    return t


def row_adapters(pm, nad, rows):
    """The adapter_names of a batch of `rows` on nad adapters (consecutive rows share one, as
    Loom's requests do), or None after selecting the single adapter (nad 1)."""
    if nad > 1:
        return [f"a{i * nad // rows}" for i in range(rows)]
    pm.set_adapter("a0")
    return None


def decode_row(pm, name, nad, steps):
    """32 samples decoding on nad adapters (0: the base model, adapters disabled)."""
    V = GEOS[name]["vocab_size"]
    S = DEC_PROMPTS * DEC_PER_PROMPT
    row = dict(kind="decode", geometry=name, device=torch.cuda.get_device_name(), requests=DEC_PROMPTS, samples=S,
               adapters=nad, prompt=DEC_PROMPT, steps=steps)
    ids = torch.randint(0, V, (DEC_PROMPTS, DEC_PROMPT), device="cuda").repeat_interleave(DEC_PER_PROMPT, dim=0)
    try:
        names = row_adapters(pm, nad, S)

        def both():
            generate(pm, ids, 2, names)  # warm-up: kernels, cuBLAS handles, the allocator's blocks
            return generate(pm, ids, 1, names), generate(pm, ids, 1 + steps, names)
        if nad == 0:
            with pm.disable_adapter():
                t1, tn = both()
        else:
            t1, tn = both()
        step_s = (tn - t1) / steps
        row.update(first_ms=1e3 * t1, step_ms=1e3 * step_s, tok_s=S / step_s,
                   peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    except torch.cuda.OutOfMemoryError:
        row["oom"] = True
    except Exception as e:  # PEFT without mixed-adapter batches (adapter_names) refuses here
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        if nad > 1:
            print(f"note: {name}: PEFT did not generate a mixed batch of {nad} adapters ({row['error'][:160]}); "
                  f"bench_cuda and ratio.py compare Loom's {nad}-adapter row with the one-adapter row", flush=True)
    gc.collect()
    torch.cuda.empty_cache()
    return row


def ttft_row(pm, name, nreq, iters):
    """Time to first token: nreq prompts of TTFT_PROMPT tokens, one new token, each prompt on
    its own adapter (PEFT's mixed batch; one adapter if that fails)."""
    V = GEOS[name]["vocab_size"]
    row = dict(kind="ttft", geometry=name, device=torch.cuda.get_device_name(), requests=nreq, prompt=TTFT_PROMPT,
               adapters=nreq)
    ids = torch.randint(0, V, (nreq, TTFT_PROMPT), device="cuda")
    try:
        names = row_adapters(pm, nreq, nreq)
        try:
            generate(pm, ids, 1, names)
        except Exception as e:  # noqa: BLE001 (PEFT's refusal of adapter_names has no one type)
            if names is None or isinstance(e, torch.cuda.OutOfMemoryError):
                raise
            print(f"note: {name}: TTFT with {nreq} adapters mixed failed ({str(e)[:120]}); one adapter instead",
                  flush=True)
            names = row_adapters(pm, 1, nreq)
            row["adapters"] = 1
            generate(pm, ids, 1, names)
        t = sorted(generate(pm, ids, 1, names) for _ in range(iters))
        row.update(ttft_ms=1e3 * t[len(t) // 2], calls=iters)
    except torch.cuda.OutOfMemoryError:
        row["oom"] = True
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    gc.collect()
    torch.cuda.empty_cache()
    return row


def run_decode(name, steps, rows, path):
    model = build(name)
    model.config.use_cache = True  # build() turns it off for the training rows; decode needs the KV cache
    pm = add_lora(model, [f"a{i}" for i in range(DEC_ADAPTERS)])
    pm.eval()
    for nad in (DEC_ADAPTERS, 1, 0):
        torch.cuda.reset_peak_memory_stats()
        rows.append(decode_row(pm, name, nad, steps))
        print(fmt(rows[-1]), flush=True)
        dump(rows, path)
    for nreq in (1, DEC_PROMPTS):
        rows.append(ttft_row(pm, name, nreq, 5))
        print(fmt(rows[-1]), flush=True)
        dump(rows, path)
    pm.set_adapter("a0")
    del pm, model
    gc.collect()
    torch.cuda.empty_cache()


def fmt(r):
    kind = r.get("kind")
    if kind in ("decode", "ttft"):
        shape = f"{r['requests']}x{DEC_PER_PROMPT}" if kind == "decode" else f"{r['requests']}x{r['prompt']}"
        head = f"{r['geometry']:<13} {kind:<6} {shape:<7} {r['adapters']:>2} ad |"
        if r.get("oom"):
            return f"{head} out of memory"
        if "error" in r:
            return f"{head} failed: {r['error'][:120]}"
        if kind == "ttft":
            return f"{head} {r['ttft_ms']:8.1f} ms (median of {r['calls']})"
        return (f"{head} step {r['step_ms']:7.2f} ms {r['tok_s']:8,.0f} tok/s | prefill+1st {r['first_ms']:7.1f} ms"
                f" | peak {r['peak_gib']:5.1f} GiB")
    if "tenants" in r:
        return (f"{r['geometry']:<13} 8 tenants x 512: {r['eight_tok_s']:>9,.0f} tok/s vs one adapter "
                f"{r['one_tok_s']:>9,.0f} tok/s = {100 * r['ratio']:.0f}%")
    shape = f"{r['batch']}x{r['seq']}" + (" ckpt" if r["checkpointing"] else "")
    if r.get("oom"):
        return f"{r['geometry']:<13} {shape:<12} out of memory"
    return (f"{r['geometry']:<13} {shape:<12} fwd {r['fwd_tok_s']:>9,.0f} tok/s  fwd+bwd {r['fb_tok_s']:>9,.0f} tok/s"
            f"  MFU {100 * r['fb_mfu']:5.1f}%  peak {r['peak_gib']:5.1f} GiB")


def dump(rows, path):
    """Writes the rows so far: a run stopped at its time limit keeps the rows it finished."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rows", default="all", choices=["all", "table", "ckpt", "tenants", "decode"])
    ap.add_argument("--geo", default=None, help="comma-separated geometries (default: every one)")
    ap.add_argument("--steps", type=int, default=128, help="decode steps timed (--rows decode)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    geos = a.geo.split(",") if a.geo else list(GEOS)
    for g in geos:
        if g not in GEOS:
            ap.error(f"unknown geometry {g} ({', '.join(GEOS)})")
    if a.steps < 1:
        ap.error("--steps must be at least 1")
    import peft
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    rows = []
    todo = (TABLE if a.rows in ("all", "table") else []) + (CKPT if a.rows in ("all", "ckpt") else [])
    want_tenants = a.rows in ("all", "tenants")
    for name in [g for g in DECODE_ORDER if g in geos] if a.rows == "decode" else []:
        run_decode(name, a.steps, rows, a.json)
    for name in [g for g in GEOS if g in geos]:
        mine = [r for r in todo if r[0] == name]
        if not mine and not (want_tenants and name == "Qwen3-0.6B"):
            continue
        model = build(name)
        pm = add_lora(model, [f"a{i}" for i in range(8)] if name == "Qwen3-0.6B" and want_tenants else ["a0"])
        for (_, batch, n, ckpt) in mine:
            r = run_row(pm, name, batch, n, ckpt, a.iters)
            rows.append(r)
            print(fmt(r), flush=True)
            dump(rows, a.json)
        if want_tenants and name == "Qwen3-0.6B":
            r = run_tenants(pm, a.iters)
            rows.append(r)
            print(fmt(r), flush=True)
            dump(rows, a.json)
        del pm, model
        gc.collect()
        torch.cuda.empty_cache()
    print("\nPyTorch + PEFT peer:")
    for r in rows:
        print("  " + fmt(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
