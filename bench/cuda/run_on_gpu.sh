#!/usr/bin/env bash
# run_on_gpu.sh — the CUDA backend's tests and benchmarks on a machine with an NVIDIA GPU
# (an H100), from the repository root. bench/cuda/NOTES.md says what to run and what each
# log shows.
#
#   bash bench/cuda/run_on_gpu.sh a         the first command of a short GPU window (~6 min)
#   bash bench/cuda/run_on_gpu.sh b         the second (~5 min)
#   bash bench/cuda/run_on_gpu.sh c         the third: the switches on trial, where the time goes (~4 min)
#   bash bench/cuda/run_on_gpu.sh STEP...   single steps (below), in the order given
#
# a: environment (driver, where cuBLAS 13 is) -> the dense kernel tests, each capped ->
#    memcheck of the first that FATALs -> the error-policy test -> cuDNN's attention test
#    -> the mixture-of-experts tests -> the backend test, every part (rerun with
#    LOOM_CUDA_SYNC=1 when it FATALs) -> the CPU suites on the cuda backend -> the fp64
#    torch reference at bf16 bars -> bench_cuda Qwen3-8B (--iters 1: 2x2048 is the MFU row,
#    1x32768 the memory row), Qwen3-0.6B (1/8/32 adapters) and Llama-3.2-1B, on the
#    defaults (cuDNN attention, kept activations, LCU_LORA=auto, decode graphs, fused
#    decode layers)
# b: PyTorch + PEFT on the same GPU (the comparison rows; bench/cuda/ratio.py) -> the
#    backend test with LCU_LORA=sgmv (its packed cases have too few adapters for auto to
#    take version 2) -> the backend test and the suites on the own attention kernels
#    (LCU_ATTN=wmma) -> the kernel bench at Qwen3-8B (LoRA gemm vs sgmv at 1/8/32 adapters)
#    -> decode and time to first token (bench_cuda --decode), the same with the decode
#    profile (a step split into its parts), then the same rows through HF generate + PEFT
#    -> the suites with the old defaults (no kept activations, no decode graphs, LCU_LORA=gemm,
#    no fused decode layers). (The own attention's model rows and
#    PyTorch's SDPA were measured on the first window: steps model-own, sdpa8b; the old
#    defaults' model and decode rows on the second: model-recompute, model-gemm,
#    decode-eager.)
# c: Qwen3-8B's rows as on an 80 GB
#    card (LCU_DEVICE_MB: the kept activations of the layers that fit), then where the time
#    goes: the training passes
#    split into operations (LCU_TRAIN_PROFILE=1), the decode passes split into the layer's
#    operations (LCU_DECODE_PROFILE=2), the decode step's kernels one by one against their
#    floors, and again with few-row GEMMs filling half a wave (LCU_GEMM_WAVES); Qwen3-8B's
#    decode rows with the LoRA's shrinks beside the base GEMM (LCU_DECODE_SIDE=1); then the backend test with LoRA version 3 on every call (LCU_LORA=sgmv3)
# The whole service (loom up with the cuda executor, PostgreSQL carried) is a third
# command of its own: bench/cuda/e2e_on_gpu.sh.
#
# Steps:
#   kernels      every kernel test (test_gpu_* but the backend test)      kernels.log
#   dense        the dense kernel tests                                   kernels.log
#   check        test_gpu_check (the backend's error policy)              kernels.log
#   moe          test_gpu_moe and the backend test's qwen3_moe case       moe.log
#   backend      test_gpu_backend, every part                             backend.log
#   backend-dense  the dense models and the prompt extras                 backend.log
#   backend-sync   the same with LOOM_CUDA_SYNC=1 (a fault names its step) backend-sync.log
#   backend-sgmv   LCU_LORA=sgmv (LoRA version 2)                         backend-sgmv.log
#   backend-mma    LCU_ATTN=mma (attention version 2)                     backend-mma.log
#   backend-cublas LCU_GEMM=cublas (every GEMM through the fallback)      backend-cublas.log
#   backend-own  LCU_ATTN=wmma (the own attention, version 1; cuDNN off)  backend-own.log
#   suites-own   the suites with LCU_ATTN=wmma                            suites.log
#   sanitize     compute-sanitizer memcheck/racecheck/synccheck            sanitize.log
#   suites       test_cpu_ref, test_learning, test_longseq, test_exe_sample
#                with LOOM_TEST_BACKEND=cuda                              suites.log
#   ref          tests/ref/run_ref.py on the cuda backend, bf16 bars      ref.log
#   model8b      bench_cuda --geo Qwen3-8B --iters 1                      model-8b.log/.json
#   model06      bench_cuda --geo Qwen3-0.6B --iters 1                    model-06b.log/.json
#   model-v2     model06 and model8b with LCU_ATTN=mma LCU_LORA=sgmv       model-v2-*.log/.json
#   model-own    model06 and model8b with LCU_ATTN=wmma (no cuDNN)         model-own-*.log/.json
#   model-recompute  model06 and model8b with LCU_KEEP_ACT=0 (the backward recomputes) model-recompute-*.log/.json
#   model-sgmv   model06 with LCU_LORA=sgmv (its 8/32-adapter rows)         model-sgmv-06b.log/.json
#   model-gemm   model06 with LCU_LORA=gemm (version 1 at any adapter count) model-gemm-06b.log/.json
#   quickmodel   bench_cuda --quick (≤ 2K tokens + the PEFT comparison rows) model.log/.json
#   model        bench_cuda, every row (several minutes)                  model.log/.json
#   bench8b      bench_cuda_kernels --geo Qwen3-8B                        bench-8b.log/.csv
#   bench / quickbench  bench_cuda_kernels, all geometries / ≤ 2K tokens  bench.log/.csv
#   layer        bench_cuda_layer, attention version 1 then 2             layer.log
#   sdpa8b       PyTorch's flash/cuDNN/efficient SDPA, Qwen3-8B, 2K/8K/32K sdpa-8b.log/.json
#   sdpa / quicksdpa   sdpa_peer.py, all shapes / ≤ 2K                    sdpa.log/.json
#   peer / peer-table  peft_peer.py: PyTorch + PEFT, all rows / the table peer.log/.json
#   decode       bench_cuda --decode --steps 64, Qwen3-8B and Qwen3-0.6B: decode tok/s against
#                the HBM bound, time to first token                       decode.log/.json
#   peer-decode  peft_peer.py --rows decode: HF generate + PEFT, same rows peer-decode.log/.json
#   decode-eager decode with LCU_DECODE_GRAPH=0 (no CUDA graphs)          decode-eager.log/.json
#   decode-prof  decode with LCU_DECODE_PROFILE=1: each sampling call's step split into the
#                layer stack, the head, the picks and the host's rest      decode-prof.log/.json
#   decode-ops   decode with LCU_DECODE_PROFILE=2: also the layer stack split into its
#                operations (eager passes, an event after each; the rows' own figures are
#                slower for it)                                            decode-ops.log/.json
#   train-ops    bench_cuda Qwen3-8B and Qwen3-0.6B with LCU_TRAIN_PROFILE=1: each row's
#                forward+backward split into its operations              train-ops.log/.json
#   kernels-decode  bench_cuda_kernels --decode: the decode step's kernels at 32 rows,
#                each against its floor                                    bench-decode.log/.csv
#   model8b-80g  model8b with LCU_DEVICE_MB=81559 (an H100's 79.6 GiB): what fits there
#                                                                          model-8b-80g.log/.json
#   model1b      bench_cuda --geo Llama-3.2-1B --iters 1 (its PEFT row: 4x2048) model-1b.log/.json
#   decode-fuse  decode with LCU_DECODE_FUSE=1 (a layer's q/k norms, RoPE, v rounding and
#                cache stores in one kernel; the attention's tile counts once a pass), then
#                LCU_DECODE_FUSE=2 (also one GEMM for q|k|v, one for gate|up) decode-fuse{,2}.log/.json
#   backend-sgmv3  test_gpu_backend with LCU_LORA=sgmv3 (LoRA version 3)    backend-sgmv3.log
#   suites-sgmv3 the suites with LCU_LORA=sgmv3                             suites.log
#   model-sgmv3  model06 with LCU_LORA=sgmv3 (its 8/32-adapter rows)        model-sgmv3-06b.log/.json
#   decode-sgmv3 decode with LCU_LORA=sgmv3 (8 adapters: 4 rows each, its small kernels) decode-sgmv3.log/.json
#   backend-fuse test_gpu_backend's llama part with LCU_DECODE_FUSE=1 (every sampling check
#                on level 1)                                             backend-fuse.log
#   decode-attn  decode with LCU_DECODE_ATTN=1 (the KV-cache attention's own kernel,
#                lcu_attention_decode.cu)                                decode-attn.log/.json
#   model-lorafirst  model8b, model06 and Qwen3-8B's decode rows (time to first token) with
#                LCU_LORA_FIRST=1 (the LoRA written first, the GEMM adding into it)
#                                                            model-lorafirst-*.log/.json
#   backend-lorafirst  test_gpu_backend with LCU_LORA_FIRST=1 (every check against the CPU
#                on that path)                                           backend-lorafirst.log
#   gemm-waves   test_gpu_gemm with LCU_GEMM_WAVES=1, then bench_cuda_kernels --decode with
#                LCU_GEMM_WAVES=2 (few-row GEMMs take the first cuBLASLt candidate that
#                fills half a wave; each plan's candidates printed)   kernels.log, bench-decode-waves.log/.csv
#   decode-side  Qwen3-8B's decode rows with LCU_DECODE_SIDE=1 (a layer's LoRA shrinks on a
#                second stream beside the base GEMM; test_gpu_backend checks it bitwise)
#                                                                          decode-side.log/.json
#   suites-old   the suites with the old defaults (LCU_KEEP_ACT=0 LCU_DECODE_GRAPH=0 LCU_DECODE_ATTN=0 LCU_LORA_FIRST=0
#                LCU_LORA=gemm LCU_DECODE_FUSE=0)                          suites.log
#
# Binaries: from the build directory LOOM_GPU_BUILD when that is set (cmake --build on the
# GPU machine itself), else from .gpu-carry/carry.tar.gz when it is there (built by
# bench/cuda/make_carry.sh on a machine without a GPU, for a GPU machine that has no build
# tools or Loom's libraries), else from build/.
#
# Environment: LOOM_GPU_BUDGET, the seconds the whole command may take (default 330 for a,
# 280 for b, 560 otherwise; keep it ~30 s under any outer time limit): each step runs for
# its own cap or what is left, and a step with no time left is reported NOT RUN, so the
# command always ends with its summary. OUT: where logs go (default /tmp/loom-gpu-out);
# the summary is also written there line by line (summary.txt). GT_SEED: the kernel tests'
# seed (default 20261126: a rerun repeats the inputs). PYTHON: the interpreter with torch.
# LOOM_CUBLAS_DIR: where libcublas.so.13 is, when the search (cuda_libs.sh) cannot find it.
# LOOM_GPU_DRY=1: a dry run of the control flow on a machine without a GPU (every binary
# exits 77 and the run goes on; LOOM_GPU_DRY_FATAL="test_gpu_head test_gpu_backend" makes
# those steps count as having FATALed, to show the memcheck and rerun branches).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
source bench/cuda/cuda_libs.sh
MODE=${1:-a}
ARGS="$*"
case $MODE in a) DEFAULT_BUDGET=330 ;; b) DEFAULT_BUDGET=280 ;; c) DEFAULT_BUDGET=240 ;; *) DEFAULT_BUDGET=560 ;; esac
BUDGET=${LOOM_GPU_BUDGET:-$DEFAULT_BUDGET}
OUT=${OUT:-/tmp/loom-gpu-out}
DRY=${LOOM_GPU_DRY:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GT_SEED=${GT_SEED:-20261126}
PY=${PYTHON:-python3}
# cuDNN for the training attention (the default where it loads): the system's, else PyTorch's wheel
export LOOM_CUDNN_LIBRARY=${LOOM_CUDNN_LIBRARY:-$(PYTHON=$PY loom_cudnn_library)}
SUM=()
RESERVE=15 # seconds kept for the summary

# ---- the binaries: the carry, or a build directory --------------------------------------
W=""
if [ -z "${LOOM_GPU_BUILD:-}" ] && [ -f .gpu-carry/carry.tar.gz ]; then
    W=$(mktemp -d /tmp/loom-carry.XXXXXX)
    trap 'rm -rf "$W"' EXIT
    tar -C "$W" -xzf .gpu-carry/carry.tar.gz
    BIN=$W/bin REAL=$W/real CARRY_LIB=$W/lib
    SOURCE="carry built from $(cat "$W/commit" 2>/dev/null || echo '?')"
    [ -s "$W/dirty" ] && SOURCE="$SOURCE (with uncommitted changes: $(tr '\n' ' ' < "$W/dirty"))"
else
    BIN=${LOOM_GPU_BUILD:-build} REAL=${LOOM_GPU_BUILD:-build} CARRY_LIB=""
    if [ ! -x "$BIN/test_gpu_attention" ]; then
        echo "no .gpu-carry/carry.tar.gz (bench/cuda/make_carry.sh) and no $BIN/test_gpu_attention (cmake --build $BIN)" |
            tee "$OUT/env.txt"
        exit 1
    fi
    BIN=$(cd "$BIN" && pwd) REAL=$BIN
    SOURCE="build directory $BIN"
fi

# ---- environment: driver, cuBLAS 13, libraries ------------------------------------------
DRIVER=""
LOOM_CUBLAS_DIR=$(loom_cublas_dir) || LOOM_CUBLAS_DIR=""
export LOOM_CUBLAS_DIR
# for binaries run directly (build directory, compute-sanitizer on the carry's real/)
export LD_LIBRARY_PATH="${CARRY_LIB:+$CARRY_LIB:}${LOOM_CUBLAS_DIR:+$LOOM_CUBLAS_DIR:}/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
    echo "run_on_gpu.sh $*: budget ${BUDGET}s, $SOURCE, checkout $(git rev-parse HEAD 2>/dev/null || echo '?')"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv 2>&1 | head -3
        DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
        major=${DRIVER%%.*}
        if [[ $major =~ ^[0-9]+$ ]] && [ "$major" -lt 580 ]; then
            echo "DRIVER $DRIVER is older than R580: the CUDA 13 runtime linked into the binaries needs R580 or newer," \
                 "so they will see no device"
        fi
    else
        echo "no nvidia-smi on PATH: no NVIDIA driver here?"
    fi
    if [ -n "$LOOM_CUBLAS_DIR" ]; then
        echo "cuBLAS 13: $LOOM_CUBLAS_DIR"
    else
        echo "cuBLAS 13 NOT FOUND (libcublasLt.so.13: not in /usr/local/cuda, the library path or the Python" \
             "packages): set LOOM_CUBLAS_DIR"
    fi
    for b in "$REAL"/test_gpu_* "$REAL"/bench_cuda* "$REAL"/libloom_backend_cuda.so; do
        [ -f "$b" ] || continue
        miss=$(ldd "$b" 2>&1 | grep "not found" | awk '{print $1}' | sort -u | tr '\n' ' ')
        [ -n "$miss" ] && echo "$(basename "$b") misses: $miss"
    done
    echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# ---- running steps ----------------------------------------------------------------------

left() { echo $((BUDGET - SECONDS)); }

summary_line() {
    SUM+=("$1")
    echo "$1" >> "$OUT/summary.txt"
}

# step LOG CAP LABEL COMMAND...: runs COMMAND for min(CAP, time left − RESERVE) seconds,
# its output appended to $OUT/LOG under a header; sets RC (125: not run, no time left) and
# records a summary line (status, seconds, the test's "N passed, N failed").
step() {
    local log=$1 cap=$2 label=$3 t0=$SECONDS lim n0 word counts
    shift 3
    lim=$(($(left) - RESERVE))
    [ "$lim" -gt "$cap" ] && lim=$cap
    if [ "$lim" -lt 10 ]; then
        RC=125
        summary_line "$(printf '%-50s NOT RUN (no time left in this command)' "$label")"
        return
    fi
    touch "$OUT/$log"
    n0=$(wc -l < "$OUT/$log")
    echo "===== $label (limit ${lim}s)" >> "$OUT/$log"
    timeout -k 5 "$lim" "$@" >> "$OUT/$log" 2>&1
    RC=$?
    local w
    for w in ${DRY:+${LOOM_GPU_DRY_FATAL:-}}; do
        if [ "$label" = "$w" ] || [[ $label == "$w "* ]]; then
            echo "FATAL (dry run: LOOM_GPU_DRY_FATAL)" >> "$OUT/$log"
            RC=1
        fi
    done
    case $RC in
        0) word=PASS ;;
        77) word="NO DEVICE (exit 77)" ;;
        124 | 137) word="TIMEOUT after ${lim}s" ;;
        *) word="FAIL (exit $RC)" ;;
    esac
    counts=$(tail -n +"$((n0 + 1))" "$OUT/$log" | grep -E "passed, [0-9]+ failed" | tail -1 | sed 's/.*: //')
    summary_line "$(printf '%-50s %-20s %4ds  %s' "$label" "$word" $((SECONDS - t0)) "$counts")"
}

# Whether the last step's output (in LOG, after its header) holds a FATAL line: a device
# fault or a refused launch (tests/gpu/gt.c) or a failed backend call (test_gpu_backend).
fataled() { sed -n "/^===== $2 /,\$p" "$OUT/$1" | grep -q "^FATAL"; }

# The first binary that sees no CUDA device ends the command: nothing else can run, and
# the GPU time is saved. (Not in a dry run.)
stop_if_no_device() {
    [ "$RC" = 77 ] && [ -z "$DRY" ] || return 0
    echo
    echo "STOPPED: $1 sees no CUDA device:"
    grep -h "no CUDA device\|no cuda device" "$OUT/$2" | tail -1
    if [ -n "$DRIVER" ]; then
        echo "The binaries link the CUDA 13 runtime statically; it needs an NVIDIA driver of R580 or newer" \
             "(this machine: $DRIVER). Nothing else can run here."
    else
        echo "No NVIDIA driver answered (nvidia-smi). Nothing else can run here."
    fi
    print_summary
    exit 3
}

sanitizer() { command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1; }

# memcheck of one kernel test on its small shapes (after it FATALed: the fault's kernel
# and address)
memcheck() {
    local san
    san=$(sanitizer)
    if [ -z "$san" ]; then
        summary_line "memcheck $1: compute-sanitizer not found"
        return
    fi
    GT_SMALL=1 step sanitize.log 90 "memcheck $1 (GT_SMALL)" "$san" --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$REAL/$1"
}

DENSE_TESTS="attention lora head gemm ops sample adamw"
BACKEND_DENSE=llama,qwen3,qwen2,llama_rope3_mqa,extras

run_dense() { # the dense kernel tests, each capped; memcheck of the first that FATALs
    local t fatal=""
    for t in $DENSE_TESTS; do
        step kernels.log 75 "test_gpu_$t" "$BIN/test_gpu_$t"
        stop_if_no_device "test_gpu_$t" kernels.log
        if [ -z "$fatal" ] && fataled kernels.log "test_gpu_$t"; then fatal=test_gpu_$t; fi
    done
    [ -n "$fatal" ] && memcheck "$fatal"
}

run_check() {
    step kernels.log 45 test_gpu_check "$BIN/test_gpu_check"
    stop_if_no_device test_gpu_check kernels.log
}

# run_backend LOG LABEL CASES [ENV=VALUE...]: the backend test on some parts (all when
# CASES is empty), cap 110 s
run_backend() {
    local log=$1 label=$2 cases=$3
    shift 3
    step "$log" 110 "$label" env GPU_BACKEND_CASES="$cases" "$@" "$BIN/test_gpu_backend"
}

run_moe() {
    step moe.log 60 test_gpu_moe "$BIN/test_gpu_moe"
    stop_if_no_device test_gpu_moe moe.log
    fataled moe.log test_gpu_moe && memcheck test_gpu_moe
    GPU_BACKEND_CASES=qwen3_moe step moe.log 90 "test_gpu_backend qwen3_moe" "$BIN/test_gpu_backend"
    if fataled moe.log "test_gpu_backend qwen3_moe"; then
        GPU_BACKEND_CASES=qwen3_moe LOOM_CUDA_SYNC=1 step moe.log 90 "test_gpu_backend qwen3_moe LOOM_CUDA_SYNC=1" \
            "$BIN/test_gpu_backend"
    fi
}

# run_model NAME CAP [bench_cuda options]: the model-level benchmark (its rows are written as
# they finish: a step stopped at its cap keeps them)
run_model() {
    local n=$1 cap=$2
    shift 2
    step "$n.log" "$cap" "bench_cuda $* ${MODEL_TAG:-}" "$BIN/bench_cuda" "$@" --json "$OUT/$n.json"
}

run_sanitize() {
    local san job
    san=$(sanitizer)
    if [ -z "$san" ]; then
        summary_line "sanitize: compute-sanitizer not found"
        return
    fi
    # memcheck everywhere; racecheck/synccheck on the kernels with shared memory and
    # barriers; racecheck on the attention (the slowest by far) last
    for job in "memcheck test_gpu_attention" "memcheck test_gpu_head" "memcheck test_gpu_sample" \
               "memcheck test_gpu_ops" "memcheck test_gpu_lora" "memcheck test_gpu_gemm" "memcheck test_gpu_moe" \
               "racecheck test_gpu_head" "racecheck test_gpu_sample" "racecheck test_gpu_lora" \
               "synccheck test_gpu_lora" "synccheck test_gpu_attention" "racecheck test_gpu_attention"; do
        # shellcheck disable=SC2086 # two words: the tool, the test
        set -- $job
        GT_SMALL=1 step sanitize.log 150 "$1 $2 (GT_SMALL)" "$san" --tool "$1" --error-exitcode 9 --print-limit 20 \
            "$REAL/$2"
    done
}

run_suites() { # run_suites [ENV=VALUE...]: the suites on cuda (the attention of ENV)
    local t
    for t in test_cpu_ref test_learning test_longseq test_exe_sample; do
        step suites.log 45 "$t (cuda${1:+ $*})" env LOOM_TEST_BACKEND=cuda "$@" "$BIN/$t"
    done
}

STEPS="dense check kernels tests moe backend backend-dense backend-sync backend-sgmv backend-mma backend-cublas
       backend-own suites suites-own sanitize ref model8b model06 model-v2 model-own model-recompute model-sgmv model-gemm quickmodel model bench8b bench
       quickbench layer sdpa8b sdpa quicksdpa peer peer-table cudnn decode peer-decode decode-eager decode-prof decode-ops
       train-ops kernels-decode model8b-80g model1b decode-fuse backend-fuse backend-sgmv3 model-sgmv3 decode-sgmv3 suites-sgmv3
       decode-attn model-lorafirst backend-lorafirst suites-old decode-side gemm-waves"

run_step() {
    case $1 in
        dense) run_dense ;;
        check) run_check ;;
        kernels | tests) run_dense; run_check; step kernels.log 60 test_gpu_moe "$BIN/test_gpu_moe" ;;
        moe) run_moe ;;
        backend) run_backend backend.log test_gpu_backend "" ;;
        backend-dense) run_backend backend.log "test_gpu_backend (dense, extras)" "$BACKEND_DENSE" ;;
        backend-sync) run_backend backend-sync.log "test_gpu_backend LOOM_CUDA_SYNC=1" "" LOOM_CUDA_SYNC=1 ;;
        backend-sgmv) run_backend backend-sgmv.log "test_gpu_backend LCU_LORA=sgmv" "" LCU_LORA=sgmv ;;
        backend-mma) run_backend backend-mma.log "test_gpu_backend LCU_ATTN=mma" "" LCU_ATTN=mma ;;
        backend-cublas) run_backend backend-cublas.log "test_gpu_backend LCU_GEMM=cublas" "" LCU_GEMM=cublas ;;
        # the own attention kernels (version 1), which cuDNN's fused attention replaced as the
        # default for training passes (backend/cuda/README.md)
        backend-own) run_backend backend-own.log "test_gpu_backend LCU_ATTN=wmma" "" LCU_ATTN=wmma ;;
        # cuDNN's fused attention against version 1 and the fp64 reference, bit-for-bit reruns
        cudnn) LOOM_CUDNN_REQUIRED=1 LCU_CUDNN_VERBOSE=1 step cudnn.log 120 test_gpu_cudnn_attn "$BIN/test_gpu_cudnn_attn" ;;
        model-own)
            LCU_ATTN=wmma MODEL_TAG="(own attention)" run_model model-own-06b 80 --geo Qwen3-0.6B --iters 1
            LCU_ATTN=wmma MODEL_TAG="(own attention)" run_model model-own-8b 200 --geo Qwen3-8B --iters 1 ;;
        model-recompute)
            LCU_KEEP_ACT=0 MODEL_TAG="(recompute)" run_model model-recompute-06b 80 --geo Qwen3-0.6B --iters 1
            LCU_KEEP_ACT=0 MODEL_TAG="(recompute)" run_model model-recompute-8b 200 --geo Qwen3-8B --iters 1 ;;
        model-sgmv) LCU_LORA=sgmv MODEL_TAG="(LoRA sgmv)" run_model model-sgmv-06b 80 --geo Qwen3-0.6B --iters 1 ;;
        model-gemm) LCU_LORA=gemm MODEL_TAG="(LoRA gemm)" run_model model-gemm-06b 80 --geo Qwen3-0.6B --iters 1 ;;
        sanitize) run_sanitize ;;
        suites) run_suites ;;
        suites-own) run_suites LCU_ATTN=wmma ;;
        ref) LOOM_TEST_BACKEND=cuda step ref.log 400 "run_ref.py (cuda, bf16 bars)" "$PY" tests/ref/run_ref.py \
                 --dump-bin "$BIN/test_cpu_ref" --work "$OUT/ref-work" --tolerance bf16 ;;
        model8b) run_model model-8b 400 --geo Qwen3-8B --iters 1 ;;
        model06) run_model model-06b 120 --geo Qwen3-0.6B --iters 1 ;;
        model1b) run_model model-1b 90 --geo Llama-3.2-1B --iters 1 ;;
        # an H100's 80 GB (79.6 GiB as cudaMemGetInfo counts it) on a bigger card
        model8b-80g) LCU_DEVICE_MB=81559 MODEL_TAG="(as an 80 GB card)" run_model model-8b-80g 200 --geo Qwen3-8B --iters 1 ;;
        train-ops) LCU_TRAIN_PROFILE=1 MODEL_TAG="(train ops)" run_model train-ops 150 --geo Qwen3-8B,Qwen3-0.6B --iters 1 ;;
        decode-fuse)
            LCU_DECODE_FUSE=1 MODEL_TAG="(fused q/k/v)" run_model decode-fuse 120 --decode --steps 64 \
                --geo Qwen3-8B,Qwen3-0.6B
            LCU_DECODE_FUSE=2 MODEL_TAG="(fused q/k/v, packed GEMMs)" run_model decode-fuse2 120 --decode --steps 64 \
                --geo Qwen3-8B,Qwen3-0.6B ;;
        suites-sgmv3) run_suites LCU_LORA=sgmv3 ;;
        backend-sgmv3) run_backend backend-sgmv3.log "test_gpu_backend LCU_LORA=sgmv3" "" LCU_LORA=sgmv3 ;;
        model-sgmv3) LCU_LORA=sgmv3 MODEL_TAG="(LoRA sgmv3)" run_model model-sgmv3-06b 80 --geo Qwen3-0.6B --iters 1 ;;
        decode-sgmv3) LCU_LORA=sgmv3 MODEL_TAG="(LoRA sgmv3)" run_model decode-sgmv3 120 --decode --steps 64 \
                          --geo Qwen3-8B,Qwen3-0.6B ;;
        backend-fuse) run_backend backend-fuse.log "test_gpu_backend LCU_DECODE_FUSE=1" llama LCU_DECODE_FUSE=1 ;;
        kernels-decode) step bench-decode.log 60 "bench_cuda_kernels --decode" "$BIN/bench_cuda_kernels" --decode \
                            --csv "$OUT/bench-decode.csv" ;;
        model-v2)
            LCU_ATTN=mma LCU_LORA=sgmv MODEL_TAG="(v2)" run_model model-v2-06b 80 --geo Qwen3-0.6B --iters 1
            LCU_ATTN=mma LCU_LORA=sgmv MODEL_TAG="(v2)" run_model model-v2-8b 200 --geo Qwen3-8B --iters 1 ;;
        quickmodel) run_model model 540 --quick ;;
        decode) run_model decode 200 --decode --steps 64 --geo Qwen3-8B,Qwen3-0.6B ;;
        decode-prof) LCU_DECODE_PROFILE=1 MODEL_TAG="(decode profile)" run_model decode-prof 120 --decode --steps 64 \
            --geo Qwen3-8B,Qwen3-0.6B ;;
        decode-ops) LCU_DECODE_PROFILE=2 MODEL_TAG="(decode ops)" run_model decode-ops 60 --decode --steps 64 \
            --geo Qwen3-8B,Qwen3-0.6B ;;
        decode-eager) LCU_DECODE_GRAPH=0 MODEL_TAG="(no decode graphs)" run_model decode-eager 200 --decode --steps 64 \
                          --geo Qwen3-8B,Qwen3-0.6B ;;
        suites-old) run_suites LCU_KEEP_ACT=0 LCU_DECODE_GRAPH=0 LCU_LORA=gemm LCU_DECODE_FUSE=0 LCU_DECODE_ATTN=0 \
                        LCU_LORA_FIRST=0 ;;
        model-lorafirst)
            LCU_LORA_FIRST=1 MODEL_TAG="(LoRA first)" run_model model-lorafirst-8b 200 --geo Qwen3-8B --iters 1
            LCU_LORA_FIRST=1 MODEL_TAG="(LoRA first)" run_model model-lorafirst-06b 80 --geo Qwen3-0.6B --iters 1
            LCU_LORA_FIRST=1 MODEL_TAG="(LoRA first)" run_model model-lorafirst-decode 60 --decode --steps 64 \
                --geo Qwen3-8B ;;
        backend-lorafirst) run_backend backend-lorafirst.log "test_gpu_backend LCU_LORA_FIRST=1" "" LCU_LORA_FIRST=1 ;;
        gemm-waves)
            step kernels.log 45 "test_gpu_gemm LCU_GEMM_WAVES=1" env LCU_GEMM_WAVES=1 "$BIN/test_gpu_gemm"
            step bench-decode-waves.log 60 "bench_cuda_kernels --decode LCU_GEMM_WAVES=2" env LCU_GEMM_WAVES=2 \
                "$BIN/bench_cuda_kernels" --decode --csv "$OUT/bench-decode-waves.csv" ;;
        decode-side) LCU_DECODE_SIDE=1 MODEL_TAG="(LoRA shrinks beside the GEMM)" run_model decode-side 60 --decode \
                         --steps 64 --geo Qwen3-8B ;;
        decode-attn) LCU_DECODE_ATTN=1 MODEL_TAG="(decode attention kernel)" run_model decode-attn 120 --decode \
                         --steps 64 --geo Qwen3-8B,Qwen3-0.6B ;;
        peer-decode) step peer-decode.log 200 "peft_peer --rows decode" "$PY" bench/cuda/peft_peer.py --rows decode \
                         --steps 64 --geo Qwen3-8B,Qwen3-0.6B --json "$OUT/peer-decode.json" ;;
        model) run_model model 540 ;;
        bench8b) step bench-8b.log 100 "bench_cuda_kernels Qwen3-8B" "$BIN/bench_cuda_kernels" --geo Qwen3-8B \
                     --csv "$OUT/bench-8b.csv" ;;
        bench) step bench.log 420 bench_cuda_kernels "$BIN/bench_cuda_kernels" --csv "$OUT/bench.csv" ;;
        quickbench) step bench.log 300 "bench_cuda_kernels --quick" "$BIN/bench_cuda_kernels" --quick --csv "$OUT/bench.csv" ;;
        layer)
            step layer.log 240 bench_cuda_layer "$BIN/bench_cuda_layer"
            LCU_ATTN=mma step layer.log 240 "bench_cuda_layer LCU_ATTN=mma" "$BIN/bench_cuda_layer" ;;
        sdpa8b) step sdpa-8b.log 60 "PyTorch SDPA Qwen3-8B" "$PY" bench/cuda/sdpa_peer.py --geo Qwen3-8B \
                    --tokens 2048,8192,32768 --single --json "$OUT/sdpa-8b.json" ;;
        sdpa) step sdpa.log 400 sdpa_peer "$PY" bench/cuda/sdpa_peer.py --json "$OUT/sdpa.json" ;;
        quicksdpa) step sdpa.log 200 "sdpa_peer --quick" "$PY" bench/cuda/sdpa_peer.py --quick --json "$OUT/sdpa.json" ;;
        peer) step peer.log 540 "peft_peer --rows all" "$PY" bench/cuda/peft_peer.py --rows all --json "$OUT/peer.json" ;;
        peer-table) step peer.log 540 "peft_peer --rows table" "$PY" bench/cuda/peft_peer.py --rows table \
                        --json "$OUT/peer.json" ;;
        *) echo "unknown step $1 (see the head of bench/cuda/run_on_gpu.sh)"; exit 2 ;;
    esac
}

bench_rows() { [ -f "$OUT/$1" ] && { echo "---- $1"; grep -E ' ad \||failed|out of memory|^== ' "$OUT/$1"; }; }

print_summary() {
    echo
    echo "---- FAIL / FATAL lines"
    grep -hE "^(FAIL|FATAL)|  FAIL |^not ok" "$OUT"/kernels.log "$OUT"/backend*.log "$OUT"/moe.log "$OUT"/suites.log \
        "$OUT"/ref.log "$OUT"/cudnn.log 2>/dev/null | cut -c1-300 | head -40
    [ -f "$OUT/sanitize.log" ] && { echo "---- compute-sanitizer"; grep -E "^=========|^===== " "$OUT/sanitize.log" | head -30; }
    for f in model-8b.log model-8b-80g.log model-06b.log model-1b.log model-recompute-8b.log model-recompute-06b.log model-sgmv-06b.log model-gemm-06b.log model-v2-06b.log \
        model-v2-8b.log model-own-06b.log model-own-8b.log model.log decode.log decode-eager.log decode-prof.log decode-fuse.log decode-fuse2.log decode-sgmv3.log model-sgmv3-06b.log decode-attn.log \
        model-lorafirst-8b.log model-lorafirst-06b.log model-lorafirst-decode.log decode-side.log; do bench_rows "$f"; done
    [ -f "$OUT/decode-prof.log" ] && grep -h "decode profile" "$OUT/decode-prof.log" | cut -c1-240 | head -12
    # the operations' tables of the timed calls (not the warm-up's single step), top 10 rows each
    [ -f "$OUT/decode-ops.log" ] && awk '/decode ops, / { keep = $0 !~ / 1 steps,/; n = 0 } /decode ops/ && keep && n++ < 11' \
        "$OUT/decode-ops.log" | cut -c1-300 | head -80
    # each training shape's table (the rows the issue compares with PEFT), top 12 rows each
    [ -f "$OUT/train-ops.log" ] && awk '/train ops, / { keep = $0 ~ /(4096|8192) tokens in .*forward\+backward/; n = 0 } /train ops/ && keep && n++ < 13' \
        "$OUT/train-ops.log" | cut -c1-300 | head -120
    for f in bench-8b.log bench.log bench-decode.log; do
        [ -f "$OUT/$f" ] && { echo "---- $f"; grep -E "ceiling|measured|attention|head|lora|gemm|decode" "$OUT/$f" | cut -c1-200 | head -100; }
    done
    for f in sdpa-8b.log sdpa.log; do
        [ -f "$OUT/$f" ] && { echo "---- $f"; grep -E "^attention|^torch|^== " "$OUT/$f" | head -40; }
    done
    [ -f "$OUT/layer.log" ] && { echo "---- layer.log"; grep -E "tok/s|====" "$OUT/layer.log"; }
    [ -f "$OUT/peer.log" ] && sed -n '/PyTorch + PEFT peer:/,$p' "$OUT/peer.log"
    [ -f "$OUT/peer-decode.log" ] && { grep -h "^note:" "$OUT/peer-decode.log"; sed -n '/PyTorch + PEFT peer:/,$p' "$OUT/peer-decode.log"; }
    echo "---- summary (run_on_gpu.sh $ARGS: ${SECONDS}s of ${BUDGET}s; logs in $OUT)"
    grep -E "NOT FOUND|misses|older than R580|no nvidia-smi" "$OUT/env.txt"
    printf '%s\n' "${SUM[@]}"
}

if [ "$MODE" != a ] && [ "$MODE" != b ] && [ "$MODE" != c ]; then
    for s in "$@"; do
        [[ " $(echo $STEPS) " == *" $s "* ]] || { echo "unknown step $s (a, b, or one of: $(echo $STEPS))"; exit 2; }
    done
fi
: > "$OUT/summary.txt"
case $MODE in
    a)
        run_dense
        run_check
        run_step cudnn
        run_moe
        run_backend backend.log test_gpu_backend ""
        stop_if_no_device test_gpu_backend backend.log
        if fataled backend.log test_gpu_backend; then
            run_backend backend-sync.log "test_gpu_backend LOOM_CUDA_SYNC=1" "" LOOM_CUDA_SYNC=1
            summary_line "bench_cuda: not run (the backend test faulted: fix that first)"
        else
            run_suites
            run_step ref
            run_step model8b
            run_step model06
            run_step model1b
        fi
        ;;
    b)
        run_step peer-table
        run_step backend-sgmv
        run_step backend-own
        run_suites LCU_ATTN=wmma
        run_step bench8b
        run_step decode
        run_step decode-prof
        run_step peer-decode
        run_step suites-old
        ;;
    c)
        run_step model8b-80g
        run_step train-ops
        run_step decode-ops
        run_step kernels-decode
        run_step gemm-waves
        run_step decode-side
        run_step backend-sgmv3
        ;;
    *)
        for s in "$@"; do run_step "$s"; done
        ;;
esac
print_summary
