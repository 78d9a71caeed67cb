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
//!    have saved). *Time saved on the critical path* is how much earlier
//!    the root would end if erring spans returned at once: an erring span
//!    saves its whole duration; a span's children form parallel blocks
//!    (children overlapping transitively), and each block saves what its
//!    longest chain of spans in series saves, the gaps between them kept,
//!    less its overlap with the next block; a span saves at most its
//!    duration (CRISP's "all series" estimate).
//!
//! Times are the input's (ns here; CRISP's Jaeger input is in µs). Each root
//! of a trace (a span without a parent in it) is analysed on its own, as
//! CRISP does with `--mergeAllRoots`. Not reproduced: CRISP's pessimistic
//! and optimistic time-saved variants, its error critical path and error
//! depth statistics.

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
    /// How much shorter the root would be if erring spans returned at once,
    /// spans in series staying in series (CRISP's "all series").
    pub time_saved_on_cp_ns: u64,
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
    pub time_saved_on_cp_ns: u64,
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

    /// CRISP's "all series" time saved on the critical path if erring spans
    /// returned at once (`computeTimeSavedOnCPReal` with
    /// `ComputeAllSeriesTimeSavedForPBlock`): an erring span saves its whole
    /// duration; otherwise its children's parallel blocks each save what the
    /// longest chain of spans in series in them saves, with the gaps between
    /// them kept, less the block's overlap with the next one; at most the
    /// span's duration.
    fn time_saved_on_cp(&self, n: usize) -> i64 {
        let node = &self.nodes[n];
        if node.errs {
            return node.duration;
        }
        if node.children.is_empty() {
            return 0;
        }
        let saved: i64 = self
            .parallel_blocks(n)
            .iter()
            .map(|b| self.block_saved(b))
            .sum();
        saved.min(node.duration)
    }

    /// The children of `n` as parallel blocks, latest first: transitively
    /// overlapping children (by the happens-before above) share a block.
    fn parallel_blocks(&self, n: usize) -> Vec<Block> {
        let children = &self.nodes[n].children;
        let mut order = children.clone();
        // CRISP's heap order: end descending, then start, then span id.
        order.sort_by(|&a, &b| {
            let (x, y) = (&self.nodes[a], &self.nodes[b]);
            y.end
                .cmp(&x.end)
                .then(x.start.cmp(&y.start))
                .then(self.spans[x.span].span_id.cmp(&self.spans[y.span].span_id))
        });
        let mut blocks = Vec::new();
        let mut current = Block::new(n, order[0], &self.nodes, 0);
        for &c in &order[1..] {
            if self.happens_before(n, children, c, current.first) {
                let overlap = (self.nodes[c].end - current.start).max(0);
                let next = Block::new(n, c, &self.nodes, overlap);
                blocks.push(std::mem::replace(&mut current, next));
            } else {
                current.spans.push(c);
                if self.nodes[c].start < self.nodes[current.first].start {
                    current.first = c;
                    current.start = self.nodes[c].start;
                }
            }
        }
        blocks.push(current);
        blocks
    }

    /// The block's spans, latest end first (ties: the order added).
    fn by_end_descending(&self, block: &Block) -> Vec<usize> {
        let mut sorted = block.spans.clone();
        sorted.sort_by_key(|&c| self.nodes[c].end);
        sorted.reverse();
        sorted
    }

    fn block_saved(&self, block: &Block) -> i64 {
        let sorted = self.by_end_descending(block);
        // For each span, the spans directly before it in series (not through another).
        let mut before: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut in_flight: Vec<usize> = vec![sorted[0]];
        before.insert(sorted[0], Vec::new());
        let ends_before = |a: usize, b: usize| self.nodes[a].end <= self.nodes[b].start;
        for &s in &sorted[1..] {
            let mut finished = Vec::new();
            for &w in &in_flight {
                if !ends_before(s, w) {
                    continue;
                }
                let direct = &before[&w];
                if direct.is_empty() {
                    before.get_mut(&w).expect("present").push(s);
                    continue;
                }
                let in_series = direct.iter().filter(|&&d| ends_before(s, d)).count();
                if in_series == direct.len() {
                    finished.push(w);
                } else if in_series == 0 {
                    before.get_mut(&w).expect("present").push(s);
                }
            }
            in_flight.retain(|w| !finished.contains(w));
            in_flight.push(s);
            before.insert(s, Vec::new());
        }
        // The spans that may end the block: the last one and those parallel to it.
        let last = sorted[0];
        let mut candidates = vec![last];
        for &s in &sorted[1..] {
            if self.happens_before(block.parent, &sorted, s, last) {
                break;
            }
            candidates.push(s);
        }
        let mut cache: HashMap<usize, i64> = HashMap::new();
        let mut latest = i64::MIN;
        for &c in &candidates {
            let saved = self.chain_saved(block, &before, &mut cache, c);
            latest = latest.max(self.nodes[c].end - saved);
        }
        (block.end - latest - block.overlap).max(0)
    }

    /// How much earlier `n` ends when it and the spans before it in series
    /// save what they can (CRISP's `ComputeAllSeriesTimeSavedForNode`).
    fn chain_saved(
        &self,
        block: &Block,
        before: &HashMap<usize, Vec<usize>>,
        cache: &mut HashMap<usize, i64>,
        n: usize,
    ) -> i64 {
        if let Some(&v) = cache.get(&n) {
            return v;
        }
        let own = self.time_saved_on_cp(n);
        let node = &self.nodes[n];
        let mut gap = node.start - block.start;
        let mut latest_before = block.start;
        for &p in before.get(&n).map(Vec::as_slice).unwrap_or(&[]) {
            gap = gap.min(node.start - self.nodes[p].end).max(0);
            let saved = self.chain_saved(block, before, cache, p);
            latest_before = latest_before.max(self.nodes[p].end - saved);
        }
        let new_end = latest_before + gap + (node.duration - own);
        let saved = node.end - new_end;
        cache.insert(n, saved);
        saved
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

/// A parallel block: children of `parent` that overlap transitively.
struct Block {
    parent: usize,
    start: i64,
    end: i64,
    /// The earliest-starting span.
    first: usize,
    spans: Vec<usize>,
    /// How much the block overlaps the one after it.
    overlap: i64,
}

impl Block {
    fn new(parent: usize, node: usize, nodes: &[Node], overlap: i64) -> Block {
        Block {
            parent,
            start: nodes[node].start,
            end: nodes[node].end,
            first: node,
            spans: vec![node],
            overlap,
        }
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
        let saved_on_cp = tree.time_saved_on_cp(root);
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
            time_saved_on_cp_ns: saved_on_cp.max(0) as u64,
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
        time_saved_on_cp_ns: 0,
    };
    for trace in traces {
        for root in crisp_trace(trace, options) {
            for (op, ns) in &root.op_time_exclusive_ns {
                *report.op_time_exclusive_ns.entry(op.clone()).or_default() += ns;
            }
            report.total_work_ns += root.total_work_ns;
            report.time_saved_on_work_ns += root.time_saved_on_work_ns;
            report.time_saved_on_cp_ns += root.time_saved_on_cp_ns;
            report.roots.push(root);
        }
    }
    report
}
