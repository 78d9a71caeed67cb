#!/usr/bin/env bash
# Installs what building and testing deepspan needs on a fresh Debian machine
# of this kind (root, Rust and Python already present). Idempotent and quiet
# when everything is there already.
set -euo pipefail
cd "$(dirname "$0")/.."

# trace-cmd and babeltrace2 are test oracles; lttng-tools/liblttng-ust-dev
# record the user-space CTF traces the CTF tests compare against; strace
# counts the Python SDK's system calls; postgresql-15 serves the row-lock
# diagnosis test (a throwaway cluster per test); python3-venv is not needed
# (the machine's own Python gets the SDK as an editable install).
debian_packages=(trace-cmd babeltrace2 lttng-tools liblttng-ust-dev strace postgresql-15)

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

# The Python SDK (and the OpenTelemetry packages its tests and the demo use).
if ! python3 -c "import deepspan_otel, opentelemetry.exporter.otlp.proto.http, pytest" 2>/dev/null; then
  echo "installing the deepspan-otel Python SDK (editable) with its test extras"
  python3 -m pip install -q --disable-pip-version-check -e "sdk/python[test]"
fi

# The PostgreSQL client of the row-lock diagnosis test.
if ! python3 -c "import psycopg2" 2>/dev/null; then
  echo "installing psycopg2-binary (PostgreSQL client for the diagnosis tests)"
  python3 -m pip install -q --disable-pip-version-check psycopg2-binary
fi

if ! command -v cargo >/dev/null; then
  echo "cargo (Rust) is required but not found on PATH" >&2
  exit 1
fi
