#!/usr/bin/env bash
# run_emu_decode_attn.sh — the KV-cache decode's attention kernel (lcu_attn_decode_fwd,
# backend/cuda/lcu_attention_decode.cu) on a machine WITHOUT a GPU: compiled by the host's g++
# against the CPU emulation of include/emu.h and checked against an fp64 reference
# (decode_attn_emu.cpp). Its index logic (blocks, warps' keys, task chunks, the merge of the
# warps' partials) before a GPU window; nothing about speed, and not a GPU pass. ~20 s.
#
#   bash tests/gpu/emu/run_emu_decode_attn.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
here="$root/tests/gpu/emu"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
# The launches `lcu_attn_decode_k<D><<<grid, block, 0, s>>>(args)` become calls of emu_launch
# through a struct of the arguments (emu_launch passes one).
python3 - "$root" "$w" <<'PY'
import re, sys
root, w = sys.argv[1], sys.argv[2]
s = open(f"{root}/backend/cuda/lcu_attention_decode.cu").read()
s, n = re.subn(r"lcu_attn_decode_k<(\d+)><<<grid, block, 0, s>>>\(p, Q, K, V, O, lse\)",
               r"emu_dec_launch<\1>(grid, block, p, Q, K, V, O, lse)", s)
if n == 0 or "<<<" in s: sys.exit("run_emu_decode_attn.sh: a launch the rewrite does not know")
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
F=(-O1 -g -ffp-contract=off -Wno-unknown-pragmas -I"$here/include" -I"$root" -pthread)
for f in "$w/decode.cpp" "$here/emu.cpp" "$here/decode_attn_emu.cpp"; do
    g++ -std=c++17 "${F[@]}" -c "$f" -o "$w/$(basename "$f").o"
done
g++ "${F[@]}" "$w"/*.o -o "$w/decode_attn_emu" -lm
"$w/decode_attn_emu"
