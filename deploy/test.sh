#!/usr/bin/env bash
# The test command (README and .ci/run): builds Loom and runs every test with ctest.
# Tests start their own PostgreSQL clusters under /tmp and remove them.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
# Tests run one at a time: each starts a whole stack, and the machine may have 2 cores.
ctest --test-dir build --output-on-failure "$@"
