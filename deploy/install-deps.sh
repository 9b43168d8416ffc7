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
  libprotobuf-c-dev protobuf-c-compiler libzstd-dev   # protobuf wire format (SDK 0.25)
  python3 python3-numpy python3-torch                  # independent numeric reference in tests
  python3-zstandard                 # tests: zstd-compressed protobuf request bodies
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
echo "install-deps: all packages present"
