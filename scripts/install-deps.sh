#!/usr/bin/env bash
# Installs what building and testing deepspan needs on a fresh Debian machine
# of this kind (root, Rust and Python already present). Idempotent and quiet
# when everything is there already.
set -euo pipefail

# trace-cmd and babeltrace2 are test oracles; lttng-tools/liblttng-ust-dev
# record the user-space CTF traces the CTF tests compare against.
debian_packages=(trace-cmd babeltrace2 lttng-tools liblttng-ust-dev)

missing=()
for pkg in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "cargo (Rust) is required but not found on PATH" >&2
  exit 1
fi
