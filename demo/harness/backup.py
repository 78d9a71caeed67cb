"""A "backup" job that floods the disk: several threads read the volume it
backs up in large blocks with O_DIRECT (as backup tools do, so as not to
evict everyone's page cache), for --seconds. The reads are issued from this
process, so the disk queue's requests carry its pid. (Reads, not writes:
this kind of virtual disk absorbs write floods, while reads queue up.)"""

import argparse
import mmap
import os
import threading
import time

from shop.telemetry import set_thread_name

VOLUME_BLOCK = 4 << 20


def make_volume(path, megabytes):
    """Writes the volume to back up, straight to the disk."""
    buf = mmap.mmap(-1, VOLUME_BLOCK)
    buf.write(os.urandom(VOLUME_BLOCK))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    try:
        for i in range(megabytes * (1 << 20) // VOLUME_BLOCK):
            os.pwrite(fd, buf, i * VOLUME_BLOCK)
        os.fsync(fd)
    finally:
        os.close(fd)


def reader(fd, block, slot, slots, deadline, blocks):
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    i = slot
    while time.monotonic() < deadline:
        os.preadv(fd, [buf], (i % blocks) * block)
        i += slots


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--volume", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--block-mb", type=int, default=4)
    args = p.parse_args()
    set_thread_name("backup")
    block = args.block_mb << 20
    fd = os.open(args.volume, os.O_RDONLY | os.O_DIRECT)
    blocks = os.fstat(fd).st_size // block
    if blocks == 0:
        raise SystemExit(f"{args.volume} is smaller than one {args.block_mb} MiB block")
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=reader, args=(fd, block, s, args.threads, deadline, blocks))
               for s in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(fd)


if __name__ == "__main__":
    main()
