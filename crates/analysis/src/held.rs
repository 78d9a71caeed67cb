//! When a CPU cgroup's quota held threads back (CFS bandwidth throttling),
//! from the switch-outs the recorder saw it cause
//! (`kernel/cfs_throttle.tsv`).
//!
//! Throttling leaves no event of its own in a trace: a throttled thread
//! is simply runnable and not running. Without these intervals the
//! analysis tells it from contention by the CPU going idle while the
//! thread waits ([`crate::request`]'s `cpu_wait`), which fails when other
//! work keeps that CPU busy. With them, a wait inside an interval is
//! throttled whoever runs meanwhile.
//!
//! A throttled switch-out holds its thread back until it runs again. The
//! kernel lets it go a little earlier (when the quota is refilled), and
//! the thread may then wait for its turn on a busy CPU; that turn is
//! counted as throttled too, since without the quota the thread would not
//! have left the CPU.
//!
//! A complete capture (it ran for the whole trace and lost nothing) also
//! says when a thread was *not* throttled: the analysis then infers no
//! throttling at all, since its inference misfires beside other busy
//! threads (a thread kept from its fair turns by a dozen runnable ones on
//! two CPUs is contention, not a quota).

use deepspan_model::Tid;

use crate::state::{KernelModel, ThreadState};
use rustc_hash::FxHashMap;

/// Per thread, the sorted, disjoint intervals `[start, end)` it was held
/// back by its cgroup's quota.
///
/// The default is no capture: nothing recorded, and nothing known.
#[derive(Clone, Debug, Default)]
pub struct HeldBack {
    by_thread: FxHashMap<Tid, Vec<(u64, u64)>>,
    complete: bool,
}

impl HeldBack {
    /// From a complete capture's throttled switch-outs `(tid, ts)`, in any
    /// order: each within the model holds its thread back from `ts` until
    /// the thread next runs in `model`, or until the model's end.
    pub fn from_switches(
        switches: impl IntoIterator<Item = (Tid, u64)>,
        model: &KernelModel,
    ) -> HeldBack {
        let (model_start, model_end) = model.time_range();
        let mut by_thread: FxHashMap<Tid, Vec<(u64, u64)>> = FxHashMap::default();
        // A switch-out before the trace begins is left out: the thread may
        // have run since, unseen (a flight window's history holds switches
        // from minutes before, of threads that ran many times since).
        for (tid, ts) in switches.into_iter().filter(|&(_, ts)| ts >= model_start) {
            let states = model.thread(tid).map_or(&[][..], |th| th.states());
            let after = states.partition_point(|s| s.start <= ts);
            let end = states[after..]
                .iter()
                .find(|s| s.state == ThreadState::Running)
                .map_or(model_end, |s| s.start);
            if end > ts {
                by_thread.entry(tid).or_default().push((ts, end));
            }
        }
        for intervals in by_thread.values_mut() {
            intervals.sort_unstable();
            // Two switch-outs before one run (one run was lost): one
            // interval.
            intervals.dedup_by(|next, kept| {
                let overlaps = next.0 <= kept.1;
                if overlaps {
                    kept.1 = kept.1.max(next.1);
                }
                overlaps
            });
        }
        HeldBack {
            by_thread,
            complete: true,
        }
    }

    /// The same intervals from a capture that missed some switch-outs
    /// (records lost to its ring, or a host of a merged run without the
    /// capture): a wait outside them may still have been throttled.
    pub fn with_gaps(self) -> HeldBack {
        HeldBack {
            complete: false,
            ..self
        }
    }

    /// Whether every throttled switch-out of the trace is in the
    /// intervals, so that a wait outside them was not throttled.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// `tid`'s intervals, sorted.
    fn of(&self, tid: Tid) -> &[(u64, u64)] {
        self.by_thread.get(&tid).map_or(&[], Vec::as_slice)
    }

    /// Splits `[start, end)` by `tid`'s intervals: returns how much of it
    /// the thread was held back, and puts the rest, in order, in `free`
    /// (cleared first).
    pub fn split(&self, tid: Tid, start: u64, end: u64, free: &mut Vec<(u64, u64)>) -> u64 {
        free.clear();
        let held = self.of(tid);
        let first = held.partition_point(|&(_, e)| e <= start);
        let mut at = start;
        let mut held_ns = 0;
        for &(s, e) in &held[first..] {
            if s >= end {
                break;
            }
            let (s, e) = (s.max(at), e.min(end));
            if s > at {
                free.push((at, s));
            }
            held_ns += e - s;
            at = e;
        }
        if at < end {
            free.push((at, end));
        }
        held_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(intervals: &[(Tid, u64, u64)]) -> HeldBack {
        let mut by_thread: FxHashMap<Tid, Vec<(u64, u64)>> = FxHashMap::default();
        for &(tid, s, e) in intervals {
            by_thread.entry(tid).or_default().push((s, e));
        }
        HeldBack {
            by_thread,
            complete: true,
        }
    }

    #[test]
    fn split_gives_the_held_time_and_the_free_pieces() {
        let held = held(&[(7, 10, 20), (7, 30, 40)]);
        let mut free = Vec::new();
        assert_eq!(held.split(7, 0, 100, &mut free), 20);
        assert_eq!(free, vec![(0, 10), (20, 30), (40, 100)]);
        assert_eq!(held.split(7, 15, 35, &mut free), 10);
        assert_eq!(free, vec![(20, 30)]);
        assert_eq!(held.split(7, 12, 18, &mut free), 6);
        assert!(free.is_empty());
        assert_eq!(held.split(8, 12, 18, &mut free), 0);
        assert_eq!(free, vec![(12, 18)]);
    }
}
