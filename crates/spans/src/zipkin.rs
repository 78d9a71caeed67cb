//! Zipkin v2 JSON: an array of spans (one trace, as zipkin-lens and the
//! `/api/v2/trace/{id}` endpoint give) or an array of such arrays
//! (`/api/v2/traces`). Times are µs.
//!
//! Zipkin peculiarities and what is done about them:
//! - **Fragments.** A span may be reported in several pieces. They are merged
//!   as Zipkin's `Trace.merge` does: same id, same `shared` flag, compatible
//!   local endpoints. A CLIENT/SERVER pair sharing an id gets the server's
//!   missing `shared` flag back-filled, as Zipkin does.
//! - **Shared span ids.** With B3 the client and the server side of an RPC
//!   share one span id; Zipkin keeps them as two spans. Our model needs one
//!   id per span, so every extra span with an id already used in the trace
//!   (the `shared` server side first of all) gets a *derived* id: a
//!   deterministic mix of the original id, `n` and the local endpoint, never
//!   colliding with an id of the trace. The original id is kept in the
//!   `zipkin.span_id` attribute, the server side's parent becomes the client
//!   side (as Jaeger's span-id deduper does), and a child whose `parentId` is
//!   the shared id is attached to the side in its own service (else the client).
//! - **No timestamp.** A span without `timestamp` takes its first annotation
//!   time; with no annotation either it cannot be placed in time and is
//!   dropped, with a warning naming how many and which.
//! - **No duration.** The span ends at its last annotation, or is
//!   zero-length; a warning counts them.
//! - **Ids that are not hex** are opaque strings mapped to stable ids with
//!   the original text kept, as in the Jaeger importer
//!   ([`TraceId::from_text`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::Error;
use crate::model::*;
use crate::{Format, Import};

const FORMAT: &str = "Zipkin v2 JSON";

#[derive(Deserialize, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
struct ZEndpoint {
    #[serde(default)]
    service_name: Option<String>,
    #[serde(default)]
    ipv4: Option<String>,
    #[serde(default)]
    ipv6: Option<String>,
    #[serde(default)]
    port: Option<u16>,
}

#[derive(Deserialize, Clone)]
struct ZAnnotation {
    timestamp: u64,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct ZSpan {
    trace_id: String,
    id: String,
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    timestamp: Option<u64>,
    #[serde(default)]
    duration: Option<u64>,
    #[serde(default)]
    local_endpoint: Option<ZEndpoint>,
    #[serde(default)]
    remote_endpoint: Option<ZEndpoint>,
    #[serde(default)]
    annotations: Vec<ZAnnotation>,
    #[serde(default)]
    tags: HashMap<String, Json>,
    #[serde(default)]
    shared: Option<bool>,
    #[serde(skip)]
    index: usize,
}

impl ZSpan {
    fn is_shared(&self) -> bool {
        self.shared == Some(true)
    }
    fn service(&self) -> &str {
        self.local_endpoint
            .as_ref()
            .and_then(|e| e.service_name.as_deref())
            .unwrap_or("")
    }
    fn is_kind(&self, k: &str) -> bool {
        self.kind
            .as_deref()
            .is_some_and(|x| x.eq_ignore_ascii_case(k))
    }
}

/// Parses Zipkin v2 JSON (see the module doc for how Zipkin's quirks map to
/// the span model).
pub fn parse_zipkin_json(bytes: &[u8], source_name: &str) -> Result<Import, Error> {
    let doc: Json = serde_json::from_slice(bytes).map_err(|e| {
        Error::invalid(
            source_name,
            FORMAT,
            format!("line {} column {}", e.line(), e.column()),
            e.to_string(),
        )
    })?;
    parse_zipkin_value(doc, source_name)
}

pub(crate) fn parse_zipkin_value(doc: Json, source_name: &str) -> Result<Import, Error> {
    let Json::Array(items) = doc else {
        return Err(Error::invalid(
            source_name,
            FORMAT,
            "top level",
            "expected an array of spans (or of traces)",
        ));
    };
    let nested = items.first().is_some_and(|v| v.is_array());
    let groups: Vec<(String, Vec<Json>)> = if nested {
        items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Json::Array(a) => Ok((format!("[{i}]"), a)),
                _ => Err(Error::invalid(
                    source_name,
                    FORMAT,
                    format!("[{i}]"),
                    "expected an array of spans, like the other elements",
                )),
            })
            .collect::<Result<_, _>>()?
    } else {
        vec![(String::new(), items)]
    };
    let mut import = Import::new(Format::ZipkinJson);
    let mut resources: HashMap<String, Arc<Resource>> = HashMap::new();
    let scope = Arc::new(Scope::default());
    let mut mapped = MappedIds::default();
    for (prefix, spans) in groups {
        let mut zspans = Vec::with_capacity(spans.len());
        for (i, v) in spans.into_iter().enumerate() {
            let mut z: ZSpan = serde_path_to_error::deserialize(v).map_err(|e| {
                let p = e.path().to_string();
                Error::invalid(
                    source_name,
                    FORMAT,
                    format!("{prefix}[{i}].{p}"),
                    e.into_inner().to_string(),
                )
            })?;
            z.index = i;
            zspans.push(z);
        }
        // Traces are independent: merge and de-duplicate per trace id.
        let mut by_trace: Vec<(TraceId, Vec<ZSpan>)> = Vec::new();
        for z in zspans {
            let (t, trace_how) = TraceId::from_text_nonzero(&z.trace_id).map_err(|why| {
                Error::invalid(
                    source_name,
                    FORMAT,
                    format!("{prefix}[{}].traceId", z.index),
                    format!("not a usable trace id: {:?}: {why}", z.trace_id),
                )
            })?;
            mapped.record(&z.trace_id, trace_how);
            let (_, span_how) = SpanId::from_text(&z.id).map_err(|why| {
                Error::invalid(
                    source_name,
                    FORMAT,
                    format!("{prefix}[{}].id", z.index),
                    format!("not a usable span id: {:?}: {why}", z.id),
                )
            })?;
            mapped.record(&z.id, span_how);
            if let Some(p) = &z.parent_id {
                let (_, parent_how) = SpanId::from_text(p).map_err(|why| {
                    Error::invalid(
                        source_name,
                        FORMAT,
                        format!("{prefix}[{}].parentId", z.index),
                        format!("not a usable span id: {p:?}: {why}"),
                    )
                })?;
                mapped.record(p, parent_how);
            }
            match by_trace.iter_mut().find(|(id, _)| *id == t) {
                Some((_, v)) => v.push(z),
                None => by_trace.push((t, vec![z])),
            }
        }
        for (trace_id, spans) in by_trace {
            convert_trace(
                trace_id,
                spans,
                source_name,
                &prefix,
                &mut resources,
                &scope,
                &mut import,
            );
        }
    }
    import.warnings.extend(mapped.note(source_name));
    Ok(import)
}

/// The id of a span id string already checked by [`parse_zipkin_value`].
fn checked_span_id(text: &str) -> SpanId {
    SpanId::from_text(text)
        .map(|(id, _)| id)
        .unwrap_or_default()
}

/// The original text of an id read as an opaque string, for the
/// `deepspan.original_*` attributes.
fn mapped_span_text(text: &str) -> Option<&str> {
    matches!(SpanId::from_text(text), Ok((_, IdText::Mapped))).then_some(text)
}

fn convert_trace(
    trace_id: TraceId,
    spans: Vec<ZSpan>,
    source_name: &str,
    prefix: &str,
    resources: &mut HashMap<String, Arc<Resource>>,
    scope: &Arc<Scope>,
    import: &mut Import,
) {
    let merged = merge(spans);

    let mut untimed = Vec::new();
    let mut no_duration = 0usize;
    let mut timed: Vec<(ZSpan, u64, u64)> = Vec::new();
    for z in merged {
        let first_ann = z.annotations.iter().map(|a| a.timestamp).min();
        let last_ann = z.annotations.iter().map(|a| a.timestamp).max();
        let Some(start) = z.timestamp.or(first_ann) else {
            untimed.push(format!(
                "{prefix}[{}] id {} {:?}",
                z.index,
                z.id,
                z.name.as_deref().unwrap_or("")
            ));
            continue;
        };
        let end = match z.duration {
            Some(d) => start.saturating_add(d),
            None => {
                no_duration += 1;
                last_ann.unwrap_or(start).max(start)
            }
        };
        timed.push((z, start, end));
    }
    if !untimed.is_empty() {
        let shown: Vec<_> = untimed.iter().take(5).cloned().collect();
        import.warnings.push(format!(
            "{source_name}: trace {trace_id}: {} span(s) have neither timestamp nor annotations and cannot be placed in time; dropped: {}{}",
            untimed.len(),
            shown.join(", "),
            if untimed.len() > shown.len() { ", ..." } else { "" }
        ));
    }
    if no_duration > 0 {
        import.warnings.push(format!(
            "{source_name}: trace {trace_id}: {no_duration} span(s) have no duration; they end at their last annotation, or at their start"
        ));
    }

    // Assign ids: the first span with an id keeps it (merge() orders client first),
    // later ones get a derived id.
    let used: HashSet<u64> = timed
        .iter()
        .map(|(z, _, _)| checked_span_id(&z.id).0)
        .collect();
    let mut taken: HashSet<u64> = HashSet::new();
    let mut assigned: Vec<(SpanId, Option<SpanId>)> = Vec::with_capacity(timed.len()); // (new id, original id if derived)
    for (z, _, _) in &timed {
        let orig = checked_span_id(&z.id);
        if taken.insert(orig.0) {
            assigned.push((orig, None));
        } else {
            let mut n = 1u64;
            let salt = fnv1a(
                format!(
                    "{}|{:?}|{:?}|{:?}",
                    z.service(),
                    z.local_endpoint.as_ref().and_then(|e| e.ipv4.clone()),
                    z.local_endpoint.as_ref().and_then(|e| e.port),
                    z.shared
                )
                .as_bytes(),
            );
            let new = loop {
                let c = splitmix64(orig.0 ^ salt ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                if c != 0 && !used.contains(&c) && !taken.contains(&c) {
                    break c;
                }
                n += 1;
            };
            taken.insert(new);
            assigned.push((SpanId(new), Some(orig)));
        }
    }
    // Sides of each original id, for re-parenting children: (service, ipv4, new id).
    let mut sides: HashMap<u64, Vec<(String, Option<String>, SpanId)>> = HashMap::new();
    for ((z, _, _), (new, orig)) in timed.iter().zip(&assigned) {
        let o = orig.unwrap_or(*new);
        sides.entry(o.0).or_default().push((
            z.service().to_string(),
            z.local_endpoint.as_ref().and_then(|e| e.ipv4.clone()),
            *new,
        ));
    }

    for ((z, start, end), (new_id, orig)) in timed.into_iter().zip(assigned) {
        let parent = if let Some(o) = orig {
            // The extra side of a shared id is a child of the first side (the client).
            Some(o)
        } else {
            z.parent_id
                .as_deref()
                .map(checked_span_id)
                .filter(|p| p.0 != 0)
                .map(|p| {
                    let ip = z.local_endpoint.as_ref().and_then(|e| e.ipv4.clone());
                    match sides.get(&p.0) {
                        Some(cands) if cands.len() > 1 => cands
                            .iter()
                            .find(|c| c.0 == z.service() && c.1 == ip)
                            .or_else(|| cands.iter().find(|c| c.0 == z.service()))
                            .map(|c| c.2)
                            .unwrap_or(p),
                        _ => p,
                    }
                })
        };

        let service = z.service().to_string();
        let resource = resources
            .entry(service.clone())
            .or_insert_with(|| {
                Arc::new(Resource::with_service(
                    if service.is_empty() {
                        "unknown_service"
                    } else {
                        &service
                    },
                    Attributes::default(),
                ))
            })
            .clone();
        let mut attributes = Attributes::default();
        let mut tags: Vec<_> = z.tags.iter().collect();
        tags.sort_by(|a, b| a.0.cmp(b.0)); // JSON object order is not kept by the map; sort for determinism
        for (k, v) in tags {
            attributes.insert(
                k.clone(),
                match v {
                    Json::String(s) => Value::String(s.clone()),
                    other => Value::String(other.to_string()),
                },
            );
        }
        if let Some(le) = &z.local_endpoint {
            if let Some(ip) = le.ipv4.as_ref().or(le.ipv6.as_ref()) {
                attributes.insert("net.host.ip", Value::String(ip.clone()));
            }
            if let Some(p) = le.port {
                attributes.insert("net.host.port", Value::Int(p as i64));
            }
        }
        if let Some(re) = &z.remote_endpoint {
            if let Some(s) = &re.service_name {
                attributes.insert("peer.service", Value::String(s.clone()));
            }
            if let Some(ip) = re.ipv4.as_ref().or(re.ipv6.as_ref()) {
                attributes.insert("net.peer.ip", Value::String(ip.clone()));
            }
            if let Some(p) = re.port {
                attributes.insert("net.peer.port", Value::Int(p as i64));
            }
        }
        if let Some(o) = orig {
            attributes.insert("zipkin.span_id", Value::String(o.to_string()));
        }
        if matches!(TraceId::from_text(&z.trace_id), Ok((_, IdText::Mapped))) {
            attributes.insert(ATTR_ORIGINAL_TRACE_ID, Value::String(z.trace_id.clone()));
        }
        if let Some(text) = mapped_span_text(&z.id) {
            attributes.insert(ATTR_ORIGINAL_SPAN_ID, Value::String(text.to_string()));
        }
        if let Some(text) = z.parent_id.as_deref().and_then(mapped_span_text) {
            attributes.insert(
                ATTR_ORIGINAL_PARENT_SPAN_ID,
                Value::String(text.to_string()),
            );
        }
        if z.is_shared() {
            attributes.insert("zipkin.shared", Value::Bool(true));
        }
        let mut status = Status::default();
        if let Some(e) = z.tags.get("error") {
            status.code = StatusCode::Error;
            if let Json::String(s) = e {
                status.message = s.clone();
            }
        }
        let kind = z
            .kind
            .as_deref()
            .and_then(SpanKind::from_name)
            .unwrap_or(SpanKind::Unspecified);
        let events = z
            .annotations
            .iter()
            .map(|a| Event {
                name: a.value.clone(),
                time_ns: a.timestamp.saturating_mul(1000),
                attributes: Attributes::default(),
            })
            .collect();
        let mut span = Span {
            trace_id,
            span_id: new_id,
            parent_span_id: parent.filter(|p| *p != new_id),
            trace_state: String::new(),
            name: z.name.clone().unwrap_or_default(),
            kind,
            resource,
            scope: scope.clone(),
            start_ns: start.saturating_mul(1000),
            end_ns: end.saturating_mul(1000),
            attributes,
            events,
            links: Vec::new(),
            status,
            sync: SyncInfo::default(),
        };
        span.refresh_sync();
        import.spans.push(span);
    }
}

/// Zipkin's `Trace.merge`: sort by (id, shared last / client first, local
/// endpoint nulls first) and merge neighbours with the same id, the same
/// shared flag and compatible endpoints; back-fill a missing `shared` flag on
/// the SERVER side that follows a CLIENT with the same id.
fn merge(mut spans: Vec<ZSpan>) -> Vec<ZSpan> {
    spans.sort_by(|a, b| {
        let ida = checked_span_id(&a.id).0;
        let idb = checked_span_id(&b.id).0;
        ida.cmp(&idb)
            .then_with(|| shared_rank(a).cmp(&shared_rank(b)))
            .then_with(|| endpoint_key(a).cmp(&endpoint_key(b)))
            .then(a.index.cmp(&b.index))
    });
    let mut out: Vec<ZSpan> = Vec::with_capacity(spans.len());
    let mut iter = spans.into_iter().peekable();
    while let Some(mut span) = iter.next() {
        let mut ep = EndpointTracker::default();
        ep.try_merge(span.local_endpoint.as_ref());
        while let Some(next) = iter.peek() {
            if next.id != span.id
                || next.is_shared() != span.is_shared()
                || !ep.try_merge(next.local_endpoint.as_ref())
            {
                break;
            }
            let next = iter.next().expect("peeked");
            merge_into(&mut span, next);
        }
        if let Some(last) = out.last() {
            if last.id == span.id {
                if last.is_kind("client") && span.is_kind("server") && !span.is_shared() {
                    span.shared = Some(true);
                }
                if span.is_shared() && span.parent_id.is_none() && last.parent_id.is_some() {
                    span.parent_id = last.parent_id.clone();
                }
            }
        }
        out.push(span);
    }
    out
}

fn shared_rank(s: &ZSpan) -> u8 {
    if s.is_shared() {
        2
    } else if s.is_kind("client") {
        0
    } else {
        1
    }
}

fn endpoint_key(s: &ZSpan) -> (bool, Option<String>, Option<String>, Option<String>) {
    match &s.local_endpoint {
        None => (false, None, None, None),
        // Zipkin sorts present values before missing ones within a field.
        Some(e) => (
            true,
            e.service_name.clone().or(Some("\u{10FFFF}".into())),
            e.ipv4.clone().or(Some("\u{10FFFF}".into())),
            e.ipv6.clone().or(Some("\u{10FFFF}".into())),
        ),
    }
}

#[derive(Default)]
struct EndpointTracker {
    service: Option<String>,
    ipv4: Option<String>,
    ipv6: Option<String>,
    port: Option<u16>,
}

impl EndpointTracker {
    fn try_merge(&mut self, e: Option<&ZEndpoint>) -> bool {
        let Some(e) = e else { return true };
        fn clash<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            matches!((a, b), (Some(x), Some(y)) if x != y)
        }
        if clash(&self.service, &e.service_name)
            || clash(&self.ipv4, &e.ipv4)
            || clash(&self.ipv6, &e.ipv6)
            || clash(&self.port, &e.port)
        {
            return false;
        }
        self.service = self.service.take().or(e.service_name.clone());
        self.ipv4 = self.ipv4.take().or(e.ipv4.clone());
        self.ipv6 = self.ipv6.take().or(e.ipv6.clone());
        self.port = self.port.or(e.port);
        true
    }
}

/// Zipkin's `Span.Builder.merge`: fill what is missing, widen the time range,
/// union annotations and tags.
fn merge_into(a: &mut ZSpan, b: ZSpan) {
    if a.name
        .as_deref()
        .is_none_or(|n| n.is_empty() || n == "unknown")
    {
        a.name = b.name.clone().or(a.name.take());
    }
    if a.kind.is_none() {
        a.kind = b.kind.clone();
    }
    if a.parent_id.is_none() {
        a.parent_id = b.parent_id.clone();
    }
    match (a.timestamp, b.timestamp) {
        (Some(ta), Some(tb)) => {
            let end = [a.duration.map(|d| ta + d), b.duration.map(|d| tb + d)]
                .into_iter()
                .flatten()
                .max();
            let start = ta.min(tb);
            a.timestamp = Some(start);
            a.duration = end.map(|e| e - start);
        }
        (None, Some(tb)) => {
            a.timestamp = Some(tb);
            a.duration = b.duration;
        }
        _ => {}
    }
    if a.local_endpoint.is_none() {
        a.local_endpoint = b.local_endpoint.clone();
    } else if let (Some(la), Some(lb)) = (a.local_endpoint.as_mut(), b.local_endpoint.as_ref()) {
        la.service_name = la.service_name.take().or(lb.service_name.clone());
        la.ipv4 = la.ipv4.take().or(lb.ipv4.clone());
        la.ipv6 = la.ipv6.take().or(lb.ipv6.clone());
        la.port = la.port.or(lb.port);
    }
    if a.remote_endpoint.is_none() {
        a.remote_endpoint = b.remote_endpoint;
    }
    for ann in b.annotations {
        if !a
            .annotations
            .iter()
            .any(|x| x.timestamp == ann.timestamp && x.value == ann.value)
        {
            a.annotations.push(ann);
        }
    }
    a.annotations.sort_by_key(|x| x.timestamp);
    for (k, v) in b.tags {
        a.tags.entry(k).or_insert(v);
    }
    if a.shared.is_none() {
        a.shared = b.shared;
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
