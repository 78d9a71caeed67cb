//! Load generator for the OTLP receiver benchmark (bench/otlp_load.py):
//! several tonic `TraceServiceClient`s, each on its own connection, export
//! batches of spans as fast as the receiver acknowledges them.
//!
//! ```text
//! otlp_load --grpc 127.0.0.1:4317 [--seconds 20] [--clients 4] [--batch 512] [--rate SPANS_PER_S]
//! ```
//!
//! Prints one JSON object: spans and requests acknowledged, refusals
//! (UNAVAILABLE: retried after a pause, as exporters do), other errors.
//! `--rate` paces the clients (total spans/s) to measure below capacity.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span};
use prost::Message;

#[derive(Default)]
struct Totals {
    spans: AtomicU64,
    requests: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut addr, mut seconds, mut clients, mut batch, mut rate) =
        (None, 20.0, 4usize, 512usize, None);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--grpc" => {
                addr = Some(
                    value()
                        .parse::<SocketAddr>()
                        .unwrap_or_else(|e| usage(&e.to_string())),
                )
            }
            "--seconds" => seconds = value().parse().unwrap_or_else(|_| usage("--seconds N")),
            "--clients" => clients = value().parse().unwrap_or_else(|_| usage("--clients N")),
            "--batch" => batch = value().parse().unwrap_or_else(|_| usage("--batch N")),
            "--rate" => {
                rate = Some(
                    value()
                        .parse::<f64>()
                        .unwrap_or_else(|_| usage("--rate SPANS_PER_S")),
                )
            }
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let addr = addr.unwrap_or_else(|| usage("--grpc ADDR is required"));
    if !(1..4096).contains(&batch) {
        usage("--batch must be between 1 and 4095");
    }
    let duration = Duration::from_secs_f64(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let totals = Arc::new(Totals::default());
    let started = Instant::now();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let totals = totals.clone();
            // Requests per second for this client when paced.
            let interval = rate.map(|r| Duration::from_secs_f64(batch as f64 * clients as f64 / r));
            tasks.push(tokio::spawn(async move {
                let mut client = TraceServiceClient::connect(format!("http://{addr}"))
                    .await
                    .expect("connect to the receiver")
                    .max_decoding_message_size(64 << 20);
                let mut request = template(batch, c as u8);
                let mut n: u64 = 0;
                let mut next = Instant::now();
                while started.elapsed() < duration {
                    if let Some(i) = interval {
                        next += i;
                        tokio::time::sleep_until(next.into()).await;
                    }
                    n += 1;
                    renumber(&mut request, c as u64, n);
                    let bytes = request.encoded_len() as u64;
                    match client.export(request.clone()).await {
                        Ok(_) => {
                            totals.spans.fetch_add(batch as u64, Relaxed);
                            totals.requests.fetch_add(1, Relaxed);
                            totals.bytes.fetch_add(bytes, Relaxed);
                        }
                        Err(s) if s.code() == tonic::Code::Unavailable => {
                            totals.refused.fetch_add(1, Relaxed);
                            // Exporters back off; a short pause keeps pressure on.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(_) => {
                            totals.errors.fetch_add(1, Relaxed);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let t = &totals;
    println!(
        "{{\"seconds\": {elapsed:.3}, \"clients\": {clients}, \"batch\": {batch}, \"spans_acked\": {}, \"requests_acked\": {}, \"bytes_acked\": {}, \"refused\": {}, \"errors\": {}, \"spans_per_s\": {:.0}}}",
        t.spans.load(Relaxed),
        t.requests.load(Relaxed),
        t.bytes.load(Relaxed),
        t.refused.load(Relaxed),
        t.errors.load(Relaxed),
        t.spans.load(Relaxed) as f64 / elapsed
    );
}

fn usage(problem: &str) -> ! {
    eprintln!("otlp_load: {problem}\nusage: otlp_load --grpc ADDR [--seconds S] [--clients N] [--batch N] [--rate SPANS_PER_S]");
    std::process::exit(2)
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

/// A batch shaped like an instrumented HTTP service's: server spans with
/// the usual attributes, deepspan fields and activation events.
fn template(batch: usize, client: u8) -> ExportTraceServiceRequest {
    use any_value::Value::{IntValue, StringValue};
    let spans = (0..batch)
        .map(|i| {
            let start = 1_700_000_000_000_000_000u64 + i as u64 * 10_000;
            let on = |name: &str, t: u64| span::Event {
                time_unix_nano: t,
                name: name.into(),
                attributes: vec![
                    kv("deepspan.tid", IntValue(4000 + i as i64 % 8)),
                    kv("deepspan.mono_ns", IntValue(t as i64 / 1000)),
                ],
                ..Default::default()
            };
            Span {
                trace_id: vec![client; 16],
                span_id: vec![1; 8],
                parent_span_id: if i % 4 == 0 { Vec::new() } else { vec![2; 8] },
                name: format!("GET /api/items/{}", i % 16),
                kind: 2,
                start_time_unix_nano: start,
                end_time_unix_nano: start + 250_000,
                attributes: vec![
                    kv("http.request.method", StringValue("GET".into())),
                    kv("http.route", StringValue("/api/items/{id}".into())),
                    kv("http.response.status_code", IntValue(200)),
                    kv("server.address", StringValue("items.internal".into())),
                    kv("url.path", StringValue(format!("/api/items/{i}"))),
                    kv("deepspan.tid", IntValue(4000 + i as i64 % 8)),
                    kv("deepspan.mono_start_ns", IntValue(start as i64 / 1000)),
                    kv(
                        "deepspan.mono_end_ns",
                        IntValue(start as i64 / 1000 + 250_000),
                    ),
                ],
                events: vec![
                    on("deepspan.on", start),
                    on("deepspan.off", start + 250_000),
                ],
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", StringValue(format!("load-{client}"))),
                    kv("host.name", StringValue("bench".into())),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "otlp_load".into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Fresh, valid ids for request `n` of `client` (batches up to 4095 spans).
fn renumber(req: &mut ExportTraceServiceRequest, client: u64, n: u64) {
    for (i, s) in req.resource_spans[0].scope_spans[0]
        .spans
        .iter_mut()
        .enumerate()
    {
        let trace = (client << 48) | (n << 8) | (i as u64 / 4) & 0xff;
        s.trace_id[8..].copy_from_slice(&(trace | 1).to_be_bytes());
        s.span_id
            .copy_from_slice(&((n << 20) | (client << 12) | (i as u64 + 1)).to_be_bytes());
        if !s.parent_span_id.is_empty() {
            let root = i / 4 * 4;
            s.parent_span_id
                .copy_from_slice(&((n << 20) | (client << 12) | (root as u64 + 1)).to_be_bytes());
        }
    }
}
