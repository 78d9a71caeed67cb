#!/usr/bin/env python3
"""The cost of placing spans by inference (from the kernel trace alone,
without the SDK's fields) against SDK placement, on the same SDK-synced run,
as ratios measured in one run (interleaved).

`deepspan analyze RUN --placement sdk|inferred`, N times each, with
DEEPSPAN_TIMINGS: the whole analysis's CPU seconds and the placement phase
("spans, placement and thread activity"), per 100 MB of kernel trace.
Without RUN it records the demo's lock scenario first (needs root).
Timings only: this is never a test.
"""

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEEPSPAN = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "deepspan"
PHASE = "spans, placement and thread activity"


def analyze(run: Path, placement: str) -> tuple:
    """(placement phase CPU s, whole analysis CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [str(DEEPSPAN), "analyze", str(run), "--placement", placement],
        env={**os.environ, "DEEPSPAN_TIMINGS": "1"},
        check=True,
        capture_output=True,
        text=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(rf"timing: {re.escape(PHASE)}: [\d.]+ s, CPU ([\d.]+) s", out.stderr)
    if not m:
        sys.exit(f"no '{PHASE}' timing in deepspan analyze's output:\n{out.stderr}")
    whole = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(m.group(1)), whole


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", type=Path, help="an analysed run with SDK-synced spans")
    p.add_argument("-n", type=int, default=7, help="analyses each way (default 7)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="deepspan-placement-bench-") as tmp:
        run = args.run
        if run is None:
            subprocess.run([str(DEEPSPAN), "demo", "--scenario", "lock", "--keep", tmp], check=True,
                           stdout=subprocess.DEVNULL)
            run = Path(tmp) / "lock"
        work = Path(tmp) / "copy"
        shutil.copytree(run, work)  # analyze rewrites analysis/; keep the input as it was
        mb = (work / "kernel" / "trace.dat").stat().st_size / 1e6
        times = {"sdk": [], "inferred": []}
        for _ in range(args.n):
            for placement in times:
                times[placement].append(analyze(work, placement))
        per100 = lambda s: s * 100 / mb
        phase = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
        whole = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
        print(f"trace: {mb:.0f} MB; medians of {args.n} analyses each way, CPU seconds per 100 MB")
        for k in times:
            print(f"  --placement {k:8}: placement phase {per100(phase[k]):.3f} s, whole analysis {per100(whole[k]):.3f} s")
        print(f"  inferred / sdk: placement phase {phase['inferred'] / phase['sdk']:.2f}x, "
              f"whole analysis {whole['inferred'] / whole['sdk']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
