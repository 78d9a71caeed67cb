#!/usr/bin/env bash
# `make demo`: record a real multi-threaded program and show what the kernel
# trace says about it. (The full multi-service demo with injected faults and
# diagnoses replaces this once the analysis stages exist.)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release
run=$(mktemp -d /var/tmp/deepspan-demo.XXXXXX)/run
trap 'echo "deepspan demo interrupted; partial run left in $run" >&2' INT TERM

echo "== recording: threads sleeping, contending on a mutex, doing disk I/O"
"$bin/deepspan" record -o "$run" -- "$bin/deepspan-workload" mt /var/tmp | tee "$run.workload.json"
echo
echo "== kernel events in $run (deepspan decode --format json)"
"$bin/deepspan" decode "$run" --format json
echo
echo "The run is kept in $run; 'trace-cmd report $run/kernel/trace.dat' reads it too."
echo "Critical paths and diagnoses arrive with 'deepspan analyze' (not built yet)."
