#!/usr/bin/env bash
# Installs what Loom needs to build and run, from Debian 12 only: the README's first
# command. The test suite needs more (deploy/install-test-deps.sh, which deploy/test.sh
# runs). Idempotent.
set -euo pipefail
. "$(dirname "$0")/apt-missing.sh"
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
  curl python3                      # the examples of the README and docs/ (HTTP, JSON read with python3)
)
apt_install_missing "${PKGS[@]}"
echo "install-deps: all packages present"
