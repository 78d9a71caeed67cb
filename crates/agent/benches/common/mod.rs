//! What the agent's end-to-end benches share: the release `deepspan agent`
//! as a child process pinned to one CPU, an in-process OTLP sink it
//! forwards to (deepspan's own receiver with a counting `RequestSink`),
//! realistic pre-encoded export requests, and a load generator over
//! `deepspan_export::OtlpClient`.

#![allow(dead_code)] // each bench uses its own part

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use deepspan_export::{ClientOptions, OtlpClient};
use deepspan_otlp::{Receiver, ReceiverConfig, ReceiverHandle, RequestSink};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value::Value, AnyValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, ResourceSpans, ScopeSpans, Span};
use prost::Message;

/// The CPU the generator and the sink run on; the agent gets the other one.
pub const GENERATOR_CPU: usize = 0;
pub const AGENT_CPU: usize = 1;

/// Pins the calling process (all its threads created from now on) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

/// The release `deepspan` next to this bench binary
/// (`target/release/deps/<bench>` → `target/release/deepspan`), or
/// `DEEPSPAN_BIN`.
pub fn deepspan_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("DEEPSPAN_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().expect("own path");
    let release = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/release");
    let bin = release.join("deepspan");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p deepspan` first (or set DEEPSPAN_BIN)",
        bin.display()
    );
    bin
}

/// A span carrying `deepspan.diagnosis`, as the sink received it.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub span_id: Vec<u8>,
    pub diagnosis: String,
    pub snapshot: Option<String>,
    pub skip_reason: Option<String>,
    pub at: Instant,
    pub at_wall_ns: u64,
}

/// Counts the spans it is given; when watching, decodes every request and
/// notes the spans that carry a diagnosis.
struct CountingSink {
    spans: Arc<AtomicU64>,
    arrivals: Option<Arc<Mutex<Vec<Arrival>>>>,
}

impl RequestSink for CountingSink {
    fn accept(
        &mut self,
        encoded: Bytes,
        spans: u64,
        _digest: deepspan_otlp::RequestDigest,
    ) -> Result<(), String> {
        if let Some(arrivals) = &self.arrivals {
            let at = Instant::now();
            let at_wall_ns = wall_ns();
            let request = ExportTraceServiceRequest::decode(encoded).map_err(|e| e.to_string())?;
            let mut found = Vec::new();
            for span in request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
            {
                let text = |key: &str| {
                    span.attributes
                        .iter()
                        .find(|kv| kv.key == key)
                        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                            Value::StringValue(s) => Some(s.clone()),
                            _ => None,
                        })
                };
                if let Some(diagnosis) = text("deepspan.diagnosis") {
                    found.push(Arrival {
                        span_id: span.span_id.clone(),
                        diagnosis,
                        snapshot: text("deepspan.snapshot"),
                        skip_reason: text("deepspan.skip_reason"),
                        at,
                        at_wall_ns,
                    });
                }
            }
            arrivals.lock().unwrap().extend(found);
        }
        self.spans.fetch_add(spans, Ordering::Relaxed);
        Ok(())
    }
}

/// deepspan's OTLP/HTTP receiver on a free loopback port, counting.
pub struct Sink {
    pub handle: ReceiverHandle,
    pub spans: Arc<AtomicU64>,
    pub arrivals: Arc<Mutex<Vec<Arrival>>>,
    _dir: tempfile::TempDir,
}

impl Sink {
    pub fn start(watch: bool) -> Sink {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ReceiverConfig::new(dir.path());
        config.grpc_addr = None;
        config.http_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        let spans = Arc::new(AtomicU64::new(0));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let sink = CountingSink {
            spans: spans.clone(),
            arrivals: watch.then(|| arrivals.clone()),
        };
        let handle = Receiver::start_with_sink(config, Box::new(sink)).expect("sink starts");
        Sink {
            handle,
            spans,
            arrivals,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.handle.http_addr().unwrap())
    }

    pub fn received(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }

    /// Waits until `spans` have arrived; false on timeout.
    pub fn wait_for(&self, spans: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.received() < spans {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        true
    }
}

/// A running `deepspan agent`, pinned to [`AGENT_CPU`].
pub struct AgentProcess {
    child: Child,
    pub http: SocketAddr,
    pub metrics: SocketAddr,
    pub snapshots: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl AgentProcess {
    /// Starts the agent forwarding to `forward`, on free ports, with
    /// `extra` flags (buffer sizes, settle…) and its snapshots in a
    /// temporary folder.
    pub fn start(forward: &str, extra: &[&str]) -> AgentProcess {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = dir.path().join("snapshots");
        let cpu = AGENT_CPU.min(available_cpus() - 1);
        let mut command = Command::new(deepspan_binary());
        command
            .args(["agent", "--forward", forward])
            .args([
                "--otlp-grpc-port",
                "0",
                "--otlp-http-port",
                "0",
                "--metrics-port",
                "0",
            ])
            .arg("--snapshots")
            .arg(&snapshots)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || pin_to_cpu(cpu));
        }
        let mut child = command.spawn().expect("deepspan agent starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (lines, ready) = mpsc::channel();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
                let _ = lines.send(line);
            }
        });
        let (mut http, mut metrics) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while http.is_none() || metrics.is_none() {
            let line = ready
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| {
                    let _ = child.kill();
                    panic!(
                        "deepspan agent did not start:\n{}",
                        log.lock().unwrap().join("\n")
                    )
                });
            if let Some(rest) = line.split_once("OTLP/HTTP on ").map(|(_, r)| r) {
                http = rest.split(',').next().and_then(|a| a.trim().parse().ok());
            }
            if let Some(rest) = line.split_once("metrics on http://").map(|(_, r)| r) {
                metrics = rest.split('/').next().and_then(|a| a.parse().ok());
            }
        }
        AgentProcess {
            child,
            http: http.unwrap(),
            metrics: metrics.unwrap(),
            snapshots,
            log,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// VmHWM: the most resident memory the agent ever had, bytes.
    pub fn peak_rss(&self) -> u64 {
        proc_status_kb(self.child.id(), "VmHWM:") * 1024
    }

    /// User + system CPU seconds the agent has used.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the command name (which may hold spaces) start at state.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// The `/metrics` text.
    pub fn metrics_text(&self) -> String {
        let mut stream = TcpStream::connect(self.metrics).unwrap();
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    }

    /// One counter or gauge from `/metrics` (the sum over its labels).
    pub fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.metrics_text(), name)
    }

    /// SIGTERM, then waits for the agent to flush and exit.
    pub fn stop(mut self) -> Vec<String> {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().unwrap();
        let log = self.log.lock().unwrap().clone();
        assert!(
            status.success(),
            "deepspan agent: {status}\n{}",
            log.join("\n")
        );
        log
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The sum of the samples of `name` (any labels) in Prometheus text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn proc_status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A service of the synthetic shop: its name and its operations with
/// their median durations.
struct Service {
    name: &'static str,
    operations: &'static [(&'static str, &'static str, u64)],
}

/// (span name, route, median ns) per service: a few services and
/// operations, as a small shop has.
const SERVICES: &[Service] = &[
    Service {
        name: "front",
        operations: &[
            ("GET /product", "/product", 4_000_000),
            ("POST /checkout", "/checkout", 25_000_000),
            ("GET /image", "/image", 9_000_000),
        ],
    },
    Service {
        name: "inventory",
        operations: &[
            ("GET /stock", "/stock", 2_000_000),
            ("POST /reserve", "/reserve", 12_000_000),
        ],
    },
    Service {
        name: "pricing",
        operations: &[
            ("GET /price", "/price", 1_500_000),
            ("GET /quote", "/quote", 6_000_000),
        ],
    },
    Service {
        name: "media",
        operations: &[("GET /media", "/media", 7_000_000)],
    },
];

/// A deterministic stream of pseudo-random numbers (SplitMix64).
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

/// How a batch of synthetic traffic looks.
#[derive(Clone, Copy, Debug)]
pub struct Traffic {
    pub traces_per_request: usize,
    /// Between the ends of consecutive traces: the pace the timestamps
    /// pretend, so a window holds the spans of its own stretch of time.
    pub trace_spacing_ns: u64,
    /// One request span in this many is 10× its operation's median (0 = none).
    pub anomaly_every: u64,
}

/// Spans per trace in one service's batch: the SERVER span (the request
/// span the agent judges), a CLIENT call and an INTERNAL step.
pub const SPANS_PER_TRACE: usize = 3;

/// One exporter's batch: `traces_per_request` traces of one service, the
/// first ending at `end_ns` (wall clock), the next `trace_spacing_ns` later…. Durations are uniform in [0.7, 1.3] × the
/// operation's median (never anomalous: the rule is > 3 × median), except
/// every `anomaly_every`-th request span, 10 × the median. Returns the
/// encoded request and its anomalous span ids.
pub fn export_request(
    n: u64,
    traffic: Traffic,
    end_ns: u64,
    rng: &mut SplitMix,
) -> (Bytes, Vec<Vec<u8>>) {
    let service = &SERVICES[n as usize % SERVICES.len()];
    let mut anomalous = Vec::new();
    let mut spans = Vec::with_capacity(traffic.traces_per_request * SPANS_PER_TRACE);
    for t in 0..traffic.traces_per_request as u64 {
        let (name, route, median) =
            service.operations[rng.next() as usize % service.operations.len()];
        let serial = n * traffic.traces_per_request as u64 + t;
        let anomaly =
            traffic.anomaly_every > 0 && (serial + 1).is_multiple_of(traffic.anomaly_every);
        let duration = if anomaly {
            median * 10
        } else {
            (median as f64 * (0.7 + 0.6 * rng.unit())) as u64
        };
        let end = end_ns + t * traffic.trace_spacing_ns;
        let start = end - duration;
        let trace_id = ((rng.next() as u128) << 64 | serial as u128 | 1)
            .to_be_bytes()
            .to_vec();
        let root_id = (serial * 4 + 1).to_be_bytes().to_vec();
        if anomaly {
            anomalous.push(root_id.clone());
        }
        spans.push(Span {
            trace_id: trace_id.clone(),
            span_id: root_id.clone(),
            name: name.into(),
            kind: SpanKind::Server as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: vec![
                kv("http.request.method", s(name.split(' ').next().unwrap())),
                kv("http.route", s(route)),
                kv("url.path", s(&format!("{route}?id={}", serial % 50))),
                kv("url.scheme", s("http")),
                kv("http.response.status_code", Value::IntValue(200)),
                kv("server.address", s("127.0.0.1")),
                kv("server.port", Value::IntValue(8080)),
                kv("network.peer.address", s("127.0.0.1")),
                kv("network.protocol.version", s("1.1")),
                kv("user_agent.original", s("Python-urllib/3.11")),
            ],
            status: None,
            ..Span::default()
        });
        spans.push(Span {
            trace_id: trace_id.clone(),
            span_id: (serial * 4 + 2).to_be_bytes().to_vec(),
            parent_span_id: root_id.clone(),
            name: "SELECT shop".into(),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: start + duration / 10,
            end_time_unix_nano: start + duration / 2,
            attributes: vec![
                kv("db.system", s("postgresql")),
                kv("db.name", s("shop")),
                kv(
                    "db.statement",
                    s("SELECT qty, price FROM items WHERE id = %s"),
                ),
                kv("server.address", s("127.0.0.1")),
                kv("server.port", Value::IntValue(5432)),
            ],
            ..Span::default()
        });
        spans.push(Span {
            trace_id,
            span_id: (serial * 4 + 3).to_be_bytes().to_vec(),
            parent_span_id: root_id,
            name: "render".into(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: start + duration / 2,
            end_time_unix_nano: end - duration / 10,
            attributes: vec![
                kv("code.function", s("render_page")),
                kv("code.namespace", s("shop.web")),
            ],
            ..Span::default()
        });
    }
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", s(service.name)),
                    kv("service.version", s("1.4.2")),
                    kv("telemetry.sdk.language", s("python")),
                    kv("telemetry.sdk.name", s("opentelemetry")),
                    kv("telemetry.sdk.version", s("1.38.0")),
                    kv("host.name", s("shop-1")),
                    kv(
                        "process.pid",
                        Value::IntValue(4000 + n as i64 % SERVICES.len() as i64),
                    ),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "opentelemetry.instrumentation.wsgi".into(),
                    version: "0.59b0".into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    (Bytes::from(request.encode_to_vec()), anomalous)
}

/// Sends every request to `url` over `connections` concurrent connections
/// (one `OtlpClient` each), retrying what the receiver refuses; returns
/// the requests refused and retried.
pub fn send_all(url: &str, requests: &[Bytes], connections: usize, gzip: bool) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let requests: Arc<Vec<Bytes>> = Arc::new(requests.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let options = ClientOptions {
                protocol: None,
                gzip,
                timeout: Duration::from_secs(30),
            };
            let mut client = OtlpClient::new(url, &options).unwrap();
            let requests = requests.clone();
            let (next, retried) = (next.clone(), retried.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else {
                        break;
                    };
                    loop {
                        match client.send_encoded(request.clone()).await {
                            Ok(_) => break,
                            Err(failure) if failure.retry => {
                                retried.fetch_add(1, Ordering::Relaxed);
                                // A load generator: retry soon, not after Retry-After.
                                let wait = failure.after.unwrap_or_default();
                                tokio::time::sleep(wait.min(Duration::from_millis(2))).await;
                            }
                            Err(failure) => panic!("send failed: {}", failure.message),
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    retried.load(Ordering::Relaxed)
}

/// Median of a few measurements.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
