//! `deepspan analyze RUN` and `deepspan report RUN --request ID`: argument
//! parsing, progress and output formatting over `deepspan_pipeline` (the
//! analysis) and `deepspan_store` (reading a request back).

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use deepspan_analysis::{CulpritKind, SyncSource};
use deepspan_model::{human, Tid};
use deepspan_pipeline::hosts::{merge_runs, HostClock};
use deepspan_pipeline::{
    read_placement, AnalysisOutcome, AnalyzeOptions, PlacementRecord, Progress, Step,
};
use deepspan_store::json::{CulpritDoc, Evidence};
use deepspan_store::report::{Report, ReportPiece, ReportQueue};
use deepspan_store::tables::thread_label;
use indicatif::ProgressBar;

use crate::progress;

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan analyze run1
  deepspan analyze run1 --top 20
  deepspan analyze front-host-run db-host-run --out both  (several hosts, one clock)
  duckdb -c \"select * from 'run1/analysis/request_summary.parquet' limit 10\"")]
pub struct AnalyzeArgs {
    /// Run folder (from `deepspan record` or `deepspan import`); several
    /// runs, one per host, are analysed together on one clock (aligned as
    /// `deepspan sync` aligns them) into the merged run `--out`.
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<PathBuf>,
    /// With several runs: the merged run folder to create (new or empty);
    /// `deepspan report` and `deepspan ui` read it as any run.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// With several runs: the host whose clock the merged run is on
    /// (default: the first run's host).
    #[arg(long, value_name = "HOST")]
    reference: Option<String>,
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

/// The analysis' progress on the terminal: a bar per long step, and with
/// `DEEPSPAN_TIMINGS` set each phase's time, CPU time and memory (for
/// benchmarks and profiling).
struct Bars {
    bar: RefCell<Option<ProgressBar>>,
    timings: bool,
    last_cpu: Cell<f64>,
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

impl Bars {
    fn new() -> Bars {
        let timings = std::env::var_os("DEEPSPAN_TIMINGS").is_some();
        Bars {
            bar: RefCell::new(None),
            timings,
            last_cpu: Cell::new(if timings { process_cpu_s() } else { 0.0 }),
        }
    }
}

impl Progress for Bars {
    fn begin(&self, step: Step, total: Option<u64>) {
        let bar = match step {
            Step::DecodeTraceDat => progress::bytes_bar(total.unwrap_or(0), "decoding"),
            Step::DecodeCtf => progress::spinner("decoding CTF"),
            Step::CriticalPaths => progress::count_bar(total.unwrap_or(0), "critical paths"),
        };
        *self.bar.borrow_mut() = Some(bar);
    }

    fn total(&self, _step: Step, total: u64) {
        if let Some(bar) = &*self.bar.borrow() {
            bar.set_length(total);
        }
    }

    fn advance(&self, step: Step, done: u64) {
        if let Some(bar) = &*self.bar.borrow() {
            match step {
                Step::DecodeCtf => bar.set_message(format!("{done} events")),
                Step::DecodeTraceDat | Step::CriticalPaths => bar.set_position(done),
            }
        }
    }

    fn end(&self, _step: Step) {
        if let Some(bar) = self.bar.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }

    fn phase_done(&self, phase: &'static str, took: Duration) {
        if !self.timings {
            return;
        }
        if phase == deepspan_pipeline::phase::DIAGNOSES_WITHIN_PATHS {
            eprintln!("deepspan: timing: {phase}: {:.3} s", took.as_secs_f64());
            return;
        }
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
            "deepspan: timing: {phase}: {:.3} s, CPU {:.3} s (RSS {} MiB, peak {} MiB)",
            took.as_secs_f64(),
            cpu - self.last_cpu.replace(cpu),
            field("VmRSS:"),
            field("VmHWM:")
        );
    }
}

pub fn run(args: AnalyzeArgs) -> Result<()> {
    for run in &args.runs {
        if !run.is_dir() {
            bail!("{} is not a run folder", run.display());
        }
        crate::record::recover_if_unfinished(run)?;
    }
    let merged;
    let run = match (args.runs.as_slice(), &args.out) {
        ([run], None) => run,
        ([_], Some(_)) => {
            bail!("--out is for several runs (one per host); one run is analysed in place")
        }
        (_, None) => bail!(
            "several runs are analysed together into a merged run: give it a folder with --out DIR"
        ),
        (runs, Some(out)) => {
            merged = merge_hosts(runs, out, args.reference.as_deref())?;
            &merged
        }
    };
    let options = AnalyzeOptions {
        thread_id_is_os_tid: args.thread_id_is_os_tid,
        placement: match args.placement {
            PlacementMode::Auto => deepspan_pipeline::PlacementMode::Auto,
            PlacementMode::Sdk => deepspan_pipeline::PlacementMode::Sdk,
            PlacementMode::Inferred => deepspan_pipeline::PlacementMode::Inferred,
        },
        keep: None,
    };
    let outcome = deepspan_pipeline::analyze_run(run, &options, &Bars::new())?;

    let mut out = std::io::stdout().lock();
    print_slowest(&mut out, &outcome, args.top)?;
    for n in &outcome.notes {
        eprintln!("deepspan: note: {n}");
    }
    let stats = &outcome.stats;
    eprintln!(
        "deepspan: analyzed {} kernel events ({} lost), {} threads, {} requests ({} thread critical paths); tables in {}",
        stats.events,
        stats.lost_events,
        stats.threads,
        stats.requests,
        stats.thread_paths,
        outcome.analysis_dir.display()
    );
    Ok(())
}

/// Aligns the clocks of `runs` (one per host) and writes their merged run
/// `out`, which is then analysed like any run.
fn merge_hosts(runs: &[PathBuf], out: &Path, reference: Option<&str>) -> Result<PathBuf> {
    let alignment = deepspan_pipeline::align::align_inputs(runs, reference)?;
    let clocks: Vec<HostClock> = alignment
        .hosts
        .iter()
        .zip(&alignment.ranges)
        .map(|(h, range)| HostClock {
            slope: h.transform.slope,
            offset_ns: h.transform.offset_ns,
            quality: h.quality.name(),
            matched: h.matched,
            max_error_ns: h.bounds.envelope().zip(*range).map(|(envelope, range)| {
                envelope.max_error_ns(&h.transform, range.first_ns, range.last_ns)
            }),
        })
        .collect();
    for n in alignment.notes.iter().chain(&alignment.bounds_notes) {
        eprintln!("deepspan: note: {n}");
    }
    for h in &alignment.hosts {
        if h.quality == deepspan_sync::Quality::Fail {
            eprintln!(
                "deepspan: warning: host {}: no message links its clock to the reference's; its times are taken as they are",
                h.host
            );
        }
    }
    let merged = merge_runs(runs, &clocks, alignment.reference, out)?;
    for n in &merged.notes {
        eprintln!("deepspan: note: {n}");
    }
    Ok(out.to_path_buf())
}

/// Prints the slowest requests (`r.requests` is slowest first) with their
/// diagnosis (cause and share, `!` marking an anomaly, the headline under
/// it), in 80 columns.
fn print_slowest(out: &mut impl Write, r: &AnalysisOutcome, top: usize) -> Result<()> {
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
                format!("{} {}", d.cause.name(), human::share(share))
            }
            (None, SyncSource::None) => "no kernel path (sync: none)".to_string(),
            (None, _) => "-".to_string(),
        };
        writeln!(
            out,
            "{:>10} {} {:016x}  {:<20}  {}",
            human::duration(p.duration()),
            if rec.anomalous { '!' } else { ' ' },
            meta.span_id,
            fit(&meta.operation_label(), 20),
            fit(&cause, 27)
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
                    "root: {} {}: {}",
                    root.cause.name(),
                    human::share(share),
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
            print_report(
                &mut out,
                &report,
                placement.as_ref(),
                args.max_pieces,
                args.detail,
            )?;
            print_hosts(&mut out, &args.run)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The hosts of a merged run (`analyze RUN_A RUN_B --out`): which `hN:`
/// prefix is which host, and how well its clock is aligned.
fn print_hosts(out: &mut impl Write, run: &Path) -> Result<()> {
    let Some(file) = deepspan_pipeline::hosts::read_hosts(run)? else {
        return Ok(());
    };
    writeln!(out, "\n  Hosts (thread ids of host N > 0 shown as hN:TID):")?;
    for (i, h) in file.hosts.iter().enumerate() {
        let clock = if i == file.reference {
            "the reference clock".to_string()
        } else {
            format!(
                "clock aligned {}, {} messages matched",
                h.quality, h.matched
            )
        };
        writeln!(out, "    h{i} {}: {clock}  ({})", h.host, h.run.display())?;
    }
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
            human::duration(b)
        ),
        Some(b) => format!("normal: its operation's median is {}", human::duration(b)),
        None => "no baseline: < 3 requests of its operation".to_string(),
    };
    writeln!(out, "Diagnosis: {}  ({anomaly})", d.cause.name())?;
    print_cause(out, &d.headline, &d.evidence, &d.culprits, detail)?;
    // Only when blocked by other requests: then there is a chain.
    let root = d.root_cause.as_ref().map(|r| (r, r.chain.as_deref()));
    if let Some((root, Some(chain))) = root {
        writeln!(
            out,
            "Root cause: {}  (through the requests it waited for)",
            root.cause.name()
        )?;
        for line in wrap(chain, 78) {
            writeln!(out, "  {line}")?;
        }
        print_cause(out, &root.headline, &root.evidence, &root.culprits, detail)?;
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

/// Headline, evidence and culprits of a cause (the diagnosis or its root
/// cause). Request culprits are grouped by `[service] operation` unless
/// `detail`.
fn print_cause(
    out: &mut impl Write,
    headline: &str,
    evidence: &Evidence,
    culprits: &[CulpritDoc],
    detail: bool,
) -> Result<()> {
    writeln!(out, "  {}", fit(headline, 78))?;
    let items: Vec<String> = evidence
        .iter()
        .map(|(k, v)| match v.as_f64() {
            Some(f) => human::evidence(k, f),
            None => format!("{k}={v}"),
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
    for (kind, who, ns) in culprit_lines(culprits, detail).into_iter().take(5) {
        writeln!(
            out,
            "  culprit {:<8} {:<51}{:>10}",
            kind,
            fit(&who, 51),
            human::duration(ns)
        )?;
    }
    Ok(())
}

/// A text field as the report has always shown it: its JSON text without
/// the quotes around it (so a `"` or `\` inside shows escaped).
fn shown(text: &str) -> String {
    serde_json::Value::from(text)
        .to_string()
        .trim_matches('"')
        .to_string()
}

/// `(kind, who, ns)` per culprit, largest first; request culprits of the
/// same `[service] operation` make one line ("5 requests of [pricing] GET
/// /price") unless `detail`.
fn culprit_lines(culprits: &[CulpritDoc], detail: bool) -> Vec<(String, String, u64)> {
    let mut lines: Vec<(String, String, u64)> = Vec::new();
    // (operation label, requests, ns, the line's index)
    let mut groups: Vec<(String, usize, usize)> = Vec::new();
    for c in culprits {
        let field = |v: &Option<String>| v.as_deref().map(shown);
        let kind = c.kind.name().to_string();
        let operation = format!(
            "[{}] {}",
            field(&c.service).unwrap_or_default(),
            field(&c.operation).unwrap_or_default()
        );
        if c.kind == CulpritKind::Request && !detail {
            if let Some(g) = groups.iter_mut().find(|g| g.0 == operation) {
                g.1 += 1;
                let line = &mut lines[g.2];
                line.1 = format!("{} requests of {}", g.1, g.0);
                line.2 += c.ns;
                continue;
            }
            groups.push((operation.clone(), 1, lines.len()));
        }
        let mut who = Vec::new();
        if let Some(comm) = field(&c.comm) {
            who.push(comm);
        }
        if let Some(t) = c.tid {
            who.push(format!("tid {}", deepspan_analysis::tid_label(t)));
        }
        if let Some(p) = c.pid {
            who.push(format!("pid {}", deepspan_analysis::tid_label(p)));
        }
        if let Some(container) = c.container() {
            who.push(shown(&container.label()));
        }
        if let Some(s) = field(&c.span_id) {
            who.push(format!("{s} {operation}"));
        }
        if let Some(n) = field(&c.name) {
            who.push(n);
        }
        lines.push((kind, who.join(", "), c.ns));
    }
    lines.sort_by_key(|line| std::cmp::Reverse(line.2));
    lines
}

/// The text report: the diagnosis, a breakdown like Gelle et al. 2021's
/// Fig. 16, then the path.
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
        human::duration(duration),
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
        // Whole sentences: the evidence is what the placement rests on.
        for line in p.evidence.iter().flat_map(|e| wrap(e, 76)) {
            writeln!(out, "    {line}")?;
        }
    }
    if r.details.truncated {
        writeln!(
            out,
            "  (a thread critical path was cut short: parts are left unexplained)"
        )?;
    }
    if let Some(queue) = &r.queue {
        print_queue(out, queue)?;
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
    // One line per blocking request (its parts under it, as Gelle et al.
    // 2021, Fig. 16, groups them), one per own (thread, state).
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
            human::duration(*ns),
            pct(*ns)
        )?;
        for (part, ns) in parts.iter().take(3) {
            writeln!(
                out,
                "      {:<50}{:>13}{:>7.1}%",
                fit(part, 50),
                human::duration(*ns),
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
                human::duration(*ns),
                *ns as f64 * 100.0 / total
            )?;
        }
    }
    if let Some(queue) = r.queue.as_ref().filter(|q| !q.critical_path.is_empty()) {
        writeln!(
            out,
            "\nQueued before the span ({} pieces, from the arrival)",
            queue.critical_path.len()
        )?;
        print_pieces(out, &queue.critical_path, queue.arrival_ns, max_pieces)?;
    }
    writeln!(out, "\nCritical path ({} pieces)", r.critical_path.len())?;
    print_pieces(out, &r.critical_path, q.start_ns, max_pieces)
}

/// A request's time queued before its span, when known: how long, what
/// says when it arrived, and its largest cause.
fn print_queue(out: &mut impl Write, queue: &ReportQueue) -> Result<()> {
    let by = match queue.arrival_by.as_str() {
        "client_send" => "the client's send",
        "server_receive" => "the server's first receive of it",
        other => other,
    };
    writeln!(
        out,
        "  queued {} before its span started (arrival: {by})",
        human::duration(queue.ns)
    )?;
    if let Some(cause) = &queue.cause {
        writeln!(out, "    {}", fit(cause, 76))?;
    }
    Ok(())
}

/// A path's pieces, times from `origin_ns`, at most `max_pieces` (0: all).
fn print_pieces(
    out: &mut impl Write,
    pieces: &[ReportPiece],
    origin_ns: u64,
    max_pieces: usize,
) -> Result<()> {
    writeln!(
        out,
        "  {:>10} {:>10}  {:<12} {:<16} in / for",
        "at", "duration", "state", "thread"
    )?;
    let shown = if max_pieces == 0 {
        pieces.len()
    } else {
        max_pieces.min(pieces.len())
    };
    for p in &pieces[..shown] {
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
            fit(&human::duration(p.start_ns.saturating_sub(origin_ns)), 10),
            fit(&human::duration(p.end_ns.saturating_sub(p.start_ns)), 10),
            p.state,
            fit(
                &thread_label(p.tid.map(|t| t as Tid), p.comm.as_deref()),
                16
            ),
            fit(&what.join(", "), 24)
        )?;
    }
    if shown < pieces.len() {
        writeln!(
            out,
            "  … {} more pieces (--max-pieces 0 shows all, --format json gives them all)",
            pieces.len() - shown
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
        let culprits: Vec<CulpritDoc> = serde_json::from_value(json!([
            {"kind": "process", "comm": "pricing", "pid": 7, "ns": 900},
            {"kind": "request", "span_id": "a1", "service": "pricing", "operation": "GET /price", "ns": 500},
            {"kind": "request", "span_id": "a2", "service": "pricing", "operation": "GET /price", "ns": 300},
            {"kind": "request", "span_id": "b1", "service": "inventory", "operation": "GET /stock", "ns": 50},
        ]))
        .unwrap();
        let grouped = culprit_lines(&culprits, false);
        assert_eq!(
            grouped,
            vec![
                ("process".into(), "pricing, pid 7".into(), 900),
                (
                    "request".into(),
                    "2 requests of [pricing] GET /price".into(),
                    800
                ),
                ("request".into(), "b1 [inventory] GET /stock".into(), 50),
            ]
        );
        let detail = culprit_lines(&culprits, true);
        assert_eq!(detail.len(), 4);
        assert_eq!(detail[1].1, "a1 [pricing] GET /price");
    }

    #[test]
    fn culprits_and_evidence_show_as_they_always_have() {
        // Text fields as their JSON text without quotes at either end (a
        // quote inside shows escaped; one at the end is lost with its
        // escape's backslash left), thread ids of other hosts as hN:TID,
        // null evidence as null.
        let culprits: Vec<CulpritDoc> = serde_json::from_value(json!([
            {"kind": "span", "span_id": "ab", "service": "db", "operation": "SELECT \"x\"", "ns": 5},
            {"kind": "thread", "tid": (1 << 22) | 7, "pid": 5, "comm": "w", "name": "futex", "ns": 1},
        ]))
        .unwrap();
        let lines = culprit_lines(&culprits, false);
        assert_eq!(lines[0].1, r#"ab [db] SELECT \"x\"#);
        assert_eq!(lines[1].1, "w, tid h1:7, pid 5, futex");
        let evidence: Evidence =
            serde_json::from_value(json!({"share": 0.5, "ns": 1500, "gap": null})).unwrap();
        let mut out = Vec::new();
        print_cause(&mut out, "HEAD", &evidence, &culprits[1..], false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  HEAD\n  evidence: gap=null ns=1.50 µs share=50.0 %\n  culprit thread   \
             w, tid h1:7, pid 5, futex                                1 ns\n"
        );
    }

    #[test]
    fn a_long_chain_wraps_at_word_boundaries() {
        let chain =
            "[front] GET /product → behind 3 × [pricing] GET /price → PREEMPTED (throttled) 100 %";
        let lines = wrap(chain, 40);
        assert!(lines.iter().all(|l| l.chars().count() <= 40), "{lines:?}");
        assert_eq!(lines.join(" ").replace("   ", " "), chain);
    }
}
