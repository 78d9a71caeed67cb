//! Placement without the SDK on a real recording: a Python HTTP server with
//! stock OpenTelemetry only (tests/placement/stock_server.py, no
//! deepspan_otel) under `deepspan record`, 80 requests from 4 client
//! threads of another process. `analyze` must place most requests on a
//! thread from the kernel trace alone (`sync: inferred`), and on the right
//! one: the oracle is the server's own log of `threading.get_native_id()`
//! per request, not anything the analysis computes. `--placement sdk`
//! (today's behaviour without inference) places none. The acceptor-and-pool
//! server with more clients than workers also checks queue time: each
//! request's wait for a worker, and the request that worker ran before.
//!
//! Needs python3 with opentelemetry-sdk and the OTLP/HTTP exporter
//! (scripts/setup.sh test).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time};
use serde_json::Value;

const REQUESTS: usize = 80;

fn server_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/placement/stock_server.py")
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

/// A recording of the stock server, with its own log of who served what.
struct Recorded {
    _dir: tempfile::TempDir,
    run: PathBuf,
    /// The server's and the clients' logs (`served.jsonl`,
    /// `clients.jsonl`).
    out: PathBuf,
    /// Span id → the OS thread that served it.
    served: HashMap<String, i64>,
    served_pid: i64,
}

/// Records `stock_server.py` in `mode` (`threads`, `asyncio`, `waitress`
/// or `pool`) under
/// `deepspan record`, REQUESTS requests from 4 client threads.
fn record_stock_server(mode: &str) -> Recorded {
    record_stock_server_with(mode, 4)
}

/// [`record_stock_server`] with `clients` clients.
fn record_stock_server_with(mode: &str, clients: usize) -> Recorded {
    let _one = one_at_a_time();
    let probe = Command::new("python3")
        .args([
            "-c",
            "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http",
        ])
        .output()
        .expect("run python3");
    assert!(
        probe.status.success(),
        "python3 with opentelemetry-sdk and the OTLP/HTTP exporter is needed (scripts/setup.sh test): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let run = dir.path().join("run");
    let mut rec = deepspan();
    crate::common::ahead_of_other_load(&mut rec);
    rec.arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0"])
        .arg("--")
        .arg("python3")
        .arg(server_py())
        .arg(&out)
        .arg(REQUESTS.to_string())
        .arg(clients.to_string())
        .arg(mode)
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
    Recorded {
        _dir: dir,
        run,
        out,
        served,
        served_pid,
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_stock_opentelemetry_server_is_placed_on_its_threads_from_the_kernel_trace() {
    if !kernel_or_skip(
        "a_stock_opentelemetry_server_is_placed_on_its_threads_from_the_kernel_trace",
    ) {
        return;
    }
    let Recorded {
        _dir,
        run,
        served,
        served_pid,
        ..
    } = record_stock_server("threads");

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

#[test]
#[ignore = "system: root and tracefs"]
fn an_asyncio_server_is_placed_on_its_process_never_on_an_invented_thread() {
    if !kernel_or_skip("an_asyncio_server_is_placed_on_its_process_never_on_an_invented_thread") {
        return;
    }
    // One event loop thread serves every request, interleaved (each sleeps
    // 5 ms while the others run): no single thread is a request's own.
    let Recorded {
        _dir,
        run,
        served,
        served_pid,
        ..
    } = record_stock_server("asyncio");
    let loop_threads: std::collections::HashSet<i64> = served.values().copied().collect();
    assert_eq!(loop_threads.len(), 1, "one event loop thread");
    let analyzed = analyze(&run, "auto");
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    let requests = requests_json(&run);
    let placements: Value = serde_json::from_slice(
        &std::fs::read(run.join("analysis/placements.json")).expect("placements.json"),
    )
    .expect("placements.json is JSON");
    let pid_of: HashMap<&str, i64> = placements["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["span_id"].as_str().unwrap(), p["pid"].as_i64().unwrap()))
        .collect();
    let mut on_process = 0;
    for r in &requests {
        let id = r["span_id"].as_str().unwrap();
        match r["sync"].as_str().unwrap() {
            "process" => {
                on_process += 1;
                assert_eq!(pid_of.get(id), Some(&served_pid), "{r}");
                assert!(
                    r["diagnosis"].is_object(),
                    "a process-level path is diagnosed: {r}"
                );
            }
            // A request alone on the loop at its time may have it.
            "inferred" => assert_eq!(r["tid"].as_i64(), served.get(id).copied(), "{r}"),
            other => panic!("request {id} placed by {other}:\n{stderr}"),
        }
    }
    eprintln!("{on_process} of {REQUESTS} requests placed on the server process as a whole");
    assert!(
        on_process * 10 >= REQUESTS * 9,
        "{on_process} of {REQUESTS} on the process:\n{stderr}"
    );
    assert!(
        stderr.contains("on their process as a whole (sync: process)"),
        "{stderr}"
    );
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_waitress_server_is_placed_on_the_worker_its_acceptor_handed_each_request_to() {
    if !kernel_or_skip(
        "a_waitress_server_is_placed_on_the_worker_its_acceptor_handed_each_request_to",
    ) {
        return;
    }
    // waitress (a real WSGI server, from PyPI): its main thread accepts and
    // reads each request, then hands it through its task queue to one of 4
    // worker threads, which runs the application (the stock WSGI
    // instrumentation's span) and sends the answer.
    let Recorded {
        _dir,
        run,
        served,
        served_pid,
        ..
    } = record_stock_server("waitress");
    let workers: std::collections::HashSet<i64> = served.values().copied().collect();
    assert!(
        (2..=4).contains(&workers.len()),
        "the requests were spread over waitress's worker threads: {workers:?}"
    );
    let analyzed = analyze(&run, "auto");
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    let requests = requests_json(&run);
    assert_eq!(requests.len(), REQUESTS);
    let mut right = 0;
    for r in &requests {
        let id = r["span_id"].as_str().unwrap();
        if r["sync"] == "inferred" {
            let tid = r["tid"].as_i64().unwrap();
            // Never on the acceptor, nor on any thread that ran no request.
            assert!(
                workers.contains(&tid),
                "request {id} placed on thread {tid}, which served no request (workers {workers:?}):\n{stderr}"
            );
            right += usize::from(served.get(id) == Some(&tid));
        }
    }
    eprintln!("{right} of {REQUESTS} requests placed on the worker that ran them");
    assert!(
        right * 100 >= REQUESTS * 95,
        "{right} of {REQUESTS} on the worker that ran them:\n{stderr}"
    );

    // `report` shows the hand-off the placement rests on.
    let one = requests
        .iter()
        .find(|r| r["sync"] == "inferred")
        .and_then(|r| r["span_id"].as_str())
        .unwrap();
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
    assert!(text.contains(&format!("of process {served_pid}")), "{text}");
    assert!(text.contains("confidence"), "{text}");
    // Whole sentences, wrapped: the hand-off is the evidence, and the
    // acceptor is passed over.
    assert!(
        text.contains("(hand-off)") || text.contains("queue"),
        "the hand-off is the evidence:\n{text}"
    );
    assert!(text.contains("acceptor,"), "{text}");

    // The UI's request page gets the same: method, thread, confidence and
    // evidence, from placements.json.
    let ui = crate::common::ui::serve(&run);
    let placements = placements_by_span(&run);
    for r in requests.iter().take(5) {
        let id = r["span_id"].as_str().unwrap();
        let detail = crate::common::ui::json(&ui, &format!("/api/requests/{id}"));
        let shown = &detail["placement"];
        assert_eq!(shown["sync"], r["sync"], "{detail}");
        assert_eq!(shown["tid"], r["tid"], "{detail}");
        assert_eq!(shown, &placements[id], "{detail}");
        let confidence = shown["confidence"].as_f64().unwrap();
        assert!(confidence > 0.0 && confidence <= 1.0, "{detail}");
        assert!(
            shown["evidence"]
                .as_array()
                .is_some_and(|e| e.iter().any(|l| l.as_str().unwrap().contains("acceptor,"))),
            "{detail}"
        );
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_thread_pool_fed_by_an_acceptor_is_placed_on_the_worker_that_answered_each_connection() {
    if !kernel_or_skip("a_thread_pool_fed_by_an_acceptor_is_placed_on_the_worker") {
        return;
    }
    // An acceptor thread reads each request and submits it to a
    // ThreadPoolExecutor of 4 workers; the worker's span names the
    // client's port, as the stock HTTP instrumentations do. The lean
    // recording names the socket of every receive and send, so the
    // worker that answered on the span's connection is the request's,
    // whatever the times of the other workers' I/O: never a wrong thread.
    let Recorded {
        _dir, run, served, ..
    } = record_stock_server("pool");
    let workers: std::collections::HashSet<i64> = served.values().copied().collect();
    assert!(
        (2..=4).contains(&workers.len()),
        "the requests were spread over the pool's workers: {workers:?}"
    );
    let analyzed = analyze(&run, "auto");
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    let requests = requests_json(&run);
    assert_eq!(requests.len(), REQUESTS);
    let placements = placements_by_span(&run);
    let mut right = 0;
    for r in &requests {
        let id = r["span_id"].as_str().unwrap();
        if r["sync"] != "inferred" {
            continue;
        }
        assert_eq!(
            r["tid"].as_i64(),
            served.get(id).copied(),
            "request {id} placed on another thread than the one that served it: {}\n{stderr}",
            placements[id]
        );
        right += 1;
        let evidence = placements[id]["evidence"].to_string();
        assert!(
            evidence.contains("socket send on the span's connection"),
            "{evidence}"
        );
    }
    eprintln!("{right} of {REQUESTS} requests placed on the worker that ran them");
    assert!(
        right * 100 >= REQUESTS * 95,
        "{right} of {REQUESTS} on the worker that ran them:\n{stderr}"
    );
}

#[test]
#[ignore = "system: root and tracefs"]
fn requests_waiting_for_a_busy_pool_are_queued_behind_what_its_workers_ran() {
    if !kernel_or_skip("requests_waiting_for_a_busy_pool_are_queued_behind") {
        return;
    }
    // Eight client processes on the acceptor and its 4 workers, each
    // request 20 ms of waiting: a request read while every worker is busy
    // waits in the executor's queue, and the worker that frees up first
    // takes it. Two oracles, neither the analysis': the client's clock when
    // its request was sent (its time to the span's start is the queue),
    // and the server's log of when each worker began and ended each
    // request (a request that arrived while its worker still ran the one
    // before was queued behind that one).
    let Recorded { _dir, run, out, .. } = record_stock_server_with("pool", 8);
    let analyzed = analyze(&run, "auto");
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    let lines = |file: &str| -> Vec<Value> {
        std::fs::read_to_string(out.join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    let ns = |v: &Value, key: &str| v[key].as_u64().unwrap_or_else(|| panic!("{key}: {v}"));
    let sent_of: HashMap<i64, u64> = lines("clients.jsonl")
        .iter()
        .map(|v| (v["i"].as_i64().unwrap(), ns(v, "sent_ns")))
        .collect();
    assert_eq!(sent_of.len(), REQUESTS, "every client logged its requests");
    let served = lines("served.jsonl");
    let by_span: HashMap<&str, &Value> = served
        .iter()
        .map(|v| (v["span_id"].as_str().unwrap(), v))
        .collect();
    // The request each worker ran just before another, by span id.
    let mut previous: HashMap<&str, &Value> = HashMap::new();
    let mut by_worker: HashMap<i64, Vec<&Value>> = HashMap::new();
    for v in &served {
        by_worker
            .entry(v["tid"].as_i64().unwrap())
            .or_default()
            .push(v);
    }
    for runs in by_worker.values_mut() {
        runs.sort_by_key(|v| ns(v, "began_ns"));
        for pair in runs.windows(2) {
            previous.insert(pair[1]["span_id"].as_str().unwrap(), pair[0]);
        }
    }

    let (mut queued, mut measured) = (0, 0);
    let (mut behind, mut named) = (0, 0);
    let mut off = Vec::new();
    for r in &requests_json(&run) {
        let id = r["span_id"].as_str().unwrap();
        let logged = by_span[id];
        let sent = sent_of[&logged["i"].as_i64().unwrap()];
        let queue = &r["queue"];
        let got = queue["ns"].as_u64();
        let expected = ns(r, "start_ns").saturating_sub(sent);
        if expected >= 2_000_000 {
            queued += 1;
            if got.is_some_and(|g| g.abs_diff(expected) <= (expected / 10).max(2_000_000)) {
                measured += 1;
            } else {
                off.push(format!(
                    "{id}: queue {got:?} ns, from the client's send {expected} ns"
                ));
            }
        }
        // Queued behind the worker's previous request: it still ran
        // (by the server's log) 2 ms after this one was sent.
        let Some(before) = previous
            .get(id)
            .filter(|b| ns(b, "ended_ns") > sent + 2_000_000)
        else {
            continue;
        };
        behind += 1;
        let before_id = before["span_id"].as_str().unwrap();
        let names = crate::common::queued_behind(queue);
        if names.contains(&before_id) {
            named += 1;
        } else {
            off.push(format!(
                "{id}: queued behind {names:?}, not the worker's previous {before_id}"
            ));
        }
    }
    eprintln!(
        "pool queue: {measured} of {queued} queued requests as the client's send says; \
         {named} of {behind} name the request their worker ran before; off: {off:#?}"
    );
    assert!(
        queued >= 10 && behind >= 10,
        "only {queued} requests waited, {behind} behind their worker's previous one"
    );
    assert!(
        measured * 10 >= queued * 9 && named * 10 >= behind * 9,
        "{measured} of {queued} as measured, {named} of {behind} named: {off:#?}\n{stderr}"
    );
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_clock_mapping_off_by_50_us_is_corrected_from_the_placed_requests() {
    if !kernel_or_skip("a_clock_mapping_off_by_50_us_is_corrected_from_the_placed_requests") {
        return;
    }
    let Recorded {
        _dir, run, served, ..
    } = record_stock_server("waitress");
    // The recorder's clock samples moved 50 µs: every wall time maps 50 µs
    // late, the kind of error a coarse or slewing sample leaves.
    let manifest_path = run.join("manifest.json");
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).expect("manifest")).unwrap();
    for pair in manifest["clock_samples"]
        .as_array_mut()
        .expect("clock samples")
    {
        pair[1] = (pair[1].as_u64().unwrap() + 50_000).into();
    }
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let analyzed = analyze(&run, "auto");
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    let corrected_us: f64 = stderr
        .split("clock mapping corrected by ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no correction noted:\n{stderr}"));
    assert!(
        (-80.0..=-20.0).contains(&corrected_us),
        "corrected by {corrected_us} µs, not about -50:\n{stderr}"
    );
    let right = requests_json(&run)
        .iter()
        .filter(|r| {
            r["sync"] == "inferred"
                && served.get(r["span_id"].as_str().unwrap()) == r["tid"].as_i64().as_ref()
        })
        .count();
    // Failed once in CI (56 of 80: 24 placed on their process after the
    // correction, 79 of 80 on threads before it) and not again in 11 runs
    // here, 8 of them beside two busy loops; the evidence of a few such
    // requests says why, next time.
    let on_process: Vec<String> = placements_by_span(&run)
        .values()
        .filter(|p| p["sync"] == "process")
        .take(3)
        .map(|p| p.to_string())
        .collect();
    assert!(
        right * 100 >= REQUESTS * 95,
        "{right} of {REQUESTS} on their worker after the correction:\n{stderr}\nplaced on their process:\n{}",
        on_process.join("\n")
    );
}

/// `analysis/placements.json`'s records by span id.
fn placements_by_span(run: &Path) -> HashMap<String, Value> {
    let doc: Value = serde_json::from_slice(
        &std::fs::read(run.join("analysis/placements.json")).expect("placements.json"),
    )
    .expect("placements.json is JSON");
    doc["placements"]
        .as_array()
        .expect("placements")
        .iter()
        .map(|p| (p["span_id"].as_str().unwrap().to_string(), p.clone()))
        .collect()
}
