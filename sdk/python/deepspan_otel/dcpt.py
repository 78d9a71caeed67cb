"""In-band critical path tracing (DCPT: Lopez et al., a Stanford report).

A caller that wants to know where a request's time went sends the opt-in
header ``deepspan-dcpt: 1``. Every server with the middleware then answers
with ``deepspan-dcpt-path``: its own hop followed by the paths of the calls
on its critical path, recursively. For calls made in parallel that is DCPT's
``self ⊕ argmax(children)``; calls made one after the other are all on the
path, as siblings. The outermost service (which got no header but
samples the request) puts the result on its OpenTelemetry span as
``deepspan.dcpt.path`` and can log it. No collector is involved.

Wire format (version 2)
-----------------------
Request header: ``deepspan-dcpt: 1``. Any other value is "not asked".

Reply header ``deepspan-dcpt-path``, ASCII, at most 4096 bytes::

    value   = version *( ";" hop ) [ ";+" dropped ]      ; "2" written, "1" and "2" read
    hop     = [ up "^" ] [ call_us "@" ] service ":" operation ":" self_us ":" total_us [ ":" cause ":" cause_us ]
    service, operation, cause = *( ALPHA / DIGIT / "-" / "." / "_" / "~" / "/" / pct-encoded )
    up, call_us, self_us, total_us, cause_us, dropped = "0" / ( %x31-39 *DIGIT )   ; fits in 64 bits

Example, front calling inventory, pricing and media one after the other::

    2;front:GET%20/product:1500:48000;9500@inventory:GET%20/stock:9300:9400;1^12000@pricing:GET%20/price:11800:11900;1^25000@media:GET%20/image:24000:24800:disk-read:20000

- Hops are in preorder: a hop, then the hops of the calls on its critical
  path in the order they were made. The first hop (depth 0) is the
  outermost service. A hop's depth is the previous hop's plus one minus its
  ``up`` (0 when absent): with no markers the hops are a chain, ``1^`` makes
  a hop the sibling of the one before it, ``2^`` the sibling of that one's
  parent. Version 1 was that chain with no markers, and is still read.
- ``call_us``: how long the caller waited for the call (send to reply
  received, network and queues included), written by the caller when it
  relays the callee's value. ``call_us - total_us`` is the time between the
  two processes: the wire time that ``deepspan dcpt decode`` prints.
- Markers: a hop starts with a run of digits followed by ``^`` (up), then a
  run of digits followed by ``@`` (call). Digits followed by anything else
  belong to the service name, which may start with a digit; ``^`` and ``@``
  are always escaped in names.
- Strings are UTF-8, percent-encoded except for the RFC 3986 unreserved
  characters and ``/`` (routes stay readable); ``:``, ``;``, ``+``, ``,``,
  ``^``, ``@``, ``%``, spaces and control characters are always escaped, so
  the delimiters are unambiguous and the value is a valid HTTP field value
  with no comma (a proxy that folds repeated headers cannot split it). Each
  string is cut to 200 bytes (at a character boundary) before escaping.
- Why text and not base64 of a binary form: hops are mostly names, which
  base64 would grow by a third, while decimal microseconds cost about as much
  as varints would after base64 (7 characters for up to 10 s). Text needs no
  codec on either side, and ``curl -v`` shows it as it is.
- Times are microseconds: an HTTP hop costs tens of microseconds at least,
  so nanosecond digits would be noise that costs 3 bytes per number.
- ``cause``/``cause_us``: the hop's top kernel cause (e.g. ``cpu-wait``,
  ``disk-read``) and its time, when a kernel view is available (see
  ``kernel_cause`` of the middlewares).
- Truncation: when the value would exceed the bound, hops are dropped from
  the end (a prefix of a preorder is still a tree) and the last element
  ``+N`` says how many hops are missing; a relayed child's own ``+N`` adds
  to it. The dropped hops' time stays in their callers' totals. Every hop
  fits (names are cut to 200 bytes, so a hop is at most ~1.3 KiB), so the
  first hops are never lost. 4 KiB stays well under the ~8 KiB per header
  that common servers accept (nginx, Apache, Node), and a caller refuses
  child values longer than 8 KiB without parsing them.

Semantics
---------
- ``total_us`` of a hop: from the request's arrival in the middleware to the
  moment its reply headers are emitted (the header has to carry it, so later
  body streaming is not counted).
- Calls: those made through an instrumented client (``requests``,
  ``httpx``) while the request was being served, in the request's context
  (threads started with ``contextvars.copy_context().run`` and asyncio tasks
  keep it), which completed before the reply headers.
- The critical calls, as the caller measured them: walking back from the
  reply, the call that returned last, then the call that returned last
  before that one was sent, and so on (the last-returning-child walk of
  Jaeger's critical path). Of calls made in parallel that is the one the
  request waited for; when they were sent together, the slowest (DCPT's
  argmax). Calls made one after another are all critical.
- ``self_us = total_us - the sum of the critical calls' call_us`` (not less
  than 0): the time the hop spent on its own, or waiting for calls that were
  not critical.
- A call that answered without a (valid) path, e.g. an uninstrumented
  service or a failed call, still counts: its hop is ``host:port`` and
  ``METHOD /path`` with self = total = call = the duration the caller saw.
- Why not version 1 (``self ⊕ argmax(children)`` as a chain): it folded
  calls made one after the other into the caller's self time, so a service
  that called three slow services in turn could be named as the slow hop.

- Relaying: a hop does not decode its calls' values; it checks their size
  (at most 8 KiB) and characters (one regular-expression pass), reads the
  ``up`` markers to know how deep each one ends, and puts its own hop in
  front, cutting the end if needed. Decoding and re-encoding the whole path
  at every hop would make a chain's cost quadratic in its length (a full
  decode of 4 KiB takes about 1 ms in Python, the check 10 µs). So a value
  can reach a caller well-formed in characters but not in structure if some
  hop sent one; the outermost service decodes the merged path and, if that
  fails, names the calls whose values do not decode as hops of its own.

Cost: a request without the header, not sampled, costs one dict lookup. A
traced request keeps each call it made (two times, the reply value as
text, the callee's name) until its reply, and checks at most 8 KiB per
call's reply.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import random
import re
import threading
import time
import urllib.parse
from contextvars import ContextVar
from typing import Callable, Iterable, List, Optional, Tuple

REQUEST_HEADER = "deepspan-dcpt"
"""Opt-in header a caller sends (value ``1``) to get the path in the reply."""
REPLY_HEADER = "deepspan-dcpt-path"
"""Reply header that carries the encoded critical path."""
SPAN_ATTRIBUTE = "deepspan.dcpt.path"
"""Span attribute on which the outermost service stores the merged path."""
VERSION = "2"
"""The version written; version 1 (a chain, no markers) is still read."""
_READABLE_VERSIONS = ("1", "2")
MAX_HEADER_BYTES = 4096
"""Bound of an encoded path (the reply header's value)."""
MAX_ACCEPTED_BYTES = 8192
"""Longest child reply value a caller parses; longer ones are not parsed."""
MAX_NAME_BYTES = 200
"""Service, operation and cause names are cut to this many UTF-8 bytes."""

_U64_MAX = 2**64 - 1
_FIELD = re.compile(r"(?:[A-Za-z0-9\-._~/]|%[0-9A-Fa-f]{2})*\Z")
_NUMBER = re.compile(r"(?:0|[1-9][0-9]*)\Z")
# A hop's markers: digits then '^' (up), digits then '@' (call time).
_UP = re.compile(r"([0-9]*)\^")
_CALL = re.compile(r"([0-9]*)@")

logger = logging.getLogger("deepspan_otel.dcpt")


class DcptError(ValueError):
    """A ``deepspan-dcpt-path`` value that is not valid; ``offset`` is the byte
    offset in the value where the faulty element starts."""

    def __init__(self, offset: int, reason: str):
        super().__init__(f"invalid {REPLY_HEADER} value at byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Hop:
    """One service on the critical path: its time alone and in total."""

    service: str
    operation: str
    self_us: int
    total_us: int
    cause: Optional[str] = None
    """Top kernel cause of the hop's self time, when known."""
    cause_us: Optional[int] = None
    depth: int = 0
    """0 for the outermost service, its calls 1, theirs 2, …"""
    call_us: Optional[int] = None
    """How long the caller waited for this call, when the caller said."""


@dataclasses.dataclass(frozen=True)
class CriticalPath:
    """Hops in preorder from the outermost service (see :attr:`Hop.depth`);
    ``dropped`` hops are missing at the end because of the size bound."""

    hops: Tuple[Hop, ...]
    dropped: int = 0

    def parent(self, index: int) -> Optional[int]:
        """The index of the hop that made call ``index``, None for the first."""
        depth = self.hops[index].depth
        return next((i for i in range(index - 1, -1, -1) if self.hops[i].depth < depth), None)

    def wire_us(self, index: int) -> Optional[int]:
        """Time between hop ``index``'s caller and it (network, queues):
        ``call_us - total_us``, or for a version 1 chain the parent's total
        minus its self time minus the hop's total. None for the first hop,
        when unknown, or when the times do not add up (clocks that jumped)."""
        hop = self.hops[index]
        parent = self.parent(index)
        if parent is None:
            return None
        if hop.call_us is not None:
            wire = hop.call_us - hop.total_us
        else:
            caller = self.hops[parent]
            below = itertools.takewhile(lambda h: h.depth > caller.depth, self.hops[parent + 1 :])
            siblings = sum(1 for h in below if h.depth == hop.depth)
            # Only a lone call's wait is known from its caller's times.
            wire = caller.total_us - caller.self_us - hop.total_us if siblings == 1 else -1
        return wire if wire >= 0 else None


def _cut(name: str) -> str:
    # Lone surrogates (from undecodable bytes) become '?': the wire is UTF-8.
    return name.encode("utf-8", "replace")[:MAX_NAME_BYTES].decode("utf-8", "ignore")


# Names repeat (a service's name, its routes): escaping once per name halves
# the cost of a traced request. Bounded, as operations can be unbounded.
@functools.lru_cache(maxsize=4096)
def _escape(name: str) -> str:
    return urllib.parse.quote(_cut(name), safe="/")


def encode_hop(hop: Hop, up: int = 0) -> str:
    """The wire form of one hop (no separator); ``up`` levels above the
    previous hop's depth plus one."""
    text = f"{up}^" if up else ""
    if hop.call_us is not None:
        text += f"{int(hop.call_us)}@"
    text += f"{_escape(hop.service)}:{_escape(hop.operation)}:{int(hop.self_us)}:{int(hop.total_us)}"
    if hop.cause is not None:
        text += f":{_escape(hop.cause)}:{int(hop.cause_us or 0)}"
    return text


def encode(path: CriticalPath, limit: int = MAX_HEADER_BYTES) -> str:
    """The header value of ``path``, cut from the end to fit ``limit`` bytes,
    with ``+N`` counting every hop missing (``path.dropped`` included).
    Raises ValueError if the depths are not a preorder (the first 0, each at
    most one deeper than the one before, none other 0)."""
    parts = []
    previous = -1
    for index, hop in enumerate(path.hops):
        up = previous + 1 - hop.depth
        if up < 0 or (index > 0 and hop.depth < 1) or (index == 0 and hop.depth != 0):
            raise ValueError(f"hop {index} at depth {hop.depth} after depth {previous}: not a preorder")
        parts.append(encode_hop(hop, up))
        previous = hop.depth
    return _cut_to_fit(";".join([VERSION, *parts]), path.dropped, limit)


def _cut_to_fit(value: str, dropped: int, limit: int) -> str:
    """``value`` (no marker) with hops cut from its end until it fits
    ``limit`` bytes with its ``+N`` marker; the first hop always stays."""
    first_end = value.find(";", len(VERSION) + 1)
    end = len(value)
    if first_end != -1:
        while end > first_end and end + (len(f";+{dropped}") if dropped else 0) > limit:
            end = value.rfind(";", 0, end)
            dropped += 1
    return value[:end] + (f";+{dropped}" if dropped else "")


def _field(value: str, offset: int, what: str) -> str:
    if not _FIELD.match(value):
        bad = next(
            (i for i, c in enumerate(value) if not (c.isascii() and (c.isalnum() or c in "-._~/%"))),
            None,
        )
        if bad is not None:
            raise DcptError(offset + bad, f"{what} has a character that must be percent-encoded: {value[bad]!r}")
        raise DcptError(offset + value.index("%"), f"{what} has a '%' not followed by two hex digits")
    try:
        return urllib.parse.unquote_to_bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DcptError(offset, f"{what} is not UTF-8 once percent-decoded ({e.reason})") from None


def _number(value: str, offset: int, what: str) -> int:
    if not _NUMBER.match(value):
        raise DcptError(offset, f"{what} is not a decimal number without leading zeros: {value[:24]!r}")
    if len(value) > 20 or int(value) > _U64_MAX:
        raise DcptError(offset, f"{what} does not fit in 64 bits")
    return int(value)


def decode(value: str) -> CriticalPath:
    """Parse a ``deepspan-dcpt-path`` value; raises :class:`DcptError` (with the
    byte offset) on anything that is not exactly the format above."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError as e:
            raise DcptError(e.start, "not ASCII") from None
    if not value.isascii():
        at = next(i for i, c in enumerate(value) if not c.isascii())
        raise DcptError(len(value[:at].encode("utf-8")), "not ASCII")
    elements = value.split(";")
    version = elements[0]
    if version not in _READABLE_VERSIONS:
        raise DcptError(0, f"unknown version {version[:16]!r} (this decoder reads '1' and '2')")
    hops: List[Hop] = []
    dropped = 0
    offset = len(version) + 1
    for index, element in enumerate(elements[1:], start=1):
        if element.startswith("+"):
            if index != len(elements) - 1:
                raise DcptError(offset, "truncation marker '+N' is not the last element")
            dropped = _number(element[1:], offset + 1, "dropped hop count")
            if dropped == 0:
                raise DcptError(offset + 1, "truncation marker says 0 hops were dropped")
        else:
            previous = hops[-1].depth if hops else -1
            hops.append(_hop(element, offset, len(hops), previous, version == "2"))
        offset += len(element) + 1
    if not hops:
        raise DcptError(len(value), "no hops")
    return CriticalPath(tuple(hops), dropped)


def _hop(element: str, offset: int, index: int, previous_depth: int, markers: bool) -> Hop:
    start = offset
    up = 0
    call_us = None
    if markers:
        m = _UP.match(element)
        if m:
            up = _number(m.group(1), offset, f"hop {index} up count")
            if up == 0:
                raise DcptError(offset, f"hop {index} goes up 0 levels (an absent marker means that)")
            if index == 0:
                raise DcptError(start, "the first hop is the outermost service: it has no caller to go up to")
            if up > previous_depth:
                raise DcptError(start, f"hop {index} goes up {up} levels from depth {previous_depth}: it would be a second outermost hop")
            element, offset = element[m.end() :], offset + m.end()
        m = _CALL.match(element)
        if m:
            call_us = _number(m.group(1), offset, f"hop {index} call time")
            if index == 0:
                raise DcptError(start, "the first hop is the outermost service: no caller timed it")
            element, offset = element[m.end() :], offset + m.end()
    depth = previous_depth + 1 - up
    fields = element.split(":")
    if len(fields) not in (4, 6):
        raise DcptError(start, f"hop {index} has {len(fields)} ':'-separated fields, expected 4 or 6")
    starts = [offset]
    for f in fields[:-1]:
        starts.append(starts[-1] + len(f) + 1)
    service = _field(fields[0], starts[0], f"hop {index} service")
    operation = _field(fields[1], starts[1], f"hop {index} operation")
    self_us = _number(fields[2], starts[2], f"hop {index} self time")
    total_us = _number(fields[3], starts[3], f"hop {index} total time")
    if self_us > total_us:
        raise DcptError(starts[2], f"hop {index} self time {self_us} µs exceeds its total time {total_us} µs")
    cause = cause_us = None
    if len(fields) == 6:
        cause = _field(fields[4], starts[4], f"hop {index} kernel cause")
        cause_us = _number(fields[5], starts[5], f"hop {index} kernel cause time")
    return Hop(service, operation, self_us, total_us, cause, cause_us, depth, call_us)


# --- Per-request state --------------------------------------------------------

_current: ContextVar[Optional["_Request"]] = ContextVar("deepspan_dcpt_request", default=None)

# What a relayed value may contain: checked in one pass of a character class,
# so that a hop never decodes and re-encodes the whole path (which would make
# a chain quadratic). The outermost service decodes it fully.
_RELAYABLE = re.compile(r"[12];[A-Za-z0-9\-._~/%:;+^@]+\Z")
_LATER_UP_MARKERS = re.compile(r";([0-9]+)\^")


def _relayable(value) -> Optional[str]:
    """``value`` if it may be relayed as is (a call's reply header), else None."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("latin-1")
    if value is None or len(value) > MAX_ACCEPTED_BYTES or not _RELAYABLE.match(value):
        return None
    return value


@dataclasses.dataclass
class _Call:
    """A call made while serving a traced request: when it was sent and
    answered, the path its reply carried (checked text) and the callee."""

    start_ns: int
    end_ns: int
    value: Optional[str]
    callee: Tuple[str, str]

    def hops(self) -> Tuple[str, int]:
        """The call's hops as wire text (``;``-separated, the first one timed
        by the caller), and how many hops its value says were dropped. Text
        is sliced, never split into hops: a chain relays 4 KiB per hop."""
        call_us = (self.end_ns - self.start_ns) // 1000
        if self.value is None:
            own = Hop(self.callee[0], self.callee[1], call_us, call_us, call_us=call_us)
            return encode_hop(own), 0
        hops = self.value[len(VERSION) + 1 :]
        dropped = 0
        head, _, last = hops.rpartition(";")
        if last.startswith("+") and last[1:].isdigit():
            dropped, hops = int(last[1:]), head
        return f"{call_us}@{hops}", dropped


def _depth_of_last(hops: str) -> int:
    """How deep the last of ``hops`` (wire text) is below the first, read
    from the up markers; a version 1 value, with none, is a chain."""
    return hops.count(";") - sum(int(up) for up in _LATER_UP_MARKERS.findall(hops))


def critical_calls(calls: Iterable[_Call]) -> List[_Call]:
    """The calls on the request's critical path, in the order they were
    made: walking back from the reply, the call that returned last, then the
    one that returned last before it was sent, and so on. Ties go to the
    call sent first (the longer)."""
    chosen = []
    waiting_since = None
    for call in sorted(calls, key=lambda c: (-c.end_ns, c.start_ns)):
        if waiting_since is None or call.end_ns <= waiting_since:
            chosen.append(call)
            waiting_since = call.start_ns
    chosen.reverse()
    return chosen


class _Request:
    """One traced request being served: when it started and the calls it
    made (kept until its reply, when the critical ones are chosen)."""

    __slots__ = ("start_ns", "lock", "calls", "critical", "done")

    def __init__(self) -> None:
        self.start_ns = time.monotonic_ns()
        self.lock = threading.Lock()
        self.calls: List[_Call] = []
        self.critical: List[_Call] = []
        self.done = False

    def add_call(self, call: _Call) -> None:
        with self.lock:
            if self.done:
                return  # Ended after the reply headers: not on this request's path.
            self.calls.append(call)

    def finish(self) -> Tuple[int, int]:
        """Ends the request's measure and picks its critical calls: its
        total and self times in µs."""
        with self.lock:
            self.done = True
            total_ns = time.monotonic_ns() - self.start_ns
        # One call (a chain) or none is the common case: no walk needed.
        self.critical = self.calls if len(self.calls) < 2 else critical_calls(self.calls)
        waited_ns = sum(c.end_ns - c.start_ns for c in self.critical)
        return total_ns // 1000, max(0, total_ns - waited_ns) // 1000

    def value(self, own: Hop, limit: int) -> str:
        """The encoded path: ``own`` hop, then each critical call's hops,
        the calls as siblings one level below."""
        parts = [VERSION, encode_hop(own)]
        dropped = 0
        for index, call in enumerate(self.critical):
            hops, call_dropped = call.hops()
            if index > 0:
                # Back up from the previous call's last hop to a sibling of its first.
                hops = f"{last_depth + 1}^{hops}"
            if index + 1 < len(self.critical):
                last_depth = _depth_of_last(hops)
            parts.append(hops)
            dropped += call_dropped
        return _cut_to_fit(";".join(parts), dropped, limit)

    def forget_paths_that_do_not_decode(self) -> None:
        """Name the critical calls whose values are not valid paths as hops
        of their own (the values had the right characters only)."""
        for call in self.critical:
            if call.value is None:
                continue
            try:
                decode(call.value)
            except DcptError as e:
                logger.debug("ignoring the path relayed by %s: %s", call.callee[0], e)
                call.value = None


# --- Servers ------------------------------------------------------------------

KernelCause = Callable[[int], Optional[Tuple[str, int]]]
"""Called with the hop's self time in µs; returns its top kernel cause and its
time in µs, or None."""


class _Server:
    def __init__(
        self,
        service: str,
        sample_rate: float,
        kernel_cause: Optional[KernelCause],
        on_path: Optional[Callable[[CriticalPath, str], None]],
        log_level: Optional[int],
        limit: int,
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be within [0, 1], got {sample_rate}")
        if not 64 <= limit <= MAX_HEADER_BYTES:
            raise ValueError(f"limit must be within [64, {MAX_HEADER_BYTES}] bytes, got {limit}")
        self.service = service
        self.sample_rate = sample_rate
        self.kernel_cause = kernel_cause
        self.on_path = on_path
        self.log_level = log_level
        self.limit = limit

    def sampled(self) -> bool:
        return self.sample_rate > 0.0 and random.random() < self.sample_rate

    def finish(self, request: _Request, operation: str, asked: bool) -> str:
        """The reply header value; for an outermost request, also reports it."""
        total_us, self_us = request.finish()
        cause = self.kernel_cause(self_us) if self.kernel_cause is not None else None
        if cause is not None:
            cause = (str(cause[0]), min(max(0, int(cause[1])), _U64_MAX))
        own = Hop(self.service, operation, self_us, total_us, *(cause or ()))
        value = request.value(own, self.limit)
        if not asked:
            try:
                path = decode(value)
            except DcptError:
                request.forget_paths_that_do_not_decode()
                value = request.value(own, self.limit)
                path = decode(value)
            self._report(path, value)
        return value

    def _report(self, path: CriticalPath, value: str) -> None:
        from opentelemetry import trace

        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute(SPAN_ATTRIBUTE, value)
        if self.log_level is not None and logger.isEnabledFor(self.log_level):
            logger.log(self.log_level, "critical path of %s: %s", path.hops[0].operation, format_path(path))
        if self.on_path is not None:
            self.on_path(path, value)


def format_path(path: CriticalPath) -> str:
    """A one-line human form: ``service operation self/total µs`` per hop,
    ``->`` before a hop's calls, in brackets when it made several. Built in
    one loop, not by recursion: a decoded chain can be a thousand hops deep."""
    hops = path.hops
    parents: List[Optional[int]] = []
    calls = [0] * len(hops)
    ancestors: List[int] = []
    for index, hop in enumerate(hops):
        while ancestors and hops[ancestors[-1]].depth >= hop.depth:
            ancestors.pop()
        parents.append(ancestors[-1] if ancestors else None)
        if ancestors:
            calls[ancestors[-1]] += 1
        ancestors.append(index)

    text: List[str] = []
    bracketed: List[int] = []  # hops whose list of calls is open
    for index, hop in enumerate(hops):
        while bracketed and hops[bracketed[-1]].depth >= hop.depth:
            bracketed.pop()
            text.append("]")
        parent = parents[index]
        if parent is not None and parent == index - 1:
            text.append(" -> [" if calls[parent] > 1 else " -> ")
            if calls[parent] > 1:
                bracketed.append(parent)
        elif parent is not None:
            text.append("; ")
        text.append(f"{hop.service} {hop.operation} {hop.self_us}/{hop.total_us}µs")
        if hop.cause is not None:
            text.append(f" [{hop.cause} {hop.cause_us}µs]")
    text.append("]" * len(bracketed))
    if path.dropped:
        text.append(f" (+{path.dropped} hops dropped)")
    return "".join(text)


class DcptWsgiMiddleware:
    """Wraps a WSGI app: a request with ``deepspan-dcpt: 1`` (or, without the
    header, sampled at ``sample_rate``) is timed, its outgoing calls' paths are
    collected, and the reply gets ``deepspan-dcpt-path`` (asked) or the
    current span gets ``deepspan.dcpt.path`` and the path is logged and given
    to ``on_path(path, value)`` (outermost). ``operation(environ)`` names the
    hop (default ``METHOD /path``); ``kernel_cause`` adds the hop's top kernel
    cause."""

    def __init__(
        self,
        app,
        service: str,
        *,
        sample_rate: float = 0.0,
        operation: Optional[Callable[[dict], str]] = None,
        kernel_cause: Optional[KernelCause] = None,
        on_path: Optional[Callable[[CriticalPath, str], None]] = None,
        log_level: Optional[int] = logging.INFO,
        limit: int = MAX_HEADER_BYTES,
    ) -> None:
        self.app = app
        self.operation = operation or (lambda env: f"{env.get('REQUEST_METHOD', '')} {env.get('PATH_INFO', '')}")
        self._server = _Server(service, sample_rate, kernel_cause, on_path, log_level, limit)

    def __call__(self, environ, start_response):
        asked = environ.get("HTTP_DEEPSPAN_DCPT") == "1"
        if not asked and not self._server.sampled():
            return self.app(environ, start_response)
        request = _Request()
        operation = self.operation(environ)

        def dcpt_start_response(status, headers, exc_info=None):
            if not request.done:
                value = self._server.finish(request, operation, asked)
                if asked:
                    headers = [*headers, (REPLY_HEADER, value)]
            return start_response(status, headers, exc_info)

        token = _current.set(request)
        try:
            result = self.app(environ, dcpt_start_response)
        finally:
            _current.reset(token)
        if request.done:
            return result
        # start_response may come with the first chunk (PEP 3333): keep the
        # request current while the iterable runs.
        return _IterateInContext(result, request)


class _IterateInContext:
    def __init__(self, result: Iterable[bytes], request: _Request) -> None:
        self._result = result
        self._iterator = iter(result)
        self._request = request

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        if self._request.done:
            return next(self._iterator)
        token = _current.set(self._request)
        try:
            return next(self._iterator)
        finally:
            _current.reset(token)

    def close(self) -> None:
        close = getattr(self._result, "close", None)
        if close is not None:
            close()


class DcptAsgiMiddleware:
    """The ASGI counterpart of :class:`DcptWsgiMiddleware` (HTTP scopes only;
    others pass through). ``operation(scope)`` names the hop."""

    def __init__(
        self,
        app,
        service: str,
        *,
        sample_rate: float = 0.0,
        operation: Optional[Callable[[dict], str]] = None,
        kernel_cause: Optional[KernelCause] = None,
        on_path: Optional[Callable[[CriticalPath, str], None]] = None,
        log_level: Optional[int] = logging.INFO,
        limit: int = MAX_HEADER_BYTES,
    ) -> None:
        self.app = app
        self.operation = operation or (lambda scope: f"{scope.get('method', '')} {scope.get('path', '')}")
        self._server = _Server(service, sample_rate, kernel_cause, on_path, log_level, limit)

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        asked = any(name.lower() == b"deepspan-dcpt" and value == b"1" for name, value in scope.get("headers", ()))
        if not asked and not self._server.sampled():
            return await self.app(scope, receive, send)
        request = _Request()
        operation = self.operation(scope)

        async def dcpt_send(message):
            if message.get("type") == "http.response.start" and not request.done:
                value = self._server.finish(request, operation, asked)
                if asked:
                    reply = (REPLY_HEADER.encode(), value.encode())
                    message = {**message, "headers": [*message.get("headers", ()), reply]}
            await send(message)

        token = _current.set(request)
        try:
            await self.app(scope, receive, dcpt_send)
        finally:
            _current.reset(token)


# --- Clients ------------------------------------------------------------------


class OutgoingCall:
    """A call made while serving a traced request, from :func:`start_call`:
    send ``deepspan-dcpt: 1`` with it and hand its reply's path to
    :meth:`finish`. For RPC stacks other than requests/httpx."""

    __slots__ = ("_request", "_start_ns")

    def __init__(self, request: _Request) -> None:
        self._request = request
        self._start_ns = time.monotonic_ns()

    def finish(self, reply_value, callee: str, operation: str) -> None:
        """Record the call as a child of the request: with the path in
        ``reply_value`` (str, bytes or None), or, if there is none or it is
        not valid, as a hop named ``callee``/``operation`` lasting as long as
        the call did. The value is relayed as text, checked for its characters
        and size only; the outermost service decodes the merged path."""
        end_ns = time.monotonic_ns()
        value = _relayable(reply_value)
        if value is None and reply_value is not None:
            logger.debug("ignoring the path sent by %s: not a valid %s value", callee, REPLY_HEADER)
        self._request.add_call(_Call(self._start_ns, end_ns, value, (callee, operation)))


def start_call() -> Optional[OutgoingCall]:
    """An :class:`OutgoingCall` if the request being served in this context is
    traced (its outgoing calls must then ask for paths), else None."""
    request = _current.get()
    if request is None or request.done:
        return None
    return OutgoingCall(request)


def _http_call(url: str, method: str) -> Tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.netloc, f"{method} {parts.path or '/'}"


_original_requests_send = None


def instrument_requests() -> None:
    """Make every ``requests`` call (any session) ask for a path when the
    request being served is traced, and merge the reply's path into it.

    ``Session.send`` is wrapped, not the adapter's: it returns once the body
    is read (unless ``stream=True``), so the call lasts as long as the caller
    waited for the reply. A body slow to arrive (a slow link, a large
    image) is then the callee's time as the caller saw it, not the caller's
    own."""
    global _original_requests_send
    import requests

    if _original_requests_send is not None:
        return
    original = requests.Session.send

    def send(self, request, **kwargs):
        call = start_call()
        if call is None:
            return original(self, request, **kwargs)
        request.headers[REQUEST_HEADER] = "1"
        try:
            response = original(self, request, **kwargs)
        except BaseException:
            call.finish(None, *_http_call(request.url, request.method))
            raise
        call.finish(response.headers.get(REPLY_HEADER), *_http_call(request.url, request.method))
        return response

    _original_requests_send = original
    requests.Session.send = send


def uninstrument_requests() -> None:
    """Undo :func:`instrument_requests`."""
    global _original_requests_send
    import requests

    if _original_requests_send is not None:
        requests.Session.send = _original_requests_send
        _original_requests_send = None


class DcptHttpxTransport:
    """An ``httpx`` transport wrapper (sync: ``httpx.Client(transport=
    DcptHttpxTransport(httpx.HTTPTransport()))``) that asks for and merges
    paths like :func:`instrument_requests`."""

    def __init__(self, transport) -> None:
        self._transport = transport

    def handle_request(self, request):
        call = start_call()
        if call is None:
            return self._transport.handle_request(request)
        request.headers[REQUEST_HEADER] = "1"
        try:
            response = self._transport.handle_request(request)
        except BaseException:
            call.finish(None, *_http_call(str(request.url), request.method))
            raise
        call.finish(response.headers.get(REPLY_HEADER), *_http_call(str(request.url), request.method))
        return response

    def close(self) -> None:
        self._transport.close()

    def __enter__(self):
        self._transport.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._transport.__exit__(*exc)


class AsyncDcptHttpxTransport:
    """The ``httpx.AsyncClient`` counterpart of :class:`DcptHttpxTransport`."""

    def __init__(self, transport) -> None:
        self._transport = transport

    async def handle_async_request(self, request):
        call = start_call()
        if call is None:
            return await self._transport.handle_async_request(request)
        request.headers[REQUEST_HEADER] = "1"
        try:
            response = await self._transport.handle_async_request(request)
        except BaseException:
            call.finish(None, *_http_call(str(request.url), request.method))
            raise
        call.finish(response.headers.get(REPLY_HEADER), *_http_call(str(request.url), request.method))
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self):
        await self._transport.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._transport.__aexit__(*exc)
