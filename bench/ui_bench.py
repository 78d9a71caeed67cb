#!/usr/bin/env python3
"""Web UI benchmark (run by hand; never a test): time to first render of
the request page and frame times while panning, on a run with >= 100 000
thread-state intervals.

The run is recorded here: the context-switch-heavy workload
(`deepspan-workload pingpong ROUNDS`) under `deepspan record`, with
synthetic requests covering its two threads' time imported as spans (as
bench/analyze_bench.py does), then `deepspan analyze`. `deepspan ui`
serves it and bench/ui_bench.mjs drives headless Debian Chromium
(/usr/bin/chromium, through playwright-core from ui/node_modules):

- start-up: from starting `deepspan ui` to its URL (the server ready),
  and the server's resident memory then, after the pages below, and at
  its peak (VmRSS, VmHWM);
- first page: navigation to the server's root until the requests list
  is drawn, first on the fresh server (cold) and then again;
- request page: navigation to the slowest request until its kernel
  critical path and summary are drawn (median of several loads);
- panning: a mouse drag across the kernel critical path and across the
  resources view's threads (the whole recording in view: every interval
  of the run behind the picture), recording each canvas draw's time and
  the browser's frame intervals (requestAnimationFrame) during the drag.

Results go to stdout and bench/out/ui.json.

  python3 bench/ui_bench.py [--rounds 150000] [--requests 12] [--run EXISTING_RUN]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze_bench import DEEPSPAN, ROOT, WORKLOAD, synthetic_spans  # noqa: E402


def record(run_dir, rounds):
    """pingpong under `deepspan record`; the OTLP receiver on free ports,
    so that other recordings on the machine do not get in the way."""
    out = subprocess.run(
        [DEEPSPAN, "record", "-o", run_dir, "--buffer-mb", "256", "--otlp-grpc-port", "0",
         "--otlp-http-port", "0", "--", WORKLOAD, "pingpong", str(rounds)],
        check=True, capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def memory(pid):
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=150_000, help="pingpong rounds to record")
    ap.add_argument("--requests", type=int, default=12, help="synthetic requests over the recording")
    ap.add_argument("--run", help="benchmark an existing analysed run instead")
    ap.add_argument("--loads", type=int, default=5, help="request page loads to time")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(dir="/var/tmp", prefix="deepspan-ui-bench-")
    run = args.run
    if not run:
        run = os.path.join(tmp.name, "run")
        log(f"recording pingpong {args.rounds} …")
        workload = record(run, args.rounds)
        synthetic_spans(run, workload, args.requests)
        log("analysing …")
        subprocess.run([DEEPSPAN, "analyze", run], check=True, capture_output=True)

    server = subprocess.Popen([DEEPSPAN, "ui", run, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = time.perf_counter()
        url = server.stdout.readline().strip()
        load_s = time.perf_counter() - started
        if not url.startswith("http://"):
            raise SystemExit(f"deepspan ui did not start: {server.stderr.read()}")
        loaded = server.stderr.readline().strip()
        log(f"{loaded} (server ready in {load_s:.2f} s)")
        rss_ready = memory(server.pid)
        info = json.loads(subprocess.run(["curl", "-s", url + "api/run"], capture_output=True, text=True, check=True).stdout)
        slowest = json.loads(subprocess.run(["curl", "-s", url + "api/requests?limit=1"], capture_output=True, text=True, check=True).stdout)
        req = slowest["requests"][0]
        detail = json.loads(subprocess.run(["curl", "-s", url + f"api/requests/{req['span_id']}"], capture_output=True, text=True, check=True).stdout)
        out = subprocess.run(
            ["node", str(ROOT / "bench/ui_bench.mjs"), url, req["span_id"], str(args.loads)],
            capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"ui_bench.mjs failed:\n{out.stdout}\n{out.stderr}")
        browser = json.loads(out.stdout.strip().splitlines()[-1])
        rss_after = memory(server.pid)
    finally:
        server.terminate()
        server.wait()

    result = {
        "run": {"intervals": info["intervals"], "threads": info["threads"], "requests": info["requests"],
                "slowest_request_pieces": detail["pieces"], "server_load_s": round(load_s, 3),
                "server_rss_ready_mib": rss_ready["VmRSS"], "server_rss_after_mib": rss_after["VmRSS"],
                "server_rss_peak_mib": rss_after["VmHWM"]},
        **browser,
    }
    out_dir = ROOT / "bench/out"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ui.json").write_text(json.dumps(result, indent=2))
    r = result["run"]
    print(f"run: {r['intervals']} thread-state intervals, {r['threads']} threads, {r['requests']} requests; "
          f"slowest request's path {r['slowest_request_pieces']} pieces; server loads it in {r['server_load_s']} s")
    print(f"server memory: {r['server_rss_ready_mib']:.0f} MiB when ready, {r['server_rss_after_mib']:.0f} MiB after "
          f"the pages, peak {r['server_rss_peak_mib']:.0f} MiB")
    fp = result["first_page"]
    print(f"first page (requests list drawn): cold {fp['cold_ms']} ms, so {r['server_load_s'] * 1000 + fp['cold_ms']:.0f} ms "
          f"from starting the server; median {fp['median_ms']} ms")
    fr = result["request_page"]
    print(f"request page, first render (navigation → path and summary drawn): median {fr['median_ms']:.0f} ms "
          f"(min {fr['min_ms']:.0f}, max {fr['max_ms']:.0f}; {len(fr['samples_ms'])} loads)")
    for name in ("pan_request_path", "pan_resources"):
        p = result[name]
        print(f"{name}: {p['draws']} draws, draw time median {p['draw_median_ms']:.2f} ms, p95 {p['draw_p95_ms']:.2f} ms, "
              f"max {p['draw_max_ms']:.2f} ms; frame interval median {p['frame_median_ms']:.1f} ms, p95 {p['frame_p95_ms']:.1f} ms; "
              f"intervals behind the view {p.get('intervals_in_view', '?')}, drawn {p.get('drawn', '?')}")


if __name__ == "__main__":
    main()
