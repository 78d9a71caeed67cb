"""The shop's users: a fixed request mix sent to the front service by a few
concurrent clients at a steady pace, for a given time.

`python3 -m shop.loadgen URL --seconds S` prints one JSON line of counts and
latencies at the end. It is not instrumented: requests start at the front.

With `--dcpt FILE` every request asks for its in-band critical path
(`deepspan-dcpt: 1`, DCPT of Lopez et al.) and FILE gets one JSON line per
request: method, path, status, CLOCK_MONOTONIC start and end (ns) and the
decoded hops in preorder ({service, operation, depth, self_us, total_us,
wire_us}, front first, wire_us the time between the hop's caller and it or
null; null when the reply had no valid path)."""

import argparse
import http.client
import json
import threading
import time
from urllib.parse import urlsplit

from deepspan_otel import dcpt

from shop import telemetry

# Item 1 is the best seller: it comes up in every other request.
ITEMS = [1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 7]
MIX = [
    ("GET", "/product"),
    ("GET", "/image"),
    ("POST", "/checkout"),
    ("GET", "/product"),
    ("POST", "/checkout"),
]


def decoded_hops(value):
    """The hops of a `deepspan-dcpt-path` value, or None without a valid one."""
    if value is None:
        return None
    try:
        path = dcpt.decode(value)
    except dcpt.DcptError:
        return None
    return [
        {
            "service": h.service,
            "operation": h.operation,
            "depth": h.depth,
            "self_us": h.self_us,
            "total_us": h.total_us,
            "wire_us": path.wire_us(i),
        }
        for i, h in enumerate(path.hops)
    ]


def client(url, worker, deadline, interval, stats, lock, paths=None):
    parts = urlsplit(url)
    i = worker * 3  # clients start at different places of the mix
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        method, path = MIX[i % len(MIX)]
        item = ITEMS[i % len(ITEMS)]
        i += 1
        started = time.monotonic()
        started_ns = time.monotonic_ns()
        status = None
        path_value = None
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            headers = {dcpt.REQUEST_HEADER: "1"} if paths is not None else {}
            conn.request(method, f"{path}?id={item}", headers=headers)
            resp = conn.getresponse()
            resp.read()
            status = resp.status
            path_value = resp.getheader(dcpt.REPLY_HEADER)
            conn.close()
        except OSError:
            status = None
        took = time.monotonic() - started
        ended_ns = time.monotonic_ns()
        with lock:
            stats["requests"] += 1
            if status != 200:
                stats["errors"] += 1
            stats["latencies"].append(took)
            if paths is not None:
                line = {"method": method, "path": path, "status": status, "start_ns": started_ns,
                        "end_ns": ended_ns, "hops": decoded_hops(path_value)}
                paths.write(json.dumps(line) + "\n")
        next_at += interval
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.monotonic()  # late: do not burst to catch up


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("url")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.15, help="seconds between a client's requests")
    p.add_argument("--dcpt", metavar="FILE", help="ask for each request's in-band critical path; JSON lines to FILE")
    args = p.parse_args()
    telemetry.set_thread_name("loadgen")
    stats = {"requests": 0, "errors": 0, "latencies": []}
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds
    paths = open(args.dcpt, "w") if args.dcpt else None
    threads = [
        threading.Thread(target=client, args=(args.url, w, deadline, args.interval, stats, lock, paths))
        for w in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if paths is not None:
        paths.close()
    lat = sorted(stats.pop("latencies")) or [0.0]
    stats["p50_ms"] = round(lat[len(lat) // 2] * 1000, 1)
    stats["p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1)
    stats["max_ms"] = round(lat[-1] * 1000, 1)
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
