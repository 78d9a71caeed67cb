//! A Jaeger JSON trace whose span ids are the letters "A".."G" and whose
//! trace id is "trace-abc" (the opaque ids of jaeger-ui's synthetic test
//! traces) imports with `deepspan import` and gives Jaeger UI's critical
//! path with `deepspan spans critical-path`, on the file and on the run.

use std::path::Path;

use crate::common::{deepspan, run_ok};
use deepspan_spans::{read_run_spans, SpanId, TraceId};
use serde_json::Value as J;

/// (span id, start µs, duration µs, parent). Times are absolute µs, none
/// zero (Jaeger UI treats a zero start as missing).
const SPANS: [(&str, u64, u64, Option<&str>); 7] = [
    ("A", 1000, 100, None),
    ("B", 1010, 30, Some("A")),
    ("C", 1050, 40, Some("A")),
    ("D", 1055, 15, Some("C")),
    ("E", 1060, 20, Some("C")),
    ("F", 1015, 15, Some("B")),
    ("G", 1020, 5, Some("F")),
];

/// Worked out by hand with Jaeger UI's algorithm (CriticalPath/index.ts):
/// from the end of the root, each span is on the path back to the end of its
/// last-finishing child (among those ending before the point reached), then
/// that child's path, then the span again down to its start.
/// - A ends at 1100; its last-finishing child is C (ends 1090): A 1090–1100.
/// - C's last-finishing child is E (1080; D ends 1070): C 1080–1090.
/// - E has no children: E 1060–1080; back in C before 1060 no child has
///   ended (D ends 1070): C 1050–1060.
/// - Back in A before 1050, B has ended (1040): A 1040–1050.
/// - B → F (ends 1030): B 1030–1040; F → G (ends 1025): F 1025–1030;
///   G 1020–1025; F before 1020: F 1015–1020; B before 1015: B 1010–1015.
/// - A before 1010: A 1000–1010. D is not on the path (E outlasts it).
const EXPECTED: [(&str, u64, u64); 11] = [
    ("A", 1090, 1100),
    ("C", 1080, 1090),
    ("E", 1060, 1080),
    ("C", 1050, 1060),
    ("A", 1040, 1050),
    ("B", 1030, 1040),
    ("F", 1025, 1030),
    ("G", 1020, 1025),
    ("F", 1015, 1020),
    ("B", 1010, 1015),
    ("A", 1000, 1010),
];

fn jaeger_trace() -> J {
    let spans: Vec<J> = SPANS
        .iter()
        .map(|(id, start, duration, parent)| {
            let references: Vec<J> = parent
                .iter()
                .map(|p| serde_json::json!({"refType": "CHILD_OF", "traceID": "trace-abc", "spanID": p}))
                .collect();
            serde_json::json!({
                "traceID": "trace-abc",
                "spanID": id,
                "operationName": format!("op {id}"),
                "references": references,
                "startTime": start,
                "duration": duration,
                "processID": "p1",
                "tags": [],
                "logs": []
            })
        })
        .collect();
    serde_json::json!({
        "data": [{
            "traceID": "trace-abc",
            "spans": spans,
            "processes": {"p1": {"serviceName": "letters", "tags": []}}
        }]
    })
}

/// The sections of `deepspan spans critical-path --format json`, span ids
/// given back as the letters of the file.
fn critical_path(path: &Path, jaeger_ui: bool) -> Vec<(String, u64, u64)> {
    let mut cmd = deepspan();
    cmd.args(["spans", "critical-path"])
        .arg(path)
        .args(["--format", "json"]);
    if jaeger_ui {
        cmd.arg("--jaeger-ui");
    }
    let (stdout, _) = run_ok(&mut cmd);
    let report: J = serde_json::from_str(&stdout).unwrap();
    let traces = report["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 1, "{stdout}");
    assert_eq!(
        traces[0]["trace_id"].as_str().unwrap(),
        TraceId::from_text("trace-abc").unwrap().0.to_string()
    );
    let letter_of = |hex: &str| {
        SPANS
            .iter()
            .map(|s| s.0)
            .find(|l| SpanId::from_text(l).unwrap().0.to_string() == hex)
            .unwrap_or_else(|| panic!("span id {hex} is none of A..G"))
            .to_string()
    };
    traces[0]["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                letter_of(s["span_id"].as_str().unwrap()),
                s["start_ns"].as_u64().unwrap() / 1000,
                s["end_ns"].as_u64().unwrap() / 1000,
            )
        })
        .collect()
}

#[test]
fn jaeger_letters_as_span_ids_import_and_give_the_critical_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("letters.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&jaeger_trace()).unwrap()).unwrap();
    let run = dir.path().join("run");

    let (stdout, stderr) = run_ok(
        deepspan()
            .args(["import", "-o"])
            .arg(&run)
            .arg("--jaeger")
            .arg(&file),
    );
    assert!(stdout.contains("7 spans (Jaeger JSON)"), "{stdout}");
    // "A".."F" are hex digits (read as 0xa..0xf, as Jaeger's backend does);
    // "G" and "trace-abc" are not: two opaque strings, one note.
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("not hex")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(
        notes[0].contains("letters.json: 2 distinct span/trace id strings are not hex"),
        "{stderr}"
    );

    // The run keeps the original text of the mapped ids.
    let spans: Vec<_> = read_run_spans(&run).unwrap().map(|s| s.unwrap()).collect();
    assert_eq!(spans.len(), 7);
    let original = |s: &deepspan_spans::Span, key: &str| {
        s.attributes
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    for s in &spans {
        assert_eq!(
            original(s, "deepspan.original_trace_id").as_deref(),
            Some("trace-abc")
        );
    }
    let g = spans.iter().find(|s| s.name == "op G").unwrap();
    assert_eq!(
        original(g, "deepspan.original_span_id").as_deref(),
        Some("G")
    );
    assert_eq!(g.parent_span_id, Some(SpanId(0xf)));

    let expected: Vec<(String, u64, u64)> = EXPECTED
        .iter()
        .map(|(l, s, e)| (l.to_string(), *s, *e))
        .collect();
    let on_path: u64 = expected.iter().map(|(_, s, e)| e - s).sum();
    assert_eq!(on_path, 100, "the path covers the root span exactly");
    for jaeger_ui in [true, false] {
        assert_eq!(
            critical_path(&file, jaeger_ui),
            expected,
            "file, jaeger_ui {jaeger_ui}"
        );
        assert_eq!(
            critical_path(&run, jaeger_ui),
            expected,
            "run, jaeger_ui {jaeger_ui}"
        );
    }
}
