//! Placement without the SDK on a real recording: a Python HTTP server with
//! stock OpenTelemetry only (tests/placement/stock_server.py, no
//! deepspan_otel) under `deepspan record`, 80 requests from 4 client
//! threads of another process. `analyze` must place most requests on a
//! thread from the kernel trace alone (`sync: inferred`), and on the right
//! one: the oracle is the server's own log of `threading.get_native_id()`
//! per request, not anything the analysis computes. `--placement sdk`
//! (today's behaviour without inference) places none.
//!
//! Needs python3 with opentelemetry-sdk and the OTLP/HTTP exporter
//! (scripts/install-deps.sh).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{deepspan, kernel_or_skip};
use serde_json::Value;

const REQUESTS: usize = 80;

fn server_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/placement/stock_server.py")
}

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

fn requests_json(run: &Path) -> Vec<Value> {
    let text = std::fs::read(run.join("analysis/requests.json")).expect("requests.json");
    let doc: Value = serde_json::from_slice(&text).expect("requests.json is JSON");
    doc["requests"].as_array().expect("requests").clone()
}

fn analyze(run: &Path, placement: &str) -> Output {
    check(
        &format!("deepspan analyze --placement {placement}"),
        deepspan()
            .arg("analyze")
            .arg(run)
            .args(["--placement", placement])
            .output()
            .expect("run deepspan analyze"),
    )
}

#[test]
fn a_stock_opentelemetry_server_is_placed_on_its_threads_from_the_kernel_trace() {
    if !kernel_or_skip(
        "a_stock_opentelemetry_server_is_placed_on_its_threads_from_the_kernel_trace",
    ) {
        return;
    }
    let probe = Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http",
        ])
        .output()
        .expect("run python3");
    assert!(
        probe.status.success(),
        "python3 with opentelemetry-sdk and the OTLP/HTTP exporter is needed (scripts/install-deps.sh): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let run = dir.path().join("run");
    let mut rec = deepspan();
    common::ahead_of_other_load(&mut rec);
    rec.arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0"])
        .arg("--")
        .arg("python3")
        .arg(server_py())
        .arg(&out)
        .arg(REQUESTS.to_string())
        .arg("4")
        // Stock OpenTelemetry: no deepspan SDK on the path.
        .env_remove("PYTHONPATH");
    check(
        "deepspan record of the stock server",
        rec.output().expect("run deepspan record"),
    );
    assert!(
        run.join("processes.json").is_file(),
        "the recording keeps its /proc scan"
    );

    // The oracle: which thread served each request, from the server itself.
    let mut served_pid = 0;
    let served: HashMap<String, i64> = std::fs::read_to_string(out.join("served.jsonl"))
        .expect("served.jsonl")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            served_pid = v["pid"].as_i64().unwrap();
            (
                v["span_id"].as_str().unwrap().to_string(),
                v["tid"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        served.len(),
        REQUESTS,
        "every request was served and logged"
    );

    // Without inference (the SDK's fields only): no request has a path.
    analyze(&run, "sdk");
    let requests = requests_json(&run);
    assert_eq!(requests.len(), REQUESTS);
    assert!(
        requests.iter().all(|r| r["sync"] == "none"),
        "no SDK fields, no placement"
    );

    let analyzed = analyze(&run, "auto");
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    assert!(
        stderr.contains(&format!("{REQUESTS} inferred on a thread"))
            || stderr.contains("inferred on a thread"),
        "analyze says how many requests each method placed:\n{stderr}"
    );
    let requests = requests_json(&run);
    let inferred: Vec<&Value> = requests
        .iter()
        .filter(|r| r["sync"] == "inferred")
        .collect();
    let right = inferred
        .iter()
        .filter(|r| served.get(r["span_id"].as_str().unwrap()) == r["tid"].as_i64().as_ref())
        .count();
    eprintln!(
        "placed {} of {REQUESTS} on a thread, {right} on the thread that served them",
        inferred.len()
    );
    // Most, not all: the kernel drops events on this machine (switches out
    // of the idle task), which may leave a thread's run unseen.
    assert!(
        inferred.len() * 10 >= REQUESTS * 9,
        "{} of {REQUESTS} placed on a thread",
        inferred.len()
    );
    assert!(
        right * 10 >= inferred.len() * 9,
        "{right} of {} on the serving thread",
        inferred.len()
    );
    // Placed requests have a kernel path and a diagnosis.
    for r in &inferred {
        assert!(r["diagnosis"].is_object(), "{r}");
    }

    // `report` says how the request was placed and why.
    let one = inferred[0]["span_id"].as_str().unwrap();
    let report = check(
        "deepspan report",
        deepspan()
            .arg("report")
            .arg(&run)
            .args(["--request", one])
            .output()
            .expect("run deepspan report"),
    );
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("sync: inferred"), "{text}");
    assert!(
        text.contains("placed from the kernel trace on thread"),
        "{text}"
    );
    // The process: from the port it listened on when the recorder's /proc
    // scan saw it listening (scans are once a second), else from the
    // request's I/O among all processes. Either way, the server's.
    let pid = served_pid.to_string();
    assert!(
        text.contains(&format!("of process {pid}")),
        "placed in the server process {pid}:\n{text}"
    );
}
