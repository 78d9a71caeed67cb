//! deepspan's kernel event model: the typed events that trace.dat and CTF
//! readers produce and that every analysis consumes, and the k-way merge that
//! turns per-CPU (per-stream) event streams into one time-ordered stream;
//! [`human`], how every output prints durations and shares; and
//! [`container`], the container and pod a process's cgroup names; and
//! [`Socket`], which connection a receive or send was on.
//!
//! Invariants:
//! - timestamps are u64 nanoseconds of one host's CLOCK_MONOTONIC;
//! - a merged stream is ordered by timestamp and stable for equal timestamps.

pub mod container;
mod event;
pub mod human;
mod merge;
mod name;
mod parallel;
mod socket;

pub use event::{
    softirq, BlockRq, Comm, Event, EventKind, Fields, Packet, SchedSwitch, Tid, Value, Wakeup,
};
pub use merge::{Merge, Timestamped};
pub use name::Name;
pub use parallel::{merge_parallel, merge_parallel_ref};
pub use socket::Socket;
