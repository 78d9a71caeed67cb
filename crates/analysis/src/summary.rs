//! Summaries of request critical paths (Gelle et al. 2021, §3.5): where a
//! request's time went, by state and thread, by blocking request and by
//! system call; and the same aggregated over all requests of an operation
//! (CRISP-style), so a slow request can be compared with its peers.

use std::collections::HashMap;
use std::hash::Hash;

use deepspan_model::{Comm, Tid};

use crate::graph::EdgeType;
use crate::request::{syscall_label, RequestPath, SpanIdx, SyscallLabelKey};
use crate::state::{KernelModel, SyscallInterval};
use crate::syscalls::Arch;
use rustc_hash::FxHashMap;

/// Time of a request's path in one (state, thread, blocking request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryRow {
    pub state: EdgeType,
    pub tid: Option<Tid>,
    pub comm: Option<Comm>,
    /// The other request the thread was working for, if any.
    pub blocked_by: Option<SpanIdx>,
    pub ns: u64,
    /// PREEMPTED only: of `ns`, the CPU stayed idle (throttling) …
    pub throttled_ns: u64,
    /// … or other threads ran (contention) …
    pub contended_ns: u64,
    /// … or it was woken and its idle CPU was getting to it.
    pub wakeup_ns: u64,
}

/// Where one request's time went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestSummary {
    /// Time covered by the path (the request's duration when it has one).
    pub total_ns: u64,
    /// Largest first.
    pub by_state: Vec<SummaryRow>,
    /// `(blocking request, ns)`, largest first.
    pub by_blocking: Vec<(SpanIdx, u64)>,
    /// `(system call label, ns)`: the system calls of the request's own
    /// threads over its path (what it waited in while the path was on
    /// other threads), largest first (see [`syscall_label`]).
    pub by_syscall: Vec<(String, u64)>,
    /// Some piece overlapped lost events.
    pub lost: bool,
}

/// Summarizes one request's path.
pub fn summarize(model: &KernelModel, arch: Arch, path: &RequestPath) -> RequestSummary {
    type Key = (EdgeType, Option<Tid>, Option<Comm>, Option<SpanIdx>);
    let mut by_state: FxHashMap<Key, (u64, u64, u64, u64)> = FxHashMap::default();
    let mut by_blocking: FxHashMap<SpanIdx, u64> = FxHashMap::default();
    // Summed per label key first: a label is made once per distinct call,
    // not once per piece.
    let mut by_call: FxHashMap<SyscallLabelKey, (SyscallInterval, u64)> = FxHashMap::default();
    let mut out = RequestSummary::default();
    for p in &path.pieces {
        let d = p.duration();
        out.total_ns += d;
        out.lost |= p.lost;
        let e = by_state
            .entry((p.state, p.tid, p.comm, p.blocked_by))
            .or_default();
        e.0 += d;
        if let Some(w) = p.cpu_wait {
            e.1 += w.throttled_ns;
            e.2 += w.contended_ns;
            e.3 += w.wakeup_ns;
        }
        if let Some(b) = p.blocked_by {
            *by_blocking.entry(b).or_default() += d;
        }
        let own = match p.waiting_in {
            Some(w) => Some(w),
            None if path.home.iter().any(|h| Some(h.tid) == p.tid) => p.syscall,
            None => None,
        };
        if let Some(s) = own {
            by_call.entry(SyscallLabelKey::of(&s)).or_insert((s, 0)).1 += d;
        }
    }
    // Different keys can read the same (a call whose argument the label
    // does not show).
    let mut by_syscall: HashMap<String, u64> = HashMap::new();
    for (s, d) in by_call.into_values() {
        *by_syscall
            .entry(syscall_label(model, arch, &s))
            .or_default() += d;
    }
    out.by_state = by_state
        .into_iter()
        .map(
            |((state, tid, comm, blocked_by), (ns, t, c, w))| SummaryRow {
                state,
                tid,
                comm,
                blocked_by,
                ns,
                throttled_ns: t,
                contended_ns: c,
                wakeup_ns: w,
            },
        )
        .collect();
    out.by_state.sort_by(|a, b| {
        b.ns.cmp(&a.ns)
            .then(a.state.cmp(&b.state))
            .then(a.tid.cmp(&b.tid))
            .then(a.blocked_by.cmp(&b.blocked_by))
            .then(
                a.comm
                    .map(|c| c.as_bytes().to_vec())
                    .cmp(&b.comm.map(|c| c.as_bytes().to_vec())),
            )
    });
    out.by_blocking = by_blocking.into_iter().collect();
    out.by_blocking
        .sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.by_syscall = by_syscall.into_iter().collect();
    out.by_syscall
        .sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

/// A request's time as people read it: its own time per (state, thread),
/// and the time it spent for other requests grouped by what those requests
/// were (their `[service] operation`, the caller's key), with a count:
/// "5 requests of [pricing] GET /price", not five lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CauseGroup<K> {
    /// The blocking requests' key; `None` for the request's own time (then
    /// `parts` is its one row).
    pub blocked_by: Option<K>,
    /// The blocking requests of the group, most time first.
    pub requests: Vec<(SpanIdx, u64)>,
    pub ns: u64,
    /// The group's time per (state, thread), largest first (the blocking
    /// requests' rows summed; `blocked_by` is left as the largest one's).
    pub parts: Vec<SummaryRow>,
}

/// Groups a request summary's rows (see [`CauseGroup`]); `key` names a
/// blocking request's group. Largest first.
pub fn group_causes<K: Eq + Clone + Ord>(
    summary: &RequestSummary,
    key: impl Fn(SpanIdx) -> K,
) -> Vec<CauseGroup<K>> {
    let mut out: Vec<CauseGroup<K>> = Vec::new();
    for row in &summary.by_state {
        let Some(b) = row.blocked_by else {
            out.push(CauseGroup {
                blocked_by: None,
                requests: Vec::new(),
                ns: row.ns,
                parts: vec![row.clone()],
            });
            continue;
        };
        let k = key(b);
        let i = match out.iter().position(|g| g.blocked_by.as_ref() == Some(&k)) {
            Some(i) => i,
            None => {
                out.push(CauseGroup {
                    blocked_by: Some(k),
                    requests: Vec::new(),
                    ns: 0,
                    parts: Vec::new(),
                });
                out.len() - 1
            }
        };
        let g = &mut out[i];
        g.ns += row.ns;
        match g.requests.iter_mut().find(|r| r.0 == b) {
            Some(r) => r.1 += row.ns,
            None => g.requests.push((b, row.ns)),
        }
        match g
            .parts
            .iter_mut()
            .find(|p| p.state == row.state && p.tid == row.tid && p.comm == row.comm)
        {
            Some(p) => {
                p.ns += row.ns;
                p.throttled_ns += row.throttled_ns;
                p.contended_ns += row.contended_ns;
                p.wakeup_ns += row.wakeup_ns;
            }
            None => g.parts.push(row.clone()),
        }
    }
    for g in &mut out {
        g.requests.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        g.parts.sort_by(|a, b| {
            b.ns.cmp(&a.ns)
                .then(a.state.cmp(&b.state))
                .then(a.tid.cmp(&b.tid))
        });
    }
    // Stable: equal times keep the summary's order.
    out.sort_by_key(|item| std::cmp::Reverse(item.ns));
    out
}

/// Time of an operation's requests in one (state, thread name, blocked or
/// not), summed over the requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRow {
    pub state: EdgeType,
    /// Threads are told apart by name: each request has its own tids.
    pub comm: Option<Comm>,
    /// Time the requests were blocked by other requests.
    pub blocked: bool,
    pub ns: u64,
    pub throttled_ns: u64,
    pub contended_ns: u64,
}

/// All requests of one operation (the caller's grouping key, usually
/// `[service] operation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationSummary<K> {
    pub key: K,
    pub requests: usize,
    /// Sum and maximum of the requests' durations.
    pub total_ns: u64,
    pub max_ns: u64,
    /// Largest first.
    pub rows: Vec<OperationRow>,
}

/// Aggregates request summaries per operation: each request's path (its
/// pieces are not needed) with its summary; `key` names its operation.
/// Operations come out slowest (largest total) first.
pub fn aggregate<'a, K: Hash + Eq + Clone + Ord>(
    requests: impl IntoIterator<Item = (&'a RequestPath, &'a RequestSummary)>,
    key: impl Fn(SpanIdx) -> K,
) -> Vec<OperationSummary<K>> {
    type RowKey = (EdgeType, Option<Comm>, bool);
    /// (requests, total ns, max ns, (ns, throttled, contended) per row)
    type Op = (usize, u64, u64, HashMap<RowKey, (u64, u64, u64)>);
    let mut ops: HashMap<K, Op> = HashMap::new();
    for (path, summary) in requests {
        let op = ops.entry(key(path.request)).or_default();
        op.0 += 1;
        op.1 += path.duration();
        op.2 = op.2.max(path.duration());
        for r in &summary.by_state {
            let e =
                op.3.entry((r.state, r.comm, r.blocked_by.is_some()))
                    .or_default();
            e.0 += r.ns;
            e.1 += r.throttled_ns;
            e.2 += r.contended_ns;
        }
    }
    let mut out: Vec<OperationSummary<K>> = ops
        .into_iter()
        .map(|(key, (requests, total_ns, max_ns, rows))| {
            let mut rows: Vec<OperationRow> = rows
                .into_iter()
                .map(|((state, comm, blocked), (ns, t, c))| OperationRow {
                    state,
                    comm,
                    blocked,
                    ns,
                    throttled_ns: t,
                    contended_ns: c,
                })
                .collect();
            rows.sort_by(|a, b| {
                b.ns.cmp(&a.ns)
                    .then(a.state.cmp(&b.state))
                    .then(a.blocked.cmp(&b.blocked))
                    .then(
                        a.comm
                            .map(|c| c.as_bytes().to_vec())
                            .cmp(&b.comm.map(|c| c.as_bytes().to_vec())),
                    )
            });
            OperationSummary {
                key,
                requests,
                total_ns,
                max_ns,
                rows,
            }
        })
        .collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.key.cmp(&b.key)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: EdgeType, tid: Tid, blocked_by: Option<SpanIdx>, ns: u64) -> SummaryRow {
        SummaryRow {
            state,
            tid: Some(tid),
            comm: None,
            blocked_by,
            ns,
            throttled_ns: if state == EdgeType::Preempted { ns } else { 0 },
            contended_ns: 0,
            wakeup_ns: 0,
        }
    }

    #[test]
    fn blocking_requests_are_grouped_by_their_operation_with_a_count() {
        use EdgeType::*;
        // Requests 1, 2, 3 are "price", 4 is "stock".
        let summary = RequestSummary {
            total_ns: 1000,
            by_state: vec![
                row(Preempted, 9, Some(1), 300),
                row(Preempted, 9, Some(2), 250),
                row(Running, 7, None, 200),
                row(Preempted, 9, Some(3), 150),
                row(Running, 8, Some(4), 60),
                row(Running, 9, Some(1), 40),
            ],
            ..RequestSummary::default()
        };
        let groups = group_causes(&summary, |r| if r == 4 { "stock" } else { "price" });
        assert_eq!(groups.len(), 3);
        let price = &groups[0];
        assert_eq!(price.blocked_by, Some("price"));
        assert_eq!(price.ns, 740);
        assert_eq!(price.requests, vec![(1, 340), (2, 250), (3, 150)]);
        // Parts per (state, thread), summed over the requests.
        assert_eq!(price.parts.len(), 2);
        assert_eq!((price.parts[0].state, price.parts[0].ns), (Preempted, 700));
        assert_eq!(price.parts[0].throttled_ns, 700);
        assert_eq!((price.parts[1].state, price.parts[1].ns), (Running, 40));
        // The request's own time stays one group per row.
        assert_eq!((groups[1].blocked_by, groups[1].ns), (None, 200));
        assert_eq!(groups[2].blocked_by, Some("stock"));
        assert_eq!(groups[2].requests, vec![(4, 60)]);
    }
}
