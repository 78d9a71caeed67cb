//! The Java agent extension (sdk/java) end to end: a small Java HTTP server
//! (sdk/java/testapp/PoolServer.java, no OpenTelemetry code of its own) runs
//! under `deepspan record` with the stock OpenTelemetry Java agent from Maven
//! Central and deepspan's extension. Each request is taken by a handler
//! thread that hands its work to a pool thread and waits for it.
//!
//! The oracle is the server itself, not deepspan: per request it logs the
//! kernel tid of the handler and of the pool thread (/proc/thread-self/status)
//! and System.nanoTime() on each. This test also reads CLOCK_MONOTONIC itself
//! around each request: the server's nanoTime must fall in between, which
//! shows that System.nanoTime is the kernel trace's clock.
//!
//! Needs root, a JDK and Maven (`make java-sdk` builds the extension and
//! fetches the agent; this test runs Maven itself when they are missing).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    check, deepspan, java_agent_jars, kernel_or_skip, monotonic_ns, one_at_a_time, sdk_java,
    wait_exit, KillOnDrop,
};
use deepspan_spans::{read_run_spans, ClockMap, Span, SpanKind};
use serde_json::Value;

/// Requests sent, from CLIENTS threads.
const REQUESTS: usize = 40;
const CLIENTS: usize = 2;

/// GET `path` with an optional traceparent; the response body.
fn get(port: u16, path: &str, traceparent: Option<&str>) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let header = traceparent
        .map(|t| format!("traceparent: {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{header}Connection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {response}");
    Ok(body.to_string())
}

/// What the client saw of one request: its trace id and CLOCK_MONOTONIC
/// before sending and after the response.
struct Sent {
    trace_id: String,
    before_ns: u64,
    after_ns: u64,
}

/// One line of the server's own log.
struct Served {
    handler_tid: u32,
    handler_mono_ns: u64,
    worker_tid: u32,
    worker_mono_ns: u64,
}

#[test]
#[ignore = "system: root, tracefs, JDK and Maven"]
fn the_java_extension_places_a_pooled_request_on_its_threads() {
    if !kernel_or_skip("the_java_extension_places_a_pooled_request_on_its_threads") {
        return;
    }
    // A JVM is heavy load, and java_app builds the same jars: one at a time.
    let _one = one_at_a_time();
    let (extension, agent) = java_agent_jars();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let classes = dir.path().join("classes");
    check(
        "javac PoolServer.java",
        Command::new("javac")
            .arg("-d")
            .arg(&classes)
            .arg(sdk_java().join("testapp/PoolServer.java"))
            .output()
            .expect("run javac (OpenJDK)"),
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = dir.path().join("served.jsonl");
    let run = dir.path().join("run");

    let mut rec = deepspan();
    crate::common::ahead_of_other_load(&mut rec);
    rec.arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0", "--"])
        .arg("java")
        .arg(format!("-javaagent:{}", agent.display()))
        .arg(format!(
            "-Dotel.javaagent.extensions={}",
            extension.display()
        ))
        .arg("-cp")
        .arg(&classes)
        .arg("PoolServer")
        .arg(port.to_string())
        .arg(&log)
        // `record` gives the endpoint and protocol (OTLP/HTTP protobuf).
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env("OTEL_SERVICE_NAME", "java-pool")
        .env("OTEL_METRICS_EXPORTER", "none")
        .env("OTEL_LOGS_EXPORTER", "none")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut recorder = KillOnDrop(rec.spawn().expect("run deepspan record"));

    // The JVM with the agent takes a few seconds to listen.
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            recorder.0.try_wait().unwrap().is_none(),
            "deepspan record ended before the server listened"
        );
        assert!(Instant::now() < deadline, "the Java server never listened");
        std::thread::sleep(Duration::from_millis(200));
    }

    let sent: Vec<Sent> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                s.spawn(move || {
                    (c..REQUESTS)
                        .step_by(CLIENTS)
                        .map(|i| {
                            let trace_id = format!("{:032x}", 0xd5e0_0000u64 + i as u64);
                            let traceparent = format!("00-{trace_id}-{:016x}-01", 0x77 + i);
                            let before_ns = monotonic_ns();
                            get(port, "/work", Some(&traceparent)).expect("GET /work");
                            let after_ns = monotonic_ns();
                            Sent {
                                trace_id,
                                before_ns,
                                after_ns,
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    get(port, "/quit", None).expect("GET /quit");
    let status = wait_exit(
        &mut recorder.0,
        Duration::from_secs(120),
        Duration::from_millis(200),
        "deepspan record did not end",
    );
    let mut stderr = String::new();
    recorder
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "deepspan record: {status}\n{stderr}");

    // The server's own account, by trace id.
    let served: HashMap<String, Served> = std::fs::read_to_string(&log)
        .expect("the server's log")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let traceparent = v["traceparent"].as_str().unwrap();
            let num = |k: &str| v[k].as_u64().unwrap();
            (
                traceparent.split('-').nth(1).unwrap().to_string(),
                Served {
                    handler_tid: num("handler_tid") as u32,
                    handler_mono_ns: num("handler_mono_ns"),
                    worker_tid: num("worker_tid") as u32,
                    worker_mono_ns: num("worker_mono_ns"),
                },
            )
        })
        .collect();
    assert_eq!(
        served.len(),
        REQUESTS,
        "every request was served and logged"
    );

    // System.nanoTime is CLOCK_MONOTONIC: the server's readings lie between
    // this process's CLOCK_MONOTONIC readings around each request.
    for s in &sent {
        let one = &served[&s.trace_id];
        for mono in [one.handler_mono_ns, one.worker_mono_ns] {
            assert!(
                s.before_ns <= mono && mono <= s.after_ns,
                "{}: nanoTime {mono} outside CLOCK_MONOTONIC [{}, {}]",
                s.trace_id,
                s.before_ns,
                s.after_ns
            );
        }
    }

    // The spans as exported by the agent, with the extension's fields.
    let spans: HashMap<String, Span> = read_run_spans(&run)
        .expect("the run's spans")
        .map(|s| s.expect("a span"))
        .filter(|s| s.kind == SpanKind::Server && s.name == "GET /work")
        .map(|s| (format!("{:032x}", s.trace_id.0), s))
        .collect();
    let clock = ClockMap::from_manifest(&run).expect("the run's clock samples");
    // The span's wall times are the SDK's (read just before the extension
    // reads nanoTime; later wall times are anchored on nanoTime) and the
    // clock mapping is µs-precise: its mono times are the same instants, a
    // few µs later. The bounds are loose (not a timing test: the first
    // request loads classes in between, about 10 ms here): never earlier
    // than the mapping's precision plus 1 ms of clock slew, at most 50 ms
    // later. An unrelated clock is off by far more.
    let before = clock.precision_ns() as i64 + 1_000_000;
    let after = 50_000_000 + clock.precision_ns() as i64;
    let mut worst_offset_ns = 0i64;
    for (trace_id, one) in &served {
        let span = spans
            .get(trace_id)
            .unwrap_or_else(|| panic!("no server span for trace {trace_id}"));
        let sync = &span.sync;
        assert!(sync.problems.is_empty(), "{trace_id}: {:?}", sync.problems);
        assert_eq!(
            sync.tid,
            Some(one.handler_tid),
            "{trace_id}: deepspan.tid is the handler's"
        );
        let (start, end) = (sync.mono_start_ns.unwrap(), sync.mono_end_ns.unwrap());
        assert!(
            start <= one.handler_mono_ns
                && one.handler_mono_ns <= one.worker_mono_ns
                && one.worker_mono_ns <= end,
            "{trace_id}: the handler's and the worker's nanoTime lie inside the span's mono times"
        );
        for (mono, wall) in [(start, span.start_ns), (end, span.end_ns)] {
            let offset = mono as i64 - clock.wall_to_mono(wall) as i64;
            worst_offset_ns = worst_offset_ns.max(offset.abs());
            assert!(
                -before <= offset && offset <= after,
                "{trace_id}: mono {mono} is {offset} ns from its wall time mapped"
            );
        }

        // Activations: on the handler, then on the pool thread and back.
        let acts: Vec<(bool, u32, u64)> = sync
            .activations
            .iter()
            .map(|a| (a.on, a.tid, a.mono_ns))
            .collect();
        let tids: std::collections::BTreeSet<u32> = acts.iter().map(|a| a.1).collect();
        assert_eq!(
            tids,
            [one.handler_tid, one.worker_tid].into(),
            "{trace_id}: activations on both threads: {acts:?}"
        );
        assert_eq!(
            acts.first().map(|a| (a.0, a.1)),
            Some((true, one.handler_tid)),
            "{acts:?}"
        );
        let worker_on = acts
            .iter()
            .find(|a| a.0 && a.1 == one.worker_tid)
            .expect("on at the worker")
            .2;
        let worker_off = acts
            .iter()
            .find(|a| !a.0 && a.1 == one.worker_tid)
            .expect("off at the worker")
            .2;
        assert!(
            worker_on <= one.worker_mono_ns && one.worker_mono_ns <= worker_off,
            "{trace_id}: the pool thread ran the work while the request was active on it: {acts:?}"
        );
    }
    eprintln!("mono times against wall times mapped: at most {worst_offset_ns} ns apart");

    // analyze places them exactly (the SDK's fields), with a kernel path.
    let analyzed = check(
        "deepspan analyze",
        deepspan()
            .arg("analyze")
            .arg(&run)
            .output()
            .expect("run deepspan analyze"),
    );
    let doc: Value = serde_json::from_slice(
        &std::fs::read(run.join("analysis/requests.json")).expect("requests.json"),
    )
    .expect("requests.json is JSON");
    let requests: HashMap<&str, &Value> = doc["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["operation"] == "GET /work")
        .map(|r| (r["trace_id"].as_str().unwrap(), r))
        .collect();
    assert_eq!(
        requests.len(),
        REQUESTS,
        "{}",
        String::from_utf8_lossy(&analyzed.stderr)
    );
    let mut through_worker = 0;
    for (trace_id, one) in &served {
        let r = requests[trace_id.as_str()];
        assert_eq!(r["sync"], "exact", "{r}");
        assert_eq!(r["tid"], one.handler_tid, "{r}");
        let causes = r["causes"].as_array().expect("causes");
        assert!(!causes.is_empty(), "{trace_id}: a kernel path: {r}");
        if causes.iter().any(|c| c["tid"] == one.worker_tid) {
            through_worker += 1;
        }
    }
    eprintln!("{through_worker} of {REQUESTS} kernel paths go through the pool thread");
    // The handler waits for the pool thread: the path follows the hand-off.
    // Not all: a lost wake-up event may hide one.
    assert!(
        through_worker * 2 >= REQUESTS,
        "{through_worker} of {REQUESTS} kernel paths through the pool thread"
    );
}
