//! `deepspan agent`: arguments, signals and printing over `deepspan_agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use deepspan_agent::{
    Agent, AgentConfig, DetectorConfig, FlightOptions, ForwardConfig, SnapshotConfig,
};
use deepspan_otlp::ReceiverConfig;

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan agent --forward http://127.0.0.1:14318           # Jaeger's OTLP/HTTP port
  deepspan agent --forward grpc://tempo:4317 --snapshots /var/lib/deepspan/snapshots
  deepspan ui /var/lib/deepspan/snapshots                   # the snapshots, each diagnosed")]
pub struct AgentArgs {
    /// Where every span goes on: an OTLP endpoint (`http://host:4318`,
    /// `http://host:4318/v1/traces`, `grpc://host:4317`, or port 4317 = gRPC).
    #[arg(long, value_name = "URL")]
    forward: String,
    /// The address the OTLP receivers listen on: loopback by default; on a
    /// node where applications in pods send to it, `0.0.0.0` (or the
    /// node's address).
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    listen: std::net::IpAddr,
    /// Port of the OTLP/gRPC receiver (0 = any free port).
    #[arg(long, default_value_t = deepspan_otlp::DEFAULT_GRPC_PORT)]
    otlp_grpc_port: u16,
    /// Port of the OTLP/HTTP receiver (0 = any free port).
    #[arg(long, default_value_t = deepspan_otlp::DEFAULT_HTTP_PORT)]
    otlp_http_port: u16,
    /// Folder of the snapshots (one run folder each).
    #[arg(long, value_name = "DIR", default_value = "deepspan-snapshots")]
    snapshots: PathBuf,
    /// Spans per (service, operation) in the sliding window of the baseline.
    #[arg(long, default_value_t = 500)]
    window: usize,
    /// A request span is anomalous above this many times its window's median.
    #[arg(long, default_value_t = 3.0)]
    threshold: f64,
    /// ... and above this quantile of its operation's last ordinary (not
    /// anomalous) spans, so that the operation's usual tail is not flagged;
    /// `off`: the median rule alone.
    #[arg(long, value_name = "Q|off", default_value = "0.99", value_parser = parse_tail_quantile)]
    tail_quantile: TailQuantile,
    /// Spans of an operation seen before any of them is judged.
    #[arg(long)]
    min_count: Option<usize>,
    /// Never anomalous below this many milliseconds.
    #[arg(long, value_name = "MS")]
    floor_ms: Option<f64>,
    /// Time added before and after a slow span's window, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    margin_ms: u64,
    /// Wait this long after a window ends for the spans around it, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    settle_ms: u64,
    /// An anomalous span waits this long for its diagnosis, milliseconds;
    /// later, it is sent marked `deepspan.diagnosis=pending` and the
    /// diagnosis follows as a child span.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    hold_ms: u64,
    /// Snapshots per minute at most.
    #[arg(long, default_value_t = 12)]
    max_snapshots_per_minute: u32,
    /// The agent's CPU, analyses included, as a percentage of one core: no
    /// snapshot starts while it has spent more (averaged over a minute; one
    /// analysis may overrun it, then the next waits). Skipped snapshots are
    /// counted as `cpu_budget`.
    #[arg(long, value_name = "PERCENT", default_value_t = 2.0)]
    cpu_budget: f64,
    /// Overlapping windows share one snapshot up to this length, seconds.
    #[arg(long, value_name = "S", default_value_t = 5)]
    max_window_s: u64,
    /// Most spans in a snapshot's span file (its analysis's memory grows
    /// with them, about 6 KiB each); over it, the requests nearest the slow
    /// spans are kept.
    #[arg(long, default_value_t = 20_000)]
    max_snapshot_spans: u64,
    /// Snapshots kept (oldest removed first).
    #[arg(long, default_value_t = 200)]
    retain: usize,
    /// Megabytes of snapshots kept (oldest removed first).
    #[arg(long, value_name = "MB", default_value_t = 2048)]
    retain_mb: u64,
    /// Where `deepspan ui SNAPSHOTS` is reachable, e.g.
    /// `http://127.0.0.1:7878/s/`: diagnosed spans then carry
    /// `deepspan.snapshot_url`, the snapshot's page.
    #[arg(long, value_name = "URL")]
    snapshot_url: Option<String>,
    /// Kernel ring buffer per CPU, KiB (read into the history every 100 ms).
    #[arg(long, value_name = "KB", default_value_t = 8 << 10)]
    buffer_kb: u64,
    /// Pages kept in memory per CPU, KiB: how far back a snapshot reaches.
    #[arg(long, value_name = "KB", default_value_t = 32 << 10)]
    history_kb: u64,
    /// Kernel events: a preset or a comma list (see `deepspan record
    /// --help`). `lean` by default: an agent stays on, and the system-call
    /// events were most of its cost (`--events analysis` for every call).
    #[arg(long, default_value = "lean")]
    events: String,
    /// Forward uncompressed (default: gzip, as OTLP exporters do; on
    /// loopback the compression only costs CPU).
    #[arg(long)]
    no_gzip: bool,
    /// Megabytes of spans waiting to be forwarded; beyond, the oldest are dropped.
    #[arg(long, value_name = "MB", default_value_t = 64)]
    queue_mb: usize,
    /// Megabytes of recent requests kept for the snapshots' span files.
    #[arg(long, value_name = "MB", default_value_t = 64)]
    recent_mb: usize,
    /// Port of `/metrics` (Prometheus text) on 127.0.0.1; 0 = any free port.
    #[arg(long, default_value_t = 9464)]
    metrics_port: u16,
    /// Serve no `/metrics`.
    #[arg(long)]
    no_metrics: bool,
    /// On SIGTERM/SIGINT, how long queued spans may take to go out, seconds.
    #[arg(long, value_name = "S", default_value_t = 10)]
    flush_s: u64,
    /// Stop after this many seconds; default: until SIGINT or SIGTERM.
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
}

/// `--tail-quantile`: a quantile, or `off` (None).
#[derive(Clone, Copy, Debug)]
struct TailQuantile(Option<f64>);

fn parse_tail_quantile(text: &str) -> Result<TailQuantile, String> {
    if text == "off" {
        return Ok(TailQuantile(None));
    }
    match text.parse::<f64>() {
        Ok(q) if q > 0.0 && q <= 1.0 => Ok(TailQuantile(Some(q))),
        _ => Err(format!(
            "{text:?} is neither a quantile in (0, 1] nor `off`"
        )),
    }
}

pub fn run(args: AgentArgs) -> Result<ExitCode> {
    let duration = match args.duration {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => bail!("--duration must be a positive number of seconds, not {s}"),
    };
    let floor_ns = match args.floor_ms {
        None => None,
        Some(ms) if ms.is_finite() && ms >= 0.0 => Some((ms * 1e6) as u64),
        Some(ms) => bail!("--floor-ms must be a number of milliseconds ≥ 0, not {ms}"),
    };
    if !(args.cpu_budget.is_finite() && args.cpu_budget > 0.0) {
        bail!(
            "--cpu-budget must be a positive percentage of one core, not {}",
            args.cpu_budget
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .context("cannot install the SIGINT/SIGTERM handlers")?;
    }

    let listen = |port| Some(SocketAddr::new(args.listen, port));
    let mut detector = DetectorConfig {
        window: args.window,
        threshold: args.threshold,
        tail_quantile: args.tail_quantile.0,
        floor_ns,
        ..DetectorConfig::default()
    };
    if let Some(n) = args.min_count {
        detector.min_count = n;
    }
    let mut snapshots = SnapshotConfig::new(&args.snapshots);
    snapshots.margin = Duration::from_millis(args.margin_ms);
    snapshots.settle = Duration::from_millis(args.settle_ms);
    snapshots.max_per_minute = args.max_snapshots_per_minute;
    snapshots.cpu_share = args.cpu_budget / 100.0;
    snapshots.max_window = Duration::from_secs(args.max_window_s);
    snapshots.retain_count = args.retain;
    snapshots.retain_bytes = args.retain_mb << 20;
    snapshots.url_prefix = args.snapshot_url.clone();
    snapshots.max_spans = args.max_snapshot_spans;
    let mut receiver = ReceiverConfig::new(&args.snapshots);
    receiver.grpc_addr = listen(args.otlp_grpc_port);
    receiver.http_addr = listen(args.otlp_http_port);
    let config = AgentConfig {
        forward_url: args.forward.clone(),
        forward: ForwardConfig {
            gzip: !args.no_gzip,
            max_queue_bytes: args.queue_mb << 20,
            ..ForwardConfig::default()
        },
        receiver,
        detector,
        flight: FlightOptions {
            buffer_kb_per_cpu: args.buffer_kb,
            history_kb_per_cpu: args.history_kb,
            events: args.events.clone().into(),
            otlp: deepspan_run::OtlpPorts {
                grpc_port: args.otlp_grpc_port,
                http_port: args.otlp_http_port,
                receiver: None,
            },
        },
        snapshots,
        hold: Duration::from_millis(args.hold_ms),
        max_held: 10_000,
        recent_bytes: args.recent_mb << 20,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory_bound = config.memory_bound_bytes(cpus);
    let agent = Agent::start(config).context("the agent could not start")?;
    let metrics = if args.no_metrics {
        None
    } else {
        let addr = SocketAddr::from(([127, 0, 0, 1], args.metrics_port));
        Some(agent.serve_metrics(addr).context("cannot serve /metrics")?)
    };
    let addr = |a: Option<SocketAddr>| a.map_or("-".to_string(), |a| a.to_string());
    // Scripts read the real ports (port 0) from this line; keep its shape.
    say(format_args!(
        "deepspan agent: receiving OTLP/gRPC on {} and OTLP/HTTP on {}, forwarding to {}",
        addr(agent.grpc_addr()),
        addr(agent.http_addr()),
        args.forward
    ));
    say(format_args!(
        "deepspan agent: flight recorder {} ({} KiB per CPU); snapshots in {}; metrics on {}; memory bound {} MiB",
        agent.instance_name(),
        args.buffer_kb,
        agent.snapshots_dir().display(),
        metrics
            .as_ref()
            .map_or("-".to_string(), |m| format!("http://{}/metrics", m.local_addr())),
        memory_bound >> 20
    ));
    for w in agent.flight_warnings() {
        say(format_args!("deepspan agent: warning: {w}"));
    }
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) && duration.is_none_or(|d| started.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(50));
    }
    say(format_args!(
        "deepspan agent: stopping (flushing up to {} s)",
        args.flush_s
    ));
    let stats = agent.shutdown(Duration::from_secs(args.flush_s));
    if let Some(m) = metrics {
        m.shutdown();
    }
    say(format_args!("deepspan agent: {}", stats.summary));
    Ok(ExitCode::SUCCESS)
}

/// A line on stderr, whether or not anyone still reads it. The agent
/// outlives a parent that died or a pipe closed behind it, and
/// `eprintln!` would then panic the main thread; it must still stop in
/// order (the flight recorder's instance removed, the queue flushed).
fn say(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
