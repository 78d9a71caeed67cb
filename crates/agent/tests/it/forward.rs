//! The forwarder against a real Jaeger v2 (all-in-one, memory storage;
//! `deepspan-jaeger-test` starts it): spans sent over gRPC and HTTP arrive
//! with their attributes as they were; with nobody listening, the queue
//! keeps to its byte budget by dropping the oldest requests, counted
//! exactly, and the newest arrive once Jaeger starts on that port. Also,
//! without Jaeger: a request over the whole budget, the shutdown deadline,
//! a server's refusal, its partial success, and
//! its Retry-After.
//!
//! No timing assumptions: every wait polls a condition with a generous
//! limit.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deepspan_agent::forward::{EncodedRequest, ForwardConfig, ForwardStats, Forwarder};
use deepspan_jaeger_test::{free_fixed_port, tag, Jaeger, Ports};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use serde_json::Value;

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

/// A 32-hex-digit trace id of `n` (fixed width, so every request of a test
/// encodes to the same size).
fn trace_hex(test: u8, n: u32) -> String {
    format!("{test:02x}{:022x}{n:08x}", 0xABCDEFu32)
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// One trace of two spans (a server span and its child) with attributes of
/// each type Jaeger keeps.
fn request(test: u8, n: u32) -> (String, EncodedRequest) {
    let trace = trace_hex(test, n);
    let trace_id = hex_bytes(&trace);
    let start = 1_700_000_000_000_000_000u64 + u64::from(n) * 1_000_000;
    let span = |id: u64, parent: Option<u64>, name: &str| Span {
        trace_id: trace_id.clone(),
        span_id: id.to_be_bytes().to_vec(),
        parent_span_id: parent.map(|p| p.to_be_bytes().to_vec()).unwrap_or_default(),
        name: name.into(),
        kind: if parent.is_none() { 2 } else { 3 },
        start_time_unix_nano: start + id,
        end_time_unix_nano: start + id + 5_000_000,
        attributes: vec![
            kv(
                "http.route",
                any_value::Value::StringValue("/cart/{id}".into()),
            ),
            kv("n", any_value::Value::IntValue(i64::from(n))),
            kv("ratio", any_value::Value::DoubleValue(0.25)),
            kv("cached", any_value::Value::BoolValue(n.is_multiple_of(2))),
        ],
        ..Span::default()
    };
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv(
                    "service.name",
                    any_value::Value::StringValue("forward-test".into()),
                )],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "forward-test".into(),
                    ..InstrumentationScope::default()
                }),
                spans: vec![
                    span(0x1000 + u64::from(n), None, "GET /cart"),
                    span(0x2000 + u64::from(n), Some(0x1000 + u64::from(n)), "SELECT"),
                ],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    (
        trace,
        EncodedRequest {
            bytes: Bytes::from(request.encode_to_vec()),
            spans: 2,
        },
    )
}

fn quick_retries() -> ForwardConfig {
    ForwardConfig {
        first_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        timeout: Duration::from_secs(10),
        ..ForwardConfig::default()
    }
}

/// Polls until `ready` holds; panics with `what` after `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = ready() {
            return v;
        }
        assert!(started.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Jaeger's trace, once it has both spans.
fn arrived(jaeger: &Jaeger, trace: &str) -> Value {
    wait_for(
        Duration::from_secs(60),
        &format!("trace {trace} in Jaeger"),
        || {
            jaeger
                .find_trace(trace)
                .filter(|t| t["spans"].as_array().is_some_and(|s| s.len() == 2))
        },
    )
}

fn check_unchanged(trace: &Value, n: u32) {
    for span in trace["spans"].as_array().unwrap() {
        assert_eq!(tag(span, "http.route"), "/cart/{id}", "{span}");
        assert_eq!(tag(span, "n"), i64::from(n), "{span}");
        assert_eq!(tag(span, "ratio"), 0.25, "{span}");
        assert_eq!(tag(span, "cached"), n.is_multiple_of(2), "{span}");
        assert!(
            ["GET /cart", "SELECT"].contains(&span["operationName"].as_str().unwrap()),
            "{span}"
        );
    }
    let services: Vec<&Value> = trace["processes"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| &p["serviceName"])
        .collect();
    assert_eq!(services, ["forward-test"]);
}

#[test]
#[ignore = "system: Jaeger"]
fn spans_arrive_in_jaeger_unchanged_over_grpc_and_http() {
    let jaeger = Jaeger::start();
    for (test, url) in [
        (1u8, format!("grpc://127.0.0.1:{}", jaeger.otlp_grpc)),
        (2, format!("http://127.0.0.1:{}", jaeger.otlp_http)),
    ] {
        let forwarder = Forwarder::start(&url, quick_retries()).unwrap();
        let traces: Vec<String> = (0..5)
            .map(|n| {
                let (trace, r) = request(test, n);
                forwarder.send(r);
                trace
            })
            .collect();
        let stats = forwarder.shutdown(Duration::from_secs(60));
        assert_eq!(
            (
                stats.requests_sent,
                stats.spans_sent,
                stats.requests_dropped()
            ),
            (5, 10, 0),
            "{url}: {stats:?}"
        );
        assert_eq!((stats.queue_bytes, stats.queue_requests), (0, 0));
        for (n, trace) in traces.iter().enumerate() {
            check_unchanged(&arrived(&jaeger, trace), n as u32);
        }
    }
}

fn offline_then_jaeger(test: u8, grpc: bool) {
    let ports = Ports::free();
    let url = if grpc {
        format!("grpc://127.0.0.1:{}", ports.otlp_grpc)
    } else {
        format!("http://127.0.0.1:{}", ports.otlp_http)
    };
    let requests: Vec<(String, EncodedRequest)> = (0..12).map(|n| request(test, n)).collect();
    let size = requests[0].1.bytes.len();
    assert!(requests.iter().all(|(_, r)| r.bytes.len() == size));
    let kept = 4usize;
    let budget = kept * size + size / 2;
    let forwarder = Forwarder::start(
        &url,
        ForwardConfig {
            max_queue_bytes: budget,
            ..quick_retries()
        },
    )
    .unwrap();
    // The first is being tried (and failing) when the others push it out.
    forwarder.send(requests[0].1.clone());
    wait_for(Duration::from_secs(60), "a first failed try", || {
        Some(()).filter(|_| forwarder.stats().retries > 0)
    });
    for (_, r) in &requests[1..] {
        forwarder.send(r.clone());
        let stats = forwarder.stats();
        assert!(stats.queue_bytes as usize <= budget, "{stats:?}");
    }
    let dropped = (requests.len() - kept) as u64;
    // The request being tried when it was pushed out is counted once its
    // try has failed.
    let stats: ForwardStats = wait_for(
        Duration::from_secs(60),
        "the pushed-out requests counted",
        || Some(forwarder.stats()).filter(|s| s.requests_dropped_oldest >= dropped),
    );
    assert_eq!(stats.requests_dropped_oldest, dropped, "{stats:?}");
    assert_eq!(stats.spans_dropped_oldest, 2 * dropped);
    assert_eq!(stats.requests_sent, 0);
    assert_eq!(stats.queue_requests, kept as u64);
    assert_eq!(stats.queue_bytes as usize, kept * size);
    assert!(stats.queue_bytes_peak as usize <= budget, "{stats:?}");
    assert!(
        stats
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("reach") || e.contains("Unavailable")),
        "{stats:?}"
    );

    let jaeger = Jaeger::start_on(ports);
    let stats = wait_for(
        Duration::from_secs(120),
        "the kept requests sent once Jaeger is up",
        || Some(forwarder.stats()).filter(|s| s.requests_sent >= kept as u64),
    );
    assert_eq!(stats.requests_sent, kept as u64, "{stats:?}");
    assert_eq!(stats.requests_dropped_oldest, dropped, "{stats:?}");
    for (n, (trace, _)) in requests.iter().enumerate().skip(requests.len() - kept) {
        check_unchanged(&arrived(&jaeger, trace), n as u32);
    }
    for (trace, _) in &requests[..requests.len() - kept] {
        assert!(
            jaeger.find_trace(trace).is_none(),
            "dropped trace {trace} reached Jaeger"
        );
    }
    let stats = forwarder.shutdown(Duration::from_secs(30));
    assert_eq!(
        (
            stats.requests_queued,
            stats.requests_sent,
            stats.requests_dropped()
        ),
        (12, kept as u64, dropped),
        "{stats:?}"
    );
}

#[test]
#[ignore = "system: Jaeger"]
fn over_http_with_jaeger_down_the_oldest_go_and_the_newest_arrive_later() {
    offline_then_jaeger(3, false);
}

#[test]
#[ignore = "system: Jaeger"]
fn over_grpc_with_jaeger_down_the_oldest_go_and_the_newest_arrive_later() {
    offline_then_jaeger(4, true);
}

#[test]
fn a_request_over_the_whole_budget_is_dropped_at_once() {
    let url = format!("http://127.0.0.1:{}", free_fixed_port());
    let (_, r) = request(5, 0);
    let forwarder = Forwarder::start(
        &url,
        ForwardConfig {
            max_queue_bytes: r.bytes.len() - 1,
            ..quick_retries()
        },
    )
    .unwrap();
    forwarder.send(r);
    let stats = forwarder.stats();
    assert_eq!(
        (
            stats.requests_dropped_oversize,
            stats.spans_dropped_oversize,
            stats.queue_bytes,
            stats.queue_bytes_peak
        ),
        (1, 2, 0, 0)
    );
}

#[test]
fn what_the_deadline_leaves_unsent_is_counted_at_shutdown() {
    // Nobody listens: every try fails, and shutdown gives up at its
    // deadline, counting the request being tried with the rest.
    let url = format!("http://127.0.0.1:{}", free_fixed_port());
    let forwarder = Forwarder::start(&url, quick_retries()).unwrap();
    for n in 0..3 {
        forwarder.send(request(6, n).1);
    }
    let stats = forwarder.shutdown(Duration::from_millis(300));
    assert_eq!(
        (
            stats.requests_dropped_at_shutdown,
            stats.spans_dropped_at_shutdown,
            stats.requests_sent,
            stats.queue_bytes,
        ),
        (3, 6, 0, 0),
        "{stats:?}"
    );
}

/// An HTTP server on loopback that answers the POSTs it gets with
/// `answers` in turn: (status line, extra header lines, body).
fn fake_server(answers: Vec<(&'static str, &'static str, Vec<u8>)>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for ((status, headers, body), stream) in answers.into_iter().zip(listener.incoming()) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut request_body = vec![0; length];
            reader.read_exact(&mut request_body).unwrap();
            write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .unwrap();
            stream.write_all(&body).unwrap();
        }
    });
    port
}

#[test]
fn a_503_is_retried_after_the_wait_the_server_asks() {
    let port = fake_server(vec![
        (
            "503 Service Unavailable",
            "retry-after: 1\r\n",
            b"busy".to_vec(),
        ),
        ("200 OK", "", Vec::new()),
    ]);
    let forwarder = Forwarder::start(&format!("http://127.0.0.1:{port}"), quick_retries()).unwrap();
    let started = Instant::now();
    forwarder.send(request(8, 0).1);
    let stats = wait_for(Duration::from_secs(60), "the request sent", || {
        Some(forwarder.stats()).filter(|s| s.requests_sent == 1)
    });
    // The server asked for 1 s; our own backoff would have been 20 ms.
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!((stats.retries, stats.spans_sent), (1, 2), "{stats:?}");
    assert!(stats.last_error.unwrap().contains("503"));
    forwarder.shutdown(Duration::from_secs(10));
}

#[test]
fn a_refusal_drops_the_request_and_partial_success_is_counted() {
    let port = fake_server(vec![("400 Bad Request", "", b"no such thing".to_vec())]);
    let forwarder = Forwarder::start(&format!("http://127.0.0.1:{port}"), quick_retries()).unwrap();
    forwarder.send(request(7, 0).1);
    let stats = forwarder.shutdown(Duration::from_secs(30));
    assert_eq!(
        (
            stats.requests_dropped_failed,
            stats.spans_dropped_failed,
            stats.retries
        ),
        (1, 2, 0),
        "{stats:?}"
    );
    let error = stats.last_error.unwrap();
    assert!(
        error.contains("400") && error.contains("no such thing"),
        "{error}"
    );

    let partial = ExportTraceServiceResponse {
        partial_success: Some(ExportTracePartialSuccess {
            rejected_spans: 1,
            error_message: "span too old".into(),
        }),
    };
    let port = fake_server(vec![("200 OK", "", partial.encode_to_vec())]);
    let forwarder = Forwarder::start(&format!("http://127.0.0.1:{port}"), quick_retries()).unwrap();
    forwarder.send(request(7, 1).1);
    let stats = forwarder.shutdown(Duration::from_secs(30));
    assert_eq!(
        (stats.requests_sent, stats.spans_sent, stats.spans_rejected),
        (1, 2, 1),
        "{stats:?}"
    );
    assert!(stats.last_error.unwrap().contains("span too old"));
}

#[test]
fn a_bad_url_is_refused_at_start() {
    assert!(Forwarder::start("https://tempo:4318", ForwardConfig::default()).is_err());
    assert!(Forwarder::start("tempo:4318", ForwardConfig::default()).is_err());
}
