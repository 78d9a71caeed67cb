//! Building the kernel model from per-CPU (per-stream) event readers, with
//! the decoding of each stream on its own thread and the model fed on the
//! calling thread in the readers' own order, so the model is identical to a
//! sequential decode's.

use std::collections::HashMap;

use deepspan_model::{merge_parallel_ref, Event, Timestamped};

use crate::state::{KernelModel, LostRange, StateBuilder};

/// One item of a decoded stream.
#[derive(Clone, Debug)]
pub enum Input {
    Event(Event),
    /// The reader says `count` events of `cpu` were lost before `ts`.
    Lost {
        cpu: u32,
        ts: u64,
        count: u64,
    },
    /// A TCP segment recorded leaving or entering a device on `cpu`
    /// (`record --tcp-keys`; see [`crate::StateBuilder::segment`]).
    Segment {
        cpu: u32,
        ts: u64,
        /// The thread current at the segment (the recording's view).
        tid: deepspan_model::Tid,
        key: u64,
        direction: crate::PacketDirection,
    },
    /// A thread went to sleep inside system call `nr` (the recorder's
    /// switch-out capture; see [`crate::StateBuilder::blocked_syscall`]).
    BlockedSyscall {
        ts: u64,
        tid: deepspan_model::Tid,
        nr: i32,
        args: [u64; 3],
        /// The thread's bytes read so far (`rchar`), when recorded.
        read_chars: Option<u64>,
    },
    /// A socket receive or send returned (the recorder's
    /// socket-call capture; see [`crate::StateBuilder::socket_call`]).
    SocketCall {
        ts: u64,
        tid: deepspan_model::Tid,
        sent: bool,
        bytes: u64,
        socket: Option<deepspan_model::Socket>,
    },
    /// The idle task gave `cpu` to `tid` (the recorder's capture of the
    /// switches out of idle that ftrace loses; see
    /// [`crate::StateBuilder::idle_switch`]).
    IdleSwitch {
        cpu: u32,
        ts: u64,
        tid: deepspan_model::Tid,
    },
}

impl Timestamped for Input {
    fn timestamp(&self) -> u64 {
        match self {
            Input::Event(e) => e.ts,
            Input::Lost { ts, .. }
            | Input::Segment { ts, .. }
            | Input::BlockedSyscall { ts, .. }
            | Input::SocketCall { ts, .. }
            | Input::IdleSwitch { ts, .. } => *ts,
        }
    }
}

/// Lost-event ranges of a model with how many events each lost.
#[derive(Clone, Debug, Default)]
pub struct LostEvents {
    /// Sorted by range start.
    pub ranges: Vec<(LostRange, u64)>,
}

impl LostEvents {
    /// Events lost in ranges that overlap `[start, end)`.
    pub fn in_range(&self, start: u64, end: u64) -> u64 {
        self.ranges
            .iter()
            .take_while(|(r, _)| r.start < end.max(start.saturating_add(1)))
            .filter(|(r, _)| start < r.end.max(r.start.saturating_add(1)))
            .map(|(_, n)| *n)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.ranges.iter().map(|(_, n)| n).sum()
    }
}

/// Builds the model from streams, each time-ordered (typically one per
/// CPU, in CPU order), decoding them in parallel
/// ([`deepspan_model::merge_parallel_ref`]), into `builder` (a
/// [`StateBuilder::new`], or [`StateBuilder::without_graph`] when no
/// critical path will be asked for). `progress(items)` is called now and
/// then with the number of items merged so far.
///
/// The first error of any stream stops everything and is returned.
pub fn build_model<S, E>(
    mut builder: StateBuilder,
    streams: Vec<S>,
    progress: &mut dyn FnMut(u64),
) -> Result<(KernelModel, LostEvents), E>
where
    S: Iterator<Item = Result<Input, E>> + Send,
    E: Send,
{
    let mut counts: HashMap<(u32, u64), u64> = HashMap::new();
    let mut merged = 0u64;
    merge_parallel_ref(streams, &mut |item| {
        match *item {
            Input::Event(ref e) => builder.push(e),
            Input::Lost { cpu, ts, count } => {
                builder.lost(cpu, ts);
                *counts.entry((cpu, ts)).or_default() += count;
            }
            Input::Segment {
                cpu,
                ts,
                tid,
                key,
                direction,
            } => builder.segment(ts, cpu, tid, key, direction),
            Input::BlockedSyscall {
                ts,
                tid,
                nr,
                args,
                read_chars,
            } => builder.blocked_syscall(ts, tid, nr, args, read_chars),
            Input::SocketCall {
                ts,
                tid,
                sent,
                bytes,
                socket,
            } => builder.socket_call(ts, tid, sent, bytes, socket),
            Input::IdleSwitch { cpu, ts, tid } => builder.idle_switch(ts, cpu, tid),
        }
        merged += 1;
        if merged.is_multiple_of(65_536) {
            progress(merged);
        }
    })?;
    progress(merged);
    let model = builder.finish();
    // The model's ranges end where the reader said events were lost.
    let ranges = model
        .lost_ranges()
        .iter()
        .map(|r| (*r, counts.remove(&(r.cpu, r.end)).unwrap_or(0)))
        .collect();
    Ok((model, LostEvents { ranges }))
}
