//! Throughput of `deepspan agent` (receive → detect → forward) on loopback,
//! in spans/s with the agent on one CPU, and its peak RSS.
//!
//! This process pins itself to CPU 0: the load generator (`OtlpClient`s
//! over a few concurrent HTTP connections, a current-thread runtime) and
//! the sink (deepspan's OTLP receiver with a counting `RequestSink`). The
//! release `deepspan agent` runs pinned to CPU 1 and forwards to the sink.
//! Each round sends the same kind of pre-encoded export requests (a few
//! services and operations, OTel-like attributes, distinct ids, durations
//! in [0.7, 1.3] × the operation's median) through:
//! - `direct`: straight into the sink, the generator+sink capacity (the
//!   baseline the agent is compared with, measured in the same round);
//! - `agent`: through the agent, forwarding gzip (its default);
//! - `agent --no-gzip`: forwarding uncompressed;
//! - `agent, 0.1 % anomalies`: one request span in 1000 is 10 × its
//!   median: those are held, snapshotted (or skipped past the rate limit),
//!   and forwarded later; the time runs until the sink has every other span.
//!   Its flight recorder keeps 8 MiB per CPU (in its RSS), not 1 MiB as in
//!   the other cases, so the anomalies' windows are still there, and its
//!   snapshots hold at most 32 MiB of spans (see `ANOMALY_FLAGS`).
//!
//! The time runs from the first send until the sink has counted the
//! spans. Rounds alternate the cases; the table gives each case's median
//! over the rounds, its ratio to `direct` (median of the per-round ratios),
//! the agent's CPU seconds per million spans and its peak RSS (VmHWM, the
//! most over the rounds). Needs root and tracefs (the flight recorder).
//! `cargo build --release -p deepspan && cargo bench -p deepspan-agent
//! --bench agent_throughput`; `BENCH_ROUNDS`, `BENCH_REQUESTS` to change
//! the size.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    available_cpus, median, pin_to_cpu, wall_ns, AgentProcess, Sink, SplitMix, Traffic, AGENT_CPU,
    GENERATOR_CPU, SPANS_PER_TRACE,
};

const TRACES_PER_REQUEST: usize = 34; // 102 spans per export request
const CONNECTIONS: usize = 4;
/// Timestamps as if 150 000 spans/s came (3 spans a trace): about the pace
/// they are sent at, so a snapshot's window holds a fair share of them.
const TRACE_SPACING_NS: u64 = 20_000;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Direct,
    Agent,
    AgentNoGzip,
    AgentAnomalies,
}

impl Case {
    const ALL: [Case; 4] = [
        Case::Direct,
        Case::Agent,
        Case::AgentNoGzip,
        Case::AgentAnomalies,
    ];

    fn label(self) -> &'static str {
        match self {
            Case::Direct => "direct to the sink (baseline)",
            Case::Agent => "agent (forward gzip)",
            Case::AgentNoGzip => "agent --no-gzip",
            Case::AgentAnomalies => "agent, 0.1 % anomalies (8 MiB buffers, --recent-mb 32)",
        }
    }
}

struct Measure {
    spans_per_s: f64,
    agent_cpu_s_per_mspans: Option<f64>,
    peak_rss: Option<u64>,
    retried: u64,
    notes: String,
}

fn requests(count: usize, anomaly_every: u64, seed: u64) -> (Vec<Bytes>, u64, u64) {
    let traffic = Traffic {
        traces_per_request: TRACES_PER_REQUEST,
        trace_spacing_ns: TRACE_SPACING_NS,
        anomaly_every,
    };
    let mut rng = SplitMix(seed);
    let start = wall_ns();
    let mut anomalous = 0;
    let encoded = (0..count as u64)
        .map(|n| {
            let end = start + n * TRACES_PER_REQUEST as u64 * TRACE_SPACING_NS;
            let (bytes, ids) = common::export_request(n, traffic, end, &mut rng);
            anomalous += ids.len() as u64;
            bytes
        })
        .collect();
    let spans = (count * TRACES_PER_REQUEST * SPANS_PER_TRACE) as u64;
    (encoded, spans, anomalous)
}

fn run(case: Case, count: usize, seed: u64) -> Measure {
    let anomaly_every = if case == Case::AgentAnomalies {
        1000
    } else {
        0
    };
    let sink = Sink::start(false);
    let agent = match case {
        Case::Direct => None,
        Case::Agent => Some(AgentProcess::start(&sink.url(), FLAGS)),
        Case::AgentAnomalies => {
            let agent = AgentProcess::start(&sink.url(), ANOMALY_FLAGS);
            // Spans that start after the recorder did: their windows are in it.
            std::thread::sleep(Duration::from_millis(500));
            Some(agent)
        }
        Case::AgentNoGzip => Some(AgentProcess::start(
            &sink.url(),
            &[FLAGS, &["--no-gzip"]].concat(),
        )),
    };
    // Encoded once the agent runs: the spans end now, inside its flight
    // recorder's window, so anomalies get real snapshots.
    let (encoded, spans, anomalous) = requests(count, anomaly_every, seed);
    let target = agent.as_ref().map_or_else(|| sink.url(), |a| a.url());
    let cpu_before = agent.as_ref().map(|a| a.cpu_seconds());
    let started = Instant::now();
    let retried = common::send_all(&target, &encoded, CONNECTIONS, false);
    // Held anomalous spans come later (after their snapshot or skip).
    let expected = spans - anomalous;
    assert!(
        sink.wait_for(expected, Duration::from_secs(120)),
        "{}: the sink got {} of {expected} spans",
        case.label(),
        sink.received()
    );
    let elapsed = started.elapsed().as_secs_f64();
    let mut notes = String::new();
    let (mut cpu, mut rss) = (None, None);
    if let Some(agent) = agent {
        cpu = Some((agent.cpu_seconds() - cpu_before.unwrap()) / (spans as f64 / 1e6));
        if anomalous > 0 {
            let waited = Instant::now();
            let all = sink.wait_for(spans, Duration::from_secs(60));
            // Then until every anomaly's snapshot is over (diagnosed in time
            // or late, or skipped).
            let deadline = Instant::now() + Duration::from_secs(180);
            let text = loop {
                let text = agent.metrics_text();
                let m = |name| common::metric_sum(&text, name);
                let settled = m("deepspan_agent_diagnosed_in_time_total")
                    + m("deepspan_agent_diagnosed_late_total")
                    + m("deepspan_agent_sent_skipped_total");
                if settled >= m("deepspan_agent_anomalies_total") || Instant::now() > deadline {
                    break text;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            let m = |name| common::metric_sum(&text, name);
            let skipped: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("deepspan_agent_snapshots_skipped_total{"))
                .filter(|l| !l.ends_with(" 0"))
                .map(|l| l.trim_start_matches("deepspan_agent_snapshots_skipped_total"))
                .collect();
            notes = format!(
                "{anomalous} sent anomalous, {} judged so: {} snapshots, skipped {}; {} diagnosed in time, {} late, {} sent pending, {} sent skipped; {} spans in the sink, all diagnoses {:.1} s after",
                m("deepspan_agent_anomalies_total"),
                m("deepspan_agent_snapshots_total"),
                if skipped.is_empty() { "none".to_string() } else { skipped.join(" ") },
                m("deepspan_agent_diagnosed_in_time_total"),
                m("deepspan_agent_diagnosed_late_total"),
                m("deepspan_agent_released_pending_total"),
                m("deepspan_agent_sent_skipped_total"),
                if all { "all" } else { "NOT all" },
                waited.elapsed().as_secs_f64()
            );
        }
        // Requests waiting for the forwarder: when they pile up, the
        // forwarder (one request in flight) is what the sink waits for.
        notes.push_str(&format!(
            "{}forward queue peak {:.1} MiB",
            if notes.is_empty() { "" } else { "; " },
            agent.metric("deepspan_agent_forward_queue_bytes_peak") / 1048576.0
        ));
        rss = Some(agent.peak_rss());
        agent.stop();
    }
    Measure {
        spans_per_s: spans as f64 / elapsed,
        agent_cpu_s_per_mspans: cpu,
        peak_rss: rss,
        retried,
        notes,
    }
}

/// Small kernel buffers: the bench measures the span path, not tracing.
const FLAGS: &[&str] = &["--buffer-kb", "1024", "--history-kb", "1024"];
/// Enough for the windows of anomalies to be still there when they have
/// settled (1.1 s later) under this load: they get real snapshots. At this
/// pace a snapshot's window holds hundreds of thousands of spans, and the
/// analysis of a snapshot takes memory and time in proportion (3 GB and
/// 5 minutes for 500 000 spans): the spans kept for snapshots are bounded
/// to 32 MiB here (`--recent-mb`, default 64), about 1.5 s of this load,
/// enough for a window that has settled (with 8 MiB, the requests of the
/// windows had gone: no anomaly could be diagnosed).
const ANOMALY_FLAGS: &[&str] = &[
    "--buffer-kb",
    "8192",
    "--history-kb",
    "8192",
    "--recent-mb",
    "32",
];

fn main() {
    if available_cpus() < 2 {
        eprintln!("one CPU only: the agent shares it with the generator");
    }
    pin_to_cpu(GENERATOR_CPU).expect("pin the generator to CPU 0");
    let rounds = env_or("BENCH_ROUNDS", 3);
    let count = env_or("BENCH_REQUESTS", 5000);
    let bytes: usize = requests(100, 0, 0).0.iter().map(|r| r.len()).sum::<usize>() / 100;
    let spans = count * TRACES_PER_REQUEST * SPANS_PER_TRACE;
    println!(
        "{rounds} rounds of {spans} spans ({count} requests of {} spans, {bytes} bytes each, {CONNECTIONS} connections); generator + sink on CPU {GENERATOR_CPU}, agent on CPU {AGENT_CPU}",
        TRACES_PER_REQUEST * SPANS_PER_TRACE
    );
    let mut results: Vec<Vec<Measure>> = Case::ALL.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, case) in Case::ALL.iter().enumerate() {
            let m = run(*case, count, (round * 10 + i) as u64 + 1);
            println!(
                "round {round} {:<32} {:>9.0} spans/s{}{}",
                case.label(),
                m.spans_per_s,
                m.peak_rss.map_or(String::new(), |r| format!(
                    ", peak RSS {:.1} MiB",
                    r as f64 / 1048576.0
                )),
                if m.notes.is_empty() {
                    String::new()
                } else {
                    format!("; {}", m.notes)
                }
            );
            results[i].push(m);
        }
    }
    println!();
    println!(
        "| case | spans/s (median) | ratio to direct | agent CPU s per 10^6 spans | agent peak RSS | sends retried |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, case) in Case::ALL.iter().enumerate() {
        let mut rate: Vec<f64> = results[i].iter().map(|m| m.spans_per_s).collect();
        let mut ratio: Vec<f64> = (0..rounds)
            .map(|r| results[i][r].spans_per_s / results[0][r].spans_per_s)
            .collect();
        let mut cpu: Vec<f64> = results[i]
            .iter()
            .filter_map(|m| m.agent_cpu_s_per_mspans)
            .collect();
        let rss = results[i].iter().filter_map(|m| m.peak_rss).max();
        let retried: u64 = results[i].iter().map(|m| m.retried).sum();
        println!(
            "| {} | {:.0} | {:.2} | {} | {} | {retried} |",
            case.label(),
            median(&mut rate),
            median(&mut ratio),
            if cpu.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", median(&mut cpu))
            },
            rss.map_or("-".to_string(), |r| format!(
                "{:.1} MiB",
                r as f64 / 1048576.0
            )),
        );
    }
    println!(
        "\nspans/s on one core (agent CPU-bound) = 10^6 / (agent CPU s per 10^6 spans); the goal is >= 100 000"
    );
}
