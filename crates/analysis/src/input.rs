//! Building the kernel model from per-CPU (per-stream) event readers, with
//! the decoding of each stream on its own thread.
//!
//! Decoding (turning ring-buffer records into typed events) is most of the
//! cost of an analysis and is independent per CPU; the model needs one
//! time-ordered stream. So each stream is decoded on a thread of its own
//! into batches, and the calling thread merges the batches and feeds the
//! [`StateBuilder`]. The merge is the same as the readers' own (by
//! timestamp, equal timestamps in stream order, then in stream order within
//! a stream), so the model is identical to a sequential decode's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use deepspan_model::{Event, Timestamped};

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
}

impl Timestamped for Input {
    fn timestamp(&self) -> u64 {
        match self {
            Input::Event(e) => e.ts,
            Input::Lost { ts, .. } => *ts,
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

/// Items per batch sent from a decoding thread: large enough that channel
/// traffic is negligible, small enough that memory stays bounded (a few
/// batches per stream in flight).
const BATCH: usize = 4096;
const BATCHES_IN_FLIGHT: usize = 4;

/// Builds the model from streams, each time-ordered (typically one per
/// CPU, in CPU order), decoding them in parallel, into `builder` (a
/// [`StateBuilder::new`], or [`StateBuilder::without_graph`] when no
/// critical path will be asked for). `progress(items)` is called now and
/// then with the number of items merged so far.
///
/// The first error of any stream stops everything and is returned.
pub fn build_model<S, E>(
    builder: StateBuilder,
    streams: Vec<S>,
    progress: &mut dyn FnMut(u64),
) -> Result<(KernelModel, LostEvents), E>
where
    S: Iterator<Item = Result<Input, E>> + Send,
    E: Send,
{
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mut receivers: Vec<Receiver<Result<Vec<Input>, E>>> = Vec::new();
        for stream in streams {
            let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
            receivers.push(rx);
            let stop = &stop;
            scope.spawn(move || {
                let mut batch = Vec::with_capacity(BATCH);
                for item in stream {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    match item {
                        Ok(i) => {
                            batch.push(i);
                            if batch.len() == BATCH {
                                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                                if tx.send(Ok(full)).is_err() {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            if !batch.is_empty() {
                                let _ = tx.send(Ok(std::mem::take(&mut batch)));
                            }
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
                if !batch.is_empty() {
                    let _ = tx.send(Ok(batch));
                }
            });
        }
        let result = merge_into_model(builder, &receivers, progress);
        // Unblock and end the decoders on every exit path.
        stop.store(true, Ordering::Relaxed);
        drop(receivers);
        result
    })
}

fn merge_into_model<E>(
    mut builder: StateBuilder,
    receivers: &[Receiver<Result<Vec<Input>, E>>],
    progress: &mut dyn FnMut(u64),
) -> Result<(KernelModel, LostEvents), E> {
    struct Cursor {
        batch: std::vec::IntoIter<Input>,
        head: Option<Input>,
    }
    // The next item of stream `i`, pulling batches as needed.
    fn advance<E>(rx: &Receiver<Result<Vec<Input>, E>>, c: &mut Cursor) -> Result<(), E> {
        loop {
            if let Some(x) = c.batch.next() {
                c.head = Some(x);
                return Ok(());
            }
            match rx.recv() {
                Ok(Ok(b)) => c.batch = b.into_iter(),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    c.head = None;
                    return Ok(());
                }
            }
        }
    }

    let mut counts: HashMap<(u32, u64), u64> = HashMap::new();
    let mut cursors: Vec<Cursor> = Vec::with_capacity(receivers.len());
    let mut heap = BinaryHeap::with_capacity(receivers.len());
    for (i, rx) in receivers.iter().enumerate() {
        let mut c = Cursor {
            batch: Vec::new().into_iter(),
            head: None,
        };
        advance(rx, &mut c)?;
        if let Some(h) = &c.head {
            heap.push(Reverse((h.timestamp(), i)));
        }
        cursors.push(c);
    }
    let mut merged = 0u64;
    while let Some(Reverse((_, i))) = heap.pop() {
        let c = &mut cursors[i];
        // The next stream in order; this one's items go first while they
        // sort before it (equal times: the lower stream index first, as in
        // the readers), with no heap traffic.
        let next = heap.peek().map(|Reverse(k)| *k);
        loop {
            match c.head.take() {
                Some(Input::Event(e)) => builder.push(&e),
                Some(Input::Lost { cpu, ts, count }) => {
                    builder.lost(cpu, ts);
                    *counts.entry((cpu, ts)).or_default() += count;
                }
                None => {}
            }
            merged += 1;
            if merged % 65_536 == 0 {
                progress(merged);
            }
            advance(&receivers[i], c)?;
            let Some(h) = &c.head else { break };
            let key = (h.timestamp(), i);
            if next.is_some_and(|n| key > n) {
                heap.push(Reverse(key));
                break;
            }
        }
    }
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
