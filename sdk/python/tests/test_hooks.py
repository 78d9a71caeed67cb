"""The hook points and the lazy span events: edge cases of the fast paths."""

import contextvars
import copy
import threading

import pytest
from opentelemetry import context, trace
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util import BoundedList

import deepspan_otel
from deepspan_otel import ATTR_MONO_END, ATTR_MONO_NS, ATTR_MONO_START, ATTR_TID, EVENT_OFF, EVENT_ON
from test_activations import activations, check_thread_timelines


def names(span):
    return [(e.name, e.attributes[ATTR_TID]) for e in span.events if e.name in (EVENT_ON, EVENT_OFF)]


def test_install_replaces_the_api_functions_and_uninstall_puts_them_back(setup):
    from opentelemetry.context import attach as attach_while_installed

    assert attach_while_installed is deepspan_otel._attach
    assert context.attach is deepspan_otel._attach and context.detach is deepspan_otel._detach
    deepspan_otel.uninstall_hooks()
    assert context.attach is not deepspan_otel._attach and context.detach is not deepspan_otel._detach
    assert context.attach.__module__ == "opentelemetry.context"
    assert not isinstance(context._RUNTIME_CONTEXT, deepspan_otel.DeepspanRuntimeContext)
    # A reference kept to our function while installed delegates once uninstalled.
    token = attach_while_installed(context.set_value("k", 1))
    assert context.get_value("k") == 1
    deepspan_otel._detach(token)
    assert context.get_value("k") is None


def test_references_to_the_original_functions_still_record(setup):
    # Code that did `from opentelemetry.context import attach` before install
    # reaches the runtime context, which records too.
    api_attach, api_detach = deepspan_otel._api_attach, deepspan_otel._api_detach
    assert api_attach.__module__ == "opentelemetry.context"
    t = setup.tracer
    with t.start_as_current_span("parent") as parent:
        span = t.start_span("child")
        token = api_attach(trace.set_span_in_context(span))
        api_detach(token)
        span.end()
    spans = {s.name: s for s in setup.finished()}
    tid = threading.get_native_id()
    assert names(spans["child"]) == [(EVENT_ON, tid), (EVENT_OFF, tid)]
    assert names(spans["parent"]) == [(EVENT_ON, tid), (EVENT_OFF, tid)]
    check_thread_timelines(spans.values())


def test_a_runtime_context_replaced_after_install_is_used(setup):
    replacement = ContextVarsRuntimeContext()
    saved = context._RUNTIME_CONTEXT
    context._RUNTIME_CONTEXT = replacement
    try:
        token = context.attach(context.set_value("k", "v"))
        assert replacement.get_current().get("k") == "v"
        assert context.get_value("k") == "v"
        context.detach(token)
        assert context.get_value("k") is None
    finally:
        context._RUNTIME_CONTEXT = saved


def test_detach_errors_are_logged_like_the_api_does(setup, caplog):
    token = context.attach(context.set_value("k", 1))
    context.detach(token)
    with caplog.at_level("ERROR", logger="opentelemetry.context"):
        context.detach(token)  # already used: the API logs and carries on
    assert "Failed to detach context" in caplog.text


def test_deep_nesting_and_out_of_order_detach(setup):
    t = setup.tracer
    with t.start_as_current_span("a"):
        with t.start_as_current_span("b"):
            with t.start_as_current_span("c"):
                with t.start_as_current_span("d"):
                    with t.start_as_current_span("e"):
                        pass
    spans = setup.finished()
    tl = check_thread_timelines(spans)
    assert [x[2] for x in tl[threading.get_native_id()]] == ["a", "b", "c", "d", "e", "d", "c", "b", "a"]
    for s in spans:
        assert len(activations(s)) == 2

    # Detaching the outer context first closes both; detaching the inner one
    # then brings back the outer span (the context it restores).
    outer = t.start_span("outer")
    inner = t.start_span("inner", context=trace.set_span_in_context(outer))

    def out_of_order():
        tok_outer = context.attach(trace.set_span_in_context(outer))
        tok_inner = context.attach(trace.set_span_in_context(inner))
        context.detach(tok_outer)
        context.detach(tok_inner)
        assert trace.get_current_span() is outer
        context.detach(context.attach(context.set_value("x", 1)))  # outer stays active
        deepspan_otel._switch(deepspan_otel._thread(), None)  # what leaving this context does

    contextvars.copy_context().run(out_of_order)
    inner.end()
    outer.end()
    spans = {s.name: s for s in setup.finished()}
    assert [a[0] for a in activations(spans["inner"])] == [True, False]
    assert [a[0] for a in activations(spans["outer"])] == [True, False, True, False]
    check_thread_timelines([spans["inner"], spans["outer"]])


def test_a_span_ended_while_current_keeps_its_activation_until_its_end(setup):
    t = setup.tracer
    with t.start_as_current_span("early") as s:
        s.end()
    with t.start_as_current_span("next"):
        pass
    spans = {x.name: x for x in setup.finished()}
    early = spans["early"]
    acts = activations(early)
    assert [a[0] for a in acts] == [True]  # the end closes it: no off after the end
    assert early.attributes[ATTR_MONO_START] <= acts[0][2] <= early.attributes[ATTR_MONO_END]
    assert [a[0] for a in activations(spans["next"])] == [True, False]


def test_events_are_made_when_read_and_behave_like_the_sdk_list(setup):
    t = setup.tracer
    with t.start_as_current_span("op") as span:
        span.add_event("mine")
    live_events = span._events
    assert isinstance(live_events, BoundedList)
    assert type(live_events) is deepspan_otel._EventsWithActivations
    assert live_events._acts is not None  # nothing read them yet
    assert len(live_events) == 3
    assert live_events._acts is None
    assert [e.name for e in live_events] == ["mine", EVENT_ON, EVENT_OFF]
    assert live_events[1].name == EVENT_ON and live_events[-1].name == EVENT_OFF
    assert live_events.dropped == 0 and span.dropped_events == 0
    assert "deepspan.on" in repr(live_events)
    assert [e.name for e in copy.deepcopy(live_events)] == ["mine", EVENT_ON, EVENT_OFF]
    assert [e.name for e in span.events] == ["mine", EVENT_ON, EVENT_OFF]
    on = span.events[1]
    assert set(on.attributes) == {ATTR_TID, ATTR_MONO_NS}
    assert span.start_time <= on.timestamp <= span.end_time
    exported = setup.finished()[0]
    assert [e.name for e in exported.events] == ["mine", EVENT_ON, EVENT_OFF]


def test_event_limit_drops_the_oldest_as_the_sdk_does():
    provider = TracerProvider(span_limits=SpanLimits(max_events=3))
    exporter = InMemorySpanExporter()
    deepspan_otel.install(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with provider.get_tracer("t").start_as_current_span("op") as span:
            for i in range(3):
                span.add_event(f"e{i}")
        (s,) = exporter.get_finished_spans()
        assert [e.name for e in s.events] == ["e2", EVENT_ON, EVENT_OFF]
        assert s.dropped_events == 2
    finally:
        provider.shutdown()
        deepspan_otel.uninstall_hooks()


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 4])
def test_attribute_limit(limit):
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=limit))
    exporter = InMemorySpanExporter()
    deepspan_otel.install(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with provider.get_tracer("t").start_as_current_span("op", attributes={"user": 1}) as span:
            span.set_attribute("later", 2)
        (s,) = exporter.get_finished_spans()
        assert len(s.attributes) <= limit
        if limit >= 3:
            # The SDK drops the oldest attributes first; the end time comes last.
            assert s.attributes[ATTR_MONO_END] >= s.attributes.get(ATTR_MONO_START, 0)
        if limit >= 4:
            assert {ATTR_TID, ATTR_MONO_START, ATTR_MONO_END} <= set(s.attributes)
        assert [a[0] for a in activations(s)] == [True, False]
    finally:
        provider.shutdown()
        deepspan_otel.uninstall_hooks()


def test_spans_started_before_install_end_normally():
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    early = tracer.start_span("early")
    token = context.attach(trace.set_span_in_context(early))
    deepspan_otel.install(provider)
    try:
        with tracer.start_as_current_span("later"):
            pass
        context.detach(token)
        early.end()
        spans = {s.name: s for s in exporter.get_finished_spans()}
        assert ATTR_TID not in spans["early"].attributes and not spans["early"].events
        assert [a[0] for a in activations(spans["later"])] == [True, False]
    finally:
        provider.shutdown()
        deepspan_otel.uninstall_hooks()


def test_processor_for_sdks_without_on_ending():
    # What install() uses on SDKs older than 1.40: first in line, works in on_end.
    provider = TracerProvider()
    processor = deepspan_otel._OnEndDeepspanSpanProcessor()
    provider.add_span_processor(processor)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    deepspan_otel._install_hooks()
    try:
        tracer = provider.get_tracer("t")
        with tracer.start_as_current_span("parent"):
            with tracer.start_as_current_span("child"):
                pass
        spans = exporter.get_finished_spans()
        assert len(spans) == 2
        for s in spans:
            a = s.attributes
            assert a[ATTR_TID] == threading.get_native_id()
            assert a[ATTR_MONO_START] <= a[ATTR_MONO_END]
            assert [x[0] for x in activations(s)] == [True, False]
        check_thread_timelines(spans)
    finally:
        provider.shutdown()
        deepspan_otel.uninstall_hooks()


def test_a_foreign_context_on_an_idle_thread_records_nothing(setup):
    other = TracerProvider().get_tracer("other")
    span = other.start_span("foreign")
    token = context.attach(trace.set_span_in_context(span))
    context.detach(token)
    span.end()
    t = deepspan_otel._thread()
    assert t.top is None and t.second is None and not t.below
