//! Spans from the LTTng-UST provider of Gelle et al. 2021
//! (`jaeger_ust:start_span` and `jaeger_ust:end_span`): each start/end pair
//! becomes a span whose deepspan sync fields are the events' own trace
//! times and thread, so it joins the kernel trace of the same LTTng session
//! exactly.
//!
//! Spans imported from Jaeger/OTLP files for the same session keep their
//! names, services and attributes; the events only add the sync fields
//! ([`apply_to`]). Spans known only from the events get the operation name
//! of the start event and the service `pid <vpid>`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::{
    Attributes, Resource, Span, SpanId, SpanKind, TraceId, Value, ATTR_MONO_END, ATTR_MONO_START,
    ATTR_TID,
};

/// One `jaeger_ust` event, as read from the trace.
#[derive(Clone, Debug)]
pub enum UstSpanEvent {
    Start {
        trace_id: u128,
        span_id: u64,
        /// 0 for a root span.
        parent_span_id: u64,
        op_name: String,
        /// As the application emitted it (Jaeger: µs since the Unix epoch).
        start_time_us: u64,
        tid: Option<u32>,
        pid: Option<i32>,
        /// Trace time of the event, in the kernel trace's time domain.
        ts: u64,
    },
    End {
        trace_id: u128,
        span_id: u64,
        duration_us: u64,
        tid: Option<u32>,
        ts: u64,
    },
}

/// The spans the events describe, and what could not be paired.
#[derive(Debug, Default)]
pub struct UstSpans {
    /// Complete spans (start and end seen), in start order.
    pub spans: Vec<Span>,
    /// Starts without an end (still open when the trace stopped, or the end
    /// was discarded) and ends without a start.
    pub unpaired: usize,
    /// Start events without a thread id (`vtid` context not recorded):
    /// their spans have no thread and get no kernel path.
    pub without_tid: usize,
}

/// Pairs start and end events (any order of arrival; events are matched by
/// trace id and span id).
pub fn spans_from_events(events: impl IntoIterator<Item = UstSpanEvent>) -> UstSpans {
    let mut open: HashMap<(u128, u64), (UstSpanEvent, usize)> = HashMap::new();
    let mut ends: HashMap<(u128, u64), UstSpanEvent> = HashMap::new();
    let mut order = 0usize;
    let mut pairs: Vec<(usize, UstSpanEvent, UstSpanEvent)> = Vec::new();
    for e in events {
        match &e {
            UstSpanEvent::Start {
                trace_id, span_id, ..
            } => {
                let key = (*trace_id, *span_id);
                match ends.remove(&key) {
                    Some(end) => pairs.push((order, e, end)),
                    None => {
                        open.insert(key, (e, order));
                    }
                }
                order += 1;
            }
            UstSpanEvent::End {
                trace_id, span_id, ..
            } => {
                let key = (*trace_id, *span_id);
                match open.remove(&key) {
                    Some((start, at)) => pairs.push((at, start, e)),
                    None => {
                        ends.insert(key, e);
                    }
                }
            }
        }
    }
    pairs.sort_by_key(|(at, _, _)| *at);
    let mut out = UstSpans {
        unpaired: open.len() + ends.len(),
        ..UstSpans::default()
    };
    let mut resources: HashMap<Option<i32>, Arc<Resource>> = HashMap::new();
    for (_, start, end) in pairs {
        let (
            UstSpanEvent::Start {
                trace_id,
                span_id,
                parent_span_id,
                op_name,
                start_time_us,
                tid,
                pid,
                ts: start_ts,
            },
            UstSpanEvent::End {
                duration_us,
                ts: end_ts,
                ..
            },
        ) = (start, end)
        else {
            unreachable!("pairs hold a start and an end")
        };
        let start_ns = start_time_us.saturating_mul(1000);
        let parent = (parent_span_id != 0).then_some(SpanId(parent_span_id));
        let mut span = Span::new(
            TraceId(trace_id),
            SpanId(span_id),
            parent,
            &op_name,
            start_ns,
            start_ns.saturating_add(duration_us.saturating_mul(1000)),
        );
        // The paper's spans are server-side units of work: a root is a request.
        span.kind = if parent.is_none() {
            SpanKind::Server
        } else {
            SpanKind::Internal
        };
        span.resource = resources
            .entry(pid)
            .or_insert_with(|| {
                let service = match pid {
                    Some(p) => format!("pid {p}"),
                    None => "jaeger_ust".to_string(),
                };
                Arc::new(Resource::with_service(&service, Attributes::default()))
            })
            .clone();
        if tid.is_none() {
            out.without_tid += 1;
        }
        set_sync(&mut span, tid, start_ts, end_ts.max(start_ts));
        out.spans.push(span);
    }
    out
}

/// Gives `spans` (imported from files) the sync fields of the events'
/// spans with the same ids; returns how many were matched. Matched event
/// spans are removed from `from`, so what is left are spans the files lack.
pub fn apply_to(spans: &mut [Span], from: &mut Vec<Span>) -> usize {
    let mut by_id: HashMap<(TraceId, SpanId), usize> = HashMap::new();
    for (i, s) in from.iter().enumerate() {
        by_id.insert((s.trace_id, s.span_id), i);
    }
    let mut used = vec![false; from.len()];
    let mut matched = 0;
    for s in spans.iter_mut() {
        if let Some(&i) = by_id.get(&(s.trace_id, s.span_id)) {
            let sync = &from[i].sync;
            if let (Some(a), Some(b)) = (sync.mono_start_ns, sync.mono_end_ns) {
                set_sync(s, sync.tid, a, b);
                used[i] = true;
                matched += 1;
            }
        }
    }
    let mut i = 0;
    from.retain(|_| {
        i += 1;
        !used[i - 1]
    });
    matched
}

fn set_sync(span: &mut Span, tid: Option<u32>, start_ts: u64, end_ts: u64) {
    if let Some(tid) = tid {
        span.attributes.insert(ATTR_TID, Value::Int(i64::from(tid)));
    }
    span.attributes
        .insert(ATTR_MONO_START, Value::Int(start_ts as i64));
    span.attributes
        .insert(ATTR_MONO_END, Value::Int(end_ts as i64));
    span.refresh_sync();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(span: u64, parent: u64, ts: u64, tid: u32) -> UstSpanEvent {
        UstSpanEvent::Start {
            trace_id: 7,
            span_id: span,
            parent_span_id: parent,
            op_name: format!("op{span}"),
            start_time_us: ts / 1000,
            tid: Some(tid),
            pid: Some(100),
            ts,
        }
    }

    fn end(span: u64, ts: u64, dur_us: u64) -> UstSpanEvent {
        UstSpanEvent::End {
            trace_id: 7,
            span_id: span,
            duration_us: dur_us,
            tid: Some(1),
            ts,
        }
    }

    #[test]
    fn pairs_starts_and_ends_in_any_order() {
        let got = spans_from_events(vec![
            end(2, 5_000, 1), // end before start: still paired
            start(1, 0, 1_000, 11),
            start(2, 1, 2_000, 12),
            start(3, 1, 3_000, 13), // never ends
            end(1, 9_000, 8),
            end(4, 9_500, 1), // never started
        ]);
        assert_eq!(got.unpaired, 2);
        let ids: Vec<u64> = got.spans.iter().map(|s| s.span_id.0).collect();
        assert_eq!(ids, vec![1, 2]);
        let root = &got.spans[0];
        assert_eq!(root.kind, SpanKind::Server);
        assert_eq!(root.parent_span_id, None);
        assert_eq!(root.resource.service_name, "pid 100");
        assert_eq!((root.start_ns, root.end_ns), (1_000, 9_000)); // µs → ns
        assert_eq!(root.sync.tid, Some(11));
        assert_eq!(
            (root.sync.mono_start_ns, root.sync.mono_end_ns),
            (Some(1_000), Some(9_000))
        );
        assert_eq!(got.spans[1].parent_span_id, Some(SpanId(1)));
        assert!(root.sync.problems.is_empty());
    }

    #[test]
    fn file_spans_take_the_sync_fields_and_leftovers_stay() {
        let mut from = spans_from_events(vec![
            start(1, 0, 1_000, 11),
            end(1, 9_000, 8),
            start(2, 1, 2_000, 12),
            end(2, 5_000, 3),
        ])
        .spans;
        let mut files = vec![Span::new(TraceId(7), SpanId(1), None, "GET /", 1, 2)];
        assert_eq!(apply_to(&mut files, &mut from), 1);
        assert_eq!(files[0].name, "GET /");
        assert_eq!(files[0].sync.tid, Some(11));
        assert_eq!(files[0].sync.mono_start_ns, Some(1_000));
        assert_eq!(from.len(), 1);
        assert_eq!(from[0].span_id, SpanId(2));
    }
}
