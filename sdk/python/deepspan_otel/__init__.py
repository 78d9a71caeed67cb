"""deepspan-otel: let deepspan join OpenTelemetry spans with kernel traces.

``install()`` adds a span processor and two hooks to the OpenTelemetry SDK.
Every span then carries, in plain OTLP:

- ``deepspan.tid``: the OS thread id (kernel tid) of the thread that started it;
- ``deepspan.mono_start_ns`` / ``deepspan.mono_end_ns``: CLOCK_MONOTONIC at
  start and end, the clock of the kernel trace (the SDK's own start/end times
  are wall clock, which needs mapping and is only µs-precise);
- span events ``deepspan.on`` / ``deepspan.off`` (attributes ``deepspan.tid``,
  ``deepspan.mono_ns``; event time = the same instant in wall clock) each time
  the span becomes the current span of a thread and stops being it. So a
  request handled by several threads in turn (thread pools) or sharing a
  thread with others (asyncio) is followed.

Cost: no system call per span. The tid is read once per thread
(``threading.current_thread().native_id`` is cached by ``threading``;
``threading.get_native_id()`` would be a ``gettid`` syscall each time) and
``time.monotonic_ns()`` is served by the vDSO.

How activations are seen
------------------------
- Context attach/detach: OpenTelemetry's context API calls the module-level
  runtime context object ``opentelemetry.context._RUNTIME_CONTEXT`` at every
  ``attach``/``detach``. ``install()`` wraps it (delegating to the original
  ``ContextVarsRuntimeContext``) and looks at the current span after each
  call. This catches ``start_as_current_span``, ``use_span``, and every
  instrumentation that propagates context to worker threads with
  ``context.attach``. It works whatever was imported first, because the API
  functions read the module attribute at each call (the ``OTEL_PYTHON_CONTEXT``
  entry point is not used: it is read once, when ``opentelemetry.context`` is
  first imported, so it would have to be set before anything imports
  OpenTelemetry).
- asyncio task steps: a task's context is switched in by the event loop at
  each step, with no attach/detach call. ``install()`` wraps the coroutine of
  every task created through ``asyncio.BaseEventLoop.create_task`` (which
  ``asyncio.create_task``, ``ensure_future``, ``gather`` and ``TaskGroup``
  use) in a thin coroutine whose ``send``/``throw`` record the span current
  in the task when a step starts and restore the thread's state when the step
  ends. Event loops that do not derive from ``BaseEventLoop`` (uvloop) can
  use ``loop.set_task_factory(deepspan_otel.task_factory)``.

Per thread, activations nest like contexts: when a child span becomes
current its parent's activation stays open, and closes only when the
parent's own context is detached (or the thread switches to another task);
the span *active* on a thread is the innermost open one.
"""

from __future__ import annotations

import asyncio
import collections.abc
import logging
import os
import threading
import time

from opentelemetry import context as _context_module
from opentelemetry import trace as _trace_api
from opentelemetry.context.context import _RuntimeContext
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import EventBase, SpanProcessor, TracerProvider
from opentelemetry.trace.propagation import _SPAN_KEY

__all__ = [
    "install",
    "uninstall_hooks",
    "DeepspanSpanProcessor",
    "DeepspanRuntimeContext",
    "task_factory",
    "ATTR_TID",
    "ATTR_MONO_START",
    "ATTR_MONO_END",
    "ATTR_MONO_NS",
    "EVENT_ON",
    "EVENT_OFF",
]

ATTR_TID = "deepspan.tid"
ATTR_MONO_START = "deepspan.mono_start_ns"
ATTR_MONO_END = "deepspan.mono_end_ns"
ATTR_MONO_NS = "deepspan.mono_ns"
EVENT_ON = "deepspan.on"
EVENT_OFF = "deepspan.off"

_logger = logging.getLogger(__name__)
_mono = time.monotonic_ns

# Spans started under the processor carry this Python attribute (on the
# object only, never exported): a list whose first item is wall-clock ns
# minus monotonic ns at start (to time-stamp activation events in wall clock
# without reading the clock twice), followed by the activations recorded so
# far as (event name, tid, mono_ns). One attribute, not two: growing the
# span's __dict__ past its size class costs more than everything else here.
_MARK = "_deepspan"


class _ThreadState(threading.local):
    """Per-thread cache: the OS tid, and the spans activated on this thread
    (innermost last)."""

    def __init__(self) -> None:
        # threading caches native_id when the thread starts: no syscall here.
        self.tid = threading.current_thread().native_id
        self.stack: list = []


_state = _ThreadState()


def _after_fork_in_child() -> None:
    # The child's only thread has a new tid (threading's own fork hook,
    # registered before this one, has updated native_id already).
    global _state
    _state = _ThreadState()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ActivationEvent(EventBase):
    """A ``deepspan.on``/``deepspan.off`` span event. Reads like the SDK's
    ``Event`` (``name``, ``timestamp``, ``attributes``) for processors and
    exporters, at a third of the construction cost: its two attributes are
    ints made here, so there is nothing for ``BoundedAttributes`` to check."""

    __slots__ = ("_tid", "_mono")

    def __init__(self, name: str, timestamp: int, tid: int, mono: int) -> None:
        self._name = name
        self._timestamp = timestamp
        self._tid = tid
        self._mono = mono

    @property
    def attributes(self):
        return {ATTR_TID: self._tid, ATTR_MONO_NS: self._mono}

    @property
    def dropped_attributes(self) -> int:
        return 0


def _emit(span, name: str, tid: int, mono: int) -> None:
    """Records an activation change of a live span; an ended span is left
    alone (its end closes every activation). Recorded as a tuple in a list
    kept on the span object and turned into span events when the span ends:
    appending to the span's event list now would take its lock each time
    (half a microsecond per activation)."""
    if span._end_time is None:
        span._deepspan.append((name, tid, mono))


def _switch(st: _ThreadState, span) -> None:
    """The current span of this thread is now ``span`` (any span, or None).
    This runs at every attach/detach that changes the current span; it is
    written for speed (``_emit`` inlined, no loop in the usual cases)."""
    if span is not None and not hasattr(span, _MARK):
        span = None  # not started under our processor: not a request we follow
    stack = st.stack
    n = len(stack)
    if n and stack[-1] is span:
        return
    mono = _mono()
    tid = st.tid
    if span is None:
        while stack:
            s = stack.pop()
            if s._end_time is None:
                s._deepspan.append((EVENT_OFF, tid, mono))
        return
    if n >= 2 and stack[-2] is span:
        # The usual way back: a child's context detached, its parent's is current again.
        s = stack.pop()
        if s._end_time is None:
            s._deepspan.append((EVENT_OFF, tid, mono))
        return
    if n >= 3:
        for i in range(n - 3, -1, -1):
            if stack[i] is span:
                # Back to an outer context: close what was opened above it.
                while len(stack) > i + 1:
                    _emit(stack.pop(), EVENT_OFF, tid, mono)
                return
    # A span not open on this thread. The stack stays a parent → child
    # chain: what is not the new span's parent is closed first (a sibling's
    # or an unrelated request's activation; after an asyncio task switch the
    # thread's stack says nothing about the task's contexts).
    if stack:
        parent = span.parent
        pid = parent.span_id if parent is not None else None
        while stack and stack[-1].context.span_id != pid:
            _emit(stack.pop(), EVENT_OFF, tid, mono)
    if span._end_time is None:
        span._deepspan.append((EVENT_ON, tid, mono))
    stack.append(span)


class DeepspanRuntimeContext(_RuntimeContext):
    """OpenTelemetry runtime context that records span activations, and
    otherwise delegates to the default ``ContextVarsRuntimeContext`` (or to
    the runtime context it wraps)."""

    def __init__(self, inner: _RuntimeContext | None = None) -> None:
        self._inner = inner if inner is not None else ContextVarsRuntimeContext()
        # Bound methods looked up once: this sits on every attach/detach.
        self._attach = self._inner.attach
        self._detach = self._inner.detach
        self.get_current = self._inner.get_current

    def attach(self, context):
        token = self._attach(context)
        span = context.get(_SPAN_KEY)
        st = _state
        stack = st.stack
        # Fast path: most attach/detach calls change nothing we track.
        if (stack[-1] is not span) if stack else (span is not None):
            try:
                _switch(st, span)
            except Exception:  # never break the application's context handling
                _logger.debug("deepspan: activation not recorded", exc_info=True)
        return token

    def get_current(self):  # replaced per instance by the inner bound method
        return self._inner.get_current()

    def detach(self, token) -> None:
        self._detach(token)
        span = self.get_current().get(_SPAN_KEY)
        st = _state
        stack = st.stack
        if (stack[-1] is not span) if stack else (span is not None):
            try:
                _switch(st, span)
            except Exception:
                _logger.debug("deepspan: activation not recorded", exc_info=True)


def _restore(st: _ThreadState, saved: list) -> None:
    """Brings this thread's activation stack back to ``saved`` (end of a task step)."""
    stack = st.stack
    if len(stack) == len(saved) and all(a is b for a, b in zip(stack, saved)):
        return
    mono = _mono()
    tid = st.tid
    while stack and (len(stack) > len(saved) or stack[-1] is not saved[len(stack) - 1]):
        _emit(stack.pop(), EVENT_OFF, tid, mono)
    for s in saved[len(stack) :]:
        _emit(s, EVENT_ON, tid, mono)
        stack.append(s)


class _StepObserver(collections.abc.Coroutine):
    """Wraps a task's coroutine: each step (send/throw) runs with the task's
    current span marked active on the thread, and the thread's previous state
    comes back when the step yields or finishes."""

    __slots__ = ("_coro",)

    def __init__(self, coro) -> None:
        self._coro = coro

    def _enter(self):
        st = _state
        saved = list(st.stack)
        try:
            _switch(st, _context_module.get_current().get(_SPAN_KEY))
        except Exception:
            _logger.debug("deepspan: task step not recorded", exc_info=True)
        return st, saved

    def send(self, value):
        st, saved = self._enter()
        try:
            return self._coro.send(value)
        finally:
            _restore(st, saved)

    def throw(self, *args):
        st, saved = self._enter()
        try:
            return self._coro.throw(*args)
        finally:
            _restore(st, saved)

    def close(self):
        return self._coro.close()

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def __getattr__(self, name):
        # cr_frame, cr_code, __qualname__...: task repr and debuggers see the real coroutine.
        if name == "_coro":
            raise AttributeError(name)
        return getattr(self._coro, name)

    def __repr__(self) -> str:
        return repr(self._coro)


def _wrap(coro):
    if isinstance(coro, _StepObserver) or not asyncio.iscoroutine(coro):
        return coro
    return _StepObserver(coro)


def task_factory(loop, coro, **kwargs):
    """A task factory for event loops not derived from ``asyncio.BaseEventLoop``
    (uvloop): ``loop.set_task_factory(deepspan_otel.task_factory)``."""
    return asyncio.Task(_wrap(coro), loop=loop, **kwargs)


_hooks_lock = threading.Lock()
_original_runtime_context = None
_original_create_task = None


def _install_hooks() -> None:
    global _original_runtime_context, _original_create_task
    with _hooks_lock:
        current = _context_module._RUNTIME_CONTEXT
        if not isinstance(current, DeepspanRuntimeContext):
            _original_runtime_context = current
            _context_module._RUNTIME_CONTEXT = DeepspanRuntimeContext(current)
        if _original_create_task is None:
            original = asyncio.BaseEventLoop.create_task
            _original_create_task = original

            def create_task(self, coro, *args, **kwargs):
                return original(self, _wrap(coro), *args, **kwargs)

            create_task.__doc__ = original.__doc__
            create_task.__wrapped__ = original
            asyncio.BaseEventLoop.create_task = create_task


def uninstall_hooks() -> None:
    """Removes the context and asyncio hooks (processors stay on their providers)."""
    global _original_runtime_context, _original_create_task
    with _hooks_lock:
        if _original_runtime_context is not None:
            _context_module._RUNTIME_CONTEXT = _original_runtime_context
            _original_runtime_context = None
        if _original_create_task is not None:
            asyncio.BaseEventLoop.create_task = _original_create_task
            _original_create_task = None


def _put(span, k1: str, v1: int, k2: str | None = None, v2: int = 0) -> None:
    """Stores our int attributes on a span, straight into its attribute dict.

    ``Span.set_attributes`` costs about 2 µs (lock, value cleaning, limit
    bookkeeping), twice the whole budget; our values are plain ints and no
    other thread can touch the span at these two moments (``on_start``
    runs before the span is returned to the caller, ``_on_ending`` after
    ``end()`` froze it and before any processor sees it). The SDK also
    freezes the attributes at ``end()``, and offers no public way to add one
    then, when the end time is known. When the container is not the expected
    ``BoundedAttributes`` or is full, the public path (with its limits) is
    used instead."""
    attrs = span._attributes
    d = getattr(attrs, "_dict", None)
    maxlen = getattr(attrs, "maxlen", None)
    n = 1 if k2 is None else 2
    if type(d) is dict and (maxlen is None or len(d) + n <= maxlen):
        d[k1] = v1
        if k2 is not None:
            d[k2] = v2
        return
    frozen = getattr(attrs, "_immutable", False)
    try:
        attrs._immutable = False
        attrs[k1] = v1
        if k2 is not None:
            attrs[k2] = v2
    finally:
        attrs._immutable = frozen


def _finish(span) -> None:
    """At span end: the monotonic end time, and the recorded activations as
    span events (appended after the span's own events, in time order; the
    SDK's event limit applies, dropping the oldest events first)."""
    _put(span, ATTR_MONO_END, _mono())
    acts = span._deepspan
    if len(acts) > 1:
        off = acts[0]
        span._events.extend([ActivationEvent(name, mono + off, tid, mono) for name, tid, mono in acts[1:]])


class DeepspanSpanProcessor(SpanProcessor):
    """Stores ``deepspan.tid`` and ``deepspan.mono_start_ns`` at start and
    ``deepspan.mono_end_ns`` at end. Use :func:`install`, which also places
    it correctly and installs the activation hooks."""

    def on_start(self, span, parent_context=None) -> None:
        mono = _mono()
        span._deepspan = [span._start_time - mono]
        _put(span, ATTR_TID, _state.tid, ATTR_MONO_START, mono)

    def _on_ending(self, span) -> None:
        # SDK >= 1.40: called by Span.end() before any processor's on_end, so
        # every exporter sees what is added here whatever the processor order.
        _finish(span)


class _OnEndDeepspanSpanProcessor(DeepspanSpanProcessor):
    """For SDKs without ``_on_ending``: install() puts this processor first,
    so its on_end runs before the exporters' processors see the span (whose
    attribute and event containers are the live span's)."""

    def on_end(self, span) -> None:
        _finish(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def install(tracer_provider: TracerProvider | None = None, activations: bool = True) -> DeepspanSpanProcessor:
    """Adds deepspan's span processor to ``tracer_provider`` (default: the
    global one, which must be an SDK ``TracerProvider``) and, unless
    ``activations`` is False, installs the activation hooks (once per
    process). Without them spans still get their tid and monotonic times,
    at about a third of the cost, but deepspan then cannot follow a request
    across threads or asyncio tasks. Calling it again for the same provider
    returns the processor already there."""
    provider = tracer_provider if tracer_provider is not None else _trace_api.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        raise TypeError(
            "deepspan_otel.install() needs an opentelemetry-sdk TracerProvider, got "
            f"{type(provider).__name__}; create one and pass it (or set it with trace.set_tracer_provider) first"
        )
    multi = provider._active_span_processor
    for p in getattr(multi, "_span_processors", ()):
        if isinstance(p, DeepspanSpanProcessor):
            if activations:
                _install_hooks()
            return p
    if hasattr(SpanProcessor, "_on_ending"):
        processor = DeepspanSpanProcessor()
        provider.add_span_processor(processor)
    else:
        # No _on_ending hook in this SDK: run first so on_end adds the end
        # time before exporters' processors (BatchSpanProcessor) queue the span.
        processor = _OnEndDeepspanSpanProcessor()
        provider.add_span_processor(processor)
        with multi._lock:
            multi._span_processors = (processor,) + tuple(p for p in multi._span_processors if p is not processor)
    if activations:
        _install_hooks()
    return processor
