//! Latency from an anomalous span reaching `deepspan agent` to the same
//! span reaching the back-end carrying `deepspan.diagnosis`.
//!
//! The release agent runs pinned to CPU 1 and forwards to an in-process
//! sink (deepspan's OTLP receiver with a `RequestSink` that notes, for
//! every span carrying `deepspan.diagnosis`, when it came). This process
//! (CPU 0) first warms one operation with normal spans (20 ms ± 30 %,
//! real timestamps ending now) and keeps a trickle of them going; then,
//! every few seconds, sends one span of that operation 10 × as long,
//! ending now, so the flight recorder still holds its window. The latency
//! of each runs from its send to its arrival at the sink. Where the time
//! goes, from the snapshot folder (`deepspan.snapshot` names it): the wait
//! until the window has settled (its end + `--margin-ms` + `--settle-ms`),
//! the flight recorder writing the window (until manifest.json's mtime),
//! the analysis (until the newest file of analysis/), and the rest
//! (snapshot.json, rename, forwarding). Cases: `--settle-ms 0` and the
//! default (1000). Needs root and tracefs. `cargo build --release -p
//! deepspan && cargo bench -p deepspan-agent --bench agent_latency`;
//! `BENCH_ANOMALIES` (default 12), `BENCH_INTERVAL_MS` (default 3000).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;
use common::{kv, median, pin_to_cpu, wall_ns, AgentProcess, Sink, SplitMix, GENERATOR_CPU};
use deepspan_export::{ClientOptions, OtlpClient};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, ResourceSpans, ScopeSpans, Span};
use prost::Message;

const MEDIAN_NS: u64 = 20_000_000;
const MARGIN_MS: u64 = 100; // the agent's default --margin-ms

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One request of `durations.len()` SERVER spans of `front` `GET /slow`,
/// the last ending now; returns it and its span ids.
fn request(durations: &[u64], serial: &mut u64, rng: &mut SplitMix) -> (Bytes, Vec<Vec<u8>>) {
    let end = wall_ns();
    let mut ids = Vec::new();
    let spans = durations
        .iter()
        .map(|&d| {
            *serial += 1;
            let span_id = (*serial | 1 << 62).to_be_bytes().to_vec();
            ids.push(span_id.clone());
            Span {
                trace_id: ((rng.next() as u128) << 64 | *serial as u128)
                    .to_be_bytes()
                    .to_vec(),
                span_id,
                name: "GET /slow".into(),
                kind: SpanKind::Server as i32,
                start_time_unix_nano: end - d,
                end_time_unix_nano: end,
                attributes: vec![
                    kv("http.request.method", Value::StringValue("GET".into())),
                    kv("http.route", Value::StringValue("/slow".into())),
                    kv("http.response.status_code", Value::IntValue(200)),
                ],
                ..Span::default()
            }
        })
        .collect();
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", Value::StringValue("front".into()))],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            schema_url: String::new(),
        }],
    };
    (Bytes::from(request.encode_to_vec()), ids)
}

fn normal(rng: &mut SplitMix) -> u64 {
    (MEDIAN_NS as f64 * (0.7 + 0.6 * rng.unit())) as u64
}

/// Wall-clock ns of a file's last change.
fn mtime_ns(path: &Path) -> Option<u64> {
    let t = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_nanos() as u64)
}

fn newest_mtime_ns(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            if e.file_type().ok()?.is_dir() {
                newest_mtime_ns(&e.path())
            } else {
                mtime_ns(&e.path())
            }
        })
        .max()
}

/// One anomaly's latency and its phases, ms.
struct Sample {
    total: f64,
    diagnosis: String,
    settle_wait: Option<f64>,
    kernel_write: Option<f64>,
    analysis: Option<f64>,
    rest: Option<f64>,
}

fn run_case(
    label: &str,
    settle_ms: Option<u64>,
    anomalies: u64,
    interval: Duration,
) -> Vec<Sample> {
    let sink = Sink::start(true);
    let mut flags = vec![
        // Large enough that a window a second old is still there on this
        // busy shared machine (8 MiB lost some).
        "--buffer-kb",
        "32768",
        "--history-kb",
        "32768",
        "--max-snapshots-per-minute",
        "120",
        // The latency of each anomaly's diagnosis, not the budget's wait.
        "--cpu-budget",
        "100",
    ];
    let settle_text = settle_ms.map(|s| s.to_string());
    if let Some(s) = &settle_text {
        flags.extend(["--settle-ms", s.as_str()]);
    }
    let agent = AgentProcess::start(&sink.url(), &flags);
    let settle_ns = settle_ms.unwrap_or(1000) * 1_000_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = agent.url();
    let options = ClientOptions {
        protocol: None,
        gzip: false,
        timeout: Duration::from_secs(30),
    };
    // The trickle of normal spans: 5 every 50 ms, on a thread of its own.
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let (stop, url, options) = (stop.clone(), url.clone(), options.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut client = OtlpClient::new(&url, &options).unwrap();
                let mut rng = SplitMix(7);
                let mut serial = 1 << 40;
                while !stop.load(Ordering::Relaxed) {
                    let durations: Vec<u64> = (0..5).map(|_| normal(&mut rng)).collect();
                    let (bytes, _) = request(&durations, &mut serial, &mut rng);
                    client.send_encoded(bytes).await.expect("normal spans sent");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
    };
    let mut samples = Vec::new();
    runtime.block_on(async {
        let mut client = OtlpClient::new(&url, &options).unwrap();
        let mut rng = SplitMix(1);
        let mut serial = 0;
        // Warm-up: well past min_count (20) durations of the operation.
        for _ in 0..10 {
            let durations: Vec<u64> = (0..20).map(|_| normal(&mut rng)).collect();
            let (bytes, _) = request(&durations, &mut serial, &mut rng);
            client.send_encoded(bytes).await.expect("warm-up sent");
        }
        for k in 0..anomalies {
            tokio::time::sleep(interval).await;
            let (bytes, ids) = request(&[MEDIAN_NS * 10], &mut serial, &mut rng);
            let sent = Instant::now();
            let sent_wall = wall_ns();
            client.send_encoded(bytes).await.expect("anomaly sent");
            let deadline = sent + Duration::from_secs(60);
            let arrival = loop {
                let found = sink
                    .arrivals
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|a| a.span_id == ids[0])
                    .cloned();
                if let Some(a) = found {
                    break a;
                }
                assert!(
                    Instant::now() < deadline,
                    "{label}: anomaly {k} never came back diagnosed"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            let ms = |ns: u64, from: u64| ns.saturating_sub(from) as f64 / 1e6;
            // The span ended at `sent_wall` (to a few µs).
            let ready = sent_wall + MARGIN_MS * 1_000_000 + settle_ns;
            let folder = arrival.snapshot.as_ref().map(|id| agent.snapshots.join(id));
            let kernel = folder
                .as_ref()
                .and_then(|f| mtime_ns(&deepspan_run::Run::new(f).manifest()));
            let analysed = folder
                .as_ref()
                .and_then(|f| newest_mtime_ns(&deepspan_run::Run::new(f).analysis_dir()));
            let sample = Sample {
                total: (arrival.at - sent).as_secs_f64() * 1e3,
                diagnosis: arrival.diagnosis.clone(),
                settle_wait: Some(ms(ready, sent_wall)),
                kernel_write: kernel.map(|k| ms(k, ready)),
                analysis: kernel.zip(analysed).map(|(k, a)| ms(a, k)),
                rest: analysed.map(|a| ms(arrival.at_wall_ns, a)),
            };
            println!(
                "{label}: anomaly {k}: {:.0} ms, {}{} (snapshot {})",
                sample.total,
                sample.diagnosis,
                arrival
                    .skip_reason
                    .as_ref()
                    .map_or(String::new(), |r| format!(": {r}")),
                arrival.snapshot.as_deref().unwrap_or("-")
            );
            samples.push(sample);
        }
    });
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();
    agent.stop();
    samples
}

fn main() {
    pin_to_cpu(GENERATOR_CPU).expect("pin to CPU 0");
    let anomalies = env_or("BENCH_ANOMALIES", 12);
    let interval = Duration::from_millis(env_or("BENCH_INTERVAL_MS", 3000));
    let cases = [
        ("--settle-ms 0", Some(0)),
        ("--settle-ms 1000 (default)", None),
    ];
    let results: Vec<_> = cases
        .iter()
        .map(|(label, settle)| (label, run_case(label, *settle, anomalies, interval)))
        .collect();
    println!();
    println!(
        "| case | anomalies | diagnosed | p50 ms (diagnosed) | max ms (diagnosed) | settle wait (p50) | kernel window write (p50) | analysis (p50) | rest: snapshot.json, forward (p50) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, samples) in results {
        let p50 = |f: &dyn Fn(&Sample) -> Option<f64>| {
            let mut v: Vec<f64> = samples
                .iter()
                .filter(|s| s.diagnosis == "diagnosed")
                .filter_map(f)
                .collect();
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.0}", median(&mut v))
            }
        };
        // Latencies of the diagnosed ones: a skipped span (its window left
        // the flight recorder) comes back at once, undiagnosed.
        let diagnosed: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.diagnosis == "diagnosed")
            .collect();
        let max = diagnosed.iter().map(|s| s.total).fold(0.0, f64::max);
        println!(
            "| {label} | {} | {} | {} | {max:.0} | {} | {} | {} | {} |",
            samples.len(),
            diagnosed.len(),
            p50(&|s| Some(s.total)),
            p50(&|s| s.settle_wait),
            p50(&|s| s.kernel_write),
            p50(&|s| s.analysis),
            p50(&|s| s.rest),
        );
    }
}
