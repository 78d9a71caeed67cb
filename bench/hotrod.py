"""HotROD, Jaeger's example application (`examples/hotrod` of the Jaeger
module the tests' Jaeger is built from), as a workload of the cost
benchmarks: Gelle et al. 2021 measured their tracing overhead on it.

One `hotrod all` process serves the four services (frontend, customer,
driver, route) on loopback ports of its own and exports its spans with the
stock OpenTelemetry Go SDK over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT.
A `GET /dispatch?customer=N` fans out to the customer service (a simulated
MySQL query), the driver service (simulated Redis lookups over gRPC) and
ten route calls: about 50 spans per request. Its latency is mostly
simulated sleeps, so what deepspan costs it shows in CPU per request.

The load is an open loop: request k is due at start + k / rate whether or
not earlier ones were answered, and its latency counts from when it was due
(a late start is the system's delay, not the client's). Workers are many
enough that none is due while all are busy at the rates used here.

Flags: the database connection's mutex is off (`-M`: with it, requests
queue one behind another at 300 ms each and a rate above 3/s only grows the
queue) and the route worker pool is 100 (`-W 100`: the default 3 workers,
shared by every request's ten route calls of about 50 ms each, cap HotROD
near 6 requests/s). Then its latency stays flat (p50 about 570 ms) up to
the 110 requests/s tried, and at the benchmark's 100 requests/s the whole
machine is about 45 % busy on two cores. About 7 % of requests fail by
design (the driver service's simulated Redis timeouts); they are counted
as errors, not in the latencies.
"""

import os
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from agent_overhead import busy_jiffies, free_port, procs

ROOT = Path(__file__).resolve().parent.parent
CUSTOMERS = [123, 392, 731, 567]
FLAGS = ["-M", "-W", "100"]
WORKERS = 256


def binary():
    """The cached HotROD binary, built from the Go module proxy the first
    time (scripts/build-jaeger.sh hotrod)."""
    out = subprocess.run([str(ROOT / "scripts/build-jaeger.sh"), "hotrod"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/build-jaeger.sh hotrod failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


class Hotrod:
    """The workload, with the interface of the demo shop's driver that the
    benchmarks use: `env`, `cleanup`, `start_services`, `stop_services`,
    and `measure` for one run's figures."""

    def __init__(self, cleanup, logs):
        self.cleanup = cleanup
        self.logs = logs
        self.binary = binary()
        self.env = dict(os.environ)
        self.proc = None
        self.url = None

    def start_services(self):
        ports = {name: free_port() for name in ("customer", "driver", "frontend", "route")}
        argv = [self.binary, "all", *FLAGS,
                "-c", str(ports["customer"]), "-d", str(ports["driver"]),
                "-f", str(ports["frontend"]), "-r", str(ports["route"])]
        for name in ports:
            argv += [f"--{name}-service-hostname", "127.0.0.1"]
        self.proc = procs.spawn("hotrod", argv, self.cleanup, self.logs, env=self.env)
        self.url = f"http://127.0.0.1:{ports['frontend']}"
        deadline = time.monotonic() + 60
        while True:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(f"hotrod exited with status {self.proc.popen.returncode}:\n"
                                   f"{self.proc.log_tail()}")
            try:
                # One of each customer: connections and caches warm up
                # before the measured load.
                for customer in CUSTOMERS:
                    self.dispatch(customer)
                return
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hotrod did not answer in 60 s:\n{self.proc.log_tail()}")
                time.sleep(0.2)

    def stop_services(self):
        # A Go program stopped by SIGTERM ends by the signal.
        status = self.proc.stop()
        if status not in (0, -15, None):
            raise RuntimeError(f"hotrod exited with status {status}:\n{self.proc.log_tail()}")
        os.remove(self.proc.log_path)  # the next run logs afresh

    def dispatch(self, customer):
        with urllib.request.urlopen(f"{self.url}/dispatch?customer={customer}", timeout=60) as r:
            r.read()
            if r.status != 200:
                raise RuntimeError(f"/dispatch answered {r.status}")

    def measure(self, seconds, rate):
        """One run at `rate` requests/s for `seconds`: requests, errors,
        throughput, p50_ms, p99_ms and the whole machine's CPU ms per
        request."""
        if rate <= 0:
            raise ValueError("HotROD runs in an open loop: give a rate above 0")
        total = int(seconds * rate)
        latencies = []
        errors = 0
        lock = threading.Lock()
        due = []
        ready = threading.Condition()
        start = time.monotonic() + 0.1

        def worker():
            nonlocal errors
            while True:
                with ready:
                    while not due:
                        ready.wait()
                    k = due.pop(0)
                if k is None:
                    return
                at = start + k / rate
                try:
                    self.dispatch(CUSTOMERS[k % len(CUSTOMERS)])
                    took = time.monotonic() - at
                    with lock:
                        latencies.append(took)
                except (OSError, urllib.error.URLError, RuntimeError):
                    with lock:
                        errors += 1

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        before = busy_jiffies()
        for k in range(total):
            wait = start + k / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with ready:
                due.append(k)
                ready.notify()
        with ready:
            due.extend([None] * WORKERS)
            ready.notify_all()
        for t in threads:
            t.join()
        busy_s = (busy_jiffies() - before) / os.sysconf("SC_CLK_TCK")
        if not latencies:
            raise RuntimeError(f"no request of {total} was answered:\n{self.proc.log_tail()}")
        latencies.sort()
        return {
            "requests": len(latencies),
            "errors": errors,
            "throughput": len(latencies) / seconds,
            "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 1),
            "cpu_ms": busy_s * 1000 / len(latencies),
        }
