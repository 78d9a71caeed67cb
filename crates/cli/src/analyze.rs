//! `deepspan analyze RUN` and `deepspan report RUN --request ID`: argument
//! parsing, progress and output formatting over `deepspan_analysis`
//! (critical paths) and `deepspan_store` (tables).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use deepspan_analysis::{
    aggregate, analyze_requests, baselines, clock_offset_bound, diagnose, infer_placements,
    is_anomalous, ActivationInput, ChainIndex, DiagnosisContext, FastMap, InferredPlace,
    OffsetBound, OperationSummary, Placement, PlacementMethod, PlacementSpan, Processes,
    RequestPath, ScannedProcess, SpanIdx, SpanInput, StateBuilder, SyncSource, ThreadWork,
};
use deepspan_model::Tid;
use deepspan_spans::activity::ActivityOptions;
use deepspan_spans::clock::span_mono_exact;
use deepspan_spans::{ClockMap, Span, SpanKind, SpanRef, ThreadActivity};
use deepspan_store::report::Report;
use deepspan_store::tables::{self, thread_label, CriticalPathWriter, KernelContext, PathContext};
use deepspan_store::{json, AnalysisResults, RequestRecord, SpanMeta, Staging};

use crate::kernel_input::KernelTrace;
use crate::progress;

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan analyze run1
  deepspan analyze run1 --top 20
  duckdb -c \"select * from 'run1/analysis/request_summary.parquet' limit 10\"")]
pub struct AnalyzeArgs {
    /// Run folder (from `deepspan record` or `deepspan import`).
    run: PathBuf,
    /// Read the `thread.id` span attribute as the OS thread id for spans
    /// without deepspan fields (true only for producers known to put the
    /// kernel tid there; most SDKs put a language-managed id).
    #[arg(long)]
    thread_id_is_os_tid: bool,
    /// How many of the slowest requests to print.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// How spans are placed on threads: `auto` (deepspan SDK fields where
    /// present, else inferred from the kernel trace), `sdk` (SDK fields
    /// only; spans without them have no kernel path), `inferred` (SDK
    /// fields ignored: every span placed from the kernel trace, to compare).
    #[arg(long, value_enum, default_value_t = PlacementMode::Auto)]
    placement: PlacementMode,
}

/// `analyze --placement`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PlacementMode {
    Auto,
    Sdk,
    Inferred,
}

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan report run1 --request 55cb429799d4a01b
  deepspan report run1 --request 3da11e6e4ce519e0c973ccd50c7fa4b2 --format json")]
pub struct ReportArgs {
    /// Run folder, analysed with `deepspan analyze`.
    run: PathBuf,
    /// Span id or trace id (hex) of the request.
    #[arg(long, value_name = "ID")]
    request: String,
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    format: ReportFormat,
    /// Text format: most critical-path pieces to list (0 = all).
    #[arg(long, default_value_t = 60)]
    max_pieces: usize,
    /// Text format: list blocking requests one by one, not grouped by
    /// `[service] operation`.
    #[arg(long)]
    detail: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    Text,
    Json,
}

/// Prints how long each phase took when `DEEPSPAN_TIMINGS` is set (for
/// benchmarks and profiling).
struct Timings {
    on: bool,
    last: std::time::Instant,
    last_cpu: f64,
}

/// CPU time (user + system) of the whole process so far, in seconds: with
/// the wall time it says how many cores a phase kept busy.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(ru.ru_utime) + s(ru.ru_stime)
}

impl Timings {
    fn new() -> Timings {
        let on = std::env::var_os("DEEPSPAN_TIMINGS").is_some();
        Timings {
            on,
            last: std::time::Instant::now(),
            last_cpu: if on { process_cpu_s() } else { 0.0 },
        }
    }

    fn phase(&mut self, name: &str) {
        if self.on {
            // Resident memory now and at its peak, from the kernel's account.
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let field = |key: &str| {
                status
                    .lines()
                    .find(|l| l.starts_with(key))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
                    .map_or(0, |kb| kb / 1024)
            };
            let cpu = process_cpu_s();
            eprintln!(
                "deepspan: timing: {name}: {:.3} s, CPU {:.3} s (RSS {} MiB, peak {} MiB)",
                self.last.elapsed().as_secs_f64(),
                cpu - self.last_cpu,
                field("VmRSS:"),
                field("VmHWM:")
            );
            self.last_cpu = cpu;
        }
        self.last = std::time::Instant::now();
    }
}

pub fn run(args: AnalyzeArgs) -> Result<()> {
    let mut timings = Timings::new();
    let run = &args.run;
    if !run.is_dir() {
        bail!("{} is not a run folder", run.display());
    }
    crate::record::recover_if_unfinished(run)?;
    let kernel_trace = KernelTrace::open_run(run)?;
    let trace_path = kernel_trace.path().to_path_buf();
    let arch = kernel_trace.arch();
    let mut notes: Vec<String> = Vec::new();

    // Spans first: they decide whether the model needs its graph.
    let mut spans = read_spans(run, &mut notes)?;
    if args.placement == PlacementMode::Inferred {
        // As if no span had the SDK: every one is placed from the trace.
        for s in &mut spans {
            s.sync = Default::default();
        }
    }
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
    // The execution graph is for critical paths: without spans, none. No
    // analysis reads the interrupt handler runs.
    let recorder_tids = deepspan_record::Manifest::load(run)
        .map(|m| m.recorder_tids)
        .unwrap_or_default();
    let builder = if spans.is_empty() {
        StateBuilder::without_graph()
    } else {
        StateBuilder::new()
    }
    .without_interrupt_history()
    .recorder_threads(&recorder_tids, arch);
    let (model, lost) = kernel_trace.build_model(builder)?;
    notes.extend(kernel_trace.warnings());
    timings.phase("decode and kernel model");
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
    let inferred = model.stats().inferred_switches;
    if inferred > 0 {
        notes.push(format!(
            "{inferred} context switches are missing from the trace (some recordings lack switches out of the idle task); each was taken to happen at the thread's next event there, so those runs may start late"
        ));
    }

    let pids = read_tgids(run);
    let opts = ActivityOptions {
        thread_id_is_os_tid: args.thread_id_is_os_tid,
    };
    let index: HashMap<SpanRef, SpanIdx> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| (SpanRef::of(s), i as SpanIdx))
        .collect();
    let mut inputs: Vec<SpanInput> = spans
        .iter()
        .map(|s| span_input(s, &index, clock.as_ref(), opts))
        .collect();
    // Spans without SDK fields: placed from the kernel trace.
    let placements = if args.placement == PlacementMode::Sdk {
        Vec::new()
    } else {
        let processes = Processes {
            tgid_of: pids.clone(),
            scanned: read_process_scan(run, &mut notes),
        };
        let placing: Vec<PlacementSpan> = spans
            .iter()
            .zip(&inputs)
            .map(|(s, i)| placement_span(s, i))
            .collect();
        let placements = infer_placements(&model, arch, &placing, &processes);
        if let Some(b) = clock_offset_bound(&model, arch, &placing, &placements) {
            notes.push(offset_note(&b));
        }
        for (input, p) in inputs.iter_mut().zip(&placements) {
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
    let metas: Vec<SpanMeta> = spans.iter().map(span_meta).collect();
    timings.phase("spans, placement and thread activity");

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
    let work = Work::new(&activity, &index);
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
    let (states, syscalls, requests) = std::thread::scope(|scope| {
        let states = scope
            .spawn(|| tables::write_thread_states(&staging.file(tables::THREAD_STATES), &kernel));
        let syscalls =
            scope.spawn(|| tables::write_syscalls(&staging.file(tables::SYSCALLS), &kernel));
        // A few paths in flight at most: a path of a long request is
        // megabytes.
        let (path_tx, path_rx) = std::sync::mpsc::sync_channel::<RequestPath>(4);
        let writer = scope.spawn(|| -> Result<(Vec<RequestRecord>, ChainIndex)> {
            let diagnosis = DiagnosisContext::new(&model, arch, &inputs, &pids, &span_label, &work);
            let mut paths = CriticalPathWriter::create(&staging.file(tables::CRITICAL_PATH))?;
            let mut records = Vec::new();
            // Every path, for the root causes through chains of requests
            // (a request's blockers may come later).
            let mut chains = ChainIndex::new();
            let mut diagnosing = std::time::Duration::ZERO;
            for path in path_rx {
                paths.write(&ctx, &path)?;
                // Diagnosed while the pieces are at hand.
                let clock = std::time::Instant::now();
                let d = diagnose(&diagnosis, &path);
                chains.add(&diagnosis, &path);
                diagnosing += clock.elapsed();
                let mut rec = RequestRecord::new(&model, arch, &lost, path, false);
                rec.diagnosis = d;
                records.push(rec);
            }
            paths.finish()?;
            if timings.on {
                eprintln!(
                    "deepspan: timing: diagnoses (within the critical paths): {:.3} s",
                    diagnosing.as_secs_f64()
                );
            }
            Ok((records, chains))
        });
        let bar = progress::count_bar(0, "critical paths");
        let analysis = analyze_requests(
            &model,
            &inputs,
            &work,
            &mut |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            },
            &mut |path| {
                // A failed writer has hung up: its error is what is
                // reported, below.
                let _ = path_tx.send(path);
            },
        );
        drop(path_tx);
        bar.finish_and_clear();
        let requests = match writer.join() {
            Ok(records) => records.map(|r| (analysis, r)),
            Err(_) => Err(anyhow::anyhow!("the critical-path writer thread panicked")),
        };
        (states.join(), syscalls.join(), requests)
    });
    let joined = |x: std::thread::Result<Result<u64, deepspan_store::Error>>| -> Result<u64> {
        match x {
            Ok(r) => Ok(r?),
            Err(_) => bail!("a table writer thread panicked"),
        }
    };
    joined(states)?;
    joined(syscalls)?;
    let (analysis, (mut records, chains)) = requests?;
    timings.phase("request critical paths, thread states and system calls");
    // Slowest first: the order of the tables and of the printout.
    records.sort_by_key(|r| {
        (
            std::cmp::Reverse(r.path.duration()),
            r.path.start,
            r.path.request,
        )
    });
    // Outliers of their operation.
    let key = |r: &deepspan_store::RequestRecord| {
        let m = &metas[r.path.request as usize];
        (m.service.as_str(), m.operation.as_str())
    };
    let base = baselines(records.iter().map(|r| (key(r), r.path.duration())));
    let base: Vec<Option<u64>> = records.iter().map(|r| base.get(&key(r)).copied()).collect();
    for (r, b) in records.iter_mut().zip(base) {
        r.baseline_ns = b;
        r.anomalous = is_anomalous(r.path.duration(), b);
    }
    timings.phase("diagnoses");
    // Root causes, once every path is known: what the requests a request
    // waited for were held up by (those that were outliers themselves).
    {
        let mut chains = chains;
        for r in records.iter().filter(|r| r.anomalous) {
            chains.mark_anomalous(r.path.request);
        }
        let diagnosis = DiagnosisContext::new(&model, arch, &inputs, &pids, &span_label, &work);
        for r in &mut records {
            if let Some(d) = r.diagnosis.as_mut() {
                d.root = chains.root_cause(&diagnosis, r.path.request).map(Box::new);
            }
        }
    }
    timings.phase("root causes");
    sync_notes(
        &records,
        clock.as_ref(),
        args.thread_id_is_os_tid,
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
    std::thread::scope(|scope| -> Result<()> {
        let side = scope.spawn(|| -> Result<(), deepspan_store::Error> {
            json::write_requests_json(&staging.file(json::REQUESTS_JSON), &results)?;
            tables::write_diagnoses(&staging.file(tables::DIAGNOSES), &results)?;
            Ok(())
        });
        let here = (|| -> Result<(), deepspan_store::Error> {
            tables::write_requests(&staging.file(tables::REQUESTS), &results)?;
            tables::write_request_summaries(
                &staging.file(tables::REQUEST_SUMMARY),
                &staging.file(tables::REQUEST_SYSCALLS),
                &results,
            )?;
            tables::write_operation_summary(&staging.file(tables::OPERATION_SUMMARY), &results)?;
            Ok(())
        })();
        // Joined before any error is returned: a scope left with a
        // panicked thread unjoined would panic itself.
        let side = side.join();
        here?;
        match side {
            Ok(r) => Ok(r?),
            Err(_) => bail!("the requests.json writer thread panicked"),
        }
    })?;
    write_placements(&staging.file(PLACEMENTS_JSON), &spans, &placements)?;
    let dir = staging.commit()?;
    timings.phase("request tables");

    let mut out = std::io::stdout().lock();
    print_slowest(&mut out, &results, args.top)?;
    for n in &notes {
        eprintln!("deepspan: note: {n}");
    }
    eprintln!(
        "deepspan: analyzed {events} kernel events ({lost_events} lost), {} threads, {} requests ({} thread critical paths); tables in {}",
        model.threads().count(),
        analysis.requests,
        analysis.thread_paths,
        dir.display()
    );
    Ok(())
}

fn read_spans(run: &Path, notes: &mut Vec<String>) -> Result<Vec<Span>> {
    let mut reader = deepspan_spans::read_run_spans(run)
        .with_context(|| format!("cannot read the spans of {}", run.display()))?;
    let mut spans = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut duplicates = 0usize;
    for s in reader.by_ref() {
        let s = s.with_context(|| format!("cannot read the spans of {}", run.display()))?;
        if seen.insert(SpanRef::of(&s)) {
            spans.push(s);
        } else {
            duplicates += 1;
        }
    }
    if duplicates > 0 {
        notes.push(format!(
            "{duplicates} duplicate span(s) (same trace and span id) ignored"
        ));
    }
    notes.append(&mut reader.warnings);
    Ok(spans)
}

fn span_input(
    s: &Span,
    index: &HashMap<SpanRef, SpanIdx>,
    clock: Option<&ClockMap>,
    opts: ActivityOptions,
) -> SpanInput {
    let parent = s.parent_span_id.and_then(|p| {
        index
            .get(&SpanRef {
                trace_id: s.trace_id,
                span_id: p,
            })
            .copied()
    });
    let exact = span_mono_exact(s);
    let mapped = exact.or_else(|| clock.map(|c| c.span_mono(s)));
    let holder = s.sync.tid.and_then(|t| Tid::try_from(t).ok()).or_else(|| {
        opts.thread_id_is_os_tid
            .then(|| s.attributes.get("thread.id").and_then(|v| v.as_i64()))
            .flatten()
            .and_then(|t| Tid::try_from(t).ok())
    });
    SpanInput {
        parent,
        entry: matches!(s.kind, SpanKind::Server | SpanKind::Consumer),
        times: mapped.map(|m| (m.start_ns, m.end_ns)),
        exact_times: exact.is_some(),
        holder,
        activations: s
            .sync
            .activations
            .iter()
            .filter_map(|a| {
                Some(ActivationInput {
                    tid: Tid::try_from(a.tid).ok()?,
                    ts: a.mono_ns,
                    on: a.on,
                })
            })
            .collect(),
        inferred: None,
    }
}

/// What placement reads of a span: its resource and attributes.
fn placement_span(s: &Span, input: &SpanInput) -> PlacementSpan {
    let attr = |k: &str| s.attributes.get(k).or_else(|| s.resource.attributes.get(k));
    let int = |k: &str| {
        attr(k).and_then(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|t| t.parse().ok()))
        })
    };
    let port = ["server.port", "net.host.port", "host.port"]
        .iter()
        .find_map(|k| int(k))
        .and_then(|p| u16::try_from(p).ok())
        .or_else(|| {
            ["url.full", "http.url", "http.host", "server.address"]
                .iter()
                .find_map(|k| attr(k).and_then(|v| v.as_str()).and_then(port_of))
        });
    PlacementSpan {
        parent: input.parent,
        entry: input.entry,
        times: input.times,
        sdk_placed: input.holder.is_some() || !input.activations.is_empty(),
        pid: int("process.pid").and_then(|p| Tid::try_from(p).ok()),
        service: s.service_name().to_string(),
        thread_name: attr("thread.name")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        port,
        sdk_language: s
            .resource
            .attributes
            .get("telemetry.sdk.language")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    }
}

/// The port of `scheme://host:port/…` or `host:port`, if it says one.
fn port_of(text: &str) -> Option<u16> {
    let rest = text.split_once("://").map_or(text, |x| x.1);
    let authority = rest.split(['/', '?', '#']).next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse().ok()
}

/// What the requests placed on threads say of the clock mapping.
fn offset_note(b: &OffsetBound) -> String {
    let us = |ns: i64| ns as f64 / 1e3;
    let verdict = if b.lower_ns <= 0 && 0 <= b.upper_ns {
        "consistent with the mapping as is".to_string()
    } else {
        let off = if b.lower_ns > 0 {
            b.lower_ns
        } else {
            b.upper_ns
        };
        format!(
            "the mapped span times are off by at least {:.1} µs",
            us(off)
        )
    };
    format!(
        "clock mapping checked against the requests placed on a thread: {} of {} ran at their spans' start (after their receive) and end for a correction between {:+.1} and {:+.1} µs: {verdict}",
        b.agreeing,
        b.of,
        us(b.lower_ns),
        us(b.upper_ns)
    )
}

/// `RUN/analysis/placements.json`: how each span without deepspan fields
/// was placed, with its evidence.
pub const PLACEMENTS_JSON: &str = "placements.json";

/// One line of [`PLACEMENTS_JSON`].
#[derive(serde::Serialize, serde::Deserialize)]
struct PlacementRecord {
    trace_id: String,
    span_id: String,
    sync: String,
    pid: i32,
    tid: Option<i32>,
    confidence: f64,
    evidence: Vec<String>,
}

fn write_placements(path: &Path, spans: &[Span], placements: &[Option<Placement>]) -> Result<()> {
    let records: Vec<PlacementRecord> = spans
        .iter()
        .zip(placements)
        .filter_map(|(s, p)| {
            let p = p.as_ref()?;
            Some(PlacementRecord {
                trace_id: format!("{:032x}", s.trace_id.0),
                span_id: format!("{:016x}", s.span_id.0),
                sync: p.method.name().to_string(),
                pid: p.pid,
                tid: p.tid,
                confidence: (p.confidence * 1000.0).round() / 1000.0,
                evidence: p.evidence.clone(),
            })
        })
        .collect();
    let text = serde_json::to_vec_pretty(&serde_json::json!({ "placements": records }))?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The placement of request `span_id` from a run's `placements.json`.
fn read_placement(run: &Path, span_id: &str) -> Option<PlacementRecord> {
    let text = std::fs::read(run.join("analysis").join(PLACEMENTS_JSON)).ok()?;
    let mut doc: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let list: Vec<PlacementRecord> = serde_json::from_value(doc["placements"].take()).ok()?;
    list.into_iter().find(|p| p.span_id == span_id)
}

/// The recorder's /proc scan (`RUN/processes.json`), when the run has one.
fn read_process_scan(run: &Path, notes: &mut Vec<String>) -> Vec<ScannedProcess> {
    let path = run.join(deepspan_record::PROCESS_SCAN);
    let Ok(text) = std::fs::read(&path) else {
        return Vec::new();
    };
    match serde_json::from_slice::<Vec<deepspan_record::ProcessEntry>>(&text) {
        Ok(list) => list
            .into_iter()
            .map(|p| ScannedProcess {
                pid: p.pid,
                comm: p.comm,
                cmdline: p.cmdline,
                listening_ports: p.listening_ports,
            })
            .collect(),
        Err(e) => {
            notes.push(format!(
                "{}: {e}; the process scan is not used",
                path.display()
            ));
            Vec::new()
        }
    }
}

fn span_meta(s: &Span) -> SpanMeta {
    SpanMeta {
        trace_id: s.trace_id.0,
        span_id: s.span_id.0,
        parent_span_id: s.parent_span_id.map(|p| p.0),
        service: s.service_name().to_string(),
        operation: s.name.clone(),
        kind: match s.kind {
            SpanKind::Unspecified => "unspecified",
            SpanKind::Internal => "internal",
            SpanKind::Server => "server",
            SpanKind::Client => "client",
            SpanKind::Producer => "producer",
            SpanKind::Consumer => "consumer",
        },
    }
}

/// The span active on each thread, as span indices, read once from the
/// activity index (queries then cost a binary search, no hashing).
struct Work {
    by_tid: FastMap<Tid, Vec<(u64, u64, SpanIdx)>>,
}

impl Work {
    fn new(activity: &ThreadActivity, index: &HashMap<SpanRef, SpanIdx>) -> Work {
        let by_tid = activity
            .threads()
            .into_iter()
            .filter_map(|t| {
                let intervals: Vec<(u64, u64, SpanIdx)> = activity
                    .active_during(t, 0, u64::MAX)
                    .into_iter()
                    .filter_map(|(a, b, r)| Some((a, b, *index.get(&r)?)))
                    .collect();
                Some((Tid::try_from(t).ok()?, intervals))
            })
            .collect();
        Work { by_tid }
    }
}

impl ThreadWork for Work {
    fn work_during(&self, tid: Tid, start: u64, end: u64, out: &mut Vec<(u64, u64, SpanIdx)>) {
        let Some(v) = self.by_tid.get(&tid) else {
            return;
        };
        let first = v.partition_point(|x| x.1 <= start);
        for &(a, b, i) in v[first..].iter().take_while(|x| x.0 < end) {
            out.push((a.max(start), b.min(end), i));
        }
    }
}

fn sync_notes(
    requests: &[RequestRecord],
    clock: Option<&ClockMap>,
    thread_id_told: bool,
    notes: &mut Vec<String>,
) {
    let count = |s: SyncSource| requests.iter().filter(|r| r.path.sync == s).count();
    let mapped = count(SyncSource::ClockMapped);
    if mapped > 0 {
        let precision = clock.map_or(0, |c| c.precision_ns());
        notes.push(format!(
            "{mapped} request(s) placed through the clock samples (sync: clock_mapped), precision about {:.1} µs",
            precision as f64 / 1e3
        ));
    }
    let inferred = count(SyncSource::Inferred);
    let process = count(SyncSource::Process);
    if inferred + process > 0 {
        notes.push(format!(
            "placement: {} exact (SDK), {mapped} clock_mapped, {inferred} inferred on a thread from the kernel trace, {process} on their process as a whole (sync: process), {} none; evidence in analysis/{PLACEMENTS_JSON}",
            count(SyncSource::Exact),
            count(SyncSource::None)
        ));
    }
    let none = count(SyncSource::None);
    if none > 0 {
        let hint = if thread_id_told {
            ""
        } else {
            "; if their `thread.id` attribute is the OS thread id, pass --thread-id-is-os-tid"
        };
        notes.push(format!(
            "{none} request(s) carry no OS thread (no deepspan fields; sync: none) and have no kernel path{hint}"
        ));
    }
}

/// `RUN/kernel/saved_tgids` (`tid tgid` lines), when the recorder saved it.
fn read_tgids(run: &Path) -> HashMap<Tid, Tid> {
    let Ok(text) = std::fs::read_to_string(run.join("kernel").join("saved_tgids")) else {
        return HashMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect()
}

/// Prints the slowest requests (`r.requests` is slowest first) with their
/// diagnosis (cause and share, `!` marking an anomaly, the headline under
/// it), in 80 columns.
fn print_slowest(out: &mut impl Write, r: &AnalysisResults, top: usize) -> Result<()> {
    if r.requests.is_empty() {
        writeln!(out, "No requests: the run has no spans (send them to the run's OTLP receiver, or `deepspan import`).")?;
        return Ok(());
    }
    let anomalous = r.requests.iter().filter(|x| x.anomalous).count();
    writeln!(
        out,
        "Slowest requests ({} of {}; {anomalous} anomalous, marked !):",
        top.min(r.requests.len()),
        r.requests.len()
    )?;
    writeln!(
        out,
        "{:>10}   {:<16}  {:<20}  cause",
        "duration", "request", "operation"
    )?;
    for rec in r.requests.iter().take(top) {
        let p = &rec.path;
        let meta = &r.spans[p.request as usize];
        let cause = match (&rec.diagnosis, p.sync) {
            (Some(d), _) => {
                let share = d
                    .evidence
                    .iter()
                    .find(|e| e.0 == "share")
                    .map_or(0.0, |e| e.1);
                format!("{} {:.0}%", d.cause.name(), share * 100.0)
            }
            (None, SyncSource::None) => "no kernel path (sync: none)".to_string(),
            (None, _) => "-".to_string(),
        };
        writeln!(
            out,
            "{:>10} {} {:016x}  {:<20}  {}",
            human_ns(p.duration()),
            if rec.anomalous { '!' } else { ' ' },
            meta.span_id,
            fit(&meta.operation_label(), 20),
            fit(&cause, 25)
        )?;
        if let Some(d) = &rec.diagnosis {
            writeln!(out, "  {}", fit(&d.headline, 78))?;
            if let Some(root) = &d.root {
                let share = root
                    .evidence
                    .iter()
                    .find(|e| e.0 == "share")
                    .map_or(0.0, |e| e.1);
                let line = format!(
                    "root: {} {:.0}%: {}",
                    root.cause.name(),
                    share * 100.0,
                    root.chain
                );
                writeln!(out, "  {}", fit(&line, 78))?;
            }
        }
    }
    Ok(())
}

/// Cuts `s` to `width` characters, marking the cut.
fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A duration for people: `850 ns`, `237.3 µs`, `2.909 ms`, `1.234 s`.
fn human_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.3} ms", f / 1e6)
    } else {
        format!("{:.3} s", f / 1e9)
    }
}

pub fn report(args: ReportArgs) -> Result<()> {
    if !args.run.is_dir() {
        bail!("{} is not a run folder", args.run.display());
    }
    let report = deepspan_store::read_report(&args.run, &args.request)?;
    let mut out = std::io::stdout().lock();
    match args.format {
        ReportFormat::Json => {
            // Serialized first, so a closed pipe surfaces as an I/O error.
            let mut text = serde_json::to_vec_pretty(&report)?;
            text.push(b'\n');
            out.write_all(&text)?;
        }
        ReportFormat::Text => {
            let placement = read_placement(&args.run, &report.request.span_id);
            print_report(&mut out, &report, placement.as_ref(), args.max_pieces, args.detail)?
        }
    }
    out.flush()?;
    Ok(())
}

/// The diagnosis block of the text report: cause and headline, whether the
/// request is an outlier, the evidence and the culprits; then the root
/// cause when the request was blocked by others (the chain first).
fn print_diagnosis(out: &mut impl Write, r: &Report, duration: u64, detail: bool) -> Result<()> {
    let Some(d) = &r.diagnosis else {
        return Ok(());
    };
    let anomaly = match r.details.baseline_ns {
        Some(b) if r.details.anomalous => format!(
            "ANOMALOUS, {:.1}x the median {}",
            duration as f64 / b.max(1) as f64,
            human_ns(b)
        ),
        Some(b) => format!("normal: its operation's median is {}", human_ns(b)),
        None => "no baseline: < 3 requests of its operation".to_string(),
    };
    writeln!(
        out,
        "Diagnosis: {}  ({anomaly})",
        d["cause"].as_str().unwrap_or("?")
    )?;
    print_cause(out, d, detail)?;
    let root = &d["root_cause"];
    if let Some(chain) = root["chain"].as_str() {
        writeln!(
            out,
            "Root cause: {}  (through the requests it waited for)",
            root["cause"].as_str().unwrap_or("?")
        )?;
        for line in wrap(chain, 78) {
            writeln!(out, "  {line}")?;
        }
        print_cause(out, root, detail)?;
    }
    Ok(())
}

/// Words of `text` in lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let last = lines.last_mut().expect("one line at least");
        if !last.is_empty() && last.chars().count() + 1 + word.chars().count() > width {
            lines.push(format!("  {word}"));
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}

/// Headline, evidence and culprits of a cause object (the diagnosis or
/// its root cause). Request culprits are grouped by `[service] operation`
/// unless `detail`.
fn print_cause(out: &mut impl Write, d: &serde_json::Value, detail: bool) -> Result<()> {
    writeln!(out, "  {}", fit(d["headline"].as_str().unwrap_or(""), 78))?;
    if let Some(ev) = d["evidence"].as_object() {
        let items: Vec<String> = ev
            .iter()
            .map(|(k, v)| match v.as_f64() {
                Some(f) if k.ends_with("_ns") || k == "ns" => format!("{k}={}", human_ns(f as u64)),
                Some(f) if k.ends_with("share") || k.ends_with("_ratio") => {
                    format!("{k}={:.0}%", f * 100.0)
                }
                Some(f) if k == "futex_uaddr" => format!("{k}={:#x}", f as u64),
                Some(f) if f.fract() != 0.0 => format!("{k}={f:.2}"),
                _ => format!("{k}={v}"),
            })
            .collect();
        // Wrapped at 80 columns.
        let mut line = String::from("  evidence:");
        for item in items {
            if line.chars().count() + 1 + item.chars().count() > 80 {
                writeln!(out, "{line}")?;
                line = String::from("   ");
            }
            line.push(' ');
            line.push_str(&item);
        }
        writeln!(out, "{line}")?;
    }
    let culprits: Vec<serde_json::Value> = d["culprits"].as_array().cloned().unwrap_or_default();
    for (kind, who, ns) in culprit_lines(&culprits, detail).into_iter().take(5) {
        writeln!(
            out,
            "  culprit {:<8} {:<51}{:>10}",
            kind,
            fit(&who, 51),
            human_ns(ns)
        )?;
    }
    Ok(())
}

/// `(kind, who, ns)` per culprit, largest first; request culprits of the
/// same `[service] operation` make one line ("5 requests of [pricing] GET
/// /price") unless `detail`.
fn culprit_lines(culprits: &[serde_json::Value], detail: bool) -> Vec<(String, String, u64)> {
    let mut lines: Vec<(String, String, u64)> = Vec::new();
    // (operation label, requests, ns, the line's index)
    let mut groups: Vec<(String, usize, usize)> = Vec::new();
    for c in culprits {
        let field = |k: &str| {
            c.get(k)
                .filter(|v| !v.is_null())
                .map(|v| v.to_string().trim_matches('"').to_string())
        };
        let kind = field("kind").unwrap_or_default();
        let ns = c["ns"].as_u64().unwrap_or(0);
        let operation = format!(
            "[{}] {}",
            field("service").unwrap_or_default(),
            field("operation").unwrap_or_default()
        );
        if kind == "request" && !detail {
            if let Some(g) = groups.iter_mut().find(|g| g.0 == operation) {
                g.1 += 1;
                let line = &mut lines[g.2];
                line.1 = format!("{} requests of {}", g.1, g.0);
                line.2 += ns;
                continue;
            }
            groups.push((operation.clone(), 1, lines.len()));
        }
        let mut who = Vec::new();
        if let Some(comm) = field("comm") {
            who.push(comm);
        }
        if let Some(t) = field("tid") {
            who.push(format!("tid {t}"));
        }
        if let Some(p) = field("pid") {
            who.push(format!("pid {p}"));
        }
        if let Some(s) = field("span_id") {
            who.push(format!("{s} {operation}"));
        }
        if let Some(n) = field("name") {
            who.push(n);
        }
        lines.push((kind, who.join(", "), ns));
    }
    lines.sort_by(|a, b| b.2.cmp(&a.2));
    lines
}

/// The text report: the diagnosis, a breakdown like seed 000's Fig. 16,
/// then the path.
fn print_report(
    out: &mut impl Write,
    r: &Report,
    placement: Option<&PlacementRecord>,
    max_pieces: usize,
    detail: bool,
) -> Result<()> {
    let q = &r.request;
    let duration = q.end_ns.saturating_sub(q.start_ns);
    let title = format!("Request {}  [{}] {}", q.span_id, q.service, q.operation);
    writeln!(out, "{}", fit(&title, 80))?;
    print_diagnosis(out, r, duration, detail)?;
    writeln!(
        out,
        "\n  trace {} {}  sync: {}  lost events: {}",
        q.trace_id,
        human_ns(duration),
        r.details.sync,
        r.lost_events
    )?;
    if let Some(p) = placement {
        let on = match p.tid {
            Some(t) => format!("thread {t} of process {}", p.pid),
            None => format!("process {} as a whole", p.pid),
        };
        writeln!(
            out,
            "  placed from the kernel trace on {on}, confidence {:.2}:",
            p.confidence
        )?;
        for e in &p.evidence {
            writeln!(out, "    {}", fit(e, 76))?;
        }
    }
    if r.details.truncated {
        writeln!(
            out,
            "  (a thread critical path was cut short: parts are left unexplained)"
        )?;
    }
    if r.critical_path.is_empty() {
        writeln!(
            out,
            "\nNo kernel critical path: the request is not placed on any thread (sync: none)."
        )?;
        return Ok(());
    }
    let total = r.summary.iter().map(|s| s.ns).sum::<u64>().max(1) as f64;
    writeln!(
        out,
        "\n{:<56}{:>13}{:>8}",
        "Where the time went", "duration", "%"
    )?;
    // One line per blocking request (its parts under it, as seed 000's
    // Fig. 16 groups them), one per own (thread, state).
    // (label, ns, parts as (label, ns))
    type Line = (String, u64, Vec<(String, u64)>);
    let mut lines: Vec<Line> = Vec::new();
    let mut blockers_of: std::collections::HashMap<String, std::collections::HashSet<String>> =
        std::collections::HashMap::new();
    for s in &r.summary {
        let thread = format!(
            "[{}] {}{}",
            thread_label(s.tid.map(|t| t as Tid), s.comm.as_deref()),
            s.state,
            deepspan_store::cpu_wait_label(s.throttled_ns, s.contended_ns, s.wakeup_ns)
        );
        match &s.blocked_by_request {
            Some(b) => {
                // Grouped by the blocking requests' `[service] operation`
                // (one line for the five requests a queue held it behind),
                // or one line per request with `--detail`.
                let op = r.details.blockers.get(b);
                let label = match (op, detail) {
                    (Some(op), false) => {
                        blockers_of.entry(op.clone()).or_default().insert(b.clone());
                        format!("Blocked by requests of {op}")
                    }
                    (Some(op), true) => format!("Blocked by request {b} {op}"),
                    (None, _) => format!("Blocked by request {b}"),
                };
                match lines.iter_mut().find(|l| l.0 == label) {
                    Some(l) => {
                        l.1 += s.ns;
                        match l.2.iter_mut().find(|p| p.0 == thread) {
                            Some(p) => p.1 += s.ns,
                            None => l.2.push((thread, s.ns)),
                        }
                    }
                    None => lines.push((label, s.ns, vec![(thread, s.ns)])),
                }
            }
            None => lines.push((thread, s.ns, Vec::new())),
        }
    }
    for l in &mut lines {
        l.2.sort_by_key(|p| std::cmp::Reverse(p.1));
        if let Some(op) = l.0.strip_prefix("Blocked by requests of ") {
            let ids = blockers_of.get(op);
            l.0 = match ids.map_or(0, |s| s.len()) {
                // One request: named, as `--detail` would.
                1 => format!(
                    "Blocked by request {} {op}",
                    ids.and_then(|s| s.iter().next()).map_or("", |b| b.as_str())
                ),
                n => format!("Blocked by {n} requests of {op}"),
            };
        }
    }
    lines.sort_by_key(|l| std::cmp::Reverse(l.1));
    let pct = |ns: u64| ns as f64 * 100.0 / total;
    for (label, ns, parts) in &lines {
        writeln!(
            out,
            "  {:<54}{:>13}{:>7.1}%",
            fit(label, 54),
            human_ns(*ns),
            pct(*ns)
        )?;
        for (part, ns) in parts.iter().take(3) {
            writeln!(
                out,
                "      {:<50}{:>13}{:>7.1}%",
                fit(part, 50),
                human_ns(*ns),
                pct(*ns)
            )?;
        }
    }
    if !r.details.syscalls.is_empty() {
        writeln!(
            out,
            "\n{:<56}{:>13}{:>8}",
            "Waiting in / running in system calls", "duration", "%"
        )?;
        for (label, ns) in r.details.syscalls.iter().take(10) {
            writeln!(
                out,
                "  {:<54}{:>13}{:>7.1}%",
                fit(label, 54),
                human_ns(*ns),
                *ns as f64 * 100.0 / total
            )?;
        }
    }
    writeln!(out, "\nCritical path ({} pieces)", r.critical_path.len())?;
    writeln!(
        out,
        "  {:>10} {:>10}  {:<12} {:<16} in / for",
        "at", "duration", "state", "thread"
    )?;
    let shown = if max_pieces == 0 {
        r.critical_path.len()
    } else {
        max_pieces.min(r.critical_path.len())
    };
    for p in &r.critical_path[..shown] {
        let mut what = Vec::new();
        if let Some(b) = &p.blocked_by_request {
            what.push(format!("blocked by {b}"));
        }
        if let Some(s) = &p.syscall {
            what.push(s.clone());
        }
        if p.throttled_ns + p.contended_ns + p.wakeup_ns > 0 {
            let why = deepspan_store::cpu_wait_label(p.throttled_ns, p.contended_ns, p.wakeup_ns);
            let why = why.trim().trim_start_matches('(').trim_end_matches(')');
            match &p.preempted_by {
                Some((t, c)) if p.contended_ns > 0 => what.push(format!(
                    "{why}, CPU to {}",
                    thread_label(Some(*t as Tid), c.as_deref())
                )),
                _ => what.push(why.to_string()),
            }
        }
        if let Some(d) = &p.detail {
            what.push(d.clone());
        }
        if p.lost {
            what.push("events lost".to_string());
        }
        writeln!(
            out,
            "  {:>10} {:>10}  {:<12} {:<16} {}",
            fit(&human_ns(p.start_ns.saturating_sub(q.start_ns)), 10),
            fit(&human_ns(p.end_ns.saturating_sub(p.start_ns)), 10),
            p.state,
            fit(
                &thread_label(p.tid.map(|t| t as Tid), p.comm.as_deref()),
                16
            ),
            fit(&what.join(", "), 24)
        )?;
    }
    if shown < r.critical_path.len() {
        writeln!(
            out,
            "  … {} more pieces (--max-pieces 0 shows all, --format json gives them all)",
            r.critical_path.len() - shown
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_culprits_of_one_operation_make_one_line_unless_detail() {
        let culprits = vec![
            json!({"kind": "process", "comm": "pricing", "pid": 7, "ns": 900}),
            json!({"kind": "request", "span_id": "a1", "service": "pricing", "operation": "GET /price", "ns": 500}),
            json!({"kind": "request", "span_id": "a2", "service": "pricing", "operation": "GET /price", "ns": 300}),
            json!({"kind": "request", "span_id": "b1", "service": "inventory", "operation": "GET /stock", "ns": 50}),
        ];
        let grouped = culprit_lines(&culprits, false);
        assert_eq!(
            grouped,
            vec![
                ("process".into(), "pricing, pid 7".into(), 900),
                ("request".into(), "2 requests of [pricing] GET /price".into(), 800),
                ("request".into(), "b1 [inventory] GET /stock".into(), 50),
            ]
        );
        let detail = culprit_lines(&culprits, true);
        assert_eq!(detail.len(), 4);
        assert_eq!(detail[1].1, "a1 [pricing] GET /price");
    }

    #[test]
    fn a_long_chain_wraps_at_word_boundaries() {
        let chain = "[front] GET /product → behind 3 × [pricing] GET /price → PREEMPTED (throttled) 100 %";
        let lines = wrap(chain, 40);
        assert!(lines.iter().all(|l| l.chars().count() <= 40), "{lines:?}");
        assert_eq!(lines.join(" ").replace("   ", " "), chain);
    }
}
