//! OTLP (OpenTelemetry protocol) in both encodings, through the
//! `opentelemetry-proto` message types: protobuf (prost) and OTLP/JSON (its
//! serde support: hex ids, 64-bit integers as strings or numbers). OTLP/JSON
//! ids that are not 32/16 hex digits are read as in the other JSON formats
//! ([`TraceId::from_text`]: short hex zero-extended, other strings mapped to
//! stable ids with the original text kept, one note per file).

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::resource::v1 as pr;
use opentelemetry_proto::tonic::trace::v1 as pt;
use prost::Message;

use crate::error::{from_json, Error};
use crate::model::*;
use crate::{Format, Import};

/// Parses OTLP/JSON: one `ExportTraceServiceRequest` object, or several
/// (one per line, as the Collector's file exporter writes them).
pub fn parse_otlp_json(bytes: &[u8], source_name: &str) -> Result<Import, Error> {
    let mut import = Import::new(Format::OtlpJson);
    let mut stream =
        serde_json::Deserializer::from_slice(bytes).into_iter::<serde::de::IgnoredAny>();
    let mut start = 0;
    let mut record = 0;
    let mut mapped = MappedIds::default();
    loop {
        match stream.next() {
            None => break,
            Some(Ok(_)) => {
                let end = stream.byte_offset();
                let name = if record == 0 {
                    source_name.to_string()
                } else {
                    format!("{source_name} (JSON value {})", record + 1)
                };
                let value = &bytes[start..end];
                let req: ExportTraceServiceRequest = match from_json(value, &name, "OTLP/JSON") {
                    Ok(req) => req,
                    // Ids that are not hex of the OTLP length fail the typed
                    // parse; only then is the value rewritten (the common
                    // case pays nothing).
                    Err(first_error) => match map_opaque_ids(value, &mut mapped) {
                        Some(rewritten) => from_json(
                            &rewritten,
                            &format!("{name} (with opaque ids mapped; the path is exact, line and column are not)"),
                            "OTLP/JSON",
                        )?,
                        None => return Err(first_error),
                    },
                };
                spans_from_request(&req, &name, "OTLP/JSON", &mut import)?;
                start = end;
                record += 1;
            }
            Some(Err(e)) => {
                return Err(Error::invalid(
                    source_name,
                    "OTLP/JSON",
                    format!("line {} column {}", e.line(), e.column()),
                    e.to_string(),
                ))
            }
        }
    }
    if record == 0 {
        return Err(Error::invalid(
            source_name,
            "OTLP/JSON",
            "start",
            "no JSON value",
        ));
    }
    import.warnings.extend(mapped.note(source_name));
    Ok(import)
}

/// Rewrites the ids of one OTLP/JSON request that are not hex of the OTLP
/// length (32 digits for trace ids, 16 for span ids) to that form, through
/// [`TraceId::from_text`] / [`SpanId::from_text`] as the other importers do,
/// and keeps the original text of opaque ids in `deepspan.original_*`
/// attributes of the span or link. `None` when nothing was rewritten (the
/// first parse error then stands).
fn map_opaque_ids(value: &[u8], mapped: &mut MappedIds) -> Option<Vec<u8>> {
    use serde_json::Value as J;
    let mut doc: J = serde_json::from_slice(value).ok()?;
    let mut changed = false;
    // Rewrites `object[key]`; returns the original text when it was opaque.
    let mut fix = |object: &mut serde_json::Map<String, J>, key: &str, trace: bool| {
        let text = object.get(key)?.as_str()?;
        let digits = if trace { 32 } else { 16 };
        if text.is_empty() || (text.len() == digits && text.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return None;
        }
        let (hex, how) = if trace {
            let (id, how) = TraceId::from_text(text).ok()?;
            (id.to_string(), how)
        } else {
            let (id, how) = SpanId::from_text(text).ok()?;
            (id.to_string(), how)
        };
        let original = mapped.record(text, how).then(|| text.to_string());
        object.insert(key.to_string(), J::String(hex));
        changed = true;
        original
    };
    let keep = |object: &mut serde_json::Map<String, J>, originals: Vec<(&str, String)>| {
        if originals.is_empty() {
            return;
        }
        let attributes = object
            .entry("attributes")
            .or_insert_with(|| J::Array(Vec::new()));
        if let J::Array(list) = attributes {
            for (key, text) in originals {
                list.push(serde_json::json!({"key": key, "value": {"stringValue": text}}));
            }
        }
    };
    let spans = doc
        .get_mut("resourceSpans")?
        .as_array_mut()?
        .iter_mut()
        .filter_map(|rs| rs.get_mut("scopeSpans")?.as_array_mut())
        .flatten()
        .filter_map(|ss| ss.get_mut("spans")?.as_array_mut())
        .flatten()
        .filter_map(J::as_object_mut);
    for span in spans {
        let mut originals = Vec::new();
        for (key, trace, attribute) in [
            ("traceId", true, ATTR_ORIGINAL_TRACE_ID),
            ("spanId", false, ATTR_ORIGINAL_SPAN_ID),
            ("parentSpanId", false, ATTR_ORIGINAL_PARENT_SPAN_ID),
        ] {
            if let Some(text) = fix(span, key, trace) {
                originals.push((attribute, text));
            }
        }
        let links = span
            .get_mut("links")
            .and_then(J::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(J::as_object_mut);
        for link in links {
            let mut link_originals = Vec::new();
            for (key, trace, attribute) in [
                ("traceId", true, ATTR_ORIGINAL_TRACE_ID),
                ("spanId", false, ATTR_ORIGINAL_SPAN_ID),
            ] {
                if let Some(text) = fix(link, key, trace) {
                    link_originals.push((attribute, text));
                }
            }
            keep(link, link_originals);
        }
        keep(span, originals);
    }
    changed.then(|| serde_json::to_vec(&doc).ok()).flatten()
}

/// Parses one binary protobuf `ExportTraceServiceRequest`.
pub fn parse_otlp_protobuf(bytes: &[u8], source_name: &str) -> Result<Import, Error> {
    let req = ExportTraceServiceRequest::decode(bytes).map_err(|e| {
        Error::invalid(
            source_name,
            "OTLP protobuf",
            "ExportTraceServiceRequest",
            e.to_string(),
        )
    })?;
    let mut import = Import::new(Format::OtlpProtobuf);
    spans_from_request(&req, source_name, "OTLP protobuf", &mut import)?;
    Ok(import)
}

/// Converts a decoded request into spans, appending to `import`. Invalid ids
/// are errors (a span without identity cannot be joined to anything);
/// inverted times are clamped with a warning.
pub fn spans_from_request(
    req: &ExportTraceServiceRequest,
    source_name: &str,
    format: &'static str,
    import: &mut Import,
) -> Result<(), Error> {
    for (ri, rs) in req.resource_spans.iter().enumerate() {
        let resource = Arc::new(Resource::new(
            rs.resource
                .as_ref()
                .map(|r| attrs_from(&r.attributes))
                .unwrap_or_default(),
        ));
        for (si, ss) in rs.scope_spans.iter().enumerate() {
            let scope = Arc::new(ss.scope.as_ref().map(scope_from).unwrap_or_default());
            for (pi, ps) in ss.spans.iter().enumerate() {
                let loc = |field: &str| {
                    format!("resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}].{field}")
                };
                let trace_id = TraceId::from_bytes(&ps.trace_id)
                    .filter(|t| t.0 != 0)
                    .ok_or_else(|| {
                        Error::invalid(
                            source_name,
                            format,
                            loc("traceId"),
                            format!(
                                "a trace id is 16 bytes, not all zero; got {} bytes",
                                ps.trace_id.len()
                            ),
                        )
                    })?;
                let span_id = SpanId::from_bytes(&ps.span_id)
                    .filter(|s| s.0 != 0)
                    .ok_or_else(|| {
                        Error::invalid(
                            source_name,
                            format,
                            loc("spanId"),
                            format!(
                                "a span id is 8 bytes, not all zero; got {} bytes",
                                ps.span_id.len()
                            ),
                        )
                    })?;
                let parent_span_id = if ps.parent_span_id.is_empty() {
                    None
                } else {
                    let p = SpanId::from_bytes(&ps.parent_span_id).ok_or_else(|| {
                        Error::invalid(
                            source_name,
                            format,
                            loc("parentSpanId"),
                            format!("a span id is 8 bytes; got {}", ps.parent_span_id.len()),
                        )
                    })?;
                    (p.0 != 0).then_some(p)
                };
                let mut end_ns = ps.end_time_unix_nano;
                if end_ns < ps.start_time_unix_nano {
                    import.warnings.push(format!(
                        "{source_name}: {}: end ({end_ns}) before start ({}); end set to start",
                        loc("endTimeUnixNano"),
                        ps.start_time_unix_nano
                    ));
                    end_ns = ps.start_time_unix_nano;
                }
                let mut links = Vec::with_capacity(ps.links.len());
                for (li, l) in ps.links.iter().enumerate() {
                    let (Some(t), Some(s)) = (
                        TraceId::from_bytes(&l.trace_id),
                        SpanId::from_bytes(&l.span_id),
                    ) else {
                        import.warnings.push(format!(
                            "{source_name}: {}: link with invalid ids ignored",
                            loc(&format!("links[{li}]"))
                        ));
                        continue;
                    };
                    links.push(Link {
                        trace_id: t,
                        span_id: s,
                        trace_state: l.trace_state.clone(),
                        attributes: attrs_from(&l.attributes),
                    });
                }
                let status = ps.status.as_ref().map(|s| Status {
                    code: match s.code {
                        1 => StatusCode::Ok,
                        2 => StatusCode::Error,
                        _ => StatusCode::Unset,
                    },
                    message: s.message.clone(),
                });
                let mut span = Span {
                    trace_id,
                    span_id,
                    parent_span_id,
                    trace_state: ps.trace_state.clone(),
                    name: ps.name.clone(),
                    kind: SpanKind::from_otlp(ps.kind),
                    resource: resource.clone(),
                    scope: scope.clone(),
                    start_ns: ps.start_time_unix_nano,
                    end_ns,
                    attributes: attrs_from(&ps.attributes),
                    events: ps
                        .events
                        .iter()
                        .map(|e| Event {
                            name: e.name.clone(),
                            time_ns: e.time_unix_nano,
                            attributes: attrs_from(&e.attributes),
                        })
                        .collect(),
                    links,
                    status: status.unwrap_or_default(),
                    sync: SyncInfo::default(),
                };
                span.refresh_sync();
                import.spans.push(span);
            }
        }
    }
    Ok(())
}

/// Builds one request from spans, grouping consecutive spans that share a
/// resource and scope (the usual case for a batch) into one
/// ResourceSpans/ScopeSpans.
pub fn request_from_spans(spans: &[Span]) -> ExportTraceServiceRequest {
    let mut out: Vec<pt::ResourceSpans> = Vec::new();
    let mut last: Option<(Arc<Resource>, Arc<Scope>)> = None;
    for s in spans {
        let same_resource = last
            .as_ref()
            .is_some_and(|(r, _)| Arc::ptr_eq(r, &s.resource) || **r == *s.resource);
        let same_scope = same_resource
            && last
                .as_ref()
                .is_some_and(|(_, sc)| Arc::ptr_eq(sc, &s.scope) || **sc == *s.scope);
        if !same_resource {
            out.push(pt::ResourceSpans {
                resource: Some(pr::Resource {
                    attributes: attrs_to(&s.resource.attributes),
                    ..Default::default()
                }),
                scope_spans: Vec::new(),
                schema_url: String::new(),
            });
        }
        let rs = out.last_mut().expect("pushed above");
        if !same_scope {
            rs.scope_spans.push(pt::ScopeSpans {
                scope: Some(pc::InstrumentationScope {
                    name: s.scope.name.clone(),
                    version: s.scope.version.clone(),
                    attributes: attrs_to(&s.scope.attributes),
                    dropped_attributes_count: 0,
                }),
                spans: Vec::new(),
                schema_url: String::new(),
            });
        }
        rs.scope_spans
            .last_mut()
            .expect("pushed above")
            .spans
            .push(span_to(s));
        last = Some((s.resource.clone(), s.scope.clone()));
    }
    ExportTraceServiceRequest {
        resource_spans: out,
    }
}

fn span_to(s: &Span) -> pt::Span {
    pt::Span {
        trace_id: s.trace_id.to_bytes().to_vec(),
        span_id: s.span_id.to_bytes().to_vec(),
        trace_state: s.trace_state.clone(),
        parent_span_id: s
            .parent_span_id
            .map(|p| p.to_bytes().to_vec())
            .unwrap_or_default(),
        flags: 0,
        name: s.name.clone(),
        kind: s.kind.to_otlp(),
        start_time_unix_nano: s.start_ns,
        end_time_unix_nano: s.end_ns,
        attributes: attrs_to(&s.attributes),
        dropped_attributes_count: 0,
        events: s
            .events
            .iter()
            .map(|e| pt::span::Event {
                time_unix_nano: e.time_ns,
                name: e.name.clone(),
                attributes: attrs_to(&e.attributes),
                dropped_attributes_count: 0,
            })
            .collect(),
        dropped_events_count: 0,
        links: s
            .links
            .iter()
            .map(|l| pt::span::Link {
                trace_id: l.trace_id.to_bytes().to_vec(),
                span_id: l.span_id.to_bytes().to_vec(),
                trace_state: l.trace_state.clone(),
                attributes: attrs_to(&l.attributes),
                dropped_attributes_count: 0,
                flags: 0,
            })
            .collect(),
        dropped_links_count: 0,
        status: match (s.status.code, s.status.message.is_empty()) {
            (StatusCode::Unset, true) => None,
            (code, _) => Some(pt::Status {
                message: s.status.message.clone(),
                code: match code {
                    StatusCode::Unset => 0,
                    StatusCode::Ok => 1,
                    StatusCode::Error => 2,
                },
            }),
        },
    }
}

fn scope_from(s: &pc::InstrumentationScope) -> Scope {
    Scope {
        name: s.name.clone(),
        version: s.version.clone(),
        attributes: attrs_from(&s.attributes),
    }
}

pub(crate) fn attrs_from(kvs: &[pc::KeyValue]) -> Attributes {
    Attributes(
        kvs.iter()
            .map(|kv| {
                (
                    kv.key.clone(),
                    kv.value.as_ref().map(value_from).unwrap_or(Value::Empty),
                )
            })
            .collect(),
    )
}

fn value_from(v: &pc::AnyValue) -> Value {
    use pc::any_value::Value as V;
    match &v.value {
        None => Value::Empty,
        Some(V::StringValue(s)) => Value::String(s.clone()),
        Some(V::BoolValue(b)) => Value::Bool(*b),
        Some(V::IntValue(i)) => Value::Int(*i),
        Some(V::DoubleValue(d)) => Value::Double(*d),
        Some(V::BytesValue(b)) => Value::Bytes(b.clone()),
        Some(V::ArrayValue(a)) => Value::Array(a.values.iter().map(value_from).collect()),
        Some(V::KvlistValue(kv)) => Value::Map(attrs_from(&kv.values)),
        // Newer protos add variants (string tables); keep them visible as empty.
        #[allow(unreachable_patterns)]
        Some(_) => Value::Empty,
    }
}

pub(crate) fn attrs_to(a: &Attributes) -> Vec<pc::KeyValue> {
    a.iter()
        .map(|(k, v)| pc::KeyValue {
            key: k.to_string(),
            value: Some(value_to(v)),
            ..Default::default()
        })
        .collect()
}

fn value_to(v: &Value) -> pc::AnyValue {
    use pc::any_value::Value as V;
    pc::AnyValue {
        value: match v {
            Value::String(s) => Some(V::StringValue(s.clone())),
            Value::Bool(b) => Some(V::BoolValue(*b)),
            Value::Int(i) => Some(V::IntValue(*i)),
            Value::Double(d) => Some(V::DoubleValue(*d)),
            Value::Bytes(b) => Some(V::BytesValue(b.clone())),
            Value::Array(a) => Some(V::ArrayValue(pc::ArrayValue {
                values: a.iter().map(value_to).collect(),
            })),
            Value::Map(m) => Some(V::KvlistValue(pc::KeyValueList {
                values: attrs_to(m),
            })),
            Value::Empty => None,
        },
    }
}
