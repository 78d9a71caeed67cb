"""Runs one service of the shop: `python3 -m shop.service NAME [options]`.

Every service prints `READY <port>` once it listens, serves until SIGTERM,
then flushes its spans. Ids travel in query strings (`/stock?id=3`), so a
server span's name (`GET /stock`) is its operation."""

import argparse
import ctypes
import hashlib
import os
import threading
import time

from opentelemetry import trace

from shop import telemetry, web
from shop.web import HttpError, int_arg


def front(args, provider):
    import requests
    from deepspan_otel import dcpt
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    downstream = {"inventory": args.inventory, "pricing": args.pricing, "media": args.media}
    by_base = {url: name for name, url in downstream.items()}

    def name_client_span(span, request):
        # The instrumentation names client spans by method only; name them
        # by the service and route they call, which is what a reader wants.
        base, _, rest = request.url.partition("://")[2].partition("/")
        service = by_base.get(f"http://{base}", base)
        span.update_name(f"{request.method} {service} /{rest.split('?')[0]}")

    RequestsInstrumentor().instrument(tracer_provider=provider, request_hook=name_client_span)
    # Calls made for a request whose caller asked for its critical path
    # ask their callees too, and merge the paths they get back.
    dcpt.instrument_requests()

    def call(method, service, path):
        r = requests.request(method, downstream[service] + path, timeout=60)
        if r.status_code != 200:
            raise HttpError(500, f"{service} answered {r.status_code}: {r.text[:200]}")
        return r

    router = web.Router()

    @router.route("GET", "/product")
    def product(q):
        item = int_arg(q, "id")
        stock = call("GET", "inventory", f"/stock?id={item}").json()
        price = call("GET", "pricing", f"/price?id={item}").json()
        image = call("GET", "media", f"/image?id={item}").content
        return {"id": item, "stock": stock["stock"], "price": price["price"], "image_bytes": len(image)}

    @router.route("POST", "/checkout")
    def checkout(q):
        item = int_arg(q, "id")
        price = call("GET", "pricing", f"/price?id={item}").json()
        order = call("POST", "inventory", f"/reserve?id={item}").json()
        return {"order": order["order"], "price": price["price"]}

    @router.route("GET", "/image")
    def image(q):
        return call("GET", "media", f"/image?id={int_arg(q, 'id')}").content

    return router, {}


def inventory(args, provider):
    import psycopg2
    import psycopg2.pool
    from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor

    Psycopg2Instrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    pool = psycopg2.pool.ThreadedConnectionPool(8, 32, args.dsn)

    def transaction(work):
        conn = pool.getconn()
        try:
            with conn, conn.cursor() as cur:  # commits, or rolls back on error
                return work(cur)
        finally:
            pool.putconn(conn)

    router = web.Router()

    @router.route("GET", "/stock")
    def stock(q):
        item = int_arg(q, "id")

        def work(cur):
            cur.execute("SELECT stock, price_cents FROM items WHERE id = %s", (item,))
            row = cur.fetchone()
            if row is None:
                raise HttpError(404, f"no item {item}")
            return {"id": item, "stock": row[0], "price_cents": row[1]}

        return transaction(work)

    @router.route("POST", "/reserve")
    def reserve(q):
        item = int_arg(q, "id")

        def work(cur):
            cur.execute("UPDATE items SET stock = stock - 1 WHERE id = %s RETURNING stock", (item,))
            if cur.fetchone() is None:
                raise HttpError(404, f"no item {item}")
            cur.execute("INSERT INTO orders (item_id) VALUES (%s) RETURNING id", (item,))
            return {"order": cur.fetchone()[0]}

        return transaction(work)

    @router.route("POST", "/restock")
    def restock(q):
        # An operator's restock: the delivery is audited (hold_ms of CPU
        # work) inside the transaction, after the UPDATE, so the row stays
        # locked and concurrent reservations of the item wait.
        item, hold_ms = int_arg(q, "id"), int_arg(q, "hold_ms")

        def work(cur):
            cur.execute("SELECT pg_backend_pid()")
            web.record_role("holder", pg_backend_pid=cur.fetchone()[0], item=item)
            cur.execute("UPDATE items SET stock = stock + 100 WHERE id = %s", (item,))
            checksum_for(hold_ms)
            return {"id": item, "restocked": 100}

        return transaction(work)

    return router, {}


def pricing(args, provider):
    router = web.Router()
    rules = [(i * 7919) % 1000 for i in range(997)]

    @router.route("GET", "/price")
    def price(q):
        item = int_arg(q, "id")
        # CPU-bound: apply the pricing rules (a fixed amount of work).
        total = item * 100
        for _ in range(args.rounds):
            for r in rules:
                total = (total * 31 + r) % 1_000_003
        return {"id": item, "price": 100 + total % 900}

    # One request at a time, like a synchronous worker process.
    return router, {"threaded": False}


def media(args, provider):
    index_lock = threading.Lock()
    index = {}

    def scan():
        found = {}
        for name in sorted(os.listdir(args.images)):
            if name.startswith("img-") and name.endswith(".bin"):
                found[int(name[4:-4])] = os.path.join(args.images, name)
        return found

    index.update(scan())
    router = web.Router()

    @router.route("GET", "/image")
    def image(q):
        item = int_arg(q, "id")
        with index_lock:
            path = index.get(item % max(len(index), 1))
        if path is None:
            raise HttpError(404, f"no image for item {item}")
        with open(path, "rb", buffering=0) as f:
            data = f.read()
            # Images are large and rarely read twice: leave the page cache
            # to others (so every read goes to the disk).
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return data

    @router.route("POST", "/reindex")
    def reindex(q):
        # An operator's re-index: the index stays locked while the images'
        # checksums are verified (hold_ms of CPU work), so image requests
        # wait for the lock.
        hold_ms = int_arg(q, "hold_ms")
        web.record_role("holder", tid=threading.get_native_id())
        with index_lock:
            fresh = scan()
            checksum_for(hold_ms)
            index.clear()
            index.update(fresh)
        return {"images": len(fresh), "digest": hashlib.sha1(repr(sorted(fresh)).encode()).hexdigest()}

    options = {}
    if args.netns:
        options["bind"] = lambda make: in_netns(args.netns, make)
        options["host"] = args.host
    return router, options


def checksum_for(ms):
    """CPU-bound work for `ms` milliseconds: SHA-256 over 8 MiB blocks
    (hashlib releases the GIL while it hashes, so the process's other
    threads are not held up by the GIL, only by what the caller locked).
    A time budget, not an amount, so the fault lasts as long on any CPU."""
    block = bytes(8 << 20)
    deadline = time.monotonic() + ms / 1000
    digest = b""
    while time.monotonic() < deadline:
        digest = hashlib.sha256(block).digest()
    return digest.hex()


CLONE_NEWNET = 0x40000000


def in_netns(netns_path, make):
    """Runs `make` (which opens the listening socket) in the network
    namespace at `netns_path`, then comes back: the socket keeps its
    namespace, everything else (the span exporter) stays in ours."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns_path})")
        try:
            return make()
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace")
    finally:
        os.close(own)
        os.close(target)


SERVICES = {"front": front, "inventory": inventory, "pricing": pricing, "media": media}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("service", choices=sorted(SERVICES))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--inventory", help="front: base URL of inventory")
    p.add_argument("--pricing", help="front: base URL of pricing")
    p.add_argument("--media", help="front: base URL of media")
    p.add_argument("--dsn", help="inventory: libpq connection string")
    p.add_argument("--rounds", type=int, default=40, help="pricing: work per request")
    p.add_argument("--images", help="media: folder of img-N.bin files")
    p.add_argument("--netns", help="media: listen in this network namespace (a /run/netns path)")
    args = p.parse_args()
    telemetry.set_thread_name(args.service)
    provider = telemetry.setup(args.service)
    router, options = SERVICES[args.service](args, provider)
    options.setdefault("host", args.host)
    web.serve(router, provider, args.service, port=args.port, **options)


if __name__ == "__main__":
    main()
