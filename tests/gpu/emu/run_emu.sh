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
#
# With `decode-attn`, the KV-cache decode's attention kernel instead (lcu_attn_decode_fwd,
# backend/cuda/lcu_attention_decode.cu) against an fp64 reference on small shapes
# (decode_attn_emu.cpp): its blocks, warps' keys, task chunks and the merge of the warps'
# partials. ~20 s.
#
#   bash tests/gpu/emu/run_emu.sh decode-attn
#
# With `elementwise`, the memory-bound kernels of lcu_elementwise.cu (elementwise_emu.cpp):
# conversions and SwiGLU in their 4-wide and scalar forms, RoPE, RMSNorm. ~10 s.
#
#   bash tests/gpu/emu/run_emu.sh elementwise
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
here="$root/tests/gpu/emu"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
F=(-O1 -g -ffp-contract=off -Wno-unknown-pragmas -I"$here/include" -I"$root" -pthread)
if [ "${1:-}" = elementwise ]; then
    # every launch `k<<<g, b, 0, s>>>(args)` becomes emu_launchv(k, g, b, args)
    python3 - "$root" "$w" <<'PY'
import re, sys
root, w = sys.argv[1], sys.argv[2]
s = open(f"{root}/backend/cuda/lcu_elementwise.cu").read()
s, n = re.subn(r"(\w+(?:<[^<>;]*>)?)<<<([^<>]+?), ([^,<>]+), 0, s>>>\(", r"emu_launchv(\1, dim3(\2), dim3(\3), ", s)
if n == 0 or "<<<" in s: sys.exit("run_emu.sh: a launch of lcu_elementwise.cu the rewrite does not know")
open(f"{w}/elementwise.cpp", "w").write(s)
PY
    for f in "$w/elementwise.cpp" "$here/emu.cpp" "$here/elementwise_emu.cpp"; do
        g++ -std=c++17 "${F[@]}" -c "$f" -o "$w/$(basename "$f").o"
    done
    g++ "${F[@]}" "$w"/*.o -o "$w/elementwise_emu" -lm
    exec "$w/elementwise_emu"
fi
if [ "${1:-}" = decode-attn ]; then
    # The launches `lcu_attn_decode_k<D><<<grid, block, 0, s>>>(args)` become calls of
    # emu_launch through a struct of the arguments (emu_launch passes one).
    python3 - "$root" "$w" <<'PY'
import re, sys
root, w = sys.argv[1], sys.argv[2]
s = open(f"{root}/backend/cuda/lcu_attention_decode.cu").read()
s, n = re.subn(r"lcu_attn_decode_k<(\d+)><<<grid, block, 0, s>>>\(p, Q, K, V, O, lse\)",
               r"emu_dec_launch<\1>(grid, block, p, Q, K, V, O, lse)", s)
if n == 0 or "<<<" in s: sys.exit("run_emu.sh: a launch of lcu_attention_decode.cu the rewrite does not know")
glue = """template <int D> struct dec_args { lcu_attn_p p; const bf16 *q, *k, *v; bf16 *o; float *lse; };
template <int D> static void dec_entry(dec_args<D> a) { lcu_attn_decode_k<D>(a.p, a.q, a.k, a.v, a.o, a.lse); }
template <int D> static void emu_dec_launch(dim3 g, dim3 b, lcu_attn_p p, const bf16 *q, const bf16 *k,
                                            const bf16 *v, bf16 *o, float *lse)
{
    dec_args<D> a{p, q, k, v, o, lse};
    emu_launch(dec_entry<D>, g, b, a);
}

int lcu_attn_decode_fwd("""
s = s.replace("int lcu_attn_decode_fwd(", glue, 1)
open(f"{w}/decode.cpp", "w").write("#define __expf expf\n" + s)
PY
    for f in "$w/decode.cpp" "$here/emu.cpp" "$here/decode_attn_emu.cpp"; do
        g++ -std=c++17 "${F[@]}" -c "$f" -o "$w/$(basename "$f").o"
    done
    g++ "${F[@]}" "$w"/*.o -o "$w/decode_attn_emu" -lm
    exec "$w/decode_attn_emu"
fi
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
for f in "$w"/*.cpp "$here/emu.cpp" "$here/lcu_host.cpp"; do g++ -std=c++17 "${F[@]}" -c "$f" -o "$w/$(basename "$f").o"; done
for f in tests/gpu/gt.c tests/gpu/test_gpu_lora.c; do gcc -std=gnu11 "${F[@]}" -c "$root/$f" -o "$w/$(basename "$f").o"; done
g++ "${F[@]}" "$w"/*.o -o "$w/test_gpu_lora_emu" -lm
small=1
[ "${1:-}" = GT_SMALL=0 ] && small=0
if [ $small = 1 ]; then GT_SMALL=1 "$w/test_gpu_lora_emu"; else env -u GT_SMALL "$w/test_gpu_lora_emu"; fi
