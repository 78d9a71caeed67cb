#!/usr/bin/env python3
"""`deepspan export` cost and output size on real recordings (timings: run
by hand, never a test).

For each run (the demo's cpu-cgroup and db-row-lock scenarios, recorded
here unless run folders are given), prints:
- export time and bytes per 1000 requests: OTLP/JSON (`--out`) and
  OTLP/HTTP protobuf into a local receiver (`deepspan receive`);
- spans per trace before folding (every critical-path piece a child span:
  `--min-ms 0 --min-percent 0`, consecutive pieces of one thread and state
  still joined; and the raw pieces, had each become a span) and after
  (the defaults: 1 ms / 1 %), mean and max, and the largest trace's size.

    python3 bench/export_bench.py [RUN ...] [--deepspan PATH] [--repeat N]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATS = re.compile(
    r"(?P<spans>\d+) spans in (?P<traces>\d+) traces; (?P<enriched>\d+) of (?P<requests>\d+) requests .*?"
    r"(?P<pieces>\d+) path pieces joined into (?P<joined>\d+), (?P<children>\d+) child spans "
    r"\((?P<folded>\d+) folded pieces\), (?P<syscalls>\d+) system-call spans"
)


def deepspan_binary(given):
    if given:
        return Path(given)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "release" / "deepspan"


def record(deepspan, keep):
    runs = []
    for scenario in ("cpu-cgroup", "db-row-lock"):
        env = dict(os.environ, DEEPSPAN_DEMO_DIR=str(REPO / "demo"), PYTHONPATH=str(REPO / "sdk/python"))
        subprocess.run([str(deepspan), "demo", "--scenario", scenario, "--keep", str(keep)], env=env,
                       check=False, capture_output=True)
        if (keep / scenario / "analysis" / "requests.json").is_file():
            runs.append(keep / scenario)
    return runs


def export(deepspan, run, out, extra=()):
    started = time.perf_counter()
    done = subprocess.run([str(deepspan), "export", str(run), "--out", str(out), *extra],
                          capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - started
    m = STATS.search(done.stderr)
    if not m:
        sys.exit(f"cannot read export's counts:\n{done.stderr}")
    return elapsed, {k: int(v) for k, v in m.groupdict().items()}


def is_syscall(span):
    return any(a["key"] == "deepspan.kernel.kind" and a["value"].get("stringValue") == "syscall"
               for a in span.get("attributes", []))


def spans_per_trace(path):
    """Spans per trace line (system-call spans left out: the comparison is
    of the critical path's spans), and each line's size."""
    counts, sizes = [], []
    for line in Path(path).read_text().splitlines():
        doc = json.loads(line)
        counts.append(sum(not is_syscall(s) for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
                          for s in ss["spans"]))
        sizes.append(len(line))
    return counts, sizes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send_http(deepspan, run, scratch):
    port = free_port()
    receiver = subprocess.Popen([str(deepspan), "receive", "-o", str(scratch / "received"),
                                 "--otlp-http-port", str(port), "--otlp-grpc-port", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        started = time.perf_counter()
        done = subprocess.run([str(deepspan), "export", str(run), "--otlp", f"http://127.0.0.1:{port}"],
                              capture_output=True, text=True, check=True)
        elapsed = time.perf_counter() - started
        sent = re.search(r"sent (\d+) spans in (\d+) requests \((\d+) protobuf bytes", done.stderr)
        return elapsed, int(sent.group(3))
    finally:
        receiver.terminate()
        receiver.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--deepspan")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    deepspan = deepspan_binary(args.deepspan)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        runs = [Path(r) for r in args.runs] or record(deepspan, scratch / "runs")
        if not runs:
            sys.exit("no run to export (recording the demo needs root and tracefs)")
        for run in runs:
            out = scratch / "out.json"
            times = []
            for _ in range(args.repeat):
                t, stats = export(deepspan, run, out)
                times.append(t)
            counts, sizes = spans_per_trace(out)
            json_bytes = out.stat().st_size
            _, unfolded = export(deepspan, run, scratch / "unfolded.json",
                                 ["--min-ms", "0", "--min-percent", "0",
                                  "--max-spans-per-trace", "1000000000", "--max-bytes-per-trace", "1000000000000"])
            unfolded_counts, unfolded_sizes = spans_per_trace(scratch / "unfolded.json")
            http_time, proto_bytes = send_http(deepspan, run, scratch)
            per_k = 1000 / max(stats["requests"], 1)
            print(f"{run.name}: {stats['spans']} spans, {stats['traces']} traces, {stats['requests']} requests, "
                  f"{stats['pieces']} critical-path pieces")
            print(f"  export --out: median {statistics.median(times):.2f} s of {args.repeat} "
                  f"({statistics.median(times) * per_k:.2f} s per 1000 requests), "
                  f"{json_bytes / 1e6:.2f} MB JSON ({json_bytes * per_k / 1e6:.2f} MB per 1000 requests)")
            print(f"  export --otlp (HTTP, gzip, into deepspan receive): {http_time:.2f} s, "
                  f"{proto_bytes / 1e6:.2f} MB protobuf ({proto_bytes * per_k / 1e6:.2f} MB per 1000 requests)")
            raw = stats["spans"] + stats["pieces"]
            print(f"  spans per trace (no system calls), before folding: mean {statistics.mean(unfolded_counts):.1f}, "
                  f"max {max(unfolded_counts)} (largest trace {max(unfolded_sizes) / 1e6:.2f} MB JSON, with all "
                  f"{unfolded['syscalls']} system calls); one span per raw piece: {raw / stats['traces']:.1f} per trace")
            print(f"  spans per trace (no system calls), after folding (1 ms / 1 %): mean {statistics.mean(counts):.1f}, "
                  f"max {max(counts)} (largest trace {max(sizes) / 1e6:.2f} MB JSON); "
                  f"{stats['children']} kernel path spans for {stats['pieces']} pieces "
                  f"({stats['folded']} folded), {stats['syscalls']} system-call spans")


if __name__ == "__main__":
    main()
