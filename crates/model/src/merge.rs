//! K-way merge of time-ordered streams (one per CPU, per CTF stream, …) into
//! one time-ordered stream.
//!
//! Streaming: holds one pending item per input, so memory does not depend on
//! the trace size. Stable: items with equal timestamps come out in input
//! order (lower stream index first, and in their own order within a stream),
//! so a decode is deterministic.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Something with a position on the common time base.
pub trait Timestamped {
    fn timestamp(&self) -> u64;
}

impl Timestamped for crate::Event {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

/// Merges fallible, individually time-ordered iterators.
///
/// An `Err` from an input is passed through as soon as that input is polled,
/// and that input is then dropped: a reader error is never silently skipped,
/// and the other inputs can still be drained by the caller if it wishes.
pub struct Merge<I, T, E>
where
    I: Iterator<Item = Result<T, E>>,
{
    inputs: Vec<I>,
    /// The pending head of each input (None once exhausted).
    heads: Vec<Option<T>>,
    /// (timestamp, input index) of every pending head; the min-heap gives
    /// the next item, the index breaks ties so equal timestamps stay stable.
    order: BinaryHeap<Reverse<(u64, usize)>>,
    /// Inputs that returned an error; they are never polled again.
    failed: Vec<bool>,
    /// Inputs that have not been polled yet (first poll is lazy so that an
    /// error in any input surfaces through `next`, not in the constructor).
    unprimed: Vec<usize>,
}

impl<I, T, E> Merge<I, T, E>
where
    I: Iterator<Item = Result<T, E>>,
    T: Timestamped,
{
    pub fn new(inputs: Vec<I>) -> Self {
        let n = inputs.len();
        Merge {
            inputs,
            heads: (0..n).map(|_| None).collect(),
            order: BinaryHeap::with_capacity(n),
            failed: vec![false; n],
            unprimed: (0..n).rev().collect(),
        }
    }

    /// Pulls the next item of input `idx` into its head slot.
    fn refill(&mut self, idx: usize) -> Result<(), E> {
        if self.failed[idx] {
            return Ok(());
        }
        match self.inputs[idx].next() {
            Some(Ok(item)) => {
                self.order.push(Reverse((item.timestamp(), idx)));
                self.heads[idx] = Some(item);
                Ok(())
            }
            Some(Err(e)) => {
                self.failed[idx] = true;
                Err(e)
            }
            None => Ok(()),
        }
    }
}

impl<I, T, E> Iterator for Merge<I, T, E>
where
    I: Iterator<Item = Result<T, E>>,
    T: Timestamped,
{
    type Item = Result<T, E>;

    fn next(&mut self) -> Option<Self::Item> {
        while let Some(idx) = self.unprimed.pop() {
            if let Err(e) = self.refill(idx) {
                return Some(Err(e));
            }
        }
        let Reverse((_, idx)) = self.order.pop()?;
        let item = self.heads[idx]
            .take()
            .expect("heap entry always has a head");
        if let Err(e) = self.refill(idx) {
            // Hand out the error now; the good item is returned on the next
            // call so that nothing decoded is lost.
            self.heads[idx] = Some(item);
            self.order.push(Reverse((
                self.heads[idx].as_ref().unwrap().timestamp(),
                idx,
            )));
            return Some(Err(e));
        }
        Some(Ok(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Item(u64, usize, usize); // ts, stream, position in stream

    impl Timestamped for Item {
        fn timestamp(&self) -> u64 {
            self.0
        }
    }

    fn streams(tss: &[Vec<u64>]) -> Vec<std::vec::IntoIter<Result<Item, String>>> {
        tss.iter()
            .enumerate()
            .map(|(s, ts)| {
                ts.iter()
                    .enumerate()
                    .map(|(i, &t)| Ok(Item(t, s, i)))
                    .collect::<Vec<_>>()
                    .into_iter()
            })
            .collect()
    }

    #[test]
    fn equal_timestamps_keep_stream_order() {
        let out: Vec<Item> = Merge::new(streams(&[vec![5, 5], vec![5], vec![1, 5]]))
            .map(Result::unwrap)
            .collect();
        let order: Vec<(u64, usize, usize)> = out.iter().map(|i| (i.0, i.1, i.2)).collect();
        assert_eq!(
            order,
            vec![(1, 2, 0), (5, 0, 0), (5, 0, 1), (5, 1, 0), (5, 2, 1)]
        );
    }

    #[test]
    fn error_is_reported_and_nothing_decoded_is_lost() {
        let a = vec![
            Ok(Item(1, 0, 0)),
            Ok(Item(3, 0, 1)),
            Err("bad page".to_string()),
        ];
        let b = vec![Ok(Item(2, 1, 0))];
        let out: Vec<_> = Merge::new(vec![a.into_iter(), b.into_iter()]).collect();
        let oks: Vec<u64> = out
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|i| i.0))
            .collect();
        assert_eq!(oks, vec![1, 2, 3]);
        assert_eq!(out.iter().filter(|r| r.is_err()).count(), 1);
    }

    proptest! {
        #[test]
        fn merge_is_a_stable_sort(mut tss in prop::collection::vec(prop::collection::vec(0u64..50, 0..40), 0..8)) {
            for ts in &mut tss { ts.sort(); }
            let merged: Vec<Item> = Merge::new(streams(&tss)).map(Result::unwrap).collect();
            let mut expected: Vec<Item> = tss.iter().enumerate()
                .flat_map(|(s, ts)| ts.iter().enumerate().map(move |(i, &t)| Item(t, s, i)))
                .collect();
            expected.sort_by_key(|i| (i.0, i.1, i.2));
            prop_assert_eq!(merged, expected);
        }
    }
}
