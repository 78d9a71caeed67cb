#!/usr/bin/env bash
# `make demo`: record a real instrumented Python program in which one request
# holds a lock while another waits for it, analyse the run and show why the
# waiting request was slow. (The multi-service demo with injected faults,
# issue 7, replaces this.)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release
work=$(mktemp -d /var/tmp/deepspan-demo.XXXXXX)
run=$work/run

echo "== recording: two requests contending on one lock (Python + OpenTelemetry + deepspan_otel)"
"$bin/deepspan" record -o "$run" --otlp-grpc-port 0 --otlp-http-port 0 -- \
  python3 crates/cli/tests/analyze/cases.py lock "$work"
echo
echo "== deepspan analyze $run"
"$bin/deepspan" analyze "$run"
waiter=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["waiter"])' "$work/ids.json")
echo
echo "== deepspan report $run --request $waiter   (the waiting request)"
"$bin/deepspan" report "$run" --request "$waiter"
echo
echo "The run is kept in $run"
echo "(kernel/trace.dat opens in trace-cmd; analysis/*.parquet in DuckDB or pandas)."
