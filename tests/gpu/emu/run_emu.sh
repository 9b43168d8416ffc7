#!/usr/bin/env bash
# run_emu.sh — tests/gpu/test_gpu_lora.c on a machine WITHOUT a GPU: the three LoRA paths of
# the kernel layer (lcu_lora.cu, lcu_sgmv.cu, lcu_sgmv3.cu) compiled by the host's g++
# against a CPU emulation of the CUDA constructs they use (include/emu.h), cuBLASLt's GEMM
# replaced by a CPU one (lcu_host.cpp), the test and its harness (gt.c) unchanged. It checks
# the kernels' index logic (tiles, vector loads, split-K, waves, bounds) before a GPU window;
# it says nothing about speed, and a pass here is not a GPU pass. Slow: one OS thread per
# CUDA thread. Written for LoRA version 3 (2026-11-27): the full test took ~40 min on 2
# busy cores, GT_SMALL=1 (the default here) ~8 min.
#
#   bash tests/gpu/emu/run_emu.sh [GT_SMALL=0]        (GT_SEED=... as for the gpu tests)
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
here="$root/tests/gpu/emu"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
# The launches `kernel<...><<<grid, block, 0, X->s>>>(X->t)` become calls of emu_launch.
python3 - "$root" "$w" <<'PY'
import re, sys
root, w = sys.argv[1], sys.argv[2]
for src in ("lcu_sgmv3.cu", "lcu_sgmv.cu", "lcu_lora.cu"):
    s = open(f"{root}/backend/cuda/{src}").read()
    s = re.sub(r"(\b\w+<[^;<>]*>)<<<([^,]+), ([^,]+), 0, (\w+->s)>>>\((\w+->t)\)",
               r"emu_launch(\1, dim3(\2), dim3(\3), \5)", s)
    if "<<<" in s: sys.exit(f"run_emu.sh: a launch of {src} the rewrite does not know")
    open(f"{w}/{src}.cpp", "w").write(s)
PY
F=(-O1 -g -ffp-contract=off -Wno-unknown-pragmas -I"$here/include" -I"$root" -pthread)
for f in "$w"/*.cpp "$here/emu.cpp" "$here/lcu_host.cpp"; do g++ -std=c++17 "${F[@]}" -c "$f" -o "$w/$(basename "$f").o"; done
for f in tests/gpu/gt.c tests/gpu/test_gpu_lora.c; do gcc -std=gnu11 "${F[@]}" -c "$root/$f" -o "$w/$(basename "$f").o"; done
g++ "${F[@]}" "$w"/*.o -o "$w/test_gpu_lora_emu" -lm
small=1
[ "${1:-}" = GT_SMALL=0 ] && small=0
if [ $small = 1 ]; then GT_SMALL=1 "$w/test_gpu_lora_emu"; else env -u GT_SMALL "$w/test_gpu_lora_emu"; fi
