//! The k-way merge with each input produced on a thread of its own.
//!
//! Decoding (turning ring-buffer records or CTF packets into typed events)
//! is most of the cost of reading a trace and is independent per stream;
//! consumers need one time-ordered stream. So each stream runs on a scoped
//! thread that sends batches, and the calling thread merges the batches and
//! hands items to a sink. The order is [`crate::Merge`]'s: by timestamp,
//! equal timestamps in stream order, then in order within a stream, so the
//! result is identical to a sequential merge.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};

use crate::Timestamped;

/// Items per batch sent from a producing thread: large enough that channel
/// traffic is negligible, small enough that memory stays bounded (a few
/// batches per stream in flight).
const BATCH: usize = 4096;
const BATCHES_IN_FLIGHT: usize = 4;

/// Drains `streams` (each time-ordered), each on its own thread, into
/// `sink` in merged order. The first error of any stream stops everything
/// (items before it, in merged order, have been handed out) and is returned.
///
/// Each item is cloned out of its batch; [`merge_parallel_ref`] lends it
/// instead, which is cheaper for large items.
pub fn merge_parallel<T, E, S>(streams: Vec<S>, sink: &mut dyn FnMut(T)) -> Result<(), E>
where
    T: Timestamped + Send + Clone,
    S: Iterator<Item = Result<T, E>> + Send,
    E: Send,
{
    merge_parallel_ref(streams, &mut |item: &T| sink(item.clone()))
}

/// Like [`merge_parallel`], but lends each item to `sink` where it lies in
/// its batch: an item is written once, by its producer, and never moved
/// again (events are about 100 bytes, and moving them through the merge
/// cost more than the merge's comparisons). Emptied batches go back to
/// their producer for reuse, so steady-state merging allocates nothing.
pub fn merge_parallel_ref<T, E, S>(streams: Vec<S>, sink: &mut dyn FnMut(&T)) -> Result<(), E>
where
    T: Timestamped + Send,
    S: Iterator<Item = Result<T, E>> + Send,
    E: Send,
{
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mut links: Vec<Link<T, E>> = Vec::new();
        for stream in streams {
            let (tx, full) = sync_channel(BATCHES_IN_FLIGHT);
            // Unbounded, but never holds more batches than were sent.
            let (give_back, spare) = channel::<Vec<T>>();
            links.push(Link { full, give_back });
            let stop = &stop;
            scope.spawn(move || {
                let fresh = || {
                    spare
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(BATCH))
                };
                let mut batch = fresh();
                for item in stream {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    match item {
                        Ok(i) => {
                            batch.push(i);
                            if batch.len() == BATCH {
                                let full = std::mem::replace(&mut batch, fresh());
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
        let result = merge_batches(&links, sink);
        // Unblock and end the producers on every exit path.
        stop.store(true, Ordering::Relaxed);
        drop(links);
        result
    })
}

/// The merging thread's ends of one producer's channels.
struct Link<T, E> {
    full: Receiver<Result<Vec<T>, E>>,
    give_back: Sender<Vec<T>>,
}

fn merge_batches<T: Timestamped, E>(
    links: &[Link<T, E>],
    sink: &mut dyn FnMut(&T),
) -> Result<(), E> {
    /// A stream's current batch and the position of its next item.
    struct Cursor<T> {
        batch: Vec<T>,
        at: usize,
    }
    // Makes `c.at` point at an item of stream `link`, pulling batches as
    // needed; `Ok(false)` when the stream has ended.
    fn refill<T, E>(link: &Link<T, E>, c: &mut Cursor<T>) -> Result<bool, E> {
        while c.at >= c.batch.len() {
            match link.full.recv() {
                Ok(Ok(b)) => {
                    let mut used = std::mem::replace(&mut c.batch, b);
                    c.at = 0;
                    if used.capacity() > 0 {
                        used.clear();
                        // The producer may be gone; the batch is then dropped.
                        let _ = link.give_back.send(used);
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    let mut cursors: Vec<Cursor<T>> = Vec::with_capacity(links.len());
    let mut heap = BinaryHeap::with_capacity(links.len());
    for (i, link) in links.iter().enumerate() {
        let mut c = Cursor {
            batch: Vec::new(),
            at: 0,
        };
        if refill(link, &mut c)? {
            heap.push(Reverse((c.batch[c.at].timestamp(), i)));
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
            while let Some(item) = c.batch.get(c.at) {
                if next.is_some_and(|n| (item.timestamp(), i) > n) {
                    break;
                }
                sink(item);
                c.at += 1;
            }
            if c.at < c.batch.len() {
                heap.push(Reverse((c.batch[c.at].timestamp(), i)));
                break;
            }
            if !refill(&links[i], c)? {
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
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
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
                input
                    .iter()
                    .map(|s| s.clone().into_iter().map(Ok::<_, ()>))
                    .collect(),
            )
            .map(|r| r.unwrap())
            .collect();
            let mut parallel = Vec::new();
            merge_parallel(
                input
                    .iter()
                    .map(|s| s.clone().into_iter().map(Ok::<_, ()>))
                    .collect(),
                &mut |i| parallel.push(i),
            )
            .unwrap();
            assert_eq!(parallel, sequential);
        }
    }

    #[test]
    fn the_first_error_stops_the_merge() {
        let good = (0..100_000u64).map(|t| Ok(Item(t, 0, 0)));
        let bad = (0..10u64).map(|t| {
            if t < 5 {
                Ok(Item(t, 1, 0))
            } else {
                Err("corrupt packet")
            }
        });
        let mut seen = 0;
        let r = merge_parallel(
            vec![
                Box::new(good) as Box<dyn Iterator<Item = _> + Send>,
                Box::new(bad),
            ],
            &mut |_| seen += 1,
        );
        assert_eq!(r, Err("corrupt packet"));
        assert!(seen < 100_000);
    }
}
