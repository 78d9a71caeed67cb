//! `GET /api/run` on a run of one host and on a merged run of several
//! (`hosts.json`): the hosts are listed with their number (the `hN:` of
//! their threads) and clock alignment; a malformed or escaping
//! `hosts.json` is reported in `hosts_error` while the run still loads.

use std::path::Path;

use deepspan_run::analysis::{CRITICAL_PATH, REQUEST_SUMMARY, REQUEST_SYSCALLS, STATE_HISTORY};
use deepspan_run::Run;
use deepspan_store::table::TableWriter;
use deepspan_store::tables::{
    CRITICAL_PATH_COLUMNS, REQUEST_SUMMARY_COLUMNS, REQUEST_SYSCALLS_COLUMNS,
};
use serde_json::Value;

/// An analysed run with no requests and empty tables, at `dir/run`.
fn empty_run(dir: &Path) -> std::path::PathBuf {
    let run = dir.join("run");
    let analysis = Run::new(&run).analysis_dir();
    std::fs::create_dir_all(&analysis).unwrap();
    let no_requests = deepspan_store::json::RequestsDoc::default();
    std::fs::write(
        analysis.join("requests.json"),
        serde_json::to_vec(&no_requests).unwrap(),
    )
    .unwrap();
    for (name, columns) in [
        (CRITICAL_PATH, CRITICAL_PATH_COLUMNS),
        (REQUEST_SUMMARY, REQUEST_SUMMARY_COLUMNS),
        (REQUEST_SYSCALLS, REQUEST_SYSCALLS_COLUMNS),
    ] {
        TableWriter::create(&analysis.join(name), columns)
            .unwrap()
            .finish()
            .unwrap();
    }
    // No thread states: a history without lanes.
    deepspan_store::history::HistoryWriter::create(&analysis.join(STATE_HISTORY))
        .unwrap()
        .finish()
        .unwrap();
    run
}

/// `/api/run` of the run at `run`.
fn api_run(run: &Path) -> Value {
    crate::get(run, "/api/run")
}

/// As `deepspan analyze alpha beta --out merged` writes it (fields the UI
/// does not show included).
const HOSTS: &str = r#"{"reference": 0,
 "hosts": [{"host": "alpha", "run": "/runs/alpha", "slope": 1.0, "offset_ns": 0.0,
            "quality": "accurate", "matched": 4801, "cpu_base": 0, "cpus": 2,
            "boot_id": "0f6c", "pids": [123]},
           {"host": "beta", "run": "/runs/beta", "slope": 1.000037, "offset_ns": -3700136900.0,
            "quality": "accurate", "matched": 4801, "cpu_base": 2, "cpus": 2, "pids": [456]}]}"#;

#[test]
fn a_run_of_one_host_has_no_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let run = empty_run(dir.path());
    let info = api_run(&run);
    assert_eq!(info["requests"], 0);
    assert!(info["hosts"].is_null(), "{}", info["hosts"]);
    assert!(info["hosts_error"].is_null(), "{}", info["hosts_error"]);
}

#[test]
fn a_merged_run_lists_its_hosts_by_number() {
    let dir = tempfile::tempdir().unwrap();
    let run = empty_run(dir.path());
    std::fs::write(run.join("hosts.json"), HOSTS).unwrap();
    let info = api_run(&run);
    assert!(info["hosts_error"].is_null(), "{}", info["hosts_error"]);
    let want: Value = serde_json::json!([
        {"index": 0, "host": "alpha", "reference": true, "quality": "accurate",
         "matched": 4801, "slope": 1.0, "offset_ns": 0.0, "run": "/runs/alpha"},
        {"index": 1, "host": "beta", "reference": false, "quality": "accurate",
         "matched": 4801, "slope": 1.000037, "offset_ns": -3700136900.0, "run": "/runs/beta"},
    ]);
    assert_eq!(info["hosts"], want);

    // The reference need not be the first host.
    std::fs::write(
        run.join("hosts.json"),
        HOSTS.replace(r#""reference": 0"#, r#""reference": 1"#),
    )
    .unwrap();
    let info = api_run(&run);
    let reference: Vec<bool> = info["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["reference"].as_bool().unwrap())
        .collect();
    assert_eq!(reference, [false, true]);
}

#[test]
fn a_malformed_hosts_json_is_reported_and_the_run_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let run = empty_run(dir.path());
    let cases = [
        ("{not json".to_string(), "list of hosts"),
        (r#"{"reference": 0}"#.to_string(), "missing field `hosts`"),
        (
            HOSTS.replace(r#""matched": 4801, "cpu_base": 2"#, r#""cpu_base": 2"#),
            "missing field `matched`",
        ),
        (r#"{"reference": 0, "hosts": []}"#.to_string(), "no hosts"),
        (
            HOSTS.replace(r#""reference": 0"#, r#""reference": 2"#),
            "reference 2 is not one of its 2 hosts",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(run.join("hosts.json"), &text).unwrap();
        let info = api_run(&run);
        assert_eq!(info["requests"], 0);
        assert!(info["hosts"].is_null(), "{text}: {}", info["hosts"]);
        let error = info["hosts_error"].as_str().unwrap_or_default();
        assert!(
            error.contains("hosts.json") && error.contains(want),
            "{text}: {error:?} should say {want:?}"
        );
    }

    // A hosts.json leading out of the run folder is not read.
    let outside = dir.path().join("elsewhere.json");
    std::fs::write(&outside, HOSTS).unwrap();
    std::fs::remove_file(run.join("hosts.json")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("hosts.json")).unwrap();
    let info = api_run(&run);
    assert!(info["hosts"].is_null(), "{}", info["hosts"]);
    let error = info["hosts_error"].as_str().unwrap_or_default();
    assert!(error.contains("outside the run folder"), "{error:?}");
}
