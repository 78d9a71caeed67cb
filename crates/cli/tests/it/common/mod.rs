//! Shared test plumbing: the binaries under test, the kernel-test gate,
//! the one lock of the heavy kernel tests, paths and polling.
#![allow(dead_code)]

pub mod podman;
pub mod ui;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// The repository's root (this crate is `crates/cli`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `rel` in the public test data next to the repository
/// (`../shared/testdata`, e.g. `kernel/ctf`, `spans/otlp/…`).
pub fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata")
        .join(rel)
}

/// A JSON file, read and parsed, or a panic naming it.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The one lock of this binary's heavy kernel tests; hold it for the whole
/// test. Each of them stages load or a fault (CPU hogs, a CPU quota, a disk
/// flood, a JVM, the demo's faults), or records the whole machine and
/// judges timing, so two at once would each be the other's noise; they also
/// share the demo's names and the Java SDK's Maven build, and one's `record
/// --cleanup` would see another's recorder. The test binary runs tests on
/// several threads; this keeps these one at a time. A test that panicked
/// while holding it poisons nothing here.
///
/// When it is released, the guard prints (past the test harness's capture)
/// how long the test waited for it and held it: the heavy tests run one
/// after another, so their held times add up to the binary's wall time,
/// and the suite's time is read from these lines.
pub fn one_at_a_time() -> HeavyTest {
    let asked = Instant::now();
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    HeavyTest {
        waited: asked.elapsed(),
        held_since: Instant::now(),
        _guard: guard,
    }
}

/// Holds the heavy-test lock; see [`one_at_a_time`].
pub struct HeavyTest {
    waited: Duration,
    held_since: Instant,
    _guard: MutexGuard<'static, ()>,
}

impl Drop for HeavyTest {
    fn drop(&mut self) {
        use std::io::Write;
        let thread = std::thread::current();
        // Written to the process's stderr, not through eprintln!, which
        // the harness captures and shows only for failed tests.
        let _ = writeln!(
            std::io::stderr(),
            "heavy test {}: held the lock {:.1} s (waited {:.1} s)",
            thread.name().unwrap_or("?"),
            self.held_since.elapsed().as_secs_f64(),
            self.waited.as_secs_f64()
        );
    }
}

/// This process's CLOCK_MONOTONIC in ns: the clock the recorder traces on
/// (`trace_clock` mono), Java's System.nanoTime and Python's
/// time.monotonic_ns, so an application's readings compare with the trace's.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec given.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The span ids a request's queue (its `queue` in requests.json) waited
/// behind, over all its cause groups.
pub fn queued_behind(queue: &serde_json::Value) -> Vec<&str> {
    queue["cause_groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["blocked_by_requests"].as_array().into_iter().flatten())
        .filter_map(serde_json::Value::as_str)
        .collect()
}

/// Calls `attempt` every `every` until it gives a value; `None` once
/// `timeout` has passed without one (the caller says what never came).
pub fn poll<T>(
    timeout: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = attempt() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits (polling every 50 ms) until `done`, failing after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    poll(timeout, Duration::from_millis(50), || done().then_some(()))
        .unwrap_or_else(|| panic!("timed out waiting for {what}"));
}

/// Waits for `child` to exit (polling every `every`); panics with
/// `too_long` if it runs over `limit`.
pub fn wait_exit(
    child: &mut Child,
    limit: Duration,
    every: Duration,
    too_long: &str,
) -> ExitStatus {
    poll(limit, every, || {
        child.try_wait().expect("wait for the child")
    })
    .unwrap_or_else(|| panic!("{too_long}"))
}

/// Runs `cmd`; its stdout and stderr, after checking that it succeeded.
pub fn run_ok(cmd: &mut Command) -> (String, String) {
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{cmd:?} failed: {stderr}");
    (stdout, stderr)
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

/// Runs `cmd`, and every process it starts, ahead of whatever else keeps
/// this machine busy (a parallel build, another CI job, busy loops). The
/// cases that stage a fault (a lock, a CPU quota, a disk flood, CPU hogs
/// among themselves) then show that fault, not the preemption by unrelated
/// load that the analysis would rightly report instead. The staged
/// processes keep their relative priorities, so contention among them is
/// still contention.
///
/// Two levers, because nice values alone do not reach across sessions:
/// with autogroup scheduling (on here) each session's processes compete as
/// one group, so a nice -19 test lost half of each CPU to two busy loops
/// started in another session (a busy CI run had an O_DIRECT read
/// `cpu_contention`, 47 % preempted by the loop, and a `cpuhog` case
/// naming the loop first). So the command joins [`ahead_group`], a CPU
/// cgroup of the largest weight (tasks in a cgroup other than the root are
/// out of autogroup), and runs at nice -19 within it, as it does where no
/// such cgroup can be made.
pub fn ahead_of_other_load(cmd: &mut Command) -> &mut Command {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let procs = ahead_group().map(|f| f.as_raw_fd());
    // SAFETY: setpriority and write are async-signal-safe; the fd stays
    // open for the life of the process (a static), and only the child is
    // touched: writing "0" to cgroup.procs moves the writing process.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = procs {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::setpriority(libc::PRIO_PROCESS, 0, -19) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Prefix of the cgroups of [`ahead_group`], followed by the test
/// process's pid.
const AHEAD_GROUP_PREFIX: &str = "deepspan-test-ahead-";

/// The `cgroup.procs` file of this test process's CPU cgroup (v1) of the
/// largest weight, made on first use and removed when the process exits
/// (an `atexit` handler: libtest ends with `process::exit`); a group left
/// by a killed test process is removed by the next one. None where no
/// such cgroup can be made (no v1 cpu controller, not root).
fn ahead_group() -> Option<&'static std::fs::File> {
    static GROUP: std::sync::OnceLock<Option<(PathBuf, std::fs::File)>> =
        std::sync::OnceLock::new();
    extern "C" fn remove_group() {
        if let Some(Some((dir, _))) = GROUP.get() {
            // Fails while a task is left in it (an orphan): the next test
            // process removes it then.
            let _ = std::fs::remove_dir(dir);
        }
    }
    GROUP
        .get_or_init(|| {
            let root = Path::new("/sys/fs/cgroup/cpu");
            for entry in std::fs::read_dir(root).ok()?.flatten() {
                let name = entry.file_name();
                let pid = name.to_str()?.strip_prefix(AHEAD_GROUP_PREFIX);
                if pid.is_some_and(|p| !Path::new("/proc").join(p).exists()) {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
            let dir = root.join(format!("{AHEAD_GROUP_PREFIX}{}", std::process::id()));
            std::fs::create_dir(&dir).ok()?;
            // SAFETY: registers a plain function, run once at exit.
            unsafe { libc::atexit(remove_group) };
            std::fs::write(dir.join("cpu.shares"), "262144").ok()?;
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .ok()?;
            Some((dir, procs))
        })
        .as_ref()
        .map(|(_, procs)| procs)
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
        // nice values: the largest weight, as `ahead_group`'s, keeps a
        // build beside the test from taking the group's unthrottled time,
        // so the test sees its quota, not that load.
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
        // Every process still in it goes back to the root group, through
        // `cgroup.procs`: that moves all of a process's threads and holds
        // off its new ones meanwhile, where moving the thread ids one by
        // one leaves behind a thread started in between (a JVM starts
        // them all the time).
        for _ in 0..50 {
            if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", pid);
                }
            }
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove the test cgroup {}", self.0.display());
    }
}

/// Runs `cmd`; its stdout, after checking that it succeeded.
pub fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Java SDK of this checkout (sdk/java).
pub fn sdk_java() -> PathBuf {
    repo().join("sdk/java")
}

/// `mvn package` in `dir`, what `make java-sdk` does.
pub fn maven_package(dir: &Path) {
    check(
        &format!("mvn package in {} (make java-sdk)", dir.display()),
        Command::new("mvn")
            .args(["-B", "-q", "package", "-DskipTests"])
            .current_dir(dir)
            .output()
            .expect("run mvn (Maven, scripts/setup.sh test)"),
    );
}

/// deepspan's extension jar and the stock OpenTelemetry Java agent jar,
/// built by Maven when missing.
pub fn java_agent_jars() -> (PathBuf, PathBuf) {
    let target = sdk_java().join("target");
    let extension = target.join("deepspan-otel-extension.jar");
    let agent = target.join("agent/opentelemetry-javaagent.jar");
    if !extension.is_file() || !agent.is_file() {
        maven_package(&sdk_java());
    }
    (extension, agent)
}
