#!/usr/bin/env bash
# run_on_gpu.sh — run ON THE GPU MACHINE (the device tool), from the repository root, with
# .gpu-carry/ carried (built here by bench/cuda/make_carry.sh). Writes its logs under $OUT
# (at most 8 files: env.txt tests.log sanitize.log bench.log bench.csv layer.log peer.log
# peer.json)
# and prints a short summary last.
#
#   bash bench/cuda/run_on_gpu.sh [tests] [sanitize] [bench|quickbench] [layer] [peer] [peer-table]
# e.g. the device tool: run(command="bash bench/cuda/run_on_gpu.sh tests bench",
#                           carry=[".gpu-carry"])
# Each step has its own time limit so that the whole stays inside one 10-minute call:
# tests ~3 min, sanitize ~3 min, bench ~4 min (quickbench ~1), layer ~4 min, peer ~5 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/loom-gpu-out}
mkdir -p "$OUT"
C=.gpu-carry
# the CUDA libraries and, where the driver is mounted outside the loader's path, libcuda
export LD_LIBRARY_PATH="$PWD/$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
SUMMARY=()
[ $# -eq 0 ] && set -- tests bench

{
    echo "carry built from: $(cat $C/commit 2>/dev/null || echo '?')   checkout: $(git rev-parse HEAD 2>/dev/null || echo '?')"
    nvidia-smi 2>&1 | head -20
    nvcc --version 2>&1 | tail -2
    ls -l /usr/local/cuda/lib64/libcublas.so* 2>&1 | head -3
    ldconfig -p 2>/dev/null | grep -E "libcuda\.so|libcublas" | head -5
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for b in "$C"/bin/*; do echo "== ldd $b"; ldd "$b" | grep -E "not found|cublas" ; done
} > "$OUT/env.txt" 2>&1
if [ ! -d "$C/bin" ]; then echo "no $C/bin: build it with bench/cuda/make_carry.sh and carry it" | tee -a "$OUT/env.txt"; exit 1; fi

run_tests() {
    : > "$OUT/tests.log"
    for t in "$C"/bin/test_gpu_*; do
        n=$(basename "$t")
        log=$(mktemp)
        timeout 300 "$t" > "$log" 2>&1
        rc=$?
        { echo "===== $n (exit $rc)"; cat "$log"; } >> "$OUT/tests.log"
        case $rc in
            0) s="PASS" ;;
            77) s="SKIPPED (no device seen: a failure on the GPU machine)" ;;
            124) s="TIMEOUT" ;;
            *) s="FAIL (exit $rc)" ;;
        esac
        line=$(grep -E "passed, [0-9]+ failed" "$log" | tail -1)
        rm -f "$log"
        SUMMARY+=("$(printf '%-22s %s  %s' "$n" "$s" "${line#*: }")")
    done
}

run_sanitize() {
    : > "$OUT/sanitize.log"
    command -v compute-sanitizer >/dev/null || { SUMMARY+=("sanitize: compute-sanitizer not found"); return; }
    # memcheck everywhere; racecheck/synccheck on the kernels with shared memory and barriers
    for job in "memcheck test_gpu_attention" "memcheck test_gpu_head" "memcheck test_gpu_sample" \
               "memcheck test_gpu_ops" "memcheck test_gpu_lora" "racecheck test_gpu_attention" \
               "racecheck test_gpu_head" "racecheck test_gpu_sample" "synccheck test_gpu_attention"; do
        set -- $job
        echo "===== $1 $2 (GT_SMALL=1)" >> "$OUT/sanitize.log"
        GT_SMALL=1 timeout 200 compute-sanitizer --tool "$1" --error-exitcode 9 "$C/bin/$2" >> "$OUT/sanitize.log" 2>&1
        rc=$?
        SUMMARY+=("$(printf 'sanitize %-9s %-20s %s' "$1" "$2" "$([ $rc = 0 ] && echo clean || echo "exit $rc")")")
    done
}

run_bench() {
    timeout 420 "$C/bin/bench_cuda_kernels" $1 --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1
    SUMMARY+=("bench_cuda_kernels $1: exit $? ($(grep -c ' ms ' "$OUT/bench.log") rows; see bench.log)")
}

run_layer() {  # with attention version 1 (default), then version 2
    timeout 240 "$C/bin/bench_cuda_layer" > "$OUT/layer.log" 2>&1
    SUMMARY+=("bench_cuda_layer: exit $?")
    echo "==== LCU_ATTN=mma" >> "$OUT/layer.log"
    LCU_ATTN=mma timeout 240 "$C/bin/bench_cuda_layer" >> "$OUT/layer.log" 2>&1
    SUMMARY+=("bench_cuda_layer LCU_ATTN=mma: exit $?")
}

run_peer() {
    timeout 540 python3 bench/cuda/peft_peer.py --rows "$1" --json "$OUT/peer.json" > "$OUT/peer.log" 2>&1
    SUMMARY+=("peft_peer --rows $1: exit $?")
}

for step in "$@"; do
    case $step in
        tests) run_tests ;;
        sanitize) run_sanitize ;;
        bench) run_bench "" ;;
        quickbench) run_bench --quick ;;
        layer) run_layer ;;
        peer) run_peer all ;;
        peer-table) run_peer table ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done

echo
for f in tests.log sanitize.log; do
    [ -f "$OUT/$f" ] && grep -E "^(FAIL|FATAL)" "$OUT/$f" | head -25
done
[ -f "$OUT/bench.log" ] && grep -E "ceiling|measured|attention|head fwd|lora" "$OUT/bench.log" | head -40
[ -f "$OUT/layer.log" ] && grep -E "tok/s|====" "$OUT/layer.log"
[ -f "$OUT/peer.log" ] && sed -n '/PyTorch + PEFT peer:/,$p' "$OUT/peer.log"
echo "---- summary"
printf '%s\n' "${SUMMARY[@]}"
