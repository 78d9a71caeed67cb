//! The byte-budgeted queue between the network tasks and the writer thread,
//! the writer thread itself, and the counters.
//!
//! A request is acknowledged once it is in the queue; from then on it is
//! either written or counted as dropped (write error), never silently lost.
//!
//! The queue holds requests in protobuf, as received when possible: that
//! is 3–4 times smaller than the decoded messages, so the byte budget is
//! the memory really held, and the writer only copies bytes to the file
//! (decoding, checking and freeing the messages happen on the network
//! threads, in parallel).

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use deepspan_spans::{ExportTraceServiceRequest, SpanWriter};
use prost::Message;

use crate::digest::{digest, RequestDigest};
use crate::screen;
use crate::ReceiverStats;

/// One accepted request on its way to disk or to a sink.
pub(crate) struct Job {
    /// The request in protobuf.
    encoded: Bytes,
    spans: u64,
    /// For a sink: what it reads of the request.
    digest: Option<RequestDigest>,
}

/// What became of a decoded request.
pub(crate) enum Outcome {
    /// Queued (possibly without some invalid spans: `rejected` of them, the
    /// first reason in `problem`).
    Accepted {
        rejected: u64,
        problem: Option<String>,
    },
    /// The queue is over budget; the sender should retry later.
    Full,
    /// The receiver is shutting down.
    Closed,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    requests_rejected: AtomicU64,
    requests_invalid: AtomicU64,
    spans_received: AtomicU64,
    spans_written: AtomicU64,
    spans_dropped: AtomicU64,
    bytes: AtomicU64,
    write_errors: AtomicU64,
}

pub(crate) struct Queue {
    max_bytes: usize,
    /// Whether offers digest their requests (for a sink).
    digests: bool,
    queued_bytes: AtomicUsize,
    peak_queued_bytes: AtomicUsize,
    /// `None` once closed. Pushing under the lock makes "closed" exact: no
    /// request is acknowledged after the writer was told the queue ended.
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    paused: Mutex<bool>,
    unpaused: Condvar,
    counters: Counters,
    last_write_error: Mutex<Option<String>>,
}

/// A poisoned lock only means another thread panicked holding it; the data
/// (a flag, a sender) is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Queue {
    pub(crate) fn new(max_bytes: usize, digests: bool) -> (Queue, mpsc::Receiver<Job>) {
        let (tx, rx) = mpsc::channel();
        let queue = Queue {
            max_bytes,
            digests,
            queued_bytes: AtomicUsize::new(0),
            peak_queued_bytes: AtomicUsize::new(0),
            sender: Mutex::new(Some(tx)),
            paused: Mutex::new(false),
            unpaused: Condvar::new(),
            counters: Counters::default(),
            last_write_error: Mutex::new(None),
        };
        (queue, rx)
    }

    /// Counts a request whose payload could not be decoded.
    pub(crate) fn invalid(&self, bytes: usize) {
        self.counters.requests.fetch_add(1, Relaxed);
        self.counters.requests_invalid.fetch_add(1, Relaxed);
        self.counters.bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Screens a decoded request and queues what is valid in it.
    /// `protobuf`: the bytes it was decoded from, stored as they are unless
    /// spans had to be taken out (None for JSON); `payload_bytes`: the size
    /// received, for the counters.
    pub(crate) fn offer(
        &self,
        mut request: ExportTraceServiceRequest,
        protobuf: Option<Bytes>,
        payload_bytes: usize,
    ) -> Outcome {
        let c = &self.counters;
        c.requests.fetch_add(1, Relaxed);
        c.bytes.fetch_add(payload_bytes as u64, Relaxed);
        let screened = screen::screen(&mut request);
        c.spans_received.fetch_add(screened.spans, Relaxed);
        let kept = screened.spans - screened.rejected;
        if kept == 0 {
            c.spans_dropped.fetch_add(screened.rejected, Relaxed);
            return Outcome::Accepted {
                rejected: screened.rejected,
                problem: screened.problem,
            };
        }
        let encoded = match protobuf {
            Some(raw) if screened.rejected == 0 => raw,
            _ => Bytes::from(request.encode_to_vec()),
        };
        let digest = self.digests.then(|| digest(&request));
        drop(request);
        let outcome = self.push(Job {
            encoded,
            spans: kept,
            digest,
        });
        match outcome {
            Outcome::Accepted { .. } => {
                c.spans_dropped.fetch_add(screened.rejected, Relaxed);
                Outcome::Accepted {
                    rejected: screened.rejected,
                    problem: screened.problem,
                }
            }
            refused => {
                c.requests_rejected.fetch_add(1, Relaxed);
                c.spans_dropped.fetch_add(screened.spans, Relaxed);
                refused
            }
        }
    }

    fn push(&self, job: Job) -> Outcome {
        let bytes = job.encoded.len();
        // Reserve first: an empty queue takes any request, so one larger than
        // the whole budget is slow but never refused forever.
        let mut current = self.queued_bytes.load(Relaxed);
        loop {
            if current != 0 && current.saturating_add(bytes) > self.max_bytes {
                return Outcome::Full;
            }
            match self.queued_bytes.compare_exchange_weak(
                current,
                current + bytes,
                Relaxed,
                Relaxed,
            ) {
                Ok(_) => {
                    self.peak_queued_bytes.fetch_max(current + bytes, Relaxed);
                    break;
                }
                Err(now) => current = now,
            }
        }
        let sent = match lock(&self.sender).as_ref() {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        };
        if sent {
            Outcome::Accepted {
                rejected: 0,
                problem: None,
            }
        } else {
            self.queued_bytes.fetch_sub(bytes, Relaxed);
            Outcome::Closed
        }
    }

    /// Ends the queue: later offers are refused, the writer drains and stops.
    pub(crate) fn close(&self) {
        lock(&self.sender).take();
        self.set_paused(false);
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        *lock(&self.paused) = paused;
        self.unpaused.notify_all();
    }

    fn is_paused(&self) -> bool {
        *lock(&self.paused)
    }

    fn wait_while_paused(&self) {
        let mut paused = lock(&self.paused);
        while *paused {
            paused = self
                .unpaused
                .wait(paused)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(crate) fn stats(&self) -> ReceiverStats {
        let c = &self.counters;
        ReceiverStats {
            requests: c.requests.load(Relaxed),
            requests_rejected: c.requests_rejected.load(Relaxed),
            requests_invalid: c.requests_invalid.load(Relaxed),
            spans_received: c.spans_received.load(Relaxed),
            spans_written: c.spans_written.load(Relaxed),
            spans_dropped: c.spans_dropped.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            write_errors: c.write_errors.load(Relaxed),
            queue_peak_bytes: self.peak_queued_bytes.load(Relaxed) as u64,
            last_write_error: lock(&self.last_write_error).clone(),
        }
    }

    fn write_failed(&self, lost_spans: u64, error: String) {
        self.counters.spans_dropped.fetch_add(lost_spans, Relaxed);
        self.counters.write_errors.fetch_add(1, Relaxed);
        *lock(&self.last_write_error) = Some(error);
    }
}

/// Longest time an appended request stays in the writer's buffer: after
/// it, the writer flushes to the OS (no fsync), so a process killed with
/// SIGKILL loses at most this much of what it acknowledged, and a reader of
/// the run sees spans this soon.
pub(crate) const MAX_FLUSH_DELAY: Duration = Duration::from_millis(500);

/// Under steady load the queue never runs empty, so the writer flushes
/// every so many records as well, bounding what a crash could lose in count.
const MAX_UNFLUSHED_RECORDS: u64 = 64;

/// When the writer must flush although more requests are waiting.
struct FlushPolicy {
    /// When the oldest unflushed record was appended, if there is one.
    oldest_unflushed: Option<Instant>,
    unflushed_records: u64,
}

impl FlushPolicy {
    fn new() -> FlushPolicy {
        FlushPolicy {
            oldest_unflushed: None,
            unflushed_records: 0,
        }
    }

    fn appended(&mut self, now: Instant) {
        self.oldest_unflushed.get_or_insert(now);
        self.unflushed_records += 1;
    }

    fn flushed(&mut self) {
        self.oldest_unflushed = None;
        self.unflushed_records = 0;
    }

    fn due(&self, now: Instant) -> bool {
        self.unflushed_records >= MAX_UNFLUSHED_RECORDS
            || self
                .oldest_unflushed
                .is_some_and(|t| now.saturating_duration_since(t) >= MAX_FLUSH_DELAY)
    }
}

/// The writer thread: takes requests off the queue in order and appends
/// them to one span file, created on the first request. Spans count as
/// written once flushed: when the queue runs empty, before the writer is
/// paused, and at the latest [`MAX_FLUSH_DELAY`] after they were appended.
/// A failed write or flush counts the spans it lost as dropped and starts a
/// new file for the next request (the old one keeps every complete record
/// before the failure).
pub(crate) fn run_writer(run_dir: &Path, jobs: mpsc::Receiver<Job>, queue: &Queue) {
    let mut out: Option<SpanWriter> = None;
    // Spans appended since the last flush: written only once flushed.
    let mut unflushed: u64 = 0;
    let mut policy = FlushPolicy::new();
    let flush = |out: &mut Option<SpanWriter>, unflushed: &mut u64, policy: &mut FlushPolicy| {
        policy.flushed();
        let Some(w) = out.as_mut() else { return };
        match w.flush() {
            Ok(()) => {
                queue.counters.spans_written.fetch_add(*unflushed, Relaxed);
            }
            Err(e) => {
                queue.write_failed(*unflushed, e.to_string());
                *out = None;
            }
        }
        *unflushed = 0;
    };
    loop {
        let job = match jobs.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Empty) => {
                // Idle: make what was written visible to readers before waiting.
                flush(&mut out, &mut unflushed, &mut policy);
                match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if queue.is_paused() {
            // A pause may last; what is already written must not wait for it.
            flush(&mut out, &mut unflushed, &mut policy);
            queue.wait_while_paused();
        }
        let result = match out.as_mut() {
            Some(w) => w.append_encoded(&job.encoded),
            None => SpanWriter::create(run_dir).and_then(|mut w| {
                let r = w.append_encoded(&job.encoded);
                out = Some(w);
                r
            }),
        };
        match result {
            Ok(()) => {
                unflushed += job.spans;
                let now = Instant::now();
                policy.appended(now);
                if policy.due(now) {
                    flush(&mut out, &mut unflushed, &mut policy);
                }
            }
            Err(e) => {
                // A failed buffered write may have taken earlier unflushed records with it.
                queue.write_failed(unflushed + job.spans, e.to_string());
                unflushed = 0;
                out = None;
            }
        }
        queue.queued_bytes.fetch_sub(job.encoded.len(), Relaxed);
    }
    flush(&mut out, &mut unflushed, &mut policy);
}

/// The consumer thread of a receiver started with a [`RequestSink`]: each
/// request in order to the sink, counted as written once it took it.
pub(crate) fn run_sink(
    mut sink: Box<dyn crate::RequestSink>,
    jobs: mpsc::Receiver<Job>,
    queue: &Queue,
) {
    while let Ok(job) = jobs.recv() {
        queue.wait_while_paused();
        let bytes = job.encoded.len();
        let digest = job.digest.unwrap_or_default();
        match sink.accept(job.encoded, job.spans, digest) {
            Ok(()) => {
                queue.counters.spans_written.fetch_add(job.spans, Relaxed);
            }
            Err(e) => queue.write_failed(job.spans, e),
        }
        queue.queued_bytes.fetch_sub(bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_flushed_within_the_delay_even_under_steady_load() {
        let start = Instant::now();
        let mut policy = FlushPolicy::new();
        assert!(
            !policy.due(start + MAX_FLUSH_DELAY * 10),
            "nothing to flush"
        );
        policy.appended(start);
        // More records keep coming, but the oldest one sets the deadline.
        let before = start + MAX_FLUSH_DELAY - Duration::from_millis(1);
        policy.appended(before);
        assert!(!policy.due(before));
        assert!(policy.due(start + MAX_FLUSH_DELAY));
        policy.flushed();
        assert!(!policy.due(start + MAX_FLUSH_DELAY * 2));
    }

    #[test]
    fn a_burst_of_records_is_flushed_by_count() {
        let now = Instant::now();
        let mut policy = FlushPolicy::new();
        for _ in 1..MAX_UNFLUSHED_RECORDS {
            policy.appended(now);
            assert!(!policy.due(now));
        }
        policy.appended(now);
        assert!(policy.due(now));
    }

    /// The writer flushes when the queue runs empty: what was acknowledged
    /// is in the file while the receiver keeps running, before any shutdown.
    #[test]
    fn an_idle_writer_has_flushed_everything_it_wrote() {
        let run = tempfile::tempdir().unwrap();
        let (queue, jobs) = Queue::new(1 << 20, false);
        let request = deepspan_spans::ExportTraceServiceRequest::default();
        let encoded = Bytes::from(request.encode_to_vec());
        std::thread::scope(|scope| {
            let writer = scope.spawn(|| run_writer(run.path(), jobs, &queue));
            for _ in 0..3 {
                assert!(matches!(
                    queue.push(Job {
                        encoded: encoded.clone(),
                        spans: 1,
                        digest: None,
                    }),
                    Outcome::Accepted { .. }
                ));
            }
            // Written counts only flushed spans; poll until the writer
            // idles (the deadline only turns a broken writer into a failure).
            let deadline = Instant::now() + Duration::from_secs(60);
            while queue.stats().spans_written < 3 {
                assert!(!writer.is_finished() && Instant::now() < deadline);
                std::thread::sleep(Duration::from_millis(1));
            }
            let file = run.path().join("spans/otlp-000.pb");
            let records: Vec<_> = deepspan_spans::store::RecordReader::open(&file)
                .unwrap()
                .collect();
            assert_eq!(records.len(), 3);
            queue.close();
        });
    }

    /// A sink gets every request in order; a refused one is counted as
    /// dropped with its message, the others as written.
    #[test]
    fn a_sink_takes_requests_in_order_and_its_refusals_are_counted() {
        struct Collect(std::sync::mpsc::Sender<usize>);
        impl crate::RequestSink for Collect {
            fn accept(
                &mut self,
                encoded: Bytes,
                _spans: u64,
                _digest: RequestDigest,
            ) -> Result<(), String> {
                if encoded.len() == 2 {
                    return Err("two bytes refused".into());
                }
                self.0.send(encoded.len()).unwrap();
                Ok(())
            }
        }
        let (queue, jobs) = Queue::new(1 << 20, true);
        let (seen_tx, seen) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let consumer = scope.spawn(|| run_sink(Box::new(Collect(seen_tx)), jobs, &queue));
            for len in [1usize, 2, 3] {
                let job = Job {
                    encoded: Bytes::from(vec![0u8; len]),
                    spans: len as u64,
                    digest: None,
                };
                assert!(matches!(queue.push(job), Outcome::Accepted { .. }));
            }
            queue.close();
            consumer.join().unwrap();
        });
        assert_eq!(seen.iter().collect::<Vec<_>>(), vec![1, 3]);
        let stats = queue.stats();
        assert_eq!((stats.spans_written, stats.spans_dropped), (4, 2));
        assert_eq!(stats.last_write_error.as_deref(), Some("two bytes refused"));
        assert_eq!(queue.queued_bytes.load(Relaxed), 0);
    }
}
