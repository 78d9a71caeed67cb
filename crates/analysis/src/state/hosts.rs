//! Models of several hosts. Each host's trace keeps its own thread ids, so
//! a model that joins several numbers a thread with its host in the bits
//! above the kernel's largest tid ([`host_tid`]), and tells them apart
//! for people ([`tid_label`]).
//!
//! What crosses hosts is here too: an event seen on one host's CPU in
//! another host's thread (hosts sharing a kernel through network
//! namespaces), and calls between hosts whose reply no message links,
//! joined afterwards by their spans ([`KernelModel::link_replies`]).

use deepspan_model::Tid;

use crate::graph::{Direction, EdgeType, VertexId};

use super::{BlockReason, KernelModel, StateBuilder, ThreadState};

/// In a model of several hosts, a thread id carries its host's number in
/// the bits above this one: Linux thread ids stay below 2^22 (`pid_max`'s
/// limit), so `host << HOST_TID_SHIFT | tid` is unique and host 0's ids are
/// the trace's own.
pub const HOST_TID_SHIFT: u32 = 22;

/// Hosts a model can hold: thread ids are positive i32s with their host
/// above [`HOST_TID_SHIFT`].
pub const MAX_HOSTS: usize = 1 << (31 - HOST_TID_SHIFT);

/// Thread `tid` of host `host`, as a model of several hosts numbers it
/// (the idle task, 0, stays 0: each host's CPUs are numbered apart).
pub fn host_tid(host: u32, tid: Tid) -> Tid {
    if tid <= 0 {
        tid
    } else {
        ((host << HOST_TID_SHIFT) as Tid) | tid
    }
}

/// A thread (or process) id for people: `hN:TID` for a thread of host
/// N > 0 of a model of several hosts, else the id itself.
pub fn tid_label(tid: Tid) -> String {
    match split_host_tid(tid) {
        (0, t) => t.to_string(),
        (host, t) => format!("h{host}:{t}"),
    }
}

/// The host and the host's own thread id of a thread id of a model of
/// several hosts.
pub fn split_host_tid(tid: Tid) -> (u32, Tid) {
    if tid <= 0 {
        (0, tid)
    } else {
        (
            (tid as u32) >> HOST_TID_SHIFT,
            tid & ((1 << HOST_TID_SHIFT) - 1),
        )
    }
}

impl StateBuilder {
    /// A model of several hosts: `cpu_hosts[cpu]` is the host of each CPU
    /// (each host's CPUs numbered apart), and thread ids carry their host
    /// ([`host_tid`]).
    ///
    /// An event on one host's CPU whose current thread is another host's
    /// happens only when the hosts share a kernel (network namespaces, each
    /// recorded with its own pid filter): the kernel delivers a packet
    /// across a virtual pair in the sender's context, and the pid filter
    /// keeps the wake-up for the woken thread's run. Such a wake-up is a
    /// packet from that thread (NETWORK with an edge from the sender, as
    /// a packet matched across hosts); any other such event is left out,
    /// as the sender's own run has it.
    pub fn hosts(mut self, cpu_hosts: Vec<u32>) -> StateBuilder {
        self.cpu_hosts = cpu_hosts;
        self
    }

    /// Whether `tid` is current on `cpu` of another host (see
    /// [`StateBuilder::hosts`]).
    pub(super) fn is_on_other_host(&self, cpu: u32, tid: Tid) -> bool {
        !self.cpu_hosts.is_empty()
            && tid > 0
            && self.cpu_hosts.get(cpu as usize) != Some(&split_host_tid(tid).0)
    }
}

/// A call between hosts, from its spans: a CLIENT span on one host and
/// its SERVER child on another, on one clock (see
/// [`KernelModel::link_replies`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteCall {
    pub client_tid: Tid,
    pub server_tid: Tid,
    /// When the server span ended (its reply was sent by then).
    pub server_end: u64,
    /// When the client span ended.
    pub client_end: u64,
}

impl KernelModel {
    /// Joins calls between hosts whose reply no message links (no TCP
    /// segment recorded, no shared kernel): the caller's wait for the
    /// reply, a NETWORK wait without a sender ended between the server
    /// span's end and the client span's, gets a NETWORK edge from the
    /// server's thread at its first vertex after the span ended (before
    /// the wake-up), else at its last before.
    /// So the request's critical path continues into the server's path.
    /// Returns the calls linked.
    pub fn link_replies(&mut self, calls: &[RemoteCall]) -> usize {
        let mut linked = 0;
        for call in calls {
            let Some(client) = self.thread(call.client_tid) else {
                continue;
            };
            // The caller's first network wait that ends in the window.
            let from = client.states().partition_point(|s| s.end < call.server_end);
            let wait = client.states()[from..]
                .iter()
                .take_while(|s| s.end <= call.client_end)
                .find(|s| s.state == ThreadState::Blocked(BlockReason::Network));
            let Some(wake) = wait.map(|s| s.end) else {
                continue;
            };
            let g = &self.graph;
            let (Some(wc), Some(ws)) = (g.worker_of(call.client_tid), g.worker_of(call.server_tid))
            else {
                continue;
            };
            let Some(to) = g.vertex_at(wc, wake) else {
                continue;
            };
            if g.edge(to, Direction::IncomingVertical).is_some() {
                continue;
            }
            // The server thread's first vertex from the span's end (it
            // blocks for the next call, say) when it comes before the
            // wake-up: its run until then stays on the path; else its last
            // vertex before.
            let last = g.tail(ws).map_or(0, |v| v.index);
            let next = match g.vertex_at_or_before(ws, call.server_end.saturating_sub(1)) {
                Some(v) if v.index < last => Some(VertexId {
                    worker: ws,
                    index: v.index + 1,
                }),
                Some(_) => None,
                None => g.tail(ws).map(|_| VertexId {
                    worker: ws,
                    index: 0,
                }),
            };
            let from = match next.filter(|&v| g.ts(v) <= wake) {
                Some(v) => v,
                None => match g.vertex_at_or_before(ws, call.server_end) {
                    Some(v) => v,
                    None => continue,
                },
            };
            if self.graph.link(from, to, EdgeType::Network, None) {
                linked += 1;
            }
        }
        linked
    }
}
