//! The live agent: OTLP in, judged, snapshotted, diagnosed, OTLP out.
//!
//! Threads and what moves between them:
//! - the OTLP receiver's network threads decode and screen requests; its
//!   one consumer thread runs [`AgentSink`]: keeps the request for
//!   snapshots, judges its request spans, forwards it, untouched when no
//!   span in it is anomalous. An anomalous span is taken out, held, and
//!   sent to the snapshot worker;
//! - the snapshot worker (`snapshot.rs`) owns the flight recorder and
//!   delivers an [`Outcome`] per trigger;
//! - the release thread sends held spans on when their hold expires,
//!   marked `deepspan.diagnosis=pending`; their diagnosis follows later
//!   as a span of its own (see [`late_diagnosis`]);
//! - the forwarder's thread sends everything on.
//!
//! Nothing here blocks the receiver's consumer for long: forwarding and
//! handing over a trigger never wait, so the applications only ever feel
//! the receiver's own backpressure.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::{span::Link, span::SpanKind, Span};
use prometheus_client::metrics::counter::Counter;
use prost::Message as _;

use deepspan_otlp::{
    Receiver, ReceiverConfig, ReceiverHandle, ReceiverStats, RequestDigest, RequestSink,
};
use deepspan_record::{FlightOptions, FlightRecorder};
use deepspan_spans::ExportTraceServiceRequest;

use crate::detect::{Detector, DetectorConfig};
use crate::forward::{EncodedRequest, ForwardConfig, ForwardStats, Forwarder};
use crate::metrics::{AgentMetrics, MetricsServer};
use crate::snapshot::{Message, Outcome, SkipReason, SnapshotConfig, Trigger, Worker, WorkerStats};
use crate::spans::{
    detach, encode, int, set_attribute, span_count, string, DetachedSpan, RecentRequests,
};

/// Attribute names the agent adds (docs/otel-attributes.md, "Live agent").
pub mod attr {
    pub const ANOMALY: &str = "deepspan.anomaly";
    pub const BASELINE_NS: &str = "deepspan.baseline_ns";
    pub const SNAPSHOT: &str = "deepspan.snapshot";
    /// The snapshot's page in `deepspan ui SNAPSHOTS` (with `--snapshot-url`).
    pub const SNAPSHOT_URL: &str = "deepspan.snapshot_url";
    /// `diagnosed`, `pending` (sent before its diagnosis: it follows as a
    /// `deepspan.diagnosis` span) or `skipped` (see `deepspan.skip_reason`).
    pub const DIAGNOSIS: &str = "deepspan.diagnosis";
    pub const SKIP_REASON: &str = "deepspan.skip_reason";
    /// The evidence numbers as one JSON object.
    pub const EVIDENCE: &str = "deepspan.evidence";
    /// The name of the span that carries a diagnosis that came too late.
    pub const LATE_DIAGNOSIS_SPAN: &str = "deepspan.diagnosis";
}

/// Everything `deepspan agent` is given.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub forward_url: String,
    pub forward: ForwardConfig,
    pub receiver: ReceiverConfig,
    pub detector: DetectorConfig,
    pub flight: FlightOptions,
    pub snapshots: SnapshotConfig,
    /// How long an anomalous span waits for its diagnosis before it is sent
    /// without it.
    pub hold: Duration,
    /// Most spans held at once; beyond, a new anomalous span is sent at once
    /// (its diagnosis follows as a span).
    pub max_held: usize,
    /// Bytes of recently received requests kept for the span files of snapshots.
    pub recent_bytes: usize,
}

impl AgentConfig {
    /// What the agent holds in memory by configuration: the receiver's and
    /// the forwarder's queues, the recent requests and the flight
    /// recorder's page history (not the kernel's ring buffer, which is not
    /// the agent's memory), and a snapshot's analysis at its span limit.
    /// RSS stays under this plus the program itself.
    pub fn memory_bound_bytes(&self, cpus: usize) -> u64 {
        (self.receiver.max_queue_bytes + deepspan_otlp::MAX_REQUEST_BYTES) as u64
            + self.forward.max_queue_bytes as u64
            + self.recent_bytes as u64
            + self.flight.history_kb_per_cpu * 1024 * cpus as u64
            + self.snapshots.max_spans * ANALYSIS_BYTES_PER_SPAN
    }
}

/// What analysing a snapshot takes per span of its span file, measured
/// (500 000 spans: 3 GB).
const ANALYSIS_BYTES_PER_SPAN: u64 = 6 << 10;

/// A span held for its diagnosis.
struct Held {
    span: DetachedSpan,
    baseline_ns: Option<u64>,
    deadline: Instant,
}

type SpanKey = (Vec<u8>, Vec<u8>);

/// What became of anomalous spans, beyond the counters of `metrics`.
#[derive(Clone, Default)]
struct Counters {
    request_spans_judged: Counter,
    diagnosed_in_time: Counter,
    diagnosed_late: Counter,
    released_pending: Counter,
    sent_skipped: Counter,
    undecodable: Counter,
    settled: Counter,
}

impl Counters {
    fn register(metrics: &AgentMetrics) -> Counters {
        let c = Counters::default();
        metrics.with_registry(|r| {
            r.register(
                "request_spans_judged",
                "Request spans judged by the detector",
                c.request_spans_judged.clone(),
            );
            r.register(
                "diagnosed_in_time",
                "Anomalous spans sent with their diagnosis",
                c.diagnosed_in_time.clone(),
            );
            r.register(
                "diagnosed_late",
                "Diagnoses sent as a deepspan.diagnosis span after their span had gone",
                c.diagnosed_late.clone(),
            );
            r.register(
                "released_pending",
                "Anomalous spans sent when their hold expired, before their diagnosis",
                c.released_pending.clone(),
            );
            r.register(
                "sent_skipped",
                "Anomalous spans sent without a diagnosis (see snapshots_skipped)",
                c.sent_skipped.clone(),
            );
            r.register(
                "anomalies_settled",
                "Anomalous spans whose snapshot has an outcome (diagnosed, in time or late, or skipped)",
                c.settled.clone(),
            );
            r.register(
                "undecodable",
                "Screened requests the agent could not decode",
                c.undecodable.clone(),
            );
        });
        c
    }
}

/// What the threads share.
struct Shared {
    forwarder: Forwarder,
    held: Mutex<HashMap<SpanKey, Held>>,
    recent: Arc<Mutex<RecentRequests>>,
    metrics: AgentMetrics,
    counters: Counters,
    worker: Arc<Mutex<WorkerStats>>,
    hold: Duration,
    max_held: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn key(span: &DetachedSpan) -> SpanKey {
    (span.trace_id().to_vec(), span.span_id().to_vec())
}

impl Shared {
    fn forward(&self, request: ExportTraceServiceRequest) {
        let spans = span_count(&request);
        if spans > 0 {
            self.forwarder.send(EncodedRequest {
                bytes: encode(&request),
                spans,
            });
        }
    }

    /// A trigger's outcome: its held span goes on with it, or, when the
    /// span already went (hold expired), a diagnosis span follows it.
    fn deliver(&self, trigger: Trigger, outcome: Outcome) {
        let held = lock(&self.held).remove(&key(&trigger.span));
        self.counters.settled.inc();
        let kernel_spans = match &outcome {
            Outcome::Diagnosed { kernel_spans, .. } => kernel_spans.clone(),
            Outcome::Skipped { .. } => None,
        };
        match held {
            Some(held) => {
                let mut span = held.span;
                annotate(&mut span.span, held.baseline_ns, &outcome);
                match outcome {
                    Outcome::Diagnosed { .. } => self.counters.diagnosed_in_time.inc(),
                    Outcome::Skipped { .. } => self.counters.sent_skipped.inc(),
                };
                self.forward(span.into_request());
            }
            None => {
                if let Some(late) = late_diagnosis(&trigger, &outcome) {
                    self.counters.diagnosed_late.inc();
                    self.forward(late);
                }
            }
        }
        if let Some(kernel) = kernel_spans {
            self.forward(kernel);
        }
    }

    /// Sends the held spans whose hold has expired (all with `everything`).
    fn release_expired(&self, everything: bool) {
        let now = Instant::now();
        let expired: Vec<Held> = {
            let mut held = lock(&self.held);
            let keys: Vec<SpanKey> = held
                .iter()
                .filter(|(_, h)| everything || h.deadline <= now)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter().filter_map(|k| held.remove(&k)).collect()
        };
        for h in expired {
            self.release(h);
        }
    }

    fn release(&self, held: Held) {
        let mut span = held.span;
        mark_anomaly(&mut span.span, held.baseline_ns);
        set_attribute(&mut span.span, attr::DIAGNOSIS, string("pending"));
        self.counters.released_pending.inc();
        self.forward(span.into_request());
    }
}

fn mark_anomaly(span: &mut Span, baseline_ns: Option<u64>) {
    set_attribute(
        span,
        attr::ANOMALY,
        opentelemetry_proto::tonic::common::v1::any_value::Value::BoolValue(true),
    );
    if let Some(b) = baseline_ns {
        set_attribute(span, attr::BASELINE_NS, int(b));
    }
}

/// The attributes of an outcome on the anomalous span (or on its late
/// diagnosis span).
fn annotate(span: &mut Span, baseline_ns: Option<u64>, outcome: &Outcome) {
    match outcome {
        Outcome::Diagnosed {
            snapshot,
            attributes,
            ..
        } => {
            for kv in attributes {
                if let Some(v) = kv.value.as_ref().and_then(|v| v.value.clone()) {
                    set_attribute(span, &kv.key, v);
                }
            }
            set_attribute(span, attr::EVIDENCE, string(evidence_json(attributes)));
            set_attribute(span, attr::SNAPSHOT, string(snapshot.clone()));
            set_attribute(span, attr::DIAGNOSIS, string("diagnosed"));
        }
        Outcome::Skipped {
            reason, snapshot, ..
        } => {
            set_attribute(span, attr::DIAGNOSIS, string("skipped"));
            set_attribute(span, attr::SKIP_REASON, string(reason.as_str()));
            if let Some(s) = snapshot {
                set_attribute(span, attr::SNAPSHOT, string(s.clone()));
            }
        }
    }
    // The agent's baseline (its sliding median) is what the span was judged
    // against; the snapshot's own requests are too few for one.
    mark_anomaly(span, baseline_ns);
}

/// `deepspan.evidence.*`, `deepspan.share` and `deepspan.cause_ns` as one
/// JSON object, as the agent's attribute contract has it.
fn evidence_json(attributes: &[KeyValue]) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let a = deepspan_export::attributes::EVIDENCE_PREFIX;
    let mut map = serde_json::Map::new();
    for kv in attributes {
        let name = match kv.key.as_str() {
            k if k == deepspan_export::attributes::SHARE => "share",
            k if k == deepspan_export::attributes::CAUSE_NS => "ns",
            k => match k.strip_prefix(a) {
                Some(name) => name,
                None => continue,
            },
        };
        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::IntValue(i)) => serde_json::Value::from(*i),
            Some(Value::DoubleValue(d)) => serde_json::Value::from(*d),
            Some(Value::StringValue(s)) => serde_json::Value::from(s.clone()),
            Some(Value::BoolValue(b)) => serde_json::Value::from(*b),
            _ => continue,
        };
        map.insert(name.to_string(), value);
    }
    serde_json::Value::Object(map).to_string()
}

/// A diagnosis that came after its span was sent: a span of its own, child
/// of the anomalous span (so the trace view shows it right under it), over
/// the same time, with a link to it, carrying the same attributes. None for
/// a skipped trigger (the span went out marked pending; nothing to add).
fn late_diagnosis(trigger: &Trigger, outcome: &Outcome) -> Option<ExportTraceServiceRequest> {
    let Outcome::Diagnosed { .. } = outcome else {
        return None;
    };
    let original = &trigger.span.span;
    let mut span = Span {
        trace_id: original.trace_id.clone(),
        span_id: late_span_id(&original.span_id),
        parent_span_id: original.span_id.clone(),
        name: attr::LATE_DIAGNOSIS_SPAN.to_string(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: original.start_time_unix_nano,
        end_time_unix_nano: original.end_time_unix_nano,
        links: vec![Link {
            trace_id: original.trace_id.clone(),
            span_id: original.span_id.clone(),
            ..Link::default()
        }],
        ..Span::default()
    };
    annotate(&mut span, trigger.baseline_ns, outcome);
    let detached = DetachedSpan {
        resource: trigger.span.resource.clone(),
        scope: trigger.span.scope.clone(),
        span,
    };
    Some(detached.into_request())
}

/// A span id derived from the anomalous span's, never equal to it.
fn late_span_id(span_id: &[u8]) -> Vec<u8> {
    let mut id: Vec<u8> = span_id.iter().map(|b| b ^ 0x5a).collect();
    if id.iter().all(|&b| b == 0) {
        id[0] = 1;
    }
    id
}

/// The receiver's consumer: judges, holds, forwards.
struct AgentSink {
    shared: Arc<Shared>,
    detector: Detector,
    triggers: SyncSender<Message>,
}

impl RequestSink for AgentSink {
    fn accept(&mut self, encoded: Bytes, spans: u64, digest: RequestDigest) -> Result<(), String> {
        let c = &self.shared.counters;
        self.shared.metrics.spans_received.inc_by(spans);
        lock(&self.shared.recent).push(encoded.clone(), spans, digest.time_range);
        let judged = digest.request_spans;
        c.request_spans_judged.inc_by(judged.len() as u64);
        let mut anomalous = Vec::new();
        for r in judged {
            let verdict = self
                .detector
                .observe(&r.service, &r.operation, r.duration_ns);
            if verdict.anomalous {
                anomalous.push((r, verdict.baseline_ns));
            } else if verdict.within_tail {
                self.shared.metrics.within_tail.inc();
            }
        }
        if anomalous.is_empty() {
            self.shared.forwarder.send(EncodedRequest {
                bytes: encoded,
                spans,
            });
            return Ok(());
        }
        // Decoded only to take its anomalous spans out: the digest served
        // the rest.
        let mut request = match ExportTraceServiceRequest::decode(&encoded[..]) {
            Ok(r) => r,
            Err(e) => {
                // The receiver decoded it already; only a bug gets here. Send it on as it is.
                c.undecodable.inc();
                self.shared.forwarder.send(EncodedRequest {
                    bytes: encoded,
                    spans,
                });
                return Err(format!("cannot decode a screened request: {e}"));
            }
        };
        let places: Vec<_> = anomalous.iter().map(|(r, _)| r.place).collect();
        let detached = detach(&mut request, &places);
        self.shared.forward(request);
        let offset = mono_minus_realtime_now();
        for (span, (r, baseline_ns)) in detached.into_iter().zip(anomalous) {
            self.shared.metrics.anomalies.inc();
            let trigger = Trigger::new(
                span.clone(),
                r.service,
                r.operation,
                r.duration_ns,
                baseline_ns,
                offset,
            );
            {
                let mut held = lock(&self.shared.held);
                if held.len() < self.shared.max_held {
                    let deadline = Instant::now() + self.shared.hold;
                    let replaced = held.insert(
                        key(&span),
                        Held {
                            span,
                            baseline_ns,
                            deadline,
                        },
                    );
                    drop(held);
                    // The same span sent twice (an exporter's retry): the
                    // first copy goes on now, never lost.
                    if let Some(first) = replaced {
                        self.shared.release(first);
                    }
                } else {
                    drop(held);
                    self.shared.release(Held {
                        span,
                        baseline_ns,
                        deadline: Instant::now(),
                    });
                }
            }
            match self.triggers.try_send(Message::Trigger(Box::new(trigger))) {
                Ok(()) => {}
                Err(TrySendError::Full(Message::Trigger(t)))
                | Err(TrySendError::Disconnected(Message::Trigger(t))) => {
                    *lock(&self.shared.worker)
                        .skipped
                        .entry(SkipReason::RateLimited)
                        .or_default() += 1;
                    self.shared
                        .metrics
                        .skip_snapshot(SkipReason::RateLimited.as_str());
                    self.shared.deliver(
                        *t,
                        Outcome::Skipped {
                            reason: SkipReason::RateLimited,
                            snapshot: None,
                            error: None,
                        },
                    );
                }
                Err(_) => {}
            }
        }
        Ok(())
    }
}

/// mono − realtime now, ns.
fn mono_minus_realtime_now() -> i128 {
    let mono = crate::snapshot::mono_now();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    mono as i128 - wall as i128
}

/// What the agent did, for `/metrics` and the line printed at exit.
#[derive(Clone, Debug, Default)]
pub struct AgentStats {
    pub receiver: ReceiverStats,
    pub forward: ForwardStats,
    pub worker: WorkerStats,
    pub spans_in: u64,
    pub anomalies: u64,
    pub diagnosed_in_time: u64,
    pub diagnosed_late: u64,
    pub released_pending: u64,
    pub sent_skipped: u64,
    pub held: usize,
    pub rss_bytes: u64,
    /// The counters as one line (`metrics::AgentMetrics::summary_line`).
    pub summary: String,
}

/// A running agent.
pub struct Agent {
    shared: Arc<Shared>,
    receiver: Option<ReceiverHandle>,
    worker: Option<SnapshotThread>,
    release: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    instance: String,
    /// What the flight recorder records without (a capture this kernel
    /// does not allow), as it said when it started.
    flight_warnings: Vec<String>,
    snapshots_dir: PathBuf,
}

/// The snapshot worker's thread, which owns the flight recorder: stopped
/// and joined when dropped, so the tracefs instance is removed even when
/// the agent is dropped without [`Agent::shutdown`] (a panic unwinding
/// the thread that holds it). A detached worker would die with the
/// process and leave the instance behind.
struct SnapshotThread {
    triggers: SyncSender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl SnapshotThread {
    fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.triggers.send(Message::Stop);
            let _ = thread.join();
        }
    }
}

impl Drop for SnapshotThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Triggers waiting for the worker at most.
const MAX_QUEUED_TRIGGERS: usize = 4096;

impl Agent {
    /// Starts forwarding, receiving and the flight recorder. Errors name
    /// what could not start (a port in use, no tracefs, a bad URL …).
    pub fn start(config: AgentConfig) -> Result<Agent, crate::Error> {
        std::fs::create_dir_all(&config.snapshots.dir)
            .map_err(|e| crate::Error::Snapshots(config.snapshots.dir.clone(), e))?;
        let detector = Detector::new(config.detector.clone())
            .map_err(|e| crate::Error::Config(e.to_string()))?;
        let forwarder = Forwarder::start(&config.forward_url, config.forward.clone())?;
        let worker_stats = Arc::new(Mutex::new(WorkerStats::default()));
        let metrics = AgentMetrics::new();
        metrics.watch_forwarder(forwarder.stats_handle());
        let counters = Counters::register(&metrics);
        let shared = Arc::new(Shared {
            forwarder,
            held: Mutex::new(HashMap::new()),
            recent: Arc::new(Mutex::new(RecentRequests::new(config.recent_bytes))),
            metrics,
            counters,
            worker: worker_stats.clone(),
            hold: config.hold,
            max_held: config.max_held,
        });
        let (trigger_tx, trigger_rx) = sync_channel(MAX_QUEUED_TRIGGERS);

        let stop_release = Arc::new(AtomicBool::new(false));
        let release = {
            let shared = shared.clone();
            let stop = stop_release.clone();
            std::thread::Builder::new()
                .name("deepspan-hold".into())
                .spawn(move || {
                    while !stop.load(Relaxed) {
                        shared.release_expired(false);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
                .map_err(crate::Error::Threads)?
        };

        let flight = match FlightRecorder::start(config.flight.clone()) {
            Ok(flight) => flight,
            Err(e) => {
                // The forwarder stops with the last reference to it.
                stop_release.store(true, Relaxed);
                let _ = release.join();
                return Err(e.into());
            }
        };
        let instance = flight.instance_name();
        let flight_warnings = flight.warnings().to_vec();
        let worker = {
            let deliver_to = shared.clone();
            let worker = Worker {
                config: config.snapshots.clone(),
                flight,
                recent: shared.recent.clone(),
                stats: worker_stats,
                metrics: shared.metrics.clone(),
                deliver: Arc::new(move |t, o| deliver_to.deliver(t, o)),
            };
            let thread = std::thread::Builder::new()
                .name("deepspan-snapshot".into())
                .spawn(move || worker.run(trigger_rx))
                .map_err(crate::Error::Threads)?;
            SnapshotThread {
                triggers: trigger_tx.clone(),
                thread: Some(thread),
            }
        };
        let sink = AgentSink {
            shared: shared.clone(),
            detector,
            triggers: trigger_tx,
        };
        let receiver = match Receiver::start_with_sink(config.receiver.clone(), Box::new(sink)) {
            Ok(receiver) => receiver,
            Err(e) => {
                // A port in use: stop what started (the worker removes the instance).
                drop(worker);
                stop_release.store(true, Relaxed);
                let _ = release.join();
                return Err(e.into());
            }
        };
        Ok(Agent {
            shared,
            receiver: Some(receiver),
            worker: Some(worker),
            release: Some((stop_release, release)),
            instance,
            flight_warnings,
            snapshots_dir: config.snapshots.dir,
        })
    }

    pub fn grpc_addr(&self) -> Option<std::net::SocketAddr> {
        self.receiver.as_ref().and_then(|r| r.grpc_addr())
    }

    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.receiver.as_ref().and_then(|r| r.http_addr())
    }

    /// The flight recorder's tracefs instance.
    pub fn instance_name(&self) -> &str {
        &self.instance
    }

    /// What the flight recorder records without, as it said when it
    /// started (each snapshot's manifest says it too).
    pub fn flight_warnings(&self) -> &[String] {
        &self.flight_warnings
    }

    pub fn snapshots_dir(&self) -> &std::path::Path {
        &self.snapshots_dir
    }

    /// Serves the counters as Prometheus text on `GET /metrics` at `addr`
    /// (loopback only).
    pub fn serve_metrics(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<MetricsServer, crate::metrics::Error> {
        self.shared.metrics.serve(addr, false)
    }

    /// The counters as one line (for the agent's exit).
    pub fn summary_line(&self) -> String {
        self.shared.metrics.summary_line()
    }

    pub fn stats(&self) -> AgentStats {
        let c = &self.shared.counters;
        AgentStats {
            receiver: self
                .receiver
                .as_ref()
                .map(|r| r.stats())
                .unwrap_or_default(),
            forward: self.shared.forwarder.stats(),
            worker: lock(&self.shared.worker).clone(),
            spans_in: self.shared.metrics.spans_received.get(),
            anomalies: self.shared.metrics.anomalies.get(),
            diagnosed_in_time: c.diagnosed_in_time.get(),
            diagnosed_late: c.diagnosed_late.get(),
            released_pending: c.released_pending.get(),
            sent_skipped: c.sent_skipped.get(),
            held: lock(&self.shared.held).len(),
            rss_bytes: crate::metrics::resident_bytes().unwrap_or(0),
            summary: self.shared.metrics.summary_line(),
        }
    }

    /// Stops in order: the receiver (what it acknowledged is judged and
    /// queued), the worker (pending triggers are skipped; the flight
    /// recorder's instance is removed), the held spans, then the forwarder,
    /// which gets `flush` to send what is queued.
    pub fn shutdown(mut self, flush: Duration) -> AgentStats {
        if let Some(receiver) = self.receiver.take() {
            if let Err(e) = receiver.shutdown() {
                eprintln!("deepspan agent: {e}");
            }
        }
        if let Some(mut worker) = self.worker.take() {
            worker.stop();
        }
        if let Some((stop, release)) = self.release.take() {
            stop.store(true, Relaxed);
            let _ = release.join();
        }
        self.shared.release_expired(true);
        let mut stats = self.stats();
        let metrics = self.shared.metrics.clone();
        match Arc::try_unwrap(self.shared) {
            Ok(shared) => stats.forward = shared.forwarder.shutdown(flush),
            Err(_) => {
                eprintln!("deepspan agent: the forwarder is still in use; its queue is not flushed")
            }
        }
        stats.summary = metrics.summary_line();
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue};

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    #[test]
    fn evidence_becomes_one_json_object() {
        let json = evidence_json(&[
            kv("deepspan.cause", Value::StringValue("cpu_throttled".into())),
            kv("deepspan.share", Value::DoubleValue(0.5)),
            kv("deepspan.cause_ns", Value::IntValue(7)),
            kv("deepspan.evidence.throttled_ns", Value::IntValue(3)),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"share": 0.5, "ns": 7, "throttled_ns": 3})
        );
    }

    #[test]
    fn a_late_diagnosis_hangs_under_its_span_with_a_link() {
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "GET /price".into(),
            start_time_unix_nano: 10,
            end_time_unix_nano: 20,
            ..Span::default()
        };
        let trigger = Trigger {
            span: DetachedSpan {
                resource: Default::default(),
                scope: Default::default(),
                span,
            },
            service: "pricing".into(),
            operation: "GET /price".into(),
            duration_ns: 10,
            baseline_ns: Some(3),
            mono: (0, 10),
        };
        let outcome = Outcome::Diagnosed {
            snapshot: "s1".into(),
            attributes: vec![kv(
                "deepspan.cause",
                Value::StringValue("cpu_throttled".into()),
            )],
            kernel_spans: None,
        };
        let late = late_diagnosis(&trigger, &outcome).expect("a diagnosis span");
        let s = &late.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(s.parent_span_id, vec![2; 8]);
        assert_ne!(s.span_id, vec![2; 8]);
        assert_eq!(s.links[0].span_id, vec![2; 8]);
        assert_eq!((s.start_time_unix_nano, s.end_time_unix_nano), (10, 20));
        let get = |k: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key == k)
                .and_then(|kv| kv.value.clone())
        };
        assert_eq!(
            get("deepspan.cause"),
            Some(AnyValue {
                value: Some(Value::StringValue("cpu_throttled".into()))
            })
        );
        assert_eq!(
            get(attr::SNAPSHOT),
            Some(AnyValue {
                value: Some(Value::StringValue("s1".into()))
            })
        );
        assert_eq!(
            get(attr::BASELINE_NS),
            Some(AnyValue {
                value: Some(Value::IntValue(3))
            })
        );
        let skipped = Outcome::Skipped {
            reason: SkipReason::RateLimited,
            snapshot: None,
            error: None,
        };
        assert!(late_diagnosis(&trigger, &skipped).is_none());
    }
}
