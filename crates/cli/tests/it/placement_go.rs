//! A Go HTTP service with stock OpenTelemetry only (tests/placement/gosvc:
//! net/http + otelhttp + the OTLP/HTTP exporter, nothing of deepspan) under
//! `deepspan record`, with a CPU quota on its process that this test puts
//! on: every request needs more CPU than a period's quota, so each one is
//! throttled, whatever else the machine is doing. The oracle is that
//! set-up, not the analysis: the requests are placed on the service's
//! process (goroutines move between OS threads: `sync: process`, never a
//! thread, none left without a path), and the slow ones — the slower half
//! and any anomalous one — are diagnosed `cpu_throttled` with the
//! service's process among the culprits.
//!
//! Needs Go and the service's modules (scripts/setup.sh test runs
//! `go mod download` in its folder); the binary is built into this test
//! target's temporary folder, from Go's build cache after the first time.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{
    check, deepspan, kernel_or_skip, one_at_a_time, poll, read_json, wait_exit, CpuQuota,
    KillOnDrop,
};
use serde_json::Value;

const REQUESTS: usize = 32;
const CLIENTS: usize = 4;
/// SHA-256 rounds over 64 KiB per request: about 20 ms of CPU here.
const WORK_ROUNDS: usize = 640;
/// 10 ms of CPU per 100 ms: a request alone needs two periods or more, so
/// its process is throttled during each request however idle the machine.
const QUOTA_US: u64 = 10_000;
const PERIOD_US: u64 = 100_000;

fn gosvc_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/placement/gosvc")
}

/// Builds the Go service (Go's build cache makes a rebuild quick).
fn build_gosvc() -> PathBuf {
    let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gosvc/gosvc");
    check(
        "go build of tests/placement/gosvc (modules: scripts/setup.sh test)",
        Command::new("go")
            .current_dir(gosvc_source())
            .args(["build", "-buildvcs=false", "-o"])
            .arg(&binary)
            .arg(".")
            .output()
            .expect("run go (Go is needed for this test)"),
    );
    binary
}

/// Waits for `path`, failing if the recorder ended first or after `limit`.
fn wait_for_file(path: &Path, recorder: &mut KillOnDrop, limit: Duration) {
    poll(limit, Duration::from_millis(20), || {
        if path.exists() {
            return Some(());
        }
        if let Ok(Some(status)) = recorder.0.try_wait() {
            panic!(
                "deepspan record ended ({status}) before {} appeared",
                path.display()
            );
        }
        None
    })
    .unwrap_or_else(|| panic!("{} did not appear in {limit:?}", path.display()));
}

#[test]
#[ignore = "system: root, tracefs, cgroups, Go toolchain and modules"]
fn a_stock_go_service_under_a_cpu_quota_is_diagnosed_cpu_throttled() {
    if !kernel_or_skip("a_stock_go_service_under_a_cpu_quota_is_diagnosed_cpu_throttled") {
        return;
    }
    // A CPU quota staged and judged: one at a time with the others.
    let _one = one_at_a_time();
    let gosvc = build_gosvc();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let run = dir.path().join("run");
    // A file, not a pipe: nothing reads it before the recorder ends.
    let record_log = dir.path().join("record.log");

    // The service and its load generator run under the recorder; the load
    // waits for OUT/go, which this test writes once the server is confined.
    let mut rec = deepspan();
    crate::common::ahead_of_other_load(&mut rec);
    rec.arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0"])
        .arg("--")
        .arg(&gosvc)
        .arg("run")
        .arg("-out")
        .arg(&out)
        .args(["-requests", &REQUESTS.to_string()])
        .args(["-clients", &CLIENTS.to_string()])
        .args(["-work", &WORK_ROUNDS.to_string()])
        .arg("-wait-go")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&record_log).expect("record log"));
    let mut recorder = KillOnDrop(rec.spawn().expect("run deepspan record"));

    wait_for_file(
        &out.join("server.json"),
        &mut recorder,
        Duration::from_secs(60),
    );
    let server = read_json(&out.join("server.json"));
    let server_pid = server["pid"].as_i64().expect("server pid");
    let quota = CpuQuota::create("gosvc", QUOTA_US, PERIOD_US);
    quota.confine(server_pid);
    std::fs::write(out.join("go"), b"").expect("write the go-ahead");

    let limit = Duration::from_secs(300);
    let status = wait_exit(
        &mut recorder.0,
        limit,
        Duration::from_millis(50),
        &format!("deepspan record of the Go service ran over {limit:?}"),
    );
    let throttled_periods = quota.throttled_periods();
    drop(quota);
    let stderr = std::fs::read_to_string(&record_log).unwrap_or_default();
    assert!(
        status.success(),
        "deepspan record of the Go service failed ({status}):\n{stderr}"
    );
    // The set-up did what it says: the kernel throttled the group.
    assert!(
        throttled_periods > 0,
        "the quota never throttled the service"
    );

    let served: HashSet<String> = std::fs::read_to_string(out.join("served.jsonl"))
        .expect("served.jsonl")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(v["pid"].as_i64(), Some(server_pid), "{l}");
            v["span_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        served.len(),
        REQUESTS,
        "every request was served and logged"
    );

    let analyzed = check(
        "deepspan analyze",
        deepspan()
            .arg("analyze")
            .arg(&run)
            .output()
            .expect("run deepspan analyze"),
    );
    let analyze_stderr = String::from_utf8_lossy(&analyzed.stderr);
    let requests = read_json(&run.join("analysis/requests.json"))["requests"]
        .as_array()
        .expect("requests")
        .clone();
    let ids: HashSet<String> = requests
        .iter()
        .map(|r| r["span_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, served, "one request per served span, no other");

    // Placement: every request on the service's process as a whole (the
    // Go SDK's resource says `telemetry.sdk.language` go), none on a thread.
    let placements = read_json(&run.join("analysis/placements.json"));
    let placement_of: HashMap<&str, &Value> = placements["placements"]
        .as_array()
        .expect("placements")
        .iter()
        .map(|p| (p["span_id"].as_str().unwrap(), p))
        .collect();
    let mut by_method: HashMap<&str, usize> = HashMap::new();
    for r in &requests {
        let sync = r["sync"].as_str().unwrap();
        *by_method.entry(sync).or_default() += 1;
        assert_eq!(sync, "process", "{r}\n{analyze_stderr}");
        let p = placement_of[r["span_id"].as_str().unwrap()];
        assert_eq!(
            p["pid"].as_i64(),
            Some(server_pid),
            "placed in the service's process {server_pid}: {p}"
        );
        assert!(
            p["evidence"]
                .to_string()
                .contains("telemetry.sdk.language is"),
            "{p}"
        );
    }
    assert!(
        analyze_stderr.contains(&format!("{REQUESTS} on their process as a whole")),
        "analyze counts the requests placed on their process:\n{analyze_stderr}"
    );

    // Diagnosis: the slower half, and every anomalous request, throttled
    // with the service among the culprits.
    let mut slowest: Vec<&Value> = requests.iter().collect();
    let duration = |r: &Value| r["end_ns"].as_i64().unwrap() - r["start_ns"].as_i64().unwrap();
    slowest.sort_by_key(|r| std::cmp::Reverse(duration(r)));
    let slow: Vec<&Value> = slowest
        .iter()
        .copied()
        .enumerate()
        .filter(|(rank, r)| *rank < REQUESTS / 2 || r["anomalous"] == true)
        .map(|(_, r)| r)
        .collect();
    let mut causes: HashMap<&str, usize> = HashMap::new();
    for r in &requests {
        *causes
            .entry(r["diagnosis"]["cause"].as_str().unwrap_or("-"))
            .or_default() += 1;
    }
    let anomalous = requests.iter().filter(|r| r["anomalous"] == true).count();
    eprintln!(
        "{REQUESTS} requests, placed by {by_method:?}; causes {causes:?}; \
         {} slow ones checked ({anomalous} anomalous); {throttled_periods} periods throttled",
        slow.len()
    );
    for r in &slow {
        let d = &r["diagnosis"];
        assert_eq!(d["cause"], "cpu_throttled", "{r}\n{analyze_stderr}");
        let culprits = d["culprits"].as_array().expect("culprits");
        assert!(
            culprits
                .iter()
                .any(|c| c["kind"] == "process" && c["pid"].as_i64() == Some(server_pid)),
            "the service's process {server_pid} among the culprits: {d}"
        );
    }
}
