#!/usr/bin/env python3
"""sdpa_peer.py — the attention peers, timed on the same GPU as Loom's own kernels.

The CUDA issue lets the attention be Loom's own kernel or cuDNN's fused attention, "chosen
by measurement". This script gives the other side of that measurement: PyTorch's scaled
dot-product attention with each fused backend it has (FlashAttention-2, cuDNN, the
memory-efficient kernel), bf16, causal, at the geometries and shapes that
bench_cuda_kernels times Loom's kernels at (one sequence of T tokens, and T/512 sequences
of 512), printed in the same line format and with the same FLOP convention (forward
4·d·nq·Σ n(n+1)/2, backward counted as 2.5× the forward), so that `grep attention` over
both logs lines the rows up. bench_cuda_kernels also times cuDNN through Loom's own call
(rows "attention fwd/bwd cudnn": packed ragged layout, deterministic backward), so the
"cudnn" rows here are the same library called by PyTorch (dense batch; its backward's
determinism is PyTorch's choice).

GQA: the heads of K/V are expanded to the query heads once, outside the timing, where a
backend does not take `enable_gqa` (the FLOPs are the same; the kernel reads more K/V).
Packed variable-length batches are not timed here (PyTorch's SDPA takes a dense batch):
the 512-token rows are equal-length sequences, which is what bench_cuda_kernels times too.

    python3 bench/cuda/sdpa_peer.py [--quick] [--geo NAME] [--tokens T,T,...] [--single] [--json FILE]

--geo: one geometry; --tokens: these token counts (default 512, 2K, 8K, 32K; --quick: 512,
2K); --single: one sequence of T tokens only (not also T/512 sequences of 512).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PEAK_TFLOPS = 989.0
PEAK_TBS = 3.35
GEOS = [  # name, nq, nkv, d (the same as bench_cuda_kernels.c)
    ("Qwen3-0.6B", 16, 8, 128),
    ("Llama-3.2-1B", 32, 8, 64),
    ("Qwen3-8B", 32, 8, 128),
]
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def time_ms(fn, iters=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def report(rows, kernel, g, shape, ms, flops, nbytes):
    tf, tb = flops / (ms * 1e-3) / 1e12, nbytes / (ms * 1e-3) / 1e12
    floor_ms = max(flops / (PEAK_TFLOPS * 1e12), nbytes / (PEAK_TBS * 1e12)) * 1e3
    print(f"{kernel:<22} {g:<13} {shape:<22} {ms:10.3f} ms {tf:8.1f} TFLOP/s {tb:6.2f} TB/s  floor {floor_ms:9.3f} ms"
          f"  x{ms / floor_ms:.1f}", flush=True)
    rows.append(dict(kernel=kernel, geometry=g, shape=shape, ms=ms, tflops=tf, floor_ms=floor_ms))


def attention(rows, name, nq, nkv, d, T, seqlen):
    nseq = T // seqlen
    dev = "cuda"
    q = torch.randn(nseq, nq, seqlen, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(nseq, nkv, seqlen, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(nseq, nkv, seqlen, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(nseq, nq, seqlen, d, device=dev, dtype=torch.bfloat16)
    pairs = nseq * seqlen * (seqlen + 1) / 2.0
    fwd_flops = 4.0 * pairs * d * nq
    qd, kvd = nq * d, nkv * d
    fwd_bytes = (T * qd * 2.0) * 2 + T * kvd * 2.0 * 2 + T * nq * 4.0
    bwd_bytes = T * qd * 2.0 * 3 + T * kvd * 2.0 * 2 + T * nq * 8.0 + T * qd * 4.0 + T * kvd * 8.0
    shape = f"{nseq}x{seqlen}"
    for label, backend in BACKENDS:
        for gqa in (True, False):  # enable_gqa where the backend takes it, else K/V expanded once
            try:
                with sdpa_kernel([backend]):
                    if gqa:
                        kk, vv, kw = k, v, dict(enable_gqa=True)
                    else:
                        kk = k.repeat_interleave(nq // nkv, dim=1).detach().requires_grad_(True)
                        vv = v.repeat_interleave(nq // nkv, dim=1).detach().requires_grad_(True)
                        kw = {}
                    fwd = time_ms(lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kw))
                    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kw)
                    bwd = time_ms(lambda: torch.autograd.grad(out, (q, kk, vv), dout, retain_graph=True))
                tag = label if gqa else label + " (kv x)"
                report(rows, f"attention fwd {tag}", name, shape, fwd, fwd_flops, fwd_bytes)
                report(rows, f"attention bwd {tag}", name, shape, bwd, 2.5 * fwd_flops, bwd_bytes)
                del out
                break
            except torch.cuda.OutOfMemoryError:  # before RuntimeError: it is one
                print(f"attention {label:<13} {name:<13} {shape:<22} out of memory", flush=True)
                break
            except (RuntimeError, TypeError) as e:  # this backend refuses the shape/GQA form
                if not gqa:
                    print(f"attention {label:<13} {name:<13} {shape:<22} not available: {str(e).splitlines()[0][:90]}",
                          flush=True)
            finally:
                torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="512 and 2K tokens only")
    ap.add_argument("--geo", default=None, choices=[g[0] for g in GEOS])
    ap.add_argument("--tokens", default=None, help="comma-separated token counts")
    ap.add_argument("--single", action="store_true", help="one sequence of T tokens only")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}",
          flush=True)
    rows = []
    toks = [512, 2048] if a.quick else [512, 2048, 8192, 32768]
    if a.tokens:
        toks = [int(t) for t in a.tokens.split(",")]
    for name, nq, nkv, d in GEOS:
        if a.geo and name != a.geo:
            continue
        print(f"== {name}: heads {nq}/{nkv} x {d}", flush=True)
        for T in toks:
            attention(rows, name, nq, nkv, d, T, T)
            if T > 512 and not a.single:
                attention(rows, name, nq, nkv, d, T, 512)
            if a.json:  # as it goes: a run stopped at its time limit keeps the rows it finished
                with open(a.json, "w") as f:
                    json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
