#!/usr/bin/env bash
# The test command (README and .ci/run): installs the test-only packages, builds Loom and
# runs every test with ctest.
# Tests start their own PostgreSQL clusters under /tmp and remove them.
set -euo pipefail
cd "$(dirname "$0")/.."
# What only the tests need (a browser, PyTorch, Node.js...): installed here, not by the
# Quick start's deploy/install-deps.sh.
bash deploy/install-test-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
# Tests run one at a time: each starts a whole stack, and the machine may have 2 cores.
ctest --test-dir build --output-on-failure "$@"
