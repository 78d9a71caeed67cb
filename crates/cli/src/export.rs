//! `deepspan export RUN`: the run's spans with their kernel critical paths,
//! as OTLP to a file or an endpoint, over `deepspan_export`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use deepspan_export::{export_run, send_otlp, write_json, ExportOptions, Protocol, SendOptions};

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan export run1 --out run1.otlp.json              # OTLP/JSON lines, one trace a line
  deepspan export run1 --otlp http://127.0.0.1:4318      # OTLP/HTTP (protobuf, gzip)
  deepspan export run1 --otlp http://127.0.0.1:4317      # OTLP/gRPC (port 4317 or grpc://)

Attribute names: docs/otel-attributes.md.")]
pub struct ExportArgs {
    /// The run folder (analysed by `deepspan analyze`).
    pub run: PathBuf,
    /// Write OTLP/JSON (one ExportTraceServiceRequest per line, one trace
    /// each; `deepspan import` reads it back).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Send to an OTLP endpoint: http://HOST:4318 (HTTP/protobuf; the path
    /// /v1/traces is added when the URL has none) or http://HOST:4317 /
    /// grpc://HOST:PORT (gRPC).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// The OTLP transport, when the URL does not tell.
    #[arg(long, value_enum)]
    pub protocol: Option<ProtocolArg>,
    /// Do not gzip what is sent.
    #[arg(long)]
    pub no_gzip: bool,
    /// Tries per request before giving up (retryable answers and
    /// unreachable servers are retried with backoff).
    #[arg(long, default_value_t = 6)]
    pub attempts: u32,
    /// Path pieces and system calls shorter than this (ms) are folded or
    /// left out...
    #[arg(long, default_value_t = 1.0, value_name = "MS")]
    pub min_ms: f64,
    /// ...and so are those shorter than this share of their request (%).
    #[arg(long, default_value_t = 1.0, value_name = "PERCENT")]
    pub min_percent: f64,
    /// Most spans per trace before its kernel spans are folded coarser.
    #[arg(long, default_value_t = deepspan_export::DEFAULT_MAX_SPANS_PER_TRACE)]
    pub max_spans_per_trace: usize,
    /// Most bytes (OTLP protobuf) per trace; Tempo refuses traces over 5 MB
    /// by default.
    #[arg(long, default_value_t = deepspan_export::DEFAULT_MAX_BYTES_PER_TRACE)]
    pub max_bytes_per_trace: usize,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ProtocolArg {
    Grpc,
    #[value(name = "http/protobuf", alias = "http")]
    HttpProtobuf,
}

pub fn run(args: ExportArgs) -> Result<()> {
    if args.out.is_none() && args.otlp.is_none() {
        bail!("say where to export: --out FILE.json and/or --otlp URL");
    }
    if !(args.min_ms >= 0.0 && args.min_percent >= 0.0 && args.min_percent <= 100.0) {
        bail!("--min-ms must be >= 0 and --min-percent within 0..=100");
    }
    let mut options = ExportOptions::default();
    options.thresholds.min_ns = (args.min_ms * 1e6).round() as u64;
    options.thresholds.min_share = args.min_percent / 100.0;
    options.max_spans_per_trace = args.max_spans_per_trace;
    options.max_bytes_per_trace = args.max_bytes_per_trace;
    let started = Instant::now();
    let export = export_run(&args.run, &options)
        .with_context(|| format!("cannot export {}", args.run.display()))?;
    for note in &export.notes {
        eprintln!("note: {note}");
    }
    let s = &export.stats;
    eprintln!(
        "{} spans in {} traces; {} of {} requests with their kernel path: {} path pieces joined into {}, {} child spans ({} folded pieces), {} system-call spans, {} span events{}",
        s.run_spans,
        s.traces,
        s.requests_enriched,
        s.requests,
        s.path_pieces,
        s.joined_pieces,
        s.path_spans,
        s.folded_pieces,
        s.syscall_spans,
        s.events,
        if s.traces_refolded > 0 {
            format!("; {} traces folded coarser to fit the budget", s.traces_refolded)
        } else {
            String::new()
        }
    );
    if let Some(path) = &args.out {
        let bytes = write_json(&export, path)?;
        eprintln!("wrote {} ({bytes} bytes)", path.display());
    }
    if let Some(url) = &args.otlp {
        let send = SendOptions {
            protocol: args.protocol.map(|p| match p {
                ProtocolArg::Grpc => Protocol::Grpc,
                ProtocolArg::HttpProtobuf => Protocol::HttpProtobuf,
            }),
            gzip: !args.no_gzip,
            max_attempts: args.attempts.max(1),
            ..SendOptions::default()
        };
        let report = send_otlp(&export, url, &send)?;
        eprintln!(
            "sent {} spans in {} requests ({} protobuf bytes, {:?}{}, {} retries) to {url}",
            report.spans,
            report.requests,
            report.bytes,
            report.protocol.unwrap_or(Protocol::HttpProtobuf),
            if send.gzip { ", gzip" } else { "" },
            report.retries
        );
        if report.rejected_spans > 0 || !report.messages.is_empty() {
            bail!(
                "the server rejected {} spans: {}",
                report.rejected_spans,
                report.messages.join("; ")
            );
        }
    }
    eprintln!("done in {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}
