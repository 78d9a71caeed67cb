#!/usr/bin/env python3
"""False queueing on the demo: of the demo shop's normal requests (server
requests not flagged anomalous), the share whose queue time (time at the
host before the span started, `queue` in requests.json) is under 1 ms.
The shop's services are threaded servers with a thread per connection, so
a normal request should wait for nothing before its span: every ms of
queue there is noise the rule adds. Goal: at least 99 %.

Runs `deepspan demo --keep` (every scenario, or `--scenario`) unless run
folders are given; prints per run and in total. An accuracy figure, not a
timing; never a test.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEEPSPAN = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "deepspan"
LIMIT_NS = 1_000_000


def queues(run: Path) -> tuple:
    """(queue ns of each normal server request, 0 without an arrival;
    how many had an arrival)."""
    doc = json.loads((run / "analysis" / "requests.json").read_text())
    normal = [r for r in doc["requests"] if r.get("kind") == "server" and not r.get("anomalous")]
    ns = [(r.get("queue") or {}).get("ns", 0) for r in normal]
    return ns, sum(1 for r in normal if r.get("queue"))


def quantile(sorted_ns: list, q: float) -> float:
    """The q quantile of sorted ns, in ms."""
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6 if sorted_ns else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="analysed demo runs (default: record them)")
    p.add_argument("--scenario", help="one demo scenario (default: all)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="deepspan-queue-bench-") as tmp:
        runs = args.runs
        if not runs:
            cmd = [str(DEEPSPAN), "demo", "--keep", tmp]
            if args.scenario:
                cmd += ["--scenario", args.scenario]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            runs = sorted(d for d in Path(tmp).iterdir() if (d / "analysis" / "requests.json").is_file())
        if not runs:
            sys.exit("no analysed run")
        every, arrived_all = [], 0
        for run in runs:
            ns, arrived = queues(run)
            every += ns
            arrived_all += arrived
            short = sum(1 for q in ns if q < LIMIT_NS)
            print(f"{run.name}: {short} of {len(ns)} normal requests queued under 1 ms ({arrived} with a known arrival)")
        every.sort()
        short = sum(1 for q in every if q < LIMIT_NS)
        share = 100.0 * short / max(len(every), 1)
        print(
            f"all: {short} of {len(every)} ({share:.2f} %) queued under 1 ms; {arrived_all} had a known arrival; "
            f"queue p50 {quantile(every, 0.5):.2f} ms, p90 {quantile(every, 0.9):.2f} ms, p99 {quantile(every, 0.99):.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
