//! Diagnosis of requests (docs/analysis.md, "Diagnosis"; the top-down
//! method of Ezzati-Jivan et al. 2021, §3.2, Alg. 1): which kind of waiting
//! dominates a request's critical path, then which system calls and kernel
//! activity explain it, with the evidence (numbers) and the culprits
//! (threads, processes, requests, spans) behind it.
//!
//! The path's time is put in *buckets*, first by who the request waited
//! for, then by state:
//! 1. `lock`: pieces of another thread of the request's own process while
//!    the request's thread waited in a futex (a lock held by that thread);
//! 2. `other request`: pieces whose thread worked for another request
//!    (`blocked_by`), through any other chain (another process, a pool…);
//! 3. otherwise the piece's state: RUNNING, PREEMPTED, TIMER,
//!    BLOCK_DEVICE, NETWORK, or unexplained (BLOCKED without a known
//!    waker, UNKNOWN, interrupts).
//!
//! The largest bucket gives the cause; inside it the kernel model says
//! why: PREEMPTED splits into `cpu_throttled` (the CPU was held back: idle,
//! or another thread kept it beyond a fair share — a cgroup quota) and
//! `cpu_contention` (other threads ran within a fair share, named by
//! process); BLOCK_DEVICE looks at the page-cache miss ratio of the
//! request's threads and the disk queue (block requests in flight) and
//! names the processes whose requests were in the queue meanwhile.
//!
//! Independently, [`baselines`] and [`is_anomalous`] tell which requests
//! are outliers of their operation.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use deepspan_model::container::Container;
use deepspan_model::{Comm, Tid};

use crate::containers::Containers;
use crate::graph::EdgeType;
use crate::request::{
    home_segments, HomeSegment, RequestPath, RequestPiece, SpanIdx, SpanInput, ThreadWork,
    WorkInterval,
};
use crate::root_cause::RootCause;
use crate::state::{BlockPhase, BlockReason, KernelModel, SyscallInterval, ThreadState};
use crate::syscalls::{syscall_name, Arch};
use rustc_hash::FxHashMap;

/// Requests an operation needs before it has a baseline.
pub const MIN_BASELINE_REQUESTS: usize = 3;
/// A request is anomalous when it took more than this many times its
/// operation's baseline …
pub const ANOMALY_FACTOR: u64 = 2;
/// … and more than the baseline plus this (so that microsecond-scale
/// operations do not flag jitter).
pub const ANOMALY_MIN_EXCESS_NS: u64 = 1_000_000;

/// The baseline (median duration, the lower middle one for an even count)
/// of every key with at least [`MIN_BASELINE_REQUESTS`] durations.
pub fn baselines<K: Hash + Eq>(durations: impl IntoIterator<Item = (K, u64)>) -> HashMap<K, u64> {
    quantiles(durations, 1, 2)
}

/// The usual healthy duration (lower quartile) of every key with at least
/// [`MIN_BASELINE_REQUESTS`] durations: the reference for whether a
/// request others waited for was itself held up (see
/// [`crate::ChainIndex::mark_held_up`]). Not the median: a fault that holds
/// up an operation's requests (a CPU hog beside its worker) holds up every
/// request queued behind them too, often half of the operation's requests
/// or more, and those then make its median. The lower quartile stays the
/// healthy duration until three quarters of the requests are held up.
pub fn usual_durations<K: Hash + Eq>(
    durations: impl IntoIterator<Item = (K, u64)>,
) -> HashMap<K, u64> {
    quantiles(durations, 1, 4)
}

/// The `num/den` quantile (the lower one between two) of every key's
/// durations, for keys with at least [`MIN_BASELINE_REQUESTS`].
fn quantiles<K: Hash + Eq>(
    durations: impl IntoIterator<Item = (K, u64)>,
    num: usize,
    den: usize,
) -> HashMap<K, u64> {
    let mut by_key: HashMap<K, Vec<u64>> = HashMap::new();
    for (k, d) in durations {
        by_key.entry(k).or_default().push(d);
    }
    by_key
        .into_iter()
        .filter(|(_, v)| v.len() >= MIN_BASELINE_REQUESTS)
        .map(|(k, mut v)| {
            let at = (v.len() - 1) * num / den;
            let (_, q, _) = v.select_nth_unstable(at);
            (k, *q)
        })
        .collect()
}

/// True when `duration` is well above `baseline`: more than
/// [`ANOMALY_FACTOR`] × baseline and more than baseline +
/// [`ANOMALY_MIN_EXCESS_NS`]. Without a baseline nothing is anomalous.
pub fn is_anomalous(duration: u64, baseline: Option<u64>) -> bool {
    baseline.is_some_and(|b| {
        duration > b.saturating_mul(ANOMALY_FACTOR)
            && duration > b.saturating_add(ANOMALY_MIN_EXCESS_NS)
    })
}

/// What a request mostly waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    CpuThrottled,
    CpuContention,
    LockContention,
    BlockedByRequest,
    Disk,
    Network,
    Timer,
    Running,
    Unknown,
}

impl Cause {
    /// Every cause, in declaration order.
    pub const ALL: [Cause; 9] = [
        Cause::CpuThrottled,
        Cause::CpuContention,
        Cause::LockContention,
        Cause::BlockedByRequest,
        Cause::Disk,
        Cause::Network,
        Cause::Timer,
        Cause::Running,
        Cause::Unknown,
    ];

    /// The cause of a contract name ([`Cause::name`]), for reading stored
    /// diagnoses back.
    pub fn from_name(name: &str) -> Option<Cause> {
        Cause::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The contract's name (`cpu_throttled`, …).
    pub fn name(self) -> &'static str {
        match self {
            Cause::CpuThrottled => "cpu_throttled",
            Cause::CpuContention => "cpu_contention",
            Cause::LockContention => "lock_contention",
            Cause::BlockedByRequest => "blocked_by_request",
            Cause::Disk => "disk",
            Cause::Network => "network",
            Cause::Timer => "timer",
            Cause::Running => "running",
            Cause::Unknown => "unknown",
        }
    }
}

/// What a culprit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CulpritKind {
    Thread,
    Process,
    Request,
    Span,
    Device,
}

impl CulpritKind {
    /// Every kind, in declaration order.
    pub const ALL: [CulpritKind; 5] = [
        CulpritKind::Thread,
        CulpritKind::Process,
        CulpritKind::Request,
        CulpritKind::Span,
        CulpritKind::Device,
    ];

    /// The kind of a contract name ([`CulpritKind::name`]), for reading
    /// stored diagnoses back.
    pub fn from_name(name: &str) -> Option<CulpritKind> {
        CulpritKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The contract's name (`thread`, `process`, …).
    pub fn name(self) -> &'static str {
        match self {
            CulpritKind::Thread => "thread",
            CulpritKind::Process => "process",
            CulpritKind::Request => "request",
            CulpritKind::Span => "span",
            CulpritKind::Device => "device",
        }
    }
}

/// Something the request's time is attributed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Culprit {
    pub kind: CulpritKind,
    pub tid: Option<Tid>,
    pub pid: Option<Tid>,
    pub comm: Option<Comm>,
    /// Request culprits: the request's span; span culprits: the span the
    /// request's thread was in (a client span).
    pub span: Option<SpanIdx>,
    /// Span culprits: the downstream entry (server) span of `span`, when
    /// known; its service and operation name the culprit.
    pub downstream: Option<SpanIdx>,
    /// Free text: the system call of a thread culprit, a device.
    pub name: Option<String>,
    /// The container and pod of a thread's or process's culprit.
    pub container: Option<Arc<Container>>,
    /// Time of the request attributed to this culprit.
    pub ns: u64,
}

impl Culprit {
    pub(crate) fn new(kind: CulpritKind, ns: u64) -> Culprit {
        Culprit {
            kind,
            tid: None,
            pid: None,
            comm: None,
            span: None,
            downstream: None,
            name: None,
            container: None,
            ns,
        }
    }
}

/// A request's diagnosis.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnosis {
    pub cause: Cause,
    /// One line, at most [`HEADLINE_MAX`] characters.
    pub headline: String,
    /// Named numbers, in a fixed order per cause.
    pub evidence: Vec<(&'static str, f64)>,
    /// Largest first.
    pub culprits: Vec<Culprit>,
    /// When the request mostly waited for other requests: what those
    /// requests were held up by, followed through them (`None` when the
    /// request was not blocked by others: its cause is its root cause).
    pub root: Option<Box<RootCause>>,
}

impl Diagnosis {
    /// The root cause: the chain's deepest cause, else the cause itself.
    pub fn root_cause(&self) -> Cause {
        self.root.as_ref().map_or(self.cause, |r| r.cause)
    }
}

/// Longest headline, in characters.
pub const HEADLINE_MAX: usize = 78;

/// Most culprits kept per diagnosis.
pub const MAX_CULPRITS: usize = 8;

/// Longest wake-up chain followed from a request's thread.
const MAX_CHAIN: usize = 16;

/// What [`diagnose`] needs besides the request's path: built once per
/// analysis.
pub struct DiagnosisContext<'a> {
    pub model: &'a KernelModel,
    pub arch: Arch,
    pub spans: &'a [SpanInput],
    /// Thread → process: the model's, else the recorder's `saved_tgids`
    /// (given to [`DiagnosisContext::new`]), merged once.
    pids: FxHashMap<Tid, Tid>,
    /// `[service] operation` of a span, for headlines.
    pub label: &'a (dyn Fn(SpanIdx) -> String + Sync),
    /// Which span each thread works for (threads without spans are the
    /// servers of other processes: a database backend …).
    pub work: &'a dyn ThreadWork,
    /// Client span → its downstream entry span.
    downstream: FxHashMap<SpanIdx, SpanIdx>,
    disk: OnceLock<DiskIndex>,
    /// Each process's container ([`DiagnosisContext::with_containers`]).
    containers: Containers,
    /// Reused by [`DiagnosisContext::has_span_at`].
    work_buf: RefCell<Vec<WorkInterval>>,
}

impl<'a> DiagnosisContext<'a> {
    pub fn new(
        model: &'a KernelModel,
        arch: Arch,
        spans: &'a [SpanInput],
        pids: &'a HashMap<Tid, Tid>,
        label: &'a (dyn Fn(SpanIdx) -> String + Sync),
        work: &'a dyn ThreadWork,
    ) -> DiagnosisContext<'a> {
        let mut downstream: FxHashMap<SpanIdx, SpanIdx> = FxHashMap::default();
        for (i, s) in spans.iter().enumerate() {
            if let (true, Some(p)) = (s.entry, s.parent) {
                // The longest entry child stands for the call.
                let len = |x: SpanIdx| {
                    spans[x as usize]
                        .times
                        .map_or(0, |(a, b)| b.saturating_sub(a))
                };
                let e = downstream.entry(p).or_insert(i as SpanIdx);
                if len(i as SpanIdx) > len(*e) {
                    *e = i as SpanIdx;
                }
            }
        }
        let mut all: FxHashMap<Tid, Tid> = pids.iter().map(|(&t, &p)| (t, p)).collect();
        for th in model.threads() {
            if let Some(p) = th.pid {
                all.insert(th.tid, p);
            }
        }
        DiagnosisContext {
            model,
            arch,
            spans,
            pids: all,
            label,
            work,
            downstream,
            disk: OnceLock::new(),
            containers: Containers::default(),
            work_buf: RefCell::new(Vec::new()),
        }
    }

    /// Culprits name the containers and pods of their processes.
    pub fn with_containers(mut self, containers: Containers) -> Self {
        self.containers = containers;
        self
    }

    fn container(&self, pid: Option<Tid>) -> Option<Arc<Container>> {
        pid.and_then(|p| self.containers.of(p)).cloned()
    }

    pub(crate) fn pid(&self, tid: Tid) -> Option<Tid> {
        self.pids.get(&tid).copied()
    }

    fn comm(&self, tid: Tid, at: u64) -> Option<Comm> {
        self.model.thread(tid).and_then(|t| t.name_at(at))
    }

    fn syscall_base(&self, s: &SyscallInterval) -> Option<&str> {
        self.model
            .syscall_name(s)
            .map(|n| n.strip_prefix("sys_").unwrap_or(n))
            .or_else(|| syscall_name(self.arch, s.id))
    }

    fn has_span_at(&self, tid: Tid, t: u64) -> bool {
        let mut v = self.work_buf.borrow_mut();
        v.clear();
        self.work.work_during(tid, t, t.saturating_add(1), &mut v);
        !v.is_empty()
    }

    /// The process a request's wait at `t` went through: follow the
    /// wake-up chain from the request's thread `home` (each blocked thread
    /// to the thread that ended its wait) towards `target`, the thread on
    /// the path; the last thread of the chain without spans in another
    /// process than `home`'s (the database backend that held the row lock
    /// for another request) is it.
    fn via(&self, home: Tid, target: Tid, t: u64) -> Option<Tid> {
        let home_pid = self.pid(home).unwrap_or(home);
        let mut chain: Vec<Tid> = Vec::new();
        let mut cur = home;
        for _ in 0..MAX_CHAIN {
            if cur == target {
                break;
            }
            let Some(st) = self.model.thread(cur).and_then(|th| th.state_at(t)) else {
                break;
            };
            let waker = match st.state {
                ThreadState::Blocked(BlockReason::Thread(w))
                | ThreadState::Blocked(BlockReason::PacketFrom(w)) => w,
                _ => break,
            };
            if waker == home || chain.contains(&waker) {
                break;
            }
            chain.push(waker);
            cur = waker;
        }
        chain
            .into_iter()
            .rev()
            .find(|&w| self.pid(w).unwrap_or(w) != home_pid && !self.has_span_at(w, t))
    }

    /// The thread `home` waits for at `t`: the one that ends its wait.
    fn waker_at(&self, home: Tid, t: u64) -> Option<Tid> {
        match self.model.thread(home)?.state_at(t)?.state {
            ThreadState::Blocked(BlockReason::Thread(w))
            | ThreadState::Blocked(BlockReason::PacketFrom(w)) => Some(w),
            _ => None,
        }
    }

    /// The server working for a request (`home`: its threads) at `t`: the
    /// thread without spans,
    /// in another process, that ends the request's thread's next wait on a
    /// thread from `t` on (its database backend, which holds its locks
    /// while the request's thread does something else).
    fn server_of(&self, home: &[HomeSegment], t: u64) -> Option<Tid> {
        let &HomeSegment { end, tid, .. } = home.iter().find(|h| h.end > t)?;
        let th = self.model.thread(tid)?;
        let pid = self.pid(tid).unwrap_or(tid);
        // The next wait on a thread only: a scan to the request's end would
        // cost its every state, for every piece.
        let (s, w) = th.states_in(t, end).iter().find_map(|s| match s.state {
            ThreadState::Blocked(BlockReason::Thread(w))
            | ThreadState::Blocked(BlockReason::PacketFrom(w))
                if s.end > t =>
            {
                Some((s, w))
            }
            _ => None,
        })?;
        (self.pid(w).unwrap_or(w) != pid && !self.has_span_at(w, s.end.saturating_sub(1)))
            .then_some(w)
    }

    fn disk(&self) -> &DiskIndex {
        self.disk.get_or_init(|| DiskIndex::new(self.model))
    }
}

/// A request's threads over time.
type HomeSegments = Vec<HomeSegment>;

/// The buckets of a path's time (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Bucket {
    Lock,
    OtherRequest,
    Preempted,
    BlockDevice,
    Network,
    Timer,
    Running,
    Unexplained,
}

/// Diagnoses one request from its critical path (with its pieces).
/// `None` when the request has no kernel path (sync `none`).
pub fn diagnose(ctx: &DiagnosisContext, path: &RequestPath) -> Option<Diagnosis> {
    if path.pieces.is_empty() {
        return None;
    }
    let total: u64 = path.pieces.iter().map(|p| p.duration()).sum();
    let mut buckets: Vec<(Bucket, u64)> = Vec::new();
    let mut of_piece: Vec<Bucket> = Vec::with_capacity(path.pieces.len());
    for p in &path.pieces {
        let b = bucket(ctx, path, p);
        of_piece.push(b);
        match buckets.iter_mut().find(|x| x.0 == b) {
            Some(x) => x.1 += p.duration(),
            None => buckets.push((b, p.duration())),
        }
    }
    // Largest first; on a tie, the more specific bucket (declaration order).
    buckets.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let (top, ns) = buckets[0];
    let pieces = path
        .pieces
        .iter()
        .zip(&of_piece)
        .filter(|(_, b)| **b == top)
        .map(|(p, _)| p);
    let share = ns as f64 / total.max(1) as f64;
    let pct = (share * 100.0).round() as u64;
    let mut d = match top {
        Bucket::Lock => lock(
            ctx,
            pieces.map(|p| (p, polled_lock_holder(ctx, path, p))),
            pct,
        ),
        Bucket::OtherRequest => other_request(ctx, path, pieces, pct),
        Bucket::Preempted => preempted(ctx, pieces, pct),
        Bucket::BlockDevice => disk(ctx, path, pieces, pct),
        Bucket::Network => network(ctx, pieces, pct),
        Bucket::Timer => by_thread(ctx, pieces, Cause::Timer, pct),
        Bucket::Running => by_thread(ctx, pieces, Cause::Running, pct),
        Bucket::Unexplained => by_thread(ctx, pieces, Cause::Unknown, pct),
    };
    d.evidence.insert(0, ("share", share));
    d.evidence.insert(1, ("ns", ns as f64));
    d.headline = fit(&d.headline, HEADLINE_MAX);
    d.culprits.truncate(MAX_CULPRITS);
    Some(d)
}

pub(crate) fn home_at(path: &RequestPath, t: u64) -> Option<Tid> {
    path.home
        .iter()
        .find(|h| h.start <= t && t < h.end)
        .or(path.home.last().filter(|h| h.end == t))
        .map(|h| h.tid)
}

pub(crate) fn bucket(ctx: &DiagnosisContext, path: &RequestPath, p: &RequestPiece) -> Bucket {
    let home = home_at(path, p.start);
    let other_thread = p.tid.is_some() && p.tid != home;
    if other_thread {
        let in_futex = p
            .waiting_in
            .is_some_and(|s| ctx.syscall_base(&s).is_some_and(|n| n.starts_with("futex")));
        let same_process = || match (
            p.tid.and_then(|t| ctx.pid(t)),
            home.and_then(|h| ctx.pid(h)),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        };
        if in_futex && same_process() {
            return Bucket::Lock;
        }
    }
    if polled_lock_holder(ctx, path, p).is_some() {
        return Bucket::Lock;
    }
    if p.blocked_by.is_some() {
        return Bucket::OtherRequest;
    }
    match p.state {
        EdgeType::Running => Bucket::Running,
        EdgeType::Preempted => Bucket::Preempted,
        EdgeType::Timer => Bucket::Timer,
        EdgeType::BlockDevice => Bucket::BlockDevice,
        EdgeType::Network => Bucket::Network,
        _ => Bucket::Unexplained,
    }
}

/// The thread holding the lock that a request's own thread polled during
/// `p`: some locks are waited for in timed futex waits that time out and
/// resume (the JVM's monitors: one waiter parks with a growing timeout so
/// that a lost wake-up cannot strand it), so the path shows the request's
/// own thread in TIMER. `resume_timeouts` attributes such a timeout to the
/// request whose thread ended the resumed wait; when that request's thread
/// at the time is another thread of the same process, the wait was for a
/// lock it held, and it is that thread.
pub(crate) fn polled_lock_holder(
    ctx: &DiagnosisContext,
    path: &RequestPath,
    p: &RequestPiece,
) -> Option<Tid> {
    let home = home_at(path, p.start)?;
    if p.tid != Some(home) || p.state != EdgeType::Timer {
        return None;
    }
    let in_futex = p
        .syscall
        .or(p.waiting_in)
        .is_some_and(|s| ctx.syscall_base(&s).is_some_and(|n| n.starts_with("futex")));
    if !in_futex {
        return None;
    }
    let other = ctx.spans.get(p.blocked_by? as usize)?;
    let mid = p.start + p.duration() / 2;
    let holder = home_segments(other)
        .into_iter()
        .find(|h| h.start <= mid && mid < h.end)
        .map(|h| h.tid)?;
    let home_pid = ctx.pid(home)?;
    (holder != home && ctx.pid(holder) == Some(home_pid)).then_some(holder)
}

/// Adds `ns` to the culprit matching `same`, or appends `new()`.
pub(crate) fn add_culprit(
    out: &mut Vec<Culprit>,
    ns: u64,
    same: impl Fn(&Culprit) -> bool,
    new: impl FnOnce() -> Culprit,
) {
    match out.iter_mut().find(|c| same(c)) {
        Some(c) => c.ns += ns,
        None => {
            let mut c = new();
            c.ns = ns;
            out.push(c);
        }
    }
}

/// Largest first; equal times keep their kinds' order (thread, process,
/// request, span, device), then tid, so the output is stable.
pub(crate) fn sort_culprits(v: &mut [Culprit]) {
    v.sort_by(|a, b| {
        b.ns.cmp(&a.ns)
            .then(a.kind.cmp(&b.kind))
            .then(a.pid.cmp(&b.pid))
            .then(a.tid.cmp(&b.tid))
            .then(a.span.cmp(&b.span))
    });
}

pub(crate) fn process_culprit(ctx: &DiagnosisContext, tid: Tid, at: u64) -> Culprit {
    let pid = ctx.pid(tid);
    let mut c = Culprit::new(CulpritKind::Process, 0);
    c.pid = Some(pid.unwrap_or(tid));
    // The process's name is its main thread's, when that is known, as it
    // was last seen (a program that names itself does so after it starts).
    let latest = |t: Tid| ctx.model.thread(t).and_then(|th| th.name());
    c.comm = pid
        .and_then(latest)
        .or_else(|| latest(tid))
        .or_else(|| ctx.comm(tid, at));
    c.container = ctx.container(c.pid);
    c
}

pub(crate) fn thread_culprit(ctx: &DiagnosisContext, tid: Tid, at: u64) -> Culprit {
    let mut c = Culprit::new(CulpritKind::Thread, 0);
    c.tid = Some(tid);
    c.pid = ctx.pid(tid);
    c.comm = ctx.comm(tid, at);
    c.container = ctx.container(c.pid);
    c
}

pub(crate) fn request_culprit(request: SpanIdx) -> Culprit {
    let mut c = Culprit::new(CulpritKind::Request, 0);
    c.span = Some(request);
    c
}

pub(crate) fn who(c: &Culprit) -> String {
    let comm = c.comm.map(|x| x.to_string_lossy()).unwrap_or_default();
    let who = match (c.kind, c.tid, c.pid) {
        (CulpritKind::Thread, Some(t), _) => format!("{}/{comm}", crate::tid_label(t)),
        (_, _, Some(p)) => format!("{comm} (pid {})", crate::tid_label(p)),
        _ => comm,
    };
    match &c.container {
        Some(container) => format!("{who} in {}", container.label()),
        None => who,
    }
}

/// `pieces` with, for a lock the request's own thread polled, the thread
/// holding it ([`polled_lock_holder`]).
pub(crate) fn lock<'p>(
    ctx: &DiagnosisContext,
    pieces: impl Iterator<Item = (&'p RequestPiece, Option<Tid>)>,
    pct: u64,
) -> Diagnosis {
    let mut culprits = Vec::new();
    let mut futex: Vec<(u64, u64)> = Vec::new();
    for (p, polled_holder) in pieces {
        let d = p.duration();
        let Some(tid) = polled_holder.or(p.tid) else {
            continue;
        };
        add_culprit(
            &mut culprits,
            d,
            |c| c.kind == CulpritKind::Thread && c.tid == Some(tid),
            || thread_culprit(ctx, tid, p.start),
        );
        if let Some(r) = p.blocked_by {
            add_culprit(
                &mut culprits,
                d,
                |c| c.kind == CulpritKind::Request && c.span == Some(r),
                || request_culprit(r),
            );
        }
        if let Some(w) = p
            .waiting_in
            .or(p.syscall.filter(|_| polled_holder.is_some()))
        {
            match futex.iter_mut().find(|f| f.0 == w.arg0) {
                Some(f) => f.1 += d,
                None => futex.push((w.arg0, d)),
            }
        }
    }
    sort_culprits(&mut culprits);
    futex.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let holder = culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Thread)
        .map(who)
        .unwrap_or_default();
    let request = culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Request)
        .and_then(|c| c.span)
        .map(|r| format!(" for {}", (ctx.label)(r)))
        .unwrap_or_default();
    let mut evidence = Vec::new();
    if let Some(f) = futex.first() {
        evidence.push(("futex_uaddr", f.0 as f64));
    }
    Diagnosis {
        cause: Cause::LockContention,
        headline: format!("LOCK {pct}%: futex held by {holder}{request}"),
        evidence,
        culprits,
        root: None,
    }
}

pub(crate) fn other_request<'p>(
    ctx: &DiagnosisContext,
    path: &RequestPath,
    pieces: impl Iterator<Item = &'p RequestPiece>,
    pct: u64,
) -> Diagnosis {
    let mut culprits = Vec::new();
    // Home threads of the other requests, computed once each.
    let mut homes: Vec<(SpanIdx, HomeSegments)> = Vec::new();
    for p in pieces {
        let d = p.duration();
        // The process in between (a server working for the other request),
        // else the thread's own.
        let mid = p.start + d / 2;
        let through = match (home_at(path, p.start), p.tid) {
            (Some(h), Some(t)) => ctx
                .via(h, t, mid)
                // The request's own server is not the one working for the
                // other request (a timed-out wait of it resumed later).
                .filter(|&v| Some(v) != ctx.waker_at(h, mid) || v != t)
                .or_else(|| {
                    let y = p.blocked_by?;
                    let i = match homes.iter().position(|h| h.0 == y) {
                        Some(i) => i,
                        None => {
                            let span = ctx.spans.get(y as usize)?;
                            homes.push((y, home_segments(span)));
                            homes.len() - 1
                        }
                    };
                    ctx.server_of(&homes[i].1, mid)
                })
                .or(Some(t)),
            (_, t) => t,
        };
        if let Some(tid) = through {
            let pid = ctx.pid(tid).unwrap_or(tid);
            add_culprit(
                &mut culprits,
                d,
                |c| c.kind == CulpritKind::Process && c.pid == Some(pid),
                || process_culprit(ctx, tid, p.start),
            );
        }
        if let Some(r) = p.blocked_by {
            add_culprit(
                &mut culprits,
                d,
                |c| c.kind == CulpritKind::Request && c.span == Some(r),
                || request_culprit(r),
            );
        }
    }
    sort_culprits(&mut culprits);
    let process = culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Process)
        .map(who)
        .unwrap_or_else(|| "a thread".to_string());
    let request = culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Request)
        .and_then(|c| c.span)
        .map(|r| (ctx.label)(r))
        .unwrap_or_default();
    Diagnosis {
        cause: Cause::BlockedByRequest,
        headline: format!("BLOCKED {pct}%: {process} working for {request}"),
        evidence: Vec::new(),
        culprits,
        root: None,
    }
}

pub(crate) fn preempted<'p>(
    ctx: &DiagnosisContext,
    pieces: impl Iterator<Item = &'p RequestPiece>,
    pct: u64,
) -> Diagnosis {
    let (mut throttled, mut contended, mut wakeup, mut preempted) = (0u64, 0u64, 0u64, 0u64);
    let mut victims: Vec<Culprit> = Vec::new();
    // (thread that had the CPU, ns, first seen at), summed over the pieces
    // without allocating per piece (pieces can be many).
    let mut holders: Vec<(Tid, u64, u64)> = Vec::new();
    for p in pieces {
        let d = p.duration();
        preempted += d;
        if let Some(w) = p.cpu_wait {
            throttled += w.throttled_ns;
            contended += w.contended_ns;
            wakeup += w.wakeup_ns;
        }
        let Some(tid) = p.tid else { continue };
        let pid = ctx.pid(tid).unwrap_or(tid);
        add_culprit(
            &mut victims,
            p.cpu_wait.map_or(d, |w| w.throttled_ns),
            |c| c.pid == Some(pid),
            || process_culprit(ctx, tid, p.start),
        );
        add_cpu_holders(ctx.model, tid, p.start, p.end, &mut holders);
    }
    // The thread that ran most names its process.
    holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut runners: Vec<Culprit> = Vec::new();
    for (holder, ns, at) in holders {
        let hpid = ctx.pid(holder).unwrap_or(holder);
        add_culprit(
            &mut runners,
            ns,
            |c| c.pid == Some(hpid),
            || {
                let mut c = process_culprit(ctx, holder, at);
                // The thread that ran, as the process may have many.
                c.tid = Some(holder);
                c.comm = ctx.model.thread(holder).and_then(|th| th.name()).or(c.comm);
                c
            },
        );
    }
    let evidence = vec![
        ("preempted_ns", preempted as f64),
        ("throttled_ns", throttled as f64),
        ("contended_ns", contended as f64),
        ("wakeup_ns", wakeup as f64),
    ];
    if throttled >= contended + wakeup {
        sort_culprits(&mut victims);
        victims.retain(|c| c.ns > 0);
        let tp = (throttled as f64 * 100.0 / preempted.max(1) as f64).round() as u64;
        let whom = victims.first().map(who).unwrap_or_default();
        Diagnosis {
            cause: Cause::CpuThrottled,
            headline: format!("PREEMPTED {pct}%: CPU held back {tp}% (cgroup quota?) {whom}"),
            evidence,
            culprits: victims,
            root: None,
        }
    } else {
        sort_culprits(&mut runners);
        let more = match runners.len() {
            0 | 1 => String::new(),
            n => format!(" +{} more", n - 1),
        };
        let first = runners
            .first()
            .map(who)
            .unwrap_or_else(|| "other threads".into());
        Diagnosis {
            cause: Cause::CpuContention,
            headline: format!("PREEMPTED {pct}%: CPU taken by {first}{more}"),
            evidence,
            culprits: runners,
            root: None,
        }
    }
}

/// Adds to `holders` the threads that ran on `tid`'s CPU while it was
/// runnable during `[start, end)` (the idle task left out), as
/// [`KernelModel::preempted_by`] does, without its allocations.
fn add_cpu_holders(
    model: &KernelModel,
    tid: Tid,
    start: u64,
    end: u64,
    holders: &mut Vec<(Tid, u64, u64)>,
) {
    let Some(th) = model.thread(tid) else {
        return;
    };
    for s in th.states_in(start, end) {
        if !s.state.is_runnable() || s.cpu == crate::state::NO_CPU {
            continue;
        }
        let (a, b) = (s.start.max(start), s.end.min(end));
        let Some(cpu) = model.cpu(s.cpu) else {
            continue;
        };
        for run in cpu.running_in(a, b) {
            let d = run.end.min(b).saturating_sub(run.start.max(a));
            if d == 0 || run.tid <= 0 || run.tid == tid {
                continue;
            }
            match holders.iter_mut().find(|h| h.0 == run.tid) {
                Some(h) => h.1 += d,
                None => holders.push((run.tid, d, a)),
            }
        }
    }
}

pub(crate) fn network<'p>(
    ctx: &DiagnosisContext,
    pieces: impl Iterator<Item = &'p RequestPiece>,
    pct: u64,
) -> Diagnosis {
    let mut culprits = Vec::new();
    for p in pieces {
        let d = p.duration();
        match (p.span, p.tid) {
            (Some(s), _) => add_culprit(
                &mut culprits,
                d,
                |c| c.kind == CulpritKind::Span && c.span == Some(s),
                || {
                    let mut c = Culprit::new(CulpritKind::Span, 0);
                    c.span = Some(s);
                    c.downstream = ctx.downstream.get(&s).copied();
                    c
                },
            ),
            (None, Some(tid)) => add_culprit(
                &mut culprits,
                d,
                |c| c.kind == CulpritKind::Thread && c.tid == Some(tid),
                || {
                    let mut c = thread_culprit(ctx, tid, p.start);
                    c.name = p
                        .syscall
                        .map(|s| ctx.syscall_base(&s).unwrap_or("?").to_string());
                    c
                },
            ),
            _ => {}
        }
    }
    sort_culprits(&mut culprits);
    let what = match culprits.first() {
        Some(c) if c.kind == CulpritKind::Span => {
            format!(
                "waiting for {}",
                (ctx.label)(c.downstream.or(c.span).unwrap_or(0))
            )
        }
        Some(c) => format!("{} waiting for packets", who(c)),
        None => "waiting for packets".into(),
    };
    Diagnosis {
        cause: Cause::Network,
        headline: format!("NETWORK {pct}%: {what}"),
        evidence: Vec::new(),
        culprits,
        root: None,
    }
}

/// TIMER, RUNNING and unexplained time: the threads, with the system call
/// each spent it in.
pub(crate) fn by_thread<'p>(
    ctx: &DiagnosisContext,
    pieces: impl Iterator<Item = &'p RequestPiece>,
    cause: Cause,
    pct: u64,
) -> Diagnosis {
    let mut culprits = Vec::new();
    let mut states: Vec<(EdgeType, u64)> = Vec::new();
    for p in pieces {
        let d = p.duration();
        match states.iter_mut().find(|s| s.0 == p.state) {
            Some(s) => s.1 += d,
            None => states.push((p.state, d)),
        }
        let Some(tid) = p.tid else { continue };
        let call = p
            .syscall
            .filter(|_| cause != Cause::Running)
            .and_then(|s| ctx.syscall_base(&s).map(str::to_string));
        add_culprit(
            &mut culprits,
            d,
            |c| c.tid == Some(tid) && c.name == call,
            || {
                let mut c = thread_culprit(ctx, tid, p.start);
                c.name = call.clone();
                c
            },
        );
    }
    sort_culprits(&mut culprits);
    states.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let state = states.first().map_or("UNKNOWN", |s| s.0.name());
    let first = culprits.first();
    let headline = match cause {
        Cause::Timer => {
            let call = first
                .and_then(|c| c.name.clone())
                .map(|n| format!(" in {n}"))
                .unwrap_or_default();
            format!("TIMER {pct}%: sleep or timeout{call}")
        }
        Cause::Running => {
            let whom = first.map(who).unwrap_or_default();
            format!("RUNNING {pct}%: its own CPU work, {whom}")
        }
        _ => {
            let whom = first.map(|c| format!(" of {}", who(c))).unwrap_or_default();
            format!("{state} {pct}%: waiting with no known waker{whom}")
        }
    };
    Diagnosis {
        cause,
        headline,
        evidence: Vec::new(),
        culprits,
        root: None,
    }
}

/// Block requests of the whole trace, matched insert/issue → completion.
struct DiskIndex {
    /// Sorted by start.
    rqs: Vec<Rq>,
    /// Per device: (ts, requests in flight from then on), in time order.
    depth: FxHashMap<u32, Vec<(u64, u32)>>,
    /// Longest time a completed request was in flight (bounds the
    /// lookups).
    longest: u64,
    /// Requests never seen completing (in flight to the end of the trace):
    /// kept apart so they do not widen every lookup.
    unfinished: Vec<Rq>,
}

#[derive(Clone, Copy, Debug)]
struct Rq {
    start: u64,
    end: u64,
    dev: u32,
    bytes: u64,
    write: bool,
    /// Thread that inserted it (or issued it, without an insert).
    tid: Tid,
}

impl DiskIndex {
    fn new(model: &KernelModel) -> DiskIndex {
        let (_, trace_end) = model.time_range();
        let mut open: FxHashMap<(u32, u64), usize> = FxHashMap::default();
        let mut rqs: Vec<Rq> = Vec::new();
        let mut done: Vec<bool> = Vec::new();
        for e in model.block_io() {
            let key = (e.dev, e.sector);
            match e.phase {
                BlockPhase::Insert | BlockPhase::Issue => {
                    if open.contains_key(&key) {
                        continue;
                    }
                    open.insert(key, rqs.len());
                    rqs.push(Rq {
                        start: e.ts,
                        end: trace_end.max(e.ts),
                        dev: e.dev,
                        bytes: e.nr_sector as u64 * 512,
                        write: e.write,
                        tid: e.tid,
                    });
                    done.push(false);
                }
                BlockPhase::Complete => {
                    if let Some(i) = open.remove(&key) {
                        rqs[i].end = e.ts;
                        done[i] = true;
                    }
                }
            }
        }
        // Requests never completed within the trace are counted in flight
        // to its end (they were).
        let mut depth: FxHashMap<u32, Vec<(u64, i32)>> = FxHashMap::default();
        let mut longest = 0;
        for (r, &done) in rqs.iter().zip(&done) {
            let v = depth.entry(r.dev).or_default();
            v.push((r.start, 1));
            v.push((r.end, -1));
            if done {
                longest = longest.max(r.end - r.start);
            }
        }
        let unfinished = rqs
            .iter()
            .zip(&done)
            .filter(|(_, &d)| !d)
            .map(|(r, _)| *r)
            .collect();
        let rqs = rqs
            .into_iter()
            .zip(done)
            .filter(|(_, d)| *d)
            .map(|(r, _)| r)
            .collect();
        let depth = depth
            .into_iter()
            .map(|(dev, mut v)| {
                v.sort_unstable();
                let mut level = 0i64;
                let mut out: Vec<(u64, u32)> = Vec::with_capacity(v.len());
                for (ts, delta) in v {
                    level += delta as i64;
                    let l = level.max(0) as u32;
                    match out.last_mut() {
                        Some(last) if last.0 == ts => last.1 = l,
                        _ => out.push((ts, l)),
                    }
                }
                (dev, out)
            })
            .collect();
        DiskIndex {
            rqs,
            depth,
            longest,
            unfinished,
        }
    }

    /// Requests in flight at some time of `[a, b)`.
    fn in_flight(&self, a: u64, b: u64) -> impl Iterator<Item = &Rq> {
        let first = self
            .rqs
            .partition_point(|r| r.start < a.saturating_sub(self.longest));
        self.rqs[first..]
            .iter()
            .take_while(move |r| r.start < b)
            .chain(self.unfinished.iter().filter(move |r| r.start < b))
            .filter(move |r| r.end > a)
    }

    /// Maximum and time-weighted mean queue depth of `dev` over `[a, b)`.
    fn depth(&self, dev: u32, a: u64, b: u64) -> (u32, f64) {
        let Some(v) = self.depth.get(&dev) else {
            return (0, 0.0);
        };
        let mut i = v.partition_point(|x| x.0 <= a);
        let mut level = if i > 0 { v[i - 1].1 } else { 0 };
        let (mut max, mut area, mut t) = (level, 0f64, a);
        while i < v.len() && v[i].0 < b {
            area += level as f64 * (v[i].0 - t) as f64;
            t = v[i].0;
            level = v[i].1;
            max = max.max(level);
            i += 1;
        }
        area += level as f64 * b.saturating_sub(t) as f64;
        (max, area / b.saturating_sub(a).max(1) as f64)
    }
}

/// Read-like system calls: their return value is the bytes read.
fn is_read(name: &str) -> bool {
    matches!(
        name,
        "read" | "pread64" | "readv" | "preadv" | "preadv2" | "copy_file_range" | "sendfile"
    )
}

/// Bytes the read-like calls of `path`'s threads returned during their
/// home segments, from a trace with the calls' exits: each call that
/// began in a segment.
fn bytes_read_by_traced_calls(ctx: &DiagnosisContext, path: &RequestPath) -> u64 {
    let mut read_bytes = 0u64;
    for &HomeSegment { start, end, tid } in &path.home {
        let Some(th) = ctx.model.thread(tid) else {
            continue;
        };
        for s in th.syscalls_in(start, end) {
            if s.start >= start
                && s.exit_seen
                && s.ret > 0
                && ctx.syscall_base(s).is_some_and(is_read)
            {
                read_bytes += s.ret as u64;
            }
        }
    }
    read_bytes
}

/// The same from a recording without the calls' exits (`lean`), from the
/// threads' counts of bytes read at their sleeps: per thread, what the
/// count grew by between the sleeps around each home segment, stretches
/// shared by two segments counted once. Reads between the sleep before a
/// segment and its start, or between its end and the next sleep, count
/// too: a thread's reads between two sleeps have no time of their own.
/// None when none of the threads has counts.
fn bytes_read_between_sleeps(ctx: &DiagnosisContext, path: &RequestPath) -> Option<u64> {
    let mut stretches: Vec<(Tid, usize, usize)> = path
        .home
        .iter()
        .filter_map(|h| {
            let th = ctx.model.thread(h.tid)?;
            let (from, to) = th.read_chars_around(h.start, h.end)?;
            Some((h.tid, from, to))
        })
        .collect();
    if stretches.is_empty() {
        return None;
    }
    stretches.sort_unstable();
    let mut merged: Vec<(Tid, usize, usize)> = Vec::with_capacity(stretches.len());
    for (tid, from, to) in stretches {
        match merged.last_mut() {
            Some(last) if last.0 == tid && from <= last.2 => last.2 = last.2.max(to),
            _ => merged.push((tid, from, to)),
        }
    }
    let bytes = merged
        .iter()
        .filter_map(|&(tid, from, to)| {
            let counts = ctx.model.thread(tid)?.read_chars();
            // A count that went down is another thread of a reused tid.
            Some(counts[to].bytes.saturating_sub(counts[from].bytes))
        })
        .sum();
    Some(bytes)
}

pub(crate) fn disk<'p>(
    ctx: &DiagnosisContext,
    path: &RequestPath,
    pieces: impl Iterator<Item = &'p RequestPiece>,
    pct: u64,
) -> Diagnosis {
    let index = ctx.disk();
    let homes: Vec<Tid> = {
        let mut v: Vec<Tid> = path.home.iter().map(|h| h.tid).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    // Page-cache misses of the request's threads: bytes the block layer
    // read for them against bytes their read calls returned. Without
    // either source of the latter, neither figure is given rather than a
    // miss ratio of 100 %.
    let read_bytes = match ctx.model.stats().syscall_exits > 0 {
        true => Some(bytes_read_by_traced_calls(ctx, path)),
        false => bytes_read_between_sleeps(ctx, path),
    };
    let mut disk_read_bytes = 0u64;
    let mut own_requests = 0u64;
    let mut by_dev: Vec<(u32, u64)> = Vec::new();
    for r in index.in_flight(path.start, path.end) {
        if r.start >= path.start && homes.binary_search(&r.tid).is_ok() {
            own_requests += 1;
            if !r.write {
                disk_read_bytes += r.bytes;
            }
        }
    }
    // Whose requests filled the queue while the request waited on it: each
    // BLOCK_DEVICE piece's time shared among the requests in flight then,
    // by size.
    let mut culprits: Vec<Culprit> = Vec::new();
    let mut bdev_ns = 0u64;
    for p in pieces {
        let (a, b) = (p.start, p.end);
        bdev_ns += b - a;
        let inflight: Vec<&Rq> = index.in_flight(a, b).collect();
        let bytes: u64 = inflight.iter().map(|r| r.bytes.max(1)).sum();
        for r in inflight {
            let ns = ((b - a) as u128 * r.bytes.max(1) as u128 / bytes.max(1) as u128) as u64;
            match by_dev.iter_mut().find(|d| d.0 == r.dev) {
                Some(d) => d.1 += ns,
                None => by_dev.push((r.dev, ns)),
            }
            let pid = ctx.pid(r.tid).unwrap_or(r.tid);
            add_culprit(
                &mut culprits,
                ns,
                |c| c.pid == Some(pid),
                || {
                    let mut c = process_culprit(ctx, r.tid, r.start);
                    c.comm = ctx.model.thread(r.tid).and_then(|th| th.name()).or(c.comm);
                    c
                },
            );
        }
    }
    culprits.retain(|c| c.ns > 0);
    sort_culprits(&mut culprits);
    by_dev.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut evidence = vec![("block_device_ns", bdev_ns as f64)];
    let miss = read_bytes
        .filter(|read| read + disk_read_bytes > 0)
        .map(|read| disk_read_bytes as f64 / read.max(disk_read_bytes) as f64);
    if let Some(m) = miss {
        evidence.push(("page_cache_miss_ratio", m));
    }
    if let Some(read) = read_bytes {
        evidence.push(("read_bytes", read as f64));
    }
    evidence.push(("disk_read_bytes", disk_read_bytes as f64));
    evidence.push(("own_block_requests", own_requests as f64));
    let mut queue = String::new();
    if let Some(&(dev, _)) = by_dev.first() {
        let (max, mean) = index.depth(dev, path.start, path.end);
        evidence.push(("queue_depth_max", max as f64));
        evidence.push(("queue_depth_mean", mean));
        evidence.push(("device_major", (dev >> 20) as f64));
        evidence.push(("device_minor", (dev & 0xf_ffff) as f64));
        queue = format!(", queue max {max}");
    }
    let miss_text = miss
        .map(|m| format!(", cache miss {:.0}%", m * 100.0))
        .unwrap_or_default();
    let whom = culprits
        .first()
        .map(|c| format!(", {}", who(c)))
        .unwrap_or_default();
    Diagnosis {
        cause: Cause::Disk,
        headline: format!("BLOCK_DEVICE {pct}%{miss_text}{queue}{whom}"),
        evidence,
        culprits,
        root: None,
    }
}

/// Cuts `s` to `width` characters, marking the cut.
pub(crate) fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}
