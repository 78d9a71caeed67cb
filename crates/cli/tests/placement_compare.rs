//! Placement by inference against the SDK's own placement, on the same
//! recording: a demo scenario recorded with deepspan_otel (`deepspan demo
//! --scenario lock --keep DIR`) is analysed as it is (the SDK's
//! `deepspan.tid` and activations place every request) and again with
//! `--placement inferred` (SDK fields ignored). The acceptance of issue 16:
//! ≥ 95 % of the requests on the same home thread, ≥ 95 % of the anomalous
//! requests with the same cause.
//!
//! Needs root, PostgreSQL and the demo's Python packages (`make demo`).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;

use common::{deepspan, kernel_or_skip};
use serde_json::Value;

fn check(what: &str, out: Output) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `(trace_id, span_id)` → request, from an analysis's requests.json.
fn requests(run: &Path) -> HashMap<(String, String), Value> {
    let text = std::fs::read(run.join("analysis/requests.json")).expect("requests.json");
    let doc: Value = serde_json::from_slice(&text).expect("requests.json is JSON");
    doc["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| {
            let key = (
                r["trace_id"].as_str().unwrap().to_string(),
                r["span_id"].as_str().unwrap().to_string(),
            );
            (key, r.clone())
        })
        .collect()
}

fn analyze(run: &Path, placement: &str) -> HashMap<(String, String), Value> {
    check(
        &format!("deepspan analyze --placement {placement}"),
        deepspan()
            .arg("analyze")
            .arg(run)
            .args(["--placement", placement])
            .output()
            .expect("run deepspan analyze"),
    );
    requests(run)
}

#[test]
fn inferred_placement_agrees_with_the_sdk_on_a_demo_recording() {
    if !kernel_or_skip("inferred_placement_agrees_with_the_sdk_on_a_demo_recording") {
        return;
    }
    // On a real disk, under the target folder.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let mut demo = deepspan();
    common::ahead_of_other_load(&mut demo);
    // The demo's own verdict is not this test's business: only the run.
    let out = demo
        .args(["demo", "--scenario", "lock", "--keep"])
        .arg(dir.path())
        .output()
        .expect("run deepspan demo");
    let run = dir.path().join("lock");
    assert!(
        run.join("analysis/requests.json").is_file(),
        "the demo kept no analysed run ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let sdk = analyze(&run, "sdk");
    let inferred = analyze(&run, "inferred");
    let placed_by_sdk: Vec<&(String, String)> = sdk
        .iter()
        .filter(|(_, r)| r["sync"] == "exact")
        .map(|(k, _)| k)
        .collect();
    assert!(
        placed_by_sdk.len() > 100,
        "{} requests placed by the SDK",
        placed_by_sdk.len()
    );
    let same_thread = placed_by_sdk
        .iter()
        .filter(|k| {
            inferred
                .get(**k)
                .is_some_and(|r| r["tid"] == sdk[**k]["tid"])
        })
        .count();
    let anomalous: Vec<&(String, String)> = sdk
        .iter()
        .filter(|(_, r)| r["anomalous"] == true && r["diagnosis"].is_object())
        .map(|(k, _)| k)
        .collect();
    let same_cause = anomalous
        .iter()
        .filter(|k| {
            inferred
                .get(**k)
                .is_some_and(|r| r["diagnosis"]["cause"] == sdk[**k]["diagnosis"]["cause"])
        })
        .count();
    eprintln!(
        "same home thread: {same_thread} of {}; anomalous with the same cause: {same_cause} of {}",
        placed_by_sdk.len(),
        anomalous.len()
    );
    assert!(
        same_thread * 100 >= placed_by_sdk.len() * 95,
        "{same_thread} of {} requests on the SDK's home thread",
        placed_by_sdk.len()
    );
    assert!(
        !anomalous.is_empty(),
        "the lock scenario makes anomalous requests"
    );
    assert!(
        same_cause * 100 >= anomalous.len() * 95,
        "{same_cause} of {} anomalous requests with the SDK's cause",
        anomalous.len()
    );
    // Inferred requests say so.
    assert!(inferred.values().all(|r| r["sync"] != "exact"));
}
