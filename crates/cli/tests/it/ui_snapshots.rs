//! `deepspan ui DIR` over a folder of the live agent's snapshots: two real
//! snapshot folders (each a recorded and analysed `deepspan-workload hot`
//! request, with a hand-written snapshot.json) and a failed one. Checks the
//! list (`/api/snapshots`, newest first), each snapshot's run API under
//! `/s/<id>/api/`, the app page, and that ids cannot leave DIR (400 for a
//! malformed id, 404 for an unknown one or a symlink out of DIR). A run
//! folder given directly is served as before (the `ui_api` module covers it).

use std::path::Path;

use crate::common::ui::{get, serve, Server};
use crate::common::{deepspan, kernel_or_skip, ok, workload};
use serde_json::{json, Value};

/// Records one `hot` request into `folder` as a run and analyses it;
/// returns the workload's line about itself (its span id).
fn record_snapshot(folder: &Path) -> Value {
    let spans = folder.with_extension("span.json");
    let stdout = ok(deepspan()
        .arg("record")
        .arg("-o")
        .arg(folder)
        .args(["--no-otlp", "--"])
        .arg(workload())
        .args(["hot", "10000000"])
        .arg(&spans));
    let told: Value = stdout
        .lines()
        .find(|l| l.starts_with("{\"workload\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("the workload's line");
    ok(deepspan()
        .arg("import")
        .arg("-o")
        .arg(folder)
        .arg("--otlp")
        .arg(&spans));
    std::fs::remove_file(&spans).unwrap();
    ok(deepspan().arg("analyze").arg(folder));
    told
}

fn get_json(s: &Server, path: &str) -> (u16, Value) {
    let (status, body) = get(s, path);
    let value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"));
    (status, value)
}

#[test]
#[ignore = "system: root and tracefs"]
fn a_folder_of_snapshots_lists_them_and_opens_each() {
    if !kernel_or_skip("a_folder_of_snapshots_lists_them_and_opens_each") {
        return;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let dir = tmp.path().join("snapshots");
    std::fs::create_dir(&dir).unwrap();
    let (old_id, new_id, failed_id) = (
        "20261125T071500.123Z-0001",
        "20261125T071600.456Z-0002",
        "20261125T071700.789Z-0003",
    );
    let mut told = Vec::new();
    for (i, id) in [old_id, new_id].into_iter().enumerate() {
        let folder = dir.join(id);
        let me = record_snapshot(&folder);
        let snapshot = json!({
            "id": id,
            "taken_unix_ns": 1_764_054_900_123_000_000u64 + i as u64 * 60_000_000_000,
            "window_mono_ns": [1000, 1000 + 250_000_000 * (i as u64 + 1)],
            "status": "analysed",
            "error": null,
            "triggers": [{"trace_id": "0".repeat(32), "span_id": me["span_id"], "service": "workload",
                          "operation": "GET /hot", "duration_ns": 123, "baseline_ns": 40,
                          "cause": "cpu_bound", "headline": format!("snapshot {i}")}],
        });
        std::fs::write(folder.join("snapshot.json"), snapshot.to_string()).unwrap();
        told.push(me);
    }
    // A snapshot whose analysis failed: no analysis/ folder.
    let failed = dir.join(failed_id);
    std::fs::create_dir(&failed).unwrap();
    std::fs::write(
        failed.join("snapshot.json"),
        json!({"id": failed_id, "taken_unix_ns": 1_764_055_100_000_000_000u64, "window_mono_ns": [5, 9],
               "status": "failed", "error": "the window left the ring buffer", "triggers": []})
        .to_string(),
    )
    .unwrap();
    // A way out of DIR, which must not be followed.
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("snapshot.json"), "{}").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape")).unwrap();

    let server = serve(&dir);
    let (status, run) = get_json(&server, "/api/run");
    assert_eq!(status, 200);
    assert_eq!(run["kind"], "snapshots");

    let (status, list) = get_json(&server, "/api/snapshots");
    assert_eq!(status, 200, "{list}");
    let list = list["snapshots"].as_array().expect("a list").clone();
    let ids: Vec<&str> = list.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [failed_id, new_id, old_id], "newest first, no escape");
    assert_eq!(list[0]["status"], "failed");
    assert_eq!(list[0]["analysed"], false);
    assert_eq!(list[0]["window_ns"], 4);
    assert_eq!(list[1]["window_ns"], 500_000_000);
    assert_eq!(list[1]["analysed"], true);
    assert_eq!(list[1]["triggers"][0]["headline"], "snapshot 1");
    assert_eq!(list[2]["triggers"][0]["span_id"], told[0]["span_id"]);

    // Each analysed snapshot answers its own run API, with its own request.
    for (id, me) in [(old_id, &told[0]), (new_id, &told[1])] {
        let (status, requests) = get_json(&server, &format!("/s/{id}/api/requests"));
        assert_eq!(status, 200, "{requests}");
        let spans: Vec<&str> = requests["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["span_id"].as_str().unwrap())
            .collect();
        assert_eq!(spans, [me["span_id"].as_str().unwrap()], "snapshot {id}");
        let span = spans[0];
        let (status, request) = get_json(&server, &format!("/s/{id}/api/requests/{span}"));
        assert_eq!(status, 200, "{request}");
        let (status, run) = get_json(&server, &format!("/s/{id}/api/run"));
        assert_eq!(status, 200, "{run}");
        assert_eq!(run["requests"], 1);
        // Query parameters reach the snapshot's API (a bad one is its 400).
        let (status, bad) = get_json(&server, &format!("/s/{id}/api/requests?sort=nonsense"));
        assert_eq!(status, 400, "{bad}");
        let (status, page) = get(&server, &format!("/s/{id}/"));
        assert_eq!(status, 200);
        assert!(
            page.contains("<div id=\"app\">") || page.contains("id=\"app\""),
            "{page}"
        );
    }
    // The failed one says why; unknown and escaping ids are 404, malformed
    // ones 400; all JSON.
    let (status, e) = get_json(&server, &format!("/s/{failed_id}/api/requests"));
    assert_eq!(status, 404);
    assert!(e["error"].as_str().unwrap().contains("ring buffer"), "{e}");
    let through = |rest: &str| format!("/s/{old_id}/api/{rest}");
    for (path, expected) in [
        (through("requests/..%2f..%2fmanifest.json").as_str(), 400),
        (through("../../../etc/passwd").as_str(), 404),
        (through("nothing").as_str(), 404),
        ("/s/nope/api/run", 404),
        ("/s/escape/api/run", 404),
        ("/s/escape/", 404),
        ("/s/..%2f..%2fetc/api/run", 400),
        ("/s/%2e%2e/api/run", 400),
        ("/s/.hidden/api/run", 400),
        ("/s/a%20b/api/run", 400),
    ] {
        let (status, e) = get_json(&server, path);
        assert_eq!(status, expected, "GET {path}: {e}");
        assert!(e["error"].is_string(), "GET {path}: {e}");
    }
    // The app itself is at the top.
    let (status, page) = get(&server, "/");
    assert_eq!(status, 200);
    assert!(page.contains("id=\"app\""), "{page}");
}
