//! Property tests: the merge of critical paths keeps every path, and the
//! state model and critical paths keep their invariants on any event stream.

use std::collections::HashMap;
use std::sync::Arc;

use deepspan_analysis::{
    critical_path, join_adjacent, merge_paths, EdgeType, KernelModel, Piece, StateBuilder,
    ThreadState,
};
use deepspan_model::{softirq, BlockRq, Comm, Event, EventKind, SchedSwitch, Tid, Wakeup};
use proptest::prelude::*;

const STATES: [EdgeType; 5] = [
    EdgeType::Running,
    EdgeType::Preempted,
    EdgeType::Blocked,
    EdgeType::Timer,
    EdgeType::Unknown,
];

/// A path: consecutive pieces over a few shared threads and states, with
/// boundaries on a coarse grid so that paths overlap often, and sometimes
/// with gaps between pieces.
fn path() -> impl Strategy<Value = Vec<Piece>> {
    prop::collection::vec(
        (
            0u64..3,
            1u64..6,
            1i32..4,
            0usize..STATES.len(),
            any::<bool>(),
        ),
        0..12,
    )
    .prop_map(|steps| {
        let mut t = 0;
        steps
            .into_iter()
            .map(|(gap, len, tid, state, q)| {
                let start = t + gap * 5;
                let end = start + len * 5;
                t = end;
                Piece {
                    start,
                    end,
                    tid,
                    state: STATES[state],
                    qualifier: q.then(|| Arc::from("q")),
                    link_from: None,
                    vertical: false,
                    lost: false,
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn merged_graph_keeps_every_path(paths in prop::collection::vec(path(), 1..6)) {
        let merged = merge_paths(paths.iter().map(|p| p.as_slice()));
        prop_assert_eq!(merged.path_count(), paths.len());
        for (i, p) in paths.iter().enumerate() {
            // Recoverable exactly (adjacent same-state pieces joined).
            prop_assert_eq!(merged.recover(i as u32), join_adjacent(p));
            // No time lost or duplicated along the path.
            let nodes = merged.path_nodes(i as u32);
            let along: u64 = nodes.iter().map(|&n| merged.nodes()[n as usize].duration()).sum();
            let want: u64 = p.iter().map(|x| x.duration()).sum();
            prop_assert_eq!(along, want);
            for w in nodes.windows(2) {
                prop_assert!(merged.nodes()[w[0] as usize].end <= merged.nodes()[w[1] as usize].start);
            }
        }
        // A (thread, state) at a given time is one node: nodes never overlap
        // another node of the same thread and state.
        type Key = (Tid, EdgeType, Option<Arc<str>>);
        let mut by_key: HashMap<Key, Vec<(u64, u64)>> = HashMap::new();
        for n in merged.nodes() {
            by_key.entry((n.tid, n.state, n.qualifier.clone())).or_default().push((n.start, n.end));
        }
        for ranges in by_key.values_mut() {
            ranges.sort();
            for w in ranges.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "overlapping nodes {:?}", w);
            }
        }
        // Each node's edges agree with its paths, and a shared state is shared.
        for (id, n) in merged.nodes().iter().enumerate() {
            for &(path, next) in &n.outgoing {
                prop_assert!(merged.nodes()[next as usize].incoming.contains(&(path, id as u32)));
            }
            prop_assert!(!n.paths.is_empty());
        }
        for (a, pa) in paths.iter().enumerate() {
            for (b, pb) in paths.iter().enumerate().skip(a + 1) {
                for x in pa {
                    for y in pb {
                        let (s, e) = (x.start.max(y.start), x.end.min(y.end));
                        if s < e && (x.tid, x.state, &x.qualifier) == (y.tid, y.state, &y.qualifier) {
                            let shared = merged.nodes().iter().any(|n| {
                                n.start <= s && s < n.end && n.tid == x.tid && n.state == x.state
                                    && n.paths.contains(&(a as u32)) && n.paths.contains(&(b as u32))
                            });
                            prop_assert!(shared, "state shared by paths {} and {} at {} is not one node", a, b, s);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn figure_6_mutex_contention_is_one_shared_node() {
    // A and B wait on a mutex held by C: C's run [1, 3] is on both paths.
    let piece = |start, end, tid, state| Piece {
        start,
        end,
        tid,
        state,
        qualifier: None,
        link_from: None,
        vertical: false,
        lost: false,
    };
    let a = vec![
        piece(0, 1, 1, EdgeType::Running),
        piece(1, 3, 3, EdgeType::Running),
        piece(3, 5, 1, EdgeType::Running),
    ];
    let b = vec![
        piece(0, 2, 2, EdgeType::Running),
        piece(2, 3, 3, EdgeType::Running),
        piece(3, 4, 1, EdgeType::Running),
        piece(4, 5, 2, EdgeType::Running),
    ];
    let m = merge_paths([a.as_slice(), b.as_slice()]);
    let shared: Vec<_> = m
        .shared_nodes()
        .map(|(_, n)| (n.tid, n.start, n.end))
        .collect();
    assert_eq!(shared, vec![(3, 2, 3), (1, 3, 4)]);
    assert_eq!(m.recover(0), join_adjacent(&a));
    assert_eq!(m.recover(1), join_adjacent(&b));
}

/// Random kernel events over few threads and CPUs, so that everything
/// collides: switches of threads not running, wake-ups of running threads,
/// unmatched interrupt exits, lost events, forks of live tids.
fn events() -> impl Strategy<Value = Vec<(u8, u8, u8, u8, i64, u8)>> {
    prop::collection::vec((0u8..14, 0u8..3, 0u8..6, 0u8..6, 0i64..4, 0u8..3), 0..200)
}

fn build(script: &[(u8, u8, u8, u8, i64, u8)]) -> KernelModel {
    let mut b = StateBuilder::new();
    let mut ts = 0;
    for &(op, cpu, a, c, st, dt) in script {
        ts += dt as u64;
        let (cpu, a, c) = (cpu as u32, a as Tid, c as Tid);
        let comm = Comm::from_bytes(b"t");
        let w = Wakeup {
            tid: a,
            comm,
            prio: 0,
            target_cpu: c % 3,
        };
        let kind = match op {
            0..=2 => EventKind::SchedSwitch(SchedSwitch {
                prev_tid: a,
                prev_comm: comm,
                prev_prio: 0,
                prev_state: [0, 1, 2, 0x100][st as usize],
                next_tid: c,
                next_comm: comm,
                next_prio: 0,
            }),
            3 => EventKind::SchedWaking(w),
            4 => EventKind::SchedWakeup(w),
            5 => EventKind::SchedWakeupNew(w),
            6 => EventKind::SchedProcessFork {
                parent_tid: c,
                parent_comm: comm,
                child_tid: a,
                child_comm: comm,
            },
            7 => EventKind::SchedProcessExit {
                tid: a,
                comm,
                prio: 0,
            },
            8 => EventKind::IrqHandlerEntry {
                irq: st as i32,
                name: deepspan_model::Name::new("eth0"),
            },
            9 => EventKind::IrqHandlerExit {
                irq: st as i32,
                ret: 0,
            },
            10 => EventKind::SoftirqEntry {
                vec: [
                    softirq::TIMER,
                    softirq::NET_RX,
                    softirq::BLOCK,
                    softirq::RCU,
                ][st as usize],
            },
            11 => EventKind::SoftirqExit {
                vec: softirq::TIMER,
            },
            12 => {
                if st == 0 {
                    EventKind::SysEnter {
                        id: 1,
                        name: None,
                        args: [0; 6],
                    }
                } else {
                    EventKind::SysExit {
                        id: 1,
                        name: None,
                        ret: 0,
                    }
                }
            }
            _ => {
                if st == 0 {
                    b.lost(cpu, ts);
                    continue;
                }
                EventKind::BlockRqComplete(BlockRq {
                    dev: 0,
                    sector: 0,
                    nr_sector: 0,
                    rwbs: [0; 8],
                    error: 0,
                })
            }
        };
        let tid = if st == 3 { -1 } else { a };
        b.push(&Event { ts, cpu, tid, kind });
    }
    b.finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn model_invariants_hold_on_any_stream(script in events()) {
        let m = build(&script);
        let (start, end) = m.time_range();
        // Per thread: sorted, non-overlapping intervals inside the trace;
        // a gap only after a death.
        for t in m.threads() {
            for s in t.states() {
                prop_assert!(start <= s.start && s.start <= s.end && s.end <= end);
            }
            for w in t.states().windows(2) {
                prop_assert!(w[0].end <= w[1].start, "thread {} overlaps: {:?}", t.tid, w);
                if w[0].end < w[1].start {
                    prop_assert!(t.deaths().iter().any(|&d| d == w[0].end), "thread {} gap without death: {:?}", t.tid, w);
                }
            }
            for w in t.syscalls().windows(2) {
                prop_assert!(w[0].end <= w[1].start);
            }
        }
        // Per CPU: at most one thread RUNNING at a time.
        let mut running: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for t in m.threads() {
            for s in t.states().iter().filter(|s| s.state == ThreadState::Running && s.end > s.start) {
                running.entry(s.cpu).or_default().push((s.start, s.end));
            }
        }
        for (cpu, mut v) in running {
            v.sort();
            for w in v.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "CPU {} runs two threads: {:?}", cpu, w);
            }
        }
        for c in m.cpus() {
            for w in c.timeline().windows(2) {
                prop_assert!(w[0].end <= w[1].start);
            }
        }
        // Critical paths: ordered, non-overlapping pieces inside the range.
        for t in m.threads() {
            let (a, b) = (start, end);
            let cp = critical_path(&m, t.tid, a, b);
            for p in &cp.pieces {
                prop_assert!(a <= p.start && p.start < p.end && p.end <= b);
            }
            for w in cp.pieces.windows(2) {
                prop_assert!(w[0].end <= w[1].start, "thread {} path overlaps: {:?}", t.tid, w);
            }
        }
    }
}
