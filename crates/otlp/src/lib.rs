//! deepspan's OTLP trace receiver: spans from OpenTelemetry exporters into
//! a run folder.
//!
//! It listens for OTLP/gRPC (`TraceService/Export`, default
//! `127.0.0.1:4317`) and OTLP/HTTP (`POST /v1/traces`, protobuf or JSON,
//! default `127.0.0.1:4318`), gzip-compressed or not, and appends every
//! accepted request as it came to `RUN/spans/otlp-NNN.pb` through
//! [`deepspan_spans::SpanWriter`].
//!
//! How it behaves under pressure and bad input, as the OTLP specification
//! asks of a server:
//! - requests are acknowledged once queued for the writer thread; the queue
//!   has a byte budget ([`ReceiverConfig::max_queue_bytes`]), so memory stays
//!   bounded when the disk is slower than the senders. A request that does not
//!   fit is refused with the retryable answer (gRPC `UNAVAILABLE` with a
//!   `RetryInfo`, HTTP 503 with `Retry-After`): the exporter keeps it and
//!   retries, nothing acknowledged is ever lost;
//! - a malformed payload gets gRPC `INVALID_ARGUMENT` / HTTP 400 with a
//!   `google.rpc.Status` body; spans without valid ids are left out and
//!   reported as a partial success (the rest of the request is kept), so the
//!   run's span files always read back;
//! - [`ReceiverHandle::shutdown`] stops accepting, drains the queue and
//!   flushes, and every span is accounted for in [`ReceiverStats`].
//!
//! The receiver runs its own small tokio runtime on background threads, so
//! synchronous code (the recorder, the CLI) starts and stops it with plain
//! calls. The spans folder is created on the first span, not before: a
//! recorder that wants an empty run folder can start the receiver first.

pub mod decode;
pub mod digest;
mod grpc;
mod http;
mod queue;
mod screen;
mod status;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use crate::queue::Queue;
pub use digest::{RequestDigest, RequestSpan, SpanPlace};

/// The IANA ports of OTLP.
pub const DEFAULT_GRPC_PORT: u16 = 4317;
pub const DEFAULT_HTTP_PORT: u16 = 4318;

/// Default budget of the queue between the network and the writer thread.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 64 << 20;

/// Largest export request accepted (after decompression), on both
/// transports. Exporters send batches of a few hundred spans, far smaller;
/// the limit only keeps one request from taking unbounded memory.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// How long [`ReceiverHandle::shutdown`] waits for requests in progress
/// before closing their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Where the receiver listens and writes.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// The run folder; spans go to `run_dir/spans/`, created on the first span.
    pub run_dir: PathBuf,
    /// OTLP/gRPC address; `None` disables gRPC. Port 0 picks a free port.
    pub grpc_addr: Option<SocketAddr>,
    /// OTLP/HTTP address; `None` disables HTTP. Port 0 picks a free port.
    pub http_addr: Option<SocketAddr>,
    /// Budget of requests waiting for the writer, counted as their protobuf
    /// size. One request is always accepted into an empty queue, so the bound
    /// is `max_queue_bytes + MAX_REQUEST_BYTES`.
    pub max_queue_bytes: usize,
}

impl ReceiverConfig {
    /// Both transports on loopback at the standard ports, 64 MiB of queue.
    pub fn new(run_dir: impl Into<PathBuf>) -> ReceiverConfig {
        ReceiverConfig {
            run_dir: run_dir.into(),
            grpc_addr: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_GRPC_PORT))),
            http_addr: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT))),
            max_queue_bytes: DEFAULT_MAX_QUEUE_BYTES,
        }
    }
}

/// The two OTLP transports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Http,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Grpc => "gRPC",
            Protocol::Http => "HTTP",
        })
    }
}

/// What went wrong starting or stopping the receiver. Problems with
/// individual requests are answered to their sender and counted in
/// [`ReceiverStats`], never returned here.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be listened on (typically: port in use).
    #[error("cannot listen for OTLP/{protocol} on {addr}: {source}")]
    Bind {
        protocol: Protocol,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("neither OTLP/gRPC nor OTLP/HTTP is enabled: nothing to receive on")]
    NoTransport,
    #[error("cannot start the OTLP receiver's threads: {0}")]
    Threads(#[source] std::io::Error),
    /// The writer thread died; the stats say what was written before.
    #[error("the OTLP receiver's writer thread failed ({message}); {} spans written before", stats.spans_written)]
    WriterFailed {
        message: String,
        stats: Box<ReceiverStats>,
    },
}

/// Counters of a receiver since it started. After
/// [`ReceiverHandle::shutdown`], `spans_received == spans_written +
/// spans_dropped`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReceiverStats {
    /// Export requests received, whatever became of them.
    pub requests: u64,
    /// Requests refused because the queue was full (the sender retries them,
    /// and they are counted again then).
    pub requests_rejected: u64,
    /// Requests that could not be decoded (answered 400 / INVALID_ARGUMENT).
    pub requests_invalid: u64,
    /// Spans in the requests that could be decoded.
    pub spans_received: u64,
    /// Spans written and flushed to the run's span files.
    pub spans_written: u64,
    /// Spans received but not stored: in refused requests, without valid
    /// ids, or lost to a write error.
    pub spans_dropped: u64,
    /// Payload bytes received (after decompression), all requests.
    pub bytes: u64,
    /// Failed writes to the span files (disk full, folder removed…).
    pub write_errors: u64,
    /// Most bytes ever waiting for the writer (see
    /// [`ReceiverConfig::max_queue_bytes`]): how close the disk came to
    /// holding the senders back.
    pub queue_peak_bytes: u64,
    /// The last write error, for the report.
    pub last_write_error: Option<String>,
}

/// Where accepted requests go instead of a run folder: the live agent
/// judges and forwards spans as they come.
pub trait RequestSink: Send + 'static {
    /// One accepted request, protobuf-encoded and screened (every span has
    /// valid ids), in arrival order. It runs on the receiver's one consumer
    /// thread: a slow sink fills the queue, and senders are then told to
    /// retry (the backpressure). An error counts the request's spans as
    /// dropped, with the message as the last write error. `digest` is what
    /// the sink reads of it without decoding it ([`digest::digest`]).
    fn accept(&mut self, encoded: Bytes, spans: u64, digest: RequestDigest) -> Result<(), String>;
}

/// The consumer at the far end of the queue.
enum Consumer {
    RunDir(PathBuf),
    Sink(Box<dyn RequestSink>),
}

/// The OTLP receiver.
pub struct Receiver;

impl Receiver {
    /// Binds the configured addresses and starts serving. Errors if an
    /// address cannot be bound (the error names the protocol and address),
    /// or if neither transport is enabled.
    pub fn start(config: ReceiverConfig) -> Result<ReceiverHandle, Error> {
        let consumer = Consumer::RunDir(config.run_dir.clone());
        Self::start_consumer(config, consumer)
    }

    /// As [`Receiver::start`], but every accepted request goes to `sink`
    /// (`config.run_dir` is not used). Backpressure, screening and the
    /// counters are the same; "written" counts the spans the sink took.
    pub fn start_with_sink(
        config: ReceiverConfig,
        sink: Box<dyn RequestSink>,
    ) -> Result<ReceiverHandle, Error> {
        Self::start_consumer(config, Consumer::Sink(sink))
    }

    fn start_consumer(config: ReceiverConfig, consumer: Consumer) -> Result<ReceiverHandle, Error> {
        // Bind synchronously, so a busy port is reported here and not lost in a task.
        let bind = |protocol, addr: Option<SocketAddr>| -> Result<Option<TcpListener>, Error> {
            let Some(addr) = addr else { return Ok(None) };
            let listener = TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|source| Error::Bind {
                    protocol,
                    addr,
                    source,
                })?;
            Ok(Some(listener))
        };
        if config.grpc_addr.is_none() && config.http_addr.is_none() {
            return Err(Error::NoTransport);
        }
        let grpc_listener = bind(Protocol::Grpc, config.grpc_addr)?;
        let http_listener = bind(Protocol::Http, config.http_addr)?;
        let local = |l: &Option<TcpListener>, protocol, asked: Option<SocketAddr>| {
            l.as_ref()
                .map(|l| {
                    l.local_addr().map_err(|source| Error::Bind {
                        protocol,
                        addr: asked.expect("bound, so configured"),
                        source,
                    })
                })
                .transpose()
        };
        let grpc_addr = local(&grpc_listener, Protocol::Grpc, config.grpc_addr)?;
        let http_addr = local(&http_listener, Protocol::Http, config.http_addr)?;

        // Two workers: decoding is the only CPU work, and cores are shared with the application.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("deepspan-otlp")
            .enable_all()
            .build()
            .map_err(Error::Threads)?;

        // A sink reads each request's digest; a run folder only its bytes.
        let digests = matches!(consumer, Consumer::Sink(_));
        let (queue, jobs) = Queue::new(config.max_queue_bytes, digests);
        let queue = Arc::new(queue);
        let writer = {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name("deepspan-otlp-writer".into())
                .spawn(move || match consumer {
                    Consumer::RunDir(run_dir) => queue::run_writer(&run_dir, jobs, &queue),
                    Consumer::Sink(sink) => queue::run_sink(sink, jobs, &queue),
                })
                .map_err(Error::Threads)?
        };

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut servers = 0;
        {
            let _enter = runtime.enter();
            if let Some(l) = grpc_listener {
                let l = tokio::net::TcpListener::from_std(l).map_err(|source| Error::Bind {
                    protocol: Protocol::Grpc,
                    addr: grpc_addr.expect("bound"),
                    source,
                })?;
                runtime.spawn(grpc::serve(
                    l,
                    queue.clone(),
                    stop_rx.clone(),
                    done_tx.clone(),
                ));
                servers += 1;
            }
            if let Some(l) = http_listener {
                let l = tokio::net::TcpListener::from_std(l).map_err(|source| Error::Bind {
                    protocol: Protocol::Http,
                    addr: http_addr.expect("bound"),
                    source,
                })?;
                runtime.spawn(http::serve(
                    l,
                    queue.clone(),
                    stop_rx.clone(),
                    done_tx.clone(),
                ));
                servers += 1;
            }
        }
        Ok(ReceiverHandle {
            inner: Some(Running {
                runtime,
                writer,
                stop: stop_tx,
                servers_done: done_rx,
                servers,
            }),
            queue,
            grpc_addr,
            http_addr,
        })
    }
}

struct Running {
    runtime: tokio::runtime::Runtime,
    writer: JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
    servers_done: mpsc::Receiver<()>,
    servers: usize,
}

/// A running receiver. Dropping it shuts it down too, but only
/// [`ReceiverHandle::shutdown`] reports the outcome.
pub struct ReceiverHandle {
    inner: Option<Running>,
    queue: Arc<Queue>,
    grpc_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
}

impl ReceiverHandle {
    /// The bound OTLP/gRPC address (the real port when 0 was asked).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The bound OTLP/HTTP address (the real port when 0 was asked).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The counters so far (spans still queued are neither written nor dropped yet).
    pub fn stats(&self) -> ReceiverStats {
        self.queue.stats()
    }

    /// Holds the writer thread: requests stay queued until released. For
    /// tests and benchmarks of backpressure; shutdown releases it.
    pub fn pause_writer(&self, paused: bool) {
        self.queue.set_paused(paused);
    }

    /// Stops accepting connections, lets requests in progress finish (up to
    /// 5 s), writes everything queued, flushes, and returns the final
    /// counters. Write failures do not make this fail: they are counted in
    /// the stats (`write_errors`, `last_write_error`, `spans_dropped`).
    ///
    /// Callable from any thread, including inside another tokio runtime.
    pub fn shutdown(mut self) -> Result<ReceiverStats, Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<ReceiverStats, Error> {
        let Some(run) = self.inner.take() else {
            return Ok(self.queue.stats());
        };
        let _ = run.stop.send(true);
        let deadline = std::time::Instant::now() + SHUTDOWN_GRACE;
        for _ in 0..run.servers {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if run.servers_done.recv_timeout(left).is_err() {
                break; // stragglers are cut off by the runtime shutdown below
            }
        }
        // Nothing is acknowledged after this; then the writer drains what was.
        self.queue.close();
        run.runtime.shutdown_background();
        let joined = run.writer.join();
        let stats = self.queue.stats();
        match joined {
            Ok(()) => Ok(stats),
            Err(panic) => Err(Error::WriterFailed {
                message: panic_message(&panic),
                stats: Box::new(stats),
            }),
        }
    }
}

impl Drop for ReceiverHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}
