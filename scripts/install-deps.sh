#!/usr/bin/env bash
# Installs what building and testing deepspan needs on a fresh Debian machine
# of this kind (root, Rust and Python already present). Idempotent and quiet
# when everything is there already.
set -euo pipefail
cd "$(dirname "$0")/.."

# trace-cmd and babeltrace2 are test oracles; lttng-tools/liblttng-ust-dev
# record the user-space CTF traces the CTF tests compare against; strace
# counts the Python SDK's system calls; python3-venv is not needed (the
# machine's own Python gets the SDK as an editable install). PostgreSQL 15
# serves the row-lock diagnosis test (a throwaway cluster per test) and the
# demo (`make demo`, demo/), which also makes network namespaces, veth pairs
# and tc qdiscs (iproute2). clang and libbpf's headers compile `record
# --tcp-keys`'s eBPF program (TCP sequence numbers for clock sync across
# hosts; crates/record/build.rs). Chromium runs the web UI's end-to-end test
# (ui/e2e, headless, driven by playwright-core). Maven and JDK 17 build the
# Java agent extension (sdk/java, `make java-sdk`) and run its test server.
debian_packages=(trace-cmd babeltrace2 lttng-tools liblttng-ust-dev strace postgresql-15 iproute2 clang libbpf-dev chromium
  maven openjdk-17-jdk-headless)

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

# The Python SDK with its test extras, and the demo application's packages
# (OpenTelemetry instrumentations, psycopg2), in one pip run so that pip
# picks one consistent set of OpenTelemetry versions.
python_modules="deepspan_otel, opentelemetry.exporter.otlp.proto.http, pytest, psycopg2, requests, httpx"
python_modules+=", opentelemetry.instrumentation.wsgi, opentelemetry.instrumentation.requests"
python_modules+=", opentelemetry.instrumentation.psycopg2"
# waitress: a real WSGI server whose main thread reads requests and hands
# them to a worker pool (the placement test's hand-off mode).
python_modules+=", waitress"
# chDB (in-process ClickHouse) runs the fleet tables' documented queries
# (tests/fleet, docs/tables.md).
python_modules+=", chdb"
if ! python3 -c "import $python_modules" 2>/dev/null; then
  echo "installing the deepspan-otel Python SDK (editable, with test extras), the demo's packages and chDB"
  python3 -m pip install -q --disable-pip-version-check -e "sdk/python[test]" -r demo/requirements.txt chdb waitress
fi

# Jaeger v2, which the export test sends spans to, built once from the Go
# module proxy and cached (~/.cache/deepspan/jaeger-<version>; minutes).
if ! command -v go >/dev/null; then
  echo "go is required to build Jaeger for the export test (scripts/build-jaeger.sh)" >&2
  exit 1
fi
scripts/build-jaeger.sh >/dev/null
# The Go service of the placement test (stock OpenTelemetry for Go,
# crates/cli/tests/placement/gosvc): its modules, fetched now so the test
# builds it from the module cache.
(cd crates/cli/tests/placement/gosvc && go mod download)

# Node 20+ and npm build the web UI (ui/); its npm packages are installed
# by `make ui` (npm ci, from ui/package-lock.json).
if ! command -v npm >/dev/null || ! node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null; then
  echo "Node.js >= 20 and npm are required to build the web UI (ui/)" >&2
  exit 1
fi

if ! command -v cargo >/dev/null; then
  echo "cargo (Rust) is required but not found on PATH" >&2
  exit 1
fi
