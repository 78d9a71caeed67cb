//! Placement by inference against the SDK's own placement, on the same
//! recording: the lock scenario of demo_real's kept demo (recorded with
//! deepspan_otel) is analysed as it is (the SDK's `deepspan.tid` and
//! activations place every request) and again with `--placement inferred`
//! (SDK fields ignored). Inference must put ≥ 95 % of the requests on the
//! SDK's home thread, and give ≥ 95 % of the anomalous requests the SDK's
//! cause.
//!
//! The second test runs `deepspan demo --no-sdk` (6 scenarios, about 2
//! minutes): without the SDK, every scenario must still be diagnosed as
//! with it.
//!
//! Needs root, PostgreSQL and the demo's Python packages (`make demo`).

use std::collections::HashMap;
use std::path::Path;

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time};
use crate::demo_real::copy_of_kept_run;
use serde_json::Value;

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
#[ignore = "system: root, tracefs, the demo (cgroups, netns, PostgreSQL)"]
fn inferred_placement_agrees_with_the_sdk_on_a_demo_recording() {
    if !kernel_or_skip("inferred_placement_agrees_with_the_sdk_on_a_demo_recording") {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let run = copy_of_kept_run("lock", dir.path());

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

/// `deepspan demo --no-sdk`: the shop with stock OpenTelemetry only. Every
/// scenario must be diagnosed with its cause and culprits (the demo's own
/// check) and the kernel path must show it, with every request placed from
/// the kernel trace (no `exact`).
#[test]
#[ignore = "system: root, tracefs, the demo (cgroups, netns, PostgreSQL)"]
fn every_demo_scenario_is_diagnosed_without_the_sdk() {
    if !kernel_or_skip("every_demo_scenario_is_diagnosed_without_the_sdk") {
        return;
    }
    let _one = one_at_a_time();
    let keep = tempfile::tempdir_in("/var/tmp").expect("temp dir");
    let mut demo = deepspan();
    crate::common::ahead_of_other_load(&mut demo);
    let out = demo
        .args(["demo", "--no-sdk", "--format", "json", "--keep"])
        .arg(keep.path())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run deepspan demo --no-sdk");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "demo output is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let scenarios = doc["scenarios"].as_array().expect("scenarios array");
    assert_eq!(scenarios.len(), 6);
    let mut failed = Vec::new();
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        if s["ok"] != true || s["path_check"]["ok"] != true {
            failed.push(format!(
                "{name}: expected {}, found {} ({}); kernel path: {}",
                s["expected_cause"], s["found_cause"], s["problems"], s["path_check"]["detail"]
            ));
        }
        let run = Path::new(s["run"].as_str().expect("kept run"));
        let requests = requests(run);
        assert!(!requests.is_empty(), "{name}: no requests");
        let exact = requests.values().filter(|r| r["sync"] == "exact").count();
        assert_eq!(exact, 0, "{name}: the shop ran without deepspan_otel");
        let inferred = requests
            .values()
            .filter(|r| r["sync"] == "inferred")
            .count();
        assert!(
            inferred * 10 >= requests.len() * 9,
            "{name}: {inferred} of {} requests placed on a thread",
            requests.len()
        );
    }
    assert!(
        failed.is_empty(),
        "scenarios not diagnosed as expected:\n{}",
        failed.join("\n")
    );
    assert!(out.status.success(), "exit status {}", out.status);
}
