//! Request inputs for hand-made scenarios: which span each thread works
//! for, and a request active on one thread for its whole time.

use deepspan_analysis::{ActivationInput, SpanIdx, SpanInput, ThreadWork, WorkInterval};
use deepspan_model::Tid;

/// Which span each thread works for: `(tid, start, end, span)`.
pub struct Work(pub Vec<(Tid, u64, u64, SpanIdx)>);

impl ThreadWork for Work {
    fn work_during(&self, tid: Tid, start: u64, end: u64, out: &mut Vec<WorkInterval>) {
        for &(t, a, b, s) in &self.0 {
            if t == tid && a < end && start < b {
                out.push(WorkInterval {
                    start: a.max(start),
                    end: b.min(end),
                    span: s,
                });
            }
        }
    }
}

pub fn request(tid: Tid, start: u64, end: u64) -> SpanInput {
    SpanInput {
        times: Some((start, end)),
        exact_times: true,
        holder: Some(tid),
        activations: vec![
            ActivationInput {
                tid,
                ts: start,
                on: true,
            },
            ActivationInput {
                tid,
                ts: end,
                on: false,
            },
        ],
        ..SpanInput::default()
    }
}
