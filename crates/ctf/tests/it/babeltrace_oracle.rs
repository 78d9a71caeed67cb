//! Every CTF trace of the test corpus decodes to exactly what babeltrace2
//! prints (timestamps, names, packet cpu_id, context and payload values),
//! and to the counts recorded in its expected.json.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use deepspan_ctf::CtfTrace;

fn expected(trace: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(corpus(trace).join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("json")
}

/// Decodes `dir` and checks it against babeltrace2 and `observed`.
fn check(dir: &Path, observed: &serde_json::Value, what: &str) -> CtfTrace {
    let trace = CtfTrace::open(dir).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut events = trace.events();
    let ours: Vec<BtEvent> = events
        .by_ref()
        .map(|e| our_event(&e.unwrap_or_else(|e| panic!("{what}: {e}"))))
        .collect();

    assert_eq!(
        ours.len() as u64,
        observed["event_count"].as_u64().unwrap(),
        "{what}: event_count"
    );
    let mut per_name: BTreeMap<String, u64> = BTreeMap::new();
    for e in &ours {
        *per_name.entry(e.name.clone()).or_default() += 1;
    }
    let want: BTreeMap<String, u64> = observed["events_per_name"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(per_name, want, "{what}: events per name");
    assert_eq!(
        ours.first().map(|e| e.ts),
        observed["first_event_ts_ns"].as_u64(),
        "{what}: first ts"
    );
    assert_eq!(
        ours.last().map(|e| e.ts),
        observed["last_event_ts_ns"].as_u64(),
        "{what}: last ts"
    );
    assert_eq!(
        trace
            .traces()
            .iter()
            .map(|t| t.stream_count())
            .sum::<usize>() as u64,
        observed["streams"].as_u64().unwrap()
    );
    let discarded_records = events.lost_event_records().len() as u64;
    assert_eq!(
        discarded_records,
        observed["discarded_event_messages"].as_u64().unwrap(),
        "{what}: discarded records"
    );

    if tool_available("babeltrace2") {
        let theirs = babeltrace_events(dir);
        assert_same_events(&ours, &theirs, what);
    }
    trace
}

fn single(name: &str) -> CtfTrace {
    let exp = expected(name);
    let dir = corpus(name).join(exp["trace_dir"].as_str().unwrap());
    check(&dir, &exp["observed"], name)
}

#[test]
fn flipping_endianness_matches_babeltrace2() {
    let t = single("flipping-endianness");
    let info = &t.traces()[0];
    assert_eq!(info.hostname(), Some("qemu0"));
    assert_eq!(info.domain(), Some("kernel"));
    assert_eq!(info.kernel_release(), Some("3.14.23-WR7.0.0.0_standard"));
    assert!(info.tid_inferred());
}

#[test]
fn bug446190_arm_64bit_headers_matches_babeltrace2() {
    single("bug446190");
}

#[test]
fn perf_taskset2_matches_babeltrace2() {
    let t = single("perf-taskset2");
    assert!(!t.traces()[0].tid_inferred(), "perf traces carry perf_tid");
    // CPUs come from the perf_cpu field (there is no cpu_id context).
    for e in t.events() {
        let e = e.unwrap();
        let perf_cpu = match e.field("perf_cpu") {
            Some(deepspan_model::Value::UInt(c)) => *c as u32,
            other => panic!("perf_cpu {other:?}"),
        };
        assert_eq!(e.cpu(), perf_cpu);
    }
}

#[test]
fn lttng_tracefile_rotation_matches_babeltrace2() {
    single("lttng-tracefile-rotation");
}

#[test]
fn multi_domains_folder_is_one_time_ordered_stream() {
    let exp = expected("multi-domains");
    let t = check(
        &corpus("multi-domains"),
        &exp["observed"]["both"],
        "multi-domains",
    );
    let domains: Vec<_> = t
        .traces()
        .iter()
        .map(|t| t.domain().unwrap().to_string())
        .collect();
    assert_eq!(domains, ["kernel", "ust"]);
    assert_eq!(t.lost_events().unwrap(), 728);
    let mut events = t.events();
    for e in events.by_ref() {
        e.unwrap();
    }
    assert_eq!(events.lost_events(), 728);
    let rec = &events.lost_event_records()[0];
    assert_eq!(rec.trace, 0);
    assert_eq!(rec.count, 728);
    // The packet boundaries babeltrace2 reports the discard between.
    assert_eq!(
        (rec.begin_ns, rec.end_ns),
        (1565032562352676346, 1565032593426663981)
    );
    // Each trace alone, too.
    for (i, name) in ["kernel", "ust"].iter().enumerate() {
        let alone = check(
            &corpus("multi-domains").join(name),
            &exp["observed"][name],
            name,
        );
        assert_eq!(alone.traces().len(), 1);
        assert_eq!(alone.traces()[0].path(), t.traces()[i].path());
    }
}
