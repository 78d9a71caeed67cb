//! `deepspan import` (span files into a run) and `deepspan spans …` (span
//! analyses that need no kernel trace), over `deepspan_spans`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use deepspan_model::human;
use deepspan_spans::{
    crisp::{crisp_report, CrispOptions, CrispReport},
    critical_path::critical_path_report_with,
    group_traces, import_file, import_into_run_with_ust, CriticalPathOptions, CriticalPathReport,
    Format,
};

use crate::import_ctf;

/// Warnings printed per command before they are summarised.
const MAX_WARNINGS_SHOWN: usize = 20;

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan import -o run2 --jaeger trace.json
  deepspan import -o run2 spans.otlp.json zipkin.json     # formats recognised
  deepspan import -o run1 --otlp collector-export.jsonl   # spans into a recorded run
  deepspan import -o run3 --ctf ~/lttng-traces/session-1/ --jaeger trace.json   # the paper's setup")]
pub struct ImportArgs {
    /// Run folder to import into (created if needed; existing spans are kept).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// OTLP file: JSON (one request, or one per line) or protobuf.
    #[arg(long = "otlp", value_name = "FILE")]
    otlp: Vec<PathBuf>,
    /// Jaeger JSON file (UI download or query API answer).
    #[arg(long = "jaeger", value_name = "FILE")]
    jaeger: Vec<PathBuf>,
    /// Zipkin v2 JSON file.
    #[arg(long = "zipkin", value_name = "FILE")]
    zipkin: Vec<PathBuf>,
    /// LTTng CTF trace folder (a session's output: kernel and/or ust
    /// traces), copied into the run as its kernel trace (`kernel/ctf/`;
    /// hard links when on the same file system). `jaeger_ust` span events in
    /// it become spans, or give the imported spans with the same ids their
    /// thread and trace times.
    #[arg(long = "ctf", value_name = "DIR")]
    ctf: Option<PathBuf>,
    /// Span files in any of these formats, recognised by content.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
}

pub fn import(args: ImportArgs) -> Result<()> {
    // (file, the format the user said it is)
    let mut inputs: Vec<(PathBuf, Option<Expected>)> = Vec::new();
    inputs.extend(args.otlp.into_iter().map(|p| (p, Some(Expected::Otlp))));
    inputs.extend(args.jaeger.into_iter().map(|p| (p, Some(Expected::Jaeger))));
    inputs.extend(args.zipkin.into_iter().map(|p| (p, Some(Expected::Zipkin))));
    inputs.extend(args.files.into_iter().map(|p| (p, None)));
    if inputs.is_empty() && args.ctf.is_none() {
        bail!("nothing to import: give span files (--otlp, --jaeger, --zipkin or plain paths) or an LTTng trace (--ctf DIR)");
    }
    let mut ust_spans = Vec::new();
    if let Some(dir) = &args.ctf {
        ust_spans = import_ctf::import(dir, &args.output)?;
        if inputs.is_empty() && ust_spans.is_empty() {
            return Ok(());
        }
    }
    let paths: Vec<PathBuf> = inputs.iter().map(|(p, _)| p.clone()).collect();
    let result = import_into_run_with_ust(&paths, ust_spans, &args.output)
        .with_context(|| format!("nothing imported into {}", args.output.display()))?;
    // Formats are recognised by content; a file given as another format is a
    // mistake worth stopping for (the user may have swapped files).
    for ((path, expected), (_, format, _)) in inputs.iter().zip(&result.inputs) {
        if let Some(expected) = expected {
            if !expected.matches(*format) {
                let _ = std::fs::remove_file(&result.file);
                bail!(
                    "{} was given as {} but is {}; nothing imported",
                    path.display(),
                    expected.flag(),
                    format.name()
                );
            }
        }
    }
    let mut out = std::io::stdout().lock();
    let mut total = 0;
    for (path, format, spans) in &result.inputs {
        writeln!(out, "{}: {spans} spans ({})", path.display(), format.name())?;
        total += spans;
    }
    if result.ust_matched > 0 {
        writeln!(
            out,
            "{} of them took their thread and trace times from jaeger_ust events",
            result.ust_matched
        )?;
    }
    if result.ust_added > 0 {
        writeln!(
            out,
            "{} spans known only from jaeger_ust events",
            result.ust_added
        )?;
        total += result.ust_added;
    }
    writeln!(out, "imported {total} spans into {}", result.file.display())?;
    print_warnings(&result.warnings);
    Ok(())
}

#[derive(Clone, Copy)]
enum Expected {
    Otlp,
    Jaeger,
    Zipkin,
}

impl Expected {
    fn matches(self, f: Format) -> bool {
        match self {
            Expected::Otlp => matches!(
                f,
                Format::OtlpJson | Format::OtlpProtobuf | Format::OtlpProtobufStream
            ),
            Expected::Jaeger => f == Format::JaegerJson,
            Expected::Zipkin => f == Format::ZipkinJson,
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Expected::Otlp => "--otlp",
            Expected::Jaeger => "--jaeger",
            Expected::Zipkin => "--zipkin",
        }
    }
}

fn print_warnings(warnings: &[String]) {
    for w in warnings.iter().take(MAX_WARNINGS_SHOWN) {
        eprintln!("deepspan: warning: {w}");
    }
    if warnings.len() > MAX_WARNINGS_SHOWN {
        eprintln!(
            "deepspan: warning: … and {} more warnings",
            warnings.len() - MAX_WARNINGS_SHOWN
        );
    }
}

#[derive(Args)]
pub struct SpansArgs {
    #[command(subcommand)]
    command: SpansCommand,
}

#[derive(Subcommand)]
enum SpansCommand {
    /// Span-level critical path of every trace (Jaeger UI's algorithm) and
    /// where the time went: exclusive time on the path per `[service] operation`.
    ///
    /// Reads a span file of any supported format or a run folder. Clock skew
    /// between hosts is tolerated by default (children shifted into their
    /// parents, CRISP's 1 % overlap allowance); `--jaeger-ui` turns that off
    /// to reproduce Jaeger UI exactly.
    CriticalPath(CriticalPathArgs),
}

#[derive(Args)]
struct CriticalPathArgs {
    /// A span file (OTLP, Jaeger or Zipkin JSON, OTLP protobuf) or a run folder.
    path: PathBuf,
    /// `json`: every trace's sections and exclusive times; `text`: a table of
    /// the exclusive time per operation over all traces.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Exactly Jaeger UI's critical path: no clock-skew adjustment.
    #[arg(long)]
    jaeger_ui: bool,
    /// Whose rules: deepspan's (Jaeger UI's walk with skew handling), or
    /// CRISP's (uber-research/CRISP: overflowing children cut or capped,
    /// exclusive time per call path with overlaps zeroed, total work and
    /// the work erring spans would have saved), to compare with CRISP.
    #[arg(long, value_enum, default_value_t = Semantics::Deepspan)]
    semantics: Semantics,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Semantics {
    Deepspan,
    Crisp,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    Json,
    Text,
}

pub fn run(args: SpansArgs) -> Result<()> {
    match args.command {
        SpansCommand::CriticalPath(a) => critical_path(a),
    }
}

fn critical_path(args: CriticalPathArgs) -> Result<()> {
    let import = import_file(&args.path)
        .with_context(|| format!("cannot read spans from {}", args.path.display()))?;
    print_warnings(&import.warnings);
    if import.spans.is_empty() {
        bail!("{} holds no spans", args.path.display());
    }
    let traces = group_traces(import.spans);
    if args.semantics == Semantics::Crisp {
        if args.jaeger_ui {
            bail!("--jaeger-ui and --semantics crisp are two different rule sets: give one");
        }
        let report = crisp_report(&traces, CrispOptions::default());
        let mut out = std::io::stdout().lock();
        match args.format {
            OutputFormat::Json => {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            }
            OutputFormat::Text => write_crisp_table(&mut out, &report, &args.path)?,
        }
        return Ok(());
    }
    let options = if args.jaeger_ui {
        CriticalPathOptions::jaeger_ui()
    } else {
        CriticalPathOptions::default()
    };
    let report = critical_path_report_with(&traces, options);
    let mut out = std::io::stdout().lock();
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => write_table(&mut out, &report, &args.path)?,
    }
    Ok(())
}

/// Operations by exclusive time on the critical path, largest first.
fn write_table(out: &mut impl Write, report: &CriticalPathReport, source: &Path) -> Result<()> {
    let total: u64 = report.aggregate_exclusive_ns.values().sum();
    let mut rows: Vec<(&String, &u64)> = report.aggregate_exclusive_ns.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let traces_with = |op: &str| {
        report
            .traces
            .iter()
            .filter(|t| t.exclusive_ns.contains_key(op))
            .count()
    };
    writeln!(
        out,
        "critical path of {} traces from {}: {} on the path",
        report.traces.len(),
        source.display(),
        human::duration(total)
    )?;
    let width = rows
        .iter()
        .map(|r| r.0.chars().count())
        .max()
        .unwrap_or(0)
        .max(20);
    writeln!(
        out,
        "{:<width$}  {:>12}  {:>7}  {:>6}",
        "[service] operation", "exclusive", "share", "traces"
    )?;
    for (op, ns) in rows {
        let share = if total == 0 {
            0.0
        } else {
            *ns as f64 / total as f64
        };
        writeln!(
            out,
            "{op:<width$}  {:>12}  {:>7}  {:>6}",
            human::duration(*ns),
            human::share(share),
            traces_with(op)
        )?;
    }
    Ok(())
}

/// CRISP's exclusive time per operation, largest first, and its work figures.
fn write_crisp_table(out: &mut impl Write, report: &CrispReport, source: &Path) -> Result<()> {
    let total: u64 = report.op_time_exclusive_ns.values().sum();
    let mut rows: Vec<(&String, &u64)> = report.op_time_exclusive_ns.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    writeln!(
        out,
        "critical path (CRISP's rules) of {} roots from {}: {} on the path",
        report.roots.len(),
        source.display(),
        human::duration(total),
    )?;
    writeln!(
        out,
        "if erring spans returned at once: {} saved on the critical path, {} of {} total work",
        human::duration(report.time_saved_on_cp_ns),
        human::duration(report.time_saved_on_work_ns),
        human::duration(report.total_work_ns)
    )?;
    let width = rows
        .iter()
        .map(|r| r.0.chars().count())
        .max()
        .unwrap_or(0)
        .max(20);
    writeln!(
        out,
        "{:<width$}  {:>12}  {:>7}",
        "[service] operation", "exclusive", "share"
    )?;
    for (op, ns) in rows {
        let share = if total == 0 {
            0.0
        } else {
            *ns as f64 / total as f64
        };
        let share = human::share(share);
        writeln!(
            out,
            "{op:<width$}  {:>12}  {share:>7}",
            human::duration(*ns)
        )?;
    }
    Ok(())
}
