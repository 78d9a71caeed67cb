"""A real OTLP/HTTP exporter carries the deepspan fields (to a server on 127.0.0.1)."""

import http.server
import threading

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import deepspan_otel
from deepspan_otel import ATTR_MONO_END, ATTR_MONO_NS, ATTR_MONO_START, ATTR_TID, EVENT_OFF, EVENT_ON


class Collector(http.server.BaseHTTPRequestHandler):
    bodies = []

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        Collector.bodies.append((self.path, self.headers.get("Content-Type"), self.rfile.read(n)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_otlp_http_exporter_serializes_deepspan_fields():
    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider = TracerProvider()
        deepspan_otel.install(provider)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces", timeout=10)))
        tracer = provider.get_tracer("otlp-test")
        with tracer.start_as_current_span("parent"):
            with tracer.start_as_current_span("child"):
                pass
        provider.force_flush()
        provider.shutdown()
    finally:
        server.shutdown()
        deepspan_otel.uninstall_hooks()

    assert Collector.bodies, "the exporter sent nothing"
    spans = []
    for path, ctype, body in Collector.bodies:
        assert path == "/v1/traces" and ctype == "application/x-protobuf"
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    assert sorted(s.name for s in spans) == ["child", "parent"]
    for s in spans:
        attrs = {kv.key: kv.value for kv in s.attributes}
        assert attrs[ATTR_TID].int_value == threading.get_native_id()
        assert 0 < attrs[ATTR_MONO_START].int_value <= attrs[ATTR_MONO_END].int_value
        acts = [(e.name, {kv.key: kv.value.int_value for kv in e.attributes}, e.time_unix_nano) for e in s.events]
        assert [a[0] for a in acts] == [EVENT_ON, EVENT_OFF]
        for name, a, t in acts:
            assert a[ATTR_TID] == threading.get_native_id()
            assert attrs[ATTR_MONO_START].int_value <= a[ATTR_MONO_NS] <= attrs[ATTR_MONO_END].int_value
            assert s.start_time_unix_nano <= t <= s.end_time_unix_nano + 1000
