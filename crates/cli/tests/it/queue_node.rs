//! Queue time on a real event loop: a Node.js HTTP server with stock
//! OpenTelemetry (tests/placement/node_blocked.js: sdk-node and its HTTP
//! instrumentation) and deepspan's span processor under `deepspan record`,
//! whose event loop a slow request blocks for 150 ms, five times, while
//! four client loops of another process call a fast endpoint. Each fast
//! request that arrives during a block waits in its socket until the loop
//! is free; its server span starts only then and shows none of it. The
//! processor places the spans on the loop thread, so the loop's time is
//! known to be the slow request's (without it they overlap on the loop and
//! go to the process as a whole: the queue is measured the same, but no
//! request is named behind it).
//!
//! The oracle is the client's own measure, on CLOCK_MONOTONIC (the kernel
//! trace's clock): its latency minus the server span's duration is the
//! time the request spent before its span. The server says which span id
//! served which request. Needs Node.js and sdk/node's npm packages
//! (scripts/setup.sh check runs `npm ci` there).

use std::collections::HashMap;
use std::path::Path;

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time};
use crate::placement_node::record_node_server;
use serde_json::Value;

const BLOCKS: usize = 5;
const BLOCK_MS: u64 = 150;

/// A request as one side saw it.
struct Seen {
    path: String,
    /// Client: when it called, and got the whole answer.
    sent_ns: u64,
    done_ns: u64,
}

fn json_file(path: &Path) -> Value {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn number(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
#[ignore = "system: root and tracefs"]
fn requests_that_arrive_while_the_event_loop_is_blocked_are_queued_behind_the_blocker() {
    if !kernel_or_skip("requests_that_arrive_while_the_event_loop_is_blocked") {
        return;
    }
    let _one = one_at_a_time();
    let (_dir, out, run) = record_node_server(
        "node_blocked.js",
        &["4", &BLOCKS.to_string(), &BLOCK_MS.to_string()],
    );
    let analyzed = check(
        "deepspan analyze",
        deepspan()
            .arg("analyze")
            .arg(&run)
            .output()
            .expect("run deepspan analyze"),
    );
    let stderr = String::from_utf8_lossy(&analyzed.stderr);

    // What each side saw: the client by request number, the server by span.
    let clients: HashMap<u64, Seen> = json_file(&out.join("clients.json"))
        .as_array()
        .expect("clients.json is a list")
        .iter()
        .map(|c| {
            let seen = Seen {
                path: c["path"].as_str().expect("path").to_string(),
                sent_ns: number(&c["sent_ns"]),
                done_ns: number(&c["done_ns"]),
            };
            (number(&c["i"]), seen)
        })
        .collect();
    let server = json_file(&out.join("server.json"));
    let number_of_span: HashMap<String, u64> = server["served"]
        .as_array()
        .expect("served")
        .iter()
        .filter_map(|s| Some((s["span_id"].as_str()?.to_string(), number(&s["i"]))))
        .collect();
    let doc = json_file(&run.join("analysis/requests.json"));
    let requests = doc["requests"].as_array().expect("requests");
    assert_eq!(
        requests.len(),
        clients.len(),
        "one server span per request:\n{stderr}"
    );
    let of_request = |r: &Value| {
        let span = r["span_id"].as_str().expect("span_id");
        let i = number_of_span
            .get(span)
            .unwrap_or_else(|| panic!("span {span} is not one the server served"));
        &clients[i]
    };
    // The blocks, as the slow requests' server spans.
    let blocks: Vec<(String, u64, u64)> = requests
        .iter()
        .filter(|r| of_request(r).path == "/slow")
        .map(|r| {
            let span = r["span_id"].as_str().unwrap().to_string();
            (span, number(&r["start_ns"]), number(&r["end_ns"]))
        })
        .collect();
    assert_eq!(blocks.len(), BLOCKS, "the slow requests");

    let (mut right, mut queued_during_blocks) = (0, 0);
    let mut wrong = Vec::new();
    for r in requests {
        let seen = of_request(r);
        let Some((blocker, _, _)) = blocks
            .iter()
            .find(|(_, start, end)| (*start..*end).contains(&seen.sent_ns))
        else {
            continue;
        };
        if seen.path != "/fast" {
            continue;
        }
        queued_during_blocks += 1;
        // The client's measure of the time before the span.
        let duration = number(&r["duration_ns"]);
        let expected = (seen.done_ns - seen.sent_ns).saturating_sub(duration);
        let queue = &r["queue"];
        let got = queue["ns"].as_u64();
        let behind = crate::common::queued_behind(queue);
        let close = got.is_some_and(|g| g.abs_diff(expected) <= (expected / 10).max(2_000_000));
        if close && behind.contains(&blocker.as_str()) {
            right += 1;
        } else {
            wrong.push(format!(
                "span {}: queue {got:?} ns, the client's measure {expected} ns, behind {behind:?} (the block: {blocker})",
                r["span_id"]
            ));
        }
    }
    eprintln!(
        "node queue: {right} of {queued_during_blocks} requests that arrived during a block \
         queued as the client measured, behind the blocker; off: {wrong:#?}"
    );
    // Each client loop has one request in flight when a block begins.
    assert!(
        queued_during_blocks >= BLOCKS * 2,
        "only {queued_during_blocks} fast requests arrived during the {BLOCKS} blocks"
    );
    assert!(
        right * 10 >= queued_during_blocks * 9,
        "{right} of {queued_during_blocks} queued as measured: {wrong:#?}\n{stderr}"
    );

    // The report says it too.
    let queued = requests
        .iter()
        .filter(|r| r["queue"]["ns"].as_u64().unwrap_or(0) > 100_000_000)
        .find_map(|r| r["span_id"].as_str())
        .expect("a request queued over 100 ms");
    let report = check(
        "deepspan report",
        deepspan()
            .arg("report")
            .arg(&run)
            .arg("--request")
            .arg(queued)
            .output()
            .expect("run deepspan report"),
    );
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("before its span started") && text.contains("queued behind"),
        "{text}"
    );
}
