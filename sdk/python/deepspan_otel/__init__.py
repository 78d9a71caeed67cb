"""deepspan-otel: let deepspan join OpenTelemetry spans with kernel traces.

``install()`` adds a span processor and two hooks to the OpenTelemetry SDK.
Every span then carries, in plain OTLP:

- ``deepspan.tid``: the OS thread id (kernel tid) of the thread that started it;
- ``deepspan.pid_ns``, only in a container with a PID namespace of its own:
  that namespace's inode number. The ids above are then the namespace's,
  and deepspan maps them to the kernel's through its /proc scans;
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
``time.monotonic_ns()`` is served by the vDSO. About 1.3 µs per span (0.6 µs
without activation tracking) on a slow 2-core VM where the plain SDK takes
11 µs (``bench/bench_processor.py``): the tid and the clock readings are
written straight into the span's attribute dict, an activation is a tuple
appended to a list kept on the span, the thread's active spans are kept in
slots of a per-thread object, and the span events are made only when
something reads the ended span's events (an exporter, usually on
``BatchSpanProcessor``'s thread; see ``_EventsWithActivations``).

How activations are seen
------------------------
- Context attach/detach: OpenTelemetry's context API functions
  ``opentelemetry.context.attach``/``detach`` call the module-level runtime
  context object ``opentelemetry.context._RUNTIME_CONTEXT``. ``install()``
  replaces those two functions (when the runtime context is the default
  ``ContextVarsRuntimeContext``) by ones that do the same and look at the
  current span: one Python call instead of two, which pays for much of the
  tracking. It also wraps ``_RUNTIME_CONTEXT`` (delegating to the original)
  so that code holding the original functions (``from
  opentelemetry.context import attach``) is seen too. This catches
  ``start_as_current_span``, ``use_span``, and every instrumentation that
  propagates context to worker threads with ``context.attach``. It works
  whatever was imported first, because callers read the module attributes at
  each call (the ``OTEL_PYTHON_CONTEXT`` entry point is not used: it is read
  once, when ``opentelemetry.context`` is first imported, so it would have to
  be set before anything imports OpenTelemetry). ``uninstall_hooks()`` puts
  everything back.
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
import contextvars
import copy
import logging
import os
import threading
import time
import types

from opentelemetry import context as _context_module
from opentelemetry import trace as _trace_api
from opentelemetry.context.context import _RuntimeContext
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import EventBase, SpanProcessor, TracerProvider
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace.propagation import _SPAN_KEY

try:  # the SDK's span class (Span itself cannot be instantiated)
    from opentelemetry.sdk.trace import _Span as _SdkSpan
except ImportError:  # pragma: no cover - older SDKs
    _SdkSpan = None

__all__ = [
    "install",
    "uninstall_hooks",
    "DeepspanSpanProcessor",
    "DeepspanRuntimeContext",
    "task_factory",
    "ATTR_TID",
    "ATTR_PID_NS",
    "ATTR_MONO_START",
    "ATTR_MONO_END",
    "ATTR_MONO_NS",
    "EVENT_ON",
    "EVENT_OFF",
]

ATTR_TID = "deepspan.tid"
ATTR_PID_NS = "deepspan.pid_ns"
ATTR_MONO_START = "deepspan.mono_start_ns"
ATTR_MONO_END = "deepspan.mono_end_ns"
ATTR_MONO_NS = "deepspan.mono_ns"
EVENT_ON = "deepspan.on"
EVENT_OFF = "deepspan.off"

_logger = logging.getLogger(__name__)
_mono = time.monotonic_ns

# Spans started under the processor carry this Python attribute (on the
# object only, never exported): the list of the activations recorded so far,
# as (event name, tid, mono_ns). One attribute, not two: growing the span's
# __dict__ past its size class costs more than everything else here.
_MARK = "_deepspan"


# ---------------------------------------------------------------------------
# Per-thread activation state


class _Thread:
    """The activation state of one thread: its OS tid and the spans active
    on it, as ``top`` (the innermost, or None), ``second`` (the one below,
    or None) and ``below`` (the rest, outermost first). Two levels held in
    slots cover nearly all requests (a span and its child) with no list
    operation; invariant: ``top`` None ⇒ ``second`` None ⇒ ``below`` empty.

    ``top_token`` / ``second_token``: the context tokens of the attach calls
    that made ``top`` / ``second`` current, when known (else None). Detaching
    ``top_token`` brings back the context that was current before, so
    ``second`` is active again: no need to look into the context."""

    __slots__ = ("tid", "top", "second", "below", "top_token", "second_token")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.top = self.second = self.top_token = self.second_token = None
        self.below = []

    def active(self) -> list:
        """The active spans, outermost first."""
        spans = list(self.below)
        if self.second is not None:
            spans.append(self.second)
        if self.top is not None:
            spans.append(self.top)
        return spans

    def set_active(self, spans: list) -> None:
        n = len(spans)
        self.top = spans[-1] if n else None
        self.second = spans[-2] if n > 1 else None
        self.below = spans[:-2] if n > 2 else []
        self.top_token = self.second_token = None


# Per thread: ``tid`` (the OS tid, for span starts) and ``t`` (the thread's
# _Thread). A plain threading.local (cheaper to read than a subclass),
# filled by _init_thread at a thread's first use.
_local = threading.local()


def _init_thread() -> _Thread:
    # threading caches native_id when the thread starts: no syscall here.
    tid = threading.current_thread().native_id
    t = _local.t = _Thread(tid)
    _local.tid = tid
    return t


def _thread() -> _Thread:
    try:
        return _local.t
    except AttributeError:
        return _init_thread()


# The host's first PID namespace: the kernel gives it a fixed inode number.
_INITIAL_PID_NS = 0xEFFFFFFC


def _pid_namespace():
    """The inode of this process's PID namespace when it is not the host's
    (a container's own), else None."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return None if ns == _INITIAL_PID_NS else ns


_pid_ns = _pid_namespace()


def _after_fork_in_child() -> None:
    # The child's only thread has a new tid (threading's own fork hook,
    # registered before this one, has updated native_id already), and may
    # be the first process of a new PID namespace.
    global _local, _pid_ns
    _local = threading.local()
    _pid_ns = _pid_namespace()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------
# Activation tracking


def _emit(span, name: str, tid: int, mono: int) -> None:
    """Records an activation change of a live span; an ended span is left
    alone (its end closes every activation). Recorded as a tuple in a list
    kept on the span object; the span events are made from it later (see
    ``_EventsWithActivations``)."""
    if span._end_time is None:
        span._deepspan.append((name, tid, mono))


def _switch(t: _Thread, span) -> None:
    """The current span of this thread is now ``span`` (any span, or None).
    The hooks handle the usual cases inline; this is the general one."""
    if span is not None and getattr(span, _MARK, None) is None:
        span = None  # not started under our processor: not a request we follow
    if t.top is span:
        return
    active = t.active()
    mono = _mono()
    tid = t.tid
    if span is None:
        for s in reversed(active):
            _emit(s, EVENT_OFF, tid, mono)
        t.set_active([])
        return
    for i in range(len(active) - 2, -1, -1):
        if active[i] is span:
            # Back to an outer context: close what was opened above it.
            for s in reversed(active[i + 1 :]):
                _emit(s, EVENT_OFF, tid, mono)
            t.set_active(active[: i + 1])
            return
    # A span not open on this thread. The active spans stay a parent → child
    # chain: what is not the new span's parent is closed first (a sibling's
    # or an unrelated request's activation; after an asyncio task switch the
    # thread's state says nothing about the task's contexts).
    if active:
        parent = span.parent
        pid = parent.span_id if parent is not None else None
        while active and active[-1].context.span_id != pid:
            _emit(active.pop(), EVENT_OFF, tid, mono)
    _emit(span, EVENT_ON, tid, mono)
    active.append(span)
    t.set_active(active)


def _switch_logged(t: _Thread, span) -> None:
    try:
        _switch(t, span)
    except Exception:  # never break the application's context handling
        _logger.debug("deepspan: activation not recorded", exc_info=True)


# The installed DeepspanRuntimeContext when it wraps exactly a
# ContextVarsRuntimeContext, and that context's ContextVar methods: the
# replacements of opentelemetry.context.attach/detach below use them.
_fast_rc = None
_var_set = _var_reset = _var_get = None


def _make_hooks(api: bool):
    """The attach/detach functions with the activation tracking inline: the
    replacements of the API module's functions (``api``: they reach the
    runtime context themselves, and detach logs errors as the API does), or
    the methods of the installed ``DeepspanRuntimeContext`` (for code that
    calls the runtime context, e.g. through the API's original functions).
    The tracking never raises (try blocks cost nothing until they catch)."""

    def attach(context):
        if api and _context_module._RUNTIME_CONTEXT is not _fast_rc:
            # Runtime context replaced since install (or hooks uninstalled).
            return _context_module._RUNTIME_CONTEXT.attach(context)
        token = _var_set(context)
        try:
            span = context.get(_SPAN_KEY)
            try:
                t = _local.t
            except AttributeError:
                t = _init_thread()
            top = t.top
            if top is span:
                return token  # most attach calls change nothing we track
            if type(span) is _SdkSpan:
                try:
                    acts = span._deepspan
                except AttributeError:
                    acts = None  # an SDK span from a provider without our processor
            else:
                acts = getattr(span, _MARK, None)
            if acts is not None and (top is None or span._parent is top._context):
                # One of our spans becomes current while nothing is active on
                # this thread (a request's root span, or a request reaching a
                # pool thread) or while its parent is the active span. (No
                # check that the span is live: records after its end are
                # dropped when the events are made, see _make_events.)
                acts.append((EVENT_ON, t.tid, _mono()))
                if top is not None:
                    second = t.second
                    if second is not None:
                        t.below.append(second)
                    t.second = top
                    t.second_token = t.top_token
                t.top = span
                t.top_token = token
                return token
            if acts is None and top is None:
                return token  # not a span we follow, and nothing to close
            _switch(t, span)
        except Exception:  # never break the application's context handling
            _logger.debug("deepspan: activation not recorded", exc_info=True)
        return token

    def detach(token) -> None:
        if api:
            if _context_module._RUNTIME_CONTEXT is not _fast_rc:
                return _api_detach(token)
            try:
                _var_reset(token)
            except Exception:  # what the API function does
                _context_module.logger.exception("Failed to detach context")
                return
        else:
            _var_reset(token)
        try:
            try:
                t = _local.t
            except AttributeError:
                t = _init_thread()
            top = t.top
            if token is t.top_token:
                # Undoing the attach that made top current: the context
                # current before it is back, and with it the span active
                # then, second.
                second = t.second
                if second is None:
                    t.top = t.top_token = None
                    top._deepspan.append((EVENT_OFF, t.tid, _mono()))
                    return
            else:
                second = t.second
                span = _var_get().get(_SPAN_KEY)
                if top is span:
                    return
                if second is not span:
                    _switch(t, span)
                    return
                # The usual way back: a span's context detached, its parent's
                # (or none) is current again. (top is a span: were it None,
                # second would be None too, and so span.)
            below = t.below
            t.second = below.pop() if below else None
            t.top = second
            t.top_token = t.second_token
            t.second_token = None
            top._deepspan.append((EVENT_OFF, t.tid, _mono()))
        except Exception:
            _logger.debug("deepspan: activation not recorded", exc_info=True)

    if api:
        attach.__name__ = attach.__qualname__ = "_attach"
        detach.__name__ = detach.__qualname__ = "_detach"
        attach.__doc__ = (
            "``opentelemetry.context.attach`` while the hooks are installed: the API "
            "function and the runtime context's method in one call, plus the activation tracking."
        )
        detach.__doc__ = "``opentelemetry.context.detach`` while the hooks are installed (see ``_attach``)."
    return attach, detach


_attach, _detach = _make_hooks(api=True)
_fast_attach, _fast_detach = _make_hooks(api=False)


def _is_api_function(f, name: str) -> bool:
    """Whether ``f`` is the OpenTelemetry API's own ``name`` function (not a
    wrapper someone put in its place)."""
    return type(f) is types.FunctionType and f.__module__ == _context_module.__name__ and f.__name__ == name


# What _attach/_detach replace (and uninstall_hooks puts back).
_api_attach = _context_module.attach
_api_detach = _context_module.detach


class DeepspanRuntimeContext(_RuntimeContext):
    """OpenTelemetry runtime context that records span activations, and
    otherwise delegates to the default ``ContextVarsRuntimeContext`` (or to
    the runtime context it wraps).

    ``install()`` puts one in ``opentelemetry.context._RUNTIME_CONTEXT``, for
    code that kept a reference to the API's ``attach``/``detach`` functions
    (``from opentelemetry.context import attach``). Calls through the API
    module (``opentelemetry.context.attach(...)``, as the SDK and
    instrumentations make them) go to faster replacements of those two
    functions, which ``install()`` sets when this object wraps exactly a
    ``ContextVarsRuntimeContext`` (the default)."""

    def __init__(self, inner: _RuntimeContext | None = None) -> None:
        self._inner = inner if inner is not None else ContextVarsRuntimeContext()
        var = getattr(self._inner, "_current_context", None)
        if type(self._inner) is ContextVarsRuntimeContext and type(var) is contextvars.ContextVar:
            self._var = var
            # get_current costs what ContextVarsRuntimeContext's does.
            self._current_context = var
        else:
            self._var = None
            self._current_context = types.SimpleNamespace(get=self._inner.get_current)

    def get_current(self):
        return self._current_context.get()

    # While installed with a ContextVar (see _install_hooks), the instance's
    # own attach/detach attributes are _fast_attach/_fast_detach, which
    # track inline; these are the general way.

    def attach(self, context):
        token = self._inner.attach(context)
        _switch_logged(_thread(), context.get(_SPAN_KEY))
        return token

    def detach(self, token) -> None:
        self._inner.detach(token)
        _switch_logged(_thread(), self._inner.get_current().get(_SPAN_KEY))


# ---------------------------------------------------------------------------
# asyncio task steps


def _restore(t: _Thread, saved: list) -> None:
    """Brings this thread's active spans back to ``saved`` (end of a task step)."""
    active = t.active()
    if len(active) == len(saved) and all(a is b for a, b in zip(active, saved)):
        return
    mono = _mono()
    tid = t.tid
    while active and (len(active) > len(saved) or active[-1] is not saved[len(active) - 1]):
        _emit(active.pop(), EVENT_OFF, tid, mono)
    for s in saved[len(active) :]:
        _emit(s, EVENT_ON, tid, mono)
    t.set_active(list(saved))


class _StepObserver(collections.abc.Coroutine):
    """Wraps a task's coroutine: each step (send/throw) runs with the task's
    current span marked active on the thread, and the thread's previous state
    comes back when the step yields or finishes."""

    __slots__ = ("_coro",)

    def __init__(self, coro) -> None:
        self._coro = coro

    def _enter(self):
        t = _thread()
        saved = t.active()
        _switch_logged(t, _context_module.get_current().get(_SPAN_KEY))
        return t, saved

    def send(self, value):
        t, saved = self._enter()
        try:
            return self._coro.send(value)
        finally:
            _restore(t, saved)

    def throw(self, *args):
        t, saved = self._enter()
        try:
            return self._coro.throw(*args)
        finally:
            _restore(t, saved)

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


# ---------------------------------------------------------------------------
# Installing the hooks

_hooks_lock = threading.Lock()
_original_runtime_context = None
_original_create_task = None


def _install_hooks() -> None:
    global _original_runtime_context, _original_create_task, _fast_rc, _var_set, _var_reset, _var_get
    global _api_attach, _api_detach
    with _hooks_lock:
        current = _context_module._RUNTIME_CONTEXT
        if not isinstance(current, DeepspanRuntimeContext):
            _original_runtime_context = current
            current = _context_module._RUNTIME_CONTEXT = DeepspanRuntimeContext(current)
        if current._var is not None and _fast_rc is not current:
            if _fast_rc is not None:
                _fast_rc.__dict__.pop("attach", None)
                _fast_rc.__dict__.pop("detach", None)
            var = current._var
            _var_set, _var_reset, _var_get = var.set, var.reset, var.get
            _fast_rc = current
            current.attach, current.detach = _fast_attach, _fast_detach
        if (
            _fast_rc is current
            and _is_api_function(_context_module.attach, "attach")
            and _is_api_function(_context_module.detach, "detach")
        ):
            # Only the API's own functions are replaced, not someone else's
            # wrappers (those reach the runtime context, which records too).
            _api_attach, _api_detach = _context_module.attach, _context_module.detach
            _context_module.attach = _attach
            _context_module.detach = _detach
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
    global _original_runtime_context, _original_create_task, _fast_rc
    with _hooks_lock:
        if _context_module.attach is _attach:
            _context_module.attach = _api_attach
        if _context_module.detach is _detach:
            _context_module.detach = _api_detach
        if _fast_rc is not None:
            _fast_rc.__dict__.pop("attach", None)
            _fast_rc.__dict__.pop("detach", None)
            _fast_rc = None
        if _original_runtime_context is not None:
            _context_module._RUNTIME_CONTEXT = _original_runtime_context
            _original_runtime_context = None
        if _original_create_task is not None:
            asyncio.BaseEventLoop.create_task = _original_create_task
            _original_create_task = None


# ---------------------------------------------------------------------------
# Span events


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

    def __repr__(self) -> str:
        return f"ActivationEvent({self._name!r}, timestamp={self._timestamp}, tid={self._tid}, mono_ns={self._mono})"


def _make_events(start: int, attrs, acts: list) -> list:
    """The span events of the activations in ``acts``, for a span started at
    wall-clock ``start`` with attributes ``attrs`` (its monotonic start and
    end). Records after the end are left out (the hooks do not check that a
    span is live): the span's end closes every activation."""
    try:
        d = attrs._dict
        end = d[ATTR_MONO_END]
        # Wall-clock ns minus monotonic ns at the start, to time-stamp the
        # events in wall clock (so they fall between the span's start and end).
        off = start - d[ATTR_MONO_START]
        return [ActivationEvent(name, mono + off, tid, mono) for name, tid, mono in acts if mono <= end]
    except (AttributeError, KeyError, TypeError):  # attributes dropped by a limit, or unusual container
        d = getattr(attrs, "_dict", None)
        if not isinstance(d, dict):
            d = {}
        mono_start, end = d.get(ATTR_MONO_START), d.get(ATTR_MONO_END)
        off = start - mono_start if type(mono_start) is int else time.time_ns() - _mono()
        if type(end) is not int:
            end = None
        return [ActivationEvent(name, mono + off, tid, mono) for name, tid, mono in acts if end is None or mono <= end]


class _EventsWithActivations(collections.abc.Sequence):
    """What an ended span's event list becomes when activations were
    recorded: the SDK's own ``BoundedList`` (``_inner``) and the activations
    (``_acts``), which become ``ActivationEvent`` objects appended to it
    (after the span's own events; the oldest dropped beyond the SDK's event
    limit, as ``extend`` does) the first time anything reads the list.

    So ``end()`` on the application's thread does not pay for the event
    objects: an exporter does when it encodes the span (off the
    application's thread with ``BatchSpanProcessor``), and a span nobody
    reads never does. A slots-only object, the cheapest to make (switching
    the class of the SDK's list would copy its __dict__), registered as a
    virtual subclass of ``BoundedList`` (``ReadableSpan.dropped_events``
    checks that). Reads then go to a tuple of the events (``_items``): the
    SDK adds no event to an ended span, so no lock is needed, and reading
    costs what reading the SDK's list does.

    Everything a ``BoundedList`` offers is here: ``len``, iteration, indexing
    (and what ``Sequence`` builds on them), ``dropped``, ``_dq``, ``_lock``,
    ``repr``, copies, and ``append``/``extend`` (which go to the inner list)."""

    __slots__ = ("_inner", "_acts", "_attrs", "_start", "_items")

    def _materialize(self) -> tuple:
        inner = self._inner
        with inner._lock:
            acts = self._acts
            if acts is not None:
                events = _make_events(self._start, self._attrs, acts)
                dq = inner._dq
                if dq.maxlen is not None:
                    drop = len(dq) + len(events) - dq.maxlen
                    if drop > 0:
                        inner.dropped += drop
                dq.extend(events)
                self._acts = None
            items = self._items = tuple(inner._dq)
        return items

    def __iter__(self):
        items = self._items
        return iter(items if items is not None else self._materialize())

    def __len__(self) -> int:
        items = self._items
        return len(items if items is not None else self._materialize())

    def __getitem__(self, index):
        items = self._items
        return (items if items is not None else self._materialize())[index]

    @property
    def dropped(self) -> int:
        if self._items is None:
            self._materialize()
        return self._inner.dropped

    @property
    def _dq(self):
        if self._items is None:
            self._materialize()
        return self._inner._dq

    @property
    def _lock(self):
        return self._inner._lock

    def __repr__(self) -> str:
        if self._items is None:
            self._materialize()
        return repr(self._inner)

    def __copy__(self):
        if self._items is None:
            self._materialize()
        return copy.copy(self._inner)

    def __deepcopy__(self, memo):
        if self._items is None:
            self._materialize()
        return copy.deepcopy(self._inner, memo)

    def __reduce_ex__(self, protocol):
        if self._items is None:
            self._materialize()
        return self._inner.__reduce_ex__(protocol)

    def append(self, item) -> None:
        if self._items is None:
            self._materialize()
        self._inner.append(item)
        self._materialize()

    def extend(self, seq) -> None:
        if self._items is None:
            self._materialize()
        self._inner.extend(seq)
        self._materialize()


BoundedList.register(_EventsWithActivations)


# ---------------------------------------------------------------------------
# The span processor


def _put(span, k1: str, v1: int, k2: str | None = None, v2: int = 0) -> None:
    """Stores our int attributes on a span through the attribute container's
    public path (with its limits), even when the span has ended. The
    processor writes straight into the container's dict instead in the usual
    case: ``Span.set_attributes`` costs about 2 µs (lock, value cleaning,
    limit bookkeeping), twice the whole budget; our values are plain ints and
    no other thread can touch the span at these two moments (``on_start``
    runs before the span is returned to the caller, ``_on_ending`` after
    ``end()`` froze it and before any processor sees it). The SDK also
    freezes the attributes at ``end()``, and offers no public way to add one
    then, when the end time is known."""
    attrs = span._attributes
    frozen = getattr(attrs, "_immutable", False)
    try:
        attrs._immutable = False
        attrs[k1] = v1
        if k2 is not None:
            attrs[k2] = v2
    finally:
        attrs._immutable = frozen


def _end_attributes(span, mono: int) -> None:
    """The general way to store the end time: unusual attribute container,
    or the attribute limit reached (our start attributes, written straight
    into the dict, may be beyond it: they are put again through the limits,
    so the oldest attributes go first, as the SDK does)."""
    attrs = span._attributes
    d = getattr(attrs, "_dict", None)
    maxlen = getattr(attrs, "maxlen", None)
    if type(d) is dict and maxlen is not None and len(d) > maxlen:
        saved = {k: d.pop(k) for k in (ATTR_TID, ATTR_PID_NS, ATTR_MONO_START) if k in d}
        while len(d) > maxlen:
            del d[next(iter(d))]
            attrs.dropped = getattr(attrs, "dropped", 0) + 1
        for k, v in saved.items():
            _put(span, k, v)
    _put(span, ATTR_MONO_END, mono)


class DeepspanSpanProcessor(SpanProcessor):
    """Stores ``deepspan.tid`` and ``deepspan.mono_start_ns`` at start and
    ``deepspan.mono_end_ns`` at end, and the span's recorded activations as
    span events. Use :func:`install`, which also places it correctly and
    installs the activation hooks."""

    def on_start(self, span, parent_context=None) -> None:
        mono = _mono()
        span._deepspan = []
        try:
            tid = _local.tid
        except AttributeError:
            tid = _init_thread().tid
        try:
            # Straight into BoundedAttributes' dict (see _put); the limit is
            # checked at the end.
            d = span._attributes._dict
            d[ATTR_TID] = tid
            d[ATTR_MONO_START] = mono
            if _pid_ns is not None:
                d[ATTR_PID_NS] = _pid_ns
        except AttributeError:
            _put(span, ATTR_TID, tid, ATTR_MONO_START, mono)
            if _pid_ns is not None:
                _put(span, ATTR_PID_NS, _pid_ns)

    def _on_ending(self, span) -> None:
        # SDK >= 1.40: called by Span.end() before any processor's on_end, so
        # every exporter sees what is added here whatever the processor order.
        try:
            acts = span._deepspan
            attrs = span._attributes
            d = attrs._dict
            maxlen = attrs.maxlen
        except AttributeError:
            if hasattr(span, _MARK):
                _finish(span, _mono())
            return  # else started before this processor was added
        mono = _mono()
        if maxlen is None or len(d) < maxlen:
            d[ATTR_MONO_END] = mono
        else:
            _end_attributes(span, mono)
        if acts:
            events = span._events
            if type(events) is BoundedList:
                lazy = _EventsWithActivations()
                lazy._inner = events
                lazy._acts = acts
                lazy._attrs = attrs
                lazy._start = span._start_time
                lazy._items = None
                span._events = lazy
            else:
                events.extend(_make_events(span._start_time, attrs, acts))


def _finish(span, mono: int) -> None:
    """The end of a span whose attribute container is not the usual one."""
    _end_attributes(span, mono)
    acts = span._deepspan
    if acts:
        span._events.extend(_make_events(span._start_time, span._attributes, acts))


class _OnEndDeepspanSpanProcessor(DeepspanSpanProcessor):
    """For SDKs without ``_on_ending``: install() puts this processor first,
    so its on_end runs before the exporters' processors see the span (whose
    attribute and event containers are the live span's). on_end gets a
    ``ReadableSpan`` made for it, not the span: the activations are found
    through the event container both share, and added to it at once."""

    def on_start(self, span, parent_context=None) -> None:
        DeepspanSpanProcessor.on_start(self, span, parent_context)
        try:
            span._events._deepspan_acts = span._deepspan
        except Exception:
            pass

    def _on_ending(self, span) -> None:
        pass

    def on_end(self, span) -> None:
        events = span._events
        acts = getattr(events, "_deepspan_acts", None)
        if acts is None:
            return
        del events._deepspan_acts
        _end_attributes(span, _mono())
        if acts:
            events.extend(_make_events(span._start_time, span._attributes, acts))

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def install(tracer_provider: TracerProvider | None = None, activations: bool = True) -> DeepspanSpanProcessor:
    """Adds deepspan's span processor to ``tracer_provider`` (default: the
    global one, which must be an SDK ``TracerProvider``) and, unless
    ``activations`` is False, installs the activation hooks (once per
    process). Without them spans still get their tid and monotonic times,
    at about half the cost, but deepspan then cannot follow a request
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
