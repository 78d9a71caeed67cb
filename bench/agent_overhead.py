#!/usr/bin/env python3
"""What deepspan costs the demo shop, in the style of Gelle et al. 2021,
Table 2: the shop's throughput and client-side p50/p99 latency under a
closed-loop load (`shop.loadgen --interval 0`: each client sends its next
request as soon as the last one is answered), in four cases:

  A    no tracing (OTEL_SDK_DISABLED=true, no exporter)
  B    OpenTelemetry -> Jaeger (the baseline)
  C-1  B through `deepspan agent` in flight mode (the services export to
       the agent, which forwards to Jaeger; default flight-recorder sizes)
  C-1/0  C-1 with snapshots off (--max-snapshots-per-minute 0): the
       pass-through and the flight recorder alone, without the analyses
  C-2  B plus `deepspan record --no-otlp` in standard mode, system-wide

PostgreSQL and Jaeger (scripts/build-jaeger.sh's cached binary, memory
storage) start once; the four services are restarted for every run with
that case's environment (stock OpenTelemetry in every case: the deepspan
span processor is left out, DEEPSPAN_DEMO_NO_SDK=1, so the cases differ
only by the deepspan process). Rounds alternate the cases (B, C-1, C-1/0,
C-2, A);
C-1 and C-2 are compared with B of the same round, and the table gives
the median over rounds and the spread of the per-round ratios (this VM
has 2 cores shared with other work: the spread is the noise).

Timings only: this is never a test. Needs root (tracefs) and the release
`deepspan` (CARGO_TARGET_DIR or target/).
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
sys.path.insert(0, str(ROOT / "demo"))

import driver  # noqa: E402
from harness import procs  # noqa: E402
from harness.cleanup import Cleanup  # noqa: E402
from harness.stale import cleanup_stale  # noqa: E402

CASES = ["B", "C-1", "C-1/0", "C-2", "A"]
DESCRIPTIONS = {
    "A": "no tracing",
    "B": "OpenTelemetry -> Jaeger",
    "C-1": "B + deepspan agent (flight mode)",
    "C-1/0": "C-1 without snapshots (--max-snapshots-per-minute 0)",
    "C-2": "B + deepspan record (standard mode)",
}


def log(msg):
    print(f"agent_overhead: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_jaeger(cleanup, work):
    binary = jaeger_binary()
    ports = {name: free_port() for name in ("grpc", "http", "query", "query_grpc", "health")}
    config = Path(work) / "jaeger.yaml"
    # The configuration of crates/jaeger-test (memory storage on loopback).
    config.write_text(f"""service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{ports['health']}
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: 127.0.0.1:{ports['query']}
    grpc:
      endpoint: 127.0.0.1:{ports['query_grpc']}
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{ports['grpc']}
      http:
        endpoint: 127.0.0.1:{ports['http']}
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
""")
    proc, _ = procs.start("jaeger", [binary, "--config", str(config)], cleanup, work)
    wait_healthy(proc, ports["health"])
    return proc, ports


def jaeger_binary():
    return subprocess.run([str(ROOT / "scripts" / "build-jaeger.sh")], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]


def wait_healthy(proc, health_port):
    """Waits for a Collector's health check (Jaeger v2 is one) to answer."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/status", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not start:\n{proc.log_tail()}")
        time.sleep(0.2)


def start_collector(cleanup, work, jaeger_http, i):
    """An OpenTelemetry Collector as a pass-through, OTLP/HTTP in, OTLP/HTTP
    out to Jaeger (gzip, the exporter's default, as the agent's forwarder):
    what a production agent usually replaces. The Collector is the Jaeger v2
    binary, itself a Collector distribution, with only the upstream OTLP
    receiver and OTLP/HTTP exporter in its pipeline. Returns the process and
    its OTLP/HTTP address."""
    ports = {name: free_port() for name in ("http", "health")}
    config = Path(work) / f"collector-{i}.yaml"
    config.write_text(f"""service:
  extensions: [healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [otlphttp]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{ports['health']}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{ports['http']}
exporters:
  otlphttp:
    endpoint: http://127.0.0.1:{jaeger_http}
""")
    proc, _ = procs.start(f"collector-{i}", [jaeger_binary(), "--config", str(config)], cleanup, work)
    wait_healthy(proc, ports["health"])
    return proc, f"127.0.0.1:{ports['http']}"


def wait_line(proc, pattern, timeout=60):
    """Reads the process's log until a line matches; returns the match."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(proc.log_path, errors="replace") as f:
            for line in f:
                m = re.search(pattern, line)
                if m:
                    return m
        if proc.popen.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name}: no line matching {pattern!r}:\n{proc.log_tail()}")


def start_agent(cleanup, work, jaeger_http, i, extra_flags=()):
    snapshots = Path(work) / f"snapshots-{i}"
    proc, _ = procs.start(f"agent-{i}", [
        str(TARGET / "deepspan"), "agent", "--forward", f"http://127.0.0.1:{jaeger_http}",
        "--otlp-grpc-port", "0", "--otlp-http-port", "0", "--metrics-port", "0",
        "--snapshots", str(snapshots), *extra_flags], cleanup, work)
    m = wait_line(proc, r"OTLP/HTTP on (127\.0\.0\.1:\d+)")
    return proc, m.group(1)


def start_record(cleanup, work, i, flags=()):
    run = Path(work) / f"record-{i}"
    proc, _ = procs.start(f"record-{i}", [
        str(TARGET / "deepspan"), "record", "-o", str(run), "--no-otlp", *flags], cleanup, work,
        stop_signal=signal.SIGINT)
    # It prints nothing at start: recording once the per-CPU files exist.
    deadline = time.monotonic() + 60
    while not (run / "kernel" / "cpu0.raw").exists():
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"deepspan record did not start:\n{proc.log_tail()}")
        time.sleep(0.1)
    return proc, run


def busy_jiffies():
    """The whole machine's non-idle CPU time so far, in clock ticks."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest is in user).
    return sum(fields[:8]) - fields[3] - fields[4]


def measure(shop, seconds, clients, interval=0):
    """The load generator's stats for one run (`interval` 0: a closed
    loop), with throughput and the whole machine's CPU ms per request."""
    before = busy_jiffies()
    load, _ = procs.start("loadgen", [sys.executable, "-m", "shop.loadgen", shop.urls["front"],
                                      "--seconds", str(seconds), "--clients", str(clients),
                                      "--interval", str(interval)], shop.cleanup, shop.logs, env=shop.env)
    load.popen.wait()
    busy_s = (busy_jiffies() - before) / os.sysconf("SC_CLK_TCK")
    with open(load.log_path) as f:
        lines = [line for line in f if line.startswith("{")]
    stats = json.loads(lines[-1]) if lines else {}
    if load.popen.returncode != 0 or not stats.get("requests"):
        raise RuntimeError(f"the load generator failed:\n{load.log_tail()}")
    os.remove(load.log_path)  # the next run appends to a fresh log
    stats["throughput"] = stats["requests"] / seconds
    stats["cpu_ms"] = busy_s * 1000 / stats["requests"]
    return stats


def run_case(case, i, shop, base_env, jaeger, work, args):
    env = dict(base_env)
    env["DEEPSPAN_DEMO_NO_SDK"] = "1"
    extra = None
    if case == "A":
        env["OTEL_SDK_DISABLED"] = "true"
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    else:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{jaeger['http']}"
    if case in ("C-1", "C-1/0"):
        flags = ["--max-snapshots-per-minute", "0"] if case == "C-1/0" else []
        extra, addr = start_agent(shop.cleanup, work, jaeger["http"], i, flags)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{addr}"
    elif case == "C-2":
        extra, run = start_record(shop.cleanup, work, i)
    shop.env = env
    shop.start_services()
    stats = measure(shop, args.seconds, args.clients)
    shop.stop_services()
    if extra is not None:
        status = extra.stop(signal.SIGINT if case == "C-2" else signal.SIGTERM, timeout=120)
        if status != 0:
            raise RuntimeError(f"{extra.name} exited {status}:\n{extra.log_tail()}")
        if case != "C-2":
            stats["agent"] = extra.log_tail(1).strip()
        else:
            shutil.rmtree(run, ignore_errors=True)
    return stats


def pct(x):
    return f"{(x - 1) * 100:+.1f} %"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0, help="load per run")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--work-root", default="/var/tmp")
    args = p.parse_args()
    if not (TARGET / "deepspan").exists():
        sys.exit(f"{TARGET / 'deepspan'} is missing: cargo build --release -p deepspan")
    cleanup_stale(lambda msg: log(msg))
    cleanup = Cleanup()
    cleanup.install_signal_handlers()
    work = tempfile.mkdtemp(prefix="deepspan-overhead-", dir=args.work_root)
    cleanup.push(f"remove {work}", lambda: shutil.rmtree(work, ignore_errors=True))
    os.chmod(work, 0o755)
    results = {c: [] for c in CASES}
    try:
        jaeger_proc, jaeger = start_jaeger(cleanup, work)
        shop = driver.Shop(cleanup, work, work)
        base_env = dict(shop.env)
        shop.start_database()
        for r in range(args.rounds):
            for case in CASES:
                stats = run_case(case, f"{r}-{case.replace('/', '')}", shop, base_env, jaeger, work, args)
                log(f"round {r} {case:4}: {stats['throughput']:.1f} req/s, p50 {stats['p50_ms']} ms, "
                    f"p99 {stats['p99_ms']} ms, {stats['errors']} errors"
                    + (f"; {stats['agent']}" if "agent" in stats else ""))
                results[case].append(stats)
    finally:
        cleanup.undo()

    def per_round(case, key):
        return [c[key] / b[key] for c, b in zip(results[case], results["B"])]

    print(f"\nDemo shop, closed loop, {args.clients} clients, {args.seconds:.0f} s per run, "
          f"{args.rounds} rounds (B, C-1, C-1/0, C-2, A); medians over rounds\n")
    print("| case | what runs | requests/s | p50 ms | p99 ms | throughput vs B | p50 vs B | p99 vs B |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for case in ["A", "B", "C-1", "C-1/0", "C-2"]:
        runs = results[case]
        med = {k: statistics.median(s[k] for s in runs) for k in ("throughput", "p50_ms", "p99_ms")}
        if case == "B":
            vs = ["-", "-", "-"]
        else:
            vs = []
            for key in ("throughput", "p50_ms", "p99_ms"):
                ratios = per_round(case, key)
                vs.append(f"{pct(statistics.median(ratios))} ({pct(min(ratios))} .. {pct(max(ratios))})")
        print(f"| {case} | {DESCRIPTIONS[case]} | {med['throughput']:.1f} | {med['p50_ms']:.1f} | "
              f"{med['p99_ms']:.1f} | {' | '.join(vs)} |")
    b = [s["throughput"] for s in results["B"]]
    if len(b) > 1:
        print(f"\nnoise: B's throughput over the rounds {min(b):.1f} .. {max(b):.1f} req/s "
              f"(spread {(max(b) - min(b)) / statistics.median(b) * 100:.1f} % of its median); "
              "ratios are (median (min .. max)) over the rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
