//! Acceptance tests of `deepspan analyze` / `deepspan report` on real
//! recordings: small Python programs instrumented with OpenTelemetry and
//! deepspan_otel (tests/analyze/cases.py) run under `deepspan record`, their
//! spans exported over OTLP/HTTP to the run's receiver, with kernel critical
//! paths known in advance:
//! - two requests contending on one lock: the waiter is blocked by the
//!   holder's request for about the hold time;
//! - a request in a CPU cgroup with a 1 % quota: PREEMPTED dominates, and
//!   it is throttling, also while short-lived processes keep the CPUs busy;
//!   the recorder's throttled switch-outs are the trace's (trace-cmd);
//! - a request reading with O_DIRECT: BLOCK_DEVICE on its path; with a
//!   process flooding the disk meanwhile, that process is named;
//! - a request sleeping: TIMER;
//! - a request pinned to a CPU with two busy processes: PREEMPTED, the
//!   busy processes named as what ran instead;
//! - two requests updating one PostgreSQL row: the waiter is blocked by the
//!   holder's request through the holder's backend process.
//!
//! Each also checks the request's diagnosis (docs/analysis.md, "Diagnosis").
//!
//! Thresholds are loose: these machines are small and shared. The tests run
//! one at a time (a lock) so that they do not disturb each other. They need
//! python3 with opentelemetry-sdk (`pip install -e 'sdk/python[test]'`);
//! the SDK itself is taken from the repository.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time, repo, HeavyTest};
use serde_json::Value;

/// `None` when the kernel test is skipped; otherwise the guard of the
/// shared lock that keeps the heavy recordings one at a time (they measure
/// each other).
fn exclusive_kernel_test(name: &str) -> Option<HeavyTest> {
    kernel_or_skip(name).then(one_at_a_time)
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

/// A recorded, imported and analysed case.
struct Case {
    _dir: tempfile::TempDir,
    run: PathBuf,
    ids: HashMap<String, String>,
}

/// Records `cases.py CASE OUT EXTRA…` under `deepspan record` (spans sent
/// to the run's receiver on ports the system picks) and analyses the run.
/// The full preset: every system call with its return value.
const FULL_PRESET: &[&str] = &["--events", "analysis"];

/// [`record_case_with`] and `record`'s default events.
fn record_case(case: &str, extra: &[&str]) -> Case {
    record_case_with(case, extra, &[])
}

/// Case `case` of cases.py, with `extra` arguments, recorded by `deepspan
/// record` with `record_args`, imported and analysed.
fn record_case_with(case: &str, extra: &[&str], record_args: &[&str]) -> Case {
    require_python();
    // Under the target folder: a real disk (O_DIRECT does not work on tmpfs).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let run = dir.path().join("run");
    let mut rec = deepspan();
    crate::common::ahead_of_other_load(&mut rec);
    rec.arg("record")
        .args(record_args)
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

/// The report's diagnosis, checked against the contract's shape.
fn diagnosis(report: &Value) -> &Value {
    let d = &report["diagnosis"];
    assert!(d.is_object(), "no diagnosis: {report}");
    assert!(d["cause"].is_string(), "{d}");
    let headline = d["headline"].as_str().expect("headline");
    assert!(headline.chars().count() <= 78, "{headline:?}");
    assert!(d["evidence"].is_object(), "{d}");
    let ns: Vec<u64> = d["culprits"]
        .as_array()
        .expect("culprits array")
        .iter()
        .map(|c| {
            assert!(c["kind"].is_string(), "{c}");
            c["ns"].as_u64().expect("culprit ns")
        })
        .collect();
    assert!(
        ns.windows(2).all(|w| w[0] >= w[1]),
        "not biggest first: {d}"
    );
    d
}

fn culprits<'a>(d: &'a Value, kind: &str) -> Vec<&'a Value> {
    d["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == kind)
        .collect()
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
#[ignore = "system: root and tracefs"]
fn lock_contention_blames_the_holder() {
    let Some(_one) = exclusive_kernel_test("lock_contention_blames_the_holder") else {
        return;
    };
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
    // Blocked by nobody's lock; at most a moment for the Python GIL the
    // waiter's thread holds once woken.
    let holder_blocked = summed(&holder, |row| !row["blocked_by_request"].is_null());
    assert!(
        holder_blocked * 20 < duration(&holder),
        "the holder blocked {:.1} ms: {holder}",
        ms(holder_blocked)
    );

    // Diagnosis: a lock of the process, held by the holder's thread for the
    // holder's request.
    let d = diagnosis(&waiter);
    assert_eq!(d["cause"], "lock_contention", "{d}\n{text}");
    let holder_tid = waiter["critical_path"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["blocked_by_request"] == holder_id && p["state"] == "TIMER")
        .and_then(|p| p["tid"].as_i64())
        .unwrap();
    let threads = culprits(d, "thread");
    assert_eq!(threads[0]["tid"].as_i64(), Some(holder_tid), "{d}");
    assert!(threads[0]["ns"].as_u64().unwrap() > 100_000_000, "{d}");
    let requests = culprits(d, "request");
    assert_eq!(requests[0]["span_id"], holder_id, "{d}");
    assert_eq!(requests[0]["operation"], "holder", "{d}");
    assert!(d["evidence"]["futex_uaddr"].as_u64().is_some(), "{d}");
    assert!(text.contains("Diagnosis: lock_contention"), "{text}");
    assert_eq!(diagnosis(&holder)["cause"], "timer", "{holder}");
}

#[test]
#[ignore = "system: root, tracefs, cgroups"]
fn cpu_cgroup_quota_shows_as_preempted() {
    let Some(_one) = exclusive_kernel_test("cpu_cgroup_quota_shows_as_preempted") else {
        return;
    };
    let group = crate::common::CpuQuota::create("analyze", 1000, 100_000);
    let case = record_case("cgroup", &[group.path().to_str().unwrap()]);
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
    let d = diagnosis(&report);
    assert_eq!(d["cause"], "cpu_throttled", "{d}\n{text}");
    let process = &d["culprits"][0];
    assert_eq!(process["kind"], "process", "{d}");
    assert!(process["pid"].as_i64().is_some(), "{d}");
    assert!(
        d["evidence"]["throttled_ns"].as_u64().unwrap() > 300_000_000,
        "{d}"
    );
    throttled_switches_are_in_the_trace(&case.run, request_tid(&requests));
}

/// A cgroup throttled while other processes keep its CPU busy is still
/// `cpu_throttled`: the recorder saw the quota switch the request out. The
/// competitors are short-lived processes, one after another on each CPU
/// (as in a parallel build): no one thread keeps the CPU long enough for
/// the wait to look held back, and the CPU is never idle.
#[test]
#[ignore = "system: root, tracefs and a CPU cgroup"]
fn cpu_cgroup_quota_beside_a_busy_machine_is_still_throttled() {
    let Some(_one) =
        exclusive_kernel_test("cpu_cgroup_quota_beside_a_busy_machine_is_still_throttled")
    else {
        return;
    };
    let competitors: Vec<Competitor> = (0..2).map(Competitor::on_cpu).collect();
    let group = crate::common::CpuQuota::create("analyze-busy", 1000, 100_000);
    let case = record_case("cgroup", &[group.path().to_str().unwrap()]);
    drop(group);
    drop(competitors);
    let text = case.report_text("throttled");
    let requests: Value =
        serde_json::from_slice(&std::fs::read(case.run.join("analysis/requests.json")).unwrap())
            .unwrap();
    let totals = &requests["requests"][0]["totals"];
    let (throttled, preempted) = (
        totals["throttled_ns"].as_u64().unwrap(),
        totals["preempted_ns"].as_u64().unwrap(),
    );
    assert!(
        throttled * 10 > preempted * 8,
        "throttled {:.1} ms of PREEMPTED {:.1} ms:\n{text}",
        ms(throttled),
        ms(preempted)
    );
    let report = case.report_json("throttled");
    let d = diagnosis(&report);
    assert_eq!(d["cause"], "cpu_throttled", "{d}\n{text}");
    throttled_switches_are_in_the_trace(&case.run, request_tid(&requests));
}

/// Short CPU-bound processes started one after another on one CPU until
/// dropped.
struct Competitor(std::process::Child);

impl Competitor {
    fn on_cpu(cpu: usize) -> Competitor {
        let child = Command::new("taskset")
            .args(["-c", &cpu.to_string(), "sh", "-c"])
            .arg("while :; do python3 -c 'sum(range(200000))'; done")
            .spawn()
            .expect("start a competitor (taskset, sh, python3)");
        Competitor(child)
    }
}

impl Drop for Competitor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The thread of the (only) request of `requests.json`.
fn request_tid(requests: &Value) -> i64 {
    requests["requests"][0]["tid"]
        .as_i64()
        .unwrap_or_else(|| panic!("the request has no thread: {requests}"))
}

/// The recorder's throttled switch-outs (`kernel/cfs_throttle.tsv`, read by
/// eBPF) of thread `tid` are there, and each is a switch-out of that thread
/// in the trace, still runnable, within 100 µs: the oracle is trace-cmd.
fn throttled_switches_are_in_the_trace(run: &Path, tid: i64) {
    let file = std::fs::read_to_string(run.join("kernel/cfs_throttle.tsv"))
        .expect("the recorder wrote kernel/cfs_throttle.tsv (Linux 6.18 with BPF and BTF)");
    let ours: Vec<u64> = file
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f[2].parse::<i64>() == Ok(tid))
        .map(|f| f[0].parse().expect("a time in ns"))
        .collect();
    assert!(
        !ours.is_empty(),
        "no throttled switch-out of thread {tid}:\n{file}"
    );
    let report = check(
        "trace-cmd report (the oracle; make test installs it)",
        Command::new("trace-cmd")
            .args(["report", "-t", "-R"])
            .arg(run.join("kernel/trace.dat"))
            .output()
            .expect("run trace-cmd"),
    );
    // `comm-pid [cpu] secs.nanos: sched_switch: prev_comm=… prev_pid=N … prev_state=S …`
    let runnable_switches: Vec<u64> = String::from_utf8_lossy(&report.stdout)
        .lines()
        .filter(|l| l.contains(" sched_switch: "))
        .filter(|l| l.contains(&format!(" prev_pid={tid} ")))
        // Still runnable: no state bit (R), or only TASK_REPORT_MAX, which
        // the tracepoint reports for a preemption (R+).
        .filter(|l| {
            let state = l
                .split(" prev_state=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap();
            state.parse::<u64>().is_ok_and(|n| n & 0xff == 0)
        })
        .map(|l| {
            let stamp = l
                .split(']')
                .nth(1)
                .unwrap()
                .trim()
                .split(':')
                .next()
                .unwrap();
            let (secs, nanos) = stamp.split_once('.').unwrap();
            secs.parse::<u64>().unwrap() * 1_000_000_000 + nanos.parse::<u64>().unwrap()
        })
        .collect();
    for t in &ours {
        assert!(
            runnable_switches.iter().any(|s| s.abs_diff(*t) <= 100_000),
            "throttled switch-out of {tid} at {t} ns is no runnable switch-out in the trace \
             (those are at {runnable_switches:?})"
        );
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn o_direct_read_waits_on_the_block_device() {
    let Some(_one) = exclusive_kernel_test("o_direct_read_waits_on_the_block_device") else {
        return;
    };
    o_direct_read(FULL_PRESET);
}

/// The same recorded `lean`: no call's return, the bytes read from the
/// threads' counts at their sleeps.
#[test]
#[ignore = "system: root and tracefs"]
fn o_direct_read_recorded_lean_has_its_miss_ratio_too() {
    let Some(_one) = exclusive_kernel_test("o_direct_read_recorded_lean_has_its_miss_ratio_too")
    else {
        return;
    };
    o_direct_read(&[]);
}

/// Case odirect recorded with `record_args`: its request waits on the
/// block device for its own reads, all from the disk.
fn o_direct_read(record_args: &[&str]) {
    let case = record_case_with("odirect", &[], record_args);
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
    // O_DIRECT bypasses the page cache: every byte read came from the disk.
    let d = diagnosis(&report);
    eprintln!("odirect recorded with {record_args:?}: {}", d["evidence"]);
    assert_eq!(d["cause"], "disk", "{d}\n{text}");
    let miss = d["evidence"]["page_cache_miss_ratio"].as_f64().unwrap();
    assert!(miss > 0.9, "page-cache miss ratio {miss}: {d}");
    assert!(
        d["evidence"]["read_bytes"].as_u64().unwrap() >= 16 << 20,
        "{d}"
    );
    assert!(
        d["evidence"]["queue_depth_max"].as_u64().unwrap() >= 1,
        "{d}"
    );
    // The reader waited on the block device for its own reads.
    let reader = report["critical_path"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["state"] == "BLOCK_DEVICE")
        .and_then(|p| p["tid"].as_i64())
        .unwrap();
    let tgids = std::fs::read_to_string(case.run.join("kernel/saved_tgids")).unwrap_or_default();
    let reader_pid = tgids
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(t, _)| t.parse::<i64>().ok() == Some(reader))
        .and_then(|(_, p)| p.parse::<i64>().ok())
        .unwrap_or(reader);
    // Among the processes whose I/O queued ahead, not necessarily first:
    // another process's writes (a build beside the test) may fill more of
    // the queue, and the analysis rightly names it first then.
    let named = d["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["kind"] == "process" && c["pid"].as_i64() == Some(reader_pid));
    assert!(
        named,
        "the reader (pid {reader_pid}) is not among the culprits: {d}"
    );
    assert!(
        d["evidence"]["own_block_requests"].as_u64() > Some(0),
        "{d}"
    );
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_process_flooding_the_disk_is_named_for_a_read_that_waits() {
    let Some(_one) =
        exclusive_kernel_test("a_process_flooding_the_disk_is_named_for_a_read_that_waits")
    else {
        return;
    };
    // The default preset (lean): the miss ratio from the threads' counts
    // of bytes read.
    let case = record_case("diskflood", &[]);
    let report = case.report_json("read");
    assert_well_formed(&report);
    let text = case.report_text("read");
    let d = diagnosis(&report);
    assert_eq!(d["cause"], "disk", "{d}\n{text}");
    let first = &d["culprits"][0];
    assert_eq!(
        (first["kind"].as_str(), first["comm"].as_str()),
        (Some("process"), Some("backup")),
        "{d}\n{text}"
    );
    assert_eq!(
        first["pid"].as_i64().map(|p| p.to_string()).as_deref(),
        Some(case.id("backup_pid")),
        "{d}"
    );
    // The backup's writes queue up in front of the reads.
    assert!(
        d["evidence"]["queue_depth_max"].as_u64().unwrap() >= 2,
        "{d}"
    );
    assert!(
        d["evidence"]["page_cache_miss_ratio"].as_f64().unwrap() > 0.9,
        "{d}"
    );
    assert!(d["headline"].as_str().unwrap().contains("backup"), "{d}");
}

#[test]
#[ignore = "system: root and tracefs"]
fn sleep_is_timer() {
    let Some(_one) = exclusive_kernel_test("sleep_is_timer") else {
        return;
    };
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
    let d = diagnosis(&report);
    assert_eq!(d["cause"], "timer", "{d}");
    assert_eq!(d["culprits"][0]["name"], "clock_nanosleep", "{d}");
    // One request of its operation: no baseline, not anomalous.
    let requests: Value =
        serde_json::from_slice(&std::fs::read(case.run.join("analysis/requests.json")).unwrap())
            .unwrap();
    let entry = &requests["requests"][0];
    assert!(
        entry["baseline_ns"].is_null() && entry["anomalous"] == false,
        "{entry}"
    );
    assert_eq!(entry["diagnosis"], *d);

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
    // With the SDK's placement only (no inference from the kernel trace,
    // which `placement_real` covers).
    let out = check(
        "deepspan analyze --placement sdk",
        deepspan()
            .arg("analyze")
            .arg(&case.run)
            .args(["--placement", "sdk"])
            .output()
            .unwrap(),
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
        "diagnoses",
        "containers",
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

#[test]
#[ignore = "system: root and tracefs"]
fn cpu_hogs_on_the_same_cpu_are_named_as_contention() {
    let Some(_one) = exclusive_kernel_test("cpu_hogs_on_the_same_cpu_are_named_as_contention")
    else {
        return;
    };
    let case = record_case("hog", &[]);
    let d = hogs_are_named_as_contention(&case);
    // Not in a container: none is named.
    for c in d["culprits"].as_array().unwrap() {
        assert!(
            c.get("container_id").is_none() && c.get("pod_uid").is_none(),
            "{c}"
        );
    }
}

/// The same hogs, each in a CPU cgroup named as the kubelet names a
/// container's (the cgroupfs layout for one, the systemd one for the
/// other), moved there after the recording began: each culprit names its
/// container id and pod uid, which the trace's cgroup moves say.
#[test]
#[ignore = "system: root, tracefs and a CPU cgroup"]
fn cpu_hogs_in_kubelet_cgroups_are_named_by_container_and_pod() {
    let Some(_one) =
        exclusive_kernel_test("cpu_hogs_in_kubelet_cgroups_are_named_by_container_and_pod")
    else {
        return;
    };
    let case = record_case("hogpods", &[]);
    let d = hogs_are_named_as_contention(&case);
    let expected = hog_containers(&case);
    let mut named = 0;
    for c in culprits(&d, "process") {
        let Some(&(container, pod)) = expected.get(&c["pid"].as_i64().unwrap()) else {
            assert!(
                c.get("container_id").is_none(),
                "not a hog, yet in a container: {c}"
            );
            continue;
        };
        assert_eq!(c["container_id"], container, "{c}");
        assert_eq!(c["pod_uid"], pod, "{c}");
        named += 1;
    }
    assert!(named >= 1, "{d}");
    // The containers table has both, by pid.
    let mut rows: HashMap<i64, (String, String)> = HashMap::new();
    deepspan_store::rows::for_each_row(
        &case.run.join("analysis/containers.parquet"),
        |row: deepspan_store::tables::ContainerRow| {
            let text = |v: Option<String>| v.unwrap_or_default();
            rows.insert(
                i64::from(row.pid),
                (text(row.container_id), text(row.pod_uid)),
            );
        },
    )
    .expect("the containers table");
    for (pid, (container, pod)) in &expected {
        assert_eq!(
            rows.get(pid),
            Some(&(container.to_string(), pod.to_string())),
            "hog {pid} in {rows:?}"
        );
    }
    // The headline and the report name the first one's container.
    let container = d["culprits"][0]["container_id"].as_str().unwrap();
    let headline = d["headline"].as_str().unwrap();
    let named = format!("in container {}", &container[..12]);
    assert!(headline.contains(&named), "{headline:?} lacks {named:?}");
    let text = case.report_text("contended");
    assert!(
        text.contains(&format!("container {}", &container[..10])),
        "{text}"
    );
}

/// The hogs as two podman containers (busybox, a shell loop; Debian's
/// podman with runc): each culprit names its container by id and by the
/// name podman gave it, and so does the report.
#[test]
#[ignore = "system: root, tracefs, a CPU cgroup and podman"]
fn cpu_hogs_in_podman_containers_are_named_by_id_and_name() {
    let Some(_one) =
        exclusive_kernel_test("cpu_hogs_in_podman_containers_are_named_by_id_and_name")
    else {
        return;
    };
    if Command::new("podman").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_none(),
            "podman is not installed (scripts/setup.sh test installs it)"
        );
        return;
    }
    let case = record_case("hogpodman", &[]);
    let report = case.report_json("contended");
    assert_well_formed(&report);
    let text = case.report_text("contended");
    let d = diagnosis(&report);
    assert_eq!(d["cause"], "cpu_contention", "{d}\n{text}");
    let expected = hog_containers(&case);
    let first = &d["culprits"][0];
    assert_eq!(first["kind"], "process", "{d}");
    let (id, name) = expected
        .get(&first["pid"].as_i64().unwrap())
        .unwrap_or_else(|| panic!("the first culprit is no hog container: {d}\n{text}"));
    assert_eq!(first["container_id"], *id, "{d}");
    assert_eq!(first["container_name"], *name, "{d}");
    let named = format!("in container {name}");
    assert!(d["headline"].as_str().unwrap().contains(&named), "{d}");
    assert!(text.contains(&format!("container {name}")), "{text}");
}

/// The `hog_containers` of case `hogpods` or `hogpodman`: each hog's pid →
/// its container id and pod uid (`hogpods`) or name (`hogpodman`).
fn hog_containers(case: &Case) -> HashMap<i64, (&str, &str)> {
    case.id("hog_containers")
        .split(',')
        .map(|entry| {
            let (pid, ids) = entry.split_once('=').unwrap();
            (pid.parse().unwrap(), ids.split_once('/').unwrap())
        })
        .collect()
}

/// Case `hog` or `hogpods`: the request waited for the CPU the hogs took,
/// and they are named for it. Returns the diagnosis.
fn hogs_are_named_as_contention(case: &Case) -> Value {
    let report = case.report_json("contended");
    assert_well_formed(&report);
    let text = case.report_text("contended");
    let total = duration(&report);
    let preempted = state_ns(&report, "PREEMPTED");
    assert!(
        preempted * 2 > total,
        "PREEMPTED {:.1} ms of {:.1} ms:\n{text}",
        ms(preempted),
        ms(total)
    );
    let d = diagnosis(&report);
    assert_eq!(d["cause"], "cpu_contention", "{d}\n{text}");
    let hogs: Vec<i64> = case
        .id("hog_pids")
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    let first = &d["culprits"][0];
    assert_eq!(first["kind"], "process", "{d}");
    assert_eq!(first["comm"], "cpuhog", "{d}");
    assert!(hogs.contains(&first["pid"].as_i64().unwrap()), "{d}");
    // Both hogs ran instead of the request, for most of its wait.
    let by_hogs: u64 = culprits(d, "process")
        .iter()
        .filter(|c| hogs.contains(&c["pid"].as_i64().unwrap()))
        .map(|c| c["ns"].as_u64().unwrap())
        .sum();
    assert!(by_hogs * 10 > preempted * 7, "{d}\n{text}");
    assert!(d["headline"].as_str().unwrap().contains("cpuhog"), "{d}");
    d.clone()
}

/// A throwaway PostgreSQL cluster on a free loopback port, stopped and
/// removed on every exit path.
struct Postgres {
    dir: tempfile::TempDir,
    port: u16,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl Postgres {
    fn start() -> Postgres {
        assert!(
            Path::new(PG_BIN).join("initdb").is_file(),
            "the PostgreSQL test needs postgresql-15 ({PG_BIN}; scripts/setup.sh test installs it)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        // The server refuses to run as root: the postgres user owns it.
        check(
            "chown the cluster folder",
            Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path())
                .output()
                .expect("run chown"),
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let as_postgres = |args: &[&str]| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).args(args);
            c
        };
        let initdb = format!("{PG_BIN}/initdb");
        check(
            "initdb",
            as_postgres(&[
                &initdb,
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "--no-sync",
            ])
            .output()
            .expect("run initdb"),
        );
        let pg = Postgres { dir, port };
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            pg.dir.path().display()
        );
        let pg_ctl = format!("{PG_BIN}/pg_ctl");
        check(
            "pg_ctl start",
            as_postgres(&[
                &pg_ctl,
                "-D",
                data.to_str().unwrap(),
                "-o",
                &options,
                "-l",
                pg.dir.path().join("log").to_str().unwrap(),
                "-w",
                "start",
            ])
            .output()
            .expect("run pg_ctl"),
        );
        pg
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{PG_BIN}/pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn row_lock(mode: &str) {
    let _one = one_at_a_time();
    let out = python()
        .args(["-c", "import psycopg2"])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the PostgreSQL test needs psycopg2 (scripts/setup.sh test installs it)"
    );
    let pg = Postgres::start();
    let case = record_case("pgrowlock", &[&pg.port.to_string(), mode]);
    drop(pg);
    let waiter = case.report_json("waiter");
    assert_well_formed(&waiter);
    let text = case.report_text("waiter");
    let holder_id = case.id("holder");
    let total = duration(&waiter);
    let blocked = summed(&waiter, |row| row["blocked_by_request"] == holder_id);
    assert!(
        total > 150_000_000 && blocked * 2 > total,
        "{mode}: blocked by the holder {:.1} ms of {:.1} ms:\n{text}",
        ms(blocked),
        ms(total)
    );
    let d = diagnosis(&waiter);
    assert_eq!(d["cause"], "blocked_by_request", "{mode}: {d}\n{text}");
    let process = culprits(d, "process")[0];
    assert_eq!(process["comm"], "postgres", "{mode}: {d}\n{text}");
    assert_eq!(
        process["pid"].as_i64().map(|p| p.to_string()).as_deref(),
        Some(case.id("holder_backend")),
        "{mode}: the holder's backend: {d}\n{text}"
    );
    let request = culprits(d, "request")[0];
    assert_eq!(request["span_id"], holder_id, "{mode}: {d}");
    // The holder waits for nobody's lock; at most for the Python GIL the
    // waiter's thread holds for a moment once both are woken.
    let holder = case.report_json("holder");
    let holder_blocked = summed(&holder, |row| !row["blocked_by_request"].is_null());
    assert!(
        holder_blocked * 20 < duration(&holder),
        "{mode}: the holder blocked {:.1} ms: {holder}",
        ms(holder_blocked)
    );
}

#[test]
#[ignore = "system: root, tracefs, PostgreSQL"]
fn a_postgres_row_lock_blames_the_other_request_through_its_backend() {
    if !kernel_or_skip("a_postgres_row_lock_blames_the_other_request_through_its_backend") {
        return;
    }
    // The holder's backend sleeps with the lock (SELECT pg_sleep) …
    row_lock("server");
    // … or its client does, between statements of the transaction.
    row_lock("client");
}
