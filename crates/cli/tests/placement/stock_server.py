"""A Python HTTP server with stock OpenTelemetry only (no deepspan_otel):
the placement test records it and checks that `deepspan analyze` finds the
thread that served each request from the kernel trace alone.

    stock_server.py OUT [REQUESTS] [CLIENTS] [threads|asyncio|waitress|pool]

Serves on 127.0.0.1 (`threads`: ThreadingHTTPServer, a thread per
connection; `asyncio`: one event loop thread serving all connections,
requests interleaved; `waitress`: the waitress WSGI server, whose main
thread accepts and reads each request and hands it through a queue to one
of its worker threads, which runs the application; `pool`: a hand-written
acceptor thread that accepts and reads each request and hands it through
`concurrent.futures.ThreadPoolExecutor`'s queue to one of 4 workers, which
makes the span, waits 20 ms and answers), one server span per
request, exported over OTLP/HTTP to
OTEL_EXPORTER_OTLP_ENDPOINT (what `deepspan record` gives its command).
A client process sends REQUESTS requests from CLIENTS threads (`pool`:
CLIENTS client processes of one thread each, so that no client waits for
its own interpreter lock). The oracle, OUT/served.jsonl, is written by the
server itself: each request's span id with `threading.get_native_id()` of
the thread that served it (`pool`: and the request's number, and when its
worker began and ended it, inside its span). The clients
write OUT/clients.jsonl: each request's number, and when (CLOCK_MONOTONIC,
the kernel trace's clock) the client began it, had sent it, and had its
whole answer."""

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

# Requests first, first + stride, … below n, from `threads` threads of
# this process; each one's times appended to the file `times`.
CLIENT = r"""
import http.client, json, sys, threading, time
port, n, first, stride, threads = (int(a) for a in sys.argv[1:6])
times = sys.argv[6]
done, lock = [], threading.Lock()
def run(k):
    for i in range(k, n, stride):
        began = time.monotonic_ns()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", f"/work?i={i}")
        sent = time.monotonic_ns()
        r = c.getresponse(); r.read(); c.close()
        with lock:
            done.append({"i": i, "began_ns": began, "sent_ns": sent, "done_ns": time.monotonic_ns()})
ts = [threading.Thread(target=run, args=(first + k,)) for k in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
with open(times, "a") as f:
    f.write("".join(json.dumps(d) + "\n" for d in done))
"""


def client_args(port, requests, clients, out):
    """The client process's command: `clients` threads."""
    times = os.path.join(out, "clients.jsonl")
    return [sys.executable, "-c", CLIENT, str(port), str(requests), "0", str(clients), str(clients), times]


def run_client_processes(port, requests, clients, out):
    """`clients` client processes of one thread each; the worst exit code."""
    times = os.path.join(out, "clients.jsonl")
    procs = [
        subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(requests), str(k), str(clients), "1", times])
        for k in range(clients)
    ]
    return max(p.wait(timeout=120) for p in procs)


def serve_asyncio(tracer, served, requests, clients, out):
    """One event loop: each request reads its line and headers, sleeps 5 ms
    (other requests run meanwhile), does some CPU work and answers."""

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        port = writer.get_extra_info("sockname")[1]
        with tracer.start_as_current_span(
            "GET /work", kind=SpanKind.SERVER, attributes={"http.request.method": "GET", "server.port": port}
        ) as span:
            await asyncio.sleep(0.005)
            digest = hashlib.sha256(b"x" * 200_000).hexdigest()
            body = json.dumps({"digest": digest}).encode()
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            ctx = span.get_span_context()
            served.append({"span_id": format(ctx.span_id, "016x"), "tid": threading.get_native_id(), "pid": os.getpid()})
        writer.close()

    async def run():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await asyncio.create_subprocess_exec(*client_args(port, requests, clients, out))
        code = await client.wait()
        server.close()
        await server.wait_closed()
        return code

    return asyncio.run(run())


def serve_waitress(provider, served, requests, clients, out):
    """waitress with 4 worker threads; the span is the stock WSGI
    instrumentation's (opentelemetry-instrumentation-wsgi), made on the
    worker thread that runs the application. Returns the client's exit code."""
    import logging

    import waitress

    # "Task queue depth is N" warnings: the queue is the point here.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware

    lock = threading.Lock()

    def app(environ, start_response):
        digest = hashlib.sha256(b"x" * 200_000).hexdigest()
        time.sleep(0.002)
        body = json.dumps({"digest": digest, "n": sum(range(20_000))}).encode()
        ctx = trace.get_current_span().get_span_context()
        with lock:
            served.append({"span_id": format(ctx.span_id, "016x"), "tid": threading.get_native_id(), "pid": os.getpid()})
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    server = waitress.create_server(
        OpenTelemetryMiddleware(app, tracer_provider=provider), host="127.0.0.1", port=0, threads=4
    )
    port = server.socket.getsockname()[1]
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    client = subprocess.run(client_args(port, requests, clients, out), timeout=120)
    # Every request was answered; waitress has no clean stop from another
    # thread, so the caller exits the process once the spans are out.
    return client.returncode


def serve_pool(tracer, served, requests, clients, out):
    """An acceptor thread reads each request (up to its blank line) and
    submits it to a ThreadPoolExecutor of 4 workers; a worker makes the
    server span, with the connection's ports as the stock HTTP
    instrumentations name them, works and answers. Returns the client's
    exit code."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pool = ThreadPoolExecutor(max_workers=4)

    def handle(conn, peer, number):
        with tracer.start_as_current_span(
            "GET /work",
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "GET",
                "server.port": port,
                "client.address": peer[0],
                "client.port": peer[1],
            },
        ) as span:
            began = time.monotonic_ns()
            digest = hashlib.sha256(b"x" * 200_000).hexdigest()
            # Mostly waiting, as a worker calling a database would: with
            # more clients than workers, requests wait for a free worker,
            # not for a CPU.
            time.sleep(0.02)
            body = json.dumps({"digest": digest, "n": sum(range(20_000))}).encode()
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            ctx = span.get_span_context()
            with lock:
                served.append(
                    {
                        "span_id": format(ctx.span_id, "016x"),
                        "tid": threading.get_native_id(),
                        "pid": os.getpid(),
                        "i": number,
                        "began_ns": began,
                        "ended_ns": time.monotonic_ns(),
                    }
                )
        conn.close()

    def accept():
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                request += chunk
            # "GET /work?i=N HTTP/1.1"
            target = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            number = int(target.partition(b"i=")[2] or -1)
            pool.submit(handle, conn, peer, number)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    code = run_client_processes(port, requests, clients, out)
    pool.shutdown(wait=True)
    listener.close()
    return code


def main():
    out = sys.argv[1]
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 80
    clients = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    mode = sys.argv[4] if len(sys.argv) > 4 else "threads"
    provider = TracerProvider(resource=Resource.create({"service.name": "plain-http"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=10), schedule_delay_millis=500))
    tracer = provider.get_tracer("stock-server")
    served = []
    lock = threading.Lock()
    if mode == "waitress":
        code = serve_waitress(provider, served, requests, clients, out)
        provider.force_flush(10_000)
        provider.shutdown()
        write_served(out, served)
        sys.stdout.flush()
        os._exit(code)
    if mode == "pool":
        code = serve_pool(tracer, served, requests, clients, out)
        provider.force_flush(10_000)
        provider.shutdown()
        write_served(out, served)
        sys.exit(code)
    if mode == "asyncio":
        code = serve_asyncio(tracer, served, requests, clients, out)
        provider.force_flush(10_000)
        provider.shutdown()
        write_served(out, served)
        sys.exit(code)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            port = self.server.server_address[1]
            with tracer.start_as_current_span(
                "GET /work", kind=SpanKind.SERVER, attributes={"http.request.method": "GET", "server.port": port}
            ) as span:
                # Some work: CPU, then a short sleep, then a CPU-bound child.
                digest = hashlib.sha256(b"x" * 200_000).hexdigest()
                time.sleep(0.002)
                with tracer.start_as_current_span("render"):
                    body = json.dumps({"digest": digest, "n": sum(range(20_000))}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                ctx = span.get_span_context()
                with lock:
                    served.append(
                        {"span_id": format(ctx.span_id, "016x"), "tid": threading.get_native_id(), "pid": os.getpid()}
                    )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    worker = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    worker.start()
    client = subprocess.run(client_args(server.server_address[1], requests, clients, out), timeout=120)
    server.shutdown()
    worker.join()
    server.server_close()
    provider.force_flush(10_000)
    provider.shutdown()
    write_served(out, served)
    sys.exit(client.returncode)


def write_served(out, served):
    with open(os.path.join(out, "served.jsonl"), "w") as f:
        for s in served:
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
