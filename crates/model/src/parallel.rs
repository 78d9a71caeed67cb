//! The k-way merge with each input produced on a thread of its own.
//!
//! Decoding (turning ring-buffer records or CTF packets into typed events)
//! is most of the cost of reading a trace and is independent per stream;
//! consumers need one time-ordered stream. So each stream runs on a scoped
//! thread that sends batches, and the calling thread merges the batches and
//! hands items to a sink. The order is [`crate::Merge`]'s: by timestamp,
//! equal timestamps in stream order, then in order within a stream, so the
//! result is identical to a sequential merge.

use std::collections::BinaryHeap;
use std::cmp::Reverse;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use crate::Timestamped;

/// Items per batch sent from a producing thread: large enough that channel
/// traffic is negligible, small enough that memory stays bounded (a few
/// batches per stream in flight).
const BATCH: usize = 4096;
const BATCHES_IN_FLIGHT: usize = 4;

/// Drains `streams` (each time-ordered), each on its own thread, into
/// `sink` in merged order. The first error of any stream stops everything
/// (items before it, in merged order, have been handed out) and is returned.
pub fn merge_parallel<T, E, S>(streams: Vec<S>, sink: &mut dyn FnMut(T)) -> Result<(), E>
where
    T: Timestamped + Send,
    S: Iterator<Item = Result<T, E>> + Send,
    E: Send,
{
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mut receivers: Vec<Receiver<Result<Vec<T>, E>>> = Vec::new();
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
        let result = merge_batches(&receivers, sink);
        // Unblock and end the producers on every exit path.
        stop.store(true, Ordering::Relaxed);
        drop(receivers);
        result
    })
}

fn merge_batches<T: Timestamped, E>(
    receivers: &[Receiver<Result<Vec<T>, E>>],
    sink: &mut dyn FnMut(T),
) -> Result<(), E> {
    struct Cursor<T> {
        batch: std::vec::IntoIter<T>,
        head: Option<T>,
    }
    // The next item of stream `i`, pulling batches as needed.
    fn advance<T, E>(rx: &Receiver<Result<Vec<T>, E>>, c: &mut Cursor<T>) -> Result<(), E> {
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

    let mut cursors: Vec<Cursor<T>> = Vec::with_capacity(receivers.len());
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
    while let Some(Reverse((_, i))) = heap.pop() {
        let c = &mut cursors[i];
        // The next stream in order; this one's items go first while they
        // sort before it (equal times: the lower stream index first), with
        // no heap traffic.
        let next = heap.peek().map(|Reverse(k)| *k);
        loop {
            if let Some(item) = c.head.take() {
                sink(item);
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Merge;

    #[derive(Debug, Clone, PartialEq)]
    struct Item(u64, usize, usize);

    impl Timestamped for Item {
        fn timestamp(&self) -> u64 {
            self.0
        }
    }

    fn streams(seed: u64) -> Vec<Vec<Item>> {
        // A small LCG: several streams with many equal timestamps.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        (0..4)
            .map(|s| {
                let mut t = 0;
                (0..(next() % 20_000) as usize)
                    .map(|k| {
                        t += next() % 3;
                        Item(t, s, k)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn same_order_as_the_sequential_merge() {
        for seed in 0..5 {
            let input = streams(seed);
            let sequential: Vec<Item> = Merge::new(
                input.iter().map(|s| s.clone().into_iter().map(Ok::<_, ()>)).collect(),
            )
            .map(|r| r.unwrap())
            .collect();
            let mut parallel = Vec::new();
            merge_parallel(
                input.iter().map(|s| s.clone().into_iter().map(Ok::<_, ()>)).collect(),
                &mut |i| parallel.push(i),
            )
            .unwrap();
            assert_eq!(parallel, sequential);
        }
    }

    #[test]
    fn the_first_error_stops_the_merge() {
        let good = (0..100_000u64).map(|t| Ok(Item(t, 0, 0)));
        let bad = (0..10u64).map(|t| if t < 5 { Ok(Item(t, 1, 0)) } else { Err("corrupt packet") });
        let mut seen = 0;
        let r = merge_parallel(
            vec![Box::new(good) as Box<dyn Iterator<Item = _> + Send>, Box::new(bad)],
            &mut |_| seen += 1,
        );
        assert_eq!(r, Err("corrupt packet"));
        assert!(seen < 100_000);
    }
}
