//! The span model every importer produces and every analysis consumes.
//!
//! It follows OpenTelemetry's data model (OTLP is also the storage format), so
//! nothing a source says is lost on the way to a run folder; the deepspan
//! synchronisation fields are *derived* from attributes and events (see
//! [`SyncInfo`]) and the raw attributes stay on the span.

use std::fmt;
use std::sync::Arc;

/// A 128-bit trace id. Displayed as 32 lowercase hex digits (OTLP/W3C form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TraceId(pub u128);

/// A 64-bit span id. Displayed as 16 lowercase hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SpanId(pub u64);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl TraceId {
    /// Parses 1 to 32 hex digits. Jaeger drops leading zeros and Zipkin uses
    /// 16-digit ids, so shorter forms are accepted and zero-extended.
    pub fn from_hex(s: &str) -> Option<TraceId> {
        parse_hex(s, 32).map(TraceId)
    }

    /// From the 16 big-endian bytes of OTLP protobuf.
    pub fn from_bytes(b: &[u8]) -> Option<TraceId> {
        let a: [u8; 16] = b.try_into().ok()?;
        Some(TraceId(u128::from_be_bytes(a)))
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl SpanId {
    /// Parses 1 to 16 hex digits (leading zeros may be missing, as in Jaeger).
    pub fn from_hex(s: &str) -> Option<SpanId> {
        parse_hex(s, 16).map(|v| SpanId(v as u64))
    }

    /// From the 8 big-endian bytes of OTLP protobuf.
    pub fn from_bytes(b: &[u8]) -> Option<SpanId> {
        let a: [u8; 8] = b.try_into().ok()?;
        Some(SpanId(u64::from_be_bytes(a)))
    }

    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }
}

/// Most bytes an id string may have to be taken as an opaque id; longer ones
/// are errors (no tracer writes them; they are corruption or a wrong field).
pub const MAX_ID_TEXT_BYTES: usize = 256;

/// How an id written as text became an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdText {
    /// 1 to 32 (trace) or 16 (span) hex digits, any case, read as a number.
    Hex,
    /// Anything else: an opaque string, hashed (see [`TraceId::from_text`]).
    Mapped,
}

/// Seeds of the id hash, one per id kind, so a string used as both a trace
/// and a span id does not give related ids.
const TRACE_ID_SEED: u64 = 0x6465_6570_7370_616e; // "deepspan"
const SPAN_ID_SEED: u64 = 0x7370_616e_6964_2121; // "spanid!!"

impl TraceId {
    /// A trace id written as text, as Jaeger and Zipkin JSON and OTLP/JSON
    /// write it. Hex ids (1 to 32 digits, zero-extended) are read as
    /// numbers. Any other non-empty string of at most [`MAX_ID_TEXT_BYTES`]
    /// bytes is an opaque id, as Jaeger UI treats ids (its test traces use
    /// "trace-abc"): it maps to the XXH3-128 hash of its UTF-8 bytes (seeded
    /// per id kind). The same string thus gives the same id in every file and
    /// run, references map through the same function as the ids they point
    /// to, and a mapped id meets a real one with probability 2^-128 per pair.
    /// Errors say why, for the caller to locate.
    pub fn from_text(s: &str) -> Result<(TraceId, IdText), String> {
        if let Some(id) = TraceId::from_hex(s) {
            return Ok((id, IdText::Hex));
        }
        check_opaque(s)?;
        let h = twox_hash::XxHash3_128::oneshot_with_seed(TRACE_ID_SEED, s.as_bytes());
        // Zero means "no id" in OTLP; the hash gives it with probability 2^-128.
        Ok((TraceId(h.max(1)), IdText::Mapped))
    }

    /// [`TraceId::from_text`] for a span's own trace id, which must not be
    /// zero (OTLP and Jaeger take zero for "no trace").
    pub fn from_text_nonzero(s: &str) -> Result<(TraceId, IdText), String> {
        match TraceId::from_text(s)? {
            (t, _) if t.0 == 0 => Err("the trace id is zero".to_string()),
            ok => Ok(ok),
        }
    }
}

impl SpanId {
    /// A span id written as text: hex (1 to 16 digits) as a number, any
    /// other string as an opaque id hashed with XXH3-64; see
    /// [`TraceId::from_text`] for the rules and why.
    pub fn from_text(s: &str) -> Result<(SpanId, IdText), String> {
        if let Some(id) = SpanId::from_hex(s) {
            return Ok((id, IdText::Hex));
        }
        check_opaque(s)?;
        let h = twox_hash::XxHash3_64::oneshot_with_seed(SPAN_ID_SEED, s.as_bytes());
        Ok((SpanId(h.max(1)), IdText::Mapped))
    }
}

fn check_opaque(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("the id is empty".into());
    }
    if s.len() > MAX_ID_TEXT_BYTES {
        return Err(format!(
            "the id is {} bytes long; ids of more than {MAX_ID_TEXT_BYTES} bytes are refused",
            s.len()
        ));
    }
    Ok(())
}

/// Attributes that keep the original text of ids mapped by
/// [`TraceId::from_text`] / [`SpanId::from_text`] (on the span, or on a link
/// for the ids it points to).
pub const ATTR_ORIGINAL_TRACE_ID: &str = "deepspan.original_trace_id";
pub const ATTR_ORIGINAL_SPAN_ID: &str = "deepspan.original_span_id";
pub const ATTR_ORIGINAL_PARENT_SPAN_ID: &str = "deepspan.original_parent_span_id";

/// Counts the distinct id strings an importer mapped, for its one note per
/// file.
#[derive(Default)]
pub(crate) struct MappedIds {
    distinct: std::collections::BTreeSet<String>,
}

impl MappedIds {
    /// Remembers `text` if it was mapped; `true` when it was.
    pub(crate) fn record(&mut self, text: &str, how: IdText) -> bool {
        if how == IdText::Mapped && !self.distinct.contains(text) {
            self.distinct.insert(text.to_string());
        }
        how == IdText::Mapped
    }

    /// The note for `source_name`, if any id was mapped.
    pub(crate) fn note(&self, source_name: &str) -> Option<String> {
        let first = self.distinct.iter().next()?;
        Some(format!(
            "{source_name}: {} distinct span/trace id strings are not hex (e.g. {first:?}); read as opaque ids, as Jaeger UI does: each maps to a stable id (XXH3 hash of the string) and the original text is kept in the deepspan.original_trace_id / deepspan.original_span_id / deepspan.original_parent_span_id attributes",
            self.distinct.len()
        ))
    }
}

fn parse_hex(s: &str, max_digits: usize) -> Option<u128> {
    if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// What a span represents in its RPC or messaging exchange (OTLP SpanKind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SpanKind {
    #[default]
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl SpanKind {
    /// The OTLP enum number.
    pub fn to_otlp(self) -> i32 {
        match self {
            SpanKind::Unspecified => 0,
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
            SpanKind::Producer => 4,
            SpanKind::Consumer => 5,
        }
    }

    /// From the OTLP enum number; unknown numbers become `Unspecified`
    /// (forward compatible, as the OTLP spec asks receivers to be).
    pub fn from_otlp(n: i32) -> SpanKind {
        match n {
            1 => SpanKind::Internal,
            2 => SpanKind::Server,
            3 => SpanKind::Client,
            4 => SpanKind::Producer,
            5 => SpanKind::Consumer,
            _ => SpanKind::Unspecified,
        }
    }

    /// From the lowercase/uppercase names Jaeger (`span.kind` tag) and Zipkin use.
    pub fn from_name(s: &str) -> Option<SpanKind> {
        Some(match s.to_ascii_lowercase().as_str() {
            "internal" => SpanKind::Internal,
            "server" => SpanKind::Server,
            "client" => SpanKind::Client,
            "producer" => SpanKind::Producer,
            "consumer" => SpanKind::Consumer,
            "unspecified" | "" => SpanKind::Unspecified,
            _ => return None,
        })
    }
}

/// A typed attribute value (OTLP AnyValue).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    String(String),
    Bool(bool),
    Int(i64),
    Double(f64),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    Map(Attributes),
    Empty,
}

impl Value {
    /// The value as an integer, also from a decimal string: Zipkin tags are
    /// always strings and Jaeger producers sometimes stringify numbers.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::String(s) => s.trim().parse().ok(),
            Value::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => Some(*d as i64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => f.write_str(s),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Double(d) => write!(f, "{d}"),
            Value::Bytes(b) => {
                for x in b {
                    write!(f, "{x:02x}")?;
                }
                Ok(())
            }
            Value::Array(a) => {
                f.write_str("[")?;
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k}={v}")?;
                }
                f.write_str("}")
            }
            Value::Empty => Ok(()),
        }
    }
}

/// Ordered key/value attributes. Order is kept (sources and exporters keep
/// it too); lookups are linear because spans carry few attributes.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Attributes(pub Vec<(String, Value)>);

impl Attributes {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key`, replacing an existing value in place.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The entity that produced spans (OTLP Resource). Shared by all the spans
/// of one batch, hence `Arc` in [`Span`].
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Resource {
    /// `service.name`, or `unknown_service` when the source has none (the
    /// OpenTelemetry SDK default).
    pub service_name: String,
    /// All resource attributes, `service.name` included.
    pub attributes: Attributes,
}

impl Resource {
    /// Builds a resource, taking the service name from `service.name`.
    pub fn new(attributes: Attributes) -> Resource {
        let service_name = attributes
            .get("service.name")
            .map(|v| v.to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown_service".to_string());
        Resource {
            service_name,
            attributes,
        }
    }

    /// A resource with only a service name (Jaeger process, Zipkin endpoint).
    pub fn with_service(service: &str, mut attributes: Attributes) -> Resource {
        attributes.insert("service.name", Value::String(service.to_string()));
        Resource::new(attributes)
    }
}

/// The instrumentation library that made the span (OTLP InstrumentationScope).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Scope {
    pub name: String,
    pub version: String,
    pub attributes: Attributes,
}

/// A timestamped annotation on a span (OTLP event, Jaeger log, Zipkin annotation).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: String,
    /// Wall clock, ns since the Unix epoch.
    pub time_ns: u64,
    pub attributes: Attributes,
}

/// A reference to another span: OTLP link, or a Jaeger reference other than
/// the parent. Jaeger's reference type is kept in the `opentracing.ref_type`
/// attribute (`child_of` / `follows_from`), as the OpenTelemetry Collector does.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub trace_state: String,
    pub attributes: Attributes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StatusCode {
    #[default]
    Unset,
    Ok,
    Error,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Status {
    pub code: StatusCode,
    pub message: String,
}

/// One activation change of a span on a thread: the span became current on
/// the thread (`on`) or stopped being current (`off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activation {
    pub tid: u32,
    /// CLOCK_MONOTONIC ns (the kernel trace's clock).
    pub mono_ns: u64,
    pub on: bool,
}

/// Span attribute holding the OS thread id that started the span.
pub const ATTR_TID: &str = "deepspan.tid";
/// Span attribute holding the inode number of the PID namespace the span's
/// process runs in, when it is not the host's first one (a container's):
/// its `deepspan.tid`s are then ids in that namespace, not the kernel
/// trace's, until the analysis maps them (the recorder's /proc scan reads
/// both for each thread).
pub const ATTR_PID_NS: &str = "deepspan.pid_ns";
/// Span attribute holding CLOCK_MONOTONIC ns at span start.
pub const ATTR_MONO_START: &str = "deepspan.mono_start_ns";
/// Span attribute holding CLOCK_MONOTONIC ns at span end.
pub const ATTR_MONO_END: &str = "deepspan.mono_end_ns";
/// Span event: the span became current on a thread.
pub const EVENT_ON: &str = "deepspan.on";
/// Span event: the span stopped being current on a thread.
pub const EVENT_OFF: &str = "deepspan.off";
/// Event attribute holding CLOCK_MONOTONIC ns of an activation change.
pub const ATTR_MONO_NS: &str = "deepspan.mono_ns";
/// Jaeger reference type kept on links (OpenTelemetry Collector convention).
pub const ATTR_REF_TYPE: &str = "opentracing.ref_type";

/// The deepspan synchronisation fields of a span, parsed from its attributes
/// and events by [`Span::refresh_sync`]. All are absent for spans from
/// producers without the deepspan SDK processor.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SyncInfo {
    /// OS thread id (kernel tid) the span started on.
    pub tid: Option<u32>,
    /// The PID namespace [`Self::tid`] and the activations' ids are in,
    /// when not the host's ([`ATTR_PID_NS`]).
    pub pid_ns: Option<u64>,
    pub mono_start_ns: Option<u64>,
    pub mono_end_ns: Option<u64>,
    /// `deepspan.on` / `deepspan.off` events, in time order.
    pub activations: Vec<Activation>,
    /// Problems found while parsing the fields (wrong type, negative, missing
    /// attribute on an activation event); the fields concerned are left out.
    pub problems: Vec<String>,
}

/// One span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub trace_state: String,
    /// Operation name.
    pub name: String,
    pub kind: SpanKind,
    pub resource: Arc<Resource>,
    pub scope: Arc<Scope>,
    /// Wall clock, ns since the Unix epoch.
    pub start_ns: u64,
    /// Wall clock, ns since the Unix epoch; never before `start_ns`.
    pub end_ns: u64,
    pub attributes: Attributes,
    pub events: Vec<Event>,
    pub links: Vec<Link>,
    pub status: Status,
    /// Derived from `attributes` and `events`; see [`Span::refresh_sync`].
    pub sync: SyncInfo,
}

impl Span {
    /// A span with the given identity and times and everything else empty;
    /// convenient for tests and for building spans from other event sources.
    pub fn new(
        trace_id: TraceId,
        span_id: SpanId,
        parent: Option<SpanId>,
        name: &str,
        start_ns: u64,
        end_ns: u64,
    ) -> Span {
        Span {
            trace_id,
            span_id,
            parent_span_id: parent,
            trace_state: String::new(),
            name: name.to_string(),
            kind: SpanKind::Unspecified,
            resource: Arc::new(Resource::new(Attributes::default())),
            scope: Arc::new(Scope::default()),
            start_ns,
            end_ns: end_ns.max(start_ns),
            attributes: Attributes::default(),
            events: Vec::new(),
            links: Vec::new(),
            status: Status::default(),
            sync: SyncInfo::default(),
        }
    }

    pub fn service_name(&self) -> &str {
        &self.resource.service_name
    }

    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// True when the parent does not wait for this span: the parent reference
    /// is a Jaeger FOLLOWS_FROM (kept as a link to the parent with
    /// `opentracing.ref_type = follows_from`).
    pub fn follows_from_parent(&self) -> bool {
        let Some(parent) = self.parent_span_id else {
            return false;
        };
        self.links.iter().any(|l| {
            l.span_id == parent
                && l.trace_id == self.trace_id
                && l.attributes.get(ATTR_REF_TYPE).and_then(Value::as_str) == Some("follows_from")
        })
    }

    /// Re-parses [`SyncInfo`] from the attributes and events. Importers call
    /// it; call it again after changing those by hand.
    pub fn refresh_sync(&mut self) {
        let mut sync = SyncInfo::default();
        let mut problems = Vec::new();
        sync.tid = read_u32(&self.attributes, ATTR_TID, &mut problems);
        sync.pid_ns = read_u64(&self.attributes, ATTR_PID_NS, &mut problems);
        sync.mono_start_ns = read_u64(&self.attributes, ATTR_MONO_START, &mut problems);
        sync.mono_end_ns = read_u64(&self.attributes, ATTR_MONO_END, &mut problems);
        if let (Some(s), Some(e)) = (sync.mono_start_ns, sync.mono_end_ns) {
            if e < s {
                problems.push(format!(
                    "{ATTR_MONO_END} ({e}) is before {ATTR_MONO_START} ({s}); both ignored"
                ));
                sync.mono_start_ns = None;
                sync.mono_end_ns = None;
            }
        }
        for (i, ev) in self.events.iter().enumerate() {
            let on = match ev.name.as_str() {
                EVENT_ON => true,
                EVENT_OFF => false,
                _ => continue,
            };
            let mut p = Vec::new();
            let tid = read_u32(&ev.attributes, ATTR_TID, &mut p);
            let mono = read_u64(&ev.attributes, ATTR_MONO_NS, &mut p);
            match (tid, mono) {
                (Some(tid), Some(mono_ns)) => {
                    sync.activations.push(Activation { tid, mono_ns, on })
                }
                _ => problems.push(format!(
                    "event {i} ({}) lacks a valid {ATTR_TID} or {ATTR_MONO_NS}{}; ignored",
                    ev.name,
                    p.first().map(|s| format!(": {s}")).unwrap_or_default()
                )),
            }
        }
        // Stable: equal timestamps keep the order the producer recorded.
        sync.activations.sort_by_key(|a| a.mono_ns);
        sync.problems = problems;
        self.sync = sync;
    }
}

impl SyncInfo {
    /// Puts the thread ids of a span from a PID namespace of its own
    /// ([`Self::pid_ns`]) into the host's, which the kernel trace uses:
    /// `host_tid(namespace, id)` gives the host's id of a thread. An id it
    /// does not know is dropped (the span's thread, or that activation),
    /// never taken for the host's thread of the same number. Returns how
    /// many were dropped; a span of the host's namespace is left as it is.
    pub fn to_host_tids(&mut self, host_tid: impl Fn(u64, u32) -> Option<u32>) -> usize {
        let Some(ns) = self.pid_ns.take() else {
            return 0;
        };
        let mut dropped = 0;
        if let Some(tid) = self.tid {
            self.tid = host_tid(ns, tid);
            dropped += usize::from(self.tid.is_none());
        }
        let before = self.activations.len();
        self.activations.retain_mut(|a| match host_tid(ns, a.tid) {
            Some(host) => {
                a.tid = host;
                true
            }
            None => false,
        });
        dropped + before - self.activations.len()
    }
}

fn read_u64(attrs: &Attributes, key: &str, problems: &mut Vec<String>) -> Option<u64> {
    let v = attrs.get(key)?;
    match v.as_i64() {
        Some(n) if n >= 0 => Some(n as u64),
        _ => {
            problems.push(format!("{key} is not a non-negative integer: {v}"));
            None
        }
    }
}

fn read_u32(attrs: &Attributes, key: &str, problems: &mut Vec<String>) -> Option<u32> {
    let v = attrs.get(key)?;
    match v.as_i64().and_then(|n| u32::try_from(n).ok()) {
        Some(n) => Some(n),
        None => {
            problems.push(format!("{key} is not a thread id: {v}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activation(name: &str, tid: i64, mono: i64) -> Event {
        Event {
            name: name.into(),
            time_ns: 0,
            attributes: Attributes(vec![
                (ATTR_TID.into(), Value::Int(tid)),
                (ATTR_MONO_NS.into(), Value::Int(mono)),
            ]),
        }
    }

    #[test]
    fn a_containers_thread_ids_become_the_hosts_or_nothing() {
        let ns = 4_026_532_999;
        let mut span = Span::new(TraceId(1), SpanId(2), None, "GET /price", 0, 10);
        span.attributes = Attributes(vec![
            (ATTR_TID.into(), Value::Int(7)),
            (ATTR_PID_NS.into(), Value::Int(ns as i64)),
        ]);
        span.events = vec![
            activation(EVENT_ON, 7, 100),
            activation(EVENT_ON, 8, 200),
            activation(EVENT_OFF, 8, 300),
        ];
        span.refresh_sync();
        assert_eq!((span.sync.tid, span.sync.pid_ns), (Some(7), Some(ns)));
        let host = |n: u64, tid: u32| (n == ns && tid == 7).then_some(1273);
        let mut sync = span.sync.clone();
        assert_eq!(
            sync.to_host_tids(host),
            2,
            "thread 8 of the namespace is unknown"
        );
        assert_eq!((sync.tid, sync.pid_ns), (Some(1273), None));
        assert_eq!(
            sync.activations,
            [Activation {
                tid: 1273,
                mono_ns: 100,
                on: true
            }]
        );
        assert_eq!(sync.to_host_tids(|_, _| None), 0, "mapped once");

        // Unknown: no thread rather than the host's thread 7.
        let mut sync = span.sync.clone();
        assert_eq!(sync.to_host_tids(|_, _| None), 4);
        assert_eq!((sync.tid, sync.activations.len()), (None, 0));

        // The host's namespace: nothing to map.
        span.attributes.0.retain(|(k, _)| k != ATTR_PID_NS);
        span.refresh_sync();
        let before = span.sync.clone();
        assert_eq!(span.sync.to_host_tids(|_, _| None), 0);
        assert_eq!(span.sync, before);
    }
}
