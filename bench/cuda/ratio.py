#!/usr/bin/env python3
"""Loom's CUDA figures (bench_cuda --json model.json) against the PyTorch + PEFT peer's
(peft_peer.py --json peer.json), measured on the same GPU, and the issue's targets:
forward_backward >= 2x the peer on every row; >= 45% MFU on Qwen3-8B at >= 2K tokens;
8 and 32 packed adapters >= 90% of one adapter's throughput; 32K tokens fit on Qwen3-8B.
Prints figures (a benchmark, not a test). Runs anywhere: plain python, no torch.

    python3 bench/cuda/ratio.py model.json peer.json
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    ours = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
    pk = {(r["geometry"], r["batch"], r["seq"]): r for r in peer if "batch" in r and not r.get("checkpointing")}
    print(f"{'geometry':<13} {'shape':<9} {'ad':>2} {'Loom fwd+bwd':>13} {'MFU':>6} {'PEFT fwd+bwd':>13} {'ratio':>7}"
          f" {'Loom fwd':>10} {'PEFT fwd':>10} {'GiB':>6}")
    one = {}
    for r in ours:
        key = (r["geometry"], r["batch"], r["seq"])
        shape = f"{r['batch']}x{r['seq']}"
        if "error" in r:
            print(f"{r['geometry']:<13} {shape:<9} {r['adapters']:>2} failed: {r['error'][:60]}")
            continue
        if r["adapters"] == 1:
            one[key] = r["fb_tok_s"]
        p = pk.get(key) if r["adapters"] == 1 else None
        pfb = "OOM" if p and p.get("oom") else f"{p['fb_tok_s']:,.0f}" if p else "-"
        pfw = "OOM" if p and p.get("oom") else f"{p['fwd_tok_s']:,.0f}" if p else "-"
        ratio = f"{r['fb_tok_s'] / p['fb_tok_s']:.2f}x" if p and not p.get("oom") else "-"
        print(f"{r['geometry']:<13} {shape:<9} {r['adapters']:>2} {r['fb_tok_s']:>13,.0f} {100 * r['fb_mfu']:>5.1f}%"
              f" {pfb:>13} {ratio:>7} {r['fwd_tok_s']:>10,.0f} {pfw:>10} {r['mem_gib']:>6.1f}")
    print("\ntargets:")
    rows = [r for r in ours if "error" not in r]
    worst = min((r["fb_tok_s"] / pk[(r["geometry"], r["batch"], r["seq"])]["fb_tok_s"]
                 for r in rows if r["adapters"] == 1 and (r["geometry"], r["batch"], r["seq"]) in pk
                 and not pk[(r["geometry"], r["batch"], r["seq"])].get("oom")), default=None)
    if worst is not None:
        print(f"  fwd+bwd >= 2x PEFT on every row the peer ran: worst {worst:.2f}x  {'met' if worst >= 2 else 'MISSED'}")
    q8 = [r for r in rows if r["geometry"] == "Qwen3-8B" and r["batch"] * r["seq"] >= 2048 and r["adapters"] == 1]
    if q8:
        m = min(r["fb_mfu"] for r in q8)
        print(f"  Qwen3-8B >= 45% MFU at >= 2K tokens: lowest {100 * m:.1f}%  {'met' if m >= 0.45 else 'MISSED'}")
    for r in rows:
        if r["adapters"] > 1 and (r["geometry"], r["batch"], r["seq"]) in one:
            f = r["fb_tok_s"] / one[(r["geometry"], r["batch"], r["seq"])]
            print(f"  {r['adapters']} adapters packed ({r['batch']}x{r['seq']}): {100 * f:.0f}% of one adapter  "
                  f"{'met' if f >= 0.9 else 'MISSED'}")
    fit = [r for r in ours if r["geometry"] == "Qwen3-8B" and r["seq"] >= 32768]
    if fit:
        ok = "error" not in fit[0]
        print(f"  32K tokens on Qwen3-8B: {'fits (' + format(fit[0]['mem_gib'], '.1f') + ' GiB)' if ok else 'FAILED'}")
    ten = [r for r in peer if "tenants" in r]
    if ten:
        print(f"  (peer: 8 tenants at {100 * ten[0]['ratio']:.0f}% of one adapter)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
