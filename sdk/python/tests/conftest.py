import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import deepspan_otel


class Setup:
    def __init__(self):
        self.provider = TracerProvider()
        # One exporter added before deepspan and a batch one after: neither
        # may be disturbed, and both must see the deepspan fields.
        self.simple = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.simple))
        self.processor = deepspan_otel.install(self.provider)
        self.batch = InMemorySpanExporter()
        self.provider.add_span_processor(BatchSpanProcessor(self.batch))
        self.tracer = self.provider.get_tracer("deepspan-tests")

    def finished(self):
        self.provider.force_flush()
        spans = self.batch.get_finished_spans()
        assert len(spans) == len(self.simple.get_finished_spans())
        return spans


@pytest.fixture
def setup():
    s = Setup()
    yield s
    s.provider.shutdown()
    deepspan_otel.uninstall_hooks()
