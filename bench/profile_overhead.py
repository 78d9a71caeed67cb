#!/usr/bin/env python3
"""The cost of CPU sampling (`deepspan record --profile`) against recording
without it, as ratios measured in one run, interleaved.

- workload: the CPU time of `deepspan-workload hot`'s request (a fixed
  amount of work; the sampling interrupts are charged to the thread they
  interrupt), median of N runs each way: wall time on a shared machine
  is mostly other load;
- shop (`--shop SCENARIO`): the demo shop's load generator (requests served,
  p50 and p99 latency) under one scenario, N runs each way.

Timings only: this is never a test. Needs root (it records).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"


def record(run: Path, profile: bool, command: list) -> str:
    args = [str(TARGET / "deepspan"), "record", "-o", str(run)]
    if profile:
        args.append("--profile")
    out = subprocess.run(args + ["--"] + command, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return out.stdout.decode()


def workload_ms(tmp: Path, i: int, profile: bool, rounds: int) -> float:
    run = tmp / f"w{i}-{int(profile)}"
    spans = tmp / f"w{i}-{int(profile)}.json"
    told = record(run, profile, [str(TARGET / "deepspan-workload"), "hot", str(rounds), str(spans)])
    line = next(l for l in told.splitlines() if l.startswith('{"workload"'))
    subprocess.run(["rm", "-rf", str(run)], check=True)
    return json.loads(line)["cpu_ns"] / 1e6


def shop(tmp: Path, i: int, profile: bool, scenario: str) -> dict:
    run = tmp / f"s{i}-{int(profile)}"
    record(run, profile, ["python3", str(ROOT / "demo" / "driver.py"), scenario, "--out", str(run / "demo")])
    stats = json.loads((run / "demo" / "expected.json").read_text())["loadgen"]
    subprocess.run(["rm", "-rf", str(run)], check=True)
    return stats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=7, help="runs each way (default 7)")
    p.add_argument("--rounds", type=int, default=300_000_000, help="hot loop rounds per half request")
    p.add_argument("--shop", metavar="SCENARIO", help="also measure the demo shop under this scenario")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="deepspan-profile-bench-") as tmp:
        tmp = Path(tmp)
        plain, sampled = [], []
        for i in range(args.n):
            plain.append(workload_ms(tmp, i, False, args.rounds))
            sampled.append(workload_ms(tmp, i, True, args.rounds))
        a, b = statistics.median(plain), statistics.median(sampled)
        print(f"workload request CPU: {a:.1f} ms recorded, {b:.1f} ms recorded with --profile (99 Hz): ratio {b / a:.4f}")
        if args.shop:
            rows = {False: [], True: []}
            for i in range(args.n):
                for profile in (False, True):
                    rows[profile].append(shop(tmp, i, profile, args.shop))
            for key in ("requests", "p50_ms", "p99_ms"):
                x = statistics.median(r[key] for r in rows[False])
                y = statistics.median(r[key] for r in rows[True])
                print(f"shop {args.shop} {key}: {x} without, {y} with --profile: ratio {y / x:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
