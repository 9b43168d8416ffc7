#!/usr/bin/env bash
# window.sh NAME COMMAND... — for the project's device tool, which brings back at most 8
# files from its $OUT: runs COMMAND with OUT pointing at a scratch directory (where
# run_on_gpu.sh and e2e_on_gpu.sh write their dozens of logs), then packs that directory
# into $OUT/NAME.tgz, whatever COMMAND's exit status (the summary is in its output).
#
#   bash bench/cuda/window.sh a LOOM_GPU_BUDGET=300 bash bench/cuda/run_on_gpu.sh a
#   (VAR=VALUE words before the command are set for it, as env does)
set -u
name=${1:?usage: window.sh NAME COMMAND...}
shift
dest=${OUT:-/tmp/loom-gpu-out}
scratch=$(mktemp -d /tmp/loom-window.XXXXXX)
mkdir -p "$dest"
OUT=$scratch env "$@"
rc=$?
tar -C "$scratch" -czf "$dest/$name.tgz" .
rm -rf "$scratch"
echo "window.sh: logs of '$name' in $dest/$name.tgz (exit $rc)"
exit $rc
