#!/usr/bin/env python3
"""CTF decode benchmark of deepspan (run by hand: `make bench`; never a test).

Decode time of `deepspan decode DIR --format json` (every event mapped
with `CtfEvent::to_event`, names counted; streams decoded on all CPUs, and
with `--threads 1` on one thread merged in time order) against
`babeltrace2 DIR -o dummy` on the same traces:

(s) small: the kernel traces of the shared corpus (bug446190, and the two
    traces of synctraces, 1-2.5 MB each), where fixed start-up costs
    (metadata, mapping, threads) weigh as much as decoding. babeltrace2's
    muxer stops the synctraces with an error after about 11.7k events
    (their packets overlap by a microsecond, an lttng-modules 2.1 quirk;
    see the corpus README), so for a trace whose `-o dummy` run fails and
    that has a single stream (which needs no muxing), babeltrace2 runs the
    same source and sink without the muxer (`babeltrace2 run` with
    src.ctf.fs -> sink.utils.dummy), which decodes every event; the
    results say which graph was used;
(a) ust: a real LTTng-UST trace (>= 200 MB by default) of the `jaeger_ust`
    test program (crates/ctf/tests/ust/jaeger_ust.c: nested span start/end
    events from two threads, vtid/vpid contexts), recorded with large
    sub-buffers in discard mode; the discarded-event count is reported;
    only with `--only ust` (it needs an LTTng session daemon);
(b) kernel: a kernel-like trace (kernel LTTng tracing is not available on
    the benchmark machines): the packets of the corpus trace bug446190
    (lttng-modules, 4 per-CPU streams) repeated until the trace is big
    enough (>= 250 MB by default), each copy shifted in time by a multiple
    of 2^32 ns beyond the end of the previous one, so every stream stays
    ordered (packet timestamps and the 64-bit timestamps of extended event
    headers are patched; compact 32-bit timestamps keep their low bits).
    Extended headers are found with deepspan's ctfdump example (`cargo
    build --release -p deepspan-ctf --examples`). `--kernel-trace DIR`
    times such a trace made before (e.g. kept with `--keep`).

Every trace's event counts per event name are checked against babeltrace2's
(its text output through the same graph as timed), once, before timing.

Each tool runs N times, interleaved; the figures are the median wall time
and the median CPU time (user + system, steadier on a shared machine), and
the ratios compare medians measured in this same run. `--baseline-bin DIR`
also times another build of deepspan (e.g. the previous commit's) in the
same rounds. Results go to stdout (a Markdown table on stderr) and
bench/out/ctf.json.

Needs babeltrace2 (and for `--only ust` lttng-tools, liblttng-ust-dev and a
C compiler), and the release binary (`cargo build --release -p deepspan`;
DEEPSPAN_BIN_DIR overrides the folder holding it). `--ust-trace DIR` times
an existing UST trace instead of recording one.
"""

import argparse
import collections
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("DEEPSPAN_BIN_DIR", ROOT / "target" / "release"))
DEEPSPAN = BIN / "deepspan"
# Another build of deepspan timed in the same rounds (`--baseline-bin`).
BASELINE = None
UST_SRC = ROOT / "crates" / "ctf" / "tests" / "ust"
CORPUS = ROOT.parent / "shared" / "testdata" / "kernel" / "ctf"
KERNEL_SAMPLE = CORPUS / "bug446190" / "trace"
# The small kernel traces of the corpus (see its README).
SMALL_TRACES = ["bug446190/trace", "synctraces/scp_src", "synctraces/scp_dest"]
# Bytes per iteration of jaeger_ust (2 threads x 6 events, vtid/vpid context).
UST_BYTES_PER_ITERATION = 2 * 6 * 51


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def run(cmd, **kw):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise SystemExit(f"`{' '.join(map(str, cmd))}` failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    return out.stdout


def measured(cmd):
    """Runs cmd (output discarded); returns (wall s, CPU s) from wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[0]} failed: {err.decode(errors='replace')[-2000:]}")
    return seconds, usage.ru_utime + usage.ru_stime


def trace_bytes(d):
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file() and p.parent.name != "index")


# ---------------------------------------------------------------- UST trace

def running_sessiond():
    for p in [Path("/var/run/lttng/lttng-sessiond.pid"), Path.home() / ".lttng" / "lttng-sessiond.pid"]:
        try:
            pid = int(p.read_text().strip())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            return pid
    return None


def record_ust(tmp, target_mb, subbuf_mb, num_subbuf, blocking):
    exe = Path(tmp) / "jaeger_ust"
    run(["cc", "-O2", f"-I{UST_SRC}", "-o", exe, UST_SRC / "jaeger_ust.c",
         "-llttng-ust", "-ldl", "-lpthread"])
    iterations = int(target_mb * 1e6 / UST_BYTES_PER_ITERATION * 1.05)
    own_sessiond = None
    if running_sessiond() is None:
        run(["lttng-sessiond", "--daemonize"])
        own_sessiond = running_sessiond()
    session = f"deepspan-ctf-bench-{os.getpid()}-{time.time_ns()}"
    out = Path(tmp) / "ust"
    created = False
    try:
        run(["lttng", "create", session, f"--output={out}"])
        created = True
        chan = ["lttng", "enable-channel", "-u", "-s", session, "bench", "--discard",
                f"--subbuf-size={subbuf_mb}M", f"--num-subbuf={num_subbuf}"]
        if blocking:
            chan.append("--blocking-timeout=inf")
        run(chan)
        run(["lttng", "enable-event", "-u", "-s", session, "-c", "bench", "jaeger_ust:*"])
        run(["lttng", "add-context", "-u", "-s", session, "-c", "bench", "-t", "vtid", "-t", "vpid"])
        run(["lttng", "start", session])
        env = dict(os.environ)
        if blocking:
            env["LTTNG_UST_ALLOW_BLOCKING"] = "1"
        log(f"recording jaeger_ust {iterations} iterations ({12 * iterations} events, "
            f"{subbuf_mb} MiB x {num_subbuf} sub-buffers per CPU{', blocking' if blocking else ''})")
        start = time.perf_counter()
        run([exe, str(iterations)], env=env)
        log(f"  program ran {time.perf_counter() - start:.1f} s")
        run(["lttng", "stop", session])
        run(["lttng", "destroy", session])
        created = False
    finally:
        if created:
            subprocess.run(["lttng", "destroy", session], capture_output=True)
        if own_sessiond is not None:
            try:
                os.kill(own_sessiond, 15)
            except ProcessLookupError:
                pass
    return out, 12 * iterations


# ------------------------------------------------------- kernel-like trace

def kernel_event_offsets(sample):
    """(file name, byte offset) of every event header of the sample, from
    deepspan's own reader (ctfdump prints them); used to find extended
    headers, whose 64-bit timestamps must be patched."""
    dump = BIN / "examples" / "ctfdump"
    if not dump.exists():
        return None
    offsets = {}
    proc = subprocess.run([dump, sample], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        at = line.rsplit(" @", 1)[-1]
        path, off = at.rsplit(":", 1)
        offsets.setdefault(Path(path).name, []).append(int(off))
    return offsets


def make_kernel_like(tmp, target_mb):
    """Repeats bug446190's packets with time shifts; None when impossible."""
    if not KERNEL_SAMPLE.is_dir():
        log(f"  {KERNEL_SAMPLE} missing: kernel-like case skipped")
        return None
    offsets = kernel_event_offsets(KERNEL_SAMPLE)
    if offsets is None:
        log(f"  {BIN}/examples/ctfdump missing (cargo build --release -p deepspan-ctf --examples): "
            "kernel-like case skipped")
        return None
    streams = sorted(p for p in KERNEL_SAMPLE.iterdir() if p.is_file() and p.name.startswith("channel"))
    data = {p.name: p.read_bytes() for p in streams}
    sample_bytes = sum(len(d) for d in data.values())
    # Layout of this trace (see its metadata; little endian, natural
    # alignment): packet header magic, uuid[16], stream_id; packet context
    # timestamp_begin at 24, timestamp_end at 32, content_size, packet_size;
    # event_header_large: uint16 id, 65535 = extended, then a struct
    # aligned on 8 bytes: uint32 id, uint64 timestamp (aligned 8);
    # alignment is relative to the packet start (packets start at page
    # boundaries in the files).
    first, last = None, None
    packets = {}
    for name, d in data.items():
        pk = []
        pos = 0
        while pos < len(d):
            magic, = struct.unpack_from("<I", d, pos)
            assert magic == 0xC1FC1FC1, (name, pos)
            tb, te, content, size = struct.unpack_from("<QQQQ", d, pos + 24)
            pk.append((pos, size // 8))
            first = tb if first is None else min(first, tb)
            last = te if last is None else max(last, te)
            pos += size // 8
        packets[name] = pk
    step = ((last - first) // (1 << 32) + 2) * (1 << 32)
    copies = max(1, int(target_mb * 1e6 / sample_bytes + 0.999))
    out = Path(tmp) / "kernel"
    out.mkdir()
    shutil.copy(KERNEL_SAMPLE / "metadata", out / "metadata")
    extended = 0
    for name, d in data.items():
        ext = []
        for o in offsets.get(name, []):
            if struct.unpack_from("<H", d, o)[0] == 0xFFFF:
                # The extended struct is aligned on its uint64 (8 bytes).
                ext.append((o + 2 + 7) // 8 * 8 + 8)
        extended += len(ext)
        with open(out / name, "wb") as f:
            for k in range(copies):
                shift = k * step
                b = bytearray(d)
                for pos, _ in packets[name]:
                    for field in (24, 32):
                        v, = struct.unpack_from("<Q", b, pos + field)
                        struct.pack_into("<Q", b, pos + field, v + shift)
                for o in ext:
                    v, = struct.unpack_from("<Q", b, o)
                    struct.pack_into("<Q", b, o, v + shift)
                f.write(b)
    log(f"  kernel-like trace: {copies} copies of {sample_bytes} bytes, "
        f"{extended} extended headers patched per copy")
    return out


# ---------------------------------------------------------------- timing

def summary(trace):
    return json.loads(run([DEEPSPAN, "decode", trace, "--format", "json"]))


def stream_files(trace):
    """The data stream files of a CTF trace folder (one trace)."""
    return [p for p in Path(trace).iterdir()
            if p.is_file() and p.name != "metadata" and not p.name.startswith(".")]


def babeltrace2_graph(trace):
    """How babeltrace2 reads `trace`: ("muxer", None) when `-o dummy`
    decodes it, else ("no muxer", reason) when it has one stream (nothing
    to merge): the source straight into the sink."""
    out = subprocess.run(["babeltrace2", str(trace), "-o", "dummy"], capture_output=True, text=True)
    if out.returncode == 0:
        return "muxer", None
    if (Path(trace) / "metadata").is_file() and len(stream_files(trace)) == 1:
        # The first error logged: `MM-DD hh:mm:ss pid tid E COMPONENT fn@file [name] message: details`.
        lines = out.stderr.splitlines()
        first = next((l for l in lines if " E " in l), lines[0] if lines else "failed")
        reason = first.split("] ", 1)[-1].split(": ", 1)[0]
        return "no muxer", f"`babeltrace2 -o dummy` failed: {reason}"
    raise SystemExit(f"babeltrace2 cannot decode {trace}:\n{out.stderr[-2000:]}")


def babeltrace2_cmd(trace, graph, sink):
    """babeltrace2 reading `trace` into `sink` (a component class)."""
    if graph == "muxer":
        return ["babeltrace2", trace, "-c", sink]
    return ["babeltrace2", "run", "--component=src:src.ctf.fs",
            f"--params=inputs=[{json.dumps(str(trace))}]",
            f"--component=sink:{sink}", "--connect=src:sink"]


def babeltrace2_names(trace, graph):
    """Events per event name, from babeltrace2's text output: each line is
    `[time] (+delta) [hostname] NAME: {...}`; the name is the first word
    after the time that ends with a colon (names may hold colons too)."""
    cmd = babeltrace2_cmd(trace, graph, "sink.text.pretty")
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    names = collections.Counter()
    for line in proc.stdout:
        for word in line.split("] ", 1)[-1].split(" "):
            if word.endswith(":"):
                names[word[:-1]] += 1
                break
    err = proc.stderr.read()
    if proc.wait() != 0:
        raise SystemExit(f"babeltrace2 text output of {trace} failed:\n{err[-2000:]}")
    return dict(names)


def throughput(trace, repeats):
    size = trace_bytes(trace)
    graph, why = babeltrace2_graph(trace)
    doc = summary(trace)  # also warms the page cache
    events = doc["events"]
    bt_names = babeltrace2_names(trace, graph)
    bt_events = sum(bt_names.values())
    same_names = bt_names == doc["by_name"]
    if not same_names:
        diff = {k: (doc["by_name"].get(k), bt_names.get(k))
                for k in set(bt_names) | set(doc["by_name"]) if doc["by_name"].get(k) != bt_names.get(k)}
        log(f"  WARNING: events per name differ (deepspan, babeltrace2): {diff}")
    tools = {
        # Streams decoded on all CPUs (counting needs no time order) ...
        "deepspan": [DEEPSPAN, "decode", trace, "--format", "json"],
        # ... and on one thread, merged in time order as babeltrace2 does.
        "deepspan_merged_1_thread": [DEEPSPAN, "decode", trace, "--format", "json", "--threads", "1"],
        "babeltrace2_dummy": (["babeltrace2", trace, "-o", "dummy"] if graph == "muxer"
                              else babeltrace2_cmd(trace, graph, "sink.utils.dummy")),
    }
    if BASELINE is not None:
        tools["deepspan_baseline"] = [BASELINE, "decode", trace, "--format", "json"]
    wall = {k: [] for k in tools}
    cpu = {k: [] for k in tools}
    for i in range(repeats):
        for k, cmd in tools.items():
            w, c = measured(cmd)
            wall[k].append(w)
            cpu[k].append(c)
        if repeats <= 10 or (i + 1) % 10 == 0:
            log(f"  run {i + 1}: " + ", ".join(f"{k} {wall[k][-1]:.3f} s ({cpu[k][-1]:.3f} s CPU)"
                                               for k in tools))
    res = {
        "trace": str(trace),
        "trace_bytes": size,
        "events": events,
        "babeltrace2_events": bt_events,
        "babeltrace2_graph": graph,
        "same_events_per_name": same_names,
        "lost_events": doc["lost_events"],
        "by_name": doc["by_name"],
        "repeats": repeats,
    }
    if why:
        res["babeltrace2_graph_why"] = why
    for k in tools:
        w, c = statistics.median(wall[k]), statistics.median(cpu[k])
        res[k] = {
            "wall_s": w, "cpu_s": c, "min_wall_s": min(wall[k]), "min_cpu_s": min(cpu[k]),
            "mb_per_s": size / w / 1e6, "events_per_s": events / c,
            "ns_per_event": c / events * 1e9,
        }
    bt = res["babeltrace2_dummy"]
    res["speedup_vs_babeltrace2_dummy_wall"] = bt["wall_s"] / res["deepspan"]["wall_s"]
    res["speedup_vs_babeltrace2_dummy"] = bt["cpu_s"] / res["deepspan"]["cpu_s"]
    one = res["deepspan_merged_1_thread"]
    res["merged_1_thread_speedup_vs_babeltrace2_dummy"] = bt["cpu_s"] / one["cpu_s"]
    res["merged_1_thread_speedup_vs_babeltrace2_dummy_wall"] = bt["wall_s"] / one["wall_s"]
    if BASELINE is not None:
        base = res["deepspan_baseline"]
        res["baseline_speedup_vs_babeltrace2_dummy_wall"] = bt["wall_s"] / base["wall_s"]
        res["baseline_speedup_vs_babeltrace2_dummy"] = bt["cpu_s"] / base["cpu_s"]
    return res


def table(results):
    """The figures as a Markdown table (bench/README.md's CTF section)."""
    ms = lambda s: f"{s * 1e3:.1f}" if s < 1 else f"{s * 1e3:.0f}"
    base = any("deepspan_baseline" in r for _, r in results)
    rows = ["| trace | MB | events | deepspan wall / CPU ms | 1 thread, merged | "
            "babeltrace2 -o dummy | × wall | × CPU | 1 thread × wall / CPU |"
            + (" baseline wall / CPU ms | baseline × wall / CPU |" if base else ""),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if base else "")]
    for name, r in results:
        d, one, bt = r["deepspan"], r["deepspan_merged_1_thread"], r["babeltrace2_dummy"]
        bt_note = "" if r["babeltrace2_graph"] == "muxer" else " (no muxer)"
        check = "" if r["same_events_per_name"] else " (COUNTS DIFFER)"
        rows.append(
            f"| {name} | {r['trace_bytes'] / 1e6:.1f} | {r['events']}{check} | "
            f"{ms(d['wall_s'])} / {ms(d['cpu_s'])} | {ms(one['wall_s'])} / {ms(one['cpu_s'])} | "
            f"{ms(bt['wall_s'])} / {ms(bt['cpu_s'])}{bt_note} | "
            f"{r['speedup_vs_babeltrace2_dummy_wall']:.1f} | {r['speedup_vs_babeltrace2_dummy']:.1f} | "
            f"{r['merged_1_thread_speedup_vs_babeltrace2_dummy_wall']:.1f} / "
            f"{r['merged_1_thread_speedup_vs_babeltrace2_dummy']:.1f} |"
            + (f" {ms(r['deepspan_baseline']['wall_s'])} / {ms(r['deepspan_baseline']['cpu_s'])} | "
               f"{r['baseline_speedup_vs_babeltrace2_dummy_wall']:.1f} / "
               f"{r['baseline_speedup_vs_babeltrace2_dummy']:.1f} |" if base else ""))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace-mb", type=int, default=250, help="size of each benchmark trace")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each tool on the large traces")
    ap.add_argument("--small-repeats", type=int, default=21, help="runs of each tool on the small traces")
    ap.add_argument("--subbuf-mb", type=int, default=8, help="UST sub-buffer size (MiB)")
    ap.add_argument("--num-subbuf", type=int, default=16, help="UST sub-buffers per CPU")
    ap.add_argument("--blocking", action="store_true",
                    help="UST channel with an infinite blocking timeout: nothing is discarded")
    ap.add_argument("--keep", metavar="DIR", help="keep the traces made in DIR")
    ap.add_argument("--ust-trace", metavar="DIR",
                    help="time this UST trace (e.g. one kept by --keep) instead of recording one")
    ap.add_argument("--kernel-trace", metavar="DIR",
                    help="time this kernel-like trace (e.g. one kept by --keep) instead of making one")
    ap.add_argument("--baseline-bin", metavar="DIR",
                    help="also time the deepspan binary in DIR (e.g. a build of the previous commit) "
                         "in the same rounds")
    ap.add_argument("--only", choices=["small", "ust", "kernel"], action="append",
                    help="cases to run (repeatable); default: small and kernel")
    args = ap.parse_args()
    global BASELINE
    if args.baseline_bin:
        BASELINE = Path(args.baseline_bin) / "deepspan"
        if not BASELINE.exists():
            raise SystemExit(f"{BASELINE} missing")
    if not DEEPSPAN.exists():
        raise SystemExit(f"{DEEPSPAN} missing: run `cargo build --release -p deepspan` first")
    only = set(args.only or ["small", "kernel"])
    needed = ["babeltrace2"] + (["lttng", "lttng-sessiond", "cc"] if "ust" in only and not args.ust_trace else [])
    for tool in needed:
        if not shutil.which(tool):
            raise SystemExit(f"{tool} missing: run `make deps` first")
    results = {"host_cpus": os.cpu_count(), "kernel": os.uname().release,
               "babeltrace2": run(["babeltrace2", "--version"]).splitlines()[0]}
    rows = []
    parent = args.keep or "/var/tmp"
    Path(parent).mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix="deepspan-ctf-bench-")
    try:
        if "small" in only:
            results["small"] = {}
            for rel in SMALL_TRACES:
                trace = CORPUS / rel
                if not trace.is_dir():
                    log(f"(s) {trace} missing: skipped")
                    continue
                log(f"(s) {rel}")
                res = throughput(trace, args.small_repeats)
                results["small"][rel] = res
                rows.append((rel, res))
        if "ust" in only and args.ust_trace:
            log(f"(a) LTTng-UST trace {args.ust_trace}")
            results["ust"] = throughput(Path(args.ust_trace), args.repeats)
            rows.append(("ust", results["ust"]))
        elif "ust" in only:
            log("(a) LTTng-UST trace (jaeger_ust)")
            trace, emitted = record_ust(tmp, args.trace_mb, args.subbuf_mb, args.num_subbuf, args.blocking)
            res = throughput(trace, args.repeats)
            res["events_emitted"] = emitted
            res["recording"] = {"subbuf_mb": args.subbuf_mb, "num_subbuf": args.num_subbuf,
                                "blocking": args.blocking}
            results["ust"] = res
            rows.append(("ust", res))
        if "kernel" in only:
            log("(b) kernel-like trace (bug446190 packets repeated)")
            trace = Path(args.kernel_trace) if args.kernel_trace else make_kernel_like(tmp, args.trace_mb)
            if trace is not None:
                results["kernel_like"] = throughput(trace, args.repeats)
                rows.append(("kernel-like", results["kernel_like"]))
    finally:
        if args.keep:
            log(f"traces kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    results["table"] = table(rows)
    (out / "ctf.json").write_text(json.dumps(results, indent=2))
    log(results["table"])
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
