"""Added cost per span of deepspan_otel, against the plain OpenTelemetry SDK.

Both variants run in this one process, in alternating rounds (so CPU
frequency and cache state hit both alike), each round timing N spans:

    with tracer.start_as_current_span("op"):   # start, attach, detach, end
        pass

- plain:    SDK TracerProvider, no deepspan processor, hooks uninstalled;
- deepspan: SDK TracerProvider + deepspan_otel.install (processor, context
            and asyncio hooks), so each span also gets its tid, monotonic
            start/end and one deepspan.on/off activation pair;
- also reported: install(activations=False) (tid and monotonic times only).

Neither provider exports (exporting costs the same in both and would only
add noise). Reported: the fastest round of each variant (the least
disturbed by other processes), and the median of the per-round differences.

Usage: python bench_processor.py [--spans N] [--rounds R] [--json]
Target: added cost <= 1000 ns per span.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from opentelemetry.sdk.trace import TracerProvider

import deepspan_otel


def run(tracer, n: int) -> float:
    start_as_current_span = tracer.start_as_current_span
    # CPU time of this thread: time stolen by other processes (a busy CI
    # machine) does not count, which wall-clock time would.
    t0 = time.thread_time_ns()
    for _ in range(n):
        with start_as_current_span("op"):
            pass
    return (time.thread_time_ns() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=5000, help="spans per round (default 5000)")
    ap.add_argument("--rounds", type=int, default=41, help="rounds per variant (default 41)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = ap.parse_args()

    plain = TracerProvider().get_tracer("bench")
    ds_provider = TracerProvider()
    deepspan_otel.install(ds_provider)
    deep = ds_provider.get_tracer("bench")

    # Warm-up, both variants.
    deepspan_otel.uninstall_hooks()
    run(plain, 2000)
    deepspan_otel.install(ds_provider)
    run(deep, 2000)

    p_times, d_times, f_times = [], [], []
    for _ in range(a.rounds):
        deepspan_otel.uninstall_hooks()
        p_times.append(run(plain, a.spans))
        f_times.append(run(deep, a.spans))  # processor only, no activation hooks
        deepspan_otel.install(ds_provider)
        d_times.append(run(deep, a.spans))
    p, d, f = min(p_times), min(d_times), min(f_times)
    paired = statistics.median(dd - pp for pp, dd in zip(p_times, d_times))
    result = {
        "spans_per_round": a.spans,
        "rounds": a.rounds,
        "plain_ns_per_span": round(p, 1),
        "deepspan_ns_per_span": round(d, 1),
        "added_ns_per_span": round(d - p, 1),
        "added_ns_per_span_median_paired": round(paired, 1),
        "added_ns_per_span_without_activations": round(f - p, 1),
        "ratio": round(d / p, 3),
        "target_added_ns": 1000,
        "python": sys.version.split()[0],
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(
            f"plain SDK: {p:.0f} ns/span; with deepspan_otel: {d:.0f} ns/span; "
            f"added {d - p:.0f} ns/span (ratio {d / p:.3f}; median of paired rounds {paired:.0f} ns; target <= 1000 ns) "
            f"[fastest of {a.rounds} rounds x {a.spans} spans each, Python {result['python']}]; "
            f"without activation hooks: added {f - p:.0f} ns/span"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
