//! The receiver against real clients: tonic's generated TraceServiceClient
//! for gRPC, plain HTTP/1.1 over TCP for OTLP/HTTP (what exporters send,
//! byte for byte). Every test reads the run back.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use deepspan_otlp::{Error, Protocol, Receiver, ReceiverConfig, ReceiverHandle, ReceiverStats};
use deepspan_spans::store::{span_files, RecordReader};
use deepspan_spans::{read_run_spans, ExportTraceServiceRequest, Span};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span as PSpan};
use prost::Message;

fn start(run: &Path, max_queue_bytes: usize) -> ReceiverHandle {
    let mut config = ReceiverConfig::new(run);
    config.grpc_addr = Some("127.0.0.1:0".parse().unwrap());
    config.http_addr = Some("127.0.0.1:0".parse().unwrap());
    config.max_queue_bytes = max_queue_bytes;
    Receiver::start(config).unwrap()
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

/// A request of `n` spans of trace `batch`, with deepspan fields and an activation event.
fn request(batch: u8, n: usize) -> ExportTraceServiceRequest {
    let spans = (0..n)
        .map(|i| {
            let start = 1_700_000_000_000_000_000 + (batch as u64) * 1_000_000 + i as u64 * 1000;
            PSpan {
                trace_id: [batch.max(1); 16].to_vec(),
                span_id: ((i as u64 + 1) | ((batch as u64) << 32))
                    .to_be_bytes()
                    .to_vec(),
                parent_span_id: if i == 0 {
                    Vec::new()
                } else {
                    ((batch as u64) << 32 | 1).to_be_bytes().to_vec()
                },
                name: format!("op-{i}"),
                kind: 2,
                start_time_unix_nano: start,
                end_time_unix_nano: start + 500,
                attributes: vec![
                    kv("deepspan.tid", any_value::Value::IntValue(4242)),
                    kv(
                        "deepspan.mono_start_ns",
                        any_value::Value::IntValue(1000 + i as i64),
                    ),
                    kv(
                        "deepspan.mono_end_ns",
                        any_value::Value::IntValue(1500 + i as i64),
                    ),
                    kv("http.route", any_value::Value::StringValue("/x".into())),
                ],
                events: vec![span::Event {
                    time_unix_nano: start,
                    name: "deepspan.on".into(),
                    attributes: vec![
                        kv("deepspan.tid", any_value::Value::IntValue(4242)),
                        kv(
                            "deepspan.mono_ns",
                            any_value::Value::IntValue(1000 + i as i64),
                        ),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv(
                    "service.name",
                    any_value::Value::StringValue("svc".into()),
                )],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// The requests stored in the run, in order.
fn stored(run: &Path) -> Vec<ExportTraceServiceRequest> {
    span_files(run)
        .unwrap()
        .iter()
        .flat_map(|f| RecordReader::open(f).unwrap().map(|r| r.unwrap()))
        .collect()
}

fn spans_of(reqs: &[ExportTraceServiceRequest]) -> Vec<Span> {
    reqs.iter()
        .flat_map(|r| {
            deepspan_spans::parse_otlp_protobuf(&r.encode_to_vec(), "sent")
                .unwrap()
                .spans
        })
        .collect()
}

fn read_back(run: &Path) -> Vec<Span> {
    read_run_spans(run).unwrap().map(|s| s.unwrap()).collect()
}

struct HttpReply {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// One HTTP/1.1 request on its own connection.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpReply {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a full HTTP head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .get("transfer-encoding")
        .is_some_and(|t| t == "chunked")
    {
        body = dechunk(&body);
    }
    HttpReply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
}

fn post_protobuf(addr: SocketAddr, req: &ExportTraceServiceRequest) -> HttpReply {
    http(
        addr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/x-protobuf")],
        &req.encode_to_vec(),
    )
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// google.rpc.Status, as a client decodes it.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

fn grpc_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn grpc_client(addr: SocketAddr) -> TraceServiceClient<tonic::transport::Channel> {
    TraceServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn assert_accounted(stats: &ReceiverStats) {
    assert_eq!(
        stats.spans_received,
        stats.spans_written + stats.spans_dropped,
        "every span written or counted as dropped: {stats:?}"
    );
}

#[test]
fn grpc_exports_land_in_the_run_unchanged() {
    let run = tempfile::tempdir().unwrap();
    let rx = start(run.path(), 64 << 20);
    let addr = rx.grpc_addr().unwrap();
    assert_ne!(addr.port(), 0, "the bound port is reported");
    let sent = vec![request(1, 3), request(2, 512), request(3, 1)];
    grpc_runtime().block_on(async {
        let mut plain = grpc_client(addr).await;
        let r = plain.export(sent[0].clone()).await.unwrap().into_inner();
        assert_eq!(r, ExportTraceServiceResponse::default(), "full success");
        // Exporters often compress: gzip is accepted.
        let mut zipped = grpc_client(addr)
            .await
            .send_compressed(tonic::codec::CompressionEncoding::Gzip);
        zipped.export(sent[1].clone()).await.unwrap();
        plain.export(sent[2].clone()).await.unwrap();
    });
    let stats = rx.shutdown().unwrap();
    assert_eq!(stored(run.path()), sent, "requests are stored as received");
    assert_eq!(read_back(run.path()), spans_of(&sent));
    assert_eq!(stats.requests, 3);
    assert_eq!(stats.spans_received, 516);
    assert_eq!(stats.spans_written, 516);
    assert_eq!(stats.spans_dropped, 0);
    assert_eq!(stats.requests_rejected, 0);
    assert_eq!(
        stats.bytes,
        sent.iter().map(|r| r.encoded_len() as u64).sum::<u64>()
    );
    let s = &read_back(run.path())[0];
    assert_eq!(s.sync.tid, Some(4242), "deepspan fields survive");
    assert_eq!(s.sync.activations.len(), 1);
}

#[test]
fn http_protobuf_gzip_and_json_land_in_the_run() {
    let run = tempfile::tempdir().unwrap();
    let rx = start(run.path(), 64 << 20);
    let addr = rx.http_addr().unwrap();
    let sent = vec![request(1, 4), request(2, 100), request(3, 2)];

    let r = post_protobuf(addr, &sent[0]);
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/x-protobuf");
    assert_eq!(
        ExportTraceServiceResponse::decode(r.body.as_slice()).unwrap(),
        ExportTraceServiceResponse::default()
    );

    let r = http(
        addr,
        "POST",
        "/v1/traces",
        &[
            ("Content-Type", "application/x-protobuf"),
            ("Content-Encoding", "gzip"),
        ],
        &gzip(&sent[1].encode_to_vec()),
    );
    assert_eq!(r.status, 200);

    // OTLP/JSON: hex ids, camelCase, as the opentelemetry-proto serde mapping writes it.
    let json = serde_json::to_vec(&sent[2]).unwrap();
    assert!(
        String::from_utf8_lossy(&json).contains("\"traceId\":\"03030303"),
        "hex ids in JSON"
    );
    let r = http(
        addr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/json; charset=utf-8")],
        &json,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.headers["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v.get("partialSuccess").is_none_or(|p| p.is_null()), "{v}");

    let stats = rx.shutdown().unwrap();
    assert_eq!(stored(run.path()), sent);
    assert_eq!(read_back(run.path()), spans_of(&sent));
    assert_eq!((stats.requests, stats.spans_written), (3, 106));
    assert_accounted(&stats);
}

#[test]
fn the_official_otlp_json_example_is_received() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/spans/otlp/opentelemetry-proto-example-trace.json"
    );
    let json = std::fs::read(path).unwrap();
    let expected = deepspan_spans::parse_otlp_json(&json, "example")
        .unwrap()
        .spans;
    let run = tempfile::tempdir().unwrap();
    let rx = start(run.path(), 64 << 20);
    let r = http(
        rx.http_addr().unwrap(),
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/json")],
        &json,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    rx.shutdown().unwrap();
    assert_eq!(read_back(run.path()), expected);
}

#[test]
fn malformed_payloads_get_otlp_errors_and_the_receiver_keeps_working() {
    let run = tempfile::tempdir().unwrap();
    let rx = start(run.path(), 64 << 20);
    let haddr = rx.http_addr().unwrap();

    // Protobuf garbage: 400 with a google.rpc.Status in protobuf.
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/x-protobuf")],
        b"\xff\xff\xff\xff garbage",
    );
    assert_eq!(r.status, 400);
    let status = RpcStatus::decode(r.body.as_slice()).unwrap();
    assert_eq!(status.code, 3, "INVALID_ARGUMENT");
    assert!(
        status.message.contains("ExportTraceServiceRequest"),
        "{}",
        status.message
    );

    // Broken JSON and JSON of the wrong shape: 400 with a JSON Status naming the place.
    for body in [
        &b"{\"resourceSpans\": [ {"[..],
        b"{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": 12}]}]}]}",
    ] {
        let r = http(
            haddr,
            "POST",
            "/v1/traces",
            &[("Content-Type", "application/json")],
            body,
        );
        assert_eq!(r.status, 400);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["code"], 3);
        assert!(v["message"].as_str().unwrap().contains("OTLP/JSON"), "{v}");
    }
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/json")],
        b"{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": 12}]}]}]}",
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("resourceSpans[0].scopeSpans[0].spans[0]"),
        "{v}"
    );

    // Corrupt gzip, unknown encodings and media types, wrong paths and methods.
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[
            ("Content-Type", "application/x-protobuf"),
            ("Content-Encoding", "gzip"),
        ],
        b"not gzip",
    );
    assert_eq!(r.status, 400);
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[
            ("Content-Type", "application/x-protobuf"),
            ("Content-Encoding", "br"),
        ],
        b"x",
    );
    assert_eq!(r.status, 415);
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "text/plain")],
        b"x",
    );
    assert_eq!(r.status, 415);
    assert_eq!(
        http(
            haddr,
            "POST",
            "/v1/metrics",
            &[("Content-Type", "application/x-protobuf")],
            b""
        )
        .status,
        404
    );
    assert_eq!(http(haddr, "GET", "/v1/traces", &[], b"").status, 405);

    // A gzip bomb stops at the request limit: 413, not memory exhaustion.
    let bomb = gzip(&vec![0u8; deepspan_otlp::MAX_REQUEST_BYTES + 1]);
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[
            ("Content-Type", "application/x-protobuf"),
            ("Content-Encoding", "gzip"),
        ],
        &bomb,
    );
    assert_eq!(r.status, 413);

    // Spans without valid ids: left out, the rest kept, partial success reported.
    let mut mixed = request(7, 3);
    mixed.resource_spans[0].scope_spans[0].spans[1]
        .trace_id
        .clear();
    let r = post_protobuf(haddr, &mixed);
    assert_eq!(r.status, 200);
    let resp = ExportTraceServiceResponse::decode(r.body.as_slice()).unwrap();
    let partial = resp.partial_success.unwrap();
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial.error_message.contains("spans[1]: traceId"),
        "{}",
        partial.error_message
    );

    // gRPC: a message that is not an ExportTraceServiceRequest gets INVALID_ARGUMENT (not INTERNAL).
    let gaddr = rx.grpc_addr().unwrap();
    #[derive(Clone, PartialEq, Message)]
    struct Bogus {
        #[prost(fixed64, tag = "1")]
        not_resource_spans: u64,
    }
    grpc_runtime().block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{gaddr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        );
        let err = grpc
            .unary::<Bogus, ExportTraceServiceResponse, _>(
                tonic::Request::new(Bogus {
                    not_resource_spans: 7,
                }),
                path,
                tonic_prost::ProstCodec::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

        let mut client = grpc_client(gaddr).await;
        let mut bad = request(8, 2);
        bad.resource_spans[0].scope_spans[0].spans[0].span_id = vec![0; 8];
        let resp = client.export(bad).await.unwrap().into_inner();
        assert_eq!(resp.partial_success.unwrap().rejected_spans, 1);
        // And valid requests still go through.
        client.export(request(9, 5)).await.unwrap();
    });
    assert_eq!(post_protobuf(haddr, &request(10, 2)).status, 200);

    let stats = rx.shutdown().unwrap();
    assert_eq!(stats.requests_invalid, 9, "{stats:?}");
    assert_eq!(stats.spans_written, 2 + 1 + 5 + 2);
    assert_eq!(stats.spans_dropped, 2, "the two spans without ids");
    assert_accounted(&stats);
    // What was stored reads back: no span without identity got in.
    assert_eq!(read_back(run.path()).len(), 10);
}

#[test]
fn a_full_queue_refuses_with_retryable_errors_and_loses_nothing_acknowledged() {
    let run = tempfile::tempdir().unwrap();
    // A one-byte budget: an empty queue takes one request, then it is full.
    let rx = start(run.path(), 1);
    rx.pause_writer(true);
    let (haddr, gaddr) = (rx.http_addr().unwrap(), rx.grpc_addr().unwrap());
    let first = request(1, 10);
    assert_eq!(post_protobuf(haddr, &first).status, 200);

    let r = post_protobuf(haddr, &request(2, 10));
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(
        RpcStatus::decode(r.body.as_slice()).unwrap().code,
        14,
        "UNAVAILABLE"
    );
    let r = http(
        haddr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/json")],
        &serde_json::to_vec(&request(3, 1)).unwrap(),
    );
    assert_eq!(r.status, 503);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["code"], 14);
    assert_eq!(v["details"][0]["retryDelay"], "1s");

    grpc_runtime().block_on(async {
        let err = grpc_client(gaddr)
            .await
            .export(request(4, 10))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        // The RetryInfo exporters use to space their retries.
        let details = RpcStatus::decode(err.details()).unwrap();
        assert_eq!(details.code, 14);
    });
    let during = rx.stats();
    assert_eq!(during.requests_rejected, 3);
    assert_eq!(during.spans_written, 0, "the writer is held");

    // Once the writer catches up, requests are accepted again.
    rx.pause_writer(false);
    let second = request(5, 10);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match post_protobuf(haddr, &second).status {
            200 => break,
            503 if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            s => panic!("status {s}"),
        }
    }
    let stats = rx.shutdown().unwrap();
    assert_eq!(
        stored(run.path()),
        vec![first, second],
        "everything acknowledged, nothing else"
    );
    assert_eq!(stats.spans_written, 20);
    assert_eq!(stats.spans_dropped, stats.spans_received - 20);
    assert!(stats.requests_rejected >= 3);
    assert_accounted(&stats);
}

#[test]
fn shutdown_drains_the_queue_and_flushes() {
    let run = tempfile::tempdir().unwrap();
    let rx = start(run.path(), 64 << 20);
    rx.pause_writer(true);
    let sent: Vec<ExportTraceServiceRequest> = (1..=20).map(|b| request(b, 50)).collect();
    for r in &sent {
        assert_eq!(post_protobuf(rx.http_addr().unwrap(), r).status, 200);
    }
    assert!(
        span_files(run.path()).unwrap().is_empty(),
        "no spans folder before the first write"
    );
    let (haddr, gaddr) = (rx.http_addr().unwrap(), rx.grpc_addr().unwrap());
    // Shutdown releases the held writer and waits for it.
    let stats = rx.shutdown().unwrap();
    assert_eq!(stats.spans_written, 1000);
    assert_eq!(stored(run.path()), sent);
    assert!(TcpStream::connect(haddr).is_err(), "HTTP port closed");
    assert!(TcpStream::connect(gaddr).is_err(), "gRPC port closed");
}

#[test]
fn a_busy_port_is_an_error_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap();
    let mut config = ReceiverConfig::new(tempfile::tempdir().unwrap().path());
    config.grpc_addr = Some("127.0.0.1:0".parse().unwrap());
    config.http_addr = Some(port);
    match Receiver::start(config) {
        Err(
            e @ Error::Bind {
                protocol: Protocol::Http,
                addr,
                ..
            },
        ) => {
            assert_eq!(addr, port);
            assert!(e.to_string().contains(&port.to_string()), "{e}");
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("bound a busy port"),
    }
}

#[test]
fn one_transport_can_be_disabled() {
    let run = tempfile::tempdir().unwrap();
    let mut config = ReceiverConfig::new(run.path());
    config.grpc_addr = None;
    config.http_addr = Some("127.0.0.1:0".parse().unwrap());
    let rx = Receiver::start(config).unwrap();
    assert!(rx.grpc_addr().is_none());
    assert_eq!(
        post_protobuf(rx.http_addr().unwrap(), &request(1, 1)).status,
        200
    );
    assert_eq!(rx.shutdown().unwrap().spans_written, 1);
}
