//! CRISP's semantics (Zhang et al., "CRISP: Critical Path Analysis of
//! Large-Scale Microservice Architectures", USENIX ATC '22, and its code,
//! uber-research/CRISP), for users who compare deepspan's span-level figures
//! with CRISP's. Rules, as CRISP applies them (rewritten here, not copied):
//!
//! 1. **Overflowing children.** Walking down from the root, a child that is
//!    the server side of an RPC (the only child of a CLIENT span; or the
//!    only child of a non-server span whose own parent is a SERVER; or the
//!    only child of a span on another host) and at most
//!    `server_lengthening_factor` (1.01) times as long as its parent is kept
//!    where it is, its *duration* capped at the parent's (its end is left as
//!    it was). Any other child that starts before its parent is cut at the
//!    parent's start (duration shortened, end kept), one that ends after it
//!    is cut at the parent's end, and one wholly outside it is dropped with
//!    its subtree.
//! 2. **Critical path.** A span is on it; then its last-finishing child
//!    (children sorted by end time, ties: the later in the trace first) and,
//!    going back in end order, every child that *happens before* the one
//!    last added: it ends strictly before that one starts, or it starts
//!    earlier, ends earlier and overlaps it by less than `overlap_allowance`
//!    (1 %) of the parent's duration with no other child starting or ending
//!    in the overlap. Each child added is walked the same way.
//! 3. **Exclusive time.** Per call path (`[s] a->[s] b`), every span on the
//!    path adds its duration, and takes it off its parent's call path;
//!    negative totals (overlapping or capped children) are set to 0. Per
//!    operation, the call paths ending in it are summed.
//! 4. **Error figures.** A span *errs* when a tag `error` is a string or
//!    true, `http.status_code` ≥ 400, `grpc.status` is set and not `OK`, a
//!    log has `error.object`, a string `error`, or `event` = `error`; and
//!    (OTLP) when its status is ERROR. *Total work* is the sum of the
//!    durations of the spans kept in step 1, and *time saved on work* the sum
//!    of those of the erring spans (the work an early error return would
//!    have saved).
//!
//! Times are the input's (ns here; CRISP's Jaeger input is in µs). Each root
//! of a trace (a span without a parent in it) is analysed on its own, as
//! CRISP does with `--mergeAllRoots`. Not reproduced: CRISP's time saved on
//! the critical path (its parallel-block simulation) and its error critical
//! path.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::critical_path::Trace;
use crate::model::{Span, SpanKind, StatusCode, Value};

/// CRISP's two tolerances.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrispOptions {
    /// Overlap between consecutive children still taken as happens-before,
    /// as a fraction of the parent's duration (CRISP: 0.01).
    pub overlap_allowance: f64,
    /// How much longer than its client a server span may be and still be
    /// kept whole (CRISP: 1.01).
    pub server_lengthening_factor: f64,
}

impl Default for CrispOptions {
    fn default() -> Self {
        CrispOptions {
            overlap_allowance: 0.01,
            server_lengthening_factor: 1.01,
        }
    }
}

/// One root's figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CrispRoot {
    pub trace_id: String,
    pub root_span_id: String,
    /// `[service] operation` of the root.
    pub root: String,
    /// Span ids on the critical path, in CRISP's order (depth first).
    pub critical_path: Vec<String>,
    /// Exclusive critical-path time per `[service] operation`.
    pub op_time_exclusive_ns: BTreeMap<String, u64>,
    /// Exclusive critical-path time per call path (`[s] a->[s] b`).
    pub call_path_exclusive_ns: BTreeMap<String, u64>,
    pub total_work_ns: u64,
    pub time_saved_on_work_ns: u64,
    /// Children cut to their parent, and dropped (with their subtrees).
    pub shrunk_children: usize,
    pub dropped_children: usize,
}

/// Every root of every trace, and the sums over them.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CrispReport {
    pub roots: Vec<CrispRoot>,
    pub op_time_exclusive_ns: BTreeMap<String, u64>,
    pub total_work_ns: u64,
    pub time_saved_on_work_ns: u64,
}

struct Node {
    span: usize,
    start: i64,
    duration: i64,
    end: i64,
    parent: Option<usize>,
    children: Vec<usize>,
    kind: SpanKind,
    host: Option<String>,
    label: String,
    errs: bool,
}

/// Whether a span errs, by CRISP's rules (plus the OTLP status).
pub fn span_errs(span: &Span) -> bool {
    if span.status.code == StatusCode::Error {
        return true;
    }
    for (key, value) in span.attributes.iter() {
        match (key.to_ascii_lowercase().as_str(), value) {
            ("error", Value::String(_)) => return true,
            ("error", Value::Bool(b)) if *b => return true,
            ("error", Value::Int(i)) if *i != 0 => return true,
            ("http.status_code", v) if v.as_i64().is_some_and(|c| c >= 400) => return true,
            ("grpc.status", Value::String(s)) if !s.is_empty() && s != "OK" => return true,
            ("grpc.status", Value::Int(i)) if *i != 0 => return true,
            _ => {}
        }
    }
    span.events.iter().any(|e| {
        e.name.eq_ignore_ascii_case("error")
            || e.attributes.iter().any(|(k, v)| {
                let k = k.to_ascii_lowercase();
                k == "error.object" || (k == "error" && matches!(v, Value::String(_)))
            })
    })
}

fn host_of(span: &Span) -> Option<String> {
    let r = &span.resource.attributes;
    r.get("hostname")
        .or_else(|| r.get("host.name"))
        .map(|v| v.to_string())
}

struct Tree<'a> {
    nodes: Vec<Node>,
    spans: &'a [Span],
    options: CrispOptions,
    shrunk: usize,
    dropped: usize,
}

impl Tree<'_> {
    fn acceptable_length(&self, parent: usize, me: usize) -> bool {
        self.nodes[me].duration as f64
            <= self.options.server_lengthening_factor * self.nodes[parent].duration as f64
    }

    /// CRISP's `isClientServerCall`: caps the child's duration when true.
    fn client_server_call(&mut self, parent: usize, me: usize) -> bool {
        let (p, m) = (&self.nodes[parent], &self.nodes[me]);
        let only_child = p.children.len() == 1;
        let clean = m.kind == SpanKind::Server && p.kind == SpanKind::Client && only_child;
        let fuzzy = m.kind == SpanKind::Server
            && p.kind != SpanKind::Server
            && only_child
            && p.parent
                .is_some_and(|g| self.nodes[g].kind == SpanKind::Server);
        let other_host = match (&p.host, &m.host) {
            (Some(a), Some(b)) => a != b && only_child,
            _ => false,
        };
        if (clean || fuzzy || other_host) && self.acceptable_length(parent, me) {
            let cap = self.nodes[parent].duration;
            let m = &mut self.nodes[me];
            m.duration = m.duration.min(cap);
            return true;
        }
        false
    }

    fn sanitize(&mut self, cur: usize) {
        let (ps, pe) = (self.nodes[cur].start, self.nodes[cur].end);
        let mut removed = Vec::new();
        for c in self.nodes[cur].children.clone() {
            let (cs, ce) = (self.nodes[c].start, self.nodes[c].end);
            if self.client_server_call(cur, c) || (cs >= ps && ce <= pe) {
                self.sanitize(c);
            } else if cs < ps && ce <= pe && ce > ps {
                let n = &mut self.nodes[c];
                n.duration -= ps - cs;
                n.start = ps;
                self.shrunk += 1;
                self.sanitize(c);
            } else if cs >= ps && ce > pe && cs < pe {
                let n = &mut self.nodes[c];
                n.duration -= ce - pe;
                n.end -= ce - pe;
                self.shrunk += 1;
                self.sanitize(c);
            } else {
                removed.push(c);
                self.dropped += 1;
            }
        }
        self.nodes[cur].children.retain(|c| !removed.contains(c));
        for c in removed {
            self.nodes[c].parent = None;
        }
    }

    fn sync_events(&self, children: &[usize], from: i64, to: i64) -> usize {
        children
            .iter()
            .map(|&c| {
                let n = &self.nodes[c];
                usize::from(n.start >= from && n.start <= to)
                    + usize::from(n.end >= from && n.end <= to)
            })
            .sum()
    }

    fn happens_before(
        &self,
        parent: usize,
        children: &[usize],
        before: usize,
        later: usize,
    ) -> bool {
        let (b, l) = (&self.nodes[before], &self.nodes[later]);
        if b.end < l.start {
            return true;
        }
        let parent_duration = self.nodes[parent].duration;
        parent_duration > 0
            && b.end < l.end
            && b.start < l.start
            && ((b.end - l.start) as f64 / parent_duration as f64) < self.options.overlap_allowance
            && self.sync_events(children, l.start, b.end) == 2
    }

    fn critical_path(&self, cur: usize, path: &mut Vec<usize>) {
        path.push(cur);
        let mut sorted = self.nodes[cur].children.clone();
        if sorted.is_empty() {
            return;
        }
        // A stable sort by end, reversed: equal ends, the later child first.
        sorted.sort_by_key(|&c| self.nodes[c].end);
        sorted.reverse();
        let mut last = sorted[0];
        self.critical_path(last, path);
        for &c in &sorted[1..] {
            if self.happens_before(cur, &sorted, c, last) {
                self.critical_path(c, path);
                last = c;
            }
        }
    }

    fn call_path(&self, mut n: usize) -> String {
        let mut parts = vec![self.nodes[n].label.as_str()];
        while let Some(p) = self.nodes[n].parent {
            parts.push(self.nodes[p].label.as_str());
            n = p;
        }
        parts.reverse();
        parts.join("->")
    }

    fn work(&self, n: usize) -> (i64, i64) {
        let node = &self.nodes[n];
        let mut total = node.duration;
        let mut saved = if node.errs { node.duration } else { 0 };
        for &c in &node.children {
            let (t, s) = self.work(c);
            total += t;
            saved += s;
        }
        (total, saved)
    }
}

fn label(span: &Span) -> String {
    format!("[{}] {}", span.resource.service_name, span.name)
}

/// CRISP's figures for each root of one trace.
pub fn crisp_trace(trace: &Trace, options: CrispOptions) -> Vec<CrispRoot> {
    let spans = &trace.spans;
    let mut index: HashMap<u64, usize> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        // A repeated span id: the last copy, as CRISP's table keeps it.
        index.insert(s.span_id.0, i);
    }
    let mut kept: Vec<usize> = index.values().copied().collect();
    kept.sort_unstable();
    let mut node_of: HashMap<u64, usize> = HashMap::new();
    let mut nodes: Vec<Node> = Vec::with_capacity(kept.len());
    for &i in &kept {
        let s = &spans[i];
        let start = i64::try_from(s.start_ns).unwrap_or(i64::MAX);
        let duration = i64::try_from(s.end_ns - s.start_ns).unwrap_or(i64::MAX);
        node_of.insert(s.span_id.0, nodes.len());
        nodes.push(Node {
            span: i,
            start,
            duration,
            end: start.saturating_add(duration),
            parent: None,
            children: Vec::new(),
            kind: s.kind,
            host: host_of(s),
            label: label(s),
            errs: span_errs(s),
        });
    }
    let mut roots = Vec::new();
    for n in 0..nodes.len() {
        let parent = spans[nodes[n].span]
            .parent_span_id
            .and_then(|p| node_of.get(&p.0).copied())
            .filter(|&p| p != n);
        match parent {
            Some(p) => {
                nodes[n].parent = Some(p);
                nodes[p].children.push(n);
            }
            None => roots.push(n),
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let mut tree = Tree {
            nodes: std::mem::take(&mut nodes),
            spans,
            options,
            shrunk: 0,
            dropped: 0,
        };
        tree.sanitize(root);
        let mut path = Vec::new();
        tree.critical_path(root, &mut path);
        let mut by_call_path: BTreeMap<String, i64> = BTreeMap::new();
        for &n in path.iter().rev() {
            *by_call_path.entry(tree.call_path(n)).or_default() += tree.nodes[n].duration;
            if n != root {
                if let Some(p) = tree.nodes[n].parent {
                    *by_call_path.entry(tree.call_path(p)).or_default() -= tree.nodes[n].duration;
                }
            }
        }
        let call_path_exclusive_ns: BTreeMap<String, u64> = by_call_path
            .into_iter()
            .map(|(k, v)| (k, v.max(0) as u64))
            .collect();
        let mut op_time_exclusive_ns: BTreeMap<String, u64> = BTreeMap::new();
        for (call_path, ns) in &call_path_exclusive_ns {
            let leaf = call_path.rsplit("->").next().unwrap_or(call_path);
            *op_time_exclusive_ns.entry(leaf.to_string()).or_default() += ns;
        }
        let (total, saved) = tree.work(root);
        out.push(CrispRoot {
            trace_id: trace.trace_id.to_string(),
            root_span_id: tree.spans[tree.nodes[root].span].span_id.to_string(),
            root: tree.nodes[root].label.clone(),
            critical_path: path
                .iter()
                .map(|&n| tree.spans[tree.nodes[n].span].span_id.to_string())
                .collect(),
            op_time_exclusive_ns,
            call_path_exclusive_ns,
            total_work_ns: total.max(0) as u64,
            time_saved_on_work_ns: saved.max(0) as u64,
            shrunk_children: tree.shrunk,
            dropped_children: tree.dropped,
        });
        nodes = tree.nodes;
    }
    out
}

/// CRISP's figures for every root of every trace, summed.
pub fn crisp_report(traces: &[Trace], options: CrispOptions) -> CrispReport {
    let mut report = CrispReport {
        roots: Vec::new(),
        op_time_exclusive_ns: BTreeMap::new(),
        total_work_ns: 0,
        time_saved_on_work_ns: 0,
    };
    for trace in traces {
        for root in crisp_trace(trace, options) {
            for (op, ns) in &root.op_time_exclusive_ns {
                *report.op_time_exclusive_ns.entry(op.clone()).or_default() += ns;
            }
            report.total_work_ns += root.total_work_ns;
            report.time_saved_on_work_ns += root.time_saved_on_work_ns;
            report.roots.push(root);
        }
    }
    report
}
