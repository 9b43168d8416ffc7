#!/usr/bin/env bash
# e2e_on_gpu.sh — the whole service on a GPU machine that has no PostgreSQL and none of
# Loom's libraries, from .gpu-carry/e2e.tar.gz (bench/cuda/make_e2e_carry.sh): `loom up`
# with the cuda executor and the HTTP tests, each step capped, the summary printed last.
#
#   bash bench/cuda/e2e_on_gpu.sh            (budget LOOM_GPU_BUDGET, default 280 s)
#
# Steps, in order:
#   e2e_sft_test.py on the CPU backend (16 cores there) -> its per-step NLL, the reference
#   e2e_sft_test.py on the cuda backend, each step's NLL against the CPU run's (bf16 noise)
#   checkpoint_test.py on cuda: save/load resumes bitwise, names, tenants, download links
#   sample_e2e_test.py on cuda: sampling through the API (asample, KV cache, stop tokens)
# Logs in $OUT (default /tmp/loom-gpu-out): e2e.log, e2e-*.json, and each test's stacks'
# up.log (every process's log: api, scheduler, executor) as stack-LABEL-N-up.log.
#
# Also runs here, on the CPU backend only (LOOM_E2E_BACKENDS=cpu), to check the carry:
# the service from the archive, not from build/.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUDGET=${LOOM_GPU_BUDGET:-280}
OUT=${OUT:-/tmp/loom-gpu-out}
PY=${PYTHON:-python3}
BACKENDS=${LOOM_E2E_BACKENDS:-cpu cuda}
mkdir -p "$OUT"
LOG=$OUT/e2e.log
: > "$LOG"
[ -f .gpu-carry/e2e.tar.gz ] || { echo "no .gpu-carry/e2e.tar.gz (bash bench/cuda/make_e2e_carry.sh)"; exit 1; }
W=$(mktemp -d /tmp/loom-e2e.XXXXXX)
trap 'rm -rf "$W"' EXIT
tar -C "$W" -xzf .gpu-carry/e2e.tar.gz
chmod 755 "$W" # after tar (it sets "./"'s mode): the cluster's unprivileged user must reach pg/ and lib/
source bench/cuda/cuda_libs.sh
CUBLAS=$(loom_cublas_dir) || CUBLAS=""
PGBIN=$(ls -d "$W"/pg/usr/lib/postgresql/*/bin | head -1)
export LOOM_BIN=$W/real/loom LOOM_PG_BINDIR=$PGBIN PATH="$PGBIN:$PATH" PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$W/lib${CUBLAS:+:$CUBLAS}:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN for the cuda executor's attention: the system's, else PyTorch's wheel
export LOOM_CUDNN_LIBRARY=${LOOM_CUDNN_LIBRARY:-$(PYTHON=$PY loom_cudnn_library)}
# Debian's server reads /usr/share/zoneinfo (compiled in); a bare image may have none
if [ ! -f /usr/share/zoneinfo/UTC ] && [ -w /usr/share ] ; then
    mkdir -p /usr/share/zoneinfo && cp -r "$W"/zoneinfo/* /usr/share/zoneinfo/ && echo "zoneinfo: carried UTC/GMT/Etc installed"
fi
{
    echo "e2e_on_gpu.sh: budget ${BUDGET}s, carry built from $(cat "$W/commit" 2>/dev/null), checkout $(git rev-parse HEAD 2>/dev/null)"
    echo "backends: $BACKENDS; cuBLAS: ${CUBLAS:-not found}; cuDNN: ${LOOM_CUDNN_LIBRARY:-not found}; PostgreSQL: $PGBIN"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    miss=$(ldd "$LOOM_BIN" "$W/real/libloom_backend_cuda.so" "$PGBIN/postgres" 2>&1 | grep "not found" | sort -u | tr '\n' ' ')
    [ -n "$miss" ] && echo "MISSING LIBRARIES: $miss"
} | tee -a "$LOG"

SUM=()
RESERVE=10
step() { # step CAP LABEL COMMAND...: capped at min(CAP, time left), output to e2e.log
    local cap=$1 label=$2 t0=$SECONDS lim word
    shift 2
    lim=$((BUDGET - SECONDS - RESERVE))
    [ "$lim" -gt "$cap" ] && lim=$cap
    if [ "$lim" -lt 10 ]; then SUM+=("$(printf '%-44s NOT RUN (no time left)' "$label")"); return; fi
    echo "===== $label (limit ${lim}s)" >> "$LOG"
    timeout -k 5 "$lim" "$@" >> "$LOG" 2>&1
    local rc=$?
    case $rc in 0) word=PASS ;; 77) word="SKIPPED (77)" ;; 124 | 137) word="TIMEOUT after ${lim}s" ;; *) word="FAIL (exit $rc)" ;; esac
    SUM+=("$(printf '%-44s %-20s %4ds  %s' "$label" "$word" $((SECONDS - t0)) \
        "$(sed -n "/^===== $label /,\$p" "$LOG" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -1)")")
    # every process's log of the step's stacks (LOOM_KEEP_TEST_DIR kept their directories)
    local n=0 d tag
    tag=$(echo "$label" | tr -c 'A-Za-z0-9_\n' '-')
    for d in $(sed -n "/^===== $label /,\$p" "$LOG" | sed -n 's/^kept \(\/tmp\/loomt-[A-Za-z0-9_]*\).*/\1/p'); do
        n=$((n + 1))
        [ -f "$d/up.log" ] && cp "$d/up.log" "$OUT/stack-$tag-$n-up.log"
        rm -rf "$d"
    done
}
export LOOM_KEEP_TEST_DIR=1

for b in $BACKENDS; do
    if [ "$b" = cpu ]; then
        LOOM_TEST_BACKEND=cpu step 120 "e2e_sft_test (cpu)" "$PY" tests/e2e_sft_test.py --losses-out "$OUT/e2e-cpu.json"
    else
        cmp=()
        [ -f "$OUT/e2e-cpu.json" ] && cmp=(--compare-with "$OUT/e2e-cpu.json")
        LOOM_TEST_BACKEND=$b step 150 "e2e_sft_test ($b)" "$PY" tests/e2e_sft_test.py --losses-out "$OUT/e2e-$b.json" "${cmp[@]}"
        LOOM_TEST_BACKEND=$b step 150 "checkpoint_test ($b)" "$PY" tests/checkpoint_test.py
        LOOM_TEST_BACKEND=$b step 120 "sample_e2e_test ($b)" "$PY" tests/sample_e2e_test.py
    fi
done

echo
echo "---- FAIL lines"
grep -E "^FAIL|  FAIL|Traceback|Error:" "$LOG" | cut -c1-300 | head -30
echo "---- NLL per step (first, 10th, 20th, last)"
for f in "$OUT"/e2e-*.json; do
    [ -f "$f" ] && "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[1].split('/')[-1], k, ' '.join('%.4f' % v[i] for i in (0, 10, 20, -1) if len(v) > abs(i))) for k, v in d.items()]" "$f"
done
echo "---- summary (e2e_on_gpu.sh: ${SECONDS}s of ${BUDGET}s; log $LOG)"
printf '%s\n' "${SUM[@]}"
