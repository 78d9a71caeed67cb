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
//! Stages, each in its own crate: `kernel_input` (trace.dat or CTF →
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use deepspan_analysis::{
    aggregate, analyze_requests, baselines, clock_offset_bound, diagnose, infer_placements,
    is_anomalous, usual_durations, ChainIndex, DiagnosisContext, InferredPlace, OperationSummary,
    PlacementMethod, PlacementSpan, Processes, RequestPath, SpanIdx, StateBuilder, SyncSource,
};
use deepspan_model::Tid;
use deepspan_run::analysis;
use deepspan_spans::activity::ActivityOptions;
use deepspan_spans::{ClockMap, Span, SpanRef, ThreadActivity};
use deepspan_store::tables::{self, CriticalPathWriter, KernelContext, PathContext};
use deepspan_store::{json, AnalysisResults, RequestRecord, SpanMeta, Staging};

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
    /// The run's spans, indexed by [`SpanIdx`] (`RequestPath::request` of
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
    if !run.is_dir() {
        return Err(Error::NotARunFolder {
            run: run.to_path_buf(),
        });
    }
    if deepspan_record::needs_recovery(run) {
        return Err(Error::UnfinishedRecording {
            run: run.to_path_buf(),
        });
    }
    let mut phases = Phases {
        progress,
        last: Instant::now(),
        done: Vec::new(),
    };
    let kernel_trace = KernelTrace::open_run(run)?;
    let trace_path = kernel_trace.path().to_path_buf();
    let arch = kernel_trace.arch();
    let mut notes: Vec<String> = Vec::new();
    if let Some(hosts) = hosts::read_hosts(run)? {
        notes.extend(hosts::alignment_notes(&hosts));
    }

    // Spans first: they decide whether the model needs its graph.
    let mut spans = inputs::read_spans(run, &mut notes)?;
    if options.placement == PlacementMode::Inferred {
        // As if no span had the SDK: every one is placed from the trace.
        for s in &mut spans {
            s.sync = Default::default();
        }
    }
    let mut clock = match ClockMap::from_manifest(run) {
        Ok(c) => Some(c),
        Err(e) => {
            if !spans.is_empty() {
                notes.push(format!(
                    "no clock mapping ({e}); spans without deepspan times are not placed"
                ));
            }
            None
        }
    };
    // The execution graph is for critical paths: without spans, none. No
    // analysis reads the interrupt handler runs.
    let recorder_tids = deepspan_run::Manifest::load(run)
        .map(|m| m.recorder_tids)
        .unwrap_or_default();
    let builder = if spans.is_empty() {
        StateBuilder::without_graph()
    } else {
        StateBuilder::new()
    }
    .without_interrupt_history()
    .recorder_threads(&recorder_tids, arch);
    let (mut model, lost) = kernel_trace.build_model(builder, progress)?;
    notes.extend(kernel_trace.warnings());
    if matches!(kernel_trace, KernelTrace::Hosts { .. }) {
        let linked = model.link_replies(&hosts::remote_calls(&spans));
        if linked > 0 {
            notes.push(format!(
                "{linked} replies between hosts had no matched packet (record with --tcp-keys for those): each caller's wait was joined to the server span's thread at its end"
            ));
        }
    }
    phases.done(phase::MODEL);
    let events = model.stats().events;
    let lost_events = lost.total();
    if lost_events > 0 || !model.lost_ranges().is_empty() {
        notes.push(format!(
            "{lost_events} kernel events were lost (ring-buffer overruns) in {} ranges; pieces over them are flagged `lost`",
            model.lost_ranges().len()
        ));
    }

    let under_recorder = model.stats().wakeups_under_recorder;
    if under_recorder > 0 {
        notes.push(format!(
            "{under_recorder} wake-ups came from interrupts that ran while a recorder thread was current (the kernel leaves those interrupts out with the recorder's own events); they are counted as timer wake-ups for threads in nanosleep, else as unexplained"
        ));
    }
    let across = model.stats().wakeups_from_other_hosts;
    if across > 0 {
        notes.push(format!(
            "{across} wake-ups were recorded by one host's run in the context of another host's thread (hosts sharing a kernel); each was taken as a packet from that thread"
        ));
    }
    let inferred = model.stats().inferred_switches;
    if inferred > 0 {
        notes.push(format!(
            "{inferred} context switches are missing from the trace (some recordings lack switches out of the idle task); each was taken to happen at the thread's next event there, so those runs may start late"
        ));
    }

    let pids = inputs::read_tgids(run);
    let opts = ActivityOptions {
        thread_id_is_os_tid: options.thread_id_is_os_tid,
    };
    let index: HashMap<SpanRef, SpanIdx> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| (SpanRef::of(s), i as SpanIdx))
        .collect();
    let mut span_inputs: Vec<_> = spans
        .iter()
        .map(|s| inputs::span_input(s, &index, clock.as_ref(), opts))
        .collect();
    // Spans without SDK fields: placed from the kernel trace.
    let placements = if options.placement == PlacementMode::Sdk {
        Vec::new()
    } else {
        let processes = Processes {
            tgid_of: pids.clone(),
            scanned: inputs::read_process_scan(run, &mut notes),
        };
        let placing: Vec<PlacementSpan> = spans
            .iter()
            .zip(&span_inputs)
            .map(|(s, i)| inputs::placement_span(s, i))
            .collect();
        let mut placements = infer_placements(&model, arch, &placing, &processes);
        let bound = clock_offset_bound(&model, arch, &placing, &placements);
        if let Some(b) = &bound {
            notes.push(placements::offset_note(b));
        }
        // A mapping the trace says is off is corrected by it, and the spans
        // placed again with their corrected times.
        let correction = bound.as_ref().and_then(placements::offset_correction);
        if let (Some(delta), Some(map)) = (correction, clock.as_ref()) {
            let corrected = map.corrected(delta);
            span_inputs = spans
                .iter()
                .map(|s| inputs::span_input(s, &index, Some(&corrected), opts))
                .collect();
            let placing: Vec<PlacementSpan> = spans
                .iter()
                .zip(&span_inputs)
                .map(|(s, i)| inputs::placement_span(s, i))
                .collect();
            placements = infer_placements(&model, arch, &placing, &processes);
            notes.push(format!(
                "clock mapping corrected by {:+.1} µs from the requests placed on threads; spans placed again",
                delta as f64 / 1e3
            ));
            if let Some(b) = clock_offset_bound(&model, arch, &placing, &placements) {
                notes.push(format!(
                    "after the correction: {}",
                    placements::offset_note(&b)
                ));
            }
            clock = Some(corrected);
        }
        for (input, p) in span_inputs.iter_mut().zip(&placements) {
            let Some(p) = p else { continue };
            match p.method {
                PlacementMethod::Thread => {
                    input.holder = p.tid;
                    input.inferred = Some(InferredPlace::Thread);
                }
                PlacementMethod::Process => {
                    let mut threads: Vec<Tid> = pids
                        .iter()
                        .filter(|(_, &pid)| pid == p.pid)
                        .map(|(&t, _)| t)
                        .chain(
                            model
                                .threads()
                                .filter(|t| t.pid == Some(p.pid))
                                .map(|t| t.tid),
                        )
                        .collect();
                    threads.sort_unstable();
                    threads.dedup();
                    input.inferred = Some(InferredPlace::Process(threads));
                }
            }
        }
        placements
    };
    let inferred_tid = |i: usize, _: &Span| {
        placements
            .get(i)
            .and_then(|p| p.as_ref())
            .and_then(|p| p.tid)
            .and_then(|t| u32::try_from(t).ok())
    };
    let activity = ThreadActivity::from_spans_placed(&spans, clock.as_ref(), opts, inferred_tid);
    notes.extend(activity.notes.iter().cloned());
    let metas: Vec<SpanMeta> = spans.iter().map(inputs::span_meta).collect();
    phases.done(phase::SPANS);

    let trace_file = trace_path
        .strip_prefix(run)
        .unwrap_or(&trace_path)
        .display()
        .to_string();
    let staging = Staging::new(run)?;
    let kernel = KernelContext {
        model: &model,
        arch,
        pids: &pids,
    };
    let ctx = PathContext {
        model: &model,
        arch,
        spans: &metas,
    };
    let work = inputs::Work::new(&activity, &index);
    let span_label = |s: SpanIdx| {
        metas
            .get(s as usize)
            .map(|m| m.operation_label())
            .unwrap_or_default()
    };
    // The kernel tables need no spans: written on threads of their own while
    // the requests are analysed. Paths are written (and diagnosed, and
    // summarized) on a thread of their own too, in the order they come, so
    // their writing overlaps the next paths' computation.
    type Written = Result<(Vec<RequestRecord>, ChainIndex, Duration), Error>;
    let (states, syscalls, requests) = std::thread::scope(|scope| {
        let states = scope
            .spawn(|| tables::write_thread_states(&staging.file(analysis::THREAD_STATES), &kernel));
        let syscalls =
            scope.spawn(|| tables::write_syscalls(&staging.file(analysis::SYSCALLS), &kernel));
        // A few paths in flight at most: a path of a long request is
        // megabytes.
        let (path_tx, path_rx) = std::sync::mpsc::sync_channel::<RequestPath>(4);
        let writer = scope.spawn(|| -> Written {
            let diagnosis =
                DiagnosisContext::new(&model, arch, &span_inputs, &pids, &span_label, &work);
            let mut paths = CriticalPathWriter::create(&staging.file(analysis::CRITICAL_PATH))?;
            let mut records = Vec::new();
            // Every path, for the root causes through chains of requests
            // (a request's blockers may come later).
            let mut chains = ChainIndex::new();
            let mut diagnosing = Duration::ZERO;
            for path in path_rx {
                paths.write(&ctx, &path)?;
                // Diagnosed while the pieces are at hand.
                let clock = Instant::now();
                let d = diagnose(&diagnosis, &path);
                chains.add(&diagnosis, &path);
                diagnosing += clock.elapsed();
                let mut rec = RequestRecord::new(&model, arch, &lost, path, false);
                rec.diagnosis = d;
                records.push(rec);
            }
            paths.finish()?;
            Ok((records, chains, diagnosing))
        });
        let step = Step::CriticalPaths;
        progress.begin(step, None);
        let mut total_told = None;
        let analysis = analyze_requests(
            &model,
            &span_inputs,
            &work,
            &mut |done, total| {
                if total_told != Some(total) {
                    total_told = Some(total);
                    progress.total(step, total as u64);
                }
                progress.advance(step, done as u64);
            },
            &mut |path| {
                // A failed writer has hung up: its error is what is
                // reported, below.
                let _ = path_tx.send(path);
            },
        );
        drop(path_tx);
        progress.end(step);
        let requests = match writer.join() {
            Ok(records) => records.map(|r| (analysis, r)),
            Err(_) => Err(Error::WorkerPanicked {
                thread: "critical-path writer",
            }),
        };
        (states.join(), syscalls.join(), requests)
    });
    let joined = |x: std::thread::Result<Result<u64, deepspan_store::Error>>| match x {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::WorkerPanicked {
            thread: "table writer",
        }),
    };
    joined(states)?;
    joined(syscalls)?;
    let (analysis, (mut records, chains, diagnosing)) = requests?;
    phases.record(phase::DIAGNOSES_WITHIN_PATHS, diagnosing);
    phases.done(phase::PATHS);
    // Slowest first: the order of the tables and of the printout.
    records.sort_by_key(|r| {
        (
            std::cmp::Reverse(r.path.duration()),
            r.path.start,
            r.path.request,
        )
    });
    // Outliers of their operation.
    let key = |r: &RequestRecord| {
        let m = &metas[r.path.request as usize];
        (m.service.as_str(), m.operation.as_str())
    };
    let base = baselines(records.iter().map(|r| (key(r), r.path.duration())));
    let base: Vec<Option<u64>> = records.iter().map(|r| base.get(&key(r)).copied()).collect();
    for (r, b) in records.iter_mut().zip(base) {
        r.baseline_ns = b;
        r.anomalous = is_anomalous(r.path.duration(), b);
    }
    phases.done(phase::BASELINES);
    // Root causes, once every path is known: what the requests a request
    // waited for were held up by (those held up themselves).
    {
        let mut chains = chains;
        let usual = usual_durations(records.iter().map(|r| (key(r), r.path.duration())));
        for r in &records {
            if is_anomalous(r.path.duration(), usual.get(&key(r)).copied()) {
                chains.mark_held_up(r.path.request);
            }
        }
        let diagnosis =
            DiagnosisContext::new(&model, arch, &span_inputs, &pids, &span_label, &work);
        for r in &mut records {
            if let Some(d) = r.diagnosis.as_mut() {
                d.root = chains.root_cause(&diagnosis, r.path.request).map(Box::new);
            }
        }
    }
    phases.done(phase::ROOT_CAUSES);
    placements::sync_notes(
        &records,
        clock.as_ref(),
        options.thread_id_is_os_tid,
        &mut notes,
    );
    let operations: Vec<OperationSummary<(String, String)>> =
        aggregate(records.iter().map(|r| (&r.path, &r.summary)), |r| {
            let m = &metas[r as usize];
            (m.service.clone(), m.operation.clone())
        });
    let results = AnalysisResults {
        model: &model,
        arch,
        lost: &lost,
        lost_events,
        events,
        trace_file: &trace_file,
        spans: &metas,
        requests: &records,
        operations: &operations,
        notes: &notes,
    };
    // requests.json (the largest) and the diagnoses on a thread of their
    // own: each file ends with an fsync, which then overlaps with work.
    std::thread::scope(|scope| -> Result<(), Error> {
        let side = scope.spawn(|| -> Result<(), deepspan_store::Error> {
            json::write_requests_json(&staging.file(analysis::REQUESTS_JSON), &results)?;
            tables::write_diagnoses(&staging.file(analysis::DIAGNOSES), &results)?;
            Ok(())
        });
        let here = (|| -> Result<(), deepspan_store::Error> {
            tables::write_requests(&staging.file(analysis::REQUESTS), &results)?;
            tables::write_request_summaries(
                &staging.file(analysis::REQUEST_SUMMARY),
                &staging.file(analysis::REQUEST_SYSCALLS),
                &results,
            )?;
            tables::write_operation_summary(&staging.file(analysis::OPERATION_SUMMARY), &results)?;
            Ok(())
        })();
        // Joined before any error is returned: a scope left with a
        // panicked thread unjoined would panic itself.
        let side = side.join();
        here?;
        match side {
            Ok(r) => Ok(r?),
            Err(_) => Err(Error::WorkerPanicked {
                thread: "requests.json writer",
            }),
        }
    })?;
    placements::write_placements(
        &staging.file(analysis::PLACEMENTS_JSON),
        &spans,
        &placements,
    )?;
    let analysis_dir = staging.commit()?;
    phases.done(phase::TABLES);

    let count = |s: SyncSource| records.iter().filter(|r| r.path.sync == s).count();
    let placement_counts = PlacementCounts {
        exact: count(SyncSource::Exact),
        clock_mapped: count(SyncSource::ClockMapped),
        inferred: count(SyncSource::Inferred),
        process: count(SyncSource::Process),
        none: count(SyncSource::None),
    };
    let stats = AnalysisStats {
        events,
        lost_events,
        lost_ranges: model.lost_ranges().len(),
        threads: model.threads().count(),
        requests: analysis.requests,
        thread_paths: analysis.thread_paths,
        inferred_switches: inferred,
        wakeups_under_recorder: under_recorder,
        spans: spans.len(),
    };
    Ok(AnalysisOutcome {
        analysis_dir,
        spans: metas,
        requests: records,
        notes,
        stats,
        placements: placement_counts,
        phases: phases.done,
    })
}
