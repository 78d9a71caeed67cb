//! Importers on the public span files of ../shared/testdata/spans.

use crate::common::testdata;

use std::collections::HashMap;

use deepspan_spans::model::{SpanKind, StatusCode, Value};
use deepspan_spans::{import_file, Format, Span, SpanId, TraceId};

fn json(rel: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(testdata(rel)).unwrap()).unwrap()
}

fn by_id(spans: &[Span]) -> HashMap<SpanId, &Span> {
    spans.iter().map(|s| (s.span_id, s)).collect()
}

#[test]
fn tracecompass_opentracing_expected() {
    let exp = json("jaeger/tracecompass-opentracing/expected.json");
    for name in ["simple.json", "multiple_services.json"] {
        let imp = import_file(&testdata(&format!(
            "jaeger/tracecompass-opentracing/{name}"
        )))
        .unwrap();
        assert_eq!(imp.format, Format::JaegerJson);
        assert!(imp.warnings.is_empty(), "{:?}", imp.warnings);
        let e = &exp["traces"][name];
        assert_eq!(
            imp.spans.len() as u64,
            e["event_count"].as_u64().unwrap(),
            "{name}"
        );
        let start = imp.spans.iter().map(|s| s.start_ns).min().unwrap();
        let end = imp.spans.iter().map(|s| s.end_ns).max().unwrap();
        assert_eq!(start, e["start_time_us"].as_u64().unwrap() * 1000, "{name}");
        assert_eq!(end, e["end_time_us"].as_u64().unwrap() * 1000, "{name}");
    }
    // First event in start order of simple.json, field by field.
    let imp = import_file(&testdata("jaeger/tracecompass-opentracing/simple.json")).unwrap();
    let first = imp.spans.iter().min_by_key(|s| s.start_ns).unwrap();
    let fe = &exp["traces"]["simple.json"]["first_event"];
    assert_eq!(first.name, fe["Name"].as_str().unwrap());
    assert_eq!(first.start_ns, fe["Timestamp_us"].as_u64().unwrap() * 1000);
    assert_eq!(first.duration_ns(), 16_961_000); // "16.961 ms"
    assert_eq!(first.span_id.to_string(), fe["ID"].as_str().unwrap());
    assert_eq!(first.service_name(), fe["Process"].as_str().unwrap());
    for (k, v) in fe["Process tags"].as_object().unwrap() {
        assert_eq!(
            first.resource.attributes.get(k).unwrap().to_string(),
            v.as_str().unwrap(),
            "process tag {k}"
        );
    }
    for (k, v) in fe["Tags"].as_object().unwrap() {
        assert_eq!(
            first.attributes.get(k).unwrap().to_string(),
            v.as_str().unwrap(),
            "tag {k}"
        );
    }
    assert_eq!(
        first.attributes.get("sampler.param"),
        Some(&Value::Bool(true))
    );
    // Parent links: the two children point at the root.
    let ids = by_id(&imp.spans);
    for s in &imp.spans {
        if s.span_id != first.span_id {
            assert_eq!(s.parent_span_id, Some(first.span_id));
            assert!(ids.contains_key(&s.parent_span_id.unwrap()));
        }
    }
    // The log's "event" field names the event.
    let fmt = imp.spans.iter().find(|s| s.name == "formatString").unwrap();
    assert_eq!(fmt.events.len(), 1);
    assert_eq!(fmt.events[0].name, "string-format");
    assert_eq!(fmt.events[0].time_ns, 1526674498433000 * 1000);
    assert_eq!(
        fmt.events[0].attributes.get("value").unwrap().to_string(),
        "Hello, Kath!"
    );

    let multi = import_file(&testdata(
        "jaeger/tracecompass-opentracing/multiple_services.json",
    ))
    .unwrap();
    let services: std::collections::BTreeSet<_> = multi
        .spans
        .iter()
        .map(|s| s.service_name().to_string())
        .collect();
    assert!(services.len() >= 2, "{services:?}");
}

/// Comparable view of a span: what OTLP → Jaeger conversion must keep.
fn essence(s: &Span) -> String {
    let mut attrs: Vec<String> = s
        .attributes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    attrs.sort();
    format!(
        "{} {} {:?} {} {:?} [{}] {}..{} {:?} scope={} attrs={attrs:?} events={} links={}",
        s.trace_id,
        s.span_id,
        s.parent_span_id,
        s.name,
        s.kind,
        s.service_name(),
        s.start_ns,
        s.end_ns,
        s.status.code,
        s.scope.name,
        s.events.len(),
        s.links.len()
    )
}

#[test]
fn otlp2jaeger_in_and_out_give_the_same_spans() {
    let a = import_file(&testdata("otlp/otlp2jaeger/otlp2jaeger-in.json")).unwrap();
    let b = import_file(&testdata("otlp/otlp2jaeger/otlp2jaeger-out.json")).unwrap();
    assert_eq!(a.format, Format::OtlpJson);
    assert_eq!(b.format, Format::JaegerJson);
    assert_eq!(a.spans.len(), 2);
    let ea: Vec<String> = a.spans.iter().map(essence).collect();
    let eb: Vec<String> = b.spans.iter().map(essence).collect();
    assert_eq!(ea, eb);
    let s = &a.spans[0];
    assert_eq!(s.trace_id.to_string(), "83a9efd15c1c98a977e0711cc93ee28b");
    assert_eq!(s.parent_span_id, SpanId::from_hex("909541b92cf05311"));
    assert_eq!(s.kind, SpanKind::Server);
    assert_eq!(s.service_name(), "telemetrygen");
    assert_eq!(s.start_ns, 1706678909209712000);
    assert_eq!(s.end_ns, 1706678909209835000);
}

#[test]
fn otlp_json_fixtures() {
    let ex = import_file(&testdata("otlp/opentelemetry-proto-example-trace.json")).unwrap();
    assert_eq!(ex.format, Format::OtlpJson);
    assert_eq!(ex.spans.len(), 1);
    let raw = json("otlp/opentelemetry-proto-example-trace.json");
    let rs = &raw["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    let s = &ex.spans[0];
    assert_eq!(
        s.trace_id.to_string(),
        rs["traceId"].as_str().unwrap().to_lowercase()
    );
    assert_eq!(
        s.span_id.to_string(),
        rs["spanId"].as_str().unwrap().to_lowercase()
    );
    assert_eq!(s.name, rs["name"].as_str().unwrap());
    assert_eq!(
        s.start_ns.to_string(),
        rs["startTimeUnixNano"].as_str().unwrap()
    );

    // Every Jaeger storage fixture: counts, ids and times agree with the raw JSON.
    let dir = testdata("otlp/jaeger-integration");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 8);
    for f in files {
        let imp = import_file(&f).unwrap_or_else(|e| panic!("{e}"));
        let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        let mut expect = Vec::new();
        for r in raw["resourceSpans"].as_array().unwrap() {
            let svc = r["resource"]["attributes"]
                .as_array()
                .and_then(|a| a.iter().find(|kv| kv["key"] == "service.name"))
                .map(|kv| kv["value"]["stringValue"].as_str().unwrap().to_string());
            for ss in r["scopeSpans"].as_array().unwrap() {
                for sp in ss["spans"].as_array().unwrap() {
                    expect.push((
                        sp["spanId"].as_str().unwrap().to_lowercase(),
                        sp["startTimeUnixNano"].as_str().unwrap().to_string(),
                        svc.clone().unwrap_or("unknown_service".into()),
                        sp["events"].as_array().map_or(0, |e| e.len()),
                        sp["links"].as_array().map_or(0, |e| e.len()),
                    ));
                }
            }
        }
        let got: Vec<_> = imp
            .spans
            .iter()
            .map(|s| {
                (
                    s.span_id.to_string(),
                    s.start_ns.to_string(),
                    s.service_name().to_string(),
                    s.events.len(),
                    s.links.len(),
                )
            })
            .collect();
        assert_eq!(got, expect, "{}", f.display());
    }
    // Link attributes survive (link_attributes_trace.json).
    let imp = import_file(&testdata(
        "otlp/jaeger-integration/link_attributes_trace.json",
    ))
    .unwrap();
    assert!(imp
        .spans
        .iter()
        .any(|s| s.links.iter().any(|l| !l.attributes.is_empty())));
}

#[test]
fn jaeger_ui_fixtures_import() {
    // The self-time fixtures: every span's parent is in the trace or it is the root.
    for name in [
        "testTraceNormal.json",
        "spansAmongEachOther.json",
        "spanLongerAsParent.json",
        "traceWithOverlappingChildren.json",
    ] {
        let imp = import_file(&testdata(&format!("jaeger/{name}"))).unwrap();
        let raw = json(&format!("jaeger/{name}"));
        assert_eq!(
            imp.spans.len(),
            raw["spans"].as_array().unwrap().len(),
            "{name}"
        );
        let ids = by_id(&imp.spans);
        let roots = imp
            .spans
            .iter()
            .filter(|s| s.parent_span_id.is_none_or(|p| !ids.contains_key(&p)))
            .count();
        assert_eq!(roots, 1, "{name}");
        for (s, r) in imp.spans.iter().zip(raw["spans"].as_array().unwrap()) {
            assert_eq!(s.start_ns, r["startTime"].as_u64().unwrap() * 1000);
            assert_eq!(s.duration_ns(), r["duration"].as_u64().unwrap() * 1000);
            let svc = &raw["processes"][r["processID"].as_str().unwrap()]["serviceName"];
            assert_eq!(s.service_name(), svc.as_str().unwrap());
        }
    }
}

#[test]
fn zipkin_files_import_without_panic_and_keep_ids() {
    let dir = testdata("zipkin");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10);
    for f in &files {
        let imp = import_file(f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(imp.format, Format::ZipkinJson, "{}", f.display());
        let raw: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
        // Span ids are unique in each trace after shared-id handling.
        let mut seen = std::collections::HashSet::new();
        for s in &imp.spans {
            assert!(
                seen.insert((s.trace_id, s.span_id)),
                "{}: duplicate id {}",
                f.display(),
                s.span_id
            );
            assert!(s.end_ns >= s.start_ns);
        }
        // Every original id is still there, as the span id or as zipkin.span_id of a derived one.
        let ids: std::collections::HashSet<String> = imp
            .spans
            .iter()
            .flat_map(|s| {
                [
                    Some(s.span_id.to_string()),
                    s.attributes.get("zipkin.span_id").map(|v| v.to_string()),
                ]
            })
            .flatten()
            .collect();
        for r in &raw {
            let id = format!("{:0>16}", r["id"].as_str().unwrap());
            let timed = r.get("timestamp").is_some();
            if timed {
                assert!(ids.contains(&id), "{}: id {id} lost", f.display());
            }
        }
        // Parents resolve inside the trace, except the root(s).
        let present: std::collections::HashSet<SpanId> =
            imp.spans.iter().map(|s| s.span_id).collect();
        let orphans = imp
            .spans
            .iter()
            .filter(|s| s.parent_span_id.is_some_and(|p| !present.contains(&p)))
            .count();
        let roots = imp
            .spans
            .iter()
            .filter(|s| s.parent_span_id.is_none())
            .count();
        assert!(roots + orphans >= 1, "{}", f.display());
    }
}

#[test]
fn zipkin_yelp_counts_and_fields() {
    let imp = import_file(&testdata("zipkin/yelp.json")).unwrap();
    assert_eq!(imp.spans.len(), 16);
    assert!(imp.warnings.is_empty(), "{:?}", imp.warnings);
    let raw: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(testdata("zipkin/yelp.json")).unwrap()).unwrap();
    // 4 shared server spans: 3 share their id with a client span and get a
    // derived id whose parent is the client side; the 4th (the root) keeps its id.
    let derived: Vec<&Span> = imp
        .spans
        .iter()
        .filter(|s| s.attributes.get("zipkin.span_id").is_some())
        .collect();
    assert_eq!(derived.len(), 3);
    let root = imp
        .spans
        .iter()
        .find(|s| s.span_id == SpanId::from_hex("2e8cfb154b59a41f").unwrap())
        .unwrap();
    assert_eq!((root.parent_span_id, root.kind), (None, SpanKind::Server));
    for d in &derived {
        let orig =
            SpanId::from_hex(&d.attributes.get("zipkin.span_id").unwrap().to_string()).unwrap();
        assert_eq!(d.parent_span_id, Some(orig));
        assert_eq!(d.kind, SpanKind::Server);
        let client = imp.spans.iter().find(|s| s.span_id == orig).unwrap();
        assert_eq!(client.kind, SpanKind::Client);
    }
    let r0 = &raw[0];
    let s0 = imp
        .spans
        .iter()
        .find(|s| {
            s.span_id.to_string() == format!("{:0>16}", r0["id"].as_str().unwrap())
                && s.attributes.get("zipkin.span_id").is_none()
        })
        .unwrap();
    assert_eq!(s0.start_ns, r0["timestamp"].as_u64().unwrap() * 1000);
    assert_eq!(
        s0.trace_id,
        TraceId::from_hex(r0["traceId"].as_str().unwrap()).unwrap()
    );
}

#[test]
fn zipkin_smartthings_missing_times_are_handled_and_said() {
    let imp = import_file(&testdata("zipkin/smartthings-mobile-web-install.json")).unwrap();
    // 84 fragments have neither timestamp nor annotations: dropped, and said.
    let w = imp.warnings.join("\n");
    assert!(
        w.contains("84 span(s) have neither timestamp nor annotations"),
        "{w}"
    );
    assert!(w.contains("have no duration"), "{w}");
    // 1041 raw spans, 84 untimed dropped; no two timed pieces share id, shared
    // flag and endpoint, so Zipkin's merge leaves the rest as they are.
    assert_eq!(imp.spans.len(), 1041 - 84, "{w}");
    let imp2 = import_file(&testdata("zipkin/smartthings-oauth-authorization.json")).unwrap();
    assert!(imp2.warnings.iter().any(|w| w.contains("have no duration")));
    assert!(imp2.spans.iter().all(|s| s.end_ns >= s.start_ns));
}

#[test]
fn zipkin_skew_trace_structure() {
    let imp = import_file(&testdata("zipkin/skew.json")).unwrap();
    assert_eq!(imp.spans.len(), 4);
    let get = |name: &str, svc: &str| {
        imp.spans
            .iter()
            .find(|s| s.name == name && s.service_name() == svc)
            .unwrap()
    };
    let root = get("get", "servicea");
    let client = get("post", "servicea");
    let server = get("post", "serviceb");
    let asyn = get("async", "serviceb");
    assert_eq!(root.parent_span_id, None);
    assert_eq!(client.parent_span_id, Some(root.span_id));
    assert_eq!(server.parent_span_id, Some(client.span_id));
    // The async span's parent id is the shared id; it belongs to serviceb, so to the server side.
    assert_eq!(asyn.parent_span_id, Some(server.span_id));
    assert_eq!(server.kind, SpanKind::Server);
}

#[test]
fn status_and_kind_from_jaeger_tags() {
    let doc = br#"{"data":[{"traceID":"1","spans":[{"traceID":"1","spanID":"2","operationName":"op","references":[],
        "startTime":10,"duration":5,"processID":"p",
        "tags":[{"key":"span.kind","type":"string","value":"client"},{"key":"otel.status_code","type":"string","value":"ERROR"},
                {"key":"otel.status_description","type":"string","value":"boom"},{"key":"deepspan.tid","type":"int64","value":4242},
                {"key":"deepspan.mono_start_ns","type":"int64","value":100},{"key":"deepspan.mono_end_ns","type":"int64","value":"105"}],
        "logs":[{"timestamp":11,"fields":[{"key":"event","type":"string","value":"deepspan.on"},{"key":"deepspan.tid","type":"int64","value":7},{"key":"deepspan.mono_ns","type":"int64","value":101}]}]}],
        "processes":{"p":{"serviceName":"svc","tags":[]}}}]}"#;
    let imp = deepspan_spans::import_bytes(doc, "inline").unwrap();
    let s = &imp.spans[0];
    assert_eq!(s.kind, SpanKind::Client);
    assert_eq!(s.status.code, StatusCode::Error);
    assert_eq!(s.status.message, "boom");
    assert!(s.attributes.get("span.kind").is_none());
    assert_eq!(s.sync.tid, Some(4242));
    assert_eq!(s.sync.mono_start_ns, Some(100));
    assert_eq!(s.sync.mono_end_ns, Some(105));
    assert_eq!(s.sync.activations.len(), 1);
    assert_eq!(
        (
            s.sync.activations[0].tid,
            s.sync.activations[0].mono_ns,
            s.sync.activations[0].on
        ),
        (7, 101, true)
    );
}

#[test]
fn errors_name_file_location_and_reason() {
    // Ids that are not hex are opaque strings (mapped, see opaque_ids.rs); an empty one is an error.
    let bad_id = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"00112233445566778899aabbccddeeff","spanId":"","name":"x"}]}]}]}"#;
    let e = deepspan_spans::import_bytes(bad_id, "bad.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bad.json") && e.contains("resourceSpans[0].scopeSpans[0].spans[0].spanId"),
        "{e}"
    );

    let bad_time = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"00112233445566778899aabbccddeeff","spanId":"0011223344556677","startTimeUnixNano":"soon"}]}]}]}"#;
    let e = deepspan_spans::import_bytes(bad_time, "t.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("startTimeUnixNano"), "{e}");

    let jaeger = br#"{"data":[{"traceID":"1","spans":[{"traceID":"1","spanID":"","startTime":1,"duration":1}],"processes":{}}]}"#;
    let e = deepspan_spans::import_bytes(jaeger, "j.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data[0].spans[0].spanID") && e.contains("empty"),
        "{e}"
    );

    let zipkin = br#"[{"traceId":"abc","id":"1","timestamp":"x"}]"#;
    let e = deepspan_spans::import_bytes(zipkin, "z.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("z.json") && e.contains("[0].timestamp"), "{e}");

    let e = deepspan_spans::import_bytes(b"{\"hello\": 1}", "h.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("neither OTLP"), "{e}");
    let e = deepspan_spans::import_bytes(b"", "empty")
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");
    // Garbage bytes: an error, never a panic.
    let e = deepspan_spans::import_bytes(&[0xff, 0x00, 0x13, 0x37, 0x99], "junk.bin");
    assert!(e.is_err());
}
