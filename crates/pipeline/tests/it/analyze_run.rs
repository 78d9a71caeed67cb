//! `analyze_run` on a real recording: the requests it returns are those
//! `RUN/analysis/requests.json` holds, in the same order with the same
//! diagnoses, and its progress calls pair up; what it keeps in memory for
//! the agent's export is what the files hold. Also its errors on folders
//! that are no run.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use deepspan_export::{export_kept, export_run, ExportOptions};
use deepspan_pipeline::{
    analyze_run, AnalyzeOptions, Error, NoProgress, PlacementMode, Progress, Step,
};
use deepspan_run::analysis::{CRITICAL_PATH, SYSCALLS};
use deepspan_run::Run;
use deepspan_store::json::read_requests_json;
use deepspan_store::kept::KeepColumns;
use deepspan_store::rows::{read_table, TableRow};
use deepspan_store::tables::{CriticalPathRow, SyscallRow};
use serde_json::Value;

const TRACEFS: &str = "/sys/kernel/tracing";

/// Kernel tests may skip only when tracefs is unavailable and
/// DEEPSPAN_REQUIRE_KERNEL is unset (as in the cli tests' common module).
fn kernel_or_skip(test: &str) -> bool {
    let required = std::env::var_os("DEEPSPAN_REQUIRE_KERNEL").is_some();
    let is_root = unsafe { libc::geteuid() } == 0;
    let tracefs = Path::new(TRACEFS).join("instances").is_dir();
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

/// A binary of this workspace built with the test's profile: the test
/// executable is `target/PROFILE/deps/NAME-HASH`; built when missing.
fn workspace_binary(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target/PROFILE");
    let path = dir.join(name);
    if !path.exists() {
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build.args(["build", "-p", package]);
        if dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo");
        assert!(status.success(), "building {package} failed");
    }
    path
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Hot-loop iterations per half of a request: tens of milliseconds.
const ROUNDS: &str = "20000000";
/// Requests recorded (three: enough for a baseline of their operation).
const REQUESTS: usize = 3;

/// Records `deepspan-workload hot` three times in one run (each writes its
/// request as an OTLP span with deepspan's thread and monotonic times) and
/// imports the spans.
fn record_three_requests(dir: &Path) -> PathBuf {
    let deepspan = workspace_binary("deepspan", "deepspan");
    let workload = workspace_binary("deepspan-workload", "deepspan-workloads");
    let run = dir.join("run");
    let spans: Vec<PathBuf> = (0..REQUESTS)
        .map(|i| dir.join(format!("span-{i}.json")))
        .collect();
    let script: Vec<String> = spans
        .iter()
        .map(|s| format!("\"$0\" hot {ROUNDS} '{}'", s.display()))
        .collect();
    // The full preset: the system-call table then has the requests'
    // calls that never sleep too, which the tests compare.
    ok(Command::new(&deepspan)
        .arg("record")
        .args(["--events", "analysis"])
        .arg("-o")
        .arg(&run)
        .args(["--no-otlp", "--", "sh", "-c"])
        .arg(script.join(" && "))
        .arg(&workload));
    let mut import = Command::new(&deepspan);
    import.arg("import").arg("-o").arg(&run);
    for s in &spans {
        import.arg("--otlp").arg(s);
    }
    ok(&mut import);
    run
}

/// Every call, as `(what, step)`, to check they pair up.
#[derive(Default)]
struct Calls(RefCell<Vec<(&'static str, Option<Step>, u64)>>);

impl Progress for Calls {
    fn begin(&self, step: Step, total: Option<u64>) {
        self.0
            .borrow_mut()
            .push(("begin", Some(step), total.unwrap_or(0)));
    }
    fn advance(&self, step: Step, done: u64) {
        self.0.borrow_mut().push(("advance", Some(step), done));
    }
    fn total(&self, step: Step, total: u64) {
        self.0.borrow_mut().push(("total", Some(step), total));
    }
    fn end(&self, step: Step) {
        self.0.borrow_mut().push(("end", Some(step), 0));
    }
    fn phase_done(&self, _phase: &'static str, _took: Duration) {
        self.0.borrow_mut().push(("phase", None, 0));
    }
}

#[test]
#[ignore = "system: root and tracefs"]
fn the_outcome_is_what_requests_json_says() {
    if !kernel_or_skip("the_outcome_is_what_requests_json_says") {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let run = record_three_requests(dir.path());
    let calls = Calls::default();
    let outcome = analyze_run(&run, &AnalyzeOptions::default(), &calls).expect("analysis");

    assert_eq!(outcome.analysis_dir, run.join("analysis"));
    let doc: Value = serde_json::from_slice(
        &std::fs::read(run.join("analysis/requests.json")).expect("requests.json"),
    )
    .expect("JSON");
    let written = doc["requests"].as_array().expect("requests");
    assert_eq!(outcome.requests.len(), REQUESTS);
    assert_eq!(written.len(), outcome.requests.len());
    assert_eq!(outcome.stats.requests, REQUESTS);
    assert_eq!(
        outcome.placements.exact, REQUESTS,
        "{:?}",
        outcome.placements
    );
    for (r, w) in outcome.requests.iter().zip(written) {
        let span = outcome.span_of(r);
        assert_eq!(w["trace_id"], format!("{:032x}", span.trace_id));
        assert_eq!(w["span_id"], format!("{:016x}", span.span_id));
        assert_eq!(w["operation"], span.operation.as_str());
        assert_eq!(w["start_ns"], r.path.start);
        assert_eq!(w["end_ns"], r.path.end);
        assert_eq!(w["sync"], r.path.sync.name());
        assert_eq!(w["anomalous"], r.anomalous);
        assert_eq!(w["baseline_ns"], serde_json::json!(r.baseline_ns));
        // Through text, as the file was: serde_json's parser may round a
        // float's last digit, the same way on both sides.
        let expected = r
            .diagnosis
            .as_ref()
            .map(|d| deepspan_store::diagnosis::DiagnosisDoc::new(d, &outcome.spans));
        let expected: Value =
            serde_json::from_str(&serde_json::to_string(&expected).unwrap()).unwrap();
        assert_eq!(w["diagnosis"], expected);
        assert!(std::ptr::eq(
            outcome.request(span.trace_id, span.span_id).unwrap(),
            r
        ));
    }
    // Slowest first, and all three of one operation: a baseline.
    assert!(outcome
        .requests
        .windows(2)
        .all(|w| w[0].path.duration() >= w[1].path.duration()));
    assert!(outcome.requests.iter().all(|r| r.baseline_ns.is_some()));
    assert!(outcome.requests.iter().any(|r| r.diagnosis.is_some()));
    assert_eq!(doc["notes"], serde_json::json!(outcome.notes));
    assert_eq!(doc["trace"]["events"], outcome.stats.events);
    assert!(outcome.stats.events > 0 && outcome.stats.threads > 0);

    // Each step begun is ended, in order, with advances in between.
    let calls = calls.0.into_inner();
    let steps: Vec<(&str, Option<Step>)> = calls
        .iter()
        .filter(|c| matches!(c.0, "begin" | "end"))
        .map(|c| (c.0, c.1))
        .collect();
    assert_eq!(
        steps,
        [
            ("begin", Some(Step::DecodeTraceDat)),
            ("end", Some(Step::DecodeTraceDat)),
            ("begin", Some(Step::CriticalPaths)),
            ("end", Some(Step::CriticalPaths)),
        ]
    );
    // Decoding advances in bytes, never back, up to its total at most.
    let decode_total = calls[0].2;
    let decoded: Vec<u64> = calls
        .iter()
        .filter(|c| c.0 == "advance" && c.1 == Some(Step::DecodeTraceDat))
        .map(|c| c.2)
        .collect();
    assert!(!decoded.is_empty(), "no decoding progress");
    assert!(decoded.windows(2).all(|w| w[0] <= w[1]), "{decoded:?}");
    let last = *decoded.last().unwrap();
    assert!(last > 0 && last <= decode_total, "{last} of {decode_total}");
    assert!(calls
        .iter()
        .any(|c| c == &("total", Some(Step::CriticalPaths), REQUESTS as u64)));
    let phases = calls.iter().filter(|c| c.0 == "phase").count();
    assert_eq!(phases, outcome.phases.len());

    // What the live agent writes for a snapshot: the trace, the manifest
    // and the span files only (no process scan, no saved tgids). The
    // requests placed by the SDK come out the same.
    let minimal = dir.path().join("minimal");
    std::fs::create_dir_all(minimal.join("kernel")).unwrap();
    std::fs::copy(run.join("manifest.json"), minimal.join("manifest.json")).unwrap();
    std::fs::copy(
        run.join("kernel/trace.dat"),
        minimal.join("kernel/trace.dat"),
    )
    .unwrap();
    std::fs::create_dir(minimal.join("spans")).unwrap();
    for f in std::fs::read_dir(run.join("spans")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), minimal.join("spans").join(f.file_name())).unwrap();
    }
    let small = analyze_run(&minimal, &AnalyzeOptions::default(), &NoProgress).expect("analysis");
    let key = |o: &deepspan_pipeline::AnalysisOutcome| -> Vec<(u64, u64, u64, &'static str, bool)> {
        o.requests
            .iter()
            .map(|r| {
                let cause = r.diagnosis.as_ref().map_or("", |d| d.cause.name());
                (
                    o.span_of(r).span_id,
                    r.path.start,
                    r.path.end,
                    cause,
                    r.anomalous,
                )
            })
            .collect()
    };
    assert_eq!(key(&small), key(&outcome));
    assert!(minimal.join("analysis/requests.json").is_file());
    the_kept_results_are_the_files(&minimal);

    // Analysed again, without the SDK fields: every request placed from
    // the kernel trace, and the folder rewritten whole.
    let options = AnalyzeOptions {
        placement: PlacementMode::Inferred,
        ..AnalyzeOptions::default()
    };
    let inferred = analyze_run(&run, &options, &NoProgress).expect("analysis");
    assert_eq!(inferred.requests.len(), REQUESTS);
    assert_eq!(inferred.placements.exact, 0);
    let doc: Value =
        serde_json::from_slice(&std::fs::read(run.join("analysis/requests.json")).unwrap())
            .unwrap();
    let syncs: Vec<&str> = doc["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["sync"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = inferred
        .requests
        .iter()
        .map(|r| r.path.sync.name())
        .collect();
    assert_eq!(syncs, expected);
    assert!(syncs.iter().all(|s| *s != "exact"), "{syncs:?}");
}

/// What the agent keeps in memory of a snapshot's analysis reads as the
/// files written beside it, and exports the same spans.
fn the_kept_results_are_the_files(run: &Path) {
    let every_column = KeepColumns {
        critical_path: <CriticalPathRow as TableRow>::COLUMNS,
        syscalls: <SyscallRow as TableRow>::COLUMNS,
    };
    let options = AnalyzeOptions {
        keep: Some(every_column),
        ..AnalyzeOptions::default()
    };
    let outcome = analyze_run(run, &options, &NoProgress).expect("analysis");
    let kept = outcome.kept.as_ref().expect("kept in memory");
    let tables = Run::new(run).analysis_dir();
    assert_eq!(
        kept.requests,
        read_requests_json(run).expect("requests.json").requests
    );
    let mut kept_rows = Vec::new();
    kept.critical_path
        .for_each_row(|r: CriticalPathRow| kept_rows.push(r))
        .unwrap();
    assert!(!kept_rows.is_empty());
    let path_rows: Vec<CriticalPathRow> =
        read_table(&tables.join(CRITICAL_PATH), |_| true).expect("table");
    assert_eq!(kept_rows, path_rows);
    let mut kept_calls = Vec::new();
    kept.syscalls
        .for_each_row(|r: SyscallRow| kept_calls.push(r))
        .unwrap();
    assert!(!kept_calls.is_empty());
    let calls: Vec<SyscallRow> = read_table(&tables.join(SYSCALLS), |_| true).expect("table");
    assert_eq!(kept_calls, calls);

    // Export from memory, with every column or only those it reads.
    let export_options = ExportOptions::default();
    let from_files = export_run(run, &export_options).expect("export");
    assert!(from_files.stats.requests_enriched > 0);
    let from_memory = export_kept(run, kept.clone(), &export_options).expect("export");
    assert_eq!(from_memory.traces, from_files.traces);
    let options = AnalyzeOptions {
        keep: Some(deepspan_export::analysis::KEEP),
        ..AnalyzeOptions::default()
    };
    let lean = analyze_run(run, &options, &NoProgress).expect("analysis");
    let kept = lean.kept.expect("kept in memory");
    let from_memory = export_kept(run, kept, &export_options).expect("export");
    assert_eq!(from_memory.traces, from_files.traces);
}

#[test]
fn folders_that_are_no_run_are_typed_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing");
    match analyze_run(&missing, &AnalyzeOptions::default(), &NoProgress) {
        Err(Error::NotARunFolder { run }) => assert_eq!(run, missing),
        other => panic!("{other:?}"),
    }
    match analyze_run(dir.path(), &AnalyzeOptions::default(), &NoProgress) {
        Err(e @ Error::NoKernelTrace { .. }) => {
            assert!(e.to_string().contains("has no kernel trace"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A trace.dat that is not one: the file is named, with the reader's
    // reason as the source.
    std::fs::create_dir(dir.path().join("kernel")).unwrap();
    let dat = dir.path().join("kernel/trace.dat");
    std::fs::write(&dat, b"not a trace").unwrap();
    match analyze_run(dir.path(), &AnalyzeOptions::default(), &NoProgress) {
        Err(e @ Error::OpenTraceDat { .. }) => {
            assert!(e.to_string().contains(&*dat.to_string_lossy()), "{e}");
            assert!(std::error::Error::source(&e).is_some());
        }
        other => panic!("{other:?}"),
    }
    // Nothing written.
    assert!(!dir.path().join("analysis").exists());
}

/// The agent analyses on a worker thread and hands the outcome (or the
/// error, into anyhow) to others.
#[test]
fn the_outcome_and_the_error_cross_threads() {
    fn send<T: Send + 'static>() {}
    fn send_sync_error<T: std::error::Error + Send + Sync + 'static>() {}
    send::<deepspan_pipeline::AnalysisOutcome>();
    send::<AnalyzeOptions>();
    send_sync_error::<Error>();
}
