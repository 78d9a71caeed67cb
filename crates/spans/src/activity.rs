//! Which request each thread works for, at any time.
//!
//! Algorithm 1 of Gelle et al. (2021), generalised: per thread, a sweep over
//! synchronisation events keeps two ordered sets,
//! - *held*: spans the thread holds (started on it and not ended, or
//!   currently activated on it), and
//! - *active stack*: spans activated on the thread, most recent on top.
//!
//! The span *active* on the thread is the top of the active stack (the paper's
//! "most recently started request"). Span start/end events (the paper's)
//! both hold and activate; `deepspan.on`/`off` events activate and
//! deactivate, so a span can be active on several threads in turn (thread
//! pools, asyncio); a span whose SDK reports activations is only *held* by
//! the thread that started it until an activation says otherwise.
//!
//! Activations nest like contexts: while a child span is current its parent
//! stays on the stack (held), and becomes active again when the child's
//! activation ends.
//!
//! The result is, per thread, sorted half-open intervals `[start, end)` of
//! constant state; queries are binary searches.

use std::collections::HashMap;

use crate::clock::{span_mono_exact, ClockMap};
use crate::model::{Span, SpanId, TraceId, Value};

/// A span's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanRef {
    pub trace_id: TraceId,
    pub span_id: SpanId,
}

impl SpanRef {
    pub fn of(span: &Span) -> SpanRef {
        SpanRef {
            trace_id: span.trace_id,
            span_id: span.span_id,
        }
    }
}

/// What happened to a span on a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// The span started on the thread: held and active (paper's start event).
    SpanStart { parent: Option<SpanId> },
    /// The span ended: no longer held or active on the thread.
    SpanEnd,
    /// The span started on the thread but its SDK reports activations
    /// separately: held, not active.
    Hold,
    /// The span became current on the thread.
    On,
    /// The span stopped being current on the thread.
    Off,
}

/// One synchronisation event: at `ts` (CLOCK_MONOTONIC ns) on thread `tid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncEvent {
    pub ts: u64,
    pub tid: u32,
    pub span: SpanRef,
    pub kind: SyncKind,
}

#[derive(Clone, Debug)]
struct Segment {
    start: u64,
    end: u64,
    active: Option<SpanRef>,
    /// Range in `Timeline::pool`.
    held: (u32, u32),
}

#[derive(Clone, Debug, Default)]
struct Timeline {
    segments: Vec<Segment>,
    pool: Vec<SpanRef>,
}

/// Options for [`ThreadActivity::from_spans`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ActivityOptions {
    /// Read the semantic-convention `thread.id` attribute as the OS thread id
    /// when `deepspan.tid` is absent. Off by default: `thread.id` is a
    /// language-managed id in most SDKs (Java, .NET, Python's `threading`
    /// ident), not the kernel's tid. Turn it on only for producers known to
    /// put the OS tid there.
    pub thread_id_is_os_tid: bool,
}

/// Per-thread span activity, queryable by time.
#[derive(Clone, Debug, Default)]
pub struct ThreadActivity {
    threads: HashMap<u32, Timeline>,
    /// Events that did not fit (an `off` for a span not active there, ...).
    pub notes: Vec<String>,
}

impl ThreadActivity {
    /// Builds the index from synchronisation events in any order (equal
    /// timestamps keep their given order).
    pub fn from_sync_events(events: impl IntoIterator<Item = SyncEvent>) -> ThreadActivity {
        let mut per_tid: HashMap<u32, Vec<SyncEvent>> = HashMap::new();
        for e in events {
            per_tid.entry(e.tid).or_default().push(e);
        }
        let mut out = ThreadActivity::default();
        for (tid, mut evs) in per_tid {
            evs.sort_by_key(|e| e.ts);
            let tl = sweep(tid, &evs, &mut out.notes);
            out.threads.insert(tid, tl);
        }
        out
    }

    /// Builds the index from spans: their deepspan thread and monotonic
    /// fields and `deepspan.on`/`off` events. Spans without monotonic fields
    /// are mapped through `clock` when given (else left out, with a note);
    /// spans without a thread id are left out (they say nothing about threads).
    pub fn from_spans<'a>(
        spans: impl IntoIterator<Item = &'a Span>,
        clock: Option<&ClockMap>,
        opts: ActivityOptions,
    ) -> ThreadActivity {
        Self::from_spans_placed(spans, clock, opts, |_, _| None)
    }

    /// [`ThreadActivity::from_spans`], with `inferred(i, span)` giving the
    /// thread of the `i`-th span when it carries none (placed from the
    /// kernel trace): such a span is active on that thread from its start
    /// to its end, like the paper's spans.
    pub fn from_spans_placed<'a>(
        spans: impl IntoIterator<Item = &'a Span>,
        clock: Option<&ClockMap>,
        opts: ActivityOptions,
        mut inferred: impl FnMut(usize, &Span) -> Option<u32>,
    ) -> ThreadActivity {
        let mut events = Vec::new();
        let mut notes = Vec::new();
        let (mut no_tid, mut no_clock) = (0usize, 0usize);
        for (i, s) in spans.into_iter().enumerate() {
            let r = SpanRef::of(s);
            let tid = s
                .sync
                .tid
                .or_else(|| {
                    if opts.thread_id_is_os_tid {
                        s.attributes
                            .get("thread.id")
                            .and_then(Value::as_i64)
                            .and_then(|t| u32::try_from(t).ok())
                    } else {
                        None
                    }
                })
                .or_else(|| inferred(i, s));
            let times = span_mono_exact(s).or_else(|| clock.map(|c| c.span_mono(s)));
            for a in &s.sync.activations {
                events.push(SyncEvent {
                    ts: a.mono_ns,
                    tid: a.tid,
                    span: r,
                    kind: if a.on { SyncKind::On } else { SyncKind::Off },
                });
            }
            let Some(tid) = tid else {
                no_tid += s.sync.activations.is_empty() as usize;
                continue;
            };
            let Some(t) = times else {
                no_clock += 1;
                continue;
            };
            // A span with `deepspan.tid` from an SDK processor that reports
            // activations (deepspan's Python and Java ones do): its start only
            // holds the thread, and it is active only while an activation says
            // so (a span never made current works for nobody). Other spans are
            // the paper's: active from start to end; so are those of the
            // Node.js processor, which has no hook on Node's async context
            // switches and reports none.
            let start_kind = if s.sync.tid.is_some() && reports_activations(s) {
                SyncKind::Hold
            } else {
                SyncKind::SpanStart {
                    parent: s.parent_span_id,
                }
            };
            events.push(SyncEvent {
                ts: t.start_ns,
                tid,
                span: r,
                kind: start_kind,
            });
            // The end releases the span on the thread that held it; activations
            // elsewhere were closed by their own `off` (or are closed here).
            events.push(SyncEvent {
                ts: t.end_ns,
                tid,
                span: r,
                kind: SyncKind::SpanEnd,
            });
            for a in &s.sync.activations {
                if a.tid != tid {
                    events.push(SyncEvent {
                        ts: t.end_ns,
                        tid: a.tid,
                        span: r,
                        kind: SyncKind::SpanEnd,
                    });
                }
            }
        }
        if no_tid > 0 {
            notes.push(format!(
                "{no_tid} span(s) are on no single thread (no deepspan.tid, no activations, no thread inferred): thread activity leaves them out; the placement note says where they went"
            ));
        }
        if no_clock > 0 {
            notes.push(format!("{no_clock} span(s) have a thread id but no monotonic times and no clock map was given; not placed"));
        }
        let mut out = ThreadActivity::from_sync_events(events);
        notes.append(&mut out.notes);
        out.notes = notes;
        out
    }

    /// Threads with any activity, ascending.
    pub fn threads(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.threads.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn segment_at(&self, tid: u32, t: u64) -> Option<(&Timeline, &Segment)> {
        let tl = self.threads.get(&tid)?;
        let i = tl.segments.partition_point(|s| s.start <= t);
        let seg = tl.segments.get(i.checked_sub(1)?)?;
        (t < seg.end).then_some((tl, seg))
    }

    /// The span thread `tid` works for at time `t` (monotonic ns), if any.
    pub fn active_at(&self, tid: u32, t: u64) -> Option<SpanRef> {
        self.segment_at(tid, t).and_then(|(_, s)| s.active)
    }

    /// Every span thread `tid` holds at `t` (the active one included): spans
    /// started on the thread in start order, then spans only activated there.
    pub fn held_at(&self, tid: u32, t: u64) -> &[SpanRef] {
        match self.segment_at(tid, t) {
            Some((tl, s)) => &tl.pool[s.held.0 as usize..s.held.1 as usize],
            None => &[],
        }
    }

    /// Every span thread `tid` holds at some time in `[t1, t2)`, in order of
    /// first appearance.
    pub fn held_during(&self, tid: u32, t1: u64, t2: u64) -> Vec<SpanRef> {
        let mut out: Vec<SpanRef> = Vec::new();
        for (tl, seg) in self.segments_during(tid, t1, t2) {
            for r in &tl.pool[seg.held.0 as usize..seg.held.1 as usize] {
                if !out.contains(r) {
                    out.push(*r);
                }
            }
        }
        out
    }

    /// `(start, end, span)` intervals during which a span is active on `tid`,
    /// clipped to `[t1, t2)`, merged where the same span continues.
    pub fn active_during(&self, tid: u32, t1: u64, t2: u64) -> Vec<(u64, u64, SpanRef)> {
        let mut out: Vec<(u64, u64, SpanRef)> = Vec::new();
        for (_, seg) in self.segments_during(tid, t1, t2) {
            let Some(a) = seg.active else { continue };
            let (s, e) = (seg.start.max(t1), seg.end.min(t2));
            match out.last_mut() {
                Some(last) if last.2 == a && last.1 == s => last.1 = e,
                _ => out.push((s, e, a)),
            }
        }
        out
    }

    fn segments_during(
        &self,
        tid: u32,
        t1: u64,
        t2: u64,
    ) -> impl Iterator<Item = (&Timeline, &Segment)> {
        let tl = self.threads.get(&tid);
        let segs = tl.map(|tl| {
            let first = tl.segments.partition_point(|s| s.end <= t1);
            tl.segments[first..]
                .iter()
                .take_while(move |s| s.start < t2)
        });
        segs.into_iter()
            .flatten()
            .map(move |s| (tl.expect("segments come from tl"), s))
    }
}

/// Whether the SDK that gave `span` its `deepspan.tid` reports the span's
/// activations (`deepspan.on`/`off`): every deepspan SDK but the Node.js
/// processor (resource `telemetry.sdk.language` `nodejs`).
fn reports_activations(span: &Span) -> bool {
    let language = span.resource.attributes.get("telemetry.sdk.language");
    language.and_then(Value::as_str) != Some("nodejs")
}

fn sweep(tid: u32, events: &[SyncEvent], notes: &mut Vec<String>) -> Timeline {
    let mut tl = Timeline::default();
    let mut held: Vec<SpanRef> = Vec::new(); // started here, not ended
    let mut active: Vec<SpanRef> = Vec::new(); // activation stack
    let mut unmatched_off = 0usize;
    let mut i = 0;
    while i < events.len() {
        let ts = events[i].ts;
        // Apply every event at this instant, then record the state until the next instant.
        while i < events.len() && events[i].ts == ts {
            let e = &events[i];
            match e.kind {
                SyncKind::SpanStart { .. } => {
                    if !held.contains(&e.span) {
                        held.push(e.span);
                    }
                    active.retain(|x| *x != e.span);
                    active.push(e.span);
                }
                SyncKind::Hold => {
                    if !held.contains(&e.span) {
                        held.push(e.span);
                    }
                }
                SyncKind::On => {
                    active.retain(|x| *x != e.span);
                    active.push(e.span);
                }
                SyncKind::Off => {
                    let before = active.len();
                    active.retain(|x| *x != e.span);
                    unmatched_off += (before == active.len()) as usize;
                }
                SyncKind::SpanEnd => {
                    held.retain(|x| *x != e.span);
                    active.retain(|x| *x != e.span);
                }
            }
            i += 1;
        }
        if let Some(last) = tl.segments.last_mut() {
            if last.end == u64::MAX {
                last.end = ts;
            }
        }
        if held.is_empty() && active.is_empty() {
            continue;
        }
        let from = tl.pool.len() as u32;
        tl.pool.extend(held.iter().copied());
        for a in &active {
            if !held.contains(a) {
                tl.pool.push(*a);
            }
        }
        tl.segments.push(Segment {
            start: ts,
            end: u64::MAX,
            active: active.last().copied(),
            held: (from, tl.pool.len() as u32),
        });
    }
    if let Some(last) = tl.segments.last() {
        if last.end == u64::MAX {
            notes.push(format!("thread {tid}: spans still held after the last event (never ended); their interval is left open"));
        }
    }
    if unmatched_off > 0 {
        notes.push(format!(
            "thread {tid}: {unmatched_off} deactivation(s) of spans not active there; ignored"
        ));
    }
    tl
}
