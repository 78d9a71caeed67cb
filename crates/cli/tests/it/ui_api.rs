//! `deepspan ui`'s JSON API on a real recorded and analysed run (two Python
//! requests contending on a lock, tests/analyze/cases.py): time ranges and
//! level of detail, bad parameters (400 with a message), unknown requests
//! (404; a flame graph of a run recorded without `--profile` too), and attempts to read files outside the run folder (`..`, encoded
//! `%2e%2e`, absolute paths, symlinks), sent as raw HTTP so that no client
//! normalizes them first.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::ui::{get, json, serve, Server};
use crate::common::{check, deepspan, kernel_or_skip, repo, wait_exit, KillOnDrop};
use serde_json::Value;

/// Records and analyses the lock case into `dir/run`; returns the run and
/// the ids the program wrote (`holder`, `waiter`).
fn record_lock_case(dir: &Path) -> (PathBuf, Value) {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let run = dir.join("run");
    check(
        "deepspan record",
        deepspan()
            .arg("record")
            .arg("-o")
            .arg(&run)
            .args([
                "--otlp-grpc-port",
                "0",
                "--otlp-http-port",
                "0",
                "--",
                "python3",
            ])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/analyze/cases.py"))
            .arg("lock")
            .arg(&out)
            .env("PYTHONPATH", repo().join("sdk/python"))
            .output()
            .unwrap(),
    );
    check(
        "deepspan analyze",
        deepspan().arg("analyze").arg(&run).output().unwrap(),
    );
    let ids = serde_json::from_slice(&std::fs::read(out.join("ids.json")).unwrap()).unwrap();
    (run, ids)
}

fn error(s: &Server, path: &str, want: u16) -> String {
    let (status, body) = get(s, path);
    assert_eq!(status, want, "GET {path} answered {status}: {body}");
    body
}

#[test]
#[ignore = "system: root and tracefs"]
fn api_on_a_recorded_run() {
    if !kernel_or_skip("api_on_a_recorded_run") {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (run, ids) = record_lock_case(dir.path());
    let holder = ids["holder"].as_str().unwrap();
    let waiter = ids["waiter"].as_str().unwrap();
    let s = serve(&run);

    // The app and the run.
    let (status, index) = get(&s, "/");
    assert_eq!(status, 200);
    assert!(
        index.contains("<div id=\"tooltip\""),
        "not the built UI: {index}"
    );
    let info = json(&s, "/api/run");
    assert!(info["requests"].as_u64().unwrap() >= 2, "{info}");
    assert!(info["intervals"].as_u64().unwrap() > 10, "{info}");
    let (t0, t1) = (
        info["start_ns"].as_i64().unwrap(),
        info["end_ns"].as_i64().unwrap(),
    );
    assert!(t1 > t0);

    // Requests: sorted both ways, filtered.
    let list = json(&s, "/api/requests?sort=duration&order=desc");
    let durations: Vec<u64> = list["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["duration_ns"].as_u64().unwrap())
        .collect();
    assert!(durations.windows(2).all(|w| w[0] >= w[1]), "{durations:?}");
    // Both last about 300 ms (the waiter waits for the holder's sleep).
    let slowest = list["requests"][0]["span_id"].as_str().unwrap();
    assert!(slowest == holder || slowest == waiter, "{list}");
    let by_start = json(&s, "/api/requests?sort=start&order=asc");
    let starts: Vec<u64> = by_start["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["start_ns"].as_u64().unwrap())
        .collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
    let waiters = json(&s, "/api/requests?operation=waiter");
    assert_eq!(waiters["total"], 1, "{waiters}");
    assert_eq!(
        json(&s, "/api/requests?service=no-such-service")["total"],
        0
    );

    // One request: the waiter is blocked by the holder.
    let w = json(&s, &format!("/api/requests/{waiter}"));
    assert_eq!(w["request"]["span_id"], waiter);
    assert!(
        w["blockers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["span_id"] == holder),
        "the waiter's blockers: {}",
        w["blockers"]
    );
    let spans = json(&s, &format!("/api/requests/{waiter}/spans"));
    let trace = &spans["trace"];
    assert!(
        trace["spans"]
            .as_array()
            .unwrap()
            .iter()
            .any(|sp| sp["span_id"] == waiter),
        "{spans}"
    );
    assert!(
        !trace["critical_path"].as_array().unwrap().is_empty(),
        "no span critical path: {spans}"
    );

    // The holder's timeline: the whole request, then a sub-range.
    let h = json(&s, &format!("/api/requests/{holder}"));
    let (hs, he) = (
        h["request"]["start_ns"].as_i64().unwrap(),
        h["request"]["end_ns"].as_i64().unwrap(),
    );
    let full = json(
        &s,
        &format!("/api/requests/{holder}/timeline?resolution_ns=1"),
    );
    let states = &full["drawn_states"];
    assert!(
        states["TIMER"].as_u64().unwrap_or(0) > 0,
        "the holder sleeps with the lock: {states}"
    );
    let pieces: Vec<&Value> = full["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["intervals"].as_array().unwrap())
        .collect();
    let covered: i64 = pieces
        .iter()
        .map(|p| p["end_ns"].as_i64().unwrap() - p["start_ns"].as_i64().unwrap())
        .sum();
    assert_eq!(
        covered,
        he - hs,
        "at full resolution the pieces cover the request exactly"
    );
    let mid = hs + (he - hs) / 2;
    let part = json(
        &s,
        &format!("/api/requests/{holder}/timeline?start_ns={mid}&end_ns={he}&resolution_ns=1"),
    );
    for l in part["lanes"].as_array().unwrap() {
        for p in l["intervals"].as_array().unwrap() {
            assert!(
                p["end_ns"].as_i64().unwrap() > mid && p["start_ns"].as_i64().unwrap() < he,
                "{p} is outside the range"
            );
        }
    }
    // A coarse resolution never returns more than about one piece per step.
    let coarse = json(
        &s,
        &format!(
            "/api/requests/{holder}/timeline?resolution_ns={}",
            (he - hs) / 10
        ),
    );
    for l in coarse["lanes"].as_array().unwrap() {
        assert!(l["intervals"].as_array().unwrap().len() <= 22, "{l}");
    }

    // Thread states and CPUs over a window.
    let ts = json(
        &s,
        &format!("/api/thread_states?start_ns={t0}&end_ns={t1}&resolution_ns=1000000"),
    );
    assert!(!ts["lanes"].as_array().unwrap().is_empty(), "{ts}");
    let tid = ts["lanes"][0]["tid"].as_i64().unwrap();
    let one = json(
        &s,
        &format!("/api/thread_states?tids={tid}&resolution_ns=1"),
    );
    assert_eq!(one["lanes"].as_array().unwrap().len(), 1);
    let ivs = one["lanes"][0]["intervals"].as_array().unwrap();
    assert!(
        ivs.windows(2)
            .all(|w| w[0]["start_ns"].as_i64() <= w[1]["start_ns"].as_i64()),
        "intervals out of order"
    );
    let cpus = json(&s, &format!("/api/cpus?start_ns={t0}&end_ns={t1}"));
    assert!(!cpus["cpus"].as_array().unwrap().is_empty(), "{cpus}");
    let conc = json(&s, &format!("/api/concurrent?start_ns={hs}&end_ns={he}"));
    let shown: Vec<&str> = conc["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["span_id"].as_str().unwrap())
        .collect();
    assert!(
        shown.contains(&holder) && shown.contains(&waiter),
        "{shown:?}"
    );
    assert!(
        conc["arrows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["from"] == waiter && a["to"] == holder),
        "no arrow from the waiter to the holder: {}",
        conc["arrows"]
    );

    // Bad parameters: 400 with a message naming the problem.
    for (path, says) in [
        ("/api/thread_states?start_ns=abc", "start_ns"),
        ("/api/thread_states?start_ns=10&end_ns=5", "end_ns"),
        ("/api/thread_states?start_ns=-5", "start_ns"),
        ("/api/thread_states?resolution_ns=0", "resolution_ns"),
        ("/api/thread_states?tids=1,x", "tids"),
        ("/api/thread_states?bogus=1", "bogus"),
        ("/api/thread_states?limit=1&limit=2", "limit"),
        ("/api/cpus?end_ns=1e9", "end_ns"),
        ("/api/requests?sort=name", "sort"),
        ("/api/requests?order=up", "order"),
        ("/api/requests?anomalous=maybe", "anomalous"),
        ("/api/requests/not-hex", "request id"),
        ("/api/requests/zz/timeline", "request id"),
        ("/api/requests/zz/profile", "request id"),
        ("/api/requests/0123456789abcdef/profile?x=1", "x"),
        ("/api/concurrent?start_ns=%zz", "percent"),
    ] {
        let body = error(&s, path, 400);
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not JSON: {body}"));
        assert!(
            v["error"].as_str().unwrap().contains(says),
            "{path}: {body}"
        );
    }
    // Unknown things: 404.
    error(&s, "/api/requests/0123456789abcdef", 404);
    error(&s, "/api/requests/0123456789abcdef/profile", 404);
    // Recorded without --profile: no flame graph, and the answer says why.
    let body = error(&s, &format!("/api/requests/{holder}/profile"), 404);
    assert!(
        body.contains("record it with `deepspan record --profile`"),
        "{body}"
    );
    error(&s, "/api/no-such-endpoint", 404);
    error(&s, "/api/thread_states?tids=999999999", 404);
    error(&s, "/no-such-page.html", 404);

    // Traversal: nothing outside the run (or the embedded app) is served.
    std::fs::write(dir.path().join("secret.txt"), "SECRET-OUTSIDE-THE-RUN").unwrap();
    for path in [
        "/../secret.txt",
        "/../../../../etc/passwd",
        "/%2e%2e/secret.txt",
        "/%2E%2E/%2E%2E/etc/passwd",
        "/assets/..%2f..%2fsecret.txt",
        "/assets/%2e%2e/%2e%2e/secret.txt",
        "//etc/passwd",
        "/etc/passwd",
        "/manifest.json",
        "/analysis/requests.json",
        "/kernel/trace.dat",
        "/..%5csecret.txt",
        "/api/requests/..%2f..%2fsecret.txt",
        "/api/requests/%2e%2e/spans",
    ] {
        let (status, body) = get(&s, path);
        assert!(
            status == 404 || status == 400,
            "GET {path} answered {status}: {body}"
        );
        assert!(
            !body.contains("SECRET") && !body.contains("root:"),
            "GET {path} leaked: {body}"
        );
    }
    // An absolute URI in the request line.
    let (status, body) = get(&s, &format!("http://{}/../secret.txt", s.addr));
    assert!(
        status == 404 || status == 400,
        "absolute URI answered {status}: {body}"
    );
    drop(s);

    // A file of the analysis that is a symlink leading out of the run is
    // refused.
    let outside = dir.path().join("outside.bin");
    let table = run.join("analysis/state_history.bin");
    std::fs::rename(&table, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &table).unwrap();
    let mut ui = KillOnDrop(
        deepspan()
            .arg("ui")
            .arg(&run)
            .args(["--port", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // A server that took the file would serve until killed.
    let status = wait_exit(
        &mut ui.0,
        Duration::from_secs(60),
        Duration::from_millis(50),
        "deepspan ui served a run whose state history leads outside it",
    );
    assert!(!status.success());
    let mut err = String::new();
    ui.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("outside the run folder"), "{err}");
    // A symlink inside the run is fine.
    std::fs::remove_file(&table).unwrap();
    std::fs::rename(&outside, run.join("analysis/history-real.bin")).unwrap();
    std::os::unix::fs::symlink("history-real.bin", &table).unwrap();
    let s = serve(&run);
    assert!(json(&s, "/api/run")["intervals"].as_u64().unwrap() > 10);
    drop(s);

    // The diagnosis fields (docs/analysis.md, "Diagnosis"), when the
    // analysis has them, are served and filter the list.
    let path = run.join("analysis/requests.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for r in doc["requests"].as_array_mut().unwrap() {
        let is_waiter = r["span_id"] == waiter;
        r["anomalous"] = Value::Bool(is_waiter);
        r["baseline_ns"] = Value::Null;
        r["diagnosis"] = serde_json::json!({
            "cause": if is_waiter { "lock_contention" } else { "timer" },
            "headline": "test",
            "evidence": {"share": 0.99},
            "culprits": [{"kind": "request", "span_id": holder, "ns": 1}],
            // The waiter's root cause through the holder (as a chain of
            // requests would give it); the holder's is its own cause.
            "root_cause": {
                "cause": if is_waiter { "cpu_throttled" } else { "timer" },
                "headline": "test",
                "chain": if is_waiter { Value::from("a → behind b → PREEMPTED (throttled) 90 %") } else { Value::Null },
                "evidence": {"share": 0.9},
                "culprits": [],
            },
        });
    }
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    let s = serve(&run);
    let info = json(&s, "/api/run");
    assert_eq!(
        info["causes"],
        serde_json::json!(["lock_contention", "timer"]),
        "{info}"
    );
    assert_eq!(
        info["root_causes"],
        serde_json::json!(["cpu_throttled", "timer"]),
        "{info}"
    );
    let throttled = json(&s, "/api/requests?root_cause=cpu_throttled");
    assert_eq!(throttled["total"], 1);
    assert_eq!(throttled["requests"][0]["span_id"], waiter);
    let locked = json(&s, "/api/requests?cause=lock_contention");
    assert_eq!(locked["total"], 1);
    assert_eq!(locked["requests"][0]["span_id"], waiter);
    let anomalous = json(&s, "/api/requests?anomalous=true");
    assert_eq!(anomalous["total"], 1);
    assert_eq!(anomalous["requests"][0]["span_id"], waiter);
    assert_eq!(json(&s, "/api/requests?anomalous=false")["total"], 1);
    let w = json(&s, &format!("/api/requests/{waiter}"));
    assert_eq!(w["diagnosis"]["cause"], "lock_contention");
    // Placed by the SDK: no inferred placement to show.
    assert_eq!(w["request"]["sync"], "exact", "{w}");
    assert!(w["placement"].is_null(), "{w}");
}

#[test]
fn ui_refuses_a_run_without_analysis() {
    let dir = tempfile::tempdir().unwrap();
    let out = deepspan()
        .arg("ui")
        .arg(dir.path())
        .args(["--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("deepspan analyze"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_deepspan"))
        .args(["ui", "/nonexistent/run"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/run"));
}
