//! Root causes through chains of requests.
//!
//! A request whose largest bucket is time spent for other requests
//! (`blocked_by_request`: a thread working for request X, or a server
//! serving X, was on its critical path) is usually not slow *because* of X:
//! X was itself held up, by a CPU quota, a disk, a lock, or by a third
//! request. For each piece of the request's path that worked for another
//! request X, this module looks at what X's own critical path was doing
//! over that same time, and follows X's blocked pieces to the requests
//! they worked for, transitively, across services and processes. Where a
//! piece is the blocking request's own work (running, preempted, reading
//! the disk …) the chain ends: that piece is a *leaf*. The leaves'
//! buckets (as [`crate::diagnose`] buckets a path) say what the blocked
//! time was really spent on, but only for blocking requests that were
//! themselves held up, well above their operation's usual duration
//! ([`ChainIndex::mark_held_up`]): a blocker of its usual length (or of an
//! operation without a baseline) is simply work the request had to wait
//! for, whatever share of it the blocker spent waiting for a busy CPU. The
//! largest bucket is the root cause:
//! - queued behind throttled requests → `cpu_throttled`;
//! - behind requests that read the disk → `disk`;
//! - blocked by a request that ran (a row lock's holder doing its work) →
//!   `blocked_by_request` still, with that request as the culprit.
//!
//! A request's own sub-requests (calls into other services) are part of
//! its work, not blockers; but when one of them waited there for a lock
//! of its process, that wait is lock contention, which the caller's path
//! alone cannot tell (the holder is in another process than the caller):
//! the sub-request's bucket is taken for that time.
//!
//! A chain that comes back to a request already on it (A waits for B, B
//! for A) is a cycle: it is not followed, the piece counts as the work of
//! the request it came back to, and the cycle is reported (evidence
//! `cycles`, `cycle_ns`, and the chain text). Chains are cut at
//! [`MAX_CHAIN_DEPTH`] requests.

use std::sync::OnceLock;

use crate::diagnosis::{
    add_culprit, by_thread, disk, fit, lock, network, polled_lock_holder, preempted,
    process_culprit, request_culprit, sort_culprits, who, Bucket, Cause, Culprit, CulpritKind,
    DiagnosisContext, HEADLINE_MAX, MAX_CULPRITS,
};
use crate::graph::EdgeType;
use crate::request::{CpuWait, RequestPath, RequestPiece, SpanIdx};
use rustc_hash::FxHashMap;

/// Most requests followed below the one diagnosed.
pub const MAX_CHAIN_DEPTH: usize = 8;

/// What the time a request spent for other requests was spent on, found
/// through those requests' own paths.
#[derive(Clone, Debug, PartialEq)]
pub struct RootCause {
    pub cause: Cause,
    /// One line, at most [`HEADLINE_MAX`] characters.
    pub headline: String,
    /// `share` (of the request's time) and `ns` of the root cause first,
    /// then `blocked_ns` (the request's time spent for other requests),
    /// `blocked_share` (of it, the root cause's), `depth` (requests in the
    /// chain below the request), the cause's own numbers, and `cycles` /
    /// `cycle_ns` when a chain came back on itself.
    pub evidence: Vec<(&'static str, f64)>,
    /// Largest first.
    pub culprits: Vec<Culprit>,
    /// The chain, as a person reads it: `[front] GET /product → behind 5 ×
    /// [pricing] GET /price → PREEMPTED (throttled) 98 %`.
    pub chain: String,
}

/// One request's path as the chains need it.
struct ChainPath {
    path: RequestPath,
    /// Well above its operation's usual duration ([`ChainIndex::mark_held_up`]).
    held_up: bool,
    /// The bucket of each piece (as the request's own diagnosis put it).
    buckets: Vec<Bucket>,
}

/// The paths of all requests of an analysis, by request, for following
/// chains once every path is known (a request can be blocked by one whose
/// path comes later).
#[derive(Default)]
pub struct ChainIndex {
    paths: FxHashMap<SpanIdx, ChainPath>,
    /// Each request's sub-requests (the requests among its descendants
    /// whose nearest request ancestor it is), made on first use.
    children: OnceLock<FxHashMap<SpanIdx, Vec<SpanIdx>>>,
}

/// A piece of blocked time at the end of its chain.
struct Leaf {
    piece: RequestPiece,
    bucket: Bucket,
    /// The request whose work (or wait) the piece is.
    owner: SpanIdx,
    /// The requests from the diagnosed one (excluded) to `owner`.
    chain: Vec<SpanIdx>,
    /// The chain came back to a request already on it.
    cycle: Option<Vec<SpanIdx>>,
}

impl ChainIndex {
    pub fn new() -> ChainIndex {
        ChainIndex::default()
    }

    /// Keeps `path` (with its pieces) for the chains.
    pub fn add(&mut self, ctx: &DiagnosisContext, path: &RequestPath) {
        let buckets = path
            .pieces
            .iter()
            .map(|p| crate::diagnosis::bucket(ctx, path, p))
            .collect();
        self.paths.insert(
            path.request,
            ChainPath {
                path: path.clone(),
                held_up: false,
                buckets,
            },
        );
        self.children = OnceLock::new();
    }

    /// Marks `request` as held up: well above its operation's usual
    /// duration ([`crate::is_anomalous`] against
    /// [`crate::usual_durations`]). Its own waits then explain the time
    /// others spent waiting for it (module doc).
    pub fn mark_held_up(&mut self, request: SpanIdx) {
        if let Some(p) = self.paths.get_mut(&request) {
            p.held_up = true;
        }
    }

    /// What a leaf's time is put down to: the owner's own waits when the
    /// owner was held up, its work otherwise (and always for a request
    /// that could not be followed further).
    fn leaf_bucket(&self, l: &Leaf) -> Bucket {
        let held_up = self.paths.get(&l.owner).is_some_and(|p| p.held_up);
        match l.bucket {
            Bucket::Lock => Bucket::Lock,
            Bucket::OtherRequest => Bucket::Running,
            b if held_up => b,
            _ => Bucket::Running,
        }
    }

    /// The requests kept.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    fn children(&self, ctx: &DiagnosisContext) -> &FxHashMap<SpanIdx, Vec<SpanIdx>> {
        self.children.get_or_init(|| {
            let mut out: FxHashMap<SpanIdx, Vec<SpanIdx>> = FxHashMap::default();
            for &r in self.paths.keys() {
                let mut s = ctx.spans.get(r as usize).and_then(|s| s.parent);
                for _ in 0..64 {
                    let Some(p) = s else { break };
                    if self.paths.contains_key(&p) {
                        out.entry(p).or_default().push(r);
                        break;
                    }
                    s = ctx.spans.get(p as usize).and_then(|s| s.parent);
                }
            }
            for v in out.values_mut() {
                v.sort_unstable();
            }
            out
        })
    }

    /// The root cause of `request` when its largest bucket is time spent
    /// for other requests; `None` otherwise (its cause is its root cause),
    /// or when it has no path here.
    pub fn root_cause(&self, ctx: &DiagnosisContext, request: SpanIdx) -> Option<RootCause> {
        let cp = self.paths.get(&request)?;
        let total: u64 = cp.path.pieces.iter().map(|p| p.duration()).sum();
        let mut sums: Vec<(Bucket, u64)> = Vec::new();
        for (p, &b) in cp.path.pieces.iter().zip(&cp.buckets) {
            match sums.iter_mut().find(|x| x.0 == b) {
                Some(x) => x.1 += p.duration(),
                None => sums.push((b, p.duration())),
            }
        }
        sums.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        if sums.first()?.0 != Bucket::OtherRequest {
            return None;
        }
        let blocked_ns = sums[0].1;
        let mut leaves = Vec::new();
        let mut chain = vec![request];
        for (p, &b) in cp.path.pieces.iter().zip(&cp.buckets) {
            if b == Bucket::OtherRequest {
                self.place(ctx, p, b, p.start, p.end, &mut chain, &mut leaves);
            }
        }
        Some(self.conclude(ctx, request, total, blocked_ns, leaves))
    }

    /// `q`, a piece of the path of the last request of `chain`, over
    /// `[a, b)`: a leaf, or followed into the request it worked for.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        ctx: &DiagnosisContext,
        q: &RequestPiece,
        bucket: Bucket,
        a: u64,
        b: u64,
        chain: &mut Vec<SpanIdx>,
        out: &mut Vec<Leaf>,
    ) {
        let owner = *chain.last().expect("a chain starts with its request");
        let (Bucket::OtherRequest, Some(next)) = (bucket, q.blocked_by) else {
            out.push(Leaf {
                piece: clip(q, a, b),
                bucket,
                owner,
                chain: chain[1..].to_vec(),
                cycle: None,
            });
            return;
        };
        // Where a sub-request of the owner waited for a lock there, the
        // time is lock contention (module doc).
        let locks = self.sub_request_locks(ctx, owner, a, b);
        let mut t = a;
        for (la, lb, lp) in locks {
            if la > t {
                self.follow(ctx, q, next, t, la, chain, out);
            }
            let mut c = chain[1..].to_vec();
            c.push(next);
            out.push(Leaf {
                piece: clip(lp, la, lb),
                bucket: Bucket::Lock,
                owner: next,
                chain: c,
                cycle: None,
            });
            t = lb;
        }
        if t < b {
            self.follow(ctx, q, next, t, b, chain, out);
        }
    }

    /// Follows `q` (working for `next`) over `[a, b)` into `next`'s path.
    #[allow(clippy::too_many_arguments)]
    fn follow(
        &self,
        ctx: &DiagnosisContext,
        q: &RequestPiece,
        next: SpanIdx,
        a: u64,
        b: u64,
        chain: &mut Vec<SpanIdx>,
        out: &mut Vec<Leaf>,
    ) {
        let leaf_here = |cycle: Option<Vec<SpanIdx>>, chain: &[SpanIdx]| {
            let mut c = chain[1..].to_vec();
            c.push(next);
            Leaf {
                piece: clip(q, a, b),
                bucket: state_bucket(q.state),
                owner: next,
                chain: c,
                cycle,
            }
        };
        if chain.contains(&next) {
            let mut cycle = chain.clone();
            cycle.push(next);
            out.push(leaf_here(Some(cycle), chain));
            return;
        }
        let Some(np) = self.paths.get(&next) else {
            out.push(leaf_here(None, chain));
            return;
        };
        if chain.len() > MAX_CHAIN_DEPTH {
            out.push(leaf_here(None, chain));
            return;
        }
        chain.push(next);
        let pieces = &np.path.pieces;
        let first = pieces.partition_point(|x| x.end <= a);
        let mut t = a;
        for (x, &bx) in pieces[first..].iter().zip(&np.buckets[first..]) {
            if x.start >= b {
                break;
            }
            let (xa, xb) = (x.start.max(a), x.end.min(b));
            if xa >= xb {
                continue;
            }
            if xa > t {
                // Not on `next`'s path (outside its span): as `q` shows it.
                out.push(Leaf {
                    piece: clip(q, t, xa),
                    bucket: state_bucket(q.state),
                    owner: next,
                    chain: chain[1..].to_vec(),
                    cycle: None,
                });
            }
            self.place(ctx, x, bx, xa, xb, chain, out);
            t = xb;
        }
        if t < b {
            out.push(Leaf {
                piece: clip(q, t, b),
                bucket: state_bucket(q.state),
                owner: next,
                chain: chain[1..].to_vec(),
                cycle: None,
            });
        }
        chain.pop();
    }

    /// The times of `[a, b)` in which a sub-request of `owner` (at any
    /// depth) waited for a lock of its own process: `(start, end, its
    /// piece)`, in time order, not overlapping.
    fn sub_request_locks(
        &self,
        ctx: &DiagnosisContext,
        owner: SpanIdx,
        a: u64,
        b: u64,
    ) -> Vec<(u64, u64, &RequestPiece)> {
        let children = self.children(ctx);
        let mut out: Vec<(u64, u64, &RequestPiece)> = Vec::new();
        let mut todo: Vec<SpanIdx> = children.get(&owner).cloned().unwrap_or_default();
        let mut seen = 0usize;
        while let Some(r) = todo.pop() {
            seen += 1;
            if seen > 256 {
                break;
            }
            let Some(cp) = self.paths.get(&r) else {
                continue;
            };
            if cp.path.end <= a || cp.path.start >= b {
                continue;
            }
            let pieces = &cp.path.pieces;
            let first = pieces.partition_point(|x| x.end <= a);
            for (x, &bx) in pieces[first..].iter().zip(&cp.buckets[first..]) {
                if x.start >= b {
                    break;
                }
                if bx == Bucket::Lock {
                    out.push((x.start.max(a), x.end.min(b), x));
                }
            }
            if let Some(c) = children.get(&r) {
                todo.extend(c);
            }
        }
        out.sort_by_key(|x| (x.0, x.1));
        // Overlaps (two sub-requests at once) are counted once.
        let mut kept: Vec<(u64, u64, &RequestPiece)> = Vec::with_capacity(out.len());
        for (s, e, p) in out {
            let s = kept.last().map_or(s, |l| s.max(l.1));
            if s < e {
                kept.push((s, e, p));
            }
        }
        kept
    }

    /// The root cause from the leaves of the blocked time.
    fn conclude(
        &self,
        ctx: &DiagnosisContext,
        request: SpanIdx,
        total: u64,
        blocked_ns: u64,
        leaves: Vec<Leaf>,
    ) -> RootCause {
        let mut sums: Vec<(Bucket, u64)> = Vec::new();
        for l in &leaves {
            let b = self.leaf_bucket(l);
            match sums.iter_mut().find(|x| x.0 == b) {
                Some(x) => x.1 += l.piece.duration(),
                None => sums.push((b, l.piece.duration())),
            }
        }
        sums.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let (top, ns) = sums.first().copied().unwrap_or((Bucket::Running, 0));
        let top_leaves: Vec<&Leaf> = leaves
            .iter()
            .filter(|l| self.leaf_bucket(l) == top)
            .collect();
        let share = ns as f64 / total.max(1) as f64;
        let pct = (share * 100.0).round() as u64;
        let pieces = || top_leaves.iter().map(|l| &l.piece);
        let mut d = match top {
            Bucket::Lock => lock(
                ctx,
                top_leaves.iter().map(|l| {
                    let holder = self
                        .paths
                        .get(&l.owner)
                        .and_then(|kept| polled_lock_holder(ctx, &kept.path, &l.piece));
                    (&l.piece, holder)
                }),
                pct,
            ),
            Bucket::Preempted => preempted(ctx, pieces(), pct),
            Bucket::BlockDevice => {
                // The page-cache figures are those of the request that
                // waited on the disk longest.
                let owner = heaviest_owner(&top_leaves).unwrap_or(request);
                let path = &self.paths.get(&owner).unwrap_or(&self.paths[&request]).path;
                disk(ctx, path, pieces(), pct)
            }
            Bucket::Network => network(ctx, pieces(), pct),
            Bucket::Timer => by_thread(ctx, pieces(), Cause::Timer, pct),
            Bucket::Unexplained => by_thread(ctx, pieces(), Cause::Unknown, pct),
            _ => working(ctx, &top_leaves, pct),
        };
        // The requests at the end of the chains, unless the cause named
        // them already.
        let named: Vec<SpanIdx> = d
            .culprits
            .iter()
            .filter(|c| c.kind == CulpritKind::Request)
            .filter_map(|c| c.span)
            .collect();
        for l in top_leaves.iter().filter(|l| !named.contains(&l.owner)) {
            add_culprit(
                &mut d.culprits,
                l.piece.duration(),
                |c| c.kind == CulpritKind::Request && c.span == Some(l.owner),
                || request_culprit(l.owner),
            );
        }
        sort_culprits(&mut d.culprits);
        d.culprits.truncate(MAX_CULPRITS);

        let depth = leaves.iter().map(|l| l.chain.len()).max().unwrap_or(0);
        let cycles: Vec<&Leaf> = leaves.iter().filter(|l| l.cycle.is_some()).collect();
        let mut evidence = vec![
            ("share", share),
            ("ns", ns as f64),
            ("blocked_ns", blocked_ns as f64),
            ("blocked_share", ns as f64 / blocked_ns.max(1) as f64),
            ("depth", depth as f64),
        ];
        evidence.append(&mut d.evidence);
        if !cycles.is_empty() {
            evidence.push(("cycles", cycles.len() as f64));
            evidence.push((
                "cycle_ns",
                cycles.iter().map(|l| l.piece.duration()).sum::<u64>() as f64,
            ));
        }
        let state = match (top, d.cause) {
            (Bucket::Preempted, Cause::CpuThrottled) => "PREEMPTED (throttled)",
            (Bucket::Preempted, _) => "PREEMPTED (other threads ran)",
            (Bucket::Lock, _) => "LOCK (futex)",
            (Bucket::BlockDevice, _) => "BLOCK_DEVICE",
            (Bucket::Network, _) => "NETWORK",
            (Bucket::Timer, _) => "TIMER",
            (Bucket::Unexplained, _) => "BLOCKED (no known waker)",
            _ => "RUNNING",
        };
        let mut chain = (ctx.label)(request);
        for level in chain_levels(ctx, &top_leaves) {
            chain.push_str(" → behind ");
            chain.push_str(&level);
        }
        let of_blocked = (ns as f64 * 100.0 / blocked_ns.max(1) as f64).round() as u64;
        chain.push_str(&format!(" → {state} {of_blocked} %"));
        if let Some(c) = cycles.first().and_then(|l| l.cycle.as_ref()) {
            let text: Vec<String> = c.iter().map(|&r| (ctx.label)(r)).collect();
            chain.push_str(&format!(" (cycle: {})", text.join(" → ")));
        }
        RootCause {
            cause: d.cause,
            headline: fit(&d.headline, HEADLINE_MAX),
            evidence,
            culprits: d.culprits,
            chain,
        }
    }
}

/// The chain's levels as read: per depth, the heaviest `[service]
/// operation` among the requests there, with their count (`5 × [pricing]
/// GET /price`), along the heaviest sequence of such labels.
fn chain_levels(ctx: &DiagnosisContext, leaves: &[&Leaf]) -> Vec<String> {
    let mut by_labels: Vec<(Vec<String>, u64, Vec<&Leaf>)> = Vec::new();
    for l in leaves {
        let labels: Vec<String> = l.chain.iter().map(|&r| (ctx.label)(r)).collect();
        match by_labels.iter_mut().find(|x| x.0 == labels) {
            Some(x) => {
                x.1 += l.piece.duration();
                x.2.push(l);
            }
            None => by_labels.push((labels, l.piece.duration(), vec![l])),
        }
    }
    by_labels.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let Some((labels, _, group)) = by_labels.into_iter().next() else {
        return Vec::new();
    };
    labels
        .into_iter()
        .enumerate()
        .map(|(depth, label)| {
            let mut ids: Vec<SpanIdx> = group
                .iter()
                .filter_map(|l| l.chain.get(depth).copied())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            match ids.len() {
                1 => label,
                n => format!("{n} × {label}"),
            }
        })
        .collect()
}

/// The request the most leaf time belongs to.
fn heaviest_owner(leaves: &[&Leaf]) -> Option<SpanIdx> {
    let mut by: Vec<(SpanIdx, u64)> = Vec::new();
    for l in leaves {
        match by.iter_mut().find(|x| x.0 == l.owner) {
            Some(x) => x.1 += l.piece.duration(),
            None => by.push((l.owner, l.piece.duration())),
        }
    }
    by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    by.first().map(|x| x.0)
}

/// Blocked time that the blocking requests spent on their own work: the
/// cause stays `blocked_by_request`, the culprits being those requests and
/// the processes they ran in.
fn working(ctx: &DiagnosisContext, leaves: &[&Leaf], pct: u64) -> crate::Diagnosis {
    let mut culprits = Vec::new();
    for l in leaves {
        let d = l.piece.duration();
        if let Some(tid) = l.piece.tid {
            let pid = ctx.pid(tid).unwrap_or(tid);
            add_culprit(
                &mut culprits,
                d,
                |c| c.kind == CulpritKind::Process && c.pid == Some(pid),
                || process_culprit(ctx, tid, l.piece.start),
            );
        }
        add_culprit(
            &mut culprits,
            d,
            |c| c.kind == CulpritKind::Request && c.span == Some(l.owner),
            || request_culprit(l.owner),
        );
    }
    sort_culprits(&mut culprits);
    let requests: Vec<SpanIdx> = culprits
        .iter()
        .filter(|c| c.kind == CulpritKind::Request)
        .filter_map(|c| c.span)
        .collect();
    let what = match requests.first() {
        Some(&r) => {
            let label = (ctx.label)(r);
            let n = requests
                .iter()
                .filter(|&&x| (ctx.label)(x) == label)
                .count();
            if n > 1 {
                format!("{n} × {label}")
            } else {
                label
            }
        }
        None => "other requests".into(),
    };
    let place = culprits
        .iter()
        .find(|c| c.kind == CulpritKind::Process)
        .map(|c| format!(" in {}", who(c)))
        .unwrap_or_default();
    crate::Diagnosis {
        cause: Cause::BlockedByRequest,
        headline: format!("BLOCKED {pct}%: {what} at work{place}"),
        evidence: Vec::new(),
        culprits,
        root: None,
    }
}

/// The bucket of a piece by its state alone (a piece of another request
/// seen from the path that waited for it).
fn state_bucket(state: EdgeType) -> Bucket {
    match state {
        EdgeType::Running => Bucket::Running,
        EdgeType::Preempted => Bucket::Preempted,
        EdgeType::Timer => Bucket::Timer,
        EdgeType::BlockDevice => Bucket::BlockDevice,
        EdgeType::Network => Bucket::Network,
        _ => Bucket::Unexplained,
    }
}

/// `p` cut to `[a, b)`, its CPU wait shared in proportion.
fn clip(p: &RequestPiece, a: u64, b: u64) -> RequestPiece {
    let (a, b) = (a.max(p.start), b.min(p.end).max(a.max(p.start)));
    let mut q = p.clone();
    let (whole, part) = (p.duration().max(1) as u128, (b - a) as u128);
    let scale = |x: u64| (x as u128 * part / whole) as u64;
    q.cpu_wait = p.cpu_wait.map(|w| CpuWait {
        throttled_ns: scale(w.throttled_ns),
        contended_ns: scale(w.contended_ns),
        wakeup_ns: scale(w.wakeup_ns),
        holder: w.holder,
    });
    q.start = a;
    q.end = b;
    q
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use deepspan_model::Tid;

    use super::*;
    use crate::request::{HomeSegment, SpanInput, SyncSource, ThreadWork, WorkInterval};
    use crate::state::StateBuilder;
    use crate::syscalls::Arch;
    use crate::{diagnose, KernelModel};

    struct NoWork;
    impl ThreadWork for NoWork {
        fn work_during(&self, _: Tid, _: u64, _: u64, _: &mut Vec<WorkInterval>) {}
    }

    const LABELS: [&str; 4] = [
        "[front] GET /product",
        "[shop] GET /cart",
        "[pricing] GET /price",
        "[pricing] GET /price",
    ];

    fn label(s: SpanIdx) -> String {
        LABELS
            .get(s as usize)
            .map_or_else(|| format!("[x] op{s}"), |l| l.to_string())
    }

    fn span(parent: Option<SpanIdx>) -> SpanInput {
        SpanInput {
            parent,
            entry: true,
            times: Some((0, 100)),
            exact_times: true,
            holder: None,
            activations: Vec::new(),
            inferred: None,
            arrival: None,
        }
    }

    fn piece(start: u64, end: u64, state: EdgeType, tid: Tid, by: Option<SpanIdx>) -> RequestPiece {
        RequestPiece {
            start,
            end,
            state,
            tid: Some(tid),
            comm: None,
            qualifier: None,
            syscall: None,
            waiting_in: None,
            span: None,
            blocked_by: by,
            shared: 0,
            vertical: false,
            lost: false,
            cpu_wait: (state == EdgeType::Preempted).then_some(CpuWait {
                throttled_ns: end - start,
                contended_ns: 0,
                wakeup_ns: 0,
                holder: None,
            }),
        }
    }

    fn path(request: SpanIdx, tid: Tid, pieces: Vec<RequestPiece>) -> RequestPath {
        let (start, end) = (pieces[0].start, pieces.last().unwrap().end);
        RequestPath {
            request,
            start,
            end,
            sync: SyncSource::Exact,
            home: vec![HomeSegment { start, end, tid }],
            pieces,
            arrival: None,
            queue: Vec::new(),
            truncated: false,
        }
    }

    struct Fixture {
        model: KernelModel,
        spans: Vec<SpanInput>,
        pids: HashMap<Tid, Tid>,
    }

    impl Fixture {
        fn new(spans: Vec<SpanInput>) -> Fixture {
            Fixture {
                model: StateBuilder::new().finish(),
                spans,
                // Thread t is in process 10 t: each its own service.
                pids: (1..=4).map(|t| (t, 10 * t)).collect(),
            }
        }

        /// Each path's diagnosis, root cause filled in as `deepspan
        /// analyze` does.
        fn diagnose(
            &self,
            paths: &[RequestPath],
            anomalous: &[SpanIdx],
        ) -> HashMap<SpanIdx, crate::Diagnosis> {
            let label = |s: SpanIdx| label(s);
            let ctx = DiagnosisContext::new(
                &self.model,
                Arch::X86_64,
                &self.spans,
                &self.pids,
                &label,
                &NoWork,
            );
            let mut index = ChainIndex::new();
            for p in paths {
                index.add(&ctx, p);
            }
            for &r in anomalous {
                index.mark_held_up(r);
            }
            paths
                .iter()
                .map(|p| {
                    let mut d = diagnose(&ctx, p).unwrap();
                    d.root = index.root_cause(&ctx, p.request).map(Box::new);
                    (p.request, d)
                })
                .collect()
        }
    }

    fn evidence(r: &RootCause, name: &str) -> Option<f64> {
        r.evidence.iter().find(|e| e.0 == name).map(|e| e.1)
    }

    /// A (front, thread 1) waits for B (thread 2) over 10..90; B itself
    /// waited for C (pricing, thread 3) over 10..85, and C was held off
    /// its CPU (or read the disk) all that time.
    fn three_deep(c_state: EdgeType) -> Vec<RequestPath> {
        use EdgeType::*;
        vec![
            path(
                0,
                1,
                vec![
                    piece(0, 10, Running, 1, None),
                    piece(10, 90, Running, 2, Some(1)),
                    piece(90, 100, Running, 1, None),
                ],
            ),
            path(
                1,
                2,
                vec![
                    piece(5, 10, Running, 2, None),
                    piece(10, 85, c_state, 3, Some(2)),
                    piece(85, 95, Running, 2, None),
                ],
            ),
            path(2, 3, vec![piece(8, 88, c_state, 3, None)]),
        ]
    }

    #[test]
    fn a_three_deep_chain_gives_the_first_request_the_root_cause_of_the_last() {
        let f = Fixture::new(vec![span(None), span(None), span(None)]);
        let d = f.diagnose(&three_deep(EdgeType::Preempted), &[0, 1, 2]);
        let a = &d[&0];
        assert_eq!(a.cause, Cause::BlockedByRequest);
        let root = a
            .root
            .as_ref()
            .expect("A was blocked by B: it has a root cause");
        assert_eq!(root.cause, Cause::CpuThrottled);
        assert_eq!(a.root_cause(), Cause::CpuThrottled);
        // 75 of A's 80 blocked ns were C's throttling; 5 were B's own work.
        assert_eq!(evidence(root, "ns"), Some(75.0));
        assert_eq!(evidence(root, "blocked_ns"), Some(80.0));
        assert_eq!(evidence(root, "depth"), Some(2.0));
        assert_eq!(
            root.chain,
            "[front] GET /product → behind [shop] GET /cart → behind [pricing] GET /price \
             → PREEMPTED (throttled) 94 %"
        );
        // The throttled process and the request at the end of the chain.
        assert_eq!(root.culprits[0].kind, CulpritKind::Process);
        assert_eq!(root.culprits[0].pid, Some(30));
        let c = root
            .culprits
            .iter()
            .find(|c| c.kind == CulpritKind::Request && c.span == Some(2))
            .expect("C is a culprit");
        assert_eq!(c.ns, 75);
        assert!(root.headline.chars().count() <= HEADLINE_MAX);
        // B's own root is the same throttling, one level down.
        let b = d[&1].root.as_ref().unwrap();
        assert_eq!(b.cause, Cause::CpuThrottled);
        assert_eq!(
            b.chain,
            "[shop] GET /cart → behind [pricing] GET /price → PREEMPTED (throttled) 100 %"
        );
    }

    #[test]
    fn a_chain_ending_on_the_disk_is_disk() {
        let f = Fixture::new(vec![span(None), span(None), span(None)]);
        let d = f.diagnose(&three_deep(EdgeType::BlockDevice), &[0, 1, 2]);
        let root = d[&0].root.as_ref().unwrap();
        assert_eq!(root.cause, Cause::Disk);
        assert!(
            root.chain.ends_with("→ BLOCK_DEVICE 94 %"),
            "{}",
            root.chain
        );
    }

    #[test]
    fn a_blocker_doing_its_own_work_stays_blocked_by_request_with_it_as_culprit() {
        use EdgeType::*;
        let f = Fixture::new(vec![span(None), span(None)]);
        let d = f.diagnose(
            &[
                path(
                    0,
                    1,
                    vec![
                        piece(0, 10, Running, 1, None),
                        piece(10, 100, Running, 2, Some(1)),
                    ],
                ),
                path(1, 2, vec![piece(0, 100, Running, 2, None)]),
            ],
            &[0, 1],
        );
        let root = d[&0].root.as_ref().unwrap();
        assert_eq!(root.cause, Cause::BlockedByRequest);
        assert!(root
            .culprits
            .iter()
            .any(|c| c.kind == CulpritKind::Request && c.span == Some(1)));
        assert_eq!(
            root.chain,
            "[front] GET /product → behind [shop] GET /cart → RUNNING 100 %"
        );
    }

    #[test]
    fn several_blockers_of_one_operation_are_counted_in_the_chain() {
        use EdgeType::*;
        // A queued behind two [pricing] GET /price requests (2 and 3),
        // throttled both.
        let f = Fixture::new(vec![span(None), span(None), span(None), span(None)]);
        let d = f.diagnose(
            &[
                path(
                    0,
                    1,
                    vec![
                        piece(0, 10, Running, 1, None),
                        piece(10, 50, Preempted, 3, Some(2)),
                        piece(50, 100, Preempted, 3, Some(3)),
                    ],
                ),
                path(2, 3, vec![piece(10, 50, Preempted, 3, None)]),
                path(3, 3, vec![piece(50, 100, Preempted, 3, None)]),
            ],
            &[0, 2, 3],
        );
        let root = d[&0].root.as_ref().unwrap();
        assert_eq!(root.cause, Cause::CpuThrottled);
        assert_eq!(
            root.chain,
            "[front] GET /product → behind 2 × [pricing] GET /price → PREEMPTED (throttled) 100 %"
        );
    }

    #[test]
    fn a_blocker_of_its_usual_length_is_work_to_wait_for_whatever_it_waited_on() {
        use EdgeType::*;
        // As in the three-deep chain, but C took its usual time: B and A
        // waited for C's work, not for the CPU C waited on.
        let f = Fixture::new(vec![span(None), span(None), span(None)]);
        let d = f.diagnose(&three_deep(Preempted), &[0, 1]);
        let root = d[&0].root.as_ref().unwrap();
        assert_eq!(root.cause, Cause::BlockedByRequest);
        assert_eq!(
            root.chain,
            "[front] GET /product → behind [shop] GET /cart → behind [pricing] GET /price \
             → RUNNING 100 %"
        );
        assert_eq!(root.culprits[0].kind, CulpritKind::Process);
        assert_eq!(root.culprits[0].pid, Some(30));
        assert_eq!(root.culprits[1].span, Some(2));
    }

    #[test]
    fn a_lock_its_own_sub_request_waited_for_is_lock_contention() {
        use crate::state::SyscallInterval;
        use EdgeType::*;
        // A (front, thread 1) calls M (span 1, a server span under A, on
        // thread 2); M's thread waits in a futex held by thread 3 of the
        // same process, working for H (span 2). A's path shows H's thread
        // (another process than A's): blocked by H; M's shows the lock.
        let mut f = Fixture::new(vec![span(None), span(Some(0)), span(None)]);
        f.pids.insert(3, 20);
        let futex = SyscallInterval {
            start: 10,
            end: 90,
            id: 202,
            name: 0,
            arg0: 0xbeef,
            arg1: 0,
            ret: 0,
            entry_seen: true,
            exit_seen: true,
        };
        let mut waiting = piece(10, 90, Running, 3, Some(2));
        waiting.waiting_in = Some(futex);
        let d = f.diagnose(
            &[
                path(
                    0,
                    1,
                    vec![
                        piece(0, 10, Running, 1, None),
                        piece(10, 90, Running, 3, Some(2)),
                        piece(90, 100, Running, 1, None),
                    ],
                ),
                path(
                    1,
                    2,
                    vec![
                        piece(5, 10, Running, 2, None),
                        waiting,
                        piece(90, 95, Running, 2, None),
                    ],
                ),
                path(2, 3, vec![piece(0, 100, Running, 3, None)]),
            ],
            &[0, 1],
        );
        assert_eq!(d[&1].cause, Cause::LockContention);
        assert_eq!(d[&0].cause, Cause::BlockedByRequest);
        let root = d[&0].root.as_ref().unwrap();
        assert_eq!(root.cause, Cause::LockContention);
        assert_eq!(evidence(root, "futex_uaddr"), Some(0xbeef as f64));
        assert_eq!(
            root.chain,
            "[front] GET /product → behind [pricing] GET /price → LOCK (futex) 100 %"
        );
        assert!(root
            .culprits
            .iter()
            .any(|c| c.kind == CulpritKind::Thread && c.tid == Some(3)));
    }

    /// The JVM's monitor: the waiting request's own thread (1) polls the
    /// lock in a timed futex wait that times out and resumes, while the
    /// holder request's thread (2) runs with it; `resume_timeouts` gave the
    /// TIMER piece to the holder's request. In one process that is a lock
    /// held by thread 2; across processes, still a request blocking it.
    #[test]
    fn a_lock_polled_by_the_requests_own_thread_is_lock_contention_held_by_the_holder() {
        use crate::state::SyscallInterval;
        use EdgeType::*;
        let futex = SyscallInterval {
            start: 10,
            end: 90,
            id: 202,
            name: 0,
            arg0: 0xfeed,
            arg1: 0,
            ret: 0,
            entry_seen: true,
            exit_seen: true,
        };
        let on_thread = |tid| SpanInput {
            holder: Some(tid),
            ..span(None)
        };
        let mut polled = piece(10, 90, Timer, 1, Some(1));
        polled.syscall = Some(futex);
        let paths = [
            path(
                0,
                1,
                vec![
                    piece(0, 10, Running, 1, None),
                    polled,
                    piece(90, 100, Running, 1, None),
                ],
            ),
            path(1, 2, vec![piece(0, 100, Running, 2, None)]),
        ];
        let mut f = Fixture::new(vec![on_thread(1), on_thread(2)]);
        f.pids.insert(2, 10);
        let d = f.diagnose(&paths, &[0]);
        let waiter = &d[&0];
        assert_eq!(waiter.cause, Cause::LockContention, "{waiter:?}");
        let first_thread = waiter
            .culprits
            .iter()
            .find(|c| c.kind == CulpritKind::Thread)
            .unwrap();
        assert_eq!(first_thread.tid, Some(2), "the holder's thread: {waiter:?}");
        assert!(waiter
            .culprits
            .iter()
            .any(|c| c.kind == CulpritKind::Request && c.span == Some(1)));
        assert!(waiter
            .evidence
            .iter()
            .any(|e| e.0 == "futex_uaddr" && e.1 == 0xfeed as f64));

        // The holder in another process: no lock of the waiter's process.
        f.pids.insert(2, 20);
        assert_eq!(f.diagnose(&paths, &[0])[&0].cause, Cause::BlockedByRequest);
    }

    #[test]
    fn a_cycle_is_reported_and_not_followed() {
        use EdgeType::*;
        let f = Fixture::new(vec![span(None), span(None)]);
        // A waits for B over 10..90, B for A over the same time.
        let d = f.diagnose(
            &[
                path(
                    0,
                    1,
                    vec![
                        piece(0, 10, Running, 1, None),
                        piece(10, 90, Running, 2, Some(1)),
                    ],
                ),
                path(
                    1,
                    2,
                    vec![
                        piece(0, 10, Running, 2, None),
                        piece(10, 90, Running, 1, Some(0)),
                    ],
                ),
            ],
            &[0, 1],
        );
        let root = d[&0].root.as_ref().unwrap();
        assert_eq!(evidence(root, "cycles"), Some(1.0));
        assert_eq!(evidence(root, "cycle_ns"), Some(80.0));
        assert!(
            root.chain.ends_with(
                "(cycle: [front] GET /product → [shop] GET /cart → [front] GET /product)"
            ),
            "{}",
            root.chain
        );
        assert_eq!(root.cause, Cause::BlockedByRequest);
    }

    #[test]
    fn a_request_not_blocked_by_others_keeps_its_diagnosis() {
        use EdgeType::*;
        let f = Fixture::new(vec![span(None), span(None)]);
        let paths = [
            path(
                0,
                1,
                vec![
                    piece(0, 70, Preempted, 1, None),
                    piece(70, 100, Running, 2, Some(1)),
                ],
            ),
            path(1, 2, vec![piece(0, 100, BlockDevice, 2, None)]),
        ];
        let d = f.diagnose(&paths, &[0, 1]);
        assert_eq!(d[&0].cause, Cause::CpuThrottled);
        assert!(d[&0].root.is_none());
        assert_eq!(d[&0].root_cause(), Cause::CpuThrottled);
        // Exactly what the diagnosis alone says.
        let label = |s: SpanIdx| label(s);
        let ctx = DiagnosisContext::new(&f.model, Arch::X86_64, &f.spans, &f.pids, &label, &NoWork);
        assert_eq!(diagnose(&ctx, &paths[0]).as_ref(), Some(&d[&0]));
    }
}
