//! A real Jaeger v2 for tests: the all-in-one binary (built from the Go
//! module proxy by `scripts/build-jaeger.sh` and cached, or
//! `DEEPSPAN_JAEGER`), run with memory storage on loopback ports, killed on
//! drop; its query API (`/api/traces/{id}`) read with a plain HTTP GET.
//! Shared by the export test (`crates/cli/tests/it/export_jaeger.rs`) and the
//! agent's forward test, so there is one way to start it. Also a real
//! OpenTelemetry Collector to put in front of it ([`Collector`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cached Jaeger binary (`DEEPSPAN_JAEGER`, else built once by the
/// script, which needs go and the Go module proxy).
pub fn jaeger_binary() -> PathBuf {
    match std::env::var_os("DEEPSPAN_JAEGER") {
        Some(p) => PathBuf::from(p),
        None => built_by("scripts/build-jaeger.sh", &[]),
    }
}

/// The path a build script of this repository prints (it builds from the
/// Go module proxy once and caches what it built).
fn built_by(script: &str, args: &[&str]) -> PathBuf {
    let out = Command::new(repo().join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} {} (needs go and the Go module proxy) failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A loopback port nobody listened on a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback port nobody listens on now, below the kernel's ephemeral
/// range (`net.ipv4.ip_local_port_range`), for a server started later.
///
/// A port from [`free_port`] is in that range, where any outgoing
/// connection may take it as its local port before the server binds it.
/// A client retrying that very port takes it too, now and then: given the
/// destination port as its own, it connects to itself (TCP's simultaneous
/// open), and the server then finds it in use (seen once in CI). Below the
/// range only an explicit bind takes a port; the start is random, so that
/// tests running at once seldom try the same ports.
pub fn free_fixed_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const LOWEST: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_low <= LOWEST + 1_000 {
        return free_port();
    }
    let span = u64::from(ephemeral_low - LOWEST);
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (0..span)
        .map(|n| LOWEST + ((random + n) % span) as u16)
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        .unwrap_or_else(free_port)
}

/// A plain HTTP/1.1 GET on loopback: (status, body).
pub fn get(port: u16, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Ok((status, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 2 + size + 2).min(b.len())..];
    }
}

/// A server started by `try_start` on ports picked free, closed, then
/// handed to it: another process may bind one in between, and the server
/// then exits at once (its log says "address already in use"), so it is
/// started again on new ports, up to four times; any other failure panics
/// with its log.
fn on_free_ports<T>(mut try_start: impl FnMut() -> Result<T, String>) -> T {
    let mut tries = 0;
    loop {
        match try_start() {
            Ok(server) => return server,
            Err(log) if log.contains("address already in use") && tries < 4 => tries += 1,
            Err(log) => panic!("{log}"),
        }
    }
}

/// The loopback ports a Jaeger listens on.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub otlp_grpc: u16,
    pub otlp_http: u16,
    /// The query API and UI (HTTP).
    pub query: u16,
    pub query_grpc: u16,
    pub health: u16,
}

impl Ports {
    /// Five ports nobody listened on a moment ago, below the kernel's
    /// ephemeral range ([`free_fixed_port`]).
    pub fn free() -> Ports {
        let [otlp_grpc, otlp_http, query, query_grpc, health] = [(); 5].map(|_| free_fixed_port());
        Ports {
            otlp_grpc,
            otlp_http,
            query,
            query_grpc,
            health,
        }
    }
}

/// Jaeger v2 all-in-one on loopback ports of its own, killed on drop.
pub struct Jaeger {
    child: Child,
    pub otlp_grpc: u16,
    pub otlp_http: u16,
    pub query: u16,
    dir: tempfile::TempDir,
}

impl Jaeger {
    /// On free ports; returns once its health check and query API answer
    /// (panics after 60 s, with its log).
    /// Free ports are picked, closed, then handed to Jaeger, so another
    /// process may bind one in between: Jaeger then exits at once, and is
    /// started again on new ports.
    pub fn start() -> Jaeger {
        on_free_ports(|| Jaeger::try_start_on(Ports::free()))
    }

    /// On the given ports (a test that sends before Jaeger is up picks
    /// them first).
    pub fn start_on(ports: Ports) -> Jaeger {
        Jaeger::try_start_on(ports).unwrap_or_else(|log| panic!("{log}"))
    }

    /// Err: Jaeger exited before it was ready, with what it logged.
    fn try_start_on(ports: Ports) -> Result<Jaeger, String> {
        let binary = jaeger_binary();
        let dir = tempfile::tempdir().unwrap();
        let Ports {
            otlp_grpc,
            otlp_http,
            query,
            query_grpc,
            health,
        } = ports;
        let config = format!(
            "service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health}
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
"
        );
        let config_path = dir.path().join("jaeger.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("jaeger.log")).unwrap();
        let child = Command::new(&binary)
            .arg("--config")
            .arg(&config_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut jaeger = Jaeger {
            child,
            otlp_grpc,
            otlp_http,
            query,
            dir,
        };
        let started = Instant::now();
        loop {
            let ready = get(health, "/status").is_ok_and(|(code, _)| code == 200)
                && get(query, "/api/services").is_ok_and(|(code, _)| code == 200);
            if ready {
                break;
            }
            if let Some(status) = jaeger.child.try_wait().unwrap() {
                return Err(format!("jaeger exited ({status}): {}", jaeger.log()));
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "jaeger not ready after 60 s: {}",
                jaeger.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(jaeger)
    }

    /// What Jaeger wrote to stdout and stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("jaeger.log")).unwrap_or_default()
    }

    /// The trace (`data[0]` of `/api/traces/{id}`); panics when Jaeger does
    /// not have it.
    pub fn trace(&self, trace_id: &str) -> Value {
        self.find_trace(trace_id)
            .unwrap_or_else(|| panic!("trace {trace_id} is not in Jaeger"))
    }

    /// The trace, or `None` when Jaeger does not have it (404).
    pub fn find_trace(&self, trace_id: &str) -> Option<Value> {
        let (code, body) = get(self.query, &format!("/api/traces/{trace_id}")).unwrap();
        if code == 404 {
            return None;
        }
        assert_eq!(
            code,
            200,
            "trace {trace_id}: {}",
            String::from_utf8_lossy(&body)
        );
        let doc: Value = serde_json::from_slice(&body).unwrap();
        Some(doc["data"][0].clone())
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Go program of this repository (`folder`, e.g. `deploy/collector`),
/// built once by `scripts/build-go.sh` (which needs go and the Go module
/// proxy) and cached.
pub fn go_program(folder: &str, name: &str) -> PathBuf {
    built_by("scripts/build-go.sh", &[folder, name])
}

/// The OpenTelemetry Collector of `deploy/collector` (`DEEPSPAN_OTELCOL`,
/// else [`go_program`]).
pub fn collector_binary() -> PathBuf {
    match std::env::var_os("DEEPSPAN_OTELCOL") {
        Some(p) => PathBuf::from(p),
        None => go_program("deploy/collector", "otelcol"),
    }
}

/// An OpenTelemetry Collector (OTLP in, batch, OTLP/HTTP out) run with
/// `deploy/collector/config.yaml`, the configuration documented for users,
/// on loopback ports of its own; killed on drop.
pub struct Collector {
    child: Child,
    pub otlp_grpc: u16,
    pub otlp_http: u16,
    dir: tempfile::TempDir,
}

impl Collector {
    /// Sending to the OTLP/HTTP port `backend_http` on loopback (a
    /// [`Jaeger`]'s `otlp_http`); returns once it takes OTLP (panics after
    /// 60 s, with its log).
    pub fn start(backend_http: u16) -> Collector {
        on_free_ports(|| Collector::try_start(backend_http))
    }

    fn try_start(backend_http: u16) -> Result<Collector, String> {
        let binary = collector_binary();
        let dir = tempfile::tempdir().unwrap();
        let (otlp_grpc, otlp_http) = (free_fixed_port(), free_fixed_port());
        let log = std::fs::File::create(dir.path().join("otelcol.log")).unwrap();
        let child = Command::new(&binary)
            .arg("--config")
            .arg(repo().join("deploy/collector/config.yaml"))
            .env("OTLP_GRPC_ENDPOINT", format!("127.0.0.1:{otlp_grpc}"))
            .env("OTLP_HTTP_ENDPOINT", format!("127.0.0.1:{otlp_http}"))
            .env(
                "BACKEND_OTLP_HTTP",
                format!("http://127.0.0.1:{backend_http}"),
            )
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut collector = Collector {
            child,
            otlp_grpc,
            otlp_http,
            dir,
        };
        let started = Instant::now();
        while !collector.log().contains("Everything is ready") {
            if let Some(status) = collector.child.try_wait().unwrap() {
                return Err(format!(
                    "the Collector exited ({status}): {}",
                    collector.log()
                ));
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the Collector is not ready after 60 s: {}",
                collector.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(collector)
    }

    /// What the Collector wrote to stdout and stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("otelcol.log")).unwrap_or_default()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of a span's tag in Jaeger's JSON (`Null` when it has none).
pub fn tag<'v>(span: &'v Value, key: &str) -> &'v Value {
    span["tags"]
        .as_array()
        .and_then(|tags| tags.iter().find(|t| t["key"] == key))
        .map(|t| &t["value"])
        .unwrap_or(&Value::Null)
}
