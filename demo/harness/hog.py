"""A CPU-bound batch job ("encoder"): spins for --seconds. The demo pins it
to the CPUs of the service it competes with."""

import argparse
import time

from shop.telemetry import set_thread_name


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, required=True)
    args = p.parse_args()
    set_thread_name("encoder")
    deadline = time.monotonic() + args.seconds
    x = 0
    while time.monotonic() < deadline:
        for i in range(10_000):
            x = (x * 31 + i) % 1_000_003


if __name__ == "__main__":
    main()
