//! What a request sink reads of each request, made on the receiver's
//! network threads while the request is decoded anyway: the sink runs on
//! one thread, and decoding every request a second time there was most of
//! the live agent's own CPU beside the decoding here.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};

use deepspan_spans::ExportTraceServiceRequest;

/// Where a span sits in its request: resource, scope, span indexes.
pub type SpanPlace = (usize, usize, usize);

/// A request span: a root, SERVER or CONSUMER span, which starts a
/// request's work in its process (the analysis's rule: client and internal
/// spans belong to a request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpan {
    pub place: SpanPlace,
    /// The resource's `service.name`, or `unknown_service`.
    pub service: String,
    pub operation: String,
    pub duration_ns: u64,
}

/// A request as a sink sees it without decoding it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDigest {
    /// Earliest start and latest end of its spans (Unix ns); `None` when
    /// it has none, or only spans that end before they start.
    pub time_range: Option<(u64, u64)>,
    /// Its request spans, in order.
    pub request_spans: Vec<RequestSpan>,
}

/// The digest of `request` (as the sink gets it: screened).
pub fn digest(request: &ExportTraceServiceRequest) -> RequestDigest {
    let mut out = RequestDigest::default();
    let (mut first, mut last) = (u64::MAX, 0);
    for (r, rs) in request.resource_spans.iter().enumerate() {
        let service = rs
            .resource
            .as_ref()
            .and_then(|res| string_attr(&res.attributes, "service.name"))
            .unwrap_or("unknown_service");
        for (s, ss) in rs.scope_spans.iter().enumerate() {
            for (i, span) in ss.spans.iter().enumerate() {
                first = first.min(span.start_time_unix_nano);
                last = last.max(span.end_time_unix_nano);
                if !is_request(span) {
                    continue;
                }
                out.request_spans.push(RequestSpan {
                    place: (r, s, i),
                    service: service.to_string(),
                    operation: span.name.clone(),
                    duration_ns: span
                        .end_time_unix_nano
                        .saturating_sub(span.start_time_unix_nano),
                });
            }
        }
    }
    out.time_range = (first <= last).then_some((first, last));
    out
}

fn is_request(span: &Span) -> bool {
    span.parent_span_id.is_empty()
        || span.kind == SpanKind::Server as i32
        || span.kind == SpanKind::Consumer as i32
}

fn string_attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match &kv.value {
            Some(AnyValue {
                value: Some(any_value::Value::StringValue(s)),
            }) => Some(s.as_str()),
            _ => None,
        })
}
