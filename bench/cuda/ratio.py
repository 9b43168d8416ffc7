#!/usr/bin/env python3
"""Loom's CUDA figures (bench_cuda --json model.json) against the PyTorch + PEFT peer's
(peft_peer.py --json peer.json), measured on the same GPU, and the issue's targets:
forward_backward >= 2x the peer on every row; >= 45% MFU on Qwen3-8B at >= 2K tokens;
8 and 32 packed adapters >= 90% of one adapter's throughput; 32K tokens fit on Qwen3-8B.
With decode rows (bench_cuda --decode, peft_peer.py --rows decode; told apart by their
"kind": "decode" / "ttft", training rows have "train" or none) also decode tok/s and time
to first token against the peer, and the decode targets: Qwen3-8B, 32 samples over 8
adapters, a step at >= 70% of its HBM-bandwidth bound and >= 4,000 tok/s on an H100; time
to first token of a 2048-token prompt <= 60 ms.
Prints figures (a benchmark, not a test). Runs anywhere: plain python, no torch.

    python3 bench/cuda/ratio.py model.json peer.json
    python3 bench/cuda/ratio.py model.json,decode.json peer.json,peer-decode.json

Each argument is one JSON file or several, comma-separated (their rows together).
"""
import json
import sys

H100_TOK_S = 4000      # the decode target's tok/s, on an H100
H100_BW = 3.35e12      # an H100 SXM's HBM bandwidth, B/s (bench_cuda.c's hbm_bandwidth)
BOUND_FRAC = 0.70      # of the HBM-bandwidth bound per step
TTFT_MS = 60           # time to first token of a 2048-token prompt


def load(arg):
    rows = []
    for path in arg.split(","):
        with open(path) as f:
            rows += json.load(f)
    return rows


def is_train(r):
    return r.get("kind", "train") == "train"


def peer_dec(peer, r):
    """The peer's row for Loom's decode/ttft row r: same kind, geometry, samples (decode) or
    requests (ttft), prompt and adapters; a row of several adapters falls back to the peer's
    one adapter (a PEFT that cannot mix adapters in one batch). None when it has neither."""
    n = "samples" if r["kind"] == "decode" else "requests"
    same = [p for p in peer if p.get("kind") == r["kind"] and p.get("geometry") == r["geometry"]
            and p.get(n) == r[n] and p.get("prompt") == r["prompt"] and "error" not in p]
    for want in (r["adapters"], 1) if r["adapters"] > 1 else (r["adapters"],):
        for p in same:
            if p.get("adapters") == want:
                return p
    return None


def decode_table(ours, peer):
    rows = [r for r in ours if r.get("kind") in ("decode", "ttft")]
    if not rows:
        return
    print("\ndecode (32 samples: tok/s, step, share of the HBM-bandwidth bound) and time to first token:")
    print(f"{'geometry':<13} {'row':<13} {'ad':>2} {'Loom':>12} {'step ms':>8} {'bound':>6} {'PEFT':>12} {'ratio':>7}")
    for r in rows:
        shape = f"{r['kind']} " + (f"{r['requests']}x{r['samples'] // r['requests']}" if r["kind"] == "decode"
                                   else f"{r['requests']}x{r['prompt']}")
        head = f"{r['geometry']:<13} {shape:<13} {r['adapters']:>2}"
        if "error" in r:
            print(f"{head} failed: {r['error'][:60]}")
            continue
        p = peer_dec(peer, r)
        note = f" (peer: {p['adapters']} adapter)" if p and p["adapters"] != r["adapters"] else ""
        if r["kind"] == "decode":
            frac = f"{100 * r['bound_frac']:.1f}%" if "bound_frac" in r else "?"
            pf = "OOM" if p and p.get("oom") else f"{p['tok_s']:,.0f} tok/s" if p else "-"
            ratio = f"{r['tok_s'] / p['tok_s']:.2f}x" if p and not p.get("oom") else "-"
            loom = f"{r['tok_s']:,.0f} tok/s"
            print(f"{head} {loom:>12} {r['step_ms']:>8.2f} {frac:>6} {pf:>12} {ratio:>7}{note}")
        else:
            pf = "OOM" if p and p.get("oom") else f"{p['ttft_ms']:,.1f} ms" if p else "-"
            ratio = f"{p['ttft_ms'] / r['ttft_ms']:.2f}x" if p and not p.get("oom") else "-"
            loom = f"{r['ttft_ms']:,.1f} ms"
            print(f"{head} {loom:>12} {'':>8} {'':>6} {pf:>12} {ratio:>7}{note}")


def decode_targets(ours, peer):
    dec = [r for r in ours if r.get("kind") == "decode" and r["geometry"] == "Qwen3-8B" and r["samples"] == 32
           and r["adapters"] == 8]
    ttft = [r for r in ours if r.get("kind") == "ttft" and r["geometry"] == "Qwen3-8B" and r["requests"] == 1
            and r["prompt"] == 2048]
    if not dec and not ttft:
        return
    print("\ndecode targets (Qwen3-8B):")
    if dec:
        r = dec[0]
        if "error" in r:
            print(f"  32 samples over 8 adapters: FAILED ({r['error'][:80]})")
        else:
            dev = r.get("device", "?")
            if "bound_frac" in r:
                f = r["bound_frac"]
                print(f"  32 samples over 8 adapters at >= {100 * BOUND_FRAC:.0f}% of the HBM-bandwidth bound: "
                      f"{100 * f:.1f}% (step {r['step_ms']:.2f} ms, bound {r['bound_ms']:.2f} ms = "
                      f"{r['bound_bytes'] / 1e9:.2f} GB at {r['bandwidth'] / 1e12:.2f} TB/s)  "
                      f"{'MET' if f >= BOUND_FRAC else 'MISSED'}")
            else:
                print(f"  32 samples over 8 adapters at >= {100 * BOUND_FRAC:.0f}% of the HBM-bandwidth bound: "
                      f"not judged ({dev}: bandwidth unknown; the step reads {r['bound_bytes'] / 1e9:.2f} GB)")
            if "H100" in dev and r.get("bandwidth") == H100_BW:
                print(f"  32 samples over 8 adapters >= {H100_TOK_S:,} tok/s on an H100: {r['tok_s']:,.0f} tok/s  "
                      f"{'MET' if r['tok_s'] >= H100_TOK_S else 'MISSED'}")
            else:
                scaled = f"; {H100_TOK_S:,} at this card's bandwidth is {H100_TOK_S * r['bandwidth'] / H100_BW:,.0f}" \
                    if r.get("bandwidth") else ""
                print(f"  32 samples over 8 adapters >= {H100_TOK_S:,} tok/s on an H100: {r['tok_s']:,.0f} tok/s "
                      f"on {dev}, not an H100 SXM: not judged{scaled}")
            p = peer_dec(peer, r)
            if p and not p.get("oom"):
                print(f"  (vs the peer on the same GPU: {r['tok_s'] / p['tok_s']:.2f}x, peer {p['tok_s']:,.0f} tok/s"
                      f" with {p['adapters']} adapter{'s' if p['adapters'] > 1 else ''})")
    if ttft:
        r = ttft[0]
        if "error" in r:
            print(f"  time to first token, 2048-token prompt: FAILED ({r['error'][:80]})")
        else:
            print(f"  time to first token, 2048-token prompt <= {TTFT_MS} ms: {r['ttft_ms']:.1f} ms on "
                  f"{r.get('device', '?')}  {'MET' if r['ttft_ms'] <= TTFT_MS else 'MISSED'}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    allours = load(sys.argv[1])
    peer = load(sys.argv[2])
    ours = [r for r in allours if is_train(r)]
    if ours:
        train(ours, [r for r in peer if is_train(r) or "tenants" in r])
    decode_table(allours, peer)
    decode_targets(allours, peer)
    return 0


def train(ours, peer):
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


if __name__ == "__main__":
    sys.exit(main())
