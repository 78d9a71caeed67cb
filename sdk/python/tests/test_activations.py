"""deepspan fields and activation events: threads, thread pools, asyncio."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from opentelemetry import context, trace

import deepspan_otel
from deepspan_otel import ATTR_MONO_END, ATTR_MONO_NS, ATTR_MONO_START, ATTR_PID_NS, ATTR_TID, EVENT_OFF, EVENT_ON


def activations(span):
    return [(e.name == EVENT_ON, e.attributes[ATTR_TID], e.attributes[ATTR_MONO_NS]) for e in span.events if e.name in (EVENT_ON, EVENT_OFF)]


def check_thread_timelines(spans):
    """Replays every activation per thread, as deepspan does: on/off must nest
    like contexts (LIFO per thread), and the *active* span (innermost open
    activation) gives non-overlapping intervals per thread. Returns
    {tid: [(start, end, span name)]} of active intervals."""
    per_tid = {}
    for s in spans:
        for on, tid, mono in activations(s):
            per_tid.setdefault(tid, []).append((mono, on, s.name, s.context.span_id))
    timelines = {}
    for tid, evs in per_tid.items():
        by_time = {}
        for mono, on, name, sid in evs:
            by_time.setdefault(mono, ([], []))[1 if on else 0].append((name, sid))
        stack, active = [], []
        last_t = None
        for mono in sorted(by_time):
            offs, ons = by_time[mono]
            if stack and last_t is not None:
                active.append((last_t, mono, stack[-1][0]))
            # Deactivations at one instant close the innermost activations (LIFO).
            if offs:
                top = stack[len(stack) - len(offs) :]
                assert sorted(x[1] for x in top) == sorted(x[1] for x in offs), f"thread {tid}: {offs} are not the innermost activations of {stack}"
                del stack[len(stack) - len(offs) :]
            for name, sid in ons:
                assert sid not in [x[1] for x in stack], f"thread {tid}: {name} activated twice"
                stack.append((name, sid))
            last_t = mono
        assert not stack, f"thread {tid}: activations left open: {stack}"
        for (a0, a1, _), (b0, b1, _) in zip(active, active[1:]):
            assert a1 <= b0, f"thread {tid}: overlapping activations"
        timelines[tid] = active
    return timelines


def test_fields_and_nesting_on_one_thread(setup):
    t = setup.tracer
    with t.start_as_current_span("parent"):
        with t.start_as_current_span("child") as c:
            c.add_event("user event", {"k": "v"})
        time.sleep(0.001)
    spans = {s.name: s for s in setup.finished()}
    tid = threading.get_native_id()
    for s in spans.values():
        a = s.attributes
        assert a[ATTR_TID] == tid
        assert a[ATTR_MONO_START] <= a[ATTR_MONO_END]
        # Monotonic and wall durations agree (both measure the same interval).
        assert abs((a[ATTR_MONO_END] - a[ATTR_MONO_START]) - (s.end_time - s.start_time)) < 2_000_000
        acts = activations(s)
        assert [x[0] for x in acts] == [True, False], s.name
        assert all(x[1] == tid for x in acts)
        assert a[ATTR_MONO_START] <= acts[0][2] <= acts[1][2] <= a[ATTR_MONO_END]
    # Activations nest: the child's lie inside the parent's.
    p, c = activations(spans["parent"]), activations(spans["child"])
    assert p[0][2] <= c[0][2] <= c[1][2] <= p[1][2]
    # The user's event is kept, and event times are wall clock consistent with the span.
    assert spans["child"].events[0].name == "user event"
    for e in spans["child"].events:
        assert spans["child"].start_time - 1_000_000 <= e.timestamp <= spans["child"].end_time + 1_000_000
    tl = check_thread_timelines(spans.values())
    assert [x[2] for x in tl[tid]] == ["parent", "child", "parent"]


def test_threads_get_their_own_tid(setup):
    t = setup.tracer
    tids = {}

    def work(name):
        tids[name] = threading.get_native_id()
        with t.start_as_current_span(name):
            time.sleep(0.002)

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    spans = setup.finished()
    assert len(spans) == 4
    assert len(set(tids.values())) == 4
    for s in spans:
        assert s.attributes[ATTR_TID] == tids[s.name]
        assert {x[1] for x in activations(s)} == {tids[s.name]}
    check_thread_timelines(spans)


def test_thread_pool_follows_the_request(setup):
    t = setup.tracer
    worker_tids = set()

    def job(ctx, i):
        worker_tids.add(threading.get_native_id())
        token = context.attach(ctx)  # what context-propagating executors do
        try:
            with t.start_as_current_span(f"job{i}"):
                time.sleep(0.001)
        finally:
            context.detach(token)

    with ThreadPoolExecutor(max_workers=2) as pool:
        with t.start_as_current_span("request") as req:
            ctx = context.get_current()
            futures = [pool.submit(job, ctx, i) for i in range(6)]
            for f in futures:
                f.result()
    spans = {s.name: s for s in setup.finished()}
    main = threading.get_native_id()
    req = spans["request"]
    assert req.attributes[ATTR_TID] == main
    acts = activations(req)
    # The request is active on the main thread and, in turn, on each worker.
    assert {x[1] for x in acts} == {main} | worker_tids
    for i in range(6):
        j = spans[f"job{i}"]
        assert j.attributes[ATTR_TID] in worker_tids
        assert j.parent.span_id == req.context.span_id
    tl = check_thread_timelines(spans.values())
    for w in worker_tids:
        names = [x[2] for x in tl[w]]
        # On a worker, every job runs inside an activation of the request.
        assert set(names) <= {"request"} | {f"job{i}" for i in range(6)}
        assert any(n.startswith("job") for n in names)


def test_asyncio_tasks_interleave_on_one_thread(setup):
    t = setup.tracer
    order = []

    async def request(name, other_started, me_started):
        with t.start_as_current_span(name):
            me_started.set()
            for i in range(3):
                order.append(name)
                await asyncio.sleep(0)  # let the other request run on this thread
            await other_started.wait()
            with t.start_as_current_span(f"{name}.db"):
                await asyncio.sleep(0.001)

    async def main():
        a_started, b_started = asyncio.Event(), asyncio.Event()
        await asyncio.gather(request("A", b_started, a_started), request("B", a_started, b_started))

    asyncio.run(main())
    assert order[:4] == ["A", "B", "A", "B"], order  # really interleaved
    spans = {s.name: s for s in setup.finished()}
    tid = threading.get_native_id()
    for s in spans.values():
        assert s.attributes[ATTR_TID] == tid
        assert {x[1] for x in activations(s)} == {tid}
    # Each request is switched in and out at every step: several activations.
    assert len(activations(spans["A"])) >= 6
    assert len(activations(spans["B"])) >= 6
    tl = check_thread_timelines(spans.values())
    # While A's task runs, A (or its child) is active, never B, and vice versa.
    names = [x[2] for x in tl[tid]]
    switches = sum(1 for a, b in zip(names, names[1:]) if a[0] != b[0])
    assert switches >= 3, names


def test_non_recording_and_foreign_spans_are_ignored(setup):
    from opentelemetry.sdk.trace import TracerProvider

    other = TracerProvider().get_tracer("other")  # no deepspan processor
    with other.start_as_current_span("foreign"):
        with setup.tracer.start_as_current_span("ours"):
            pass
    with trace.use_span(trace.INVALID_SPAN):
        pass
    spans = setup.finished()
    assert [s.name for s in spans] == ["ours"]
    assert len(activations(spans[0])) == 2


def test_install_is_idempotent_and_checks_the_provider(setup):
    assert deepspan_otel.install(setup.provider) is setup.processor
    import pytest

    with pytest.raises(TypeError, match="TracerProvider"):
        deepspan_otel.install(trace.NoOpTracerProvider())


def test_the_pid_namespace_is_said_only_in_a_containers_own(setup, monkeypatch):
    # This process runs in the host's namespace: its ids are the kernel's.
    assert deepspan_otel._pid_namespace() is None
    t = setup.tracer
    with t.start_as_current_span("on the host"):
        pass
    # As in a container with a PID namespace of its own (the inode of
    # /proc/self/ns/pid there).
    monkeypatch.setattr(deepspan_otel, "_pid_ns", 4026532999)
    with t.start_as_current_span("in a container"):
        pass
    spans = {s.name: s for s in setup.finished()}
    assert ATTR_PID_NS not in spans["on the host"].attributes
    assert spans["in a container"].attributes[ATTR_PID_NS] == 4026532999
    assert spans["in a container"].attributes[ATTR_TID] == threading.get_native_id()
