#!/usr/bin/env python3
"""Kernel-side benchmarks of deepspan (run by hand: `make bench`; never a test).

(a) decode throughput: `deepspan decode --format json` vs `trace-cmd report >
    /dev/null` on the same recording made here (>= 200 MB by default);
(b) recording overhead: CPU time of a context-switch-heavy and a
    syscall-heavy workload alone and under `deepspan record` (one rare event:
    the recorder's own cost; `--events lean`; `--events analysis`; and
    `--mode flight`), runs interleaved, ratios of medians;
(c) decode peak RSS for traces of growing size (should stay flat).

Every figure is a ratio against a baseline measured in the same run, because
these machines are noisy. Results go to stdout and bench/out/kernel.json.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("DEEPSPAN_BIN_DIR", ROOT / "target" / "release"))
DEEPSPAN = BIN / "deepspan"
WORKLOAD = BIN / "deepspan-workload"


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def peak_rss_kib(cmd, stdout=subprocess.DEVNULL):
    """Runs cmd and returns (seconds, its own peak RSS in KiB) via wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss


def record_big_trace(run_dir, target_mb):
    """Records the syscall workload until the trace reaches target_mb."""
    # A getppid call gives ~98 bytes of sys_enter/sys_exit (x86-64, 4 KiB pages).
    calls = int(target_mb * 1024 * 1024 / 98 * 1.05)
    log(f"recording ~{target_mb} MB: {calls} system calls under deepspan record")
    subprocess.run(
        [DEEPSPAN, "record", "-o", run_dir, "--buffer-mb", "256", "--",
         WORKLOAD, "syscalls", str(calls)],
        check=True, stdout=subprocess.DEVNULL)
    return Path(run_dir) / "kernel" / "trace.dat"


def decode_throughput(dat, repeats):
    size = dat.stat().st_size
    summary = json.loads(subprocess.run([DEEPSPAN, "decode", dat, "--format", "json"],
                                        check=True, capture_output=True).stdout)
    events = summary["events"]
    ours, theirs, rss = [], [], []
    for i in range(repeats):
        s, r = peak_rss_kib([DEEPSPAN, "decode", dat, "--format", "json"])
        ours.append(s)
        rss.append(r)
        s, _ = peak_rss_kib(["trace-cmd", "report", dat])
        theirs.append(s)
        log(f"  decode run {i + 1}: deepspan {ours[-1]:.2f} s, trace-cmd report {theirs[-1]:.2f} s")
    d, t = statistics.median(ours), statistics.median(theirs)
    return {
        "trace_bytes": size,
        "events": events,
        "lost_events": summary["lost_events"],
        "deepspan_s": d,
        "trace_cmd_report_s": t,
        "deepspan_mb_per_s": size / d / 1e6,
        "deepspan_events_per_s": events / d,
        "trace_cmd_mb_per_s": size / t / 1e6,
        "speedup_vs_trace_cmd": t / d,
        "deepspan_peak_rss_kib": max(rss),
    }


def workload_seconds(cmd):
    """The workload's own CPU time (user + system): tracing cost is charged
    to the traced threads, and unlike wall time it is not stretched by
    whatever else runs on this shared 2-core machine."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["cpu_seconds"]


# The recordings compared with the workload alone: the recorder's own cost
# (one event that never fires here, its eBPF captures on), the two presets,
# and the flight recorder with the default preset.
RECORDINGS = {
    "base": ["--events", "sched:sched_process_exec"],
    "lean": ["--events", "lean"],
    "analysis": ["--events", "analysis"],
    "flight": ["--mode", "flight"],
}


def recording_overhead(tmp, repeats, pingpong_rounds, syscall_count):
    workloads = {
        # Both threads pinned to one CPU: every round trip is two context
        # switches on that CPU, and run-to-run noise from migrations is gone.
        "context_switch": ["taskset", "-c", "0", str(WORKLOAD), "pingpong", str(pingpong_rounds)],
        "syscall": [str(WORKLOAD), "syscalls", str(syscall_count)],
    }
    results = {}
    for name, cmd in workloads.items():
        times = {"baseline": [], **{r: [] for r in RECORDINGS}}
        for i in range(repeats):
            # Interleave the configurations so drift hits them alike.
            times["baseline"].append(workload_seconds(cmd))
            for rec, args in RECORDINGS.items():
                run = Path(tmp) / f"ovh-{name}-{rec}-{i}"
                times[rec].append(workload_seconds(
                    [str(DEEPSPAN), "record", "--no-otlp", "-o", str(run), *args, "--"] + cmd))
                shutil.rmtree(run, ignore_errors=True)
            log(f"  {name} run {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()))
        base = statistics.median(times["baseline"])
        results[name] = {
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            **{f"overhead_{r}": statistics.median(times[r]) / base - 1 for r in RECORDINGS},
        }
    return results


def rss_vs_size(tmp, sizes_mb):
    rows = []
    for mb in sizes_mb:
        dat = record_big_trace(Path(tmp) / f"rss-{mb}", mb)
        seconds, rss = peak_rss_kib([DEEPSPAN, "decode", dat, "--format", "json"])
        rows.append({"trace_mb": dat.stat().st_size / 1e6, "peak_rss_mib": rss / 1024, "seconds": seconds})
        log(f"  {rows[-1]}")
        shutil.rmtree(Path(tmp) / f"rss-{mb}", ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-mb", type=int, default=220, help="size of the decode benchmark trace")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pingpong-rounds", type=int, default=500_000)
    ap.add_argument("--syscalls", type=int, default=2_000_000)
    ap.add_argument("--only", choices=["decode", "overhead", "rss"], action="append")
    args = ap.parse_args()
    for binary in (DEEPSPAN, WORKLOAD):
        if not binary.exists():
            raise SystemExit(f"{binary} missing: run `make build` first")
    if not shutil.which("trace-cmd"):
        raise SystemExit("trace-cmd missing: run `make deps` first")
    only = set(args.only or ["decode", "overhead", "rss"])
    results = {"host_cpus": os.cpu_count(), "kernel": os.uname().release}
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="deepspan-bench-") as tmp:
        if "decode" in only:
            log("(a) decode throughput")
            dat = record_big_trace(Path(tmp) / "big", args.trace_mb)
            results["decode"] = decode_throughput(dat, args.repeats)
            shutil.rmtree(Path(tmp) / "big", ignore_errors=True)
        if "overhead" in only:
            log("(b) recording overhead")
            results["recording_overhead"] = recording_overhead(
                tmp, args.repeats, args.pingpong_rounds, args.syscalls)
        if "rss" in only:
            log("(c) decode peak RSS vs trace size")
            results["decode_rss"] = rss_vs_size(tmp, [50, 200, 500])
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "kernel.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
