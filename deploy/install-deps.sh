#!/usr/bin/env bash
# Installs what Loom needs to build and run, from Debian 12 only: the README's first
# command. The test suite needs more (deploy/install-test-deps.sh, which deploy/test.sh
# runs). Idempotent.
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
  libprotobuf-c-dev protobuf-c-compiler libzstd-dev   # protobuf wire format (SDK 0.25)
  dpkg-dev file                     # the .deb (CPack runs dpkg-shlibdeps for its Depends)
  curl python3                      # the README's examples (HTTP, and JSON read with python3)
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
