//! `deepspan export` without a kernel trace: what it refuses and how it
//! says so, and a run without requests (spans imported from a file, an
//! analysis that found none) exported unchanged.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::{deepspan, testdata};

fn example_trace() -> PathBuf {
    testdata("spans/otlp/opentelemetry-proto-example-trace.json")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A run with the example trace's spans and an analysis without requests.
fn run_without_requests(dir: &Path) -> PathBuf {
    let run = dir.join("run");
    let out = deepspan()
        .arg("import")
        .arg("-o")
        .arg(&run)
        .arg(example_trace())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::create_dir_all(run.join("analysis")).unwrap();
    std::fs::write(run.join("analysis/requests.json"), requests_json(&[])).unwrap();
    run
}

/// A requests.json of these requests, as `analyze` writes one.
fn requests_json(requests: &[serde_json::Value]) -> String {
    serde_json::json!({
        "format_version": 1,
        "trace": {"file": "", "events": 0, "lost_events": 0, "start_ns": 0, "end_ns": 0, "threads": 0},
        "notes": [],
        "requests": requests,
        "operations": [],
    })
    .to_string()
}

#[test]
fn export_needs_a_destination_and_an_analysis() {
    let dir = tempfile::tempdir().unwrap();
    let out = deepspan().arg("export").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--out FILE.json and/or --otlp URL"),
        "{}",
        stderr(&out)
    );

    let out = deepspan()
        .arg("export")
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("x.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("has no analysis: run `deepspan analyze"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_analysis_files_and_urls_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_without_requests(dir.path());
    let out = deepspan()
        .arg("export")
        .arg(&run)
        .args(["--otlp", "https://127.0.0.1:4318"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("https is not supported"),
        "{}",
        stderr(&out)
    );

    let request = serde_json::json!({
        "trace_id": "zz", "span_id": "00000000000000aa", "parent_span_id": null,
        "service": "s", "operation": "o", "kind": "server", "start_ns": 1, "end_ns": 2,
        "duration_ns": 1, "sync": "exact", "tid": null, "lost_events": 0, "truncated": false,
        "totals": {"running_ns": 0, "preempted_ns": 0, "throttled_ns": 0,
                   "blocked_by_requests_ns": 0, "unknown_ns": 0},
        "causes": [], "cause_groups": [], "syscalls": [], "baseline_ns": null,
        "anomalous": false, "diagnosis": null,
    });
    std::fs::write(
        run.join("analysis/requests.json"),
        requests_json(&[request]),
    )
    .unwrap();
    let out = deepspan()
        .arg("export")
        .arg(&run)
        .arg("--out")
        .arg(dir.path().join("x.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("requests[0].trace_id is not hex"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));

    // A file that is not the analysis's: which file, and what is missing.
    std::fs::write(
        run.join("analysis/requests.json"),
        r#"{"requests": [{"trace_id": "zz"}]}"#,
    )
    .unwrap();
    let out = deepspan()
        .arg("export")
        .arg(&run)
        .arg("--out")
        .arg(dir.path().join("x.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("requests.json") && err.contains("missing field"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn spans_of_a_run_without_requests_are_exported_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_without_requests(dir.path());
    let file = dir.path().join("out.otlp.json");
    let out = deepspan()
        .arg("export")
        .arg(&run)
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut original = deepspan_spans::import_file(&example_trace()).unwrap().spans;
    let mut exported = deepspan_spans::import_file(&file).unwrap().spans;
    assert!(!original.is_empty());
    original.sort_by_key(|s| (s.trace_id, s.span_id));
    exported.sort_by_key(|s| (s.trace_id, s.span_id));
    assert_eq!(exported, original);
}
