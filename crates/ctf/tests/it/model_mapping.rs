//! Kernel events of the corpus mapped to the typed model: counts per kind,
//! field values, syscall naming (LTTng < 2.6 and ≥ 2.6), thread ids
//! inferred from sched_switch, and statedump fields kept reachable.

use std::collections::{BTreeMap, HashMap};

use crate::common::corpus;
use deepspan_ctf::CtfTrace;
use deepspan_model::{Comm, EventKind, SchedSwitch, Tid, Value, Wakeup};

fn kinds(dir: &str) -> BTreeMap<String, usize> {
    let t = CtfTrace::open(corpus(dir)).unwrap();
    let mut out = BTreeMap::new();
    for e in t.events() {
        let ev = e.unwrap().to_event();
        let k = match &ev.kind {
            EventKind::Other { .. } => "Other".to_string(),
            EventKind::SysEnter { name: Some(_), .. } => "SysEnter(named)".to_string(),
            EventKind::SysEnter { name: None, .. } => "SysEnter(unnamed)".to_string(),
            k => format!("{k:?}")
                .split(['(', ' '])
                .next()
                .unwrap()
                .to_string(),
        };
        *out.entry(k).or_default() += 1;
    }
    out
}

#[test]
fn rotation_trace_maps_sched_events() {
    let k = kinds("lttng-tracefile-rotation/kernel");
    let want: BTreeMap<String, usize> = [
        ("SchedSwitch", 4687),
        ("SchedWaking", 2378),
        ("SchedWakeup", 2378),
        ("SchedWakeupNew", 5),
        ("SchedProcessFork", 5),
        ("SchedProcessExec", 3),
        ("SchedProcessExit", 6),
        ("SchedProcessFree", 6),
        ("SchedMigrateTask", 269),
        ("Other", 2557 + 11),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b))
    .collect();
    assert_eq!(k, want);

    // The first sched_switch of the .expect dump, field by field.
    let t = CtfTrace::open(corpus("lttng-tracefile-rotation/kernel")).unwrap();
    let first = t
        .events()
        .map(|e| e.unwrap())
        .find(|e| e.name() == "sched_switch")
        .unwrap();
    let ev = first.to_event();
    assert_eq!(ev.ts, 1_571_261_795_523_071_732);
    assert_eq!(ev.cpu, 2);
    assert_eq!(ev.tid, 0, "a sched_switch runs in the task switched out");
    assert_eq!(
        ev.kind,
        EventKind::SchedSwitch(SchedSwitch {
            prev_tid: 0,
            prev_comm: Comm::from_bytes(b"swapper/2"),
            prev_prio: 20,
            prev_state: 0,
            next_tid: 31407,
            next_comm: Comm::from_bytes(b"lttng-consumerd"),
            next_prio: 20,
        })
    );
    assert_eq!(first.monotonic_ns(), 23_364_367_745_468);
    assert_eq!(
        first.ts() as i128 - first.monotonic_ns() as i128,
        t.traces()[0].clock_offset_ns()
    );
}

#[test]
fn tids_are_inferred_per_cpu_from_sched_switch() {
    let t = CtfTrace::open(corpus("lttng-tracefile-rotation/kernel")).unwrap();
    assert!(t.traces()[0].tid_inferred());
    let mut current: HashMap<u32, Tid> = HashMap::new();
    let mut known = 0;
    for e in t.events() {
        let ev = e.unwrap().to_event();
        match current.get(&ev.cpu) {
            Some(tid) => {
                if let EventKind::SchedSwitch(s) = &ev.kind {
                    assert_eq!(ev.tid, s.prev_tid);
                } else {
                    assert_eq!(ev.tid, *tid);
                }
                known += 1;
            }
            None if !matches!(ev.kind, EventKind::SchedSwitch(_)) => assert_eq!(ev.tid, -1),
            None => {}
        }
        if let EventKind::SchedSwitch(s) = &ev.kind {
            current.insert(ev.cpu, s.next_tid);
        }
    }
    assert!(known > 12_000, "{known}");
}

#[test]
fn old_lttng_syscalls_irqs_and_network() {
    let k = kinds("bug446190/trace");
    // sys_* entries (sys_unknown has no name) and exit_syscall exits.
    assert_eq!(k["SysExit"], 1811);
    assert_eq!(k["SysEnter(unnamed)"], 7);
    assert_eq!(k["IrqHandlerEntry"], 1357);
    assert_eq!(k["IrqHandlerExit"], 1357);
    assert_eq!(k["SoftirqRaise"], 893);
    assert_eq!(k["SoftirqEntry"], 893);
    assert_eq!(k["SoftirqExit"], 893);
    assert_eq!(k["HrtimerExpireEntry"], 287);
    assert_eq!(k["HrtimerExpireExit"], 287);
    assert_eq!(k["NetDevQueue"], 16);
    assert_eq!(k["NetifReceiveSkb"], 326);
    assert_eq!(k["SchedSwitch"], 1052);

    let t = CtfTrace::open(corpus("bug446190/trace")).unwrap();
    let mut saw_open = false;
    let mut saw_unknown = false;
    for e in t.events() {
        let e = e.unwrap();
        match (e.name(), e.to_event().kind) {
            ("sys_open", EventKind::SysEnter { id, name, args }) if !saw_open => {
                // filename is a string: positional args keep their place.
                assert_eq!((id, name.as_deref()), (-1, Some("open")));
                assert_eq!(args[0], 0);
                assert_eq!(Some(&Value::Int(args[1] as i64)), e.field("flags"));
                saw_open = true;
            }
            (
                "sys_unknown",
                EventKind::SysEnter {
                    id,
                    name: None,
                    args,
                },
            ) if !saw_unknown => {
                assert_eq!(id, 194);
                assert_eq!(args, [12, 0, 8388608, 0, 0, 8]);
                saw_unknown = true;
            }
            ("exit_syscall", EventKind::SysExit { id, name, ret }) => {
                assert_eq!((id, name), (-1, None));
                assert_eq!(Some(&Value::Int(ret)), e.field("ret"));
            }
            ("netif_receive_skb", EventKind::NetifReceiveSkb(p)) => {
                assert!(!p.dev.is_empty() && p.len > 0)
            }
            _ => {}
        }
    }
    assert!(saw_open && saw_unknown);
}

#[test]
fn irq_and_statedump_fields() {
    let t = CtfTrace::open(corpus("flipping-endianness/trace")).unwrap();
    let events: Vec<_> = t.events().map(|e| e.unwrap()).collect();
    assert_eq!(
        events[0].to_event().kind,
        EventKind::IrqHandlerEntry {
            irq: 23,
            name: "timer".into()
        }
    );
    assert_eq!(
        events[1].to_event().kind,
        EventKind::IrqHandlerExit { irq: 23, ret: 1 }
    );
    let statedump = &events[2];
    assert_eq!(
        statedump.to_event().kind,
        EventKind::Other {
            name: "lttng_statedump_process_state".into()
        }
    );
    assert_eq!(statedump.field("tid"), Some(&Value::Int(1)));
    assert_eq!(statedump.field("name"), Some(&Value::Str("systemd".into())));
    assert_eq!(statedump.field("status"), Some(&Value::Int(5)));
    let forks = events
        .iter()
        .filter(|e| matches!(e.to_event().kind, EventKind::SchedProcessFork { .. }))
        .count();
    assert_eq!(forks, 8);
}

#[test]
fn perf_converted_trace() {
    let k = kinds("perf-taskset2/trace");
    assert_eq!(k["SchedSwitch"], 562);
    assert_eq!(k["SchedWakeup"], 346);
    assert_eq!(k["SchedMigrateTask"], 4);
    assert_eq!(k["SchedProcessExec"], 2);
    assert_eq!(k["SchedProcessExit"], 1);
    let t = CtfTrace::open(corpus("perf-taskset2/trace")).unwrap();
    let first = t.events().next().unwrap().unwrap();
    assert_eq!(first.name(), "sched:sched_wakeup");
    let ev = first.to_event();
    assert_eq!(ev.tid, 0, "from perf_tid");
    assert_eq!(
        ev.kind,
        EventKind::SchedWakeup(Wakeup {
            tid: 1834,
            comm: Comm::from_bytes(b"perf"),
            prio: 120,
            target_cpu: 0
        })
    );
}

/// Streams read on their own and merged by time give exactly the events of
/// the merged reader (typed, with inferred thread ids), or the trace says
/// it cannot be read so.
#[test]
fn stream_readers_merge_to_the_same_events() {
    use deepspan_model::{merge_parallel, Event};
    let mut parallel_traces = 0;
    for dir in [
        "bug446190",
        "flipping-endianness",
        "lttng-tracefile-rotation",
        "multi-domains",
        "perf-taskset2",
    ] {
        let t = CtfTrace::open(corpus(dir)).unwrap();
        let sequential: Vec<Event> = t.events().map(|e| e.unwrap().to_event()).collect();
        let Some(streams) = t.stream_events() else {
            continue;
        };
        parallel_traces += 1;
        let typed: Vec<_> = streams
            .into_iter()
            .map(|s| s.map(|e| e.map(|e| e.to_event())))
            .collect();
        let mut merged = Vec::new();
        merge_parallel(typed, &mut |e| merged.push(e)).unwrap();
        assert_eq!(merged.len(), sequential.len(), "{dir}");
        for (i, (a, b)) in merged.iter().zip(&sequential).enumerate() {
            assert_eq!(a, b, "{dir}: event {i}");
        }
    }
    assert!(
        parallel_traces >= 4,
        "only {parallel_traces} corpus traces read per stream"
    );
}
