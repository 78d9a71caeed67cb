//! Export of a small, fixed run (spans and an analysis built here): the
//! kernel child spans, links, events and diagnosis attributes; the round
//! trip through `--out` and the importer; sending to deepspan's own OTLP
//! receiver over gRPC and HTTP; retries; the per-trace budget.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use deepspan_export::analysis::{Piece, Queue, Request, RunAnalysis, Syscall};
use deepspan_export::attributes as a;
use deepspan_export::{
    export_spans, send_otlp, write_json, Export, ExportOptions, Protocol, SendOptions,
};
use deepspan_model::container::Container;
use deepspan_otlp::{Receiver, ReceiverConfig};
use deepspan_spans::model::{Attributes, Resource, SpanKind, Value};
use deepspan_spans::{import_file, read_run_spans, Span, SpanId, TraceId};

const MS: u64 = 1_000_000;
/// Wall clock minus monotonic clock of the fixture.
const WALL_OFFSET: u64 = 1_700_000_000_000_000_000;
const CHECKOUT_TRACE: TraceId = TraceId(0xaaaa_0000_0000_0000_0000_0000_0000_0001);
const CHECKOUT: SpanId = SpanId(0x1111);
const RESTOCK_TRACE: TraceId = TraceId(0xbbbb_0000_0000_0000_0000_0000_0000_0002);
const RESTOCK: SpanId = SpanId(0x2222);

fn piece(start_ms: u64, end_ms: u64, state: &str, tid: i64, comm: &str) -> Piece {
    Piece {
        start_ns: 1000 * MS + start_ms * MS,
        end_ns: 1000 * MS + end_ms * MS,
        state: state.into(),
        tid: Some(tid),
        comm: Some(comm.into()),
        syscall: None,
        waiting_in: None,
        detail: None,
        blocked_by: None,
        lost: false,
        preempted_by: None,
        throttled_ns: 0,
        contended_ns: 0,
        wakeup_ns: 0,
    }
}

fn span(
    trace: TraceId,
    id: SpanId,
    parent: Option<SpanId>,
    service: &str,
    name: &str,
    start_ms: u64,
    end_ms: u64,
) -> Span {
    let mut s = Span::new(
        trace,
        id,
        parent,
        name,
        WALL_OFFSET + 1000 * MS + start_ms * MS,
        WALL_OFFSET + 1000 * MS + end_ms * MS,
    );
    s.kind = SpanKind::Server;
    s.resource = Arc::new(Resource::with_service(service, Attributes::default()));
    s.attributes
        .insert("http.method", Value::String("POST".into()));
    s
}

/// Two traces: a checkout (100 ms) throttled, then blocked by a restock
/// request (on a PostgreSQL backend), and the restock itself.
fn fixture() -> (Vec<Span>, RunAnalysis) {
    let spans = vec![
        span(
            CHECKOUT_TRACE,
            CHECKOUT,
            None,
            "inventory",
            "POST /checkout",
            0,
            100,
        ),
        span(
            CHECKOUT_TRACE,
            SpanId(0x1112),
            Some(CHECKOUT),
            "inventory",
            "SELECT",
            40,
            90,
        ),
        span(
            RESTOCK_TRACE,
            RESTOCK,
            None,
            "inventory",
            "POST /restock",
            0,
            95,
        ),
    ];
    let mut throttled = piece(10, 40, "PREEMPTED", 7, "inventory");
    throttled.throttled_ns = 25 * MS;
    throttled.contended_ns = 5 * MS;
    // Shorter than the threshold (1 ms, 1 % of 100 ms): folded into the
    // throttled piece.
    let mut short = piece(40, 41, "RUNNING", 7, "inventory");
    short.end_ns -= MS / 2;
    let mut held = piece(40, 90, "RUNNING", 9, "postgres");
    held.start_ns += MS / 2;
    held.blocked_by = Some((RESTOCK_TRACE, RESTOCK));
    held.waiting_in = Some("recvfrom(fd=5)".into());
    let mut lost = piece(95, 100, "UNKNOWN", 7, "inventory");
    lost.lost = true;
    let checkout = Request {
        trace_id: CHECKOUT_TRACE,
        span_id: CHECKOUT,
        service: "inventory".into(),
        operation: "POST /checkout".into(),
        start_ns: 1000 * MS,
        end_ns: 1100 * MS,
        tid: Some(7),
        sync: "exact".into(),
        lost_events: 3,
        truncated: false,
        anomalous: true,
        baseline_ns: Some(5 * MS),
        top_cause: Some("blocked by request 0000000000002222".into()),
        // As requests.json has it (without the details no test reads).
        diagnosis: Some(
            serde_json::from_value(serde_json::json!({
            "cause": "blocked_by_request",
            "headline": "waited 49 ms for [inventory] POST /restock (postgres)",
            "evidence": {"share": 0.49, "ns": 49000000, "futex_uaddr": 1234},
            "culprits": [
                {"kind": "process", "pid": 90, "tid": 9, "comm": "postgres", "ns": 49000000,
                 "container_id": "ab".repeat(32), "container_name": "inventory-db",
                 "pod_uid": "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d", "pod_name": "db-0",
                 "pod_namespace": "shop"},
                {"kind": "request", "trace_id": RESTOCK_TRACE.to_string(), "span_id": RESTOCK.to_string(),
                 "service": "inventory", "operation": "POST /restock", "ns": 49000000}
            ],
            "root_cause": {"cause": "cpu_throttled", "headline": "behind [inventory] POST /restock: throttled",
                           "chain": "[inventory] POST /checkout → behind [inventory] POST /restock → PREEMPTED (throttled)"}
            }))
            .expect("a diagnosis"),
        ),
        pieces: vec![
            piece(0, 10, "RUNNING", 7, "inventory"),
            throttled,
            short,
            held,
            piece(90, 95, "RUNNING", 7, "inventory"),
            lost,
        ],
        queue: None,
    };
    let restock = Request {
        trace_id: RESTOCK_TRACE,
        span_id: RESTOCK,
        service: "inventory".into(),
        operation: "POST /restock".into(),
        start_ns: 1000 * MS,
        end_ns: 1095 * MS,
        tid: Some(8),
        sync: "exact".into(),
        lost_events: 0,
        truncated: false,
        anomalous: false,
        baseline_ns: None,
        top_cause: None,
        diagnosis: None,
        pieces: vec![piece(0, 95, "RUNNING", 8, "inventory")],
        // It reached the host 4 ms before its span began, while the
        // thread that took it up worked for the checkout.
        queue: Some(Queue {
            arrival_ns: 996 * MS,
            arrival_by: "client_send".into(),
            cause: Some("queued behind 1 request of [inventory] POST /checkout".into()),
            behind: vec![(CHECKOUT_TRACE, CHECKOUT)],
        }),
    };
    let mut syscalls = HashMap::new();
    syscalls.insert(
        7,
        vec![
            // Starts before the request: clipped to it.
            Syscall {
                tid: 7,
                start_ns: 990 * MS,
                end_ns: 1005 * MS,
                nr: 202,
                name: Some("futex".into()),
                ret: Some(0),
            },
            Syscall {
                tid: 7,
                start_ns: 1041 * MS,
                end_ns: 1090 * MS,
                nr: 45,
                name: Some("recvfrom".into()),
                ret: Some(120),
            },
            // After the request.
            Syscall {
                tid: 7,
                start_ns: 1200 * MS,
                end_ns: 1300 * MS,
                nr: 0,
                name: Some("read".into()),
                ret: Some(1),
            },
        ],
    );
    let pids = HashMap::from([(7, 70), (8, 70), (9, 90)]);
    (
        spans,
        RunAnalysis {
            requests: vec![checkout, restock],
            syscalls,
            pids,
            // postgres runs in a pod's container; inventory in none.
            containers: HashMap::from([(
                90,
                Container {
                    id: Some("ab".repeat(32)),
                    runtime: Some("containerd".into()),
                    name: Some("inventory-db".into()),
                    pod_uid: Some("0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d".into()),
                    pod_name: Some("db-0".into()),
                    pod_namespace: Some("shop".into()),
                },
            )]),
        },
    )
}

fn exported() -> Export {
    let (spans, analysis) = fixture();
    export_spans(spans, &analysis, &ExportOptions::default())
}

fn attr<'s>(s: &'s Span, key: &str) -> &'s Value {
    s.attributes
        .get(key)
        .unwrap_or_else(|| panic!("{} has no {key}: {:?}", s.name, s.attributes))
}

fn children_of(export: &Export, parent: SpanId) -> Vec<&Span> {
    export
        .spans()
        .filter(|s| s.parent_span_id == Some(parent) && s.scope.name == a::SCOPE_NAME)
        .collect()
}

#[test]
fn a_request_gets_its_kernel_path_as_child_spans_inside_its_bounds() {
    let export = exported();
    let parent = export.spans().find(|s| s.span_id == CHECKOUT).unwrap();
    let children = children_of(&export, CHECKOUT);
    let path: Vec<(&str, u64, u64)> = children
        .iter()
        .filter(|c| attr(c, a::KIND) == &Value::String(a::KIND_PATH.into()))
        .map(|c| {
            (
                c.name.as_str(),
                (c.start_ns - parent.start_ns) / MS,
                (c.end_ns - parent.start_ns) / MS,
            )
        })
        .collect();
    assert_eq!(
        path,
        vec![
            ("kernel: RUNNING · inventory/7", 0, 10),
            ("kernel: PREEMPTED (throttled) · inventory/7", 10, 40),
            (
                "kernel: RUNNING · postgres/9 · for [inventory] POST /restock",
                40,
                90
            ),
            ("kernel: RUNNING · inventory/7", 90, 95),
            ("kernel: UNKNOWN · inventory/7", 95, 100),
        ]
    );
    for c in &children {
        assert!(
            c.start_ns >= parent.start_ns && c.end_ns <= parent.end_ns,
            "{} outside its parent",
            c.name
        );
        assert_eq!(c.kind, SpanKind::Internal);
        assert_eq!(c.resource, parent.resource);
        assert_ne!(c.span_id, parent.span_id);
    }
    let throttled = children[1];
    assert_eq!(
        attr(throttled, a::STATE),
        &Value::String("PREEMPTED".into())
    );
    assert_eq!(attr(throttled, a::TID), &Value::Int(7));
    assert_eq!(attr(throttled, a::PID), &Value::Int(70));
    assert_eq!(
        attr(throttled, a::THROTTLED_NS),
        &Value::Int((25 * MS) as i64)
    );
    assert_eq!(
        attr(throttled, a::CONTENDED_NS),
        &Value::Int((5 * MS) as i64)
    );
    assert_eq!(attr(throttled, a::FOLDED_PIECES), &Value::Int(1));
    assert_eq!(attr(throttled, a::FOLDED_NS), &Value::Int((MS / 2) as i64));
    assert!(throttled.attributes.get(a::THREAD_CONTAINER_ID).is_none());
    let held = children[2];
    assert_eq!(attr(held, a::COMM), &Value::String("postgres".into()));
    // The piece's process ran in a container: its container and pod.
    let text = |v: &str| Value::String(v.into());
    assert_eq!(attr(held, a::THREAD_CONTAINER_ID), &text(&"ab".repeat(32)));
    assert_eq!(attr(held, a::THREAD_CONTAINER_NAME), &text("inventory-db"));
    assert_eq!(
        attr(held, a::THREAD_POD_UID),
        &text("0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d")
    );
    assert_eq!(attr(held, a::THREAD_POD_NAME), &text("db-0"));
    assert_eq!(attr(held, a::THREAD_NAMESPACE_NAME), &text("shop"));
    assert_eq!(
        attr(held, a::WAITING_IN),
        &Value::String("recvfrom(fd=5)".into())
    );
    assert_eq!(held.links.len(), 1);
    assert_eq!(
        (held.links[0].trace_id, held.links[0].span_id),
        (RESTOCK_TRACE, RESTOCK)
    );
    assert_eq!(
        held.links[0].attributes.get(a::LINK_REASON),
        Some(&Value::String("blocked_by_request".into()))
    );
    // The long system calls of the request's thread, clipped to it; the
    // one after the request is not there.
    let syscalls: Vec<(&str, u64, u64)> = children
        .iter()
        .filter(|c| attr(c, a::KIND) == &Value::String(a::KIND_SYSCALL.into()))
        .map(|c| {
            (
                c.name.as_str(),
                (c.start_ns - parent.start_ns) / MS,
                (c.end_ns - parent.start_ns) / MS,
            )
        })
        .collect();
    assert_eq!(
        syscalls,
        vec![
            ("syscall: futex · inventory/7", 0, 5),
            ("syscall: recvfrom · inventory/7", 41, 90)
        ]
    );
    assert_eq!(export.stats.folded_pieces, 1);
    assert_eq!(export.stats.path_spans, 5 + 1);
    assert_eq!(export.stats.syscall_spans, 2);
}

#[test]
fn a_queued_request_gets_its_queue_as_a_child_span_just_before_it() {
    let export = exported();
    let parent = export.spans().find(|s| s.span_id == RESTOCK).unwrap();
    let queued: Vec<&Span> = children_of(&export, RESTOCK)
        .into_iter()
        .filter(|c| attr(c, a::KIND) == &Value::String(a::KIND_QUEUE.into()))
        .collect();
    assert_eq!(queued.len(), 1, "one queue span");
    let q = queued[0];
    assert_eq!(
        q.name,
        "queued: queued behind 1 request of [inventory] POST /checkout"
    );
    assert_eq!(
        (q.start_ns, q.end_ns),
        (parent.start_ns - 4 * MS, parent.start_ns)
    );
    let four_ms = Value::Int((4 * MS) as i64);
    assert_eq!(attr(q, a::QUEUE_NS), &four_ms);
    assert_eq!(attr(parent, a::QUEUE_NS), &four_ms);
    assert_eq!(
        attr(parent, a::QUEUE_ARRIVAL_BY),
        &Value::String("client_send".into())
    );
    assert_eq!(attr(q, a::MONO_START_NS), &Value::Int((996 * MS) as i64));
    assert_eq!(q.links.len(), 1);
    assert_eq!(
        (q.links[0].trace_id, q.links[0].span_id),
        (CHECKOUT_TRACE, CHECKOUT)
    );
    assert_eq!(
        q.links[0].attributes.get(a::LINK_REASON),
        Some(&Value::String("queued_behind_request".into()))
    );
    // A request that did not queue has neither.
    let checkout = export.spans().find(|s| s.span_id == CHECKOUT).unwrap();
    assert!(checkout.attributes.get(a::QUEUE_NS).is_none());
}

#[test]
fn the_request_span_carries_the_diagnosis_and_kernel_events() {
    let export = exported();
    let s = export.spans().find(|s| s.span_id == CHECKOUT).unwrap();
    assert_eq!(
        attr(s, a::CAUSE),
        &Value::String("blocked_by_request".into())
    );
    assert_eq!(
        attr(s, a::HEADLINE),
        &Value::String("waited 49 ms for [inventory] POST /restock (postgres)".into())
    );
    assert_eq!(attr(s, a::SHARE), &Value::Double(0.49));
    assert_eq!(attr(s, a::CAUSE_NS), &Value::Int(49_000_000));
    assert_eq!(attr(s, "deepspan.evidence.futex_uaddr"), &Value::Int(1234));
    assert_eq!(attr(s, a::ANOMALOUS), &Value::Bool(true));
    assert_eq!(attr(s, a::BASELINE_NS), &Value::Int(5_000_000));
    assert_eq!(
        attr(s, a::ROOT_CAUSE),
        &Value::String("cpu_throttled".into())
    );
    assert_eq!(
        attr(s, a::ROOT_CHAIN),
        &Value::String(
            "[inventory] POST /checkout → behind [inventory] POST /restock → PREEMPTED (throttled)"
                .into()
        )
    );
    assert!(attr(s, a::ROOT_CAUSE_JSON)
        .as_str()
        .unwrap()
        .contains("\"headline\""));
    assert_eq!(attr(s, a::LOST_EVENTS), &Value::Int(3));
    let Value::Array(culprits) = attr(s, a::CULPRITS) else {
        panic!()
    };
    assert_eq!(
        culprits[0],
        Value::String(
            "process postgres (pid 90, tid 9) in container inventory-db, pod shop/db-0: 49.0 ms"
                .into()
        )
    );
    // Its container and pod under OpenTelemetry's names, in deepspan's
    // namespace.
    let named = [
        (a::CULPRIT_CONTAINER_ID, "ab".repeat(32)),
        (a::CULPRIT_CONTAINER_NAME, "inventory-db".into()),
        (
            a::CULPRIT_POD_UID,
            "0c2b4e6a-1d3f-4a5b-9c8d-7e6f5a4b3c2d".into(),
        ),
        (a::CULPRIT_POD_NAME, "db-0".into()),
        (a::CULPRIT_NAMESPACE_NAME, "shop".into()),
    ];
    for (name, value) in named {
        assert_eq!(attr(s, name), &Value::String(value), "{name}");
    }
    assert_eq!(
        culprits[1],
        Value::String("request [inventory] POST /restock 0000000000002222: 49.0 ms".into())
    );
    // The span's own attributes are still there, first.
    assert_eq!(
        s.attributes.0[0],
        ("http.method".to_string(), Value::String("POST".into()))
    );
    let events: Vec<(&str, u64)> = s
        .events
        .iter()
        .map(|e| (e.name.as_str(), (e.time_ns - s.start_ns) / MS))
        .collect();
    assert_eq!(
        events,
        vec![
            (a::EVENT_THROTTLE_START, 10),
            (a::EVENT_THROTTLE_END, 40),
            (a::EVENT_WOKEN_BY_REQUEST, 90),
            (a::EVENT_LOST, 95),
        ]
    );
    let woken = &s.events[2];
    assert_eq!(
        woken.attributes.get(a::BLOCKED_BY_SPAN_ID),
        Some(&Value::String(RESTOCK.to_string()))
    );
    assert_eq!(
        woken.attributes.get(a::BLOCKED_BY_OPERATION),
        Some(&Value::String("[inventory] POST /restock".into()))
    );
    // A span that is no request is exported unchanged.
    let (originals, _) = fixture();
    let select = export
        .spans()
        .find(|s| s.span_id == SpanId(0x1112))
        .unwrap();
    assert_eq!(select, &originals[1]);
}

#[test]
fn what_out_writes_imports_back_to_the_same_spans() {
    let export = exported();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("export.otlp.json");
    let bytes = write_json(&export, &path).unwrap();
    assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
    let import = import_file(&path).unwrap();
    assert!(import.warnings.is_empty(), "{:?}", import.warnings);
    let written: Vec<Span> = export.spans().cloned().collect();
    assert_eq!(import.spans.len(), written.len());
    for (got, want) in import.spans.iter().zip(&written) {
        assert_eq!(got, want);
    }
}

fn receive_and_read(protocol: Protocol) -> (Vec<Span>, deepspan_export::SendReport) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ReceiverConfig::new(dir.path());
    config.grpc_addr = Some("127.0.0.1:0".parse().unwrap());
    config.http_addr = Some("127.0.0.1:0".parse().unwrap());
    let receiver = Receiver::start(config).unwrap();
    let url = match protocol {
        Protocol::Grpc => format!("grpc://{}", receiver.grpc_addr().unwrap()),
        Protocol::HttpProtobuf => format!("http://{}", receiver.http_addr().unwrap()),
    };
    let export = exported();
    let options = SendOptions {
        max_request_bytes: 1,
        ..SendOptions::default()
    };
    let report = send_otlp(&export, &url, &options).unwrap();
    let stats = receiver.shutdown().unwrap();
    assert_eq!(stats.spans_written as usize, export.spans().count());
    let mut reader = read_run_spans(dir.path()).unwrap();
    let spans: Vec<Span> = reader.by_ref().map(|s| s.unwrap()).collect();
    let mut want: Vec<Span> = export.spans().cloned().collect();
    want.sort_by_key(|s| (s.trace_id, s.span_id));
    let mut got = spans;
    got.sort_by_key(|s| (s.trace_id, s.span_id));
    assert_eq!(got, want);
    (got, report)
}

#[test]
fn grpc_sends_every_span_as_exported() {
    let (_, report) = receive_and_read(Protocol::Grpc);
    assert_eq!(report.protocol, Some(Protocol::Grpc));
    // One request per trace (the batch limit is below one trace).
    assert_eq!(report.requests, 2);
    assert_eq!(report.retries, 0);
}

#[test]
fn http_sends_every_span_as_exported() {
    let (_, report) = receive_and_read(Protocol::HttpProtobuf);
    assert_eq!(report.protocol, Some(Protocol::HttpProtobuf));
    assert_eq!(report.requests, 2);
}

/// A server that answers 503 (Retry-After: 0) to the first request and 200
/// to the next; returns the bodies' content encodings it saw.
fn flaky_server() -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for answer in [
            "503 Service Unavailable\r\nRetry-After: 0",
            "200 OK\r\nContent-Type: application/x-protobuf",
        ] {
            let (stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            let mut encoding = String::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let line = line.trim_end().to_ascii_lowercase();
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if let Some(v) = line.strip_prefix("content-encoding:") {
                    encoding = v.trim().to_string();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            seen.push(encoding);
            let mut stream = stream;
            write!(
                stream,
                "HTTP/1.1 {answer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
        }
        seen
    });
    (url, handle)
}

#[test]
fn a_503_is_retried_after_the_time_the_server_asks() {
    let (url, server) = flaky_server();
    let export = exported();
    let report = send_otlp(&export, &url, &SendOptions::default()).unwrap();
    assert_eq!(report.retries, 1);
    assert_eq!(report.requests, 1);
    assert_eq!(server.join().unwrap(), vec!["gzip", "gzip"]);
}

#[test]
fn a_server_that_refuses_is_an_error_after_the_tries() {
    // A port nobody listens on (bound, then closed).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = SendOptions {
        max_attempts: 2,
        first_backoff: Duration::from_millis(1),
        ..SendOptions::default()
    };
    let e = send_otlp(&exported(), &format!("http://127.0.0.1:{port}"), &options).unwrap_err();
    assert!(e.to_string().contains("after 2 tries"), "{e}");
}

#[test]
fn only_the_traces_asked_for_are_exported_and_counted() {
    let (spans, analysis) = fixture();
    let options = ExportOptions {
        traces: Some(HashSet::from([RESTOCK_TRACE])),
        ..ExportOptions::default()
    };
    let export = export_spans(spans, &analysis, &options);
    assert_eq!(export.traces.len(), 1);
    assert!(export.spans().all(|s| s.trace_id == RESTOCK_TRACE));
    assert_eq!(export.stats.run_spans, 1);
    assert_eq!(export.stats.requests, 1);
    assert_eq!(export.stats.requests_enriched, 1);
    // The other trace's request is not missing, only not asked for.
    assert!(export.notes.is_empty(), "{:?}", export.notes);
    // Its spans are those of an export of every trace.
    let all: Vec<Span> = exported()
        .spans()
        .filter(|s| s.trace_id == RESTOCK_TRACE)
        .cloned()
        .collect();
    assert_eq!(export.traces[0], all);
}

#[test]
fn a_trace_over_the_span_budget_is_folded_coarser_and_said_so() {
    let (spans, analysis) = fixture();
    let options = ExportOptions {
        max_spans_per_trace: 4,
        ..ExportOptions::default()
    };
    let export = export_spans(spans, &analysis, &options);
    let checkout: Vec<&Span> = export
        .spans()
        .filter(|s| s.trace_id == CHECKOUT_TRACE)
        .collect();
    assert!(checkout.len() <= 4, "{} spans", checkout.len());
    assert_eq!(export.stats.traces_refolded, 1);
    assert!(
        export
            .notes
            .iter()
            .any(|n| n.contains(&CHECKOUT_TRACE.to_string()) && n.contains("folded")),
        "{:?}",
        export.notes
    );
    // What was folded is counted on the spans that stayed.
    let parent = checkout.iter().find(|s| s.span_id == CHECKOUT).unwrap();
    let Value::Int(threshold) = attr(parent, a::FOLD_THRESHOLD_NS) else {
        panic!()
    };
    assert!(*threshold > MS as i64);
    let folded: i64 = checkout
        .iter()
        .filter_map(|s| s.attributes.get(a::FOLDED_PIECES).and_then(Value::as_i64))
        .sum();
    assert!(folded >= 2, "{folded}");
}
