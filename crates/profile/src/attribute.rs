//! A request's wall time as one flame graph: its kernel critical path,
//! piece by piece. A RUNNING piece's time is shared among the CPU samples
//! its thread took inside it (the stacks say which code); every other
//! piece is an off-CPU frame saying why the request waited (the state, what
//! blocked it, the system call). On-CPU plus off-CPU time is the path's
//! length, which is the request's duration.

use std::collections::HashMap;

use crate::samples::Sample;
use crate::symbols::{Frame, Symbols};

/// One piece of a request's critical path, as the analysis tables give it.
#[derive(Clone, Debug, Default)]
pub struct PathPiece {
    pub start_ns: u64,
    pub end_ns: u64,
    /// `RUNNING`, `PREEMPTED`, `BLOCKED`, `BLOCK_DEVICE`, …
    pub state: String,
    pub tid: Option<i64>,
    pub comm: Option<String>,
    pub syscall: Option<String>,
    /// The request this piece waited for, as `[service] operation` or an id.
    pub blocked_by_request: Option<String>,
    /// Time of a PREEMPTED piece spent throttled by a CPU cgroup quota.
    pub throttled_ns: u64,
}

/// The run's samples by thread, in time order. It owns them, so that a
/// long-lived holder (the UI server) keeps one copy.
pub struct SampleIndex {
    by_tid: HashMap<i32, Vec<Sample>>,
}

impl SampleIndex {
    pub fn new(samples: Vec<Sample>) -> SampleIndex {
        let mut by_tid: HashMap<i32, Vec<Sample>> = HashMap::new();
        for s in samples {
            by_tid.entry(s.tid).or_default().push(s);
        }
        for list in by_tid.values_mut() {
            list.sort_by_key(|s| s.time_ns);
        }
        SampleIndex { by_tid }
    }

    /// How many samples it holds.
    pub fn len(&self) -> usize {
        self.by_tid.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_tid.is_empty()
    }

    /// The samples of `tid` in `[start, end)`.
    pub fn within(&self, tid: i32, start: u64, end: u64) -> &[Sample] {
        let Some(list) = self.by_tid.get(&tid) else {
            return &[];
        };
        let from = list.partition_point(|s| s.time_ns < start);
        let to = list.partition_point(|s| s.time_ns < end);
        &list[from..to.max(from)]
    }
}

/// What went into a profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub on_cpu_ns: u64,
    pub off_cpu_ns: u64,
    /// CPU samples placed on RUNNING pieces.
    pub samples: u64,
    /// RUNNING time in pieces that no sample fell in (short pieces).
    pub unsampled_ns: u64,
}

impl Totals {
    pub fn add(&mut self, other: Totals) {
        self.on_cpu_ns += other.on_cpu_ns;
        self.off_cpu_ns += other.off_cpu_ns;
        self.samples += other.samples;
        self.unsampled_ns += other.unsampled_ns;
    }
}

/// What a stack stands for: samples and wall time, on or off the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackValue<'a> {
    /// CPU samples behind the stack (0 for off-CPU and unsampled time).
    pub samples: u64,
    pub wall_ns: u64,
    /// The kernel state of an off-CPU stack; None when on the CPU.
    pub off_cpu_state: Option<&'a str>,
}

/// Where [`add_request`] puts the stacks it builds: a pprof profile
/// ([`crate::PprofBuilder`]) or a flame tree ([`crate::FlameTree`]).
pub trait StackSink {
    /// One stack, root first.
    fn add_stack(&mut self, root_first: &[Frame], value: StackValue);
}

/// Adds one request's path to `out` under the root frame `root`.
///
/// A thread's RUNNING time on the path is shared among all the samples it
/// took inside its RUNNING pieces, not piece by piece: pieces are often
/// shorter than the sampling period (a preempted thread), and a sample
/// stands for the code of the whole period around it.
pub fn add_request(
    out: &mut impl StackSink,
    root: &str,
    path: &[PathPiece],
    samples: &SampleIndex,
    symbols: &mut Symbols,
) -> Totals {
    let mut totals = Totals::default();
    // tid (None: interrupt context) → (thread frame, RUNNING ns, samples).
    let mut running: Vec<(Option<i64>, Frame, u64, Vec<&Sample>)> = Vec::new();
    for piece in path {
        let ns = piece.end_ns.saturating_sub(piece.start_ns);
        if ns == 0 {
            continue;
        }
        let thread = thread_frame(piece);
        if piece.state == "RUNNING" {
            totals.on_cpu_ns += ns;
            let taken = piece.tid.map_or(&[][..], |tid| {
                samples.within(tid as i32, piece.start_ns, piece.end_ns)
            });
            match running.iter_mut().find(|r| r.0 == piece.tid) {
                Some(r) => {
                    r.2 += ns;
                    r.3.extend(taken);
                }
                None => running.push((piece.tid, thread, ns, taken.iter().collect())),
            }
        } else {
            totals.off_cpu_ns += ns;
            let mut stack = vec![marker(root), thread, marker(&off_cpu_label(piece))];
            if let Some(call) = &piece.syscall {
                stack.push(Frame {
                    function: format!("syscall: {call}"),
                    module: "[kernel]".into(),
                });
            }
            out.add_stack(
                &stack,
                StackValue {
                    samples: 0,
                    wall_ns: ns,
                    off_cpu_state: Some(&piece.state),
                },
            );
        }
    }
    for (_, thread, ns, taken) in running {
        if taken.is_empty() {
            totals.unsampled_ns += ns;
            let stack = [marker(root), thread, marker("[on-CPU: not sampled]")];
            out.add_stack(
                &stack,
                StackValue {
                    samples: 0,
                    wall_ns: ns,
                    off_cpu_state: None,
                },
            );
            continue;
        }
        totals.samples += taken.len() as u64;
        let n = taken.len() as u64;
        for (i, s) in taken.iter().enumerate() {
            // Shares that add up to the thread's RUNNING time exactly.
            let share = ns / n + u64::from((i as u64) < ns % n);
            let mut stack = vec![marker(root), thread.clone(), marker("[on-CPU]")];
            let leaf_first: Vec<(u64, bool)> = s.frames().collect();
            stack.extend(
                leaf_first
                    .iter()
                    .rev()
                    .map(|&(addr, kernel)| symbols.frame(s.pid, addr, kernel)),
            );
            out.add_stack(
                &stack,
                StackValue {
                    samples: 1,
                    wall_ns: share,
                    off_cpu_state: None,
                },
            );
        }
    }
    totals
}

fn thread_frame(piece: &PathPiece) -> Frame {
    marker(&match (piece.tid, &piece.comm) {
        (Some(tid), Some(comm)) => format!("{comm}/{tid}"),
        (Some(tid), None) => format!("tid {tid}"),
        (None, _) => "[interrupt context]".to_string(),
    })
}

/// `[off-CPU: STATE]`, `[off-CPU: PREEMPTED (throttled)]`, and for time
/// spent waiting on another request, what that request's thread was doing:
/// `[off-CPU: blocked by request X: TIMER]`.
pub fn off_cpu_label(piece: &PathPiece) -> String {
    let throttled = piece.state == "PREEMPTED"
        && piece.throttled_ns * 2 >= piece.end_ns.saturating_sub(piece.start_ns);
    let state = if throttled {
        "PREEMPTED (throttled)".to_string()
    } else {
        piece.state.clone()
    };
    match &piece.blocked_by_request {
        Some(x) => format!("[off-CPU: blocked by request {x}: {state}]"),
        None => format!("[off-CPU: {state}]"),
    }
}

fn marker(name: &str) -> Frame {
    Frame {
        function: name.to_string(),
        module: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::PprofBuilder;
    use crate::samples::{PERF_CONTEXT_KERNEL, PERF_CONTEXT_USER};

    #[test]
    fn on_and_off_cpu_time_add_up_to_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut symbols = Symbols::open(dir.path());
        let sample = |t: u64, tid: i32| Sample {
            time_ns: t,
            pid: 1,
            tid,
            cpu: 0,
            callchain: vec![
                PERF_CONTEXT_KERNEL,
                0xffff_ffff_8100_0000,
                PERF_CONTEXT_USER,
                0x1000,
                0x2000,
            ],
        };
        let samples = vec![
            sample(100, 5),
            sample(150, 5),
            sample(180, 5),
            sample(400, 6),
            sample(950, 5),
        ];
        let index = SampleIndex::new(samples);
        let piece = |start, end, state: &str, tid| PathPiece {
            start_ns: start,
            end_ns: end,
            state: state.into(),
            tid: Some(tid),
            comm: Some("w".into()),
            ..PathPiece::default()
        };
        let path = vec![
            piece(90, 200, "RUNNING", 5),
            PathPiece {
                throttled_ns: 250,
                ..piece(200, 500, "PREEMPTED", 5)
            },
            PathPiece {
                syscall: Some("futex".into()),
                ..piece(500, 700, "BLOCKED", 5)
            },
            piece(700, 900, "RUNNING", 6),
            // A piece of tid 5 too short for a sample of its own.
            piece(900, 920, "RUNNING", 5),
        ];
        let mut out = PprofBuilder::new(0, 830);
        let totals = add_request(&mut out, "[svc] GET /x", &path, &index, &mut symbols);
        assert_eq!(
            totals,
            Totals {
                on_cpu_ns: 110 + 200 + 20,
                off_cpu_ns: 300 + 200,
                samples: 3,
                unsampled_ns: 200
            }
        );
        let profile = out.finish();
        let wall: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(wall, 830);
        let names: Vec<&str> = profile
            .function
            .iter()
            .map(|f| profile.string_table[f.name as usize].as_str())
            .collect();
        for expected in [
            "[off-CPU: PREEMPTED (throttled)]",
            "[off-CPU: BLOCKED]",
            "syscall: futex",
            "w/5",
            "[on-CPU]",
            "[on-CPU: not sampled]",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} missing from {names:?}"
            );
        }
        // Tid 5's three samples share its 130 ns of RUNNING (the sample at
        // 950 is outside the path); tid 6's 200 ns had no sample.
        let on: Vec<i64> = profile
            .sample
            .iter()
            .filter(|s| s.value[0] == 1)
            .map(|s| s.value[1])
            .collect();
        assert_eq!(on, vec![44, 43, 43]);
    }
}
