//! Network messages in the state model: packets and TCP segments, and how
//! the two ends of one are matched so a thread woken by a message is
//! woken by its sender. A packet of the loopback device or of a virtual
//! pair (veth) is received with the skb address it was queued with, so
//! its sender is the thread that queued it; a recorded TCP segment is
//! matched by its key, in this model or, through [`NetworkEnds`], across
//! the models of several hosts.
//!
//! The handlers here mark what an interrupt frame or a thread received on
//! the builder's per-CPU records (`Frame`, `CpuRec`); a wake-up reads
//! those marks to say who sent what it delivers.

use deepspan_model::{softirq, Name, Packet, Tid};

use crate::graph::{EdgeType, VertexId};

use super::builder::CpuRec;
use super::{Interrupt, StateBuilder, KERNEL_WORKER, MAX_CPUS};

/// A packet a thread queued, until its address is queued again.
#[derive(Clone)]
pub(super) struct LocalPacket {
    sender: Tid,
    queued: u64,
    dev: Name,
}

impl LocalPacket {
    /// Whether the packet received on `dev` at `ts` with this packet's
    /// skb address is this packet. A loopback packet comes back on `lo`;
    /// one crossing a virtual pair arrives on the other end, so on a
    /// different device. The same device but `lo` means a real NIC that
    /// freed the sent skb and allocated a received one at its address.
    fn delivered_as(&self, dev: &str, ts: u64) -> bool {
        let same_device = *self.dev == *dev;
        ts.saturating_sub(self.queued) <= LOOPBACK_IN_FLIGHT_NS && (same_device == (dev == "lo"))
    }
}

/// A segment received outside an interrupt frame explains wake-ups on its
/// CPU for this long: the kernel wakes the socket's reader within
/// microseconds of the segment's arrival, and the frame's end, which would
/// close the window, may be missing from the trace (ksoftirqd, pid filters).
pub const SEGMENT_WAKE_NS: u64 = 100_000;

/// The key of the segment received on CPU `c` outside a frame, if within
/// [`SEGMENT_WAKE_NS`] of `ts`.
pub(super) fn fresh_segment(c: &CpuRec, ts: u64) -> Option<u64> {
    c.thread_segment
        .filter(|&(_, at)| ts.saturating_sub(at) <= SEGMENT_WAKE_NS)
        .map(|(key, _)| key)
}

/// A local packet is received within microseconds of being queued; an
/// skb address not received for this long was reused or its reception lost.
const LOOPBACK_IN_FLIGHT_NS: u64 = 1_000_000_000;

/// Packets in flight on `lo` kept at most (stale ones are dropped first).
const MAX_LOOPBACK_IN_FLIGHT: usize = 1 << 16;

/// Where network messages leave and arrive in the execution graph, by
/// message key, for joining the graphs of several hosts
/// ([`crate::distributed_graph`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkEnds {
    /// (key, vertex of the sending context at the send), in time order.
    pub sent: Vec<(u64, VertexId)>,
    /// (key, vertex of the thread a received message woke, at the
    /// wake-up), in time order.
    pub received: Vec<(u64, VertexId)>,
}

/// The direction of a message given to [`StateBuilder::packet`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketDirection {
    Sent,
    Received,
}

impl StateBuilder {
    /// A network message sent or received now on `cpu`, identified by
    /// `key` (what matches its two ends: a TCP (seq, ack_seq, flags)
    /// digest, a test stub's message id). The context doing it gets a
    /// graph vertex: the current thread, or the host's kernel worker
    /// ([`KERNEL_WORKER`]) in interrupt context, running since the
    /// interrupt began. A send is kept as an end of the message; a
    /// reception makes the context's next wake-ups network wake-ups (no
    /// link from the waker), whose woken vertices are kept as the other
    /// end ([`KernelModel::network_ends`](crate::KernelModel::network_ends)).
    pub fn packet(&mut self, ts: u64, cpu: u32, key: u64, direction: PacketDirection) {
        if cpu >= MAX_CPUS {
            self.stats.bad_cpu += 1;
            return;
        }
        let ts = self.clock(ts);
        let vertex = self.context_vertex(cpu, ts);
        let c = self.cpu_mut(cpu);
        match direction {
            PacketDirection::Sent => {
                if let Some(v) = vertex {
                    self.packets.sent.push((key, v));
                }
            }
            PacketDirection::Received => match c.stack.last_mut() {
                Some(f) => {
                    f.packet = true;
                    f.message = Some(key);
                }
                None => {
                    c.thread_packet = true;
                    c.thread_message = Some(key);
                }
            },
        }
    }

    /// A TCP segment recorded (`record --tcp-keys`) leaving (`Sent`) or
    /// entering (`Received`) a device now on `cpu`, with `tid` current
    /// there, `key` its (seq, ack_seq, flags) digest. Unlike [`StateBuilder::packet`] (Trace
    /// Compass's stubs, whose hosts are joined afterwards), the two ends
    /// meet in this model: a thread woken by a received segment gets a
    /// NETWORK edge from the context that sent it, at the send, when no
    /// other rule names the sender (loopback and veth packets are matched
    /// by skb address; a wake-up in another host's thread is that
    /// thread's). So a request waiting for another host's reply continues,
    /// on its critical path, into that host's thread that sent it.
    ///
    /// A received segment outside an interrupt frame (a softirq run by
    /// ksoftirqd, or whose events a pid filter left out) makes the CPU's
    /// next wake-ups within [`SEGMENT_WAKE_NS`], of threads blocked in a
    /// system call that waits for I/O, network wake-ups.
    pub fn segment(&mut self, ts: u64, cpu: u32, tid: Tid, key: u64, direction: PacketDirection) {
        if cpu >= MAX_CPUS {
            self.stats.bad_cpu += 1;
            return;
        }
        let ts = self.clock(ts);
        match direction {
            PacketDirection::Sent => {
                // The recording names the thread current at the send: more
                // certain than the model's current thread when the trace
                // lacks that CPU's switches (pid filters), unless the send
                // is in an interrupt frame (the kernel's, not that thread's).
                let in_frame = self
                    .cpus
                    .get(cpu as usize)
                    .is_some_and(|c| !c.stack.is_empty());
                let vertex = if tid > 0 && !in_frame && self.graph_on {
                    let t = self.thread(tid);
                    Some(self.vertex_now(t, ts))
                } else {
                    self.context_vertex(cpu, ts)
                };
                if let Some(v) = vertex {
                    if self.segments_in_flight.len() >= MAX_LOOPBACK_IN_FLIGHT {
                        let oldest = ts.saturating_sub(LOOPBACK_IN_FLIGHT_NS);
                        self.segments_in_flight
                            .retain(|_, &mut (_, sent)| sent >= oldest);
                        if self.segments_in_flight.len() >= MAX_LOOPBACK_IN_FLIGHT {
                            self.segments_in_flight.clear();
                        }
                    }
                    self.segments_in_flight.insert(key, (v, ts));
                }
            }
            PacketDirection::Received => {
                let c = self.cpu_mut(cpu);
                match c.stack.last_mut() {
                    Some(f) => {
                        f.packet = true;
                        f.message = Some(key);
                    }
                    None => c.thread_segment = Some((key, ts)),
                }
            }
        }
    }

    /// The NETWORK edge of thread `t`, woken at `ts` by the message `key`,
    /// from the context that sent it (see [`StateBuilder::segment`]).
    pub(super) fn link_segment(&mut self, t: usize, ts: u64, key: u64) -> bool {
        let Some(&(from, sent)) = self.segments_in_flight.get(&key) else {
            return false;
        };
        if sent > ts || ts - sent > LOOPBACK_IN_FLIGHT_NS {
            return false;
        }
        let to = self.vertex_now(t, ts);
        if from.worker == to.worker {
            return false;
        }
        self.segments_in_flight.remove(&key);
        self.graph.link(from, to, EdgeType::Network, None)
    }

    /// A network wake-up of thread `t` by a thread that received packets
    /// (a threaded interrupt handler, threaded NAPI) names that thread on
    /// the NETWORK edge, as Trace Compass does: the edge ends here, before
    /// the wake-up's own transition (which then finds the vertex made).
    pub(super) fn name_network_edge(&mut self, t: usize, ts: u64, cpu: u32) {
        let Some(c) = self.cpus.get(cpu as usize) else {
            return;
        };
        if !self.graph_on || !c.stack.is_empty() || !c.thread_packet {
            return;
        }
        let Some(receiver) = c.current.filter(|&x| x > 0) else {
            return;
        };
        let name = self
            .index
            .get(receiver)
            .and_then(|i| self.threads[i as usize].hist.name())
            .map(|comm| comm.to_string_lossy());
        let worker = self.worker(t);
        self.graph
            .append(worker, ts, EdgeType::Network, name.as_deref());
    }

    /// The key of the message the context running on `cpu` received last
    /// (a segment received in thread context only until [`SEGMENT_WAKE_NS`]
    /// after it, `ts`).
    pub(super) fn context_message(&self, cpu: u32, ts: u64) -> Option<u64> {
        let c = self.cpus.get(cpu as usize)?;
        match c.stack.last() {
            Some(f) => f.message,
            None => c.thread_message.or(fresh_segment(c, ts)),
        }
    }

    /// A vertex at `ts` of whatever runs on `cpu`: the kernel worker in
    /// interrupt context (from the interrupt's start), else the current
    /// thread.
    fn context_vertex(&mut self, cpu: u32, ts: u64) -> Option<VertexId> {
        if !self.graph_on {
            return None;
        }
        let c = self.cpu_mut(cpu);
        if let Some(start) = c.stack.last().map(|f| f.start) {
            let worker = self.graph.worker(KERNEL_WORKER);
            let since = self.graph.tail(worker).map(|v| self.graph.ts(v));
            if since.is_none_or(|t| t < start) {
                self.graph.add(worker, start);
            }
            return Some(self.graph.append(worker, ts, EdgeType::Running, None));
        }
        let tid = self.current(cpu).filter(|&t| t > 0)?;
        let t = self.thread(tid);
        Some(self.vertex_now(t, ts))
    }

    /// A packet queued on a device (`net_dev_queue`) by the thread current
    /// on `cpu`: kept by its skb address until it is received, to name
    /// that thread as its sender.
    pub(super) fn net_dev_queue(&mut self, ts: u64, cpu: u32, p: &Packet) {
        let c = self.cpu_mut(cpu);
        if !c.stack.is_empty() {
            // Forwarded in a softirq (a veth peer into a bridge):
            // still the packet its thread sent.
            if let Some(local) = self.local_in_flight.get_mut(&p.skbaddr) {
                local.queued = ts;
            }
            return;
        }
        let sender = c.current.filter(|&t| t > 0);
        if &*p.dev == "lo" {
            c.loopback_sender = sender;
        }
        if let Some(sender) = sender {
            if self.local_in_flight.len() >= MAX_LOOPBACK_IN_FLIGHT {
                let oldest = ts.saturating_sub(LOOPBACK_IN_FLIGHT_NS);
                self.local_in_flight.retain(|_, p| p.queued >= oldest);
                if self.local_in_flight.len() >= MAX_LOOPBACK_IN_FLIGHT {
                    self.local_in_flight.clear();
                }
            }
            let local = LocalPacket {
                sender,
                queued: ts,
                dev: p.dev.clone(),
            };
            self.local_in_flight.insert(p.skbaddr, local);
        }
    }

    /// A packet received on a device (`netif_receive_skb`): the frame it
    /// is received in, or the thread, delivers a packet, and a local one
    /// (loopback, or a virtual pair's, found by its skb address) names its
    /// sender.
    pub(super) fn netif_receive_skb(&mut self, ts: u64, cpu: u32, p: &Packet) {
        let on_lo = &*p.dev == "lo";
        let from = match self.local_in_flight.get(&p.skbaddr) {
            Some(local) if local.delivered_as(&p.dev, ts) => Some(local.sender),
            _ => None,
        };
        // A loopback skb is received once; one crossing virtual
        // devices (veth, a bridge, the peer) is received on each.
        if on_lo {
            self.local_in_flight.remove(&p.skbaddr);
        }
        let loopback = on_lo || from.is_some();
        let c = self.cpu_mut(cpu);
        match c.stack.last_mut() {
            Some(f) => {
                f.packet = true;
                if loopback {
                    f.loopback = true;
                    f.loopback_from = from;
                }
            }
            None => c.thread_packet = true,
        }
    }

    /// The thread whose loopback packet wakes a thread from `cpu` now: in
    /// a NET_RX softirq that received a loopback packet, the thread that
    /// queued that packet (matched by skb address), else the thread the
    /// softirq interrupted right after it queued packets on `lo`.
    pub(super) fn loopback_sender(&self, cpu: u32) -> Option<Tid> {
        let c = self.cpus.get(cpu as usize)?;
        match c.stack.as_slice() {
            [f] if f.kind == Interrupt::Softirq(softirq::NET_RX) && f.loopback => {
                f.loopback_from.or(c
                    .loopback_sender
                    .filter(|&sender| c.current == Some(sender)))
            }
            _ => None,
        }
    }
}
