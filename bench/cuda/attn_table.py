#!/usr/bin/env python3
"""attn_table.py — Loom's attention kernels next to PyTorch's, per geometry and shape.

    python3 bench/cuda/attn_table.py bench.csv sdpa.json

bench.csv comes from `run_on_gpu.sh bench` (bench_cuda_kernels: the own versions wmma and
mma, and cudnn: cuDNN's fused attention called by the kernel layer, lcu_cudnn_attn_*, where
libcudnn loads), sdpa.json from `run_on_gpu.sh sdpa` (PyTorch's flash, cudnn, efficient).
Prints milliseconds for forward and backward, and which is fastest: the measurement that
chooses between Loom's own attention and cuDNN's (the CUDA issue asks for the choice by
measurement). "loom cudnn" and "torch cudnn" are the same library at the same shapes, one
called through Loom's packed layout (ragged offsets) and deterministic backward, the other
through PyTorch's dense batch.
"""
import csv
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    t = {}  # (geometry, shape, pass) -> {impl: ms}
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            k = r["kernel"].split()
            if k[0] == "attention":
                t.setdefault((r["geometry"], r["shape"], k[1]), {})["loom " + k[2]] = float(r["ms"])
    with open(sys.argv[2]) as f:
        for r in json.load(f):
            k = r["kernel"].split(maxsplit=2)
            t.setdefault((r["geometry"], r["shape"], k[1]), {})["torch " + k[2]] = r["ms"]
    impls = sorted({i for v in t.values() for i in v}, key=lambda s: (not s.startswith("loom"), s))
    print(f"{'geometry':<13} {'shape':<9} {'pass':<4} " + " ".join(f"{i:>19}" for i in impls) + "  fastest")
    for (g, shape, p), v in sorted(t.items(), key=lambda kv: (kv[0][0], int(kv[0][1].split('x')[0]) *
                                                             int(kv[0][1].split('x')[1]), kv[0][1], kv[0][2] != "fwd")):
        cells = " ".join(f"{v[i]:>16.3f} ms" if i in v else f"{'-':>19}" for i in impls)
        best = min(v, key=v.get)
        print(f"{g:<13} {shape:<9} {p:<4} {cells}  {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
