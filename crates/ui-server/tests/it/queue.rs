//! A request's queue (its time at its host before its span started) on
//! the request page's API: `requests.json`'s `queue` with the requests it
//! was queued behind named, and the pieces of `queue_path.parquet` in the
//! timeline's lanes, marked and before the span's own. A run analysed
//! before queues (no `queue_path.parquet`) still loads, with no pieces.
//!
//! Each request's pieces are read by the rows `requests.json` gives for
//! it; an analysis made before it gave them is read by a scan of the
//! tables' `span_id` column, with the same answers.

use std::path::{Path, PathBuf};

use crate::{get, get_status};

use axum::http::StatusCode;
use deepspan_run::analysis::{
    CRITICAL_PATH, QUEUE_PATH, REQUESTS_JSON, REQUEST_SUMMARY, REQUEST_SYSCALLS, STATE_HISTORY,
};
use deepspan_run::Run;
use deepspan_store::json::{CauseGroup, QueueDoc, RequestEntry, RequestsDoc, TableRows};
use deepspan_store::table::TableWriter;
use deepspan_store::tables::{
    CriticalPathRow, CRITICAL_PATH_COLUMNS, REQUEST_SUMMARY_COLUMNS, REQUEST_SYSCALLS_COLUMNS,
};
use serde_json::Value;

const TRACE: &str = "0000000000000000000000000000000a";
/// Queued behind `BLOCKER` on thread 10, then waiting for a CPU on 11.
const QUEUED: &str = "00000000000000aa";
const BLOCKER: &str = "00000000000000bb";

fn entry(span_id: &str, service: &str, operation: &str, start: u64, end: u64) -> RequestEntry {
    RequestEntry {
        trace_id: TRACE.into(),
        span_id: span_id.into(),
        parent_span_id: None,
        service: service.into(),
        operation: operation.into(),
        kind: "server".into(),
        start_ns: start,
        end_ns: end,
        duration_ns: end - start,
        sync: "exact".into(),
        tid: Some(10),
        lost_events: 0,
        truncated: false,
        totals: Default::default(),
        causes: Vec::new(),
        cause_groups: Vec::new(),
        syscalls: Vec::new(),
        baseline_ns: None,
        anomalous: false,
        diagnosis: None,
        queue: None,
        critical_path_rows: None,
    }
}

/// The two requests; with `rows`, each with where its pieces are in the
/// tables `queued_run` writes, as the analysis gives them.
fn requests_doc(rows: bool) -> RequestsDoc {
    let at = |first, count| rows.then_some(TableRows { first, count });
    let mut blocker = entry(BLOCKER, "node", "GET /slow", 900_000, 1_950_000);
    blocker.critical_path_rows = at(0, 1);
    let mut queued = entry(QUEUED, "node", "GET /fast", 2_000_000, 3_000_000);
    queued.critical_path_rows = at(1, 1);
    queued.queue = Some(QueueDoc {
        arrival_ns: 1_000_000,
        arrival_by: "client_send".into(),
        ns: 1_000_000,
        cause_groups: vec![CauseGroup {
            label: "queued behind 1 request of [node] GET /slow".into(),
            blocked_by_operation: Some("[node] GET /slow".into()),
            blocked_by_requests: vec![BLOCKER.into()],
            state: "RUNNING".into(),
            ns: 900_000,
            share: 0.9,
            parts: Vec::new(),
        }],
        diagnosis: None,
        queue_path_rows: at(0, 2),
    });
    RequestsDoc {
        requests: vec![blocker, queued],
        ..Default::default()
    }
}

fn piece(span_id: &str, seq: i32, start: i64, end: i64, state: &str, tid: i32) -> CriticalPathRow {
    CriticalPathRow {
        trace_id: TRACE.into(),
        span_id: span_id.into(),
        seq,
        start_ns: start,
        end_ns: end,
        duration_ns: end - start,
        state: state.into(),
        tid: Some(tid),
        comm: Some(format!("node-{tid}")),
        syscall: None,
        waiting_in: None,
        detail: None,
        working_for_span_id: None,
        blocked_by_request: None,
        blocked_by_trace_id: None,
        shared: 0,
        vertical: false,
        lost: false,
        preempted_by_tid: None,
        preempted_by_comm: None,
        throttled_ns: None,
        contended_ns: None,
        wakeup_ns: None,
    }
}

/// Writes rows in `critical_path`'s columns, as the analysis writes both
/// `critical_path.parquet` and `queue_path.parquet`.
fn write_path(path: &Path, rows: &[CriticalPathRow]) {
    let mut w = TableWriter::create(path, CRITICAL_PATH_COLUMNS).unwrap();
    for r in rows {
        w.str(&r.trace_id);
        w.str(&r.span_id);
        w.i32(r.seq);
        w.i64(r.start_ns);
        w.i64(r.end_ns);
        w.i64(r.duration_ns);
        w.str(&r.state);
        w.opt_i32(r.tid);
        w.opt_str(r.comm.as_deref());
        w.opt_str(r.syscall.as_deref());
        w.opt_str(r.waiting_in.as_deref());
        w.opt_str(r.detail.as_deref());
        w.opt_str(r.working_for_span_id.as_deref());
        w.opt_str(r.blocked_by_request.as_deref());
        w.opt_str(r.blocked_by_trace_id.as_deref());
        w.i32(r.shared);
        w.bool(r.vertical);
        w.bool(r.lost);
        w.opt_i32(r.preempted_by_tid);
        w.opt_str(r.preempted_by_comm.as_deref());
        w.opt_i64(r.throttled_ns);
        w.opt_i64(r.contended_ns);
        w.opt_i64(r.wakeup_ns);
        w.end_row().unwrap();
    }
    w.finish().unwrap();
}

/// An analysed run at `dir/run`: the two requests (with their rows in
/// `requests.json` if `rows`), their paths, and the queued one's queue
/// path.
fn queued_run(dir: &Path, rows: bool) -> PathBuf {
    let run = dir.join("run");
    let analysis = Run::new(&run).analysis_dir();
    std::fs::create_dir_all(&analysis).unwrap();
    std::fs::write(
        analysis.join(REQUESTS_JSON),
        serde_json::to_vec(&requests_doc(rows)).unwrap(),
    )
    .unwrap();
    for (name, columns) in [
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
    write_path(
        &analysis.join(CRITICAL_PATH),
        &[
            piece(BLOCKER, 0, 900_000, 1_950_000, "RUNNING", 10),
            piece(QUEUED, 0, 2_000_000, 3_000_000, "RUNNING", 10),
        ],
    );
    let mut behind = piece(QUEUED, 0, 1_000_000, 1_900_000, "RUNNING", 10);
    behind.blocked_by_request = Some(BLOCKER.into());
    behind.blocked_by_trace_id = Some(TRACE.into());
    write_path(
        &analysis.join(QUEUE_PATH),
        &[
            behind,
            piece(QUEUED, 1, 1_900_000, 2_000_000, "WAIT_CPU", 11),
        ],
    );
    run
}

/// `(tid, start_ns, state, queue)` of every drawn interval of a timeline.
fn drawn(timeline: &Value) -> Vec<(i64, i64, String, bool)> {
    let mut out = Vec::new();
    for lane in timeline["lanes"].as_array().unwrap() {
        for iv in lane["intervals"].as_array().unwrap() {
            out.push((
                lane["tid"].as_i64().unwrap(),
                iv["start_ns"].as_i64().unwrap(),
                iv["state"].as_str().unwrap().to_string(),
                iv["queue"].as_bool().unwrap_or(false),
            ));
        }
    }
    out
}

#[test]
fn the_request_page_shows_the_queue_and_its_pieces() {
    for rows in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let run = queued_run(dir.path(), rows);
        request_page_shows_the_queue(&run);
    }
}

fn request_page_shows_the_queue(run: &Path) {
    let run = run.to_path_buf();

    let detail = get(&run, &format!("/api/requests/{QUEUED}"));
    let queue = &detail["queue"];
    assert_eq!(queue["arrival_ns"], 1_000_000, "{queue}");
    assert_eq!(queue["arrival_by"], "client_send");
    assert_eq!(queue["ns"], 1_000_000);
    assert_eq!(queue["start_ns"], 2_000_000);
    assert_eq!(
        queue["label"],
        "queued behind 1 request of [node] GET /slow"
    );
    assert_eq!(
        queue["cause_groups"][0]["blocked_by_requests"],
        serde_json::json!([BLOCKER])
    );
    assert_eq!(queue["pieces"], 2);
    assert_eq!(
        queue["blockers"],
        serde_json::json!([{"span_id": BLOCKER, "trace_id": TRACE, "service": "node",
                            "operation": "GET /slow", "start_ns": 900_000, "end_ns": 1_950_000}])
    );
    // The queue is not the span's path: neither its pieces nor its blocker.
    assert_eq!(detail["pieces"], 1);
    assert_eq!(detail["blockers"], serde_json::json!([]));
    assert_eq!(detail["request"]["queue"]["arrival_ns"], 1_000_000);

    // The blocker has no queue.
    let detail = get(&run, &format!("/api/requests/{BLOCKER}"));
    assert!(detail["queue"].is_null(), "{}", detail["queue"]);

    // The list carries each request's queue.
    let list = get(&run, "/api/requests?sort=start");
    let queued: Vec<Value> = list["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["queue"]["ns"].clone())
        .collect();
    assert_eq!(queued, [Value::Null, Value::from(1_000_000)]);

    // The timeline starts at the arrival; the queue's pieces come first in
    // their lanes, marked, and the path moves from its queue to its span.
    let timeline = get(&run, &format!("/api/requests/{QUEUED}/timeline"));
    assert_eq!(timeline["start_ns"], 1_000_000);
    assert_eq!(timeline["end_ns"], 3_000_000);
    assert_eq!(
        drawn(&timeline),
        [
            (10, 1_000_000, "RUNNING".into(), true),
            (10, 2_000_000, "RUNNING".into(), false),
            (11, 1_900_000, "WAIT_CPU".into(), true),
        ]
    );
    let behind = &timeline["lanes"][0]["intervals"][0];
    assert_eq!(behind["blocked_by_request"], BLOCKER);
    let arrows: Vec<(i64, i64, i64)> = timeline["arrows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["at_ns"].as_i64().unwrap(),
                a["from_tid"].as_i64().unwrap(),
                a["to_tid"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(arrows, [(1_900_000, 10, 11), (2_000_000, 11, 10)]);
}

#[test]
fn a_run_without_queue_paths_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let run = queued_run(dir.path(), true);
    let analysis = Run::new(&run).analysis_dir();
    std::fs::remove_file(analysis.join(QUEUE_PATH)).unwrap();

    let detail = get(&run, &format!("/api/requests/{QUEUED}"));
    let queue = &detail["queue"];
    assert_eq!(queue["ns"], 1_000_000, "{queue}");
    assert_eq!(queue["pieces"], 0);
    // Its groups still name the request it was queued behind.
    assert_eq!(queue["blockers"][0]["span_id"], BLOCKER);
    let timeline = get(&run, &format!("/api/requests/{QUEUED}/timeline"));
    assert_eq!(timeline["start_ns"], 1_000_000);
    assert_eq!(drawn(&timeline), [(10, 2_000_000, "RUNNING".into(), false)]);

    // Nor does an analysis made before queues have any in requests.json.
    let mut doc = requests_doc(true);
    for r in &mut doc.requests {
        r.queue = None;
    }
    let mut text: Value = serde_json::to_value(&doc).unwrap();
    for r in text["requests"].as_array_mut().unwrap() {
        r.as_object_mut().unwrap().remove("queue");
    }
    std::fs::write(
        analysis.join(REQUESTS_JSON),
        serde_json::to_vec(&text).unwrap(),
    )
    .unwrap();
    let detail = get(&run, &format!("/api/requests/{QUEUED}"));
    assert!(detail["queue"].is_null(), "{}", detail["queue"]);
    let timeline = get(&run, &format!("/api/requests/{QUEUED}/timeline"));
    assert_eq!(timeline["start_ns"], 2_000_000);
}

#[test]
fn a_queue_path_leading_outside_the_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = queued_run(dir.path(), true);
    let analysis = Run::new(&run).analysis_dir();
    let outside = dir.path().join("elsewhere.parquet");
    std::fs::rename(analysis.join(QUEUE_PATH), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, analysis.join(QUEUE_PATH)).unwrap();
    let err = match deepspan_ui_server::load(&run) {
        Ok(_) => panic!("a queue path outside the run folder was read"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("outside the run folder"), "{err}");
}

#[test]
fn rows_that_are_not_the_requests_are_an_error_not_another_path() {
    let dir = tempfile::tempdir().unwrap();
    let run = queued_run(dir.path(), true);
    // The queued request said to be at the blocker's row.
    let mut doc = requests_doc(true);
    doc.requests[1].critical_path_rows = Some(TableRows { first: 0, count: 1 });
    let analysis = Run::new(&run).analysis_dir();
    std::fs::write(
        analysis.join(REQUESTS_JSON),
        serde_json::to_vec(&doc).unwrap(),
    )
    .unwrap();
    let (status, body) = get_status(&run, &format!("/api/requests/{QUEUED}"));
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("critical_path.parquet") && message.contains("not of one analysis"),
        "{body}"
    );
    // The other request is still served.
    let detail = get(&run, &format!("/api/requests/{BLOCKER}"));
    assert_eq!(detail["pieces"], 1);
}
