//! The capture of switches out of idle against an oracle: the trace's own
//! `sched_switch` events, recorded in the same run; and in a flight
//! recorder's window.
//!
//! ftrace keeps most of a CPU's switches into idle but may lose those out
//! of it, so a stretch of a CPU between a traced switch into idle and its
//! next traced switch is an idle stretch that ends in a switch out of
//! idle. For every such stretch the trace holds whole (no lost-event mark
//! in it), the capture must have what ended it:
//! - when the trace kept the switch out of idle (`0 ==> T`), a record of
//!   the same CPU and thread stamped inside the stretch: after the switch
//!   into idle and before the CPU's next traced event of any kind. Both
//!   probes run in one call of the tracepoint with interrupts off, so
//!   nothing else of that CPU comes between them; they are usually
//!   microseconds apart, but a VM's CPU can be stalled by its host
//!   between the two for as long as the host likes;
//! - when it lost it (the next switch is `T ==> …`, T not idle), a record
//!   of that CPU inside the stretch: nothing but a switch out of idle
//!   ends one.
//!
//! The thread of a record in a lost stretch is counted, not compared: on
//! the VM this was written on ftrace also loses a few other switches (a
//! few a second, into idle and between threads), so the thread that left
//! idle need not be the one the trace next shows. Nor is each record
//! required to fall in an idle stretch of the trace, for the same reason.
//!
//! A loaded machine may have no idle CPU at all: the comparisons then have
//! nothing to compare, and the test says so. The workload sleeps 2 ms at
//! a time, so that on a quiet one there are hundreds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deepspan_model::EventKind;
use deepspan_record::{clock_sample, read_idle_switches, record, IdleSwitch, RecordOptions};
use deepspan_run::Manifest;

use crate::blocked_syscalls::gettid;
use crate::kernel::{flight_window, kernel, switches_flight_recorder, Sweep};

/// A traced switch on one CPU.
#[derive(Clone, Copy, Debug)]
struct Switch {
    ts: u64,
    prev: i32,
    next: i32,
    /// The stamp of the CPU's next traced event of any kind (u64::MAX if
    /// none).
    next_event_ts: u64,
}

/// One list per CPU, in CPU order.
type PerCpu<T> = Vec<Vec<T>>;

/// Per CPU, the trace's switches in order, and its lost-event stretches
/// (from the last record before a mark to the record that carries it).
fn switches_and_losses(trace: &std::path::Path) -> (PerCpu<Switch>, PerCpu<(u64, u64)>) {
    let trace = deepspan_ftrace::TraceDat::open(trace).expect("deepspan reads the trace");
    let mut switches = Vec::new();
    let mut losses = Vec::new();
    for cpu in 0..trace.cpus() {
        let mut records = trace.cpu_records(cpu).expect("cpu records");
        let (mut lost, mut last_ts) = (0, 0);
        let (mut mine, mut lost_here): (Vec<Switch>, _) = (Vec::new(), Vec::new());
        while let Some(record) = records.next() {
            let record = record.expect("record decodes");
            if records.lost_events() > lost {
                lost = records.lost_events();
                lost_here.push((last_ts, record.ts));
            }
            last_ts = record.ts;
            if let Some(last) = mine.last_mut().filter(|s| s.next_event_ts == u64::MAX) {
                last.next_event_ts = record.ts;
            }
            if let EventKind::SchedSwitch(s) = record.to_event(trace.schema()).kind {
                mine.push(Switch {
                    ts: record.ts,
                    prev: s.prev_tid,
                    next: s.next_tid,
                    next_event_ts: u64::MAX,
                });
            }
        }
        switches.push(mine);
        losses.push(lost_here);
    }
    (switches, losses)
}

/// What the comparison found.
#[derive(Debug, Default)]
struct Comparison {
    /// Idle stretches whose traced end the capture has.
    kept_matched: usize,
    /// Idle stretches whose end the trace lost, and which hold a record.
    lost_filled: usize,
    /// Of those, the stretches whose last record names the thread the
    /// trace shows next.
    lost_same_thread: usize,
    /// The largest distance between a kept switch's traced stamp and its
    /// record's.
    widest_gap_ns: u64,
    mismatches: Vec<String>,
}

/// Compares one CPU's records (in time order) with its traced switches.
fn compare_cpu(
    cpu: usize,
    switches: &[Switch],
    losses: &[(u64, u64)],
    records: &[IdleSwitch],
    out: &mut Comparison,
) {
    let lost_in = |from: u64, to: u64| losses.iter().any(|&(a, b)| a <= to && b >= from);
    let records_in = |from: u64, to: u64| {
        let a = records.partition_point(|r| r.mono_ns < from);
        let b = records.partition_point(|r| r.mono_ns <= to);
        &records[a..b]
    };
    for pair in switches.windows(2) {
        let (into_idle, end) = (pair[0], pair[1]);
        if into_idle.next != 0 || lost_in(into_idle.ts, end.ts) {
            continue;
        }
        if end.prev == 0 {
            let stretch = records_in(into_idle.ts, end.next_event_ts);
            match stretch.iter().find(|r| r.tid == end.next) {
                Some(r) => {
                    out.kept_matched += 1;
                    out.widest_gap_ns = out.widest_gap_ns.max(r.mono_ns.abs_diff(end.ts));
                }
                None => out.mismatches.push(format!(
                    "CPU {cpu}: the traced switch 0 ==> {} at {} (idle since {}, next event at \
                     {}) has no record: {stretch:?}",
                    end.next, end.ts, into_idle.ts, end.next_event_ts
                )),
            }
        } else {
            match records_in(into_idle.ts, end.ts).last() {
                Some(r) => {
                    out.lost_filled += 1;
                    out.lost_same_thread += usize::from(r.tid == end.prev);
                }
                None => out.mismatches.push(format!(
                    "CPU {cpu}: idle from {} until {} ==> … at {}, and no record between",
                    into_idle.ts, end.prev, end.ts
                )),
            }
        }
    }
}

#[test]
#[ignore = "system: root, tracefs, BPF and BTF"]
fn each_idle_stretch_of_the_trace_ends_in_a_captured_switch() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut opts = RecordOptions::new(&run);
    opts.duration = Some(Duration::from_secs(2));
    opts.events = "minimal".into();
    let stop = Arc::new(AtomicBool::new(false));
    let sleeper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let summary = record(&opts, &mut |_| {}).expect("record");
    stop.store(true, Ordering::Relaxed);
    sleeper.join().unwrap();

    let manifest = Manifest::load(&run).unwrap();
    let section = manifest
        .idle_switches
        .as_ref()
        .unwrap_or_else(|| panic!("no idle switches recorded: {:?}", manifest.warnings));
    assert_eq!(section.lost, 0, "the ring had room for every switch");
    let records = read_idle_switches(&run.join(&section.file)).expect("read the file");
    assert_eq!(records.len() as u64, section.records);

    let (switches, losses) = switches_and_losses(&summary.kernel_trace);
    let mut by_cpu: BTreeMap<u32, Vec<IdleSwitch>> = BTreeMap::new();
    for r in records {
        by_cpu.entry(r.cpu).or_default().push(r);
    }
    let mut comparison = Comparison::default();
    for (cpu, traced) in switches.iter().enumerate() {
        let mut mine = by_cpu.remove(&(cpu as u32)).unwrap_or_default();
        mine.sort_by_key(|r| r.mono_ns);
        compare_cpu(cpu, traced, &losses[cpu], &mine, &mut comparison);
    }
    assert!(
        by_cpu.is_empty(),
        "records of CPUs the trace lacks: {by_cpu:?}"
    );
    let from_idle: usize = switches.iter().flatten().filter(|s| s.prev == 0).count();
    let into_idle: usize = switches.iter().flatten().filter(|s| s.next == 0).count();
    eprintln!(
        "idle switches: {} records, {} lost to the ring; the trace has {into_idle} switches into \
         idle and {from_idle} out of it; {} idle stretches whose traced end was captured, {} \
         whose end the trace lost and the capture has ({} naming the thread the trace shows \
         next), {} mismatches; a kept switch's record at most {} µs from its traced stamp",
        section.records,
        section.lost,
        comparison.kept_matched,
        comparison.lost_filled,
        comparison.lost_same_thread,
        comparison.mismatches.len(),
        comparison.widest_gap_ns / 1000
    );
    assert!(
        comparison.mismatches.is_empty(),
        "{:#?}",
        comparison.mismatches
    );
    if into_idle == 0 {
        eprintln!("no CPU was idle during the recording: nothing to compare");
    }
}

/// A flight recorder window holds the switches out of idle of its time: a
/// thread of this test sleeps 2 ms at a time inside the window, and every
/// record is of the window.
#[test]
#[ignore = "system: root, tracefs, BPF and BTF"]
fn flight_recorder_windows_hold_the_switches_out_of_idle() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let (_sweep, mut flight) = switches_flight_recorder(&tracefs);
    let start = clock_sample()[1];
    let tid = std::thread::spawn(|| {
        for _ in 0..30 {
            std::thread::sleep(Duration::from_millis(2));
        }
        gettid()
    })
    .join()
    .unwrap();
    let end = clock_sample()[1];
    let (dir, manifest) = flight_window(&mut flight, start, end);
    let section = manifest
        .idle_switches
        .unwrap_or_else(|| panic!("no idle switches recorded: {:?}", manifest.warnings));
    let records = read_idle_switches(&dir.path().join(&section.file)).expect("read");
    assert_eq!(records.len() as u64, section.records);
    assert!(
        records.iter().all(|r| r.mono_ns <= end),
        "none after the window"
    );
    // The thread woke 30 times; on a machine with an idle CPU some of its
    // wake-ups found one. A loaded machine may have none, so only what is
    // there is checked.
    let ours = records.iter().filter(|r| r.tid == tid).count();
    eprintln!(
        "flight window: {} idle switches, {ours} of the sleeping thread",
        records.len()
    );
    flight.stop().expect("stop");
}
