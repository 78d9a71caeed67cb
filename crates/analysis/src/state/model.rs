//! What the state model produces: per-thread state intervals with their
//! block reasons, system calls and names over time, per-CPU timelines and
//! interrupt runs, block I/O, lost-event ranges and the execution graph,
//! gathered in a [`KernelModel`], with the queries the analyses ask of it.
//!
//! These are plain data: the rules that make them are the builder's
//! (`builder`, `network`, `hosts`), so a reader of the analyses finds
//! here everything they read, and nothing of how it was inferred.

use std::collections::HashMap;

use deepspan_model::container::ContainerRef;
use deepspan_model::{softirq, Comm, Name, Socket, Tid};

use crate::graph::{EdgeType, Graph};
use crate::held::HeldBack;
use rustc_hash::FxHashMap;

use super::NetworkEnds;

/// CPU number used where the CPU is not known.
pub const NO_CPU: u32 = u32::MAX;

/// What a thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadState {
    /// Alive, but what it does is not known (e.g. a statedump said "waiting"
    /// without saying on what, or events were lost).
    Unknown,
    /// On a CPU.
    Running,
    /// Switched out while still runnable: waiting for a CPU it was taken from.
    Preempted,
    /// Woken (or just forked) and waiting for a CPU.
    WaitCpu,
    /// Waiting for something; the reason is known once it is woken.
    Blocked(BlockReason),
}

/// Why a BLOCKED interval ended: the context that woke the thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockReason {
    /// No wake-up seen (switched in without one, or still blocked at the
    /// end), or woken from the idle task without interrupt context.
    Unexplained,
    /// Woken by this thread, outside interrupt context.
    Thread(Tid),
    /// hrtimer expiry, TIMER/HRTIMER softirq, or a timer IPI.
    Timer,
    /// BLOCK/IRQ_POLL softirq, or an interrupt (or thread) that completed a
    /// block request before the wake-up.
    BlockDevice,
    /// NET_RX/NET_TX softirq, or packet reception before the wake-up.
    Network,
    /// A packet whose sender is known: sent by this thread over the
    /// loopback device or a virtual pair (veth) of the same kernel (local
    /// TCP/UDP, containers), or, in a model of several hosts, by this
    /// thread of another host. NETWORK, with a wake-up edge to the sender,
    /// as a matched cross-host packet would have.
    PacketFrom(Tid),
    /// SCHED softirq or irq 0.
    Interrupted,
    /// Inter-processor interrupt.
    Ipi,
    /// Interrupt of an input device (keyboard, mouse, tty, evdev …).
    UserInput,
    /// Another hardware interrupt; its name is [`KernelModel::irq_name`].
    Irq(i32),
    /// Another softirq (HI, TASKLET, RCU …).
    Softirq(u32),
}

impl ThreadState {
    /// The execution-graph edge type of this state.
    pub fn edge_type(self) -> EdgeType {
        match self {
            ThreadState::Unknown => EdgeType::Unknown,
            ThreadState::Running => EdgeType::Running,
            ThreadState::Preempted | ThreadState::WaitCpu => EdgeType::Preempted,
            ThreadState::Blocked(r) => match r {
                BlockReason::Unexplained
                | BlockReason::Thread(_)
                | BlockReason::Irq(_)
                | BlockReason::Softirq(_) => EdgeType::Blocked,
                BlockReason::Timer => EdgeType::Timer,
                BlockReason::BlockDevice => EdgeType::BlockDevice,
                BlockReason::Network | BlockReason::PacketFrom(_) => EdgeType::Network,
                BlockReason::Interrupted => EdgeType::Interrupted,
                BlockReason::Ipi => EdgeType::Ipi,
                BlockReason::UserInput => EdgeType::UserInput,
            },
        }
    }

    /// Runnable: preempted or woken, waiting for a CPU.
    pub fn is_runnable(self) -> bool {
        matches!(self, ThreadState::Preempted | ThreadState::WaitCpu)
    }
}

/// Name of a softirq vector (`TIMER`, `NET_RX`, …).
pub fn softirq_name(vec: u32) -> &'static str {
    match vec {
        softirq::HI => "HI",
        softirq::TIMER => "TIMER",
        softirq::NET_TX => "NET_TX",
        softirq::NET_RX => "NET_RX",
        softirq::BLOCK => "BLOCK",
        softirq::IRQ_POLL => "IRQ_POLL",
        softirq::TASKLET => "TASKLET",
        softirq::SCHED => "SCHED",
        softirq::HRTIMER => "HRTIMER",
        softirq::RCU => "RCU",
        _ => "softirq",
    }
}

/// A thread in one state over `[start, end]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateInterval {
    pub start: u64,
    pub end: u64,
    pub state: ThreadState,
    /// RUNNING: the CPU; PREEMPTED/WAIT_CPU: the run queue's CPU when known;
    /// BLOCKED: the CPU it left. [`NO_CPU`] when unknown.
    pub cpu: u32,
}

impl StateInterval {
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// One system call of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallInterval {
    pub start: u64,
    pub end: u64,
    /// Syscall number, -1 when only the name is known.
    pub id: i32,
    /// Interned name, read with [`KernelModel::syscall_name`]; 0 = none
    /// (also for names past the 65 535th distinct one, which no kernel
    /// has). Two bytes, so the interval is 48 bytes, not 56: a model has
    /// millions of them.
    pub name: u16,
    /// First two arguments: futex `uaddr`/`op`, the fd of read/recvfrom/…
    pub arg0: u64,
    pub arg1: u64,
    /// Return value (valid when `exit_seen`).
    pub ret: i64,
    /// False when the entry was not seen (before the trace or lost): `start`
    /// is then only the earliest possible time. A call the recorder saw
    /// only at a sleep inside it (see
    /// [`StateBuilder::blocked_syscall`](crate::StateBuilder::blocked_syscall))
    /// has its arguments, so this is true, but `start` is the sleep's.
    pub entry_seen: bool,
    pub exit_seen: bool,
}

/// In `arg1` of a socket call from the recorder's capture: the socket's
/// ports follow (a traced call with no entry has no arguments, 0).
const SOCKET_KNOWN: u64 = 1 << 63;

impl SyscallInterval {
    /// A receive (`sent` false, `name` recv) or send from the recorder's
    /// socket-call capture at `ts`: a call of no length whose entry was not
    /// seen, carrying its socket in its arguments (`arg0` the cookie,
    /// `arg1` [`SOCKET_KNOWN`] and the ports), and a receive its bytes as
    /// its return value, as a traced call's exit does.
    pub fn socket_call(ts: u64, name: u16, sent: bool, bytes: u64, socket: Option<Socket>) -> Self {
        let (arg0, arg1) = socket.map_or((0, 0), |s| {
            (
                s.cookie,
                SOCKET_KNOWN | u64::from(s.local_port) << 16 | u64::from(s.remote_port),
            )
        });
        SyscallInterval {
            start: ts,
            end: ts,
            id: -1,
            name,
            arg0,
            arg1,
            ret: if sent { 0 } else { bytes as i64 },
            entry_seen: false,
            exit_seen: !sent,
        }
    }

    /// The socket of a call from the socket-call capture
    /// ([`SyscallInterval::socket_call`]), when it was recorded.
    pub fn socket(&self) -> Option<Socket> {
        (self.id == -1 && !self.entry_seen && self.arg1 & SOCKET_KNOWN != 0).then_some(Socket {
            cookie: self.arg0,
            local_port: (self.arg1 >> 16) as u16,
            remote_port: self.arg1 as u16,
        })
    }

    /// For a call of the socket-call capture, whether it sent (else it
    /// received): its exit is the one a receive's return stands for.
    pub fn socket_sent(&self) -> bool {
        self.id == -1 && !self.entry_seen && !self.exit_seen
    }
}

/// Everything known about one thread over the trace.
#[derive(Clone, Debug, Default)]
pub struct ThreadHistory {
    pub tid: Tid,
    pub pid: Option<Tid>,
    pub ppid: Option<Tid>,
    /// The thread that forked this one, when the fork was traced.
    pub parent: Option<Tid>,
    pub(super) states: Vec<StateInterval>,
    pub(super) syscalls: Vec<SyscallInterval>,
    pub(super) names: Vec<(u64, Comm)>,
    pub(super) deaths: Vec<u64>,
    pub(super) read_chars: Vec<ReadChars>,
}

/// How many bytes a thread's read-like system calls had returned by `ts`
/// (the kernel's per-thread `rchar`, read by the recorder at the thread's
/// sleeps; see [`StateBuilder::blocked_syscall`](crate::StateBuilder::blocked_syscall)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadChars {
    pub ts: u64,
    pub bytes: u64,
}

impl ThreadHistory {
    /// All state intervals, in time order, never overlapping. Gaps only
    /// follow a death (see [`ThreadHistory::deaths`]).
    pub fn states(&self) -> &[StateInterval] {
        &self.states
    }

    /// The state intervals that overlap `[start, end]`.
    pub fn states_in(&self, start: u64, end: u64) -> &[StateInterval] {
        overlapping(&self.states, start, end, |s| (s.start, s.end))
    }

    /// The state at `ts` (the later one at a boundary).
    pub fn state_at(&self, ts: u64) -> Option<&StateInterval> {
        at(&self.states, ts, |s| (s.start, s.end))
    }

    /// All system calls, in time order.
    pub fn syscalls(&self) -> &[SyscallInterval] {
        &self.syscalls
    }

    /// The system calls that overlap `[start, end]`.
    pub fn syscalls_in(&self, start: u64, end: u64) -> &[SyscallInterval] {
        overlapping(&self.syscalls, start, end, |s| (s.start, s.end))
    }

    /// The system call the thread was in at `ts`.
    pub fn syscall_at(&self, ts: u64) -> Option<&SyscallInterval> {
        at(&self.syscalls, ts, |s| (s.start, s.end))
    }

    /// Names over time: `(since, name)`, in time order.
    pub fn names(&self) -> &[(u64, Comm)] {
        &self.names
    }

    /// The latest name.
    pub fn name(&self) -> Option<Comm> {
        self.names.last().map(|n| n.1)
    }

    /// The name at `ts` (the first name when `ts` precedes it).
    pub fn name_at(&self, ts: u64) -> Option<Comm> {
        let i = self.names.partition_point(|n| n.0 <= ts);
        self.names.get(i.saturating_sub(1)).map(|n| n.1)
    }

    /// The names the thread may have had at `ts`: the name at `ts` and,
    /// when the trace shows a later one, that one too. A rename (`prctl`,
    /// a runtime naming a thread it has just made) shows only at the
    /// thread's next event that carries its name, so the new name may have
    /// been the thread's at any moment after its last event under the old.
    pub fn names_possible_at(&self, ts: u64) -> impl Iterator<Item = Comm> + '_ {
        let i = self.names.partition_point(|n| n.0 <= ts);
        self.names[i.saturating_sub(1)..(i + 1).min(self.names.len())]
            .iter()
            .map(|n| n.1)
    }

    /// When the thread was first seen.
    pub fn first_seen(&self) -> Option<u64> {
        let s = self.states.first().map(|s| s.start);
        let n = self.names.first().map(|n| n.0);
        s.into_iter().chain(n).min()
    }

    /// Times at which the thread died (more than one if its tid was reused).
    pub fn deaths(&self) -> &[u64] {
        &self.deaths
    }

    /// The thread's counts of bytes read so far, in time order (empty when
    /// the recording has none).
    pub fn read_chars(&self) -> &[ReadChars] {
        &self.read_chars
    }

    /// The two counts that bracket `[start, end]` as closely as the
    /// thread's sleeps allow, as indices into
    /// [`ThreadHistory::read_chars`]: the last taken at or before `start`
    /// (else the first), and the first taken at or after `end` (else the
    /// last). Reads between a count and `start`, or between `end` and the
    /// next count, fall inside: the thread's reads between its sleeps have
    /// no time of their own. None without counts.
    pub fn read_chars_around(&self, start: u64, end: u64) -> Option<(usize, usize)> {
        let last = self.read_chars.len().checked_sub(1)?;
        let from = self
            .read_chars
            .partition_point(|r| r.ts <= start)
            .saturating_sub(1);
        let to = self.read_chars.partition_point(|r| r.ts < end).min(last);
        Some((from, to.max(from)))
    }
}

/// Items sorted by start with non-overlapping `[start, end]` ranges.
fn overlapping<T>(items: &[T], start: u64, end: u64, range: impl Fn(&T) -> (u64, u64)) -> &[T] {
    let a = items.partition_point(|x| range(x).1 < start);
    let b = items.partition_point(|x| range(x).0 <= end);
    items.get(a..b.max(a)).unwrap_or(&[])
}

fn at<T>(items: &[T], ts: u64, range: impl Fn(&T) -> (u64, u64)) -> Option<&T> {
    let i = items.partition_point(|x| range(x).0 <= ts).checked_sub(1)?;
    let x = items.get(i)?;
    (ts <= range(x).1).then_some(x)
}

/// A thread on a CPU over `[start, end]` (tid 0 is the idle task).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInterval {
    pub start: u64,
    pub end: u64,
    pub tid: Tid,
}

/// An interrupt context on a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    Irq(i32),
    Softirq(u32),
    Hrtimer,
    Ipi,
}

/// An interrupt handler's run on a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterruptInterval {
    pub start: u64,
    pub end: u64,
    pub kind: Interrupt,
    /// Nesting depth, 0 = interrupted a thread.
    pub depth: u8,
}

/// What one CPU did.
#[derive(Clone, Debug, Default)]
pub struct CpuHistory {
    pub cpu: u32,
    pub(super) timeline: Vec<CpuInterval>,
    pub(super) interrupts: Vec<InterruptInterval>,
}

impl CpuHistory {
    /// Which thread ran, in time order (from `sched_switch`).
    pub fn timeline(&self) -> &[CpuInterval] {
        &self.timeline
    }

    /// The threads that ran over `[start, end]`.
    pub fn running_in(&self, start: u64, end: u64) -> &[CpuInterval] {
        overlapping(&self.timeline, start, end, |c| (c.start, c.end))
    }

    /// The thread running at `ts`.
    pub fn running_at(&self, ts: u64) -> Option<Tid> {
        at(&self.timeline, ts, |c| (c.start, c.end)).map(|c| c.tid)
    }

    /// Interrupt handler runs, ordered by their end.
    pub fn interrupts(&self) -> &[InterruptInterval] {
        &self.interrupts
    }
}

/// Which step of a block request's life a [`BlockIo`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockPhase {
    /// Put in the I/O scheduler's queue (`block_rq_insert`).
    Insert,
    /// Sent to the device driver (`block_rq_issue`).
    Issue,
    /// Done by the device (`block_rq_complete`).
    Complete,
}

/// A task moved into a cgroup of one hierarchy, and the container and pod
/// that cgroup's path names (none: it names no container).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMove {
    pub ts: u64,
    pub tid: Tid,
    /// The hierarchy.
    pub root: i32,
    pub container: Option<ContainerRef>,
}

/// One block-layer request event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIo {
    pub ts: u64,
    pub phase: BlockPhase,
    /// Kernel `dev_t` (major << 20 | minor).
    pub dev: u32,
    pub sector: u64,
    pub nr_sector: u32,
    /// `rwbs` has `W`.
    pub write: bool,
    /// The thread current when the event fired: for insert and issue of
    /// synchronous I/O, the thread the request was made for (or a kernel
    /// worker: writeback, kblockd); for completion, whatever was
    /// interrupted.
    pub tid: Tid,
}

/// A time range in which events were lost on one CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LostRange {
    pub start: u64,
    pub end: u64,
    pub cpu: u32,
}

/// Counters of what the model saw and what it had to guess or ignore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelStats {
    pub events: u64,
    /// Wake-ups of running or runnable threads.
    pub spurious_wakeups: u64,
    /// `sched_wakeup` events ignored because the trace has `sched_waking`.
    pub wakeups_superseded: u64,
    /// `sched_waking` of a still-running thread that then blocked right away.
    pub early_wakings_used: u64,
    /// Events whose timestamp went backwards (treated as the latest time).
    pub out_of_order: u64,
    /// Events on a CPU number above [`MAX_CPUS`](crate::MAX_CPUS).
    pub bad_cpu: u64,
    /// Scheduling events contradicting the model (a switch-out of a thread
    /// that was not the CPU's current one, …): signs of lost events.
    pub inconsistencies: u64,
    /// Interrupt exits without a matching entry.
    pub unmatched_exits: u64,
    /// Lost-event markers.
    pub lost_markers: u64,
    /// Switches that were not in the trace but that an event proved: an
    /// event of thread T on a CPU the model thought ran another thread (T
    /// is taken as running there from that event on).
    pub inferred_switches: u64,
    /// Switches out of the idle task the trace lacks, taken from the
    /// recorder's capture of them (see
    /// [`StateBuilder::idle_switch`](crate::StateBuilder::idle_switch)).
    pub idle_switches_added: u64,
    /// Waits a timer interrupted that the thread resumed, in the same
    /// call, until a thread woke it: one wait in the execution graph (see
    /// docs/analysis.md, "Resumed waits").
    pub resumed_waits: u64,
    /// Wake-ups by an interrupt that ran while a recorder thread was
    /// current (see
    /// [`StateBuilder::recorder_threads`](crate::StateBuilder::recorder_threads)).
    pub wakeups_under_recorder: u64,
    /// Wake-ups recorded on one host's CPU in the context of another
    /// host's thread (see [`StateBuilder::hosts`](crate::StateBuilder::hosts)).
    pub wakeups_from_other_hosts: u64,
    /// Other events of that kind, left out.
    pub other_host_events: u64,
    /// System-call exits in the trace: where there are none, no call's
    /// return value is known (a `lean` recording, or a trace without the
    /// system-call events).
    pub syscall_exits: u64,
}

/// The tid of a host's kernel worker: the graph row of the work done in
/// interrupt context (Trace Compass' kernel worker).
pub const KERNEL_WORKER: Tid = -1;

/// The result of the state model: per-thread and per-CPU histories, the
/// execution graph, and what was lost.
#[derive(Clone, Debug)]
pub struct KernelModel {
    pub(super) threads: Vec<ThreadHistory>,
    pub(super) index: FxHashMap<Tid, usize>,
    pub(super) cpus: Vec<CpuHistory>,
    pub(super) graph: Graph,
    pub(super) lost: Vec<LostRange>,
    pub(super) irq_names: FxHashMap<i32, Name>,
    pub(super) syscall_names: Vec<Name>,
    pub(super) stats: ModelStats,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) block_io: Vec<BlockIo>,
    pub(super) cgroup_moves: Vec<CgroupMove>,
    pub(super) packets: NetworkEnds,
    pub(super) held_back: HeldBack,
}

impl KernelModel {
    /// The graph vertices where messages given to
    /// [`StateBuilder::packet`](crate::StateBuilder::packet) left and woke
    /// threads.
    pub fn network_ends(&self) -> &NetworkEnds {
        &self.packets
    }

    /// Block-layer request events (`block_rq_insert`/`issue`/`complete`),
    /// in time order.
    pub fn block_io(&self) -> &[BlockIo] {
        &self.block_io
    }

    /// Tasks moved into cgroups (`cgroup:cgroup_attach_task`), in time
    /// order.
    pub fn cgroup_moves(&self) -> &[CgroupMove] {
        &self.cgroup_moves
    }

    /// First and last event timestamps.
    pub fn time_range(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    /// Takes the intervals the recorder saw CPU cgroup quotas hold
    /// threads back (see [`HeldBack`]).
    pub fn set_held_back(&mut self, held_back: HeldBack) {
        self.held_back = held_back;
    }

    /// When CPU cgroup quotas held threads back, as recorded (empty when
    /// the recording could not say).
    pub fn held_back(&self) -> &HeldBack {
        &self.held_back
    }

    /// One thread's history.
    pub fn thread(&self, tid: Tid) -> Option<&ThreadHistory> {
        self.index.get(&tid).and_then(|&i| self.threads.get(i))
    }

    /// All threads, in order of first sight (tid 0, the idle task, is not a
    /// thread here: see the CPU timelines).
    pub fn threads(&self) -> impl Iterator<Item = &ThreadHistory> {
        self.threads.iter()
    }

    /// One CPU's history.
    pub fn cpu(&self, cpu: u32) -> Option<&CpuHistory> {
        self.cpus.get(cpu as usize)
    }

    pub fn cpus(&self) -> &[CpuHistory] {
        &self.cpus
    }

    /// The execution graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The name of a hardware interrupt (from `irq_handler_entry`).
    pub fn irq_name(&self, irq: i32) -> Option<&str> {
        self.irq_names.get(&irq).map(|s| &**s)
    }

    /// The name of a system call, when the trace gave one.
    pub fn syscall_name(&self, s: &SyscallInterval) -> Option<&str> {
        (s.name != 0)
            .then(|| self.syscall_names.get(s.name as usize).map(|n| &**n))
            .flatten()
    }

    /// Ranges in which events were lost, sorted by start.
    pub fn lost_ranges(&self) -> &[LostRange] {
        &self.lost
    }

    /// True when events were lost (on any CPU) during `[start, end)`, so
    /// states over that range may be wrong. A lost range holds the events
    /// after its start (the CPU's last event) up to its end.
    pub fn overlaps_lost(&self, start: u64, end: u64) -> bool {
        // Ranges are few; a linear scan over those starting before `end`.
        let n = self
            .lost
            .partition_point(|r| r.start < end.max(start.saturating_add(1)));
        self.lost[..n]
            .iter()
            .any(|r| start < r.end.max(r.start.saturating_add(1)))
    }

    pub fn stats(&self) -> &ModelStats {
        &self.stats
    }

    /// Threads that ran on `cpu` during `[start, end]`, with how long each,
    /// longest first (tid 0 = idle).
    pub fn cpu_occupants(&self, cpu: u32, start: u64, end: u64) -> Vec<(Tid, u64)> {
        let mut by_tid: HashMap<Tid, u64> = HashMap::new();
        if let Some(c) = self.cpu(cpu) {
            for i in c.running_in(start, end) {
                let d = i.end.min(end).saturating_sub(i.start.max(start));
                if d > 0 {
                    *by_tid.entry(i.tid).or_default() += d;
                }
            }
        }
        let mut v: Vec<_> = by_tid.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Who held the CPU while `tid` was runnable (PREEMPTED or WAIT_CPU)
    /// during `[start, end]`: the run-queue holders, longest first.
    pub fn preempted_by(&self, tid: Tid, start: u64, end: u64) -> Vec<(Tid, u64)> {
        let mut by_tid: HashMap<Tid, u64> = HashMap::new();
        if let Some(th) = self.thread(tid) {
            for s in th
                .states_in(start, end)
                .iter()
                .filter(|s| s.state.is_runnable() && s.cpu != NO_CPU)
            {
                for (holder, d) in self.cpu_occupants(s.cpu, s.start.max(start), s.end.min(end)) {
                    if holder != tid {
                        *by_tid.entry(holder).or_default() += d;
                    }
                }
            }
        }
        let mut v: Vec<_> = by_tid.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_helpers_use_closed_ranges() {
        let v = [(0u64, 10u64), (10, 20), (25, 30)];
        assert_eq!(overlapping(&v, 10, 10, |x| *x), &v[0..2]);
        assert_eq!(overlapping(&v, 21, 24, |x| *x), &[] as &[(u64, u64)]);
        assert_eq!(at(&v, 10, |x| *x), Some(&(10, 20)));
        assert_eq!(at(&v, 22, |x| *x), None);
    }
}
