//! Throughput of the state model alone on a synthetic but realistic event
//! mix (system calls, interrupts, wake-ups, switches on 8 CPUs), reported
//! per event and per MB of the equivalent ftrace ring-buffer records:
//! `cargo run --release -p deepspan-analysis --example model_throughput [MILLION_EVENTS]`.

use std::time::Instant;

use deepspan_analysis::{critical_path, StateBuilder};
use deepspan_model::{softirq, Comm, Event, EventKind, Name, SchedSwitch, Tid, Wakeup};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Size of the event as an ftrace ring-buffer record (4-byte header plus
/// the format's fields), to express throughput in trace bytes.
fn ftrace_bytes(k: &EventKind) -> u64 {
    4 + match k {
        EventKind::SchedSwitch(_) => 64,
        EventKind::SchedWaking(_) | EventKind::SchedWakeup(_) => 36,
        EventKind::SysEnter { .. } => 64,
        EventKind::SysExit { .. } => 24,
        EventKind::IrqHandlerEntry { .. } => 20,
        EventKind::IrqHandlerExit { .. } => 16,
        EventKind::SoftirqEntry { .. } | EventKind::SoftirqExit { .. } => 12,
        EventKind::HrtimerExpireEntry { .. } => 32,
        EventKind::HrtimerExpireExit { .. } => 16,
        _ => 16,
    }
}

fn main() {
    let millions: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let (cpus, threads) = (8u32, 400 as Tid);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let comm = Comm::from_bytes(b"worker");
    let futex = Name::new("futex");
    let irq_name = Name::new("eth0-rx");
    let mut current: Vec<Tid> = (0..cpus as Tid).map(|c| 1 + c).collect();
    let mut blocked: Vec<Tid> = Vec::new();
    let mut runnable: Vec<Tid> = (cpus as Tid + 1..=threads).collect();
    let mut events = Vec::with_capacity(millions * 1_000_000);
    let mut ts = 1_000_000u64;
    let mut bytes = 0u64;
    let push =
        |events: &mut Vec<Event>, bytes: &mut u64, ts: u64, cpu: u32, tid: Tid, kind: EventKind| {
            *bytes += ftrace_bytes(&kind);
            events.push(Event { ts, cpu, tid, kind });
        };
    while events.len() < millions * 1_000_000 {
        ts += 1 + rng.below(200);
        let cpu = rng.below(cpus as u64) as u32;
        let cur = current[cpu as usize];
        match rng.below(100) {
            // System calls: the bulk of a server's trace.
            0..=54 => {
                push(
                    &mut events,
                    &mut bytes,
                    ts,
                    cpu,
                    cur,
                    EventKind::SysEnter {
                        id: 202,
                        name: Some(futex.clone()),
                        args: [0x7f00, 0, 0, 0, 0, 0],
                    },
                );
                push(
                    &mut events,
                    &mut bytes,
                    ts + 1,
                    cpu,
                    cur,
                    EventKind::SysExit {
                        id: 202,
                        name: Some(futex.clone()),
                        ret: 0,
                    },
                );
            }
            // Interrupts, some waking a blocked thread.
            55..=69 => {
                let timer = rng.below(2) == 0;
                if timer {
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::HrtimerExpireEntry {
                            hrtimer: 1,
                            function: 2,
                            now: 0,
                        },
                    );
                } else {
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::IrqHandlerEntry {
                            irq: 30,
                            name: irq_name.clone(),
                        },
                    );
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::SoftirqEntry {
                            vec: softirq::NET_RX,
                        },
                    );
                }
                if !blocked.is_empty() {
                    let w = blocked.swap_remove(rng.below(blocked.len() as u64) as usize);
                    let wk = Wakeup {
                        tid: w,
                        comm,
                        prio: 120,
                        target_cpu: cpu as i32,
                    };
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::SchedWaking(wk),
                    );
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::SchedWakeup(wk),
                    );
                    runnable.push(w);
                }
                if timer {
                    push(
                        &mut events,
                        &mut bytes,
                        ts + 1,
                        cpu,
                        cur,
                        EventKind::HrtimerExpireExit { hrtimer: 1 },
                    );
                } else {
                    push(
                        &mut events,
                        &mut bytes,
                        ts + 1,
                        cpu,
                        cur,
                        EventKind::SoftirqExit {
                            vec: softirq::NET_RX,
                        },
                    );
                    push(
                        &mut events,
                        &mut bytes,
                        ts + 1,
                        cpu,
                        cur,
                        EventKind::IrqHandlerExit { irq: 30, ret: 1 },
                    );
                }
            }
            // A thread wakes another one.
            70..=84 => {
                if !blocked.is_empty() {
                    let w = blocked.swap_remove(rng.below(blocked.len() as u64) as usize);
                    let wk = Wakeup {
                        tid: w,
                        comm,
                        prio: 120,
                        target_cpu: cpu as i32,
                    };
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::SchedWaking(wk),
                    );
                    push(
                        &mut events,
                        &mut bytes,
                        ts,
                        cpu,
                        cur,
                        EventKind::SchedWakeup(wk),
                    );
                    runnable.push(w);
                }
            }
            // Switches: block or be preempted.
            _ => {
                if runnable.is_empty() {
                    continue;
                }
                let next = runnable.swap_remove(rng.below(runnable.len() as u64) as usize);
                let blocks = rng.below(3) > 0;
                let s = SchedSwitch {
                    prev_tid: cur,
                    prev_comm: comm,
                    prev_prio: 120,
                    prev_state: if blocks { 1 } else { 0 },
                    next_tid: next,
                    next_comm: comm,
                    next_prio: 120,
                };
                push(
                    &mut events,
                    &mut bytes,
                    ts,
                    cpu,
                    cur,
                    EventKind::SchedSwitch(s),
                );
                if blocks {
                    blocked.push(cur)
                } else {
                    runnable.push(cur)
                }
                current[cpu as usize] = next;
            }
        }
    }
    let n = events.len() as f64;
    let mb = bytes as f64 / 1e6;
    // Best of three runs, so the one-off cost of generating the events
    // (page faults of a large vector) stays out of the measure.
    // CPU time of this thread: the machine may be shared.
    let cpu_ns = || -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
            .unwrap_or(0)
    };
    let mut best = f64::MAX;
    let mut model = None;
    for _ in 0..3 {
        drop(model.take());
        let (t0, c0) = (Instant::now(), cpu_ns());
        let mut b = StateBuilder::new();
        for e in &events {
            b.push(e);
        }
        let m = b.finish();
        let cpu = (cpu_ns() - c0) as f64 / 1e9;
        let wall = t0.elapsed().as_secs_f64();
        best = best.min(if cpu > 0.0 { cpu } else { wall });
        model = Some(m);
    }
    let (model, dt) = (model.expect("ran"), best);
    let intervals: usize = model
        .threads()
        .map(|t| t.states().len() + t.syscalls().len())
        .sum();
    println!(
        "{:.1} M events, {mb:.0} MB as ftrace records ({:.1} B/event)",
        n / 1e6,
        bytes as f64 / n
    );
    println!(
        "state model: {dt:.3} s CPU = {:.0} ns/event = {:.0} MB/s of trace",
        dt * 1e9 / n,
        mb / dt
    );
    println!(
        "{intervals} state + syscall intervals, {} graph vertices",
        model.graph().vertex_count()
    );
    let (start, end) = model.time_range();
    let t1 = Instant::now();
    let mut pieces = 0;
    for tid in 1..=50 {
        pieces += critical_path(&model, tid, start, end).pieces.len();
    }
    println!(
        "critical paths of 50 threads over the whole trace: {:.3} s ({pieces} pieces)",
        t1.elapsed().as_secs_f64()
    );
}
