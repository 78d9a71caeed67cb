//! `deepspan export` into a real Jaeger v2 (all-in-one, memory storage,
//! built from the Go module proxy by scripts/build-jaeger.sh and cached):
//! two demo runs (a CPU cgroup quota, a PostgreSQL row lock; copies of
//! demo_real's kept demo) are exported (HTTP and gRPC) and read back through Jaeger's query API
//! (`/api/traces/{id}`): the diagnosed request's diagnosis attributes, its
//! kernel child spans (states, threads) tiling it without clock-skew
//! warnings, the link to the blocking request, and the same path as
//! `deepspan report` (what the UI shows) gives.
//!
//! Kernel test (root, tracefs, cgroups, PostgreSQL: the demo's needs). It
//! depends on no timing beyond bounded waits for Jaeger to be ready.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{check, deepspan, kernel_or_skip, one_at_a_time, poll, read_json};
use crate::demo_real::copy_of_kept_run;
use deepspan_jaeger_test::{tag, Collector, Jaeger};
use deepspan_spans::{import_file, read_run_spans, Span, SpanId, TraceId};
use serde_json::Value;

/// The request of the scenario's target operation diagnosed with its
/// expected cause: the slowest, or with `blocker`, the one that waited
/// longest for that request.
pub(crate) fn diagnosed_request(run: &Path, blocker: Option<&str>) -> Value {
    let expected = read_json(&run.join("demo/expected.json"));
    let requests = read_json(&run.join("analysis/requests.json"));
    let target = &expected["target"];
    let waited_for = |r: &Value, b: &str| {
        r["diagnosis"]["culprits"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == "request" && c["span_id"] == b)
            .filter_map(|c| c["ns"].as_u64())
            .sum::<u64>()
    };
    requests["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["service"] == target["service"])
        .filter(|r| target["operation"].is_null() || r["operation"] == target["operation"])
        .filter(|r| r["diagnosis"]["cause"] == expected["cause"])
        .filter(|r| blocker.is_none_or(|b| waited_for(r, b) > 0))
        // requests.json is slowest first; max_by_key keeps the last maximum.
        .rev()
        .max_by_key(|r| blocker.map_or(0, |b| waited_for(r, b)))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{}: no {} request of {target} diagnosed {} (blocked by {blocker:?})",
                run.display(),
                expected["scenario"],
                expected["cause"]
            )
        })
}

/// The request's span and the children of its kernel path (start order),
/// from Jaeger.
pub(crate) fn from_jaeger<'t>(trace: &'t Value, span_id: &str) -> (&'t Value, Vec<&'t Value>) {
    let spans = trace["spans"].as_array().unwrap();
    let me = spans
        .iter()
        .find(|s| s["spanID"] == span_id)
        .unwrap_or_else(|| panic!("span {span_id} not in Jaeger's trace"));
    let mut path: Vec<&Value> = spans
        .iter()
        .filter(|s| {
            s["references"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["refType"] == "CHILD_OF" && r["spanID"] == span_id)
        })
        // Pieces, and groups of short pieces; not system calls.
        .filter(|s| {
            matches!(
                tag(s, "deepspan.kernel.kind").as_str(),
                Some("path" | "folded")
            )
        })
        .collect();
    path.sort_by_key(|s| s["startTime"].as_u64());
    (me, path)
}

/// What `deepspan report` (the UI's source) gives as the request's path.
fn report(run: &Path, span_id: &str) -> Value {
    let out = check(
        "deepspan report",
        deepspan()
            .arg("report")
            .arg(run)
            .args(["--request", span_id, "--format", "json"])
            .output()
            .unwrap(),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `deepspan export RUN --otlp` to Jaeger's OTLP/HTTP port.
pub(crate) fn export_over_http(run: &Path, jaeger: &Jaeger) {
    check(
        "deepspan export --otlp (HTTP)",
        deepspan()
            .arg("export")
            .arg(run)
            .arg("--otlp")
            .arg(format!("http://127.0.0.1:{}", jaeger.otlp_http))
            .output()
            .unwrap(),
    );
}

/// How many spans `deepspan export` sends of each trace of a run (counted
/// in `export --out`), by trace id.
pub(crate) fn spans_sent(run: &Path) -> HashMap<String, usize> {
    let scratch = tempfile::tempdir().unwrap();
    let file = export_out(run, scratch.path());
    let mut sent = HashMap::new();
    for span in import_file(&file).unwrap().spans {
        *sent.entry(span.trace_id.to_string()).or_default() += 1;
    }
    sent
}

/// The trace as Jaeger shows it once it holds every span `deepspan
/// export` sends of it (`sent`, from [`spans_sent`]). Jaeger acknowledges
/// spans before they are stored, so a trace read right after the export
/// may still lack its last batch (the kernel children of a request then
/// ended before the request did, once in CI).
pub(crate) fn complete_trace(
    jaeger: &Jaeger,
    sent: &HashMap<String, usize>,
    trace_id: &str,
) -> Value {
    let sent = sent.get(trace_id).copied().unwrap_or(0);
    assert!(sent > 0, "export sends no span of trace {trace_id}");
    let (limit, every) = (Duration::from_secs(60), Duration::from_millis(100));
    poll(limit, every, || {
        jaeger
            .find_trace(trace_id)
            .filter(|t| t["spans"].as_array().map_or(0, Vec::len) >= sent)
    })
    .unwrap_or_else(|| panic!("Jaeger has not all {sent} spans of trace {trace_id} after 60 s"))
}

/// Checks common to both requests; returns the (state, tid) of the children.
fn check_request(run: &Path, request: &Value, trace: &Value) -> Vec<(String, i64)> {
    let span_id = request["span_id"].as_str().unwrap();
    let (me, path) = from_jaeger(trace, span_id);
    let d = &request["diagnosis"];
    assert_eq!(tag(me, "deepspan.cause"), &d["cause"]);
    assert_eq!(tag(me, "deepspan.headline"), &d["headline"]);
    assert_eq!(tag(me, "deepspan.share"), &d["evidence"]["share"]);
    assert!(tag(me, "deepspan.culprits").is_string(), "{me}");
    assert!(!path.is_empty(), "no kernel child spans under {span_id}");
    // The children tile the request (µs in Jaeger), and Jaeger moved none
    // of them (its clock-skew adjuster would have left a warning).
    let (start, duration) = (
        me["startTime"].as_u64().unwrap(),
        me["duration"].as_u64().unwrap(),
    );
    let mut at = start;
    for child in &path {
        let (s, d) = (
            child["startTime"].as_u64().unwrap(),
            child["duration"].as_u64().unwrap(),
        );
        assert!(s + 1 >= at && s <= at + 1, "gap or overlap before {child}");
        assert!(
            s >= start && s + d <= start + duration + 1,
            "{child} outside {me}"
        );
        assert!(child["warnings"].is_null(), "{child}");
        at = s + d;
    }
    assert!(
        at + 2 >= start + duration,
        "the children end at {at}, the request at {}",
        start + duration
    );
    // Every child names a state and a thread of the request's path as
    // `deepspan report` (and the UI) show it.
    let report = report(run, span_id);
    let reported: BTreeSet<(String, i64)> = report["critical_path"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| Some((p["state"].as_str()?.to_string(), p["tid"].as_i64()?)))
        .collect();
    let children: Vec<(String, i64)> = path
        .iter()
        .filter_map(|c| {
            Some((
                tag(c, "deepspan.kernel.state").as_str()?.to_string(),
                tag(c, "deepspan.kernel.tid").as_i64()?,
            ))
        })
        .collect();
    for child in &children {
        assert!(
            reported.contains(child),
            "{child:?} is not on the reported path {reported:?}"
        );
    }
    children
}

/// `deepspan export RUN --out SCRATCH/export.otlp.json`; the file.
/// Each span of a trace as Jaeger shows it, independent of the order of
/// spans, tags and processes: id, name, times, tags and references.
fn span_shapes(trace: &Value) -> BTreeSet<String> {
    let sorted = |list: &Value| -> Vec<String> {
        let mut v: Vec<String> = list
            .as_array()
            .map(|a| a.iter().map(Value::to_string).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {} {} {} {:?} {:?}",
                s["spanID"],
                s["operationName"],
                s["startTime"],
                s["duration"],
                sorted(&s["tags"]),
                sorted(&s["references"])
            )
        })
        .collect()
}

fn export_out(run: &Path, scratch: &Path) -> PathBuf {
    let file = scratch.join("export.otlp.json");
    check(
        "deepspan export --out",
        deepspan()
            .arg("export")
            .arg(run)
            .arg("--out")
            .arg(&file)
            .output()
            .unwrap(),
    );
    file
}

/// `export --out` of a real run, imported into a new run by `deepspan
/// import`: every span of the run comes back, those that are no request
/// exactly as they were, request spans with only what export adds (after
/// their own attributes and events), and the kernel children as written.
fn round_trip(run: &Path, scratch: &Path) {
    let file = export_out(run, scratch);
    let imported_run = scratch.join("imported");
    check(
        "deepspan import",
        deepspan()
            .arg("import")
            .arg("-o")
            .arg(&imported_run)
            .arg(&file)
            .output()
            .unwrap(),
    );
    let read = |dir: &Path| -> Vec<Span> {
        let mut reader = read_run_spans(dir).unwrap();
        reader.by_ref().map(|s| s.unwrap()).collect()
    };
    let exported = import_file(&file).unwrap().spans;
    let imported = read(&imported_run);
    assert_eq!(
        imported, exported,
        "deepspan import changed the exported spans"
    );
    let requests: BTreeSet<String> = read_json(&run.join("analysis/requests.json"))["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["span_id"].as_str().unwrap().to_string())
        .collect();
    let by_id: HashMap<(TraceId, SpanId), &Span> = imported
        .iter()
        .map(|s| ((s.trace_id, s.span_id), s))
        .collect();
    let originals = read(run);
    for original in &originals {
        let back = by_id
            .get(&(original.trace_id, original.span_id))
            .unwrap_or_else(|| panic!("span {} was not exported", original.span_id));
        if requests.contains(&original.span_id.to_string()) {
            let mut trimmed = (*back).clone();
            trimmed.attributes.0.truncate(original.attributes.len());
            trimmed.events.truncate(original.events.len());
            trimmed.refresh_sync();
            assert_eq!(&trimmed, original, "request span {}", original.span_id);
            assert!(back.attributes.get("deepspan.kernel.sync").is_some());
        } else {
            assert_eq!(*back, original, "span {}", original.span_id);
        }
    }
    let added = imported.len() - originals.len();
    assert!(
        added > 0
            && imported
                .iter()
                .filter(|s| s.scope.name == "deepspan.kernel")
                .count()
                == added
    );
}

#[test]
#[ignore = "system: root, tracefs, Jaeger, the demo (cgroups, PostgreSQL)"]
fn jaeger_shows_the_kernel_path_the_link_and_the_diagnosis() {
    if !kernel_or_skip("jaeger_shows_the_kernel_path_the_link_and_the_diagnosis") {
        return;
    }
    // Runs of the demo with their faults staged (demo_real's kept demo,
    // staged by whichever test needs it first, under the heavy-test lock).
    let _one = one_at_a_time();
    let jaeger = Jaeger::start();
    let keep = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();

    // A CPU cgroup quota, exported over OTLP/HTTP.
    let run = copy_of_kept_run("cpu-cgroup", keep.path());
    export_over_http(&run, &jaeger);
    let throttled = diagnosed_request(&run, None);
    let sent = spans_sent(&run);
    let trace = complete_trace(&jaeger, &sent, throttled["trace_id"].as_str().unwrap());
    let children = check_request(&run, &throttled, &trace);
    let (_, path) = from_jaeger(&trace, throttled["span_id"].as_str().unwrap());
    let pricing_tid = throttled["tid"].as_i64().unwrap();
    assert!(
        path.iter()
            .any(|c| tag(c, "deepspan.kernel.state") == "PREEMPTED"
                && tag(c, "deepspan.kernel.tid") == pricing_tid
                && c["operationName"]
                    .as_str()
                    .unwrap()
                    .contains("PREEMPTED (throttled)")
                && tag(c, "deepspan.kernel.throttled_ns").as_i64() > Some(0)),
        "no throttled PREEMPTED child of thread {pricing_tid}: {children:?}"
    );
    let (me, _) = from_jaeger(&trace, throttled["span_id"].as_str().unwrap());
    let logs: Vec<&Value> = me["logs"].as_array().unwrap().iter().collect();
    assert!(
        logs.iter().any(|l| l["fields"]
            .to_string()
            .contains("deepspan.kernel.throttle_start")),
        "no throttling event in {logs:?}"
    );

    round_trip(&run, keep.path());

    // The same run through an OpenTelemetry Collector (deploy/collector,
    // with the configuration documented for users: OTLP/gRPC in, batch,
    // OTLP/HTTP out) into a Jaeger of its own: every span arrives as it
    // did directly, kernel children and their attributes included.
    let behind = Jaeger::start();
    let collector = Collector::start(behind.otlp_http);
    check(
        "deepspan export --otlp (gRPC, to the Collector)",
        deepspan()
            .arg("export")
            .arg(&run)
            .args(["--protocol", "grpc", "--otlp"])
            .arg(format!("http://127.0.0.1:{}", collector.otlp_grpc))
            .output()
            .unwrap(),
    );
    let relayed = complete_trace(&behind, &sent, throttled["trace_id"].as_str().unwrap());
    assert_eq!(
        span_shapes(&relayed),
        span_shapes(&trace),
        "the Collector changed the trace (its log: {})",
        collector.log()
    );

    // A PostgreSQL row lock, exported over OTLP/gRPC.
    let run = copy_of_kept_run("db-row-lock", keep.path());
    check(
        "deepspan export --otlp (gRPC)",
        deepspan()
            .arg("export")
            .arg(&run)
            .args(["--protocol", "grpc", "--otlp"])
            .arg(format!("http://127.0.0.1:{}", jaeger.otlp_grpc))
            .output()
            .unwrap(),
    );
    let expected = read_json(&run.join("demo/expected.json"));
    let holder = expected["path"]["blocked_by_request"].as_str().unwrap();
    let waiter = diagnosed_request(&run, Some(holder));
    let sent = spans_sent(&run);
    let trace = complete_trace(&jaeger, &sent, waiter["trace_id"].as_str().unwrap());
    check_request(&run, &waiter, &trace);
    let (me, path) = from_jaeger(&trace, waiter["span_id"].as_str().unwrap());
    let linked: Vec<&&Value> = path
        .iter()
        .filter(|c| {
            c["references"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["refType"] == "FOLLOWS_FROM" && r["spanID"] == holder)
        })
        .collect();
    assert!(!linked.is_empty(), "no child links to the holder {holder}");
    // The culprits name the PostgreSQL backend in between.
    assert!(
        tag(me, "deepspan.culprits")
            .to_string()
            .contains("process postgres"),
        "{}",
        tag(me, "deepspan.culprits")
    );
    assert!(
        me["logs"]
            .to_string()
            .contains("deepspan.kernel.woken_by_request"),
        "no wake-up event: {}",
        me["logs"]
    );
    // The link leads to a span Jaeger has: the holder's request.
    let holder_trace = linked[0]["references"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["refType"] == "FOLLOWS_FROM")
        .unwrap()["traceID"]
        .as_str()
        .unwrap()
        .to_string();
    let holder_spans = complete_trace(&jaeger, &sent, &holder_trace);
    assert!(
        holder_spans["spans"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["spanID"] == holder),
        "the holder's span is not in Jaeger"
    );
}
