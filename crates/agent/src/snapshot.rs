//! The snapshot worker: anomalous spans in, diagnosed snapshots out.
//!
//! One thread owns the flight recorder. A trigger (an anomalous request
//! span) waits until its window `[start − margin, end + margin]` has been
//! over for `settle` (spans of the other requests in that window are still
//! on their way), together with the triggers whose windows overlap it: they
//! share one snapshot. Then:
//! 1. budget: while the agent has spent more CPU than its share of a core
//!    allows (`cpu_share`, [`CpuBudget`]), skipped as `cpu_budget`; then
//!    at most `max_per_minute` snapshots (a token bucket), else skipped as
//!    `rate_limited`;
//! 2. the flight recorder writes the window as a run folder, or says it
//!    has left the ring buffer (`left_ring_buffer`);
//! 3. the spans of the requests received around the window go in
//!    `spans/otlp-000.pb`, as received;
//! 4. the run is analysed by `deepspan_pipeline::analyze_run`, the code of
//!    `deepspan analyze`, which also keeps what export needs in memory,
//!    and its diagnoses go on spans as `deepspan export` would put them
//!    (without reading the tables it just wrote);
//! 5. the folder is renamed into place with its `snapshot.json`, and the
//!    oldest snapshots go while the folder holds more than its budget.
//!
//! Each trigger's [`Outcome`] goes to the delivery callback.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use serde::Serialize;

use deepspan_record::{FlightRecorder, WindowOutcome};
use deepspan_run::{Run, SnapshotInfo, SnapshotStatus, SnapshotTrigger};
use deepspan_spans::{request_from_spans, ExportTraceServiceRequest, Span, SpanWriter, TraceId};

use crate::spans::{mono_times, DetachedSpan, RecentRequests};

/// How snapshots are taken and kept.
#[derive(Clone, Debug)]
pub struct SnapshotConfig {
    /// Where each snapshot's run folder goes (`DIR/<id>/`).
    pub dir: PathBuf,
    /// Added before and after a slow span: the causes of a wait may start
    /// before the request (a lock taken earlier, a throttling period).
    pub margin: Duration,
    /// How long after a window's end the snapshot waits for the spans of
    /// the other requests in it.
    pub settle: Duration,
    pub max_per_minute: u32,
    /// The agent's CPU, everything included, as a share of one core (0.02
    /// = 2 %): no snapshot starts while it has spent more; see [`CpuBudget`].
    pub cpu_share: f64,
    /// Overlapping windows merge into one snapshot up to this length.
    pub max_window: Duration,
    /// The folder keeps at most this many snapshots and bytes; the oldest go first.
    pub retain_count: usize,
    pub retain_bytes: u64,
    /// Where `deepspan ui DIR` serves the snapshots (`http://host:7878/s/`):
    /// a diagnosed span then carries `deepspan.snapshot_url`, its snapshot's page.
    pub url_prefix: Option<String>,
    /// Most spans written into a snapshot's span file: the analysis's time
    /// and memory grow with them (about 6 KiB each, measured). Over it, the requests
    /// nearest the slow spans are kept.
    pub max_spans: u64,
}

impl SnapshotConfig {
    pub fn new(dir: impl Into<PathBuf>) -> SnapshotConfig {
        SnapshotConfig {
            dir: dir.into(),
            margin: Duration::from_millis(100),
            settle: Duration::from_secs(1),
            max_per_minute: 12,
            cpu_share: 0.02,
            max_window: Duration::from_secs(30),
            retain_count: 200,
            retain_bytes: 2 << 30,
            url_prefix: None,
            max_spans: 20_000,
        }
    }
}

/// An anomalous request span waiting for its snapshot.
#[derive(Clone, Debug)]
pub struct Trigger {
    pub span: DetachedSpan,
    pub service: String,
    pub operation: String,
    pub duration_ns: u64,
    pub baseline_ns: Option<u64>,
    /// The span on the monotonic clock.
    pub mono: (u64, u64),
}

impl Trigger {
    pub fn new(
        span: DetachedSpan,
        service: String,
        operation: String,
        duration_ns: u64,
        baseline_ns: Option<u64>,
        mono_minus_realtime_ns: i128,
    ) -> Trigger {
        let mono = mono_times(&span.span, mono_minus_realtime_ns);
        Trigger {
            span,
            service,
            operation,
            duration_ns,
            baseline_ns,
            mono,
        }
    }
}

/// Why a trigger got no diagnosis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// More snapshots than `max_per_minute`.
    RateLimited,
    /// The agent had spent its CPU budget (`cpu_share`).
    CpuBudget,
    /// The window's events were no longer in the flight recorder.
    LeftRingBuffer,
    /// Writing or analysing the snapshot failed (the error is logged in
    /// `snapshot.json` when the folder could be kept).
    Failed,
    /// The agent stopped before the window settled.
    Stopping,
}

impl SkipReason {
    pub const ALL: [SkipReason; 5] = [
        SkipReason::RateLimited,
        SkipReason::CpuBudget,
        SkipReason::LeftRingBuffer,
        SkipReason::Failed,
        SkipReason::Stopping,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::RateLimited => "rate_limited",
            SkipReason::CpuBudget => "cpu_budget",
            SkipReason::LeftRingBuffer => "left_ring_buffer",
            SkipReason::Failed => "failed",
            SkipReason::Stopping => "stopping",
        }
    }
}

/// What became of a trigger.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Diagnosed in snapshot `snapshot`: the `deepspan.*` attributes the
    /// analysis gives its span (as `deepspan export` sets them) and the
    /// spans of its kernel critical path (children of the span).
    Diagnosed {
        snapshot: String,
        attributes: Vec<KeyValue>,
        kernel_spans: Option<ExportTraceServiceRequest>,
    },
    Skipped {
        reason: SkipReason,
        snapshot: Option<String>,
        error: Option<String>,
    },
}

/// Messages to the worker.
pub enum Message {
    Trigger(Box<Trigger>),
    /// Stop: pending triggers are skipped (`stopping`), the recorder removed.
    Stop,
}

/// Counts kept by the worker.
#[derive(Clone, Debug, Default)]
pub struct WorkerStats {
    pub snapshots: u64,
    pub snapshot_bytes: u64,
    pub skipped: HashMap<SkipReason, u64>,
    pub removed_by_retention: u64,
}

/// Everything the worker runs with.
pub struct Worker {
    pub config: SnapshotConfig,
    pub flight: FlightRecorder,
    pub recent: Arc<Mutex<RecentRequests>>,
    pub stats: Arc<Mutex<WorkerStats>>,
    pub metrics: crate::metrics::AgentMetrics,
    /// Runs once per trigger, from either of the worker's threads.
    pub deliver: Arc<dyn Fn(Trigger, Outcome) + Send + Sync>,
}

/// A token bucket: `per_minute` snapshots a minute, bursts up to that.
struct RateLimit {
    per_minute: u32,
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    fn take(&mut self, now: Instant) -> bool {
        let cap = self.per_minute as f64;
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * cap / 60.0).min(cap);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The agent's CPU budget: a share of one core, spent by the whole process
/// (the pass-through, the flight recorder's reading, captures and
/// analyses), checked before each snapshot. A bucket of CPU time: it fills
/// at `share` of the wall time, up to a minute's worth, and the process's
/// CPU time is taken out as it is spent; a snapshot starts only while the
/// bucket is not empty. One analysis can cost more than a minute's budget
/// (about a CPU second for the demo shop's window, against 1.2 s a minute
/// at 2 %): the bucket goes into debt by it, and the next snapshot waits
/// until the debt is paid. Over any long stretch the agent stays within its
/// share, give or take one analysis, and it takes fewer snapshots when
/// they cost more.
struct CpuBudget {
    share: f64,
    /// CPU nanoseconds the agent may still spend; negative: its debt.
    credit_ns: f64,
    at: Instant,
    cpu_at_ns: u64,
}

impl CpuBudget {
    /// Credit for a minute is the most the bucket holds.
    const HORIZON: Duration = Duration::from_secs(60);

    /// A full bucket: an agent that just started may take a snapshot.
    fn new(share: f64, now: Instant, cpu_ns: u64) -> CpuBudget {
        CpuBudget {
            share,
            credit_ns: share * Self::HORIZON.as_nanos() as f64,
            at: now,
            cpu_at_ns: cpu_ns,
        }
    }

    /// Whether a snapshot may start, given the process's CPU time now.
    fn allows(&mut self, now: Instant, cpu_ns: u64) -> bool {
        let cap = self.share * Self::HORIZON.as_nanos() as f64;
        let earned = self.share * now.duration_since(self.at).as_nanos() as f64;
        let spent = cpu_ns.saturating_sub(self.cpu_at_ns) as f64;
        self.credit_ns = (self.credit_ns + earned - spent).min(cap);
        self.at = now;
        self.cpu_at_ns = cpu_ns;
        self.credit_ns > 0.0
    }
}

/// The CPU time of this process so far, all threads (ns).
fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The kernel's buffer is read into the recorder's history this often, so
/// that how far back a snapshot reaches is the history's size, whatever
/// the kernel's buffer holds and however busy the machine (reading pages is
/// a copy: a few thousand `read`s a second on a busy host).
const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// Windows written and waiting for the analyst at most; beyond, a window
/// is skipped as `rate_limited` (the analysis cannot keep up).
const MAX_CAPTURED_WAITING: usize = 32;

/// A window written to disk, waiting for its analysis.
struct Captured {
    id: String,
    group: Vec<Trigger>,
    start: u64,
    end: u64,
    partial: PathBuf,
    /// Spans of the window not written (over `max_spans`).
    spans_left_out: u64,
}

/// Counting and delivering outcomes, shared by the two threads.
#[derive(Clone)]
struct Reporter {
    stats: Arc<Mutex<WorkerStats>>,
    metrics: crate::metrics::AgentMetrics,
    deliver: Arc<dyn Fn(Trigger, Outcome) + Send + Sync>,
}

impl Reporter {
    fn skip(
        &self,
        group: Vec<Trigger>,
        reason: SkipReason,
        snapshot: Option<String>,
        error: Option<String>,
    ) {
        *self
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .skipped
            .entry(reason)
            .or_default() += group.len() as u64;
        for t in group {
            self.metrics.skip_snapshot(reason.as_str());
            (self.deliver)(
                t,
                Outcome::Skipped {
                    reason,
                    snapshot: snapshot.clone(),
                    error: error.clone(),
                },
            );
        }
    }
}

impl Worker {
    /// Runs until `Stop` or until every sender is gone, then removes the
    /// flight recorder's instance.
    ///
    /// Two threads: this one captures (it owns the flight recorder, and
    /// writes each window as soon as it has settled: a few milliseconds),
    /// an analyst thread analyses what was captured, in order. An analysis
    /// takes seconds; captures never wait for one, so windows are written
    /// while the kernel still holds them.
    pub fn run(self, messages: Receiver<Message>) {
        let Worker {
            config,
            mut flight,
            recent,
            stats,
            metrics,
            deliver,
        } = self;
        let reporter = Reporter {
            stats,
            metrics,
            deliver,
        };
        let stopping = Arc::new(AtomicBool::new(false));
        let (captured_tx, captured_rx) = sync_channel::<Captured>(MAX_CAPTURED_WAITING);
        let analyst = {
            let analyst = Analyst {
                config: config.clone(),
                reporter: reporter.clone(),
                stopping: stopping.clone(),
            };
            std::thread::Builder::new()
                .name("deepspan-analyst".into())
                .spawn(move || analyst.run(captured_rx))
        };
        let analyst = match analyst {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!("deepspan agent: cannot start the analyst thread: {e}; no snapshot will be analysed");
                None
            }
        };
        let capture = Capture {
            config,
            recent,
            reporter: reporter.clone(),
        };
        let mut pending: Vec<Trigger> = Vec::new();
        let mut limit = RateLimit {
            per_minute: capture.config.max_per_minute,
            tokens: capture.config.max_per_minute as f64,
            at: Instant::now(),
        };
        let mut budget = CpuBudget::new(capture.config.cpu_share, Instant::now(), process_cpu_ns());
        let mut next_clock_sample = Instant::now() + Duration::from_secs(1);
        let mut last_drain = Instant::now();
        let mut sequence = 0u64;
        // When the first pending group settles (from the last grouping).
        let mut next_ready_ns: Option<u64> = None;
        loop {
            let now_mono = mono_now();
            let wait = next_ready_ns
                .map_or(DRAIN_EVERY, |at| {
                    Duration::from_nanos(at.saturating_sub(now_mono))
                })
                .min(next_clock_sample.saturating_duration_since(Instant::now()))
                .min((last_drain + DRAIN_EVERY).saturating_duration_since(Instant::now()));
            let stop = match messages.recv_timeout(wait) {
                Ok(Message::Trigger(t)) => {
                    pending.push(*t);
                    false
                }
                Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => true,
                Err(RecvTimeoutError::Timeout) => false,
            };
            if stop {
                break;
            }
            if Instant::now() >= next_clock_sample {
                flight.sample_clock();
                next_clock_sample = Instant::now() + Duration::from_secs(1);
            }
            if last_drain.elapsed() >= DRAIN_EVERY {
                if let Err(e) = flight.drain_into_history() {
                    eprintln!("deepspan agent: {e}");
                }
                last_drain = Instant::now();
            }
            let settled = capture.take_ready(&mut pending, mono_now());
            next_ready_ns = settled.next_ready_ns;
            for group in settled.ready {
                sequence += 1;
                // A window already gone costs no snapshot of the budget.
                let start = group.iter().map(|t| capture.window(t).0).min().unwrap_or(0);
                if start < flight.reaches_back_to_ns() {
                    reporter.skip(group, SkipReason::LeftRingBuffer, None, None);
                    continue;
                }
                if !budget.allows(Instant::now(), process_cpu_ns()) {
                    reporter.skip(group, SkipReason::CpuBudget, None, None);
                    continue;
                }
                if !limit.take(Instant::now()) {
                    reporter.skip(group, SkipReason::RateLimited, None, None);
                    continue;
                }
                let Some(captured) = capture.capture(&mut flight, group, sequence) else {
                    continue;
                };
                if let Err(TrySendError::Full(c) | TrySendError::Disconnected(c)) =
                    captured_tx.try_send(captured)
                {
                    let _ = fs::remove_dir_all(&c.partial);
                    reporter.skip(c.group, SkipReason::RateLimited, None, None);
                }
            }
        }
        reporter.skip(pending, SkipReason::Stopping, None, None);
        stopping.store(true, Ordering::Relaxed);
        drop(captured_tx);
        if let Some(analyst) = analyst {
            let _ = analyst.join();
        }
        if let Err(e) = flight.stop() {
            eprintln!("deepspan agent: {e}");
        }
    }
}

/// The groups of [`settled_groups`] ready for a snapshot, and when the
/// next of the groups left pending will be.
struct Settled {
    ready: Vec<Vec<Trigger>>,
    /// When the earliest group left in `pending` settles (monotonic ns).
    next_ready_ns: Option<u64>,
}

/// Takes out of `pending` the groups of triggers ready for a snapshot.
/// Overlapping windows merge into one group that never spans more than
/// `max_ns`; a group is ready once its *last* window has settled
/// (`settle_ns` after its end). The others stay pending, and the capture
/// thread sleeps until the first of them settles: a group whose first
/// window has settled but whose last has not is not ready, so waking for
/// its first window would spin until its last one settles.
fn settled_groups(
    pending: &mut Vec<Trigger>,
    window: impl Fn(&Trigger) -> (u64, u64),
    max_ns: u64,
    settle_ns: u64,
    now_mono: u64,
) -> Settled {
    pending.sort_by_key(|t| window(t).0);
    let mut groups: Vec<(Vec<Trigger>, u64)> = Vec::new();
    let mut group_start = 0;
    for t in pending.drain(..) {
        let (start, end) = window(&t);
        match groups.last_mut() {
            Some((group, group_end))
                if start <= *group_end && end.max(*group_end) - group_start <= max_ns =>
            {
                *group_end = (*group_end).max(end);
                group.push(t);
            }
            _ => {
                group_start = start;
                groups.push((vec![t], end));
            }
        }
    }
    let mut settled = Settled {
        ready: Vec::new(),
        next_ready_ns: None,
    };
    for (group, end) in groups {
        let ready_at = end.saturating_add(settle_ns);
        if ready_at <= now_mono {
            settled.ready.push(group);
        } else {
            pending.extend(group);
            settled.next_ready_ns =
                Some(settled.next_ready_ns.map_or(ready_at, |n| n.min(ready_at)));
        }
    }
    settled
}

/// The capturing half: windows, groups, and writing a window's run folder.
struct Capture {
    config: SnapshotConfig,
    recent: Arc<Mutex<RecentRequests>>,
    reporter: Reporter,
}

impl Capture {
    fn window(&self, t: &Trigger) -> (u64, u64) {
        let margin = self.config.margin.as_nanos() as u64;
        (
            t.mono.0.saturating_sub(margin),
            t.mono.1.saturating_add(margin),
        )
    }

    /// Takes out the groups of overlapping windows whose last window has
    /// settled; see [`settled_groups`].
    fn take_ready(&self, pending: &mut Vec<Trigger>, now_mono: u64) -> Settled {
        settled_groups(
            pending,
            |t| self.window(t),
            self.config.max_window.as_nanos() as u64,
            self.config.settle.as_nanos() as u64,
            now_mono,
        )
    }

    /// Writes the group's window (kernel trace and the spans around it) as
    /// `DIR/.partial-ID`; a window that cannot be written is skipped here.
    fn capture(
        &self,
        flight: &mut FlightRecorder,
        group: Vec<Trigger>,
        sequence: u64,
    ) -> Option<Captured> {
        let start = group.iter().map(|t| self.window(t).0).min().unwrap_or(0);
        let end = group.iter().map(|t| self.window(t).1).max().unwrap_or(0);
        let id = snapshot_id(sequence);
        let partial = self.config.dir.join(format!(".partial-{id}"));
        let mut spans_left_out = 0;
        let written = (|| -> Result<bool, String> {
            fs::create_dir_all(&partial)
                .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
            match flight
                .snapshot(start, end, &partial)
                .map_err(|e| e.to_string())?
            {
                WindowOutcome::LeftBuffer { .. } => return Ok(false),
                WindowOutcome::Written { .. } => {}
            }
            let offset = flight.mono_minus_realtime_ns();
            let wall = |mono: u64| (mono as i128 - offset).max(0) as u64;
            let near: Vec<(u64, u64)> = group
                .iter()
                .map(|t| (wall(t.mono.0), wall(t.mono.1)))
                .collect();
            let (requests, left_out) = self
                .recent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .overlapping(wall(start), wall(end), &near, self.config.max_spans);
            spans_left_out = left_out;
            let mut writer = SpanWriter::create(&partial).map_err(|e| e.to_string())?;
            for encoded in &requests {
                writer.append_encoded(encoded).map_err(|e| e.to_string())?;
            }
            writer.flush().map_err(|e| e.to_string())?;
            Ok(true)
        })();
        match written {
            Ok(true) => Some(Captured {
                id,
                group,
                start,
                end,
                partial,
                spans_left_out,
            }),
            Ok(false) => {
                let _ = fs::remove_dir_all(&partial);
                self.reporter
                    .skip(group, SkipReason::LeftRingBuffer, None, None);
                None
            }
            Err(error) => {
                let _ = fs::remove_dir_all(&partial);
                self.reporter
                    .skip(group, SkipReason::Failed, None, Some(error));
                None
            }
        }
    }
}

/// The analysing half: a captured window in, its diagnoses delivered.
struct Analyst {
    config: SnapshotConfig,
    reporter: Reporter,
    stopping: Arc<AtomicBool>,
}

impl Analyst {
    fn run(self, captured: Receiver<Captured>) {
        // The analysis is the agent's one large piece of work: at the
        // lowest priority (the threads it starts inherit it), so that on a
        // busy host it takes only what the applications leave. A diagnosis
        // then comes later, never at their expense (the held span goes on
        // pending after --hold-ms).
        // SAFETY: gettid has no preconditions; setpriority with a thread id
        // changes that thread only (Linux keeps nice values per thread).
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
        for c in captured {
            if self.stopping.load(Ordering::Relaxed) {
                let _ = fs::remove_dir_all(&c.partial);
                self.reporter
                    .skip(c.group, SkipReason::Stopping, None, None);
            } else {
                self.analyse(c);
            }
        }
    }

    fn analyse(&self, c: Captured) {
        let Captured {
            id,
            group,
            start,
            end,
            partial,
            spans_left_out,
        } = c;
        let done = self.config.dir.join(&id);
        match analyse_window(&group, &partial) {
            Ok(diagnosed) => {
                let mut info = snapshot_info(&id, start, end, &group, &diagnosed, None);
                info.spans_left_out = spans_left_out;
                let kept = write_info(&partial, &info).and_then(|()| rename(&partial, &done));
                if let Err(e) = kept {
                    let _ = fs::remove_dir_all(&partial);
                    return self.reporter.skip(group, SkipReason::Failed, None, Some(e));
                }
                {
                    let mut stats = self
                        .reporter
                        .stats
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    stats.snapshots += 1;
                    self.reporter.metrics.snapshots_taken.inc();
                    stats.snapshot_bytes += dir_bytes(&done);
                }
                self.retain();
                for (t, attributes) in group.into_iter().zip(diagnosed) {
                    let outcome = match attributes {
                        Some((mut attributes, kernel_spans)) => {
                            if let Some(prefix) = &self.config.url_prefix {
                                attributes.push(KeyValue {
                                    key: crate::attr::SNAPSHOT_URL.into(),
                                    value: Some(AnyValue {
                                        value: Some(any_value::Value::StringValue(format!(
                                            "{prefix}{id}/"
                                        ))),
                                    }),
                                    ..KeyValue::default()
                                });
                            }
                            Outcome::Diagnosed {
                                snapshot: id.clone(),
                                attributes,
                                kernel_spans,
                            }
                        }
                        None => Outcome::Skipped {
                            reason: SkipReason::Failed,
                            snapshot: Some(id.clone()),
                            error: Some(
                                "the snapshot's analysis has no request for this span".into(),
                            ),
                        },
                    };
                    (self.reporter.deliver)(t, outcome);
                }
            }
            Err(error) => {
                // Kept for a look: the error is in its snapshot.json.
                let kept = write_info(
                    &partial,
                    &snapshot_info(&id, start, end, &group, &[], Some(error.clone())),
                )
                .and_then(|()| rename(&partial, &done))
                .is_ok();
                if !kept {
                    let _ = fs::remove_dir_all(&partial);
                }
                self.reporter
                    .skip(group, SkipReason::Failed, kept.then_some(id), Some(error));
            }
        }
    }

    /// Removes the oldest snapshots while the folder is over its budget.
    fn retain(&self) {
        let removed = retain(
            &self.config.dir,
            self.config.retain_count,
            self.config.retain_bytes,
        );
        self.reporter
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .removed_by_retention += removed;
    }
}

/// Removes the oldest snapshot folders of `dir` (those with a
/// `snapshot.json`) until at most `count` and `bytes` are left; returns how
/// many went. Folders being written (`.partial-…`) are not counted.
fn retain(dir: &Path, count: usize, bytes: u64) -> u64 {
    let mut snapshots: Vec<(String, u64)> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| Run::new(e.path()).snapshot().is_file())
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        dir_bytes(&e.path()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    // Ids start with their UTC time: name order is age order.
    snapshots.sort();
    let mut held: u64 = snapshots.iter().map(|(_, b)| b).sum();
    let mut left = snapshots.len();
    let mut removed = 0;
    for (name, size) in snapshots {
        if left <= count && held <= bytes {
            break;
        }
        if fs::remove_dir_all(dir.join(&name)).is_ok() {
            left -= 1;
            held -= size;
            removed += 1;
        }
    }
    removed
}

/// A captured window analysed with the code of `deepspan analyze`; for each
/// trigger its attributes and kernel spans (None when the analysis has no
/// request for it).
#[allow(clippy::type_complexity)]
fn analyse_window(
    group: &[Trigger],
    dir: &Path,
) -> Result<Vec<Option<(Vec<KeyValue>, Option<ExportTraceServiceRequest>)>>, String> {
    let options = deepspan_pipeline::AnalyzeOptions {
        keep: Some(deepspan_export::analysis::KEEP),
        ..Default::default()
    };
    let outcome = deepspan_pipeline::analyze_run(dir, &options, &deepspan_pipeline::NoProgress)
        .map_err(|e| format!("analysis: {e}"))?;
    let kept = outcome
        .kept
        .ok_or("analysis: the results asked to be kept in memory were not")?;
    // Only the triggers' traces: the snapshot holds every request around
    // them, and the rest would be enriched for nothing.
    let traces = group
        .iter()
        .filter_map(|t| <[u8; 16]>::try_from(t.span.trace_id()).ok())
        .map(|id| TraceId(u128::from_be_bytes(id)))
        .collect();
    let options = deepspan_export::ExportOptions {
        traces: Some(traces),
        ..Default::default()
    };
    let export = deepspan_export::export_kept(dir, kept, &options)
        .map_err(|e| format!("export of the diagnoses: {e}"))?;
    Ok(group
        .iter()
        .map(|t| diagnosed_attributes(&export.traces, t))
        .collect())
}

/// The trigger span's `deepspan.*` attributes from the export of its
/// snapshot, and the kernel spans under it.
fn diagnosed_attributes(
    traces: &[Vec<Span>],
    trigger: &Trigger,
) -> Option<(Vec<KeyValue>, Option<ExportTraceServiceRequest>)> {
    let trace = traces.iter().find(|t| {
        t.first()
            .is_some_and(|s| s.trace_id.0.to_be_bytes().as_slice() == trigger.span.trace_id())
    })?;
    let span_id = trigger.span.span_id();
    let enriched = trace
        .iter()
        .find(|s| s.span_id.0.to_be_bytes().as_slice() == span_id)?;
    let as_request = request_from_spans(std::slice::from_ref(enriched));
    let attributes: Vec<KeyValue> = as_request
        .resource_spans
        .into_iter()
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .flat_map(|s| s.attributes)
        // The SDK's own fields are already on the span; the snapshot's
        // anomaly verdict and baseline rest on its few requests, the agent's
        // sliding window replaces them.
        .filter(|kv| {
            kv.key.starts_with("deepspan.")
                && !kv.key.starts_with("deepspan.mono_")
                && !matches!(
                    kv.key.as_str(),
                    "deepspan.tid"
                        | deepspan_export::attributes::ANOMALOUS
                        | deepspan_export::attributes::BASELINE_NS
                )
        })
        .collect();
    // The kernel spans of this request: those of the kernel scope below it.
    let mut under: std::collections::HashSet<u64> =
        std::collections::HashSet::from([enriched.span_id.0]);
    let mut kernel = Vec::new();
    let mut added = true;
    while added {
        added = false;
        for s in trace {
            if s.scope.name == deepspan_export::attributes::SCOPE_NAME
                && !under.contains(&s.span_id.0)
                && s.parent_span_id.is_some_and(|p| under.contains(&p.0))
            {
                under.insert(s.span_id.0);
                kernel.push(s.clone());
                added = true;
            }
        }
    }
    let kernel_spans = (!kernel.is_empty()).then(|| request_from_spans(&kernel));
    Some((attributes, kernel_spans))
}

fn snapshot_info(
    id: &str,
    start: u64,
    end: u64,
    group: &[Trigger],
    diagnosed: &[Option<(Vec<KeyValue>, Option<ExportTraceServiceRequest>)>],
    error: Option<String>,
) -> SnapshotInfo {
    let text = |attributes: Option<&Vec<KeyValue>>, key: &str| {
        attributes?.iter().find(|kv| kv.key == key).and_then(|kv| match &kv.value {
            Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                value: Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)),
            }) => Some(s.clone()),
            _ => None,
        })
    };
    SnapshotInfo {
        id: id.to_string(),
        taken_unix_ns: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        window_mono_ns: [start, end],
        spans_left_out: 0,
        status: if error.is_none() {
            SnapshotStatus::Analysed
        } else {
            SnapshotStatus::Failed
        },
        error,
        triggers: group
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let attributes = diagnosed.get(i).and_then(|d| d.as_ref()).map(|(a, _)| a);
                SnapshotTrigger {
                    trace_id: hex(t.span.trace_id()),
                    span_id: hex(t.span.span_id()),
                    service: t.service.clone(),
                    operation: t.operation.clone(),
                    duration_ns: t.duration_ns,
                    baseline_ns: t.baseline_ns,
                    cause: text(attributes, deepspan_export::attributes::CAUSE),
                    headline: text(attributes, deepspan_export::attributes::HEADLINE),
                }
            })
            .collect(),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `YYYYmmddTHHMMSS.mmmZ-NNNN`: sorts by time, unique within the agent.
fn snapshot_id(sequence: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{:03}Z-{sequence:04}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        now.subsec_millis()
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn write_info(dir: &Path, info: &SnapshotInfo) -> Result<(), String> {
    info.save(dir).map(drop).map_err(|e| e.to_string())
}

fn rename(from: &Path, to: &Path) -> Result<(), String> {
    fs::rename(from, to)
        .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        })
        .unwrap_or(0)
}

pub fn mono_now() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `clock`'s time now (ns).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; the clocks
    // passed here exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_sort_by_time() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_417), (2025, 11, 25));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let id = snapshot_id(7);
        assert_eq!(id.len(), "20261125T071500.123Z-0007".len(), "{id}");
        assert!(id.ends_with("Z-0007"));
    }

    #[test]
    fn retention_removes_the_oldest_snapshots_first() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str, size: usize| {
            let d = dir.path().join(name);
            fs::create_dir_all(&d).unwrap();
            fs::write(Run::new(&d).snapshot(), "{}").unwrap();
            fs::write(d.join("data"), vec![0u8; size]).unwrap();
        };
        make("20261125T070000.000Z-0001", 1000);
        make("20261125T070001.000Z-0002", 1000);
        make("20261125T070002.000Z-0003", 1000);
        fs::create_dir_all(dir.path().join(".partial-20261125T070003.000Z-0004")).unwrap();
        let names = || {
            let mut n: Vec<String> = fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(retain(dir.path(), 2, u64::MAX), 1, "by count");
        assert_eq!(
            names()[1..],
            ["20261125T070001.000Z-0002", "20261125T070002.000Z-0003"]
        );
        assert_eq!(retain(dir.path(), 10, 1500), 1, "by bytes");
        assert_eq!(names()[1..], ["20261125T070002.000Z-0003"]);
        assert!(
            names()[0].starts_with(".partial-"),
            "a snapshot being written is left alone"
        );
        assert_eq!(retain(dir.path(), 10, 1500), 0);
    }

    fn trigger(start: u64, end: u64) -> Trigger {
        Trigger {
            span: DetachedSpan {
                resource: Default::default(),
                scope: Default::default(),
                span: Default::default(),
            },
            service: "s".into(),
            operation: "o".into(),
            duration_ns: end - start,
            baseline_ns: None,
            mono: (start, end),
        }
    }

    #[test]
    fn a_group_is_ready_when_its_last_window_has_settled() {
        let window = |t: &Trigger| t.mono;
        let (max, settle) = (1_000, 100);
        // 0..50 and 40..300 overlap: one group, settled at 400; 500..600
        // is a group of its own, settled at 700.
        let mut pending = vec![trigger(500, 600), trigger(40, 300), trigger(0, 50)];
        let s = settled_groups(&mut pending, window, max, settle, 200);
        assert!(
            s.ready.is_empty(),
            "the first window settled, the group not"
        );
        assert_eq!(s.next_ready_ns, Some(400), "wake when the group settles");
        assert_eq!(pending.len(), 3);

        let s = settled_groups(&mut pending, window, max, settle, 400);
        assert_eq!(s.ready.len(), 1);
        let spans: Vec<(u64, u64)> = s.ready[0].iter().map(|t| t.mono).collect();
        assert_eq!(spans, [(0, 50), (40, 300)]);
        assert_eq!(s.next_ready_ns, Some(700));

        let s = settled_groups(&mut pending, window, max, settle, 700);
        assert_eq!(s.ready.len(), 1);
        assert!(pending.is_empty());
        assert_eq!(s.next_ready_ns, None);
    }

    #[test]
    fn a_group_never_spans_more_than_the_longest_window() {
        let window = |t: &Trigger| t.mono;
        let mut pending = vec![trigger(0, 600), trigger(500, 1_200)];
        let s = settled_groups(&mut pending, window, 1_000, 0, 2_000);
        assert_eq!(s.ready.len(), 2, "merged they would span 1 200 ns");
    }

    #[test]
    fn the_cpu_budget_goes_into_debt_by_an_analysis_and_waits_it_out() {
        let start = Instant::now();
        let s = Duration::from_secs;
        let mut budget = CpuBudget::new(0.02, start, 0);
        assert!(budget.allows(start, 0), "a full bucket at start");
        // An analysis of 3 CPU s: 1.8 s of debt after a minute's credit.
        assert!(!budget.allows(start + s(1), 3_000_000_000));
        // 2 % of a core pays 1.8 s back in 90 s.
        assert!(!budget.allows(start + s(80), 3_000_000_000));
        assert!(budget.allows(start + s(92), 3_000_000_000));
        // Idle for an hour: at most a minute's credit (1.2 s), so a 1.5 s
        // analysis puts it in debt again.
        assert!(budget.allows(start + s(3_692), 3_000_000_000));
        assert!(!budget.allows(start + s(3_692), 4_500_000_000));
    }

    #[test]
    fn the_rate_limit_lets_a_burst_through_then_refills() {
        let start = Instant::now();
        let mut limit = RateLimit {
            per_minute: 2,
            tokens: 2.0,
            at: start,
        };
        assert!(limit.take(start));
        assert!(limit.take(start));
        assert!(!limit.take(start), "two a minute");
        assert!(!limit.take(start + Duration::from_secs(29)));
        assert!(
            limit.take(start + Duration::from_secs(31)),
            "one token back after 30 s"
        );
    }
}
