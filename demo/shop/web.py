"""The HTTP side of a service: a small WSGI router served by wsgiref,
wrapped in OpenTelemetry's WSGI middleware (one server span per request,
named `METHOD /path`: ids travel in the query string, so the name is the
operation) and deepspan's in-band critical path middleware (a caller that
sends `deepspan-dcpt: 1` gets the request's critical path in the reply;
others cost one header lookup)."""

import json
import os
import signal
import socketserver
import sys
import threading
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from deepspan_otel.dcpt import DcptWsgiMiddleware
from opentelemetry import trace
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware


class HttpError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


class Router:
    """Maps `METHOD /path` to handler(query) -> (body bytes | JSON-able)."""

    def __init__(self):
        self.routes = {}

    def route(self, method, path):
        def register(handler):
            self.routes[(method, path)] = handler
            return handler

        return register

    def __call__(self, environ, start_response):
        key = (environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""))
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        try:
            handler = self.routes.get(key)
            if handler is None:
                raise HttpError(404, f"no route {key[0]} {key[1]}")
            result = handler(query)
            status = 200
        except HttpError as e:
            status, result = e.status, {"error": str(e)}
        except Exception as e:  # a failed request must not kill the worker thread
            status, result = 500, {"error": f"{type(e).__name__}: {e}"}
        if isinstance(result, (bytes, bytearray, memoryview)):
            body, ctype = bytes(result), "application/octet-stream"
        else:
            body, ctype = json.dumps(result).encode(), "application/json"
        start_response(
            f"{status} {_REASONS.get(status, 'Error')}",
            [("Content-Type", ctype), ("Content-Length", str(len(body)))],
        )
        return [body]


def int_arg(query, name):
    try:
        return int(query[name])
    except (KeyError, ValueError):
        raise HttpError(400, f"query parameter {name!r} must be an integer") from None


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass

    def get_environ(self):
        # The client's port, as gunicorn and waitress give it and wsgiref
        # does not: OpenTelemetry's WSGI middleware makes it the span's
        # peer port, which names the request's connection.
        env = super().get_environ()
        env["REMOTE_PORT"] = str(self.client_address[1])
        return env


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # Bursts of connections queue in the kernel instead of being refused.
    request_queue_size = 128


class _SerialServer(WSGIServer):
    request_queue_size = 128


def serve(router, provider, service, host="127.0.0.1", port=0, threaded=True, bind=None):
    """Serves `router` until SIGTERM/SIGINT, then flushes the spans.

    Prints `READY <port>` on stdout once listening (the demo driver waits
    for it). `bind`, when given, is called around the socket creation (the
    network scenario opens the listening socket in another namespace)."""
    # Inside OpenTelemetry's middleware, so the request's span is current
    # for the DCPT middleware.
    app = OpenTelemetryMiddleware(DcptWsgiMiddleware(router, service, log_level=None), tracer_provider=provider)
    server_class = _ThreadingServer if threaded else _SerialServer

    def make():
        return make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)

    server = bind(make) if bind else make()

    def stop(_sig, _frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"READY {server.server_port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if not provider.force_flush(10_000):
            print("spans could not be exported within 10 s", file=sys.stderr)
        provider.shutdown()


def record_role(role, **extra):
    """Marks the current request's span with `demo.role` and appends its ids
    to $DEMO_ROLES (JSON lines), so the demo knows which request it was."""
    span = trace.get_current_span()
    ctx = span.get_span_context()
    span.set_attribute("demo.role", role)
    for k, v in extra.items():
        span.set_attribute(f"demo.{k}", v)
    path = os.environ.get("DEMO_ROLES")
    if not path:
        return
    line = json.dumps(
        {"role": role, "trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"), **extra}
    )
    with open(path, "a") as f:
        f.write(line + "\n")
