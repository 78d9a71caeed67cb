"""A CPU-bound batch job ("encoder"): spins for --seconds, in --processes
processes (this one and its children). The demo pins it to the CPUs of the
service it competes with."""

import argparse
import os
import time

from shop.telemetry import set_thread_name


def spin(seconds):
    set_thread_name("encoder")
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        for i in range(10_000):
            x = (x * 31 + i) % 1_000_003


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--processes", type=int, default=1)
    args = p.parse_args()
    children = []
    for _ in range(args.processes - 1):
        pid = os.fork()
        if pid == 0:
            spin(args.seconds)
            os._exit(0)
        children.append(pid)
    spin(args.seconds)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise SystemExit(f"encoders {failed} failed")


if __name__ == "__main__":
    main()
