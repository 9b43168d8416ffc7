#!/usr/bin/env bash
# make_carry.sh — run HERE (the machine with nvcc, no GPU): builds the gpu tests, the
# backend suites and the benches, and packs them with every shared library they need that
# the GPU machine may lack into .gpu-carry/carry.tar.gz (git-ignored, under the device
# tool's 64 MiB), for bench/cuda/run_on_gpu.sh to unpack and run there. Never packs the
# CUDA libraries (they are there) or the C runtime (glibc and libstdc++ are newer there).
#
# In the archive: real/<binary> (debug sections stripped: symbols stay for backtraces),
# lib/<library>, cuda_libs.sh (bench/cuda/cuda_libs.sh: where cuBLAS 13 is on that machine)
# and bin/<binary>, a wrapper that runs real/<binary> with lib/ and the cuBLAS directory
# (LOOM_CUBLAS_DIR, else found by cuda_libs.sh: the toolkit, the system, or PyTorch's
# wheels) on LD_LIBRARY_PATH, so that nothing else (python, torch) ever sees the carried
# libraries.
#
#   bash bench/cuda/make_carry.sh [build-dir]        (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
C=.gpu-carry
command -v nvcc >/dev/null || { echo "make_carry: nvcc not found" >&2; exit 1; }
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
GPU_TESTS=$(cd tests/gpu && ls test_gpu_*.c | sed 's/\.c$//')
SUITES="test_cpu_ref test_learning test_longseq test_exe_sample"
BENCHES="bench_cuda_kernels bench_cuda_layer bench_cuda"
# shellcheck disable=SC2086
cmake --build "$B" -j2 --target $GPU_TESTS $SUITES $BENCHES loom_backend_cuda_module
rm -f "$C/carry.tar.gz" "$C/commit" # not e2e.tar.gz (make_e2e_carry.sh): each travels alone
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin" "$S/real" "$S/lib" "$C"
for t in $GPU_TESTS $SUITES $BENCHES; do
    objcopy --strip-debug "$B/$t" "$S/real/$t"
    cat > "$S/bin/$t" <<EOF
#!/usr/bin/env bash
# runs the carried $t with the carried libraries (bench/cuda/make_carry.sh)
here=\$(cd "\$(dirname "\$0")/.." && pwd)
if [ -z "\${LOOM_CUBLAS_DIR:-}" ]; then
    source "\$here/cuda_libs.sh"
    LOOM_CUBLAS_DIR=\$(loom_cublas_dir) || echo "$t: cuBLAS 13 (libcublasLt.so.13) not found; set LOOM_CUBLAS_DIR" >&2
fi
export LD_LIBRARY_PATH="\$here/lib\${LOOM_CUBLAS_DIR:+:\$LOOM_CUBLAS_DIR}:/usr/local/nvidia/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "\$here/real/$t" "\$@"
EOF
    chmod +x "$S/bin/$t"
done
# The CUDA backend module, found next to the binaries (backend/backends.c).
cp "$B/libloom_backend_cuda.so" "$S/real/"
cp bench/cuda/cuda_libs.sh "$S/"
# Libraries: everything ldd resolves except glibc's own libraries, the C++ runtime and the
# CUDA libraries.
source bench/cuda/cuda_libs.sh
loom_copy_libs "$S/lib" "$S"/real/*
git rev-parse HEAD > "$S/commit" 2>/dev/null || true
git status --short | grep -v '^??' > "$S/dirty" || true
tar -C "$S" -czf "$C/carry.tar.gz" .
cp "$S/commit" "$C/commit"
echo "packed: $(ls "$S/real" | wc -l) binaries, $(ls "$S/lib" | wc -l) libraries ($(du -sh "$S" | cut -f1) unpacked)"
du -sh "$C/carry.tar.gz"
size=$(du -sb "$C/carry.tar.gz" | cut -f1)
if [ "$size" -gt $((56 * 1024 * 1024)) ]; then echo "make_carry: $C/carry.tar.gz is over 56 MiB" >&2; exit 1; fi
echo "carry ready: device calls with carry [\"$C/carry.tar.gz\"], in the order of bench/cuda/NOTES.md"
