//! The `deepspan` command: a thin layer of argument parsing and output
//! formatting over the library crates.

mod agent;
mod analyze;
mod dcpt;
mod decode;
mod demo;
mod export;
mod import_ctf;
mod profile;
mod progress;
mod receive;
mod record;
mod spans_cmd;
mod sync;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// deepspan explains why a request was slow, down to the kernel: it joins
/// distributed-tracing spans with Linux kernel traces and gives every request
/// a critical path made of kernel states.
#[derive(Parser)]
#[command(name = "deepspan", version, about, long_about = None, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record a kernel trace (and the run's clocks) into a run folder.
    ///
    /// Records in a private tracefs instance with the monotonic clock, so
    /// nothing else using ftrace is disturbed; the instance is removed on
    /// exit, error, SIGINT and SIGTERM. With `-- CMD ARGS…` the command is run
    /// and traced until it exits, and its exit status becomes deepspan's.
    Record(record::RecordArgs),
    /// Decode a kernel trace (trace.dat file, CTF folder or run folder) to JSON.
    ///
    /// `--format json` prints a summary (event counts by name, lost events);
    /// `--format jsonl` prints every event on its own line in time order.
    Decode(decode::DecodeArgs),
    /// Receive OTLP spans (gRPC and HTTP) into a run folder, without kernel
    /// tracing, until SIGINT/SIGTERM or `--duration`.
    Receive(receive::ReceiveArgs),
    /// Import span files (OTLP, Jaeger, Zipkin) into a run folder.
    Import(spans_cmd::ImportArgs),
    /// Span analyses that need no kernel trace.
    Spans(spans_cmd::SpansArgs),
    /// Analyse a run: every request's kernel critical path and where its
    /// time went; writes Parquet tables and requests.json under RUN/analysis/
    /// and prints the slowest requests.
    Analyze(analyze::AnalyzeArgs),
    /// One request's kernel critical path and summary (after `analyze`).
    Report(analyze::ReportArgs),
    /// Run the demo shop with injected faults (CPU quota, CPU hog, lock,
    /// database row lock, disk flood, slow network), record, analyse and
    /// check that each fault is diagnosed.
    Demo(demo::DemoArgs),
    /// Export the run's spans to Jaeger, Tempo or a collector (OTLP), each
    /// request with its kernel critical path as child spans, its diagnosis
    /// as attributes and notable kernel events as span events.
    Export(export::ExportArgs),
    /// Serve the web UI over an analysed run (127.0.0.1:7878 by default).
    ///
    /// Views: the requests, one request's span Gantt chart and kernel
    /// critical path per thread with its summary and diagnosis, the
    /// requests running at the same time, and CPUs and threads over time.
    Ui(ui::UiArgs),
    /// Each host's clock as a linear transform of a reference host's, from
    /// client/server span pairs (run folders) and TCP segments (LTTng CTF
    /// folders, runs recorded with --tcp-keys) matched across hosts, with
    /// its quality and bounds.
    Sync(sync::SyncArgs),
    /// In-band critical paths (`deepspan-dcpt-path` reply headers written
    /// by the deepspan_otel.dcpt middleware).
    Dcpt(dcpt::DcptArgs),
    /// A request's (or an operation's) wall time as a pprof profile: CPU
    /// stacks sampled by `record --profile` on its RUNNING pieces, and its
    /// off-CPU pieces as frames that say why it waited.
    Profile(profile::ProfileArgs),
    /// Live agent: receive OTLP spans and forward them (Jaeger, Tempo, a
    /// collector); a span much slower than its operation's norm gets a
    /// kernel snapshot of its time, analysed at once, and goes on carrying
    /// the diagnosis (`deepspan.cause`, …) and the snapshot's id.
    ///
    /// Keeps a flight recorder (a tracefs instance in overwrite mode) for
    /// its lifetime; SIGINT/SIGTERM send what is queued and remove it.
    Agent(agent::AgentArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(args) => record::run(args),
        Command::Decode(args) => decode::run(args).map(|()| ExitCode::SUCCESS),
        Command::Receive(args) => receive::run(args),
        Command::Import(args) => spans_cmd::import(args).map(|()| ExitCode::SUCCESS),
        Command::Spans(args) => spans_cmd::run(args).map(|()| ExitCode::SUCCESS),
        Command::Analyze(args) => analyze::run(args).map(|()| ExitCode::SUCCESS),
        Command::Report(args) => analyze::report(args).map(|()| ExitCode::SUCCESS),
        Command::Demo(args) => demo::run(args),
        Command::Export(args) => export::run(args).map(|()| ExitCode::SUCCESS),
        Command::Ui(args) => ui::run(args).map(|()| ExitCode::SUCCESS),
        Command::Sync(args) => sync::run(args).map(|()| ExitCode::SUCCESS),
        Command::Dcpt(args) => dcpt::run(args).map(|()| ExitCode::SUCCESS),
        Command::Profile(args) => profile::run(args).map(|()| ExitCode::SUCCESS),
        Command::Agent(args) => agent::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // A closed stdout (`deepspan decode … | head`) is not an error worth a message.
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("deepspan: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
    })
}
