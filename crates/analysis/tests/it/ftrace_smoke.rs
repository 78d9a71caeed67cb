//! Smoke test on real trace.dat files (LISA test assets): the model builds
//! and keeps its invariants.

use crate::common;

use std::collections::HashMap;

use deepspan_analysis::{critical_path, KernelModel, StateBuilder, ThreadState};
use deepspan_ftrace::TraceDat;

fn model(name: &str) -> (KernelModel, u64) {
    let path = common::testdata(&format!("kernel/ftrace/{name}"));
    let trace = TraceDat::open(&path).expect("open trace.dat");
    let schema = trace.schema().clone();
    let mut b = StateBuilder::new();
    let mut n = 0;
    for r in trace.records().expect("records") {
        let r = r.expect("record");
        b.push(&r.to_event(&schema));
        n += 1;
    }
    (b.finish(), n)
}

fn check_invariants(m: &KernelModel) {
    let (start, end) = m.time_range();
    assert!(start < end);
    let mut running: HashMap<u32, Vec<(u64, u64, i32)>> = HashMap::new();
    for t in m.threads() {
        let states = t.states();
        assert!(
            !states.is_empty() || !t.names().is_empty(),
            "thread {} has nothing",
            t.tid
        );
        for w in states.windows(2) {
            assert!(w[0].end <= w[1].start, "thread {} overlaps: {w:?}", t.tid);
            // Covered from first appearance to the end, except after a death.
            assert!(
                w[0].end == w[1].start || t.deaths().contains(&w[0].end),
                "thread {} gap: {w:?}",
                t.tid
            );
        }
        if let Some(last) = states.last() {
            assert!(
                last.end == end || t.deaths().contains(&last.end),
                "thread {} ends early: {last:?}",
                t.tid
            );
        }
        for s in states
            .iter()
            .filter(|s| s.state == ThreadState::Running && s.end > s.start)
        {
            running
                .entry(s.cpu)
                .or_default()
                .push((s.start, s.end, t.tid));
        }
    }
    for (cpu, mut v) in running {
        v.sort();
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0, "CPU {cpu} runs two threads: {w:?}");
        }
    }
    for t in m.threads() {
        let cp = critical_path(m, t.tid, start, end);
        for w in cp.pieces.windows(2) {
            assert!(w[0].end <= w[1].start, "path of {} overlaps: {w:?}", t.tid);
        }
    }
}

#[test]
fn sched_load_trace_builds_a_consistent_model() {
    let (m, n) = model("sched_load.dat");
    assert_eq!(n, 3724);
    assert_eq!(m.stats().events, 3724);
    assert!(m.threads().count() > 5);
    check_invariants(&m);
}

#[test]
fn rtapp_trace_builds_a_consistent_model() {
    let (m, n) = model("example_rtapp.dat");
    assert_eq!(n, 7820);
    assert!(m.threads().count() > 5);
    check_invariants(&m);
}
