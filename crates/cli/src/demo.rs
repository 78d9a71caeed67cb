//! `deepspan demo`: argument parsing and the 80-column diagnosis table over
//! `deepspan_demo` (which runs and checks the scenarios).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use deepspan_analysis::CulpritKind;
use deepspan_demo::{
    find_demo_dir, run_scenario, Interrupted, RunOptions, Signals, Verdict, SCENARIOS,
};
use deepspan_model::human;
use deepspan_store::json::CulpritDoc;
use serde_json::Value;

use crate::progress;

#[derive(Args)]
#[command(
    after_help = "Scenarios (each injects one real fault into the demo shop):
  cpu-cgroup   pricing in a CPU cgroup with a 1% quota        -> cpu_throttled
  cpu-hog      CPU-bound processes pinned to pricing's CPU    -> cpu_contention
  lock         a request holds media's index lock             -> lock_contention
  db-row-lock  a transaction holds a PostgreSQL row lock      -> blocked_by_request
  disk         a backup process floods the disk               -> disk
  network      media behind a rate-limited veth (tc tbf)      -> network

Needs root (kernel tracing, cgroups, network namespaces), PostgreSQL and the
Python packages of demo/requirements.txt (`make demo` installs them)."
)]
pub struct DemoArgs {
    /// A scenario name, or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Keep the runs in DIR (DIR/SCENARIO, for `deepspan report` or the UI);
    /// by default they are deleted.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Python interpreter with the demo's packages.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Check the runs kept in DIR by an earlier `--keep DIR` (DIR/SCENARIO,
    /// as `deepspan analyze` left them) without recording again: to judge
    /// a new analysis on the same recordings.
    #[arg(long, value_name = "DIR", conflicts_with = "keep")]
    check: Option<PathBuf>,
    /// Run the shop with stock OpenTelemetry only (no deepspan_otel): every
    /// request is placed on its thread from the kernel trace alone
    /// (`sync: inferred`).
    #[arg(long)]
    no_sdk: bool,
    /// The kernel events each scenario records (`deepspan record
    /// --events`): a preset (`lean`, `analysis`) or a list.
    #[arg(long, default_value = "lean")]
    events: String,
    /// Run pricing, and the cpu-hog scenario's encoders, in podman
    /// containers of their own (own PID namespace, the host's network), as
    /// on a container host: culprits are then named by container. Needs
    /// podman and runc.
    #[arg(long)]
    containers: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Tells the demo shop's services not to install deepspan_otel.
const NO_SDK_ENV: &str = "DEEPSPAN_DEMO_NO_SDK";

pub fn run(args: DemoArgs) -> Result<ExitCode> {
    let names: Vec<&str> = if args.scenario == "all" {
        SCENARIOS.to_vec()
    } else if let Some(n) = SCENARIOS.iter().find(|n| **n == args.scenario) {
        vec![*n]
    } else {
        bail!(
            "unknown scenario {:?}; one of: all, {}",
            args.scenario,
            SCENARIOS.join(", ")
        );
    };
    if let Some(dir) = &args.check {
        return check_kept(dir, &names, args.format);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("deepspan demo needs root: it traces the kernel and makes cgroups and network namespaces");
    }
    if args.no_sdk {
        // Inherited by the recorder, the driver and the shop's services
        // (demo/shop/telemetry.py reads it); set before any thread starts.
        std::env::set_var(NO_SDK_ENV, "1");
    } else {
        std::env::remove_var(NO_SDK_ENV);
    }
    let exe = std::env::current_exe().context("locate the deepspan executable")?;
    let demo_dir = find_demo_dir(&exe)?;
    check_python(&args.python, &demo_dir)?;
    if args.containers {
        check_podman()?;
    }
    let (root, temporary) = match &args.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            for n in &names {
                let run = dir.join(n);
                if run.exists() {
                    bail!(
                        "{} exists already: --keep needs a folder without the scenarios' runs",
                        run.display()
                    );
                }
            }
            (dir.canonicalize()?, false)
        }
        None => {
            // On a real disk (/var/tmp): the disk scenario needs one.
            let dir = PathBuf::from(format!(
                "/var/tmp/deepspan-demo-runs-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            (dir, true)
        }
    };
    let opts = RunOptions {
        deepspan: exe,
        demo_dir,
        python: args.python.clone(),
        events: args.events.clone(),
        containers: args.containers,
    };
    let signals = Signals::install()?;
    let text = args.format == Format::Text;
    let started = Instant::now();
    if text {
        println!(
            "deepspan demo: {} scenario{}, each a recording of the shop with one fault",
            names.len(),
            if names.len() == 1 { "" } else { "s" }
        );
        println!();
        println!(
            "{:<12} {:<19} {:<19} {:>9}  result",
            "scenario", "expected", "found", "anomalous"
        );
    }
    let mut verdicts: Vec<(Verdict, Option<PathBuf>)> = Vec::new();
    let mut failure = None;
    for (i, name) in names.iter().enumerate() {
        let bar = progress::spinner(&format!("[{}/{}] {name}: starting", i + 1, names.len()));
        let plain = !std::io::stderr().is_terminal();
        let mut show = |p: &str| {
            let msg = format!("[{}/{}] {name}: {p}", i + 1, names.len());
            if plain {
                eprintln!("{msg}");
            }
            bar.set_message(msg);
            bar.tick();
        };
        let result = run_scenario(&opts, name, &root.join(name), &signals, &mut show);
        bar.finish_and_clear();
        match result {
            Ok(run) => {
                if text {
                    print_verdict(&run.verdict, run.elapsed);
                }
                verdicts.push((run.verdict, (!temporary).then_some(run.run_dir)));
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    let ok = verdicts.iter().filter(|v| v.0.ok).count();
    match args.format {
        Format::Json => {
            let scenarios: Vec<Value> = verdicts
                .iter()
                .map(|(v, run)| {
                    let mut j = serde_json::to_value(v).expect("verdicts serialize");
                    j["run"] = run
                        .as_ref()
                        .map_or(Value::Null, |p| p.display().to_string().into());
                    j
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "scenarios": scenarios }))?
            );
        }
        Format::Text => {
            println!();
            println!(
                "{ok} of {} scenario{} diagnosed as expected in {}",
                verdicts.len(),
                if verdicts.len() == 1 { "" } else { "s" },
                minutes(started.elapsed())
            );
            if let Some(dir) = args.keep.as_ref().filter(|_| !verdicts.is_empty()) {
                println!(
                    "Runs kept in {}: deepspan report {}/SCENARIO --request ID",
                    dir.display(),
                    dir.display()
                );
            }
        }
    }
    if let Some(e) = failure {
        if let Some(Interrupted(sig)) = e.downcast_ref::<Interrupted>() {
            eprintln!(
                "deepspan demo: interrupted; the scenario's processes and resources were removed"
            );
            return Ok(ExitCode::from(128 + *sig as u8));
        }
        return Err(e);
    }
    Ok(if ok == verdicts.len() && ok == names.len() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--check DIR`: the verdicts of kept runs (those of `names` that are
/// there).
fn check_kept(dir: &std::path::Path, names: &[&str], format: Format) -> Result<ExitCode> {
    let mut verdicts: Vec<(Verdict, PathBuf)> = Vec::new();
    for name in names {
        let run = dir.join(name);
        if deepspan_run::Run::new(&run)
            .demo_file(deepspan_run::demo::EXPECTED)
            .is_file()
        {
            verdicts.push((deepspan_demo::check_run(&run)?, run));
        }
    }
    if verdicts.is_empty() {
        bail!(
            "{} has no kept scenario runs (DIR/SCENARIO/demo/expected.json)",
            dir.display()
        );
    }
    match format {
        Format::Json => {
            let scenarios: Vec<Value> = verdicts
                .iter()
                .map(|(v, run)| {
                    let mut j = serde_json::to_value(v).expect("verdicts serialize");
                    j["run"] = run.display().to_string().into();
                    j
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "scenarios": scenarios }))?
            );
        }
        Format::Text => {
            println!(
                "{:<12} {:<19} {:<19} {:>9}  result",
                "scenario", "expected", "found", "anomalous"
            );
            for (v, _) in &verdicts {
                print_verdict(v, Duration::ZERO);
            }
        }
    }
    Ok(if verdicts.iter().all(|v| v.0.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Fails early, with what to do, when python3 lacks the demo's packages.
fn check_python(python: &str, demo_dir: &std::path::Path) -> Result<()> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import psycopg2, requests, opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http, \
             opentelemetry.instrumentation.wsgi, opentelemetry.instrumentation.requests, \
             opentelemetry.instrumentation.psycopg2",
        ])
        .output()
        .with_context(|| format!("run {python}"))?;
    if !out.status.success() {
        bail!(
            "{python} lacks the demo's Python packages ({}): `scripts/setup.sh demo` (or `make demo`) \
             installs them, see {}/requirements.txt",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("import failed").trim(),
            demo_dir.display()
        );
    }
    Ok(())
}

/// `--containers` runs podman with runc (crun refuses this kind of VM's
/// hybrid cgroup layout): both must be installed.
fn check_podman() -> Result<()> {
    for program in ["podman", "runc"] {
        let found = std::process::Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            bail!("--containers needs podman and runc, and `{program} --version` does not run: apt-get install podman runc");
        }
    }
    Ok(())
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// One table row and the lines under it (each within 80 columns).
fn print_verdict(v: &Verdict, elapsed: Duration) {
    let found = match &v.found_cause {
        Some(c) => c.clone(),
        None if !v.diagnosis_available => "no diagnosis".into(),
        None => "-".into(),
    };
    let anomalous = if v.diagnosis_available {
        format!("{} of {}", v.anomalous, v.targets)
    } else {
        "-".into()
    };
    println!(
        "{:<12} {:<19} {:<19} {:>9}  {} ({})",
        v.name,
        v.expected_cause,
        found,
        anomalous,
        if v.ok { "ok" } else { "FAIL" },
        minutes(elapsed)
    );
    if let Some(r) = v.top_requests.first() {
        let what = match (&r.headline, &r.path_top) {
            (Some(h), _) => h.clone(),
            (None, Some(p)) => format!("{p} {:.0}%", r.path_top_share.unwrap_or(0.0) * 100.0),
            (None, None) => String::new(),
        };
        println!(
            "{}",
            cut(
                &format!(
                    "  {} [{}] {}: {what}",
                    human::duration(r.duration_ns),
                    r.service,
                    r.operation
                ),
                80
            )
        );
        let culprits: Vec<String> = r.culprits.iter().map(culprit_label).collect();
        if !culprits.is_empty() {
            println!(
                "{}",
                cut(&format!("    culprits: {}", culprits.join(", ")), 80)
            );
        }
    }
    println!(
        "{}",
        cut(
            // The verdict first: the detail may be cut at 80 columns.
            &format!(
                "  kernel path {}: {}",
                if v.path_check.ok {
                    "shows it"
                } else {
                    "does NOT show it"
                },
                v.path_check.detail
            ),
            80
        )
    );
    if let Some(r) = v.root.as_ref().filter(|r| r.anomalous == 0) {
        println!(
            "  root cause on {}: not felt (none of its {} requests in the window anomalous)",
            r.requests_of, r.requests
        );
    } else if let Some(r) = &v.root {
        // Where the fault is felt: the root cause against the proximate.
        println!(
            "{}",
            cut(
                &format!(
                    "  root cause on {} {}: {} in {} of {} anomalous (proximate: {})",
                    r.requests_of,
                    if r.ok { "ok" } else { "FAIL" },
                    r.found_root_cause.as_deref().unwrap_or("-"),
                    r.root_matching,
                    r.anomalous,
                    r.proximate_matching
                ),
                80
            )
        );
        if let Some(chain) = &r.chain {
            println!("{}", cut(&format!("    {chain}"), 80));
        }
    }
    if !v.ok {
        for p in &v.problems {
            println!("{}", cut(&format!("  ! {p}"), 80));
        }
    }
}

fn culprit_label(c: &CulpritDoc) -> String {
    let s = |v: &Option<String>| v.as_deref().unwrap_or("?").to_string();
    // A negative id (none is written) shows as `?`, as it always has.
    let id = |v: Option<i32>| {
        v.and_then(|v| u64::try_from(v).ok())
            .map_or("?".into(), |v| v.to_string())
    };
    let who = match c.kind {
        CulpritKind::Process => format!("{} (pid {})", s(&c.comm), id(c.pid)),
        CulpritKind::Thread => format!("{} (tid {})", s(&c.comm), id(c.tid)),
        CulpritKind::Request => format!("request {}", s(&c.span_id)),
        CulpritKind::Span => format!("[{}] {}", s(&c.service), s(&c.operation)),
        other => format!("{} {}", other.name(), c.name.as_deref().unwrap_or("")),
    };
    let container = c.container().map(|c| format!(" in {}", c.label()));
    format!(
        "{who}{} {}",
        container.unwrap_or_default(),
        human::duration(c.ns)
    )
}
