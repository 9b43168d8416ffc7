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
# Each step has its own time limit, and all steps of one call share a budget of
# LOOM_GPU_BUDGET seconds (default 560: the device tool stops a call at 600 s, and a call
# stopped there prints no summary; set it lower when the session has less device time
# left than that, or when the call's timeout_s is lower): a step gets its own limit or what is left of the budget,
# whichever is less, and a step the budget has no room for is reported as not run. See
# NOTES.md for the calls in order. Tests print their seed (GT_SEED=...); GT_VERBOSE=1
# prints passes.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${LOOM_GPU_BUDGET:-560}
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

# Seconds a step may run: its own limit ($1) or what is left of the call's budget.
step_limit() {
    local left=$((BUDGET - SECONDS))
    echo $((left < $1 ? left : $1))
}

# Runs COMMAND under the step's time limit (step_limit), its output into FILE, or appended
# to FILE under a header when APPEND is 1 (then also kept in $W/last.out); sets TIMED_RC
# (124/137: stopped at the limit; 125: not run, the budget is spent) and TIMED_LIMIT.
# usage: timed FILE APPEND LIMIT_S LABEL COMMAND...
timed() {
    local file=$1 append=$2 label=$4
    TIMED_LIMIT=$(step_limit "$3")
    shift 4
    : > "$W/last.out"
    if [ "$TIMED_LIMIT" -lt 15 ]; then
        TIMED_RC=125
        echo "===== $label: not run (the call's ${BUDGET}s budget is spent)" >> "$file"
    elif [ "$append" = 1 ]; then
        timeout -k 10 "$TIMED_LIMIT" "$@" > "$W/last.out" 2>&1
        TIMED_RC=$?
        { echo "===== $label (exit $TIMED_RC)"; cat "$W/last.out"; } >> "$file"
    else
        timeout -k 10 "$TIMED_LIMIT" "$@" > "$file" 2>&1
        TIMED_RC=$?
    fi
}

# How a step ended, for the summary.
status_word() {
    case $1 in
        0) echo "PASS" ;;
        77) echo "SKIPPED (no device seen: a failure on the GPU machine)" ;;
        124|137) echo "TIMEOUT after ${TIMED_LIMIT}s" ;;
        125) echo "NOT RUN (no time left in this call: run it in another call)" ;;
        *) echo "FAIL (exit $1)" ;;
    esac
}

# Runs one binary of the carry with a time limit; appends to a log; records a summary line.
# usage: run_one LOG LIMIT_S LABEL COMMAND...
run_one() {
    local log=$1 limit=$2 label=$3
    shift 3
    local t0=$SECONDS line
    timed "$OUT/$log" 1 "$limit" "$label" "$@"
    line=$(grep -E "passed, [0-9]+ failed" "$W/last.out" | tail -1)
    SUMMARY+=("$(printf '%-26s %s %4ds  %s' "$label" "$(status_word $TIMED_RC)" $((SECONDS - t0)) "${line#*: }")")
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
    # the toolkit's bin/ need not be on PATH there
    local san
    san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
          /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
    [ -n "$san" ] || { SUMMARY+=("sanitize: compute-sanitizer not found"); return; }
    # memcheck everywhere; racecheck/synccheck on the kernels with shared memory and barriers.
    # racecheck on the attention (the slowest job by far) goes last, so that a call whose
    # budget it outlasts still has every other result.
    for job in "memcheck test_gpu_attention" "memcheck test_gpu_head" "memcheck test_gpu_sample" \
               "memcheck test_gpu_ops" "memcheck test_gpu_lora" "memcheck test_gpu_moe" "racecheck test_gpu_head" \
               "racecheck test_gpu_sample" "synccheck test_gpu_attention" "racecheck test_gpu_attention"; do
        set -- $job
        GT_SMALL=1 LD_LIBRARY_PATH="$W/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64" \
            timed "$OUT/sanitize.log" 1 200 "$1 $2 (GT_SMALL=1)" \
            "$san" --tool "$1" --error-exitcode 9 "$W/real/$2"
        case $TIMED_RC in
            0) r=clean ;;
            9) r="ERRORS (exit 9)" ;;
            *) r=$(status_word $TIMED_RC) ;;
        esac
        SUMMARY+=("$(printf 'sanitize %-9s %-20s %s' "$1" "$2" "$r")")
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

# The benchmarks write their rows as they go (model.json, bench.csv too), so a step stopped
# at its limit still leaves the rows it finished.
run_model() {  # usage: run_model NAME [ARGS]  (writes NAME.log, NAME.json)
    local n=$1
    shift
    timed "$OUT/$n.log" 0 540 bench_cuda "$W/bin/bench_cuda" "$@" --json "$OUT/$n.json"
    SUMMARY+=("bench_cuda $* ($n): $(status_word $TIMED_RC) ($(grep -c ' ad |' "$OUT/$n.log") rows; see $n.log)")
}

run_bench() {
    timed "$OUT/bench.log" 0 420 bench_cuda_kernels "$W/bin/bench_cuda_kernels" $1 --csv "$OUT/bench.csv"
    SUMMARY+=("bench_cuda_kernels${1:+ $1}: $(status_word $TIMED_RC) ($(grep -c ' ms ' "$OUT/bench.log") rows; see bench.log)")
}

run_layer() {  # with attention version 1 (default), then version 2
    : > "$OUT/layer.log"
    timed "$OUT/layer.log" 1 240 "bench_cuda_layer" "$W/bin/bench_cuda_layer"
    SUMMARY+=("bench_cuda_layer: $(status_word $TIMED_RC)")
    LCU_ATTN=mma timed "$OUT/layer.log" 1 240 "LCU_ATTN=mma bench_cuda_layer" "$W/bin/bench_cuda_layer"
    SUMMARY+=("bench_cuda_layer LCU_ATTN=mma: $(status_word $TIMED_RC)")
}

run_peer() {
    timed "$OUT/peer.log" 0 540 peft_peer "$PY" bench/cuda/peft_peer.py --rows "$1" --json "$OUT/peer.json"
    SUMMARY+=("peft_peer --rows $1: $(status_word $TIMED_RC)")
}

run_sdpa() {
    timed "$OUT/sdpa.log" 0 400 sdpa_peer "$PY" bench/cuda/sdpa_peer.py $1 --json "$OUT/sdpa.json"
    SUMMARY+=("sdpa_peer${1:+ $1}: $(status_word $TIMED_RC) ($(grep -c ' ms ' "$OUT/sdpa.log") rows; see sdpa.log)")
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
