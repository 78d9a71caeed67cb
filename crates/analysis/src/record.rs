//! A request's analysis as it is kept once its critical path is written:
//! the path's times and threads, where its time went, its totals, and the
//! judgement passed on it (diagnosis, baseline, anomaly). The writers of
//! `RUN/analysis/` serialize these; they compute nothing themselves.

use std::ops::Range;

use crate::diagnosis::Diagnosis;
use crate::graph::EdgeType;
use crate::input::LostEvents;
use crate::queue::Arrival;
use crate::request::RequestPath;
use crate::state::KernelModel;
use crate::summary::{summarize, RequestSummary};
use crate::syscalls::Arch;

/// One analysed request.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// The path's request, times and threads; `pieces` may have been
    /// dropped.
    pub path: RequestPath,
    pub summary: RequestSummary,
    pub totals: RequestTotals,
    /// Kernel events lost during the request.
    pub lost_events: u64,
    /// What the request mostly waited for (`None` without a kernel path).
    pub diagnosis: Option<Diagnosis>,
    /// Median duration of its `[service] operation` (at least
    /// [`MIN_BASELINE_REQUESTS`](crate::diagnosis::MIN_BASELINE_REQUESTS) requests).
    pub baseline_ns: Option<u64>,
    /// Well above the baseline ([`crate::is_anomalous`]).
    pub anomalous: bool,
    /// Its time queued before the span started, when its arrival is known.
    pub queue: Option<QueueRecord>,
    /// Where its pieces are in the `critical_path` table (row numbers),
    /// once written there.
    pub path_rows: Option<Range<u64>>,
}

/// A request's time queued before its span started
/// ([`RequestPath::queue`]), as kept.
#[derive(Clone, Debug)]
pub struct QueueRecord {
    pub arrival: Arrival,
    /// From the arrival to the span's start.
    pub ns: u64,
    /// Where that time went, as a request's summary.
    pub summary: RequestSummary,
    /// What it mostly waited for: [`crate::Cause::BlockedByRequest`] is
    /// queued behind other requests (`None` without a path of it).
    pub diagnosis: Option<Diagnosis>,
    /// Where its pieces are in the `queue_path` table, once written there.
    pub path_rows: Option<Range<u64>>,
}

impl RequestRecord {
    /// Summarizes a complete path; its pieces are kept only if `keep`.
    /// The judgement is passed later, over all requests.
    pub fn new(
        model: &KernelModel,
        arch: Arch,
        lost: &LostEvents,
        mut path: RequestPath,
        keep: bool,
    ) -> RequestRecord {
        let summary = summarize(model, arch, &path);
        let totals = RequestTotals::of(&path);
        let lost_events = lost.in_range(path.start, path.end);
        let queue = path.arrival.map(|arrival| QueueRecord {
            arrival,
            ns: path.queue_ns(),
            summary: path
                .queue_path()
                .map(|q| summarize(model, arch, &q))
                .unwrap_or_default(),
            diagnosis: None,
            path_rows: None,
        });
        if !keep {
            path.pieces = Vec::new();
            path.queue = Vec::new();
        }
        RequestRecord {
            path,
            summary,
            totals,
            lost_events,
            diagnosis: None,
            baseline_ns: None,
            anomalous: false,
            queue,
            path_rows: None,
        }
    }
}

/// A path's time by kind of piece (the `requests` table's totals).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestTotals {
    pub pieces: u64,
    pub running_ns: u64,
    pub preempted_ns: u64,
    /// Of `preempted_ns`, the CPU stayed idle under a CPU quota.
    pub throttled_ns: u64,
    /// Pieces where a thread worked for another request.
    pub blocked_by_requests_ns: u64,
    pub unknown_ns: u64,
}

impl RequestTotals {
    pub fn of(path: &RequestPath) -> RequestTotals {
        let mut t = RequestTotals {
            pieces: path.pieces.len() as u64,
            ..RequestTotals::default()
        };
        for p in &path.pieces {
            let d = p.duration();
            if p.blocked_by.is_some() {
                t.blocked_by_requests_ns += d;
            }
            match p.state {
                EdgeType::Running => t.running_ns += d,
                EdgeType::Preempted => {
                    t.preempted_ns += d;
                    t.throttled_ns += p.cpu_wait.map_or(0, |w| w.throttled_ns);
                }
                EdgeType::Unknown | EdgeType::Default => t.unknown_ns += d,
                _ => {}
            }
        }
        t
    }
}
