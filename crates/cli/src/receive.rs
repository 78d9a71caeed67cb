//! `deepspan receive`, and the OTLP receiver `deepspan record` runs beside
//! the kernel recording: argument parsing, signals, and the run manifest's
//! `otlp` section, over `deepspan_otlp`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use deepspan_otlp::{Protocol, Receiver, ReceiverConfig, ReceiverHandle, ReceiverStats};
use deepspan_record::{clock_sample, host_name};
use deepspan_run::{Manifest, OtlpPorts, Run};

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan receive -o run1                      # until Ctrl-C, on 4317 (gRPC) and 4318 (HTTP)
  deepspan receive -o run2 --duration 60 --otlp-http-port 14318
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 ./app   # in another shell")]
pub struct ReceiveArgs {
    /// Run folder to write spans into (created if needed; an existing run
    /// gets a new span file).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Port of the OTLP/gRPC receiver on 127.0.0.1 (0 = any free port).
    #[arg(long, default_value_t = deepspan_otlp::DEFAULT_GRPC_PORT)]
    otlp_grpc_port: u16,
    /// Port of the OTLP/HTTP receiver on 127.0.0.1 (0 = any free port).
    #[arg(long, default_value_t = deepspan_otlp::DEFAULT_HTTP_PORT)]
    otlp_http_port: u16,
    /// Stop after this many seconds (fractions allowed); default: until SIGINT or SIGTERM.
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
}

pub fn run(args: ReceiveArgs) -> Result<ExitCode> {
    let duration = match args.duration {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => bail!("--duration must be a positive number of seconds, not {s}"),
    };
    let run = &args.output;
    std::fs::create_dir_all(run)
        .with_context(|| format!("cannot create the run folder {}", run.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .context("cannot install the SIGINT/SIGTERM handlers")?;
    }

    let mut samples = vec![clock_sample()];
    let receiver = start_receiver(
        run,
        Some(args.otlp_grpc_port),
        Some(args.otlp_http_port),
        "",
    )?;
    let (grpc, http) = bound(&receiver);
    // Scripts read the real ports (port 0) from this line; keep its shape.
    eprintln!(
        "deepspan: receiving OTLP/gRPC on {grpc} and OTLP/HTTP on {http} into {}",
        run.display()
    );
    eprintln!(
        "deepspan: stop with Ctrl-C{}",
        match duration {
            Some(d) => format!(" (or after {:.1} s)", d.as_secs_f64()),
            None => String::new(),
        }
    );

    let started = Instant::now();
    let mut next_sample = started + Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) && duration.is_none_or(|d| started.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() >= next_sample {
            samples.push(clock_sample());
            next_sample += Duration::from_secs(1);
        }
    }
    let stats = receiver.shutdown().context("the OTLP receiver failed")?;
    samples.push(clock_sample());

    let otlp = otlp_section(Some(grpc), Some(http), &stats);
    if Run::new(run).manifest().exists() {
        // The manifest belongs to the recording; the receiver owns its
        // `otlp` section only.
        Manifest::patch_section(run, "otlp", &otlp)?;
    } else {
        Manifest::spans_only(host_name(), samples, otlp).save(run)?;
    }
    eprintln!("deepspan: {}", describe(&stats));
    if let Some(e) = &stats.last_write_error {
        bail!("{} write errors; spans were lost: {e}", stats.write_errors);
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts the OTLP receiver of a `deepspan record` run, before the recording
/// (so the command it runs finds it listening). `None` disables a
/// transport; port 0 picks a free port (read it back from the handle).
///
/// The receiver creates `run/spans/` only when the first span arrives.
pub fn start_run_receiver(
    run: &Path,
    grpc_port: Option<u16>,
    http_port: Option<u16>,
) -> Result<ReceiverHandle> {
    start_receiver(
        run,
        grpc_port,
        http_port,
        " or --no-otlp to record without spans",
    )
}

/// Stops the receiver of a recording once `deepspan_record::record` has
/// written the manifest: drains and flushes the spans, then records the
/// bound ports and the receiver's counters in the manifest's `otlp` section
/// (the rest of the manifest is left as it is). Returns the counters; write
/// errors are an error (spans were lost).
pub fn finish_run_receiver(handle: ReceiverHandle, run: &Path) -> Result<ReceiverStats> {
    let (grpc, http) = (handle.grpc_addr(), handle.http_addr());
    let stats = handle.shutdown().context("the OTLP receiver failed")?;
    if Run::new(run).manifest().exists() {
        Manifest::patch_section(run, "otlp", &otlp_section(grpc, http, &stats))?;
    }
    if stats.spans_received > 0 || stats.requests > 0 {
        eprintln!("deepspan: {}", describe(&stats));
    }
    if let Some(e) = &stats.last_write_error {
        bail!(
            "{} OTLP span write errors; spans were lost: {e}",
            stats.write_errors
        );
    }
    Ok(stats)
}

fn start_receiver(
    run: &Path,
    grpc_port: Option<u16>,
    http_port: Option<u16>,
    alternative: &str,
) -> Result<ReceiverHandle> {
    let on_loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let mut config = ReceiverConfig::new(run);
    config.grpc_addr = grpc_port.map(on_loopback);
    config.http_addr = http_port.map(on_loopback);
    Receiver::start(config).map_err(|e| {
        let hint = match &e {
            deepspan_otlp::Error::Bind { protocol, addr, .. } => {
                let flag = match protocol {
                    Protocol::Grpc => "--otlp-grpc-port",
                    Protocol::Http => "--otlp-http-port",
                };
                Some(format!(
                    "OTLP/{protocol} port {} is not available; choose another with {flag} N (0 = any free port){alternative}",
                    addr.port()
                ))
            }
            _ => None,
        };
        match hint {
            Some(hint) => anyhow::Error::new(e).context(hint),
            None => anyhow::Error::new(e),
        }
    })
}

fn bound(r: &ReceiverHandle) -> (SocketAddr, SocketAddr) {
    (
        r.grpc_addr().expect("gRPC enabled"),
        r.http_addr().expect("HTTP enabled"),
    )
}

/// The manifest's `otlp` section: the bound ports (0 for a disabled
/// transport) and the receiver's counters.
fn otlp_section(
    grpc: Option<SocketAddr>,
    http: Option<SocketAddr>,
    stats: &ReceiverStats,
) -> OtlpPorts {
    OtlpPorts {
        grpc_port: grpc.map_or(0, |a| a.port()),
        http_port: http.map_or(0, |a| a.port()),
        receiver: Some(serde_json::to_value(stats).expect("plain counters")),
    }
}

fn describe(s: &ReceiverStats) -> String {
    let mut text = format!(
        "OTLP: {} spans written from {} requests ({} bytes)",
        s.spans_written, s.requests, s.bytes
    );
    if s.spans_dropped > 0 || s.requests_rejected > 0 || s.requests_invalid > 0 {
        text.push_str(&format!(
            "; {} spans not stored, {} requests refused while the queue was full (exporters retry them), {} malformed requests",
            s.spans_dropped, s.requests_rejected, s.requests_invalid
        ));
    }
    text
}
