//! Acceptance tests of `deepspan analyze` / `deepspan report` on real
//! recordings: small Python programs instrumented with OpenTelemetry and
//! deepspan_otel (tests/analyze/cases.py) run under `deepspan record`, their
//! spans exported over OTLP/HTTP to the run's receiver, with kernel critical
//! paths known in advance:
//! - two requests contending on one lock: the waiter is blocked by the
//!   holder's request for about the hold time;
//! - a request in a CPU cgroup with a 1 % quota: PREEMPTED dominates;
//! - a request reading with O_DIRECT: BLOCK_DEVICE on its path;
//! - a request sleeping: TIMER.
//!
//! Thresholds are loose: these machines are small and shared. The tests run
//! one at a time (a lock) so that they do not disturb each other. They need
//! python3 with opentelemetry-sdk (`pip install -e 'sdk/python[test]'`);
//! the SDK itself is taken from the repository.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use common::{deepspan, kernel_or_skip};
use serde_json::Value;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cases_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/analyze/cases.py")
}

fn python() -> Command {
    let mut c = Command::new("python3");
    // The SDK of this checkout, whatever is installed.
    c.env("PYTHONPATH", repo().join("sdk/python"));
    c
}

fn require_python() {
    let out = python()
        .args([
            "-c",
            "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.common, deepspan_otel",
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3 with opentelemetry-sdk and the OTLP exporter is needed (pip install -e 'sdk/python[test]'): {}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// A recorded, imported and analysed case.
struct Case {
    _dir: tempfile::TempDir,
    run: PathBuf,
    ids: HashMap<String, String>,
}

/// Records `cases.py CASE OUT EXTRA…` under `deepspan record` (spans sent
/// to the run's receiver on ports the system picks) and analyses the run.
fn record_case(case: &str, extra: &[&str]) -> Case {
    require_python();
    // Under the target folder: a real disk (O_DIRECT does not work on tmpfs).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let run = dir.path().join("run");
    let mut rec = deepspan();
    rec.arg("record")
        .arg("-o")
        .arg(&run)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0"])
        .arg("--")
        .arg("python3")
        .arg(cases_py())
        .arg(case)
        .arg(&out)
        .args(extra)
        .env("PYTHONPATH", repo().join("sdk/python"));
    check(
        &format!("deepspan record of case {case}"),
        rec.output().expect("run deepspan record"),
    );
    assert!(
        run.join("spans").is_dir(),
        "the run's receiver got no spans from case {case} (no {}/spans)",
        run.display()
    );
    check(
        "deepspan analyze",
        deepspan()
            .arg("analyze")
            .arg(&run)
            .output()
            .expect("run deepspan analyze"),
    );
    let ids: HashMap<String, String> =
        serde_json::from_slice(&std::fs::read(out.join("ids.json")).expect("ids.json"))
            .expect("ids.json is JSON");
    Case {
        _dir: dir,
        run,
        ids,
    }
}

impl Case {
    fn id(&self, name: &str) -> &str {
        self.ids
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no request {name} in {:?}", self.ids))
    }

    fn report_json(&self, name: &str) -> Value {
        let out = check(
            "deepspan report --format json",
            deepspan()
                .arg("report")
                .arg(&self.run)
                .args(["--request", self.id(name), "--format", "json"])
                .output()
                .expect("run deepspan report"),
        );
        serde_json::from_slice(&out.stdout).expect("report is JSON")
    }

    fn report_text(&self, name: &str) -> String {
        let out = check(
            "deepspan report",
            deepspan()
                .arg("report")
                .arg(&self.run)
                .args(["--request", self.id(name), "--max-pieces", "40"])
                .output()
                .expect("run deepspan report"),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn duration(report: &Value) -> u64 {
    let r = &report["request"];
    r["end_ns"].as_u64().unwrap() - r["start_ns"].as_u64().unwrap()
}

/// Time of the summary rows matching `keep`.
fn summed(report: &Value, keep: impl Fn(&Value) -> bool) -> u64 {
    report["summary"]
        .as_array()
        .expect("summary array")
        .iter()
        .filter(|row| keep(row))
        .map(|row| row["ns"].as_u64().unwrap())
        .sum()
}

fn state_ns(report: &Value, state: &str) -> u64 {
    summed(report, |row| {
        row["state"] == state && row["blocked_by_request"].is_null()
    })
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Every report covers the request: the path is contiguous from start to
/// end, and the summary adds up to the duration.
fn assert_well_formed(report: &Value) {
    let start = report["request"]["start_ns"].as_u64().unwrap();
    let end = report["request"]["end_ns"].as_u64().unwrap();
    let path = report["critical_path"]
        .as_array()
        .expect("critical_path array");
    assert!(!path.is_empty(), "empty critical path: {report}");
    let mut t = start;
    for p in path {
        assert_eq!(
            p["start_ns"].as_u64().unwrap(),
            t,
            "gap or overlap in the path at {p}"
        );
        t = p["end_ns"].as_u64().unwrap();
    }
    assert_eq!(t, end, "the path does not reach the request's end");
    assert_eq!(
        summed(report, |_| true),
        end - start,
        "the summary does not add up to the duration"
    );
    assert!(report["lost_events"].is_u64());
}

#[test]
fn lock_contention_blames_the_holder() {
    if !kernel_or_skip("lock_contention_blames_the_holder") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let case = record_case("lock", &[]);
    let waiter = case.report_json("waiter");
    assert_well_formed(&waiter);
    let holder_id = case.id("holder");
    let blocked = summed(&waiter, |row| row["blocked_by_request"] == holder_id);
    let total = duration(&waiter);
    let text = case.report_text("waiter");
    // The holder keeps the lock 300 ms; the waiter starts once it is held.
    assert!(
        total > 150_000_000,
        "the waiter took only {:.1} ms:\n{text}",
        ms(total)
    );
    assert!(
        blocked * 2 > total && blocked > 100_000_000,
        "blocked by the holder {:.1} ms of {:.1} ms:\n{text}",
        ms(blocked),
        ms(total)
    );
    // And the path goes through the holder's thread while it waits.
    let through_holder = waiter["critical_path"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["blocked_by_request"] == holder_id && p["state"] == "TIMER");
    assert!(
        through_holder,
        "no piece of the holder sleeping with the lock:\n{text}"
    );
    assert!(
        text.contains(&format!("Blocked by request {holder_id}")),
        "{text}"
    );
    let holder = case.report_json("holder");
    assert_well_formed(&holder);
    assert_eq!(
        summed(&holder, |row| !row["blocked_by_request"].is_null()),
        0,
        "{holder}"
    );
}

/// A CPU cgroup (v1) made for one test and removed on every exit path.
struct Cgroup(PathBuf);

impl Cgroup {
    fn create(quota_us: u64, period_us: u64) -> Cgroup {
        let root = Path::new("/sys/fs/cgroup/cpu");
        assert!(
            root.join("tasks").is_file(),
            "the cgroup test needs the v1 cpu controller at {}",
            root.display()
        );
        let dir = root.join(format!("deepspan-test-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let group = Cgroup(dir);
        std::fs::write(group.0.join("cpu.cfs_period_us"), period_us.to_string())
            .expect("set cpu.cfs_period_us");
        std::fs::write(group.0.join("cpu.cfs_quota_us"), quota_us.to_string())
            .expect("set cpu.cfs_quota_us");
        group
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Any thread left in it (a failed run) goes back to the root group.
        if let Ok(tasks) = std::fs::read_to_string(self.0.join("tasks")) {
            for tid in tasks.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/cpu/tasks", tid);
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove the test cgroup {}", self.0.display());
    }
}

#[test]
fn cpu_cgroup_quota_shows_as_preempted() {
    if !kernel_or_skip("cpu_cgroup_quota_shows_as_preempted") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let group = Cgroup::create(1000, 100_000);
    let case = record_case("cgroup", &[group.0.to_str().unwrap()]);
    drop(group);
    let report = case.report_json("throttled");
    assert_well_formed(&report);
    let total = duration(&report);
    let preempted = state_ns(&report, "PREEMPTED");
    let running = state_ns(&report, "RUNNING");
    let text = case.report_text("throttled");
    // 15 ms of CPU at 1 ms per 100 ms: over a second, nearly all waiting.
    assert!(
        total > 500_000_000,
        "the throttled request took only {:.1} ms:\n{text}",
        ms(total)
    );
    assert!(
        preempted * 10 > total * 6,
        "PREEMPTED {:.1} ms of {:.1} ms:\n{text}",
        ms(preempted),
        ms(total)
    );
    assert!(
        preempted > 5 * running,
        "PREEMPTED does not dominate RUNNING:\n{text}"
    );
    // And it is told apart from contention: the CPU stayed idle, or other
    // threads got far more than a fair share meanwhile.
    let requests: Value =
        serde_json::from_slice(&std::fs::read(case.run.join("analysis/requests.json")).unwrap())
            .unwrap();
    let totals = &requests["requests"][0]["totals"];
    let throttled = totals["throttled_ns"].as_u64().unwrap();
    assert!(
        throttled * 2 > totals["preempted_ns"].as_u64().unwrap(),
        "throttled {:.1} ms of PREEMPTED {:.1} ms:\n{text}",
        ms(throttled),
        ms(preempted)
    );
    assert!(text.contains("PREEMPTED (throttled)"), "{text}");
}

#[test]
fn o_direct_read_waits_on_the_block_device() {
    if !kernel_or_skip("o_direct_read_waits_on_the_block_device") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let case = record_case("odirect", &[]);
    let report = case.report_json("read");
    assert_well_formed(&report);
    let total = duration(&report);
    let device = state_ns(&report, "BLOCK_DEVICE");
    let text = case.report_text("read");
    assert!(
        device * 5 > total,
        "BLOCK_DEVICE {:.2} ms of {:.2} ms:\n{text}",
        ms(device),
        ms(total)
    );
    let in_read = report["critical_path"].as_array().unwrap().iter().any(|p| {
        p["state"] == "BLOCK_DEVICE" && p["syscall"].as_str().is_some_and(|s| s.contains("read"))
    });
    assert!(
        in_read,
        "no BLOCK_DEVICE piece inside a read system call:\n{text}"
    );
}

#[test]
fn sleep_is_timer() {
    if !kernel_or_skip("sleep_is_timer") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let case = record_case("sleep", &[]);
    let report = case.report_json("sleep");
    assert_well_formed(&report);
    let total = duration(&report);
    let timer = state_ns(&report, "TIMER");
    let text = case.report_text("sleep");
    assert!(
        timer * 10 > total * 8,
        "TIMER {:.1} ms of {:.1} ms:\n{text}",
        ms(timer),
        ms(total)
    );
    assert!(
        text.contains("clock_nanosleep"),
        "the sleep's system call is not named:\n{text}"
    );

    // By trace id too, and the same answer.
    let trace_id = report["request"]["trace_id"].as_str().unwrap().to_string();
    let by_trace = check(
        "deepspan report by trace id",
        deepspan()
            .arg("report")
            .arg(&case.run)
            .args(["--request", &trace_id, "--format", "json"])
            .output()
            .unwrap(),
    );
    let by_trace: Value = serde_json::from_slice(&by_trace.stdout).unwrap();
    assert_eq!(by_trace, report);

    // A plain OTel span (no deepspan fields) over the same sleep: placed
    // only when told its `thread.id` is the OS tid, through the clock samples.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(case.run.join("manifest.json")).unwrap()).unwrap();
    let offset = manifest["start"]["realtime_ns"].as_u64().unwrap() as i128
        - manifest["start"]["mono_ns"].as_u64().unwrap() as i128;
    let sleeper = report["critical_path"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["state"] == "TIMER")
        .and_then(|p| p["tid"].as_i64())
        .expect("a TIMER piece with a thread");
    let (start, end) = (
        report["request"]["start_ns"].as_u64().unwrap() + 5_000_000,
        report["request"]["end_ns"].as_u64().unwrap() - 5_000_000,
    );
    let wall = |mono: u64| (mono as i128 + offset).to_string();
    let plain = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "plain"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "0000000000000000000000000000abcd", "spanId": "000000000000abcd",
            "name": "mapped", "kind": 2,
            "startTimeUnixNano": wall(start), "endTimeUnixNano": wall(end),
            "attributes": [{"key": "thread.id", "value": {"intValue": sleeper.to_string()}}]
        }]}]
    }]});
    let plain_file = case.run.join("plain.json");
    std::fs::write(&plain_file, plain.to_string()).unwrap();
    check(
        "deepspan import of a plain span",
        deepspan()
            .arg("import")
            .arg("-o")
            .arg(&case.run)
            .arg(&plain_file)
            .output()
            .unwrap(),
    );
    let sync_of = |requests: &Value| {
        requests["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["span_id"] == "000000000000abcd")
            .map(|r| r["sync"].as_str().unwrap().to_string())
    };
    let out = check(
        "deepspan analyze",
        deepspan().arg("analyze").arg(&case.run).output().unwrap(),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--thread-id-is-os-tid"));
    let requests: Value =
        serde_json::from_slice(&std::fs::read(case.run.join("analysis/requests.json")).unwrap())
            .unwrap();
    assert_eq!(sync_of(&requests).as_deref(), Some("none"));
    check(
        "deepspan analyze --thread-id-is-os-tid",
        deepspan()
            .arg("analyze")
            .arg(&case.run)
            .arg("--thread-id-is-os-tid")
            .output()
            .unwrap(),
    );
    let requests: Value =
        serde_json::from_slice(&std::fs::read(case.run.join("analysis/requests.json")).unwrap())
            .unwrap();
    assert_eq!(sync_of(&requests).as_deref(), Some("clock_mapped"));
    let mapped = check(
        "deepspan report of the mapped span",
        deepspan()
            .arg("report")
            .arg(&case.run)
            .args(["--request", "abcd", "--format", "json"])
            .output()
            .unwrap(),
    );
    let mapped: Value = serde_json::from_slice(&mapped.stdout).unwrap();
    assert_well_formed(&mapped);
    // The sleeping thread was working for the other request meanwhile.
    let timer = summed(&mapped, |row| row["state"] == "TIMER");
    assert!(timer * 10 > duration(&mapped) * 8, "{mapped}");

    // Analysing again replaces the analysis whole, with the same result.
    let json = || std::fs::read(case.run.join("analysis/requests.json")).unwrap();
    let first: Value = serde_json::from_slice(&json()).unwrap();
    check(
        "deepspan analyze again",
        deepspan()
            .arg("analyze")
            .arg(&case.run)
            .arg("--thread-id-is-os-tid")
            .output()
            .unwrap(),
    );
    let second: Value = serde_json::from_slice(&json()).unwrap();
    assert_eq!(first, second);
    let leftovers: Vec<_> = std::fs::read_dir(&case.run)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".analysis"))
        .collect();
    assert!(leftovers.is_empty(), "staging folders left: {leftovers:?}");
    for table in [
        "thread_states",
        "syscalls",
        "requests",
        "critical_path",
        "request_summary",
        "request_syscalls",
        "operation_summary",
    ] {
        assert!(
            case.run.join(format!("analysis/{table}.parquet")).is_file(),
            "no {table} table"
        );
    }
}

#[test]
fn report_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = deepspan()
        .arg("report")
        .arg(dir.path())
        .args(["--request", "abc"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("deepspan analyze"), "{err}");
    let out = deepspan().arg("analyze").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no kernel trace"), "{err}");
}
