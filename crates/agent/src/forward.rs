//! The forward queue: every OTLP request the agent receives goes on to
//! Jaeger, Tempo or a collector, in order, through one sender thread.
//!
//! - [`Forwarder::send`] never blocks (beyond a short lock): the queue is
//!   bounded in bytes, and a request that does not fit pushes the oldest
//!   ones out (counted as `dropped_oldest`). The newest spans are the ones
//!   worth having when the back-end comes back.
//! - A request larger than the whole budget is refused at once and counted
//!   (`dropped_oversize`): keeping it would empty the queue and still break
//!   the budget. (OTLP receivers take 4 to 16 MiB per request; the budget is
//!   meant to be far above.)
//! - Requests are protobuf bytes already ([`EncodedRequest`]): the agent
//!   forwards what it received untouched, and they go out through
//!   [`deepspan_export::OtlpClient`] (gRPC through a codec that passes the
//!   bytes through, or HTTP/protobuf), gzip-compressed.
//! - Retryable failures (no connection, gRPC `UNAVAILABLE`,
//!   `RESOURCE_EXHAUSTED`…, HTTP 429/502/503/504, time-outs) are retried
//!   with exponential backoff, or after what the server asks (HTTP
//!   `Retry-After`, gRPC `RetryInfo`, at most 30 s), for as long as the
//!   request is in the queue. The request being tried stays in the queue
//!   (and in its bytes) until it is sent; pushed out meanwhile, it is let go
//!   after the try under way (its bytes no longer count: the memory held is
//!   at most the budget plus that one request) and counted as dropped only
//!   if that try fails.
//! - Other failures (HTTP 400, gRPC `INVALID_ARGUMENT`) drop the request
//!   (`dropped_failed`), with the message kept in `last_error`. Spans the
//!   server accepted but rejected (OTLP partial success) are counted in
//!   `spans_rejected`.
//! - [`Forwarder::shutdown`] keeps sending until the queue is empty or the
//!   deadline passes; what is left is counted as `dropped_at_shutdown`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deepspan_export::{ClientOptions, OtlpClient, Protocol, MAX_SERVER_BACKOFF};
use tokio::sync::{watch, Notify};

/// One OTLP `ExportTraceServiceRequest`, protobuf-encoded, and how many
/// spans it holds (for the counters; the bytes are not decoded again).
#[derive(Clone, Debug)]
pub struct EncodedRequest {
    pub bytes: Bytes,
    pub spans: u64,
}

/// How to forward.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// `None`: from the URL ([`Protocol::from_url`]: `grpc://` or port 4317
    /// is gRPC, the rest HTTP/protobuf).
    pub protocol: Option<Protocol>,
    pub gzip: bool,
    /// Most protobuf bytes queued (the request being sent included).
    pub max_queue_bytes: usize,
    /// Per try.
    pub timeout: Duration,
    /// Wait before the first retry of a request, doubled after each failed
    /// try up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for ForwardConfig {
    fn default() -> ForwardConfig {
        ForwardConfig {
            protocol: None,
            gzip: true,
            max_queue_bytes: 64 << 20,
            timeout: Duration::from_secs(10),
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
        }
    }
}

/// What can go wrong starting a [`Forwarder`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("forward URL: {0}")]
    Url(#[from] deepspan_export::Error),
    #[error("cannot start the forwarder: {0}")]
    Start(std::io::Error),
}

/// The forwarder's counters at one moment (requests, and the spans they
/// hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Given to [`Forwarder::send`] (the oversize ones included).
    pub requests_queued: u64,
    pub spans_queued: u64,
    pub requests_sent: u64,
    pub spans_sent: u64,
    /// Pushed out of the queue by newer requests.
    pub requests_dropped_oldest: u64,
    pub spans_dropped_oldest: u64,
    /// Larger than the whole queue budget.
    pub requests_dropped_oversize: u64,
    pub spans_dropped_oversize: u64,
    /// Refused by the server with an error that retrying cannot fix.
    pub requests_dropped_failed: u64,
    pub spans_dropped_failed: u64,
    /// Still queued when the shutdown deadline passed.
    pub requests_dropped_at_shutdown: u64,
    pub spans_dropped_at_shutdown: u64,
    /// Spans of sent requests the server said it rejected (partial success).
    pub spans_rejected: u64,
    /// Tries after a retryable failure.
    pub retries: u64,
    /// Protobuf bytes queued now, and the most ever queued.
    pub queue_bytes: u64,
    pub queue_bytes_peak: u64,
    pub queue_requests: u64,
    /// The last failure or partial-success message, if any.
    pub last_error: Option<String>,
}

impl ForwardStats {
    /// Requests dropped for any reason.
    pub fn requests_dropped(&self) -> u64 {
        self.requests_dropped_oldest
            + self.requests_dropped_oversize
            + self.requests_dropped_failed
            + self.requests_dropped_at_shutdown
    }

    /// Spans dropped for any reason.
    pub fn spans_dropped(&self) -> u64 {
        self.spans_dropped_oldest
            + self.spans_dropped_oversize
            + self.spans_dropped_failed
            + self.spans_dropped_at_shutdown
    }
}

/// Sends [`EncodedRequest`]s to one OTLP endpoint from a thread of its own;
/// see the module doc.
pub struct Forwarder {
    shared: Arc<Shared>,
    protocol: Protocol,
    target: String,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    max_queue_bytes: usize,
    queue: Mutex<Queue>,
    /// A request was queued, or the queue closed.
    queued: Notify,
    /// Bumped when the request being tried is pushed out, or at shutdown:
    /// a sender waiting to retry looks again.
    changed: watch::Sender<u64>,
    counters: Counters,
    last_error: Mutex<Option<String>>,
}

#[derive(Default)]
struct Queue {
    requests: VecDeque<Queued>,
    bytes: usize,
    next_id: u64,
    /// The request the sender is trying, and whether it was pushed out of
    /// the queue meanwhile.
    in_flight: Option<u64>,
    in_flight_evicted: bool,
    /// Set by shutdown: send until then, then drop the rest.
    deadline: Option<Instant>,
}

struct Queued {
    id: u64,
    request: EncodedRequest,
}

#[derive(Default)]
struct Counters {
    requests_queued: AtomicU64,
    spans_queued: AtomicU64,
    requests_sent: AtomicU64,
    spans_sent: AtomicU64,
    requests_dropped_oldest: AtomicU64,
    spans_dropped_oldest: AtomicU64,
    requests_dropped_oversize: AtomicU64,
    spans_dropped_oversize: AtomicU64,
    requests_dropped_failed: AtomicU64,
    spans_dropped_failed: AtomicU64,
    requests_dropped_at_shutdown: AtomicU64,
    spans_dropped_at_shutdown: AtomicU64,
    spans_rejected: AtomicU64,
    retries: AtomicU64,
    queue_bytes: AtomicU64,
    queue_bytes_peak: AtomicU64,
    queue_requests: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Forwarder {
    /// Checks the URL and starts the sender thread (which connects when it
    /// has something to send).
    pub fn start(url: &str, config: ForwardConfig) -> Result<Forwarder, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Start)?;
        let client = {
            let _inside = runtime.enter();
            OtlpClient::new(
                url,
                &ClientOptions {
                    protocol: config.protocol,
                    gzip: config.gzip,
                    timeout: config.timeout,
                },
            )?
        };
        let (protocol, target) = (client.protocol(), client.target().to_string());
        let shared = Arc::new(Shared {
            max_queue_bytes: config.max_queue_bytes,
            queue: Mutex::new(Queue::default()),
            queued: Notify::new(),
            changed: watch::Sender::new(0),
            counters: Counters::default(),
            last_error: Mutex::new(None),
        });
        let sender = Sender {
            shared: shared.clone(),
            client,
            config,
        };
        let thread = std::thread::Builder::new()
            .name("deepspan-forward".into())
            .spawn(move || runtime.block_on(sender.run()))
            .map_err(Error::Start)?;
        Ok(Forwarder {
            shared,
            protocol,
            target,
            thread: Some(thread),
        })
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Where requests go (`http://…`, with `/v1/traces` for HTTP).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Queues a request; never waits for the network. Over the budget, the
    /// oldest requests are dropped first; a request larger than the whole
    /// budget is dropped itself. Both are counted.
    pub fn send(&self, request: EncodedRequest) {
        let shared = &*self.shared;
        let c = &shared.counters;
        let len = request.bytes.len();
        add(&c.requests_queued, 1);
        add(&c.spans_queued, request.spans);
        if len > shared.max_queue_bytes {
            add(&c.requests_dropped_oversize, 1);
            add(&c.spans_dropped_oversize, request.spans);
            return;
        }
        let mut evicted_in_flight = false;
        {
            let mut queue = shared.queue.lock().expect("forward queue poisoned");
            while queue.bytes + len > shared.max_queue_bytes {
                let oldest = queue
                    .requests
                    .pop_front()
                    .expect("bytes > 0 means requests");
                queue.bytes -= oldest.request.bytes.len();
                if queue.in_flight == Some(oldest.id) {
                    // Counted by the sender once its try is over: it may
                    // still get through.
                    queue.in_flight_evicted = true;
                    evicted_in_flight = true;
                } else {
                    add(&c.requests_dropped_oldest, 1);
                    add(&c.spans_dropped_oldest, oldest.request.spans);
                }
            }
            let id = queue.next_id;
            queue.next_id += 1;
            queue.bytes += len;
            queue.requests.push_back(Queued { id, request });
            c.queue_bytes.store(queue.bytes as u64, Ordering::Relaxed);
            c.queue_bytes_peak
                .fetch_max(queue.bytes as u64, Ordering::Relaxed);
            c.queue_requests
                .store(queue.requests.len() as u64, Ordering::Relaxed);
        }
        if evicted_in_flight {
            shared.changed.send_modify(|n| *n += 1);
        }
        shared.queued.notify_one();
    }

    /// The counters now.
    pub fn stats(&self) -> ForwardStats {
        self.shared.stats()
    }

    /// A handle that reads the counters from elsewhere (the metrics
    /// server), for as long as it is kept.
    pub fn stats_handle(&self) -> ForwardStatsHandle {
        ForwardStatsHandle(self.shared.clone())
    }

    /// Sends what is queued until `deadline` from now, then drops the rest
    /// (counted as `dropped_at_shutdown`) and stops the thread.
    pub fn shutdown(mut self, deadline: Duration) -> ForwardStats {
        self.stop(deadline);
        self.shared.stats()
    }

    fn stop(&mut self, deadline: Duration) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared
            .queue
            .lock()
            .expect("forward queue poisoned")
            .deadline = Some(Instant::now() + deadline);
        self.shared.changed.send_modify(|n| *n += 1);
        self.shared.queued.notify_one();
        let _ = thread.join();
    }
}

/// Reads a [`Forwarder`]'s counters; see [`Forwarder::stats_handle`].
#[derive(Clone)]
pub struct ForwardStatsHandle(Arc<Shared>);

impl ForwardStatsHandle {
    pub fn get(&self) -> ForwardStats {
        self.0.stats()
    }
}

impl std::fmt::Debug for ForwardStatsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ForwardStatsHandle").finish_non_exhaustive()
    }
}

impl Drop for Forwarder {
    /// Without [`Forwarder::shutdown`], what is queued is dropped.
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

impl Shared {
    fn stats(&self) -> ForwardStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ForwardStats {
            requests_queued: get(&c.requests_queued),
            spans_queued: get(&c.spans_queued),
            requests_sent: get(&c.requests_sent),
            spans_sent: get(&c.spans_sent),
            requests_dropped_oldest: get(&c.requests_dropped_oldest),
            spans_dropped_oldest: get(&c.spans_dropped_oldest),
            requests_dropped_oversize: get(&c.requests_dropped_oversize),
            spans_dropped_oversize: get(&c.spans_dropped_oversize),
            requests_dropped_failed: get(&c.requests_dropped_failed),
            spans_dropped_failed: get(&c.spans_dropped_failed),
            requests_dropped_at_shutdown: get(&c.requests_dropped_at_shutdown),
            spans_dropped_at_shutdown: get(&c.spans_dropped_at_shutdown),
            spans_rejected: get(&c.spans_rejected),
            retries: get(&c.retries),
            queue_bytes: get(&c.queue_bytes),
            queue_bytes_peak: get(&c.queue_bytes_peak),
            queue_requests: get(&c.queue_requests),
            last_error: self.last_error.lock().expect("poisoned").clone(),
        }
    }

    fn set_last_error(&self, message: String) {
        *self.last_error.lock().expect("poisoned") = Some(message);
    }
}

/// The sender thread's side.
struct Sender {
    shared: Arc<Shared>,
    client: OtlpClient,
    config: ForwardConfig,
}

/// How a request's turn ended.
enum Outcome {
    Sent {
        rejected_spans: u64,
    },
    /// Pushed out of the queue while it was being tried, and not sent.
    Evicted,
    /// A failure retrying cannot fix (the message is in `last_error`).
    Failed,
    /// The shutdown deadline passed.
    Abandoned,
}

/// What the sender does next.
enum Next {
    Send(u64, EncodedRequest),
    Wait,
    Stop,
}

impl Sender {
    async fn run(mut self) {
        let mut changed = self.shared.changed.subscribe();
        loop {
            match self.next() {
                Next::Send(id, request) => {
                    let outcome = self.send_one(&request, &mut changed).await;
                    self.finish(id, &request, outcome);
                }
                Next::Wait => {
                    // A notify_one() while nobody waits is kept, so a
                    // request queued since next() looked is not missed.
                    self.shared.queued.notified().await;
                }
                Next::Stop => break,
            }
        }
    }

    /// The oldest request, marked as being tried (it stays queued); or
    /// wait; or stop (shut down, and the queue empty or the deadline past,
    /// the rest then counted as dropped).
    fn next(&self) -> Next {
        let mut queue = self.shared.queue.lock().expect("forward queue poisoned");
        let past_deadline = queue.deadline.is_some_and(|d| Instant::now() >= d);
        if past_deadline {
            let c = &self.shared.counters;
            let left: Vec<Queued> = queue.requests.drain(..).collect();
            for q in left {
                add(&c.requests_dropped_at_shutdown, 1);
                add(&c.spans_dropped_at_shutdown, q.request.spans);
            }
            queue.bytes = 0;
            c.queue_bytes.store(0, Ordering::Relaxed);
            c.queue_requests.store(0, Ordering::Relaxed);
            return Next::Stop;
        }
        match queue.requests.front() {
            Some(front) => {
                let next = Next::Send(front.id, front.request.clone());
                queue.in_flight = Some(front.id);
                queue.in_flight_evicted = false;
                next
            }
            None if queue.deadline.is_some() => Next::Stop,
            None => Next::Wait,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.shared.queue.lock().expect("poisoned").deadline
    }

    fn evicted(&self) -> bool {
        self.shared
            .queue
            .lock()
            .expect("poisoned")
            .in_flight_evicted
    }

    /// Tries the request until it is sent, fails for good, is pushed out
    /// of the queue, or the shutdown deadline passes.
    async fn send_one(
        &mut self,
        request: &EncodedRequest,
        changed: &mut watch::Receiver<u64>,
    ) -> Outcome {
        let mut backoff = self.config.first_backoff;
        loop {
            changed.borrow_and_update();
            // `biased`: a passed deadline wins over a try that is ready too.
            let tried = tokio::select! {
                biased;
                _ = shutdown_deadline(&self.shared, changed.clone()) => return Outcome::Abandoned,
                r = self.client.send_encoded(request.bytes.clone()) => r,
            };
            let failure = match tried {
                Ok(response) => {
                    let rejected = response.partial_success.map_or(0, |p| {
                        if !p.error_message.is_empty() {
                            self.shared
                                .set_last_error(format!("partial success: {}", p.error_message));
                        }
                        p.rejected_spans.max(0) as u64
                    });
                    return Outcome::Sent {
                        rejected_spans: rejected,
                    };
                }
                Err(failure) => failure,
            };
            self.shared.set_last_error(failure.message.clone());
            if !failure.retry {
                return Outcome::Failed;
            }
            let wait = failure
                .after
                .map(|a| a.min(MAX_SERVER_BACKOFF))
                .unwrap_or(backoff);
            backoff = (backoff * 2).min(self.config.max_backoff);
            // Wait, unless the request is pushed out of the queue or the
            // shutdown deadline passes first.
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                changed.borrow_and_update();
                if self.evicted() {
                    return Outcome::Evicted;
                }
                let deadline = self.deadline();
                tokio::select! {
                    biased;
                    _ = sleep_until(deadline) => return Outcome::Abandoned,
                    _ = changed.changed() => continue,
                    _ = &mut sleep => break,
                }
            }
            add(&self.shared.counters.retries, 1);
        }
    }

    /// Counts how the request's turn ended and takes it off the queue.
    fn finish(&self, id: u64, request: &EncodedRequest, outcome: Outcome) {
        let c = &self.shared.counters;
        let mut queue = self.shared.queue.lock().expect("forward queue poisoned");
        let evicted = std::mem::take(&mut queue.in_flight_evicted);
        queue.in_flight = None;
        let (requests, spans) = match outcome {
            Outcome::Sent { rejected_spans } => {
                add(&c.spans_rejected, rejected_spans);
                (&c.requests_sent, &c.spans_sent)
            }
            Outcome::Failed => (&c.requests_dropped_failed, &c.spans_dropped_failed),
            Outcome::Evicted => (&c.requests_dropped_oldest, &c.spans_dropped_oldest),
            // Pushed out before the deadline: dropped as the oldest. Still
            // queued: next() counts it with the rest.
            Outcome::Abandoned if evicted => (&c.requests_dropped_oldest, &c.spans_dropped_oldest),
            Outcome::Abandoned => return,
        };
        add(requests, 1);
        add(spans, request.spans);
        // Unless send() pushed it out meanwhile, it is still the front.
        if queue.requests.front().is_some_and(|f| f.id == id) {
            let done = queue.requests.pop_front().expect("front checked");
            queue.bytes -= done.request.bytes.len();
        }
        c.queue_bytes.store(queue.bytes as u64, Ordering::Relaxed);
        c.queue_requests
            .store(queue.requests.len() as u64, Ordering::Relaxed);
    }
}

/// Resolves at `deadline`; never without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Resolves when the shutdown deadline passes, one set later included.
async fn shutdown_deadline(shared: &Shared, mut changed: watch::Receiver<u64>) {
    loop {
        let deadline = shared.queue.lock().expect("poisoned").deadline;
        if deadline.is_some() {
            return sleep_until(deadline).await;
        }
        // Any change (an eviction, the shutdown) makes us look again; the
        // sender half lives as long as `shared`, so this cannot fail.
        let _ = changed.changed().await;
    }
}
