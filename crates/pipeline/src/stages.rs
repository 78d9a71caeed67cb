//! The stages of [`analyze_run`](crate::analyze_run), each a function from
//! what the stages before it produced to its own typed output:
//!
//! 1. [`open_inputs`]: the run folder → [`Inputs`]: the kernel trace opened
//!    (not yet decoded), the spans (each once; without their SDK fields
//!    under `--placement inferred`), the manifest's clock mapping and the
//!    recorder's threads.
//! 2. [`build_kernel`]: [`Inputs`] → [`Kernel`]: the kernel model decoded
//!    from the trace and the events lost doing it; [`kernel_notes`] then
//!    says what of the model the reader should know.
//! 3. [`place_spans`]: [`Inputs`] (consumed) and [`Kernel`] → [`Placed`]:
//!    every span as the request analysis reads it, on the kernel clock and
//!    on a thread or process (SDK fields, else inferred from the model,
//!    once more on a corrected clock when the placed requests say the
//!    mapping is off), and the span active on each thread.
//! 4. [`critical_paths`]: [`Kernel`] and [`Placed`] → [`Paths`]: every
//!    request's critical path, written to the staging folder and diagnosed
//!    as it comes, with the chains of requests between paths; the kernel
//!    tables are written beside it.
//! 5. [`rank_and_baseline`]: [`Paths::records`] sorted slowest first, each
//!    marked against its operation's baseline.
//! 6. [`root_causes`]: [`Paths`] → each diagnosis's root cause.
//! 7. [`write_tables`]: everything above and the notes (the last of them,
//!    on how the requests were placed, from `placements::sync_notes`) →
//!    `RUN/analysis/`, swapped in whole.
//! 8. [`placement_counts`] and [`stats`]: the counts of the
//!    [`AnalysisOutcome`](crate::AnalysisOutcome).
//!
//! Why this order: the spans are read before the model is built because
//! without spans there are no critical paths, and the model is then built
//! without its execution graph. Placement reads the model (which thread
//! ran when, which received what), and the critical paths need every span
//! placed. Baselines need every request's duration, so they wait for all
//! the paths; root causes need every path (a request's blocker may come
//! later) and the anomalies (which requests were held up). The tables come
//! last because they hold the notes, the last of which count the finished
//! records.
//!
//! Notes are appended to one list as the stages go, so their order is the
//! order of the stages.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

use deepspan_analysis::RequestRecord;
use deepspan_analysis::{
    aggregate, analyze_requests, arrivals, baselines, clock_offset_bound, diagnose,
    infer_placements, is_anomalous, usual_durations, Arch, ChainIndex, Containers,
    DiagnosisContext, InferredPlace, KernelModel, LostEvents, OffsetBound, OperationSummary,
    Placement, PlacementMethod, PlacementSpan, Processes, RequestAnalysis, RequestPath,
    ScannedProcess, SpanIdx, SpanInput, StateBuilder, SyncSource,
};
use deepspan_model::Tid;
use deepspan_run::analysis;
use deepspan_spans::activity::ActivityOptions;
use deepspan_spans::{ClockMap, Span, SpanRef, ThreadActivity};
use deepspan_store::kept::{KeepColumns, KeptAnalysis, KeptTable};
use deepspan_store::table::Column;
use deepspan_store::tables::{self, CriticalPathWriter, KernelContext, PathContext};
use deepspan_store::{json, AnalysisResults, SpanMeta, Staging};

use crate::inputs::{
    placement_span, read_process_scan, read_spans, read_tgids, span_input, span_meta, to_host_tids,
    Work,
};
use crate::{
    hosts, placements, AnalysisStats, AnalyzeOptions, Error, KernelTrace, PlacementCounts,
    PlacementMode, Progress, Step,
};

/// The run's inputs, opened: what [`build_kernel`] and [`place_spans`]
/// read.
pub(crate) struct Inputs {
    /// The kernel trace, opened, not yet decoded.
    pub trace: KernelTrace,
    /// The recorder's own threads, from the manifest (none without one).
    pub recorder_tids: Vec<Tid>,
    /// The spans, each (trace id, span id) once; their order is their
    /// [`SpanIdx`].
    pub spans: Vec<Span>,
    /// The manifest's wall → kernel clock mapping, when it has one.
    pub clock: Option<ClockMap>,
    /// The recorder's /proc scans (none without `processes.json`).
    pub scanned: Vec<ScannedProcess>,
}

/// Opens the kernel trace and reads the hosts' alignment notes, the spans
/// and the manifest's clock mapping. Under [`PlacementMode::Inferred`] the
/// spans lose their SDK fields here, so every later stage sees them as
/// spans without the SDK. A folder that is no run, or a recording that
/// must be recovered first, is refused.
pub(crate) fn open_inputs(
    run: &Path,
    options: &AnalyzeOptions,
    notes: &mut Vec<String>,
) -> Result<Inputs, Error> {
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
    let trace = KernelTrace::open_run(run)?;
    if let Some(hosts) = hosts::read_hosts(run)? {
        notes.extend(hosts::alignment_notes(&hosts));
    }
    let mut spans = read_spans(run, notes)?;
    let scan = read_process_scan(run, notes);
    if options.placement == PlacementMode::Inferred {
        // As if no span had the SDK: every one is placed from the trace.
        for s in &mut spans {
            s.sync = Default::default();
        }
    }
    to_host_tids(&mut spans, &scan, notes);
    let clock = match ClockMap::from_manifest(run) {
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
    let recorder_tids = deepspan_run::Manifest::load(run)
        .map(|m| m.recorder_tids)
        .unwrap_or_default();
    Ok(Inputs {
        trace,
        recorder_tids,
        spans,
        clock,
        scanned: scan.processes,
    })
}

/// The kernel model and what the later stages need of its trace.
pub(crate) struct Kernel {
    pub model: KernelModel,
    /// Events the trace reader counted as lost, per range.
    pub lost: LostEvents,
    pub arch: Arch,
    /// The kernel trace, relative to the run folder, as the tables name it.
    pub trace_file: String,
}

/// Decodes the kernel trace into the model; across hosts, also joins the
/// replies no packet matched to the server span's thread.
pub(crate) fn build_kernel(
    run: &Path,
    inputs: &Inputs,
    progress: &dyn Progress,
    notes: &mut Vec<String>,
) -> Result<Kernel, Error> {
    let arch = inputs.trace.arch();
    // The execution graph is for critical paths: without spans, none. No
    // analysis reads the interrupt handler runs.
    let builder = if inputs.spans.is_empty() {
        StateBuilder::without_graph()
    } else {
        StateBuilder::new()
    }
    .without_interrupt_history()
    .recorder_threads(&inputs.recorder_tids, arch);
    let (mut model, lost) = inputs.trace.build_model(builder, progress)?;
    notes.extend(inputs.trace.warnings());
    if matches!(inputs.trace, KernelTrace::Hosts { .. }) {
        let linked = model.link_replies(&hosts::remote_calls(&inputs.spans));
        if linked > 0 {
            notes.push(format!(
                "{linked} replies between hosts had no matched packet (record with --tcp-keys for those): each caller's wait was joined to the server span's thread at its end"
            ));
        }
    }
    let path = inputs.trace.path();
    let trace_file = path.strip_prefix(run).unwrap_or(path).display().to_string();
    Ok(Kernel {
        model,
        lost,
        arch,
        trace_file,
    })
}

/// Notes on what the model had to make up or leave out: events lost,
/// wake-ups from interrupts under the recorder or from other hosts'
/// threads, context switches missing from the trace.
pub(crate) fn kernel_notes(kernel: &Kernel, notes: &mut Vec<String>) {
    let model = &kernel.model;
    let lost_events = kernel.lost.total();
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
    let added = model.stats().idle_switches_added;
    if added > 0 {
        notes.push(format!(
            "{added} switches out of the idle task that the trace lost were taken from the recorder's capture of them (kernel/idle_switches.tsv)"
        ));
    }
}

/// The spans, placed: what the critical paths and the tables read of them.
pub(crate) struct Placed {
    /// The spans as read, indexed by [`SpanIdx`].
    pub spans: Vec<Span>,
    /// What the tables keep of each span.
    pub metas: Vec<SpanMeta>,
    /// Each span's [`SpanIdx`].
    pub index: HashMap<SpanRef, SpanIdx>,
    /// Each span as the request analysis reads it, with its placement.
    pub span_inputs: Vec<SpanInput>,
    /// Each span's placement from the kernel trace (empty under
    /// [`PlacementMode::Sdk`]).
    pub placements: Vec<Option<Placement>>,
    /// The clock mapping the spans were placed with: the manifest's, or
    /// that corrected by the placed requests.
    pub clock: Option<ClockMap>,
    /// Thread → process, from the recorder's saved tgids.
    pub pids: HashMap<Tid, Tid>,
    /// The span active on each thread (its notes already taken).
    pub activity: ThreadActivity,
    /// Each process's container, which culprits name.
    pub containers: Containers,
}

/// Places the spans on the kernel clock and on threads: by their SDK
/// fields, else (unless [`PlacementMode::Sdk`]) from the kernel trace,
/// correcting the clock mapping by the placed requests when they say it is
/// off ([`place_correcting_clock`]).
pub(crate) fn place_spans(
    run: &Path,
    options: &AnalyzeOptions,
    inputs: Inputs,
    kernel: &Kernel,
    notes: &mut Vec<String>,
) -> Placed {
    let Inputs {
        spans,
        mut clock,
        scanned,
        ..
    } = inputs;
    let pids = read_tgids(run);
    let containers = Containers::new(&kernel.model, &scanned, |tid| pids.get(&tid).copied());
    let opts = ActivityOptions {
        thread_id_is_os_tid: options.thread_id_is_os_tid,
    };
    let index: HashMap<SpanRef, SpanIdx> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| (SpanRef::of(s), i as SpanIdx))
        .collect();
    let (mut span_inputs, placements) = if options.placement == PlacementMode::Sdk {
        (
            span_inputs(&spans, &index, clock.as_ref(), opts),
            Vec::new(),
        )
    } else {
        let processes = Processes {
            tgid_of: pids.clone(),
            scanned,
        };
        let placing = place_correcting_clock(&mut clock, notes, |clock| {
            let inputs = span_inputs(&spans, &index, clock, opts);
            infer_on(kernel, &processes, &spans, inputs)
        });
        (placing.span_inputs, placing.placements)
    };
    apply_placements(&mut span_inputs, &placements, |pid| {
        process_threads(pid, &pids, kernel.model.threads().map(|t| (t.tid, t.pid)))
    });
    set_arrivals(&kernel.model, &spans, &mut span_inputs);
    let inferred_tid = |i: usize, _: &Span| {
        placements
            .get(i)
            .and_then(|p| p.as_ref())
            .and_then(|p| p.tid)
            .and_then(|t| u32::try_from(t).ok())
    };
    let activity = ThreadActivity::from_spans_placed(&spans, clock.as_ref(), opts, inferred_tid);
    notes.extend(activity.notes.iter().cloned());
    let metas = spans.iter().map(span_meta).collect();
    Placed {
        spans,
        metas,
        index,
        span_inputs,
        placements,
        clock,
        pids,
        activity,
        containers,
    }
}

/// Gives each server span the arrival of its request at the host
/// ([`arrivals`]), from its connection and its placed times.
fn set_arrivals(model: &KernelModel, spans: &[Span], span_inputs: &mut [SpanInput]) {
    let connections: Vec<PlacementSpan> = spans
        .iter()
        .zip(span_inputs.iter())
        .map(|(s, i)| placement_span(s, i))
        .collect();
    for (input, arrival) in span_inputs.iter_mut().zip(arrivals(model, &connections)) {
        input.arrival = arrival;
    }
}

/// Every span as the request analysis reads it, its times mapped through
/// `clock` when it has no deepspan times.
fn span_inputs(
    spans: &[Span],
    index: &HashMap<SpanRef, SpanIdx>,
    clock: Option<&ClockMap>,
    opts: ActivityOptions,
) -> Vec<SpanInput> {
    spans
        .iter()
        .map(|s| span_input(s, index, clock, opts))
        .collect()
}

/// One placement of the spans from the kernel trace.
struct Placing {
    /// The spans' inputs the placement was made from (placements not yet
    /// applied).
    span_inputs: Vec<SpanInput>,
    placements: Vec<Option<Placement>>,
    /// What the requests placed on threads say of the clock mapping the
    /// inputs' times went through.
    bound: Option<OffsetBound>,
}

/// Places the spans from the kernel trace (`place`, given the clock mapping
/// their times go through) and checks the mapping against the requests
/// placed on threads. A mapping they say is off is corrected by them:
/// `clock` becomes the corrected mapping, and the spans are placed again
/// with their corrected times.
fn place_correcting_clock(
    clock: &mut Option<ClockMap>,
    notes: &mut Vec<String>,
    place: impl Fn(Option<&ClockMap>) -> Placing,
) -> Placing {
    let placing = place(clock.as_ref());
    if let Some(b) = &placing.bound {
        notes.push(placements::offset_note(b));
    }
    let correction = placing
        .bound
        .as_ref()
        .and_then(placements::offset_correction);
    let (Some(delta), Some(map)) = (correction, clock.as_ref()) else {
        return placing;
    };
    let corrected = map.corrected(delta);
    let placing = place(Some(&corrected));
    notes.push(format!(
        "clock mapping corrected by {:+.1} µs from the requests placed on threads; spans placed again",
        delta as f64 / 1e3
    ));
    if let Some(b) = &placing.bound {
        notes.push(format!(
            "after the correction: {}",
            placements::offset_note(b)
        ));
    }
    *clock = Some(corrected);
    placing
}

/// Places the spans without SDK fields from the kernel trace, and bounds
/// the offset of the clock mapping by the requests it placed on threads.
fn infer_on(
    kernel: &Kernel,
    processes: &Processes,
    spans: &[Span],
    span_inputs: Vec<SpanInput>,
) -> Placing {
    let placing: Vec<PlacementSpan> = spans
        .iter()
        .zip(&span_inputs)
        .map(|(s, i)| placement_span(s, i))
        .collect();
    let placements = infer_placements(&kernel.model, kernel.arch, &placing, processes);
    let bound = clock_offset_bound(&kernel.model, kernel.arch, &placing, &placements);
    Placing {
        span_inputs,
        placements,
        bound,
    }
}

/// Gives each span placed from the kernel trace its place: a span placed
/// on a thread holds that thread, one placed on its process as a whole
/// gets the process's threads (`threads_of` its pid). `placements[i]` is
/// span `i`'s; spans without one are left as they are.
pub(crate) fn apply_placements(
    span_inputs: &mut [SpanInput],
    placements: &[Option<Placement>],
    threads_of: impl Fn(Tid) -> Vec<Tid>,
) {
    // Each process's threads are found once: finding them scans every
    // thread of the host.
    let mut by_process: HashMap<Tid, Vec<Tid>> = HashMap::new();
    for (input, p) in span_inputs.iter_mut().zip(placements) {
        let Some(p) = p else { continue };
        match p.method {
            PlacementMethod::Thread => {
                input.holder = p.tid;
                input.inferred = Some(InferredPlace::Thread);
            }
            PlacementMethod::Process => {
                let threads = by_process.entry(p.pid).or_insert_with(|| threads_of(p.pid));
                input.inferred = Some(InferredPlace::Process(threads.clone()));
            }
        }
    }
}

/// The threads of process `pid`, sorted, each once: those the recorder
/// saved the tgid of (`tgids`, thread → process) and those the model
/// knows in it (`model_threads`, (thread, its process if known)).
pub(crate) fn process_threads(
    pid: Tid,
    tgids: &HashMap<Tid, Tid>,
    model_threads: impl Iterator<Item = (Tid, Option<Tid>)>,
) -> Vec<Tid> {
    let mut threads: Vec<Tid> = tgids
        .iter()
        .filter(|(_, &p)| p == pid)
        .map(|(&t, _)| t)
        .chain(
            model_threads
                .filter(|&(_, p)| p == Some(pid))
                .map(|(t, _)| t),
        )
        .collect();
    threads.sort_unstable();
    threads.dedup();
    threads
}

/// The requests as the critical paths left them; [`rank_and_baseline`] and
/// [`root_causes`] complete their records.
pub(crate) struct Paths {
    /// The span each thread works for, as span indices.
    pub work: Work,
    /// The request analysis' counts.
    pub analysis: RequestAnalysis,
    /// Every request, its path written and diagnosed (its pieces not
    /// kept), in the order the paths came.
    pub records: Vec<RequestRecord>,
    /// Every path's waits on other requests, for the root causes.
    pub chains: ChainIndex,
    /// Time spent diagnosing, within the paths' time.
    pub diagnosing: Duration,
    /// The critical-path and system-call tables' kept columns, when asked
    /// for.
    pub kept: Option<(KeptTable, KeptTable)>,
}

/// Computes every request's critical path on this thread and hands each to
/// a writer thread, which writes it to the staging folder, diagnoses it and
/// keeps its record, in the order they come, so that writing overlaps the
/// next paths' computation. The kernel tables need no spans: they are
/// written on threads of their own meanwhile.
pub(crate) fn critical_paths(
    staging: &Staging,
    kernel: &Kernel,
    placed: &Placed,
    keep: Option<KeepColumns>,
    progress: &dyn Progress,
) -> Result<Paths, Error> {
    let kernel_tables = KernelContext {
        model: &kernel.model,
        arch: kernel.arch,
        pids: &placed.pids,
    };
    let work = Work::new(&placed.activity, &placed.index);
    let (states, syscalls, requests) = std::thread::scope(|scope| {
        let states = scope.spawn(|| {
            tables::write_thread_states(
                &staging.file(analysis::THREAD_STATES),
                &staging.file(analysis::STATE_HISTORY),
                &kernel_tables,
            )
        });
        let syscalls = scope.spawn(|| {
            tables::write_syscalls(
                &staging.file(analysis::SYSCALLS),
                &kernel_tables,
                keep.map(|k| k.syscalls),
            )
        });
        // A few paths in flight at most: a path of a long request is
        // megabytes.
        let (path_tx, path_rx) = std::sync::mpsc::sync_channel::<RequestPath>(4);
        let writer = scope.spawn(|| {
            write_paths(
                path_rx,
                staging,
                kernel,
                placed,
                &work,
                keep.map(|k| k.critical_path),
            )
        });
        let analysis = compute_paths(kernel, placed, &work, progress, path_tx);
        let requests = match writer.join() {
            Ok(written) => written.map(|w| (analysis, w)),
            Err(_) => Err(Error::WorkerPanicked {
                thread: "critical-path writer",
            }),
        };
        (states.join(), syscalls.join(), requests)
    });
    table_written(states)?;
    let (_, kept_syscalls) = table_written(syscalls)?;
    let (analysis, written) = requests?;
    Ok(Paths {
        work,
        analysis,
        records: written.records,
        chains: written.chains,
        diagnosing: written.diagnosing,
        kept: written.kept.zip(kept_syscalls),
    })
}

/// A kernel table writer's result, its panic an error.
fn table_written<T>(
    joined: std::thread::Result<Result<T, deepspan_store::Error>>,
) -> Result<T, Error> {
    match joined {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::WorkerPanicked {
            thread: "table writer",
        }),
    }
}

/// Runs the request analysis, sending each path to the writer (`paths`)
/// and telling `progress` how far it is.
fn compute_paths(
    kernel: &Kernel,
    placed: &Placed,
    work: &Work,
    progress: &dyn Progress,
    paths: SyncSender<RequestPath>,
) -> RequestAnalysis {
    let step = Step::CriticalPaths;
    progress.begin(step, None);
    let mut total_told = None;
    let analysis = analyze_requests(
        &kernel.model,
        &placed.span_inputs,
        work,
        &mut |done, total| {
            if total_told != Some(total) {
                total_told = Some(total);
                progress.total(step, total as u64);
            }
            progress.advance(step, done as u64);
        },
        &mut |path| {
            // A failed writer has hung up: its error is what is
            // reported, by whoever joins it.
            let _ = paths.send(path);
        },
    );
    drop(paths);
    progress.end(step);
    analysis
}

/// What the critical-path writer leaves.
struct Written {
    records: Vec<RequestRecord>,
    chains: ChainIndex,
    diagnosing: Duration,
    /// The table's kept columns, when asked for.
    kept: Option<KeptTable>,
}

/// The critical-path writer: writes each path that comes to the
/// `critical_path` table, diagnoses it while its pieces are at hand, adds
/// it to the chains of requests and keeps its record (without the pieces).
fn write_paths(
    paths: Receiver<RequestPath>,
    staging: &Staging,
    kernel: &Kernel,
    placed: &Placed,
    work: &Work,
    keep: Option<&[Column]>,
) -> Result<Written, Error> {
    let label = span_label(&placed.metas);
    let diagnosis = DiagnosisContext::new(
        &kernel.model,
        kernel.arch,
        &placed.span_inputs,
        &placed.pids,
        &label,
        work,
    )
    .with_containers(placed.containers.clone());
    let ctx = PathContext {
        model: &kernel.model,
        arch: kernel.arch,
        spans: &placed.metas,
    };
    let mut table = CriticalPathWriter::create(&staging.file(analysis::CRITICAL_PATH))?;
    if let Some(columns) = keep {
        table.keep(columns);
    }
    let mut queue_table = CriticalPathWriter::create(&staging.file(analysis::QUEUE_PATH))?;
    let mut records = Vec::new();
    // Every path, for the root causes through chains of requests (a
    // request's blockers may come later).
    let mut chains = ChainIndex::new();
    let mut diagnosing = Duration::ZERO;
    for path in paths {
        let path_rows = table.write(&ctx, &path)?;
        let queue = path.queue_path();
        let queue_rows = match &queue {
            Some(q) => Some(queue_table.write(&ctx, q)?),
            None => None,
        };
        let clock = Instant::now();
        let d = diagnose(&diagnosis, &path);
        let queue_diagnosis = queue.as_ref().and_then(|q| diagnose(&diagnosis, q));
        chains.add(&diagnosis, &path);
        diagnosing += clock.elapsed();
        let mut rec = RequestRecord::new(&kernel.model, kernel.arch, &kernel.lost, path, false);
        rec.diagnosis = d;
        rec.path_rows = Some(path_rows);
        if let Some(q) = rec.queue.as_mut() {
            q.diagnosis = queue_diagnosis;
            q.path_rows = queue_rows;
        }
        records.push(rec);
    }
    let (_, kept) = table.finish()?;
    queue_table.finish()?;
    Ok(Written {
        records,
        chains,
        diagnosing,
        kept,
    })
}

/// `[service] operation` of a span, for the diagnoses' headlines.
fn span_label(metas: &[SpanMeta]) -> impl Fn(SpanIdx) -> String + Sync + '_ {
    move |s| {
        metas
            .get(s as usize)
            .map(|m| m.operation_label())
            .unwrap_or_default()
    }
}

/// The (service, operation) a request is one of: what its duration is
/// compared within.
fn operation_of<'m>(metas: &'m [SpanMeta], r: &RequestRecord) -> (&'m str, &'m str) {
    let m = &metas[r.path.request as usize];
    (m.service.as_str(), m.operation.as_str())
}

/// Sorts the requests slowest first (the order of the tables and of the
/// printout) and marks each against its operation's baseline: outliers of
/// their operation are anomalous.
pub(crate) fn rank_and_baseline(records: &mut [RequestRecord], metas: &[SpanMeta]) {
    records.sort_by_key(|r| {
        (
            std::cmp::Reverse(r.path.duration()),
            r.path.start,
            r.path.request,
        )
    });
    let key = |r: &RequestRecord| operation_of(metas, r);
    let base = baselines(records.iter().map(|r| (key(r), r.path.duration())));
    let base: Vec<Option<u64>> = records.iter().map(|r| base.get(&key(r)).copied()).collect();
    for (r, b) in records.iter_mut().zip(base) {
        r.baseline_ns = b;
        r.anomalous = is_anomalous(r.path.duration(), b);
    }
}

/// Gives each diagnosis its root cause, once every path is known: what the
/// requests a request waited for were held up by (those held up
/// themselves: slow for their operation).
pub(crate) fn root_causes(paths: &mut Paths, kernel: &Kernel, placed: &Placed) {
    let key = |r: &RequestRecord| operation_of(&placed.metas, r);
    let usual = usual_durations(paths.records.iter().map(|r| (key(r), r.path.duration())));
    for r in &paths.records {
        if is_anomalous(r.path.duration(), usual.get(&key(r)).copied()) {
            paths.chains.mark_held_up(r.path.request);
        }
    }
    // Built again, not shared with the critical-path writer: a
    // `DiagnosisContext` is neither `Send` (its `work` is a
    // `&dyn ThreadWork`, which is not `Sync`) nor `Sync` (its scratch
    // buffer is a `RefCell`), so one context cannot serve that thread and
    // this one. Building it is a pass over the spans and the model's
    // threads.
    let label = span_label(&placed.metas);
    let diagnosis = DiagnosisContext::new(
        &kernel.model,
        kernel.arch,
        &placed.span_inputs,
        &placed.pids,
        &label,
        &paths.work,
    )
    .with_containers(placed.containers.clone());
    for r in &mut paths.records {
        if let Some(d) = r.diagnosis.as_mut() {
            d.root = paths
                .chains
                .root_cause(&diagnosis, r.path.request)
                .map(Box::new);
        }
    }
}

/// Writes the request tables, `requests.json` and `placements.json` into
/// the staging folder (beside the kernel and critical-path tables) and
/// swaps it in as `RUN/analysis/`, which it returns; with the tables kept
/// by [`critical_paths`], also the results kept in memory.
pub(crate) fn write_tables(
    staging: Staging,
    kernel: &Kernel,
    placed: &Placed,
    records: &[RequestRecord],
    notes: &[String],
    kept: Option<(KeptTable, KeptTable)>,
) -> Result<(PathBuf, Option<KeptAnalysis>), Error> {
    let operations: Vec<OperationSummary<(String, String)>> =
        aggregate(records.iter().map(|r| (&r.path, &r.summary)), |r| {
            let m = &placed.metas[r as usize];
            (m.service.clone(), m.operation.clone())
        });
    let results = AnalysisResults {
        model: &kernel.model,
        arch: kernel.arch,
        lost: &kernel.lost,
        lost_events: kernel.lost.total(),
        events: kernel.model.stats().events,
        trace_file: &kernel.trace_file,
        spans: &placed.metas,
        requests: records,
        operations: &operations,
        containers: &placed.containers,
        notes,
    };
    write_request_tables(&staging, &results, || {
        placements::write_placements(
            &staging.file(analysis::PLACEMENTS_JSON),
            &placed.spans,
            &placed.placements,
        )
    })?;
    let kept = kept.map(|(critical_path, syscalls)| KeptAnalysis {
        requests: json::request_entries(&results),
        critical_path,
        syscalls,
        containers: placed.containers.clone(),
    });
    Ok((staging.commit()?, kept))
}

/// The tables of the requests, then `and_then` (`placements.json`).
/// `requests.json` (the largest: about as long to write as the rest
/// together) is written on a thread of its own; each file ends with an
/// fsync, which then overlaps with work.
fn write_request_tables(
    staging: &Staging,
    results: &AnalysisResults,
    and_then: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    std::thread::scope(|scope| {
        let side = scope
            .spawn(|| json::write_requests_json(&staging.file(analysis::REQUESTS_JSON), results));
        let here = (|| -> Result<(), Error> {
            tables::write_diagnoses(&staging.file(analysis::DIAGNOSES), results)?;
            tables::write_requests(&staging.file(analysis::REQUESTS), results)?;
            tables::write_request_summaries(
                &staging.file(analysis::REQUEST_SUMMARY),
                &staging.file(analysis::REQUEST_SYSCALLS),
                results,
            )?;
            tables::write_operation_summary(&staging.file(analysis::OPERATION_SUMMARY), results)?;
            tables::write_containers(&staging.file(analysis::CONTAINERS), results.containers)?;
            and_then()
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
    })
}

/// How the requests were placed, from their `sync`.
pub(crate) fn placement_counts(records: &[RequestRecord]) -> PlacementCounts {
    let count = |s: SyncSource| records.iter().filter(|r| r.path.sync == s).count();
    PlacementCounts {
        exact: count(SyncSource::Exact),
        clock_mapped: count(SyncSource::ClockMapped),
        inferred: count(SyncSource::Inferred),
        process: count(SyncSource::Process),
        none: count(SyncSource::None),
    }
}

/// The model's and the request analysis' counts.
pub(crate) fn stats(kernel: &Kernel, placed: &Placed, paths: &Paths) -> AnalysisStats {
    let model = &kernel.model;
    AnalysisStats {
        events: model.stats().events,
        lost_events: kernel.lost.total(),
        lost_ranges: model.lost_ranges().len(),
        threads: model.threads().count(),
        requests: paths.analysis.requests,
        thread_paths: paths.analysis.thread_paths,
        inferred_switches: model.stats().inferred_switches,
        wakeups_under_recorder: model.stats().wakeups_under_recorder,
        spans: placed.spans.len(),
    }
}

#[cfg(test)]
mod on_a_real_trace;

#[cfg(test)]
mod tests {
    use super::*;

    fn record(request: SpanIdx, start: u64, duration_ms: u64) -> RequestRecord {
        RequestRecord {
            path: deepspan_analysis::RequestPath {
                request,
                start,
                end: start + duration_ms * 1_000_000,
                sync: deepspan_analysis::SyncSource::Exact,
                home: Vec::new(),
                pieces: Vec::new(),
                arrival: None,
                queue: Vec::new(),
                truncated: false,
            },
            summary: deepspan_analysis::RequestSummary::default(),
            totals: deepspan_analysis::RequestTotals::default(),
            lost_events: 0,
            diagnosis: None,
            baseline_ns: None,
            anomalous: false,
            queue: None,
            path_rows: None,
        }
    }

    #[test]
    fn requests_are_ranked_slowest_first_and_judged_against_their_operation() {
        let meta = |operation: &str| SpanMeta {
            service: "shop".into(),
            operation: operation.into(),
            ..SpanMeta::default()
        };
        // Five requests of one operation (a baseline: their median, 30
        // ms), two of another (too few for one).
        let mut metas = vec![meta("GET /a"); 5];
        metas.extend(vec![meta("GET /b"); 2]);
        let mut records = vec![
            record(0, 0, 10),
            record(1, 5, 200),
            record(2, 9, 30),
            record(3, 20, 40),
            record(4, 30, 20),
            record(5, 0, 500),
            record(6, 1, 1),
        ];
        rank_and_baseline(&mut records, &metas);
        let order: Vec<SpanIdx> = records.iter().map(|r| r.path.request).collect();
        assert_eq!(order, [5, 1, 3, 2, 4, 0, 6]);
        for r in &records {
            // Only the 200 ms one is over twice its baseline; the 500 ms
            // one has none to be judged against.
            let expected = match r.path.request {
                0..=4 => (Some(30_000_000), r.path.request == 1),
                _ => (None, false),
            };
            assert_eq!(
                (r.baseline_ns, r.anomalous),
                expected,
                "request {}",
                r.path.request
            );
        }
    }

    fn placed(method: PlacementMethod, pid: Tid, tid: Option<Tid>) -> Option<Placement> {
        Some(Placement {
            method,
            pid,
            tid,
            confidence: 0.9,
            evidence: vec!["test".to_string()],
        })
    }

    fn sdk_holder(tid: Tid) -> SpanInput {
        SpanInput {
            holder: Some(tid),
            ..SpanInput::default()
        }
    }

    #[test]
    fn placements_become_the_spans_holders_and_processes() {
        let mut inputs = vec![
            SpanInput::default(),
            sdk_holder(7),
            SpanInput::default(),
            sdk_holder(8),
        ];
        let placements = vec![
            placed(PlacementMethod::Thread, 40, Some(42)),
            None,
            placed(PlacementMethod::Process, 50, None),
        ];
        let asked = std::cell::RefCell::new(Vec::new());
        apply_placements(&mut inputs, &placements, |pid| {
            asked.borrow_mut().push(pid);
            vec![pid + 1, pid + 2]
        });
        assert_eq!(asked.into_inner(), vec![50]);
        assert_eq!(inputs[0].holder, Some(42));
        assert_eq!(inputs[0].inferred, Some(InferredPlace::Thread));
        // Not placed: as the SDK left it.
        assert_eq!(inputs[1], sdk_holder(7));
        // On its process: its threads, no holder.
        assert_eq!(inputs[2].holder, None);
        assert_eq!(
            inputs[2].inferred,
            Some(InferredPlace::Process(vec![51, 52]))
        );
        // Beyond the placements (none under `--placement sdk`): untouched.
        assert_eq!(inputs[3], sdk_holder(8));
    }

    #[test]
    fn a_thread_placement_replaces_the_holder() {
        let mut inputs = vec![sdk_holder(7)];
        let placements = vec![placed(PlacementMethod::Thread, 40, Some(42))];
        apply_placements(&mut inputs, &placements, |_| unreachable!());
        assert_eq!(inputs[0].holder, Some(42));
    }

    fn placing(bound: Option<OffsetBound>) -> Placing {
        Placing {
            span_inputs: Vec::new(),
            placements: Vec::new(),
            bound,
        }
    }

    fn bound(lower_ns: i64, upper_ns: i64, agreeing: usize, of: usize) -> Option<OffsetBound> {
        Some(OffsetBound {
            lower_ns,
            upper_ns,
            agreeing,
            of,
        })
    }

    fn samples() -> ClockMap {
        ClockMap::new(&[(1_000_000, 500), (2_000_000, 1_000_500)]).unwrap()
    }

    /// Places with the bounds given, in turn; returns what each placement
    /// saw wall time 1.5 ms mapped to, and the placement.
    fn place_with(
        bounds: Vec<Option<OffsetBound>>,
        clock: &mut Option<ClockMap>,
        notes: &mut Vec<String>,
    ) -> (Vec<Option<u64>>, Placing) {
        let seen = std::cell::RefCell::new(Vec::new());
        let bounds = std::cell::RefCell::new(bounds.into_iter());
        let placed = place_correcting_clock(clock, notes, |c| {
            seen.borrow_mut().push(c.map(|c| c.wall_to_mono(1_500_000)));
            placing(bounds.borrow_mut().next().expect("placed too often"))
        });
        (seen.into_inner(), placed)
    }

    #[test]
    fn an_offset_mapping_is_corrected_and_the_spans_placed_again() {
        let mut clock = Some(samples());
        let mut notes = Vec::new();
        let (seen, placed) = place_with(
            vec![bound(36_000, 57_000, 71, 80), bound(-3_000, 4_000, 80, 80)],
            &mut clock,
            &mut notes,
        );
        assert_eq!(seen, vec![Some(500_500), Some(547_000)]);
        assert_eq!(clock.unwrap().wall_to_mono(1_500_000), 547_000);
        // The placement kept is the second one.
        assert_eq!(placed.bound, bound(-3_000, 4_000, 80, 80));
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("off by at least 36.0 µs"), "{notes:?}");
        assert!(notes[1].starts_with("clock mapping corrected by +46.5 µs"));
        assert!(notes[2].starts_with("after the correction: "));
        assert!(notes[2].contains("consistent with the mapping as is"));
    }

    #[test]
    fn a_consistent_or_missing_mapping_is_placed_once() {
        let mut clock = Some(samples());
        let mut notes = Vec::new();
        let (seen, _) = place_with(vec![bound(-3_000, 15_000, 80, 80)], &mut clock, &mut notes);
        assert_eq!(seen, vec![Some(500_500)]);
        assert_eq!(clock.unwrap().wall_to_mono(1_500_000), 500_500);
        assert_eq!(notes.len(), 1);

        // Off, but no mapping to correct.
        let mut clock = None;
        let mut notes = Vec::new();
        let (seen, _) = place_with(vec![bound(36_000, 57_000, 71, 80)], &mut clock, &mut notes);
        assert_eq!(seen, vec![None]);
        assert!(clock.is_none());
        assert_eq!(notes.len(), 1);

        // No request placed on a thread: nothing said of the mapping.
        let mut clock = Some(samples());
        let mut notes = Vec::new();
        let (seen, _) = place_with(vec![None], &mut clock, &mut notes);
        assert_eq!(seen.len(), 1);
        assert!(notes.is_empty());
    }

    #[test]
    fn a_process_has_the_saved_and_the_modelled_threads_once_each() {
        let tgids: HashMap<Tid, Tid> = [(12, 10), (11, 10), (21, 20), (10, 10)].into();
        let model = [(12, Some(10)), (15, Some(10)), (16, None), (22, Some(20))];
        assert_eq!(
            process_threads(10, &tgids, model.into_iter()),
            vec![10, 11, 12, 15]
        );
        assert_eq!(process_threads(20, &tgids, model.into_iter()), vec![21, 22]);
        assert_eq!(
            process_threads(30, &tgids, model.into_iter()),
            Vec::<Tid>::new()
        );
    }
}
