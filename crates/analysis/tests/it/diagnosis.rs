//! Diagnoses of requests on small hand-made event sequences whose causes
//! and culprits are known: one scenario per cause.

use crate::common::requests::{request, Work};
use crate::common::script::{comm, Script};

use std::collections::HashMap;

use deepspan_analysis::{
    analyze_requests, baselines, diagnose, is_anomalous, usual_durations, Arch, BlockPhase, Cause,
    CulpritKind, Diagnosis, DiagnosisContext, KernelModel, RequestPath, SpanIdx, SpanInput,
    HEADLINE_MAX,
};
use deepspan_analysis::{BlockReason, ThreadState};
use deepspan_model::{softirq, EventKind, Packet, Tid};

const READ: i64 = 0;
const PREAD64: i64 = 17;
const RECVFROM: i64 = 45;
const FUTEX: i64 = 202;
const NANOSLEEP: i64 = 230;

/// Every request's diagnosis, by request span index.
fn diagnoses(
    model: &KernelModel,
    spans: &[SpanInput],
    work: &Work,
    pids: &[(Tid, Tid)],
) -> HashMap<SpanIdx, (RequestPath, Diagnosis)> {
    let pids: HashMap<Tid, Tid> = pids.iter().copied().collect();
    let label = |s: SpanIdx| format!("[svc] op{s}");
    let ctx = DiagnosisContext::new(model, Arch::X86_64, spans, &pids, &label, work);
    let mut out = HashMap::new();
    analyze_requests(model, spans, work, &mut |_, _| {}, &mut |p| {
        let Some(d) = diagnose(&ctx, &p) else {
            assert!(p.pieces.is_empty(), "a placed request has a diagnosis");
            return;
        };
        assert!(
            d.headline.chars().count() <= HEADLINE_MAX,
            "{:?}",
            d.headline
        );
        let ns: Vec<u64> = d.culprits.iter().map(|c| c.ns).collect();
        assert!(ns.windows(2).all(|w| w[0] >= w[1]), "{d:#?}");
        out.insert(p.request, (p, d));
    });
    out
}

fn evidence(d: &Diagnosis, name: &str) -> Option<f64> {
    d.evidence.iter().find(|e| e.0 == name).map(|e| e.1)
}

/// Holder (tid 1, CPU 0) sleeps 10..100 holding a lock, then releases it at
/// 105, waking the waiter (tid 2, CPU 1) blocked in a futex since 20. Both
/// threads are in process 1.
fn lock_scenario() -> (KernelModel, Vec<SpanInput>, Work) {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .switch(2, 1, 0, 0, 2)
        .enter(9, 0, NANOSLEEP, 0)
        .switch(10, 0, 1, 1, 0)
        .enter(20, 1, FUTEX, 0x1000)
        .switch(21, 1, 2, 1, 0)
        .timer(100, 0, 1)
        .switch(101, 0, 0, 0, 1)
        .exit(102, 0, NANOSLEEP, 0)
        .waking(105, 0, 2)
        .switch(106, 1, 0, 0, 2)
        .exit(107, 1, FUTEX, 0)
        .switch(110, 0, 1, 1, 0)
        .switch(130, 1, 2, 1, 0);
    let spans = vec![request(1, 0, 110), request(2, 15, 120)];
    let work = Work(vec![(1, 0, 110, 0), (2, 15, 120, 1)]);
    (s.model(), spans, work)
}

#[test]
fn a_lock_held_by_another_thread_of_the_process_is_lock_contention() {
    let (model, spans, work) = lock_scenario();
    let d = diagnoses(&model, &spans, &work, &[(1, 1), (2, 1)]);
    let (_, waiter) = &d[&1];
    assert_eq!(waiter.cause, Cause::LockContention, "{waiter:#?}");
    assert_eq!(evidence(waiter, "futex_uaddr"), Some(0x1000 as f64));
    let holder = waiter
        .culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Thread)
        .unwrap();
    assert_eq!((holder.tid, holder.pid), (Some(1), Some(1)));
    assert!(holder.ns >= 80, "{waiter:#?}");
    let req = waiter
        .culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Request)
        .unwrap();
    assert_eq!(req.span, Some(0));
    assert!(waiter.headline.starts_with("LOCK "), "{}", waiter.headline);
    assert!(waiter.headline.contains("[svc] op0"), "{}", waiter.headline);
    // The holder itself slept: a timer.
    assert_eq!(d[&0].1.cause, Cause::Timer, "{:#?}", d[&0].1);
}

#[test]
fn the_same_wait_through_another_process_is_blocked_by_request() {
    // Same events, but the holder is another process: not a lock of ours.
    let (model, spans, work) = lock_scenario();
    let d = diagnoses(&model, &spans, &work, &[(1, 1), (2, 2)]);
    let (_, waiter) = &d[&1];
    assert_eq!(waiter.cause, Cause::BlockedByRequest, "{waiter:#?}");
    let first = &waiter.culprits[0];
    assert_eq!(
        (first.kind, first.pid, first.comm),
        (CulpritKind::Process, Some(1), Some(comm(1)))
    );
    assert!(waiter
        .culprits
        .iter()
        .any(|c| c.kind == CulpritKind::Request && c.span == Some(0)));
}

#[test]
fn preempted_with_an_idle_cpu_is_throttled_and_by_a_hog_is_contention() {
    // Thread 3 (request 0) preempted 10..50 with its CPU idle: throttled.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3)
        .switch(10, 0, 3, 0, 0)
        .switch(50, 0, 0, 0, 3)
        .switch(60, 0, 3, 1, 0);
    let model = s.model();
    let spans = vec![request(3, 5, 58)];
    let d = diagnoses(&model, &spans, &Work(vec![(3, 5, 58, 0)]), &[(3, 3)]);
    let t = &d[&0].1;
    assert_eq!(t.cause, Cause::CpuThrottled, "{t:#?}");
    assert_eq!(evidence(t, "throttled_ns"), Some(40.0));
    assert_eq!(
        (t.culprits[0].kind, t.culprits[0].pid),
        (CulpritKind::Process, Some(3))
    );

    // Thread 3 preempted 10..50 by a hog (tid 9 of process 8) that runs
    // in short turns with thread 4 (process 4): contention, hog first.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 3)
        .switch(10, 0, 3, 0, 9)
        .switch(25, 0, 9, 0, 4)
        .switch(30, 0, 4, 1, 9)
        .switch(50, 0, 9, 0, 3)
        .switch(60, 0, 3, 1, 9);
    let model = s.model();
    let d = diagnoses(
        &model,
        &spans,
        &Work(vec![(3, 5, 58, 0)]),
        &[(3, 3), (9, 8), (4, 4)],
    );
    let c = &d[&0].1;
    assert_eq!(c.cause, Cause::CpuContention, "{c:#?}");
    let hog = &c.culprits[0];
    assert_eq!(
        (hog.kind, hog.pid, hog.tid, hog.comm, hog.ns),
        (CulpritKind::Process, Some(8), Some(9), Some(comm(9)), 35)
    );
    assert_eq!((c.culprits[1].pid, c.culprits[1].ns), (Some(4), 5));
    assert!(c.headline.contains("t9 (pid 8)"), "{}", c.headline);
}

#[test]
fn a_read_from_disk_names_the_miss_ratio_the_queue_and_who_filled_it() {
    // Thread 1 (request 0) reads 4 KiB at 10; its block request (sector
    // 100) is inserted behind three of a backup process (tid 5) and
    // completes at 90 from the disk's interrupt, waking it.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .switch(2, 1, 0, 0, 5)
        .block(3, 1, 5, BlockPhase::Insert, 1000)
        .block(4, 1, 5, BlockPhase::Insert, 2000)
        .block(5, 1, 5, BlockPhase::Insert, 3000)
        .enter(10, 0, PREAD64, 3)
        .block(11, 0, 1, BlockPhase::Insert, 100)
        .switch(12, 0, 1, 2, 0)
        .switch(15, 1, 5, 1, 0)
        .disk_interrupt(40, 0, &[1000, 2000], None)
        .disk_interrupt(60, 0, &[3000], None)
        .disk_interrupt(90, 0, &[100], Some(1))
        .switch(92, 0, 0, 0, 1)
        .exit(93, 0, PREAD64, 4096)
        .switch(100, 0, 1, 1, 0);
    let model = s.model();
    assert_eq!(model.block_io().len(), 8);
    let spans = vec![request(1, 8, 95)];
    let d = diagnoses(
        &model,
        &spans,
        &Work(vec![(1, 8, 95, 0)]),
        &[(1, 1), (5, 5)],
    );
    let disk = &d[&0].1;
    assert_eq!(disk.cause, Cause::Disk, "{disk:#?}");
    assert_eq!(evidence(disk, "page_cache_miss_ratio"), Some(1.0));
    assert_eq!(evidence(disk, "read_bytes"), Some(4096.0));
    assert_eq!(evidence(disk, "disk_read_bytes"), Some(4096.0));
    assert_eq!(evidence(disk, "queue_depth_max"), Some(4.0));
    assert_eq!(evidence(disk, "device_major"), Some(253.0));
    // While it waited (12..90), the backup's requests were in flight
    // 12..60 and its own throughout: the backup is the main culprit.
    let backup = &disk.culprits[0];
    assert_eq!((backup.kind, backup.pid), (CulpritKind::Process, Some(5)));
    assert_eq!(disk.culprits[1].pid, Some(1));
    assert!(backup.ns > disk.culprits[1].ns, "{disk:#?}");
    assert!(
        disk.headline.contains("cache miss 100%") && disk.headline.contains("t5 (pid 5)"),
        "{}",
        disk.headline
    );
}

#[test]
fn a_cached_read_has_a_zero_miss_ratio() {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .enter(26, 0, READ, 3)
        .exit(28, 0, READ, 8192)
        .switch(30, 0, 1, 1, 0)
        .disk_interrupt(50, 0, &[7], Some(1))
        .switch(52, 0, 0, 0, 1)
        .switch(60, 0, 1, 1, 0);
    let model = s.model();
    let spans = vec![request(1, 25, 55)];
    let d = diagnoses(&model, &spans, &Work(vec![(1, 25, 55, 0)]), &[]);
    let disk = &d[&0].1;
    assert_eq!(disk.cause, Cause::Disk, "{disk:#?}");
    assert_eq!(evidence(disk, "page_cache_miss_ratio"), Some(0.0));
}

/// Request 0 on thread 1 (8..95), recorded lean: no call's return, only
/// the thread's sleeps with its bytes read so far (`read_chars`). It
/// waited for its request in a receive (sleep at 5, 1000 bytes read),
/// read 8 KiB from the page cache and then slept in a pread64 whose 4 KiB
/// came from the disk (sleep at 12), and slept again after it (at 100).
fn lean_disk_read(read_chars: [Option<u64>; 3]) -> Diagnosis {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .sleep(5, 1, RECVFROM as i32, 4, read_chars[0])
        .switch(5, 0, 1, 1, 0)
        .waking(7, 0, 1)
        .switch(8, 0, 0, 0, 1)
        .block(11, 0, 1, BlockPhase::Insert, 100)
        .sleep(12, 1, PREAD64 as i32, 3, read_chars[1])
        .switch(12, 0, 1, 2, 0)
        .disk_interrupt(90, 0, &[100], Some(1))
        .switch(92, 0, 0, 0, 1)
        .sleep(100, 1, RECVFROM as i32, 4, read_chars[2])
        .switch(100, 0, 1, 1, 0);
    let model = s.model();
    assert_eq!(model.stats().syscall_exits, 0, "a lean model");
    let spans = vec![request(1, 8, 95)];
    let d = diagnoses(&model, &spans, &Work(vec![(1, 8, 95, 0)]), &[(1, 1)]);
    d[&0].1.clone()
}

#[test]
fn a_lean_recording_reads_the_miss_ratio_from_the_threads_bytes_read_at_its_sleeps() {
    let disk = lean_disk_read([Some(1000), Some(1000 + 8192), Some(1000 + 8192 + 4096)]);
    assert_eq!(disk.cause, Cause::Disk, "{disk:#?}");
    // Between the sleeps around the request: 12 KiB read, 4 KiB of them
    // from the disk.
    assert_eq!(evidence(&disk, "read_bytes"), Some(12288.0));
    assert_eq!(evidence(&disk, "disk_read_bytes"), Some(4096.0));
    assert_eq!(
        evidence(&disk, "page_cache_miss_ratio"),
        Some(4096.0 / 12288.0)
    );
    assert!(
        disk.headline.contains("cache miss 33%"),
        "{}",
        disk.headline
    );
    // Without the counts (a kernel without them, or an older recording),
    // no figure rather than a guess.
    let uncounted = lean_disk_read([None; 3]);
    assert_eq!(uncounted.cause, Cause::Disk, "{uncounted:#?}");
    assert_eq!(evidence(&uncounted, "page_cache_miss_ratio"), None);
    assert_eq!(evidence(&uncounted, "read_bytes"), None);
    assert_eq!(evidence(&uncounted, "disk_read_bytes"), Some(4096.0));
}

#[test]
fn waiting_for_packets_names_the_client_span_and_its_downstream_service() {
    // Request 0 on thread 1; inside it, client span 1 calls a server span
    // 2 (another request) and thread 1 waits in recvfrom for the answer.
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .enter(10, 0, RECVFROM, 4)
        .switch(11, 0, 1, 1, 0)
        .softirq(80, 0, softirq::NET_RX, 1)
        .switch(81, 0, 0, 0, 1)
        .exit(82, 0, RECVFROM, 100)
        .switch(90, 0, 1, 1, 0);
    let model = s.model();
    let spans = vec![
        request(1, 5, 85),
        SpanInput {
            parent: Some(0),
            times: Some((8, 83)),
            ..SpanInput::default()
        },
        SpanInput {
            parent: Some(1),
            entry: true,
            times: Some((20, 70)),
            ..SpanInput::default()
        },
    ];
    let work = Work(vec![(1, 5, 8, 0), (1, 8, 83, 1), (1, 83, 85, 0)]);
    let d = diagnoses(&model, &spans, &work, &[]);
    let net = &d[&0].1;
    assert_eq!(net.cause, Cause::Network, "{net:#?}");
    let c = &net.culprits[0];
    assert_eq!(
        (c.kind, c.span, c.downstream),
        (CulpritKind::Span, Some(1), Some(2))
    );
    assert!(net.headline.contains("[svc] op2"), "{}", net.headline);
}

#[test]
fn sleeping_is_timer_and_computing_is_running() {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .enter(10, 0, NANOSLEEP, 0)
        .switch(11, 0, 1, 1, 0)
        .timer(90, 0, 1)
        .switch(91, 0, 0, 0, 1)
        .exit(92, 0, NANOSLEEP, 0)
        .switch(200, 0, 1, 1, 0);
    let model = s.model();
    let spans = vec![request(1, 5, 95), request(1, 100, 190)];
    let work = Work(vec![(1, 5, 95, 0), (1, 100, 190, 1)]);
    let d = diagnoses(&model, &spans, &work, &[]);
    let sleep = &d[&0].1;
    assert_eq!(sleep.cause, Cause::Timer, "{sleep:#?}");
    assert_eq!(sleep.culprits[0].name.as_deref(), Some("clock_nanosleep"));
    assert!(
        sleep.headline.contains("clock_nanosleep"),
        "{}",
        sleep.headline
    );
    let run = &d[&1].1;
    assert_eq!(run.cause, Cause::Running, "{run:#?}");
    assert_eq!(evidence(run, "share"), Some(1.0));
}

#[test]
fn requests_without_a_path_have_no_diagnosis() {
    let model = Script::default().model();
    let spans = vec![SpanInput {
        times: Some((0, 10)),
        ..SpanInput::default()
    }];
    let pids = HashMap::new();
    let label = |_: SpanIdx| String::new();
    let work = Work(vec![]);
    let ctx = DiagnosisContext::new(&model, Arch::X86_64, &spans, &pids, &label, &work);
    analyze_requests(&model, &spans, &work, &mut |_, _| {}, &mut |p| {
        assert!(diagnose(&ctx, &p).is_none());
    });
}

#[test]
fn anomalies_are_well_above_the_median_of_their_operation() {
    let b = baselines([
        ("a", 10_000_000),
        ("a", 12_000_000),
        ("a", 11_000_000),
        ("a", 50_000_000),
        ("b", 1),
        ("b", 2),
    ]);
    // Lower median of four.
    assert_eq!(b.get("a"), Some(&11_000_000));
    assert_eq!(b.get("b"), None, "fewer than three requests");
    assert!(is_anomalous(50_000_000, b.get("a").copied()));
    assert!(!is_anomalous(12_000_000, b.get("a").copied()));
    assert!(!is_anomalous(50_000_000, None));
    // Twice a tiny baseline is not enough: 1 ms more is needed too.
    assert!(!is_anomalous(30_000, Some(10_000)));
    assert!(is_anomalous(1_020_000, Some(10_000)));
}

#[test]
fn requests_held_up_are_judged_against_the_lower_quartile() {
    // A fault held up five of nine requests of an operation: they make
    // its median, and no longer stand out against it.
    let durations = [10, 11, 9, 10, 30, 32, 29, 31, 33].map(|ms| ("a", ms * 1_000_000));
    let median = baselines(durations)["a"];
    let usual = usual_durations(durations)["a"];
    assert_eq!(median, 29_000_000);
    assert_eq!(usual, 10_000_000, "the lower quartile");
    assert!(!is_anomalous(32_000_000, Some(median)));
    assert!(is_anomalous(32_000_000, Some(usual)));
    assert!(!is_anomalous(11_000_000, Some(usual)));
    assert!(
        usual_durations([("b", 1), ("b", 2)]).is_empty(),
        "fewer than three requests"
    );
}

/// Request X (thread 1) asks its database backend (thread 10, process 10)
/// to update a row that request Y (thread 2) has locked through its own
/// backend (thread 11, process 11); backend 11 sleeps (pg_sleep) 8..100
/// holding the row lock, commits at 105 (waking backend 10 from its futex)
/// and answers Y; backend 10 then answers X. The backends have no spans.
/// With `loopback`, the answers travel over TCP on `lo`; with `timeout`,
/// backend 10's lock wait times out at 50 (PostgreSQL's deadlock check)
/// and is resumed at once in the same call.
fn row_lock_scenario(loopback: bool, timeout: bool) -> (KernelModel, Vec<SpanInput>, Work) {
    let mut s = Script::default();
    s.switch(1, 0, 0, 0, 1)
        .switch(1, 1, 0, 0, 2)
        .switch(1, 2, 0, 0, 11)
        .switch(1, 3, 0, 0, 10)
        .enter(5, 1, RECVFROM, 7)
        .switch(6, 1, 2, 1, 0)
        .enter(7, 2, NANOSLEEP, 0)
        .switch(8, 2, 11, 1, 0)
        .enter(10, 0, RECVFROM, 7)
        .switch(11, 0, 1, 1, 0)
        .enter(12, 3, FUTEX, 0x5000)
        .switch(13, 3, 10, 1, 0)
        .timer(100, 2, 11)
        .switch(101, 2, 0, 0, 11)
        .exit(102, 2, NANOSLEEP, 0)
        .waking(105, 2, 10);
    if timeout {
        s.timer(50, 3, 10)
            .switch(50, 3, 0, 0, 10)
            .exit(51, 3, FUTEX, -110)
            .enter(51, 3, FUTEX, 0x5000)
            .switch(52, 3, 10, 1, 0);
    }
    if loopback {
        s.loopback(108, 2, 11, 2);
    } else {
        s.waking(108, 2, 2);
    }
    s.switch(106, 3, 0, 0, 10)
        .exit(107, 3, FUTEX, 0)
        .switch(109, 1, 0, 0, 2)
        .exit(109, 1, RECVFROM, 10)
        .switch(110, 2, 11, 1, 0);
    if loopback {
        s.loopback(115, 3, 10, 1);
    } else {
        s.waking(115, 3, 1);
    }
    s.switch(112, 1, 2, 1, 0)
        .switch(116, 3, 10, 1, 0)
        .switch(117, 0, 0, 0, 1)
        .exit(118, 0, RECVFROM, 10)
        .switch(125, 0, 1, 1, 0);
    // Events are pushed in time order.
    s.events.sort_by_key(|e| e.ts);
    let spans = vec![request(1, 9, 120), request(2, 4, 112)];
    let work = Work(vec![(1, 9, 120, 0), (2, 4, 112, 1)]);
    (s.model(), spans, work)
}

const ROW_LOCK_PIDS: &[(Tid, Tid)] = &[(1, 1), (2, 1), (10, 10), (11, 11)];

/// Thread 10 sends to thread 1 over `lo` at 20, but the NET_RX softirq
/// that delivers the packet runs at 30 in ksoftirqd (thread 99), as under
/// load (or in a thread whose events a recorder filtered out): the packet
/// is matched by its skb address to the thread that queued it. A packet
/// whose queueing the trace lacks stays a plain network wake-up.
#[test]
fn a_loopback_packet_delivered_by_ksoftirqd_is_from_the_thread_that_queued_it() {
    for (queued_skb, received_skb, waker) in [
        (0xaa00, 0xaa00, BlockReason::PacketFrom(10)),
        (0xaa00, 0xbb00, BlockReason::Network),
    ] {
        let packet = |skbaddr| Packet {
            skbaddr,
            len: 100,
            dev: "lo".into(),
        };
        let mut s = Script::default();
        s.switch(1, 1, 0, 0, 1)
            .enter(2, 1, RECVFROM, 7)
            .switch(3, 1, 1, 1, 0)
            .switch(10, 0, 0, 0, 10)
            .ev_by(20, 0, 10, EventKind::NetDevQueue(packet(queued_skb)))
            .switch(25, 0, 10, 0, 99)
            .ev_by(
                30,
                0,
                99,
                EventKind::SoftirqEntry {
                    vec: softirq::NET_RX,
                },
            )
            .ev_by(30, 0, 99, EventKind::NetifReceiveSkb(packet(received_skb)))
            .waking(31, 0, 1)
            .ev_by(
                32,
                0,
                99,
                EventKind::SoftirqExit {
                    vec: softirq::NET_RX,
                },
            )
            .switch(33, 0, 99, 1, 10);
        let model = s.model();
        let state = model.thread(1).unwrap().state_at(15).unwrap().state;
        assert_eq!(state, ThreadState::Blocked(waker), "skb {received_skb:#x}");
    }
}

#[test]
fn a_backend_holding_a_row_lock_for_another_request_blames_that_request() {
    for (loopback, timeout) in [(false, false), (true, false), (false, true), (true, true)] {
        let (model, spans, work) = row_lock_scenario(loopback, timeout);
        if loopback {
            let waits = model.thread(1).unwrap().state_at(50).unwrap().state;
            assert_eq!(waits, ThreadState::Blocked(BlockReason::PacketFrom(10)));
        }
        let d = diagnoses(&model, &spans, &work, ROW_LOCK_PIDS);
        let (path, x) = &d[&0];
        assert_eq!(
            x.cause,
            Cause::BlockedByRequest,
            "loopback {loopback} timeout {timeout}: {x:#?}\n{path:#?}"
        );
        let by_y: u64 = path
            .pieces
            .iter()
            .filter(|p| p.blocked_by == Some(1))
            .map(|p| p.duration())
            .sum();
        // With the timeout, backend 10's timed-out wait (13..50) is the
        // resumed wait's, so it counts too (else only 53 would).
        assert!(by_y >= 89, "timeout {timeout}: {path:#?}");
        // The backend that held the lock for Y is the main process culprit.
        let process = x
            .culprits
            .iter()
            .find(|c| c.kind == CulpritKind::Process)
            .unwrap();
        assert_eq!(
            (process.kind, process.pid, process.comm),
            (CulpritKind::Process, Some(11), Some(comm(11))),
            "{x:#?}"
        );
        assert!(x
            .culprits
            .iter()
            .any(|c| c.kind == CulpritKind::Request && c.span == Some(1)));
        assert!(x.headline.contains("[svc] op1"), "{}", x.headline);
        // Y waited for its own backend's sleep: its own time.
        let (ypath, y) = &d[&1];
        assert!(
            ypath.pieces.iter().all(|p| p.blocked_by.is_none()),
            "{ypath:#?}"
        );
        assert_eq!(y.cause, Cause::Timer, "{y:#?}");
    }
}

#[test]
fn a_backend_no_request_waits_for_works_for_nobody() {
    // Without Y's thread waiting on it, backend 11's sleep is no one's:
    // X is then not blocked by Y (its path shows the backend's TIMER).
    let (model, mut spans, _) = row_lock_scenario(false, false);
    spans[1].times = Some((4, 5));
    let work = Work(vec![(1, 9, 120, 0), (2, 4, 5, 1)]);
    let d = diagnoses(&model, &spans, &work, ROW_LOCK_PIDS);
    let (path, x) = &d[&0];
    assert!(
        path.pieces.iter().all(|p| p.blocked_by.is_none()),
        "{path:#?}"
    );
    assert_eq!(x.cause, Cause::Timer, "{x:#?}");
}

#[test]
fn cause_and_culprit_kind_names_read_back() {
    for c in Cause::ALL {
        assert_eq!(Cause::from_name(c.name()), Some(c));
    }
    for k in CulpritKind::ALL {
        assert_eq!(CulpritKind::from_name(k.name()), Some(k));
    }
    assert_eq!(Cause::from_name("CPU_THROTTLED"), None);
    assert_eq!(CulpritKind::from_name(""), None);
}
