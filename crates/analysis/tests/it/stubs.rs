//! Oracles from Trace Compass' XML kernel stubs: the OS execution graph of
//! `sched_only.xml` (`LttngExecutionGraphTest`), and the thread status tree,
//! rows and arrows of `lttng_kernel_analysis.xml`
//! (`ThreadStatusDataProviderTest`).

use crate::common;

use deepspan_analysis::{KernelModel, StateBuilder, ThreadHistory, ThreadState};

fn model_of(stub: &str) -> KernelModel {
    let items = common::stub::read(&common::testdata(&format!("kernel/stubs/{stub}")));
    let mut b = StateBuilder::new();
    common::stub::feed(&mut b, &items);
    b.finish()
}

#[test]
fn sched_only_execution_graph_matches_trace_compass() {
    let doc = common::read_json("kernel/stubs/sched_only.expected-graph.json");
    let model = model_of("sched_only.xml");
    assert_eq!(
        model.graph().workers().len(),
        doc["expected_worker_count"].as_u64().unwrap() as usize
    );
    common::check_equal(model.graph(), &doc["expected_graph"])
        .unwrap_or_else(|e| panic!("{e}\nactual:\n{}", common::describe(model.graph())));
}

/// Trace Compass' thread entries are a tree by parent pid, siblings by
/// start time (then tid), flattened depth first.
fn tree_order(model: &KernelModel) -> Vec<&ThreadHistory> {
    let threads: Vec<&ThreadHistory> = model.threads().collect();
    let key = |t: &ThreadHistory| (t.first_seen().unwrap_or(0), t.tid);
    let is_child_of =
        |t: &ThreadHistory, p: &ThreadHistory| t.ppid == Some(p.tid) && t.tid != p.tid;
    let mut roots: Vec<&ThreadHistory> = threads
        .iter()
        .copied()
        .filter(|t| !threads.iter().any(|p| is_child_of(t, p)))
        .collect();
    roots.sort_by_key(|t| key(t));
    let mut out = Vec::new();
    fn visit<'a>(
        t: &'a ThreadHistory,
        all: &[&'a ThreadHistory],
        out: &mut Vec<&'a ThreadHistory>,
    ) {
        out.push(t);
        let mut kids: Vec<&ThreadHistory> = all
            .iter()
            .copied()
            .filter(|c| c.ppid == Some(t.tid) && c.tid != t.tid)
            .collect();
        kids.sort_by_key(|c| (c.first_seen().unwrap_or(0), c.tid));
        for k in kids {
            visit(k, all, out);
        }
    }
    for r in roots {
        visit(r, &threads, &mut out);
    }
    out
}

/// Trace Compass' state system ends one tick after the last event.
fn tc_end(model: &KernelModel) -> u64 {
    model.time_range().1 + 1
}

#[test]
fn thread_status_tree_matches_trace_compass() {
    let expected =
        std::fs::read_to_string(common::testdata("kernel/stubs/expectedThreadStatusTree")).unwrap();
    let model = model_of("lttng_kernel_analysis.xml");
    let (start, end) = model.time_range();
    let mut lines = vec![format!("lttng_kernel_analysis.xml,{start},{end}")];
    for t in tree_order(&model) {
        lines.push(format!(
            "{},{},{},{},{},{}",
            t.name().map(|n| n.to_string()).unwrap_or_default(),
            t.first_seen().unwrap(),
            tc_end(&model),
            t.tid,
            // Trace Compass shows the tid as pid and -1 as ppid when unknown.
            t.pid.unwrap_or(t.tid),
            t.ppid.unwrap_or(-1),
        ));
    }
    let expected: Vec<&str> = expected.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines, expected);
}

/// The Thread Status view's style of a state.
fn style(
    model: &KernelModel,
    t: &ThreadHistory,
    s: &deepspan_analysis::StateInterval,
) -> Vec<(u64, u64, String, String)> {
    let one = |name: &str| vec![(s.start, s.end, name.to_string(), "null".to_string())];
    match s.state {
        ThreadState::Running => {
            // Running splits into user mode and system calls.
            let mut out = Vec::new();
            let mut t0 = s.start;
            for c in t.syscalls_in(s.start, s.end) {
                let (a, b) = (c.start.max(s.start), c.end.min(s.end));
                if a >= b {
                    continue;
                }
                if a > t0 {
                    out.push((t0, a, "Usermode".into(), "null".into()));
                }
                let label = model.syscall_name(c).unwrap_or("?").to_string();
                out.push((a, b, "System call".into(), label));
                t0 = b;
            }
            if s.end > t0 || out.is_empty() {
                out.push((t0, s.end, "Usermode".into(), "null".into()));
            }
            out
        }
        ThreadState::Preempted | ThreadState::WaitCpu => one("Wait for CPU"),
        ThreadState::Blocked(_) => one("Wait blocked"),
        ThreadState::Unknown => one("Wait"),
    }
}

fn row(model: &KernelModel, t: &ThreadHistory, from: u64) -> Vec<String> {
    const NO_STATE: &str = "-2147483648";
    let end = tc_end(model);
    let mut segs: Vec<(u64, u64, String, String)> = Vec::new();
    let mut t0 = from;
    let n = t.states().len();
    for (i, s) in t.states().iter().enumerate() {
        if s.start > t0 {
            segs.push((t0, s.start, NO_STATE.into(), "null".into()));
        }
        let mut parts = style(model, t, s);
        if let Some(last) = parts.last_mut() {
            // The state still open at the end runs to the state system's end.
            if i + 1 == n
                && last.1 == model.time_range().1
                && t.deaths().last().is_none_or(|&d| d < last.1)
            {
                last.1 = end;
            }
        }
        t0 = parts.last().map_or(t0, |p| p.1);
        segs.extend(parts);
    }
    if end > t0 {
        segs.push((t0, end, NO_STATE.into(), "null".into()));
    }
    segs.into_iter()
        .flat_map(|(a, b, st, l)| [a.to_string(), (b - a).to_string(), st, l])
        .collect()
}

#[test]
fn thread_status_rows_match_trace_compass() {
    let expected =
        std::fs::read_to_string(common::testdata("kernel/stubs/expectedThreadStatusRows")).unwrap();
    let model = model_of("lttng_kernel_analysis.xml");
    // Rows come in entry-creation order: the order of first sight.
    let threads: Vec<&ThreadHistory> = model.threads().collect();
    let expected: Vec<&str> = expected.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(threads.len(), expected.len());
    for (t, line) in threads.iter().zip(expected) {
        let (name, tuples) = line.split_once(':').unwrap();
        assert_eq!(t.name().unwrap().to_string(), name);
        let want: Vec<&str> = tuples.split(',').collect();
        let got = row(&model, t, 1);
        assert!(
            got.len() >= want.len(),
            "{name}: got {got:?}, want {want:?}"
        );
        // The upstream test compares the first states of each row.
        assert_eq!(&got[..want.len()], &want[..], "{name}");
    }
}

#[test]
fn thread_status_arrows_match_trace_compass() {
    // An arrow joins the thread that ran on a CPU to the next one, at the
    // switch, once a thread has been seen running on that CPU.
    let expected =
        std::fs::read_to_string(common::testdata("kernel/stubs/expectedThreadStatusArrows"))
            .unwrap();
    let model = model_of("lttng_kernel_analysis.xml");
    let name = |tid| {
        model
            .thread(tid)
            .and_then(|t| t.name())
            .map(|n| n.to_string())
            .unwrap()
    };
    let mut arrows = Vec::new();
    for c in model.cpus() {
        for w in c.timeline().windows(2) {
            if w[0].end == w[1].start {
                arrows.push((
                    w[1].start,
                    format!("{},{},{},0", name(w[0].tid), name(w[1].tid), w[1].start),
                ));
            }
        }
    }
    arrows.sort();
    let got: Vec<String> = arrows.into_iter().map(|a| a.1).collect();
    let want: Vec<&str> = expected.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(got, want);
}
