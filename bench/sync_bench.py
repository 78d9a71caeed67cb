#!/usr/bin/env python3
"""The cost of clock sync against the number of matched pairs.

Runs the criterion benchmark `crates/bench/benches/sync_cost.rs` and prints,
per size, the convex-hull sync time, the baseline's (sorting the same
messages) measured in the same run, and their ratio. Timings only: this is
never a test.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def estimate_ns(group: str, function: str, size: int) -> float:
    path = target_dir() / "criterion" / group / function / str(size) / "new" / "estimates.json"
    return json.loads(path.read_text())["median"]["point_estimate"]


def main() -> int:
    subprocess.run(
        ["cargo", "bench", "-q", "-p", "deepspan-bench", "--bench", "sync_cost"],
        cwd=ROOT,
        check=True,
        stdout=sys.stderr,
    )
    print(f"{'pairs':>9} {'sync':>10} {'ns/pair':>8} {'sort':>10} {'sync/sort':>9}")
    for size in (1_000, 10_000, 100_000, 1_000_000):
        sync = estimate_ns("sync_cost", "convex_hull", size)
        sort = estimate_ns("sync_cost", "baseline_sort", size)
        print(
            f"{size:>9} {sync / 1e6:>8.2f}ms {sync / size:>8.1f} {sort / 1e6:>8.2f}ms {sync / sort:>9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
