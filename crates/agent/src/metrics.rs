//! The agent's counters, served as Prometheus text on `GET /metrics`
//! (OpenMetrics 1.0 text, which Prometheus reads; encoded by
//! `prometheus-client`), on loopback unless told otherwise, and as one line
//! at exit ([`AgentMetrics::summary_line`]).
//!
//! Every name starts with `deepspan_agent_`. The agent increments its own
//! counters ([`AgentMetrics`]'s fields); the forwarder's counters and the
//! resident memory are read when scraped, so they cannot drift from their
//! source:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `spans_received_total` | counter | |
//! | `anomalies_total` | counter | |
//! | `anomalies_within_tail_total` (over the median rule, within the tail) | counter | |
//! | `snapshots_total` | counter | |
//! | `snapshots_skipped_total` | counter | `reason` |
//! | `spans_dropped_total` | counter | `reason` (drops by the agent itself) |
//! | `forward_spans_sent_total` (spans out), `forward_requests_sent_total` | counter | |
//! | `forward_spans_dropped_total` | counter | `reason`: `oldest`, `oversize`, `failed`, `shutdown` |
//! | `forward_spans_rejected_total`, `forward_retries_total` | counter | |
//! | `forward_queue_bytes`, `forward_queue_bytes_peak` | gauge | |
//! | `resident_memory_bytes` | gauge | |

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::forward::{ForwardStats, ForwardStatsHandle};

/// The `reason` label of the counters that have one.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

/// The agent's counters and their registry; cheap to clone (every clone
/// counts into the same values).
#[derive(Clone)]
pub struct AgentMetrics {
    pub spans_received: Counter,
    pub anomalies: Counter,
    /// Spans over the median rule's threshold but within their operation's
    /// ordinary tail: not anomalous.
    pub within_tail: Counter,
    pub snapshots_taken: Counter,
    snapshots_skipped: Family<Reason, Counter>,
    spans_dropped: Family<Reason, Counter>,
    /// Reasons seen so far, for the summary line (a family cannot be listed).
    skip_reasons: Arc<Mutex<BTreeSet<String>>>,
    drop_reasons: Arc<Mutex<BTreeSet<String>>>,
    forwarder: Arc<Mutex<Option<ForwardStatsHandle>>>,
    registry: Arc<Mutex<Registry>>,
}

impl Default for AgentMetrics {
    fn default() -> AgentMetrics {
        AgentMetrics::new()
    }
}

impl AgentMetrics {
    pub fn new() -> AgentMetrics {
        let mut registry = Registry::with_prefix("deepspan_agent");
        let mut metrics = AgentMetrics {
            spans_received: Counter::default(),
            anomalies: Counter::default(),
            within_tail: Counter::default(),
            snapshots_taken: Counter::default(),
            snapshots_skipped: Family::default(),
            spans_dropped: Family::default(),
            skip_reasons: Arc::default(),
            drop_reasons: Arc::default(),
            forwarder: Arc::default(),
            registry: Arc::default(),
        };
        for (name, help, counter) in [
            (
                "spans_received",
                "Spans received from applications",
                &metrics.spans_received,
            ),
            ("anomalies", "Spans judged anomalous", &metrics.anomalies),
            (
                "anomalies_within_tail",
                "Spans over the median rule's threshold left alone as within their operation's ordinary tail",
                &metrics.within_tail,
            ),
            (
                "snapshots",
                "Kernel snapshots taken",
                &metrics.snapshots_taken,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        for (name, help, family) in [
            ("snapshots_skipped", "Snapshot triggers skipped, by reason", &metrics.snapshots_skipped),
            (
                "spans_dropped",
                "Spans the agent dropped itself, by reason (the forwarder's drops are forward_spans_dropped)",
                &metrics.spans_dropped,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register_collector(Box::new(ScrapeTime {
            forwarder: metrics.forwarder.clone(),
        }));
        metrics.registry = Arc::new(Mutex::new(registry));
        metrics
    }

    /// Counts a snapshot trigger skipped for `reason` (e.g. `rate_limit`,
    /// `left_ring_buffer`).
    pub fn skip_snapshot(&self, reason: &str) {
        self.snapshots_skipped
            .get_or_create(&reason_label(reason))
            .inc();
        self.skip_reasons
            .lock()
            .expect("poisoned")
            .insert(reason.to_string());
    }

    /// Counts `spans` dropped by the agent for `reason`.
    pub fn drop_spans(&self, reason: &str, spans: u64) {
        self.spans_dropped
            .get_or_create(&reason_label(reason))
            .inc_by(spans);
        self.drop_reasons
            .lock()
            .expect("poisoned")
            .insert(reason.to_string());
    }

    /// Reads the forwarder's counters at each scrape (and for the summary).
    pub fn watch_forwarder(&self, stats: ForwardStatsHandle) {
        *self.forwarder.lock().expect("poisoned") = Some(stats);
    }

    /// Registers more metrics (under the `deepspan_agent_` prefix).
    pub fn with_registry<T>(&self, register: impl FnOnce(&mut Registry) -> T) -> T {
        register(&mut self.registry.lock().expect("poisoned"))
    }

    /// The exposition, OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().expect("poisoned");
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// One line for the agent's exit: spans in and out, anomalies,
    /// snapshots, drops by reason, queue bytes, resident memory.
    pub fn summary_line(&self) -> String {
        let forward = self.forward_stats().unwrap_or_default();
        let mut line = format!(
            "spans in {}, out {}; anomalies {} ({} more within their tail); snapshots {}",
            self.spans_received.get(),
            forward.spans_sent,
            self.anomalies.get(),
            self.within_tail.get(),
            self.snapshots_taken.get()
        );
        let skipped = counts(&self.snapshots_skipped, &self.skip_reasons);
        if !skipped.is_empty() {
            let _ = write!(line, " (skipped: {})", join(&skipped));
        }
        let mut dropped = counts(&self.spans_dropped, &self.drop_reasons);
        dropped.extend(
            forward_drops(&forward)
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(r, n)| (format!("forward {r}"), n)),
        );
        let total: u64 = dropped.iter().map(|(_, n)| n).sum();
        let _ = write!(line, "; spans dropped {total}");
        if !dropped.is_empty() {
            let _ = write!(line, " ({})", join(&dropped));
        }
        let _ = write!(
            line,
            "; queue {} B (peak {} B); RSS {}",
            forward.queue_bytes,
            forward.queue_bytes_peak,
            resident_bytes().map_or("?".to_string(), |b| format!(
                "{:.1} MiB",
                b as f64 / 1048576.0
            ))
        );
        line
    }

    fn forward_stats(&self) -> Option<ForwardStats> {
        self.forwarder
            .lock()
            .expect("poisoned")
            .as_ref()
            .map(|h| h.get())
    }

    /// Serves `GET /metrics` on `addr` from a thread of its own. Only
    /// loopback addresses unless `allow_remote` (the counters say what runs
    /// on the host).
    pub fn serve(&self, addr: SocketAddr, allow_remote: bool) -> Result<MetricsServer, Error> {
        if !addr.ip().is_loopback() && !allow_remote {
            return Err(Error::NotLoopback(addr));
        }
        let listener = std::net::TcpListener::bind(addr).map_err(|e| Error::Bind(addr, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Bind(addr, e))?;
        let local = listener.local_addr().map_err(|e| Error::Bind(addr, e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Start)?;
        let metrics = self.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                }
            }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listener = {
            let _inside = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(|e| Error::Bind(addr, e))?
        };
        let thread = std::thread::Builder::new()
            .name("deepspan-metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                })
            })
            .map_err(Error::Start)?;
        Ok(MetricsServer {
            addr: local,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

fn reason_label(reason: &str) -> Reason {
    Reason {
        reason: reason.to_string(),
    }
}

fn counts(
    family: &Family<Reason, Counter>,
    reasons: &Mutex<BTreeSet<String>>,
) -> Vec<(String, u64)> {
    reasons
        .lock()
        .expect("poisoned")
        .iter()
        .map(|r| (r.clone(), family.get_or_create(&reason_label(r)).get()))
        .collect()
}

fn join(counts: &[(String, u64)]) -> String {
    counts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn forward_drops(s: &ForwardStats) -> [(&'static str, u64); 4] {
    [
        ("oldest", s.spans_dropped_oldest),
        ("oversize", s.spans_dropped_oversize),
        ("failed", s.spans_dropped_failed),
        ("shutdown", s.spans_dropped_at_shutdown),
    ]
}

/// The resident set of this process, from `/proc/self/statm` (pages).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0)?)
}

/// The metrics read when scraped: the forwarder's and resident memory.
#[derive(Debug)]
struct ScrapeTime {
    forwarder: Arc<Mutex<Option<ForwardStatsHandle>>>,
}

impl Collector for ScrapeTime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut gauge = |name: &str, help: &str, value: i64| -> Result<(), std::fmt::Error> {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
        };
        if let Some(rss) = resident_bytes() {
            gauge(
                "resident_memory_bytes",
                "Resident memory of the agent",
                rss as i64,
            )?;
        }
        let forward = self
            .forwarder
            .lock()
            .expect("poisoned")
            .as_ref()
            .map(|h| h.get());
        let Some(s) = forward else {
            return Ok(());
        };
        gauge(
            "forward_queue_bytes",
            "Protobuf bytes waiting to be forwarded",
            s.queue_bytes as i64,
        )?;
        gauge(
            "forward_queue_bytes_peak",
            "The most protobuf bytes ever waiting to be forwarded",
            s.queue_bytes_peak as i64,
        )?;
        let mut counter = |name: &str, help: &str, value: u64| -> Result<(), std::fmt::Error> {
            ConstCounter::new(value).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Counter,
            )?)
        };
        counter(
            "forward_spans_sent",
            "Spans forwarded (spans out)",
            s.spans_sent,
        )?;
        counter(
            "forward_requests_sent",
            "OTLP requests forwarded",
            s.requests_sent,
        )?;
        counter(
            "forward_spans_rejected",
            "Spans the back-end accepted but rejected (OTLP partial success)",
            s.spans_rejected,
        )?;
        counter(
            "forward_retries",
            "Tries after a retryable failure",
            s.retries,
        )?;
        let mut family = encoder.encode_descriptor(
            "forward_spans_dropped",
            "Spans the forwarder dropped, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in forward_drops(&s) {
            let label = reason_label(reason);
            ConstCounter::new(n).encode(family.encode_family(&label)?)?;
        }
        Ok(())
    }
}

/// What can go wrong serving the metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} is not a loopback address: the metrics are served on loopback unless remote access is asked for")]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("cannot start the metrics server: {0}")]
    Start(std::io::Error),
}

/// The `/metrics` server; stops on [`MetricsServer::shutdown`] or drop.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Where it listens (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}
