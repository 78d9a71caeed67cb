//! Span and trace ids that are not hex (opaque strings, as Jaeger UI takes
//! them) import in every JSON format: stable ids, references kept
//! consistent, the original text in `deepspan.original_*` attributes, one
//! note per file. Empty and absurdly long ids stay errors with a position.

use deepspan_spans::model::Value;
use deepspan_spans::{
    parse_jaeger_json, parse_otlp_json, parse_zipkin_json, IdText, Import, Span, SpanId, TraceId,
};

/// XXH3 of the id text, from the reference C implementation (python-xxhash
/// 3.x: `xxh3_64_intdigest(b"G", seed=0x7370616e69642121)` and
/// `xxh3_128_intdigest(b"trace-abc", seed=0x646565707370616e)`): the mapping
/// must never change, or ids in stored runs would stop matching new imports.
#[test]
fn opaque_ids_map_to_the_reference_xxh3_of_their_text() {
    assert_eq!(
        SpanId::from_text("G").unwrap(),
        (SpanId(0x682e_a382_c729_5748), IdText::Mapped)
    );
    assert_eq!(
        SpanId::from_text("span-A").unwrap(),
        (SpanId(0x126c_04a2_17db_b7b8), IdText::Mapped)
    );
    assert_eq!(
        TraceId::from_text("trace-abc").unwrap(),
        (
            TraceId(0x5b08_3b1e_5567_e186_5a2e_bb2f_125d_4a76),
            IdText::Mapped
        )
    );
    // Hex stays hex, in any case and zero-extended, as Jaeger reads it.
    assert_eq!(SpanId::from_text("A").unwrap(), (SpanId(0xa), IdText::Hex));
    assert_eq!(
        TraceId::from_text("00Ff").unwrap(),
        (TraceId(0xff), IdText::Hex)
    );
    // Too long for a span id, so opaque: not truncated, not refused.
    assert_eq!(
        SpanId::from_text("0123456789abcdef0").unwrap().1,
        IdText::Mapped
    );
    assert!(SpanId::from_text("").unwrap_err().contains("empty"));
    let long = "x".repeat(257);
    assert!(TraceId::from_text(&long).unwrap_err().contains("257 bytes"));
    assert!(TraceId::from_text(&long[..256]).is_ok());
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    span.attributes.get(key).and_then(Value::as_str)
}

fn by_original(import: &Import, text: &str) -> Span {
    import
        .spans
        .iter()
        .find(|s| attr(s, "deepspan.original_span_id") == Some(text) || s.name == text)
        .unwrap_or_else(|| panic!("no span {text}"))
        .clone()
}

const JAEGER: &str = r#"{"data": [{"traceID": "trace-1", "spans": [
  {"traceID": "trace-1", "spanID": "root", "operationName": "root", "references": [], "startTime": 100, "duration": 50, "processID": "p1"},
  {"traceID": "trace-1", "spanID": "G", "operationName": "G", "references": [{"refType": "CHILD_OF", "traceID": "trace-1", "spanID": "root"}], "startTime": 110, "duration": 10, "processID": "p1"},
  {"traceID": "trace-1", "spanID": "A", "operationName": "A", "references": [{"refType": "CHILD_OF", "spanID": "G"}, {"refType": "FOLLOWS_FROM", "traceID": "other trace", "spanID": "x y"}], "startTime": 111, "duration": 5, "processID": "p1"}
], "processes": {"p1": {"serviceName": "svc", "tags": []}}}]}"#;

#[test]
fn jaeger_opaque_ids_import_with_consistent_references_and_one_note() {
    let import = parse_jaeger_json(JAEGER.as_bytes(), "t.json").unwrap();
    assert_eq!(import.spans.len(), 3);
    let root = by_original(&import, "root");
    let g = by_original(&import, "G");
    let a = import.spans.iter().find(|s| s.name == "A").unwrap();
    assert_eq!(root.span_id, SpanId::from_text("root").unwrap().0);
    assert_eq!(g.parent_span_id, Some(root.span_id));
    assert_eq!(attr(&g, "deepspan.original_parent_span_id"), Some("root"));
    // "A" is hex: read as 0xA, no original kept; its parent "G" is not.
    assert_eq!(a.span_id, SpanId(0xa));
    assert_eq!(attr(a, "deepspan.original_span_id"), None);
    assert_eq!(a.parent_span_id, Some(g.span_id));
    assert_eq!(attr(a, "deepspan.original_parent_span_id"), Some("G"));
    let trace = TraceId::from_text("trace-1").unwrap().0;
    for s in &import.spans {
        assert_eq!(s.trace_id, trace);
        assert_eq!(attr(s, "deepspan.original_trace_id"), Some("trace-1"));
    }
    let link = &a.links[0];
    assert_eq!(link.trace_id, TraceId::from_text("other trace").unwrap().0);
    assert_eq!(link.span_id, SpanId::from_text("x y").unwrap().0);
    let link_attr = |k: &str| link.attributes.get(k).and_then(Value::as_str);
    assert_eq!(link_attr("deepspan.original_trace_id"), Some("other trace"));
    assert_eq!(link_attr("deepspan.original_span_id"), Some("x y"));
    // Distinct strings mapped: trace-1, root, G, other trace, x y.
    assert_eq!(import.warnings.len(), 1, "{:?}", import.warnings);
    assert!(
        import.warnings[0].starts_with("t.json: 5 distinct span/trace id strings are not hex"),
        "{}",
        import.warnings[0]
    );
    // Same strings, same ids, in another file and another run.
    let again = parse_jaeger_json(JAEGER.as_bytes(), "copy.json").unwrap();
    let ids = |i: &Import| {
        i.spans
            .iter()
            .map(|s| (s.trace_id, s.span_id))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&import), ids(&again));
}

#[test]
fn hex_only_files_get_no_note() {
    let hex = JAEGER
        .replace("trace-1", "abc1")
        .replace("\"root\"", "\"1\"")
        .replace("\"G\"", "\"2\"")
        .replace("other trace", "3")
        .replace("x y", "4");
    let import = parse_jaeger_json(hex.as_bytes(), "hex.json").unwrap();
    assert!(import.warnings.is_empty(), "{:?}", import.warnings);
    assert!(import.spans.iter().all(|s| s
        .attributes
        .iter()
        .all(|(k, _)| !k.starts_with("deepspan.original"))));
}

#[test]
fn empty_and_overlong_ids_are_errors_with_their_position() {
    let empty = JAEGER.replace("\"spanID\": \"G\"", "\"spanID\": \"\"");
    let e = parse_jaeger_json(empty.as_bytes(), "t.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("data[0].spans[1].spanID"), "{e}");
    assert!(e.contains("empty"), "{e}");
    let long = JAEGER.replace("x y", &"z".repeat(300));
    let e = parse_jaeger_json(long.as_bytes(), "t.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("data[0].spans[2].references[1].spanID"), "{e}");
    assert!(e.contains("300 bytes"), "{e}");
    let zipkin = r#"[{"traceId": "t", "id": "", "timestamp": 1, "duration": 1}]"#;
    let e = parse_zipkin_json(zipkin.as_bytes(), "z.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("[0].id"), "{e}");
}

#[test]
fn zipkin_opaque_ids_import_with_consistent_parents() {
    let zipkin = r#"[
      {"traceId": "trace-1", "id": "root", "name": "root", "timestamp": 100, "duration": 50, "localEndpoint": {"serviceName": "a"}},
      {"traceId": "trace-1", "id": "G", "parentId": "root", "name": "g", "timestamp": 110, "duration": 10, "localEndpoint": {"serviceName": "a"}}
    ]"#;
    let import = parse_zipkin_json(zipkin.as_bytes(), "z.json").unwrap();
    let root = by_original(&import, "root");
    let g = by_original(&import, "G");
    assert_eq!(root.span_id, SpanId::from_text("root").unwrap().0);
    assert_eq!(g.parent_span_id, Some(root.span_id));
    assert_eq!(attr(&g, "deepspan.original_parent_span_id"), Some("root"));
    assert_eq!(attr(&g, "deepspan.original_trace_id"), Some("trace-1"));
    assert_eq!(import.warnings.len(), 1, "{:?}", import.warnings);
    assert!(import.warnings[0].starts_with("z.json: 3 distinct"));
}

#[test]
fn otlp_json_opaque_ids_import_with_consistent_parents_and_links() {
    let otlp = r#"{"resourceSpans": [{"scopeSpans": [{"spans": [
      {"traceId": "trace-1", "spanId": "root", "name": "root", "startTimeUnixNano": "100", "endTimeUnixNano": "200"},
      {"traceId": "trace-1", "spanId": "G", "parentSpanId": "root", "name": "g", "startTimeUnixNano": "110", "endTimeUnixNano": "120",
       "attributes": [{"key": "k", "value": {"stringValue": "v"}}],
       "links": [{"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "other"}]},
      {"traceId": "abc", "spanId": "eee19b7ec3c1b174", "parentSpanId": "", "name": "short hex", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
    ]}]}]}"#;
    let import = parse_otlp_json(otlp.as_bytes(), "o.json").unwrap();
    assert_eq!(import.spans.len(), 3);
    let root = by_original(&import, "root");
    let g = by_original(&import, "G");
    assert_eq!(root.trace_id, TraceId::from_text("trace-1").unwrap().0);
    assert_eq!(g.parent_span_id, Some(root.span_id));
    assert_eq!(attr(&g, "k"), Some("v"));
    assert_eq!(attr(&g, "deepspan.original_parent_span_id"), Some("root"));
    assert_eq!(g.links[0].span_id, SpanId::from_text("other").unwrap().0);
    assert_eq!(
        g.links[0]
            .attributes
            .get("deepspan.original_span_id")
            .and_then(Value::as_str),
        Some("other")
    );
    // Short hex is zero-extended, as in the other formats; not an opaque id.
    let short = import.spans.iter().find(|s| s.name == "short hex").unwrap();
    assert_eq!(short.trace_id, TraceId(0xabc));
    assert_eq!(attr(short, "deepspan.original_trace_id"), None);
    assert_eq!(import.warnings.len(), 1, "{:?}", import.warnings);
    assert!(import.warnings[0].starts_with("o.json: 4 distinct"));
    // A real error elsewhere still names its JSON path.
    let bad = otlp.replace("\"name\": \"g\"", "\"name\": 7");
    let e = parse_otlp_json(bad.as_bytes(), "o.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("resourceSpans[0].scopeSpans[0].spans[1].name"),
        "{e}"
    );
}
