#!/usr/bin/env python3
"""OTLP receiver load benchmark (run by hand: `make bench`; never a test).

`deepspan receive` on loopback ports, fed by real OTLP clients:
(a) capacity: tonic gRPC clients (crates/otlp/examples/otlp_load.rs), one
    connection each, batches of 512 spans, as fast as they are acknowledged;
(b) below capacity: the same clients paced at half of (a)'s rate; nothing
    may be refused or dropped;
(c) the OpenTelemetry Python SDK (BatchSpanProcessor + OTLP/HTTP protobuf
    exporter, several threads) at a steady rate.

For each: spans/s acknowledged and written (from the receiver's own
counters in the run manifest), requests refused for backpressure, spans
dropped, and the receiver's peak RSS (its queue is bounded, so RSS must be).
At most ~50 s in all. Results go to stdout and bench/out/otlp.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
DEEPSPAN = TARGET / "release" / "deepspan"
LOAD = TARGET / "release" / "examples" / "otlp_load"

PYTHON_APP = r"""
import sys, threading, time
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
import deepspan_otel

endpoint, seconds, threads, rate = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
provider = TracerProvider(resource=Resource.create({"service.name": "bench-py"}))
deepspan_otel.install(provider)
provider.add_span_processor(BatchSpanProcessor(
    OTLPSpanExporter(endpoint=endpoint, timeout=10),
    max_queue_size=65536, max_export_batch_size=512, schedule_delay_millis=200))
tracer = provider.get_tracer("bench")
made = [0] * threads

def work(k):
    per_thread = rate / threads
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            return
        if made[k] > per_thread * elapsed:
            time.sleep(0.001)
            continue
        with tracer.start_as_current_span("GET /items", attributes={"http.route": "/items", "n": made[k]}):
            with tracer.start_as_current_span("db.query"):
                pass
        made[k] += 2

ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
start = time.monotonic()
for t in ts: t.start()
for t in ts: t.join()
provider.force_flush()
provider.shutdown()
print(sum(made))
"""


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class ReceiverProcess:
    """`deepspan receive` on free ports; stop() returns (manifest otlp section, peak RSS KiB)."""

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.proc = subprocess.Popen(
            [DEEPSPAN, "receive", "-o", run_dir, "--otlp-grpc-port", "0", "--otlp-http-port", "0"],
            stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        # "deepspan: receiving OTLP/gRPC on A and OTLP/HTTP on B into RUN"
        words = line.split()
        try:
            self.grpc = words[words.index("OTLP/gRPC") + 2]
            self.http = words[words.index("OTLP/HTTP") + 2]
        except ValueError:
            raise SystemExit(f"deepspan receive did not start: {line}{self.proc.stderr.read()}")

    def stop(self):
        self.proc.send_signal(2)  # SIGINT, as Ctrl-C
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        err = self.proc.stderr.read()
        if self.proc.returncode != 0:
            raise SystemExit(f"deepspan receive failed ({self.proc.returncode}): {err[-2000:]}")
        otlp = json.loads((self.run_dir / "manifest.json").read_text())["otlp"]["receiver"]
        return otlp, usage.ru_maxrss


def summarise(name, client, stats, rss_kib, seconds):
    row = {
        "phase": name,
        "seconds": round(seconds, 2),
        "client": client,
        "receiver": stats,
        "spans_written_per_s": round(stats["spans_written"] / seconds),
        "receiver_peak_rss_mib": round(rss_kib / 1024, 1),
    }
    log(f"  {name}: {row['spans_written_per_s']:,} spans/s written, "
        f"{stats['requests_rejected']} requests refused (backpressure), "
        f"{stats['spans_dropped']} spans dropped, peak RSS {row['receiver_peak_rss_mib']} MiB")
    return row


def grpc_phase(tmp, name, seconds, clients, rate=None):
    rx = ReceiverProcess(Path(tmp) / name)
    cmd = [LOAD, "--grpc", rx.grpc, "--seconds", str(seconds), "--clients", str(clients), "--batch", "512"]
    if rate:
        cmd += ["--rate", str(rate)]
    start = time.perf_counter()
    client = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    stats, rss = rx.stop()
    elapsed = time.perf_counter() - start
    row = summarise(name, client, stats, rss, client["seconds"])
    # Every acknowledged span is on disk.
    row["acked_equals_written"] = client["spans_acked"] == stats["spans_written"]
    row["wall_seconds"] = round(elapsed, 2)
    return row


def python_phase(tmp, seconds, threads, rate):
    rx = ReceiverProcess(Path(tmp) / "python")
    try:
        out = subprocess.run(
            [sys.executable, "-c", PYTHON_APP, f"http://{rx.http}/v1/traces", str(seconds), str(threads), str(rate)],
            check=True, capture_output=True, text=True)
    finally:
        stats, rss = rx.stop()
    made = int(out.stdout.strip())
    row = summarise("python_http", {"spans_made": made, "threads": threads, "rate": rate}, stats, rss, seconds)
    row["made_equals_written"] = made == stats["spans_written"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15, help="duration of the capacity phase")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--python-rate", type=float, default=4000, help="spans/s of the Python phase")
    args = ap.parse_args()
    if not DEEPSPAN.exists():
        raise SystemExit(f"{DEEPSPAN} missing: run `make build` first")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "deepspan-otlp", "--example", "otlp_load"],
                   check=True, cwd=ROOT)
    results = {"host_cpus": os.cpu_count(), "batch": 512}
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="deepspan-otlp-bench-") as tmp:
        log(f"(a) capacity: {args.clients} gRPC clients, unpaced, {args.seconds:g} s")
        cap = grpc_phase(tmp, "capacity", args.seconds, args.clients)
        results["capacity"] = cap
        half = max(1000, cap["spans_written_per_s"] // 2)
        log(f"(b) below capacity: {half:,} spans/s, {args.seconds * 2 / 3:g} s")
        results["below_capacity"] = grpc_phase(tmp, "below_capacity", args.seconds * 2 / 3, args.clients, rate=half)
        log(f"(c) OpenTelemetry Python SDK over OTLP/HTTP: {args.python_rate:g} spans/s, 10 s")
        try:
            results["python_http"] = python_phase(tmp, 10, 4, args.python_rate)
        except subprocess.CalledProcessError as e:
            log(f"  skipped: the Python OpenTelemetry SDK failed ({e.stderr.strip()[-300:]}); "
                "pip install -e 'sdk/python[test]'")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "otlp.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
