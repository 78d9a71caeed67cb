//! Clock synchronisation across hosts.
//!
//! Traces recorded on different hosts each carry their own clock. Given
//! messages matched between hosts (a send on one, the receive on another:
//! a CLIENT span and its SERVER child, or a TCP segment seen leaving one
//! kernel and entering another), this crate computes, for every host, the
//! linear transform `t ↦ slope·t + offset_ns` onto a reference host's clock,
//! with a quality and its bounds:
//!
//! - [`ClockPair`]: two hosts, the fully incremental convex hull algorithm
//!   (Jabbarifar, Dagenais and Shameli-Sendi; as in Trace Compass's
//!   `SyncAlgorithmFullyIncremental`), with two [`Estimator`]s between the
//!   extreme lines: the line with the most room (the default) and Trace
//!   Compass's bisector;
//! - [`Bounds`]: every line that fits the messages, by the corners of that
//!   set: the extreme slopes, and how far a mapped time can be from the
//!   true one at any time, hence over a trace's time range;
//! - [`HostGraph`]: any number of hosts, a [`ClockPair`] each way round per
//!   pair of hosts that exchanged messages, combined over a breadth-first
//!   spanning tree from the reference, the bounds composed along the
//!   tree's paths.
//!
//! No I/O: callers match the messages (see `deepspan sync`).

mod bounds;
mod graph;
mod hull;
mod pair;

pub use bounds::{Bounds, Envelope};
pub use graph::{HostGraph, HostSync};
pub use pair::{ClockPair, Estimate, Estimator};

/// How far a transform can be trusted, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Quality {
    /// Messages in both directions bound the slope on both sides and are
    /// consistent: the true line lies between the extreme lines (the bounds
    /// are enclosed), and the estimate is the estimator's line between them.
    Accurate,
    /// Messages in both directions, but either no linear transform fits
    /// them all (the hulls cross: a clock stepped, or a message was matched
    /// wrongly) or they do not interleave enough to bound the slope on both
    /// sides; the transform is a fit.
    Approximate,
    /// Messages in one direction only: the offset is bounded on one side,
    /// and the estimate is off by at least the smallest one-way delay.
    Incomplete,
    /// No message links the host to the reference (the identity is given).
    Fail,
}

impl Quality {
    /// The lowercase name `deepspan sync` prints (`accurate`, …).
    pub fn name(self) -> &'static str {
        match self {
            Quality::Accurate => "accurate",
            Quality::Approximate => "approximate",
            Quality::Incomplete => "incomplete",
            Quality::Fail => "fail",
        }
    }
}

/// A linear clock transform: a time `t` (ns) of one host is
/// `slope·t + offset_ns` on the target clock.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Transform {
    /// Rate of the target clock per ns of the source clock (1 + drift).
    pub slope: f64,
    /// The target time of source time 0, in ns.
    pub offset_ns: f64,
}

impl Transform {
    /// The transform of a clock onto itself (and of an unsynchronised one).
    pub const IDENTITY: Transform = Transform {
        slope: 1.0,
        offset_ns: 0.0,
    };

    /// The transformed time, rounded to the ns. `slope·t` is computed as
    /// `t + (slope − 1)·t` so that times near the Unix epoch (1.7e18 ns,
    /// beyond f64's integer precision) keep their last digits.
    pub fn map_ns(&self, t_ns: u64) -> i128 {
        let shift = (self.slope - 1.0) * t_ns as f64 + self.offset_ns;
        t_ns as i128 + shift.round() as i128
    }

    /// `self` applied after `inner` (a time of `inner`'s source clock onto
    /// `self`'s target clock).
    pub fn after(&self, inner: &Transform) -> Transform {
        Transform {
            slope: self.slope * inner.slope,
            offset_ns: self.slope * inner.offset_ns + self.offset_ns,
        }
    }
}

/// Why a message could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    #[error(
        "message at {other_ns} ns (other host) / {reference_ns} ns (reference) is more than 2^61 ns away from the pair's first message ({first_other_ns} / {first_reference_ns} ns): the two inputs do not look like the same time base"
    )]
    TooFarApart {
        other_ns: u64,
        reference_ns: u64,
        first_other_ns: u64,
        first_reference_ns: u64,
    },
    #[error("a message from host {host} to itself says nothing about clocks")]
    SameHost { host: String },
    #[error("unknown host index {index} (only {hosts} hosts)")]
    UnknownHost { index: usize, hosts: usize },
}
