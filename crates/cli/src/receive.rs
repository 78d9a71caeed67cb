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
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde_json::{json, Value as Json};

const MANIFEST_FILE: &str = "manifest.json";
/// The manifest format `deepspan record` writes; `receive` writes the same version.
const MANIFEST_FORMAT_VERSION: u32 = 1;

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

    let mut samples = vec![clock_pair()];
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
            samples.push(clock_pair());
            next_sample += Duration::from_secs(1);
        }
    }
    let stats = receiver.shutdown().context("the OTLP receiver failed")?;
    samples.push(clock_pair());

    let otlp = otlp_section(grpc, http, &stats);
    let manifest = run.join(MANIFEST_FILE);
    if manifest.exists() {
        patch_manifest_key(run, "otlp", otlp)?;
    } else {
        write_minimal_manifest(run, &samples, otlp)?;
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
    if run.join(MANIFEST_FILE).exists() {
        patch_manifest_key(run, "otlp", otlp_section_opt(grpc, http, &stats))?;
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

fn otlp_section(grpc: SocketAddr, http: SocketAddr, stats: &ReceiverStats) -> Json {
    otlp_section_opt(Some(grpc), Some(http), stats)
}

/// The manifest's `otlp` value: the ports `deepspan record` writes (0 for a
/// disabled transport) and the receiver's counters under `receiver`.
fn otlp_section_opt(
    grpc: Option<SocketAddr>,
    http: Option<SocketAddr>,
    stats: &ReceiverStats,
) -> Json {
    json!({
        "grpc_port": grpc.map_or(0, |a| a.port()),
        "http_port": http.map_or(0, |a| a.port()),
        "receiver": stats,
    })
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

/// A (CLOCK_REALTIME, CLOCK_MONOTONIC) pair, as `deepspan record` samples
/// them: the realtime read bracketed by monotonic reads, the tightest of
/// three brackets kept, its midpoint as the monotonic value.
fn clock_pair() -> [u64; 2] {
    fn read(clock: libc::clockid_t) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid, writable timespec; these clocks always exist.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
    let mut best = (u64::MAX, [0, 0]);
    for _ in 0..3 {
        let m1 = read(libc::CLOCK_MONOTONIC);
        let r = read(libc::CLOCK_REALTIME);
        let m2 = read(libc::CLOCK_MONOTONIC);
        let width = m2.saturating_sub(m1);
        if width < best.0 {
            best = (width, [r, m1 + width / 2]);
        }
    }
    best.1
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates or truncates.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    }
}

/// The manifest of a spans-only run: enough for the clock mapping
/// (`clock_samples`) and to tell where the spans came from.
fn write_minimal_manifest(run: &Path, samples: &[[u64; 2]], otlp: Json) -> Result<()> {
    let point = |s: &[u64; 2]| json!({ "realtime_ns": s[0], "mono_ns": s[1] });
    let manifest = OrderedObject(vec![
        ("format_version".into(), json!(MANIFEST_FORMAT_VERSION)),
        ("host".into(), json!(hostname())),
        ("mode".into(), json!("receive")),
        ("start".into(), point(&samples[0])),
        (
            "end".into(),
            point(samples.last().expect("start and end samples")),
        ),
        ("clock_samples".into(), json!(samples)),
        ("otlp".into(), otlp),
    ]);
    save_manifest(run, &manifest)
}

/// Replaces (or adds) one top-level key of `run/manifest.json`, keeping the
/// other keys and their order as they are: the manifest belongs to
/// `deepspan record`, and this only owns its `otlp` section.
fn patch_manifest_key(run: &Path, key: &str, value: Json) -> Result<()> {
    let path = run.join(MANIFEST_FILE);
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut object: OrderedObject = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a JSON object", path.display()))?;
    match object.0.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => *v = value,
        None => object.0.push((key.to_string(), value)),
    }
    save_manifest(run, &object)
}

/// Through a temporary file, so a reader never sees half a manifest.
fn save_manifest(run: &Path, manifest: &OrderedObject) -> Result<()> {
    let path = run.join(MANIFEST_FILE);
    let tmp = run.join(format!("{MANIFEST_FILE}.partial"));
    let mut text = serde_json::to_vec_pretty(manifest)?;
    text.push(b'\n');
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A JSON object whose top-level keys keep their order (serde_json's map
/// sorts them unless a crate-wide feature is turned on).
struct OrderedObject(Vec<(String, Json)>);

impl serde::Serialize for OrderedObject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> serde::Deserialize<'de> for OrderedObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedObject, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Json>()? {
                    entries.push(entry);
                }
                Ok(OrderedObject(entries))
            }
        }
        d.deserialize_map(V)
    }
}
