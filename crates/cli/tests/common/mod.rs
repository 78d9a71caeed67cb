//! Shared test plumbing: the binaries under test and the kernel-test gate.
#![allow(dead_code)]

pub mod ui;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub const TRACEFS: &str = "/sys/kernel/tracing";

/// The `deepspan` binary built for this test run.
pub fn deepspan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deepspan"))
}

/// The workload binary from the sibling crate, built on demand with the same
/// profile (cargo offers no stable way to depend on another crate's binary).
pub fn workload() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_deepspan"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = dir.join("deepspan-workload");
    if !path.exists() {
        let release = dir.ends_with("release");
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build.args(["build", "-p", "deepspan-workloads"]);
        if release {
            build.arg("--release");
        }
        let status = build
            .status()
            .expect("run cargo to build deepspan-workloads");
        assert!(status.success(), "building deepspan-workloads failed");
    }
    path
}

/// Whether kernel tests can run. They may skip only when tracefs is
/// unavailable and DEEPSPAN_REQUIRE_KERNEL is unset; CI sets it.
pub fn kernel_or_skip(test: &str) -> bool {
    let required = std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_some();
    let is_root = unsafe { libc::geteuid() } == 0;
    let tracefs = Path::new(TRACEFS).join("instances").is_dir()
        || (is_root && Path::new("/sys/kernel/tracing").is_dir());
    if is_root && tracefs {
        return true;
    }
    assert!(
        !required,
        "{test}: DEEPSPAN_REQUIRE_KERNEL is set but kernel tracing is unavailable (root: {is_root}, tracefs: {tracefs})"
    );
    eprintln!("{test}: skipped: kernel tracing unavailable (root: {is_root}, tracefs: {tracefs})");
    false
}

/// Names of deepspan tracefs instances that currently exist.
pub fn deepspan_instances() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(Path::new(TRACEFS).join("instances")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("deepspan-"))
        .collect()
}

/// Instances owned by a given recorder process (named `deepspan-<pid>-…`).
pub fn instances_of(pid: u32) -> Vec<String> {
    let prefix = format!("deepspan-{pid}-");
    deepspan_instances()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Kills the wrapped process when dropped, so a failing test never leaves a
/// recorder (and its tracefs instance) running behind it.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SIGINT first: the recorder then removes its instance itself.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            for _ in 0..100 {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// True once the recorder `pid` has switched tracing on in its instance.
///
/// A new instance starts with tracing_on = 1 and no event enabled; the
/// recorder turns it off, enables its events, and turns it on again at the
/// end of its set-up. So tracing_on alone would say "started" during the
/// set-up, and a test that then ran its workload (slow set-up under load)
/// found none of its events in the trace. Enabled events tell the two apart.
pub fn recording_started(pid: u32) -> bool {
    instances_of(pid).iter().any(|name| {
        let dir = Path::new(TRACEFS).join("instances").join(name);
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        read("tracing_on").trim() == "1" && !matches!(read("events/enable").trim(), "0" | "")
    })
}

/// Runs `cmd`, and every process it starts, at nice -19, ahead of whatever
/// else keeps this machine busy (a parallel build, another CI job). The
/// cases that stage a fault (a lock, a CPU quota, a disk flood, CPU hogs
/// among themselves) then show that fault, not the preemption by unrelated
/// load that the analysis would rightly report instead: one CI run with
/// both cores busy had an O_DIRECT read diagnosed `cpu_contention`, 60 %
/// of it preempted by other processes. The staged processes keep their
/// relative priorities, so contention among them is still contention.
pub fn ahead_of_other_load(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setpriority is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setpriority(libc::PRIO_PROCESS, 0, -19) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// `out`, after checking that the command it came from succeeded (its
/// output in the failure message).
pub fn check(what: &str, out: Output) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A CPU cgroup (v1, CFS quota) of one test, removed on every exit path, a
/// panic included: `/sys/fs/cgroup/cpu/deepspan-test-<name>-<pid>`.
pub struct CpuQuota(PathBuf);

impl CpuQuota {
    pub fn create(name: &str, quota_us: u64, period_us: u64) -> CpuQuota {
        let root = Path::new("/sys/fs/cgroup/cpu");
        assert!(
            root.join("cpu.cfs_quota_us").is_file(),
            "this test needs the v1 cpu controller with CFS quotas at {}",
            root.display()
        );
        let dir = root.join(format!("deepspan-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("create the test cgroup");
        let group = CpuQuota(dir);
        std::fs::write(group.0.join("cpu.cfs_period_us"), period_us.to_string())
            .expect("set cpu.cfs_period_us");
        std::fs::write(group.0.join("cpu.cfs_quota_us"), quota_us.to_string())
            .expect("set cpu.cfs_quota_us");
        // A group competes for the CPU by its weight, not by its tasks'
        // nice values (`ahead_of_other_load` does not reach into it): the
        // largest weight keeps a build beside the test from taking the
        // group's unthrottled time, so the test sees its quota, not that
        // load (a CI run beside two builds had a throttled Go service
        // diagnosed `cpu_contention`, 244 ms contended for 123 ms throttled).
        std::fs::write(group.0.join("cpu.shares"), "262144").expect("set cpu.shares");
        group
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Moves every thread of `pid` in (threads it starts later follow).
    pub fn confine(&self, pid: i64) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .expect("move the process into the cgroup");
    }

    /// Periods the group was throttled in, from the kernel's own count.
    pub fn throttled_periods(&self) -> u64 {
        let stat = std::fs::read_to_string(self.0.join("cpu.stat")).expect("cpu.stat");
        stat.lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|n| n.trim().parse().ok())
            .expect("nr_throttled in cpu.stat")
    }
}

impl Drop for CpuQuota {
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
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove the test cgroup {}", self.0.display());
    }
}
