//! A recorder killed with SIGKILL leaves a run that `deepspan record
//! --recover` finishes, and an instance that `--cleanup` removes once the
//! command it traced is gone. Kill points are drawn from fixed seeds; what is
//! checked holds wherever the kill lands.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

// One recorder at a time (the shared lock): `--cleanup` looks at every
// instance, so a test's cleanup would see another test's recorder.
use crate::common::{
    deepspan, instances_of, kernel_or_skip, one_at_a_time, poll, recording_started, workload,
};

/// Runs `deepspan record --cleanup` and checks that it removed the dead
/// recorder's instance (other instances on the machine are not ours to judge).
fn cleanup_removes(recorder_pid: u32, context: &str) {
    let out = deepspan().args(["record", "--cleanup"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{context}: {stderr}"
    );
    assert!(
        stderr.contains(&format!("dead recorder (pid {recorder_pid})")),
        "{context}: {stderr}"
    );
    assert!(
        instances_of(recorder_pid).is_empty(),
        "{context}: --cleanup left the instance: {stderr}"
    );
}

/// splitmix64: kill delays from a seed, no dependency needed.
fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Starts `deepspan record` on a busy command and waits until it traces.
fn start_recorder(run: &Path, mode: &str) -> Child {
    let mut child = deepspan()
        .args([
            "record",
            "--no-otlp",
            "--buffer-mb",
            "2",
            "--mode",
            mode,
            "-o",
        ])
        .arg(run)
        .arg("--")
        // Bounded: 20 million round trips take far longer than any kill delay
        // here, and the test kills it at the end. The pause between rounds
        // keeps pages filling every few milliseconds while the trace stays
        // a few MB: without it, 2.5 s made 100 MB, and trace-cmd took 7 s
        // to read it back.
        .arg(workload())
        .args(["pingpong", "20000000", "200"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start deepspan record");
    poll(Duration::from_secs(60), Duration::from_millis(20), || {
        if recording_started(child.id()) {
            return Some(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the recorder exited before tracing started: {status}");
        }
        None
    })
    .expect("the recorder did not start tracing within 60 s");
    child
}

/// The traced command (a child of the recorder, orphaned by its death), once
/// the recorder has started it and written it into its journal.
fn command_pid(run: &Path) -> i32 {
    let mut state: Option<serde_json::Value> = None;
    poll(Duration::from_secs(30), Duration::from_millis(20), || {
        state = std::fs::read(run.join("kernel/journal/recording.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        state
            .as_ref()
            .and_then(|s| s["owner"]["traced"][0]["pid"].as_i64())
    })
    .map(|pid| pid as i32)
    .unwrap_or_else(|| panic!("the journal never named the command: {state:?}"))
}

/// Waits until `pid` has exited (gone, or a zombie nobody reaped yet: it
/// traces nothing any more, and cleanup counts it as gone too).
fn wait_gone(pid: i32) {
    poll(Duration::from_secs(30), Duration::from_millis(10), || {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().chars().next())
            })
            .flatten();
        matches!(state, None | Some('Z') | Some('X')).then_some(())
    })
    .unwrap_or_else(|| panic!("process {pid} did not exit after SIGKILL"));
}

/// Records `mode` into `run`, and SIGKILLs the recorder `after` tracing
/// started. Returns the dead recorder's pid and its orphaned command.
fn killed_recording(run: &Path, mode: &str, after: Duration) -> (u32, KillPid) {
    let mut recorder = start_recorder(run, mode);
    let command = KillPid(command_pid(run));
    std::thread::sleep(after);
    recorder.kill().expect("SIGKILL the recorder");
    recorder.wait().unwrap();
    (recorder.id(), command)
}

/// Kills the orphaned command at the end, whatever happened.
struct KillPid(i32);
impl Drop for KillPid {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGKILL) };
        wait_gone(self.0);
    }
}

fn trace_cmd_events(path: &Path) -> usize {
    let out = Command::new("trace-cmd")
        .arg("report")
        .arg(path)
        .output()
        .expect("run trace-cmd report");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "trace-cmd report {} failed: {stderr}",
        path.display()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter(|l| l.contains(": ") && l.contains('[') && !l.starts_with("cpus="))
        .count()
}

fn deepspan_events(path: &Path) -> usize {
    let trace = deepspan_ftrace::TraceDat::open(path).expect("deepspan reads the recovered trace");
    let mut n = 0;
    for record in trace.records().expect("records") {
        record.expect("every record decodes");
        n += 1;
    }
    n
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_killed_recorder_leaves_a_run_that_recovers_whole() {
    let test = "a_killed_recorder_leaves_a_run_that_recovers_whole";
    if !kernel_or_skip(test) {
        return;
    }
    let _one = one_at_a_time();
    // Seed 0 kills at once, before the capture threads may have written a
    // page; the others anywhere in the first 2.5 s (610 to 2465 ms).
    for seed in [0u64, 1, 2, 3, 4] {
        let delay = Duration::from_millis(if seed == 0 { 0 } else { splitmix(seed) % 2500 });
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let (recorder_pid, command) = killed_recording(&run, "standard", delay);
        let context = format!(
            "seed {seed}, killed {} ms after tracing started",
            delay.as_millis()
        );

        assert!(
            !run.join("manifest.json").exists(),
            "{context}: a killed recorder wrote no manifest"
        );
        let page_size = 4096u64;
        let raw_sizes: Vec<u64> = (0..)
            .map(|cpu| run.join(format!("kernel/cpu{cpu}.raw")))
            .take_while(|p| p.exists())
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert!(!raw_sizes.is_empty(), "{context}: no page files");
        let samples_before =
            std::fs::read_to_string(run.join("kernel/journal/clock_samples")).unwrap();

        let out = deepspan()
            .args(["record", "--recover"])
            .arg(&run)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{context}: recovery failed: {stderr}");
        assert!(stderr.contains("recovered"), "{context}: {stderr}");

        let trace = run.join("kernel/trace.dat");
        let dat = deepspan_ftrace::TraceDat::open(&trace).unwrap();
        for (cpu, &size) in raw_sizes.iter().enumerate() {
            // Every whole page is kept; only a page the kill cut short is lost.
            assert_eq!(
                dat.cpu_data_bytes_of(cpu as u32),
                size / page_size * page_size,
                "{context}: CPU {cpu} had {size} bytes of pages"
            );
        }
        let events = deepspan_events(&trace);
        let whole_pages: u64 = raw_sizes.iter().map(|s| s / page_size).sum();
        assert!(
            events > 0 || whole_pages == 0,
            "{context}: {whole_pages} pages gave no event"
        );
        assert_eq!(
            events,
            trace_cmd_events(&trace),
            "{context}: deepspan and trace-cmd disagree on the recovered file"
        );

        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["kernel_trace"], "kernel/trace.dat");
        let samples = manifest["clock_samples"].as_array().unwrap();
        // The start sample, then every one the journal had.
        assert_eq!(
            samples.len(),
            1 + samples_before.lines().count(),
            "{context}: {samples:?}"
        );
        assert!(manifest["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("recovered")));
        assert!(
            !run.join("kernel/journal").exists(),
            "{context}: the journal is consumed"
        );
        assert!(
            !run.join("kernel/cpu0.raw").exists(),
            "{context}: the page files are consumed"
        );

        // The run now reads like any other.
        let decoded = deepspan().arg("decode").arg(&run).output().unwrap();
        assert!(
            decoded.status.success(),
            "{context}: {}",
            String::from_utf8_lossy(&decoded.stderr)
        );

        // The instance stays while the command it traced runs, and says why.
        assert_eq!(
            instances_of(recorder_pid).len(),
            1,
            "{context}: the dead recorder's instance"
        );
        let held = deepspan().args(["record", "--cleanup"]).output().unwrap();
        let held_err = String::from_utf8_lossy(&held.stderr);
        assert_eq!(held.status.code(), Some(3), "{context}: {held_err}");
        assert!(
            held_err.contains(&format!("pid {}", command.0)),
            "{context}: {held_err}"
        );
        assert_eq!(
            instances_of(recorder_pid).len(),
            1,
            "{context}: kept while its command runs"
        );
        drop(command);
        cleanup_removes(recorder_pid, &context);
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn analyze_reads_a_killed_recorders_run_with_a_note() {
    let test = "analyze_reads_a_killed_recorders_run_with_a_note";
    if !kernel_or_skip(test) {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (recorder_pid, command) = killed_recording(&run, "standard", Duration::from_millis(500));
    drop(command);

    let out = deepspan().arg("analyze").arg(&run).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("never finished; recovering it first"),
        "{stderr}"
    );
    assert!(run.join("manifest.json").is_file());
    assert!(run.join("analysis").is_dir());

    // A run that was finished is not "recovered" again.
    let again = deepspan()
        .args(["record", "--recover"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("recorded to the end"));
    cleanup_removes(recorder_pid, test);
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_killed_flight_recorder_keeps_its_ring_buffer() {
    let test = "a_killed_flight_recorder_keeps_its_ring_buffer";
    if !kernel_or_skip(test) {
        return;
    }
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (recorder_pid, command) = killed_recording(&run, "flight", Duration::from_millis(800));

    // While the command runs, no `--cleanup` (of another test run on the
    // machine) takes the instance, whose ring buffer recovery reads.
    let out = deepspan()
        .args(["record", "--recover"])
        .arg(&run)
        .output()
        .unwrap();
    drop(command);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("ring buffer was read from the dead recorder's instance"),
        "{stderr}"
    );
    let trace = run.join("kernel/trace.dat");
    let events = deepspan_events(&trace);
    assert!(events > 0, "the flight recorder's ring held events");
    assert_eq!(events, trace_cmd_events(&trace));
    cleanup_removes(recorder_pid, test);
}
