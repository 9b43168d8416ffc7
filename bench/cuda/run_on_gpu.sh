#!/usr/bin/env bash
# run_on_gpu.sh — run ON THE GPU MACHINE (the device tool), from the repository root, with
# .gpu-carry/ carried (built here by bench/cuda/make_carry.sh). Unpacks the carry, runs the
# steps asked for, writes logs under $OUT and prints a short summary last.
#
#   bash bench/cuda/run_on_gpu.sh STEP...
#
#   kernels      the kernel tests (test_gpu_* but the backend test)          kernels.log
#   sanitize     compute-sanitizer memcheck/racecheck/synccheck on them       sanitize.log
#   backend      test_gpu_backend: the cuda backend against the cpu backend   backend.log
#   backend-sync the same with LOOM_CUDA_SYNC=1 (a fault names its step)      backend-sync.log
#   backend-sgmv the same with LCU_LORA=sgmv (LoRA version 2, lcu_sgmv.cu)     backend-sgmv.log
#   suites       test_cpu_ref, test_learning, test_longseq, test_exe_sample
#                with LOOM_TEST_BACKEND=cuda                                   suites.log
#   ref          tests/ref/run_ref.py on the cuda backend, bf16 bars           ref.log
#   model        bench_cuda: the model-level benchmark (quickmodel: ≤ 2K tokens) model.log model.json
#   model-sgmv   the same with LCU_LORA=sgmv                      model-sgmv.log model-sgmv.json
#   bench        the kernel bench (quickbench: fewer shapes)                  bench.log bench.csv
#   layer        bench_cuda_layer, attention version 1 then 2                 layer.log
#   peer         bench/cuda/peft_peer.py, all rows (peer-table: the table)     peer.log peer.json
#   sdpa         bench/cuda/sdpa_peer.py: PyTorch's flash/cuDNN/efficient     sdpa.log sdpa.json
#                attention at the kernel bench's shapes (quicksdpa: ≤ 2K)
#
# e.g. the device tool: run(command="bash bench/cuda/run_on_gpu.sh kernels backend",
#                           carry=[".gpu-carry"])
# Each step has its own time limit so that a call stays inside 10 minutes: see NOTES.md
# for the calls in order. Tests print their seed (GT_SEED=...); GT_VERBOSE=1 prints passes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/loom-gpu-out}
mkdir -p "$OUT"
C=.gpu-carry
W=$(mktemp -d /tmp/loom-carry.XXXXXX)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}   # the interpreter with torch (PYTHON=... elsewhere)
SUMMARY=()
[ $# -eq 0 ] && set -- kernels backend
if [ ! -f "$C/carry.tar.gz" ]; then
    echo "no $C/carry.tar.gz: build it with bench/cuda/make_carry.sh and carry it" | tee "$OUT/env.txt"
    exit 1
fi
tar -C "$W" -xzf "$C/carry.tar.gz"

{
    echo "carry built from: $(cat "$W/commit" 2>/dev/null || echo '?')   checkout: $(git rev-parse HEAD 2>/dev/null || echo '?')"
    [ -s "$W/dirty" ] && { echo "carry built with uncommitted changes:"; cat "$W/dirty"; }
    nvidia-smi 2>&1 | head -20
    nvcc --version 2>&1 | tail -2
    ls -l /usr/local/cuda/lib64/libcublas.so* 2>&1 | head -3
    ldconfig -p 2>/dev/null | grep -E "libcuda\.so|libcublas|libopenblas" | head -6
    for b in "$W"/real/*; do
        miss=$(LD_LIBRARY_PATH="$W/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64" ldd "$b" | grep "not found")
        [ -n "$miss" ] && echo "== $(basename "$b") misses: $miss"
    done
    "$PY" -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1
} > "$OUT/env.txt" 2>&1

# Runs one binary of the carry with a time limit; appends to a log; records a summary line.
# usage: run_one LOG LIMIT_S LABEL COMMAND...
run_one() {
    local log=$1 limit=$2 label=$3
    shift 3
    local tmp
    tmp=$(mktemp)
    timeout "$limit" "$@" > "$tmp" 2>&1
    local rc=$?
    { echo "===== $label (exit $rc)"; cat "$tmp"; } >> "$OUT/$log"
    local s
    case $rc in
        0) s="PASS" ;;
        77) s="SKIPPED (no device seen: a failure on the GPU machine)" ;;
        124) s="TIMEOUT after ${limit}s" ;;
        *) s="FAIL (exit $rc)" ;;
    esac
    local line
    line=$(grep -E "passed, [0-9]+ failed" "$tmp" | tail -1)
    rm -f "$tmp"
    SUMMARY+=("$(printf '%-26s %s  %s' "$label" "$s" "${line#*: }")")
}

run_kernels() {
    : > "$OUT/kernels.log"
    for t in "$W"/bin/test_gpu_*; do
        n=$(basename "$t")
        [ "$n" = test_gpu_backend ] && continue
        run_one kernels.log 300 "$n" "$t"
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
        GT_SMALL=1 LD_LIBRARY_PATH="$W/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64" timeout 200 \
            compute-sanitizer --tool "$1" --error-exitcode 9 "$W/real/$2" >> "$OUT/sanitize.log" 2>&1
        rc=$?
        SUMMARY+=("$(printf 'sanitize %-9s %-20s %s' "$1" "$2" "$([ $rc = 0 ] && echo clean || echo "exit $rc")")")
    done
}

run_suites() {
    : > "$OUT/suites.log"
    for t in test_cpu_ref test_learning test_longseq test_exe_sample; do
        LOOM_TEST_BACKEND=cuda run_one suites.log 240 "$t (cuda)" "$W/bin/$t"
    done
}

run_ref() {
    : > "$OUT/ref.log"
    LOOM_TEST_BACKEND=cuda run_one ref.log 400 "run_ref.py (cuda, bf16 bars)" "$PY" tests/ref/run_ref.py \
        --dump-bin "$W/bin/test_cpu_ref" --work "$W/ref-work" --tolerance bf16
}

run_model() {  # usage: run_model NAME [ARGS]  (writes NAME.log, NAME.json)
    local n=$1
    shift
    timeout 540 "$W/bin/bench_cuda" "$@" --json "$OUT/$n.json" > "$OUT/$n.log" 2>&1
    SUMMARY+=("bench_cuda $* ($n): exit $? ($(grep -c ' ad |' "$OUT/$n.log") rows; see $n.log)")
}

run_bench() {
    timeout 420 "$W/bin/bench_cuda_kernels" $1 --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1
    SUMMARY+=("bench_cuda_kernels $1: exit $? ($(grep -c ' ms ' "$OUT/bench.log") rows; see bench.log)")
}

run_layer() {  # with attention version 1 (default), then version 2
    timeout 240 "$W/bin/bench_cuda_layer" > "$OUT/layer.log" 2>&1
    SUMMARY+=("bench_cuda_layer: exit $?")
    echo "==== LCU_ATTN=mma" >> "$OUT/layer.log"
    LCU_ATTN=mma timeout 240 "$W/bin/bench_cuda_layer" >> "$OUT/layer.log" 2>&1
    SUMMARY+=("bench_cuda_layer LCU_ATTN=mma: exit $?")
}

run_peer() {
    timeout 540 "$PY" bench/cuda/peft_peer.py --rows "$1" --json "$OUT/peer.json" > "$OUT/peer.log" 2>&1
    SUMMARY+=("peft_peer --rows $1: exit $?")
}

run_sdpa() {
    timeout 400 "$PY" bench/cuda/sdpa_peer.py $1 --json "$OUT/sdpa.json" > "$OUT/sdpa.log" 2>&1
    SUMMARY+=("sdpa_peer $1: exit $? ($(grep -c ' ms ' "$OUT/sdpa.log") rows; see sdpa.log)")
}

for step in "$@"; do
    case $step in
        kernels|tests) run_kernels ;;
        sanitize) run_sanitize ;;
        backend) : > "$OUT/backend.log"; run_one backend.log 500 test_gpu_backend "$W/bin/test_gpu_backend" ;;
        backend-sync) : > "$OUT/backend-sync.log"
                      LOOM_CUDA_SYNC=1 run_one backend-sync.log 500 "test_gpu_backend (sync)" "$W/bin/test_gpu_backend" ;;
        backend-sgmv) : > "$OUT/backend-sgmv.log"
                      LCU_LORA=sgmv run_one backend-sgmv.log 500 "test_gpu_backend (sgmv)" "$W/bin/test_gpu_backend" ;;
        suites) run_suites ;;
        ref) run_ref ;;
        model) run_model model ;;
        quickmodel) run_model model --quick ;;
        model-sgmv) LCU_LORA=sgmv run_model model-sgmv ;;
        bench) run_bench "" ;;
        quickbench) run_bench --quick ;;
        layer) run_layer ;;
        peer) run_peer all ;;
        peer-table) run_peer table ;;
        sdpa) run_sdpa "" ;;
        quicksdpa) run_sdpa --quick ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done

echo
grep -h "misses:" "$OUT/env.txt" 2>/dev/null
for f in kernels.log sanitize.log backend.log backend-sync.log backend-sgmv.log suites.log ref.log; do
    [ -f "$OUT/$f" ] && grep -hE "^(FAIL|FATAL)|  FAIL " "$OUT/$f" | head -25
done
[ -f "$OUT/bench.log" ] && grep -E "ceiling|measured|attention|head fwd|lora" "$OUT/bench.log" | head -40
[ -f "$OUT/layer.log" ] && grep -E "tok/s|====" "$OUT/layer.log"
for f in model.log model-sgmv.log; do
    [ -f "$OUT/$f" ] && { echo "== $f"; grep -E " ad \||==|failed" "$OUT/$f"; }
done
[ -f "$OUT/sdpa.log" ] && grep -E "^attention" "$OUT/sdpa.log" | head -40
[ -f "$OUT/peer.log" ] && sed -n '/PyTorch + PEFT peer:/,$p' "$OUT/peer.log"
echo "---- summary"
printf '%s\n' "${SUMMARY[@]}"
rm -rf "$W"
