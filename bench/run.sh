#!/usr/bin/env bash
# Runs every benchmark (by hand; timings never gate tests). Pass arguments
# through to the kernel benchmark, e.g. `bench/run.sh --only decode`; the
# analysis benchmark (bench/analyze_bench.py) runs with its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 bench/kernel_bench.py "$@"
python3 bench/analyze_bench.py
# OTLP receiver throughput, drops and peak RSS under real exporters (< 1 min).
python3 bench/otlp_load.py
python3 bench/ctf_bench.py  # CTF decode time vs babeltrace2: the corpus kernel traces and a >= 250 MB one (--only ust: a recorded LTTng-UST trace)
python3 bench/ui_bench.py  # UI: request page first render, frame time while panning (>= 100 000 intervals)
python3 bench/sync_bench.py  # clock sync (convex hull) cost per matched pair vs sorting the same pairs
python3 bench/profile_overhead.py  # CPU sampling (record --profile) cost against recording without it
python3 bench/export_bench.py  # deepspan export: time and bytes per 1000 requests, spans per trace before/after folding
python3 bench/java_extension_bench.py  # the Java agent extension's cost per span against the agent alone (needs make java-sdk)
python3 bench/placement_bench.py  # placing spans by inference vs by the SDK: CPU s per 100 MB of trace
python3 bench/queue_accuracy.py  # false queueing: share of the demo's normal requests queued under 1 ms (goal >= 99 %)
