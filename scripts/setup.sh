#!/usr/bin/env bash
# Installs what one purpose needs on a fresh Debian machine of this kind
# (root; Rust, Python 3.11, Node 20, Go and a JDK present), and nothing more:
#
#   scripts/setup.sh build   build `deepspan` (web UI included)
#   scripts/setup.sh demo    build + run `deepspan demo`            (make demo)
#   scripts/setup.sh check   build + the fast test tier            (make check)
#   scripts/setup.sh test    demo + check + the whole suite         (make test)
#   scripts/setup.sh bench   test's set-up: the benchmarks use it   (make bench)
#
# Each step prints its name and wall time ("present" when there was nothing
# to do); steps that are done already cost well under a second, so every make
# target runs this first.
set -euo pipefail
cd "$(dirname "$0")/.."

purpose="${1:-}"
case "$purpose" in
  build | demo | check | test | bench) ;;
  *)
    echo "usage: scripts/setup.sh build|demo|check|test|bench (got '${purpose}')" >&2
    exit 2
    ;;
esac
wants() { # wants PURPOSE...: whether this run's purpose includes any of them
  local p
  for p in "$@"; do
    case "$purpose:$p" in
      "$p:$p" | test:demo | test:check | bench:demo | bench:check | bench:test) return 0 ;;
    esac
  done
  return 1
}

# step NAME CMD...: runs CMD, then prints "setup: NAME: T s".
step() {
  local name="$1"
  shift
  local started
  started=$(date +%s.%N)
  "$@"
  printf 'setup: %-58s %5.1f s\n' "$name" "$(echo "$(date +%s.%N) - $started" | bc)" >&2
}

need_command() { # need_command CMD WHY
  command -v "$1" >/dev/null || { echo "setup: $1 is required ($2) but not found on PATH" >&2; exit 1; }
}
need_command cargo "Rust builds deepspan"
need_command python3 "the demo, the SDK and the tests are Python"
need_command node "Node.js >= 20 builds the web UI (ui/)"
node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' ||
  { echo "setup: Node.js >= 20 is required to build the web UI (ui/)" >&2; exit 1; }

# --- Debian packages -------------------------------------------------------
# build: clang and libbpf's headers compile the recorder's eBPF program
#   (crates/record/build.rs); the zstd crate links the system's libzstd,
#   found by pkg-config.
# demo: PostgreSQL 15 serves the shop's inventory; iproute2 makes the network
#   fault's namespace, veth pair and tc qdisc.
# check: trace-cmd and babeltrace2 are the oracles of the trace.dat and CTF
#   decoders; strace counts the Python SDK's system calls.
# test: LTTng records the user-space CTF traces; Chromium runs the web UI's
#   end-to-end test (headless, driven by playwright-core); Maven and JDK 17
#   build the Java agent extension and run WireMock; podman (with runc: crun
#   refuses this VM's hybrid cgroup layout) runs busybox containers whose
#   culprits must be named by container.
debian=(clang libbpf-dev libzstd-dev pkg-config)
wants demo && debian+=(postgresql-15 iproute2)
wants check && debian+=(trace-cmd babeltrace2 strace)
wants test && debian+=(lttng-tools liblttng-ust-dev chromium maven openjdk-17-jdk-headless
  podman runc busybox-static)
install_debian() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
step "Debian packages (${#debian[@]})" install_debian "${debian[@]}"

# --- Python packages -------------------------------------------------------
# One pip run per purpose, so pip picks one consistent set of OpenTelemetry
# versions. demo: the deepspan-otel SDK (editable) and the shop's packages.
# check: the SDK's test extras (its own tests, and the CLI tests that run
# instrumented Python programs). test: waitress (a real WSGI server with a
# worker pool, for the placement test) and chDB (the fleet tables' queries).
python_modules=() pip_args=()
if wants demo; then
  python_modules+=(deepspan_otel opentelemetry.exporter.otlp.proto.http requests psycopg2
    opentelemetry.instrumentation.wsgi opentelemetry.instrumentation.requests
    opentelemetry.instrumentation.psycopg2)
  pip_args+=(-r demo/requirements.txt)
fi
if wants check; then
  python_modules+=(deepspan_otel pytest httpx opentelemetry.proto opentelemetry.instrumentation.wsgi)
  pip_args+=(-e "sdk/python[test]")
elif wants demo; then
  pip_args+=(-e sdk/python)
fi
if wants test; then
  python_modules+=(waitress chdb)
  pip_args+=(waitress chdb)
fi
install_python() {
  [ ${#python_modules[@]} -eq 0 ] && return 0
  local imports
  imports=$(IFS=,; echo "${python_modules[*]}")
  python3 -c "import $imports" 2>/dev/null && return 0
  echo "setup: installing Python packages: ${pip_args[*]}" >&2
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "${pip_args[@]}"
}
step "Python packages" install_python

# --- npm packages of the web UI (built into the binary) ---------------------
install_ui() {
  [ -d ui/node_modules ] && [ ui/node_modules/.package-lock.json -nt ui/package-lock.json ] && return 0
  (cd ui && npm ci --no-audit --no-fund --loglevel=error)
}
step "npm packages of the web UI" install_ui

# --- npm packages of the Node.js SDK (its tests, and the CLI's Node server) --
install_node_sdk() {
  local lock=sdk/node/node_modules/.package-lock.json
  [ -f "$lock" ] && [ "$lock" -nt sdk/node/package-lock.json ] && return 0
  (cd sdk/node && npm ci --no-audit --no-fund --loglevel=error)
}
wants check && step "npm packages of the Node.js SDK" install_node_sdk

# --- what only the whole suite uses ------------------------------------------
if wants test; then
  need_command go "Go builds Jaeger and the placement test's Go service"
  # Jaeger v2, which the export and agent tests send spans to: built once
  # from the Go module proxy and cached (~/.cache/deepspan; minutes).
  step "Jaeger (built once, cached)" bash -c 'scripts/build-jaeger.sh >/dev/null'
  # The OpenTelemetry Collector of deploy/collector, which the export test
  # puts between deepspan and Jaeger, and the check of deploy/'s Kubernetes
  # manifests (strict decoding into k8s.io/api's types): built and cached
  # the same way.
  step "OpenTelemetry Collector (built once, cached)" \
    bash -c 'scripts/build-go.sh deploy/collector otelcol >/dev/null'
  step "manifest check (built once, cached)" \
    bash -c 'scripts/build-go.sh deploy/check manifest-check >/dev/null'
  # The Go service of the placement test (stock OpenTelemetry for Go): its
  # modules, fetched now so the test builds it from the module cache.
  step "Go modules of the placement test" bash -c 'cd crates/cli/tests/placement/gosvc && go mod download'
fi
