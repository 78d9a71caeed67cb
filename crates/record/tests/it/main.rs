//! Integration tests of deepspan-record, one binary.
//!
//! `kernel`: recording against the running kernel through a private tracefs
//! instance; needs root and tracefs, so its tests are marked
//! `#[ignore = "system: …"]` and run only under `make test`
//! (`--include-ignored`). They run one at a time
//! ([`common::one_at_a_time`]). `blocked_syscalls`: the eBPF capture of
//! sleeps in system calls against the trace's own syscall events, the same
//! way; `socket_calls`: the eBPF capture of socket receives and sends,
//! likewise; `idle_switches`: the eBPF capture of switches out of idle
//! against the trace's own switches. `containers`: the /proc scan's
//! containers, from cgroups the test makes (root, no tracefs).

mod common;

mod blocked_syscalls;
mod containers;
mod idle_switches;
mod kernel;
mod socket_calls;
