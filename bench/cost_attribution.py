#!/usr/bin/env python3
"""Where deepspan's cost on a busy service goes: each part measured as its
own ratio against B (the demo shop sending its spans to Jaeger directly),
in one run, the cases interleaved round by round.

Cases (each beside B's services and Jaeger, nothing else of deepspan):

  B            OpenTelemetry -> Jaeger, no deepspan (the baseline)
  B'           OpenTelemetry -> an OpenTelemetry Collector -> Jaeger: the
               fair baseline of the agent's pass-through, since a
               production agent usually replaces a Collector (the Jaeger v2
               binary, a Collector distribution, with the upstream OTLP
               receiver and OTLP/HTTP exporter; agent_overhead.py's
               start_collector)
  rec:base     `deepspan record --no-otlp`, system-wide, recording one
               rare event (sched_process_exec): the recorder's own cost
  rec:CLASS    `deepspan record --no-otlp --events CLASS`, system-wide,
               standard mode, for each event class of the `analysis`
               preset alone: sched, irq (hard and soft interrupts), timer,
               ipi, syscalls, net, block
  rec:all      the whole `analysis` preset (what `record` costs today)
  rec:lean     the `lean` preset: `analysis` without raw_syscalls
  agent:pass   `deepspan agent`, snapshots off, recording one rare event
               (sched_process_exec): the OTLP pass-through alone
  agent:flight the agent with snapshots off and its default preset
               (`lean`): the pass-through and the flight recorder's reading
  agent:flight-all
               the same with the `analysis` preset (every system call)
  agent        the agent as it ships (snapshots on)

The load is the shop's load generator at a fixed pace (`--rate`, requests
per second over all clients, about half what the shop serves flat out on
two cores) or, with `--rate 0`, a closed loop (each client sends as soon as
its last answer came). With `--workload hotrod` the workload is HotROD
instead (bench/hotrod.py, the workload Gelle et al. 2021 measured their overhead on), in an open loop at
`--rate` dispatches per second. With `--warmup S`, each run's services
first serve S seconds of the same load, not measured: the first requests
(imports, connections), the recorder's first /proc scans and the agent's
first baselines are then left out of a short run. Per run: throughput, client p50 and p99, and the
whole machine's CPU time per request from /proc/stat (the kernel's tracing
work and deepspan's threads included; this is the figure that matters at a
fixed rate, where throughput does not move). The table gives each case's
median over rounds of its ratio to B of the same round, with the spread
(min .. max) of those ratios: where the spread is wider than a figure, the
figure is noise.

Beside the ratios, what needs no baseline: for each case with a process
beside the workload (deepspan, or the Collector of B'), its own CPU time
(all its threads, over the measured load) and that of its eBPF programs
(their `run_time_ns`, which the kernel keeps while
`kernel.bpf_stats_enabled` is 1: the benchmark sets it for the run and
puts the old value back), each in ms per request. These
are exact where the ratios are noisy; what neither shows is the kernel's
own tracing work in the traced threads (writing ring-buffer events), which
only the ratios measure.

Timings only: this is never a test. Needs root (tracefs), the release
`deepspan` (CARGO_TARGET_DIR or target/), PostgreSQL and the demo's Python
packages (`make demo`), and Jaeger (scripts/build-jaeger.sh; for HotROD
also scripts/build-jaeger.sh hotrod, which the benchmark runs).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agent_overhead as common  # noqa: E402  (the shop, Jaeger and agent plumbing)
import hotrod  # noqa: E402
from agent_overhead import TARGET, driver, Cleanup, cleanup_stale  # noqa: E402

TRACEFS = Path("/sys/kernel/tracing")

# The `analysis` preset (crates/record/src/events.rs) by class.
CLASSES = {
    "sched": ["sched:sched_switch", "sched:sched_waking", "sched:sched_wakeup",
              "sched:sched_wakeup_new", "sched:sched_process_fork", "sched:sched_process_exec",
              "sched:sched_process_exit", "sched:sched_process_free", "sched:sched_migrate_task"],
    "irq": ["irq:irq_handler_entry", "irq:irq_handler_exit", "irq:softirq_raise",
            "irq:softirq_entry", "irq:softirq_exit"],
    "timer": ["timer:hrtimer_expire_entry", "timer:hrtimer_expire_exit"],
    "ipi": ["irq_vectors:reschedule_entry", "irq_vectors:reschedule_exit",
            "irq_vectors:call_function_entry", "irq_vectors:call_function_exit",
            "irq_vectors:call_function_single_entry", "irq_vectors:call_function_single_exit",
            "ipi:ipi_entry", "ipi:ipi_exit"],
    "syscalls": ["raw_syscalls:sys_enter", "raw_syscalls:sys_exit"],
    "net": ["net:net_dev_queue", "net:netif_receive_skb"],
    "block": ["block:block_rq_insert", "block:block_rq_issue", "block:block_rq_complete"],
}

# One event that hardly ever fires: the recorder (or the agent's flight
# recorder) runs, with nearly nothing to record.
RARE_EVENT = "sched:sched_process_exec"


def log(msg):
    print(f"cost_attribution: {msg}", file=sys.stderr, flush=True)


def available(events):
    """The events of `events` this kernel has (the preset skips the others too)."""
    return [e for e in events if (TRACEFS / "events" / e.replace(":", "/")).is_dir()]


def cases():
    """Case name -> what runs beside B: (kind, flags)."""
    out = {"B": (None, []), "B'": ("collector", []),
           "rec:base": ("record", ["--events", RARE_EVENT])}
    for name, events in CLASSES.items():
        have = available(events)
        if have:
            out[f"rec:{name}"] = ("record", ["--events", ",".join(have)])
    out["rec:all"] = ("record", ["--events", "analysis"])
    out["rec:lean"] = ("record", ["--events", "lean"])
    out["agent:pass"] = ("agent", ["--max-snapshots-per-minute", "0", "--events", RARE_EVENT])
    out["agent:flight"] = ("agent", ["--max-snapshots-per-minute", "0"])
    out["agent:flight-all"] = ("agent", ["--max-snapshots-per-minute", "0", "--events", "analysis"])
    out["agent"] = ("agent", [])
    return out


def process_cpu_ms(pid):
    """CPU time of process `pid` so far (all threads, user and system), ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime: fields 14 and 15 of proc(5), 12 and 13 after the comm.
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def bpf_run_ms(pid):
    """Run time so far of the eBPF programs process `pid` holds open, ms
    (0 unless kernel.bpf_stats_enabled was 1 while they ran)."""
    total_ns = 0
    fds = Path(f"/proc/{pid}/fdinfo")
    for info in fds.iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue  # closed meanwhile
        if "prog_type:" not in text:
            continue
        for line in text.splitlines():
            if line.startswith("run_time_ns:"):
                total_ns += int(line.split()[1])
    return total_ns / 1e6


def run_case(case, kind, flags, i, shop, base_env, jaeger, work, args):
    env = dict(base_env)
    env["DEEPSPAN_DEMO_NO_SDK"] = "1"
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{jaeger['http']}"
    extra = run = None
    if kind == "agent":
        extra, addr = common.start_agent(shop.cleanup, work, jaeger["http"], i, flags)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{addr}"
    elif kind == "collector":
        extra, addr = common.start_collector(shop.cleanup, work, jaeger["http"], i)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{addr}"
    elif kind == "record":
        extra, run = common.start_record(shop.cleanup, work, i, flags)
    shop.env = env
    shop.start_services()

    def load(seconds):
        if isinstance(shop, hotrod.Hotrod):
            return shop.measure(seconds, args.rate)
        interval = args.clients / args.rate if args.rate > 0 else 0
        return common.measure(shop, seconds, args.clients, interval)

    if args.warmup > 0:
        # Not measured: the services' first requests (imports, connections,
        # caches), the recorder's first scans, the agent's first baselines.
        load(args.warmup)
    own = extra is not None
    if own:
        own_before = (process_cpu_ms(extra.pid), bpf_run_ms(extra.pid))
    stats = load(args.seconds)
    if own:
        stats["own_ms"] = (process_cpu_ms(extra.pid) - own_before[0]) / stats["requests"]
        stats["bpf_ms"] = (bpf_run_ms(extra.pid) - own_before[1]) / stats["requests"]
    shop.stop_services()
    if extra is not None:
        status = extra.stop(signal.SIGINT if kind == "record" else signal.SIGTERM, timeout=120)
        if status != 0:
            raise RuntimeError(f"{extra.name} exited {status}:\n{extra.log_tail()}")
        if run is not None:
            manifest = json.loads((run / "manifest.json").read_text())
            # Events read from each CPU's buffer, and any left in it.
            stats["events"] = sum(c.get("read_events", 0) + c.get("entries", 0)
                                  for c in manifest.get("per_cpu", [])) or None
            # What the eBPF captures wrote and what their rings had no room
            # for.
            captures = [manifest.get(k) or {} for k in
                        ("socket_calls", "blocked_syscalls", "cfs_throttle", "tcp_keys")]
            stats["captured"] = sum(c.get("records", 0) for c in captures)
            stats["capture_lost"] = sum(c.get("lost", 0) for c in captures)
            shutil.rmtree(run, ignore_errors=True)
        elif kind == "agent":
            stats["agent"] = extra.log_tail(1).strip()
            shutil.rmtree(Path(work) / f"snapshots-{i}", ignore_errors=True)
    return stats


def ratio_cells(runs, baseline, keys):
    """Per key: the median of the per-round ratios to the baseline, with
    their min .. max."""
    cells = []
    for key in keys:
        ratios = [c[key] / b[key] for c, b in zip(runs, baseline)]
        cells.append(f"{common.pct(statistics.median(ratios))} ({common.pct(min(ratios))} .. {common.pct(max(ratios))})")
    return cells


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=15.0, help="load per run")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="load before each run's measured load, not measured (seconds)")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--workload", choices=["shop", "hotrod"], default="shop")
    p.add_argument("--rate", type=float,
                   help="requests per second over all clients; 0 = closed loop (the shop only); "
                        "default 60 for the shop, 100 for HotROD")
    p.add_argument("--cases", help="comma list of cases to run (B always runs); default: all")
    p.add_argument("--work-root", default="/var/tmp")
    args = p.parse_args()
    if args.rate is None:
        args.rate = 100.0 if args.workload == "hotrod" else 60.0
    if args.workload == "hotrod" and args.rate <= 0:
        sys.exit("HotROD runs in an open loop: --rate must be above 0")
    if not (TARGET / "deepspan").exists():
        sys.exit(f"{TARGET / 'deepspan'} is missing: cargo build --release -p deepspan")
    all_cases = cases()
    chosen = list(all_cases)
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - set(all_cases)
        if unknown:
            sys.exit(f"unknown cases {sorted(unknown)}; known: {', '.join(all_cases)}")
        chosen = [c for c in all_cases if c == "B" or c in wanted]
    cleanup_stale(log)
    cleanup = Cleanup()
    cleanup.install_signal_handlers()
    work = tempfile.mkdtemp(prefix="deepspan-cost-", dir=args.work_root)
    cleanup.push(f"remove {work}", lambda: shutil.rmtree(work, ignore_errors=True))
    os.chmod(work, 0o755)
    stats_sysctl = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats_sysctl.read_text().strip()
    if stats_before != "1":
        stats_sysctl.write_text("1")
        cleanup.push("put kernel.bpf_stats_enabled back",
                     lambda: stats_sysctl.write_text(stats_before))
    results = {c: [] for c in chosen}
    try:
        _, jaeger = common.start_jaeger(cleanup, work)
        if args.workload == "hotrod":
            shop = hotrod.Hotrod(cleanup, work)
        else:
            shop = driver.Shop(cleanup, work, work)
            shop.start_database()
        base_env = dict(shop.env)
        for r in range(args.rounds):
            for case in chosen:
                kind, flags = all_cases[case]
                i = f"{r}-" + case.replace(":", "-").replace("'", "p")
                stats = run_case(case, kind, flags, i, shop, base_env, jaeger, work, args)
                log(f"round {r} {case:16}: {stats['throughput']:.1f} req/s, p50 {stats['p50_ms']} ms, "
                    f"p99 {stats['p99_ms']} ms, {stats['cpu_ms']:.2f} CPU ms/request, "
                    f"{stats['errors']} errors" + (f", {stats['events']} events" if stats.get("events") else "")
                    + (f", beside {stats['own_ms']:.2f} + eBPF {stats['bpf_ms']:.2f} CPU ms/request"
                       if "own_ms" in stats else "")
                    + (f", {stats['captured']} eBPF records ({stats['capture_lost']} lost)"
                       if "captured" in stats else "")
                    + (f"; {stats['agent']}" if stats.get("agent") else ""))
                results[case].append(stats)
    finally:
        cleanup.undo()

    load = f"a fixed {args.rate:g} requests/s" if args.rate > 0 else "a closed loop"
    workload = "HotROD" if args.workload == "hotrod" else f"Demo shop, {args.clients} clients"
    warmup = f" after {args.warmup:.0f} s of warm-up" if args.warmup > 0 else ""
    print(f"\n{workload}, {load}, {args.seconds:.0f} s per run{warmup}, "
          f"{args.rounds} rounds; each case against B of the same round: median (min .. max)\n")
    keys = ["throughput", "p50_ms", "p99_ms", "cpu_ms"]
    print("| case | events/s | requests/s | p50 | p99 | CPU per request |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in chosen:
        runs = results[case]
        # The recording spans the warm-up too.
        events = [s["events"] / (args.seconds + args.warmup) for s in runs if s.get("events")]
        ev = f"{statistics.median(events):,.0f}" if events else "-"
        if case == "B":
            med = {k: statistics.median(s[k] for s in runs) for k in keys}
            cells = [f"{med['throughput']:.1f}", f"{med['p50_ms']:.1f} ms", f"{med['p99_ms']:.1f} ms",
                     f"{med['cpu_ms']:.2f} ms"]
        else:
            cells = ratio_cells(runs, results["B"], keys)
        print(f"| {case} | {ev} | {' | '.join(cells)} |")
    if "B'" in chosen:
        agents = [c for c in chosen if c.startswith("agent")]
        if agents:
            print("\nThe agent against B' (the same spans through a Collector) of the same round:\n")
            print("| case | requests/s | p50 | p99 | CPU per request |")
            print("|---|---:|---:|---:|---:|")
            for case in agents:
                cells = ratio_cells(results[case], results["B'"], keys)
                print(f"| {case} | {' | '.join(cells)} |")
    own = [c for c in chosen if results[c] and "own_ms" in results[c][0]]
    if own:
        b_cpu = statistics.median(s["cpu_ms"] for s in results["B"])
        print("\nWhat the process beside the workload (deepspan, or the Collector of B') and its "
              "eBPF programs used, CPU ms per request "
              f"(median over rounds; in % of B's whole-machine {b_cpu:.2f} ms):\n")
        print("| case | its threads | its eBPF programs |")
        print("|---|---:|---:|")
        for case in own:
            d = statistics.median(s["own_ms"] for s in results[case])
            e = statistics.median(s["bpf_ms"] for s in results[case])
            print(f"| {case} | {d:.3f} ({d / b_cpu * 100:.1f} %) | {e:.3f} ({e / b_cpu * 100:.1f} %) |")
    b = [s["cpu_ms"] for s in results["B"]]
    if len(b) > 1:
        print(f"\nnoise: B's CPU per request over the rounds {min(b):.2f} .. {max(b):.2f} ms "
              f"(spread {(max(b) - min(b)) / statistics.median(b) * 100:.1f} % of its median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
