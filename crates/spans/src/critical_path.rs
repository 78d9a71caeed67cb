//! Span-level critical path of a trace, and per-operation time statistics.
//!
//! The walk is Jaeger UI's (`TracePage/CriticalPath`), step for step, so
//! its test cases give the same sections in the same order:
//! 1. from each root span (no parent, or parent not in the trace — Jaeger UI
//!    drops such orphan roots, deepspan keeps them: partial traces are common);
//! 2. keep only *blocking* children: not PRODUCER → CONSUMER (current Jaeger
//!    UI) and not FOLLOWS_FROM (older Jaeger UI; OTLP has no equivalent);
//! 3. clip children to their (already clipped) parent; drop children wholly
//!    outside it, with their subtrees;
//! 4. walk back from the end of the root: the span is on the path from its
//!    last-finishing child's end to the current limit, then that child is
//!    walked; when a span has no child finishing before the limit, the span
//!    is on the path back to its own start and the walk returns to its
//!    parent, with the limit set to that span's start.
//!
//! Clock skew, two remedies, both on by default and both off in
//! [`CriticalPathOptions::jaeger_ui`]:
//! - *host skew adjustment* (Zipkin's and jaeger-query's adjusters): a child
//!   on another host that does not fit in its parent but is not longer than
//!   it is shifted to the middle of the parent, with its same-host subtree;
//! - *CRISP's happens-before allowance*: when walking back, a sibling that
//!   overlaps the child just walked by less than `overlap_allowance` of the
//!   parent's duration (default 1 %, CRISP's) still counts as finishing
//!   before it, provided no other sibling starts or ends in the overlap
//!   (CRISP's "exactly two sync events" test). Its sections are then clipped
//!   at the start of the later sibling, so sections never overlap.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::model::{Span, SpanId, SpanKind, TraceId};

/// The spans of one trace.
#[derive(Clone, Debug)]
pub struct Trace {
    pub trace_id: TraceId,
    pub spans: Vec<Span>,
}

/// Groups spans by trace id, traces in order of first appearance.
pub fn group_traces(spans: impl IntoIterator<Item = Span>) -> Vec<Trace> {
    let mut index: HashMap<TraceId, usize> = HashMap::new();
    let mut traces: Vec<Trace> = Vec::new();
    for s in spans {
        let i = *index.entry(s.trace_id).or_insert_with(|| {
            traces.push(Trace {
                trace_id: s.trace_id,
                spans: Vec::new(),
            });
            traces.len() - 1
        });
        traces[i].spans.push(s);
    }
    traces
}

/// How to compute the critical path; see the module doc.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CriticalPathOptions {
    /// CRISP's overlap allowance, a fraction of the parent's duration; 0 disables.
    pub overlap_allowance: f64,
    /// Shift children on other hosts into their parents when skew puts them outside.
    pub adjust_clock_skew: bool,
}

impl Default for CriticalPathOptions {
    fn default() -> Self {
        CriticalPathOptions {
            overlap_allowance: 0.01,
            adjust_clock_skew: true,
        }
    }
}

impl CriticalPathOptions {
    /// Exactly Jaeger UI: no skew handling beyond its clipping.
    pub fn jaeger_ui() -> Self {
        CriticalPathOptions {
            overlap_allowance: 0.0,
            adjust_clock_skew: false,
        }
    }
}

/// A piece of the critical path: `span_id` is on the path during
/// `[start_ns, end_ns)` (wall clock ns, after skew adjustment if any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    pub span_id: SpanId,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// `[service] operation`, the key of every per-operation statistic.
pub fn operation_key(span: &Span) -> String {
    format!("[{}] {}", span.service_name(), span.name)
}

/// The structure shared by the critical path and the statistics: id index,
/// children in start order, roots in start order.
struct Tree {
    children: Vec<Vec<usize>>,
    parent: Vec<Option<usize>>,
    roots: Vec<usize>,
}

fn build_tree(spans: &[Span], start: &[u64]) -> Tree {
    let mut by_id: HashMap<SpanId, usize> = HashMap::with_capacity(spans.len());
    for (i, s) in spans.iter().enumerate() {
        // A duplicated id keeps its first span; the others become roots of their own.
        by_id.entry(s.span_id).or_insert(i);
    }
    let mut children = vec![Vec::new(); spans.len()];
    let mut parent = vec![None; spans.len()];
    let mut roots = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        match s
            .parent_span_id
            .and_then(|p| by_id.get(&p))
            .copied()
            .filter(|&p| p != i && by_id.get(&s.span_id) == Some(&i))
        {
            Some(p) => {
                children[p].push(i);
                parent[i] = Some(p);
            }
            None => roots.push(i),
        }
    }
    // Jaeger UI's tree: children (and roots) in start order, stable.
    for c in &mut children {
        c.sort_by_key(|&i| start[i]);
    }
    roots.sort_by_key(|&i| start[i]);
    // A parent cycle (malformed input) leaves spans unreachable from any root; they are ignored.
    Tree {
        children,
        parent,
        roots,
    }
}

/// Span times after the optional host skew adjustment.
fn effective_times(spans: &[Span], tree: &Tree, adjust: bool) -> (Vec<u64>, Vec<u64>) {
    let mut start: Vec<u64> = spans.iter().map(|s| s.start_ns).collect();
    let mut end: Vec<u64> = spans.iter().map(|s| s.end_ns).collect();
    if !adjust {
        return (start, end);
    }
    let host: Vec<String> = spans.iter().map(host_key).collect();
    // Top-down so a shifted parent carries its same-host children along.
    let mut shift = vec![0i128; spans.len()];
    let mut stack: Vec<usize> = tree.roots.iter().rev().copied().collect();
    let mut seen = vec![false; spans.len()];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        if let Some(p) = tree.parent[i] {
            let (ps, pe) = (start[p], end[p]); // already adjusted
            if host[i] == host[p] {
                shift[i] = shift[p];
            } else {
                let (cs, ce) = (
                    spans[i].start_ns as i128 + shift[p],
                    spans[i].end_ns as i128 + shift[p],
                );
                let (cd, pd) = (ce - cs, (pe - ps) as i128);
                shift[i] = shift[p];
                if (cs < ps as i128 || ce > pe as i128) && cd <= pd {
                    let latency = (pd - cd) / 2;
                    shift[i] += ps as i128 + latency - cs;
                }
            }
            // Clamped to the u64 range both ways, so a shift never reorders start and end.
            let shifted = |t: u64| (t as i128 + shift[i]).clamp(0, u64::MAX as i128) as u64;
            start[i] = shifted(spans[i].start_ns);
            end[i] = shifted(spans[i].end_ns);
        }
        stack.extend(tree.children[i].iter().rev());
    }
    (start, end)
}

/// What identifies a host, best first: `host.name`/`host.id` resource
/// attributes, the span's local IP (Zipkin import), else the service.
fn host_key(s: &Span) -> String {
    for k in ["host.name", "host.id", "hostname", "ip"] {
        if let Some(v) = s.resource.attributes.get(k) {
            return format!("{k}={v}");
        }
    }
    if let Some(v) = s.attributes.get("net.host.ip") {
        return format!("ip={v}");
    }
    format!("service={}", s.service_name())
}

/// The critical path sections of a trace, in Jaeger UI's emission order
/// (backwards from the end of each root; roots in start order).
pub fn critical_path(trace: &Trace, opts: CriticalPathOptions) -> Vec<Section> {
    let spans = &trace.spans;
    let raw_start: Vec<u64> = spans.iter().map(|s| s.start_ns).collect();
    let tree = build_tree(spans, &raw_start);
    let (start, end) = effective_times(spans, &tree, opts.adjust_clock_skew);
    let mut sections = Vec::new();
    for &root in &tree.roots {
        walk_root(spans, &tree, &start, &end, root, opts, &mut sections);
    }
    sections
}

fn is_blocking(parent: &Span, child: &Span) -> bool {
    let producer_consumer = parent.kind == SpanKind::Producer && child.kind == SpanKind::Consumer;
    !producer_consumer && !child.follows_from_parent()
}

fn walk_root(
    spans: &[Span],
    tree: &Tree,
    start: &[u64],
    end: &[u64],
    root: usize,
    opts: CriticalPathOptions,
    out: &mut Vec<Section>,
) {
    // 1-2: the blocking subtree in DFS order (Jaeger's createCPSpanMap), with clipped times (3).
    let n = spans.len();
    let mut in_map = vec![false; n];
    let mut cs = start.to_vec();
    let mut ce = end.to_vec();
    let mut kids: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut order = Vec::new();
    let mut stack = vec![root];
    while let Some(i) = stack.pop() {
        if in_map[i] {
            continue;
        }
        in_map[i] = true;
        order.push(i);
        let blocking: Vec<usize> = tree.children[i]
            .iter()
            .copied()
            .filter(|&c| is_blocking(&spans[i], &spans[c]))
            .collect();
        stack.extend(blocking.iter().rev());
        kids.insert(i, blocking);
    }
    for &i in &order {
        if i == root {
            continue;
        }
        let p = tree.parent[i].expect("non-root span in the map has a parent");
        if !in_map[p] {
            in_map[i] = false; // parent dropped: drop the subtree
            continue;
        }
        let (ps, pe) = (cs[p], ce[p]);
        let (s, e) = (cs[i], ce[i]);
        if s >= ps {
            if s >= pe {
                in_map[i] = false;
            } else if e > pe {
                ce[i] = pe;
            }
        } else if e <= ps {
            in_map[i] = false;
        } else {
            cs[i] = ps;
            ce[i] = e.min(pe);
        }
    }
    let children = |i: usize| {
        kids.get(&i)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&c| in_map[c])
    };

    // 4: the walk, iterative (deep traces must not overflow the stack).
    let mut cur = root;
    let mut returning: Option<usize> = None; // child we came back from
    let mut caps: Vec<(usize, u64)> = Vec::new(); // (span where a CRISP clip was set, clip)
    loop {
        let cap = caps.last().map(|c| c.1);
        let limit = returning.map(|r| cs[r]).unwrap_or(ce[cur]);
        let mut lfc: Option<usize> = None;
        for c in children(cur) {
            let ok = match returning {
                None => true,
                Some(_) => ce[c] < limit,
            };
            if ok && lfc.is_none_or(|b| ce[c] > ce[b]) {
                lfc = Some(c);
            }
        }
        let mut tolerated = false;
        if let (Some(r), true) = (returning, opts.overlap_allowance > 0.0) {
            let pdur = ce[cur].saturating_sub(cs[cur]);
            for c in children(cur) {
                if c == r || ce[c] < limit || lfc.is_some_and(|b| ce[c] <= ce[b]) {
                    continue;
                }
                if ce[c] < ce[r]
                    && cs[c] < cs[r]
                    && pdur > 0
                    && ((ce[c] - cs[r]) as f64 / pdur as f64) < opts.overlap_allowance
                {
                    let events = children(cur)
                        .map(|x| {
                            (cs[x] >= cs[r] && cs[x] <= ce[c]) as u32
                                + (ce[x] >= cs[r] && ce[x] <= ce[c]) as u32
                        })
                        .sum::<u32>();
                    if events == 2 {
                        lfc = Some(c);
                        tolerated = true;
                    }
                }
            }
        }
        let push = |out: &mut Vec<Section>, i: usize, s: u64, e: u64| {
            let e = cap.map_or(e, |c| e.min(c));
            // Jaeger pushes when start != end; clipping can only shorten, so keep start < end.
            if s < e {
                out.push(Section {
                    span_id: spans[i].span_id,
                    start_ns: s,
                    end_ns: e,
                });
            }
        };
        match lfc {
            Some(c) => {
                push(out, cur, ce[c], limit);
                if tolerated {
                    caps.push((cur, limit.min(cap.unwrap_or(u64::MAX))));
                }
                cur = c;
                returning = None;
            }
            None => {
                push(out, cur, cs[cur], limit);
                if cur == root {
                    break;
                }
                let p = tree.parent[cur].expect("non-root has a parent");
                if caps.last().is_some_and(|c| c.0 == p) {
                    caps.pop();
                }
                returning = Some(cur);
                cur = p;
            }
        }
    }
}

/// One trace's part of a [`CriticalPathReport`].
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TraceCriticalPath {
    /// 32 hex digits.
    pub trace_id: String,
    pub sections: Vec<SectionOut>,
    /// Time on the critical path per `[service] operation`.
    pub exclusive_ns: BTreeMap<String, u64>,
}

/// A [`Section`] as reported (span id as 16 hex digits).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SectionOut {
    pub span_id: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Critical paths of many traces and where their time went, CRISP-style:
/// exclusive (on-path) time per `[service] operation`, per trace and summed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CriticalPathReport {
    pub traces: Vec<TraceCriticalPath>,
    pub aggregate_exclusive_ns: BTreeMap<String, u64>,
}

/// [`critical_path_report_with`] with the default (skew tolerant) options.
pub fn critical_path_report(traces: &[Trace]) -> CriticalPathReport {
    critical_path_report_with(traces, CriticalPathOptions::default())
}

/// Critical path and exclusive time per operation for every trace.
pub fn critical_path_report_with(
    traces: &[Trace],
    opts: CriticalPathOptions,
) -> CriticalPathReport {
    let mut report = CriticalPathReport {
        traces: Vec::with_capacity(traces.len()),
        aggregate_exclusive_ns: BTreeMap::new(),
    };
    for t in traces {
        let by_id: HashMap<SpanId, &Span> = t.spans.iter().rev().map(|s| (s.span_id, s)).collect();
        let sections = critical_path(t, opts);
        let mut exclusive: BTreeMap<String, u64> = BTreeMap::new();
        for s in &sections {
            let key = by_id
                .get(&s.span_id)
                .map(|sp| operation_key(sp))
                .unwrap_or_default();
            *exclusive.entry(key.clone()).or_default() += s.end_ns - s.start_ns;
            *report.aggregate_exclusive_ns.entry(key).or_default() += s.end_ns - s.start_ns;
        }
        report.traces.push(TraceCriticalPath {
            trace_id: t.trace_id.to_string(),
            sections: sections
                .iter()
                .map(|s| SectionOut {
                    span_id: s.span_id.to_string(),
                    start_ns: s.start_ns,
                    end_ns: s.end_ns,
                })
                .collect(),
            exclusive_ns: exclusive,
        });
    }
    report
}

/// Self time of each span of a trace: its duration minus the union of its
/// children's intervals clipped to it (children of every kind, as Jaeger UI's
/// trace statistics count them). Indexed like `trace.spans`.
pub fn self_times(trace: &Trace) -> Vec<u64> {
    let spans = &trace.spans;
    let start: Vec<u64> = spans.iter().map(|s| s.start_ns).collect();
    let tree = build_tree(spans, &start);
    spans
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut covered = 0u64;
            let mut reach = s.start_ns; // children are in start order
            for &c in &tree.children[i] {
                let (cs, ce) = (spans[c].start_ns.max(reach), spans[c].end_ns.min(s.end_ns));
                if ce > cs {
                    covered += ce - cs;
                    reach = ce;
                }
            }
            s.duration_ns() - covered.min(s.duration_ns())
        })
        .collect()
}

/// Duration and self-time statistics of one group of spans.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct TimeStats {
    pub key: String,
    pub count: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub self_total_ns: u64,
    pub self_min_ns: u64,
    pub self_max_ns: u64,
}

/// Duration and self-time statistics grouped by `key` (spans for which it
/// gives `None` are left out), rows in order of first occurrence walking each
/// trace as Jaeger UI lists it (roots then children, in start order). Use
/// [`operation_key`] for per-`[service] operation` rows.
pub fn self_time_stats(traces: &[Trace], key: impl Fn(&Span) -> Option<String>) -> Vec<TimeStats> {
    let mut rows: Vec<TimeStats> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for t in traces {
        let selfs = self_times(t);
        let start: Vec<u64> = t.spans.iter().map(|s| s.start_ns).collect();
        let tree = build_tree(&t.spans, &start);
        let mut stack: Vec<usize> = tree.roots.iter().rev().copied().collect();
        let mut seen = vec![false; t.spans.len()];
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            stack.extend(tree.children[i].iter().rev());
            let s = &t.spans[i];
            let Some(k) = key(s) else { continue };
            let r = *index.entry(k.clone()).or_insert_with(|| {
                rows.push(TimeStats {
                    key: k,
                    min_ns: u64::MAX,
                    self_min_ns: u64::MAX,
                    ..Default::default()
                });
                rows.len() - 1
            });
            let row = &mut rows[r];
            let d = s.duration_ns();
            row.count += 1;
            row.total_ns += d;
            row.min_ns = row.min_ns.min(d);
            row.max_ns = row.max_ns.max(d);
            row.self_total_ns += selfs[i];
            row.self_min_ns = row.self_min_ns.min(selfs[i]);
            row.self_max_ns = row.self_max_ns.max(selfs[i]);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Attributes, Resource, Value};

    fn on_host(mut span: Span, host: &str) -> Span {
        span.resource = Arc::new(Resource::new(Attributes(vec![(
            "host.name".into(),
            Value::String(host.into()),
        )])));
        span
    }

    /// A skew shift towards the end of the u64 range used to wrap a span's
    /// end past zero (end before start), which put sections far outside the
    /// root. Clamped, every section stays within the root.
    #[test]
    fn a_skew_shift_near_the_end_of_time_keeps_sections_in_the_root() {
        let t = TraceId(1);
        let top = u64::MAX;
        let spans = vec![
            on_host(Span::new(t, SpanId(1), None, "r", top - 100, top - 1), "a"),
            // Another host, outside its parent: shifted by about 2^64.
            on_host(Span::new(t, SpanId(2), Some(SpanId(1)), "c", 0, 50), "b"),
            // Same host as c: shifted alike; its end would pass u64::MAX.
            on_host(Span::new(t, SpanId(3), Some(SpanId(2)), "g", 0, 100), "b"),
            on_host(Span::new(t, SpanId(4), Some(SpanId(3)), "k", 10, 20), "c"),
        ];
        let trace = Trace { trace_id: t, spans };
        let sections = critical_path(&trace, CriticalPathOptions::default());
        assert!(!sections.is_empty());
        for s in &sections {
            assert!(
                s.start_ns < s.end_ns && s.start_ns >= top - 100 && s.end_ns < top,
                "{s:?}"
            );
        }
    }
}
