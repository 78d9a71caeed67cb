//! More than two hosts: a [`ClockPair`] for every pair of hosts that
//! exchanged messages, and a spanning tree from the reference host along
//! which the pairwise transforms and their bounds are composed.
//!
//! Each pair of hosts is kept both ways round, each host the reference of
//! one [`ClockPair`], so that an edge's estimate is always computed on its
//! parent's clock rather than inverted from the other way: neither
//! estimator is symmetric (the most room is measured on the reference's
//! clock; Trace Compass's bisector averages lines written against it). Both
//! pairs see every message in the same order, in coordinates that are each
//! other's mirror, so a message one refuses the other refuses too.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::bounds::Envelope;
use crate::{Bounds, ClockPair, Estimate, Estimator, Quality, SyncError, Transform};

/// Hosts and the messages matched between them.
#[derive(Clone, Debug, Default)]
pub struct HostGraph {
    hosts: Vec<String>,
    /// Keyed by (reference, other): each pair of hosts both ways round.
    pairs: BTreeMap<(usize, usize), ClockPair>,
}

/// One host's clock on the reference clock.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSync {
    pub host: String,
    /// Maps this host's times onto the reference host's clock.
    pub transform: Transform,
    /// The lines that fit every message along the tree path, composed as
    /// the transform is: enclosed when every edge's are (the reference's
    /// is its own clock, exactly), unbounded for a host the tree does not
    /// reach.
    pub bounds: Bounds,
    /// The worst quality along the tree path to the reference (the
    /// reference itself is accurate; a host the tree does not reach fails).
    pub quality: Quality,
    /// Messages between this host and its parent in the tree.
    pub matched: u64,
    /// The host whose clock this one was synchronised through (None for the
    /// reference and for unreached hosts).
    pub parent: Option<String>,
    /// The pairwise estimate with the parent, as the parent's reference.
    pub edge: Option<Estimate>,
}

impl HostGraph {
    /// No host, no message.
    pub fn new() -> HostGraph {
        HostGraph::default()
    }

    /// Adds a host (once per name) and returns its index.
    pub fn host(&mut self, name: &str) -> usize {
        match self.hosts.iter().position(|h| h == name) {
            Some(i) => i,
            None => {
                self.hosts.push(name.to_string());
                self.hosts.len() - 1
            }
        }
    }

    /// The host names, by index.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// A message sent by host `sender` at `send_ns` (its clock), received
    /// by host `receiver` at `receive_ns` (its clock).
    pub fn add_message(
        &mut self,
        sender: usize,
        send_ns: u64,
        receiver: usize,
        receive_ns: u64,
    ) -> Result<(), SyncError> {
        for index in [sender, receiver] {
            if index >= self.hosts.len() {
                return Err(SyncError::UnknownHost {
                    index,
                    hosts: self.hosts.len(),
                });
            }
        }
        if sender == receiver {
            return Err(SyncError::SameHost {
                host: self.hosts[sender].clone(),
            });
        }
        self.pairs
            .entry((receiver, sender))
            .or_default()
            .add_to_reference(send_ns, receive_ns)?;
        self.pairs
            .entry((sender, receiver))
            .or_default()
            .add_from_reference(send_ns, receive_ns)
    }

    /// The estimate by `estimator` for the pair (a, b), as a transform of
    /// b's clock onto a's, if they exchanged any message.
    pub fn pair_estimate(&self, a: usize, b: usize, estimator: Estimator) -> Option<Estimate> {
        Some(self.pairs.get(&(a, b))?.estimate(estimator))
    }

    /// Every host's transform onto `reference`'s clock by `estimator`, in
    /// host order. The tree is breadth-first from the reference (fewest
    /// hops); a host that can hang from several hosts of the same depth
    /// takes the edge giving it the best quality, then the most messages,
    /// then the earliest parent.
    pub fn solve(
        &self,
        reference: usize,
        estimator: Estimator,
    ) -> Result<Vec<HostSync>, SyncError> {
        let n = self.hosts.len();
        if reference >= n {
            return Err(SyncError::UnknownHost {
                index: reference,
                hosts: n,
            });
        }
        let mut result: Vec<HostSync> = self
            .hosts
            .iter()
            .map(|host| HostSync {
                host: host.clone(),
                transform: Transform::IDENTITY,
                bounds: Bounds::Unbounded,
                quality: Quality::Fail,
                matched: 0,
                parent: None,
                edge: None,
            })
            .collect();
        result[reference].quality = Quality::Accurate;
        result[reference].bounds = Bounds::Enclosed(Envelope::exact(Transform::IDENTITY));
        let mut reached = vec![false; n];
        reached[reference] = true;
        // Layer by layer, so that a host reachable from several parents at
        // the same depth takes the best edge of all of them.
        let mut layer = vec![reference];
        while !layer.is_empty() {
            let mut candidates: Vec<(Quality, Reverse<u64>, usize, usize, Estimate)> = Vec::new();
            for &parent in &layer {
                for child in (0..n).filter(|&child| !reached[child]) {
                    let Some(edge) = self.pair_estimate(parent, child, estimator) else {
                        continue;
                    };
                    if edge.quality != Quality::Fail {
                        let quality = result[parent].quality.max(edge.quality);
                        candidates.push((quality, Reverse(edge.matched), child, parent, edge));
                    }
                }
            }
            candidates.sort_by_key(|c| (c.0, c.1, c.2, c.3));
            let mut next = Vec::new();
            for (quality, _, child, parent, edge) in candidates {
                if reached[child] {
                    continue;
                }
                reached[child] = true;
                result[child] = HostSync {
                    host: self.hosts[child].clone(),
                    transform: result[parent].transform.after(&edge.transform),
                    bounds: result[parent].bounds.after(&edge.bounds),
                    quality,
                    matched: edge.matched,
                    parent: Some(self.hosts[parent].clone()),
                    edge: Some(edge),
                };
                next.push(child);
            }
            layer = next;
        }
        Ok(result)
    }
}
