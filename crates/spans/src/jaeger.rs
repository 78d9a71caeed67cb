//! Jaeger JSON: the query API answer (`{"data": [trace, ...]}`), the UI's
//! single-trace download (`{traceID, spans, processes}`) and a bare array of
//! such traces. Times are µs. Conventions follow the OpenTelemetry
//! Collector's Jaeger translator, so a trace converted OTLP → Jaeger by
//! jaeger-query reads back as the same spans:
//! - parent: the first CHILD_OF reference in the same trace, else the first
//!   FOLLOWS_FROM one (Jaeger's `ParentSpanID`); every other reference, and a
//!   FOLLOWS_FROM parent, becomes a link with `opentracing.ref_type`;
//! - tags `span.kind`, `otel.status_code`, `otel.status_description`,
//!   `error`, `otel.scope.name`/`otel.library.name`, `otel.scope.version`,
//!   `w3c.tracestate` become the span's kind, status, scope and trace state;
//! - a log's `event` field is the event name;
//! - ids are read with [`TraceId::from_text`] / [`SpanId::from_text`]: hex as
//!   numbers, other strings (Jaeger UI takes ids as opaque strings; its test
//!   traces use "span-A") hashed to stable ids, the original text kept in
//!   `deepspan.original_trace_id` / `deepspan.original_span_id` /
//!   `deepspan.original_parent_span_id` (on links for the ids they point
//!   to), and one note per file says how many strings were mapped.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::Error;
use crate::model::*;
use crate::{Format, Import};

const FORMAT: &str = "Jaeger JSON";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JTrace {
    #[serde(rename = "traceID", default)]
    _trace_id: Option<String>,
    spans: Vec<JSpan>,
    #[serde(default)]
    processes: HashMap<String, JProcess>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct JProcess {
    #[serde(default)]
    service_name: String,
    #[serde(default)]
    tags: Vec<JTag>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JSpan {
    #[serde(rename = "traceID")]
    trace_id: Option<String>,
    #[serde(rename = "spanID")]
    span_id: String,
    #[serde(default)]
    operation_name: String,
    #[serde(default)]
    references: Vec<JRef>,
    start_time: serde_json::Number,
    duration: serde_json::Number,
    #[serde(default)]
    tags: Vec<JTag>,
    #[serde(default)]
    logs: Vec<JLog>,
    #[serde(rename = "processID", default)]
    process_id: Option<String>,
    #[serde(default)]
    process: Option<JProcess>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JRef {
    ref_type: String,
    #[serde(rename = "traceID", default)]
    trace_id: Option<String>,
    #[serde(rename = "spanID")]
    span_id: String,
}

#[derive(Deserialize, Clone)]
struct JTag {
    key: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    value: Json,
}

#[derive(Deserialize)]
struct JLog {
    timestamp: serde_json::Number,
    #[serde(default)]
    fields: Vec<JTag>,
}

/// Parses any of the Jaeger JSON shapes named in the module doc.
pub fn parse_jaeger_json(bytes: &[u8], source_name: &str) -> Result<Import, Error> {
    let doc: Json = serde_json::from_slice(bytes).map_err(|e| {
        Error::invalid(
            source_name,
            FORMAT,
            format!("line {} column {}", e.line(), e.column()),
            e.to_string(),
        )
    })?;
    parse_jaeger_value(doc, source_name)
}

pub(crate) fn parse_jaeger_value(doc: Json, source_name: &str) -> Result<Import, Error> {
    let (traces, prefix): (Vec<Json>, &str) =
        match doc {
            Json::Object(mut m) if m.contains_key("data") => match m.remove("data") {
                Some(Json::Array(a)) => (a, "data"),
                Some(Json::Null) => (Vec::new(), "data"),
                _ => {
                    return Err(Error::invalid(
                        source_name,
                        FORMAT,
                        "data",
                        "expected an array of traces",
                    ))
                }
            },
            Json::Object(m) if m.contains_key("spans") => (vec![Json::Object(m)], ""),
            Json::Array(a) => (a, ""),
            _ => return Err(Error::invalid(
                source_name,
                FORMAT,
                "top level",
                "expected {\"data\": [...]}, a trace object with \"spans\", or an array of traces",
            )),
        };
    let mut import = Import::new(Format::JaegerJson);
    let mut resources: HashMap<String, Arc<Resource>> = HashMap::new();
    let empty_scope = Arc::new(Scope::default());
    let mut scopes: HashMap<(String, String), Arc<Scope>> = HashMap::new();
    let mut mapped = MappedIds::default();
    for (ti, t) in traces.into_iter().enumerate() {
        let tloc = if prefix.is_empty() && ti == 0 {
            String::new()
        } else if prefix.is_empty() {
            format!("[{ti}]")
        } else {
            format!("{prefix}[{ti}]")
        };
        let trace: JTrace = serde_path_to_error::deserialize(t).map_err(|e| {
            let p = e.path().to_string();
            Error::invalid(
                source_name,
                FORMAT,
                join(&tloc, &p),
                e.into_inner().to_string(),
            )
        })?;
        for (si, js) in trace.spans.into_iter().enumerate() {
            let loc = |f: &str| join(&tloc, &format!("spans[{si}].{f}"));
            let trace_hex = js
                .trace_id
                .as_deref()
                .or(trace._trace_id.as_deref())
                .unwrap_or("");
            let (trace_id, trace_how) = TraceId::from_text_nonzero(trace_hex).map_err(|why| {
                Error::invalid(
                    source_name,
                    FORMAT,
                    loc("traceID"),
                    format!("not a usable trace id: {trace_hex:?}: {why}"),
                )
            })?;
            let (span_id, span_how) = SpanId::from_text(&js.span_id).map_err(|why| {
                Error::invalid(
                    source_name,
                    FORMAT,
                    loc("spanID"),
                    format!("not a usable span id: {:?}: {why}", js.span_id),
                )
            })?;
            // (attribute, original text) for the ids read as opaque strings.
            let mut originals: Vec<(&str, String)> = Vec::new();
            if mapped.record(trace_hex, trace_how) {
                originals.push((ATTR_ORIGINAL_TRACE_ID, trace_hex.to_string()));
            }
            if mapped.record(&js.span_id, span_how) {
                originals.push((ATTR_ORIGINAL_SPAN_ID, js.span_id.clone()));
            }
            let start_us = micros(&js.start_time).ok_or_else(|| {
                Error::invalid(
                    source_name,
                    FORMAT,
                    loc("startTime"),
                    format!("not a non-negative µs time: {}", js.start_time),
                )
            })?;
            let dur_us = micros(&js.duration).ok_or_else(|| {
                Error::invalid(
                    source_name,
                    FORMAT,
                    loc("duration"),
                    format!("not a non-negative µs duration: {}", js.duration),
                )
            })?;

            // Parent per Jaeger's ParentSpanID(): first CHILD_OF in the same trace, else first FOLLOWS_FROM.
            let mut refs = Vec::with_capacity(js.references.len());
            for (ri, r) in js.references.iter().enumerate() {
                let mut ref_originals = Vec::new();
                let rt = match r.trace_id.as_deref() {
                    None | Some("") => trace_id,
                    Some(text) => {
                        let (id, how) = TraceId::from_text(text).map_err(|why| {
                            Error::invalid(
                                source_name,
                                FORMAT,
                                loc(&format!("references[{ri}].traceID")),
                                format!("not a usable trace id: {text:?}: {why}"),
                            )
                        })?;
                        if mapped.record(text, how) {
                            ref_originals.push((ATTR_ORIGINAL_TRACE_ID, text.to_string()));
                        }
                        id
                    }
                };
                let (rs, rs_how) = SpanId::from_text(&r.span_id).map_err(|why| {
                    Error::invalid(
                        source_name,
                        FORMAT,
                        loc(&format!("references[{ri}].spanID")),
                        format!("not a usable span id: {:?}: {why}", r.span_id),
                    )
                })?;
                if mapped.record(&r.span_id, rs_how) {
                    ref_originals.push((ATTR_ORIGINAL_SPAN_ID, r.span_id.clone()));
                }
                let follows = match r.ref_type.to_ascii_uppercase().as_str() {
                    "CHILD_OF" => false,
                    "FOLLOWS_FROM" => true,
                    other => {
                        return Err(Error::invalid(
                            source_name,
                            FORMAT,
                            loc(&format!("references[{ri}].refType")),
                            format!("unknown reference type {other:?}"),
                        ))
                    }
                };
                refs.push((rt, rs, follows, ref_originals));
            }
            let parent_ref = refs
                .iter()
                .position(|r| r.0 == trace_id && !r.2)
                .or_else(|| refs.iter().position(|r| r.0 == trace_id && r.2));
            let parent_span_id = parent_ref.map(|i| refs[i].1);
            if let Some(original) = parent_ref.and_then(|i| {
                refs[i]
                    .3
                    .iter()
                    .find(|(attr, _)| *attr == ATTR_ORIGINAL_SPAN_ID)
            }) {
                originals.push((ATTR_ORIGINAL_PARENT_SPAN_ID, original.1.clone()));
            }
            let links = refs
                .iter()
                .enumerate()
                .filter(|(i, r)| Some(*i) != parent_ref || r.2)
                .map(|(_, r)| {
                    let mut attributes = Attributes(vec![(
                        ATTR_REF_TYPE.to_string(),
                        Value::String(if r.2 { "follows_from" } else { "child_of" }.to_string()),
                    )]);
                    for (attr, text) in &r.3 {
                        attributes.insert(*attr, Value::String(text.clone()));
                    }
                    Link {
                        trace_id: r.0,
                        span_id: r.1,
                        trace_state: String::new(),
                        attributes,
                    }
                })
                .collect();

            let process = match (&js.process, &js.process_id) {
                (Some(p), _) => p.clone(),
                (None, Some(pid)) => trace.processes.get(pid).cloned().ok_or_else(|| {
                    Error::invalid(
                        source_name,
                        FORMAT,
                        loc("processID"),
                        format!("process {pid:?} is not in the trace's processes"),
                    )
                })?,
                (None, None) => JProcess {
                    service_name: String::new(),
                    tags: Vec::new(),
                },
            };
            let rkey = resource_key(&process);
            let resource = resources
                .entry(rkey)
                .or_insert_with(|| {
                    let attrs = Attributes(
                        process
                            .tags
                            .iter()
                            .map(|t| (t.key.clone(), tag_value(t)))
                            .collect(),
                    );
                    let svc = if process.service_name.is_empty() {
                        "unknown_service"
                    } else {
                        &process.service_name
                    };
                    Arc::new(Resource::with_service(svc, attrs))
                })
                .clone();

            let mut attributes = Attributes(
                js.tags
                    .iter()
                    .map(|t| (t.key.clone(), tag_value(t)))
                    .collect(),
            );
            let kind = match attributes.remove("span.kind") {
                Some(v) => SpanKind::from_name(&v.to_string()).unwrap_or(SpanKind::Unspecified),
                None => SpanKind::Unspecified,
            };
            let mut status = Status::default();
            if let Some(v) = attributes.remove("otel.status_code") {
                status.code = match v.to_string().to_ascii_uppercase().as_str() {
                    "OK" => StatusCode::Ok,
                    "ERROR" => StatusCode::Error,
                    _ => StatusCode::Unset,
                };
            }
            if let Some(v) = attributes.remove("otel.status_description") {
                status.message = v.to_string();
            }
            if status.code == StatusCode::Unset
                && matches!(attributes.get("error"), Some(Value::Bool(true)))
            {
                status.code = StatusCode::Error;
                attributes.remove("error");
            }
            for (attr, text) in originals {
                attributes.insert(attr, Value::String(text));
            }
            let trace_state = attributes
                .remove("w3c.tracestate")
                .map(|v| v.to_string())
                .unwrap_or_default();
            let scope_name = attributes
                .remove("otel.scope.name")
                .or_else(|| attributes.remove("otel.library.name"))
                .map(|v| v.to_string());
            let scope_version = attributes
                .remove("otel.scope.version")
                .or_else(|| attributes.remove("otel.library.version"))
                .map(|v| v.to_string());
            let scope = match (scope_name, scope_version) {
                (None, None) => empty_scope.clone(),
                (n, v) => {
                    let key = (n.unwrap_or_default(), v.unwrap_or_default());
                    scopes
                        .entry(key.clone())
                        .or_insert_with(|| {
                            Arc::new(Scope {
                                name: key.0,
                                version: key.1,
                                attributes: Attributes::default(),
                            })
                        })
                        .clone()
                }
            };

            let mut events = Vec::with_capacity(js.logs.len());
            for (li, l) in js.logs.iter().enumerate() {
                let ts = micros(&l.timestamp).ok_or_else(|| {
                    Error::invalid(
                        source_name,
                        FORMAT,
                        loc(&format!("logs[{li}].timestamp")),
                        format!("not a µs time: {}", l.timestamp),
                    )
                })?;
                let mut attrs = Attributes(
                    l.fields
                        .iter()
                        .map(|t| (t.key.clone(), tag_value(t)))
                        .collect(),
                );
                let name = attrs
                    .remove("event")
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                events.push(Event {
                    name,
                    time_ns: ts.saturating_mul(1000),
                    attributes: attrs,
                });
            }

            let start_ns = start_us.saturating_mul(1000);
            let mut span = Span {
                trace_id,
                span_id,
                parent_span_id,
                trace_state,
                name: js.operation_name,
                kind,
                resource,
                scope,
                start_ns,
                end_ns: start_ns.saturating_add(dur_us.saturating_mul(1000)),
                attributes,
                events,
                links,
                status,
                sync: SyncInfo::default(),
            };
            span.refresh_sync();
            import.spans.push(span);
        }
    }
    import.warnings.extend(mapped.note(source_name));
    Ok(import)
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty() || b == ".") {
        (true, true) => "top level".to_string(),
        (true, false) => b.to_string(),
        (false, true) => a.to_string(),
        (false, false) => format!("{a}.{b}"),
    }
}

fn resource_key(p: &JProcess) -> String {
    let mut k = p.service_name.clone();
    for t in &p.tags {
        k.push('\u{1}');
        k.push_str(&t.key);
        k.push('=');
        k.push_str(&t.value.to_string());
    }
    k
}

/// µs from a JSON number; fractional µs (some exporters write floats) are truncated.
fn micros(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| *f >= 0.0 && f.is_finite())
            .map(|f| f as u64)
    })
}

/// A tag's typed value; the `type` field wins, else the JSON type decides
/// (jaeger-ui fixtures omit `type`).
fn tag_value(t: &JTag) -> Value {
    let ty = t.kind.as_deref().unwrap_or("").to_ascii_lowercase();
    match (ty.as_str(), &t.value) {
        ("bool", Json::Bool(b)) => Value::Bool(*b),
        ("bool", Json::String(s)) => Value::Bool(s == "true"),
        ("int64", Json::Number(n)) => n
            .as_i64()
            .map(Value::Int)
            .unwrap_or_else(|| Value::Double(n.as_f64().unwrap_or(0.0))),
        ("int64", Json::String(s)) => s
            .parse()
            .map(Value::Int)
            .unwrap_or_else(|_| Value::String(s.clone())),
        ("float64", Json::Number(n)) => Value::Double(n.as_f64().unwrap_or(0.0)),
        ("float64", Json::String(s)) => s
            .parse()
            .map(Value::Double)
            .unwrap_or_else(|_| Value::String(s.clone())),
        ("binary", Json::String(s)) => Value::String(s.clone()),
        (_, Json::String(s)) => Value::String(s.clone()),
        (_, Json::Bool(b)) => Value::Bool(*b),
        (_, Json::Number(n)) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Double(n.as_f64().unwrap_or(0.0)),
        },
        (_, Json::Null) => Value::Empty,
        (_, other) => Value::String(other.to_string()),
    }
}
