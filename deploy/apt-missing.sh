#!/usr/bin/env bash
# Sourced by deploy/install-deps.sh and deploy/install-test-deps.sh: apt_install_missing
# PKG... installs, from Debian, the packages of the list that are not installed yet (as
# root, or through sudo), and changes nothing when all are.
apt_install_missing() {
  local sudo="" p
  local missing=()
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}
