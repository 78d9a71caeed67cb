//! deepspan's analysis pipeline as one call: [`analyze_run`] takes a run
//! folder (kernel trace, spans, manifest), builds the kernel model, places
//! the spans, computes every request's critical path, diagnosis, baseline
//! and root cause, writes `RUN/analysis/` (the Parquet tables,
//! `requests.json`, `placements.json`) and returns the requests with the
//! analysis' notes and counts.
//!
//! `deepspan analyze` and the live agent both call it. It prints nothing
//! and never exits: progress goes to a [`Progress`] the caller gives (a
//! terminal bar, or [`NoProgress`]), failures are an [`Error`].
//!
//! The stages are functions of the `stages` module, each taking what the
//! ones before produced and giving its own typed output. The work itself is
//! done by the modules and crates they call: `kernel_input` (trace.dat or CTF →
//! `deepspan_analysis::Input`) → `deepspan_analysis::build_model` → spans
//! (`inputs`) and placement (`deepspan_analysis::infer_placements`) →
//! `deepspan_analysis::analyze_requests` (paths handed to a writer thread
//! that writes, diagnoses and summarizes them) → baselines and root causes →
//! `deepspan_store` (tables, written into a staging folder swapped in whole).

pub mod align;
mod error;
pub mod hosts;
mod inputs;
mod kernel_input;
mod placements;
mod stages;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use deepspan_analysis::RequestRecord;
use deepspan_store::kept::{KeepColumns, KeptAnalysis};
use deepspan_store::{SpanMeta, Staging};

pub use deepspan_store::placements::PlacementRecord;
pub use error::Error;
pub use kernel_input::KernelTrace;
pub use placements::read_placement;

/// How spans are placed on threads (`deepspan analyze --placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// deepspan SDK fields where present, else inferred from the kernel
    /// trace.
    #[default]
    Auto,
    /// SDK fields only: spans without them have no kernel path.
    Sdk,
    /// SDK fields ignored: every span placed from the kernel trace (to
    /// compare the two).
    Inferred,
}

/// Everything `deepspan analyze` can be told; [`Default`] is its defaults.
#[derive(Clone, Debug, Default)]
pub struct AnalyzeOptions {
    /// Read the `thread.id` span attribute as the OS thread id for spans
    /// without deepspan fields (true only for producers known to put the
    /// kernel tid there).
    pub thread_id_is_os_tid: bool,
    /// How spans are placed on threads.
    pub placement: PlacementMode,
    /// Also keep the results in memory, these columns of the critical-path
    /// and system-call tables with `requests.json`'s requests
    /// ([`AnalysisOutcome::kept`]), for a caller that exports them at once
    /// (the agent): reading the files back would decode what was just
    /// encoded.
    pub keep: Option<KeepColumns>,
}

/// A long step of the analysis that [`Progress`] hears about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Decoding `kernel/trace.dat`: bytes of CPU data read.
    DecodeTraceDat,
    /// Decoding `kernel/ctf/`: events read (no total known ahead).
    DecodeCtf,
    /// Requests' critical paths: requests done (the total is known once
    /// the requests are grouped, at the first `advance`).
    CriticalPaths,
}

/// Where an analysis is, for a progress display. Every method has a no-op
/// default. Called only on the thread that called [`analyze_run`].
pub trait Progress {
    /// `step` starts; `total` when known ahead.
    fn begin(&self, _step: Step, _total: Option<u64>) {}
    /// `step` got to `done` (in its unit, see [`Step`]); for
    /// [`Step::CriticalPaths`] `total` may change.
    fn advance(&self, _step: Step, _done: u64) {}
    /// The total of `step` is now known (or changed).
    fn total(&self, _step: Step, _total: u64) {}
    /// `step` is over (also when it failed).
    fn end(&self, _step: Step) {}
    /// A phase of the analysis ended (the phases of
    /// [`AnalysisOutcome::phases`], in order); for timings.
    fn phase_done(&self, _phase: &'static str, _took: Duration) {}
}

/// A [`Progress`] that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// How the requests were placed on threads (the `sync` of each request).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementCounts {
    /// deepspan SDK fields (monotonic times and thread).
    pub exact: usize,
    /// SDK thread, wall times mapped through the manifest's clock samples.
    pub clock_mapped: usize,
    /// Placed on a thread from the kernel trace.
    pub inferred: usize,
    /// Placed on a process as a whole.
    pub process: usize,
    /// Not placed: no kernel path.
    pub none: usize,
}

/// Counts of the kernel model and the request analysis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnalysisStats {
    /// Kernel events decoded.
    pub events: u64,
    /// Events the trace reader counted as lost (ring-buffer overruns).
    pub lost_events: u64,
    /// Time ranges over which events were lost.
    pub lost_ranges: usize,
    /// Threads the kernel model knows.
    pub threads: usize,
    /// Requests analysed (critical paths handed out).
    pub requests: usize,
    /// Thread critical paths computed (one per thread and time range).
    pub thread_paths: usize,
    /// Context switches missing from the trace that the model inferred.
    pub inferred_switches: u64,
    /// Wake-ups from interrupts that ran while a recorder thread was
    /// current.
    pub wakeups_under_recorder: u64,
    /// Spans read (duplicates left out).
    pub spans: usize,
}

/// What [`analyze_run`] found; `RUN/analysis/` holds the same.
#[derive(Debug)]
pub struct AnalysisOutcome {
    /// `RUN/analysis`, where the tables were written.
    pub analysis_dir: PathBuf,
    /// The run's spans, indexed by
    /// [`SpanIdx`](deepspan_analysis::SpanIdx) (`RequestPath::request` of
    /// each request is its span).
    pub spans: Vec<SpanMeta>,
    /// Every request with its diagnosis, baseline and root cause, slowest
    /// first: the order and content of `requests.json`. The critical-path
    /// pieces are not kept (`path.pieces` is empty; they are in the
    /// `critical_path` table).
    pub requests: Vec<RequestRecord>,
    /// Things the user should know (events lost, spans left out, clock
    /// precision, placement counts, …), as `deepspan analyze` prints them.
    pub notes: Vec<String>,
    /// The model's and analysis' counts.
    pub stats: AnalysisStats,
    /// How the requests were placed.
    pub placements: PlacementCounts,
    /// How long each phase took, in order (the diagnoses are measured
    /// within the critical paths, so not added to the total).
    pub phases: Vec<(&'static str, Duration)>,
    /// The results kept in memory, when [`AnalyzeOptions::keep`] asked.
    pub kept: Option<KeptAnalysis>,
}

impl AnalysisOutcome {
    /// The span a request is about.
    pub fn span_of(&self, request: &RequestRecord) -> &SpanMeta {
        &self.spans[request.path.request as usize]
    }

    /// The request whose span is (`trace_id`, `span_id`), if that span is a
    /// request (a root, server or consumer span).
    pub fn request(&self, trace_id: u128, span_id: u64) -> Option<&RequestRecord> {
        self.requests.iter().find(|r| {
            let s = self.span_of(r);
            s.trace_id == trace_id && s.span_id == span_id
        })
    }
}

/// Phase names, as [`Progress::phase_done`] and [`AnalysisOutcome::phases`]
/// give them.
pub mod phase {
    pub const MODEL: &str = "decode and kernel model";
    pub const SPANS: &str = "spans, placement and thread activity";
    pub const PATHS: &str = "request critical paths, thread states and system calls";
    /// Within [`PATHS`], on the writer thread.
    pub const DIAGNOSES_WITHIN_PATHS: &str = "diagnoses (within the critical paths)";
    /// Baselines and anomalies (named as `DEEPSPAN_TIMINGS` always named
    /// this phase).
    pub const BASELINES: &str = "diagnoses";
    pub const ROOT_CAUSES: &str = "root causes";
    pub const TABLES: &str = "request tables";
}

/// Records phase times and tells the caller's progress.
struct Phases<'a> {
    progress: &'a dyn Progress,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases<'_> {
    fn done(&mut self, phase: &'static str) {
        let took = self.last.elapsed();
        self.record(phase, took);
        self.last = Instant::now();
    }

    fn record(&mut self, phase: &'static str, took: Duration) {
        self.progress.phase_done(phase, took);
        self.done.push((phase, took));
    }
}

/// Analyses the run folder `run`: every request's kernel critical path,
/// summary, diagnosis, baseline and root cause, written to `RUN/analysis/`
/// (replaced whole, so readers never see half an analysis) and returned.
///
/// A run whose recorder died unfinished is refused
/// ([`Error::UnfinishedRecording`]): recover it first
/// (`deepspan_record::recover`). Safe to call from any thread; it starts
/// threads of its own (one per CPU stream while decoding, table writers).
pub fn analyze_run(
    run: &Path,
    options: &AnalyzeOptions,
    progress: &dyn Progress,
) -> Result<AnalysisOutcome, Error> {
    let mut phases = Phases {
        progress,
        last: Instant::now(),
        done: Vec::new(),
    };
    let mut notes: Vec<String> = Vec::new();
    let inputs = stages::open_inputs(run, options, &mut notes)?;
    let kernel = stages::build_kernel(run, &inputs, progress, &mut notes)?;
    phases.done(phase::MODEL);
    stages::kernel_notes(&kernel, &mut notes);

    let placed = stages::place_spans(run, options, inputs, &kernel, &mut notes);
    phases.done(phase::SPANS);

    let staging = Staging::new(run)?;
    let mut paths = stages::critical_paths(&staging, &kernel, &placed, options.keep, progress)?;
    phases.record(phase::DIAGNOSES_WITHIN_PATHS, paths.diagnosing);
    phases.done(phase::PATHS);
    stages::rank_and_baseline(&mut paths.records, &placed.metas);
    phases.done(phase::BASELINES);
    stages::root_causes(&mut paths, &kernel, &placed);
    phases.done(phase::ROOT_CAUSES);

    placements::sync_notes(
        &paths.records,
        placed.clock.as_ref(),
        options.thread_id_is_os_tid,
        &mut notes,
    );
    let (analysis_dir, kept) = stages::write_tables(
        staging,
        &kernel,
        &placed,
        &paths.records,
        &notes,
        paths.kept.take(),
    )?;
    phases.done(phase::TABLES);

    Ok(AnalysisOutcome {
        analysis_dir,
        placements: stages::placement_counts(&paths.records),
        stats: stages::stats(&kernel, &placed, &paths),
        spans: placed.metas,
        requests: paths.records,
        notes,
        phases: phases.done,
        kept,
    })
}
