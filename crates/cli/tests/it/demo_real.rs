//! Acceptance tests of `deepspan demo` (kernel tests: root, tracefs,
//! cgroups, network namespaces, PostgreSQL and the demo's Python packages,
//! which scripts/setup.sh test installs).
//!
//! - every scenario runs end to end; when `deepspan analyze` writes
//!   diagnoses, each scenario's found cause and culprits must be the
//!   expected ones; without them (before the diagnosis lands) each fault
//!   must at least show on the kernel critical path of the slow requests
//!   it hit, and the output must say that there is no diagnosis;
//! - nothing is left behind: processes, cgroups, network namespaces, veth
//!   pairs, PostgreSQL clusters, work folders, tracefs instances, podman
//!   containers; also when the demo is stopped by SIGTERM or by a Ctrl-C
//!   (SIGINT to its process group) in the middle of a fault;
//! - with `--containers` (pricing and the encoders in podman containers
//!   with PID namespaces of their own), cpu-hog names the encoders'
//!   container as the culprit, and Jaeger gets each kernel child's
//!   container.
//!
//! The six scenarios run once per test binary ([`kept_demo`]): the runs are
//! kept for the other tests that need a demo run with its fault staged.
//!
//! The tests run one at a time (a lock): they share the machine's CPUs,
//! disk and names. Other demos may run on the machine meanwhile (another
//! checkout's tests, a user's): the processes of this test binary's demos
//! carry a tag in their environment, and only what is tagged, or named
//! after a process that is gone, counts as left behind.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time, repo, TRACEFS};
use serde_json::Value;

/// Set in the environment of this test binary's demos (inherited by every
/// process they start): the value is this process's pid.
const TAG: &str = "DEEPSPAN_DEMO_TEST_OWNER";

/// Whether `pid` is a process of one of this test binary's demos.
fn ours(pid: i32) -> bool {
    let tag = format!("{TAG}={}", std::process::id());
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == tag.as_bytes()))
}

/// The pid a demo resource is named after (`deepspan-demo-<pid>…`,
/// `dsd<pid>n`, `deepspan-<pid>-…`).
fn pid_in(name: &str) -> Option<i32> {
    let digits: String = name
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// A resource of a demo that is running and is not ours: not a leftover.
fn someone_elses(name: &str) -> bool {
    pid_in(name).is_some_and(|p| alive(p) && !ours(p))
}

fn demo() -> Command {
    let mut c = deepspan();
    crate::common::ahead_of_other_load(&mut c);
    c.arg("demo")
        .env(TAG, std::process::id().to_string())
        .env("DEEPSPAN_DEMO_DIR", repo().join("demo"))
        // The demo's services import the SDK of this checkout.
        .env("PYTHONPATH", repo().join("sdk/python"));
    c
}

/// What the demo may leave behind, named so that leftovers can be found.
#[derive(Debug, PartialEq, Eq)]
struct Leftovers {
    processes: BTreeSet<String>,
    cgroups: BTreeSet<String>,
    netns: BTreeSet<String>,
    links: BTreeSet<String>,
    work_dirs: BTreeSet<String>,
    dead_instances: BTreeSet<String>,
    /// podman's containers (`--containers`), from its storage file.
    containers: BTreeSet<String>,
}

fn names_in(dir: &str, prefix: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn leftovers() -> Leftovers {
    let mut processes = BTreeSet::new();
    for pid in names_in("/proc", "") {
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        // The driver, the shop's services, hog and backup, and PostgreSQL
        // (its data folder is in a deepspan-demo-<pid>- work folder).
        let demo_process = cmd.contains("demo/driver.py")
            || cmd.contains("shop.service")
            || cmd.contains("shop.loadgen")
            || cmd.contains("harness.")
            || cmd.contains("/deepspan-demo-");
        if demo_process && pid.parse().is_ok_and(ours) {
            processes.insert(format!("{pid}: {}", cmd.trim()));
        }
    }
    let dead_instances = names_in(&format!("{TRACEFS}/instances"), "deepspan-")
        .into_iter()
        .filter(|n| {
            n.split('-')
                .nth(1)
                .and_then(|p| p.parse().ok())
                .is_some_and(|p: i32| !alive(p))
        })
        .collect();
    let mine = |names: BTreeSet<String>| -> BTreeSet<String> {
        names.into_iter().filter(|n| !someone_elses(n)).collect()
    };
    Leftovers {
        processes,
        cgroups: mine(
            names_in("/sys/fs/cgroup/cpu", "deepspan-demo-")
                .into_iter()
                .chain(names_in("/sys/fs/cgroup", "deepspan-demo-"))
                .collect(),
        ),
        netns: mine(names_in("/run/netns", "deepspan-demo-")),
        links: mine(names_in("/sys/class/net", "dsd")),
        work_dirs: mine(names_in("/var/tmp", "deepspan-demo-")),
        dead_instances,
        containers: mine(podman_containers("deepspan-demo-")),
    }
}

/// The names of podman's containers that start with `prefix`.
fn podman_containers(prefix: &str) -> BTreeSet<String> {
    #[derive(serde::Deserialize)]
    struct Stored {
        #[serde(default)]
        names: Vec<String>,
    }
    let storage = "/var/lib/containers/storage/overlay-containers/containers.json";
    let stored: Vec<Stored> = std::fs::read(storage)
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_default();
    stored
        .into_iter()
        .flat_map(|c| c.names)
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// What the demo left behind that was not there before it started
/// (`Err`: the list).
fn nothing_left(before: &Leftovers) -> Result<(), String> {
    let after = leftovers();
    let new = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
        a.difference(b).cloned().collect()
    };
    let found = [
        ("processes", new(&after.processes, &before.processes)),
        ("cgroups", new(&after.cgroups, &before.cgroups)),
        ("network namespaces", new(&after.netns, &before.netns)),
        ("links", new(&after.links, &before.links)),
        (
            "work folders in /var/tmp",
            new(&after.work_dirs, &before.work_dirs),
        ),
        (
            "tracefs instances of dead recorders",
            new(&after.dead_instances, &before.dead_instances),
        ),
        ("containers", new(&after.containers, &before.containers)),
    ];
    let left: Vec<_> = found.iter().filter(|(_, v)| !v.is_empty()).collect();
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("the demo left these behind: {left:#?}"))
    }
}

/// Fails with the difference when the demo left something that was not
/// there before it started.
fn assert_nothing_left(before: &Leftovers) {
    if let Err(left) = nothing_left(before) {
        panic!("{left}");
    }
}

/// The demo's six scenarios, run once per test binary with `--keep`, for
/// every test that needs a demo run with its fault staged: the acceptance
/// test below judges the demo's own verdicts, and export_jaeger and
/// placement_compare work on copies of the kept runs
/// ([`copy_of_kept_run`]) instead of staging scenarios of their own. A
/// scenario takes a quarter of a minute; staging each once saves the
/// suite about a minute. The caller holds the heavy-test lock.
pub struct KeptDemo {
    /// `SCENARIO/` for each scenario the demo kept (under the target
    /// folder's tmp, removed when the next test binary runs the demo).
    pub dir: PathBuf,
    /// `deepspan demo --format json`'s exit status and report (its
    /// progress went to the test's stderr).
    pub output: Output,
    pub took: Duration,
    /// What the demo left behind that was not there before it ran.
    pub left_behind: Result<(), String>,
}

static KEPT_DEMO: OnceLock<KeptDemo> = OnceLock::new();

/// The kept demo, run by the first caller; see [`KeptDemo`].
pub fn kept_demo() -> &'static KeptDemo {
    KEPT_DEMO.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kept-demo");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("remove the last test run's kept demo");
        }
        std::fs::create_dir_all(&dir).expect("create the kept demo's folder");
        let before = leftovers();
        let started = Instant::now();
        let output = demo()
            .args(["--format", "json", "--keep"])
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("run deepspan demo");
        KeptDemo {
            dir,
            output,
            took: started.elapsed(),
            left_behind: nothing_left(&before),
        }
    })
}

/// A copy, in `into`, of the kept demo's analysed run of `scenario`: a test
/// that analyses or exports it again changes no other test's input.
pub fn copy_of_kept_run(scenario: &str, into: &Path) -> PathBuf {
    let demo = kept_demo();
    let kept = demo.dir.join(scenario);
    assert!(
        kept.join("analysis/requests.json").is_file(),
        "the demo kept no analysed run of {scenario} ({}):\n{}",
        demo.output.status,
        String::from_utf8_lossy(&demo.output.stdout)
    );
    let copy = into.join(scenario);
    check(
        "copy the kept run",
        Command::new("cp")
            .arg("-a")
            .arg(&kept)
            .arg(&copy)
            .output()
            .expect("run cp"),
    );
    copy
}

#[test]
#[ignore = "system: root, tracefs, the demo (cgroups, netns, PostgreSQL)"]
fn every_scenario_is_diagnosed_and_nothing_is_left_behind() {
    if !kernel_or_skip("every_scenario_is_diagnosed_and_nothing_is_left_behind") {
        return;
    }
    let _one = one_at_a_time();
    let demo = kept_demo();
    let out = &demo.output;
    eprintln!("deepspan demo took {:.0} s", demo.took.as_secs_f64());
    if let Err(left) = &demo.left_behind {
        panic!("{left}");
    }
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "demo output is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let scenarios = doc["scenarios"].as_array().expect("scenarios array");
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cpu-cgroup",
            "cpu-hog",
            "lock",
            "db-row-lock",
            "disk",
            "network"
        ]
    );
    let mut failed = Vec::new();
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        for key in ["expected_cause", "found_cause", "top_requests", "ok"] {
            assert!(s.get(key).is_some(), "{name}: no {key} in {s}");
        }
        // The fault shows on the kernel critical path of the requests it hit.
        if s["path_check"]["ok"] != true {
            failed.push(format!(
                "{name}: kernel path: {}",
                s["path_check"]["detail"]
            ));
        }
        if s["diagnosis_available"] == true {
            // Where users feel the fault: the root cause on front's
            // requests, through the requests they waited for.
            let root = &s["root"];
            assert!(root.is_object(), "{name}: no root verdict in {s}");
            eprintln!(
                "{name}: root cause on {}: {} in {} of {} anomalous (proximate {}); {}",
                root["requests_of"],
                root["found_root_cause"],
                root["root_matching"],
                root["anomalous"],
                root["proximate_matching"],
                root["chain"]
            );
            if root["ok"] != true {
                failed.push(format!(
                    "{name}: root cause on {}: expected {}, found {}",
                    root["requests_of"], root["expected_root_cause"], root["found_root_cause"]
                ));
            }
            if s["ok"] != true || s["found_cause"] != s["expected_cause"] {
                failed.push(format!(
                    "{name}: expected {}, found {} ({})",
                    s["expected_cause"], s["found_cause"], s["problems"]
                ));
            }
        } else {
            // Before `deepspan analyze` diagnoses: said plainly, and a failure.
            assert_eq!(s["found_cause"], Value::Null, "{name}");
            assert_eq!(s["ok"], false, "{name}");
            assert!(
                s["problems"][0]
                    .as_str()
                    .unwrap()
                    .starts_with("no diagnosis"),
                "{name}: {s}"
            );
            eprintln!(
                "{name}: no diagnosis yet; kernel path: {}",
                s["path_check"]["detail"]
            );
        }
        let run = Path::new(s["run"].as_str().expect("kept run"));
        assert!(
            run.join("demo/expected.json").is_file()
                && run.join("analysis/requests.json").is_file()
        );
    }
    assert!(
        failed.is_empty(),
        "scenarios not diagnosed as expected:\n{}",
        failed.join("\n")
    );
    let all_diagnosed = scenarios.iter().all(|s| s["diagnosis_available"] == true);
    assert_eq!(
        out.status.success(),
        all_diagnosed,
        "exit status {} vs verdicts",
        out.status
    );
}

/// Starts `deepspan demo --scenario NAME` in its own process group, waits
/// until `fault_active()` (the fault is in place), sends `signal` (to the
/// group when `group`, as a terminal's Ctrl-C does) and checks that the
/// demo stops with 128+signal and removes everything.
fn interrupt_during_fault(name: &str, signal: i32, group: bool, fault_active: impl Fn() -> bool) {
    let _one = one_at_a_time();
    let before = leftovers();
    let mut child = demo()
        .args(["--scenario", name, "--format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .expect("run deepspan demo");
    let pid = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(90);
    while !fault_active() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name}: the demo ended ({status}) before its fault was seen");
        }
        assert!(
            Instant::now() < deadline,
            "{name}: the fault did not show within 90 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(if group { -pid } else { pid }, signal) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            panic!("{name}: the demo did not stop within 60 s of the signal");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        status.code(),
        Some(128 + signal),
        "{name}: exit status {status}"
    );
    assert_nothing_left(&before);
}

#[test]
#[ignore = "system: root, tracefs, the demo (cgroups, netns, PostgreSQL)"]
fn sigterm_during_the_network_fault_removes_namespace_link_and_everything() {
    if !kernel_or_skip("sigterm_during_the_network_fault") {
        return;
    }
    // The qdisc is the fault: a tbf on the far end of the veth.
    interrupt_during_fault("network", libc::SIGTERM, false, || {
        names_in("/run/netns", "deepspan-demo-")
            .iter()
            .filter(|ns| !someone_elses(ns))
            .any(|ns| {
                Command::new("ip")
                    .args(["netns", "exec", ns, "tc", "qdisc", "show"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("tbf"))
            })
    });
}

#[test]
#[ignore = "system: root, tracefs, the demo (cgroups, netns, PostgreSQL)"]
fn ctrl_c_during_the_cgroup_fault_removes_the_cgroup_and_everything() {
    if !kernel_or_skip("ctrl_c_during_the_cgroup_fault") {
        return;
    }
    interrupt_during_fault("cpu-cgroup", libc::SIGINT, true, || {
        names_in("/sys/fs/cgroup/cpu", "deepspan-demo-")
            .iter()
            .filter(|g| !someone_elses(g))
            .any(|g| {
                std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/{g}/tasks"))
                    .is_ok_and(|t| !t.trim().is_empty())
            })
    });
}

#[test]
#[ignore = "system: root, tracefs, the demo (cgroups, netns, PostgreSQL)"]
fn a_driver_killed_with_sigkill_is_cleaned_up_by_the_next_one() {
    if !kernel_or_skip("a_driver_killed_with_sigkill") {
        return;
    }
    let _one = one_at_a_time();
    let before = leftovers();
    let mut child = demo()
        .args(["--scenario", "network", "--format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("run deepspan demo");
    // The driver's pid is in its namespace's name: deepspan-demo-<pid>.
    let deadline = Instant::now() + Duration::from_secs(90);
    let driver: i32 = loop {
        let mine = &names_in("/run/netns", "deepspan-demo-") - &before.netns;
        if let Some(pid) = mine
            .iter()
            .filter_map(|n| n["deepspan-demo-".len()..].parse().ok())
            .find(|&pid| ours(pid))
        {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "no network namespace of the driver within 90 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Once PostgreSQL runs (the services start after it).
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(driver, libc::SIGKILL) };
    let status = child.wait().expect("wait for deepspan demo");
    assert!(
        !status.success(),
        "the demo cannot succeed without its driver"
    );
    let left = leftovers();
    assert!(
        left.netns.len() > before.netns.len() && left.work_dirs.len() > before.work_dirs.len(),
        "a SIGKILLed driver leaves its namespace and work folder: {left:?}"
    );
    let out = Command::new("python3")
        .arg(repo().join("demo/driver.py"))
        .arg("--cleanup")
        .output()
        .expect("run driver.py --cleanup");
    assert!(
        out.status.success(),
        "driver.py --cleanup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The services die with their driver (PR_SET_PDEATHSIG); give them a moment.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !leftovers().processes.is_subset(&before.processes) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_nothing_left(&before);
}

#[test]
#[ignore = "system: root, tracefs, podman, Jaeger, the demo (cgroups, PostgreSQL)"]
fn cpu_hog_in_containers_names_the_encoders_container_and_jaeger_shows_each_threads_container() {
    if !kernel_or_skip("cpu_hog_in_containers") || !crate::common::podman::podman_or_skip() {
        return;
    }
    let _one = one_at_a_time();
    let before = leftovers();
    let keep = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = demo()
        .args([
            "--scenario",
            "cpu-hog",
            "--containers",
            "--format",
            "json",
            "--keep",
        ])
        .arg(keep.path())
        .stderr(Stdio::inherit())
        .output()
        .expect("run deepspan demo");
    assert_nothing_left(&before);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "demo output is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let verdict = &doc["scenarios"][0];
    // The verdict's culprits are expected.json's: an encoder, named by its
    // container's id and name.
    assert!(
        verdict["ok"] == true && verdict["culprits_found"] == true,
        "cpu-hog in containers: {verdict:#}"
    );
    let run = keep.path().join("cpu-hog");
    let expected = crate::common::read_json(&run.join("demo/expected.json"));
    let (pricing, encoders) = (
        &expected["containers"]["pricing"],
        &expected["containers"]["encoders"],
    );
    assert!(
        pricing["id"].is_string() && encoders["id"].is_string() && pricing["id"] != encoders["id"],
        "expected.json's containers: {:#}",
        expected["containers"]
    );
    assert_eq!(
        verdict["expected_culprits"][0]["container_name"], encoders["name"],
        "{verdict:#}"
    );

    // In Jaeger: the slowest request diagnosed with CPU contention names
    // the encoders' container among its culprit attributes, and each of
    // its kernel children on its own thread names pricing's.
    let jaeger = deepspan_jaeger_test::Jaeger::start();
    crate::export_jaeger::export_over_http(&run, &jaeger);
    let request = crate::export_jaeger::diagnosed_request(&run, None);
    let sent = crate::export_jaeger::spans_sent(&run);
    let trace =
        crate::export_jaeger::complete_trace(&jaeger, &sent, request["trace_id"].as_str().unwrap());
    // pricing runs in a PID namespace of its own: its SDK's thread ids are
    // that namespace's, and the request is on a host thread of pricing's.
    let scan = crate::common::read_json(&run.join("processes.json"));
    let pricing_scan = scan
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pricing["pid"])
        .unwrap_or_else(|| panic!("pricing (pid {}) not in processes.json", pricing["pid"]));
    let host_tids: Vec<&Value> = pricing_scan["namespaced_tids"]
        .as_object()
        .map(|m| m.values().collect())
        .unwrap_or_default();
    assert!(
        pricing_scan["pid_ns"].is_u64() && host_tids.contains(&&request["tid"]),
        "request {} on thread {}; pricing's scan: {pricing_scan}",
        request["span_id"],
        request["tid"]
    );
    let (me, path) =
        crate::export_jaeger::from_jaeger(&trace, request["span_id"].as_str().unwrap());
    let tag = deepspan_jaeger_test::tag;
    assert_eq!(tag(me, "deepspan.culprit.container.id"), &encoders["id"]);
    assert_eq!(
        tag(me, "deepspan.culprit.container.name"),
        &encoders["name"]
    );
    let own: Vec<&&Value> = path
        .iter()
        .filter(|c| tag(c, "deepspan.kernel.tid") == &request["tid"])
        .collect();
    assert!(
        !own.is_empty(),
        "no kernel child of {} on its thread {}",
        request["span_id"],
        request["tid"]
    );
    for child in own {
        assert_eq!(
            (
                tag(child, "deepspan.thread.container.id"),
                tag(child, "deepspan.thread.container.name")
            ),
            (&pricing["id"], &pricing["name"]),
            "kernel child {}",
            child["operationName"]
        );
    }
}
