//! `deepspan export`: a run's spans, with each request's kernel critical
//! path, as OTLP for the tracing back-ends people already use (Jaeger,
//! Grafana Tempo, an OpenTelemetry Collector) — what Skua (Sheth and Sun
//! 2018) shows, without a patched kernel or tracer.
//!
//! Every span of the run goes out unchanged, except that each request span
//! (a span the analysis gave a kernel critical path) gains:
//! - the diagnosis as attributes (`deepspan.cause`, `deepspan.headline`, …);
//! - child spans for its path ([`kernel`]): pieces of one thread and state
//!   joined, short pieces folded and counted, a span link to the request a
//!   piece worked for ("blocked by request X"), and its long system calls;
//! - span events for a wake-up by another request, throttling start and
//!   end, and lost kernel events.
//!
//! The names are listed in [`attributes`] and `docs/otel-attributes.md`.
//! What back-ends accept shapes the output: children stay inside their
//! parent (Jaeger's clock-skew adjuster moves those that do not) and each
//! trace keeps to a budget of spans and bytes (Tempo refuses traces over
//! 5 MB by default; Jaeger UI slows down past a few thousand spans): a trace
//! over it has its requests folded at a coarser threshold, and the notes say
//! so. [`send`] writes OTLP/JSON files and sends OTLP over gRPC or HTTP.

pub mod analysis;
pub mod attributes;
pub mod kernel;
pub mod send;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use deepspan_spans::model::Scope;
use deepspan_spans::{read_run_spans, request_from_spans, Span, SpanId, TraceId};
use deepspan_store::kept::KeptAnalysis;
use prost::Message;

pub use kernel::{RequestCounts, Thresholds};
pub use send::{
    send_otlp, write_json, ClientOptions, Failure, OtlpClient, Protocol, SendOptions, SendReport,
    MAX_SERVER_BACKOFF,
};

/// What can go wrong while exporting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{} has no analysis: run `deepspan analyze {}` first", run.display(), run.display())]
    NoAnalysis { run: PathBuf },
    #[error("{}: {what}", path.display())]
    Analysis { path: PathBuf, what: String },
    #[error(transparent)]
    Store(#[from] deepspan_store::Error),
    #[error(transparent)]
    Spans(#[from] deepspan_spans::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Send(String),
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How much `export` adds.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub thresholds: Thresholds,
    /// Most spans of a trace (its own and the added ones) before its
    /// requests are folded more coarsely.
    pub max_spans_per_trace: usize,
    /// Most bytes of a trace, as OTLP protobuf.
    pub max_bytes_per_trace: usize,
    /// Only the spans of these traces (`None`: every trace). The agent
    /// wants the traces of its slow spans, not all those of the snapshot.
    pub traces: Option<HashSet<TraceId>>,
}

/// Jaeger UI slows down past a few thousand spans in one trace.
pub const DEFAULT_MAX_SPANS_PER_TRACE: usize = 2000;
/// Under Tempo's 5 MB per trace, and under the 4 MiB message size that
/// gRPC servers (the Collector's and Jaeger's OTLP receivers) take by
/// default, so that one trace always fits in one request.
pub const DEFAULT_MAX_BYTES_PER_TRACE: usize = 3 << 20;

impl Default for ExportOptions {
    fn default() -> ExportOptions {
        ExportOptions {
            thresholds: Thresholds {
                min_ns: 1_000_000,
                min_share: 0.01,
                max_events: 64,
            },
            max_spans_per_trace: DEFAULT_MAX_SPANS_PER_TRACE,
            max_bytes_per_trace: DEFAULT_MAX_BYTES_PER_TRACE,
            traces: None,
        }
    }
}

/// Counts of what an export made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Spans of the run (of the traces asked for), all exported.
    pub run_spans: usize,
    pub traces: usize,
    /// Requests of the analysis (in the traces asked for), and of them
    /// those whose span was found.
    pub requests: usize,
    pub requests_enriched: usize,
    /// Rows of `critical_path` of the enriched requests.
    pub path_pieces: usize,
    /// After joining consecutive pieces of one thread and state.
    pub joined_pieces: usize,
    pub path_spans: usize,
    pub syscall_spans: usize,
    /// Joined pieces folded into a neighbour or into a group.
    pub folded_pieces: usize,
    pub events: usize,
    pub events_dropped: usize,
    /// Traces folded more coarsely to fit the budget.
    pub traces_refolded: usize,
    /// Traces still over the budget (their own spans alone exceed it).
    pub traces_over_budget: usize,
}

/// The spans to send, one list per trace, and what was done.
pub struct Export {
    pub traces: Vec<Vec<Span>>,
    pub stats: ExportStats,
    /// What the user should know (spans not found, traces refolded, …).
    pub notes: Vec<String>,
}

impl Export {
    /// All spans, trace after trace.
    pub fn spans(&self) -> impl Iterator<Item = &Span> {
        self.traces.iter().flatten()
    }
}

/// Reads a run (its spans and `analysis/`) and builds what `export` sends.
pub fn export_run(run_dir: &Path, options: &ExportOptions) -> Result<Export, Error> {
    let analysis = analysis::read(run_dir, options.thresholds.min_ns)?;
    export_analysed(run_dir, &analysis, options)
}

/// [`export_run`] of a run just analysed with its results kept in memory
/// (`AnalyzeOptions::keep` = [`analysis::KEEP`]): they are not read back.
pub fn export_kept(
    run_dir: &Path,
    kept: KeptAnalysis,
    options: &ExportOptions,
) -> Result<Export, Error> {
    let analysis = analysis::from_kept(run_dir, kept, options.thresholds.min_ns)?;
    export_analysed(run_dir, &analysis, options)
}

/// The run's spans exported with `analysis`.
fn export_analysed(
    run_dir: &Path,
    analysis: &analysis::RunAnalysis,
    options: &ExportOptions,
) -> Result<Export, Error> {
    let mut reader = read_run_spans(run_dir)?;
    let mut spans = Vec::new();
    for s in reader.by_ref() {
        spans.push(s?);
    }
    let mut notes = reader.warnings;
    let mut export = export_spans(spans, analysis, options);
    notes.append(&mut export.notes);
    export.notes = notes;
    Ok(export)
}

/// [`export_run`] for spans and an analysis already in memory.
pub fn export_spans(
    spans: Vec<Span>,
    analysis: &analysis::RunAnalysis,
    options: &ExportOptions,
) -> Export {
    let asked = |trace: &TraceId| options.traces.as_ref().is_none_or(|t| t.contains(trace));
    let spans: Vec<Span> = spans.into_iter().filter(|s| asked(&s.trace_id)).collect();
    let mut stats = ExportStats {
        run_spans: spans.len(),
        requests: analysis
            .requests
            .iter()
            .filter(|r| asked(&r.trace_id))
            .count(),
        ..ExportStats::default()
    };
    let mut notes = Vec::new();
    let by_id: HashMap<(TraceId, SpanId), usize> = analysis
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.trace_id, r.span_id), i))
        .collect();
    let scope = Arc::new(Scope {
        name: attributes::SCOPE_NAME.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        attributes: Default::default(),
    });
    let cx = kernel::Context {
        analysis,
        by_id: &by_id,
        scope: &scope,
    };

    // Traces in the order their first span came.
    let mut order: HashMap<TraceId, usize> = HashMap::new();
    let mut traces: Vec<Vec<Span>> = Vec::new();
    for s in spans {
        let i = *order.entry(s.trace_id).or_insert_with(|| {
            traces.push(Vec::new());
            traces.len() - 1
        });
        traces[i].push(s);
    }
    stats.traces = traces.len();

    let mut out = Vec::with_capacity(traces.len());
    for originals in traces {
        // (index in the trace, request) of its request spans, first copy only.
        let mut seen = std::collections::HashSet::new();
        let requests: Vec<(usize, usize)> = originals
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let r = *by_id.get(&(s.trace_id, s.span_id))?;
                seen.insert(r).then_some((i, r))
            })
            .collect();
        if requests.is_empty() {
            out.push(originals);
            continue;
        }
        let mut factor: u64 = 1;
        loop {
            let mut trace = originals.clone();
            let mut children = Vec::new();
            let mut counts = Vec::with_capacity(requests.len());
            let mut coarsest = true;
            for &(i, r) in &requests {
                let request = &analysis.requests[r];
                let base = options.thresholds.for_request(request.duration_ns());
                let threshold = base.saturating_mul(factor);
                coarsest &= threshold >= request.duration_ns();
                let enriched = kernel::enrich_request(
                    &mut trace[i],
                    request,
                    threshold,
                    options.thresholds.max_events,
                    &cx,
                );
                children.extend(enriched.children);
                counts.push(enriched.counts);
            }
            trace.append(&mut children);
            let span_count = trace.len();
            let bytes = request_from_spans(&trace).encoded_len();
            let over =
                span_count > options.max_spans_per_trace || bytes > options.max_bytes_per_trace;
            if over && !coarsest {
                factor = factor.saturating_mul(4);
                continue;
            }
            let trace_id = trace[0].trace_id;
            if factor > 1 {
                stats.traces_refolded += 1;
                notes.push(format!(
                    "trace {trace_id}: kernel pieces folded at {factor}x the threshold to keep within {} spans and {} bytes (now {span_count} spans, {bytes} bytes)",
                    options.max_spans_per_trace, options.max_bytes_per_trace
                ));
            }
            if over {
                stats.traces_over_budget += 1;
                notes.push(format!(
                    "trace {trace_id}: {span_count} spans, {bytes} bytes: over the budget of {} spans / {} bytes even with one kernel span per request",
                    options.max_spans_per_trace, options.max_bytes_per_trace
                ));
            }
            for c in counts {
                stats.requests_enriched += 1;
                stats.path_pieces += c.pieces;
                stats.joined_pieces += c.joined;
                stats.path_spans += c.path_spans;
                stats.syscall_spans += c.syscall_spans;
                stats.folded_pieces += c.folded;
                stats.events += c.events;
                stats.events_dropped += c.events_dropped;
            }
            out.push(trace);
            break;
        }
    }
    let missing = stats.requests - stats.requests_enriched;
    if missing > 0 {
        notes.push(format!(
            "{missing} of {} analysed requests have no span in the run's spans/ (analysed from other span files?): exported without their kernel path",
            stats.requests
        ));
    }
    Export {
        traces: out,
        stats,
        notes,
    }
}
