//! `deepspan spans critical-path --semantics crisp` on a Jaeger JSON file.

use crate::common::deepspan;

/// A root of 100 µs, an erring child of 40 µs, then a child of 60 µs.
const TRACE: &str = r#"{"data": [{"traceID": "a1", "processes": {"p1": {"serviceName": "S1", "tags": []}},
 "spans": [
  {"traceID": "a1", "spanID": "1", "operationName": "P", "references": [], "startTime": 1000, "duration": 100,
   "processID": "p1", "tags": [{"key": "span.kind", "type": "string", "value": "server"}], "logs": []},
  {"traceID": "a1", "spanID": "2", "operationName": "A", "startTime": 1000, "duration": 40, "processID": "p1",
   "references": [{"refType": "CHILD_OF", "traceID": "a1", "spanID": "1"}],
   "tags": [{"key": "error", "type": "bool", "value": true}], "logs": []},
  {"traceID": "a1", "spanID": "3", "operationName": "B", "startTime": 1040, "duration": 60, "processID": "p1",
   "references": [{"refType": "CHILD_OF", "traceID": "a1", "spanID": "1"}], "tags": [], "logs": []}
 ]}]}"#;

#[test]
fn crisp_semantics_gives_crisps_figures() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json");
    std::fs::write(&file, TRACE).unwrap();
    let out = deepspan()
        .args([
            "spans",
            "critical-path",
            "--semantics",
            "crisp",
            "--format",
            "json",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["op_time_exclusive_ns"],
        serde_json::json!({"[S1] A": 40000, "[S1] B": 60000, "[S1] P": 0})
    );
    assert_eq!(report["total_work_ns"], 200000);
    assert_eq!(report["time_saved_on_work_ns"], 40000);
    assert_eq!(report["time_saved_on_cp_ns"], 40000);

    let out = deepspan()
        .args([
            "spans",
            "critical-path",
            "--semantics",
            "crisp",
            "--jaeger-ui",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give one"));
}
