#!/usr/bin/env python3
"""Analysis cost per span (run by hand; never a test): one kernel trace,
analysed alone and with 10^3 ... 10^6 synthetic requests, to show whether
placement, baselines, root causes and table writing stay linear in spans.

The trace is recorded here (`deepspan-workload pingpong`, about 100 MB) or
given with `--run`. Each case is a copy of the run folder (the kernel files
hard-linked) with N requests imported: root spans alternating between the
workload's two threads in consecutive slices of the recording, with
deepspan's fields, as bench/analyze_bench.py makes them (with `--inferred`,
without them: placed by inference from the trace). Per case: wall and
CPU time of `deepspan analyze`, its peak RSS (wait4), the phases
(DEEPSPAN_TIMINGS), the CPU time per span beyond the kernel-only analysis
of the same trace in the same run, and the marginal CPU time per span
from one count to the next (the figure that matters: flat within 2x from
10^3 to 10^6 spans means linear; the first figure also carries the fixed
cost of any analysis with requests). Results go to stdout and
bench/out/span_scaling.json.

  python3 bench/span_scaling.py [--run RUN --tids T1 T2] [--inferred] [--counts 1000 10000 ...]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze_bench import DEEPSPAN, WORKLOAD, phases, record, run_measured  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Spans per OTLP request line: keeps each JSON line a few MB.
SPANS_PER_LINE = 10_000


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def write_spans(run, tids, count, inferred=False):
    """`count` root spans over the recording, as JSON lines of OTLP; with
    `inferred`, without deepspan's fields (only the process's pid in the
    resource), so that placement infers their threads from the trace."""
    manifest = json.loads((run / "manifest.json").read_text())
    start, end = manifest["start"]["mono_ns"], manifest["end"]["mono_ns"]
    wall = manifest["start"]["realtime_ns"] - start
    step = (end - start) // (count + 1)
    if step < 1:
        raise SystemExit(f"{count} requests do not fit in the recording's {end - start} ns")
    attr = lambda k, v: {"key": k, "value": {"intValue": str(v)}}
    path = run / "synthetic-spans.jsonl"
    with path.open("w") as out:
        for first in range(0, count, SPANS_PER_LINE):
            spans = []
            for i in range(first, min(count, first + SPANS_PER_LINE)):
                a, b = start + i * step, start + (i + 1) * step
                tid = tids[i % len(tids)]
                ev = lambda name, t: {"timeUnixNano": str(t + wall), "name": name,
                                      "attributes": [attr("deepspan.tid", tid), attr("deepspan.mono_ns", t)]}
                span = {
                    "traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": f"op{i % 7}",
                    "kind": 2, "startTimeUnixNano": str(a + wall), "endTimeUnixNano": str(b + wall),
                }
                if not inferred:
                    span["attributes"] = [attr("deepspan.tid", tid), attr("deepspan.mono_start_ns", a),
                                          attr("deepspan.mono_end_ns", b)]
                    span["events"] = [ev("deepspan.on", a), ev("deepspan.off", b)]
                spans.append(span)
            resource = [{"key": "service.name", "value": {"stringValue": "pingpong"}}]
            if inferred:
                resource.append(attr("process.pid", tids[0]))
            out.write(json.dumps({"resourceSpans": [{
                "resource": {"attributes": resource},
                "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}]}]}) + "\n")
    run_measured([DEEPSPAN, "import", "-o", run, "--otlp", path])
    path.unlink()


def copy_run(source, dest):
    """The run folder without its analysis or spans; kernel files linked."""
    dest.mkdir()
    for item in source.iterdir():
        if item.name in ("analysis", "spans") or item.name.startswith(".analysis-tmp"):
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name, copy_function=os.link)
        else:
            shutil.copy2(item, dest / item.name)


def analyse(run):
    env = dict(os.environ, DEEPSPAN_TIMINGS="1")
    seconds, cpu, rss_kib, err = run_measured([DEEPSPAN, "analyze", run], env)
    return {"analyze_s": seconds, "cpu_s": cpu, "peak_rss_mib": rss_kib / 1024, "phases_s": phases(err)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, help="an existing run recorded with pingpong, instead of a new one")
    ap.add_argument("--tids", type=int, nargs="+", help="with --run: the workload's two threads (record prints them)")
    ap.add_argument("--rounds", type=int, default=150_000, help="pingpong rounds to record (about 100 MB)")
    ap.add_argument("--counts", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--inferred", action="store_true",
                    help="spans without deepspan's fields: their threads are inferred from the trace")
    args = ap.parse_args()
    for binary in (DEEPSPAN, WORKLOAD):
        if not binary.exists():
            raise SystemExit(f"{binary} missing: run `make build` first")
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="deepspan-spans-") as tmp:
        tmp = Path(tmp)
        if args.run:
            if not args.tids:
                raise SystemExit("--run needs --tids: the workload's threads, as its recording printed them")
            source, tids = args.run, args.tids
        else:
            source = tmp / "recorded"
            log(f"recording pingpong {args.rounds}")
            tids = record(source, args.rounds)["tids"]
            os.sync()
        size = (source / "kernel" / "trace.dat").stat().st_size
        base = tmp / "kernel-only"
        copy_run(source, base)
        kernel = analyse(base)
        log(f"kernel only: {kernel['analyze_s']:.2f} s, CPU {kernel['cpu_s']:.2f} s, "
            f"RSS {kernel['peak_rss_mib']:.0f} MiB")
        rows = []
        for count in args.counts:
            run = tmp / f"spans-{count}"
            copy_run(source, run)
            write_spans(run, tids, count, args.inferred)
            m = analyse(run)
            extra_s = m["cpu_s"] - kernel["cpu_s"]
            m.update({
                "spans": count,
                "cpu_us_per_span": extra_s / count * 1e6,
                "wall_us_per_span": (m["analyze_s"] - kernel["analyze_s"]) / count * 1e6,
                "rss_over_trace": m["peak_rss_mib"] * 2**20 / size,
            })
            log(f"{count} spans: {m['analyze_s']:.2f} s, CPU {m['cpu_s']:.2f} s "
                f"({m['cpu_us_per_span']:.1f} CPU µs per span beyond the kernel's), "
                f"RSS {m['peak_rss_mib']:.0f} MiB, {m['phases_s']}")
            rows.append(m)
            shutil.rmtree(run, ignore_errors=True)
    # The cost of each step up in spans, per span added: the fixed cost of
    # any analysis with requests (thread critical paths for every thread)
    # drops out, and what is left is what grows with spans.
    for before, after in zip(rows, rows[1:]):
        added = after["spans"] - before["spans"]
        after["marginal_cpu_us_per_span"] = (after["cpu_s"] - before["cpu_s"]) / added * 1e6
    per_span = [r["marginal_cpu_us_per_span"] for r in rows[1:] if r["marginal_cpu_us_per_span"] > 0]
    result = {
        "host_cpus": os.cpu_count(), "kernel": os.uname().release,
        "load_average_1m": os.getloadavg()[0], "trace_mb": size / 1e6,
        "placed_by": "inference" if args.inferred else "deepspan's fields",
        "kernel_only": kernel, "cases": rows,
        "marginal_cpu_per_span_max_over_min": max(per_span) / min(per_span) if per_span else None,
    }
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "span_scaling.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
