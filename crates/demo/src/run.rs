//! Running one scenario: `deepspan record -o RUN -- python3 demo/driver.py
//! SCENARIO --out RUN/demo`, then `deepspan analyze RUN`, then [`check`].
//!
//! The record and analyze steps are this same binary run as child
//! processes, so each keeps its own signal handling and clean-up.
//! SIGINT/SIGTERM received meanwhile are passed on to the child (the
//! recorder forwards them to the driver, which removes everything it made)
//! and the scenario ends with [`Interrupted`] once the child has exited.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use deepspan_run::{demo, Run};

use crate::check::{check, Expected, Verdict};

/// The scenarios, in the order `all` runs them.
pub const SCENARIOS: &[&str] = &[
    "cpu-cgroup",
    "cpu-hog",
    "lock",
    "db-row-lock",
    "disk",
    "network",
];

/// How long one scenario's recording may take (the driver's own timeline is
/// about 15 s) before it is stopped as hung.
const RECORD_TIMEOUT: Duration = Duration::from_secs(240);
/// How long its analysis may take.
const ANALYZE_TIMEOUT: Duration = Duration::from_secs(300);

/// Set when the run was stopped by SIGINT/SIGTERM.
#[derive(Debug)]
pub struct Interrupted(pub i32);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "interrupted by signal {}", self.0)
    }
}

impl std::error::Error for Interrupted {}

pub struct RunOptions {
    /// The deepspan binary (record and analyze run as its children).
    pub deepspan: PathBuf,
    /// The demo folder (driver.py, shop/, harness/).
    pub demo_dir: PathBuf,
    /// The python interpreter.
    pub python: String,
    /// `deepspan record --events`.
    pub events: String,
    /// Runs pricing, and the cpu-hog scenario's encoders, in podman
    /// containers (`driver.py --containers`).
    pub containers: bool,
}

/// A finished scenario: the verdict and where its run is.
pub struct ScenarioRun {
    pub verdict: Verdict,
    pub run_dir: PathBuf,
    pub elapsed: Duration,
}

/// Finds demo/: $DEEPSPAN_DEMO_DIR, else the `demo` folder of the
/// repository the executable was built in (target/…/deepspan → repo), else
/// ./demo.
pub fn find_demo_dir(exe: &Path) -> Result<PathBuf> {
    let is_demo = |p: &Path| p.join("driver.py").is_file();
    if let Some(dir) = std::env::var_os("DEEPSPAN_DEMO_DIR") {
        let dir = PathBuf::from(dir);
        if is_demo(&dir) {
            return Ok(dir);
        }
        bail!("DEEPSPAN_DEMO_DIR={} has no driver.py", dir.display());
    }
    let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    let mut candidates: Vec<PathBuf> = exe.ancestors().skip(1).map(|a| a.join("demo")).collect();
    // A CARGO_TARGET_DIR outside the repository: the source tree it was built from.
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../demo"));
    candidates.push(PathBuf::from("demo"));
    candidates
        .into_iter()
        .find(|p| is_demo(p))
        .map(|p| p.canonicalize().unwrap_or(p))
        .ok_or_else(|| {
            anyhow!(
                "cannot find the demo folder (demo/driver.py) near {} or in the current folder; \
                 set DEEPSPAN_DEMO_DIR",
                exe.display()
            )
        })
}

/// Signal flags while scenarios run: SIGINT/SIGTERM are noted, not fatal.
pub struct Signals {
    got: Arc<AtomicI32>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    pub fn install() -> Result<Signals> {
        let got = Arc::new(AtomicI32::new(0));
        let mut ids = Vec::new();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let flag = Arc::new(AtomicBool::new(false));
            let got = got.clone();
            // SAFETY: the handler only stores into atomics.
            let id = unsafe {
                signal_hook::low_level::register(sig, move || {
                    flag.store(true, Ordering::Relaxed);
                    let _ = got.compare_exchange(0, sig, Ordering::Relaxed, Ordering::Relaxed);
                })
            }
            .context("install signal handler")?;
            ids.push(id);
        }
        Ok(Signals { got, ids })
    }

    /// The first signal received, if any.
    pub fn received(&self) -> Option<i32> {
        match self.got.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Runs scenario `name` into `run_dir` (must not exist). `progress` gets
/// short status lines (the driver's `progress:` lines, then the analysis).
pub fn run_scenario(
    opts: &RunOptions,
    name: &str,
    run_dir: &Path,
    signals: &Signals,
    progress: &mut dyn FnMut(&str),
) -> Result<ScenarioRun> {
    let started = Instant::now();
    let parent = run_dir.parent().unwrap_or(Path::new("."));
    let log_path = parent.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;

    progress("recording");
    let mut record = Command::new(&opts.deepspan);
    record
        .arg("record")
        .arg("-o")
        .arg(run_dir)
        .arg("--events")
        .arg(&opts.events)
        .args(["--otlp-grpc-port", "0", "--otlp-http-port", "0", "--"])
        .arg(&opts.python)
        .arg(opts.demo_dir.join("driver.py"))
        .arg(name)
        .arg("--out")
        .arg(Run::new(run_dir).demo_dir())
        .args(opts.containers.then_some("--containers"))
        // The run's own receiver, whatever the caller's environment says.
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?);
    let mut child = record
        .spawn()
        .with_context(|| format!("run {} record", opts.deepspan.display()))?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut log_copy = log.try_clone()?;
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            use std::io::Write;
            let _ = writeln!(log_copy, "{line}");
            if let Some(p) = line.strip_prefix("progress: ") {
                let _ = tx.send(p.to_string());
            }
        }
    });
    let status = wait_forwarding(&mut child, signals, RECORD_TIMEOUT, &mut |_| {
        while let Ok(p) = rx.try_recv() {
            progress(&p);
        }
    })?;
    let _ = reader.join();
    if let Some(sig) = signals.received() {
        return Err(Interrupted(sig).into());
    }
    let Some(status) = status else {
        bail!(
            "scenario {name}: still running after {} s, stopped; the end of {}:\n{}",
            RECORD_TIMEOUT.as_secs(),
            log_path.display(),
            tail(&log_path, 25)
        );
    };
    if !status.success() {
        bail!(
            "scenario {name}: recording the driver failed ({status}); the end of {}:\n{}",
            log_path.display(),
            tail(&log_path, 25)
        );
    }

    progress("analysing the run");
    let mut analyze = Command::new(&opts.deepspan);
    analyze
        .arg("analyze")
        .arg(run_dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(
            Run::new(run_dir).demo_file(demo::ANALYZE_LOG),
        )?)
        .stderr(log.try_clone()?);
    let mut child = analyze.spawn().context("run deepspan analyze")?;
    let status = wait_forwarding(&mut child, signals, ANALYZE_TIMEOUT, &mut |_| {})?;
    if let Some(sig) = signals.received() {
        return Err(Interrupted(sig).into());
    }
    let Some(status) = status else {
        bail!(
            "scenario {name}: deepspan analyze still running after {} s, stopped",
            ANALYZE_TIMEOUT.as_secs()
        );
    };
    if !status.success() {
        bail!(
            "scenario {name}: deepspan analyze failed ({status}):\n{}",
            tail(&log_path, 25)
        );
    }
    let verdict = check_run(run_dir)?;
    Ok(ScenarioRun {
        verdict,
        run_dir: run_dir.to_path_buf(),
        elapsed: started.elapsed(),
    })
}

/// Checks an analysed run folder (RUN/demo/expected.json against
/// RUN/analysis/requests.json).
pub fn check_run(run_dir: &Path) -> Result<Verdict> {
    let expected_path = Run::new(run_dir).demo_file(demo::EXPECTED);
    let expected: Expected = serde_json::from_slice(
        &std::fs::read(&expected_path)
            .with_context(|| format!("read {}", expected_path.display()))?,
    )
    .with_context(|| format!("{} is not a scenario expectation", expected_path.display()))?;
    let requests = deepspan_store::json::read_requests_json(run_dir)?;
    Ok(check(&expected, &requests))
}

/// Waits for `child`, passing SIGINT/SIGTERM on to it (once) and calling
/// `tick` every 100 ms. After `timeout` the child gets SIGTERM (it cleans up
/// as on a signal) and, once it has exited, `None` is returned.
fn wait_forwarding(
    child: &mut Child,
    signals: &Signals,
    timeout: Duration,
    tick: &mut dyn FnMut(()),
) -> Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut forwarded = false;
    let mut timed_out = false;
    loop {
        if let Some(status) = child.try_wait()? {
            tick(());
            return Ok((!timed_out).then_some(status));
        }
        let sig = signals.received().or_else(|| {
            (Instant::now() > deadline).then(|| {
                timed_out = true;
                libc::SIGTERM
            })
        });
        if let (Some(sig), false) = (sig, forwarded) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as i32, sig) };
            forwarded = true;
        }
        if timed_out && Instant::now() > deadline + Duration::from_secs(60) {
            // It did not stop on SIGTERM either.
            let _ = child.kill();
        }
        tick(());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
