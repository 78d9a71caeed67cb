#!/usr/bin/env python3
"""Writes the seeds of the otlp_request and span_store fuzz targets (small
binary inputs that no test data file has the layout of). Needs the
opentelemetry-proto Python package. Run from anywhere:
    python3 fuzz/make_seeds.py
"""
import gzip
import zlib
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

FUZZ = Path(__file__).resolve().parent
EXAMPLE = FUZZ / "../../shared/testdata/spans/otlp/opentelemetry-proto-example-trace.json"

# otlp_request's first byte: low two bits the Content-Type (0 protobuf,
# 1 JSON), the next two the Content-Encoding (0 none, 1 gzip, 2 deflate).
def headers(content_type, content_encoding):
    return bytes([content_type | content_encoding << 2])


def request(spans):
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value="shop"))
    )
    ss = rs.scope_spans.add()
    for i in range(spans):
        s = ss.spans.add()
        s.trace_id = bytes(range(1, 17))
        s.span_id = bytes([0, 0, 0, 0, 0, 0, 0, i + 1])
        if i:
            s.parent_span_id = bytes([0, 0, 0, 0, 0, 0, 0, 1])
        s.name = f"op{i}"
        s.start_time_unix_nano = 1_000 * (i + 1)
        s.end_time_unix_nano = 10_000 - i
        s.attributes.append(KeyValue(key="deepspan.tid", value=AnyValue(int_value=42)))
    return req.SerializeToString()


def delimited(record):
    n, out = len(record), bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out) + record


json = EXAMPLE.read_bytes()
proto = request(3)
seeds = {
    "otlp_request_seeds/json.bin": headers(1, 0) + json,
    "otlp_request_seeds/json-gzip.bin": headers(1, 1) + gzip.compress(json),
    "otlp_request_seeds/protobuf.bin": headers(0, 0) + proto,
    "otlp_request_seeds/protobuf-gzip.bin": headers(0, 1) + gzip.compress(proto),
    "otlp_request_seeds/protobuf-deflate.bin": headers(0, 2) + zlib.compress(proto),
    "import_otlp_proto_seeds/request.pb": proto,
    "span_store_seeds/two-records.pb": delimited(proto) + delimited(request(1)),
    "span_store_seeds/truncated.pb": (delimited(proto) + delimited(request(2)))[:-7],
}
for name, data in seeds.items():
    (FUZZ / name).write_bytes(data)
    print(f"{name}: {len(data)} bytes")
