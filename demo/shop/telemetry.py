"""OpenTelemetry set-up shared by the services: a tracer provider named
after the service, the deepspan processor, and an OTLP/HTTP exporter to
OTEL_EXPORTER_OTLP_ENDPOINT (what `deepspan record` gives its command).

With DEEPSPAN_DEMO_NO_SDK=1 (`deepspan demo --no-sdk`) the deepspan
processor is left out: stock OpenTelemetry only, and `deepspan analyze`
places the requests on threads from the kernel trace."""

import ctypes
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import deepspan_otel

_PR_SET_NAME = 15


def set_thread_name(name):
    """Names the calling thread (its `comm`, what the kernel trace shows);
    threads started afterwards inherit it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def setup(service):
    """Installs the tracer provider of `service` and returns it."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if not os.environ.get("DEEPSPAN_DEMO_NO_SDK"):
        deepspan_otel.install(provider)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(timeout=10), schedule_delay_millis=1000)
        )
    else:
        print(f"{service}: OTEL_EXPORTER_OTLP_ENDPOINT is not set: spans are dropped", file=sys.stderr)
    trace.set_tracer_provider(provider)
    return provider
