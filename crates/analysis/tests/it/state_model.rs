//! The state model's rules on small hand-made event sequences.

use std::sync::Arc;

use crate::common::script::Script;

use deepspan_analysis::{
    critical_path, BlockReason, Direction, EdgeType, KernelModel, StateBuilder, ThreadState, NO_CPU,
};
use deepspan_model::{
    softirq, BlockRq, Comm, Event, EventKind, Name, SchedSwitch, Socket, Tid, Wakeup,
};

fn states(m: &KernelModel, tid: Tid) -> Vec<(u64, u64, ThreadState)> {
    m.thread(tid)
        .unwrap()
        .states()
        .iter()
        .map(|s| (s.start, s.end, s.state))
        .collect()
}

fn blocked_reason(m: &KernelModel, tid: Tid, at: u64) -> BlockReason {
    match m.thread(tid).unwrap().state_at(at).unwrap().state {
        ThreadState::Blocked(r) => r,
        s => panic!("not blocked at {at}: {s:?}"),
    }
}

#[test]
fn thread_wakeup_links_waker_and_blocked_thread() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1) // 1 runs on CPU 0
        .switch(20, 0, 1, 1, 0) // 1 blocks
        .switch(15, 1, 0, 0, 2) // out of order: counted, treated as 20
        .wake(30, 1, 1, false) // 2 (running on CPU 1) wakes 1
        .switch(40, 0, 0, 0, 1);
    let m = s.model();
    assert_eq!(m.stats().out_of_order, 1);
    assert_eq!(
        states(&m, 1),
        vec![
            (10, 20, ThreadState::Running),
            (20, 30, ThreadState::Blocked(BlockReason::Thread(2))),
            (30, 40, ThreadState::WaitCpu),
            (40, 40, ThreadState::Running),
        ]
    );
    // Graph: vertical edge from 2's vertex at 30 to 1's vertex at 30.
    let g = m.graph();
    let w1 = g.worker_of(1).unwrap();
    let v = g.vertex_at(w1, 30).unwrap();
    let link = g.edge(v, Direction::IncomingVertical).unwrap();
    assert_eq!(
        (g.tid(link.from.worker), g.ts(link.from), link.kind),
        (2, 30, EdgeType::Default)
    );
    assert_eq!(
        g.edge(g.vertex_at(w1, 20).unwrap(), Direction::OutgoingHorizontal)
            .unwrap()
            .kind,
        EdgeType::Blocked
    );
    // Critical path of 1 over [10, 40]: its run, then 2 running, then its wait for CPU.
    let cp = critical_path(&m, 1, 10, 40);
    let pieces: Vec<_> = cp
        .pieces
        .iter()
        .map(|p| (p.start, p.end, p.tid, p.state))
        .collect();
    assert_eq!(
        pieces,
        vec![
            (10, 20, 1, EdgeType::Running),
            (20, 30, 2, EdgeType::Running),
            (30, 40, 1, EdgeType::Preempted),
        ]
    );
    assert_eq!(cp.pieces[1].link_from, Some(1));
}

#[test]
fn interrupt_contexts_give_block_reasons() {
    let irq = |irq: i32, name: &str| EventKind::IrqHandlerEntry {
        irq,
        name: Name::new(name),
    };
    let irq_exit = |irq: i32| EventKind::IrqHandlerExit { irq, ret: 1 };
    let mut s = Script::new();
    // Threads 1..=7 block on CPU 0 one after the other; CPU 1 wakes them.
    s.switch(1, 0, 0, 0, 1)
        .switch(2, 0, 1, 1, 2)
        .switch(3, 0, 2, 1, 3)
        .switch(4, 0, 3, 1, 4);
    s.switch(5, 0, 4, 1, 5)
        .switch(6, 0, 5, 1, 6)
        .switch(7, 0, 6, 2, 7)
        .switch(8, 0, 7, 1, 0);
    s.switch(9, 1, 0, 0, 0);
    // hrtimer → TIMER
    s.ev(
        10,
        1,
        EventKind::HrtimerExpireEntry {
            hrtimer: 1,
            function: 2,
            now: 10,
        },
    );
    s.wake(11, 1, 1, false);
    s.ev(12, 1, EventKind::HrtimerExpireExit { hrtimer: 1 });
    // blk-mq completion in a hard irq → BLOCK_DEVICE (the case Trace Compass misses)
    s.ev(20, 1, irq(42, "nvme0q1"));
    let rq = BlockRq {
        dev: 1,
        sector: 0,
        nr_sector: 8,
        rwbs: *b"R\0\0\0\0\0\0\0",
        error: 0,
    };
    s.ev(21, 1, EventKind::BlockRqComplete(rq));
    s.wake(22, 1, 2, false);
    s.ev(23, 1, irq_exit(42));
    // NET_RX softirq → NETWORK
    s.ev(
        30,
        1,
        EventKind::SoftirqEntry {
            vec: softirq::NET_RX,
        },
    );
    s.wake(31, 1, 3, false);
    s.ev(
        32,
        1,
        EventKind::SoftirqExit {
            vec: softirq::NET_RX,
        },
    );
    // keyboard irq → USER_INPUT
    s.ev(40, 1, irq(1, "i8042"));
    s.wake(41, 1, 4, false);
    s.ev(42, 1, irq_exit(1));
    // another irq → BLOCKED with its name kept
    s.ev(50, 1, irq(9, "acpi"));
    s.wake(51, 1, 5, false);
    s.ev(52, 1, irq_exit(9));
    // reschedule IPI → IPI
    s.ev(
        60,
        1,
        EventKind::IpiEntry {
            kind: Name::new("reschedule"),
            vector: 253,
        },
    );
    s.wake(61, 1, 6, false);
    s.ev(
        62,
        1,
        EventKind::IpiExit {
            kind: Name::new("reschedule"),
            vector: 253,
        },
    );
    // SCHED softirq → INTERRUPTED
    s.ev(
        70,
        1,
        EventKind::SoftirqEntry {
            vec: softirq::SCHED,
        },
    );
    s.wake(71, 1, 7, false);
    s.ev(
        72,
        1,
        EventKind::SoftirqExit {
            vec: softirq::SCHED,
        },
    );
    let m = s.model();
    assert_eq!(blocked_reason(&m, 1, 5), BlockReason::Timer);
    assert_eq!(blocked_reason(&m, 2, 5), BlockReason::BlockDevice);
    assert_eq!(blocked_reason(&m, 3, 5), BlockReason::Network);
    assert_eq!(blocked_reason(&m, 4, 5), BlockReason::UserInput);
    assert_eq!(blocked_reason(&m, 5, 10), BlockReason::Irq(9));
    assert_eq!(m.irq_name(9), Some("acpi"));
    assert_eq!(blocked_reason(&m, 6, 10), BlockReason::Ipi);
    assert_eq!(blocked_reason(&m, 7, 10), BlockReason::Interrupted);
    // Edge types and the irq-name qualifier in the graph.
    let g = m.graph();
    let out = |tid: Tid, ts: u64| {
        let v = g.vertex_at(g.worker_of(tid).unwrap(), ts).unwrap();
        let e = g.edge(v, Direction::OutgoingHorizontal).unwrap();
        (e.kind, g.qualifier(e.qualifier).map(|q| q.to_string()))
    };
    assert_eq!(out(1, 2), (EdgeType::Timer, None));
    assert_eq!(out(2, 3), (EdgeType::BlockDevice, None));
    assert_eq!(out(5, 6), (EdgeType::Blocked, Some("acpi".into())));
    // None of these is followed by the critical path: it keeps them as they are.
    let cp = critical_path(&m, 2, 0, 100);
    assert!(cp
        .pieces
        .iter()
        .any(|p| p.state == EdgeType::BlockDevice && p.tid == 2));
    assert!(cp.pieces.iter().all(|p| p.tid == 2));
    // Interrupt intervals of CPU 1.
    assert_eq!(m.cpu(1).unwrap().interrupts().len(), 7);
}

#[test]
fn waking_is_preferred_and_early_waking_explains_the_next_switch_out() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1).switch(11, 1, 0, 0, 2);
    // 2 (CPU 1) wakes 1 while 1 is still on its way into schedule() on CPU 0.
    s.wake(20, 1, 1, true);
    s.switch(21, 0, 1, 1, 0);
    s.wake(22, 0, 1, false); // the late sched_wakeup: superseded
    s.switch(30, 0, 0, 0, 1);
    // A plain waking of a blocked thread, then its wakeup: only the waking counts.
    s.switch(40, 0, 1, 1, 0);
    s.wake(50, 1, 1, true);
    s.wake(55, 0, 1, false);
    let m = s.model();
    assert_eq!(m.stats().early_wakings_used, 1);
    assert_eq!(m.stats().wakeups_superseded, 2);
    assert_eq!(
        states(&m, 1),
        vec![
            (10, 21, ThreadState::Running),
            (21, 30, ThreadState::WaitCpu),
            (30, 40, ThreadState::Running),
            (40, 50, ThreadState::Blocked(BlockReason::Thread(2))),
            (50, 55, ThreadState::WaitCpu),
        ]
    );
}

#[test]
fn spurious_wakeups_are_counted_not_applied() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1).switch(11, 1, 0, 0, 2);
    s.wake(12, 1, 1, false); // 1 is running
    s.switch(13, 0, 1, 0, 3); // 1 preempted by 3
    s.wake(14, 1, 1, false); // 1 is runnable
    s.switch(20, 0, 3, 0, 1);
    let m = s.model();
    assert_eq!(m.stats().spurious_wakeups, 2);
    assert_eq!(states(&m, 1)[1], (13, 20, ThreadState::Preempted));
    // Who held CPU 0 while 1 was preempted.
    assert_eq!(m.preempted_by(1, 0, 100), vec![(3, 7)]);
}

#[test]
fn syscalls_are_attached_to_blocked_intervals() {
    let futex = Name::new("futex");
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1);
    s.ev(
        11,
        0,
        EventKind::SysEnter {
            id: 202,
            name: Some(futex.clone()),
            args: [0x7f00, 0, 1, 0, 0, 0],
        },
    );
    s.switch(12, 0, 1, 1, 0);
    s.switch(13, 1, 0, 0, 2);
    s.wake(20, 1, 1, false);
    s.switch(21, 0, 0, 0, 1);
    s.ev(
        22,
        0,
        EventKind::SysExit {
            id: 202,
            name: Some(futex),
            ret: 0,
        },
    );
    // An exit without entry: the call began before we could see it.
    s.ev(
        23,
        1,
        EventKind::SysExit {
            id: 0,
            name: None,
            ret: 5,
        },
    );
    let m = s.model();
    let t1 = m.thread(1).unwrap();
    let blocked = t1
        .states()
        .iter()
        .find(|s| matches!(s.state, ThreadState::Blocked(_)))
        .unwrap();
    let call = t1.syscall_at(blocked.start).unwrap();
    assert_eq!(
        (
            m.syscall_name(call),
            call.id,
            call.arg0,
            call.start,
            call.end
        ),
        (Some("futex"), 202, 0x7f00, 11, 22)
    );
    assert!(call.entry_seen && call.exit_seen);
    let c2 = m.thread(2).unwrap().syscalls();
    assert_eq!(
        (c2[0].start, c2[0].end, c2[0].entry_seen, c2[0].ret),
        (13, 23, false, 5)
    );
}

/// A trace without the system-call events, and the recorder's sleeps in
/// calls: each sleep is a call from the sleep until the thread runs again,
/// with its arguments and no return value.
#[test]
fn sleeps_in_calls_are_calls_from_the_sleep_to_the_next_run() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1);
    // A futex sleep, then a read that sleeps twice, the second time to
    // the end of the trace. The recorder's time may be a moment before
    // the switch event's or after it.
    s.switch(12, 0, 1, 1, 0);
    s.wake(20, 0, 1, true);
    s.switch(21, 0, 0, 0, 1);
    s.switch(30, 0, 1, 1, 0);
    s.wake(35, 0, 1, true);
    s.switch(36, 0, 0, 0, 1);
    s.switch(40, 0, 1, 1, 0);
    s.switch(45, 1, 0, 0, 2);
    let sleeps = [
        (12, 202, [0x7f00, 0x80, 1]),
        (29, 0, [5, 0x1000, 64]),
        (41, 0, [5, 0x1000, 64]),
    ];
    let mut b = StateBuilder::new();
    let mut sleeps = sleeps.iter().peekable();
    for e in &s.events {
        while let Some(&&(ts, nr, args)) = sleeps.peek().filter(|c| c.0 <= e.ts) {
            b.blocked_syscall(ts, 1, nr, args, None);
            sleeps.next();
        }
        b.push(e);
    }
    let m = b.finish();
    let calls: Vec<_> = m
        .thread(1)
        .unwrap()
        .syscalls()
        .iter()
        .map(|c| (c.start, c.end, c.id, c.arg0, c.entry_seen, c.exit_seen))
        .collect();
    assert_eq!(
        calls,
        [
            (12, 21, 202, 0x7f00, true, false),
            (29, 36, 0, 5, true, false),
            (41, 45, 0, 5, true, false),
        ]
    );
    let futex = m.thread(1).unwrap().syscall_at(15).unwrap();
    assert_eq!(
        deepspan_analysis::syscall_label(&m, deepspan_analysis::Arch::X86_64, futex),
        "futex(uaddr=0x7f00)"
    );
    // A thread that never slept in a call has none.
    assert!(m.thread(2).unwrap().syscalls().is_empty());
}

/// A trace without the system-call events, and the recorder's socket
/// calls: each is a call of no length, a receive with its bytes as its
/// return value; a call seen at its sleep ends by then.
#[test]
fn socket_calls_are_receives_and_sends_of_no_length() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1);
    s.switch(12, 0, 1, 1, 0);
    s.wake(20, 0, 1, true);
    s.switch(21, 0, 0, 0, 1);
    let mut b = StateBuilder::new();
    let mut events = s.events.iter();
    for e in events.by_ref().take(1) {
        b.push(e);
    }
    b.blocked_syscall(12, 1, 45, [7, 0, 0], None);
    for e in events {
        b.push(e);
    }
    let socket = Socket {
        cookie: u64::MAX,
        local_port: 8080,
        remote_port: u16::MAX,
    };
    b.socket_call(22, 1, false, 300, Some(socket));
    b.socket_call(25, 1, true, 120, Some(socket));
    // A sleep whose switch-in is lost, then a send: the sleep's call ends
    // at the send. A file of v1 names no socket.
    b.blocked_syscall(30, 1, 45, [7, 0, 0], None);
    b.socket_call(33, 1, true, 10, None);
    let m = b.finish();
    let calls: Vec<_> = m
        .thread(1)
        .unwrap()
        .syscalls()
        .iter()
        .map(|c| {
            (
                c.start,
                c.end,
                m.syscall_name(c),
                c.ret,
                c.exit_seen,
                c.socket(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            (12, 21, None, 0, false, None),
            (22, 22, Some("recv"), 300, true, Some(socket)),
            (25, 25, Some("send"), 0, false, Some(socket)),
            (30, 33, None, 0, false, None),
            (33, 33, Some("send"), 0, false, None),
        ]
    );
}

/// The recorder's capture of switches out of idle: a switch the trace
/// lost is made at the capture's time, and one the trace kept too is one
/// switch, whichever of the two comes first.
#[test]
fn a_switch_out_of_idle_the_trace_lost_is_taken_from_the_capture() {
    // Thread 1 sleeps on CPU 0, is woken at 20 by thread 2 on CPU 1, runs
    // from 21 on CPU 0 and sleeps again at 40.
    let trace = |switch_in_kept: bool| {
        let mut s = Script::new();
        s.switch(10, 0, 0, 0, 1)
            .switch(12, 0, 1, 1, 0)
            .switch(15, 1, 0, 0, 2)
            .wake(20, 1, 1, true);
        if switch_in_kept {
            s.switch(21, 0, 0, 0, 1);
        }
        s.switch(40, 0, 1, 1, 0);
        s.events
    };
    let run = |events: &[Event], idle_switch_at: Option<u64>| {
        let mut b = StateBuilder::new();
        let mut pending = idle_switch_at;
        for e in events {
            if let Some(at) = pending.filter(|&at| at <= e.ts) {
                b.idle_switch(at, 0, 1);
                pending = None;
            }
            b.push(e);
        }
        b.finish()
    };
    let exact = vec![
        (10, 12, ThreadState::Running),
        (12, 20, ThreadState::Blocked(BlockReason::Thread(2))),
        (20, 21, ThreadState::WaitCpu),
        (21, 40, ThreadState::Running),
    ];
    // The trace kept the switch: the model as it always was.
    let kept = run(&trace(true), None);
    assert_eq!(states(&kept, 1)[..4], exact[..]);
    // Lost, and not captured either: its run reads as a wait for a CPU.
    let lost = run(&trace(false), None);
    assert_eq!(states(&lost, 1)[2], (20, 40, ThreadState::WaitCpu));
    // Lost, and captured: the same as kept.
    let captured = run(&trace(false), Some(21));
    assert_eq!(states(&captured, 1)[..4], exact[..]);
    assert_eq!(captured.stats().idle_switches_added, 1);
    // Kept and captured, the capture a moment before or after the trace's
    // switch: one switch, at the first of the two, and no contradiction.
    for (at, first) in [(21, 21), (22, 21)] {
        let both = run(&trace(true), Some(at));
        let mut expected = exact.clone();
        expected[2].1 = first;
        expected[3].0 = first;
        assert_eq!(states(&both, 1)[..4], expected[..], "capture at {at}");
        assert_eq!(both.stats().inconsistencies, 0, "capture at {at}");
        assert_eq!(
            both.stats().inconsistencies,
            kept.stats().inconsistencies,
            "capture at {at}"
        );
        assert_eq!(
            both.thread(1).unwrap().name(),
            kept.thread(1).unwrap().name()
        );
    }
}

/// A wait a timer interrupted without ending it is one wait: thread 1
/// sleeps in `epoll_wait`, a timer wakes it, it sleeps again in the same
/// call, and thread 2 wakes it. Its critical path follows thread 2 from the
/// first sleep on. Another call the second time, or a wake-up thread 1
/// gives in between, keeps the timer's piece.
#[test]
fn a_wait_resumed_after_a_timer_is_one_wait_for_its_waker() {
    const EPOLL_WAIT: i64 = 232;
    let run = |second_epfd: u64, wakes_another: bool| {
        let mut s = Script::new();
        s.switch(5, 1, 0, 0, 2)
            .switch(10, 0, 0, 0, 1)
            .enter(11, 0, EPOLL_WAIT, 7)
            .switch(12, 0, 1, 1, 0)
            .timer(20, 0, 1)
            .switch(21, 0, 0, 0, 1)
            .exit(22, 0, EPOLL_WAIT, -4);
        if wakes_another {
            s.switch(22, 1, 2, 1, 3)
                .switch(23, 1, 3, 1, 2)
                .wake(23, 0, 3, true);
        }
        s.enter(24, 0, EPOLL_WAIT, second_epfd)
            .switch(25, 0, 1, 1, 0)
            .wake(40, 1, 1, true)
            .switch(41, 0, 0, 0, 1);
        let m = s.model();
        let pieces: Vec<_> = critical_path(&m, 1, 10, 45)
            .pieces
            .iter()
            .map(|p| (p.start, p.end, p.tid, p.state))
            .collect();
        (m, pieces)
    };
    let (resumed, pieces) = run(7, false);
    assert_eq!(resumed.stats().resumed_waits, 1);
    assert_eq!(
        pieces,
        vec![
            (10, 12, 1, EdgeType::Running),
            (12, 40, 2, EdgeType::Running),
            (40, 41, 1, EdgeType::Preempted),
        ]
    );
    // The thread's own states still say what happened.
    assert_eq!(
        states(&resumed, 1)[1..4],
        [
            (12, 20, ThreadState::Blocked(BlockReason::Timer)),
            (20, 21, ThreadState::WaitCpu),
            (21, 25, ThreadState::Running),
        ]
    );
    for (epfd, wakes_another) in [(8, false), (7, true)] {
        let (m, pieces) = run(epfd, wakes_another);
        assert_eq!(
            m.stats().resumed_waits,
            0,
            "epfd {epfd}, wakes {wakes_another}"
        );
        assert!(
            pieces.contains(&(12, 20, 1, EdgeType::Timer)),
            "epfd {epfd}, wakes {wakes_another}: {pieces:?}"
        );
    }
}

#[test]
fn fork_exec_exit_and_names() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1);
    s.ev(
        11,
        0,
        EventKind::SchedProcessFork {
            parent_tid: 1,
            parent_comm: Comm::from_bytes(b"t1"),
            child_tid: 5,
            child_comm: Comm::from_bytes(b"t1"),
        },
    );
    s.ev(
        12,
        0,
        EventKind::SchedWakeupNew(Wakeup {
            tid: 5,
            comm: Comm::from_bytes(b"t1"),
            prio: 120,
            target_cpu: 1,
        }),
    );
    s.switch(13, 1, 0, 0, 5);
    s.ev(
        14,
        1,
        EventKind::SchedProcessExec {
            tid: 5,
            old_tid: 5,
            filename: Arc::from("/usr/bin/worker"),
        },
    );
    s.ev(
        15,
        1,
        EventKind::SchedProcessExit {
            tid: 5,
            comm: Comm::from_bytes(b"worker"),
            prio: 120,
        },
    );
    s.switch(16, 1, 5, 64, 0);
    let m = s.model();
    assert_eq!(m.stats().spurious_wakeups, 0);
    let t5 = m.thread(5).unwrap();
    assert_eq!(t5.parent, Some(1));
    assert_eq!(t5.deaths(), &[16]);
    assert_eq!(t5.name_at(14).unwrap().to_string(), "worker");
    assert_eq!(t5.name_at(12).unwrap().to_string(), "t1");
    let possible = |ts| {
        t5.names_possible_at(ts)
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
    };
    // Its switch-in at 13 shows "t5": at 12 it may already have had it.
    assert_eq!(possible(12), ["t1", "t5"]);
    // After the last name shown, only that one.
    assert_eq!(possible(100), [t5.name().unwrap().to_string()]);
    assert_eq!(
        states(&m, 5),
        vec![
            (11, 12, ThreadState::WaitCpu),
            (12, 13, ThreadState::WaitCpu),
            (13, 16, ThreadState::Running)
        ]
    );
    assert_eq!(t5.states()[1].cpu, 1);
    assert_eq!(t5.states()[0].cpu, NO_CPU);
    // Fork link in the graph.
    let g = m.graph();
    let head = g.head(g.worker_of(5).unwrap()).unwrap();
    let link = g.edge(head, Direction::IncomingVertical).unwrap();
    assert_eq!((g.tid(link.from.worker), g.ts(link.from)), (1, 11));
}

#[test]
fn lost_events_mark_overlapping_ranges() {
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1)
        .switch(20, 0, 1, 1, 0)
        .switch(30, 0, 0, 0, 1)
        .switch(40, 0, 1, 0, 0);
    let m = s.model_with_lost(0, 30);
    assert_eq!(m.lost_ranges().len(), 1);
    assert_eq!((m.lost_ranges()[0].start, m.lost_ranges()[0].end), (20, 30));
    assert!(m.overlaps_lost(25, 26));
    assert!(!m.overlaps_lost(10, 19));
    let cp = critical_path(&m, 1, 10, 40);
    let lost: Vec<bool> = cp.pieces.iter().map(|p| p.lost).collect();
    assert_eq!(lost, vec![false, true, false]);
}

#[test]
fn reader_tid_tells_who_runs_before_the_first_switch() {
    let mut b = StateBuilder::new();
    b.push(&Event {
        ts: 5,
        cpu: 2,
        tid: 9,
        kind: EventKind::SysEnter {
            id: 0,
            name: None,
            args: [3, 0, 0, 0, 0, 0],
        },
    });
    b.push(&Event {
        ts: 8,
        cpu: 2,
        tid: 9,
        kind: EventKind::SchedSwitch(SchedSwitch {
            prev_tid: 9,
            prev_comm: Comm::from_bytes(b"reader"),
            prev_prio: 120,
            prev_state: 1,
            next_tid: 0,
            next_comm: Comm::from_bytes(b"swapper/2"),
            next_prio: 120,
        }),
    });
    let m = b.finish();
    assert_eq!(
        states(&m, 9),
        vec![
            (5, 8, ThreadState::Running),
            (8, 8, ThreadState::Blocked(BlockReason::Unexplained))
        ]
    );
    assert_eq!(m.thread(9).unwrap().syscalls()[0].arg0, 3);
    assert_eq!(m.cpu(2).unwrap().running_at(6), Some(9));
}

#[test]
fn statedump_sets_initial_state_only_for_unknown_threads() {
    use deepspan_model::Value;
    let fields = |tid: i64, status: i64| -> deepspan_model::Fields {
        vec![
            (Arc::from("tid"), Value::Int(tid)),
            (Arc::from("pid"), Value::Int(100)),
            (Arc::from("ppid"), Value::Int(1)),
            (Arc::from("name"), Value::Str("app".into())),
            (Arc::from("status"), Value::Int(status)),
        ]
    };
    let mut b = StateBuilder::new();
    b.push(&Event {
        ts: 1,
        cpu: 0,
        tid: -1,
        kind: EventKind::SchedSwitch(SchedSwitch {
            prev_tid: 7,
            prev_comm: Comm::from_bytes(b"x"),
            prev_prio: 0,
            prev_state: 1,
            next_tid: 0,
            next_comm: Comm::default(),
            next_prio: 0,
        }),
    });
    let info =
        |tid, st| deepspan_analysis::ThreadInfo::from_lttng_statedump(&fields(tid, st)).unwrap();
    b.thread_info(2, &info(7, 2)); // known already: only ids and name
    b.thread_info(3, &info(8, 2)); // WAIT_CPU
    b.thread_info(4, &info(9, 5)); // WAIT
    let m = b.finish();
    assert_eq!(
        states(&m, 7)[0].2,
        ThreadState::Blocked(BlockReason::Unexplained)
    );
    assert_eq!(m.thread(7).unwrap().pid, Some(100));
    assert_eq!(m.thread(7).unwrap().name().unwrap().to_string(), "app");
    assert_eq!(states(&m, 8), vec![(3, 4, ThreadState::WaitCpu)]);
    assert_eq!(states(&m, 9), vec![(4, 4, ThreadState::Unknown)]);
}

#[test]
fn wakeups_while_the_recorder_runs_are_interrupts_not_the_recorders() {
    // 1 sleeps in clock_nanosleep and 3 in futex (raw_syscalls: numbers
    // only). The recorder thread 9 is current on CPU 1 when the timer
    // interrupt wakes 1 and another interrupt wakes 3; the trace, filtered
    // by pid, kept the wake-ups but not the interrupts.
    let enter = |id: i64| EventKind::SysEnter {
        id,
        name: None,
        args: [0; 6],
    };
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1)
        .ev(11, 0, enter(230))
        .switch(12, 0, 1, 1, 3);
    s.ev(13, 0, enter(202)).switch(14, 0, 3, 1, 0);
    s.switch(20, 1, 0, 0, 9);
    s.wake(50, 1, 1, true).wake(60, 1, 3, true);
    let as_recorded = s.model();
    assert_eq!(blocked_reason(&as_recorded, 1, 30), BlockReason::Thread(9));
    let recorder = as_recorded.graph().worker_of(9).unwrap();
    assert!(as_recorded.graph().vertex_at(recorder, 50).is_some());

    let mut b = StateBuilder::new().recorder_threads(&[9], deepspan_analysis::Arch::X86_64);
    for e in &s.events {
        b.push(e);
    }
    let m = b.finish();
    assert_eq!(blocked_reason(&m, 1, 30), BlockReason::Timer);
    assert_eq!(blocked_reason(&m, 3, 30), BlockReason::Unexplained);
    assert_eq!(m.stats().wakeups_under_recorder, 2);
    // No graph edge from the recorder: the wake-ups came from no thread.
    let g = m.graph();
    let recorder = g.worker_of(9).unwrap();
    assert!(g.vertex_at(recorder, 50).is_none());
}

#[test]
fn a_thread_first_seen_at_its_wake_up_slept_since_the_trace_began() {
    // Thread 5 has no event before thread 7 wakes it at 40 (it was blocked
    // since before the recording, or a snapshot's window, began).
    let mut s = Script::new();
    s.switch(10, 1, 0, 0, 7)
        .wake(40, 1, 5, true)
        .switch(45, 0, 0, 0, 5);
    let m = s.model();
    assert_eq!(blocked_reason(&m, 5, 10), BlockReason::Thread(7));
    assert_eq!(blocked_reason(&m, 5, 39), BlockReason::Thread(7));
    // Trace Compass begins the row at the thread's first event.
    let mut b = StateBuilder::new().open_ended();
    for e in &s.events {
        b.push(e);
    }
    assert!(b.finish().thread(5).unwrap().state_at(30).is_none());
}

/// A client thread (1, CPU 0) waits for a reply that thread 2 (CPU 1)
/// sends: the recorded TCP segments (`record --tcp-keys`) join the two
/// ends, so the wait is NETWORK with an edge from 2 at the send, and the
/// client's critical path runs through 2 until then.
fn segment_script(receive_in_softirq: bool) -> KernelModel {
    use deepspan_analysis::PacketDirection;
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1) // 1 runs
        .switch(20, 0, 1, 1, 0) // 1 blocks (waits for the reply)
        .switch(25, 1, 0, 0, 2); // 2 runs on CPU 1
    let mut b = StateBuilder::new();
    for e in &s.events {
        b.push(e);
    }
    b.segment(40, 1, 2, 0xfeed, PacketDirection::Sent); // 2 sends the reply
    let mut s = Script::new();
    if receive_in_softirq {
        s.ev(
            44,
            0,
            EventKind::SoftirqEntry {
                vec: softirq::NET_RX,
            },
        );
    }
    for e in &s.events {
        b.push(e);
    }
    // An unrelated segment first: only the last one received counts.
    b.segment(44, 0, 0, 0xbeef, PacketDirection::Received);
    b.segment(45, 0, 0, 0xfeed, PacketDirection::Received);
    let mut s = Script::new();
    // The wake-up comes from whatever runs on CPU 0: the idle task here
    // (the softirq, or a ksoftirqd the recording left out).
    s.wake(46, 0, 1, true);
    if receive_in_softirq {
        s.ev(
            47,
            0,
            EventKind::SoftirqExit {
                vec: softirq::NET_RX,
            },
        );
    }
    s.switch(50, 0, 0, 0, 1).switch(60, 1, 2, 1, 0);
    for e in &s.events {
        b.push(e);
    }
    b.finish()
}

#[test]
fn a_recorded_segment_links_the_wake_up_to_its_sender() {
    for in_softirq in [true, false] {
        let m = segment_script(in_softirq);
        assert_eq!(
            blocked_reason(&m, 1, 30),
            BlockReason::Network,
            "softirq {in_softirq}"
        );
        let g = m.graph();
        let v = g.vertex_at(g.worker_of(1).unwrap(), 46).unwrap();
        let link = g
            .edge(v, Direction::IncomingVertical)
            .expect("an edge from the sender");
        assert_eq!(
            (g.tid(link.from.worker), g.ts(link.from), link.kind),
            (2, 40, EdgeType::Network)
        );
        let cp = critical_path(&m, 1, 10, 50);
        let pieces: Vec<_> = cp
            .pieces
            .iter()
            .map(|p| (p.start, p.end, p.tid, p.state))
            .collect();
        assert_eq!(
            pieces,
            vec![
                (10, 20, 1, EdgeType::Running),
                (20, 25, 2, EdgeType::Unknown),
                (25, 40, 2, EdgeType::Running),
                (40, 46, 1, EdgeType::Network),
                (46, 50, 1, EdgeType::Preempted),
            ],
            "softirq {in_softirq}"
        );
    }
}

#[test]
fn a_segment_received_long_before_a_wake_up_does_not_explain_it() {
    use deepspan_analysis::{PacketDirection, SEGMENT_WAKE_NS};
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1)
        .switch(20, 0, 1, 1, 3)
        .switch(25, 1, 0, 0, 2);
    let mut b = StateBuilder::new();
    for e in &s.events {
        b.push(e);
    }
    b.segment(40, 1, 2, 0xfeed, PacketDirection::Sent);
    b.segment(45, 0, 0, 0xfeed, PacketDirection::Received);
    let mut s = Script::new();
    // Thread 3 (current on CPU 0, its switch-out not traced) wakes 1 well
    // after the segment: a thread's wake-up, not the segment's.
    let late = 45 + SEGMENT_WAKE_NS + 1;
    s.wake(late, 0, 1, true).switch(late + 10, 0, 3, 0, 1);
    for e in &s.events {
        b.push(e);
    }
    let m = b.finish();
    assert_eq!(blocked_reason(&m, 1, 30), BlockReason::Thread(3));
}

#[test]
fn a_segment_does_not_end_a_sleep() {
    use deepspan_analysis::PacketDirection;
    // 1 sleeps in clock_nanosleep; a segment arrives on CPU 0 (someone
    // else's traffic) just before 3, current there, wakes 1 (its timer's
    // interrupt left out of the trace): a wake-up by 3, not a packet.
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1).ev(
        11,
        0,
        EventKind::SysEnter {
            id: 230,
            name: Some(Name::new("clock_nanosleep")),
            args: [0; 6],
        },
    );
    s.switch(20, 0, 1, 1, 3).switch(25, 1, 0, 0, 2);
    let mut b = StateBuilder::new();
    for e in &s.events {
        b.push(e);
    }
    b.segment(40, 1, 2, 0xfeed, PacketDirection::Sent);
    b.segment(45, 0, 0, 0xfeed, PacketDirection::Received);
    let mut s = Script::new();
    s.wake(46, 0, 1, true).switch(50, 0, 3, 0, 1);
    for e in &s.events {
        b.push(e);
    }
    let m = b.finish();
    assert_eq!(blocked_reason(&m, 1, 30), BlockReason::Thread(3));
}

#[test]
fn a_reply_without_a_matched_packet_is_joined_by_its_spans() {
    use deepspan_analysis::{host_tid, RemoteCall};
    // Host 0: client 1 on CPU 0 waits for the reply; its NET_RX wake-up
    // at 60 names no sender. Host 1: server (1, CPU 1) runs the call from
    // 25, ends its span at 50, blocks for the next call at 55.
    let server = host_tid(1, 1);
    let mut s = Script::new();
    s.switch(10, 0, 0, 0, 1)
        .switch(20, 0, 1, 1, 0)
        .switch(25, 1, 0, 0, server)
        .switch(55, 1, server, 1, 0)
        .ev(
            59,
            0,
            EventKind::SoftirqEntry {
                vec: softirq::NET_RX,
            },
        )
        .wake(60, 0, 1, true)
        .ev(
            61,
            0,
            EventKind::SoftirqExit {
                vec: softirq::NET_RX,
            },
        )
        .switch(62, 0, 0, 0, 1);
    let mut b = StateBuilder::new().hosts(vec![0, 1]);
    for e in &s.events {
        b.push(e);
    }
    let mut m = b.finish();
    assert_eq!(blocked_reason(&m, 1, 30), BlockReason::Network);
    let call = RemoteCall {
        client_tid: 1,
        server_tid: server,
        server_end: 50,
        client_end: 70,
    };
    assert_eq!(m.link_replies(&[call]), 1);
    // Linked once only.
    assert_eq!(m.link_replies(&[call]), 0);
    let cp = critical_path(&m, 1, 10, 62);
    let pieces: Vec<_> = cp
        .pieces
        .iter()
        .map(|p| (p.start, p.end, p.tid, p.state))
        .collect();
    assert!(
        pieces.contains(&(25, 55, server, EdgeType::Running)),
        "the server's run is on the caller's path: {pieces:?}"
    );
    assert!(
        pieces.contains(&(55, 60, 1, EdgeType::Network)),
        "then the reply's way back: {pieces:?}"
    );
}
