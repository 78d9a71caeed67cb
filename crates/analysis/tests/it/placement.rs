//! Placement of spans without deepspan fields on hand-made kernel models
//! whose serving threads are known: a thread pool, an event loop, a
//! hand-off from an acceptor thread, process identification, and the
//! process-level path.

use crate::common::requests::Work;
use crate::common::script::Script;

use deepspan_analysis::{
    analyze_requests, clock_offset_bound, infer_placements, Arch, EdgeType, InferredPlace,
    KernelModel, Placement, PlacementMethod, PlacementSpan, Processes, RequestPath, ScannedProcess,
    SpanInput, SyncSource,
};
use deepspan_model::{Socket, Tid};

const RECVFROM: i64 = 45;
const SENDTO: i64 = 44;
const FUTEX: i64 = 202;
const WRITE: i64 = 1;
const SLEEPING: i64 = 1;

fn server_span(service: &str, start: u64, end: u64) -> PlacementSpan {
    PlacementSpan {
        entry: true,
        times: Some((start, end)),
        service: service.to_string(),
        ..PlacementSpan::default()
    }
}

fn processes(tgids: &[(Tid, Tid)]) -> Processes {
    Processes {
        tgid_of: tgids.iter().copied().collect(),
        scanned: Vec::new(),
    }
}

fn place(model: &KernelModel, spans: &[PlacementSpan], p: &Processes) -> Vec<Option<Placement>> {
    infer_placements(model, Arch::X86_64, spans, p)
}

/// Thread 101 reads the request, serves it and sends the answer; thread
/// 102 of the same pool sleeps in a futex meanwhile.
fn pool() -> KernelModel {
    let mut s = Script::named(&[(101, "web"), (102, "web")]);
    s.switch(0, 0, 0, 0, 101)
        .switch(0, 1, 0, 0, 102)
        .call(10, 9_000, 1, FUTEX, 0)
        .switch(20, 1, 102, SLEEPING, 0)
        .call(100, 1_000, 0, RECVFROM, 120)
        .call(4_900, 4_950, 0, SENDTO, 300)
        .switch(6_000, 0, 101, SLEEPING, 0);
    s.model_in_time_order()
}

#[test]
fn the_thread_that_received_served_and_sent_is_placed() {
    let model = pool();
    let spans = vec![
        server_span("web", 1_100, 5_000),
        PlacementSpan {
            parent: Some(0),
            times: Some((2_000, 3_000)),
            service: "web".into(),
            ..PlacementSpan::default()
        },
    ];
    let p = place(&model, &spans, &processes(&[(101, 100), (102, 100)]));
    let request = p[0].as_ref().expect("placed");
    assert_eq!(request.method, PlacementMethod::Thread);
    assert_eq!((request.pid, request.tid), (100, Some(101)));
    assert!(request.confidence > 0.5, "{request:?}");
    let text = request.evidence.join("\n");
    assert!(
        text.contains("socket receive returned 100 ns before the start"),
        "{text}"
    );
    assert!(text.contains("socket send 100 ns from the end"), "{text}");
    // The child goes where its request went.
    assert_eq!(p[1].as_ref().map(|c| c.tid), Some(Some(101)));
}

#[test]
fn spans_with_sdk_fields_or_a_thread_name_of_another_thread_are_not_placed_there() {
    let model = pool();
    let mut sdk = server_span("web", 1_100, 5_000);
    sdk.sdk_placed = true;
    let mut named = server_span("web", 1_100, 5_000);
    named.thread_name = Some("worker-2".into());
    let p = place(&model, &[sdk, named], &processes(&[(101, 100), (102, 100)]));
    assert_eq!(p[0], None);
    // No thread of that name: the process as a whole, never a guess.
    let q = p[1].as_ref().expect("placed on the process");
    assert_eq!((q.method, q.tid), (PlacementMethod::Process, None));
}

/// Thread 103, just made by a pool, still carries its maker's name "web"
/// when it reads the request; it names itself "web-7" and serves the
/// request without leaving the CPU, so the trace shows the new name only
/// at its switch-out after the span's start (a Jetty thread, seen in a
/// WireMock recording).
fn renamed_while_serving() -> KernelModel {
    let mut s = Script::named(&[(101, "web"), (103, "web")]);
    s.switch(0, 0, 0, 0, 101)
        .switch(10, 0, 101, SLEEPING, 0)
        .switch(20, 1, 0, 0, 103)
        .call(100, 1_000, 1, RECVFROM, 120)
        .call(4_900, 4_950, 1, SENDTO, 300);
    s.names.insert(103, "web-7");
    s.switch(6_000, 1, 103, SLEEPING, 0);
    s.model_in_time_order()
}

#[test]
fn a_thread_name_the_trace_shows_only_after_the_start_still_matches() {
    let model = renamed_while_serving();
    let mut renamed = server_span("web", 1_100, 5_000);
    renamed.thread_name = Some("web-7".into());
    let mut other = renamed.clone();
    other.thread_name = Some("web-8".into());
    let p = place(
        &model,
        &[renamed, other],
        &processes(&[(101, 100), (103, 100)]),
    );
    let placed = p[0].as_ref().expect("placed");
    assert_eq!(
        (placed.method, placed.tid),
        (PlacementMethod::Thread, Some(103))
    );
    assert!(
        placed
            .evidence
            .iter()
            .any(|e| e == "thread.name is its comm"),
        "{placed:?}"
    );
    // A name the thread never had still rules it out.
    let q = p[1].as_ref().expect("placed on the process");
    assert_eq!((q.method, q.tid), (PlacementMethod::Process, None));
}

#[test]
fn the_service_name_picks_the_process() {
    // Two processes, each with a thread that received and sent at the
    // same times: only the service name tells them apart.
    let mut s = Script::named(&[(101, "web"), (201, "api")]);
    s.switch(0, 0, 0, 0, 101)
        .switch(0, 1, 0, 0, 201)
        .call(100, 1_000, 0, RECVFROM, 10)
        .call(100, 1_000, 1, RECVFROM, 10)
        .call(4_900, 4_950, 0, SENDTO, 10)
        .call(4_900, 4_950, 1, SENDTO, 10);
    let model = s.model_in_time_order();
    let spans = vec![
        server_span("api", 1_100, 5_000),
        server_span("web", 1_100, 5_000),
    ];
    let p = place(&model, &spans, &processes(&[(101, 100), (201, 200)]));
    assert_eq!(p[0].as_ref().and_then(|x| x.tid), Some(201));
    assert_eq!(p[1].as_ref().and_then(|x| x.tid), Some(101));
    assert!(p[0].as_ref().unwrap().evidence[0].contains("service.name \"api\""));
    // The resource's process.pid outranks the name.
    let mut by_pid = server_span("api", 1_100, 5_000);
    by_pid.pid = Some(100);
    let p = place(&model, &[by_pid], &processes(&[(101, 100), (201, 200)]));
    assert_eq!(p[0].as_ref().and_then(|x| x.tid), Some(101));
}

#[test]
fn a_request_handed_over_by_an_acceptor_is_placed_on_the_pool_thread() {
    // 301 receives, wakes 302 and sleeps; 302 serves and sends.
    let mut s = Script::named(&[(301, "srv"), (302, "srv")]);
    s.switch(0, 0, 0, 0, 301)
        .switch(0, 1, 0, 0, 302)
        .call(10, 1_060, 1, FUTEX, 0)
        .switch(20, 1, 302, SLEEPING, 0)
        .call(100, 1_000, 0, RECVFROM, 80)
        .waking(1_050, 0, 302)
        .switch(1_060, 1, 0, 0, 302)
        .switch(1_070, 0, 301, SLEEPING, 0)
        .call(4_900, 4_950, 1, SENDTO, 10)
        .switch(6_000, 1, 302, SLEEPING, 0);
    let model = s.model_in_time_order();
    let p = place(
        &model,
        &[server_span("srv", 1_100, 5_000)],
        &processes(&[(301, 300), (302, 300)]),
    );
    let placed = p[0].as_ref().expect("placed");
    assert_eq!(placed.tid, Some(302));
    let text = placed.evidence.join("\n");
    assert!(
        text.contains("on thread 301, which then woke it (hand-off)"),
        "{text}"
    );
}

/// A lean recording of an acceptor (301) and two pool threads: 301
/// receives a request on connection A (client port 40001) and wakes 303,
/// then one on connection B (40002) and wakes 302. B's request carries no
/// span (sampled out, or an untraced client), yet its I/O lies right at
/// A's span: 302 was woken just before A's start and answers B exactly at
/// A's end, while 303 answers A 400 ns later.
fn two_connections() -> KernelModel {
    let on = |cookie, remote_port| {
        Some(Socket {
            cookie,
            local_port: 8080,
            remote_port,
        })
    };
    let mut s = Script::named(&[(301, "srv"), (302, "srv"), (303, "srv")]);
    s.switch(0, 0, 0, 0, 301)
        .socket_call(100, 301, false, 80, on(11, 40001))
        .waking(300, 0, 303)
        .switch(310, 2, 0, 0, 303)
        .socket_call(900, 301, false, 80, on(12, 40002))
        .waking(1_000, 0, 302)
        .switch(1_010, 1, 0, 0, 302)
        .switch(1_100, 0, 301, SLEEPING, 0)
        .socket_call(5_000, 302, true, 300, on(12, 40002))
        .socket_call(5_400, 303, true, 300, on(11, 40001))
        .switch(6_000, 1, 302, SLEEPING, 0)
        .switch(6_000, 2, 303, SLEEPING, 0);
    s.model_in_time_order()
}

#[test]
fn the_client_port_of_the_span_picks_the_thread_that_served_its_connection() {
    let model = two_connections();
    let threads = processes(&[(301, 300), (302, 300), (303, 300)]);
    let span = |client_port| PlacementSpan {
        port: Some(8080),
        client_port,
        ..server_span("srv", 1_050, 5_000)
    };
    // Time alone: 302, whose hand-off and send lie nearest.
    let p = place(&model, &[span(None)], &threads);
    assert_eq!(p[0].as_ref().and_then(|x| x.tid), Some(302), "{p:?}");
    // The span's connection: 303, which answered on it.
    let p = place(&model, &[span(Some(40001))], &threads);
    let placed = p[0].as_ref().expect("placed");
    assert_eq!(placed.tid, Some(303), "{placed:?}");
    let text = placed.evidence.join("\n");
    assert!(
        text.contains("socket receive on the span's connection returned")
            && text.contains("on thread 301, which then woke it (hand-off)")
            && text.contains("socket send on the span's connection 400 ns from the end"),
        "{text}"
    );
    // Another server port than the connection's: not that connection, and
    // with no thread left on the span's connection, placed by time alone.
    let other_port = PlacementSpan {
        port: Some(9090),
        ..span(Some(40001))
    };
    let p = place(&model, &[other_port], &threads);
    assert_eq!(p[0].as_ref().and_then(|x| x.tid), Some(302), "{p:?}");
    // A client port no socket of the process has (a proxy between): as
    // if the span named none.
    let p = place(&model, &[span(Some(55555))], &threads);
    assert_eq!(p[0].as_ref().and_then(|x| x.tid), Some(302), "{p:?}");
}

#[test]
fn time_off_the_cpu_between_the_io_and_the_span_does_not_count_against_a_thread() {
    // Under a CPU quota, 401 reads the request and is held off the CPU
    // for 90 ms before its span starts; it sends the answer, then waits
    // 100 ms more before the span ends. 402, an acceptor of the same
    // process, ran 2.8 ms before the start and wrote to a wake-up fd
    // 0.5 ms before the end (a Jetty acceptor, seen in a WireMock run under
    // a quota, where it took the request from its own reader).
    let mut s = Script::named(&[(401, "srv"), (402, "srv"), (900, "hog")]);
    s.switch(0, 0, 0, 0, 401)
        .switch(0, 1, 0, 0, 402)
        .switch(20, 1, 402, SLEEPING, 0)
        .call(100, 1_000, 0, RECVFROM, 120)
        .switch(2_000, 0, 401, 0, 900)
        .switch(89_000_000, 1, 0, 0, 402)
        .switch(89_200_000, 1, 402, SLEEPING, 0)
        .switch(92_000_000, 0, 900, 0, 401)
        .call(100_000_000, 100_001_000, 0, SENDTO, 300)
        .switch(100_002_000, 0, 401, 0, 900)
        .switch(199_400_000, 1, 0, 0, 402)
        .call(199_410_000, 199_420_000, 1, WRITE, 8)
        .switch(199_500_000, 1, 402, SLEEPING, 0)
        .switch(199_999_000, 0, 900, 0, 401)
        .switch(200_001_000, 0, 401, SLEEPING, 0);
    let model = s.model_in_time_order();
    let p = place(
        &model,
        &[server_span("srv", 92_000_100, 200_000_000)],
        &processes(&[(401, 400), (402, 400), (900, 900)]),
    );
    let placed = p[0].as_ref().expect("placed");
    let text = placed.evidence.join("\n");
    assert_eq!(placed.tid, Some(401), "{text}");
    assert!(
        text.contains(
            "socket receive returned 92.0 ms (92.0 ms of it waiting for a CPU) before the start"
        ),
        "{text}"
    );
}

/// One thread (201) receives two requests and answers both, interleaved;
/// 202 sleeps.
fn event_loop() -> KernelModel {
    let mut s = Script::named(&[(201, "loop"), (202, "loop")]);
    s.switch(0, 0, 0, 0, 201)
        .switch(0, 1, 0, 0, 202)
        .call(10, 9_000, 1, FUTEX, 0)
        .switch(20, 1, 202, SLEEPING, 0)
        .call(100, 1_000, 0, RECVFROM, 10)
        .call(1_200, 1_500, 0, RECVFROM, 10)
        .call(4_900, 4_950, 0, SENDTO, 10)
        .call(5_900, 5_950, 0, SENDTO, 10)
        .switch(7_000, 0, 201, SLEEPING, 0);
    s.model_in_time_order()
}

#[test]
fn requests_interleaved_on_one_thread_go_to_the_process() {
    let model = event_loop();
    // Long enough apart to be more than clock error (100 µs of overlap).
    let spans = vec![
        server_span("loop", 1_100, 500_000),
        server_span("loop", 1_600, 600_000),
    ];
    let p = place(&model, &spans, &processes(&[(201, 200), (202, 200)]));
    for x in &p {
        let x = x.as_ref().expect("placed");
        assert_eq!(
            (x.method, x.pid, x.tid),
            (PlacementMethod::Process, 200, None),
            "{x:?}"
        );
        assert!(x.evidence.iter().any(|e| e.contains("event loop")), "{x:?}");
    }
}

#[test]
fn a_process_level_path_names_real_threads_in_their_states() {
    let model = event_loop();
    let spans = vec![SpanInput {
        entry: true,
        times: Some((1_100, 6_500)),
        inferred: Some(InferredPlace::Process(vec![201, 202])),
        ..SpanInput::default()
    }];
    let mut paths: Vec<RequestPath> = Vec::new();
    analyze_requests(&model, &spans, &Work(vec![]), &mut |_, _| {}, &mut |p| {
        paths.push(p)
    });
    let path = &paths[0];
    assert_eq!(path.sync, SyncSource::Process);
    assert!(path.home.is_empty(), "no thread of its own");
    // 201 runs all along: the process is where it is.
    assert!(!path.pieces.is_empty());
    for piece in &path.pieces {
        assert_eq!(piece.tid, Some(201), "{piece:?}");
        assert_eq!(piece.state, EdgeType::Running, "{piece:?}");
    }
    let covered: u64 = path.pieces.iter().map(|p| p.duration()).sum();
    assert_eq!(covered, 6_500 - 1_100);
}

#[test]
fn a_go_request_goes_to_its_process_even_when_one_thread_fits() {
    // Thread 101 received, ran and sent around the request: a thread would
    // fit, but the Go runtime may have run the request's goroutine on 102
    // in between and others on 101. The process, never a thread.
    let model = pool();
    let mut go = server_span("web", 1_100, 5_000);
    go.sdk_language = Some("go".into());
    let mut python = go.clone();
    python.sdk_language = Some("python".into());
    let p = place(&model, &[go, python], &processes(&[(101, 100), (102, 100)]));
    let go = p[0].as_ref().expect("placed");
    assert_eq!(
        (go.method, go.pid, go.tid),
        (PlacementMethod::Process, 100, None)
    );
    assert!(
        go.evidence
            .iter()
            .any(|e| e.contains("telemetry.sdk.language is \"go\"")),
        "{go:?}"
    );
    assert_eq!(
        p[1].as_ref().and_then(|x| x.tid),
        Some(101),
        "other runtimes keep threads"
    );
}

#[test]
fn a_go_request_among_processes_of_one_name_goes_to_the_one_that_fits() {
    // Two processes named "gosvc" (a server and its load generator, one
    // binary); only 101's process received and sent around the request.
    let mut s = Script::named(&[(101, "gosvc"), (201, "gosvc")]);
    s.switch(0, 0, 0, 0, 101)
        .switch(0, 1, 0, 0, 201)
        .call(10, 9_000, 1, FUTEX, 0)
        .switch(20, 1, 201, SLEEPING, 0)
        .call(100, 1_000, 0, RECVFROM, 10)
        .call(4_900, 4_950, 0, SENDTO, 10)
        .switch(6_000, 0, 101, SLEEPING, 0);
    let model = s.model_in_time_order();
    let mut span = server_span("gosvc", 1_100, 5_000);
    span.sdk_language = Some("go".into());
    let p = place(&model, &[span], &processes(&[(101, 100), (201, 200)]));
    let placed = p[0].as_ref().expect("placed");
    assert_eq!(
        (placed.method, placed.pid, placed.tid),
        (PlacementMethod::Process, 100, None),
        "{placed:?}"
    );
}

#[test]
fn without_a_named_process_both_a_receive_and_a_send_are_needed() {
    let mut s = Script::named(&[(101, "python3")]);
    s.switch(0, 0, 0, 0, 101)
        .call(100, 1_000, 0, RECVFROM, 10)
        .switch(9_000, 0, 101, SLEEPING, 0);
    let model = s.model_in_time_order();
    // unknown_service: every process is considered, and a receive alone
    // is not enough.
    let p = place(
        &model,
        &[server_span("unknown_service", 1_100, 5_000)],
        &processes(&[(101, 100)]),
    );
    assert_eq!(p[0], None);
}

#[test]
fn the_listening_port_picks_the_process_when_the_name_does_not() {
    // Two python3 processes with the same I/O; only process 200 listened on
    // the span's port (the recorder's /proc scan).
    let mut s = Script::named(&[(101, "python3"), (201, "python3")]);
    s.switch(0, 0, 0, 0, 101)
        .switch(0, 1, 0, 0, 201)
        .call(100, 1_000, 0, RECVFROM, 10)
        .call(100, 1_000, 1, RECVFROM, 10)
        .call(4_900, 4_950, 0, SENDTO, 10)
        .call(4_900, 4_950, 1, SENDTO, 10);
    let model = s.model_in_time_order();
    let mut span = server_span("unknown_service:python3", 1_100, 5_000);
    span.port = Some(8080);
    let mut p = processes(&[(101, 100), (201, 200)]);
    p.scanned = vec![ScannedProcess {
        pid: 200,
        comm: "python3".into(),
        cmdline: "python3 server.py".into(),
        listening_ports: vec![8080],
        container: None,
    }];
    let placed = place(&model, &[span], &p);
    let placed = placed[0].as_ref().expect("placed");
    assert_eq!((placed.pid, placed.tid), (200, Some(201)));
    assert!(
        placed.evidence[0].contains("listening on port 8080"),
        "{placed:?}"
    );
}

#[test]
fn without_a_scanned_listener_the_process_that_answered_on_the_port_is_picked() {
    // No /proc scan caught a listener (the server came and went between
    // two scans): of two python3 processes, 300's threads received and
    // sent on connections of port 8080 (the socket-call capture).
    let model = two_connections();
    let threads = processes(&[(301, 300), (302, 300), (303, 300), (401, 400)]);
    let span = PlacementSpan {
        port: Some(8080),
        ..server_span("unknown_service:python3", 1_050, 5_000)
    };
    let placed = place(&model, &[span], &threads);
    let placed = placed[0].as_ref().expect("placed");
    assert_eq!(placed.pid, 300, "{placed:?}");
    assert!(
        placed.evidence[0].contains("received and sent on port 8080"),
        "{placed:?}"
    );
}

#[test]
fn placed_requests_bound_the_clock_mapping_offset() {
    // Thread 101 ran over [0, 6000) and received until 1000: a span mapped
    // to [1100, 5000] may move by -100 ns (back to the receive) to +1000 ns
    // (its end to the end of the run).
    let model = pool();
    let spans = vec![server_span("web", 1_100, 5_000)];
    let p = place(&model, &spans, &processes(&[(101, 100), (102, 100)]));
    let b = clock_offset_bound(&model, Arch::X86_64, &spans, &p).expect("a bound");
    assert_eq!(
        (b.lower_ns, b.upper_ns, b.agreeing, b.of),
        (-100, 1_000, 1, 1)
    );
    // A request mapped past its thread's run (asleep from 6000; the span at
    // [6500, 7000]) takes the run nearest it, 500 ns back, within
    // OFFSET_SEARCH_NS: its window (a move of at least -1000 ns) leaves out
    // the range the two others agree on, so the answer is theirs, 2 of 3.
    let moved = vec![
        server_span("web", 1_100, 5_000),
        server_span("web", 1_100, 5_000),
        server_span("web", 6_500, 7_000),
    ];
    let mut placed = place(&model, &moved[..1], &processes(&[(101, 100), (102, 100)]));
    placed.push(placed[0].clone());
    placed.push(placed[0].clone());
    let b = clock_offset_bound(&model, Arch::X86_64, &moved, &placed).expect("a bound");
    assert_eq!((b.agreeing, b.of), (2, 3), "{b:?}");
    assert_eq!((b.lower_ns, b.upper_ns), (-100, 1_000), "{b:?}");
}
