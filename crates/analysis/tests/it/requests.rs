//! Request critical paths, summaries and the parallel model build on small
//! hand-made event sequences whose answers are known.

use crate::common::requests::{request, Work};
use crate::common::script::Script;

use deepspan_analysis::{
    aggregate, analyze_requests, build_model, summarize, Arch, Arrival, ArrivalBy, CpuWait,
    EdgeType, HeldBack, Input, KernelModel, RequestAnalysis, RequestPath, SpanIdx, SpanInput,
    StateBuilder, SyncSource,
};
use deepspan_model::{Event, EventKind, Tid};

const FUTEX: i64 = 202;

/// Holder (tid 1, CPU 0) sleeps 10..100 holding a lock, then releases it at
/// 105, waking the waiter (tid 2, CPU 1) blocked in a futex since 20.
fn lock_scenario() -> (KernelModel, Vec<SpanInput>, Work) {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .switch(2, 1, 0, 0, 2)
        .enter(9, 0, 230, 0) // clock_nanosleep
        .switch(10, 0, 1, 1, 0)
        .enter(20, 1, FUTEX, 0x1000)
        .switch(21, 1, 2, 1, 0)
        .timer(100, 0, 1)
        .switch(101, 0, 0, 0, 1)
        .exit(102, 0, 230, 0)
        .waking(105, 0, 2)
        .switch(106, 1, 0, 0, 2)
        .exit(107, 1, FUTEX, 0)
        .switch(110, 0, 1, 1, 0)
        .switch(130, 1, 2, 1, 0);
    let spans = vec![request(1, 0, 110), request(2, 15, 120)];
    let work = Work(vec![(1, 0, 110, 0), (2, 15, 120, 1)]);
    (s.model(), spans, work)
}

struct Analysed {
    paths: Vec<RequestPath>,
    request_of: Vec<SpanIdx>,
    shared_states: usize,
}

fn analyze(model: &KernelModel, spans: &[SpanInput], work: &Work) -> Analysed {
    let mut paths = Vec::new();
    let mut last_done = 0;
    let a: RequestAnalysis = analyze_requests(
        model,
        spans,
        work,
        &mut |done, _| last_done = done,
        &mut |p| paths.push(p),
    );
    assert_eq!(last_done, paths.len());
    assert_eq!(a.requests, paths.len());
    paths.sort_by_key(|p| p.request);
    Analysed {
        paths,
        request_of: a.request_of,
        shared_states: a.shared_states,
    }
}

#[test]
fn waiter_is_blocked_by_the_holders_request() {
    let (model, spans, work) = lock_scenario();
    let a = analyze(&model, &spans, &work);
    assert_eq!(a.paths.len(), 2);
    let waiter = &a.paths[1];
    assert_eq!(
        (waiter.start, waiter.end, waiter.sync),
        (15, 120, SyncSource::Exact)
    );
    // Contiguous over the request.
    let mut t = waiter.start;
    for p in &waiter.pieces {
        assert_eq!(p.start, t, "{:#?}", waiter.pieces);
        t = p.end;
    }
    assert_eq!(t, waiter.end);
    // While the holder sleeps with the lock, the waiter's path is the
    // holder's TIMER state, blamed on the holder's request.
    let blocked: u64 = waiter
        .pieces
        .iter()
        .filter(|p| p.blocked_by == Some(0))
        .map(|p| p.duration())
        .sum();
    assert!(blocked >= 80, "{:#?}", waiter.pieces);
    assert!(waiter
        .pieces
        .iter()
        .any(|p| p.blocked_by == Some(0) && p.tid == Some(1) && p.state == EdgeType::Timer));
    // … and says the waiter waited in its futex meanwhile.
    let summary = summarize(&model, Arch::X86_64, waiter);
    assert_eq!(summary.total_ns, 105);
    assert_eq!(summary.by_blocking[0].0, 0);
    assert!(
        summary.by_syscall[0].0.starts_with("futex(uaddr=0x1000)"),
        "{summary:?}"
    );
    // The holder is blocked by nobody.
    assert!(a.paths[0].pieces.iter().all(|p| p.blocked_by.is_none()));
    // Both paths go through the holder's sleep: shared states in the merge.
    assert!(a.shared_states > 0);
    let holder = summarize(&model, Arch::X86_64, &a.paths[0]);
    let ops = aggregate([(&a.paths[0], &holder), (&a.paths[1], &summary)], |_| "op");
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].requests, 2);
}

#[test]
fn a_span_inside_the_request_is_not_blocking_it() {
    // The holder's thread works for a child span of the waiter's request
    // (e.g. a downstream call): its time is the request's own.
    let (model, mut spans, _) = lock_scenario();
    spans.push(SpanInput {
        parent: Some(1),
        ..SpanInput::default()
    });
    let work = Work(vec![(1, 0, 110, 2), (2, 15, 120, 1)]);
    let a = analyze(&model, &spans, &work);
    assert_eq!(a.request_of[2], 1);
    let waiter = a.paths.iter().find(|p| p.request == 1).unwrap();
    assert!(
        waiter.pieces.iter().all(|p| p.blocked_by.is_none()),
        "{:#?}",
        waiter.pieces
    );
    assert!(waiter.pieces.iter().any(|p| p.span == Some(2)));
}

#[test]
fn idle_cpu_while_preempted_is_throttling_and_others_are_contention() {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3)
        .switch(10, 0, 3, 0, 0) // preempted, CPU left idle: throttled
        .switch(50, 0, 0, 0, 3)
        .switch(60, 0, 3, 0, 4) // preempted by thread 4: contention
        .switch(70, 0, 4, 1, 3)
        .switch(80, 0, 3, 1, 0);
    let model = s.model();
    let spans = vec![request(3, 5, 75)];
    let work = Work(vec![(3, 5, 75, 0)]);
    let a = analyze(&model, &spans, &work);
    let pre: Vec<_> = a.paths[0]
        .pieces
        .iter()
        .filter(|p| p.state == EdgeType::Preempted)
        .collect();
    let throttled: u64 = pre
        .iter()
        .filter_map(|p| p.cpu_wait)
        .map(|w| w.throttled_ns)
        .sum();
    let contended: u64 = pre
        .iter()
        .filter_map(|p| p.cpu_wait)
        .map(|w| w.contended_ns)
        .sum();
    assert_eq!((throttled, contended), (40, 10), "{pre:#?}");
    let holder = pre.iter().filter_map(|p| p.cpu_wait).find_map(|w| w.holder);
    assert_eq!(holder, Some(4));
}

#[test]
fn a_request_that_arrived_while_its_loop_ran_another_is_queued_behind_it() {
    // An event loop (thread 3) runs request 0 from 10 to 160; request 1
    // arrived at 20 and its span runs from 170 to 200 on the same loop.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3).switch(300, 0, 3, 1, 0);
    let model = s.model();
    let mut spans = vec![request(3, 10, 160), request(3, 170, 200)];
    let arrival = Arrival {
        ts: 20,
        by: ArrivalBy::ClientSend,
    };
    spans[1].arrival = Some(arrival);
    let work = Work(vec![(3, 10, 160, 0), (3, 170, 200, 1)]);
    let a = analyze(&model, &spans, &work);
    let (first, queued) = (&a.paths[0], &a.paths[1]);
    assert!(first.queue.is_empty() && first.arrival.is_none());
    assert_eq!((queued.arrival, queued.queue_ns()), (Some(arrival), 150));
    let q: Vec<_> = queued
        .queue
        .iter()
        .map(|p| (p.start, p.end, p.state, p.blocked_by))
        .collect();
    assert_eq!(
        q,
        vec![
            (20, 160, EdgeType::Running, Some(0)),
            (160, 170, EdgeType::Running, None)
        ]
    );
    // The span's own path is what it was without the queue.
    let own: Vec<_> = queued.pieces.iter().map(|p| (p.start, p.end)).collect();
    assert_eq!(own, vec![(170, 200)]);
    assert_eq!(queued.home.first().map(|h| h.start), Some(170));
    // The queue as a path of its own, for summaries and diagnoses.
    let path = queued.queue_path().unwrap();
    assert_eq!((path.start, path.end, path.pieces.len()), (20, 170, 2));
}

#[test]
fn a_request_alone_on_an_idle_loop_is_queued_behind_nothing() {
    // The loop (thread 3) sleeps until the request's bytes wake it at 150,
    // reads and parses them, and starts the span at 160.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3)
        .switch(5, 0, 3, 1, 0)
        .waking(150, 0, 3)
        .switch(151, 0, 0, 0, 3)
        .switch(300, 0, 3, 1, 0);
    let model = s.model();
    let mut spans = vec![request(3, 160, 200)];
    spans[0].arrival = Some(Arrival {
        ts: 150,
        by: ArrivalBy::ClientSend,
    });
    let a = analyze(&model, &spans, &Work(vec![(3, 160, 200, 0)]));
    let path = &a.paths[0];
    assert_eq!(path.queue_ns(), 10);
    assert_eq!(path.queue.first().map(|p| p.start), Some(150));
    assert_eq!(path.queue.last().map(|p| p.end), Some(160));
    assert!(
        path.queue.iter().all(|p| p.blocked_by.is_none()),
        "{:#?}",
        path.queue
    );
}

#[test]
fn before_its_thread_was_made_a_queue_is_on_the_thread_that_made_it() {
    // An acceptor (thread 2) runs from 1; the request arrives at 20; the
    // acceptor forks thread 5 for its connection at 50, which starts the
    // span at 70.
    let mut s = Script::default();
    let acceptor = s.comm(2);
    s.switch(1, 0, 0, 0, 2).ev(
        50,
        0,
        EventKind::SchedProcessFork {
            parent_tid: 2,
            parent_comm: acceptor,
            child_tid: 5,
            child_comm: acceptor,
        },
    );
    s.switch(52, 1, 0, 0, 5)
        .switch(100, 1, 5, 1, 0)
        .switch(120, 0, 2, 1, 0);
    let model = s.model();
    let mut spans = vec![request(5, 70, 90)];
    spans[0].arrival = Some(Arrival {
        ts: 20,
        by: ArrivalBy::ClientSend,
    });
    let a = analyze(&model, &spans, &Work(vec![(5, 70, 90, 0)]));
    let queue = &a.paths[0].queue;
    let first = queue.first().expect("a queue path");
    assert_eq!((first.start, first.tid), (20, Some(2)), "{queue:#?}");
    assert_eq!(queue.last().map(|p| (p.end, p.tid)), Some((70, Some(5))));
    assert!(
        queue.iter().all(|p| p.state != EdgeType::Unknown),
        "{queue:#?}"
    );
}

#[test]
fn requests_without_threads_have_no_path_and_gaps_are_unknown() {
    let (model, mut spans, work) = lock_scenario();
    spans.push(SpanInput {
        times: Some((0, 50)),
        ..SpanInput::default()
    });
    // Runs past the end of the trace (130): the rest is UNKNOWN.
    spans[1].times = Some((15, 200));
    let a = analyze(&model, &spans, &work);
    let unplaced = a.paths.iter().find(|p| p.request == 2).unwrap();
    assert_eq!(unplaced.sync, SyncSource::None);
    assert!(unplaced.pieces.is_empty());
    let waiter = a.paths.iter().find(|p| p.request == 1).unwrap();
    let last = waiter.pieces.last().unwrap();
    assert_eq!((last.end, last.state), (200, EdgeType::Unknown));
}

#[test]
fn parallel_build_gives_the_sequential_model() {
    let mut s = Script::default();
    // Two CPUs with interleaved and equal timestamps.
    s.switch(1, 0, 0, 0, 1)
        .switch(1, 1, 0, 0, 2)
        .enter(5, 0, FUTEX, 7)
        .switch(6, 0, 1, 1, 0)
        .waking(8, 1, 1)
        .switch(8, 0, 0, 0, 1)
        .exit(9, 0, FUTEX, 0)
        .switch(12, 1, 2, 0, 3)
        .switch(20, 0, 1, 1, 0);
    let streams: Vec<Vec<Result<Input, ()>>> = (0..2)
        .map(|cpu| {
            let mut v: Vec<Result<Input, ()>> = s
                .events
                .iter()
                .filter(|e| e.cpu == cpu)
                .cloned()
                .map(|e| Ok(Input::Event(e)))
                .collect();
            if cpu == 1 {
                v.insert(
                    1,
                    Ok(Input::Lost {
                        cpu: 1,
                        ts: 8,
                        count: 3,
                    }),
                );
            }
            v
        })
        .collect();
    // The sequential reference: the same merge order (time, then stream).
    let mut merged: Vec<(u64, usize, usize, Input)> = Vec::new();
    for (cpu, v) in streams.iter().enumerate() {
        for (i, x) in v.iter().enumerate() {
            let x = x.clone().unwrap();
            let ts = match &x {
                Input::Event(e) => e.ts,
                Input::Lost { ts, .. }
                | Input::Segment { ts, .. }
                | Input::BlockedSyscall { ts, .. }
                | Input::SocketCall { ts, .. }
                | Input::IdleSwitch { ts, .. } => *ts,
            };
            merged.push((ts, cpu, i, x));
        }
    }
    merged.sort_by_key(|m| (m.0, m.1, m.2));
    let mut b = StateBuilder::new();
    for (_, _, _, x) in &merged {
        match x {
            Input::Event(e) => b.push(e),
            Input::Lost { cpu, ts, .. } => b.lost(*cpu, *ts),
            Input::Segment {
                cpu,
                ts,
                tid,
                key,
                direction,
            } => b.segment(*ts, *cpu, *tid, *key, *direction),
            Input::BlockedSyscall {
                ts,
                tid,
                nr,
                args,
                read_chars,
            } => b.blocked_syscall(*ts, *tid, *nr, *args, *read_chars),
            Input::SocketCall {
                ts,
                tid,
                sent,
                bytes,
                socket,
            } => b.socket_call(*ts, *tid, *sent, *bytes, *socket),
            Input::IdleSwitch { cpu, ts, tid } => b.idle_switch(*ts, *cpu, *tid),
        }
    }
    let sequential = b.finish();
    let (parallel, lost) = build_model(
        StateBuilder::new(),
        streams.into_iter().map(|v| v.into_iter()).collect(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(sequential.lost_ranges(), parallel.lost_ranges());
    for t in sequential.threads() {
        let p = parallel.thread(t.tid).unwrap();
        assert_eq!(t.states(), p.states(), "thread {}", t.tid);
        assert_eq!(t.syscalls(), p.syscalls(), "thread {}", t.tid);
    }
    assert_eq!(lost.total(), 3);
    // Without the graph: the same histories, no critical paths.
    let streams: Vec<Vec<Result<Input, ()>>> = (0..2)
        .map(|cpu| {
            s.events
                .iter()
                .filter(|e| e.cpu == cpu)
                .cloned()
                .map(|e| Ok(Input::Event(e)))
                .collect()
        })
        .collect();
    let (lean, _) = build_model(
        StateBuilder::without_graph(),
        streams.into_iter().map(|v| v.into_iter()).collect(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(lean.graph().vertex_count(), 0);
    for t in sequential.threads() {
        assert_eq!(t.states(), lean.thread(t.tid).unwrap().states());
    }
    assert_eq!(lost.in_range(0, 100), 3);
    assert_eq!(lost.in_range(50, 100), 0);

    // A stream's error stops the build and is returned.
    let failing: Vec<std::vec::IntoIter<Result<Input, &str>>> =
        vec![vec![Ok(Input::Event(s.events[0].clone())), Err("bad page")].into_iter()];
    assert_eq!(
        build_model(StateBuilder::new(), failing, &mut |_| {}).err(),
        Some("bad page")
    );
}

#[test]
fn syscall_labels_name_what_was_waited_for() {
    let (model, _, _) = lock_scenario();
    let th = model.thread(2).unwrap();
    let futex = th.syscalls()[0];
    assert_eq!(
        deepspan_analysis::syscall_label(&model, Arch::X86_64, &futex),
        "futex(uaddr=0x1000)"
    );
}

#[test]
fn a_missed_switch_is_inferred_from_the_threads_own_events() {
    // Some recordings lack the switch from the idle task to a woken thread;
    // the thread's next event on that CPU proves it runs there.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 5)
        .switch(5, 0, 5, 1, 0)
        .timer(10, 0, 5);
    s.events.push(Event {
        ts: 20,
        cpu: 0,
        tid: 5,
        kind: EventKind::SysEnter {
            id: 0,
            name: None,
            args: [3, 0, 0, 0, 0, 0],
        },
    });
    s.switch(30, 0, 5, 1, 0);
    let m = s.model();
    let states: Vec<_> = m
        .thread(5)
        .unwrap()
        .states()
        .iter()
        .map(|x| (x.start, x.end, x.state))
        .collect();
    use deepspan_analysis::{BlockReason, ThreadState};
    assert_eq!(
        states[..4],
        [
            (1, 5, ThreadState::Running),
            (5, 10, ThreadState::Blocked(BlockReason::Timer)),
            (10, 20, ThreadState::WaitCpu),
            (20, 30, ThreadState::Running),
        ]
    );
    assert_eq!(m.stats().inferred_switches, 1);
    assert_eq!(m.thread(5).unwrap().syscalls().len(), 1);
}

#[test]
fn parallel_merge_keeps_the_readers_order_on_random_streams() {
    // Three streams with many equal timestamps: the model must see the
    // items in (time, stream, position) order whatever the batching.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut streams: Vec<Vec<Event>> = vec![Vec::new(); 3];
    for (cpu, s) in streams.iter_mut().enumerate() {
        let mut ts = 1;
        for _ in 0..20_000 {
            ts += rnd(3);
            let tid = 1 + rnd(4) as Tid;
            let enter = rnd(2) == 0;
            s.push(Event {
                ts,
                cpu: cpu as u32,
                tid,
                kind: if enter {
                    EventKind::SysEnter {
                        id: rnd(5) as i64,
                        name: None,
                        args: [rnd(100), 0, 0, 0, 0, 0],
                    }
                } else {
                    EventKind::SysExit {
                        id: rnd(5) as i64,
                        name: None,
                        ret: rnd(10) as i64,
                    }
                },
            });
        }
    }
    let mut all: Vec<(u64, usize, usize, Event)> = Vec::new();
    for (cpu, s) in streams.iter().enumerate() {
        for (i, e) in s.iter().enumerate() {
            all.push((e.ts, cpu, i, e.clone()));
        }
    }
    all.sort_by_key(|x| (x.0, x.1, x.2));
    let mut b = StateBuilder::new();
    for x in &all {
        b.push(&x.3);
    }
    let sequential = b.finish();
    let inputs: Vec<std::vec::IntoIter<Result<Input, ()>>> = streams
        .into_iter()
        .map(|s| {
            s.into_iter()
                .map(|e| Ok(Input::Event(e)))
                .collect::<Vec<_>>()
                .into_iter()
        })
        .collect();
    let (parallel, _) = build_model(StateBuilder::new(), inputs, &mut |_| {}).unwrap();
    assert_eq!(sequential.stats(), parallel.stats());
    for t in sequential.threads() {
        let p = parallel.thread(t.tid).unwrap();
        assert_eq!(t.states(), p.states(), "thread {}", t.tid);
        assert_eq!(t.syscalls(), p.syscalls(), "thread {}", t.tid);
    }
}

/// Thread 3 waits 20 ms while threads 4 and 5 take ten 2 ms turns, then
/// runs the rest of its request: (model, the request's end).
fn skipped_in_the_rotation() -> (KernelModel, u64) {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3);
    let turn = 2_000_000;
    let mut prev = 3;
    for i in 0..10u64 {
        let next = if i % 2 == 0 { 4 } else { 5 };
        s.switch(10 + i * turn, 0, prev, 0, next);
        prev = next;
    }
    s.switch(10 + 10 * turn, 0, prev, 0, 3)
        .switch(10 + 10 * turn + 100, 0, 3, 1, 0);
    (s.model(), 10 + 10 * turn + 50)
}

/// The CPU waits on the critical path of thread 3's request from 5 to
/// `end`.
fn cpu_waits(model: &KernelModel, end: u64) -> Vec<CpuWait> {
    let spans = vec![request(3, 5, end)];
    let work = Work(vec![(3, 5, end, 0)]);
    let a = analyze(model, &spans, &work);
    let pieces = &a.paths[0].pieces;
    pieces.iter().filter_map(|p| p.cpu_wait).collect()
}

/// (contended, throttled, wake-up) ns of `waits`.
fn wait_sums(waits: &[CpuWait]) -> (u64, u64, u64) {
    let sum = |f: fn(&CpuWait) -> u64| waits.iter().map(f).sum();
    (
        sum(|w| w.contended_ns),
        sum(|w| w.throttled_ns),
        sum(|w| w.wakeup_ns),
    )
}

#[test]
fn a_thread_skipped_in_the_rotation_is_held_back() {
    // A fair scheduler would have run 3 before either got a third turn.
    let (model, end) = skipped_in_the_rotation();
    let waits = cpu_waits(&model, end);
    let turn = 2_000_000;
    // From the third turn of thread 4 (at 8 ms into the wait) on.
    assert_eq!(wait_sums(&waits), (4 * turn, 6 * turn, 0), "{waits:?}");
}

#[test]
fn a_complete_throttling_capture_replaces_the_inference() {
    // The recorder's capture saw no throttled switch-out: the rotation
    // that skipped thread 3 was contention (busy threads of other cgroups
    // do that with no quota at all), and the idle CPU after a preemption
    // was the scheduler's latency.
    let (mut model, end) = skipped_in_the_rotation();
    model.set_held_back(HeldBack::from_switches([], &model));
    let waits = cpu_waits(&model, end);
    assert_eq!(wait_sums(&waits), (20_000_000, 0, 0), "{waits:?}");

    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3)
        .switch(10, 0, 3, 0, 0) // preempted, CPU left idle
        .switch(50, 0, 0, 0, 3)
        .switch(80, 0, 3, 1, 0);
    let mut model = s.model();
    assert_eq!(wait_sums(&cpu_waits(&model, 75)), (0, 40, 0));
    model.set_held_back(HeldBack::from_switches([], &model));
    assert_eq!(wait_sums(&cpu_waits(&model, 75)), (0, 0, 40));
    // A capture with gaps (records lost) keeps the inference.
    model.set_held_back(HeldBack::from_switches([], &model).with_gaps());
    assert_eq!(wait_sums(&cpu_waits(&model, 75)), (0, 40, 0));
    // What the capture recorded is throttled whoever ran.
    let (mut model, end) = skipped_in_the_rotation();
    model.set_held_back(HeldBack::from_switches([(3, 10)], &model));
    let waits = cpu_waits(&model, end);
    assert_eq!(wait_sums(&waits), (0, 20_000_000, 0), "{waits:?}");
}
