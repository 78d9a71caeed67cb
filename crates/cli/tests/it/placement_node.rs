//! A Node.js HTTP server (tests/placement/node_server.js: node:http with
//! stock OpenTelemetry, sdk-node and its HTTP instrumentation, plus
//! deepspan's span processor from sdk/node) under `deepspan record`, 80
//! requests from 4 concurrent client loops of another process. Every
//! request runs on the event loop, interleaved with the others (each waits
//! 2 ms on a timer): the processor's `deepspan.tid` and CLOCK_MONOTONIC
//! times place each one exactly (`sync: exact`) on the loop thread, whose
//! tid is the process id the server reports (its own oracle, not the
//! analysis').
//!
//! Needs Node.js and sdk/node's npm packages (scripts/setup.sh check runs
//! `npm ci` there).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time};
use serde_json::Value;

/// Records `node SCRIPT OUT ARGS…` (a server of tests/placement) under
/// `deepspan record`: the temporary folder, OUT (where the server writes
/// its own account, the tests' oracle) and the run.
pub(crate) fn record_node_server(
    script: &str,
    args: &[&str],
) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sdk = manifest_dir.join("../../sdk/node/node_modules/@opentelemetry/sdk-node");
    assert!(
        sdk.is_dir(),
        "sdk/node's npm packages are needed (scripts/setup.sh check runs npm ci there): {} is missing",
        sdk.display()
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let run = dir.path().join("run");
    let mut rec = deepspan();
    crate::common::ahead_of_other_load(&mut rec);
    check(
        &format!("deepspan record of {script}"),
        rec.arg("record")
            .arg("-o")
            .arg(&run)
            .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0", "--"])
            .arg("node")
            .arg(manifest_dir.join("tests/placement").join(script))
            .arg(&out)
            .args(args)
            .output()
            .expect("run deepspan record"),
    );
    (dir, out, run)
}

const REQUESTS: usize = 80;

#[test]
#[ignore = "system: root and tracefs"]
fn a_node_server_with_the_deepspan_processor_is_placed_exactly_on_its_event_loop() {
    if !kernel_or_skip("a_node_server_with_the_deepspan_processor_is_placed_exactly") {
        return;
    }
    let _one = one_at_a_time();
    let (_dir, out, run) = record_node_server("node_server.js", &[&REQUESTS.to_string(), "4"]);
    let server: Value =
        serde_json::from_slice(&std::fs::read(out.join("server.json")).expect("server.json"))
            .expect("server.json is JSON");
    let loop_tid = server["pid"].as_i64().expect("the server's pid");

    let analyzed = check(
        "deepspan analyze",
        deepspan()
            .arg("analyze")
            .arg(&run)
            .output()
            .expect("run deepspan analyze"),
    );
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    let doc: Value = serde_json::from_slice(
        &std::fs::read(run.join("analysis/requests.json")).expect("requests.json"),
    )
    .expect("requests.json is JSON");
    let requests = doc["requests"].as_array().expect("requests");
    assert_eq!(
        requests.len(),
        REQUESTS,
        "one server span per request:\n{stderr}"
    );
    let mut placed: HashMap<(String, Option<i64>), usize> = HashMap::new();
    for r in requests {
        let key = (
            r["sync"].as_str().unwrap_or("?").to_string(),
            r["tid"].as_i64(),
        );
        *placed.entry(key).or_default() += 1;
    }
    eprintln!("node: {placed:?} (the event loop is thread {loop_tid})");
    assert_eq!(
        placed,
        HashMap::from([(("exact".to_string(), Some(loop_tid)), REQUESTS)]),
        "every request exactly on the event loop thread {loop_tid}:\n{stderr}"
    );
    // Each request has a kernel path on that thread, and its own CPU work
    // (the SHA-256 of 200 KB) shows as running.
    for r in requests {
        let running = r["totals"]["running_ns"].as_u64().unwrap_or(0);
        assert!(running > 0, "no running time on the loop: {r}");
    }
}
