//! Forward throughput, in spans/s, of one `Forwarder` sending requests of
//! 100 spans on loopback: to an HTTP/protobuf sink that only reads each
//! body (axum, answers 200), with and without gzip; then to deepspan's own
//! OTLP receiver (`deepspan-otlp`, which decodes and writes every request to
//! a run folder, in this process) over gRPC and HTTP, with and without gzip. The time runs
//! from the first `send` until `shutdown` has sent the last request. Plain
//! harness: `cargo bench -p deepspan-agent --bench forward`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deepspan_agent::forward::{EncodedRequest, ForwardConfig, Forwarder};
use deepspan_otlp::{Receiver, ReceiverConfig};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

const SPANS_PER_REQUEST: u64 = 100;
const REQUESTS: u64 = 2000;

fn request(n: u64) -> EncodedRequest {
    let kv = |k: &str, v: any_value::Value| KeyValue {
        key: k.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..KeyValue::default()
    };
    let spans = (0..SPANS_PER_REQUEST)
        .map(|i| Span {
            // Never 0: an all-zero trace id is invalid.
            trace_id: (n as u128 * 1000 + i as u128 + 1).to_be_bytes().to_vec(),
            span_id: (n * 1000 + i + 1).to_be_bytes().to_vec(),
            name: "GET /api/cart/{id}".into(),
            kind: 2,
            start_time_unix_nano: 1_700_000_000_000_000_000 + n * 1_000_000 + i,
            end_time_unix_nano: 1_700_000_000_000_000_000 + n * 1_000_000 + i + 3_000_000,
            attributes: vec![
                kv(
                    "http.route",
                    any_value::Value::StringValue("/api/cart/{id}".into()),
                ),
                kv("http.status_code", any_value::Value::IntValue(200)),
                kv(
                    "net.peer.name",
                    any_value::Value::StringValue("inventory".into()),
                ),
            ],
            ..Span::default()
        })
        .collect();
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv(
                    "service.name",
                    any_value::Value::StringValue("bench".into()),
                )],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            schema_url: String::new(),
        }],
    };
    EncodedRequest {
        bytes: Bytes::from(request.encode_to_vec()),
        spans: SPANS_PER_REQUEST,
    }
}

/// An HTTP sink on loopback; returns its port and the bodies' byte count.
fn sink() -> (u16, Arc<AtomicU64>) {
    let received = Arc::new(AtomicU64::new(0));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let counted = received.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/v1/traces",
                axum::routing::post(move |body: Bytes| {
                    counted.fetch_add(body.len() as u64, Ordering::Relaxed);
                    async { "" }
                }),
            );
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (port, received)
}

/// Sends every request through a new forwarder to `url`; returns the
/// seconds from the first send to the end of shutdown, and ns per send().
fn forward_all(url: &str, gzip: bool, requests: &[EncodedRequest]) -> (f64, f64) {
    let bytes: usize = requests.iter().map(|r| r.bytes.len()).sum();
    let forwarder = Forwarder::start(
        url,
        ForwardConfig {
            gzip,
            max_queue_bytes: bytes * 2,
            ..ForwardConfig::default()
        },
    )
    .unwrap();
    let started = Instant::now();
    for r in requests {
        forwarder.send(r.clone());
    }
    let enqueue = started.elapsed();
    let stats = forwarder.shutdown(Duration::from_secs(600));
    let elapsed = started.elapsed();
    assert_eq!(stats.requests_sent, requests.len() as u64, "{stats:?}");
    (
        elapsed.as_secs_f64(),
        enqueue.as_nanos() as f64 / requests.len() as f64,
    )
}

fn main() {
    let requests: Vec<EncodedRequest> = (0..REQUESTS).map(request).collect();
    let bytes: usize = requests.iter().map(|r| r.bytes.len()).sum();
    let spans = (REQUESTS * SPANS_PER_REQUEST) as f64;
    println!(
        "{REQUESTS} requests of {SPANS_PER_REQUEST} spans, {} bytes each",
        bytes / REQUESTS as usize
    );
    for gzip in [false, true] {
        let (port, received) = sink();
        let (seconds, send_ns) = forward_all(&format!("http://127.0.0.1:{port}"), gzip, &requests);
        println!(
            "forward HTTP/protobuf gzip={gzip} to a sink: {:.0} spans/s ({:.1} MB/s of protobuf, {:.1} MB on the wire); send() {send_ns:.0} ns per request",
            spans / seconds,
            bytes as f64 / seconds / 1e6,
            received.load(Ordering::Relaxed) as f64 / 1e6,
        );
    }
    for (grpc, gzip) in [(true, true), (true, false), (false, true), (false, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ReceiverConfig::new(dir.path());
        config.grpc_addr = Some("127.0.0.1:0".parse().unwrap());
        config.http_addr = Some("127.0.0.1:0".parse().unwrap());
        let receiver = Receiver::start(config).unwrap();
        let url = if grpc {
            format!("grpc://{}", receiver.grpc_addr().unwrap())
        } else {
            format!("http://{}", receiver.http_addr().unwrap())
        };
        let (seconds, _) = forward_all(&url, gzip, &requests);
        let stats = receiver.shutdown().unwrap();
        assert_eq!(stats.spans_written, REQUESTS * SPANS_PER_REQUEST);
        println!(
            "forward {} gzip={gzip} to deepspan's receiver (decoded, written to disk): {:.0} spans/s",
            if grpc { "gRPC" } else { "HTTP/protobuf" },
            spans / seconds
        );
    }
}
