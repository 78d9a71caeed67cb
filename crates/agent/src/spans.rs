//! What the agent reads from and writes into OTLP requests: the recent
//! requests kept for snapshots, a span's monotonic times, and the
//! attributes it puts on an anomalous span. The request spans it judges
//! come with each request's digest (`deepspan_otlp::digest`).

use std::collections::VecDeque;

use bytes::Bytes;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

use deepspan_spans::ExportTraceServiceRequest;

/// The attributes the Python SDK and the Java extension put on spans: the
/// span's times on the host's CLOCK_MONOTONIC, so no clock mapping is needed.
const MONO_START: &str = "deepspan.mono_start_ns";
const MONO_END: &str = "deepspan.mono_end_ns";

pub use deepspan_otlp::SpanPlace;

fn int_attr(attributes: &[KeyValue], key: &str) -> Option<u64> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match &kv.value {
            Some(AnyValue {
                value: Some(any_value::Value::IntValue(i)),
            }) => u64::try_from(*i).ok(),
            Some(AnyValue {
                value: Some(any_value::Value::StringValue(s)),
            }) => s.parse().ok(),
            _ => None,
        })
}

/// A span on the host's monotonic clock: from the SDK's fields when it has
/// them, else its wall times moved by `mono_minus_realtime_ns`.
pub fn mono_times(span: &Span, mono_minus_realtime_ns: i128) -> (u64, u64) {
    let exact = int_attr(&span.attributes, MONO_START).zip(int_attr(&span.attributes, MONO_END));
    exact.unwrap_or_else(|| {
        let mono = |wall: u64| (wall as i128 + mono_minus_realtime_ns).max(0) as u64;
        (
            mono(span.start_time_unix_nano),
            mono(span.end_time_unix_nano),
        )
    })
}

/// One span taken out of its request with its resource and scope, so that
/// it can be sent on its own later.
#[derive(Clone, Debug)]
pub struct DetachedSpan {
    pub resource: ResourceSpans,
    pub scope: ScopeSpans,
    pub span: Span,
}

impl DetachedSpan {
    pub fn trace_id(&self) -> &[u8] {
        &self.span.trace_id
    }

    pub fn span_id(&self) -> &[u8] {
        &self.span.span_id
    }

    /// A request holding only this span.
    pub fn into_request(self) -> ExportTraceServiceRequest {
        let DetachedSpan {
            mut resource,
            mut scope,
            span,
        } = self;
        scope.spans = vec![span];
        resource.scope_spans = vec![scope];
        ExportTraceServiceRequest {
            resource_spans: vec![resource],
        }
    }
}

/// Takes the spans at `places` out of `request`; resources and scopes left
/// empty are removed.
pub fn detach(request: &mut ExportTraceServiceRequest, places: &[SpanPlace]) -> Vec<DetachedSpan> {
    let mut out = Vec::with_capacity(places.len());
    // Back to front, so earlier places stay valid while spans are removed.
    let mut sorted = places.to_vec();
    sorted.sort_unstable();
    for &(r, s, i) in sorted.iter().rev() {
        let rs = &mut request.resource_spans[r];
        let span = rs.scope_spans[s].spans.remove(i);
        let ss = &rs.scope_spans[s];
        let scope = ScopeSpans {
            scope: ss.scope.clone(),
            spans: Vec::new(),
            schema_url: ss.schema_url.clone(),
        };
        let resource = resource_shell(rs);
        out.push(DetachedSpan {
            resource,
            scope,
            span,
        });
    }
    out.reverse();
    for rs in &mut request.resource_spans {
        rs.scope_spans.retain(|ss| !ss.spans.is_empty());
    }
    request
        .resource_spans
        .retain(|rs| !rs.scope_spans.is_empty());
    out
}

/// The resource without its spans (cloning them all would be wasted).
fn resource_shell(rs: &ResourceSpans) -> ResourceSpans {
    ResourceSpans {
        resource: rs.resource.clone(),
        scope_spans: Vec::new(),
        schema_url: rs.schema_url.clone(),
    }
}

/// Sets `key` on the span, replacing an attribute of that name.
pub fn set_attribute(span: &mut Span, key: &str, value: any_value::Value) {
    let value = Some(AnyValue { value: Some(value) });
    match span.attributes.iter_mut().find(|kv| kv.key == key) {
        Some(kv) => kv.value = value,
        None => span.attributes.push(KeyValue {
            key: key.to_string(),
            value,
            ..KeyValue::default()
        }),
    }
}

pub fn string(s: impl Into<String>) -> any_value::Value {
    any_value::Value::StringValue(s.into())
}

pub fn int(i: u64) -> any_value::Value {
    any_value::Value::IntValue(i.min(i64::MAX as u64) as i64)
}

/// The requests received lately, as they came, for the span files of
/// snapshots: a window's analysis needs the spans of every request around
/// it, not only the slow one's. Bounded in bytes; the oldest go first.
pub struct RecentRequests {
    requests: VecDeque<RecentRequest>,
    bytes: usize,
    max_bytes: usize,
}

struct RecentRequest {
    encoded: Bytes,
    spans: u64,
    /// Earliest start and latest end of its spans, wall-clock ns.
    first_start_unix_ns: u64,
    last_end_unix_ns: u64,
}

impl RecentRequests {
    pub fn new(max_bytes: usize) -> RecentRequests {
        RecentRequests {
            requests: VecDeque::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Keeps a request of `spans` spans over `time_range` (its digest's);
    /// one without a time range has nothing a window could need.
    pub fn push(&mut self, encoded: Bytes, spans: u64, time_range: Option<(u64, u64)>) {
        let Some((first, last)) = time_range else {
            return;
        };
        self.bytes += encoded.len();
        self.requests.push_back(RecentRequest {
            encoded,
            spans,
            first_start_unix_ns: first,
            last_end_unix_ns: last,
        });
        while self.bytes > self.max_bytes {
            let Some(old) = self.requests.pop_front() else {
                break;
            };
            self.bytes -= old.encoded.len();
        }
    }

    /// The requests with a span in `[start, end]` (wall-clock ns), oldest
    /// first, at most `max_spans` spans of them: when there are more, those
    /// nearest in time to one of `near` (the slow spans' own times) are kept.
    /// Also returns how many spans were left out.
    pub fn overlapping(
        &self,
        start_unix_ns: u64,
        end_unix_ns: u64,
        near: &[(u64, u64)],
        max_spans: u64,
    ) -> (Vec<Bytes>, u64) {
        let mut found: Vec<(usize, &RecentRequest)> = self
            .requests
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.first_start_unix_ns <= end_unix_ns && r.last_end_unix_ns >= start_unix_ns
            })
            .collect();
        let total: u64 = found.iter().map(|(_, r)| r.spans).sum();
        let mut left_out = 0;
        if total > max_spans {
            let distance = |r: &RecentRequest| {
                near.iter()
                    .map(|&(s, e)| {
                        s.saturating_sub(r.last_end_unix_ns)
                            .max(r.first_start_unix_ns.saturating_sub(e))
                    })
                    .min()
                    .unwrap_or(0)
            };
            found.sort_by_key(|(i, r)| (distance(r), *i));
            let mut kept = 0;
            found.retain(|(_, r)| {
                // The nearest request always goes in, whatever its size.
                let keep = kept == 0 || kept + r.spans <= max_spans;
                if keep {
                    kept += r.spans;
                } else {
                    left_out += r.spans;
                }
                keep
            });
            found.sort_by_key(|(i, _)| *i);
        }
        (
            found.into_iter().map(|(_, r)| r.encoded.clone()).collect(),
            left_out,
        )
    }

    /// The oldest wall time still held (a span file for a window before it
    /// would miss spans).
    pub fn oldest_unix_ns(&self) -> Option<u64> {
        self.requests.iter().map(|r| r.first_start_unix_ns).min()
    }
}

/// Encodes a request for the forwarder.
pub fn encode(request: &ExportTraceServiceRequest) -> Bytes {
    Bytes::from(request.encode_to_vec())
}

/// Spans in a request.
pub fn span_count(request: &ExportTraceServiceRequest) -> u64 {
    request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

    fn span(id: u8, parent: Option<u8>, kind: SpanKind, start: u64, end: u64) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: format!("op{id}"),
            kind: kind as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            ..Span::default()
        }
    }

    fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        let resource = Resource {
            attributes: vec![KeyValue {
                key: "service.name".into(),
                value: Some(AnyValue {
                    value: Some(string("shop")),
                }),
                ..KeyValue::default()
            }],
            ..Resource::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                schema_url: String::new(),
            }],
        }
    }

    #[test]
    fn roots_servers_and_consumers_are_requests_clients_and_internals_are_not() {
        let r = request(vec![
            span(1, None, SpanKind::Internal, 0, 10),
            span(2, Some(1), SpanKind::Client, 1, 5),
            span(3, Some(2), SpanKind::Server, 2, 4),
            span(4, Some(3), SpanKind::Internal, 2, 3),
            span(5, Some(3), SpanKind::Consumer, 3, 9),
        ]);
        let found: Vec<_> = deepspan_otlp::digest::digest(&r)
            .request_spans
            .into_iter()
            .map(|s| (s.operation, s.service, s.duration_ns))
            .collect();
        assert_eq!(
            found,
            vec![
                ("op1".into(), "shop".into(), 10),
                ("op3".into(), "shop".into(), 2),
                ("op5".into(), "shop".into(), 6)
            ]
        );
    }

    #[test]
    fn detached_spans_leave_the_rest_of_the_request_as_it_was() {
        let mut r = request(vec![
            span(1, None, SpanKind::Server, 0, 10),
            span(2, Some(1), SpanKind::Client, 1, 5),
            span(3, None, SpanKind::Server, 2, 4),
        ]);
        let taken = detach(&mut r, &[(0, 0, 2), (0, 0, 0)]);
        assert_eq!(
            taken.iter().map(|d| d.span.span_id[0]).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(r.resource_spans[0].scope_spans[0].spans.len(), 1);
        assert_eq!(r.resource_spans[0].scope_spans[0].spans[0].span_id[0], 2);
        let alone = taken[0].clone().into_request();
        assert_eq!(span_count(&alone), 1);
        assert_eq!(
            alone.resource_spans[0].resource,
            r.resource_spans[0].resource
        );

        let mut only = request(vec![span(1, None, SpanKind::Server, 0, 10)]);
        detach(&mut only, &[(0, 0, 0)]);
        assert!(
            only.resource_spans.is_empty(),
            "no empty resource is sent on"
        );
    }

    #[test]
    fn monotonic_times_come_from_the_sdk_fields_when_present() {
        let mut s = span(1, None, SpanKind::Server, 1_000, 2_000);
        assert_eq!(mono_times(&s, -500), (500, 1_500));
        set_attribute(&mut s, MONO_START, int(7));
        set_attribute(&mut s, MONO_END, int(9));
        assert_eq!(mono_times(&s, -500), (7, 9));
    }

    #[test]
    fn recent_requests_are_bounded_and_found_by_time() {
        let mut recent = RecentRequests::new(100);
        for (i, (start, end)) in [(0u64, 10u64), (20, 30), (40, 50)].into_iter().enumerate() {
            let r = request(vec![span(i as u8 + 1, None, SpanKind::Server, start, end)]);
            let digest = deepspan_otlp::digest::digest(&r);
            assert_eq!(digest.time_range, Some((start, end)));
            recent.push(Bytes::from(vec![i as u8; 40]), 1, digest.time_range);
        }
        assert_eq!(
            recent.oldest_unix_ns(),
            Some(20),
            "the first went over the budget"
        );
        assert_eq!(recent.overlapping(25, 45, &[(25, 45)], u64::MAX).0.len(), 2);
        assert_eq!(recent.overlapping(31, 39, &[(31, 39)], u64::MAX).0.len(), 0);
        // Over the span budget, the request nearest the slow span stays.
        let (kept, left_out) = recent.overlapping(0, 100, &[(41, 42)], 1);
        assert_eq!((kept.len(), left_out), (1, 1));
        assert_eq!(kept[0][0], 2, "the request of 40..50");
    }
}
