//! A real Java web application that no one here wrote — WireMock 3 (a Jetty
//! 11 server, org.wiremock:wiremock from Maven Central) — under `deepspan
//! record` with the stock OpenTelemetry Java agent, with two faults:
//!
//! - a lock: a WireMock extension compiled here
//!   (sdk/java/testapp/wiremock-fault, loaded through WireMock's own
//!   extension option, WireMock unchanged) makes a "holder" request keep a
//!   `synchronized` monitor until the other requests of the application
//!   wait on it, then for 600 ms more of CPU;
//! - a CPU quota: this test moves the JVM into a CPU cgroup (v1) of 10 ms
//!   per 100 ms while each request needs 30 ms of CPU;
//! - a full pool: Jetty's pool serves two requests at a time, each asleep
//!   for 20 ms, while six clients call: a request waits in Jetty's queue
//!   until a worker is free, before its span starts.
//!
//! Each fault runs twice: with deepspan's agent extension (SDK placement)
//! and with the plain agent alone, analysed with `--placement inferred`.
//! The oracle is the set-up, not the analysis: the extension logs each
//! request's role and kernel thread id (a sleeper's also its start and
//! end), the clients log when they sent, and the test set the quota.
//!
//! Apart from the kernel: WireMock as a hop of the in-band critical path
//! (DCPT), called by the demo shop's Python services, through the
//! extension's Jetty hook.
//!
//! Needs root, a JDK and Maven (`make java-sdk` builds the extension,
//! fetches the agent and WireMock; this test runs Maven when they are
//! missing).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{
    check, deepspan, java_agent_jars, kernel_or_skip, maven_package, monotonic_ns, one_at_a_time,
    poll, queued_behind, repo, sdk_java, wait_exit, CpuQuota, KillOnDrop,
};
use serde_json::Value;

/// Lock case: rounds of one holder and WAITERS requests that need its lock.
const ROUNDS: usize = 2;
const WAITERS: usize = 4;
/// CPU the holder spends inside the monitor, against a moment for a waiter.
const HOLD_CPU_MS: u64 = 600;
/// Quota case: requests, each needing WORK_CPU_MS of CPU, from CLIENTS.
const CPU_REQUESTS: usize = 12;
const CLIENTS: usize = 2;
const WORK_CPU_MS: u64 = 30;
/// 10 ms of CPU per 100 ms: a request alone needs three periods.
const QUOTA_US: u64 = 10_000;
const PERIOD_US: u64 = 100_000;
/// Pool case: requests, each asleep SLEEP_MS on its worker, from
/// POOL_CLIENTS.
const POOL_REQUESTS: usize = 36;
const POOL_CLIENTS: usize = 6;
const SLEEP_MS: u64 = 20;
/// WireMock's `--container-threads` for two workers: Jetty leases the rest
/// of its pool to its acceptors and selectors (and keeps one in reserve),
/// on the two cores of these machines.
const POOL_THREADS: usize = 7;

/// The jars: deepspan's extension, the stock agent, and WireMock's class
/// path with the fault extension.
struct Jars {
    extension: PathBuf,
    agent: PathBuf,
    classpath: String,
}

fn jars() -> Jars {
    let (extension, agent) = java_agent_jars();
    let app = sdk_java().join("testapp/wiremock-fault");
    let fault = app.join("target/wiremock-fault.jar");
    let lib = app.join("target/lib");
    if !fault.is_file() || !lib.join("wiremock-3.13.2.jar").is_file() {
        maven_package(&app);
    }
    Jars {
        extension,
        agent,
        classpath: format!("{}:{}/*", fault.display(), lib.display()),
    }
}

/// GET `path` with a traceparent made of `trace_id`; when it was sent: the
/// CLOCK_MONOTONIC readings just before and after the request's write (a
/// busy machine may run other threads between the write and either).
fn get(port: u16, path: &str, trace_id: u128) -> (u64, u64) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to WireMock");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let before = monotonic_ns();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         traceparent: 00-{trace_id:032x}-{:016x}-01\r\nConnection: close\r\n\r\n",
        trace_id as u64 | 1
    )
    .unwrap();
    let sent = (before, monotonic_ns());
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "GET {path}: {response}"
    );
    sent
}

/// WireMock's own admin call that stops it (and so the recording).
fn shutdown(port: u16) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to WireMock");
    write!(
        stream,
        "POST /__admin/shutdown HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
}

/// One line of the fault extension's log: the oracle.
#[derive(Clone, Debug)]
struct Served {
    role: String,
    tid: i64,
    pid: i64,
    /// A sleeper's start and end (System.nanoTime); 0 for the others.
    began_ns: u64,
    ended_ns: u64,
}

/// The fault log by trace id.
fn served(log: &Path) -> HashMap<String, Served> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let traceparent = v["traceparent"].as_str().unwrap();
            (
                traceparent.split('-').nth(1).unwrap().to_string(),
                Served {
                    role: v["role"].as_str().unwrap().to_string(),
                    tid: v["tid"].as_i64().unwrap(),
                    pid: v["pid"].as_i64().unwrap(),
                    began_ns: v["began_ns"].as_u64().unwrap_or(0),
                    ended_ns: v["ended_ns"].as_u64().unwrap_or(0),
                },
            )
        })
        .collect()
}

fn wait_for_trace(log: &Path, trace_id: u128) -> Served {
    let key = format!("{trace_id:032x}");
    poll(Duration::from_secs(60), Duration::from_millis(10), || {
        served(log).remove(&key)
    })
    .unwrap_or_else(|| panic!("{key} never reached the fault extension"))
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    Lock,
    Quota,
    Pool,
}

/// A recorded and analysed run of WireMock under one fault.
struct Analysed {
    /// requests.json's requests by trace id.
    requests: HashMap<String, Value>,
    served: HashMap<String, Served>,
    /// The trace ids sent under the fault (the warm-up's are not).
    under_fault: Vec<String>,
    /// Requests sent alone to the idle server (the pool case).
    alone: Vec<String>,
    /// When each request under the fault was sent (between two readings of
    /// the client's clock), by trace id.
    sent: HashMap<String, (u64, u64)>,
    throttled_periods: u64,
    analyze_stderr: String,
}

fn run(fault: Fault, with_extension: bool) -> Analysed {
    let jars = jars();
    let temp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    // DEEPSPAN_KEEP_JAVA_TEST=1 keeps the runs for a look afterwards.
    let kept;
    let dir = if std::env::var_os("DEEPSPAN_KEEP_JAVA_TEST").is_some() {
        kept = temp.keep();
        eprintln!("{fault:?} run kept in {}", kept.display());
        kept.as_path()
    } else {
        temp.path()
    };
    // WireMock answers every GET from one stub in its root folder.
    let root = dir.join("wiremock");
    std::fs::create_dir_all(root.join("mappings")).unwrap();
    std::fs::write(
        root.join("mappings/any.json"),
        r#"{"request":{"method":"GET","urlPattern":"/.*"},"response":{"status":200,"body":"ok\n"}}"#,
    )
    .unwrap();
    let log = dir.join("fault.jsonl");
    let run = dir.join("run");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();

    let mut rec = deepspan();
    crate::common::ahead_of_other_load(&mut rec);
    rec.arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0", "--"])
        .arg("java")
        .arg(format!("-javaagent:{}", jars.agent.display()));
    if with_extension {
        rec.arg(format!(
            "-Dotel.javaagent.extensions={}",
            jars.extension.display()
        ));
    }
    rec.arg(format!("-Ddeepspan.fault.log={}", log.display()))
        .arg(format!("-Ddeepspan.fault.hold_cpu_ms={HOLD_CPU_MS}"))
        .arg(format!("-Ddeepspan.fault.work_cpu_ms={WORK_CPU_MS}"))
        .arg(format!("-Ddeepspan.fault.sleep_ms={SLEEP_MS}"))
        .arg("-cp")
        .arg(&jars.classpath)
        .arg("wiremock.Run")
        .args(["--port", &port.to_string()])
        .arg("--root-dir")
        .arg(&root)
        .args(["--extensions", "deepspan.fault.LockFault"])
        .args(["--disable-banner", "--no-request-journal"]);
    if fault == Fault::Pool {
        rec.args(["--container-threads", &POOL_THREADS.to_string()]);
    }
    rec.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env("OTEL_SERVICE_NAME", "wiremock")
        .env("OTEL_METRICS_EXPORTER", "none")
        .env("OTEL_LOGS_EXPORTER", "none")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("record.log")).unwrap());
    let mut recorder = KillOnDrop(rec.spawn().expect("run deepspan record"));

    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            recorder.0.try_wait().unwrap().is_none(),
            "deepspan record ended before WireMock listened"
        );
        assert!(Instant::now() < deadline, "WireMock never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Warm up (class loading, the agent's first spans), then the fault.
    let mut trace = 0x7a_0000_0000u128 + ((fault as u128) << 24) + ((with_extension as u128) << 20);
    let mut next = || {
        trace += 1;
        trace
    };
    for _ in 0..3 {
        get(port, "/cpu/warm", next());
    }
    let warm = next();
    get(port, "/hold/warm", warm);
    let jvm_pid = wait_for_trace(&log, warm).pid;

    let mut throttled_periods = 0;
    let mut under_fault = Vec::new();
    let mut alone = Vec::new();
    let mut sent = HashMap::new();
    match fault {
        Fault::Lock => {
            for round in 0..ROUNDS {
                let holder = next();
                let waiters: Vec<u128> = (0..WAITERS).map(|_| next()).collect();
                under_fault.push(holder);
                under_fault.extend(&waiters);
                std::thread::scope(|s| {
                    s.spawn(|| get(port, &format!("/hold/{round}/{WAITERS}"), holder));
                    // The waiters go once the holder has the monitor.
                    wait_for_trace(&log, holder);
                    for (i, &w) in waiters.iter().enumerate() {
                        s.spawn(move || get(port, &format!("/api/{round}/{i}"), w));
                    }
                });
            }
        }
        Fault::Quota => {
            let group = CpuQuota::create("javaapp", QUOTA_US, PERIOD_US);
            group.confine(jvm_pid);
            let ids: Vec<u128> = (0..CPU_REQUESTS).map(|_| next()).collect();
            under_fault.extend(&ids);
            std::thread::scope(|s| {
                for c in 0..CLIENTS {
                    let ids = &ids;
                    s.spawn(move || {
                        for (i, &id) in ids.iter().enumerate().skip(c).step_by(CLIENTS) {
                            get(port, &format!("/cpu/{i}"), id);
                        }
                    });
                }
            });
            // The quota is lifted before WireMock shuts down: at a tenth of
            // a CPU the JVM's exit (the agent flushing its spans) takes
            // seconds that show nothing the test reads.
            throttled_periods = group.throttled_periods();
            drop(group);
        }
        Fault::Pool => {
            // Once the warm-up's tail is over, one request on its own.
            std::thread::sleep(Duration::from_millis(500));
            let id = next();
            get(port, "/cpu/alone", id);
            alone.push(format!("{id:032x}"));
            let ids: Vec<u128> = (0..POOL_REQUESTS).map(|_| next()).collect();
            under_fault.extend(&ids);
            let times = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for c in 0..POOL_CLIENTS {
                    let (ids, times) = (&ids, &times);
                    s.spawn(move || {
                        for (i, &id) in ids.iter().enumerate().skip(c).step_by(POOL_CLIENTS) {
                            let sent = get(port, &format!("/sleep/{i}"), id);
                            times.lock().unwrap().push((format!("{id:032x}"), sent));
                        }
                    });
                }
            });
            sent = times.into_inner().unwrap().into_iter().collect();
        }
    }
    shutdown(port);
    let status = wait_exit(
        &mut recorder.0,
        Duration::from_secs(120),
        Duration::from_millis(100),
        "deepspan record did not end",
    );
    let record_log = std::fs::read_to_string(dir.join("record.log")).unwrap_or_default();
    assert!(status.success(), "deepspan record: {status}\n{record_log}");

    let mut analyze = deepspan();
    analyze.arg("analyze").arg(&run);
    if !with_extension {
        analyze.args(["--placement", "inferred"]);
    }
    let analyzed = check(
        "deepspan analyze",
        analyze.output().expect("run deepspan analyze"),
    );
    let doc: Value = serde_json::from_slice(
        &std::fs::read(run.join("analysis/requests.json")).expect("requests.json"),
    )
    .expect("requests.json is JSON");
    let requests = doc["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| (r["trace_id"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    let served = served(&log);
    assert!(
        served.values().all(|s| s.pid == jvm_pid),
        "one JVM served all"
    );
    Analysed {
        requests,
        served,
        under_fault: under_fault.iter().map(|t| format!("{t:032x}")).collect(),
        alone,
        sent,
        throttled_periods,
        analyze_stderr: String::from_utf8_lossy(&analyzed.stderr).into_owned(),
    }
}

fn count<'a>(values: impl Iterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for v in values {
        *counts.entry(v.to_string()).or_default() += 1;
    }
    counts
}

/// The requests of `role` sent under the fault with their analysis, each
/// one present.
fn of_role<'a>(a: &'a Analysed, role: &str) -> Vec<(&'a Served, &'a Value)> {
    let mut found: Vec<(&Served, &Value)> =
        a.served
            .iter()
            .filter(|(trace, s)| s.role == role && a.under_fault.contains(trace))
            .map(|(trace, s)| {
                let r = a.requests.get(trace).unwrap_or_else(|| {
                    panic!("no request for trace {trace}:\n{}", a.analyze_stderr)
                });
                (s, r)
            })
            .collect();
    found.sort_by_key(|(s, _)| s.tid);
    found
}

fn summary(mode: &str, requests: &[(&Served, &Value)]) -> String {
    format!(
        "{mode}: {} requests, placed {:?}, causes {:?}",
        requests.len(),
        count(
            requests
                .iter()
                .map(|(_, r)| r["sync"].as_str().unwrap_or("-"))
        ),
        count(
            requests
                .iter()
                .map(|(_, r)| r["diagnosis"]["cause"].as_str().unwrap_or("-"))
        ),
    )
}

/// Every waiter `lock_contention` with a holder's thread among the
/// culprits, but for at most one per round: HotSpot's monitor makes one
/// waiter "responsible", parked with timeouts of 1, 8, 64, 512 ms… so that
/// a lost wake-up cannot strand it; when the holder's exit wakes another
/// waiter instead, that one gets the monitor after its own timeout with no
/// wake-up from the holder in the kernel trace. The trace cannot tell that
/// wait from a sleep: it must then be `timer`, in a futex, on its own
/// thread, never anything else.
fn check_lock(a: &Analysed, mode: &str, placement: &str) {
    let holders: Vec<&Served> = of_role(a, "holder").into_iter().map(|(s, _)| s).collect();
    assert_eq!(holders.len(), ROUNDS, "every holder served");
    let waiters = of_role(a, "waiter");
    assert_eq!(waiters.len(), ROUNDS * WAITERS, "every waiter served");
    eprintln!("lock, {}", summary(mode, &waiters));
    let mut timed_out = 0;
    let waiter_threads: Vec<i64> = waiters.iter().map(|(s, _)| s.tid).collect();
    for (s, r) in &waiters {
        // Jetty makes pool threads while the waiters block, and a new one
        // may serve a waiter before any event of the trace shows the name
        // it gave itself (thread.name): placement takes that name too, so
        // every waiter is on a thread (2 on their process in one CI run,
        // 1 in 8 loaded runs, before it did).
        assert_eq!(r["sync"], placement, "{r}\n{}", a.analyze_stderr);
        if placement == "exact" {
            assert_eq!(r["tid"].as_i64(), Some(s.tid), "placed on its thread: {r}");
        } else {
            // Waiters parked on one monitor and released one after another
            // look alike from the kernel: inference may swap two of them
            // (seen once in a loaded run), never put one off the threads
            // that served waiters.
            assert!(
                r["tid"]
                    .as_i64()
                    .is_some_and(|t| waiter_threads.contains(&t)),
                "placed on a thread that served a waiter: {r}"
            );
        }
        let d = &r["diagnosis"];
        let culprits = d["culprits"].as_array().expect("culprits");
        if d["cause"] == "timer" {
            timed_out += 1;
            assert!(
                culprits[0]["tid"].as_i64() == Some(s.tid) && culprits[0]["name"] == "futex",
                "a responsible waiter's own timed futex wait: {d}"
            );
            continue;
        }
        assert_eq!(d["cause"], "lock_contention", "{r}\n{}", a.analyze_stderr);
        // Placed by inference, a waiter may be on the thread of another
        // waiter (swapped, above), which waited behind the waiter released
        // before it: its culprit is then that waiter's thread, the convoy's
        // previous owner of the monitor.
        let owners: Vec<i64> = holders
            .iter()
            .map(|h| h.tid)
            .chain(if placement == "exact" {
                vec![]
            } else {
                waiter_threads.clone()
            })
            .collect();
        assert!(
            culprits
                .iter()
                .any(|c| c["kind"] == "thread"
                    && c["tid"].as_i64().is_some_and(|t| owners.contains(&t))),
            "a holder's thread among the culprits (or, placed by inference, a waiter's): {d}"
        );
    }
    assert!(
        timed_out <= ROUNDS,
        "{timed_out} waiters got the monitor by a timeout, more than one a round"
    );
}

fn check_quota(a: &Analysed, mode: &str, placement: &str) {
    assert!(a.throttled_periods > 0, "the quota never throttled the JVM");
    let under_quota = of_role(a, "cpu");
    assert_eq!(under_quota.len(), CPU_REQUESTS, "every request served");
    let jvm = under_quota[0].0.pid;
    eprintln!(
        "quota ({} periods throttled), {}",
        a.throttled_periods,
        summary(mode, &under_quota)
    );
    for (s, r) in &under_quota {
        assert_eq!(r["sync"], placement, "{r}\n{}", a.analyze_stderr);
        assert_eq!(r["tid"].as_i64(), Some(s.tid), "placed on its thread: {r}");
        let d = &r["diagnosis"];
        assert_eq!(d["cause"], "cpu_throttled", "{r}\n{}", a.analyze_stderr);
        let culprits = d["culprits"].as_array().expect("culprits");
        assert!(
            culprits
                .iter()
                .any(|c| c["kind"] == "process" && c["pid"].as_i64() == Some(jvm)),
            "the JVM {jvm} among the culprits: {d}"
        );
    }
}

/// Requests that waited for a worker: each one's queue time matches the
/// client's clock (from its send to the span's start, within 10 % or 2
/// ms of the readings around the send), and names the request its worker
/// ran before it when that one still ran 2 ms after the send (the server's
/// log of each worker's requests).
fn check_pool(a: &Analysed, mode: &str, placement: &str) {
    let sleepers = of_role(a, "sleep");
    assert_eq!(sleepers.len(), POOL_REQUESTS, "every request served");
    // The set-up's own check: how many requests Jetty ran at once.
    let most_at_once = sleepers
        .iter()
        .map(|(s, _)| {
            sleepers
                .iter()
                .filter(|(o, _)| o.began_ns <= s.began_ns && s.began_ns < o.ended_ns)
                .count()
        })
        .max()
        .unwrap_or(0);
    let trace_of = |r: &Value| r["trace_id"].as_str().unwrap().to_string();
    // Each worker's requests in the order it ran them: (began, ended, trace).
    let mut by_worker: HashMap<i64, Vec<(u64, u64, String)>> = HashMap::new();
    for (s, r) in &sleepers {
        by_worker
            .entry(s.tid)
            .or_default()
            .push((s.began_ns, s.ended_ns, trace_of(r)));
    }
    for runs in by_worker.values_mut() {
        runs.sort();
    }

    let (mut queued, mut measured) = (0, 0);
    let (mut behind, mut named) = (0, 0);
    let mut off = Vec::new();
    for (s, r) in &sleepers {
        assert_eq!(r["sync"], placement, "{r}\n{}", a.analyze_stderr);
        let trace = trace_of(r);
        let (before_send, sent) = a.sent[&trace];
        let queue = &r["queue"];
        let got = queue["ns"].as_u64();
        let start = r["start_ns"].as_u64().unwrap();
        let (least, most) = (
            start.saturating_sub(sent),
            start.saturating_sub(before_send),
        );
        if least >= 2_000_000 {
            queued += 1;
            let margin = (least / 10).max(2_000_000);
            if got.is_some_and(|g| least.saturating_sub(margin) <= g && g <= most + margin) {
                measured += 1;
            } else {
                off.push(format!(
                    "{trace}: queue {got:?} ns, from the client's send {least}..{most} ns"
                ));
            }
        }
        let runs = &by_worker[&s.tid];
        let at = runs.iter().position(|(_, _, t)| *t == trace).unwrap();
        let Some((_, _, before)) = at
            .checked_sub(1)
            .map(|b| &runs[b])
            .filter(|(_, ended, _)| *ended > sent + 2_000_000)
        else {
            continue;
        };
        behind += 1;
        let before_span = a.requests[before]["span_id"].as_str().unwrap();
        let names = queued_behind(queue);
        if names.contains(&before_span) {
            named += 1;
        } else {
            off.push(format!(
                "{trace}: queued behind {names:?}, not its worker's previous {before_span}"
            ));
        }
    }
    // A request sent alone to an idle server has nothing to queue behind.
    // (The warm-up's requests, one right after another, may: a worker
    // still finishing the previous one's reply when the next arrives.)
    assert_eq!(a.alone.len(), 1, "the request sent alone");
    for trace in &a.alone {
        let r = &a.requests[trace];
        let behind = r["queue"]["cause_groups"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|g| {
                g["blocked_by_requests"]
                    .as_array()
                    .is_some_and(|b| !b.is_empty())
            });
        assert!(!behind, "a request alone queued behind others: {r}");
    }
    eprintln!(
        "pool, {mode}: Jetty ran at most {most_at_once} at once; {measured} of {queued} queued \
         requests as the client's send says; {named} of {behind} name the request their worker \
         ran before; off: {off:#?}"
    );
    assert!(
        queued >= 10 && behind >= 10,
        "only {queued} requests waited, {behind} behind their worker's previous one"
    );
    assert!(
        measured * 10 >= queued * 9 && named * 10 >= behind * 9,
        "{measured} of {queued} as measured, {named} of {behind} named: {off:#?}\n{}",
        a.analyze_stderr
    );
}

/// Runs `fault` with the extension (SDK placement) and with the agent
/// alone (inferred placement), one at a time, and checks each.
fn with_and_without_the_extension(fault: Fault, check: fn(&Analysed, &str, &str)) {
    let _one = one_at_a_time();
    check(&run(fault, true), "with the extension", "exact");
    check(&run(fault, false), "agent alone, inferred", "inferred");
}

#[test]
#[ignore = "system: root, tracefs, JDK and Maven"]
fn wiremock_waiting_on_a_synchronized_lock_is_lock_contention_with_and_without_the_extension() {
    if !kernel_or_skip("wiremock_waiting_on_a_synchronized_lock_is_lock_contention") {
        return;
    }
    with_and_without_the_extension(Fault::Lock, check_lock);
}

#[test]
#[ignore = "system: root, tracefs, cgroups, JDK and Maven"]
fn wiremock_under_a_cpu_quota_is_cpu_throttled_with_and_without_the_extension() {
    if !kernel_or_skip("wiremock_under_a_cpu_quota_is_cpu_throttled") {
        return;
    }
    with_and_without_the_extension(Fault::Quota, check_quota);
}

#[test]
#[ignore = "system: root, tracefs, JDK and Maven"]
fn wiremock_with_two_workers_queues_requests_behind_the_ones_they_ran() {
    if !kernel_or_skip("wiremock_with_two_workers_queues_requests") {
        return;
    }
    with_and_without_the_extension(Fault::Pool, check_pool);
}

/// A free loopback port.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// GET `path` from `port`, asking for the in-band path when `ask`: the
/// status line and the `deepspan-dcpt-path` header, if any.
fn get_dcpt(port: u16, path: &str, ask: bool) -> (String, Option<String>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let ask = if ask { "deepspan-dcpt: 1\r\n" } else { "" };
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{ask}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let status = head.lines().next().unwrap_or_default().to_string();
    let path = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("deepspan-dcpt-path")
            .then(|| value.trim().to_string())
    });
    (status, path)
}

/// A demo shop service (`python3 -m shop.service NAME ARGS`) and its port,
/// once it prints `READY <port>`.
fn shop_service(name: &str, args: &[&str], logs: &Path) -> (KillOnDrop, u16) {
    let repo = repo();
    let mut child = Command::new("python3")
        .args(["-m", "shop.service", name])
        .args(args)
        .env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                repo.join("demo").display(),
                repo.join("sdk/python").display()
            ),
        )
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(logs.join(format!("{name}.log"))).unwrap())
        .spawn()
        .expect("run python3 -m shop.service");
    let stdout = child.stdout.take().unwrap();
    let child = KillOnDrop(child);
    let port = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("READY ").and_then(|p| p.trim().parse().ok()))
        .unwrap_or_else(|| {
            panic!(
                "{name} never got ready: {}",
                std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default()
            )
        });
    (child, port)
}

#[test]
#[ignore = "system: JDK, Maven and the demo's Python packages"]
fn wiremock_in_a_chain_of_demo_services_is_named_the_slow_hop_of_the_in_band_path() {
    // The demo's front calls inventory, pricing and media in turn. Here
    // inventory and pricing are WireMock stubs (pricing's answer 300 ms
    // late), media the demo's own service. The path front gets back names
    // WireMock's hops by their own service name (the extension's Jetty
    // hook), not as the address front called, and pricing's as the hop
    // that took the time.
    let jars = jars();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let root = dir.path().join("wiremock");
    std::fs::create_dir_all(root.join("mappings")).unwrap();
    std::fs::write(
        root.join("mappings/price.json"),
        r#"{"request":{"method":"GET","urlPath":"/price"},"response":{"status":200,"jsonBody":{"price":12.5},"fixedDelayMilliseconds":300}}"#,
    )
    .unwrap();
    std::fs::write(
        root.join("mappings/stock.json"),
        r#"{"request":{"method":"GET","urlPath":"/stock"},"response":{"status":200,"jsonBody":{"stock":4}}}"#,
    )
    .unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("img-0.bin"), vec![7u8; 64 << 10]).unwrap();

    let port = free_port();
    let wiremock = KillOnDrop(
        Command::new("java")
            .arg(format!("-javaagent:{}", jars.agent.display()))
            .arg(format!(
                "-Dotel.javaagent.extensions={}",
                jars.extension.display()
            ))
            .arg("-cp")
            .arg(&jars.classpath)
            .arg("wiremock.Run")
            .args(["--port", &port.to_string()])
            .arg("--root-dir")
            .arg(&root)
            .args(["--disable-banner", "--no-request-journal"])
            .env("OTEL_SERVICE_NAME", "wiremock")
            .env("OTEL_TRACES_EXPORTER", "none")
            .env("OTEL_METRICS_EXPORTER", "none")
            .env("OTEL_LOGS_EXPORTER", "none")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("wiremock.log")).unwrap())
            .spawn()
            .expect("run WireMock"),
    );
    let mut wiremock = wiremock;
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            wiremock.0.try_wait().unwrap().is_none(),
            "WireMock ended: {}",
            std::fs::read_to_string(dir.path().join("wiremock.log")).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "WireMock never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_media, media_port) =
        shop_service("media", &["--images", images.to_str().unwrap()], dir.path());
    let stub = format!("http://127.0.0.1:{port}");
    let media = format!("http://127.0.0.1:{media_port}");
    let (_front, front_port) = shop_service(
        "front",
        &["--inventory", &stub, "--pricing", &stub, "--media", &media],
        dir.path(),
    );

    // Asked nothing, WireMock adds nothing.
    let (status, path) = get_dcpt(port, "/stock?id=1", false);
    assert!(status.contains(" 200"), "{status}");
    assert_eq!(path, None, "a path nobody asked for");

    for id in 0..5 {
        let (status, value) = get_dcpt(front_port, &format!("/product?id={id}"), true);
        assert!(status.contains(" 200"), "front: {status}");
        let value = value.expect("front answered with its path");
        eprintln!("in-band path of /product?id={id}: {value}");
        let decoded = check(
            "deepspan dcpt decode",
            deepspan()
                .args(["dcpt", "decode", "--format", "json", &value])
                .output()
                .unwrap(),
        );
        let doc: Value = serde_json::from_slice(&decoded.stdout).unwrap();
        let hops = doc["hops"].as_array().expect("hops");
        let named = |service: &str, operation: &str| {
            hops.iter()
                .find(|h| h["service"] == service && h["operation"] == operation)
                .unwrap_or_else(|| panic!("no {service} {operation} hop in {value}: {doc:#}"))
        };
        assert_eq!(hops[0]["service"], "front", "{value}");
        let price = named("wiremock", "GET /price");
        named("wiremock", "GET /stock");
        named("media", "GET /image");
        for h in &hops[1..] {
            assert_eq!(h["depth"], 1, "calls made in turn are siblings: {value}");
        }
        // Its stub's delay is within its own time, which front waited
        // through (a wire time of 0 or more: the call's time holds the
        // hop's total).
        assert!(
            price["total_us"].as_i64().unwrap() >= 300_000,
            "WireMock's 300 ms are its own: {value}"
        );
        assert!(price["wire_us"].as_i64().is_some(), "{doc:#}");
        let slowest = hops
            .iter()
            .max_by_key(|h| h["self_us"].as_i64().unwrap())
            .unwrap();
        assert_eq!(slowest, price, "the slow hop: {value}");
    }
}
