//! deepspan's distributed-tracing side: spans in, spans joined to threads.
//!
//! - [`model`]: the span model (OpenTelemetry's), with the deepspan
//!   synchronisation fields (`deepspan.tid`, `deepspan.mono_start_ns`,
//!   `deepspan.mono_end_ns`, `deepspan.on`/`deepspan.off` events) parsed out;
//! - importers: OTLP JSON and protobuf, Jaeger JSON, Zipkin v2 JSON, and
//!   [`import_file`] that recognises which;
//! - [`store`]: a run's `spans/` folder (length-delimited OTLP protobuf);
//! - [`critical_path`]: the span-level critical path (Jaeger UI's algorithm)
//!   and self/exclusive time per `[service] operation`;
//! - [`crisp`]: CRISP's semantics of the same (overflowing children,
//!   exclusive time per call path, error work), to compare with CRISP;
//! - [`clock`]: wall clock → CLOCK_MONOTONIC mapping from the run's samples;
//! - [`activity`]: which span each thread works for at any time (Algorithm 1
//!   of Gelle et al. 2021, generalised to activations).

pub mod activity;
pub mod clock;
pub mod crisp;
pub mod critical_path;
pub mod dcpt;
mod error;
mod jaeger;
pub mod model;
mod otlp;
pub mod store;
pub mod ust;
mod zipkin;

use std::path::{Path, PathBuf};

use deepspan_run::layout::SPANS_DIR;

pub use activity::{ActivityOptions, SpanRef, SyncEvent, SyncKind, ThreadActivity};
pub use clock::{ClockMap, MonoTimes};
pub use critical_path::{
    critical_path, critical_path_report, group_traces, CriticalPathOptions, CriticalPathReport,
    Section, Trace,
};
pub use error::Error;
pub use jaeger::parse_jaeger_json;
pub use model::{IdText, Span, SpanId, SpanKind, TraceId};
pub use otlp::{parse_otlp_json, parse_otlp_protobuf, request_from_spans};
pub use store::{read_run_spans, SpanWriter};
pub use zipkin::parse_zipkin_json;

/// Re-export of the OTLP message type the store and a receiver exchange.
pub use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

/// The span formats deepspan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OtlpJson,
    OtlpProtobuf,
    /// Length-delimited OTLP protobuf records (a run's `spans/` files).
    OtlpProtobufStream,
    JaegerJson,
    ZipkinJson,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::OtlpJson => "OTLP/JSON",
            Format::OtlpProtobuf => "OTLP protobuf",
            Format::OtlpProtobufStream => "OTLP protobuf records (deepspan span storage)",
            Format::JaegerJson => "Jaeger JSON",
            Format::ZipkinJson => "Zipkin v2 JSON",
        }
    }
}

/// What an importer produced: spans in input order, and what it had to
/// repair or leave out (never silently).
#[derive(Debug)]
pub struct Import {
    pub format: Format,
    pub spans: Vec<Span>,
    pub warnings: Vec<String>,
}

impl Import {
    pub(crate) fn new(format: Format) -> Import {
        Import {
            format,
            spans: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

/// Reads spans from a file of any supported format, or from a run folder
/// (its `spans/`) or a `spans/` folder itself.
///
/// Recognition: JSON is told apart by its shape (`resourceSpans` → OTLP,
/// `data` or `spans`+`processes` → Jaeger, an array of objects with `traceId`
/// and `id` → Zipkin). Binary files are read as length-delimited OTLP records
/// when the whole file parses that way, else as one OTLP protobuf request.
pub fn import_file(path: &Path) -> Result<Import, Error> {
    if path.is_dir() {
        let run =
            if path.file_name().is_some_and(|n| n == SPANS_DIR) && !path.join(SPANS_DIR).is_dir() {
                path.parent().unwrap_or(path).to_path_buf()
            } else {
                path.to_path_buf()
            };
        let mut import = Import::new(Format::OtlpProtobufStream);
        let mut reader = read_run_spans(&run)?;
        for s in reader.by_ref() {
            import.spans.push(s?);
        }
        import.warnings = reader.warnings;
        return Ok(import);
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "cannot read span file", e))?;
    import_bytes(&bytes, &path.display().to_string())
}

/// [`import_file`] for bytes already in memory; `source_name` names them in errors.
pub fn import_bytes(bytes: &[u8], source_name: &str) -> Result<Import, Error> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        None => Err(Error::UnknownFormat {
            source_name: source_name.to_string(),
            reason: "the file is empty".into(),
        }),
        Some(b'{') | Some(b'[') => import_json(bytes, source_name),
        Some(_) => {
            if let Some(import) = try_stream(bytes, source_name) {
                return Ok(import);
            }
            parse_otlp_protobuf(bytes, source_name).map_err(|e| Error::UnknownFormat {
                source_name: source_name.to_string(),
                reason: format!("not JSON, and not OTLP protobuf either ({e})"),
            })
        }
    }
}

fn import_json(bytes: &[u8], source_name: &str) -> Result<Import, Error> {
    // Only the first JSON value decides the format (OTLP JSON lines have several).
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<serde_json::Value>();
    let first = match stream.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            return Err(Error::invalid(
                source_name,
                "JSON",
                format!("line {} column {}", e.line(), e.column()),
                e.to_string(),
            ))
        }
        None => {
            return Err(Error::UnknownFormat {
                source_name: source_name.to_string(),
                reason: "no JSON value".into(),
            })
        }
    };
    let single = stream.next().is_none();
    use serde_json::Value as J;
    let is_obj_with = |v: &J, k: &str| v.as_object().is_some_and(|o| o.contains_key(k));
    if is_obj_with(&first, "resourceSpans") {
        return parse_otlp_json(bytes, source_name);
    }
    if !single {
        return Err(Error::UnknownFormat {
            source_name: source_name.to_string(),
            reason: "several JSON values, and the first is not an OTLP request".into(),
        });
    }
    let looks_zipkin_span = |v: &J| is_obj_with(v, "traceId") && is_obj_with(v, "id");
    let looks_jaeger_trace = |v: &J| is_obj_with(v, "spans");
    match &first {
        J::Object(o) if o.contains_key("data") || o.contains_key("spans") => jaeger::parse_jaeger_value(first, source_name),
        J::Array(a) if a.is_empty() => Ok(Import::new(Format::ZipkinJson)),
        J::Array(a) if looks_zipkin_span(&a[0]) || a[0].as_array().is_some_and(|t| t.is_empty() || looks_zipkin_span(&t[0])) => {
            zipkin::parse_zipkin_value(first, source_name)
        }
        J::Array(a) if looks_jaeger_trace(&a[0]) => jaeger::parse_jaeger_value(first, source_name),
        _ => Err(Error::UnknownFormat {
            source_name: source_name.to_string(),
            reason: "JSON, but neither OTLP (resourceSpans), Jaeger (data / spans+processes) nor Zipkin v2 (array of spans with traceId and id)".into(),
        }),
    }
}

/// Length-delimited OTLP records, accepted only if the whole input parses so
/// and yields spans (a single protobuf request rarely does both).
fn try_stream(bytes: &[u8], source_name: &str) -> Option<Import> {
    use prost::Message;
    let mut rest = bytes;
    let mut import = Import::new(Format::OtlpProtobufStream);
    let mut record = 0;
    while !rest.is_empty() {
        let len = prost::encoding::decode_varint(&mut rest).ok()? as usize;
        if len > rest.len() {
            return None;
        }
        let req = ExportTraceServiceRequest::decode(&rest[..len]).ok()?;
        otlp::spans_from_request(
            &req,
            &format!("{source_name} record {record}"),
            "OTLP protobuf",
            &mut import,
        )
        .ok()?;
        rest = &rest[len..];
        record += 1;
    }
    (!import.spans.is_empty()).then_some(import)
}

/// What [`import_into_run`] did.
#[derive(Debug)]
pub struct RunImport {
    /// The file written, `RUN/spans/otlp-NNN.pb`.
    pub file: PathBuf,
    /// (input, format, span count) per input.
    pub inputs: Vec<(PathBuf, Format, usize)>,
    /// Spans of the inputs given sync fields by LTTng-UST span events.
    pub ust_matched: usize,
    /// Spans known only from LTTng-UST span events, written as well.
    pub ust_added: usize,
    pub warnings: Vec<String>,
}

/// Imports span files (any format [`import_file`] reads) into a run's span
/// storage: one new `spans/otlp-NNN.pb`, one record per input. Nothing is
/// written unless every input parses.
pub fn import_into_run(inputs: &[PathBuf], run_dir: &Path) -> Result<RunImport, Error> {
    import_into_run_with_ust(inputs, Vec::new(), run_dir)
}

/// [`import_into_run`], with spans from LTTng-UST span events
/// ([`ust::spans_from_events`]): file spans with the same ids take their
/// sync fields, the others are written as one more record.
pub fn import_into_run_with_ust(
    inputs: &[PathBuf],
    mut ust_spans: Vec<Span>,
    run_dir: &Path,
) -> Result<RunImport, Error> {
    let mut imports = Vec::with_capacity(inputs.len());
    for p in inputs {
        imports.push((p.clone(), import_file(p)?));
    }
    let mut writer = SpanWriter::create(run_dir)?;
    let mut out = RunImport {
        file: writer.path().to_path_buf(),
        inputs: Vec::new(),
        ust_matched: 0,
        ust_added: 0,
        warnings: Vec::new(),
    };
    for (p, mut imp) in imports {
        out.ust_matched += ust::apply_to(&mut imp.spans, &mut ust_spans);
        writer.append(&imp.spans)?;
        out.inputs.push((p, imp.format, imp.spans.len()));
        out.warnings.append(&mut imp.warnings);
    }
    if !ust_spans.is_empty() {
        writer.append(&ust_spans)?;
        out.ust_added = ust_spans.len();
    }
    writer.flush()?;
    Ok(out)
}
