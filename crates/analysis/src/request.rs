//! Per-request kernel critical paths (Gelle et al. 2021, §3.4).
//!
//! A *request* is a span that starts a unit of work: a root span (no parent
//! among the spans given) or an entry span of a service (server, consumer).
//! Every span belongs to the nearest request among itself and its ancestors.
//!
//! For each request:
//! 1. *home segments*: which thread carries the request when. Where the span
//!    is activated (`deepspan.on`/`off`), the thread it is active on (the
//!    thread that started it when it is active on several); elsewhere the
//!    thread that started it (`deepspan.tid`, or `thread.id` when the caller
//!    says it is an OS tid), which then works for other requests or nobody.
//! 2. requests are taken in groups that overlap in time (only those can
//!    share a state); for each group, the thread critical path of each home
//!    thread over the group's segments on it ([`crate::critical_path`], once
//!    per thread and overlapping range);
//! 3. the group's request paths merged ([`crate::merge_paths`], Algorithm
//!    2), so a state on several paths at once (contention) is one shared
//!    node; a group of one request is its own merged graph;
//! 4. each piece of the merged path goes to whoever the piece's thread was
//!    working for at that time ([`ThreadWork`]): the request itself (or a
//!    span inside it), or another request X — the request was then *blocked
//!    by request X* (the thread it depended on, its own included, was busy
//!    for X). A thread without spans works for the request whose own
//!    thread it woke at the end of a wait covering that time (a database
//!    backend for its client's request: `Served`). A TIMER piece whose
//!    wait is resumed at once in the same call and then ended by a thread
//!    is attributed like what follows it (`resume_timeouts`: PostgreSQL's
//!    deadlock check in a row-lock wait). Waiting pieces are split at
//!    system-call boundaries (what the
//!    thread waited in; a RUNNING stretch stays whole), pieces of other
//!    threads say what the request's own thread was waiting in, and
//!    runnable pieces say who had the CPU ([`CpuWait`]).
//!
//! Paths are handed to the caller group by group as they are done, so
//! memory is bounded by the largest group, not by the run.
//!
//! Time of the request not covered by any path (no home thread known, or a
//! thread not in the trace yet) is UNKNOWN, so every path covers exactly
//! `[start, end)`.

use std::collections::HashMap;
use std::sync::Arc;

use deepspan_model::{Comm, Tid};

use crate::critical::Piece;
use crate::graph::EdgeType;
use crate::merge::{join_adjacent, merge_paths};
use crate::queue::Arrival;
use crate::state::{BlockReason, KernelModel, SyscallInterval, ThreadState, NO_CPU};
use crate::syscalls::{syscall_name, Arch};
use rustc_hash::FxHashMap;

/// Index of a span in the slice given to [`analyze_requests`].
pub type SpanIdx = u32;

/// Deepest parent chain followed; deeper (or cyclic) chains stop there.
const MAX_DEPTH: usize = 4096;

/// How a request was placed on kernel threads and time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncSource {
    /// Monotonic times and OS thread from the span itself (deepspan SDK
    /// fields): no clock mapping, nanosecond precision.
    Exact,
    /// Wall-clock times mapped to the kernel clock through the run's clock
    /// samples (µs precision); the thread from `deepspan.tid`, activations,
    /// or `thread.id` when told it is an OS tid.
    ClockMapped,
    /// Wall-clock times mapped, the thread inferred from the kernel trace
    /// (no deepspan fields: `crate::placement`).
    Inferred,
    /// Wall-clock times mapped, placed on its process as a whole: no single
    /// thread is credible (event loops, goroutines); the path follows, at
    /// each instant, the process thread that is furthest along (running,
    /// then waiting for a CPU, then waiting for the disk, the network …).
    Process,
    /// Nothing places the request on a thread or on the kernel clock: it has
    /// no kernel critical path.
    None,
}

impl SyncSource {
    /// `exact`, `clock_mapped`, `inferred`, `process` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            SyncSource::Exact => "exact",
            SyncSource::ClockMapped => "clock_mapped",
            SyncSource::Inferred => "inferred",
            SyncSource::Process => "process",
            SyncSource::None => "none",
        }
    }
}

/// A span's context becoming current (`on`) or not (`off`) on a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivationInput {
    pub tid: Tid,
    /// Kernel clock (CLOCK_MONOTONIC ns).
    pub ts: u64,
    pub on: bool,
}

/// One span, as the request analysis needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanInput {
    /// Index of the parent span in the same slice, when it is there.
    pub parent: Option<SpanIdx>,
    /// An entry span of a service (OTLP kind server or consumer): it starts
    /// a request even when it has a parent.
    pub entry: bool,
    /// Start and end on the kernel clock; `None` when they cannot be known.
    pub times: Option<(u64, u64)>,
    /// True when `times` come from the span's own monotonic fields.
    pub exact_times: bool,
    /// The OS thread that started the span.
    pub holder: Option<Tid>,
    /// Activations of the span, in any order.
    pub activations: Vec<ActivationInput>,
    /// How the span was placed when it has no deepspan fields (`holder`
    /// then holds the inferred thread).
    pub inferred: Option<InferredPlace>,
    /// When its request reached the host, before `times`' start
    /// ([`crate::arrivals`]): the time between is its queue.
    pub arrival: Option<Arrival>,
}

/// Placement of a span without deepspan fields, from the kernel trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InferredPlace {
    /// On the span's `holder` thread.
    Thread,
    /// On its process as a whole: these are the process's threads.
    Process(Vec<Tid>),
}

/// A thread working for span `span` during `[start, end)`.
///
/// Ordered by `start`, then `end`, then `span`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkInterval {
    pub start: u64,
    pub end: u64,
    pub span: SpanIdx,
}

/// Which span a thread works for over time: the span active on it
/// (Gelle et al. 2021, Alg. 1; `deepspan_spans::ThreadActivity` answers
/// it).
pub trait ThreadWork {
    /// Appends to `out`, in time order and clipped to `[start, end)`, the
    /// intervals in which thread `tid` works for a span.
    fn work_during(&self, tid: Tid, start: u64, end: u64, out: &mut Vec<WorkInterval>);
}

/// Who had the CPU while a thread of the path was runnable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuWait {
    /// Held back rather than out-competed: recorded as throttled by its
    /// CPU cgroup's quota; or, without a complete capture of that, inferred
    /// (a quota or a much lower priority): its CPU stayed idle, or one other
    /// thread kept it far beyond a fair time slice ([`FAIR_SLICE_NS`]) or
    /// got more turns than a fair share allows ([`FAIR_TURNS`]).
    pub throttled_ns: u64,
    /// Other threads ran on the thread's CPU meanwhile.
    pub contended_ns: u64,
    /// Runnable, and its CPU still idle: the time the idle CPU took to
    /// switch to it (wake-up latency).
    pub wakeup_ns: u64,
    /// The thread that ran longest instead, if any.
    pub holder: Option<Tid>,
}

/// One piece of a request's critical path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPiece {
    pub start: u64,
    pub end: u64,
    pub state: EdgeType,
    /// The thread in that state; `None` for time no thread is known for.
    pub tid: Option<Tid>,
    /// The thread's name at `start`.
    pub comm: Option<Comm>,
    /// Detail of the state: the interrupt of an unexplained BLOCKED, ….
    pub qualifier: Option<Arc<str>>,
    /// The system call the thread was in.
    pub syscall: Option<SyscallInterval>,
    /// When the piece is another thread's: the system call the request's
    /// own thread was waiting in meanwhile (the futex of a lock, the read
    /// of a socket …).
    pub waiting_in: Option<SyscallInterval>,
    /// The span the thread was working for, if any.
    pub span: Option<SpanIdx>,
    /// Set when the thread was working for another request: the request
    /// (index of its span) this one was blocked by.
    pub blocked_by: Option<SpanIdx>,
    /// How many other requests' paths go through this same state at the
    /// same time (contention; from the merged graph).
    pub shared: u32,
    /// The time a vertical edge spans (a message in flight).
    pub vertical: bool,
    /// Events were lost during the piece: it may be wrong.
    pub lost: bool,
    /// For PREEMPTED pieces: who had the CPU.
    pub cpu_wait: Option<CpuWait>,
}

impl RequestPiece {
    /// A thread path's piece cut to `[start, end)`, not yet attributed
    /// (no span, system call or blocker), `shared` with that many other
    /// requests.
    fn of_node(node: Piece, start: u64, end: u64, shared: u32) -> RequestPiece {
        RequestPiece {
            start: node.start.max(start),
            end: node.end.min(end),
            state: node.state,
            tid: Some(node.tid),
            comm: None,
            qualifier: node.qualifier,
            syscall: None,
            waiting_in: None,
            span: None,
            blocked_by: None,
            shared,
            vertical: node.vertical,
            lost: node.lost,
            cpu_wait: None,
        }
    }

    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// Thread `tid` carrying a request during `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HomeSegment {
    pub start: u64,
    pub end: u64,
    pub tid: Tid,
}

/// The kernel critical path of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPath {
    /// The request's span.
    pub request: SpanIdx,
    pub start: u64,
    pub end: u64,
    pub sync: SyncSource,
    /// The threads that carried the request, in time order.
    pub home: Vec<HomeSegment>,
    /// Time-ordered, non-overlapping, covering `[start, end)` (empty when
    /// the request has no kernel path).
    pub pieces: Vec<RequestPiece>,
    /// When the request reached its host, if known and before `start`.
    pub arrival: Option<Arrival>,
    /// The path of its time queued before its span started: as `pieces`,
    /// covering `[arrival, start)` on the thread that then took it up
    /// (empty without an arrival or a kernel path).
    pub queue: Vec<RequestPiece>,
    /// A thread critical path under it ran out of its step budget.
    pub truncated: bool,
}

impl RequestPath {
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Time from the request's arrival to its span's start (0 when its
    /// arrival is not known).
    pub fn queue_ns(&self) -> u64 {
        self.arrival.map_or(0, |a| self.start.saturating_sub(a.ts))
    }

    /// The path of its queue alone, as a path of its own (`[arrival,
    /// start)`, its pieces [`RequestPath::queue`]), for what reads a path:
    /// summaries, diagnoses. `None` without a queue.
    pub fn queue_path(&self) -> Option<RequestPath> {
        let arrival = self.arrival?;
        (!self.queue.is_empty()).then(|| RequestPath {
            request: self.request,
            start: arrival.ts,
            end: self.start,
            sync: self.sync,
            home: self
                .queue
                .first()
                .and_then(|p| p.tid)
                .map(|tid| HomeSegment {
                    start: arrival.ts,
                    end: self.start,
                    tid,
                })
                .into_iter()
                .collect(),
            pieces: self.queue.clone(),
            arrival: None,
            queue: Vec::new(),
            truncated: self.truncated,
        })
    }
}

/// What [`analyze_requests`] returns besides the paths it hands out.
#[derive(Clone, Debug, Default)]
pub struct RequestAnalysis {
    /// For every span, the request it belongs to.
    pub request_of: Vec<SpanIdx>,
    /// Number of requests (paths handed out).
    pub requests: usize,
    /// Thread critical paths computed (one per thread and time range).
    pub thread_paths: usize,
    /// States of the merged graphs that lie on more than one request path.
    pub shared_states: usize,
}

/// Spans that start a request: roots and entry spans.
pub fn is_request(span: &SpanInput) -> bool {
    span.parent.is_none() || span.entry
}

/// How `span` is placed on threads and time.
pub fn sync_source(span: &SpanInput) -> SyncSource {
    match (&span.inferred, span.times) {
        (Some(InferredPlace::Thread), Some(_)) if span.holder.is_some() => {
            return SyncSource::Inferred
        }
        (Some(InferredPlace::Process(threads)), Some(_)) if !threads.is_empty() => {
            return SyncSource::Process
        }
        _ => {}
    }
    let placed = span.holder.is_some() || !span.activations.is_empty();
    match span.times {
        Some(_) if placed && span.exact_times => SyncSource::Exact,
        Some(_) if placed => SyncSource::ClockMapped,
        _ => SyncSource::None,
    }
}

/// Computes the critical path of every request and hands each to
/// `on_path` as soon as it is complete; `progress(done, total)` follows.
///
/// Requests are processed in groups of requests overlapping in time (only
/// those can share a state, so Algorithm 2 merges each group on its own):
/// memory is bounded by the largest group, not by the whole run. Paths come
/// out group by group, in time order; within a group, in span order.
pub fn analyze_requests(
    model: &KernelModel,
    spans: &[SpanInput],
    work: &dyn ThreadWork,
    progress: &mut dyn FnMut(usize, usize),
    on_path: &mut dyn FnMut(RequestPath),
) -> RequestAnalysis {
    let request_of = requests_of(spans);
    let mut requests: Vec<RequestTimes> = (0..spans.len() as SpanIdx)
        .filter(|&i| request_of[i as usize] == i)
        .map(|i| {
            let (start, end) = spans[i as usize].times.unwrap_or((0, 0));
            RequestTimes {
                start,
                end,
                request: i,
            }
        })
        .collect();
    requests.sort_unstable();
    let total = requests.len();
    let mut out = RequestAnalysis {
        request_of,
        requests: total,
        ..RequestAnalysis::default()
    };
    let mut scratch = Scratch::default();
    let mut done = 0;
    let mut first = 0;
    while first < requests.len() {
        // The group: requests chained by time overlap.
        let mut last = first + 1;
        let mut reach = requests[first].end;
        while last < requests.len() && requests[last].start < reach {
            reach = reach.max(requests[last].end);
            last += 1;
        }
        let mut group: Vec<SpanIdx> = requests[first..last].iter().map(|r| r.request).collect();
        group.sort_unstable();
        analyze_group(model, spans, work, &group, &mut out, &mut scratch, on_path);
        done += group.len();
        progress(done, total);
        first = last;
    }
    out
}

/// Where a request waited from its arrival (`arrival`) to its span's
/// start: on the thread that took it up at the start; before that thread
/// existed, when it was made for the request (a server with a thread per
/// connection), on the thread that made it (the acceptor, accepting and
/// forking), when the fork was traced. Empty without a home at the start.
fn queue_homes(model: &KernelModel, span: &SpanInput, arrival: u64) -> Vec<HomeSegment> {
    let Some((start, _)) = span.times.filter(|t| arrival < t.0) else {
        return Vec::new();
    };
    let home = home_segments(span);
    let Some(tid) = home.first().filter(|h| h.start == start).map(|h| h.tid) else {
        return Vec::new();
    };
    let thread = model.thread(tid);
    let born = thread
        .and_then(|t| t.first_seen())
        .filter(|&b| arrival < b && b < start);
    let parent = thread.and_then(|t| t.parent).filter(|&p| p != tid);
    match (born, parent) {
        (Some(born), Some(parent)) => vec![
            HomeSegment {
                start: arrival,
                end: born,
                tid: parent,
            },
            HomeSegment {
                start: born,
                end: start,
                tid,
            },
        ],
        _ => vec![HomeSegment {
            start: arrival,
            end: start,
            tid,
        }],
    }
}

/// The path of request `r`'s queue ([`RequestPath::queue`]), from its
/// arrival to its span's start: each queue home's thread critical path
/// there ([`queue_homes`]; a process-level request, its process's), its
/// pieces attributed as a span's are. Queue paths are computed on their
/// own, never merged with the groups' paths: the span's own path is what
/// it would be without them.
#[allow(clippy::too_many_arguments)]
fn queue_path(
    model: &KernelModel,
    spans: &[SpanInput],
    request_of: &[SpanIdx],
    work: &dyn ThreadWork,
    served: &Served,
    r: SpanIdx,
    arrival: u64,
    scratch: &mut Scratch,
) -> Vec<RequestPiece> {
    let span = &spans[r as usize];
    let Some((start, _)) = span.times else {
        return Vec::new();
    };
    let sync = sync_source(span);
    // The pieces before attribution, each with the home thread it is on
    // (none at process level).
    let mut bases: Vec<(RequestPiece, Option<Tid>)> = Vec::new();
    let homes = match (sync, &span.inferred) {
        (SyncSource::None, _) => return Vec::new(),
        (SyncSource::Process, Some(InferredPlace::Process(threads))) => {
            let process = process_pieces(model, threads, arrival, start);
            bases.extend(process.into_iter().map(|p| (p, None)));
            Vec::new()
        }
        _ => queue_homes(model, span, arrival),
    };
    if homes.is_empty() && bases.is_empty() {
        return Vec::new();
    }
    for home in &homes {
        let mut raw = crate::critical_path(model, home.tid, home.start, home.end).pieces;
        if !raw.windows(2).all(|w| w[0].start <= w[1].start) {
            raw.sort_by_key(|p| p.start);
        }
        for node in join_adjacent(&raw) {
            let base = RequestPiece::of_node(node, home.start, home.end, 0);
            if base.end > base.start {
                bases.push((base, Some(home.tid)));
            }
        }
    }
    let mut pieces = Vec::with_capacity(bases.len());
    for (base, home) in bases {
        let owner = Owner { request: r, home };
        attribute(
            model,
            spans,
            request_of,
            work,
            owner,
            served,
            base,
            scratch,
            &mut pieces,
        );
    }
    fill_gaps(model, &homes, arrival, start, &mut pieces);
    if sync != SyncSource::Process {
        resume_timeouts(model, &mut pieces);
    }
    join(pieces)
}

/// A request's span and its time on the kernel clock (`[0, 0)` when
/// unknown). Ordered by `start`, then `end`, then `request`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RequestTimes {
    start: u64,
    end: u64,
    request: SpanIdx,
}

/// One group of requests overlapping in time: thread paths, merge,
/// attribution.
fn analyze_group(
    model: &KernelModel,
    spans: &[SpanInput],
    work: &dyn ThreadWork,
    group: &[SpanIdx],
    out: &mut RequestAnalysis,
    scratch: &mut Scratch,
    on_path: &mut dyn FnMut(RequestPath),
) {
    // Where each request runs, then each home thread's critical path once
    // per time range where requests overlap on it.
    let homes: Vec<Vec<HomeSegment>> = group
        .iter()
        .map(|&r| home_segments(&spans[r as usize]))
        .collect();
    let served = served_by(model, group, &homes);
    let mut ranges: HashMap<Tid, Vec<(u64, u64)>> = HashMap::new();
    for seg in homes.iter().flatten() {
        ranges
            .entry(seg.tid)
            .or_default()
            .push((seg.start, seg.end));
    }
    let mut thread_paths: HashMap<Tid, Vec<ThreadPath>> = HashMap::new();
    for (tid, mut rs) in ranges {
        rs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in rs {
            match merged.last_mut() {
                Some(last) if a < last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let paths = merged
            .into_iter()
            .map(|(a, b)| {
                out.thread_paths += 1;
                let cp = crate::critical_path(model, tid, a, b);
                let mut pieces = cp.pieces;
                // Path order is time order; a stable sort guards the slicing
                // below against any piece out of place.
                if !pieces.windows(2).all(|w| w[0].start <= w[1].start) {
                    pieces.sort_by_key(|p| p.start);
                }
                ThreadPath {
                    start: a,
                    end: b,
                    pieces,
                    truncated: cp.truncated,
                }
            })
            .collect();
        thread_paths.insert(tid, paths);
    }

    // Each request's path: its home threads' paths over its segments.
    let mut raw: Vec<Vec<Piece>> = Vec::with_capacity(group.len());
    let mut truncated = vec![false; group.len()];
    for (n, home) in homes.iter().enumerate() {
        let mut pieces = Vec::new();
        for &HomeSegment { start, end, tid } in home {
            let Some(tp) = thread_paths
                .get(&tid)
                .and_then(|v| v.iter().find(|p| p.start <= start && end <= p.end))
            else {
                continue;
            };
            truncated[n] |= tp.truncated;
            let first = tp.pieces.partition_point(|p| p.end <= start);
            for p in tp.pieces[first..].iter().take_while(|p| p.start < end) {
                let (s, e) = (p.start.max(start), p.end.min(end));
                if e > s {
                    pieces.push(Piece {
                        start: s,
                        end: e,
                        ..p.clone()
                    });
                }
            }
        }
        raw.push(pieces);
    }
    drop(thread_paths);

    // A request alone in its time range shares nothing: its merged graph is
    // its own path (adjacent equal pieces joined), so the merge is skipped.
    let merged = (group.len() > 1).then(|| merge_paths(raw.iter().map(|p| p.as_slice())));
    if let Some(m) = &merged {
        out.shared_states += m.shared_nodes().count();
    }
    let alone: Vec<Piece> = match &merged {
        Some(_) => Vec::new(),
        None => join_adjacent(&raw[0]),
    };
    drop(raw);

    for (n, &r) in group.iter().enumerate() {
        let span = &spans[r as usize];
        let sync = sync_source(span);
        let (start, end) = span.times.unwrap_or((0, 0));
        let mut pieces = Vec::with_capacity(
            match &merged {
                Some(m) => m.path_len(n as u32),
                None => alone.len(),
            } * 3
                / 2
                + 2,
        );
        if let (SyncSource::Process, Some(InferredPlace::Process(threads))) = (sync, &span.inferred)
        {
            for base in process_pieces(model, threads, start, end) {
                let owner = Owner {
                    request: r,
                    home: None,
                };
                attribute(
                    model,
                    spans,
                    &out.request_of,
                    work,
                    owner,
                    &served,
                    base,
                    scratch,
                    &mut pieces,
                );
            }
            fill_gaps(model, &homes[n], start, end, &mut pieces);
        } else if sync != SyncSource::None {
            // (piece, how many other paths share it)
            let nodes: Box<dyn Iterator<Item = (Piece, u32)>> = match &merged {
                Some(m) => Box::new(m.path_nodes(n as u32).into_iter().map(|i| {
                    let node = &m.nodes()[i as usize];
                    let piece = Piece {
                        start: node.start,
                        end: node.end,
                        tid: node.tid,
                        state: node.state,
                        qualifier: node.qualifier.clone(),
                        link_from: None,
                        vertical: node.vertical,
                        lost: node.lost,
                    };
                    (piece, node.paths.len().saturating_sub(1) as u32)
                })),
                None => Box::new(alone.iter().map(|p| (p.clone(), 0))),
            };
            for (node, shared) in nodes {
                let base = RequestPiece::of_node(node, start, end, shared);
                if base.end > base.start {
                    let home = homes[n]
                        .iter()
                        .find(|h| h.start <= base.start && base.start < h.end)
                        .map(|h| h.tid);
                    attribute(
                        model,
                        spans,
                        &out.request_of,
                        work,
                        Owner { request: r, home },
                        &served,
                        base,
                        scratch,
                        &mut pieces,
                    );
                }
            }
            fill_gaps(model, &homes[n], start, end, &mut pieces);
            resume_timeouts(model, &mut pieces);
        }
        let arrival = span.arrival.filter(|a| a.ts < start);
        let queue = match arrival {
            Some(a) => queue_path(
                model,
                spans,
                &out.request_of,
                work,
                &served,
                r,
                a.ts,
                scratch,
            ),
            None => Vec::new(),
        };
        on_path(RequestPath {
            request: r,
            start,
            end,
            sync,
            home: homes[n].clone(),
            pieces: join(pieces),
            arrival,
            queue,
            truncated: truncated[n],
        });
    }
}

/// How far along a state is, for process-level paths: the process is
/// where its most advanced thread is (running beats waiting for a CPU,
/// which beats waiting for the disk, the network, another thread, a timer).
fn progress_rank(state: ThreadState) -> u8 {
    match state.edge_type() {
        EdgeType::Running => 0,
        EdgeType::Preempted => 1,
        EdgeType::BlockDevice => 2,
        EdgeType::Network => 3,
        EdgeType::Blocked => 4,
        EdgeType::Timer => 5,
        EdgeType::Unknown => 7,
        _ => 6,
    }
}

/// The path of a request placed on a process as a whole (no thread of its
/// own): over `[start, end)`, at each instant the state of the process's
/// most advanced thread: a running one, else a runnable one, else the
/// waiting thread shown last (the one that ran before it waited), else the
/// wait of highest [`progress_rank`]; the thread already shown first on a
/// tie, then the lowest tid. Every piece names a real thread in the state
/// it was in.
fn process_pieces(model: &KernelModel, threads: &[Tid], start: u64, end: u64) -> Vec<RequestPiece> {
    let histories: Vec<(Tid, &[crate::state::StateInterval])> = threads
        .iter()
        .filter_map(|&t| Some((t, model.thread(t)?.states_in(start, end))))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    let mut cuts: Vec<u64> = vec![start, end];
    for (_, states) in &histories {
        for s in *states {
            cuts.extend([s.start.clamp(start, end), s.end.clamp(start, end)]);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut next = vec![0usize; histories.len()];
    let mut out: Vec<RequestPiece> = Vec::new();
    let mut shown: Option<Tid> = None;
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let mut best: Option<(Standing, ThreadState)> = None;
        for (k, (tid, states)) in histories.iter().enumerate() {
            while next[k] < states.len() && states[next[k]].end <= a {
                next[k] += 1;
            }
            let Some(st) = states.get(next[k]).filter(|s| s.start <= a) else {
                continue;
            };
            // Smaller is better: running, then runnable, then waiting; among
            // waits the thread already shown (the one that just ran: its wait
            // is the process's, not that of a thread idle all along), then
            // the rank of the wait, then tid.
            let rank = progress_rank(st.state);
            let standing = Standing {
                activity: rank.min(2),
                not_shown: shown != Some(*tid),
                rank,
                tid: *tid,
            };
            if best.is_none_or(|(b, _)| standing < b) {
                best = Some((standing, st.state));
            }
        }
        let Some((Standing { tid, .. }, state)) = best else {
            continue;
        };
        shown = Some(tid);
        match out.last_mut() {
            Some(last)
                if last.end == a && last.tid == Some(tid) && last.state == state.edge_type() =>
            {
                last.end = b
            }
            _ => out.push(RequestPiece {
                start: a,
                end: b,
                state: state.edge_type(),
                tid: Some(tid),
                comm: None,
                qualifier: None,
                syscall: None,
                waiting_in: None,
                span: None,
                blocked_by: None,
                shared: 0,
                vertical: false,
                lost: model.overlaps_lost(a, b),
                cpu_wait: None,
            }),
        }
    }
    out
}

/// How well a thread of a process-level request stands for its process at
/// an instant, for [`process_pieces`]: smaller is better, compared field by
/// field in this order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Standing {
    /// Running (0), runnable (1) or waiting (2).
    activity: u8,
    /// False for the thread shown last.
    not_shown: bool,
    /// [`progress_rank`] of its state.
    rank: u8,
    tid: Tid,
}

struct ThreadPath {
    start: u64,
    end: u64,
    pieces: Vec<Piece>,
    truncated: bool,
}

/// Whose path a piece is on: the request, and its own thread at the time.
#[derive(Clone, Copy)]
struct Owner {
    request: SpanIdx,
    home: Option<Tid>,
}

#[derive(Default)]
struct Scratch {
    work: Vec<WorkInterval>,
    cuts: Vec<u64>,
    /// Where the last lookup in each sorted history ended: pieces come in
    /// time order, so the next lookup is usually close by.
    hints: FxHashMap<(Hint, i64), usize>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Hint {
    Syscalls,
    States,
    Cpu,
}

impl Scratch {
    /// The items of `items` (sorted, non-overlapping closed ranges) that
    /// overlap `[start, end]`, searched from where the last lookup under
    /// the same key ended.
    fn overlapping<'a, T>(
        &mut self,
        key: (Hint, i64),
        items: &'a [T],
        start: u64,
        end: u64,
        range: impl Fn(&T) -> (u64, u64),
    ) -> &'a [T] {
        let hint = self.hints.entry(key).or_insert(0);
        let a = partition_point_near(items, *hint, |x| range(x).1 < start);
        let b = partition_point_near(items, a, |x| range(x).0 <= end);
        *hint = a;
        items.get(a..b.max(a)).unwrap_or(&[])
    }
}

/// `v.partition_point(pred)`, searched outwards from `hint` (galloping):
/// O(log distance) instead of O(log len) when the answer is near the hint.
fn partition_point_near<T>(v: &[T], hint: usize, pred: impl Fn(&T) -> bool) -> usize {
    let n = v.len();
    let hint = hint.min(n);
    let (lo, hi) = if hint < n && pred(&v[hint]) {
        // The answer is after the hint.
        let (mut lo, mut step) = (hint + 1, 1);
        let hi = loop {
            let probe = hint + step;
            if probe >= n {
                break n;
            }
            if !pred(&v[probe]) {
                break probe;
            }
            lo = probe + 1;
            step *= 2;
        };
        (lo, hi)
    } else {
        // The answer is at or before the hint.
        let (mut hi, mut step) = (hint, 1);
        let lo = loop {
            if step > hint {
                break 0;
            }
            let probe = hint - step;
            if pred(&v[probe]) {
                break probe + 1;
            }
            hi = probe;
            step *= 2;
        };
        (lo, hi)
    };
    lo + v[lo..hi].partition_point(pred)
}

/// The request of every span: the nearest request among itself and its
/// ancestors.
fn requests_of(spans: &[SpanInput]) -> Vec<SpanIdx> {
    let mut out: Vec<Option<SpanIdx>> = vec![None; spans.len()];
    for i in 0..spans.len() {
        let mut chain = Vec::new();
        let mut cur = i as SpanIdx;
        let found = loop {
            if let Some(r) = out[cur as usize] {
                break r;
            }
            let s = &spans[cur as usize];
            if is_request(s) {
                break cur;
            }
            chain.push(cur);
            match s.parent {
                Some(p) if (p as usize) < spans.len() && chain.len() < MAX_DEPTH => cur = p,
                // A cycle or an absurd depth: the span stands for itself.
                _ => break i as SpanIdx,
            }
        };
        out[i] = Some(found);
        for c in chain {
            out[c as usize].get_or_insert(found);
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or(i as SpanIdx))
        .collect()
}

/// True when `span` is `request` or a descendant of it.
fn within(spans: &[SpanInput], mut span: SpanIdx, request: SpanIdx) -> bool {
    for _ in 0..MAX_DEPTH {
        if span == request {
            return true;
        }
        match spans.get(span as usize).and_then(|s| s.parent) {
            Some(p) => span = p,
            None => return false,
        }
    }
    false
}

/// The threads carrying a request over its lifetime, in time order,
/// non-overlapping.
pub(crate) fn home_segments(span: &SpanInput) -> Vec<HomeSegment> {
    let Some((start, end)) = span.times else {
        return Vec::new();
    };
    if end <= start {
        return Vec::new();
    }
    // Activation intervals per thread.
    let mut acts = span.activations.clone();
    acts.sort_by_key(|a| a.ts);
    let mut open: HashMap<Tid, u64> = HashMap::new();
    let mut active: Vec<HomeSegment> = Vec::new();
    for a in &acts {
        if a.on {
            open.entry(a.tid).or_insert(a.ts);
        } else if let Some(t) = open.remove(&a.tid) {
            active.push(HomeSegment {
                start: t,
                end: a.ts,
                tid: a.tid,
            });
        }
    }
    active.extend(
        open.into_iter()
            .map(|(tid, t)| HomeSegment { start: t, end, tid }),
    );
    active.retain_mut(|x| {
        x.start = x.start.max(start);
        x.end = x.end.min(end);
        x.end > x.start
    });
    if active.is_empty() {
        return span
            .holder
            .map(|tid| vec![HomeSegment { start, end, tid }])
            .unwrap_or_default();
    }
    // Elementary intervals between every boundary; in each, the holder if
    // active there, else the latest activated thread, else the holder.
    let mut cuts: Vec<u64> = vec![start, end];
    for x in &active {
        cuts.extend([x.start, x.end]);
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<HomeSegment> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let covers = |x: &HomeSegment| x.start <= a && b <= x.end;
        let here = active.iter().filter(|x| covers(x));
        let chosen = match span.holder {
            Some(h) if active.iter().any(|x| x.tid == h && covers(x)) => Some(h),
            _ => here
                .max_by_key(|x| (x.start, x.tid))
                .map(|x| x.tid)
                .or(span.holder),
        };
        let Some(tid) = chosen else { continue };
        match out.last_mut() {
            Some(last) if last.tid == tid && last.end == a => last.end = b,
            _ => out.push(HomeSegment {
                start: a,
                end: b,
                tid,
            }),
        }
    }
    out
}

/// Which requests each thread served: a request's own thread was waiting
/// (BLOCKED or NETWORK) and this thread ended the wait by waking it — the
/// server of a connection, a worker of a queue. Only used for threads
/// without spans of their own.
#[derive(Default)]
struct Served {
    /// Per thread: when it worked for which request (`span` is the
    /// request's), sorted by start (may overlap).
    by_tid: FxHashMap<Tid, Vec<WorkInterval>>,
    /// Longest interval, to bound the lookups.
    longest: u64,
}

fn served_by(model: &KernelModel, group: &[SpanIdx], homes: &[Vec<HomeSegment>]) -> Served {
    let mut out = Served::default();
    for (n, home) in homes.iter().enumerate() {
        for &HomeSegment { start, end, tid } in home {
            let Some(th) = model.thread(tid) else {
                continue;
            };
            for st in th.states_in(start, end) {
                let waker = match st.state {
                    ThreadState::Blocked(BlockReason::Thread(w))
                    | ThreadState::Blocked(BlockReason::PacketFrom(w)) => w,
                    _ => continue,
                };
                let (x, y) = (st.start.max(start), st.end.min(end));
                if waker != tid && y > x {
                    out.by_tid.entry(waker).or_default().push(WorkInterval {
                        start: x,
                        end: y,
                        span: group[n],
                    });
                    out.longest = out.longest.max(y - x);
                }
            }
        }
    }
    for v in out.by_tid.values_mut() {
        v.sort_unstable();
    }
    out
}

impl Served {
    /// Appends to `out`, time-ordered and not overlapping, the parts of
    /// `[start, end)` in which `tid` served a request: `request` itself
    /// wherever it did, else the earliest other one.
    fn during(
        &self,
        tid: Tid,
        start: u64,
        end: u64,
        request: SpanIdx,
        out: &mut Vec<WorkInterval>,
    ) {
        let Some(v) = self.by_tid.get(&tid) else {
            return;
        };
        let first = v.partition_point(|x| x.start.saturating_add(self.longest) <= start);
        let overlapping = v[first..]
            .iter()
            .take_while(|x| x.start < end)
            .filter(|x| x.end > start)
            .map(|x| WorkInterval {
                start: x.start.max(start),
                end: x.end.min(end),
                span: x.span,
            });
        // Mostly one wait overlaps the piece: no choice to make.
        let mut probe = overlapping.clone();
        if let (Some(w), None) = (probe.next(), probe.next()) {
            match out.last_mut() {
                Some(last) if last.end == w.start && last.span == w.span => last.end = w.end,
                _ => out.push(w),
            }
            return;
        }
        let hits: Vec<WorkInterval> = overlapping.collect();
        if hits.is_empty() {
            return;
        }
        let mut cuts: Vec<u64> = hits.iter().flat_map(|h| [h.start, h.end]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let here = |h: &&WorkInterval| h.start <= a && b <= h.end;
            let chosen = hits
                .iter()
                .filter(here)
                .find(|h| h.span == request)
                .or_else(|| hits.iter().find(here));
            let Some(&WorkInterval { span: r, .. }) = chosen else {
                continue;
            };
            match out.last_mut() {
                Some(last) if last.end == a && last.span == r => last.end = b,
                _ => out.push(WorkInterval {
                    start: a,
                    end: b,
                    span: r,
                }),
            }
        }
    }
}

/// Splits a merged-graph piece by what its thread worked for and by system
/// call, and gives each part to the request or to the request it waited for.
#[allow(clippy::too_many_arguments)]
fn attribute(
    model: &KernelModel,
    spans: &[SpanInput],
    request_of: &[SpanIdx],
    work: &dyn ThreadWork,
    owner: Owner,
    served: &Served,
    base: RequestPiece,
    scratch: &mut Scratch,
    out: &mut Vec<RequestPiece>,
) {
    let request = owner.request;
    let tid = base.tid.unwrap_or(-1);
    let thread = model.thread(tid);
    scratch.work.clear();
    work.work_during(tid, base.start, base.end, &mut scratch.work);
    if scratch.work.is_empty() {
        // A thread without spans works for the request whose thread waits
        // for it (a database backend for its client).
        served.during(tid, base.start, base.end, request, &mut scratch.work);
    }
    let syscalls: &[SyscallInterval] = match thread {
        Some(t) => scratch.overlapping(
            (Hint::Syscalls, tid.into()),
            t.syscalls(),
            base.start,
            base.end,
            |s| (s.start, s.end),
        ),
        None => &[],
    };
    // The request's own thread, when the piece is another's.
    let home = owner.home.filter(|&h| h != tid);
    let waiting: &[SyscallInterval] = match home.and_then(|h| model.thread(h)) {
        Some(t) => scratch.overlapping(
            (Hint::Syscalls, t.tid.into()),
            t.syscalls(),
            base.start,
            base.end,
            |s| (s.start, s.end),
        ),
        None => &[],
    };

    let mut cuts = std::mem::take(&mut scratch.cuts);
    cuts.clear();
    cuts.extend([base.start, base.end]);
    for w in &scratch.work {
        cuts.extend([w.start, w.end]);
    }
    // Waiting states are split by what the thread waited in; a RUNNING
    // stretch stays whole (it is in and out of many calls), and says its
    // call only when one covers it.
    let running = base.state == EdgeType::Running;
    let split_by: &[SyscallInterval] = if running { &[] } else { syscalls };
    for s in split_by.iter().chain(waiting) {
        cuts.extend([s.start, s.end]);
    }
    cuts.retain(|&t| t >= base.start && t <= base.end);
    cuts.sort_unstable();
    cuts.dedup();
    let work_list = std::mem::take(&mut scratch.work);

    let (mut wi, mut si, mut hi) = (0, 0, 0);
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        while wi < work_list.len() && work_list[wi].end <= a {
            wi += 1;
        }
        while si < syscalls.len() && syscalls[si].end <= a {
            si += 1;
        }
        while hi < waiting.len() && waiting[hi].end <= a {
            hi += 1;
        }
        let waiting_in = waiting.get(hi).filter(|s| s.start <= a).copied();
        let span = work_list
            .get(wi)
            .filter(|x| x.start <= a)
            .map(|x| x.span)
            .filter(|&s| (s as usize) < spans.len());
        let syscall = syscalls
            .get(si)
            .filter(|s| s.start <= a && (!running || b <= s.end))
            .copied();
        let blocked_by = span
            .filter(|&s| !within(spans, s, request))
            .map(|s| request_of[s as usize]);
        let cpu_wait =
            (base.state == EdgeType::Preempted).then(|| cpu_wait(model, tid, a, b, scratch));
        out.push(RequestPiece {
            start: a,
            end: b,
            comm: thread.and_then(|t| t.name_at(a)),
            syscall,
            waiting_in,
            span,
            blocked_by,
            cpu_wait,
            qualifier: base.qualifier.clone(),
            ..base
        });
    }
    // The buffers go back for the next piece.
    scratch.cuts = cuts;
    scratch.work = work_list;
}

/// Longest time one other thread keeps a CPU while a runnable thread of the
/// same kind waits, under a fair scheduler (CFS' latency target is at most
/// 24 ms, EEVDF's slices a few ms). A thread kept waiting longer is being
/// held back: a CPU cgroup quota (bandwidth throttling) or a much higher
/// priority, not ordinary contention.
pub const FAIR_SLICE_NS: u64 = 30_000_000;

/// Idle time a woken thread's CPU normally takes to switch to it (leaving
/// a deep idle state); longer means the thread was held back.
pub const WAKEUP_GRACE_NS: u64 = 1_000_000;

/// Full turns (of at least [`MIN_TURN_NS`]) one other thread can get on a
/// CPU while a runnable thread waits there, under a fair scheduler; a
/// thread that waits through more is held back.
pub const FAIR_TURNS: u32 = 2;

/// A run shorter than this is a sleeper's quick turn (woken, served,
/// asleep again), which a fair scheduler may give often; only longer ones
/// count as turns.
pub const MIN_TURN_NS: u64 = 1_000_000;

/// Who had the CPU while `tid` was runnable during `[start, end)`.
///
/// Each moment is one of: *throttled* (recorded as held back by its CPU
/// cgroup's quota, see [`crate::HeldBack`]; else, when the recording has
/// no complete capture of throttling, inferred: its CPU stayed idle after
/// it was preempted, or beyond [`WAKEUP_GRACE_NS`] after a wake-up; or
/// one other thread kept the CPU beyond [`FAIR_SLICE_NS`]; or, from the
/// moment one other thread started its turn number [`FAIR_TURNS`] + 1, the
/// wait was not a fair share's); *wake-up* latency (idle CPU, within the
/// grace when inferring); *contended* (other threads ran).
///
/// A complete capture replaces the inference rather than adding to it:
/// beside busy threads of other cgroups the fairness rules fire with no
/// quota at all, and the capture says exactly when a quota held a thread.
fn cpu_wait(model: &KernelModel, tid: Tid, start: u64, end: u64, scratch: &mut Scratch) -> CpuWait {
    let mut wait = CpuWait::default();
    let Some(th) = model.thread(tid) else {
        return wait;
    };
    let infer_throttling = !model.held_back().is_complete();
    // The other threads that ran meanwhile, and for how long (ns).
    let mut others: Vec<(Tid, u64)> = Vec::new();
    let mut free: Vec<(u64, u64)> = Vec::new();
    // Part of [x, y) after `limit`.
    let beyond = |x: u64, y: u64, limit: u64| y.saturating_sub(x.max(limit));
    let states = scratch.overlapping((Hint::States, tid.into()), th.states(), start, end, |s| {
        (s.start, s.end)
    });
    for s in states {
        if !s.state.is_runnable() || s.cpu == NO_CPU {
            continue;
        }
        let (a, b) = (s.start.max(start), s.end.min(end));
        if b <= a {
            continue;
        }
        let Some(cpu) = model.cpu(s.cpu) else {
            continue;
        };
        // Turns other threads got since this thread became runnable: under
        // a fair scheduler none gets a third full turn before it.
        let mut turns: Vec<(Tid, u32)> = Vec::new();
        let mut held_since = u64::MAX;
        let since_runnable = if infer_throttling {
            scratch.overlapping((Hint::Cpu, s.cpu.into()), cpu.timeline(), s.start, b, |c| {
                (c.start, c.end)
            })
        } else {
            &[]
        };
        for run in since_runnable {
            if run.tid == tid || run.tid == 0 || run.start < s.start {
                continue;
            }
            if run.end.saturating_sub(run.start) < MIN_TURN_NS {
                continue;
            }
            let n = match turns.iter_mut().find(|(t, _)| *t == run.tid) {
                Some((_, count)) => {
                    *count += 1;
                    *count
                }
                None => {
                    turns.push((run.tid, 1));
                    1
                }
            };
            if n > FAIR_TURNS {
                held_since = run.start;
                break;
            }
        }
        let runs = scratch.overlapping((Hint::Cpu, s.cpu.into()), cpu.timeline(), a, b, |c| {
            (c.start, c.end)
        });
        for run in runs {
            let (x, y) = (run.start.max(a), run.end.min(b));
            if y <= x || run.tid == tid {
                continue;
            }
            // Recorded throttling is throttling, whoever ran meanwhile;
            // the rest of the run is judged by the rules above.
            wait.throttled_ns += model.held_back().split(tid, x, y, &mut free);
            // Measured from when this thread began waiting for this run.
            let since = run.start.max(s.start);
            for &(x, y) in &free {
                let d = y - x;
                if run.tid == 0 && !infer_throttling {
                    wait.wakeup_ns += d;
                } else if run.tid == 0 {
                    if s.state == ThreadState::Preempted {
                        wait.throttled_ns += d;
                    } else {
                        let late = beyond(x, y, since.saturating_add(WAKEUP_GRACE_NS));
                        wait.throttled_ns += late;
                        wait.wakeup_ns += d - late;
                    }
                } else {
                    let fair_until = if infer_throttling {
                        since.saturating_add(FAIR_SLICE_NS).min(held_since)
                    } else {
                        u64::MAX
                    };
                    let late = beyond(x, y, fair_until);
                    wait.throttled_ns += late;
                    wait.contended_ns += d - late;
                    match others.iter_mut().find(|(t, _)| *t == run.tid) {
                        Some((_, ns)) => *ns += d,
                        None => others.push((run.tid, d)),
                    }
                }
            }
        }
    }
    wait.holder = others
        .into_iter()
        .max_by_key(|&(t, d)| (d, std::cmp::Reverse(t)))
        .map(|(t, _)| t);
    wait
}

/// Longest time a thread may run between a wait that timed out and the
/// same wait resumed for the two to count as one wait.
pub const RESUME_GAP_NS: u64 = 2_000_000;

/// A wait that timed out and was resumed at once in the same system call
/// (same number and first argument, within [`RESUME_GAP_NS`]; a few other
/// calls may come between: a PostgreSQL backend's lock wait
/// woken by its `deadlock_timeout` check, a condition variable waited on
/// with a timeout in a loop) is one wait: its TIMER piece, and the short
/// run before the wait resumes, are attributed like the time the resumed
/// wait waited for (what the path shows next), when a thread ended that
/// resumed wait. `pieces` are in time order.
fn resume_timeouts(model: &KernelModel, pieces: &mut [RequestPiece]) {
    // From the end, so a chain of timeouts takes the final attribution.
    for i in (0..pieces.len()).rev() {
        let p = &pieces[i];
        let (Some(tid), Some(first), EdgeType::Timer) = (p.tid, p.syscall, p.state) else {
            continue;
        };
        let Some(th) = model.thread(tid) else {
            continue;
        };
        // The short run of the same thread that follows on the path.
        let mut j = i + 1;
        let mut ran = 0;
        while let Some(q) = pieces.get(j) {
            if q.tid != Some(tid) || !matches!(q.state, EdgeType::Running | EdgeType::Preempted) {
                break;
            }
            ran += q.duration();
            j += 1;
        }
        let Some(next) = pieces.get(j) else { continue };
        if ran > RESUME_GAP_NS {
            continue;
        }
        // The same wait resumed soon after (a few calls may come between:
        // the timeout's own work), ended by a thread.
        let calls = th.syscalls();
        let k = calls.partition_point(|s| s.start <= first.start);
        let soon = first.end.saturating_add(RESUME_GAP_NS);
        let woken_by_thread = |call: &SyscallInterval| {
            th.states_in(call.start, call.end).iter().any(|s| {
                s.start >= call.start
                    && matches!(
                        s.state,
                        ThreadState::Blocked(BlockReason::Thread(_))
                            | ThreadState::Blocked(BlockReason::PacketFrom(_))
                    )
            })
        };
        let resumed = calls[k..]
            .iter()
            .take_while(|s| s.start <= soon)
            .filter(|s| s.id == first.id && s.arg0 == first.arg0)
            .find(|s| woken_by_thread(s));
        if resumed.is_none_or(|again| next.start > again.end) {
            continue;
        }
        let (span, blocked_by) = (next.span, next.blocked_by);
        for q in &mut pieces[i..j] {
            q.span = span;
            q.blocked_by = blocked_by;
        }
    }
}

/// Adds UNKNOWN pieces for the time of `[start, end)` no piece covers.
fn fill_gaps(
    model: &KernelModel,
    home: &[HomeSegment],
    start: u64,
    end: u64,
    pieces: &mut Vec<RequestPiece>,
) {
    if !pieces.windows(2).all(|w| w[0].start <= w[1].start) {
        pieces.sort_by_key(|p| p.start);
    }
    // Usually the pieces already tile the range: then nothing to do.
    let tiled = pieces.first().is_some_and(|p| p.start == start)
        && pieces.last().is_some_and(|p| p.end == end)
        && pieces.windows(2).all(|w| w[0].end == w[1].start)
        && pieces.iter().all(|p| p.end > p.start);
    if tiled {
        return;
    }
    let mut out = Vec::with_capacity(pieces.len() + 2);
    let mut t = start;
    let gap = |a: u64, b: u64, out: &mut Vec<RequestPiece>| {
        // The home thread at the gap, when one is known.
        let tid = home
            .iter()
            .find(|h| h.start <= a && a < h.end)
            .map(|h| h.tid);
        let comm = tid
            .and_then(|t| model.thread(t))
            .and_then(|th| th.name_at(a));
        out.push(RequestPiece {
            start: a,
            end: b,
            state: EdgeType::Unknown,
            tid,
            comm,
            qualifier: None,
            syscall: None,
            waiting_in: None,
            span: None,
            blocked_by: None,
            shared: 0,
            vertical: false,
            lost: model.overlaps_lost(a, b),
            cpu_wait: None,
        });
    };
    for mut p in pieces.drain(..) {
        p.start = p.start.max(t);
        if p.end <= p.start {
            continue;
        }
        if p.start > t {
            gap(t, p.start, &mut out);
        }
        t = p.end;
        out.push(p);
    }
    if t < end {
        gap(t, end, &mut out);
    }
    *pieces = out;
}

/// Joins adjacent pieces that say the same thing (in place).
fn join(mut pieces: Vec<RequestPiece>) -> Vec<RequestPiece> {
    pieces.dedup_by(|p, last| {
        let same = last.end == p.start
            && last.state == p.state
            && last.tid == p.tid
            && last.comm == p.comm
            && last.qualifier == p.qualifier
            && last.syscall == p.syscall
            && last.waiting_in == p.waiting_in
            && last.span == p.span
            && last.blocked_by == p.blocked_by
            && last.shared == p.shared
            && last.vertical == p.vertical;
        if same {
            last.end = p.end;
            last.lost |= p.lost;
            if let (Some(a), Some(b)) = (last.cpu_wait.as_mut(), p.cpu_wait) {
                let (ta, tb) = (a.contended_ns, b.contended_ns);
                a.throttled_ns += b.throttled_ns;
                a.contended_ns += b.contended_ns;
                a.wakeup_ns += b.wakeup_ns;
                if tb > ta {
                    a.holder = b.holder;
                }
            }
        }
        same
    });
    pieces
}

/// What [`syscall_label`] depends on besides the model and the
/// architecture: calls with equal keys have equal labels, so callers that
/// label many pieces make each label once per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallLabelKey {
    name: u16,
    id: i32,
    entry_seen: bool,
    arg0: u64,
}

impl SyscallLabelKey {
    pub fn of(s: &SyscallInterval) -> SyscallLabelKey {
        SyscallLabelKey {
            name: s.name,
            id: s.id,
            entry_seen: s.entry_seen,
            arg0: s.arg0,
        }
    }
}

/// A system call as reports show it: the name with the argument that says
/// what was waited for (`futex(uaddr=0x7f…)`, `read(fd=3)`), or `sys_N`.
pub fn syscall_label(model: &KernelModel, arch: Arch, s: &SyscallInterval) -> String {
    let name = model
        .syscall_name(s)
        .map(|n| n.strip_prefix("sys_").unwrap_or(n))
        .or_else(|| syscall_name(arch, s.id));
    let Some(name) = name else {
        return format!("sys_{}", s.id);
    };
    if !s.entry_seen {
        // The arguments were not seen.
        return name.to_string();
    }
    match name {
        "futex" | "futex_wait" | "futex_waitv" => format!("futex(uaddr={:#x})", s.arg0),
        "read" | "write" | "pread64" | "pwrite64" | "readv" | "writev" | "preadv" | "pwritev"
        | "preadv2" | "pwritev2" | "recvfrom" | "sendto" | "recvmsg" | "sendmsg" | "recvmmsg"
        | "sendmmsg" | "fsync" | "fdatasync" | "sync_file_range" | "accept" | "accept4"
        | "connect" | "sendfile" | "splice" | "ioctl" | "flock" | "fcntl" => {
            format!("{name}(fd={})", s.arg0 as i64)
        }
        "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => format!("{name}(epfd={})", s.arg0 as i64),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(parent: Option<SpanIdx>, entry: bool) -> SpanInput {
        SpanInput {
            parent,
            entry,
            ..SpanInput::default()
        }
    }

    #[test]
    fn requests_are_roots_and_entries() {
        let spans = vec![
            span(None, false),    // 0: root
            span(Some(0), false), // 1: inside 0
            span(Some(1), true),  // 2: server span: its own request
            span(Some(2), false), // 3: inside 2
            span(Some(5), false), // 4: cycle 4 <-> 5
            span(Some(4), false), // 5
        ];
        let r = requests_of(&spans);
        assert_eq!(r[..4], [0, 0, 2, 2]);
        assert_eq!(r[4], 4);
        assert!(within(&spans, 3, 0));
        assert!(!within(&spans, 0, 2));
    }

    #[test]
    fn searching_near_a_hint_finds_what_a_binary_search_finds() {
        let v: Vec<u64> = (0..200).map(|x| x * 3).collect();
        for hint in [0, 1, 7, 50, 199, 200, 500] {
            for target in [0, 1, 2, 3, 100, 299, 597, 598, 1000] {
                assert_eq!(
                    partition_point_near(&v, hint, |&x| x < target),
                    v.partition_point(|&x| x < target),
                    "hint {hint} target {target}"
                );
            }
        }
        assert_eq!(partition_point_near(&[] as &[u64], 3, |&x| x < 1), 0);
    }

    #[test]
    fn home_prefers_holder_then_latest_activation() {
        let s = SpanInput {
            times: Some((100, 200)),
            holder: Some(7),
            activations: vec![
                ActivationInput {
                    tid: 8,
                    ts: 120,
                    on: true,
                },
                ActivationInput {
                    tid: 8,
                    ts: 150,
                    on: false,
                },
                ActivationInput {
                    tid: 7,
                    ts: 140,
                    on: true,
                },
                ActivationInput {
                    tid: 7,
                    ts: 160,
                    on: false,
                },
            ],
            ..SpanInput::default()
        };
        let seg = |start, end, tid| HomeSegment { start, end, tid };
        assert_eq!(
            home_segments(&s),
            vec![seg(100, 120, 7), seg(120, 140, 8), seg(140, 200, 7)]
        );
        let paper = SpanInput {
            times: Some((10, 20)),
            holder: Some(3),
            ..SpanInput::default()
        };
        assert_eq!(home_segments(&paper), vec![seg(10, 20, 3)]);
        assert!(home_segments(&SpanInput::default()).is_empty());
    }
}
