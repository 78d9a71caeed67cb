//! Checks the spans of a request before it is stored.
//!
//! deepspan's span reader refuses a record holding a span without a valid
//! identity (it could not be joined to anything), and would then stop
//! reading that file. So such spans are taken out here and reported to the
//! sender as a partial success, as the OTLP specification suggests, instead
//! of poisoning the run.

use deepspan_spans::ExportTraceServiceRequest;

pub(crate) struct Screened {
    /// Spans in the request as received.
    pub spans: u64,
    /// Spans taken out.
    pub rejected: u64,
    /// Why the first one was, with its location in the request.
    pub problem: Option<String>,
}

pub(crate) fn screen(request: &mut ExportTraceServiceRequest) -> Screened {
    let mut out = Screened {
        spans: 0,
        rejected: 0,
        problem: None,
    };
    for (ri, rs) in request.resource_spans.iter_mut().enumerate() {
        for (si, ss) in rs.scope_spans.iter_mut().enumerate() {
            let mut pi = 0;
            ss.spans.retain(|span| {
                let verdict = check(&span.trace_id, &span.span_id, &span.parent_span_id);
                if let Err(reason) = &verdict {
                    out.rejected += 1;
                    out.problem.get_or_insert_with(|| {
                        format!("resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]: {reason}")
                    });
                }
                pi += 1;
                verdict.is_ok()
            });
            out.spans += pi as u64;
        }
    }
    out
}

fn check(trace_id: &[u8], span_id: &[u8], parent_span_id: &[u8]) -> Result<(), String> {
    if trace_id.len() != 16 || trace_id.iter().all(|&b| b == 0) {
        return Err(format!(
            "traceId must be 16 bytes, not all zero (got {} bytes)",
            trace_id.len()
        ));
    }
    if span_id.len() != 8 || span_id.iter().all(|&b| b == 0) {
        return Err(format!(
            "spanId must be 8 bytes, not all zero (got {} bytes)",
            span_id.len()
        ));
    }
    if !parent_span_id.is_empty() && parent_span_id.len() != 8 {
        return Err(format!(
            "parentSpanId must be empty or 8 bytes (got {} bytes)",
            parent_span_id.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn span(trace: Vec<u8>, id: Vec<u8>) -> Span {
        Span {
            trace_id: trace,
            span_id: id,
            ..Default::default()
        }
    }

    #[test]
    fn invalid_ids_are_taken_out_and_located() {
        let mut req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![
                        span(vec![1; 16], vec![2; 8]),
                        span(vec![], vec![2; 8]),
                        span(vec![1; 16], vec![0; 8]),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let s = screen(&mut req);
        assert_eq!((s.spans, s.rejected), (3, 2));
        assert_eq!(
            s.problem.unwrap(),
            "resourceSpans[0].scopeSpans[0].spans[1]: traceId must be 16 bytes, not all zero (got 0 bytes)"
        );
        assert_eq!(req.resource_spans[0].scope_spans[0].spans.len(), 1);
    }
}
