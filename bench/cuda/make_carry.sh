#!/usr/bin/env bash
# make_carry.sh — run HERE (the machine with nvcc, no GPU): builds the gpu test and bench
# binaries and copies them, with any shared library they need that the GPU machine may
# lack, into .gpu-carry/ (git-ignored, kept under the device tool's 64 MiB), for
# bench/cuda/run_on_gpu.sh to run there. Never copies the CUDA libraries (they are there)
# or the C runtime.
#
#   bash bench/cuda/make_carry.sh [build-dir]        (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
C=.gpu-carry
command -v nvcc >/dev/null || { echo "make_carry: nvcc not found" >&2; exit 1; }
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
TARGETS=$(cd tests/gpu && ls test_gpu_*.c | sed 's/\.c$//')
# shellcheck disable=SC2086
cmake --build "$B" -j2 --target $TARGETS bench_cuda_kernels bench_cuda_layer
rm -rf "$C"
mkdir -p "$C/bin" "$C/lib"
for t in $TARGETS bench_cuda_kernels bench_cuda_layer; do cp "$B/$t" "$C/bin/"; done
# Libraries: everything ldd resolves except the C/C++ runtime (newer on the GPU machine's
# Ubuntu 24.04) and the CUDA libraries (installed there under /usr/local/cuda).
SKIP='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libgcc_s|libstdc\+\+|libcublas|libcublasLt|libcudart|libcudnn|libnccl|libcuda\.)'
for f in "$C"/bin/*; do
    ldd "$f" | awk '/=>/ {print $1, $3}' | while read -r name path; do
        if ! [[ $name =~ $SKIP ]] && [ -f "$path" ] && [ ! -f "$C/lib/$name" ]; then cp -L "$path" "$C/lib/$name"; fi
    done
done
git rev-parse HEAD > "$C/commit" 2>/dev/null || true
du -sh "$C"
size=$(du -sb "$C" | cut -f1)
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then echo "make_carry: $C is over 60 MiB" >&2; exit 1; fi
echo "carry ready: device runs with carry [\"$C\"]: 'bash bench/cuda/run_on_gpu.sh tests sanitize', then 'bench layer', then 'peer' (bench/cuda/NOTES.md)"
