//! Recording against the running kernel. Needs root and tracefs (so each
//! test is marked `#[ignore = "system: …"]` and runs under `make test`):
//! without them each test prints "skipped: no tracefs" and passes, unless
//! DEEPSPAN_REQUIRE_KERNEL is set (as in CI), where that is a failure.
//!
//! Tests that send signals run the recorder in a child process: this test
//! binary re-executed on the `kernel::child_recorder` test, so no extra
//! binary is needed and the signals never reach the test harness.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use crate::common::one_at_a_time;
use deepspan_record::{
    cleanup_stale_instances, owners_dir, record, resolve_events, Error, EventSelection,
    FlightOptions, FlightRecorder, InstanceOwner, Mode, ProcessId, RecordOptions, StaleInstance,
    Tracefs, WindowOutcome,
};
use deepspan_run::{ClockPoint, Manifest};

const CHILD_ENV: &str = "DEEPSPAN_RECORD_TEST_CHILD";
/// Ring size per CPU of the flight-mode child, KiB.
const FLIGHT_KB: u64 = 1024;

fn require_kernel() -> bool {
    std::env::var("DEEPSPAN_REQUIRE_KERNEL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The tracefs and the shared lock ([`one_at_a_time`]), or None (test
/// skipped).
pub(crate) fn kernel() -> Option<(Tracefs, MutexGuard<'static, ()>)> {
    match Tracefs::open() {
        Ok(t) => Some((t, one_at_a_time())),
        Err(e) if require_kernel() => {
            panic!("DEEPSPAN_REQUIRE_KERNEL is set but tracefs is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no tracefs ({e})");
            None
        }
    }
}

fn instances_of(tracefs: &Tracefs, pid: u32) -> Vec<String> {
    let prefix = format!("deepspan-{pid}-");
    std::fs::read_dir(tracefs.root().join("instances"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A flight recorder with the scheduler's switches only, and the sweep
/// that removes this process's instances whatever the test does: the
/// start of the eBPF captures' flight-window tests. Bind both, the sweep
/// first (it then outlives the recorder).
pub(crate) fn switches_flight_recorder(tracefs: &Tracefs) -> (Sweep, FlightRecorder) {
    let sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let options = FlightOptions {
        events: "sched:sched_switch".into(),
        ..FlightOptions::default()
    };
    let flight = FlightRecorder::start(options).expect("start the flight recorder");
    (sweep, flight)
}

/// The flight recorder's window `[start, end]`, written into a new folder:
/// the folder and the window's manifest. Fails the test when no window was
/// written.
pub(crate) fn flight_window(
    flight: &mut FlightRecorder,
    start: u64,
    end: u64,
) -> (tempfile::TempDir, Manifest) {
    let dir = tempfile::tempdir().unwrap();
    let outcome = flight.snapshot(start, end, dir.path()).expect("snapshot");
    assert!(
        matches!(outcome, WindowOutcome::Written { .. }),
        "{outcome:?}"
    );
    let manifest = Manifest::load(dir.path()).expect("manifest");
    (dir, manifest)
}

/// Removes, when dropped, every instance of the given pids, so that a
/// failing test never leaves one behind.
pub(crate) struct Sweep {
    pub(crate) tracefs: Tracefs,
    pub(crate) pids: Vec<u32>,
}

impl Drop for Sweep {
    fn drop(&mut self) {
        for &pid in &self.pids {
            for name in instances_of(&self.tracefs, pid) {
                let dir = self.tracefs.root().join("instances").join(&name);
                let _ = std::fs::write(dir.join("tracing_on"), "0");
                for _ in 0..100 {
                    if std::fs::remove_dir(&dir).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

/// A recorder child process, killed if the test ends early.
struct Recorder {
    child: Child,
    lines: mpsc::Receiver<String>,
    _sweep: Sweep,
}

impl Recorder {
    fn start(tracefs: &Tracefs, mode: &str, out: &Path) -> Recorder {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "kernel::child_recorder",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{mode}:{}", out.display()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the recorder child");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let sweep = Sweep {
            tracefs: tracefs.clone(),
            pids: vec![child.id()],
        };
        Recorder {
            child,
            lines,
            _sweep: sweep,
        }
    }

    /// Waits for a line containing `prefix` from the child (libtest may put
    /// its own "test … " before the first one).
    fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("no '{prefix}' line from the recorder child: {e}"),
            }
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "recorder child did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs only inside a child started by [`Recorder::start`]: records until
/// SIGINT and reports on stdout.
#[test]
fn child_recorder() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (mode, out) = spec.split_once(':').unwrap();
    let mut opts = RecordOptions::new(out);
    if mode == "flight" {
        // Scheduling events only, so that the ring holds seconds of history
        // even on a busy machine and the test's probe is not overwritten.
        opts.mode = Mode::Flight;
        opts.buffer_kb_per_cpu = FLIGHT_KB;
        opts.events = EventSelection::Spec("minimal".into());
    }
    let mut announced = false;
    let summary = record(&opts, &mut |p| {
        if !announced {
            println!("RECORDING");
            announced = true;
        }
        println!("PROGRESS snapshots={}", p.snapshots);
    })
    .expect("record");
    println!(
        "DONE exit_code={:?} snapshots={}",
        summary.exit_code, summary.snapshots
    );
}

/// `trace-cmd report` of a file: (events, stdout). Fails on any complaint.
fn trace_cmd_report(path: &Path) -> (usize, String) {
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
    let lower = stderr.to_lowercase();
    assert!(
        !lower.contains("warn") && !lower.contains("error") && !lower.contains("fail"),
        "trace-cmd report complained about {}: {stderr}",
        path.display()
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let events = stdout
        .lines()
        .filter(|l| l.contains(": ") && l.contains('[') && !l.starts_with("cpus="))
        .count();
    (events, stdout)
}

/// Events in a trace.dat according to deepspan's reader.
fn reader_events(path: &Path) -> (usize, Option<String>) {
    let trace = deepspan_ftrace::TraceDat::open(path).expect("deepspan reads the trace");
    let mut n = 0;
    for record in trace.records().expect("records") {
        record.expect("record decodes");
        n += 1;
    }
    (n, trace.clock().map(str::to_string))
}

fn trace_cmd_available() -> bool {
    Command::new("trace-cmd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() || !o.stdout.is_empty())
}

#[test]
#[ignore = "system: root and tracefs"]
fn records_a_command_and_passes_its_exit_code_through() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let env_file = tmp.path().join("otel-endpoint");
    let mut opts = RecordOptions::new(&run);
    opts.command = [
        "sh",
        "-c",
        "sleep 0.2; ls / >/dev/null; echo \"$OTEL_EXPORTER_OTLP_ENDPOINT\" > \"$0\"; exit 3",
    ]
    .iter()
    .map(Into::into)
    .chain([env_file.clone().into_os_string()])
    .collect();
    let summary = record(&opts, &mut |_| {}).expect("record");

    assert_eq!(summary.exit_code, Some(3));
    assert!(
        instances_of(&tracefs, std::process::id()).is_empty(),
        "instance left behind"
    );
    let trace = run.join("kernel/trace.dat");
    assert_eq!(summary.kernel_trace, trace);
    assert!(trace.is_file());
    let leftovers: Vec<_> = std::fs::read_dir(run.join("kernel"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".raw") || n.ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    let expected_endpoint =
        std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or("http://127.0.0.1:4318".into());
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap().trim(),
        expected_endpoint
    );

    let manifest = Manifest::load(&run).unwrap();
    assert_eq!(manifest.exit_code, Some(3));
    assert_eq!(manifest.kernel_trace.as_deref(), Some("kernel/trace.dat"));
    assert_eq!(manifest.trace_clock, "mono");
    assert_eq!(
        (manifest.otlp.grpc_port, manifest.otlp.http_port),
        (4317, 4318)
    );
    assert_eq!(manifest.command[0], "sh");
    assert!(manifest.clock_samples.len() >= 2);
    assert!(manifest.events.contains(&"sched:sched_switch".to_string()));
    assert_eq!(manifest.per_cpu.len(), manifest.cpus);
    assert!(manifest.start.mono_ns < manifest.end.mono_ns);
    assert!(manifest.start.realtime_ns < manifest.end.realtime_ns);

    // The kernel counted the events it handed out; every one must be in the file.
    let kernel_count: u64 = manifest.per_cpu.iter().map(|c| c.read_events).sum();
    let (reader_count, clock) = reader_events(&trace);
    assert_eq!(clock.as_deref(), Some("mono"));
    assert_eq!(
        reader_count as u64, kernel_count,
        "deepspan reader vs kernel read_events"
    );
    assert!(reader_count > 0);

    // All events lie between the start and end clock samples.
    let t = deepspan_ftrace::TraceDat::open(&trace).unwrap();
    for record in t.records().unwrap() {
        let ev = record.unwrap().to_event(t.schema());
        assert!(
            ev.ts >= manifest.start.mono_ns && ev.ts <= manifest.end.mono_ns,
            "event at {} outside [{}, {}]",
            ev.ts,
            manifest.start.mono_ns,
            manifest.end.mono_ns
        );
    }

    if trace_cmd_available() {
        let (count, text) = trace_cmd_report(&trace);
        assert_eq!(count, reader_count, "trace-cmd report vs deepspan reader");
        assert!(
            text.contains("ls-"),
            "the command's `ls` is not in the trace"
        );
    } else {
        eprintln!("trace-cmd not installed: cross-check with trace-cmd report skipped");
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn pid_filter_follows_the_process_and_its_children() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let target = Kill(
        Command::new("sh")
            .args(["-c", "while :; do sleep 0.05; done"])
            .spawn()
            .unwrap(),
    );
    let pid = target.0.id() as i32;
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut opts = RecordOptions::new(&run);
    opts.pids = vec![pid];
    opts.duration = Some(Duration::from_millis(1500));
    // The full preset: the filter is checked on the system-call events.
    opts.events = "analysis".into();
    record(&opts, &mut |_| {}).expect("record");
    assert_eq!(Manifest::load(&run).unwrap().pids, vec![pid]);

    let trace = deepspan_ftrace::TraceDat::open(&run.join("kernel/trace.dat")).unwrap();
    let mut comms = std::collections::HashMap::new();
    let mut syscall_tids = std::collections::HashSet::new();
    let mut children = std::collections::HashSet::new();
    for record in trace.records().unwrap() {
        let ev = record.unwrap().to_event(trace.schema());
        match ev.kind {
            deepspan_model::EventKind::SchedSwitch(s) => {
                comms.insert(s.prev_tid, s.prev_comm.to_string_lossy());
                comms.insert(s.next_tid, s.next_comm.to_string_lossy());
            }
            deepspan_model::EventKind::SchedProcessFork {
                parent_tid,
                child_tid,
                ..
            } if parent_tid == pid => {
                children.insert(child_tid);
            }
            deepspan_model::EventKind::SysEnter { .. } => {
                syscall_tids.insert(ev.tid);
            }
            _ => {}
        }
    }
    assert!(
        !children.is_empty() && syscall_tids.contains(&pid),
        "the traced shell's forks and syscalls are missing"
    );
    // Only the shell and its children make system calls in the trace. A
    // child is `sh` from its fork until it execs `sleep`; one forked before
    // the recording began has no fork event, and the switch events its comm
    // is read from may be among those the kernel lost.
    for tid in syscall_tids {
        let comm = comms.get(&tid).map(String::as_str).unwrap_or("?");
        assert!(
            tid == pid || children.contains(&tid) || comm == "sleep" || comm == "sh",
            "syscalls of thread {tid} ({comm}) in a --pid recording"
        );
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn unknown_event_names_suggest_close_matches_and_leave_nothing() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let err = resolve_events("sched:sched_swich", &tracefs).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("unknown kernel event 'sched:sched_swich'"),
        "{text}"
    );
    assert!(text.contains("sched:sched_switch"), "{text}");

    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut opts = RecordOptions::new(&run);
    opts.events = EventSelection::Spec("sched_switch,irq:no_such_irq_event".into());
    let err = record(&opts, &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::UnknownEvent { .. }), "{err}");
    assert!(!run.exists(), "a failed recording left its run folder");
    assert!(instances_of(&tracefs, std::process::id()).is_empty());
}

#[test]
#[ignore = "system: root and tracefs"]
fn refuses_a_non_empty_output_folder() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs,
        pids: vec![std::process::id()],
    };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("precious"), "keep me").unwrap();
    let err = record(&RecordOptions::new(tmp.path()), &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::OutputNotEmpty(_)), "{err}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("precious")).unwrap(),
        "keep me"
    );
}

#[test]
#[ignore = "system: root and tracefs"]
fn sigint_stops_a_recording_cleanly() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut recorder = Recorder::start(&tracefs, "standard", &run);
    recorder.expect_line("RECORDING", Duration::from_secs(60));
    assert_eq!(
        instances_of(&tracefs, recorder.child.id()).len(),
        1,
        "the recorder works in one instance"
    );
    recorder.signal(libc::SIGINT);
    let status = recorder.wait(Duration::from_secs(60));
    assert!(status.success(), "recorder child failed: {status}");
    recorder.expect_line("DONE exit_code=None", Duration::from_secs(5));
    assert!(
        instances_of(&tracefs, recorder.child.id()).is_empty(),
        "instance left behind"
    );

    let trace = run.join("kernel/trace.dat");
    let manifest = Manifest::load(&run).unwrap();
    let (reader_count, _) = reader_events(&trace);
    assert_eq!(
        reader_count as u64,
        manifest.per_cpu.iter().map(|c| c.read_events).sum::<u64>()
    );
    if trace_cmd_available() {
        let (count, _) = trace_cmd_report(&trace);
        assert_eq!(count, reader_count);
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn flight_mode_writes_nothing_until_sigusr2_then_the_buffer() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut recorder = Recorder::start(&tracefs, "flight", &run);
    recorder.expect_line("RECORDING", Duration::from_secs(60));
    // Let the ring see a few seconds of system activity.
    std::thread::sleep(Duration::from_secs(2));
    // Only the journal (what recovery needs after a crash) is on disk.
    let written: Vec<String> = std::fs::read_dir(run.join("kernel"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        written.iter().all(|name| name == "journal"),
        "flight mode wrote kernel data before any snapshot: {written:?}"
    );

    // Something recognisable just before the request.
    std::thread::Builder::new()
        .name("flightprobe".into())
        .spawn(|| {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(2));
            }
        })
        .unwrap()
        .join()
        .unwrap();
    recorder.signal(libc::SIGUSR2);
    recorder.expect_line("PROGRESS snapshots=1", Duration::from_secs(60));
    let snapshot = run.join("kernel/snapshots/001.dat");
    assert!(snapshot.is_file());
    let (snap_events, clock) = reader_events(&snapshot);
    assert_eq!(clock.as_deref(), Some("mono"));
    assert!(snap_events > 0);
    // "The last buffer's worth": bounded by the ring size, with slack for
    // pages written while it was read.
    let cpus = std::fs::read_dir(tracefs.root().join("per_cpu"))
        .unwrap()
        .count() as u64;
    let snap_size = std::fs::metadata(&snapshot).unwrap().len();
    let header = 8 << 20; // kallsyms and formats
    assert!(
        snap_size <= header + cpus * 2 * FLIGHT_KB * 1024,
        "snapshot of {snap_size} bytes is more than the ring"
    );
    if trace_cmd_available() {
        let (count, text) = trace_cmd_report(&snapshot);
        assert_eq!(count, snap_events);
        assert!(
            text.contains("flightprobe"),
            "the snapshot misses events from just before SIGUSR2"
        );
    }

    recorder.signal(libc::SIGINT);
    let status = recorder.wait(Duration::from_secs(60));
    assert!(status.success(), "recorder child failed: {status}");
    recorder.expect_line("DONE exit_code=None snapshots=1", Duration::from_secs(5));
    assert!(
        instances_of(&tracefs, recorder.child.id()).is_empty(),
        "instance left behind"
    );
    let manifest = Manifest::load(&run).unwrap();
    assert_eq!(manifest.mode, "flight");
    assert_eq!(manifest.snapshots.len(), 1);
    assert_eq!(manifest.snapshots[0].file, "kernel/snapshots/001.dat");
    assert_eq!(manifest.kernel_trace.as_deref(), Some("kernel/trace.dat"));
    let (final_events, _) = reader_events(&run.join("kernel/trace.dat"));
    if trace_cmd_available() {
        let (count, _) = trace_cmd_report(&run.join("kernel/trace.dat"));
        assert_eq!(count, final_events);
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn cleanup_removes_only_instances_of_dead_recorders() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let instances = tracefs.root().join("instances");
    let stale = instances.join("deepspan-999999999-x");
    let live = instances.join(format!("deepspan-{}-cleanup-test", std::process::id()));
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![999_999_999, std::process::id()],
    };
    std::fs::create_dir(&stale).expect("create a fake stale instance");
    std::fs::create_dir(&live).expect("create a fake live instance");

    let done = cleanup_stale_instances(false).expect("cleanup");
    let removed: Vec<&str> = done
        .iter()
        .filter_map(|d| match d {
            StaleInstance::Removed { instance, .. } => Some(instance.as_str()),
            StaleInstance::Kept { .. } => None,
        })
        .collect();
    assert!(removed.contains(&"deepspan-999999999-x"), "{done:?}");
    assert!(
        !removed
            .iter()
            .any(|n| n.starts_with(&format!("deepspan-{}-", std::process::id()))),
        "{done:?}"
    );
    assert!(!stale.exists());
    assert!(live.exists());
}

/// The instance of a dead recorder stays while a process it traced lives
/// (its owner file says which), and goes once that process is gone.
#[test]
#[ignore = "system: root and tracefs"]
fn cleanup_keeps_an_instance_while_a_process_it_traced_runs() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let name = "deepspan-999999998-held";
    let dir = tracefs.root().join("instances").join(name);
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![999_999_998],
    };
    std::fs::create_dir(&dir).expect("create a fake stale instance");
    let mut traced = Command::new("sleep").arg("60").spawn().unwrap();
    let owner = InstanceOwner {
        instance: name.into(),
        run_dir: PathBuf::from("/nonexistent-run"),
        recorder: ProcessId {
            pid: 999_999_998,
            start_ticks: None,
        },
        traced: vec![ProcessId::of(traced.id() as i32)],
    };
    std::fs::create_dir_all(owners_dir()).unwrap();
    let owner_file = owners_dir().join(format!("{name}.json"));
    std::fs::write(&owner_file, serde_json::to_vec(&owner).unwrap()).unwrap();

    let done = cleanup_stale_instances(false).expect("cleanup");
    let kept = done.iter().find_map(|d| match d {
        StaleInstance::Kept {
            instance, held_by, ..
        } if instance == name => Some(held_by.clone()),
        _ => None,
    });
    assert_eq!(
        kept,
        Some(vec![(traced.id() as i32, "sleep".to_string())]),
        "{done:?}"
    );
    assert!(dir.exists());

    traced.kill().unwrap();
    traced.wait().unwrap();
    let done = cleanup_stale_instances(false).expect("cleanup");
    assert!(
        done.iter()
            .any(|d| matches!(d, StaleInstance::Removed { instance, .. } if instance == name)),
        "{done:?}"
    );
    assert!(!dir.exists());
    assert!(
        !owner_file.exists(),
        "the owner file goes with its instance"
    );
}

/// Fills a tiny filesystem: the recording must stop with a disk-full error
/// naming the file, remove its instance and keep what it wrote.
#[test]
#[ignore = "system: root (mounts a tmpfs) and tracefs"]
fn disk_full_stops_cleanly_and_keeps_what_was_written() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        assert!(
            !require_kernel(),
            "cannot mount a small tmpfs to test disk-full handling"
        );
        eprintln!("skipped: cannot mount a tmpfs");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());

    let mut opts = RecordOptions::new(mnt.join("run"));
    opts.events = EventSelection::Spec("raw_syscalls:*,sched:*".into());
    opts.duration = Some(Duration::from_secs(30));
    // Over half a million tiny reads: far more trace than 1 MiB. `timeout`
    // bounds it, as the recorder leaves a command running on error.
    opts.command = [
        "timeout",
        "10",
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=1",
        "count=300000",
    ]
    .iter()
    .map(Into::into)
    .collect();
    let err = record(&opts, &mut |_| {}).unwrap_err();
    assert!(err.is_disk_full(), "expected a disk-full error, got: {err}");
    let text = err.to_string();
    assert!(
        text.contains(&mnt.display().to_string()),
        "error does not name the file: {text}"
    );
    assert!(
        instances_of(&tracefs, std::process::id()).is_empty(),
        "instance left behind"
    );
    let kept: u64 = std::fs::read_dir(mnt.join("run/kernel"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".raw"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(kept > 0, "nothing of what was captured was kept");
}

/// The agent's flight recorder: a window in the past is written as a run
/// folder that both readers take, holding what ran in it; a second window
/// over the same time still finds those events (drained pages stay in
/// memory); a window from before the recorder started is refused.
#[test]
#[ignore = "system: root and tracefs"]
fn flight_recorder_writes_past_windows_and_refuses_windows_it_no_longer_holds() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let before_start = ClockPoint::default();
    // Process events only: a busy machine (a build beside the test) cannot
    // produce enough of them to push the window out of the history, which
    // the scheduler's events could.
    let options = FlightOptions {
        buffer_kb_per_cpu: 2048,
        history_kb_per_cpu: 2048,
        events: "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit".into(),
        ..FlightOptions::default()
    };
    let mut flight = FlightRecorder::start(options).expect("start the flight recorder");
    let instance = flight.instance_name();
    assert!(instances_of(&tracefs, std::process::id()).contains(&instance));

    let start = mono_ns();
    let status = Command::new("sleep")
        .arg("0.05")
        .status()
        .expect("run sleep");
    assert!(status.success());
    let end = mono_ns();

    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let outcome = flight.snapshot(start, end, &first).expect("snapshot");
    let WindowOutcome::Written { bytes, pages } = outcome else {
        panic!("window refused: {outcome:?}")
    };
    assert!(bytes > 0 && pages > 0);
    let manifest = Manifest::load(&first).expect("the snapshot has a manifest");
    assert_eq!(manifest.mode, "flight");
    assert_eq!((manifest.start.mono_ns, manifest.end.mono_ns), (start, end));
    let trace = first.join("kernel/trace.dat");
    let (events, clock) = reader_events(&trace);
    assert!(events > 0);
    assert_eq!(clock.as_deref(), Some("mono"));
    if trace_cmd_available() {
        let (_, text) = trace_cmd_report(&trace);
        assert!(
            text.contains("sleep-"),
            "the window holds what the command did"
        );
    }

    // A later snapshot over the same time: the kernel buffer was drained,
    // the pages must come from the recorder's history.
    let second = dir.path().join("second");
    let outcome = flight
        .snapshot(start, end, &second)
        .expect("second snapshot");
    assert!(
        matches!(outcome, WindowOutcome::Written { .. }),
        "{outcome:?}"
    );
    if trace_cmd_available() {
        let (_, text) = trace_cmd_report(&second.join("kernel/trace.dat"));
        assert!(text.contains("sleep-"));
    }

    let outcome = flight
        .snapshot(before_start.mono_ns, end, &dir.path().join("third"))
        .expect("third");
    assert!(
        matches!(outcome, WindowOutcome::LeftBuffer { complete_since_ns } if complete_since_ns > 0),
        "{outcome:?}"
    );
    assert!(!dir.path().join("third/manifest.json").exists());

    flight.stop().expect("stop");
    assert!(
        !instances_of(&tracefs, std::process::id()).contains(&instance),
        "instance removed"
    );
}

/// A flight recorder window holds the throttled switch-outs of its time
/// (read by eBPF, kept in memory): a busy loop in a CPU cgroup with a 10 %
/// quota is switched out by the quota in (about) every period.
#[test]
#[ignore = "system: root, tracefs, BPF and a CPU cgroup"]
fn flight_recorder_windows_hold_the_throttled_switch_outs() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let group = Path::new("/sys/fs/cgroup/cpu")
        .join(format!("deepspan-test-flight-{}", std::process::id()));
    std::fs::create_dir(&group).expect("create a CPU cgroup");
    let _remove = RemoveCgroup(group.clone());
    std::fs::write(group.join("cpu.cfs_quota_us"), "10000").expect("set the quota");
    let options = FlightOptions {
        events: "sched:sched_switch".into(),
        ..FlightOptions::default()
    };
    let mut flight = FlightRecorder::start(options).expect("start the flight recorder");
    let start = mono_ns();
    let tasks = group.join("tasks");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}; exec timeout 0.5 sh -c 'while :; do :; done'",
            tasks.display()
        ))
        .status()
        .expect("run a busy loop in the cgroup");
    assert!(!status.success(), "timeout ends the loop");
    let end = mono_ns();
    let (dir, manifest) = flight_window(&mut flight, start, end);
    let throttle = manifest
        .cfs_throttle
        .unwrap_or_else(|| panic!("no throttling recorded: {:?}", manifest.warnings));
    let switches =
        deepspan_record::read_throttled_switches(&dir.path().join(throttle.file)).expect("read");
    // 0.5 s at 10 ms per 100 ms period. A period's overrun (up to a tick)
    // is taken from the next one, so not every period throttles.
    assert!(switches.len() >= 2, "{switches:?}");
    assert_eq!(switches.len() as u64, throttle.switches);
    assert!(switches.iter().all(|s| s.mono_ns <= end));
    flight.stop().expect("stop");
}

/// Removes a test's CPU cgroup, its threads moved back to the root group.
struct RemoveCgroup(PathBuf);

impl Drop for RemoveCgroup {
    fn drop(&mut self) {
        if let Ok(tasks) = std::fs::read_to_string(self.0.join("tasks")) {
            for tid in tasks.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/cpu/tasks", tid);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
