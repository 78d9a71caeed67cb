//! A request's kernel critical path as OTLP: child spans of the request span
//! (its path, joined and folded; its long system calls), span events on the
//! request span (wake-up by another request, throttling start and end, lost
//! events) and the diagnosis attributes.
//!
//! Times: the analysis is on the recording host's CLOCK_MONOTONIC, spans are
//! on the wall clock. A request's monotonic start and end are mapped onto its
//! span's wall start and end, and its pieces linearly in between, so the
//! path tiles the span exactly. The two durations disagree by some
//! microseconds (an SDK reads the two clocks one after the other, at the
//! start and again at the end, and may be preempted in between); moved by
//! the start's offset alone, the path would end that much before or after
//! its span, and Jaeger's clock-skew adjuster moves a child that starts
//! before or ends after its parent. The monotonic times stay in the
//! children's attributes.

use std::collections::HashMap;
use std::sync::Arc;

use deepspan_model::container::Container;
use deepspan_spans::model::{Attributes, Event, Link, Scope, SpanKind, Status, SyncInfo, Value};
use deepspan_spans::{Span, SpanId, TraceId};
use deepspan_store::json::CulpritDoc;

use crate::analysis::{Piece, Queue, Request, RunAnalysis, Syscall};
use crate::attributes as a;

/// A piece of the path after joining: one thread in one state, with what
/// was folded into it.
#[derive(Clone, Debug)]
struct Joined {
    start_ns: u64,
    end_ns: u64,
    state: String,
    tid: Option<i64>,
    comm: Option<String>,
    /// (label, ns): the system call that covers most of the piece.
    syscall: Option<(String, u64)>,
    waiting_in: Option<(String, u64)>,
    detail: Option<String>,
    blocked_by: Option<(TraceId, SpanId)>,
    lost: bool,
    preempted_by: Option<(i64, Option<String>)>,
    throttled_ns: u64,
    contended_ns: u64,
    wakeup_ns: u64,
    /// Rows of `critical_path` joined into this one.
    pieces: u32,
    /// Short pieces of other threads or states folded into this one.
    folded_pieces: u32,
    folded_ns: u64,
}

impl Joined {
    fn from_piece(p: &Piece) -> Joined {
        let d = p.duration_ns();
        Joined {
            start_ns: p.start_ns,
            end_ns: p.end_ns,
            state: p.state.clone(),
            tid: p.tid,
            comm: p.comm.clone(),
            syscall: p.syscall.clone().map(|s| (s, d)),
            waiting_in: p.waiting_in.clone().map(|s| (s, d)),
            detail: p.detail.clone(),
            blocked_by: p.blocked_by,
            lost: p.lost,
            preempted_by: p.preempted_by.clone(),
            throttled_ns: p.throttled_ns,
            contended_ns: p.contended_ns,
            wakeup_ns: p.wakeup_ns,
            pieces: 1,
            folded_pieces: 0,
            folded_ns: 0,
        }
    }

    fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    fn same_activity(&self, other: &Joined) -> bool {
        self.tid == other.tid && self.state == other.state && self.blocked_by == other.blocked_by
    }

    /// Takes `next` (same thread and state, right after) into this piece.
    fn absorb_same(&mut self, next: Joined) {
        let keep_longer = |mine: &mut Option<(String, u64)>, theirs: Option<(String, u64)>| {
            if let Some(t) = theirs {
                if mine.as_ref().is_none_or(|m| t.1 > m.1) {
                    *mine = Some(t);
                }
            }
        };
        self.start_ns = self.start_ns.min(next.start_ns);
        self.end_ns = self.end_ns.max(next.end_ns);
        keep_longer(&mut self.syscall, next.syscall);
        keep_longer(&mut self.waiting_in, next.waiting_in);
        if self.comm.is_none() {
            self.comm = next.comm;
        }
        if self.detail.is_none() {
            self.detail = next.detail;
        }
        if self.preempted_by.is_none() {
            self.preempted_by = next.preempted_by;
        }
        self.lost |= next.lost;
        self.throttled_ns += next.throttled_ns;
        self.contended_ns += next.contended_ns;
        self.wakeup_ns += next.wakeup_ns;
        self.pieces += next.pieces;
        self.folded_pieces += next.folded_pieces;
        self.folded_ns += next.folded_ns;
    }

    /// Covers a short piece of another thread or state next to this one.
    fn fold_in(&mut self, short: &Joined) {
        self.start_ns = self.start_ns.min(short.start_ns);
        self.end_ns = self.end_ns.max(short.end_ns);
        self.lost |= short.lost;
        self.folded_pieces += short.pieces + short.folded_pieces;
        self.folded_ns += short.duration_ns();
    }
}

/// Consecutive pieces of one thread and state (and blocking request) as one.
fn join(pieces: &[Piece]) -> Vec<Joined> {
    let mut out: Vec<Joined> = Vec::new();
    for p in pieces {
        let next = Joined::from_piece(p);
        match out.last_mut() {
            Some(last) if last.same_activity(&next) && next.start_ns <= last.end_ns => {
                last.absorb_same(next)
            }
            _ => out.push(next),
        }
    }
    out
}

/// One child span of the path, before it becomes a span.
// Most children are pieces, each made once and turned into a span at once:
// boxing the large variant would add an allocation per piece and save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Child {
    Piece(Joined),
    /// A run of short pieces that together reach the threshold.
    Folded {
        start_ns: u64,
        end_ns: u64,
        pieces: u32,
        /// (state, ns), largest first.
        states: Vec<(String, u64)>,
        lost: bool,
    },
}

/// Pieces shorter than `threshold_ns` are folded: a run of them that stays
/// under the threshold goes into the kept piece before it (after it at the
/// start of the path), a longer run becomes one `Folded` child. When no piece
/// reaches the threshold, the longest is kept.
fn fold(joined: Vec<Joined>, threshold_ns: u64) -> Vec<Child> {
    if joined.is_empty() {
        return Vec::new();
    }
    let longest = joined
        .iter()
        .enumerate()
        .max_by_key(|(i, j)| (j.duration_ns(), std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let kept = |i: usize, j: &Joined| j.duration_ns() >= threshold_ns || i == longest;
    let any_kept_over = joined.iter().any(|j| j.duration_ns() >= threshold_ns);
    let mut out: Vec<Child> = Vec::new();
    // Short pieces waiting for the next kept one (the path's start only).
    let mut leading: Vec<Joined> = Vec::new();
    let mut run: Vec<Joined> = Vec::new();
    let flush_run = |run: &mut Vec<Joined>, out: &mut Vec<Child>, leading: &mut Vec<Joined>| {
        if run.is_empty() {
            return;
        }
        let total: u64 = run.iter().map(Joined::duration_ns).sum();
        if total >= threshold_ns && run.len() > 1 {
            let mut states: HashMap<String, u64> = HashMap::new();
            for j in run.iter() {
                *states.entry(j.state.clone()).or_default() += j.duration_ns();
            }
            let mut states: Vec<(String, u64)> = states.into_iter().collect();
            states.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
            out.push(Child::Folded {
                start_ns: run[0].start_ns,
                end_ns: run.last().map(|j| j.end_ns).unwrap_or(run[0].end_ns),
                pieces: run.iter().map(|j| j.pieces + j.folded_pieces).sum(),
                states,
                lost: run.iter().any(|j| j.lost),
            });
            run.clear();
        } else if total >= threshold_ns {
            // A single piece that reaches the threshold only with what was
            // folded into it stays as it is.
            out.push(Child::Piece(run.remove(0)));
        } else if let Some(Child::Piece(previous)) = out.last_mut() {
            for j in run.drain(..) {
                previous.fold_in(&j);
            }
        } else {
            leading.append(run);
        }
    };
    for (i, j) in joined.into_iter().enumerate() {
        if kept(i, &j) && (any_kept_over || i == longest) {
            flush_run(&mut run, &mut out, &mut leading);
            let mut j = j;
            for short in leading.drain(..) {
                j.fold_in(&short);
            }
            // Folding may have put two pieces of the same activity side by side.
            match out.last_mut() {
                Some(Child::Piece(last)) if last.same_activity(&j) => last.absorb_same(j),
                _ => out.push(Child::Piece(j)),
            }
        } else {
            run.push(j);
        }
    }
    flush_run(&mut run, &mut out, &mut leading);
    if !leading.is_empty() {
        // Nothing was kept after them: they stay as they are.
        for j in leading {
            out.push(Child::Piece(j));
        }
    }
    out
}

/// How many path pieces a request has, and what was made of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Rows of `critical_path`.
    pub pieces: usize,
    /// After joining pieces of one thread and state.
    pub joined: usize,
    /// Child spans of the path (pieces and folded groups).
    pub path_spans: usize,
    /// System-call child spans.
    pub syscall_spans: usize,
    /// Joined pieces folded into a neighbour or a group.
    pub folded: usize,
    pub events: usize,
    pub events_dropped: usize,
}

/// Options of [`enrich_request`].
#[derive(Clone, Debug)]
pub struct Thresholds {
    /// Pieces and system calls shorter than this are folded / left out...
    pub min_ns: u64,
    /// ...and so are those shorter than this share of the request.
    pub min_share: f64,
    /// Most span events per request span; the rest are counted.
    pub max_events: usize,
}

impl Thresholds {
    /// The fold threshold of a request: the larger of the two limits, so a
    /// request has at most about `1 / min_share` path spans.
    pub fn for_request(&self, duration_ns: u64) -> u64 {
        let share = (duration_ns as f64 * self.min_share).round() as u64;
        self.min_ns.max(share).max(1)
    }
}

/// The request span made richer, and its new children.
pub struct Enriched {
    pub children: Vec<Span>,
    pub counts: RequestCounts,
}

/// A stable, non-zero id for child `index` of `kind` under `parent`.
fn child_id(trace: TraceId, parent: SpanId, kind: u8, index: u32) -> SpanId {
    let mut bytes = [0u8; 29];
    bytes[..16].copy_from_slice(&trace.to_bytes());
    bytes[16..24].copy_from_slice(&parent.to_bytes());
    bytes[24] = kind;
    bytes[25..29].copy_from_slice(&index.to_be_bytes());
    SpanId(twox_hash::XxHash3_64::oneshot(&bytes).max(1))
}

fn thread_label(tid: Option<i64>, comm: Option<&str>) -> String {
    match (comm, tid) {
        (Some(c), Some(t)) => format!("{c}/{t}"),
        (None, Some(t)) => format!("{t}"),
        (Some(c), None) => c.to_string(),
        (None, None) => "no thread".to_string(),
    }
}

/// Turns a request's monotonic ns into its span's wall clock: the
/// request's monotonic start and end onto the span's, linearly in between
/// (outside, clipped to the span).
struct Clock {
    mono_start_ns: u64,
    mono_len_ns: u64,
    wall_start_ns: u64,
    wall_len_ns: u64,
}

impl Clock {
    fn new(mono: (u64, u64), wall: (u64, u64)) -> Clock {
        Clock {
            mono_start_ns: mono.0,
            mono_len_ns: mono.1.saturating_sub(mono.0),
            wall_start_ns: wall.0,
            wall_len_ns: wall.1.saturating_sub(wall.0),
        }
    }

    fn wall(&self, mono_ns: u64) -> u64 {
        if self.mono_len_ns == 0 {
            return self.wall_start_ns;
        }
        let into = mono_ns
            .saturating_sub(self.mono_start_ns)
            .min(self.mono_len_ns) as u128;
        let scaled = into * self.wall_len_ns as u128 / self.mono_len_ns as u128;
        self.wall_start_ns + scaled as u64
    }
}

fn int(v: u64) -> Value {
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn string(s: impl Into<String>) -> Value {
    Value::String(s.into())
}

/// A short label for a culprit of the diagnosis contract.
fn culprit_label(c: &CulpritDoc) -> String {
    let mut label = c.kind.name().to_string();
    if let (Some(service), Some(operation)) = (&c.service, &c.operation) {
        label.push_str(&format!(" [{service}] {operation}"));
    }
    if let Some(span) = &c.span_id {
        label.push_str(&format!(" {span}"));
    }
    if let Some(comm) = c.comm.as_ref().or(c.name.as_ref()) {
        label.push_str(&format!(" {comm}"));
    }
    match (c.pid, c.tid) {
        (Some(p), Some(t)) => label.push_str(&format!(" (pid {p}, tid {t})")),
        (Some(p), None) => label.push_str(&format!(" (pid {p})")),
        (None, Some(t)) => label.push_str(&format!(" (tid {t})")),
        _ => {}
    }
    if let Some(container) = c.container() {
        label.push_str(&format!(" in {}", container.label()));
    }
    label.push_str(&format!(": {}", deepspan_model::human::duration(c.ns)));
    label
}

/// The diagnosis and path totals as attributes of the request span.
fn request_attributes(span: &mut Span, request: &Request, threshold_ns: u64) {
    let at = &mut span.attributes;
    at.insert(a::SYNC, string(&request.sync));
    at.insert(a::ANOMALOUS, Value::Bool(request.anomalous));
    if let Some(b) = request.baseline_ns {
        at.insert(a::BASELINE_NS, int(b));
    }
    if let Some(t) = &request.top_cause {
        at.insert(a::TOP_CAUSE, string(t));
    }
    at.insert(a::LOST_EVENTS, int(request.lost_events));
    if request.truncated {
        at.insert(a::TRUNCATED, Value::Bool(true));
    }
    at.insert(a::PATH_PIECES, int(request.pieces.len() as u64));
    at.insert(a::FOLD_THRESHOLD_NS, int(threshold_ns));
    if let Some(q) = &request.queue {
        at.insert(
            a::QUEUE_NS,
            int(request.start_ns.saturating_sub(q.arrival_ns)),
        );
        at.insert(a::QUEUE_ARRIVAL_BY, string(&q.arrival_by));
        if let Some(c) = &q.cause {
            at.insert(a::QUEUE_CAUSE, string(c));
        }
    }
    let Some(d) = &request.diagnosis else {
        return;
    };
    at.insert(a::CAUSE, string(d.cause.name()));
    at.insert(a::HEADLINE, string(&d.headline));
    for (name, v) in d.evidence.iter() {
        // Integers as written; null (not a finite number) left out.
        let value = match (v.as_i64(), v.as_f64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(f)) => Value::Double(f),
            _ => continue,
        };
        match name {
            "share" => at.insert(a::SHARE, value),
            "ns" => at.insert(a::CAUSE_NS, value),
            _ => at.insert(format!("{}{name}", a::EVIDENCE_PREFIX), value),
        }
    }
    at.insert(
        a::CULPRITS,
        Value::Array(
            d.culprits
                .iter()
                .map(|c| string(culprit_label(c)))
                .collect(),
        ),
    );
    at.insert(
        a::CULPRITS_JSON,
        string(serde_json::to_string(&d.culprits).unwrap_or_default()),
    );
    // The largest culprit in a container names it with OpenTelemetry's
    // resource names, under deepspan's namespace: the request span's own
    // resource stays what the application sent.
    if let Some(container) = d.culprits.iter().find_map(CulpritDoc::container) {
        let named = [
            (a::CULPRIT_CONTAINER_ID, container.id),
            (a::CULPRIT_CONTAINER_NAME, container.name),
            (a::CULPRIT_POD_UID, container.pod_uid),
            (a::CULPRIT_POD_NAME, container.pod_name),
            (a::CULPRIT_NAMESPACE_NAME, container.pod_namespace),
        ];
        for (name, value) in named {
            if let Some(v) = value {
                at.insert(name, string(v));
            }
        }
    }
    // Analyses made before root causes have none.
    if let Some(root) = &d.root_cause {
        at.insert(a::ROOT_CAUSE, string(root.cause.name()));
        at.insert(a::ROOT_HEADLINE, string(&root.headline));
        if let Some(c) = &root.chain {
            at.insert(a::ROOT_CHAIN, string(c));
        }
        at.insert(
            a::ROOT_CAUSE_JSON,
            string(serde_json::to_string(root).unwrap_or_default()),
        );
    }
}

fn piece_attributes(
    j: &Joined,
    pid: Option<i64>,
    container: Option<&Container>,
    blocker: Option<&Request>,
) -> Attributes {
    let mut at = Attributes::default();
    at.insert(a::KIND, string(a::KIND_PATH));
    at.insert(a::STATE, string(&j.state));
    if let Some(t) = j.tid {
        at.insert(a::TID, Value::Int(t));
    }
    if let Some(c) = &j.comm {
        at.insert(a::COMM, string(c));
    }
    if let Some(p) = pid {
        at.insert(a::PID, Value::Int(p));
    }
    if let Some(c) = container {
        let named = [
            (a::THREAD_CONTAINER_ID, &c.id),
            (a::THREAD_CONTAINER_NAME, &c.name),
            (a::THREAD_POD_UID, &c.pod_uid),
            (a::THREAD_POD_NAME, &c.pod_name),
            (a::THREAD_NAMESPACE_NAME, &c.pod_namespace),
        ];
        for (name, value) in named {
            if let Some(v) = value {
                at.insert(name, string(v));
            }
        }
    }
    if let Some((s, _)) = &j.syscall {
        at.insert(a::SYSCALL, string(s));
    }
    if let Some((s, _)) = &j.waiting_in {
        at.insert(a::WAITING_IN, string(s));
    }
    if let Some(d) = &j.detail {
        at.insert(a::DETAIL, string(d));
    }
    if j.throttled_ns + j.contended_ns + j.wakeup_ns > 0 {
        at.insert(a::THROTTLED_NS, int(j.throttled_ns));
        at.insert(a::CONTENDED_NS, int(j.contended_ns));
        at.insert(a::WAKEUP_NS, int(j.wakeup_ns));
    }
    if let Some((tid, comm)) = &j.preempted_by {
        at.insert(a::PREEMPTED_BY_TID, Value::Int(*tid));
        if let Some(c) = comm {
            at.insert(a::PREEMPTED_BY_COMM, string(c));
        }
    }
    if let Some((trace, span)) = j.blocked_by {
        at.insert(a::BLOCKED_BY_TRACE_ID, string(trace.to_string()));
        at.insert(a::BLOCKED_BY_SPAN_ID, string(span.to_string()));
        if let Some(b) = blocker {
            at.insert(a::BLOCKED_BY_OPERATION, string(b.label()));
        }
    }
    if j.lost {
        at.insert(a::LOST, Value::Bool(true));
    }
    at.insert(a::PIECES, int(j.pieces as u64));
    if j.folded_pieces > 0 {
        at.insert(a::FOLDED_PIECES, int(j.folded_pieces as u64));
        at.insert(a::FOLDED_NS, int(j.folded_ns));
    }
    at.insert(a::MONO_START_NS, int(j.start_ns));
    at.insert(a::MONO_END_NS, int(j.end_ns));
    at
}

fn piece_name(j: &Joined, blocker: Option<&Request>) -> String {
    let mut name = format!(
        "kernel: {}{} · {}",
        j.state,
        deepspan_store::cpu_wait_label(j.throttled_ns, j.contended_ns, j.wakeup_ns),
        thread_label(j.tid, j.comm.as_deref())
    );
    match (j.blocked_by, blocker) {
        (_, Some(b)) => name.push_str(&format!(" · for {}", b.label())),
        (Some((_, span)), None) => name.push_str(&format!(" · for request {span}")),
        _ => {}
    }
    name
}

/// Everything [`enrich_request`] reads besides the request.
pub struct Context<'a> {
    pub analysis: &'a RunAnalysis,
    pub by_id: &'a HashMap<(TraceId, SpanId), usize>,
    pub scope: &'a Arc<Scope>,
}

/// Adds the diagnosis attributes and kernel events to `span` (the request's
/// own span) and makes its kernel child spans, folding at `threshold_ns`.
pub fn enrich_request(
    span: &mut Span,
    request: &Request,
    threshold_ns: u64,
    max_events: usize,
    cx: &Context<'_>,
) -> Enriched {
    request_attributes(span, request, threshold_ns);
    let clock = Clock::new(
        (request.start_ns, request.end_ns),
        (span.start_ns, span.end_ns),
    );
    let blocker_of = |j: &Joined| {
        j.blocked_by
            .and_then(|id| cx.by_id.get(&id))
            .map(|&i| &cx.analysis.requests[i])
    };
    let joined = join(&request.pieces);
    let mut counts = RequestCounts {
        pieces: request.pieces.len(),
        joined: joined.len(),
        ..RequestCounts::default()
    };

    // Events come from the joined path, before folding hides anything.
    let mut events: Vec<Event> = Vec::new();
    let thread_attrs = |j: &Joined| {
        let mut at = Attributes::default();
        if let Some(t) = j.tid {
            at.insert(a::TID, Value::Int(t));
        }
        if let Some(c) = &j.comm {
            at.insert(a::COMM, string(c));
        }
        at
    };
    let mut throttled_run: Option<(u64, u64, u64, Attributes)> = None;
    let close_throttle = |run: &mut Option<(u64, u64, u64, Attributes)>,
                          events: &mut Vec<Event>| {
        if let Some((start, end, ns, attrs)) = run.take() {
            events.push(Event {
                name: a::EVENT_THROTTLE_START.into(),
                time_ns: clock.wall(start),
                attributes: attrs.clone(),
            });
            let mut end_attrs = attrs;
            end_attrs.insert(a::THROTTLED_NS, int(ns));
            events.push(Event {
                name: a::EVENT_THROTTLE_END.into(),
                time_ns: clock.wall(end),
                attributes: end_attrs,
            });
        }
    };
    for (i, j) in joined.iter().enumerate() {
        if j.throttled_ns > 0 && j.state == "PREEMPTED" {
            match &mut throttled_run {
                Some((_, end, ns, _)) if *end >= j.start_ns => {
                    *end = j.end_ns;
                    *ns += j.throttled_ns;
                }
                _ => {
                    close_throttle(&mut throttled_run, &mut events);
                    throttled_run = Some((j.start_ns, j.end_ns, j.throttled_ns, thread_attrs(j)));
                }
            }
        } else {
            close_throttle(&mut throttled_run, &mut events);
        }
        if let Some((trace, span_id)) = j.blocked_by {
            let handed_back = joined
                .get(i + 1)
                .is_none_or(|n| n.blocked_by != j.blocked_by);
            if handed_back {
                let mut at = thread_attrs(j);
                at.insert(a::BLOCKED_BY_TRACE_ID, string(trace.to_string()));
                at.insert(a::BLOCKED_BY_SPAN_ID, string(span_id.to_string()));
                if let Some(b) = blocker_of(j) {
                    at.insert(a::BLOCKED_BY_OPERATION, string(b.label()));
                }
                events.push(Event {
                    name: a::EVENT_WOKEN_BY_REQUEST.into(),
                    time_ns: clock.wall(j.end_ns),
                    attributes: at,
                });
            }
        }
        if j.lost && !(i > 0 && joined[i - 1].lost) {
            events.push(Event {
                name: a::EVENT_LOST.into(),
                time_ns: clock.wall(j.start_ns),
                attributes: thread_attrs(j),
            });
        }
    }
    close_throttle(&mut throttled_run, &mut events);
    events.sort_by_key(|e| e.time_ns);
    counts.events = events.len().min(max_events);
    counts.events_dropped = events.len().saturating_sub(max_events);
    events.truncate(max_events);
    span.events.extend(events);
    if counts.events_dropped > 0 {
        span.attributes
            .insert(a::EVENTS_DROPPED, int(counts.events_dropped as u64));
    }

    let children_of_path = fold(joined, threshold_ns);
    let mut children = Vec::with_capacity(children_of_path.len());
    let new_span = |index: u32, kind: u8, name: String, start: u64, end: u64, at| Span {
        trace_id: span.trace_id,
        span_id: child_id(span.trace_id, span.span_id, kind, index),
        parent_span_id: Some(span.span_id),
        trace_state: String::new(),
        name,
        kind: SpanKind::Internal,
        resource: span.resource.clone(),
        scope: cx.scope.clone(),
        start_ns: clock.wall(start),
        end_ns: clock.wall(end),
        attributes: at,
        events: Vec::new(),
        links: Vec::new(),
        status: Status::default(),
        sync: SyncInfo::default(),
    };
    for (index, child) in children_of_path.iter().enumerate() {
        let index = index as u32;
        match child {
            Child::Piece(j) => {
                counts.folded += j.folded_pieces as usize;
                let blocker = blocker_of(j);
                let pid = j.tid.and_then(|t| cx.analysis.pids.get(&t).copied());
                let mut s = new_span(
                    index,
                    b'p',
                    piece_name(j, blocker),
                    j.start_ns,
                    j.end_ns,
                    piece_attributes(
                        j,
                        pid,
                        pid.and_then(|p| cx.analysis.containers.get(&p)),
                        blocker,
                    ),
                );
                if let Some((trace_id, span_id)) = j.blocked_by {
                    let mut at = Attributes::default();
                    at.insert(a::LINK_REASON, string("blocked_by_request"));
                    s.links.push(Link {
                        trace_id,
                        span_id,
                        trace_state: String::new(),
                        attributes: at,
                    });
                }
                children.push(s);
            }
            Child::Folded {
                start_ns,
                end_ns,
                pieces,
                states,
                lost,
            } => {
                counts.folded += *pieces as usize;
                let mut at = Attributes::default();
                at.insert(a::KIND, string(a::KIND_FOLDED));
                at.insert(a::STATE, string(&states[0].0));
                at.insert(a::FOLDED_PIECES, int(*pieces as u64));
                at.insert(a::FOLDED_NS, int(end_ns - start_ns));
                for (state, ns) in states {
                    at.insert(format!("{}{state}", a::STATE_NS_PREFIX), int(*ns));
                }
                if *lost {
                    at.insert(a::LOST, Value::Bool(true));
                }
                at.insert(a::MONO_START_NS, int(*start_ns));
                at.insert(a::MONO_END_NS, int(*end_ns));
                let name = format!("kernel: {pieces} short pieces (mostly {})", states[0].0);
                children.push(new_span(index, b'f', name, *start_ns, *end_ns, at));
            }
        }
    }
    counts.path_spans = children.len();

    let syscalls: &[Syscall] = request
        .tid
        .and_then(|t| cx.analysis.syscalls.get(&t))
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let first = syscalls.partition_point(|s| s.end_ns <= request.start_ns);
    let mut index = 0u32;
    for sc in syscalls[first..]
        .iter()
        .take_while(|s| s.start_ns < request.end_ns)
        .filter(|s| {
            let clipped = s
                .end_ns
                .min(request.end_ns)
                .saturating_sub(s.start_ns.max(request.start_ns));
            clipped >= threshold_ns
        })
    {
        let comm = request
            .pieces
            .iter()
            .find(|p| p.tid == Some(sc.tid))
            .and_then(|p| p.comm.clone());
        let label = sc
            .name
            .clone()
            .unwrap_or_else(|| format!("syscall {}", sc.nr));
        let mut at = Attributes::default();
        at.insert(a::KIND, string(a::KIND_SYSCALL));
        at.insert(a::SYSCALL, string(&label));
        at.insert(a::SYSCALL_NR, Value::Int(sc.nr));
        if let Some(r) = sc.ret {
            at.insert(a::SYSCALL_RET, Value::Int(r));
        }
        at.insert(a::TID, Value::Int(sc.tid));
        if let Some(c) = &comm {
            at.insert(a::COMM, string(c));
        }
        if let Some(p) = cx.analysis.pids.get(&sc.tid) {
            at.insert(a::PID, Value::Int(*p));
        }
        at.insert(a::MONO_START_NS, int(sc.start_ns));
        at.insert(a::MONO_END_NS, int(sc.end_ns));
        let name = format!(
            "syscall: {label} · {}",
            thread_label(Some(sc.tid), comm.as_deref())
        );
        let start = sc.start_ns.max(request.start_ns);
        let end = sc.end_ns.min(request.end_ns);
        children.push(new_span(index, b's', name, start, end, at));
        index += 1;
    }
    counts.syscall_spans = index as usize;
    if let Some(q) = request
        .queue
        .as_ref()
        .filter(|q| q.arrival_ns < request.start_ns)
    {
        children.push(queue_span(span, request, q, cx));
    }
    span.attributes
        .insert(a::CHILD_SPANS, int(children.len() as u64));
    Enriched { children, counts }
}

/// The child span of a request's time queued before its span started: it
/// ends where the request span starts and begins as long before (the two
/// clocks run at the same rate), linked to the requests it was queued
/// behind.
fn queue_span(span: &Span, request: &Request, q: &Queue, cx: &Context<'_>) -> Span {
    let queued_ns = request.start_ns - q.arrival_ns;
    let mut at = Attributes::default();
    at.insert(a::KIND, string(a::KIND_QUEUE));
    at.insert(a::QUEUE_NS, int(queued_ns));
    at.insert(a::QUEUE_ARRIVAL_BY, string(&q.arrival_by));
    if let Some(c) = &q.cause {
        at.insert(a::QUEUE_CAUSE, string(c));
    }
    at.insert(a::MONO_START_NS, int(q.arrival_ns));
    at.insert(a::MONO_END_NS, int(request.start_ns));
    let links = q
        .behind
        .iter()
        .filter(|id| cx.by_id.contains_key(id))
        .map(|&(trace_id, span_id)| {
            let mut at = Attributes::default();
            at.insert(a::LINK_REASON, string("queued_behind_request"));
            Link {
                trace_id,
                span_id,
                trace_state: String::new(),
                attributes: at,
            }
        })
        .collect();
    Span {
        trace_id: span.trace_id,
        span_id: child_id(span.trace_id, span.span_id, b'q', 0),
        parent_span_id: Some(span.span_id),
        trace_state: String::new(),
        name: match &q.cause {
            Some(c) => format!("queued: {c}"),
            None => "queued".to_string(),
        },
        kind: SpanKind::Internal,
        resource: span.resource.clone(),
        scope: cx.scope.clone(),
        start_ns: span.start_ns.saturating_sub(queued_ns),
        end_ns: span.start_ns,
        attributes: at,
        events: Vec::new(),
        links,
        status: Status::default(),
        sync: SyncInfo::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(start: u64, end: u64, state: &str, tid: i64) -> Piece {
        Piece {
            start_ns: start,
            end_ns: end,
            state: state.into(),
            tid: Some(tid),
            comm: Some(format!("t{tid}")),
            syscall: None,
            waiting_in: None,
            detail: None,
            blocked_by: None,
            lost: false,
            preempted_by: None,
            throttled_ns: 0,
            contended_ns: 0,
            wakeup_ns: 0,
        }
    }

    #[test]
    fn the_path_tiles_its_span_when_the_two_clocks_disagree_on_its_length() {
        // 10 000 ns on the monotonic clock, 10 030 ns on the wall clock.
        let clock = Clock::new((1_000, 11_000), (500_000, 510_030));
        assert_eq!(clock.wall(1_000), 500_000);
        assert_eq!(clock.wall(6_000), 505_015);
        assert_eq!(clock.wall(11_000), 510_030);
        // Outside the request: clipped to the span.
        assert_eq!(clock.wall(0), 500_000);
        assert_eq!(clock.wall(20_000), 510_030);
        // Longer on the monotonic clock: still inside the span.
        let longer = Clock::new((1_000, 11_000), (500_000, 509_000));
        assert_eq!(longer.wall(11_000), 509_000);
        // A request of no length sits at its span's start.
        assert_eq!(Clock::new((5, 5), (100, 200)).wall(5), 100);
    }

    fn spans_of(children: &[Child]) -> Vec<(u64, u64, String)> {
        children
            .iter()
            .map(|c| match c {
                Child::Piece(j) => (j.start_ns, j.end_ns, j.state.clone()),
                Child::Folded {
                    start_ns, end_ns, ..
                } => (*start_ns, *end_ns, "folded".into()),
            })
            .collect()
    }

    #[test]
    fn consecutive_pieces_of_one_thread_and_state_are_joined() {
        let joined = join(&[
            piece(0, 10, "RUNNING", 1),
            piece(10, 20, "RUNNING", 1),
            piece(20, 30, "RUNNING", 2),
            piece(30, 40, "BLOCKED", 2),
        ]);
        let got: Vec<_> = joined
            .iter()
            .map(|j| (j.start_ns, j.end_ns, j.pieces))
            .collect();
        assert_eq!(got, vec![(0, 20, 2), (20, 30, 1), (30, 40, 1)]);
    }

    #[test]
    fn short_pieces_fold_into_the_previous_kept_piece_and_are_counted() {
        let joined = join(&[
            piece(0, 100, "RUNNING", 1),
            piece(100, 103, "PREEMPTED", 1),
            piece(103, 200, "RUNNING", 1),
            piece(200, 300, "BLOCKED", 1),
        ]);
        let children = fold(joined, 10);
        // The short PREEMPTED piece went into the first RUNNING piece, which
        // then joined the second.
        assert_eq!(
            spans_of(&children),
            vec![(0, 200, "RUNNING".into()), (200, 300, "BLOCKED".into())]
        );
        let Child::Piece(first) = &children[0] else {
            panic!()
        };
        assert_eq!(
            (first.folded_pieces, first.folded_ns, first.pieces),
            (1, 3, 2)
        );
    }

    #[test]
    fn a_long_run_of_short_pieces_becomes_one_folded_child() {
        let mut pieces = vec![piece(0, 100, "RUNNING", 1)];
        for k in 0..20u64 {
            let state = if k % 2 == 0 { "PREEMPTED" } else { "RUNNING" };
            pieces.push(piece(100 + 5 * k, 105 + 5 * k, state, 1 + (k % 2) as i64));
        }
        pieces.push(piece(200, 300, "BLOCKED", 1));
        let children = fold(join(&pieces), 10);
        assert_eq!(
            spans_of(&children),
            vec![
                (0, 100, "RUNNING".into()),
                (100, 200, "folded".into()),
                (200, 300, "BLOCKED".into())
            ]
        );
        let Child::Folded { pieces, states, .. } = &children[1] else {
            panic!()
        };
        assert_eq!(*pieces, 20);
        assert_eq!(states.iter().map(|s| s.1).sum::<u64>(), 100);
    }

    #[test]
    fn short_pieces_at_the_start_fold_into_the_next_kept_piece() {
        let children = fold(
            join(&[piece(0, 3, "BLOCKED", 2), piece(3, 100, "RUNNING", 1)]),
            10,
        );
        assert_eq!(spans_of(&children), vec![(0, 100, "RUNNING".into())]);
    }

    #[test]
    fn when_no_piece_reaches_the_threshold_the_longest_is_kept() {
        let children = fold(
            join(&[
                piece(0, 3, "BLOCKED", 2),
                piece(3, 8, "RUNNING", 1),
                piece(8, 10, "BLOCKED", 2),
            ]),
            100,
        );
        assert_eq!(spans_of(&children), vec![(0, 10, "RUNNING".into())]);
    }

    #[test]
    fn the_threshold_is_the_larger_of_the_two_limits() {
        let t = Thresholds {
            min_ns: 1_000_000,
            min_share: 0.01,
            max_events: 10,
        };
        assert_eq!(t.for_request(10_000_000), 1_000_000);
        assert_eq!(t.for_request(1_000_000_000), 10_000_000);
    }
}
