//! Kernel state model: what every thread and CPU was doing over time,
//! reconstructed from scheduling, interrupt and system-call events in one
//! streaming pass, plus the execution graph built along the way.
//!
//! Rules (docs/analysis.md, "Kernel state model"; Trace Compass' with its
//! gaps fixed):
//! - switch-in → RUNNING; switch-out of a still-runnable thread → PREEMPTED,
//!   otherwise BLOCKED (see [`switch_out`] for the `prev_state` encodings);
//! - a wake-up ends BLOCKED (→ WAIT_CPU until switch-in) and gives the
//!   blocked interval its [`BlockReason`] from the context of the waker:
//!   a thread (the only reason linked in the graph), or the innermost
//!   interrupt context of the waking CPU (timer, block device, network, …);
//! - `sched_waking` (emitted by the waker) is used when the trace has it,
//!   `sched_wakeup` otherwise; wake-ups of running or runnable threads are
//!   spurious and only counted;
//! - a thread's state is unknown until an event says it (no interval before
//!   its first appearance).
//!
//! Memory grows with the number of state intervals, system calls and
//! interrupts, never with the number of other events.
//!
//! The module is split by concern:
//! - `model`: what the pass produces ([`KernelModel`] and the histories,
//!   intervals and reasons it is made of) and how it is queried;
//! - `builder`: [`StateBuilder`], the pass itself: one handler per kind of
//!   event, and the per-thread and per-CPU records it keeps meanwhile;
//! - `network`: packets and TCP segments, and how their two ends are
//!   matched (loopback and virtual pairs by skb address, recorded segments
//!   by key) so a wake-up by a message names its sender;
//! - `waker`: who woke a thread, the ordered rules that give a wait its
//!   reason;
//! - `hosts`: models of several hosts: thread ids that carry their host,
//!   events of one host seen on another's CPU, and calls between hosts
//!   joined by their spans.

mod builder;
mod hosts;
mod model;
mod network;
mod waker;

pub use builder::{InitialStatus, StateBuilder, SwitchOut, ThreadInfo, MAX_CPUS};
pub use hosts::{host_tid, split_host_tid, tid_label, RemoteCall, HOST_TID_SHIFT, MAX_HOSTS};
pub use model::{
    softirq_name, BlockIo, BlockPhase, BlockReason, CgroupMove, CpuHistory, CpuInterval, Interrupt,
    InterruptInterval, KernelModel, LostRange, ModelStats, ReadChars, StateInterval,
    SyscallInterval, ThreadHistory, ThreadState, KERNEL_WORKER, NO_CPU,
};
pub use network::{NetworkEnds, PacketDirection, SEGMENT_WAKE_NS};
