"""In-band critical paths across real services: wsgiref servers on 127.0.0.1
in threads calling each other with requests/httpx, and an ASGI app driven
directly. Slow hops sleep 200 ms and fast ones 0, and only the slow hop and
the path's structure are asserted, never times, so load cannot flip a result
(parallel branches that a loaded machine happens to run one after the other
may join the path, so tests of parallel calls allow them)."""

import asyncio
import contextvars
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from threading import Thread
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

import httpx
import pytest
import requests
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deepspan_otel import dcpt
from deepspan_otel.dcpt import (
    MAX_HEADER_BYTES,
    REPLY_HEADER,
    REQUEST_HEADER,
    SPAN_ATTRIBUTE,
    AsyncDcptHttpxTransport,
    DcptAsgiMiddleware,
    DcptHttpxTransport,
    DcptWsgiMiddleware,
    Hop,
    decode,
    encode_hop,
)

SLOW = 0.2


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


@pytest.fixture
def servers():
    """Starts WSGI apps on loopback ports; returns their base URLs."""
    started = []

    def start(app):
        server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
        Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        started.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.fixture
def instrumented():
    dcpt.instrument_requests()
    yield
    dcpt.uninstrument_requests()


def service(name, calls=(), sleep=0.0, parallel=False, get=None, seen=None):
    """A WSGI service that sleeps, then calls `calls` (in order, or at once
    in threads that carry the request's context), and answers its name."""
    get = get or (lambda url: requests.get(url, timeout=30))

    def app(environ, start_response):
        if seen is not None:
            seen.append(environ.get("HTTP_DEEPSPAN_DCPT"))
        time.sleep(sleep)
        if parallel:
            with ThreadPoolExecutor(len(calls)) as pool:
                futures = [pool.submit(contextvars.copy_context().run, get, url) for url in calls]
                for future in futures:
                    future.result()
        else:
            for url in calls:
                get(url)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [name.encode()]

    return DcptWsgiMiddleware(app, name)


def ask(url):
    response = requests.get(url + "/work", headers={REQUEST_HEADER: "1"}, timeout=30)
    assert response.status_code == 200
    return decode(response.headers[REPLY_HEADER])


def services_of(path):
    return [hop.service for hop in path.hops]


def test_a_reply_body_slow_to_arrive_is_the_callees_time_not_the_callers(servers, instrumented):
    """A callee that sends its headers at once and its body slowly (a large
    reply over a slow link): the caller waited for the whole body, so that
    wait is its critical child's, not its own self time."""

    def slow_body(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/octet-stream")])

        def body():
            yield b"x" * 1000
            time.sleep(SLOW)
            yield b"y" * 1000

        return body()

    back = servers(DcptWsgiMiddleware(slow_body, "back"))
    front = servers(service("front", [back + "/b"]))
    path = ask(front)
    assert services_of(path) == ["front", "back"]
    front_hop = path.hops[0]
    assert front_hop.total_us - front_hop.self_us >= SLOW * 1e6


def test_a_chain_names_its_slow_hop(servers, instrumented):
    back = servers(service("back"))
    mid = servers(service("mid", [back + "/b"], sleep=SLOW))
    front = servers(service("front", [mid + "/m"]))
    path = ask(front)
    assert services_of(path) == ["front", "mid", "back"]
    assert [hop.operation for hop in path.hops] == ["GET /work", "GET /m", "GET /b"]
    assert path.dropped == 0
    slowest = max(path.hops, key=lambda hop: hop.self_us)
    assert slowest.service == "mid" and slowest.self_us >= SLOW * 1e6
    # Each caller waited at least as long as its callee worked.
    assert path.hops[0].total_us >= path.hops[1].total_us >= path.hops[2].total_us
    for hop, child in zip(path.hops, path.hops[1:]):
        assert hop.total_us - hop.self_us >= child.total_us


def test_sequential_calls_are_all_on_the_path_as_siblings(servers, instrumented):
    fast1 = servers(service("fast1"))
    leaf = servers(service("leaf"))
    slow = servers(service("slow", [leaf + "/l"], sleep=SLOW))
    fast2 = servers(service("fast2"))
    front = servers(service("front", [fast1 + "/a", slow + "/b", fast2 + "/c"]))
    path = ask(front)
    assert [(h.service, h.depth) for h in path.hops] == [("front", 0), ("fast1", 1), ("slow", 1), ("leaf", 2), ("fast2", 1)]
    assert all(h.call_us >= h.total_us for h in path.hops[1:])
    # Front's self time is its own, not its calls': the slow hop is slow's.
    assert max(path.hops, key=lambda h: h.self_us).service == "slow"
    front_hop = path.hops[0]
    assert front_hop.self_us == pytest.approx(
        front_hop.total_us - sum(h.call_us for h in path.hops if h.depth == 1), abs=5
    )


def parallel_branches_then(path, last):
    """The services of ``path`` below its first hop, checked to be fast
    branches (which load may serialise) and then ``last``."""
    names = services_of(path)
    assert names[-len(last):] == last, names
    assert all(name.startswith("fast") for name in names[1 : -len(last)]), names
    return names


def test_a_parallel_fan_out_follows_its_slowest_branch(servers, instrumented):
    branches = [servers(service(f"fast{i}")) for i in range(3)]
    leaf = servers(service("leaf"))
    branches.insert(2, servers(service("slow", [leaf + "/l"], sleep=SLOW)))
    front = servers(service("front", [url + "/x" for url in branches], parallel=True))
    path = ask(front)
    parallel_branches_then(path, ["slow", "leaf"])
    slow = path.hops[-2]
    assert slow.self_us >= SLOW * 1e6
    # The branches overlap, so front waited about as long as the slowest one only.
    assert path.hops[0].self_us < slow.total_us


def test_a_long_chain_stays_within_4_kib_with_a_marker(servers, instrumented):
    depth = 40
    name = "service-with-a-long-name-{:02d}-" + "x" * 120
    url = None
    for i in reversed(range(depth)):
        url = servers(service(name.format(i), [url + "/next"] if url else []))
    response = requests.get(url + "/work", headers={REQUEST_HEADER: "1"}, timeout=60)
    value = response.headers[REPLY_HEADER]
    assert len(value) <= MAX_HEADER_BYTES
    path = decode(value)
    kept = len(path.hops)
    assert 10 < kept < depth
    assert path.dropped == depth - kept
    assert services_of(path) == [name.format(i) for i in range(kept)]
    # The last kept hop still accounts for the dropped hops' time.
    assert path.hops[-1].self_us < path.hops[-1].total_us
    # The cut kept every hop that fit: the room left is less than the next
    # hop could take. Its times are unknown (the value dropped them), so it
    # is taken at its widest: every number as long as the outermost total,
    # which bounds them all; one byte more for the marker's count, which
    # may lose a digit when that hop is back.
    widest = str(path.hops[0].total_us)
    longest_next = encode_hop(
        Hop(name.format(kept), path.hops[-1].operation, self_us=int(widest), total_us=int(widest),
            depth=path.hops[-1].depth + 1, call_us=int(widest))
    )
    assert MAX_HEADER_BYTES - len(value) < len(";" + longest_next) + 1


def test_requests_without_the_header_are_untouched(servers, instrumented):
    seen = []
    back = servers(service("back", seen=seen))
    front = servers(service("front", [back + "/b"]))
    response = requests.get(front + "/work", timeout=30)
    assert response.status_code == 200 and response.text == "front"
    assert REPLY_HEADER not in response.headers
    assert seen == [None]  # The outgoing call did not ask either.

    # The middleware hands the app's own start_response and result through.
    calls = []
    result = [b"body"]

    def app(environ, start_response):
        calls.append(start_response)
        return result

    def start_response(status, headers, exc_info=None):
        pass

    wrapped = DcptWsgiMiddleware(app, "plain")
    assert wrapped({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, start_response) is result
    assert calls == [start_response]


def test_the_outermost_service_puts_the_path_on_its_span_and_logs_it(servers, instrumented, caplog):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reported = []
    back = servers(service("back", sleep=SLOW))
    inner = service("front", [back + "/b"])
    outermost = DcptWsgiMiddleware(
        inner.app, "front", sample_rate=1.0, on_path=lambda path, value: reported.append((path, value))
    )
    front = servers(OpenTelemetryMiddleware(outermost, tracer_provider=provider))
    with caplog.at_level(logging.INFO, logger="deepspan_otel.dcpt"):
        response = requests.get(front + "/work", timeout=30)
    assert REPLY_HEADER not in response.headers  # Nobody asked: the topology stays inside.
    (span,) = exporter.get_finished_spans()
    path = decode(span.attributes[SPAN_ATTRIBUTE])
    assert services_of(path) == ["front", "back"]
    assert reported == [(path, span.attributes[SPAN_ATTRIBUTE])]
    assert any("critical path of GET /work: front GET /work" in r.getMessage() for r in caplog.records)
    provider.shutdown()


def test_a_sample_rate_of_zero_traces_nothing(servers, instrumented):
    seen = []
    back = servers(service("back", seen=seen))
    reported = []
    app = service("front", [back + "/b"]).app
    front = servers(DcptWsgiMiddleware(app, "front", sample_rate=0.0, on_path=lambda *a: reported.append(a)))
    requests.get(front + "/work", timeout=30)
    assert seen == [None] and reported == []
    with pytest.raises(ValueError):
        DcptWsgiMiddleware(app, "front", sample_rate=1.5)


def test_children_without_a_valid_path_count_under_their_address(servers, instrumented):
    def plain(environ, start_response):
        time.sleep(SLOW if environ["PATH_INFO"] == "/slow" else 0)
        start_response("200 OK", [(REPLY_HEADER, "garbage" if environ["PATH_INFO"] == "/bad" else "1;" + "x" * 9000)])
        return [b""]

    other = servers(plain)
    front = servers(service("front", [other + "/bad", other + "/slow", "http://127.0.0.1:9/refused"],
                            get=lambda url: _get_ignoring_errors(url)))
    path = ask(front)
    address = other.removeprefix("http://")
    assert [(hop.service, hop.operation) for hop in path.hops] == [
        ("front", "GET /work"),
        (address, "GET /bad"),
        (address, "GET /slow"),
        ("127.0.0.1:9", "GET /refused"),
    ]
    slow = path.hops[2]
    assert slow.self_us == slow.total_us == slow.call_us >= SLOW * 1e6


def _get_ignoring_errors(url):
    try:
        requests.get(url, timeout=30)
    except requests.ConnectionError:
        pass


def test_a_kernel_cause_goes_on_the_hop(servers, instrumented):
    app = service("front").app
    front = servers(DcptWsgiMiddleware(app, "front", kernel_cause=lambda self_us: ("cpu-wait", self_us // 2)))
    hop = ask(front).hops[0]
    assert hop.cause == "cpu-wait" and hop.cause_us == hop.self_us // 2
    # What the provider returns is made to fit the format.
    odd = servers(DcptWsgiMiddleware(app, "front", kernel_cause=lambda self_us: ("a:b", -5)))
    hop = ask(odd).hops[0]
    assert (hop.cause, hop.cause_us) == ("a:b", 0)


def test_httpx_clients_ask_and_merge_too(servers):
    back = servers(service("back", sleep=SLOW))
    client = httpx.Client(transport=DcptHttpxTransport(httpx.HTTPTransport()))
    front = servers(service("front", [servers(service("fast")) + "/f", back + "/b"],
                            get=lambda url: client.get(url, timeout=30)))
    path = ask(front)
    client.close()
    assert services_of(path) == ["front", "fast", "back"]


def test_an_asgi_app_with_concurrent_tasks(servers):
    slow = servers(service("slow", sleep=SLOW))
    fast = servers(service("fast"))

    async def app(scope, receive, send):
        async with httpx.AsyncClient(transport=AsyncDcptHttpxTransport(httpx.AsyncHTTPTransport())) as client:
            # Tasks copy the context, so each call lands on this request.
            await asyncio.gather(client.get(fast + "/f"), client.get(slow + "/s"), client.get(fast + "/g"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"asgi"})

    wrapped = DcptAsgiMiddleware(app, "front")

    async def call(headers):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/work", "headers": headers}
        await wrapped(scope, receive, send)
        return sent

    sent = asyncio.run(call([(b"deepspan-dcpt", b"1")]))
    headers = dict(sent[0]["headers"])
    path = decode(headers[REPLY_HEADER.encode()])
    parallel_branches_then(path, ["slow"])
    assert path.hops[-1].operation == "GET /s"
    assert sent[1] == {"type": "http.response.body", "body": b"asgi"}

    sent = asyncio.run(call([]))
    assert REPLY_HEADER.encode() not in dict(sent[0]["headers"])


def test_a_lazy_wsgi_app_is_traced_while_its_body_is_produced(servers, instrumented):
    back = servers(service("back"))

    def lazy(environ, start_response):
        # start_response with the first chunk, after the app returned (PEP 3333).
        requests.get(back + "/b", timeout=30)
        start_response("200 OK", [])
        yield b"late"

    front = servers(DcptWsgiMiddleware(lazy, "front"))
    assert services_of(ask(front)) == ["front", "back"]


def test_other_rpc_stacks_use_start_call():
    assert dcpt.start_call() is None  # Not serving a traced request.

    def serve(calls, asked=True):
        def app(environ, start_response):
            for callee, reply, sleep in calls:
                call = dcpt.start_call()
                time.sleep(sleep)
                call.finish(reply, callee, "rpc")
            start_response("200 OK", [])
            return [b""]

        headers, reported = [], []
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/x"}
        if asked:
            environ["HTTP_DEEPSPAN_DCPT"] = "1"
        middleware = DcptWsgiMiddleware(app, "front", sample_rate=1.0, on_path=lambda p, v: reported.append(v))
        result = middleware(environ, lambda status, h, exc_info=None: headers.extend(h))
        assert list(result) == [b""]
        values = [v for name, v in headers if name == REPLY_HEADER] + reported
        assert len(values) == 1
        return values[0]

    def hops(value):
        return [(h.service, h.operation) for h in decode(value).hops]

    # The callee's path is used when it sent one (version 1 too), else the callee is a hop.
    assert hops(serve([("db", "2;db:SELECT:7:7", SLOW), ("cache", None, 0)])) == [
        ("front", "POST /x"),
        ("db", "SELECT"),
        ("cache", "rpc"),
    ]
    assert hops(serve([("db", "1;db:SELECT:7:7", 0), ("cache", b"2;a b", SLOW)])) == [
        ("front", "POST /x"),
        ("db", "SELECT"),
        ("cache", "rpc"),
    ]
    # A value with the right characters but no path is relayed as it is (a
    # hop checks only the characters and the size of what it relays, which
    # keeps a chain linear); the outermost service, which decodes, names the
    # child instead.
    garbage = [("db", "2;db:SELECT:7", SLOW), ("cache", "2;cache:GET:1:1", 0)]
    assert serve(garbage).startswith("2;front:POST%20/x:") and "@db:SELECT:7;" in serve(garbage)
    assert hops(serve(garbage, asked=False)) == [("front", "POST /x"), ("db", "rpc"), ("cache", "GET")]


def relayed(calls, limit=MAX_HEADER_BYTES):
    """The value a request sends back after ``calls`` (start ms, end ms,
    reply value or None, callee), its own hop in front."""
    request = dcpt._Request()
    request.calls = [dcpt._Call(int(a * 1e6), int(b * 1e6), value, (callee, "GET /z")) for a, b, value, callee in calls]
    request.finish()
    return request.value(dcpt.Hop("front", "GET /", 1, 100_000), limit)


def test_the_critical_calls_are_those_the_request_waited_for_in_turn():
    def chosen(*spans):
        calls = [dcpt._Call(a, b, None, (str(i), "op")) for i, (a, b) in enumerate(spans)]
        return [c.callee[0] for c in dcpt.critical_calls(calls)]

    assert chosen((0, 10), (11, 20), (21, 30)) == ["0", "1", "2"]  # one after the other
    assert chosen((0, 10), (0, 30), (0, 20)) == ["1"]  # parallel: the one that returned last
    assert chosen((0, 5), (6, 30), (6, 12), (8, 29)) == ["0", "1"]  # a call, then a fan-out
    assert chosen((0, 10), (0, 10)) == ["0"]  # a tie: one of them, not both
    assert chosen() == []


def test_relaying_puts_calls_as_siblings_and_cuts_the_end():
    value = relayed([(0, 5, "1;a:x:1:2;b:y:1:1", "a"), (6, 8, "2;c:x:3:4;+5", "c"), (9, 10, None, "d")])
    assert value == "2;front:GET%20/:1:100000;5000@a:x:1:2;b:y:1:1;2^2000@c:x:3:4;1^1000@d:GET%20/z:1000:1000;+5"
    path = decode(value)
    assert [(h.service, h.depth) for h in path.hops] == [("front", 0), ("a", 1), ("b", 2), ("c", 1), ("d", 1)]
    total = len(path.hops) + path.dropped
    for limit in range(24, len(value) + 1):
        cut = relayed([(0, 5, "1;a:x:1:2;b:y:1:1", "a"), (6, 8, "2;c:x:3:4;+5", "c"), (9, 10, None, "d")], limit)
        back = decode(cut)
        assert len(cut) <= max(limit, len("2;front:GET%20/:1:100000;+9"))
        assert back.hops == path.hops[: len(back.hops)] and len(back.hops) + back.dropped == total
